/* test_kernels_moe.c — test_kernels' checks of the MoE ops besides the experts' GEMMs: routers,
 * the balancing losses, the permutation, gather and combine, the expert loads and the bias update
 * (templates/kernels/70-moe.cu, 75-seq-aux.cu): the cuda ops against the cpu ops (test_kernels.h). */
#include "test_kernels.h"


/* Router (softmax, and sigmoid with a bias), balancing loss, permutation, gather and combine.
 * Expert 3's logits are far below the rest, so the softmax router never picks it. */
void test_moe(void) {
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
