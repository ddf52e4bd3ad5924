/* ops_moe.c — the cuda backend's MoE ops (mtrt_ops.h over device pointers): router, balancing
 * loss, permutation, gather/combine, and the routed experts as grouped GEMMs
 * (cublasGemmGroupedBatchedEx: one call per projection for all experts, never a loop of
 * per-expert launches).
 *
 * Dropless routing needs the tokens per expert on the host (the grouped GEMMs' shapes, the
 * all-to-all's counts): the permutation copies the top-k choices to the host, orders them there
 * exactly as the cpu backend does (by expert, then token: deterministic), and copies the rows
 * and offsets back. One synchronization per MoE layer and pass, as in Megatron's dropless MoE. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cu_internal.h"
#include "mtrt_ops.h"

void rt_router_forward(int32_t *idx, real *wts, const real *logits, const act *bias, int N, int E, int K,
                       bool sigmoid) {
  int sg = sigmoid;
  cu_launch(K_ROUTER_TOPK, cu_blocks(N, 128), 128, (void *[]){&idx, &wts, &logits, &bias, &sg});
}

void rt_router_backward(real *dlogits, const real *dwts, const real *logits, const int32_t *idx, const real *wts, int N,
                        int E, int K, bool sigmoid) {
  int sg = sigmoid;
  cu_launch(K_ROUTER_BACKWARD, cu_blocks(N, 128), 128, (void *[]){&dlogits, &dwts, &logits, &idx, &wts, &sg});
}

void rt_router_group_forward(int32_t *idx, real *wts, const real *logits, const act *bias, int N, int E, int K,
                             int n_group, int topk_group) {
  (void)E, (void)K;
  cu_launch(K_ROUTER_TOPK_GROUPED, cu_blocks(N, 128), 128, (void *[]){&idx, &wts, &logits, &bias, &n_group, &topk_group});
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
  cu_check(cudaMemsetAsync(stats, 0, sizeof(float) * 2 * (size_t)E, cu.stream), "balancing loss");
  cu_launch(K_AUX_LOSS_STATS, cu_blocks(N, 128), 128, (void *[]){&stats, &logits, &idx});
}

real rt_aux_loss_forward(const real *logits, const int32_t *idx, int N, int E, int K, real alpha, real *scratch) {
  aux_stats(scratch, logits, idx, N, E);
  rt_cuda_download(cu.stats_host, scratch, sizeof(float) * 2 * (size_t)E);
  double s = 0;
  for (int e = 0; e < E; e++) s += (double)cu.stats_host[e] * cu.stats_host[E + e];
  return (real)(alpha * E * s);
}

void rt_aux_loss_backward(real *dlogits, const real *logits, const int32_t *idx, int N, int E, int K, real alpha,
                          real dloss, real *scratch) {
  aux_stats(scratch, logits, idx, N, E);
  float coef = dloss * alpha * (float)E / (float)N;
  cu_launch(K_AUX_LOSS_BACKWARD, cu_blocks(N, 128), 128, (void *[]){&dlogits, &logits, &scratch, &coef});
}

void rt_moe_count(real *load, const int32_t *idx, int64_t n) {
  rt_cuda_fail("rt_moe_count", "auxiliary-loss-free balancing is not on the cuda backend yet");
}

void rt_moe_permute(int32_t *pos, int *offsets, const int32_t *idx, int N, int E, int K) {
  int *o = cu.off_host, *p = cu.pos_host, *ix = cu.idx_host, n = N * K;
  rt_cuda_download(ix, idx, sizeof(int) * (size_t)n);
  for (int e = 0; e <= E; e++) o[e] = 0;
  for (int a = 0; a < n; a++) {
    if (ix[a] < 0 || ix[a] >= E) rt_cuda_fail("moe permute", "the router chose an expert out of range");
    o[ix[a] + 1]++;
  }
  for (int e = 0; e < E; e++) o[e + 1] += o[e];
  for (int a = 0; a < n; a++) p[a] = o[ix[a]]++; /* stable: token order within an expert */
  for (int e = E; e > 0; e--) o[e] = o[e - 1];
  o[0] = 0;
  rt_cuda_upload(pos, p, sizeof(int) * (size_t)n);
  rt_cuda_upload(offsets, o, sizeof(int) * (size_t)(E + 1));
  cu_offsets_uploaded(offsets, (size_t)E + 1);
}

const int *cu_offsets(const int *dev, size_t n) {
  /* a tail of the array held (whole-expert shards: one shard's experts at a time) needs no copy */
  uintptr_t held = (uintptr_t)cu.off_of, at = (uintptr_t)dev;
  if (held && at > held && (at - held) % sizeof(int) == 0 && at - held + n * sizeof(int) <= cu.off_bytes)
    return cu.off_host + (at - held) / sizeof(int);
  if (cu.off_of != dev || cu.off_bytes < n * sizeof(int)) {
    rt_cuda_download(cu.off_host, dev, sizeof(int) * n);
    cu_offsets_uploaded(dev, n);
  }
  return cu.off_host;
}

void cu_offsets_uploaded(const int *dev, size_t n) { cu.off_of = dev, cu.off_bytes = n * sizeof(int); }

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

/* ---- grouped GEMMs over the experts: rows [off[e], off[e+1]) belong to expert e ----
 *   FWD: out rows (r, OC) = x rows (r, IC) · w_eᵀ         (w: E × (OC, IC))
 *   DX:  out rows (r, IC) += x rows (r, OC) · w_e         (x is the output gradient)
 *   DW:  out_e (OC, IC)   += yᵀ rows (r, OC) · x rows (r, IC)
 * Column-major as cuBLAS sees row-major data, as in ops.c's rt_matmul_*. */
enum { G_FWD, G_DX, G_DW };

static const char *compute_name(cublasComputeType_t c) {
  return c == CUBLAS_COMPUTE_32F_FAST_16BF ? "bf16" : c == CUBLAS_COMPUTE_32F_FAST_TF32 ? "tf32" : "fp32";
}

static void grouped(const char *op, int kind, int slot, void *out, const act *x, const act *y, const act *w,
                    const int *off, int E, int IC, int OC) {
  enum { MAXG = 1024 };
  static cublasOperation_t ta[MAXG], tb[MAXG];
  static int m[MAXG], n[MAXG], k[MAXG], lda[MAXG], ldb[MAXG], ldc[MAXG], size[MAXG];
  static float alpha[MAXG], beta[MAXG];
  static const void *host[3 * MAXG];
  if (E > MAXG || E > cu.cfg.experts) rt_cuda_fail(op, "more experts than the grouped GEMM was sized for");
  /* C is the activation type, the weight gradients (G_DW) too: fp32 accumulation added into it (beta 1) */
  cudaDataType_t ct = CU_ACT;
  size_t cs = sizeof(act);
  int g = 0;
  for (int e = 0; e < E; e++) {
    int rows = off[e + 1] - off[e];
    if (!rows) continue;
    size_t we = (size_t)e * OC * IC;
    const act *A, *B;
    char *C;
    alpha[g] = 1, size[g] = 1;
    if (kind == G_FWD) {
      ta[g] = CUBLAS_OP_T, tb[g] = CUBLAS_OP_N, m[g] = OC, n[g] = rows, k[g] = IC, beta[g] = 0;
      A = w + we, lda[g] = IC, B = x + (size_t)off[e] * IC, ldb[g] = IC, C = (char *)out + cs * (size_t)off[e] * OC, ldc[g] = OC;
    } else if (kind == G_DX) {
      ta[g] = CUBLAS_OP_N, tb[g] = CUBLAS_OP_N, m[g] = IC, n[g] = rows, k[g] = OC, beta[g] = 1;
      A = w + we, lda[g] = IC, B = x + (size_t)off[e] * OC, ldb[g] = OC, C = (char *)out + cs * (size_t)off[e] * IC, ldc[g] = IC;
    } else {
      ta[g] = CUBLAS_OP_N, tb[g] = CUBLAS_OP_T, m[g] = IC, n[g] = OC, k[g] = rows, beta[g] = 1;
      A = x + (size_t)off[e] * IC, lda[g] = IC, B = y + (size_t)off[e] * OC, ldb[g] = OC, C = (char *)out + cs * we, ldc[g] = IC;
    }
    host[g] = A, host[MAXG + g] = B, host[2 * MAXG + g] = C;
    g++;
  }
  if (!g) return;
  CU_PROF_BEGIN();
  cu_prof_flops = 0;
  for (int i = 0; i < g; i++) cu_prof_flops += 2.0 * m[i] * n[i] * k[i];
  size_t E3 = (size_t)cu.cfg.experts;
  void **d = cu.gptr + (size_t)slot * 3 * E3; /* this call's slot: A, B, C pointer arrays */
  for (int i = 0; i < 3; i++)
    cu_check(cudaMemcpyAsync(d + i * E3, host + i * MAXG, sizeof(void *) * (size_t)g, cudaMemcpyHostToDevice, cu.stream),
             op);
  for (;;) {
    cublasStatus_t s = cublasGemmGroupedBatchedEx(
        cu.blas, ta, tb, m, n, k, alpha, (const void *const *)d, CU_ACT, lda, (const void *const *)(d + E3), CU_ACT,
        ldb, beta, d + 2 * E3, ct, ldc, g, size, MTRT_ACT_IS_BF16 ? CUBLAS_COMPUTE_32F : cu.grouped_compute);
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
  /* the shape arrays are read by cuBLAS during the call, and a pageable host-to-device copy has
   * taken its source when it returns, so the static host arrays may be rewritten now */
  if (cu.sync_each) cu_check(cudaStreamSynchronize(cu.stream), op);
  CU_PROF_END(op);
}

void rt_experts_forward(act *yp, act *g, act *u, act *h, const act *xp, const act *wg, const act *wu, const act *wd,
                        const int *offsets, int E, int C, int F) {
  const int *off = cu_offsets(offsets, (size_t)E + 1);
  grouped("experts up_proj", G_FWD, 1, u, xp, NULL, wu, off, E, C, F);
  if (wg) {
    grouped("experts gate_proj", G_FWD, 0, g, xp, NULL, wg, off, E, C, F);
    rt_swiglu_forward(h, g, u, (int64_t)off[E] * F);
  } else {
    rt_gelu_forward(h, u, (int64_t)off[E] * F); /* GELU experts (mtrt_ops.h) */
  }
  grouped("experts down_proj", G_FWD, 2, yp, h, NULL, wd, off, E, F, C);
}

void rt_experts_backward(act *dxp, act *dwg, act *dwu, act *dwd, const act *dyp, const act *xp, const act *g,
                         const act *u, const act *h, const act *wg, const act *wu, const act *wd, const int *offsets,
                         int E, int C, int F, act *dh, act *dg, act *du) {
  const int *off = cu_offsets(offsets, (size_t)E + 1);
  size_t n = (size_t)off[E] * F;
  rt_zero(dh, n), rt_zero(du, n);
  if (wg) rt_zero(dg, n);
  grouped("experts down_proj dx", G_DX, 0, dh, dyp, NULL, wd, off, E, F, C);
  if (dwd) grouped("experts down_proj dw", G_DW, 1, dwd, h, dyp, NULL, off, E, F, C);
  if (wg) rt_swiglu_backward(dg, du, dh, g, u, (int64_t)n);
  else rt_gelu_backward(du, dh, u, (int64_t)n); /* GELU experts: no gate */
  if (dxp) {
    if (wg) grouped("experts gate_proj dx", G_DX, 2, dxp, dg, NULL, wg, off, E, C, F);
    grouped("experts up_proj dx", G_DX, 3, dxp, du, NULL, wu, off, E, C, F);
  }
  if (wg && dwg) grouped("experts gate_proj dw", G_DW, 4, dwg, xp, dg, NULL, off, E, C, F);
  if (dwu) grouped("experts up_proj dw", G_DW, 5, dwu, xp, du, NULL, off, E, C, F);
}
