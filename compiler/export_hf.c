/* export_hf.c — the Hugging Face side of `mtc export CKPT OUTDIR --spec SPEC`: which transformers
 * family expresses the spec's model (export_family), that family's config.json (export_config)
 * and its tensor names (export_tensors), from the program's own names (export_raw_name, the
 * names step.c's tensor table and the checkpoint manifest use).
 *
 * Sources: transformers' src/transformers/models/<family>/configuration_<family>.py for the
 * config fields and defaults, modeling_<family>.py for the module tree, hence the state-dict
 * names (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM,
 * Qwen3MoeForCausalLM, OlmoeForCausalLM, DeepseekV3ForCausalLM, GPT2LMHeadModel). */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "mtc.h"

const char *export_raw_name(Mem *m, int layer, const char *p) {
  const char *rest = p, *pre = "";
  if (strncmp(p, "attn.", 5) == 0) pre = "self_attn.", rest = p + 5;
  else if (strncmp(p, "moe.gate.", 9) == 0) pre = "mlp.gate.", rest = p + 9;
  else if (strncmp(p, "moe.experts.", 12) == 0) pre = "mlp.experts.%d.", rest = p + 12;
  else if (strncmp(p, "moe.shared_experts.", 19) == 0) pre = "mlp.shared_experts.", rest = p + 19;
  else if (strncmp(p, "moe.shared_expert_gate.", 23) == 0) pre = "mlp.shared_expert_gate.", rest = p + 23;
  if (layer < 0) return strcmp(p, "lm_head.weight") == 0 ? p : mem_printf(m, "model.%s", p);
  return mem_printf(m, "model.layers.%d.%s%s", layer, pre, rest);
}

/* ---- which family ------------------------------------------------------------------------- */

/* An error at spec key `key`: no family expresses the model, and why. Returns NULL. */
static const char *refuse(Diag *d, const Spec *s, const char *key, const char *why, const char *expected) {
  diag_error(d, spec_loc(s, key), "mtc export: no Hugging Face family expresses this model: %s; expected %s", why,
             expected);
  return NULL;
}

/* Whether layer l is an MoE layer (model.c's is_moe_layer). */
static bool moe_layer(const ModelSpec *ms, int64_t l) {
  const MoeSpec *moe = &ms->moe;
  if (!moe->present || l < moe->first_dense_layers) return false;
  return (l - moe->first_dense_layers + 1) % moe->interleave == 0;
}

/* The GPT-2 family: every GPT-style feature together, nothing else (GPT2Block). */
static const char *gpt2_family(Diag *d, const Spec *s) {
  const ModelSpec *ms = &s->model;
  const AttentionSpec *a = &ms->attention;
  const char *exp = "the GPT-2 form (model.norm layernorm, position learned, bias true, attention mha, a dense gelu "
                    "mlp, no moe: GPT2LMHeadModel) or the Llama form (rmsnorm, rope, no biases, swiglu)";
  if (ms->norm != NORM_LAYERNORM) return refuse(d, s, "model.norm", "model.norm is rmsnorm with a GPT-2 feature "
                                                "(learned positions, biases or a GELU MLP)", exp);
  if (ms->position != POS_LEARNED) return refuse(d, s, "model.position", "model.position is rope with a GPT-2 feature "
                                                 "(LayerNorm, biases or a GELU MLP)", exp);
  if (!ms->bias) return refuse(d, s, "model.bias", "model.bias is false with a GPT-2 feature (LayerNorm, learned "
                               "positions or a GELU MLP); GPT-2 has a bias on every linear and norm", exp);
  if (ms->moe.present) return refuse(d, s, "model.moe", "MoE layers with GPT-2 features (LayerNorm, learned positions, "
                                     "biases, GELU experts): no family has biased or GELU experts", exp);
  if (ms->mlp.activation != ACT_GELU) return refuse(d, s, "model.mlp.activation", "a swiglu MLP with GPT-2 features; "
                                                   "GPT-2's MLP is c_fc, GELU, c_proj", exp);
  if (a->kind != ATTN_MHA && a->kv_heads != a->heads)
    return refuse(d, s, "model.attention.kv_heads", "grouped-query attention with GPT-2 features; GPT-2's c_attn "
                  "has as many key and value heads as query heads", exp);
  if (a->head_dim * a->heads != ms->hidden)
    return refuse(d, s, "model.attention.head_dim", "head_dim x heads is not hidden; GPT-2's heads split n_embd", exp);
  if (a->qk_norm != QKN_NONE) return refuse(d, s, "model.attention.qk_norm", "qk-norm with GPT-2 features", exp);
  return "gpt2";
}

/* The MoE families other than DeepSeek-V3's (softmax routers without a bias). */
static const char *moe_family(Diag *d, const Spec *s) {
  const ModelSpec *ms = &s->model;
  const MoeSpec *moe = &ms->moe;
  const AttentionSpec *a = &ms->attention;
  bool all_moe = moe->first_dense_layers == 0 && moe->interleave == 1;
  bool split_heads = a->head_dim * a->heads == ms->hidden;
  if (moe->shared_experts) {
    if (!moe->shared_expert_gate)
      return refuse(d, s, "model.moe.shared_experts", "shared experts without a gate on a softmax router (Qwen2-MoE "
                    "gates its shared expert; DeepSeek-V3's ungated ones need MLA and a sigmoid router)",
                    "model.moe.shared_expert_gate: true (qwen2_moe), or no shared experts");
    if (a->qk_norm != QKN_NONE)
      return refuse(d, s, "model.attention.qk_norm", "qk-norm with a gated shared expert (Qwen2-MoE has no q_norm, "
                    "k_norm)", "no qk_norm (qwen2_moe), or no shared experts with qk_norm per_head (qwen3_moe)");
    if (!split_heads)
      return refuse(d, s, "model.attention.head_dim", "head_dim x heads is not hidden (Qwen2MoeAttention's head_dim "
                    "is hidden_size / num_attention_heads)", "no model.attention.head_dim");
    return "qwen2_moe";
  }
  if (a->qk_norm == QKN_PER_HEAD) return "qwen3_moe";
  if (a->qk_norm == QKN_FULL) {
    if (!all_moe)
      return refuse(d, s, "model.moe.first_dense_layers", "qk-norm over all heads with dense layers (OLMoE makes "
                    "every layer MoE)", "every layer MoE: first_dense_layers 0 and interleave 1");
    if (!split_heads)
      return refuse(d, s, "model.attention.head_dim", "head_dim x heads is not hidden (OlmoeAttention's head_dim is "
                    "hidden_size / num_attention_heads)", "no model.attention.head_dim");
    return "olmoe";
  }
  if (!moe->norm_topk_prob)
    return refuse(d, s, "model.moe.norm_topk_prob", "norm_topk_prob false without qk-norm or a shared expert "
                  "(Mixtral always renormalizes its top-k)", "norm_topk_prob true (mixtral), qk_norm per_head "
                  "(qwen3_moe) or full (olmoe), or a gated shared expert (qwen2_moe)");
  if (!all_moe)
    return refuse(d, s, moe->first_dense_layers ? "model.moe.first_dense_layers" : "model.moe.interleave",
                  "dense layers without qk-norm or a shared expert (Mixtral makes every layer MoE)",
                  "every layer MoE (mixtral), qk_norm per_head (qwen3_moe) or a gated shared expert (qwen2_moe)");
  return "mixtral";
}

/* model.attention.bias in family fam (transformers' attention classes): llama, qwen3, qwen3_moe
 * and olmoe have attention_bias (q, k, v and o_proj, or none); qwen2 has q/k/v biases always,
 * qwen2_moe has them with qkv_bias; mixtral and deepseek_v3 have none. A dense llama-shaped model
 * with q/k/v biases is Qwen2's. fam, or NULL with a diagnostic at model.attention.bias. */
static const char *with_attention_bias(Diag *d, const Spec *s, const char *fam) {
  AttnBias b = s->model.attention.bias;
  if (b == ABIAS_NONE || !strcmp(fam, "gpt2")) return fam;
  if (b == ABIAS_QKV && !strcmp(fam, "llama")) return "qwen2";
  bool qkvo_ok = !strcmp(fam, "llama") || !strcmp(fam, "qwen3") || !strcmp(fam, "qwen3_moe") || !strcmp(fam, "olmoe");
  if ((b == ABIAS_QKVO && qkvo_ok) || (b == ABIAS_QKV && !strcmp(fam, "qwen2_moe"))) return fam;
  return refuse(d, s, "model.attention.bias", mem_printf(d->mem, "attention bias %s in a %s-shaped model (%s)",
                b == ABIAS_QKV ? "qkv" : "qkvo", fam, !strcmp(fam, "qwen2_moe") ? "Qwen2MoeAttention's o_proj has no "
                "bias" : b == ABIAS_QKV && qkvo_ok ? "its attention_bias puts biases on q, k, v and o_proj" : "its "
                "attention has no biases"), "model.attention.bias qkvo (llama, qwen3, qwen3_moe, olmoe), qkv (qwen2, "
                "qwen2_moe) or none");
}

static const char *family_of(Diag *d, const Spec *s);

const char *export_family(Diag *d, const Spec *s) {
  const char *fam = family_of(d, s);
  return fam ? with_attention_bias(d, s, fam) : NULL;
}

/* The family by every feature but the attention biases. */
static const char *family_of(Diag *d, const Spec *s) {
  const ModelSpec *ms = &s->model;
  const MoeSpec *moe = &ms->moe;
  const AttentionSpec *a = &ms->attention;
  if (ms->norm == NORM_LAYERNORM || ms->position == POS_LEARNED || ms->bias ||
      (ms->mlp.present && ms->mlp.activation == ACT_GELU))
    return gpt2_family(d, s);
  if (moe->present && moe->activation != ACT_SWIGLU)
    return refuse(d, s, "model.moe.activation", "GELU experts (every family's experts are gated: silu(gate) x up, "
                  "then down)", "model.moe.activation swiglu");
  if (a->kind == ATTN_MLA) {
    const char *exp = "DeepSeek-V3's form: MoE with router sigmoid, router_bias true, shared experts of "
                      "expert_intermediate each, every layer past first_dense_layers MoE (interleave 1)";
    if (!moe->present) return refuse(d, s, "model.attention.kind", "MLA in a dense model", exp);
    if (moe->router != ROUTER_SIGMOID || !moe->router_bias)
      return refuse(d, s, "model.moe.router", "MLA with a router other than sigmoid with a score-correction bias "
                    "(DeepseekV3TopkRouter always has e_score_correction_bias)", exp);
    if (!moe->shared_experts || moe->shared_intermediate != moe->expert_intermediate)
      return refuse(d, s, "model.moe.shared_experts", "MLA without shared experts of expert_intermediate each "
                    "(DeepseekV3MoE's shared expert is n_shared_experts x moe_intermediate_size wide)", exp);
    if (moe->interleave != 1)
      return refuse(d, s, "model.moe.interleave", "interleaved dense layers (DeepseekV3DecoderLayer makes every "
                    "layer from first_k_dense_replace on MoE)", exp);
    if (moe->shared_expert_gate)
      return refuse(d, s, "model.moe.shared_expert_gate", "a gated shared expert with MLA", exp);
    return "deepseek_v3";
  }
  if (moe->present) {
    if (moe->router != ROUTER_SOFTMAX || moe->router_bias)
      return refuse(d, s, moe->router_bias ? "model.moe.router_bias" : "model.moe.router", "a sigmoid router or a "
                    "score-correction bias without MLA (only DeepSeek-V3 has them, and it has MLA)",
                    "router softmax without router_bias, or attention kind mla");
    if (moe->routed_scaling_factor != 1)
      return refuse(d, s, "model.moe.routed_scaling_factor", "routed_scaling_factor without MLA (only DeepSeek-V3 "
                    "has it)", "routed_scaling_factor 1, or attention kind mla");
    if (moe->n_group > 1)
      return refuse(d, s, "model.moe.n_group", "group-limited routing without MLA (only DeepSeek-V3 has it)",
                    "n_group 1, or attention kind mla");
    return moe_family(d, s);
  }
  if (a->qk_norm == QKN_FULL)
    return refuse(d, s, "model.attention.qk_norm", "qk-norm over all heads in a dense model (no exported family "
                  "has it)", "qk_norm per_head (qwen3) or none (llama)");
  return a->qk_norm == QKN_PER_HEAD ? "qwen3" : "llama";
}

/* ---- config.json -------------------------------------------------------------------------- */

static void set_int(json_t *c, const char *k, int64_t v) { json_object_set_new(c, k, json_integer((json_int_t)v)); }
static void set_real(json_t *c, const char *k, double v) { json_object_set_new(c, k, json_real(v)); }
static void set_str(json_t *c, const char *k, const char *v) { json_object_set_new(c, k, json_string(v)); }
static void set_bool(json_t *c, const char *k, bool v) { json_object_set_new(c, k, json_boolean(v)); }

/* rope_scaling as transformers' modeling_rope_utils.py reads it, or null. */
static json_t *rope_scaling(const RopeScalingSpec *r) {
  if (!r->present || r->type == ROPE_SCALING_NONE) return json_null();
  bool llama3 = r->type == ROPE_SCALING_LLAMA3;
  json_t *o = json_object();
  set_str(o, "rope_type", llama3 ? "llama3" : "yarn");
  set_real(o, "factor", r->factor);
  if (r->original_max_position) set_int(o, "original_max_position_embeddings", r->original_max_position);
  if (llama3) {
    set_real(o, "low_freq_factor", r->low_freq_factor);
    set_real(o, "high_freq_factor", r->high_freq_factor);
  } else {
    set_real(o, "beta_fast", r->beta_fast);
    set_real(o, "beta_slow", r->beta_slow);
    set_real(o, "mscale", r->mscale);
    set_real(o, "mscale_all_dim", r->mscale_all_dim);
  }
  return o;
}

/* The fields of the RoPE, RMSNorm, gated-MLP families (LlamaConfig's, shared by the others). */
static void llama_common(json_t *c, const Spec *s) {
  const ModelSpec *ms = &s->model;
  const AttentionSpec *a = &ms->attention;
  int64_t pos = ms->max_position > s->training.seq_len ? ms->max_position : s->training.seq_len;
  const RopeScalingSpec *r = &ms->rope_scaling;
  /* YaRN: the context after scaling, factor x original_max_position (DeepSeek-V3: 40 x 4096):
   * transformers' _compute_yarn_parameters takes the factor as max_position_embeddings /
   * original_max_position_embeddings in some versions. Default and llama3 RoPE do not read it. */
  if (r->present && r->type == ROPE_SCALING_YARN) pos = llround(r->factor * (double)r->original_max_position);
  set_int(c, "vocab_size", ms->vocab);
  set_int(c, "hidden_size", ms->hidden);
  set_int(c, "num_hidden_layers", ms->layers);
  set_int(c, "num_attention_heads", a->heads);
  set_int(c, "num_key_value_heads", a->kind == ATTN_MLA ? a->heads : a->kv_heads);
  if (a->kind != ATTN_MLA) set_int(c, "head_dim", a->head_dim);
  set_str(c, "hidden_act", "silu");
  set_int(c, "max_position_embeddings", pos > 0 ? pos : 4096);
  set_real(c, "rms_norm_eps", ms->norm_eps);
  set_real(c, "rope_theta", a->rope_theta);
  json_object_set_new(c, "rope_scaling", rope_scaling(&ms->rope_scaling));
  set_bool(c, "tie_word_embeddings", ms->tie_embeddings);
  set_bool(c, "attention_bias", a->bias == ABIAS_QKVO); /* LlamaAttention: q, k, v and o_proj */
  set_real(c, "attention_dropout", 0);
}

/* The MoE fields every MoE family shares in meaning. */
static void moe_common(json_t *c, const MoeSpec *moe) {
  set_int(c, "num_experts_per_tok", moe->top_k);
  set_bool(c, "norm_topk_prob", moe->norm_topk_prob);
  set_real(c, "router_aux_loss_coef", moe->load_balance == LB_AUX_LOSS ? moe->aux_loss_coef : 0);
  set_bool(c, "output_router_logits", false);
}

/* Qwen2-MoE / Qwen3-MoE layer pattern: decoder_sparse_step and mlp_only_layers (a layer is sparse
 * when it is not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0). */
static void qwen_layers(json_t *c, const ModelSpec *ms) {
  json_t *dense = json_array();
  int64_t step = ms->moe.first_dense_layers == 0 ? ms->moe.interleave : 1;
  for (int64_t l = 0; l < ms->layers; l++)
    if (!moe_layer(ms, l) && (l + 1) % step == 0) json_array_append_new(dense, json_integer((json_int_t)l));
  set_int(c, "decoder_sparse_step", step);
  json_object_set_new(c, "mlp_only_layers", dense);
}

void *export_config(const Spec *s, const char *family, const char *dtype) {
  const ModelSpec *ms = &s->model;
  const MoeSpec *moe = &ms->moe;
  const AttentionSpec *a = &ms->attention;
  static const char *const arch[][2] = {{"llama", "LlamaForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"}, {"qwen3", "Qwen3ForCausalLM"},
      {"mixtral", "MixtralForCausalLM"}, {"qwen2_moe", "Qwen2MoeForCausalLM"}, {"qwen3_moe", "Qwen3MoeForCausalLM"},
      {"olmoe", "OlmoeForCausalLM"}, {"deepseek_v3", "DeepseekV3ForCausalLM"}, {"gpt2", "GPT2LMHeadModel"}};
  json_t *c = json_object();
  for (size_t i = 0; i < sizeof arch / sizeof *arch; i++)
    if (!strcmp(arch[i][0], family)) json_object_set_new(c, "architectures", json_pack("[s]", arch[i][1]));
  set_str(c, "model_type", family);
  set_str(c, "_name_or_path", s->name);
  set_str(c, "torch_dtype", dtype);
  set_real(c, "initializer_range", 0.02);
  set_bool(c, "use_cache", true);
  int64_t dense_inter = ms->mlp.present ? ms->mlp.intermediate : moe->expert_intermediate;
  if (!strcmp(family, "gpt2")) { /* configuration_gpt2.py */
    set_int(c, "vocab_size", ms->vocab);
    set_int(c, "n_positions", ms->max_position);
    set_int(c, "n_embd", ms->hidden);
    set_int(c, "n_layer", ms->layers);
    set_int(c, "n_head", a->heads);
    if (ms->mlp.intermediate == 4 * ms->hidden) json_object_set_new(c, "n_inner", json_null()); /* GPT2MLP: 4 n_embd */
    else set_int(c, "n_inner", ms->mlp.intermediate);
    set_str(c, "activation_function", "gelu_new"); /* mtc's GELU is the tanh form */
    set_real(c, "layer_norm_epsilon", ms->norm_eps);
    set_real(c, "resid_pdrop", 0), set_real(c, "embd_pdrop", 0), set_real(c, "attn_pdrop", 0);
    set_bool(c, "scale_attn_weights", true);
    set_bool(c, "scale_attn_by_inverse_layer_idx", false);
    set_bool(c, "reorder_and_upcast_attn", false);
    set_bool(c, "add_cross_attention", false);
    set_bool(c, "tie_word_embeddings", ms->tie_embeddings);
    return c;
  }
  llama_common(c, s);
  set_int(c, "intermediate_size", dense_inter);
  if (!strcmp(family, "llama")) set_bool(c, "mlp_bias", false);
  if (!strcmp(family, "qwen2")) json_object_del(c, "attention_bias"); /* Qwen2Attention: q/k/v biases always */
  if (!strcmp(family, "qwen2") || !strcmp(family, "qwen3") || !strcmp(family, "qwen3_moe") ||
      !strcmp(family, "qwen2_moe")) {
    set_bool(c, "use_sliding_window", false);
    json_object_set_new(c, "sliding_window", json_null());
  }
  if (!strcmp(family, "mixtral")) {
    set_int(c, "num_local_experts", moe->experts);
    json_object_set_new(c, "sliding_window", json_null());
    set_real(c, "router_jitter_noise", 0);
    set_int(c, "intermediate_size", moe->expert_intermediate);
    moe_common(c, moe);
  } else if (!strcmp(family, "olmoe")) {
    set_int(c, "num_experts", moe->experts);
    set_int(c, "intermediate_size", moe->expert_intermediate);
    json_object_set_new(c, "clip_qkv", json_null());
    moe_common(c, moe);
  } else if (!strcmp(family, "qwen2_moe") || !strcmp(family, "qwen3_moe")) {
    set_int(c, "num_experts", moe->experts);
    set_int(c, "moe_intermediate_size", moe->expert_intermediate);
    if (!strcmp(family, "qwen2_moe")) {
      set_int(c, "shared_expert_intermediate_size", moe->shared_experts * moe->shared_intermediate);
      set_bool(c, "qkv_bias", a->bias == ABIAS_QKV); /* Qwen2MoeAttention: bias=config.qkv_bias */
      json_object_del(c, "attention_bias");
    }
    qwen_layers(c, ms);
    moe_common(c, moe);
  } else if (!strcmp(family, "deepseek_v3")) { /* configuration_deepseek_v3.py */
    set_int(c, "n_routed_experts", moe->experts);
    set_int(c, "n_shared_experts", moe->shared_experts);
    set_int(c, "moe_intermediate_size", moe->expert_intermediate);
    set_int(c, "first_k_dense_replace", moe->first_dense_layers);
    set_int(c, "moe_layer_freq", 1);
    if (a->q_lora_rank) set_int(c, "q_lora_rank", a->q_lora_rank);
    else json_object_set_new(c, "q_lora_rank", json_null());
    set_int(c, "kv_lora_rank", a->kv_lora_rank);
    set_int(c, "qk_nope_head_dim", a->qk_nope_head_dim);
    set_int(c, "qk_rope_head_dim", a->qk_rope_head_dim);
    set_int(c, "v_head_dim", a->v_head_dim);
    set_int(c, "n_group", moe->n_group);
    set_int(c, "topk_group", moe->topk_group);
    set_real(c, "routed_scaling_factor", moe->routed_scaling_factor);
    set_str(c, "scoring_func", "sigmoid");
    set_str(c, "topk_method", "noaux_tc");
    /* DeepSeek's remote MoEGate fields for the sequence-wise balance loss (import-hf reads them back) */
    set_real(c, "aux_loss_alpha", moe->seq_aux_loss_coef);
    set_bool(c, "seq_aux", true);
    set_bool(c, "rope_interleave", true); /* the rope rows are written interleaved (rope_rows) */
    moe_common(c, moe);
  }
  return c;
}

/* ---- tensor names ------------------------------------------------------------------------- */

/* Replaces the first `from` in name by `to` (name unchanged when absent). */
static const char *swap(Mem *m, const char *name, const char *from, const char *to) {
  const char *p = strstr(name, from);
  if (!p) return name;
  return mem_printf(m, "%.*s%s%s", (int)(p - name), name, to, p + strlen(from));
}

/* GPT2LMHeadModel's name for a raw name (modeling_gpt2.py: transformer.{wte,wpe,h.N,ln_f};
 * GPT2Block: ln_1, attn, ln_2, mlp; GPT2Attention: c_attn (q, k, v fused), c_proj; GPT2MLP:
 * c_fc, c_proj). *transposed: a Conv1D weight, stored [in, out]. */
static const char *gpt2_name(Mem *m, const char *raw, bool *transposed) {
  static const char *const map[][2] = {
      {"model.embed_tokens.", "transformer.wte."}, {"model.embed_positions.", "transformer.wpe."},
      {"model.norm.", "transformer.ln_f."}, {"model.layers.", "transformer.h."},
      {".input_layernorm.", ".ln_1."}, {".post_attention_layernorm.", ".ln_2."},
      {".self_attn.q_proj.", ".attn.c_attn."}, {".self_attn.k_proj.", ".attn.c_attn."},
      {".self_attn.v_proj.", ".attn.c_attn."}, {".self_attn.o_proj.", ".attn.c_proj."},
      {".mlp.up_proj.", ".mlp.c_fc."}, {".mlp.down_proj.", ".mlp.c_proj."}};
  const char *n = raw;
  for (size_t i = 0; i < sizeof map / sizeof *map; i++) n = swap(m, n, map[i][0], map[i][1]);
  size_t len = strlen(n);
  *transposed = strstr(n, ".attn.c_") || strstr(n, ".mlp.c_");
  *transposed = *transposed && len > 7 && !strcmp(n + len - 7, ".weight");
  return n;
}

/* The family's name for raw name (experts: "%d" in it, kept). */
static const char *family_name(Mem *m, const char *family, const char *raw) {
  if (!strcmp(family, "mixtral")) { /* MixtralSparseMoeBlock: gate, experts.E.w1 (gate), w2 (down), w3 (up) */
    const char *n = swap(m, swap(m, raw, ".mlp.gate.", ".block_sparse_moe.gate."), ".mlp.experts.",
                         ".block_sparse_moe.experts.");
    return swap(m, swap(m, swap(m, n, ".gate_proj.", ".w1."), ".down_proj.", ".w2."), ".up_proj.", ".w3.");
  }
  if (!strcmp(family, "qwen2_moe")) /* Qwen2MoeSparseMoeBlock: gate, experts, shared_expert, shared_expert_gate */
    return swap(m, raw, ".mlp.shared_experts.", ".mlp.shared_expert.");
  return raw; /* Llama, Qwen3, Qwen3-MoE, OLMoE, DeepSeek-V3: the program's names are theirs */
}

/* DeepSeek's RoPE rows (deepseek_v3, config rope_interleave true): the rope part of each q head
 * (q_b_proj, q_proj: blocks of nope + rope rows, the rope rows last) and kv_a_proj_with_mqa's rope
 * key (its rows past kv_lora_rank) are written in interleaved pairs (ExportTensor's rope_*), so
 * that transformers' DeepseekV3Attention with rope_interleave (its default, and DeepSeek's own
 * modeling_deepseek.py, which always de-interleaves) computes mtc's half-split RoPE. */
static void rope_rows(const Model *md, ExportTensor *t) {
  const AttentionSpec *a = &md->spec->model.attention;
  size_t n = strlen(t->name);
#define ENDS(x) (n >= sizeof(x) - 1 && !strcmp(t->name + n - (sizeof(x) - 1), x))
  if (ENDS(".q_b_proj.weight") || ENDS(".q_proj.weight"))
    t->rope_block = a->qk_nope_head_dim + a->qk_rope_head_dim, t->rope_off = a->qk_nope_head_dim;
  else if (ENDS(".kv_a_proj_with_mqa.weight"))
    t->rope_block = a->kv_lora_rank + a->qk_rope_head_dim, t->rope_off = a->kv_lora_rank;
  else return;
  t->rope_dim = a->qk_rope_head_dim;
#undef ENDS
}

ExportTensor *export_tensors(Mem *m, const Model *md, const char *family, int *count) {
  int cap = 0, n = 0;
  for (int i = 0; i < md->nops; i++)
    for (int j = 0; j < md->ops[i].nparams; j++) {
      const Param *p = &md->ops[i].params[j];
      cap += p->ndim == 3 ? (int)p->shape[0] : 1;
    }
  ExportTensor *out = mem_array(m, (size_t)cap + 1, sizeof *out);
  bool gpt2 = !strcmp(family, "gpt2");
  for (int i = 0; i < md->nops; i++) {
    const Op *o = &md->ops[i];
    for (int j = 0; j < o->nparams; j++) {
      const Param *p = &o->params[j];
      const char *raw = export_raw_name(m, o->layer, p->name);
      int ne = p->ndim == 3 ? (int)p->shape[0] : 1;
      int64_t rows = p->shape[p->ndim == 3 ? 1 : 0], cols = p->ndim >= 2 ? p->shape[p->ndim - 1] : 0;
      for (int e = 0; e < ne; e++) {
        const char *r = p->ndim == 3 ? mem_printf(m, "%s", swap(m, raw, "%d", mem_printf(m, "%d", e))) : raw;
        bool tr = false;
        const char *name = gpt2 ? gpt2_name(m, r, &tr) : family_name(m, family, r);
        ExportTensor *t = NULL;
        for (int k = n - 1; k >= 0 && gpt2 && k >= n - 6 && !t; k--) /* c_attn's q, k, v parts: the last few */
          if (!strcmp(out[k].name, name)) t = &out[k];
        if (t && t->nparts < 3) {
          if (t->transposed) t->cols += rows;
          else t->rows += rows;
        } else {
          t = &out[n++];
          t->name = name, t->transposed = tr;
          t->rows = tr ? cols : rows, t->cols = tr ? rows : cols;
        }
        ExportPart *pt = &t->parts[t->nparts++];
        pt->raw = raw, pt->expert = p->ndim == 3 ? e : -1, pt->rows = rows, pt->cols = cols;
        if (!strcmp(family, "deepseek_v3")) rope_rows(md, t);
      }
    }
  }
  *count = n;
  return out;
}
