/* muon_cuda.c — Muon on the device: Newton-Schulz over a batch of same-shaped matrices with
 * cuBLAS strided-batched GEMMs, and the Muon step of a group (runtime/optim/muon.c's math:
 * Nesterov momentum, Frobenius normalization, transpose when rows > cols, five quintic steps
 * (a, b, c) = (3.4445, −4.7750, 2.0315), scale 0.2·sqrt(max(rows, cols)), decoupled decay).
 *
 * Precision: fp32 operands with CUBLAS_COMPUTE_32F (no TF32, no bf16). The master weights,
 * gradients and momentum are fp32 already, so there is no cast; the iteration then matches the
 * host's to rounding (the emulated compare against the cpu build stays tight), and the quintic's
 * band is not widened by bf16's 8-bit mantissa. Newton-Schulz is a small part of a step's FLOPs
 * (europa-1t: a few GFLOP per matrix), so the tensor-core speed bf16 would buy is not worth
 * losing that. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cu_internal.h"

size_t rt_cu_newton_schulz_work(int batch, int rows, int cols) {
  size_t r = (size_t)(rows < cols ? rows : cols), n = (size_t)rows * (size_t)cols;
  return (size_t)batch * (2 * n + 2 * r * r + 1);
}

static void gemm(cublasOperation_t ta, int m, int n, int k, float alpha, const float *A, int lda, long long sa,
                 const float *B, int ldb, long long sb, float beta, float *C, int ldc, long long sc, int batch) {
  cu_blas_check(cublasGemmStridedBatchedEx(cu.blas, ta, CUBLAS_OP_N, m, n, k, &alpha, A, CUDA_R_32F, lda, sa, B,
                                           CUDA_R_32F, ldb, sb, &beta, C, CUDA_R_32F, ldc, sc, batch,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "Newton-Schulz (cublasGemmStridedBatchedEx)");
  if (cu.sync_each) cu_check(cudaStreamSynchronize(cu.stream), "Newton-Schulz");
}

static void copy(float *dst, const float *src, size_t n) {
  cu_check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, cu.stream), "Newton-Schulz copy");
}

void rt_cu_newton_schulz(float *out, const float *g, int batch, int rows, int cols, float scale, float *work) {
  const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  int tr = rows > cols, r = tr ? cols : rows, k = tr ? rows : cols; /* X is (r, k) row-major, r <= k */
  long long n = (long long)rows * cols, rr = (long long)r * r;
  float *X = work, *Y = X + batch * n, *A = Y + batch * n, *B = A + batch * rr, *inv = B + batch * rr;
  long ln = (long)n;
  cu_launch(K_NS_INV_NORM, (unsigned)batch, 256, (void *[]){&inv, &g, &ln});
  cu_launch3(K_NS_PREP, cu_blocks(n, 256), (unsigned)batch, 1, 256, (void *[]){&X, &g, &inv, &rows, &cols, &tr});
  /* cuBLAS is column-major: row-major X (r, k) is Xᵀ (k, r) with ld k to it; A and B are
   * symmetric, so either reading of them is the same */
  for (int it = 0; it < 5; it++) {
    gemm(CUBLAS_OP_T, r, r, k, 1, X, k, n, X, k, n, 0, A, r, rr, batch); /* A = X Xᵀ */
    copy(B, A, (size_t)(batch * rr));
    gemm(CUBLAS_OP_N, r, r, r, c, A, r, rr, A, r, rr, b, B, r, rr, batch); /* B = c A² + b A */
    copy(Y, X, (size_t)(batch * n));
    gemm(CUBLAS_OP_N, k, r, r, 1, Y, k, n, B, r, rr, a, X, k, n, batch); /* X = a X + B X: Xᵀ = a Xᵀ + Xᵀ B */
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

/* The owner's side of a gathered matrix: G up, Newton-Schulz on the device, U down. */
typedef struct {
  float *dev;   /* device scratch */
  size_t elems; /* its values */
} OrthCtx;

static void orth_on_device(real *U, const real *G, int rows, int cols, void *ctx) {
  OrthCtx *o = ctx;
  size_t n = (size_t)rows * (size_t)cols;
  if (n + rt_cu_newton_schulz_work(1, rows, cols) > o->elems)
    rt_cuda_fail("Muon", "a gathered matrix does not fit Muon's device scratch (regenerate with this mtc)");
  rt_cuda_upload(o->dev, G, n * sizeof(float));
  rt_cu_newton_schulz(o->dev, o->dev, 1, rows, cols, muon_scale(rows, cols), o->dev + n);
  rt_cuda_download(U, o->dev, n * sizeof(float));
}

void rt_cu_muon_group(MPI_Comm comm, int ranks, float *param, float *mom, const float *grad, const RtTensor *t, int nt,
                      int g, int64_t S, float grad_scale, const RtMuon *h, float *dwork, size_t dwork_elems,
                      float *hwork, void *counts, RtMuonStats *st) {
  int me;
  MPI_Comm_rank(comm, &me);
  int64_t lo = (int64_t)me * S, hi = lo + S;
  if (dwork_elems <= (size_t)S) rt_cuda_fail("Muon", "the device scratch is smaller than a shard");
  float *N = dwork, *ns = dwork + S; /* N: the Nesterov gradients (then updates) at shard indices */
  size_t ns_elems = dwork_elems - (size_t)S;
  float mu = h->momentum;
  RT_FOR_PIECES(t, nt, g, lo, hi, {
    (void)first;
    if (T->muon) momentum(mom + at, grad + at, N + at, len, grad_scale, mu);
  })
  /* the gathered matrices' Nesterov gradients to the host first and their exchange started, so
   * that it flies while the batches of matrices held here run on the GPU */
  bool moving = false;
  for (int i = 0; i < nt && !moving; i++) {
    const RtTensor *T = &t[i];
    for (int k = 0; T->group == g && T->muon && k < (T->experts ? T->experts : 1); k++) {
      int64_t a = rt_expert_at(T, k), n = T->rows * T->cols;
      if (a + n > (a / S + 1) * S) moving = true;
    }
  }
  RtMuonXchg xs;
  if (moving) {
    rt_cuda_download(hwork, N, (size_t)S * sizeof(float));
    rt_muon_exchange_start(comm, ranks, hwork, t, nt, g, S, hwork + S, counts, &xs);
  }
  /* matrices whole in this shard: runs of same-shaped neighbours (a layer's experts of one
   * tensor) as batches, as many as the scratch holds; orthogonalized in place in N */
  for (int i = 0; i < nt; i++) {
    const RtTensor *T = &t[i];
    if (T->group != g || !T->muon) continue;
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
      apply(param + (a - lo), x, b * n, h);
      if (st) st->local += b;
    }
  }
  if (!moving) return;
  /* the others at their owners (one all-to-all there and one back), each on the owner's GPU */
  OrthCtx o = {ns, ns_elems};
  rt_muon_exchange_finish(&xs, orth_on_device, &o, st);
  rt_cuda_upload(N, hwork, (size_t)S * sizeof(float));
  for (int i = 0; i < nt; i++) {
    const RtTensor *T = &t[i];
    if (T->group != g || !T->muon) continue;
    int64_t n = T->rows * T->cols;
    for (int k = 0; k < (T->experts ? T->experts : 1); k++) {
      int64_t a = rt_expert_at(T, k), from = a > lo ? a : lo, to = a + n < hi ? a + n : hi;
      if (a + n <= (a / S + 1) * S || from >= to) continue; /* held whole somewhere, or not here */
      apply(param + (from - lo), N + (from - lo), to - from, h);
    }
  }
}
