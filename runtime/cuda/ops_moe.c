/* ops_moe.c — the cuda backend's MoE ops (mtrt_ops.h over device pointers): router, balancing
 * loss, permutation, gather/combine, and the routed experts as grouped GEMMs
 * (a loop of cuBLAS GEMMs over a few streams, or one cublasGemmGroupedBatchedEx per projection, by the
 * rows each expert has: below).
 *
 * Dropless routing needs the tokens per expert on the host (the grouped GEMMs' shapes, the
 * all-to-all's counts). The permutation runs on the device (kernels.cu's moe_count and
 * moe_positions, in the cpu backend's order: by expert, then token), and one copy brings the
 * counts to the host: the one host synchronization of a MoE layer pass, as in Megatron's dropless
 * MoE. When the balancing loss ran just before on the same routing, its statistics and the counts
 * come down in that one copy. The host keeps the offsets it learned (cu_offsets), so the route, the
 * grouped GEMMs and the backward read them without another copy. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_internal.h"
#include "mtrt_comm.h"
#include "mtrt_ops.h"

void rt_router_forward(int32_t *idx, real *wts, const real *logits, const act *bias, int N, int E, int K,
                       bool sigmoid) {
  int sg = sigmoid;
  cu.cnt_of = NULL, cu.stats_of = NULL; /* idx changes */
  cu_launch(K_ROUTER_TOPK, cu_blocks(N, 128), 128, (void *[]){&idx, &wts, &logits, &bias, &sg});
}

void rt_router_backward(real *dlogits, const real *dwts, const real *logits, const int32_t *idx, const real *wts, int N,
                        int E, int K, bool sigmoid) {
  int sg = sigmoid;
  cu_launch(K_ROUTER_BACKWARD, cu_blocks(N, 128), 128, (void *[]){&dlogits, &dwts, &logits, &idx, &wts, &sg});
}

void rt_router_group_forward(int32_t *idx, real *wts, const real *logits, const act *bias, int N, int E, int K,
                             int n_group, int topk_group, bool sigmoid) {
  (void)E, (void)K;
  int sg = sigmoid;
  cu.cnt_of = NULL, cu.stats_of = NULL;
  cu_launch(K_ROUTER_TOPK_GROUPED, cu_blocks(N, 128), 128,
            (void *[]){&idx, &wts, &logits, &bias, &n_group, &topk_group, &sg});
}

void rt_router_weights(real *wts, const real *logits, const int32_t *idx, int N, int E, int K, bool sigmoid,
                       bool norm, real scale) {
  (void)E, (void)K;
  int sg = sigmoid, nm = norm;
  float s = scale;
  cu_launch(K_ROUTER_WEIGHTS, cu_blocks(N, 128), 128, (void *[]){&wts, &logits, &idx, &sg, &nm, &s});
}

void rt_router_weights_backward(real *dlogits, const real *dwts, const real *logits, const int32_t *idx,
                                const real *wts, int N, int E, int K, bool sigmoid, bool norm, real scale) {
  (void)E, (void)K;
  int sg = sigmoid, nm = norm;
  float s = scale;
  cu_launch(K_ROUTER_WEIGHTS_BACKWARD, cu_blocks(N, 128), 128,
            (void *[]){&dlogits, &dwts, &logits, &idx, &wts, &sg, &nm, &s});
}

/* The gated shared expert (kernels.cu's sigmoid_gate_*: rows of the plan's HIDDEN). */
void rt_sigmoid_gate_forward(act *y, const act *x, const real *logit, int N, int C) {
  (void)C;
  cu_launch(K_SIGMOID_GATE_FORWARD, (unsigned)N, 128, (void *[]){&y, &x, &logit});
}

void rt_sigmoid_gate_backward(act *dx, real *dlogit, const act *dy, const act *x, const real *logit, int N, int C) {
  (void)C;
  cu_launch(K_SIGMOID_GATE_BACKWARD, (unsigned)N, 128, (void *[]){&dx, &dlogit, &dy, &x, &logit});
}

/* stats (2E: mean softmax P, then assignment fraction f) into scratch, zeroed first */
static void aux_stats(real *stats, const real *logits, const int32_t *idx, int N, int E) {
  int *cnt = NULL;
  cu_check(cudaMemsetAsync(stats, 0, sizeof(float) * 2 * (size_t)E, cu.stream), "balancing loss");
  cu_launch(K_AUX_LOSS_STATS, cu_blocks(N, 128), 128, (void *[]){&stats, &cnt, &logits, &idx});
}

/* The assignments per expert of idx into cu.moe's counts (on the device). */
static void count(const int32_t *idx, int N, int E, int K) {
  size_t cnt, tab, eoff;
  cu_moe_layout((size_t)cu.cfg.experts, &cnt, &tab, &eoff);
  if (N != cu.cfg.tokens || K != cu.cfg.top_k || E != cu.cfg.experts)
    rt_cuda_fail("moe permute", "the routing's shape is not the one kernels.cu was compiled for");
  int *c = (int *)((char *)cu.moe + cnt);
  cu_check(cudaMemsetAsync(c, 0, sizeof(int) * (size_t)E, cu.stream), "moe permute");
  cu_launch(K_MOE_COUNT, cu_blocks((long long)N * K, 256), 256, (void *[]){&c, &idx});
}

/* The statistics and the counts the permutation needs next, side by side in cu.moe (zeroed by one
 * memset, filled by one aux_loss_stats pass): one copy down for both. scratch is not used: the
 * backward reads the statistics in cu.moe while they are still these logits' (stats_of: step.c
 * calls this in a recomputed forward too, just before the layer's backward), else computes them
 * again. */
real rt_aux_loss_forward(const real *logits, const int32_t *idx, int N, int E, int K, real alpha, real *scratch) {
  (void)scratch;
  size_t cnt, tab, eoff;
  cu_moe_layout((size_t)cu.cfg.experts, &cnt, &tab, &eoff);
  if (N != cu.cfg.tokens || K != cu.cfg.top_k || E != cu.cfg.experts)
    rt_cuda_fail("balancing loss", "the routing's shape is not the one kernels.cu was compiled for");
  float *stats = (float *)cu.moe;
  int *c = (int *)((char *)cu.moe + cnt);
  cu_check(cudaMemsetAsync(cu.moe, 0, cnt + sizeof(int) * (size_t)E, cu.stream), "balancing loss");
  cu_launch(K_AUX_LOSS_STATS, cu_blocks(N, 128), 128, (void *[]){&stats, &c, &logits, &idx});
  cu_download(cu.moe_host, cu.moe, cnt + sizeof(int) * (size_t)E);
  cu.cnt_of = idx, cu.stats_of = logits, cu.stats_idx = idx;
  const float *st = cu.moe_host;
  double s = 0;
  for (int e = 0; e < E; e++) s += (double)st[e] * st[E + e];
  return (real)(alpha * E * s);
}

void rt_aux_loss_backward(real *dlogits, const real *logits, const int32_t *idx, int N, int E, int K, real alpha,
                          real dloss, real *scratch) {
  real *stats = scratch;
  if (cu.stats_of == logits && cu.stats_idx == idx) stats = (real *)cu.moe; /* the forward's, still there */
  else aux_stats(scratch, logits, idx, N, E);
  float coef = dloss * alpha * (float)E / (float)N;
  cu_launch(K_AUX_LOSS_BACKWARD, cu_blocks(N, 128), 128, (void *[]){&dlogits, &logits, &stats, &coef});
}

/* Context parallelism (mtrt_ops.h): this rank's statistics at scratch + E, 2E values in aux_stats'
 * order (P, then f: the caller averages all 2E over the cp group, whichever is where); the value
 * from the averaged ones, read down (one host synchronization: the permutation then counts on its
 * own); the backward with the averaged f. */
void rt_aux_loss_stats(const real *logits, const int32_t *idx, int N, int E, int K, real *scratch) {
  (void)K;
  aux_stats(scratch + E, logits, idx, N, E);
}

real rt_aux_loss_value(const real *scratch, int E, real alpha) {
  const float *st = cu.moe_host; /* (its statistics' slot: 2E floats, before the counts) */
  cu_download(cu.moe_host, scratch + E, sizeof(float) * 2 * (size_t)E);
  double s = 0;
  for (int e = 0; e < E; e++) s += (double)st[e] * st[E + e];
  return (real)(alpha * E * s);
}

void rt_aux_loss_backward_stats(real *dlogits, const real *logits, int N, int E, real alpha, real dloss,
                                real *scratch) {
  float coef = dloss * alpha * (float)E / (float)N;
  real *st = scratch + E;
  cu_launch(K_AUX_LOSS_BACKWARD, cu_blocks(N, 128), 128, (void *[]){&dlogits, &logits, &st, &coef});
}

/* The sequence-wise loss's statistics (2 E per sequence: P then f) into scratch (2 (N / T) E). */
static void seq_aux_stats(real *stats, const real *logits, const int32_t *idx, int N, int E, int K, int T, bool sig) {
  if (N != cu.cfg.tokens || K != cu.cfg.top_k || E != cu.cfg.experts || T < 1 || N % T)
    rt_cuda_fail("sequence-wise balance loss", "the routing's shape is not the one kernels.cu was compiled for");
  int s = sig;
  cu_check(cudaMemsetAsync(stats, 0, sizeof(float) * 2 * (size_t)(N / T) * (size_t)E, cu.stream),
           "sequence-wise balance loss");
  cu_launch(K_SEQ_AUX_STATS, cu_blocks(N, 128), 128, (void *[]){&stats, &logits, &idx, &T, &s});
}

/* The loss summed on the device (seq_aux_loss_sum) into the statistics' slot before the counts, which
 * are counted here for the permutation that follows: one copy brings both down, as the batch-wise
 * loss does (rt_moe_permute then neither counts nor copies again). */
real rt_seq_aux_loss_forward(const real *logits, const int32_t *idx, int N, int E, int K, int T, bool sigmoid,
                             real alpha, real *scratch) {
  size_t cnt, tab, eoff;
  cu_moe_layout((size_t)cu.cfg.experts, &cnt, &tab, &eoff);
  int B = N / T;
  float a = alpha, *out = (float *)cu.moe;
  cu.stats_of = NULL; /* (out is the statistics' slot) */
  seq_aux_stats(scratch, logits, idx, N, E, K, T, sigmoid);
  cu_launch(K_SEQ_AUX_LOSS_SUM, 1, 256, (void *[]){&out, &scratch, &B, &a});
  count(idx, N, E, K);
  cu_download(cu.moe_host, cu.moe, cnt + sizeof(int) * (size_t)E);
  cu.cnt_of = idx;
  return ((const float *)cu.moe_host)[0];
}

void rt_seq_aux_loss_backward(real *dlogits, const real *logits, const int32_t *idx, int N, int E, int K, int T,
                              bool sigmoid, real alpha, real dloss, real *scratch) {
  seq_aux_stats(scratch, logits, idx, N, E, K, T, sigmoid);
  float coef = dloss * alpha / (float)N;
  int s = sigmoid;
  cu_launch(K_SEQ_AUX_BACKWARD, cu_blocks(N, 128), 128, (void *[]){&dlogits, &logits, &scratch, &T, &coef, &s});
}

void rt_moe_count(real *load, const int32_t *idx, int64_t n) {
  long long nn = n;
  if (n > 0) cu_launch(K_MOE_LOAD_ADD, cu_blocks(nn, 256), 256, (void *[]){&load, &idx, &nn});
}

/* The step's loads summed over the world on the device: an NCCL all-reduce of the E values in
 * place (comm_nccl.c's world communicator), waited for by the compute stream, not the host. */
void rt_moe_load_all_reduce(real *load, int E) { rt_cu_all_reduce(MPI_COMM_WORLD, load, (size_t)E); }

/* shard may be device memory or the pinned host state arena (STATE_ON_HOST): the kernel writes
 * either (unified addressing). */
void rt_router_bias_update(real *shard, int64_t lo, int64_t n, int64_t off, const real *load, int E, real rate) {
  if (E != cu.cfg.experts) rt_cuda_fail("rt_router_bias_update", "the experts are not the ones kernels.cu was compiled for");
  long long l = lo, nn = n, o = off;
  float r = rate;
  cu_launch(K_ROUTER_BIAS_UPDATE, cu_blocks(E, 128), 128, (void *[]){&shard, &l, &nn, &o, &load, &r});
}

void rt_moe_permute(int32_t *pos, int *offsets, const int32_t *idx, int N, int E, int K) {
  size_t cnt, tab, eoff;
  cu_moe_layout((size_t)cu.cfg.experts, &cnt, &tab, &eoff);
  int fresh = cu.cnt_of != idx; /* else the balancing loss has counted idx and copied it down */
  if (fresh) count(idx, N, E, K);
  const int *c = (const int *)((char *)cu.moe + cnt);
  cu_launch(K_MOE_POSITIONS, (unsigned)E, 256, (void *[]){&pos, &offsets, &c, &idx});
  if (fresh) cu_download((char *)cu.moe_host + cnt, c, sizeof(int) * (size_t)E);
  cu.cnt_of = idx;
  /* the offsets as moe_positions writes them, on the host */
  const int *h = (const int *)((const char *)cu.moe_host + cnt);
  int *o = (int *)((char *)cu.moe_host + eoff); /* (staging: cu_offsets_known copies it) */
  int64_t at = 0;
  o[0] = 0;
  for (int e = 0; e < E; e++) {
    at += h[e], o[e + 1] = (int)at;
  }
  if (at != (int64_t)N * K) rt_cuda_fail("moe permute", "the router chose an expert out of range");
  /* (moe_positions wrote no position of such an assignment; the job ends here) */
  cu_offsets_known(offsets, o, (size_t)E + 1);
}

static int *oc_host(int i) { return cu.off_host + (size_t)i * ((size_t)cu.cfg.experts + 1); }

const int *cu_offsets(const int *dev, size_t n) {
  /* a part of an array held needs no copy */
  for (int i = 0; i < CU_OFF_CACHE; i++)
    if (cu.oc[i].dev && dev >= cu.oc[i].dev && dev + n <= cu.oc[i].dev + cu.oc[i].n)
      return oc_host(i) + (dev - cu.oc[i].dev);
  size_t cnt, tab, eoff;
  cu_moe_layout((size_t)cu.cfg.experts, &cnt, &tab, &eoff);
  if (n > (size_t)cu.cfg.experts + 1) rt_cuda_fail("moe offsets", "more offsets than experts + 1");
  int *h = (int *)((char *)cu.moe_host + eoff);
  cu_download(h, dev, sizeof(int) * n);
  cu_offsets_known(dev, h, n);
  return cu_offsets(dev, n);
}

void cu_offsets_known(const int *dev, const int *host, size_t n) {
  if (n > (size_t)cu.cfg.experts + 1) rt_cuda_fail("moe offsets", "more offsets than experts + 1");
  int at = -1;
  for (int i = 0; i < CU_OFF_CACHE; i++) /* copies of the bytes dev overwrites are stale */
    if (cu.oc[i].dev && dev < cu.oc[i].dev + cu.oc[i].n && cu.oc[i].dev < dev + n) {
      cu.oc[i].dev = NULL;
      if (at < 0) at = i;
    }
  if (at < 0) at = cu.oc_next, cu.oc_next = (cu.oc_next + 1) % CU_OFF_CACHE;
  memcpy(oc_host(at), host, sizeof(int) * n);
  cu.oc[at].dev = dev, cu.oc[at].n = n;
}

void cu_download(void *dst, const void *src, size_t bytes) {
  size_t loss, stage, room = cu_rb_layout((size_t)(cu.cfg.experts > 0 ? cu.cfg.experts : 1), &loss, &stage) - stage;
  void *st = (char *)cu.rb + stage; /* pinned: the copy lands there, the host copies it out after the wait */
  for (size_t at = 0; at < bytes; at += room) {
    size_t n = bytes - at < room ? bytes - at : room;
    cu_check(cudaMemcpyAsync(st, (const char *)src + at, n, cudaMemcpyDeviceToHost, cu.stream), "download");
    rt_cu_host_wait("download");
    memcpy((char *)dst + at, st, n);
  }
}

void rt_moe_gather(act *xp, const act *x, const int32_t *pos, int N, int K, int C) {
  cu_launch(K_MOE_GATHER, (unsigned)(N * K), 128, (void *[]){&xp, &x, &pos});
}

void rt_moe_gather_backward(act *dx, const act *dxp, const int32_t *pos, int N, int K, int C) {
  cu_launch(K_MOE_GATHER_BACKWARD, (unsigned)N, 128, (void *[]){&dx, &dxp, &pos});
}

void rt_moe_combine(act *y, const act *yp, const real *wts, const int32_t *pos, int N, int K, int C) {
  cu_launch(K_MOE_COMBINE, (unsigned)N, 128, (void *[]){&y, &yp, &wts, &pos});
}

void rt_moe_combine_backward(act *dyp, real *dwts, const act *dy, const act *yp, const real *wts, const int32_t *pos,
                             int N, int K, int C) {
  if (!dyp || !dwts) rt_cuda_fail("rt_moe_combine_backward", "dyp and dwts are required on the cuda backend");
  cu_launch(K_MOE_COMBINE_BACKWARD, (unsigned)N, 128, (void *[]){&dyp, &dwts, &dy, &yp, &wts, &pos});
}

/* ---- the experts' GEMMs: rows [off[e], off[e+1]) belong to expert e ----
 *   FWD: out rows (r, OC) = x rows (r, IC) · w_eᵀ         (w: E × (OC, IC))
 *   DX:  out rows (r, IC) = or += x rows (r, OC) · w_e    (x is the output gradient; beta 0 or 1)
 *   DW:  out_e (OC, IC)   += yᵀ rows (r, OC) · x rows (r, IC)
 * Column-major as cuBLAS sees row-major data, as in ops.c's rt_matmul_*. Expert e's matrix w_e
 * (and out_e) lies at (e / per) · stride + (e % per) · OC · IC elements: shards of per whole
 * experts, stride apart (mtrt_ops.h).
 *
 * Two paths, picked per call from the rows the host already has (the counts' copy):
 *   loop:    one cublasGemmEx per expert with rows, round robin over CU_LANES streams forked from
 *            and joined back into the compute stream. Each expert is then a GEMM at cuBLAS's dense
 *            heuristics: on H100, 128 experts of K 2048, N 1536 over 65,536 tokens, such a loop
 *            reached 129.5 TFLOP/s where cublasGemmGroupedBatchedEx reached 85.2
 *            (tgale96/grouped_gemm PR #37); NVIDIA's cuBLAS 12.5 post ("Introducing Grouped GEMM
 *            APIs in cuBLAS") says its grouped kernels use only warp-level MMA, not Hopper's
 *            warpgroup MMA (wgmma) that its dense kernels use.
 *   grouped: one cublasGemmGroupedBatchedEx for all experts, where experts are too small for a
 *            GEMM each to outrun its launch (the same post: 1.2x a loop at MoE batch sizes 8 and
 *            64). Experts without rows are left out of it (TransformerEngine PR #2765: cuBLAS
 *            13.2's grouped weight gradient is wrong when a group is empty).
 * The plan says where the loop starts (cfg.expert_loop_rows: the mean rows of the experts with
 * rows; compiler/cost_kernel.c's cost_expert_loop_rows prices both paths); $MTC_EXPERTS=loop|grouped forces one.
 * The grouped call's A, B and C pointer arrays are built on the device (kernels.cu's
 * moe_group_ptrs) from the device's copy of the offsets, in stream order: no host array is copied
 * up, so none can be rewritten before the GEMM reads it, and no pageable copy is left here. Its
 * shape arrays are host arrays cuBLAS reads during the call (static: the call has returned
 * before they are rewritten). */
enum { G_FWD, G_DX, G_DW };

static const char *compute_name(cublasComputeType_t c) {
  return c == CUBLAS_COMPUTE_32F_FAST_16BF ? "bf16" : c == CUBLAS_COMPUTE_32F_FAST_TF32 ? "tf32" : "fp32";
}

/* One call's experts: the arguments of each expert's GEMM, the non-empty ones in expert order. */
typedef struct {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
  float beta;
  const act *A, *B;
  act *C;
} ExpertGemm;

/* Whether the loop runs the g experts of rows total rows (the plan's rule, or $MTC_EXPERTS). */
static int use_loop(int g, int64_t rows) {
  if (cu.expert_path) return cu.expert_path == 1;
  return cu.cfg.expert_loop_rows > 0 && rows >= (int64_t)cu.cfg.expert_loop_rows * g;
}

/* The loop: expert i on lane i % CU_LANES; the other lanes wait for the compute stream's work so far
 * (fork), and the compute stream waits for every lane (join). */
static void loop(const char *op, const ExpertGemm *x, int g) {
  const float one = 1;
  cublasComputeType_t math = MTRT_ACT_IS_BF16 ? CUBLAS_COMPUTE_32F : cu.compute;
  int L = g < CU_LANES ? g : CU_LANES;
  if (L > 1) {
    cu_check(cudaEventRecord(cu.fork, cu.stream), op);
    for (int l = 1; l < L; l++) cu_check(cudaStreamWaitEvent(cu.lane[l], cu.fork, 0), op);
  }
  for (int i = 0; i < g; i++)
    cu_blas_check(cublasGemmEx(cu.lane_blas[i % L], x[i].ta, x[i].tb, x[i].m, x[i].n, x[i].k, &one, x[i].A, CU_ACT,
                               x[i].lda, x[i].B, CU_ACT, x[i].ldb, &x[i].beta, x[i].C, CU_ACT, x[i].ldc, math,
                               CUBLAS_GEMM_DEFAULT),
                  op);
  for (int l = 1; l < L; l++) {
    cu_check(cudaEventRecord(cu.join[l], cu.lane[l]), op);
    cu_check(cudaStreamWaitEvent(cu.stream, cu.join[l], 0), op);
  }
}

/* The grouped call: the pointer arrays built on the device into this call's slot of cu.gptr. */
static void grouped_call(const char *op, int kind, int slot, const ExpertGemm *x, int g, void *out, const act *xa,
                         const act *ya, const act *w, const int *dev_off, int E, int per, int64_t stride, int IC,
                         int OC) {
  enum { MAXG = 1024 };
  static cublasOperation_t ta[MAXG], tb[MAXG];
  static int m[MAXG], n[MAXG], k[MAXG], lda[MAXG], ldb[MAXG], ldc[MAXG], size[MAXG];
  static float alpha[MAXG], beta[MAXG];
  for (int i = 0; i < g; i++) {
    ta[i] = x[i].ta, tb[i] = x[i].tb, m[i] = x[i].m, n[i] = x[i].n, k[i] = x[i].k;
    lda[i] = x[i].lda, ldb[i] = x[i].ldb, ldc[i] = x[i].ldc, alpha[i] = 1, beta[i] = x[i].beta, size[i] = 1;
  }
  void **d = cu.gptr + (size_t)slot * 3 * (size_t)cu.cfg.experts; /* this call's slot: A, B, C pointer arrays */
  long long st = stride;
  cu_launch(K_MOE_GROUP_PTRS, 1, 32,
            (void *[]){&d, &dev_off, &E, &g, &kind, &out, &xa, &ya, &w, &per, &st, &IC, &OC});
  for (;;) {
    cublasStatus_t s = cublasGemmGroupedBatchedEx(
        cu.blas, ta, tb, m, n, k, alpha, (const void *const *)d, CU_ACT, lda, (const void *const *)(d + g), CU_ACT,
        ldb, beta, d + 2 * g, CU_ACT, ldc, g, size, MTRT_ACT_IS_BF16 ? CUBLAS_COMPUTE_32F : cu.grouped_compute);
    /* not every math mode is documented for fp32 storage in grouped GEMMs: fall back on failure */
    if (s != CUBLAS_STATUS_SUCCESS && !MTRT_ACT_IS_BF16 && cu.grouped_compute != CUBLAS_COMPUTE_32F) {
      cublasComputeType_t next = cu.grouped_compute == CUBLAS_COMPUTE_32F_FAST_16BF ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                    : CUBLAS_COMPUTE_32F;
      int inited = 0, rank = 0;
      MPI_Initialized(&inited); /* test_kernels runs the ops without MPI */
      if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0)
        fprintf(stderr, "note: cuBLAS grouped GEMM refused %s math on fp32 storage (%s); the experts use %s\n",
                compute_name(cu.grouped_compute), cublasGetStatusString(s), compute_name(next));
      cu.grouped_compute = next;
      continue;
    }
    cu_blas_check(s, op);
    break;
  }
}

/* One projection's GEMMs over the experts of off (host) / dev_off (the same offsets on the device),
 * C in the activation type, the weight gradients (G_DW) too: fp32 accumulation added into it
 * (beta 1). G_DX writes its rows (dx_beta 0: the first writer) or adds to them (1). */
static void grouped(const char *op, int kind, int slot, void *out, const act *x, const act *y, const act *w,
                    const int *off, const int *dev_off, int E, int per, int64_t stride, int IC, int OC,
                    float dx_beta) {
  enum { MAXG = 1024 };
  static ExpertGemm gm[MAXG];
  if (E > MAXG || E > cu.cfg.experts) rt_cuda_fail(op, "more experts than the grouped GEMM was sized for");
  if (per < 1) rt_cuda_fail(op, "experts per shard must be at least 1");
  int g = 0;
  for (int e = 0; e < E; e++) {
    int rows = off[e + 1] - off[e];
    if (!rows) continue;
    size_t we = (size_t)(e / per) * (size_t)stride + (size_t)(e % per) * OC * IC;
    ExpertGemm *q = &gm[g++];
    if (kind == G_FWD)
      *q = (ExpertGemm){CUBLAS_OP_T, CUBLAS_OP_N, OC, rows, IC, IC, IC, OC, 0, w + we, x + (size_t)off[e] * IC,
                        (act *)out + (size_t)off[e] * OC};
    else if (kind == G_DX)
      *q = (ExpertGemm){CUBLAS_OP_N, CUBLAS_OP_N, IC, rows, OC, IC, OC, IC, dx_beta, w + we, x + (size_t)off[e] * OC,
                        (act *)out + (size_t)off[e] * IC};
    else
      *q = (ExpertGemm){CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, rows, IC, OC, IC, 1, x + (size_t)off[e] * IC,
                        y + (size_t)off[e] * OC, (act *)out + we};
  }
  if (!g) return;
  CU_PROF_BEGIN();
  cu_prof_flops = 0;
  for (int i = 0; i < g; i++) cu_prof_flops += 2.0 * gm[i].m * gm[i].n * gm[i].k;
  if (use_loop(g, (int64_t)off[E] - off[0])) loop(op, gm, g);
  else grouped_call(op, kind, slot, gm, g, out, x, y, w, dev_off, E, per, stride, IC, OC);
  if (cu.sync_each) cu_check(cudaStreamSynchronize(cu.stream), op);
  CU_PROF_END(op);
}

void rt_experts_forward(act *yp, act *g, act *u, act *h, const act *xp, const act *wg, const act *wu, const act *wd,
                        const int *offsets, int E, int per, int64_t stride, int C, int F) {
  const int *off = cu_offsets(offsets, (size_t)E + 1);
  grouped("experts up_proj", G_FWD, 1, u, xp, NULL, wu, off, offsets, E, per, stride, C, F, 0);
  if (wg) {
    grouped("experts gate_proj", G_FWD, 0, g, xp, NULL, wg, off, offsets, E, per, stride, C, F, 0);
    rt_swiglu_forward(h, g, u, (int64_t)off[E] * F);
  } else {
    rt_gelu_forward(h, u, (int64_t)off[E] * F); /* GELU experts (mtrt_ops.h) */
  }
  grouped("experts down_proj", G_FWD, 2, yp, h, NULL, wd, off, offsets, E, per, stride, F, C, 0);
}

void rt_experts_backward(act *dxp, act *dwg, act *dwu, act *dwd, const act *dyp, const act *xp, const act *g,
                         const act *u, const act *h, const act *wg, const act *wu, const act *wd, const int *offsets,
                         int E, int per, int64_t stride, int C, int F, act *dh, act *dg, act *du) {
  const int *off = cu_offsets(offsets, (size_t)E + 1);
  size_t n = (size_t)off[E] * F;
  /* written, not zeroed first: dh by its GEMM (beta 0), dg and du by the activation's backward,
   * dxp by its first GEMM (gate's, else up's) */
  grouped("experts down_proj dx", G_DX, 0, dh, dyp, NULL, wd, off, offsets, E, per, stride, F, C, 0);
  if (dwd) grouped("experts down_proj dw", G_DW, 1, dwd, h, dyp, NULL, off, offsets, E, per, stride, F, C, 0);
  if (wg) rt_swiglu_backward(dg, du, dh, g, u, (int64_t)n);
  else rt_gelu_backward(du, dh, u, (int64_t)n); /* GELU experts: no gate */
  if (dxp) {
    if (wg) grouped("experts gate_proj dx", G_DX, 2, dxp, dg, NULL, wg, off, offsets, E, per, stride, C, F, 0);
    grouped("experts up_proj dx", G_DX, 3, dxp, du, NULL, wu, off, offsets, E, per, stride, C, F, wg ? 1 : 0);
  }
  if (wg && dwg) grouped("experts gate_proj dw", G_DW, 4, dwg, xp, dg, NULL, off, offsets, E, per, stride, C, F, 0);
  if (dwu) grouped("experts up_proj dw", G_DW, 5, dwu, xp, du, NULL, off, offsets, E, per, stride, C, F, 0);
}
