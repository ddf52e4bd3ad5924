/* emit_moe.c — the MoE part of a layer in step.c: router, top-k, dispatch all-to-all (in
 * rounds bounded by the plan's moe_imbalance), the routed experts as grouped GEMMs over whole-
 * expert or flat shards, shared experts, combine; forward and backward. */
#include <string.h>

#include "emit.h"

static bool blocked(const Em *e) { return plan_expert_per(e->El, e->efsdp) > 0; }
static int64_t per_shard(const Em *e) { return plan_expert_per(e->El, e->efsdp); }
static const char *exw(Em *e, const char *mac, long long o) { return mem_printf(e->m, "%s(%lld)", mac, o); }
static const char *exo(Em *e, const char *offs) { return mem_printf(e->m, "I(%s)", offs); }
/* The local experts, then their layout: with whole-expert shards, expert x's weights lie at
 * part + (x / per) * SHARD_EXPERTS_ELEMS + (x % per) * OC * IC (emit_layout.c); flat: per = El,
 * no stride. One call covers every local expert (no host loop over shards). */
static const char *exn(Em *e) {
  long long El = e->El;
  return blocked(e) ? mem_printf(e->m, "%lld, %lld, SHARD_EXPERTS_ELEMS", El, (long long)per_shard(e))
                    : mem_printf(e->m, "%lld, %lld, 0", El, El);
}

/* Whether the routing weights are not rt_router_forward's (renormalized top-k, unscaled): then
 * rt_router_weights recomputes them (model.moe.norm_topk_prob false, routed_scaling_factor). */
static bool reweight(const Em *e) {
  return !e->s->model.moe.norm_topk_prob || e->s->model.moe.routed_scaling_factor != 1;
}

void em_moe_forward(Em *e, int l) {
  int g = e->layer_dense[l], ge = e->layer_experts[l];
  long long N = e->N, C = e->C, E = e->E, K = e->K;
  const char *ln2 = A(e, l, "LN2"), *lg = A(e, l, "LOGITS"), *idx = A(e, l, "IDX"),
             *wts = A(e, l, "WTS"), *pos = A(e, l, "POS"), *offs = A(e, l, "OFFSETS"),
             *xp = e->ep > 1 ? "WS_XP" : A(e, l, "XP"), *yp = A(e, l, "YP");
  P(e, "  rt_router_logits_forward(R(%s), R(%s), W(%lld), %lld, %lld, %lld); /* router (mlp.gate) */\n", lg, ln2,
    (long long)off(e, g, "moe.gate.weight"), N, C, E);
  const MoeSpec *ms = &e->s->model.moe;
  if (ms->topk_group < ms->n_group) /* group-limited (DeepSeek-V3 with sigmoid, V2 with softmax) */
    P(e, "  rt_router_group_forward(I(%s), R(%s), R(%s), %s, %lld, %lld, %lld, %lld, %lld, %s); /* n_group, topk_group */\n",
      idx, wts, lg, ms->router_bias ? mem_printf(e->m, "W(%lld)", (long long)off(e, g, "moe.gate.e_score_correction_bias")) : "NULL",
      N, E, K, (long long)ms->n_group, (long long)ms->topk_group, e->sigmoid ? "true" : "false");
  else if (e->s->model.moe.router_bias)
    P(e, "  rt_router_forward(I(%s), R(%s), R(%s), W(%lld), %lld, %lld, %lld, %s); /* biased selection */\n", idx,
      wts, lg, (long long)off(e, g, "moe.gate.e_score_correction_bias"), N, E, K, e->sigmoid ? "true" : "false");
  else
    P(e, "  rt_router_forward(I(%s), R(%s), R(%s), NULL, %lld, %lld, %lld, %s);\n", idx, wts, lg, N, E, K,
      e->sigmoid ? "true" : "false");
  if (reweight(e))
    P(e, "  rt_router_weights(R(%s), R(%s), I(%s), %lld, %lld, %lld, %s, %s, %.9g); /* norm_topk_prob, "
         "routed_scaling_factor */\n", wts, lg, idx, N, E, K, e->sigmoid ? "true" : "false",
      e->s->model.moe.norm_topk_prob ? "true" : "false", e->s->model.moe.routed_scaling_factor);
  if (e->aux_free)
    P(e, "  if (!recompute) rt_moe_count(R(L%d_LOAD), I(%s), %lld); /* aux_free: tokens per expert */\n", l, idx, N * K);
  else if (e->cp > 1) /* the loss of the whole sequences: f and P averaged over the cp group */
    P(e, "  if (!recompute) {\n    rt_aux_loss_stats(R(%s), I(%s), %lld, %lld, %lld, R(AUX));\n"
         "    rt_comm_cp_mean(c->comm.cp_comm, PLAN_CP, R(AUX) + %lld, %lld);\n"
         "    c->aux_loss += rt_aux_loss_value(R(AUX), %lld, %.9g);\n  }\n", lg, idx, N, E, K, E, 2 * E, E,
      e->s->model.moe.aux_loss_coef);
  else
    P(e, "  real aux = rt_aux_loss_forward(R(%s), I(%s), %lld, %lld, %lld, %.9g, R(AUX)); /* recomputing too: the "
         "backward's statistics */\n  if (!recompute) c->aux_loss += aux;\n", lg, idx, N, E, K, e->s->model.moe.aux_loss_coef);
  if (ms->seq_aux_loss_coef > 0) /* DeepSeek-V2's seq_aux, V3's complementary loss: per sequence of T tokens */
    P(e, "  if (!recompute) c->aux_loss += rt_seq_aux_loss_forward(R(%s), I(%s), %lld, %lld, %lld, %lld, %s, %.9g, R(AUX)); "
         "/* sequence-wise balance loss: N, E, K, T */\n", lg, idx, N, E, K, (long long)e->T, e->sigmoid ? "true" : "false",
      ms->seq_aux_loss_coef);
  P(e, "  rt_moe_permute(I(%s), I(%s), I(%s), %lld, %lld, %lld);\n", pos, offs, idx, N, E, K);
  if (!e->hier) P(e, "  rt_moe_gather(R(%s), R(%s), I(%s), %lld, %lld, %lld);\n", xp, ln2, pos, N, K, C);
  long long wu = off(e, ge, "moe.experts.up_proj.weight"), wd = off(e, ge, "moe.experts.down_proj.weight");
  const char *eg = e->gelu_experts ? "NULL" : mem_printf(e->m, "R(%s)", A(e, l, "EG")), *eu = A(e, l, "EU"),
             *eh = A(e, l, "EH"), *wg = e->gelu_experts ? "NULL" : exw(e, "WE", off(e, ge, "moe.experts.gate_proj.weight"));
  if (e->ep == 1) {
    P(e, "  rt_experts_forward(R(%s), %s, R(%s), R(%s), R(%s), %s, %s, %s, %s, %s, %lld, %lld); "
         "/* experts, hidden, expert width%s */\n",
      yp, eg, eu, eh, xp, wg, exw(e, "WE", wu), exw(e, "WE", wd), exo(e, offs), exn(e), C,
      (long long)e->Fe, e->gelu_experts ? "; GELU: no gate" : "");
  } else if (e->hier) {
    const char *xe = A(e, l, "XE"), *eo = A(e, l, "EOFF");
    P(e, "  /* expert parallelism over %lld ranks on %lld nodes, the hierarchical all-to-all (mtrt_hier.h): a token's row\n"
         "   * crosses once to each node holding one of its experts, then goes to them inside the node; the relay there\n"
         "   * sums the token's gated outputs before the one crossing back; in rounds of at most MOE_CAP_ROWS rows */\n",
      (long long)e->ep, (long long)e->hr.nodes);
    P(e, "  rt_hier_slots(&c->hier, I(%s));\n", pos);
    P(e, "  int rounds = rt_moe_route(c->comm.ep_comm, &c->a2a, I(%s));\n", offs);
    P(e, "  if (!recompute) rt_moe_note(c); /* metrics: the busiest rank's load, extra rounds */\n");
    P(e, "  rt_zero(R(WS_YH), %lld);\n", N * C);
    P(e, "  for (int r = 0; r < rounds; r++) {\n");
    P(e, "    rt_moe_hier_dispatch(&c->hier, &c->a2a, r, R(%s), I(%s), NULL, R(%s), R(%s), R(HUS), R(HUR), R(HST), R(A2A), "
         "%lld);\n", xe, eo, ln2, wts, C);
    P(e, "    rt_experts_forward(R(WS_YE), %s, R(%s), R(%s), R(%s), %s, %s, %s, %s, %s, %lld, %lld);\n", eg, eu, eh, xe, wg,
      exw(e, "WE", wu), exw(e, "WE", wd), exo(e, eo), exn(e), C, (long long)e->Fe);
    P(e, "    rt_moe_hier_combine(&c->hier, &c->a2a, R(WS_YH), R(WS_YE), true, R(HUS), R(HUR), R(HST), R(A2A), %lld); "
         "/* gated, summed per token */\n  }\n", C);
    if (!e->Fs || e->s->model.moe.shared_expert_gate) /* else the ungated shared experts write WS_Y first */
      P(e, "  rt_copy(R(WS_Y), R(WS_YH), %lld);\n", N * C);
  } else {
    const char *xe = A(e, l, "XE"), *ye = "WS_YE", *eo = A(e, l, "EOFF");
    P(e, "  /* expert parallelism over %lld ranks: this rank's experts take the rows routed to them, in rounds\n"
         "   * of at most MOE_CAP_ROWS (one round unless some rank gets more than moe_imbalance x the mean) */\n",
      (long long)e->ep);
    P(e, "  int rounds = rt_moe_route(c->comm.ep_comm, &c->a2a, I(%s));\n", offs);
    P(e, "  if (!recompute) rt_moe_note(c); /* metrics: the busiest rank's load, extra rounds */\n");
    P(e, "  for (int r = 0; r < rounds; r++) {\n");
    P(e, "    rt_moe_dispatch(c->comm.ep_comm, &c->a2a, r, R(%s), I(%s), R(A2A), R(%s), %lld); /* all-to-all */\n", xe, eo,
      xp, C);
    P(e, "    rt_experts_forward(R(%s), %s, R(%s), R(%s), R(%s), %s, %s, %s, %s, %s, %lld, %lld);\n", ye,
      eg, eu, eh, xe, wg, exw(e, "WE", wu), exw(e, "WE", wd), exo(e, eo), exn(e), C, (long long)e->Fe);
    P(e, "    rt_moe_undispatch(c->comm.ep_comm, &c->a2a, R(%s), R(A2A), R(%s), %lld); /* back to the tokens' ranks */\n",
      yp, ye, C);
    P(e, "  }\n");
  }
  bool gate = e->s->model.moe.shared_expert_gate;
  if (!e->hier && (!e->Fs || gate)) {
    P(e, "  rt_zero(R(WS_Y), %lld);\n", N * C);
    P(e, "  rt_moe_combine(R(WS_Y), R(%s), R(%s), I(%s), %lld, %lld, %lld);\n", yp, wts, pos, N, K, C);
  }
  if (e->Fs) {
    long long Fs = e->Fs;
    const char *su = A(e, l, "SU"), *sh = A(e, l, "SH");
    const char *sg = e->gelu_experts ? NULL : A(e, l, "SG");
    if (e->gu_fused[1]) { /* one GEMM: each token's row g | u; SwiGLU reads both halves */
      const char *sgu = A(e, l, "SGU");
      P(e, "  rt_matmul_forward(R(%s), R(%s), W(%lld), NULL, %lld, %lld, %lld); /* shared_experts.gate_proj, up_proj */\n",
        sgu, ln2, (long long)em_gu_weight(e, g, "moe.shared_experts", Fs), N, C, 2 * Fs);
      P(e, "  rt_swiglu_rows_forward(R(%s), R(%s), %lld, %lld);\n", sh, sgu, N, Fs);
    } else {
      if (sg)
        P(e, "  rt_matmul_forward(R(%s), R(%s), W(%lld), %s, %lld, %lld, %lld); /* shared_experts.gate_proj */\n", sg,
          ln2, (long long)off(e, g, "moe.shared_experts.gate_proj.weight"), bias_arg(e, g, "moe.shared_experts.gate_proj.weight", "W"), N, C, Fs);
      P(e, "  rt_matmul_forward(R(%s), R(%s), W(%lld), %s, %lld, %lld, %lld); /* shared_experts.up_proj */\n", su,
        ln2, (long long)off(e, g, "moe.shared_experts.up_proj.weight"), bias_arg(e, g, "moe.shared_experts.up_proj.weight", "W"), N, C, Fs);
      if (sg) P(e, "  rt_swiglu_forward(R(%s), R(%s), R(%s), %lld);\n", sh, sg, su, N * Fs);
      else P(e, "  rt_gelu_forward(R(%s), R(%s), %lld); /* GELU shared experts: no gate */\n", sh, su, N * Fs);
    }
    const char *so = gate ? A(e, l, "SO") : "WS_Y"; /* ungated: the block's output, the combine adds to it */
    P(e, "  rt_matmul_forward(R(%s), R(%s), W(%lld), %s, %lld, %lld, %lld); /* shared_experts.down_proj */\n", so, sh,
      (long long)off(e, g, "moe.shared_experts.down_proj.weight"), bias_arg(e, g, "moe.shared_experts.down_proj.weight", "W"), N, Fs, C);
    if (gate) {
      const char *sgl = A(e, l, "SGL");
      P(e, "  rt_router_logits_forward(R(%s), R(%s), W(%lld), %lld, %lld, 1); /* shared_expert_gate */\n", sgl, ln2,
        (long long)off(e, g, "moe.shared_expert_gate.weight"), N, C);
      P(e, "  rt_sigmoid_gate_forward(R(WS_Y), R(%s), R(%s), %lld, %lld); /* + sigmoid(gate) x shared output */\n", so,
        sgl, N, C);
    } else if (e->hier) {
      P(e, "  rt_accumulate(R(WS_Y), R(WS_YH), %lld); /* + the routed experts' (gated, summed per token) */\n", N * C);
    } else {
      P(e, "  rt_moe_combine(R(WS_Y), R(%s), R(%s), I(%s), %lld, %lld, %lld); /* + the routed experts' */\n", yp,
        wts, pos, N, K, C);
    }
  }
}

void em_moe_backward(Em *e, int l, const char *dy) {
  int g = e->layer_dense[l];
  long long N = e->N, C = e->C, E = e->E, K = e->K;
  const char *ln2 = A(e, l, "LN2"), *lg = A(e, l, "LOGITS"), *idx = A(e, l, "IDX"),
             *wts = A(e, l, "WTS"), *pos = A(e, l, "POS"), *offs = A(e, l, "OFFSETS"),
             *xp = e->ep > 1 ? "WS_XP" : A(e, l, "XP"), *yp = A(e, l, "YP");
  if (e->Fs) {
    long long Fs = e->Fs;
    const char *dso = dy;
    if (e->s->model.moe.shared_expert_gate) { /* through the gate: DSO, and the gate's logits into DLN */
      int64_t og = off(e, g, "moe.shared_expert_gate.weight");
      P(e, "  rt_zero(R(DSO), %lld);\n  rt_zero_real(R(DSGL), %lld);\n", N * C, N);
      P(e, "  rt_sigmoid_gate_backward(R(DSO), R(DSGL), R(%s), R(%s), R(%s), %lld, %lld);\n", dy, A(e, l, "SO"),
        A(e, l, "SGL"), N, C);
      em_dln_zero(e);
      P(e, "  rt_router_logits_backward(R(DLN), DW(%lld), R(DSGL), R(%s), W(%lld), %lld, %lld, 1); /* shared_expert_gate */\n",
        (long long)og, ln2, (long long)og, N, C);
      dso = "DSO";
    }
    int64_t o = off(e, g, "moe.shared_experts.down_proj.weight");
    P(e, "  rt_matmul_backward_set(R(DSH), DW(%lld), %s, R(%s), R(%s), W(%lld), %lld, %lld, %lld); /* shared down_proj */\n",
      (long long)o, bias_arg(e, g, "moe.shared_experts.down_proj.weight", "DW"), dso, A(e, l, "SH"), (long long)o, N, Fs, C);
    if (e->gu_fused[1]) { /* the gradient of the rows g | u, then one GEMM */
      int64_t w = em_gu_weight(e, g, "moe.shared_experts", Fs);
      P(e, "  rt_swiglu_rows_backward(R(DSGU), R(DSH), R(%s), %lld, %lld);\n", A(e, l, "SGU"), N, Fs);
      P(e, "  %s(R(DLN), DW(%lld), NULL, R(DSGU), R(%s), W(%lld), %lld, %lld, %lld); /* shared gate_proj, up_proj */\n",
        em_dln_gemm(e), (long long)w, ln2, (long long)w, N, C, 2 * Fs);
    } else if (e->gelu_experts) {
      P(e, "  rt_gelu_backward(R(DSU), R(DSH), R(%s), %lld);\n", A(e, l, "SU"), N * Fs);
    } else {
      P(e, "  rt_swiglu_backward(R(DSG), R(DSU), R(DSH), R(%s), R(%s), %lld);\n", A(e, l, "SG"), A(e, l, "SU"), N * Fs);
      o = off(e, g, "moe.shared_experts.gate_proj.weight");
      P(e, "  %s(R(DLN), DW(%lld), %s, R(DSG), R(%s), W(%lld), %lld, %lld, %lld); /* shared gate_proj */\n", em_dln_gemm(e),
        (long long)o, bias_arg(e, g, "moe.shared_experts.gate_proj.weight", "DW"), ln2, (long long)o, N, C, Fs);
    }
    if (!e->gu_fused[1]) {
      o = off(e, g, "moe.shared_experts.up_proj.weight");
      P(e, "  %s(R(DLN), DW(%lld), %s, R(DSU), R(%s), W(%lld), %lld, %lld, %lld); /* shared up_proj */\n", em_dln_gemm(e),
        (long long)o, bias_arg(e, g, "moe.shared_experts.up_proj.weight", "DW"), ln2, (long long)o, N, C, Fs);
    }
  }
  if (e->hier) /* hierarchical: at the experts' owners (rt_moe_gate_rows), added per round */
    P(e, "  rt_zero_real(R(DWTS), %lld);\n", N * K);
  else /* writes DYP and DWTS */
    P(e, "  rt_moe_combine_backward(R(DYP), R(DWTS), R(%s), R(%s), R(%s), I(%s), %lld, %lld, %lld);\n", dy, yp, wts,
      pos, N, K, C);
  int ge = e->layer_experts[l];
  long long wgo = e->gelu_experts ? 0 : off(e, ge, "moe.experts.gate_proj.weight"),
            wu = off(e, ge, "moe.experts.up_proj.weight"),
            wd = off(e, ge, "moe.experts.down_proj.weight");
  const char *eg = e->gelu_experts ? "NULL" : mem_printf(e->m, "R(%s)", A(e, l, "EG")), *eu = A(e, l, "EU"),
             *eh = A(e, l, "EH"), *wg = e->gelu_experts ? "NULL" : exw(e, "WE", wgo),
             *dwg = e->gelu_experts ? "NULL" : exw(e, "DWE", wgo), *edg = e->gelu_experts ? "NULL" : "R(EDG)";
  const char *bwd = "rt_experts_backward(R(%s), %s, %s, %s, R(%s), R(%s), %s, R(%s), R(%s), "
                    "%s, %s, %s, %s, %s, %lld, %lld, R(EDH), %s, R(EDU));\n";
  /* one rank: the token copies' gradient goes into the experts' outputs in expert order, dead once
   * combined (rt_experts_backward reads DYP, XP and the activations): step.c's DXP is WS_YP, or
   * this layer's own saved YP */
  const char *dxp = e->ep == 1 ? yp : "DXP";
  if (e->ep == 1) {
    P(e, "  /* the gradient of the token copies (written), in YP's bytes */\n  ");
    P(e, bwd, dxp, dwg, exw(e, "DWE", wu), exw(e, "DWE", wd), "DYP", xp, eg, eu, eh, wg,
      exw(e, "WE", wu), exw(e, "WE", wd), exo(e, offs), exn(e), C, (long long)e->Fe, edg);
  } else if (e->hier) {
    const char *xe = A(e, l, "XE"), *eo = A(e, l, "EOFF");
    const char *stage = "R(HUS), R(HUR), R(HST), R(A2A)";
    P(e, "  rt_hier_slots(&c->hier, I(%s));\n", pos);
    P(e, "  int rounds = rt_moe_route(c->comm.ep_comm, &c->a2a, I(%s)); /* as in the forward */\n", offs);
    em_dln_zero(e); /* the relays' combine adds each token's gradient into DLN */
    P(e, "  for (int r = 0; r < rounds; r++) {\n");
    /* the experts' outputs meet the output's gradient at their owner (the routing weights'
     * gradient): a recomputed forward (checkpointing) left its last round's in WS_YE; else, or
     * for another round, the experts' forward runs again (cost_layer prices it) */
    bool again = e->ac == AC_NONE;
    P(e, "    if (rounds > 1) { /* the forward kept its last round's rows: this round's again */\n"
         "      rt_moe_hier_dispatch(&c->hier, &c->a2a, r, R(%s), I(%s), NULL, R(%s), NULL, %s, %lld);\n%s", xe, eo, ln2,
      stage, C, again ? "    }\n" : "");
    P(e, "    %srt_experts_forward(R(WS_YE), %s, R(%s), R(%s), R(%s), %s, %s, %s, %s, %s, %lld, %lld); /* the outputs */\n%s",
      again ? "" : "  ", eg, eu, eh, xe, wg, exw(e, "WE", wu), exw(e, "WE", wd), exo(e, eo), exn(e), C, (long long)e->Fe,
      again ? "" : "    }\n");
    P(e, "    rt_moe_hier_dispatch(&c->hier, &c->a2a, r, R(DXE), I(WS_EOFF), R(HEW), R(%s), R(%s), %s, %lld); /* the output's "
         "gradient, once per token and node */\n", dy, wts, stage, C);
    P(e, "    rt_moe_gate_rows(R(DYE), R(HDV), R(DXE), R(HEW), c->a2a.rows_recv, %lld); /* DYE: gate x gradient; HDV: "
         "gradient . output */\n", C);
    P(e, "    /* writes DXE's rows */\n    ");
    P(e, bwd, "DXE", dwg, exw(e, "DWE", wu), exw(e, "DWE", wd), "DYE", xe, eg, eu, eh, wg,
      exw(e, "WE", wu), exw(e, "WE", wd), exo(e, "WS_EOFF"), exn(e), C, (long long)e->Fe, edg);
    P(e, "    rt_moe_hier_combine(&c->hier, &c->a2a, R(DLN), R(DXE), false, %s, %lld); /* the rows' gradient, summed "
         "per token */\n", stage, C);
    P(e, "    rt_moe_hier_scalars_back(&c->hier, &c->a2a, R(DWTS), R(HDV));\n  }\n");
  } else {
    const char *xe = A(e, l, "XE"), *ye = "WS_YE", *eo = A(e, l, "EOFF");
    P(e, "  int rounds = rt_moe_route(c->comm.ep_comm, &c->a2a, I(%s)); /* as in the forward */\n", offs);
    P(e, "  for (int r = 0; r < rounds; r++) {\n");
    P(e, "    if (rounds > 1) { /* the forward kept its last round's expert activations: rebuild this round's\n"
         "                       * from the rows to send, gathered again (WS_XP shares DXE's bytes) */\n");
    P(e, "      rt_moe_gather(R(WS_XP), R(%s), I(%s), %lld, %lld, %lld);\n", ln2, pos, N, K, C);
    P(e, "      rt_moe_dispatch(c->comm.ep_comm, &c->a2a, r, R(%s), I(%s), R(A2A), R(%s), %lld);\n", xe, eo, xp, C);
    P(e, "      rt_experts_forward(R(%s), %s, R(%s), R(%s), R(%s), %s, %s, %s, %s, %s, %lld, "
         "%lld);\n    }\n", ye, eg, eu, eh, xe, wg, exw(e, "WE", wu), exw(e, "WE", wd),
      exo(e, eo), exn(e), C, (long long)e->Fe);
    P(e, "    rt_moe_dispatch(c->comm.ep_comm, &c->a2a, r, R(DYE), I(WS_EOFF), R(A2A), R(DYP), %lld); /* all-to-all */\n", C);
    P(e, "    /* writes DXE's rows */\n    ");
    P(e, bwd, "DXE", dwg, exw(e, "DWE", wu), exw(e, "DWE", wd), "DYE", xe, eg, eu, eh, wg,
      exw(e, "WE", wu), exw(e, "WE", wd), exo(e, "WS_EOFF"), exn(e), C, (long long)e->Fe, edg);
    P(e, "    rt_moe_undispatch(c->comm.ep_comm, &c->a2a, R(DXP), R(A2A), R(DXE), %lld); /* all-to-all back */\n  }\n", C);
  }
  if (!e->hier) {
    em_dln_zero(e);
    P(e, "  rt_moe_gather_backward(R(DLN), R(%s), I(%s), %lld, %lld, %lld);\n", dxp, pos, N, K, C);
  }
  /* the router's backward writes DLOGITS, the balancing losses' add */
  if (reweight(e))
    P(e, "  rt_router_weights_backward(R(DLOGITS), R(DWTS), R(%s), I(%s), R(%s), %lld, %lld, %lld, %s, %s, %.9g);\n", lg,
      idx, wts, N, E, K, e->sigmoid ? "true" : "false", e->s->model.moe.norm_topk_prob ? "true" : "false",
      e->s->model.moe.routed_scaling_factor);
  else
    P(e, "  rt_router_backward(R(DLOGITS), R(DWTS), R(%s), I(%s), R(%s), %lld, %lld, %lld, %s);\n", lg, idx, wts, N,
      E, K, e->sigmoid ? "true" : "false");
  if (!e->aux_free && e->cp > 1)
    P(e, "  rt_aux_loss_stats(R(%s), I(%s), %lld, %lld, %lld, R(AUX));\n"
         "  rt_comm_cp_mean(c->comm.cp_comm, PLAN_CP, R(AUX) + %lld, %lld);\n"
         "  rt_aux_loss_backward_stats(R(DLOGITS), R(%s), %lld, %lld, %.9g, c->dloss, R(AUX));\n", lg, idx, N, E, K,
      E, 2 * E, lg, N, E, e->s->model.moe.aux_loss_coef);
  else if (!e->aux_free)
    P(e, "  rt_aux_loss_backward(R(DLOGITS), R(%s), I(%s), %lld, %lld, %lld, %.9g, c->dloss, R(AUX));\n", lg, idx, N,
      E, K, e->s->model.moe.aux_loss_coef);
  if (e->s->model.moe.seq_aux_loss_coef > 0)
    P(e, "  rt_seq_aux_loss_backward(R(DLOGITS), R(%s), I(%s), %lld, %lld, %lld, %lld, %s, %.9g, c->dloss, R(AUX));\n", lg,
      idx, N, E, K, (long long)e->T, e->sigmoid ? "true" : "false", e->s->model.moe.seq_aux_loss_coef);
  int64_t o = off(e, g, "moe.gate.weight");
  P(e, "  rt_router_logits_backward(R(DLN), DW(%lld), R(DLOGITS), R(%s), W(%lld), %lld, %lld, %lld); /* router */\n",
    (long long)o, ln2, (long long)o, N, C, E);
}

/* Backward of layer l: the gradient of its output X(l+1) is in dy; leaves that of X(l) in dx. */
