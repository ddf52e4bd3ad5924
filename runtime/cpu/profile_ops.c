/* profile_ops.c — the cpu backend's timed entry points for `train --profile` (mtrt_profile.h).
 * The linker's --wrap=NAME (runtime/CMakeLists.txt, MTRT_PROFILE_WRAPS) sends every call of NAME
 * from another object to __wrap_NAME here, which times __real_NAME (the op itself) when a
 * profile is on. The ops' sources are untouched. GEMMs are timed where they all pass, CBLAS;
 * an op's remaining seconds (the loss's softmax, the experts' activation) go to its own class.
 * Bytes are counted as the cost model counts them (compiler/cost_kernel.c): 2 B per activation
 * value (bf16) read or written once per pass, the backward twice the forward. */
#include <cblas.h>

#include "mtrt_comm.h"
#include "mtrt_ops.h"
#include "mtrt_profile.h"

#define B2 2.0 /* bytes of an activation value, as the cost model counts them */

#define TIMED(cls, flops, bytes, call)                                                                         \
  do {                                                                                                         \
    if (!rt_prof_on) {                                                                                         \
      call;                                                                                                    \
      return;                                                                                                  \
    }                                                                                                          \
    double t0_ = rt_prof_begin();                                                                              \
    call;                                                                                                      \
    rt_prof_end((cls), t0_, (flops), (bytes));                                                                 \
  } while (0)

/* ---- GEMMs: the class is the enclosing op's (grouped inside the experts) ---- */
static RtProfClass gemm_class = RT_PROF_GEMM;
static int gemm_flops = 1; /* 0 inside an op that counts its own FLOPs (attention) */

#define GEMM_ARGS                                                                                              \
  OPENBLAS_CONST enum CBLAS_ORDER o, OPENBLAS_CONST enum CBLAS_TRANSPOSE ta,                                   \
      OPENBLAS_CONST enum CBLAS_TRANSPOSE tb, OPENBLAS_CONST blasint M, OPENBLAS_CONST blasint N,              \
      OPENBLAS_CONST blasint K
void __real_cblas_sgemm(GEMM_ARGS, OPENBLAS_CONST float alpha, OPENBLAS_CONST float *A, OPENBLAS_CONST blasint lda,
                        OPENBLAS_CONST float *B, OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta, float *C,
                        OPENBLAS_CONST blasint ldc);
void __wrap_cblas_sgemm(GEMM_ARGS, OPENBLAS_CONST float alpha, OPENBLAS_CONST float *A, OPENBLAS_CONST blasint lda,
                        OPENBLAS_CONST float *B, OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta, float *C,
                        OPENBLAS_CONST blasint ldc) {
  TIMED(gemm_class, gemm_flops * 2.0 * M * N * K, 0, __real_cblas_sgemm(o, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
}
void __real_cblas_dgemm(GEMM_ARGS, OPENBLAS_CONST double alpha, OPENBLAS_CONST double *A,
                        OPENBLAS_CONST blasint lda, OPENBLAS_CONST double *B, OPENBLAS_CONST blasint ldb,
                        OPENBLAS_CONST double beta, double *C, OPENBLAS_CONST blasint ldc);
void __wrap_cblas_dgemm(GEMM_ARGS, OPENBLAS_CONST double alpha, OPENBLAS_CONST double *A,
                        OPENBLAS_CONST blasint lda, OPENBLAS_CONST double *B, OPENBLAS_CONST blasint ldb,
                        OPENBLAS_CONST double beta, double *C, OPENBLAS_CONST blasint ldc) {
  TIMED(gemm_class, gemm_flops * 2.0 * M * N * K, 0, __real_cblas_dgemm(o, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
}

/* ---- the ops: one wrapper per entry point the generated step calls ---- */
#define WRAP(name, params, args, cls, flops, bytes)                                                            \
  __typeof__(name) __real_##name, __wrap_##name;                                                               \
  void __wrap_##name params { TIMED(cls, flops, bytes, __real_##name args); }

/* Attention: the GEMMs inside it (cpu/ops_attention.c: scores, outputs, gradients) are its own time,
 * and its FLOPs the causal count below, not the GEMMs' (whose tiles include masked scores). */
#define WRAP_ATTN(name, params, args, cls, flops)                                                              \
  __typeof__(name) __real_##name, __wrap_##name;                                                               \
  void __wrap_##name params {                                                                                  \
    gemm_class = cls, gemm_flops = 0;                                                                          \
    TIMED(cls, flops, 0, (__real_##name args, gemm_class = RT_PROF_GEMM, gemm_flops = 1));                     \
  }
/* causal: T²/2 scores of q·k (hd) and p·v (vd) each, 2 FLOPs a multiply-add */
static double attn_flops(int B, int T, int nh, int hd, int vd) { return B * (double)T * T * nh * (hd + vd); }

WRAP_ATTN(rt_attention_forward,
     (act * out, real * lse, const act *q, const act *k, const act *v, int B, int T, int nh, int nkv, int hd, int vd),
     (out, lse, q, k, v, B, T, nh, nkv, hd, vd), RT_PROF_ATTENTION_FWD, attn_flops(B, T, nh, hd, vd))
WRAP_ATTN(rt_attention_backward,
     (act * dq, act * dk, act * dv, const act *dout, const act *q, const act *k, const act *v, const act *out,
      const real *lse, int B, int T, int nh, int nkv, int hd, int vd),
     (dq, dk, dv, dout, q, k, v, out, lse, B, T, nh, nkv, hd, vd), RT_PROF_ATTENTION_BWD,
     2.5 * attn_flops(B, T, nh, hd, vd))
WRAP_ATTN(rt_attention_qkv_forward, (act * out, real * lse, const act *qkv, int B, int T, int nh, int nkv, int hd),
          (out, lse, qkv, B, T, nh, nkv, hd), RT_PROF_ATTENTION_FWD, attn_flops(B, T, nh, hd, hd))
WRAP_ATTN(rt_attention_qkv_backward,
          (act * dqkv, const act *dout, const act *qkv, const act *out, const real *lse, int B, int T, int nh, int nkv,
           int hd),
          (dqkv, dout, qkv, out, lse, B, T, nh, nkv, hd), RT_PROF_ATTENTION_BWD, 2.5 * attn_flops(B, T, nh, hd, hd))
WRAP(rt_rope_qkv_forward, (act * x, int B, int T, int nh, int nkv, int hd, real theta), (x, B, T, nh, nkv, hd, theta),
     RT_PROF_ROPE, 0, B2 * 2 * B * (double)T * (nh + nkv) * hd)
WRAP(rt_rope_qkv_backward, (act * dx, int B, int T, int nh, int nkv, int hd, real theta),
     (dx, B, T, nh, nkv, hd, theta), RT_PROF_ROPE, 0, B2 * 4 * B * (double)T * (nh + nkv) * hd)
/* context parallelism: T queries a rank holds against keys of sequences of S, its causal half on average */
WRAP_ATTN(rt_attention_span_forward,
     (act * out, real * lse, const act *q, const act *k, const act *v, int B, int T, int S, int64_t lo, int64_t hi,
      int nh, int nkv, int hd, int vd),
     (out, lse, q, k, v, B, T, S, lo, hi, nh, nkv, hd, vd), RT_PROF_ATTENTION_FWD,
     B * (double)T * S * nh * (hd + vd))
WRAP_ATTN(rt_attention_span_backward,
     (act * dq, act * dk, act * dv, const act *dout, const act *q, const act *k, const act *v, const act *out,
      const real *lse, act *work, int B, int T, int S, int64_t lo, int64_t hi, int nh, int nkv, int hd, int vd),
     (dq, dk, dv, dout, q, k, v, out, lse, work, B, T, S, lo, hi, nh, nkv, hd, vd), RT_PROF_ATTENTION_BWD,
     2.5 * B * (double)T * S * nh * (hd + vd))
WRAP(rt_rope_span_forward, (act * x, int B, int T, int H, int stride, int rd, real theta, int64_t lo, int64_t hi),
     (x, B, T, H, stride, rd, theta, lo, hi), RT_PROF_ROPE, 0, B2 * 2 * B * (double)T * H * rd)
WRAP(rt_rope_span_backward, (act * dx, int B, int T, int H, int stride, int rd, real theta, int64_t lo, int64_t hi),
     (dx, B, T, H, stride, rd, theta, lo, hi), RT_PROF_ROPE, 0, B2 * 4 * B * (double)T * H * rd)
WRAP(rt_rmsnorm_forward, (act * out, real * rstd, const act *x, const act *w, int N, int C, real eps),
     (out, rstd, x, w, N, C, eps), RT_PROF_NORM, 0, B2 * 2 * N * (double)C)
WRAP(rt_add_rmsnorm_forward,
     (act * res, act * out, real * rstd, const act *x, const act *y, const act *w, int N, int C, real eps),
     (res, out, rstd, x, y, w, N, C, eps), RT_PROF_NORM, 0, B2 * 4 * N * (double)C)
WRAP(rt_rmsnorm_backward,
     (act * dx, real * dw, const act *dout, const act *x, const act *w, const real *rstd, int N, int C),
     (dx, dw, dout, x, w, rstd, N, C), RT_PROF_NORM, 0, B2 * 4 * N * (double)C)
WRAP(rt_layernorm_forward,
     (act * out, real * mean, real * rstd, const act *x, const act *w, const act *b, int N, int C, real eps),
     (out, mean, rstd, x, w, b, N, C, eps), RT_PROF_NORM, 0, B2 * 2 * N * (double)C)
WRAP(rt_layernorm_backward,
     (act * dx, real * dw, real * db, const act *dout, const act *x, const act *w, const real *mean,
      const real *rstd, int N, int C),
     (dx, dw, db, dout, x, w, mean, rstd, N, C), RT_PROF_NORM, 0, B2 * 4 * N * (double)C)
WRAP(rt_qk_norm_forward, (act * out, real * rstd, const act *x, const act *w, int64_t rows, int width, real eps),
     (out, rstd, x, w, rows, width, eps), RT_PROF_NORM, 0, B2 * 2 * (double)rows * width)
WRAP(rt_qk_norm_backward,
     (act * dx, real * dw, const act *dout, const act *x, const act *w, const real *rstd, int64_t rows, int width),
     (dx, dw, dout, x, w, rstd, rows, width), RT_PROF_NORM, 0, B2 * 4 * (double)rows * width)
WRAP(rt_rope_forward, (act * x, int B, int T, int H, int hd, real theta), (x, B, T, H, hd, theta), RT_PROF_ROPE, 0,
     B2 * 2 * B * (double)T * H * hd)
WRAP(rt_rope_backward, (act * dx, int B, int T, int H, int hd, real theta), (dx, B, T, H, hd, theta), RT_PROF_ROPE,
     0, B2 * 4 * B * (double)T * H * hd)
WRAP(rt_swiglu_forward, (act * h, const act *g, const act *u, int64_t n), (h, g, u, n), RT_PROF_ACTIVATION, 0,
     B2 * 3 * (double)n)
WRAP(rt_swiglu_rows_forward, (act * h, const act *gu, int64_t rows, int F), (h, gu, rows, F), RT_PROF_ACTIVATION, 0,
     B2 * 3 * (double)rows * F)
WRAP(rt_swiglu_rows_backward, (act * dgu, const act *dh, const act *gu, int64_t rows, int F), (dgu, dh, gu, rows, F),
     RT_PROF_ACTIVATION, 0, B2 * 5 * (double)rows * F)
WRAP(rt_swiglu_backward, (act * dg, act * du, const act *dh, const act *g, const act *u, int64_t n),
     (dg, du, dh, g, u, n), RT_PROF_ACTIVATION, 0, B2 * 6 * (double)n)
WRAP(rt_gelu_forward, (act * h, const act *x, int64_t n), (h, x, n), RT_PROF_ACTIVATION, 0, B2 * 2 * (double)n)
WRAP(rt_gelu_backward, (act * dx, const act *dh, const act *x, int64_t n), (dx, dh, x, n), RT_PROF_ACTIVATION, 0,
     B2 * 4 * (double)n)
WRAP(rt_moe_gather, (act * xp, const act *x, const int32_t *pos, int N, int K, int C), (xp, x, pos, N, K, C),
     RT_PROF_PERMUTE, 0, B2 * 2 * N * (double)K * C)
WRAP(rt_moe_gather_backward, (act * dx, const act *dxp, const int32_t *pos, int N, int K, int C),
     (dx, dxp, pos, N, K, C), RT_PROF_PERMUTE, 0, B2 * 4 * N * (double)K * C)
WRAP(rt_moe_combine, (act * y, const act *yp, const real *wts, const int32_t *pos, int N, int K, int C),
     (y, yp, wts, pos, N, K, C), RT_PROF_PERMUTE, 0, B2 * 2 * N * (double)K * C)
WRAP(rt_moe_combine_backward,
     (act * dyp, real * dwts, const act *dy, const act *yp, const real *wts, const int32_t *pos, int N, int K, int C),
     (dyp, dwts, dy, yp, wts, pos, N, K, C), RT_PROF_PERMUTE, 0, B2 * 4 * N * (double)K * C)
WRAP(rt_add, (act * out, const act *a, const act *b, size_t n), (out, a, b, n), RT_PROF_ELEMENTWISE, 0,
     B2 * 3 * (double)n)
WRAP(rt_accumulate, (act * acc, const act *x, size_t n), (acc, x, n), RT_PROF_ELEMENTWISE, 0, B2 * 3 * (double)n)
WRAP(rt_zero, (act * x, size_t n), (x, n), RT_PROF_ELEMENTWISE, 0, B2 * (double)n)
WRAP(rt_copy, (act * dst, const act *src, size_t n), (dst, src, n), RT_PROF_ELEMENTWISE, 0, B2 * 2 * (double)n)
WRAP(rt_embedding_forward, (act * out, const int32_t *tok, const act *wte, int N, int C), (out, tok, wte, N, C),
     RT_PROF_ELEMENTWISE, 0, B2 * 2 * N * (double)C)
WRAP(rt_embedding_backward, (real * dwte, const act *dout, const int32_t *tok, int N, int C),
     (dwte, dout, tok, N, C), RT_PROF_ELEMENTWISE, 0, B2 * 4 * N * (double)C)

/* The routed experts: their GEMMs are grouped GEMMs; the rest, the activation (SwiGLU: 3
 * values per unit, GELU 2). rows = offsets[E]. */
__typeof__(rt_experts_forward) __real_rt_experts_forward, __wrap_rt_experts_forward;
void __wrap_rt_experts_forward(act *yp, act *g, act *u, act *h, const act *xp, const act *wg, const act *wu,
                               const act *wd, const int *offsets, int E, int per, int64_t stride, int C, int F) {
  double units = (double)offsets[E] * F;
  gemm_class = RT_PROF_GROUPED_GEMM;
  TIMED(RT_PROF_ACTIVATION, 0, B2 * (wg ? 3 : 2) * units,
        (__real_rt_experts_forward(yp, g, u, h, xp, wg, wu, wd, offsets, E, per, stride, C, F), gemm_class = RT_PROF_GEMM));
}
__typeof__(rt_experts_backward) __real_rt_experts_backward, __wrap_rt_experts_backward;
void __wrap_rt_experts_backward(act *dxp, real *dwg, real *dwu, real *dwd, const act *dyp, const act *xp,
                                const act *g, const act *u, const act *h, const act *wg, const act *wu,
                                const act *wd, const int *offsets, int E, int per, int64_t stride, int C, int F,
                                act *dh, act *dg, act *du) {
  double units = (double)offsets[E] * F;
  gemm_class = RT_PROF_GROUPED_GEMM;
  TIMED(RT_PROF_ACTIVATION, 0, B2 * (wg ? 6 : 4) * units,
        (__real_rt_experts_backward(dxp, dwg, dwu, dwd, dyp, xp, g, u, h, wg, wu, wd, offsets, E, per, stride, C, F, dh, dg, du),
         gemm_class = RT_PROF_GEMM));
}

/* The loss: its GEMMs are GEMMs; the rest, the cross-entropy over N × V logits (the cost
 * model's fused loss: 2 B per logit forward, 4 backward). */
__typeof__(rt_lm_head_ce_forward) __real_rt_lm_head_ce_forward, __wrap_rt_lm_head_ce_forward;
real __wrap_rt_lm_head_ce_forward(real *lse, const act *x, const act *w, const int32_t *targets, int N, int C, int V,
                                  int chunk, real *scratch) {
  if (!rt_prof_on) return __real_rt_lm_head_ce_forward(lse, x, w, targets, N, C, V, chunk, scratch);
  double t0 = rt_prof_begin();
  real loss = __real_rt_lm_head_ce_forward(lse, x, w, targets, N, C, V, chunk, scratch);
  rt_prof_end(RT_PROF_LOSS, t0, 0, B2 * N * (double)V);
  return loss;
}
WRAP(rt_lm_head_ce_backward,
     (act * dx, real * dw, const act *x, const act *w, const int32_t *targets, const real *lse, int N, int C, int V,
      int chunk, real *scratch, real dloss),
     (dx, dw, x, w, targets, lse, N, C, V, chunk, scratch, dloss), RT_PROF_LOSS, 0, B2 * 2 * N * (double)V)

/* ---- collectives: the bytes this rank sends as the cost model counts them (cost.c: the
 * gathered parameters and the exchanged token rows in bf16, 2 B a value, whatever `act` is
 * here; the reduce-scatter's wire as sent, fp32 or bf16), the seconds it is blocked ---- */
static double group_size(MPI_Comm comm) {
  int g = 1;
  MPI_Comm_size(comm, &g);
  return g;
}
WRAP(rt_comm_all_gather_start, (MPI_Comm comm, act * out, const act *in, size_t count, int slot),
     (comm, out, in, count, slot), RT_PROF_ALL_GATHER, 0, (group_size(comm) - 1) * count * B2)
WRAP(rt_comm_all_gather_wait, (int slot), (slot), RT_PROF_ALL_GATHER, 0, 0)
WRAP(rt_comm_reduce_scatter_start,
     (MPI_Comm comm, real * acc, act * in, size_t count, bool bf16, real * wire, int slot),
     (comm, acc, in, count, bf16, wire, slot), RT_PROF_REDUCE_SCATTER, 0,
     (group_size(comm) - 1) * count * (bf16 ? 2.0 : (double)sizeof(real)))
WRAP(rt_comm_reduce_scatter_wait, (int slot), (slot), RT_PROF_REDUCE_SCATTER, 0, 0)
WRAP(rt_comm_all_reduce, (MPI_Comm comm, real * buf, size_t count), (comm, buf, count), RT_PROF_ALL_REDUCE, 0,
     2 * (group_size(comm) - 1) / group_size(comm) * count * sizeof(real))
/* the rows this rank sends to the other ranks of comm (its own stay: a local copy), as the cost
 * model's cost_all_to_all counts them: bytes · (ep − 1) / ep of a uniform exchange */
static double a2a_sent(MPI_Comm comm, const int *scount, int row) {
  int g = 1, me = 0;
  MPI_Comm_size(comm, &g);
  MPI_Comm_rank(comm, &me);
  double rows = 0;
  for (int p = 0; p < g; p++)
    if (p != me) rows += scount[p];
  return rows * row * B2;
}
WRAP(rt_comm_all_to_all_v,
     (MPI_Comm comm, const real *send, const int *scount, const int *sdispl, real *recv, const int *rcount,
      const int *rdispl, int row),
     (comm, send, scount, sdispl, recv, rcount, rdispl, row), RT_PROF_ALL_TO_ALL, 0, a2a_sent(comm, scount, row))
