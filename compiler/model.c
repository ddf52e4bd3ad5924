/* model.c — the model graph: the spec's model expanded into layers × ops, each with its
 * parameter tensors, the activations it saves for the backward (what its backward reads; a norm
 * also its output, which the GEMMs after it read), and its FLOPs and bytes per token.
 *
 * Shapes follow PyTorch/Hugging Face conventions (nn.Linear weight = [out, in]) so counts can
 * be checked against published ones. Dimension names used in comments:
 *   H hidden, V vocab, nh heads, nkv kv_heads, hd head_dim, I mlp.intermediate,
 *   E experts, k top_k, Ie expert_intermediate, S shared_experts, Is shared_intermediate. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

static const char *const kind_names[PK__COUNT] = {
    "embedding", "attention", "dense_mlp", "routed_experts", "shared_experts", "router", "norms", "lm_head"};

const char *model_kind_name(ParamKind k) { return kind_names[k]; }

int64_t model_dtype_bytes(DType t) { return t == DT_BF16 ? 2 : 4; }

typedef struct {
  Mem *m;
  const Spec *s;
  Model *md;
  bool overflow; /* a count left 64 bits: reported once at the end */
} Cx;

static int64_t mul(Cx *c, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) c->overflow = true, r = 0;
  return r;
}

static int64_t add(Cx *c, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) c->overflow = true, r = 0;
  return r;
}

static Op *new_op(Cx *c, OpKind kind, const char *name, int layer, int64_t in, int64_t out) {
  Model *md = c->md;
  if (md->nops == md->cap) {
    int cap = md->cap ? md->cap * 2 : 64;
    Op *ops = mem_array(c->m, (size_t)cap, sizeof *ops);
    if (md->nops) memcpy(ops, md->ops, (size_t)md->nops * sizeof *ops);
    md->ops = ops, md->cap = cap;
  }
  Op *o = &md->ops[md->nops++];
  o->kind = kind, o->name = name, o->layer = layer;
  o->in_bytes = mul(c, in, 2), o->out_bytes = mul(c, out, 2); /* activations move as bf16 */
  return o;
}

/* Adds a parameter tensor of shape d0 × d1 (× d2 when d2 > 0; d1 = 0 for a vector).
 * Routed experts' tensors lead with E; a token touches top_k of them. */
static void param(Cx *c, Op *o, const char *name, ParamKind kind, bool matmul, int64_t d0,
                  int64_t d1, int64_t d2) {
  Param *p = &o->params[o->nparams++];
  p->name = name, p->kind = kind, p->matmul = matmul;
  p->ndim = d2 ? 3 : d1 ? 2 : 1;
  p->shape[0] = d0, p->shape[1] = d1, p->shape[2] = d2;
  p->count = mul(c, mul(c, d0, d1 ? d1 : 1), d2 ? d2 : 1);
  int64_t active = p->count;
  if (kind == PK_ROUTED) active = mul(c, p->count / d0, c->s->model.moe.top_k);
  o->param_count = add(c, o->param_count, p->count);
  o->active_params = add(c, o->active_params, active);
  if (matmul) o->active_matmul = add(c, o->active_matmul, active);
}

/* Adds save `name` (the program's buffer name, Saved) of elems per token to o, described by
 * `what` (the generated program's arena map shows it). */
static void save(Cx *c, Op *o, const char *name, int64_t elems, DType t, SaveClass cls, const char *what) {
  (void)c;
  if (o->nsaved == OP_MAX_SAVED) { /* (a model.c bug: raise OP_MAX_SAVED) */
    fprintf(stderr, "mtc: internal error: op %s saves more than %d tensors\n", o->name, OP_MAX_SAVED);
    abort();
  }
  o->saved[o->nsaved++] = (Saved){name, elems, t, cls, false, what};
}

/* Marks the last n saves of o as routed (on the experts' side of the all-to-all). */
static void routed(Op *o, int n) {
  for (int i = o->nsaved - n; i < o->nsaved; i++) o->saved[i].routed = true;
}

/* A norm over n channels: weight (and bias with model.bias or LayerNorm's own bias when
 * model.bias is set). */
static void norm_params(Cx *c, Op *o, const char *w, const char *b, int64_t n) {
  param(c, o, w, PK_NORM, false, n, 0, 0);
  if (c->s->model.bias) param(c, o, b, PK_NORM, false, n, 0, 0);
}

/* A norm op over the hidden size. Saves its input x (class in_cls, buffer x, described by
 * xwhat), its output (buffer out, class other, described by owhat: the input of the GEMMs after
 * it, the q/k/v projections, the router or the mlp, the LM head, whose backward reads it) and its
 * statistics (buffer rstd): 1/rms, or LayerNorm's rstd and mean. */
static void norm_op(Cx *c, OpKind kind, const char *name, const char *w, const char *b, int layer,
                    SaveClass in_cls, const char *x, const char *xwhat, const char *out,
                    const char *owhat, const char *rstd) {
  int64_t H = c->s->model.hidden;
  bool ln = c->s->model.norm == NORM_LAYERNORM;
  Op *o = new_op(c, kind, name, layer, H, H);
  norm_params(c, o, w, b, H);
  save(c, o, x, H, DT_BF16, in_cls, xwhat);
  save(c, o, out, H, DT_BF16, SAVE_OTHER, owhat);
  save(c, o, rstd, ln ? 2 : 1, DT_FP32, SAVE_OTHER, ln ? "its rstd, then its mean, per token" : "its 1/rms per token");
}

/* The causal attention core (flash-style: saves q, k, v, its output and the log-sum-exp per
 * head, never the seq x seq scores) and the output projection. q, k, v are elements per
 * token; qk and vd the per-head sizes. FLOPs per token: 2 · seq · nh · (qk + vd) / 2. */
static void core_and_out(Cx *c, int l, int64_t q, int64_t k, int64_t v, int64_t qk, int64_t vd) {
  const ModelSpec *ms = &c->s->model;
  int64_t H = ms->hidden, nh = ms->attention.heads, out = mul(c, nh, vd);
  Op *o = new_op(c, OP_ATTN_CORE, "attention.core", l, add(c, add(c, q, k), v), out);
  o->attn_flops_per_seq = (double)nh * (double)(qk + vd);
  save(c, o, "Q", q, DT_BF16, SAVE_ATTN, "queries (rotated)");
  save(c, o, "K", k, DT_BF16, SAVE_ATTN, "keys (rotated)");
  save(c, o, "V", v, DT_BF16, SAVE_ATTN, "values");
  save(c, o, "ATT", out, DT_BF16, SAVE_ATTN, "attention output");
  save(c, o, "LSE", nh, DT_FP32, SAVE_ATTN, "attention log-sum-exp per head and query");
  o = new_op(c, OP_ATTN_OUT, "attention.out", l, out, H); /* its input is the core's ATT */
  param(c, o, "attn.o_proj.weight", PK_ATTENTION, true, H, out, 0);
  if (ms->bias || ms->attention.bias == ABIAS_QKVO) param(c, o, "attn.o_proj.bias", PK_ATTENTION, false, H, 0, 0);
}

/* Attention for mha/gqa: q/k/v projections, optional qk-norm, RoPE, the causal core and
 * the output projection. Sources: Llama 3 (GQA), Qwen3 / OLMo 2 (qk-norm). */
static void attention_gqa(Cx *c, int l) {
  const ModelSpec *ms = &c->s->model;
  const AttentionSpec *a = &ms->attention;
  int64_t H = ms->hidden, nh = a->heads, nkv = a->kv_heads, hd = a->head_dim;
  int64_t q = mul(c, nh, hd), kv = mul(c, nkv, hd), qkv = add(c, q, mul(c, 2, kv));
  bool b = ms->bias || a->bias != ABIAS_NONE;
  Op *o = new_op(c, OP_QKV, "attention.qkv", l, H, qkv);
  param(c, o, "attn.q_proj.weight", PK_ATTENTION, true, q, H, 0);
  param(c, o, "attn.k_proj.weight", PK_ATTENTION, true, kv, H, 0);
  param(c, o, "attn.v_proj.weight", PK_ATTENTION, true, kv, H, 0);
  if (b) {
    param(c, o, "attn.q_proj.bias", PK_ATTENTION, false, q, 0, 0);
    param(c, o, "attn.k_proj.bias", PK_ATTENTION, false, kv, 0, 0);
    param(c, o, "attn.v_proj.bias", PK_ATTENTION, false, kv, 0, 0);
  }
  if (a->qk_norm != QKN_NONE) {
    o = new_op(c, OP_QK_NORM, "attention.qk_norm", l, q + kv, q + kv);
    bool full = a->qk_norm == QKN_FULL;
    norm_params(c, o, "attn.q_norm.weight", "attn.q_norm.bias", full ? q : hd);
    norm_params(c, o, "attn.k_norm.weight", "attn.k_norm.bias", full ? kv : hd);
    /* kept with the attention core (selective checkpointing recomputes neither): the
     * backward of the norm needs its input (q and k before it) and 1/rms (per token with
     * qk_norm full, else per token and head) */
    save(c, o, "QR", q, DT_BF16, SAVE_ATTN, "queries before qk-norm");
    save(c, o, "KR", kv, DT_BF16, SAVE_ATTN, "keys before qk-norm");
    save(c, o, "RSTDQ", full ? 1 : nh, DT_FP32, SAVE_ATTN, "qk-norm: 1/rms per token (full) or per token and head");
    save(c, o, "RSTDK", full ? 1 : nkv, DT_FP32, SAVE_ATTN, "the same for the keys");
  }
  if (ms->position == POS_ROPE) new_op(c, OP_ROPE, "attention.rope", l, q + kv, q + kv);
  core_and_out(c, l, q, kv, kv, hd, hd);
}

/* Multi-head latent attention (DeepSeek-V2/V3, arXiv:2405.04434 §2.1): queries through an
 * optional low-rank q_a/q_b pair, keys and values from a shared latent of kv_lora_rank plus
 * one RoPE key of qk_rope_head_dim shared by the heads. */
static void attention_mla(Cx *c, int l) {
  const ModelSpec *ms = &c->s->model;
  const AttentionSpec *a = &ms->attention;
  int64_t H = ms->hidden, nh = a->heads, qr = a->q_lora_rank, kvr = a->kv_lora_rank;
  int64_t nope = a->qk_nope_head_dim, rope = a->qk_rope_head_dim, vd = a->v_head_dim;
  int64_t q = mul(c, nh, nope + rope), k = q, v = mul(c, nh, vd);
  bool b = ms->bias;
  Op *o = new_op(c, OP_QKV, "attention.mla_proj", l, H, add(c, add(c, q, k), v));
  if (qr) {
    param(c, o, "attn.q_a_proj.weight", PK_ATTENTION, true, qr, H, 0);
    norm_params(c, o, "attn.q_a_layernorm.weight", "attn.q_a_layernorm.bias", qr);
    param(c, o, "attn.q_b_proj.weight", PK_ATTENTION, true, q, qr, 0);
    if (b) param(c, o, "attn.q_a_proj.bias", PK_ATTENTION, false, qr, 0, 0);
    if (b) param(c, o, "attn.q_b_proj.bias", PK_ATTENTION, false, q, 0, 0);
  } else {
    param(c, o, "attn.q_proj.weight", PK_ATTENTION, true, q, H, 0);
    if (b) param(c, o, "attn.q_proj.bias", PK_ATTENTION, false, q, 0, 0);
  }
  param(c, o, "attn.kv_a_proj_with_mqa.weight", PK_ATTENTION, true, kvr + rope, H, 0);
  norm_params(c, o, "attn.kv_a_layernorm.weight", "attn.kv_a_layernorm.bias", kvr);
  param(c, o, "attn.kv_b_proj.weight", PK_ATTENTION, true, mul(c, nh, nope + vd), kvr, 0);
  if (b) param(c, o, "attn.kv_a_proj_with_mqa.bias", PK_ATTENTION, false, kvr + rope, 0, 0);
  if (b) param(c, o, "attn.kv_b_proj.bias", PK_ATTENTION, false, mul(c, nh, nope + vd), 0, 0);
  /* the latents before their norms (QA, the query latent, and KVL: the norms' backward needs
   * them; the normalized ones are recomputed from them) and their 1/rms (RSTDQA, RSTDKV); the
   * RoPE key part of kv_a_proj_with_mqa's output is not kept: its only reader is K, saved by the
   * core (emit_mla.c) */
  if (qr) {
    save(c, o, "QA", qr, DT_BF16, SAVE_OTHER, "mla: q_a_proj's output (the query latent before its norm)");
    save(c, o, "RSTDQA", 1, DT_FP32, SAVE_OTHER, "mla: q_a_layernorm's 1/rms per token");
  }
  save(c, o, "KVL", kvr, DT_BF16, SAVE_OTHER, "mla: the KV latent before kv_a_layernorm");
  save(c, o, "RSTDKV", 1, DT_FP32, SAVE_OTHER, "mla: kv_a_layernorm's 1/rms per token");
  new_op(c, OP_ROPE, "attention.rope", l, mul(c, nh + 1, rope), mul(c, nh + 1, rope));
  core_and_out(c, l, q, k, v, nope + rope, vd);
}

/* A feed-forward of width n (times `lead` experts for routed ones, which lead with E):
 * swiglu has gate/up/down (Shazeer 2020), gelu has up/down. `tokens` is how many copies of
 * each token it sees (top_k for routed experts). Saves the gate, the up (GELU's input) and the
 * activation, buffers <b>G, <b>U, <b>H ("" dense, "E" routed, "S" shared experts), described
 * as who's ("mlp", "routed experts'", "shared experts'") gate, up and activation. */
static void ffn(Cx *c, Op *o, const char *prefix, ParamKind kind, Activation act, int64_t lead,
                int64_t n, int64_t tokens, SaveClass cls, const char *bp, const char *who) {
  int64_t H = c->s->model.hidden;
  bool b = c->s->model.bias;
  const char *pre = prefix;
  int64_t e = lead; /* 0 for non-expert tensors */
  Mem *m = c->m;
  if (act == ACT_SWIGLU) {
    param(c, o, mem_printf(m, "%s.gate_proj.weight", pre), kind, true, e ? e : n, e ? n : H, e ? H : 0);
    if (b) param(c, o, mem_printf(m, "%s.gate_proj.bias", pre), kind, false, e ? e : n, e ? n : 0, 0);
  }
  param(c, o, mem_printf(m, "%s.up_proj.weight", pre), kind, true, e ? e : n, e ? n : H, e ? H : 0);
  if (b) param(c, o, mem_printf(m, "%s.up_proj.bias", pre), kind, false, e ? e : n, e ? n : 0, 0);
  param(c, o, mem_printf(m, "%s.down_proj.weight", pre), kind, true, e ? e : H, e ? H : n, e ? n : 0);
  if (b) param(c, o, mem_printf(m, "%s.down_proj.bias", pre), kind, false, e ? e : H, e ? H : 0, 0);
  int64_t tn = mul(c, tokens, n);
  if (act == ACT_SWIGLU) save(c, o, mem_printf(m, "%sG", bp), tn, DT_BF16, cls, mem_printf(m, "%s gate", who));
  save(c, o, mem_printf(m, "%sU", bp), tn, DT_BF16, cls,
       mem_printf(m, "%s up%s", who, kind == PK_ROUTED && act == ACT_GELU ? " (GELU's input)" : ""));
  save(c, o, mem_printf(m, "%sH", bp), tn, DT_BF16, cls, mem_printf(m, "%s activation", who));
}

static void dense_mlp(Cx *c, int l) {
  const MlpSpec *mlp = &c->s->model.mlp;
  int64_t H = c->s->model.hidden;
  Op *o = new_op(c, OP_MLP, "mlp", l, H, H);
  ffn(c, o, "mlp", PK_MLP, mlp->activation, 0, mlp->intermediate, 1, SAVE_OTHER, "", "mlp");
  c->md->layers[l].ffn_width = mlp->intermediate;
}

/* The MoE block: router, dispatch (token permutation + all-to-all), routed experts, shared
 * experts, combine. Routed activations count top_k copies of a token. */
static void moe_block(Cx *c, int l) {
  const MoeSpec *moe = &c->s->model.moe;
  int64_t H = c->s->model.hidden, E = moe->experts, k = moe->top_k;
  int64_t kH = mul(c, k, H);
  Op *o = new_op(c, OP_ROUTER, "moe.router", l, H, E);
  param(c, o, "moe.gate.weight", PK_ROUTER, true, E, H, 0);
  if (moe->router_bias) param(c, o, "moe.gate.e_score_correction_bias", PK_ROUTER, false, E, 0, 0);
  save(c, o, "LOGITS", E, DT_FP32, SAVE_OTHER, "router logits");
  save(c, o, "IDX", k, DT_INT32, SAVE_OTHER, "selected experts (int32)");
  save(c, o, "WTS", k, DT_FP32, SAVE_OTHER, "their weights");
  save(c, o, "POS", k, DT_INT32, SAVE_OTHER, "row of each assignment in expert order (int32)"); /* the permutation */
  new_op(c, OP_DISPATCH, "moe.dispatch", l, H, kH);
  o = new_op(c, OP_EXPERTS, "moe.experts", l, kH, kH);
  /* the experts' outputs, y, back in token order (= the combine all-to-all's receive): the
   * combine's weight gradient needs them */
  save(c, o, "YP", kH, DT_BF16, SAVE_EXPERT, "expert outputs in that order");
  /* the experts' input rows, x permuted into expert order (= the dispatch all-to-all's receive;
   * with one EP rank the program holds them in XP, the permuted copies themselves) */
  save(c, o, "XE", kH, DT_BF16, SAVE_EXPERT, "rows this rank's experts received in one all-to-all round (MOE_CAP_ROWS)");
  ffn(c, o, "moe.experts", PK_ROUTED, moe->activation, E, moe->expert_intermediate, k, SAVE_EXPERT, "E",
      "routed experts'");
  routed(o, o->nsaved - 1); /* all but YP */
  c->md->layers[l].routed_width = mul(c, k, moe->expert_intermediate);
  if (moe->shared_experts) {
    o = new_op(c, OP_SHARED, "moe.shared_experts", l, H, H);
    ffn(c, o, "moe.shared_experts", PK_SHARED, moe->activation, 0,
        mul(c, moe->shared_experts, moe->shared_intermediate), 1, SAVE_EXPERT, "S", "shared experts'");
    c->md->layers[l].ffn_width = mul(c, moe->shared_experts, moe->shared_intermediate);
    if (moe->shared_expert_gate) { /* Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(x)) x the shared
                                    * expert's output; a gate like the router (AdamW, not in the FLOPs) */
      param(c, o, "moe.shared_expert_gate.weight", PK_ROUTER, true, 1, H, 0);
      save(c, o, "SO", H, DT_BF16, SAVE_EXPERT, "shared experts' output before the gate");
      save(c, o, "SGL", 1, DT_FP32, SAVE_EXPERT, "shared_expert_gate's logit per token (fp32, as the router's)");
    }
  }
  new_op(c, OP_COMBINE, "moe.combine", l, kH, H);
}

/* Muon's share: a weight matrix other than embedding, router and LM head. Newton-Schulz on an
 * r × c matrix (r <= c, transposed if needed), per iteration: A = X Xᵀ (2r²c), B = bA + cA²
 * (2r³), X = aX + BX (2r²c); 5 iterations (Jordan et al., "Muon", 2024). */
static void muon_account(Cx *c, Model *md, const Param *p) {
  if (!p->matmul || p->kind == PK_EMBEDDING || p->kind == PK_ROUTER || p->kind == PK_HEAD) return;
  int64_t n = p->ndim == 3 ? p->shape[0] : 1;
  int64_t r = p->shape[p->ndim - 2], cols = p->shape[p->ndim - 1];
  if (r > cols) { int64_t t = r; r = cols; cols = t; }
  md->muon_params = add(c, md->muon_params, p->count);
  if (p->kind != PK_ROUTED) md->muon_dense_params = add(c, md->muon_dense_params, p->count);
  md->muon_matrices = add(c, md->muon_matrices, n);
  md->ns_flops += (double)n * 5.0 * (4.0 * (double)r * (double)r * (double)cols + 2.0 * (double)r * (double)r * (double)r);
  if (r * cols > md->muon_max_rows * md->muon_max_cols) md->muon_max_rows = r, md->muon_max_cols = cols;
}

static bool is_moe_layer(const ModelSpec *ms, int l) {
  const MoeSpec *moe = &ms->moe;
  if (!moe->present || l < moe->first_dense_layers) return false;
  return (l - moe->first_dense_layers + 1) % moe->interleave == 0;
}

Model *model_build(Mem *m, Diag *d, const Spec *s) {
  const ModelSpec *ms = &s->model;
  Model *md = mem_alloc(m, sizeof *md);
  Cx c = {m, s, md, false};
  int64_t H = ms->hidden, V = ms->vocab;
  md->spec = s;
  md->nlayers = (int)ms->layers;
  md->layers = mem_array(m, (size_t)ms->layers, sizeof *md->layers);
  if (ms->attention.kind == ATTN_MLA) {
    md->qk_head_dim = ms->attention.qk_nope_head_dim + ms->attention.qk_rope_head_dim;
    md->v_head_dim = ms->attention.v_head_dim;
  } else {
    md->qk_head_dim = md->v_head_dim = ms->attention.head_dim;
  }

  Op *o = new_op(&c, OP_EMBED, "embedding", -1, 0, H);
  param(&c, o, "embed_tokens.weight", PK_EMBEDDING, false, V, H, 0);
  save(&c, o, "INPUTS", 1, DT_INT32, SAVE_OTHER, "token ids of the micro-batch (int32)");
  if (ms->position == POS_LEARNED) {
    o = new_op(&c, OP_POS_EMBED, "position_embedding", -1, H, H);
    param(&c, o, "embed_positions.weight", PK_EMBEDDING, false, ms->max_position, H, 0);
  }
  for (int l = 0; l < md->nlayers; l++) {
    Layer *ly = &md->layers[l];
    ly->first_op = md->nops;
    ly->kind = is_moe_layer(ms, l) ? LAYER_MOE : LAYER_DENSE;
    norm_op(&c, OP_NORM, "attention_norm", "input_layernorm.weight", "input_layernorm.bias", l, SAVE_BOUNDARY,
            "X", "boundary: the layer's input (residual stream)", "LN1", "attention norm output", "RSTD1");
    if (ms->attention.kind == ATTN_MLA) attention_mla(&c, l);
    else attention_gqa(&c, l);
    new_op(&c, OP_RESIDUAL, "attention.residual", l, 2 * H, H);
    norm_op(&c, OP_NORM, "mlp_norm", "post_attention_layernorm.weight", "post_attention_layernorm.bias", l,
            SAVE_OTHER, "RES", "residual stream after attention", "LN2", "mlp norm output", "RSTD2");
    if (ly->kind == LAYER_MOE) moe_block(&c, l), md->n_moe_layers++;
    else dense_mlp(&c, l);
    new_op(&c, OP_RESIDUAL, "mlp.residual", l, 2 * H, H);
    ly->nops = md->nops - ly->first_op;
  }
  norm_op(&c, OP_FINAL_NORM, "final_norm", "norm.weight", "norm.bias", -1, SAVE_OTHER, "X", "output of the last layer",
          "LNF", "final norm output", "RSTDF");
  o = new_op(&c, OP_LM_HEAD, "lm_head", -1, H, 0); /* logits stay in vocabulary chunks */
  if (!ms->tie_embeddings) param(&c, o, "lm_head.weight", PK_HEAD, true, V, H, 0);
  else o->active_matmul = mul(&c, V, H); /* the GEMM runs against the embedding */
  o = new_op(&c, OP_LOSS, "loss", -1, 0, 0);
  save(&c, o, "LSEF", 1, DT_FP32, SAVE_OTHER, "log-sum-exp of each token's logits");
  save(&c, o, "TARGETS", 1, DT_INT32, SAVE_OTHER, "next-token targets (int32)");

  /* accounting */
  for (int i = 0; i < md->nops; i++) {
    Op *op = &md->ops[i];
    op->gemm_flops = 2.0 * (double)op->active_matmul;
    md->params_total = add(&c, md->params_total, op->param_count);
    md->params_active = add(&c, md->params_active, op->active_params);
    for (int j = 0; j < op->nparams; j++) {
      const Param *p = &op->params[j];
      int64_t act = p->kind == PK_ROUTED ? mul(&c, p->count / p->shape[0], ms->moe.top_k) : p->count;
      md->by_kind_total[p->kind] = add(&c, md->by_kind_total[p->kind], p->count);
      md->by_kind_active[p->kind] = add(&c, md->by_kind_active[p->kind], act);
      if (p->matmul && p->kind != PK_ROUTER) md->active_matmul = add(&c, md->active_matmul, act);
    }
    if (op->kind == OP_LM_HEAD && ms->tie_embeddings)
      md->active_matmul = add(&c, md->active_matmul, op->active_matmul);
    for (int j = 0; j < op->nparams; j++) muon_account(&c, md, &op->params[j]);
    if (op->layer < 0) {
      bool e = op->kind == OP_EMBED || op->kind == OP_POS_EMBED;
      for (int j = 0; j < op->nparams; j++) *(e ? &md->unit_embed_params : &md->unit_head_params) += (double)op->params[j].count;
    }
    if (op->layer >= 0) {
      Layer *ly = &md->layers[op->layer];
      if (op->kind == OP_EXPERTS) ly->routed_params = add(&c, ly->routed_params, op->param_count);
      ly->params = add(&c, ly->params, op->param_count);
      ly->active_params = add(&c, ly->active_params, op->active_params);
      for (int j = 0; j < op->nsaved; j++) {
        const Saved *sv = &op->saved[j];
        int64_t b = mul(&c, sv->elems, model_dtype_bytes(sv->dtype));
        ly->saved_bytes[sv->cls] = add(&c, ly->saved_bytes[sv->cls], b);
        if (sv->routed) ly->saved_routed = add(&c, ly->saved_routed, b);
      }
    }
  }
  md->params_active_nonembedding =
      md->params_active - md->by_kind_active[PK_EMBEDDING] - md->by_kind_active[PK_HEAD];
  md->flops_matmul = 6.0 * (double)md->active_matmul;
  md->flops_attention = 6.0 * (double)ms->layers * (double)s->training.seq_len *
                        (double)ms->attention.heads * (double)(md->qk_head_dim + md->v_head_dim) / 2.0;
  md->flops_per_token = md->flops_matmul + md->flops_attention;
  if (c.overflow) {
    diag_error(d, spec_loc(s, "model"), "the model's parameter count overflows 64 bits; "
                                        "expected dimensions of a model that fits in memory");
    return NULL;
  }
  return md;
}
