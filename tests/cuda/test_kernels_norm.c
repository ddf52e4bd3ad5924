/* test_kernels_norm.c — test_kernels' checks of the elementwise ops and activations, the
 * embeddings, the norms and the bias (templates/kernels/10-norm.cu, 30-elementwise.cu): the cuda
 * ops against the cpu ops (test_kernels.h). */
#include "test_kernels.h"


/* rt_add, rt_accumulate, rt_copy, rt_zero, SwiGLU and GELU over NE values. */
void test_elementwise(void) {
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
  /* the fused gate|up rows: a's NE values as rows of 2 x 17 (g | u), the last few unused */
  enum { GF = 17, GR = NE / (2 * GF) };
  ref_swiglu_rows_forward(out, a, GR, GF), rt_swiglu_rows_forward(dout, da, GR, GF);
  check_dev("swiglu_rows_forward", dout, out, (size_t)GR * GF, TOL);
  ref_swiglu_rows_backward(dg, dh, a, GR, GF), rt_swiglu_rows_backward(ddg, ddh, da, GR, GF);
  check_dev("swiglu_rows_backward", ddg, dg, (size_t)GR * 2 * GF, TOL);
  ref_gelu_forward(out, a, NE), rt_gelu_forward(dout, da, NE);
  check_dev("gelu_forward", dout, out, NE, TOL);
  ref_gelu_backward(dg, dh, a, NE), rt_gelu_backward(ddg, ddh, da, NE);
  check_dev("gelu_backward", ddg, dg, NE, TOL);
}

/* Embeddings (tokens, learned positions), RMSNorm, qk-norm, LayerNorm and the bias, forward and
 * backward; gradients start non-zero (backward adds). */
void test_norms(void) {
  int32_t *tok = (int32_t *)host(N);
  for (int i = 0; i < N; i++) tok[i] = rnd_index(V);
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
  /* the residual add and the norm after it in one kernel */
  float *yy = rnd((size_t)N * C, 4), *res = host((size_t)N * C);
  act *dyy = deva(yy, (size_t)N * C), *dres = deva(NULL, (size_t)N * C);
  ref_add_rmsnorm_forward(res, out, rstd, x, yy, w, N, C, 1e-5f);
  rt_add_rmsnorm_forward(dres, dout, drstd, dx_, dyy, dw_, N, C, 1e-5f);
  check_dev("add_rmsnorm_forward res", dres, res, (size_t)N * C, TOL);
  check_dev("add_rmsnorm_forward out", dout, out, (size_t)N * C, TOL);
  /* (the cuda side sums the squares of res rounded to act, as rt_add then rt_rmsnorm_forward do; the
   * cpu's res is fp32: bf16's rounding of res, ~2^-9 relative, moves rstd by as much) */
  check_dev("add_rmsnorm_forward rstd", drstd, rstd, N, 4e-3);

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
}
