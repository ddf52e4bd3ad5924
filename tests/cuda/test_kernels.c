/* test_kernels.c — the cuda backend's ops against the cpu backend's, as a generated program
 * calls them: the mtrt_ops.h API over device pointers (runtime/cuda/ops.c, ops_moe.c: cuBLAS
 * GEMMs (the router's logits too), the experts' grouped GEMMs, the kernels of
 * templates/kernels/NN-*.cu) and the device optimizer (train_cuda.c, muon_cuda.c's
 * Newton-Schulz), forward and backward on random inputs.
 *
 * The cuda runtime is set up as train.c does it: rt_cuda_setup with kernels.cu after a prelude
 * of the test's shapes, fp32 storage (ACT_FLOAT), as compiler/emit_prog.c writes it. Three
 * passes, each a fresh set-up:
 *   fp32 GEMMs (MTC_GEMM=fp32), flash attention            tight, but bf16 tensor-core attention
 *   fp32 GEMMs, simple attention (MTC_ATTENTION=simple)    tight everywhere
 *   bf16 GEMMs (the default, CUBLAS_COMPUTE_32F_FAST_16BF) loose where a GEMM is involved
 * The reference is the cpu backend's ops, linked under ref_ names (tests/cuda/ref_ops.cmake):
 * ref_matmul_forward is runtime/cpu's rt_matmul_forward, rt_matmul_forward the cuda one.
 * An error is max |cuda − cpu| / max |cpu| over a tensor; the last lines are the table of
 * errors per op and pass.
 *   usage: test_kernels TEMPLATES/kernels/NN-*.cu... (in name order: the generated kernels.cu's body)
 * Without a GPU it prints why and exits 77 (ctest: skipped); tests/cuda_emu runs it on the CPU.
 *
 * Built twice from this one file (tests/CMakeLists.txt): test_kernels against mtrt_cuda_f32act
 * (act = float, kernels.cu with ACT_FLOAT: the tight checks above), and test_kernels_bf16 against
 * mtrt_cuda, the runtime the generated programs link (MTRT_ACT_BF16: act is bf16, kernels.cu
 * without ACT_FLOAT, cuBLAS with bf16 operands and CUBLAS_COMPUTE_32F, the bf16-only casts). In the
 * bf16 build every act buffer is uploaded as bf16 (deva: the host's float rounded to nearest
 * even) and read back as float (check_dev on an act pointer); the random inputs are drawn
 * bf16-exact (rnd), so the cpu reference sees the very values the device holds and only the
 * rounding of the device's own results and intermediates counts. Its passes are flash and simple
 * attention (MTC_GEMM does not apply to bf16 operands); its tolerances are at ACT_TOL below. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mtrt_cuda.h"
#include "mtrt_ops.h" /* rt_: the cuda ops (mtrt_cuda), device pointers */
#include "mtrt_optim.h"
#include "ref_ops.h" /* ref_: the cpu ops, host pointers */

#ifdef MTRT_ACT_BF16
#define MTRT_ACT_IS_BF16 1
#else
#define MTRT_ACT_IS_BF16 0
#endif

/* Shapes: B sequences of T tokens, C hidden, NH query / NKV KV heads of HD, V vocabulary in
 * chunks of CH, E experts (top K) of width F, NE elementwise values. T is two flash tiles of 64
 * and HD a multiple of 16, so both attention kernels exist; C is no multiple of a row kernel's
 * 128 threads; CH leaves a partial last chunk; NE is no multiple of the 4-value vectors (the
 * scalar tail runs). */
enum { B = 2, T = 128, N = B * T, C = 96, NH = 4, NKV = 2, HD = 32, V = 256, CH = 96, E = 8, K = 2, F = 48 };
enum { NE = 1003, OC = 80 /* a linear layer's outputs */ };
#define THETA 10000.0f
typedef struct {
  const char *name, *gemm, *attention; /* $MTC_GEMM, $MTC_ATTENTION (NULL: flash) */
  double gemm_tol, attn_tol;           /* for outputs of GEMMs, of the attention kernels */
} Pass;
#ifndef MTRT_ACT_BF16
#define TOL 1e-4 /* fp32 arithmetic in another order, fast-math exp */
static const Pass passes[] = {
    {"fp32/flash", "fp32", NULL, TOL, 2e-2},
    {"fp32/simple", "fp32", "simple", TOL, TOL},
    {"bf16/flash", "bf16", NULL, 2e-2, 2e-2},
};
#else
/* bf16 activations. An error is max |cuda − cpu| / max |cpu| over a tensor, the inputs exact
 * (rnd draws bf16 values): what is left is the rounding of act results to bf16 (unit roundoff
 * u = 2^-9 = 1.95e-3 of the value, at most u of the max), plus, where a kernel or a chain of ops
 * stores an intermediate in bf16 and computes on (swiglu's backward reads its bf16 h, rope over
 * a tensor rotated before, the attention backward from the device's bf16 out), a few more
 * roundings, each at most u of the max. ACT_TOL = 8u = 1.6e-2 allows 8 such roundings.
 * GEMMs (cuBLAS, bf16 operands, fp32 accumulation) and reductions over n terms: the fp32 sums are
 * exact to ~n·2^-24 (< 1e-4 for n ≤ 1000), so their results are off by the output's rounding
 * and the rounded intermediates (the experts' g, u, h feed the next GEMM; each term carries u,
 * summed over the reduction's n ≤ 520 terms of random sign: ~u·√n of the typical term, while
 * the max result grows as √n of it too): ACT_TOL holds there as well. The attention kernels'
 * own bf16 tensor-core products (flash) are as in the fp32 pass above (2e-2): 2·ACT_TOL with
 * the bf16 stores on top; the backward 2× that as in every pass. */
#define ACT_TOL 1.6e-2
#define TOL ACT_TOL
static const Pass passes[] = {
    {"bf16act/flash", "bf16", NULL, ACT_TOL, 2 * ACT_TOL},
    {"bf16act/simple", "bf16", "simple", ACT_TOL, ACT_TOL},
};
#endif
enum { NPASS = sizeof passes / sizeof passes[0] };

/* ---- results: the error of every check, per pass ---- */
enum { MAXRES = 128 };
static struct {
  const char *name;
  double err[NPASS], tol[NPASS];
} res[MAXRES];
static int nres, pass;

/* Records check `name`'s error in this pass; a failure when above tol (or NaN). */
static void record(const char *name, double err, double tol) {
  int i = 0;
  while (i < nres && strcmp(res[i].name, name) != 0) i++;
  if (i == nres) {
    if (nres == MAXRES) fprintf(stderr, "test_kernels: too many checks\n"), exit(1);
    res[nres++].name = name;
    for (int p = 0; p < NPASS; p++) res[i].err[p] = NAN, res[i].tol[p] = -1;
  }
  res[i].err[pass] = err, res[i].tol[pass] = tol;
  if (!(err <= tol)) fprintf(stderr, "  FAIL %s (%s): error %.3e above %.0e\n", name, passes[pass].name, err, tol);
  CHECK(err <= tol);
}

/* max |got − ref| / max |ref| over n values; NaN when got holds a NaN */
static double err_of(const float *got, const float *ref, size_t n) {
  double d = 0, s = 1e-30;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - ref[i]);
    if (isnan(e)) return NAN;
    d = fmax(d, e), s = fmax(s, fabs(ref[i]));
  }
  return d / s;
}

/* ---- memory: host and device buffers of one pass, freed at its end ---- */
enum { MAXBUF = 320 };
static void *hbufs[MAXBUF], *dbufs[MAXBUF];
static int nh, nd;
static unsigned seed = 1;

/* act <-> float on the host. bf16: the upper 16 bits of the float, rounded to nearest even (as
 * kernels.cu's cast_bf16 and __float2bfloat16_rn; the inputs are finite); float: itself. */
#ifdef MTRT_ACT_BF16
static act to_act(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (act){(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
#else
static act to_act(float f) { return f; }
#endif
/* f as act holds it: bf16-exact in the bf16 build */
static float act_exact(float f) { return mtrt_act_float(to_act(f)); }

/* n zeroed floats (or ints) on the host */
static float *host(size_t n) {
  if (nh == MAXBUF) fprintf(stderr, "test_kernels: too many buffers\n"), exit(1);
  return hbufs[nh++] = calloc(n, sizeof(float));
}
/* n values uniform in [−scale/2, scale/2) */
static float *rnd(size_t n, float scale) {
  float *x = host(n);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = act_exact(scale * ((float)(seed >> 8) / 16777216.0f - 0.5f)); /* bf16-exact in the bf16 build */
  }
  return x;
}
/* bytes on the device (rt_cuda_alloc: zeroed), a copy of src unless NULL */
static void *dev(const void *src, size_t bytes) {
  char err[256];
  void *d = rt_cuda_alloc(bytes, err, sizeof err);
  if (!d || nd == MAXBUF) fprintf(stderr, "test_kernels: %s\n", d ? "too many buffers" : err), exit(1);
  if (src) rt_cuda_upload(d, src, bytes);
  return dbufs[nd++] = d;
}
/* n floats (ints) on the device, as dev */
static float *devf(const float *x, size_t n) { return dev(x, n * sizeof(float)); }
static int32_t *devi(const int32_t *x, size_t n) { return dev(x, n * sizeof(int32_t)); }
/* n act values on the device (zeroed when x is NULL, else x converted by to_act) */
static act *deva(const float *x, size_t n) {
  act *h = x ? malloc(n * sizeof(act)) : NULL;
  for (size_t i = 0; x && i < n; i++) h[i] = to_act(x[i]);
  act *d = dev(h, n * sizeof(act));
  free(h);
  return d;
}
/* Frees every buffer of the pass. */
static void free_pass(void) {
  while (nd) rt_cuda_free(dbufs[--nd]);
  while (nh) free(hbufs[--nh]);
}

/* Check `name`: n floats of device buffer d against the reference. */
static void check_real(const char *name, const float *d, const float *ref, size_t n, double tol) {
#ifdef MTRT_ACT_BF16
  /* an fp32 result (rstd, lse, logits, router weights, losses, the optimizer's state) of
   * bf16-exact inputs is fp32 arithmetic as in the fp32 build: 1e-4, not ACT_TOL (the flash
   * attention's lse keeps its pass's 2 ACT_TOL: its tensor-core products are bf16) */
  if (tol == ACT_TOL) tol = 1e-4;
#endif
  float *got = host(n);
  rt_cuda_download(got, d, n * sizeof *got);
  record(name, err_of(got, ref, n), tol);
}
#ifdef MTRT_ACT_BF16
/* Check `name`: n act values of device buffer d, read back as float, against the reference. */
static void check_act(const char *name, const act *d, const float *ref, size_t n, double tol) {
  act *raw = malloc(n * sizeof *raw);
  float *got = host(n);
  rt_cuda_download(raw, d, n * sizeof *raw);
  for (size_t i = 0; i < n; i++) got[i] = mtrt_act_float(raw[i]);
  free(raw);
  record(name, err_of(got, ref, n), tol);
}
/* check_dev: check_act for an act buffer, check_real for an fp32 one */
#define check_dev(name, d, ref, n, tol) \
  _Generic((d), act *: check_act, const act *: check_act, default: check_real)(name, d, ref, n, tol)
#else
#define check_dev check_real
#endif
/* Check `name`: n ints of device buffer d equal the reference (the error is the mismatch count). */
static void check_ints(const char *name, const int32_t *d, const int32_t *ref, size_t n) {
  int32_t *got = (int32_t *)host(n);
  rt_cuda_download(got, d, n * sizeof *got);
  int bad = 0;
  for (size_t i = 0; i < n; i++) bad += got[i] != ref[i];
  record(name, bad, 0);
}
/* Check `name`: a scalar, relative to the reference. */
static void check_scalar(const char *name, double got, double ref, double tol) {
#ifdef MTRT_ACT_BF16
  if (tol == ACT_TOL) tol = 1e-4; /* an fp32 loss of bf16-exact inputs: as check_real */
#endif
  record(name, fabs(got - ref) / fmax(fabs(ref), 1e-30), tol);
}

/* ---- the checks: each draws its inputs, runs both backends, compares ---- */

/* rt_add, rt_accumulate, rt_copy, rt_zero, SwiGLU and GELU over NE values. */
static void elementwise(void) {
  float *a = rnd(NE, 8), *b = rnd(NE, 2), *out = host(NE);
  act *da = deva(a, NE), *db = deva(b, NE), *dout = deva(NULL, NE);
  ref_add(out, a, b, NE), rt_add(dout, da, db, NE);
  check_dev("add", dout, out, NE, TOL);
  ref_accumulate(out, a, NE), rt_accumulate(dout, da, NE);
  check_dev("accumulate", dout, out, NE, TOL);
  rt_copy(dout, db, NE);
  check_dev("copy", dout, b, NE, 0);
  rt_zero(dout, NE);
  check_dev("zero", dout, host(NE), NE, 0);
  /* rt_cast_to_act of fp32 values that bf16 cannot hold (a/3): rounded to nearest even, as the
   * host's to_act (the bf16 build's cast_bf16 kernel; the fp32 build's copy) */
  float *third = host(NE), *cast = host(NE);
  for (int i = 0; i < NE; i++) third[i] = a[i] / 3, cast[i] = act_exact(third[i]);
  rt_cast_to_act(dout, devf(third, NE), NE);
  check_dev("cast_to_act", dout, cast, NE, 0);

  float *dh = rnd(NE, 2), *dg = rnd(NE, 1), *du = rnd(NE, 1);
  act *ddh = deva(dh, NE), *ddg = deva(dg, NE), *ddu = deva(du, NE);
  ref_swiglu_forward(out, a, b, NE), rt_swiglu_forward(dout, da, db, NE);
  check_dev("swiglu_forward", dout, out, NE, TOL);
  ref_swiglu_backward(dg, du, dh, a, b, NE), rt_swiglu_backward(ddg, ddu, ddh, da, db, NE);
  check_dev("swiglu_backward dg", ddg, dg, NE, TOL);
  check_dev("swiglu_backward du", ddu, du, NE, TOL);
  ref_gelu_forward(out, a, NE), rt_gelu_forward(dout, da, NE);
  check_dev("gelu_forward", dout, out, NE, TOL);
  ref_gelu_backward(dg, dh, a, NE), rt_gelu_backward(ddg, ddh, da, NE);
  check_dev("gelu_backward", ddg, dg, NE, TOL);
}

/* Embedding, RMSNorm and RoPE, forward and backward; gradients start non-zero (backward adds). */
static void norm_embed_rope(void) {
  int32_t *tok = (int32_t *)host(N);
  for (int i = 0; i < N; i++) tok[i] = (int32_t)((seed = seed * 1664525u + 1013904223u) >> 8) % V;
  float *wte = rnd((size_t)V * C, 2), *out = host((size_t)N * C), *dwte = rnd((size_t)V * C, 1), *dy = rnd((size_t)N * C, 1);
  int32_t *dtok = devi(tok, N);
  act *dwte_ = deva(wte, (size_t)V * C), *dout = deva(NULL, (size_t)N * C), *ddwte = deva(dwte, (size_t)V * C);
  act *ddy = deva(dy, (size_t)N * C);
  ref_embedding_forward(out, tok, wte, N, C), rt_embedding_forward(dout, dtok, dwte_, N, C);
  check_dev("embedding_forward", dout, out, (size_t)N * C, 0);
  ref_embedding_backward(dwte, dy, tok, N, C), rt_embedding_backward(ddwte, ddy, dtok, N, C);
  check_dev("embedding_backward", ddwte, dwte, (size_t)V * C, TOL);
  /* learned positions (wpe of T + 3 rows; the last 3 get no gradient) */
  size_t np_ = (size_t)(T + 3) * C;
  float *wpe = rnd(np_, 2), *dwpe = rnd(np_, 1);
  act *dwpe_ = deva(wpe, np_), *ddwpe = deva(dwpe, np_);
  ref_position_forward(out, wpe, B, T, C), rt_position_forward(dout, dwpe_, B, T, C);
  check_dev("position_forward", dout, out, (size_t)N * C, TOL);
  ref_position_backward(dwpe, dy, B, T, C), rt_position_backward(ddwpe, ddy, B, T, C);
  check_dev("position_backward", ddwpe, dwpe, np_, TOL);

  float *x = rnd((size_t)N * C, 4), *w = rnd(C, 2), *rstd = host(N), *dx = rnd((size_t)N * C, 1), *dw = rnd(C, 1);
  float *drstd = devf(NULL, N);
  act *dx_ = deva(x, (size_t)N * C), *dw_ = deva(w, C), *ddx = deva(dx, (size_t)N * C);
  act *ddw = deva(dw, C);
  ref_rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f), rt_rmsnorm_forward(dout, drstd, dx_, dw_, N, C, 1e-5f);
  check_dev("rmsnorm_forward out", dout, out, (size_t)N * C, TOL);
  check_dev("rmsnorm_forward rstd", drstd, rstd, N, TOL);
  ref_rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C), rt_rmsnorm_backward(ddx, ddw, ddy, dx_, dw_, drstd, N, C);
  check_dev("rmsnorm_backward dx", ddx, dx, (size_t)N * C, TOL);
  check_dev("rmsnorm_backward dw", ddw, dw, C, TOL);

  /* qk-norm: per head (N·NH rows of HD) and full (N rows of NH·HD), eps 1e-6 */
  for (int full = 0; full < 2; full++) {
    size_t n = (size_t)N * NH * HD;
    int64_t rows = full ? N : (int64_t)N * NH;
    int width = full ? NH * HD : HD;
    float *qx = rnd(n, 4), *qw = rnd((size_t)width, 2), *qo = host(n), *qr = host((size_t)rows), *qdy = rnd(n, 1);
    float *qdx = rnd(n, 1), *qdw = rnd((size_t)width, 1);
    float *qr_ = devf(NULL, (size_t)rows);
    act *qx_ = deva(qx, n), *qw_ = deva(qw, (size_t)width), *qo_ = deva(NULL, n);
    act *qdy_ = deva(qdy, n), *qdx_ = deva(qdx, n), *qdw_ = deva(qdw, (size_t)width);
    ref_qk_norm_forward(qo, qr, qx, qw, rows, width, 1e-6f), rt_qk_norm_forward(qo_, qr_, qx_, qw_, rows, width, 1e-6f);
    check_dev(full ? "qk_norm_forward full" : "qk_norm_forward per_head", qo_, qo, n, TOL);
    ref_qk_norm_backward(qdx, qdw, qdy, qx, qw, qr, rows, width);
    rt_qk_norm_backward(qdx_, qdw_, qdy_, qx_, qw_, qr_, rows, width);
    check_dev(full ? "qk_norm_backward full dx" : "qk_norm_backward per_head dx", qdx_, qdx, n, TOL);
    check_dev(full ? "qk_norm_backward full dw" : "qk_norm_backward per_head dw", qdw_, qdw, (size_t)width, TOL);
  }
  /* LayerNorm, with a bias and without (mean, rstd reuse rstd's buffers) */
  float *b = rnd(C, 1), *db = rnd(C, 1), *mean = host(N), *dmean = devf(NULL, N);
  act *db_ = deva(b, C), *ddb = deva(db, C);
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    const float *bb = with_bias ? b : NULL;
    const act *dbb = with_bias ? db_ : NULL;
    ref_layernorm_forward(out, mean, rstd, x, w, bb, N, C, 1e-5f);
    rt_layernorm_forward(dout, dmean, drstd, dx_, dw_, dbb, N, C, 1e-5f);
    check_dev(with_bias ? "layernorm_forward+b out" : "layernorm_forward out", dout, out, (size_t)N * C, TOL);
    check_dev("layernorm_forward rstd", drstd, rstd, N, TOL);
    ref_layernorm_backward(dx, dw, with_bias ? db : NULL, dy, x, w, mean, rstd, N, C);
    rt_layernorm_backward(ddx, ddw, with_bias ? ddb : NULL, ddy, dx_, dw_, dmean, drstd, N, C);
    check_dev(with_bias ? "layernorm_backward+b dx" : "layernorm_backward dx", ddx, dx, (size_t)N * C, TOL);
    check_dev("layernorm_backward dw", ddw, dw, C, TOL);
    if (with_bias) check_dev("layernorm_backward db", ddb, db, C, TOL);
  }
  ref_bias_forward(out, b, N, C), rt_bias_forward(dout, db_, N, C);
  check_dev("bias_forward", dout, out, (size_t)N * C, TOL);
  ref_bias_backward(db, dy, N, C), rt_bias_backward(ddb, ddy, N, C);
  check_dev("bias_backward", ddb, db, C, TOL);

  size_t nq = (size_t)N * NH * HD, nk = (size_t)N * NKV * HD;
  float *q = rnd(nq, 2), *k = rnd(nk, 2);
  act *dq = deva(q, nq), *dk = deva(k, nk);
  ref_rope_forward(q, B, T, NH, HD, THETA), rt_rope_forward(dq, B, T, NH, HD, THETA);
  check_dev("rope_forward", dq, q, nq, TOL);
  ref_rope_backward(k, B, T, NKV, HD, THETA), rt_rope_backward(dk, B, T, NKV, HD, THETA);
  check_dev("rope_backward", dk, k, nk, TOL);
  /* Llama 3.1's scaling with original_max_position 64 over T 128: the pairs' wavelengths fall
   * below 16 (kept), between 16 and 64 (blended) and above 64 (divided by 8) */
  ref_rope_llama3_forward(q, B, T, NH, HD, THETA, 8, 1, 4, 64), rt_rope_llama3_forward(dq, B, T, NH, HD, THETA, 8, 1, 4, 64);
  check_dev("rope_llama3_forward", dq, q, nq, TOL);
  ref_rope_llama3_backward(k, B, T, NKV, HD, THETA, 8, 1, 4, 64), rt_rope_llama3_backward(dk, B, T, NKV, HD, THETA, 8, 1, 4, 64);
  check_dev("rope_llama3_backward", dk, k, nk, TOL);
  /* YaRN: factor 4 over original_max_position 32, beta 32 / 1 (the ramp inside HD's pairs),
   * attention factor 1.1386 (= 0.1 ln 4 + 1) */
  ref_rope_yarn_forward(q, B, T, NH, HD, THETA, 4, 32, 32, 1, 1.1386f), rt_rope_yarn_forward(dq, B, T, NH, HD, THETA, 4, 32, 32, 1, 1.1386f);
  check_dev("rope_yarn_forward", dq, q, nq, TOL);
  ref_rope_yarn_backward(k, B, T, NKV, HD, THETA, 4, 32, 32, 1, 1.1386f), rt_rope_yarn_backward(dk, B, T, NKV, HD, THETA, 4, 32, 32, 1, 1.1386f);
  check_dev("rope_yarn_backward", dk, k, nk, TOL);
  /* MLA: RoPE on channels [8, 24) of each head (stride HD), and the keys and values built from
   * kv_b_proj's output (nope 8, rope 16, v 24 per head) and the shared RoPE key */
  ref_rope_strided_forward(q + 8, B, T, NH, HD, 16, THETA, 1, 1, 1, 1, 1),
      rt_rope_strided_forward(dq + 8, B, T, NH, HD, 16, THETA, 1, 1, 1, 1, 1);
  check_dev("rope_strided_forward", dq, q, nq, TOL);
  ref_rope_strided_backward(k + 8, B, T, NKV, HD, 16, THETA, 1, 1, 1, 1, 1),
      rt_rope_strided_backward(dk + 8, B, T, NKV, HD, 16, THETA, 1, 1, 1, 1, 1);
  check_dev("rope_strided_backward", dk, k, nk, TOL);
  /* with YaRN over the 16 rotated channels (factor 4, orig 32, beta 32 / 1, attention factor 1.1386) */
  ref_rope_strided_forward(q + 8, B, T, NH, HD, 16, THETA, 4, 32, 32, 1, 1.1386f),
      rt_rope_strided_forward(dq + 8, B, T, NH, HD, 16, THETA, 4, 32, 32, 1, 1.1386f);
  check_dev("rope_strided_forward yarn", dq, q, nq, TOL);
  ref_rope_strided_backward(k + 8, B, T, NKV, HD, 16, THETA, 4, 32, 32, 1, 1.1386f),
      rt_rope_strided_backward(dk + 8, B, T, NKV, HD, 16, THETA, 4, 32, 32, 1, 1.1386f);
  check_dev("rope_strided_backward yarn", dk, k, nk, TOL);
  enum { MNOPE = 8, MROPE = 16, MVD = 24 };
  size_t nb = (size_t)N * NH * (MNOPE + MVD), nmk = (size_t)N * NH * (MNOPE + MROPE), nmv = (size_t)N * NH * MVD;
  float *kvb = rnd(nb, 2), *kr = rnd((size_t)N * MROPE, 2), *mk = host(nmk), *mv = host(nmv);
  act *dkvb_ = deva(kvb, nb), *dkr_ = deva(kr, (size_t)N * MROPE), *dmk = deva(NULL, nmk), *dmv = deva(NULL, nmv);
  ref_mla_kv_forward(mk, mv, kvb, kr, N, NH, MNOPE, MROPE, MVD, 1.5f),
      rt_mla_kv_forward(dmk, dmv, dkvb_, dkr_, N, NH, MNOPE, MROPE, MVD, 1.5f);
  check_dev("mla_kv_forward k", dmk, mk, nmk, TOL);
  check_dev("mla_kv_forward v", dmv, mv, nmv, TOL);
  float *gk = rnd(nmk, 1), *gv = rnd(nmv, 1);
  act *dgk = deva(gk, nmk), *dgv = deva(gv, nmv);
  ref_mla_kv_backward(kvb, kr, gk, gv, N, NH, MNOPE, MROPE, MVD, 1.5f),
      rt_mla_kv_backward(dkvb_, dkr_, dgk, dgv, N, NH, MNOPE, MROPE, MVD, 1.5f);
  check_dev("mla_kv_backward dkvb", dkvb_, kvb, nb, TOL);
  check_dev("mla_kv_backward dkr", dkr_, kr, (size_t)N * MROPE, TOL);
}

/* A linear layer (cuBLAS GEMMs): out (N, OC) = x wᵀ; dx and dw added to. */
static void matmul(const Pass *p) {
  size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
  float *x = rnd(nx, 2), *w = rnd(nw, 1), *out = host(no), *dy = rnd(no, 2), *dx = rnd(nx, 1), *dw = rnd(nw, 1);
  act *dx_ = deva(x, nx), *dw_ = deva(w, nw), *dout = deva(NULL, no), *ddy = deva(dy, no), *ddx = deva(dx, nx);
  act *ddw = deva(dw, nw);
  ref_matmul_forward(out, x, w, NULL, N, C, OC), rt_matmul_forward(dout, dx_, dw_, NULL, N, C, OC);
  check_dev("matmul_forward", dout, out, no, p->gemm_tol);
  ref_matmul_backward(dx, dw, NULL, dy, x, w, N, C, OC), rt_matmul_backward(ddx, ddw, NULL, ddy, dx_, dw_, N, C, OC);
  check_dev("matmul_backward dx", ddx, dx, nx, p->gemm_tol);
  check_dev("matmul_backward dw", ddw, dw, nw, p->gemm_tol);
  /* with a bias (model.bias): bias_forward after the GEMM, bias_backward for dbias */
  float *bias = rnd(OC, 1), *dbias = rnd(OC, 1);
  act *dbias_ = deva(bias, OC), *ddbias = deva(dbias, OC);
  ref_matmul_forward(out, x, w, bias, N, C, OC), rt_matmul_forward(dout, dx_, dw_, dbias_, N, C, OC);
  check_dev("matmul_forward+b", dout, out, no, p->gemm_tol);
  ref_matmul_backward(NULL, NULL, dbias, dy, x, w, N, C, OC), rt_matmul_backward(NULL, NULL, ddbias, ddy, dx_, dw_, N, C, OC);
  check_dev("matmul_backward dbias", ddbias, dbias, OC, TOL);
  /* the router's linear layer: fp32 logits (N, E) from act operands, dx and dw added to */
  size_t nl = (size_t)N * E, nr = (size_t)E * C;
  float *rw = rnd(nr, 1), *lg = host(nl), *dlg = rnd(nl, 1), *rdx = rnd(nx, 1), *rdw = rnd(nr, 1);
  float *dlg_out = devf(NULL, nl), *ddlg = devf(dlg, nl);
  act *drw = deva(rw, nr), *drdx = deva(rdx, nx), *drdw = deva(rdw, nr);
  ref_router_logits_forward(lg, x, rw, N, C, E), rt_router_logits_forward(dlg_out, dx_, drw, N, C, E);
  check_dev("router_logits_forward", dlg_out, lg, nl, p->gemm_tol);
  ref_router_logits_backward(rdx, rdw, dlg, x, rw, N, C, E), rt_router_logits_backward(drdx, drdw, ddlg, dx_, drw, N, C, E);
  check_dev("router_logits_backward dx", drdx, rdx, nx, p->gemm_tol);
  check_dev("router_logits_backward dw", drdw, rdw, nr, p->gemm_tol);
}

/* Causal GQA attention: lse is (B, NH, T) on the cpu and (tokens, NH) on the GPU (each backend
 * reads only its own); each backward runs from its own forward's out and lse. */
static void attention(const Pass *p) {
  size_t nq = (size_t)N * NH * HD, nk = (size_t)N * NKV * HD;
  float *q = rnd(nq, 4), *k = rnd(nk, 4), *v = rnd(nk, 2), *out = host(nq), *lse = host((size_t)N * NH);
  float *dy = rnd(nq, 2), *dq = rnd(nq, 1), *dk = rnd(nk, 1), *dv = rnd(nk, 1), *lse_t = host((size_t)N * NH);
  float *dlse = devf(NULL, (size_t)N * NH);
  act *dq_ = deva(q, nq), *dk_ = deva(k, nk), *dv_ = deva(v, nk), *dout = deva(NULL, nq);
  act *ddy = deva(dy, nq), *ddq = deva(dq, nq), *ddk = deva(dk, nk), *ddv = deva(dv, nk);
  ref_attention_forward(out, lse, q, k, v, B, T, NH, NKV, HD, HD), rt_attention_forward(dout, dlse, dq_, dk_, dv_, B, T, NH, NKV, HD, HD);
  check_dev("attention_forward out", dout, out, nq, p->attn_tol);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) lse_t[((size_t)b * T + t) * NH + h] = lse[((size_t)b * NH + h) * T + t];
  check_dev("attention_forward lse", dlse, lse_t, (size_t)N * NH, p->attn_tol);
  ref_attention_backward(dq, dk, dv, dy, q, k, v, out, lse, B, T, NH, NKV, HD, HD);
  rt_attention_backward(ddq, ddk, ddv, ddy, dq_, dk_, dv_, dout, dlse, B, T, NH, NKV, HD, HD);
  check_dev("attention_backward dq", ddq, dq, nq, 2 * p->attn_tol);
  check_dev("attention_backward dk", ddk, dk, nk, 2 * p->attn_tol);
  check_dev("attention_backward dv", ddv, dv, nk, 2 * p->attn_tol);
}

/* Router (softmax, and sigmoid with a bias), balancing loss, permutation, gather and combine.
 * Expert 3's logits are far below the rest, so the softmax router never picks it. */
static void moe(void) {
  size_t nl = (size_t)N * E, na = (size_t)N * K, nx = (size_t)N * C, np = na * C;
  float *logits = rnd(nl, 8), *bias = rnd(E, 1), *wts = host(na), *dl = rnd(nl, 1), *dwts = rnd(na, 1);
  for (int n = 0; n < N; n++) logits[(size_t)n * E + 3] = -20;
  int32_t *idx = (int32_t *)host(na), *didx = devi(NULL, na);
  float *dlog = devf(logits, nl), *dwts_ = devf(NULL, na), *ddl = devf(dl, nl), *ddwts = devf(dwts, na);
  act *dbias = deva(bias, E);
  for (int sig = 1; sig >= 0; sig--) { /* softmax last: its choices go on */
    float *b = sig ? bias : NULL;
    act *db = sig ? dbias : NULL;
    ref_router_forward(idx, wts, logits, b, N, E, K, sig), rt_router_forward(didx, dwts_, dlog, db, N, E, K, sig);
    check_ints(sig ? "router_forward sigmoid idx" : "router_forward softmax idx", didx, idx, na);
    check_dev(sig ? "router_forward sigmoid wts" : "router_forward softmax wts", dwts_, wts, na, TOL);
    ref_router_backward(dl, dwts, logits, idx, wts, N, E, K, sig), rt_router_backward(ddl, ddwts, dlog, didx, dwts_, N, E, K, sig);
    check_dev(sig ? "router_backward sigmoid" : "router_backward softmax", ddl, dl, nl, TOL);
    if (sig) { /* group-limited routing: 4 groups of 2, the best 2 kept (with the bias) */
      int32_t *gidx = (int32_t *)host(na), *dgidx = devi(NULL, na);
      float *gw = host(na), *dgw = devf(NULL, na);
      ref_router_group_forward(gidx, gw, logits, bias, N, E, K, 4, 2, true);
      rt_router_group_forward(dgidx, dgw, dlog, dbias, N, E, K, 4, 2, true);
      check_ints("router_group_forward idx", dgidx, gidx, na);
      check_dev("router_group_forward wts", dgw, gw, na, TOL);
    }
    /* the weights' conventions on the same choices: norm_topk_prob false, routed_scaling_factor */
    static const char *const rw_name[2][2] = {{"router_weights softmax raw", "router_weights softmax norm"},
                                              {"router_weights sigmoid raw", "router_weights sigmoid norm"}};
    static const char *const rwb_name[2][2] = {{"router_weights_bwd softmax raw", "router_weights_bwd softmax norm"},
                                               {"router_weights_bwd sigmoid raw", "router_weights_bwd sigmoid norm"}};
    for (int norm = 0; norm < 2; norm++) {
      float *rw = host(na), *rdl = rnd(nl, 1), *drw = devf(NULL, na), *drdl = devf(rdl, nl);
      ref_router_weights(rw, logits, idx, N, E, K, sig, norm, 2.5f);
      rt_router_weights(drw, dlog, didx, N, E, K, sig, norm, 2.5f);
      check_dev(rw_name[sig][norm], drw, rw, na, TOL);
      ref_router_weights_backward(rdl, dwts, logits, idx, rw, N, E, K, sig, norm, 2.5f);
      rt_router_weights_backward(drdl, ddwts, dlog, didx, drw, N, E, K, sig, norm, 2.5f);
      check_dev(rwb_name[sig][norm], drdl, rdl, nl, TOL);
    }
  }

  /* Qwen2-MoE's gated shared expert: rows of C, one logit per token */
  {
    float *gx = rnd(nx, 2), *gl = rnd(N, 3), *gy = rnd(nx, 1), *gdy = rnd(nx, 1), *gdx = rnd(nx, 1), *gdl = rnd(N, 1);
    float *gl_ = devf(gl, N);
    act *gx_ = deva(gx, nx), *gy_ = deva(gy, nx), *gdy_ = deva(gdy, nx), *gdx_ = deva(gdx, nx);
    float *gdl_ = devf(gdl, N);
    ref_sigmoid_gate_forward(gy, gx, gl, N, C), rt_sigmoid_gate_forward(gy_, gx_, gl_, N, C);
    check_dev("sigmoid_gate_forward", gy_, gy, nx, TOL);
    ref_sigmoid_gate_backward(gdx, gdl, gdy, gx, gl, N, C), rt_sigmoid_gate_backward(gdx_, gdl_, gdy_, gx_, gl_, N, C);
    check_dev("sigmoid_gate_backward dx", gdx_, gdx, nx, TOL);
    check_dev("sigmoid_gate_backward dlogit", gdl_, gdl, N, TOL);
  }

  /* alpha 1: the gradient is about 1e-3, as the start values */
  float *scratch = host(3 * E), *dscratch = devf(NULL, 3 * E), *dla = rnd(nl, 2e-3f), *ddla = devf(dla, nl);
  check_scalar("aux_loss_forward", rt_aux_loss_forward(dlog, didx, N, E, K, 1, dscratch),
               ref_aux_loss_forward(logits, idx, N, E, K, 1, scratch), TOL);
  ref_aux_loss_backward(dla, logits, idx, N, E, K, 1, 0.5f, scratch), rt_aux_loss_backward(ddla, dlog, didx, N, E, K, 1, 0.5f, dscratch);
  check_dev("aux_loss_backward", ddla, dla, nl, TOL);
  /* the sequence-wise loss (B sequences of T), softmax and normalized-sigmoid affinities, alpha 1 */
  for (int sig = 0; sig < 2; sig++) {
    float *ss = host(2 * (size_t)B * E), *dss = devf(NULL, 2 * (size_t)B * E), *sdl = rnd(nl, 2e-3f), *dsdl = devf(sdl, nl);
    check_scalar(sig ? "seq_aux_loss_forward sigmoid" : "seq_aux_loss_forward softmax",
                 rt_seq_aux_loss_forward(dlog, didx, N, E, K, T, sig, 1, dss),
                 ref_seq_aux_loss_forward(logits, idx, N, E, K, T, sig, 1, ss), TOL);
    ref_seq_aux_loss_backward(sdl, logits, idx, N, E, K, T, sig, 1, 0.5f, ss);
    rt_seq_aux_loss_backward(dsdl, dlog, didx, N, E, K, T, sig, 1, 0.5f, dss);
    check_dev(sig ? "seq_aux_loss_backward sigmoid" : "seq_aux_loss_backward softmax", dsdl, sdl, nl, TOL);
  }

  int32_t *pos = (int32_t *)host(na), *off = (int32_t *)host(E + 1), *dpos = devi(NULL, na), *doff = devi(NULL, E + 1);
  ref_moe_permute(pos, off, idx, N, E, K), rt_moe_permute(dpos, doff, didx, N, E, K);
  check_ints("moe_permute pos", dpos, pos, na);
  check_ints("moe_permute offsets", doff, off, E + 1);
  CHECK_EQ(off[3], off[4]); /* expert 3 has no rows */

  float *x = rnd(nx, 2), *xp = host(np), *dxp = rnd(np, 1), *dx = rnd(nx, 1);
  act *dx_ = deva(x, nx), *dxp_ = deva(NULL, np);
  act *ddxp = deva(dxp, np), *ddx = deva(dx, nx);
  ref_moe_gather(xp, x, pos, N, K, C), rt_moe_gather(dxp_, dx_, dpos, N, K, C);
  check_dev("moe_gather", dxp_, xp, np, 0);
  ref_moe_gather_backward(dx, dxp, pos, N, K, C), rt_moe_gather_backward(ddx, ddxp, dpos, N, K, C);
  check_dev("moe_gather_backward", ddx, dx, nx, TOL);

  float *yp = rnd(np, 2), *y = rnd(nx, 1), *dy = rnd(nx, 2), *dyp = rnd(np, 1) /* overwritten */, *dw = rnd(na, 1);
  float *ddw = devf(dw, na);
  act *dyp_ = deva(yp, np), *dy_ = deva(y, nx), *ddy = deva(dy, nx), *ddyp = deva(dyp, np);
  ref_moe_combine(y, yp, wts, pos, N, K, C), rt_moe_combine(dy_, dyp_, dwts_, dpos, N, K, C);
  check_dev("moe_combine", dy_, y, nx, TOL);
  ref_moe_combine_backward(dyp, dw, dy, yp, wts, pos, N, K, C);
  rt_moe_combine_backward(ddyp, ddw, ddy, dyp_, dwts_, dpos, N, K, C);
  check_dev("moe_combine_backward dyp", ddyp, dyp, np, TOL);
  check_dev("moe_combine_backward dwts", ddw, dw, na, TOL);

  /* auxiliary-loss-free balancing: each expert's load counted from the choices (added to), then
   * the bias moved by it, in a shard [2, 7) of a group holding the E biases at offset 1 (experts
   * 1 to 5 inside it, expert 3 never chosen) */
  float *load = rnd(E, 0), *dload = devf(load, E), *shard = rnd(5, 1), *dshard = devf(shard, 5);
  ref_moe_count(load, idx, (int64_t)na), rt_moe_count(dload, devi(idx, na), (int64_t)na);
  check_dev("moe_count", dload, load, E, 0);
  ref_router_bias_update(shard, 2, 5, 1, load, E, 0.01f), rt_router_bias_update(dshard, 2, 5, 1, dload, E, 0.01f);
  check_dev("router_bias_update", dshard, shard, 5, TOL);
}

/* The routed experts (grouped GEMMs) over uneven rows per expert, one of them 0 and one 1, with
 * the weights in whole-expert shards of PER experts (the last one short), SHARD elements apart
 * with a gap after each: expert e at (e / PER) · SHARD + (e % PER) · F · C. */
static void experts(const Pass *p) {
  static const int rows[E] = {90, 0, 130, 7, 64, 1, 100, 120};
  enum { PER = 3 };
  const int64_t SHARD = (int64_t)PER * F * C + 17;
  int32_t *off = (int32_t *)host(E + 1);
  for (int e = 0; e < E; e++) off[e + 1] = off[e] + rows[e];
  CHECK_EQ(off[E], N * K);
  size_t nx = (size_t)N * K * C, nh_ = (size_t)N * K * F, nw = (size_t)((E + PER - 1) / PER) * (size_t)SHARD;
  float *xp = rnd(nx, 2), *wg = rnd(nw, 1), *wu = rnd(nw, 1), *wd = rnd(nw, 1);
  float *yp = host(nx), *g = host(nh_), *u = host(nh_), *h = host(nh_);
  int32_t *doff = devi(off, E + 1);
  act *dxp_ = deva(xp, nx), *dwg_ = deva(wg, nw), *dwu_ = deva(wu, nw), *dwd_ = deva(wd, nw);
  act *dyp_ = deva(NULL, nx), *dg_ = deva(NULL, nh_), *du_ = deva(NULL, nh_), *dh_ = deva(NULL, nh_);
  ref_experts_forward(yp, g, u, h, xp, wg, wu, wd, off, E, PER, SHARD, C, F);
  rt_experts_forward(dyp_, dg_, du_, dh_, dxp_, dwg_, dwu_, dwd_, doff, E, PER, SHARD, C, F);
  check_dev("experts_forward g", dg_, g, nh_, p->gemm_tol);
  check_dev("experts_forward u", du_, u, nh_, p->gemm_tol);
  check_dev("experts_forward h", dh_, h, nh_, p->gemm_tol);
  check_dev("experts_forward yp", dyp_, yp, nx, p->gemm_tol);

  float *dyp = rnd(nx, 2), *dxp = rnd(nx, 1), *dwg = rnd(nw, 1), *dwu = rnd(nw, 1), *dwd = rnd(nw, 1);
  float *sh = host(nh_), *sg = host(nh_), *su = host(nh_);
  act *ddyp = deva(dyp, nx), *ddxp = deva(dxp, nx), *ddwg = deva(dwg, nw), *ddwu = deva(dwu, nw), *ddwd = deva(dwd, nw);
  act *dsh = deva(NULL, nh_), *dsg = deva(NULL, nh_), *dsu = deva(NULL, nh_);
  ref_experts_backward(dxp, dwg, dwu, dwd, dyp, xp, g, u, h, wg, wu, wd, off, E, PER, SHARD, C, F, sh, sg, su);
  rt_experts_backward(ddxp, ddwg, ddwu, ddwd, ddyp, dxp_, dg_, du_, dh_, dwg_, dwu_, dwd_, doff, E, PER, SHARD, C, F, dsh, dsg, dsu);
  check_dev("experts_backward dxp", ddxp, dxp, nx, p->gemm_tol);
  check_dev("experts_backward dwg", ddwg, dwg, nw, p->gemm_tol);
  check_dev("experts_backward dwu", ddwu, dwu, nw, p->gemm_tol);
  check_dev("experts_backward dwd", ddwd, dwd, nw, p->gemm_tol);
}

/* GELU experts (wg NULL: no gate), on the same uneven rows. */
static void experts_gelu(const Pass *p) {
  static const int rows[E] = {90, 0, 130, 7, 64, 1, 100, 120};
  int32_t *off = (int32_t *)host(E + 1);
  for (int e = 0; e < E; e++) off[e + 1] = off[e] + rows[e];
  size_t nx = (size_t)N * K * C, nh_ = (size_t)N * K * F, nw = (size_t)E * F * C;
  float *xp = rnd(nx, 2), *wu = rnd(nw, 1), *wd = rnd(nw, 1), *yp = host(nx), *u = host(nh_), *h = host(nh_);
  int32_t *doff = devi(off, E + 1);
  act *dxp_ = deva(xp, nx), *dwu_ = deva(wu, nw), *dwd_ = deva(wd, nw);
  act *dyp_ = deva(NULL, nx), *du_ = deva(NULL, nh_), *dh_ = deva(NULL, nh_);
  ref_experts_forward(yp, NULL, u, h, xp, NULL, wu, wd, off, E, E, 0, C, F);
  rt_experts_forward(dyp_, NULL, du_, dh_, dxp_, NULL, dwu_, dwd_, doff, E, E, 0, C, F);
  check_dev("experts_gelu_forward h", dh_, h, nh_, p->gemm_tol);
  check_dev("experts_gelu_forward yp", dyp_, yp, nx, p->gemm_tol);
  float *dyp = rnd(nx, 2), *dxp = rnd(nx, 1), *dwu = rnd(nw, 1), *dwd = rnd(nw, 1), *sh = host(nh_), *su = host(nh_);
  act *ddyp = deva(dyp, nx), *ddxp = deva(dxp, nx), *ddwu = deva(dwu, nw), *ddwd = deva(dwd, nw);
  act *dsh = deva(NULL, nh_), *dsu = deva(NULL, nh_);
  ref_experts_backward(dxp, NULL, dwu, dwd, dyp, xp, NULL, u, h, NULL, wu, wd, off, E, E, 0, C, F, sh, NULL, su);
  rt_experts_backward(ddxp, NULL, ddwu, ddwd, ddyp, dxp_, NULL, du_, dh_, NULL, dwu_, dwd_, doff, E, E, 0, C, F, dsh, NULL, dsu);
  check_dev("experts_gelu_backward dxp", ddxp, dxp, nx, p->gemm_tol);
  check_dev("experts_gelu_backward dwu", ddwu, dwu, nw, p->gemm_tol);
  check_dev("experts_gelu_backward dwd", ddwd, dwd, nw, p->gemm_tol);
}

/* LM head and cross-entropy over vocabulary chunks of CH; dloss 64 makes the gradients about
 * as large as the start values they are added to. */
static void lm_head(const Pass *p) {
  size_t nx = (size_t)N * C, nw = (size_t)V * C;
  int32_t *tgt = (int32_t *)host(N);
  for (int i = 0; i < N; i++) tgt[i] = (int32_t)((seed = seed * 1664525u + 1013904223u) >> 8) % V;
  float *x = rnd(nx, 2), *w = rnd(nw, 1), *lse = host(N), *scratch = host(2 * (size_t)N * CH), *dx = rnd(nx, 1), *dw = rnd(nw, 1);
  int32_t *dtgt = devi(tgt, N);
  float *dlse = devf(NULL, N), *dscratch = devf(NULL, 2 * (size_t)N * CH);
  act *dx_ = deva(x, nx), *dw_ = deva(w, nw);
  act *ddx = deva(dx, nx), *ddw = deva(dw, nw);
  check_scalar("lm_head_ce_forward loss", rt_lm_head_ce_forward(dlse, dx_, dw_, dtgt, N, C, V, CH, dscratch),
               ref_lm_head_ce_forward(lse, x, w, tgt, N, C, V, CH, scratch), p->gemm_tol);
  check_dev("lm_head_ce_forward lse", dlse, lse, N, p->gemm_tol);
  ref_lm_head_ce_backward(dx, dw, x, w, tgt, lse, N, C, V, CH, scratch, 64);
  rt_lm_head_ce_backward(ddx, ddw, dx_, dw_, dtgt, dlse, N, C, V, CH, dscratch, 64);
  check_dev("lm_head_ce_backward dx", ddx, dx, nx, p->gemm_tol);
  check_dev("lm_head_ce_backward dw", ddw, dw, nw, p->gemm_tol);
}

/* The device optimizer against the host's: AdamW over a shard [LO, HI) of group 0 that cuts
 * tensors, skips the Muon tensor and another group's, and decays only where decay is set; the
 * squared norm over more values than the kernel's 1024 blocks of 256 cover in one sweep. */
static void optimizer(void) {
  enum { LO = 250, HI = 880, S = HI - LO, NS = 300000 };
  static const RtTensor t[] = {
      {.name = "w", .group = 0, .offset = 0, .count = 300, .decay = true},
      {.name = "norm", .group = 0, .offset = 300, .count = 100, .init_one = true},
      {.name = "muon", .group = 0, .offset = 400, .count = 200, .muon = true, .decay = true},
      {.name = "experts", .group = 0, .offset = 600, .count = 150, .experts = 2, .decay = true},
      {.name = "other", .group = 1, .offset = 0, .count = 700, .decay = true},
  };
  RtAdamW hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3};
  float *par = rnd(S, 2), *m = rnd(S, 0.2f), *v = rnd(S, 0.02f), *grad = rnd(S, 2);
  for (int i = 0; i < S; i++) v[i] = fabsf(v[i]);
  float *dpar = devf(par, S), *dm = devf(m, S), *dv = devf(v, S), *dgrad = devf(grad, S);
  rt_adamw_shard(par, m, v, grad, t, 5, 0, LO, HI, 0.5f, &hp);
  rt_cu_adamw_shard(dpar, dm, dv, dgrad, t, 5, 0, LO, HI, 0.5f, &hp);
  check_dev("adamw param", dpar, par, S, TOL);
  check_dev("adamw m", dm, m, S, TOL);
  check_dev("adamw v", dv, v, S, TOL);
  float *g = rnd(NS, 2);
  check_scalar("sum_squares", rt_cu_sum_squares(devf(g, NS), NS), rt_sum_squares(g, NS), 1e-5);
}

/* Eigenvalues of the symmetric n × n matrix a (destroyed) by cyclic Jacobi rotations (double). */
static void jacobi(double *a, int n, double *eig) {
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) off += a[p * n + q] * a[p * n + q];
    if (off < 1e-22) break;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) {
        double apq = a[p * n + q];
        if (fabs(apq) < 1e-300) continue;
        double th = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        double t = (th >= 0 ? 1 : -1) / (fabs(th) + sqrt(th * th + 1)), c = 1 / sqrt(t * t + 1), sn = t * c;
        for (int k = 0; k < n; k++) {
          double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - sn * akq, a[k * n + q] = sn * akp + c * akq;
        }
        for (int k = 0; k < n; k++) {
          double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - sn * aqk, a[q * n + k] = sn * apk + c * aqk;
        }
      }
  }
  for (int i = 0; i < n; i++) eig[i] = a[i * n + i];
}

/* The range [lo, hi] of the singular values of u (rows, cols, host) / scale: the square roots of
 * the eigenvalues of the short side's Gram matrix. */
static void sv_range(const float *u, int rows, int cols, double scale, double *lo, double *hi) {
  int r = rows < cols ? rows : cols, k = rows < cols ? cols : rows;
  double *gram = calloc((size_t)r * r, sizeof(double)), *eig = malloc(sizeof(double) * (size_t)r);
  for (int i = 0; i < r; i++)
    for (int j = 0; j < r; j++)
      for (int l = 0; l < k; l++)
        gram[i * r + j] += rows < cols ? (double)u[i * cols + l] * u[j * cols + l] : (double)u[l * cols + i] * u[l * cols + j];
  jacobi(gram, r, eig);
  *lo = 1e9, *hi = 0;
  for (int i = 0; i < r; i++) {
    double sv = sqrt(fmax(eig[i], 0)) / scale;
    *lo = fmin(*lo, sv), *hi = fmax(*hi, sv);
  }
  free(gram), free(eig);
}

/* Muon's Newton-Schulz on the device (rt_cu_newton_schulz: batches of fp32 cuBLAS strided GEMMs)
 * against the host's (rt_newton_schulz, times Muon's scale), for a batch of tall matrices (the
 * transposed path) and one of wide ones, in place as the Muon step runs it; and the singular
 * values of every result in the quintic's band, about [0.68, 1.13] (checked as [0.65, 1.16]). */
static void newton_schulz(void) {
  static const int shapes[][3] = {{3, 40, 24}, {2, 16, 32}}; /* batch, rows, cols */
  for (int s = 0; s < 2; s++) {
    int b = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2], n = rows * cols;
    float scale = (float)(0.2 * sqrt((double)(rows > cols ? rows : cols)));
    float *g = rnd((size_t)b * n, 2), *ref = host((size_t)b * n), *got = host((size_t)b * n);
    float *work = host(rt_newton_schulz_work(rows, cols));
    for (int i = 0; i < b; i++) {
      rt_newton_schulz(ref + (size_t)i * n, g + (size_t)i * n, rows, cols, work);
      for (int j = 0; j < n; j++) ref[(size_t)i * n + j] *= scale;
    }
    float *dg = devf(g, (size_t)b * n), *dw = devf(NULL, rt_cu_newton_schulz_work(b, rows, cols));
    rt_cu_newton_schulz(dg, dg, b, rows, cols, scale, dw);
    check_dev(s ? "newton_schulz wide" : "newton_schulz tall (batch 3)", dg, ref, (size_t)b * n, 1e-4);
    rt_cuda_download(got, dg, sizeof(float) * (size_t)b * n);
    double lo = 1e9, hi = 0;
    for (int i = 0; i < b; i++) {
      double l, h;
      sv_range(got + (size_t)i * n, rows, cols, scale, &l, &h);
      lo = fmin(lo, l), hi = fmax(hi, h);
    }
    printf("test_kernels: Newton-Schulz %d x (%d, %d) on the device: singular values in [%.3f, %.3f]\n", b, rows, cols,
           lo, hi);
    CHECK(lo >= 0.65 && hi <= 1.16);
  }
}

/* ---- the passes ---- */

/* kernels.cu: the files at paths[0..n) (templates/kernels/NN-*.cu in name order) after the prelude
 * of the test's shapes, as emit_prog.c writes it (malloc'ed; NULL when a file cannot be read). */
static char *kernels_source(char **paths, int n, size_t *len) {
  char pre[512];
  int pl = snprintf(pre, sizeof pre,
                    "%s#define TOKENS %d\n#define SEQ_LEN %d\n#define HIDDEN %d\n#define HEADS %d\n"
                    "#define KV_HEADS %d\n#define HEAD_DIM %d\n#define ROPE_THETA ((float)%.17g)\n#define RMS_EPS 1e-5f\n"
                    "#define VOCAB %d\n#define VOCAB_CHUNK %d\n#define EXPERTS %d\n#define TOP_K %d\n\n",
                    MTRT_ACT_IS_BF16 ? "" : "#define ACT_FLOAT\n", N, T, C, NH, NKV, HD, (double)THETA, V, CH, E,
                    K);
  char *src = malloc((size_t)pl + 1);
  memcpy(src, pre, (size_t)pl);
  *len = (size_t)pl;
  for (int i = 0; i < n; i++) {
    FILE *f = fopen(paths[i], "rb");
    if (!f) return fprintf(stderr, "test_kernels: cannot open %s\n", paths[i]), free(src), NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    src = realloc(src, *len + (size_t)size + 1);
    *len += fread(src + *len, 1, (size_t)size, f);
    fclose(f);
  }
  src[*len] = 0;
  return src;
}

/* One pass: the cuda runtime set up as train.c does (MTC_GEMM, MTC_ATTENTION as the pass says),
 * every check, teardown. Returns -1 when the set-up fails. */
static int run_pass(const Pass *p, const char *src, size_t len) {
  setenv("MTC_GEMM", p->gemm, 1);
  if (p->attention) setenv("MTC_ATTENTION", p->attention, 1);
  else unsetenv("MTC_ATTENTION");
  RtCudaConfig cfg = {src, len, MTRT_CUDA_INCLUDE, N, NH, E, K, 4 << 20};
  static char err[1 << 16];
  if (rt_cuda_setup(&cfg, 0, err, sizeof err) != 0) return fprintf(stderr, "test_kernels: %s\n", err), -1;
  char line[1024];
  rt_cuda_describe(line, sizeof line);
  printf("test_kernels: pass %s: %s\n", p->name, line);
  CHECK(strstr(line, p->attention ? "attention simple" : "attention flash") != NULL);
  seed = 1; /* every pass draws the same inputs */
  elementwise();
  norm_embed_rope();
  matmul(p);
  attention(p);
  moe();
  experts(p);
  experts_gelu(p);
  lm_head(p);
  optimizer();
  newton_schulz();
  rt_cuda_sync("test_kernels");
  free_pass();
  rt_cuda_teardown();
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* in order with the runtime's notes on stderr */
  int gpus = 0;
  cudaError_t e = cudaGetDeviceCount(&gpus);
  if (e != cudaSuccess || gpus == 0) {
    printf("test_kernels: skipped: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 77;
  }
  if (argc < 2) return fprintf(stderr, "usage: test_kernels TEMPLATES/kernels/*.cu\n"), 2;
  size_t len;
  char *src = kernels_source(argv + 1, argc - 1, &len);
  if (!src) return 1;
  for (pass = 0; pass < NPASS; pass++)
    if (run_pass(&passes[pass], src, len) != 0) return free(src), 1;
  free(src);
  printf("test_kernels: max |cuda - cpu| / max |cpu| per op / limit\n  %-30s", "op");
  for (int p = 0; p < NPASS; p++) printf("  %-17s", passes[p].name);
  for (int i = 0; i < nres; i++) {
    printf("\n  %-30s", res[i].name);
    for (int p = 0; p < NPASS; p++)
      printf("  %8.2e/%-6.0e%s", res[i].err[p], res[i].tol[p], res[i].err[p] <= res[i].tol[p] ? " " : "!");
  }
  printf("\n");
  return CHECK_DONE("test_kernels");
}
