/* attn_ws.c — the attention's groups of the shared workspace (the program's LWS, or A2A with
 * ep > 1; the plan's workspace.shared or moe.a2a_staging), laid out once for the planner
 * (plan.c: their sizes in the shared max) and the emitter (emit_layout.c shared_ws: the buffers'
 * offsets), so that plan and program agree to the element.
 *
 * The backward group holds, from the o_proj backward to the q/k/v projections' backward, the
 * attention's gradients DATT (tokens x heads x v_head_dim), DQ (tokens x q), DK (tokens x kv),
 * DV (tokens x kv_heads x v_head_dim) and, with qk-norm, DQR and DKR (before it); with MLA also
 * the buffers of its backward (emit_mla.c em_mla_backward), each placed first-fit over the
 * buffers whose lifetimes (in the ops of that backward, below) meet its own, so that they reuse
 * DATT's bytes (dead after the attention core's backward), then DQ's (dead after q's part),
 * then DK's and DV's (dead after rt_mla_kv_backward). The forward group holds MLA's forward
 * temporaries (em_mla_forward): the normalized latents, the RoPE key and kv_b_proj's output,
 * from the latent norms to rt_mla_kv_forward. */
#include <string.h>

#include "mtc.h"

enum { WS_ALIGN = 16 }; /* elements: each buffer starts on 64 bytes of float, as emit_layout.c's */

static int64_t up(int64_t x) { return (x + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN; }

/* Appends buffer name of n elements (n > 0) alive over ops [first, last] at the lowest offset
 * (a multiple of WS_ALIGN) that no buffer of g alive at some of the same ops overlaps. */
static void place(PlanWsGroup *g, const char *name, const char *what, int64_t n, int first, int last) {
  if (n <= 0) return;
  int64_t at = 0;
  for (bool moved = true; moved;) { /* brute force: a group has at most PLAN_WS_MAX buffers */
    moved = false;
    for (int i = 0; i < g->nb; i++) {
      const PlanWsBuf *b = &g->b[i];
      if (b->last < first || last < b->first) continue; /* never alive together */
      if (at < b->at + up(b->n) && b->at < at + up(n)) at = b->at + up(b->n), moved = true;
    }
  }
  g->b[g->nb++] = (PlanWsBuf){name, what, at, n, first, last};
  if (at + up(n) > g->size) g->size = at + up(n);
}

/* Ops of MLA's backward (em_mla_backward), in order: the lifetimes above. The attention core's
 * backward (writes DQ, DK, DV from DATT) is op -1. */
enum {
  OP_CORE = -1,
  OP_Q_ROPE,       /* q's rope part in DQ */
  OP_QAN,          /* RQAN <- q_a_layernorm again (q-LoRA) */
  OP_Q_B,          /* DQAN <- q_b_proj backward (reads DQ, RQAN) */
  OP_QA_NORM,      /* DQA <- q_a_layernorm backward */
  OP_Q_A,          /* DLN += q_a_proj backward (reads DQA), or q_proj backward (reads DQ) */
  OP_KV,           /* DKVB, DKRP <- rt_mla_kv_backward (reads DK, DV) */
  OP_KR_ROPE,      /* the RoPE key's rope backward in DKRP */
  OP_KVN,          /* RKVN <- kv_a_layernorm again */
  OP_KV_B,         /* DKVN <- kv_b_proj backward (reads DKVB, RKVN) */
  OP_KV_NORM,      /* DKVL <- kv_a_layernorm backward */
  OP_KV_A,         /* DLN += kv_a_proj_with_mqa backward: the latent (reads DKVL) */
  OP_KR_A,         /* DLN += kv_a_proj_with_mqa backward: the RoPE key (reads DKRP) */
};

bool plan_qkv_fused(const Spec *s, int64_t cp) {
  const ModelSpec *m = &s->model;
  bool scaled = m->rope_scaling.present && m->rope_scaling.type != ROPE_SCALING_NONE;
  return m->attention.kind != ATTN_MLA && m->attention.qk_norm == QKN_NONE && !scaled && cp <= 1;
}

PlanWsGroup plan_ws_attention(const Spec *s, const Model *md, int64_t tokens, int64_t cp) {
  const bool qkv_fused = plan_qkv_fused(s, cp);
  const AttentionSpec *a = &s->model.attention;
  const bool mla = a->kind == ATTN_MLA;
  const int64_t N = tokens, nh = a->heads, nkv = mla ? a->heads : a->kv_heads;
  const int64_t hd = md->qk_head_dim, vd = md->v_head_dim, Q = nh * hd, KV = nkv * hd;
  const int64_t qr = mla ? a->q_lora_rank : 0;
  PlanWsGroup g;
  memset(&g, 0, sizeof g);
  /* the attention core's backward reads DATT and writes DQ, DK, DV; without MLA all of them
   * live until the projections' backward (the layer's op sequence, emit_layer.c) */
  int qlast = !mla ? OP_KR_A : qr ? OP_Q_B : OP_Q_A;
  place(&g, "DATT", "gradient of the attention output", N * nh * vd, OP_CORE - 1, mla ? OP_CORE : OP_KR_A);
  if (qkv_fused) { /* (not with MLA or qk-norm: plan_qkv_fused) */
    place(&g, "DQKV", "gradient of the queries, keys and values, each token's row q | k | v", N * (Q + KV + nkv * vd),
          OP_CORE, OP_KR_A);
    return g;
  }
  place(&g, "DQ", "gradient of the queries", N * Q, OP_CORE, qlast);
  place(&g, "DK", "gradient of the keys", N * KV, OP_CORE, mla ? OP_KV : OP_KR_A);
  place(&g, "DV", "gradient of the values", N * nkv * vd, OP_CORE, mla ? OP_KV : OP_KR_A);
  /* context parallelism through cuDNN: the core's backward writes (not adds) dK, dV of each query
   * chunk's keys, and the second chunk's keys include the first's; the first chunk's, of one
   * sequence at a time, go here and are added in (runtime/cuda/ops_cp.c) */
  if (cp > 1 && plan_attention_cudnn(md))
    place(&g, "DKV1", "context parallelism: the first query chunk's dK then dV of one sequence (cuDNN's span backward)",
          s->training.seq_len / 2 * nkv * (hd + vd), OP_CORE, OP_CORE);
  if (a->qk_norm != QKN_NONE) { /* (not with MLA: check.c) */
    place(&g, "DQR", "gradient of the queries before qk-norm", N * Q, OP_CORE, OP_KR_A);
    place(&g, "DKR", "gradient of the keys before qk-norm", N * KV, OP_CORE, OP_KR_A);
  }
  if (!mla) return g;
  const int64_t kvr = a->kv_lora_rank, rd = a->qk_rope_head_dim, kvb = nh * (a->qk_nope_head_dim + vd);
  if (qr) {
    place(&g, "RQAN", "mla: the normalized query latent, recomputed for the backward", N * qr, OP_QAN, OP_Q_B);
    place(&g, "DQAN", "mla: its gradient", N * qr, OP_Q_B, OP_QA_NORM);
    place(&g, "DQA", "mla: gradient of the query latent before its norm", N * qr, OP_QA_NORM, OP_Q_A);
  }
  place(&g, "DKVB", "mla: gradient of kv_b_proj's output (k_nope and v per head)", N * kvb, OP_KV, OP_KV_B);
  place(&g, "DKRP", "mla: gradient of the RoPE key (summed over heads)", N * rd, OP_KV, OP_KR_A);
  place(&g, "RKVN", "mla: the normalized KV latent, recomputed for the backward", N * kvr, OP_KVN, OP_KV_B);
  place(&g, "DKVN", "mla: gradient of the normalized KV latent", N * kvr, OP_KV_B, OP_KV_NORM);
  place(&g, "DKVL", "mla: gradient of the KV latent", N * kvr, OP_KV_NORM, OP_KV_A);
  return g;
}

bool plan_attention_cudnn(const Model *md) {
  int64_t hd = md->qk_head_dim, vd = md->v_head_dim;
  return hd % 8 == 0 && vd % 8 == 0 && hd <= 256 && vd <= 256;
}

PlanWsGroup plan_ws_mla_forward(const Spec *s, int64_t tokens) {
  const AttentionSpec *a = &s->model.attention;
  PlanWsGroup g;
  memset(&g, 0, sizeof g);
  if (a->kind != ATTN_MLA) return g;
  const int64_t N = tokens;
  /* all alive together from the latent norms to rt_mla_kv_forward (one op span) */
  place(&g, "WS_QAN", "mla: the normalized query latent", N * a->q_lora_rank, 0, 0);
  place(&g, "WS_KVN", "mla: the normalized KV latent", N * a->kv_lora_rank, 0, 0);
  place(&g, "WS_KRP", "mla: the RoPE key shared by the heads (rotated in place)", N * a->qk_rope_head_dim, 0, 0);
  place(&g, "WS_KVB", "mla: kv_b_proj's output, k_nope and v per head",
        N * a->heads * (a->qk_nope_head_dim + a->v_head_dim), 0, 0);
  return g;
}
