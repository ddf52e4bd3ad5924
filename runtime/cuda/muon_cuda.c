/* muon_cuda.c — Muon on the device: Newton-Schulz over a batch of same-shaped matrices with
 * cuBLAS strided-batched GEMMs, and the Muon step of a group (runtime/optim/muon.c's math:
 * Nesterov momentum, Frobenius normalization, transpose when rows > cols, five quintic steps
 * (a, b, c) = (3.4445, −4.7750, 2.0315), scale 0.2·sqrt(max(rows, cols)), decoupled decay).
 *
 * Precision: bf16 operands with fp32 accumulation on the tensor cores, by cuBLAS's
 * CUBLAS_COMPUTE_32F_FAST_16BF on fp32 matrices ("allows the library to use Tensor Cores with
 * automatic down-conversion and bf16 compute for 32-bit input and output matrices", cuBLAS docs,
 * cublasComputeType_t): X, A = X Xᵀ and B = c A² + b A are stored fp32 and rounded to bf16 only as
 * they enter a product, so no cast kernel runs; the iterate keeps fp32 (a·X added in fp32).
 * Muon's reference implementation (Keller Jordan, modded-nanogpt) runs its whole iteration in
 * bf16. TF32 (CUBLAS_COMPUTE_32F_FAST_TF32) would keep 10 mantissa bits instead of 7 but runs at
 * half the bf16 rate on Hopper (NVIDIA H100 datasheet: 494.7 vs 989.4 dense TFLOP/s), and the plan
 * prices Newton-Schulz at the bf16 rate (cost.c, dense_gemm x bf16_flops); fp32 compute runs on
 * the FP32 cores, about 1/15 of it. The quintic's singular-value band holds
 * (tests/cuda/test_kernels_optim.c). Per iteration two device copies (cuBLAS's C may not alias
 * an operand) and three GEMMs, no kernel. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cu_internal.h"

size_t rt_cu_newton_schulz_work(int batch, int rows, int cols) {
  size_t r = (size_t)(rows < cols ? rows : cols), n = (size_t)rows * (size_t)cols;
  return (size_t)batch * (2 * n + 2 * r * r + 1);
}

/* C = alpha op(A) B + beta C over a batch of fp32 matrices, bf16 products with fp32 accumulation
 * (strides in elements). */
static void gemm(cublasOperation_t ta, int m, int n, int k, float alpha, const float *A, int lda, long long sa,
                 const float *B, int ldb, long long sb, float beta, float *C, int ldc, long long sc, int batch) {
  cu_blas_check(cublasGemmStridedBatchedEx(cu.blas, ta, CUBLAS_OP_N, m, n, k, &alpha, A, CUDA_R_32F, lda, sa, B,
                                           CUDA_R_32F, ldb, sb, &beta, C, CUDA_R_32F, ldc, sc, batch,
                                           CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT),
                "Newton-Schulz (cublasGemmStridedBatchedEx)");
  if (cu.sync_each) cu_check(cudaStreamSynchronize(cu.stream), "Newton-Schulz");
}

void rt_cu_newton_schulz(float *out, const float *g, int batch, int rows, int cols, float scale, float *work) {
  const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  int tr = rows > cols, r = tr ? cols : rows, k = tr ? rows : cols; /* X is (r, k) row-major, r <= k */
  long long n = (long long)rows * cols, rr = (long long)r * r;
  /* X and Y (batch n each: the iterate, ping-pong), A and B (batch rr each), the norms (batch):
   * batch (2 n + 2 rr + 1), rt_cu_newton_schulz_work */
  float *X = work, *Y = X + batch * n, *A = Y + batch * n, *B = A + batch * rr, *inv = B + batch * rr;
  long ln = (long)n;
  cu_launch(K_NS_INV_NORM, (unsigned)batch, 256, (void *[]){&inv, &g, &ln});
  cu_launch3(K_NS_PREP, cu_blocks(n, 256), (unsigned)batch, 1, 256, (void *[]){&X, &g, &inv, &rows, &cols, &tr});
  /* cuBLAS is column-major: row-major X (r, k) is Xᵀ (k, r) with ld k to it; A and B are
   * symmetric, so either reading of them is the same. cuBLAS's C may not alias an operand, so
   * a X + B X goes into the other buffer, Y, holding a copy of X (C, times beta a) */
  for (int it = 0; it < 5; it++) {
    gemm(CUBLAS_OP_T, r, r, k, 1, X, k, n, X, k, n, 0, A, r, rr, batch); /* A = X Xᵀ */
    cu_check(cudaMemcpyAsync(B, A, sizeof(float) * (size_t)(batch * rr), cudaMemcpyDeviceToDevice, cu.stream),
             "Newton-Schulz copy");
    gemm(CUBLAS_OP_N, r, r, r, c, A, r, rr, A, r, rr, b, B, r, rr, batch); /* B = c A² + b A */
    cu_check(cudaMemcpyAsync(Y, X, sizeof(float) * (size_t)(batch * n), cudaMemcpyDeviceToDevice, cu.stream),
             "Newton-Schulz copy");
    gemm(CUBLAS_OP_N, k, r, r, 1, X, k, n, B, r, rr, a, Y, k, n, batch); /* Y = a X + B X: Yᵀ = a Xᵀ + Xᵀ B */
    float *t = X;
    X = Y, Y = t;
  }
  cu_launch3(K_NS_FINISH, cu_blocks(n, 256), (unsigned)batch, 1, 256, (void *[]){&out, &X, &rows, &cols, &tr, &scale});
}

static float muon_scale(int rows, int cols) { return (float)(0.2 * sqrt((double)(rows > cols ? rows : cols))); }

static void apply(float *param, const float *u, int64_t n, const RtMuon *h) {
  long ln = (long)n;
  float lr = h->lr, wd = h->weight_decay;
  cu_launch(K_MUON_APPLY, cu_blocks(ln, 256), 256, (void *[]){&param, &u, &ln, &lr, &wd});
}

static void momentum(float *m, const float *grad, float *out, int64_t n, float grad_scale, float mu) {
  long ln = (long)n;
  cu_launch(K_MUON_MOMENTUM, cu_blocks(ln, 256), 256, (void *[]){&m, &grad, &out, &ln, &grad_scale, &mu});
}

/* The owner's side of a gathered matrix: its pieces up, Newton-Schulz on the device, the update
 * down into the same pieces; queued on the stream, none waited for: orth_done waits once for
 * all of an exchange's matrices. The pieces lie in the exchange's pinned host scratch (a
 * pageable one works too, with copies that block), so the copies are asynchronous; one device
 * scratch serves every matrix in turn, the stream keeping their order. */
typedef struct {
  float *dev;   /* device scratch */
  size_t elems; /* its values */
} OrthCtx;

static void orth_on_device(real *const *piece, const int64_t *len, int np, int rows, int cols, void *ctx) {
  OrthCtx *o = ctx;
  size_t n = (size_t)rows * (size_t)cols, at = 0;
  if (n + rt_cu_newton_schulz_work(1, rows, cols) > o->elems)
    rt_cuda_fail("Muon", "a gathered matrix does not fit Muon's device scratch (regenerate with this mtc)");
  for (int i = 0; i < np; at += (size_t)len[i], i++)
    if (len[i])
      cu_check(cudaMemcpyAsync(o->dev + at, piece[i], (size_t)len[i] * sizeof(float), cudaMemcpyHostToDevice,
                               cu.stream),
               "Muon: a gathered matrix up");
  rt_cu_newton_schulz(o->dev, o->dev, 1, rows, cols, muon_scale(rows, cols), o->dev + n);
  at = 0;
  for (int i = 0; i < np; at += (size_t)len[i], i++)
    if (len[i])
      cu_check(cudaMemcpyAsync(piece[i], o->dev + at, (size_t)len[i] * sizeof(float), cudaMemcpyDeviceToHost,
                               cu.stream),
               "Muon: its update down");
}

static void orth_done(void *ctx) {
  (void)ctx;
  rt_cu_host_wait("Muon's updates of its gathered matrices");
}

/* Whether a Muon matrix of group g is split over shards of S (the same answer on every rank). */
static bool group_moves(const RtTensor *t, int nt, int g, int64_t S) {
  for (int i = 0; i < nt; i++) {
    const RtTensor *T = &t[i];
    for (int k = 0; T->group == g && T->muon && k < (T->experts ? T->experts : 1); k++) {
      int64_t a = rt_expert_at(T, k), n = T->rows * T->cols;
      if (a + n > (a / S + 1) * S) return true;
    }
  }
  return false;
}

size_t rt_cu_muon_host_work(const RtTensor *t, int nt, const RtMuonShard *gs, int ng, int ranks) {
  size_t nests = 0;
  for (int i = 0; i < ng; i++) nests += group_moves(t, nt, gs[i].g, gs[i].S) ? (size_t)gs[i].S : 0;
  return nests ? nests + rt_muon_exchange_work(t, nt, gs, ng, ranks) : 0;
}

/* Group gs's matrices whole in this shard [lo, lo + S): runs of same-shaped neighbours (a
 * layer's experts of one tensor) as batches, as many as the scratch holds; orthogonalized in
 * place in N (its Nesterov gradients at shard indices) and applied to param. */
static void local_batches(const RtMuonShard *q, const RtTensor *t, int nt, int64_t lo, float *N, float *ns,
                          size_t ns_elems, const RtMuon *h, RtMuonStats *st) {
  int64_t hi = lo + q->S, run = 0, rlen = 0; /* the updates of adjacent batches: one apply */
  for (int i = 0; i < nt; i++) {
    const RtTensor *T = &t[i];
    if (T->group != q->g || !T->muon) continue;
    int ne = T->experts ? T->experts : 1, rows = (int)T->rows, cols = (int)T->cols;
    int64_t n = T->rows * T->cols;
    int cap = (int)(ns_elems / rt_cu_newton_schulz_work(1, rows, cols));
    if (cap < 1) rt_cuda_fail("Muon", "a matrix does not fit Muon's device scratch (regenerate with this mtc)");
    for (int k = 0, b; k < ne; k += b) {
      int64_t a = rt_expert_at(T, k);
      b = 1;
      if (a < lo || a + n > hi) continue;
      while (k + b < ne && b < cap && rt_expert_at(T, k + b) == a + b * n && a + (b + 1) * n <= hi) b++;
      float *x = N + (a - lo);
      rt_cu_newton_schulz(x, x, b, rows, cols, muon_scale(rows, cols), ns);
      if (rlen && a - lo != run + rlen) apply(q->param + run, N + run, rlen, h), rlen = 0;
      if (!rlen) run = a - lo;
      rlen += b * n;
      if (st) st->local += b;
    }
  }
  if (rlen) apply(q->param + run, N + run, rlen, h);
}

void rt_cu_muon_groups(MPI_Comm comm, int ranks, RtMuonShard *gs, int ng, const RtTensor *t, int nt,
                       float grad_scale, const RtMuon *h, float *dwork, size_t dwork_elems, float *hwork, void *counts,
                       RtMuonStats *st) {
  int me;
  MPI_Comm_rank(comm, &me);
  int64_t Smax = 0, off = 0; /* off: the next nest in hwork */
  for (int i = 0; i < ng; i++) Smax = gs[i].S > Smax ? gs[i].S : Smax;
  if (dwork_elems <= (size_t)Smax) rt_cuda_fail("Muon", "the device scratch is smaller than a shard");
  float *N = dwork, *ns = dwork + Smax; /* N: a group's Nesterov gradients (then updates) at shard indices */
  size_t ns_elems = dwork_elems - (size_t)Smax;
  float mu = h->momentum;
  bool moving = false;
  /* group by group: the momentum, the Nesterov gradients of a group whose matrices move to the
   * host (each group's nest, one after another in hwork), the batches of matrices held here */
  for (int i = 0; i < ng; i++) {
    RtMuonShard *q = &gs[i];
    int64_t lo = (int64_t)me * q->S, hi = lo + q->S;
    int64_t run = 0, rlen = 0; /* adjacent Muon pieces in one launch (elementwise) */
    RT_FOR_PIECES(t, nt, q->g, lo, hi, {
      (void)first;
      if (!T->muon) continue;
      if (rlen && at == run + rlen) {
        rlen += len;
        continue;
      }
      if (rlen) momentum(q->mom + run, q->grad + run, N + run, rlen, grad_scale, mu);
      run = at;
      rlen = len;
    })
    if (rlen) momentum(q->mom + run, q->grad + run, N + run, rlen, grad_scale, mu);
    q->nest = hwork ? hwork + off : NULL; /* (none when no matrix of any group moves) */
    if (group_moves(t, nt, q->g, q->S)) { /* into pinned hwork: not waited for here */
      cu_check(cudaMemcpyAsync(q->nest, N, (size_t)q->S * sizeof(float), cudaMemcpyDeviceToHost, cu.stream),
               "Muon: Nesterov gradients down");
      rt_cu_host_mark(); /* the last group's batches below still overlap the exchange */
      off += q->S, moving = true;
    }
    local_batches(q, t, nt, lo, N, ns, ns_elems, h, st);
  }
  if (!moving) return;
  /* the others at their owners: the gather is started while the last group's batches run on the
   * GPU; one all-to-all there and one back for all the groups, each owner's matrices on its GPU */
  rt_cu_host_wait_mark("Muon's Nesterov gradients"); /* every moving group's, at once */
  RtMuonXchg xs;
  rt_muon_exchange_start(comm, ranks, gs, ng, t, nt, hwork + off, counts, &xs);
  OrthCtx o = {ns, ns_elems};
  rt_muon_exchange_finish(&xs, orth_on_device, orth_done, &o, st);
  for (int i = 0; i < ng; i++) {
    const RtMuonShard *q = &gs[i];
    int64_t lo = (int64_t)me * q->S, hi = lo + q->S, S = q->S;
    if (!group_moves(t, nt, q->g, S)) continue;
    /* q->nest lies in the pinned hwork, untouched until the next step's host waits */
    cu_check(cudaMemcpyAsync(N, q->nest, (size_t)S * sizeof(float), cudaMemcpyHostToDevice, cu.stream),
             "Muon: the owners' updates up");
    for (int j = 0; j < nt; j++) {
      const RtTensor *T = &t[j];
      if (T->group != q->g || !T->muon) continue;
      int64_t n = T->rows * T->cols;
      for (int k = 0; k < (T->experts ? T->experts : 1); k++) {
        int64_t a = rt_expert_at(T, k), from = a > lo ? a : lo, to = a + n < hi ? a + n : hi;
        if (a + n <= (a / S + 1) * S || from >= to) continue; /* held whole somewhere, or not here */
        apply(q->param + (from - lo), N + (from - lo), to - from, h);
      }
    }
  }
}
