/* test_kernels_gemm.c — test_kernels' checks of the ops built on GEMMs: linear layers and the
 * router's logits (cuBLAS), the routed experts' grouped GEMMs, the LM head with its chunked
 * cross-entropy (templates/kernels/60-loss.cu), at the pass's gemm_tol: the cuda ops against the
 * cpu ops (test_kernels.h). */
#include "test_kernels.h"


/* A linear layer (cuBLAS GEMMs): out (N, OC) = x wᵀ; dx and dw added to (rt_matmul_backward_set: dx
 * written). */
void test_matmul(const Pass *p) {
  size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
  float *x = rnd(nx, 2), *w = rnd(nw, 1), *out = host(no), *dy = rnd(no, 2), *dx = rnd(nx, 1), *dw = rnd(nw, 1);
  act *dx_ = deva(x, nx), *dw_ = deva(w, nw), *dout = deva(NULL, no), *ddy = deva(dy, no), *ddx = deva(dx, nx);
  act *ddw = deva(dw, nw);
  ref_matmul_forward(out, x, w, NULL, N, C, OC), rt_matmul_forward(dout, dx_, dw_, NULL, N, C, OC);
  check_dev("matmul_forward", dout, out, no, p->gemm_tol);
  ref_matmul_backward(dx, dw, NULL, dy, x, w, N, C, OC), rt_matmul_backward(ddx, ddw, NULL, ddy, dx_, dw_, N, C, OC);
  check_dev("matmul_backward dx", ddx, dx, nx, p->gemm_tol);
  check_dev("matmul_backward dw", ddw, dw, nw, p->gemm_tol);
  /* the first writer of dx (beta 0): dx's old values, non-zero here, are not read; dw still adds */
  ref_matmul_backward_set(dx, dw, NULL, dy, x, w, N, C, OC), rt_matmul_backward_set(ddx, ddw, NULL, ddy, dx_, dw_, N, C, OC);
  check_dev("matmul_backward_set dx", ddx, dx, nx, p->gemm_tol);
  check_dev("matmul_backward_set dw", ddw, dw, nw, 2 * p->gemm_tol);
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


/* The routed experts (the pass's path: the GEMM loop over streams, or the grouped call) over uneven
 * rows per expert, one of them 0 and one 1, with
 * the weights in whole-expert shards of PER experts (the last one short), SHARD elements apart
 * with a gap after each: expert e at (e / PER) · SHARD + (e % PER) · F · C. */
void test_experts(const Pass *p) {
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
void test_experts_gelu(const Pass *p) {
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
void test_lm_head(const Pass *p) {
  size_t nx = (size_t)N * C, nw = (size_t)V * C;
  int32_t *tgt = (int32_t *)host(N);
  for (int i = 0; i < N; i++) tgt[i] = rnd_index(V);
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
