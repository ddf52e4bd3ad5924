/* import_hf.c — `mtc import-hf config.json`: a Hugging Face transformers config becomes a
 * spec (its model section from the config; cluster and training sections to edit).
 * Families: llama, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3, gpt2. Field
 * names are those of transformers' configuration_<family>.py. Every field that changes the math is
 * kept (rms_norm_eps, norm_topk_prob, routed_scaling_factor, router_aux_loss_coef, DeepSeek's
 * aux_loss_alpha and seq_aux, qk-norm,
 * rope_scaling llama3 and yarn, Qwen2-MoE's shared_expert_gate, n_group/topk_group, the attention
 * biases: attention_bias, Qwen2's and Qwen2-MoE's q/k/v biases) or, when the spec cannot say it
 * yet (other rope types, mlp_bias, clip_qkv, sliding windows), refused with an error naming the field; so is an invalid value
 * (num_experts_per_tok above the experts, topk_group above n_group). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

typedef struct {
  Mem *m;
  Diag *d;
  const Source *src;
  json_t *cfg;
  const char *family;
  char *out; /* the spec being written */
  int64_t seq_len; /* training.seq_len to write: 4096, or less where the model's positions end */
} Hf;

static void emit(Hf *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(Hf *h, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *buf = mem_alloc(h->m, n > 0 ? (size_t)n + 1 : 1);
  buf[0] = 0;
  va_start(ap, fmt);
  if (n > 0) vsnprintf(buf, (size_t)n + 1, fmt, ap);
  va_end(ap);
  h->out = mem_printf(h->m, "%s%s", h->out, buf);
}

/* Where "key" is written in the config (its first occurrence as a JSON key), for diagnostics:
 * jansson keeps no positions, so the text is searched. Line 1, column 1 when not found. */
static Loc key_loc(Hf *h, const char *key) {
  const char *t = h->src->text, *p = t;
  size_t n = strlen(key);
  while ((p = strstr(p, key))) {
    const char *q = p + n;
    while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r' || *q == '"') q++;
    if (p > t && p[-1] == '"' && p[n] == '"' && *q == ':') break;
    p += n;
  }
  Loc l = {h->src, 0, 0};
  for (const char *c = t; p && c < p - 1; c++) /* the opening quote's line and column */
    if (*c == '\n') l.line++, l.col = 0;
    else l.col++;
  return l;
}

/* An integer field of at least min: false without a diagnostic when absent (or null) and not
 * required; false with one naming the field when required and absent, or present and not such
 * an integer. */
static bool get_int(Hf *h, const char *key, bool required, int64_t min, int64_t *out) {
  json_t *v = json_object_get(h->cfg, key);
  if (!v || json_is_null(v)) {
    if (required)
      return diag_error(h->d, (Loc){h->src, 0, 0}, "missing \"%s\", required for model_type '%s'; "
                        "expected a transformers config.json of that family", key, h->family);
    return false;
  }
  if (!json_is_integer(v))
    return diag_error(h->d, key_loc(h, key), "\"%s\" is not an integer; expected a count", key);
  if (json_integer_value(v) < min)
    return diag_error(h->d, key_loc(h, key), "\"%s\" is %lld; expected an integer >= %lld", key,
                      (long long)json_integer_value(v), (long long)min);
  *out = json_integer_value(v);
  return true;
}

/* An optional integer field (>= min, dflt when absent): false only after a diagnostic. */
static bool opt_int(Hf *h, const char *key, int64_t min, int64_t dflt, int64_t *out) {
  *out = dflt;
  return get_int(h, key, false, min, out) || !h->d->msg;
}

/* An optional positive number (dflt when absent or null): false after a diagnostic. */
static bool get_real(Hf *h, const char *key, double dflt, double *out) {
  json_t *v = json_object_get(h->cfg, key);
  *out = dflt;
  if (!v || json_is_null(v)) return true;
  if (!json_is_number(v) || !(json_number_value(v) > 0))
    return diag_error(h->d, key_loc(h, key), "\"%s\" is not a positive number; expected one such as %g", key, dflt);
  *out = json_number_value(v);
  return true;
}

/* An optional boolean (false when absent or null): false after a diagnostic. */
static bool get_bool(Hf *h, const char *key, bool *out) {
  json_t *v = json_object_get(h->cfg, key);
  *out = false;
  if (!v || json_is_null(v)) return true;
  if (!json_is_boolean(v))
    return diag_error(h->d, key_loc(h, key), "\"%s\" is not true or false; expected a boolean", key);
  *out = json_is_true(v);
  return true;
}

/* An optional boolean, dflt when absent or null: false after a diagnostic. */
static bool opt_bool(Hf *h, const char *key, bool dflt, bool *out) {
  json_t *v = json_object_get(h->cfg, key);
  if (!v || json_is_null(v)) return *out = dflt, true;
  return get_bool(h, key, out);
}

/* An optional string (NULL when absent or null; *ok false after a diagnostic when not a string). */
static const char *get_str(Hf *h, const char *key, bool *ok) {
  json_t *v = json_object_get(h->cfg, key);
  if (v && !json_is_null(v) && !json_is_string(v))
    *ok = diag_error(h->d, key_loc(h, key), "\"%s\" is not a string; expected text", key);
  return v && json_is_string(v) ? json_string_value(v) : NULL;
}

/* Every family's MLP (and expert) is gated: act(gate(x)) * up(x), then down. mtc's gated MLP is
 * swiglu (silu); a gated MLP with another activation (gelu_new, relu, ...) has no spec form, and
 * mtc's gelu is the ungated two-matrix MLP, a different model: refused. */
static bool gated_silu(Hf *h) {
  bool ok = true;
  const char *a = get_str(h, "hidden_act", &ok);
  if (!ok || !a || !strcmp(a, "silu") || !strcmp(a, "swish")) return ok;
  return diag_error(h->d, key_loc(h, "hidden_act"), "\"hidden_act\" is '%s', but model_type '%s' has gated MLPs "
                    "(gate, up and down matrices) and mtc's only gated MLP is swiglu (silu); expected silu (mtc's "
                    "gelu is an ungated two-matrix MLP, another model with other parameter counts)", a, h->family);
}

/* The RoPE base (rope_scaling is common()'s: model.rope_scaling). */
static bool rope(Hf *h) {
  double theta;
  if (!get_real(h, "rope_theta", 10000, &theta)) return false;
  emit(h, "    rope_theta: %g\n", theta);
  return true;
}

/* An error for a config field whose math mtc cannot represent yet. */
static bool unsupported(Hf *h, const char *key, const char *what) {
  return diag_error(h->d, key_loc(h, key), "\"%s\" %s, which mtc cannot represent yet; expected a config "
                    "without it (the imported model would train different math)", key, what);
}

/* Whether field key is present and not null (or false, for a boolean). */
static bool set_field(Hf *h, const char *key) {
  json_t *v = json_object_get(h->cfg, key);
  return v && !json_is_null(v) && !json_is_false(v);
}

/* The fields every family shares whose math the spec cannot say: sliding windows (Qwen's
 * use_sliding_window; Mixtral's sliding_window, which its attention applies whenever it is set;
 * layer_types naming another kind than full_attention), clip_qkv, biases on the MLP projections
 * only (mlp_bias: mtc's model.bias puts one on every linear and norm, another model). The
 * attention's biases (attention_bias, qkv_bias) are model.attention.bias: attention_gqa's. */
static bool refuse_common(Hf *h) {
  bool sliding, mbias;
  if (!get_bool(h, "use_sliding_window", &sliding) || !get_bool(h, "mlp_bias", &mbias))
    return false;
  if (sliding) return unsupported(h, "use_sliding_window", "is true (sliding-window attention)");
  json_t *w = json_object_get(h->cfg, "sliding_window");
  if (!strcmp(h->family, "mixtral") && w && !json_is_null(w))
    return unsupported(h, "sliding_window", mem_printf(h->m, "is %s (model_type mixtral applies a sliding-window "
                       "attention whenever it is set; null turns it off)", json_is_integer(w) ?
                       mem_printf(h->m, "%lld", (long long)json_integer_value(w)) : "set"));
  json_t *types = json_object_get(h->cfg, "layer_types"), *t;
  size_t i;
  if (types && json_is_array(types))
    json_array_foreach(types, i, t)
      if (!json_is_string(t) || strcmp(json_string_value(t), "full_attention") != 0)
        return unsupported(h, "layer_types", mem_printf(h->m, "has '%s' at layer %zu (only full_attention layers can "
                           "be said in a spec)", json_is_string(t) ? json_string_value(t) : "?", i));
  if (set_field(h, "clip_qkv")) return unsupported(h, "clip_qkv", "is set (q, k, v clamped)");
  if (mbias)
    return unsupported(h, "mlp_bias", "is true (biases on gate_proj, up_proj and down_proj only; mtc's model.bias "
                       "puts biases on every linear and norm, another model)");
  return true;
}

/* top_k routed experts of experts: 1 <= top_k <= experts, or an error at num_experts_per_tok. */
static bool topk_fits(Hf *h, int64_t topk, int64_t experts, const char *experts_key) {
  if (topk <= experts) return true;
  return diag_error(h->d, key_loc(h, "num_experts_per_tok"), "\"num_experts_per_tok\" is %lld, more than %s %lld; "
                    "expected 1 to %lld experts per token", (long long)topk, experts_key, (long long)experts,
                    (long long)experts);
}

/* rope_scaling (transformers' modeling_rope_utils.py): llama3 and yarn become model.rope_scaling
 * (emitted under model:, before attention:); another rope_type is an error naming it. */
static bool rope_scaling(Hf *h) {
  json_t *r = json_object_get(h->cfg, "rope_scaling");
  if (!r || json_is_null(r)) return true;
  json_t *t = json_object_get(r, "rope_type");
  if (!t) t = json_object_get(r, "type");
  const char *type = t && json_is_string(t) ? json_string_value(t) : "unknown";
  bool llama3 = !strcmp(type, "llama3"), yarn = !strcmp(type, "yarn");
  if (!llama3 && !yarn) return unsupported(h, "rope_scaling", mem_printf(h->m, "has rope_type %s", type));
  json_t *f = json_object_get(r, "factor"), *o = json_object_get(r, "original_max_position_embeddings");
  if (!f || !json_is_number(f) || !o || !json_is_integer(o))
    return diag_error(h->d, key_loc(h, "rope_scaling"), "\"rope_scaling\" (%s) lacks a numeric factor or an integer "
                      "original_max_position_embeddings; expected both", type);
  emit(h, "  rope_scaling:\n    type: %s\n    factor: %.9g\n    original_max_position: %lld\n", type,
       json_number_value(f), (long long)json_integer_value(o));
  static const char *const l3[][2] = {{"low_freq_factor", "low_freq_factor"}, {"high_freq_factor", "high_freq_factor"}};
  static const char *const yn[][2] = {{"beta_fast", "beta_fast"}, {"beta_slow", "beta_slow"}, {"mscale", "mscale"},
                                      {"mscale_all_dim", "mscale_all_dim"}};
  for (int i = 0; i < (llama3 ? 2 : 4); i++) {
    const char *hf = llama3 ? l3[i][0] : yn[i][0], *key = llama3 ? l3[i][1] : yn[i][1];
    json_t *v = json_object_get(r, hf);
    if (v && json_is_number(v)) emit(h, "    %s: %.9g\n", key, json_number_value(v));
  }
  return true;
}

/* The MoE fields that change the routing weights and the balancing loss; norm_topk_prob's
 * default is the family's (transformers' config classes: false for qwen2_moe, qwen3_moe, olmoe). */
static bool moe_conventions(Hf *h, bool norm_default) {
  bool norm;
  if (!opt_bool(h, "norm_topk_prob", norm_default, &norm)) return false;
  if (!norm) emit(h, "    norm_topk_prob: false\n");
  json_t *c = json_object_get(h->cfg, "router_aux_loss_coef");
  if (c && json_is_number(c)) emit(h, "    aux_loss_coef: %.9g\n", json_number_value(c));
  return true;
}

/* The attention section of a gqa/mha family. bias: the family's fixed projection biases
 * (model.attention.bias: "qkv" for Qwen2's and Qwen2-MoE's q/k/v_proj, "none" for Mixtral, whose
 * attention has none whatever the config says), or NULL for the families whose attention_bias
 * (transformers' LlamaAttention and its copies in Qwen3, Qwen3-MoE, OLMoE: q, k, v and o_proj)
 * says it. */
static bool attention_gqa(Hf *h, int64_t hidden, const char *qk_norm, const char *bias) {
  int64_t heads = 0, kv, hd;
  bool abias = false;
  if (!get_int(h, "num_attention_heads", true, 1, &heads) || !opt_int(h, "num_key_value_heads", 1, heads, &kv) ||
      !opt_int(h, "head_dim", 1, 0, &hd) || (!bias && !get_bool(h, "attention_bias", &abias)))
    return false;
  if (heads % kv != 0)
    return diag_error(h->d, key_loc(h, "num_key_value_heads"), "\"num_key_value_heads\" is %lld, which does not "
                      "divide num_attention_heads %lld; expected a divisor (grouped-query attention)",
                      (long long)kv, (long long)heads);
  if (!hd && hidden % heads != 0)
    return diag_error(h->d, key_loc(h, "num_attention_heads"), "\"num_attention_heads\" %lld does not divide "
                      "hidden_size %lld and there is no head_dim; expected a divisor, or head_dim",
                      (long long)heads, (long long)hidden);
  emit(h, "  attention:\n    kind: gqa\n    heads: %lld\n", (long long)heads);
  if (kv != heads) emit(h, "    kv_heads: %lld\n", (long long)kv);
  if (hd && hd * heads != hidden) emit(h, "    head_dim: %lld\n", (long long)hd);
  if (!rope(h)) return false;
  if (qk_norm) emit(h, "    qk_norm: %s\n", qk_norm);
  if ((bias && strcmp(bias, "none") != 0) || abias) emit(h, "    bias: %s\n", bias ? bias : "qkvo");
  return true;
}

static bool common(Hf *h, int64_t *hidden, int64_t *layers) {
  int64_t vocab;
  bool tie;
  if (!get_int(h, "hidden_size", true, 1, hidden) || !get_int(h, "num_hidden_layers", true, 1, layers) ||
      !get_int(h, "vocab_size", true, 1, &vocab) || !gated_silu(h) || !get_bool(h, "tie_word_embeddings", &tie))
    return false;
  emit(h, "model:\n  layers: %lld\n  hidden: %lld\n  vocab: %lld\n", (long long)*layers, (long long)*hidden,
       (long long)vocab);
  if (tie) emit(h, "  tie_embeddings: true\n");
  /* a missing rms_norm_eps is the family's own default (transformers' config classes: MixtralConfig
   * and OlmoeConfig 1e-5; LlamaConfig, Qwen2/Qwen3(-MoE)Config and DeepseekV2/V3Config 1e-6),
   * written out unless it is the spec's default 1e-5; a value, when given, is kept (check judges it) */
  double dflt = !strcmp(h->family, "mixtral") || !strcmp(h->family, "olmoe") ? 1e-5 : 1e-6;
  json_t *eps = json_object_get(h->cfg, "rms_norm_eps");
  if (eps && !json_is_null(eps) && !json_is_number(eps))
    return diag_error(h->d, key_loc(h, "rms_norm_eps"), "\"rms_norm_eps\" is not a number; expected one such as %g "
                      "(model_type '%s''s default)", dflt, h->family);
  if (eps && json_is_number(eps)) emit(h, "  norm_eps: %.9g\n", json_number_value(eps));
  else if (dflt != 1e-5) emit(h, "  norm_eps: %.9g\n", dflt);
  return refuse_common(h) && rope_scaling(h);
}

/* Llama; Qwen2 (dense: Llama's layout with biases on q_proj, k_proj and v_proj, Qwen2Attention in
 * modeling_qwen2.py); Qwen3 (dense: q and k normalized per head, modeling_qwen3.py). */
static bool llama(Hf *h, const char *family) {
  int64_t hidden, layers, inter;
  bool qwen2 = !strcmp(family, "qwen2"), qwen3 = !strcmp(family, "qwen3");
  if (!common(h, &hidden, &layers) || !attention_gqa(h, hidden, qwen3 ? "per_head" : NULL, qwen2 ? "qkv" : NULL) ||
      !get_int(h, "intermediate_size", true, 1, &inter))
    return false;
  emit(h, "  mlp:\n    intermediate: %lld\n    activation: swiglu\n", (long long)inter);
  return true;
}

static bool mixtral(Hf *h) {
  int64_t hidden, layers, inter, experts, topk;
  if (!common(h, &hidden, &layers) || !attention_gqa(h, hidden, NULL, "none") ||
      !get_int(h, "intermediate_size", true, 1, &inter) || !get_int(h, "num_local_experts", true, 1, &experts) ||
      !get_int(h, "num_experts_per_tok", true, 1, &topk) || !topk_fits(h, topk, experts, "num_local_experts"))
    return false;
  emit(h, "  moe:\n    experts: %lld\n    top_k: %lld\n    expert_intermediate: %lld\n", (long long)experts,
       (long long)topk, (long long)inter);
  return moe_conventions(h, true); /* Mixtral renormalizes its top-k softmax: no norm_topk_prob field */
}

/* OLMoE (modeling_olmoe.py): every layer MoE, q and k normalized over all heads' channels
 * (q_norm of hidden, k_norm of kv_heads x head_dim), softmax top-k not renormalized by default. */
static bool olmoe(Hf *h) {
  int64_t hidden, layers, inter, experts, topk;
  if (!common(h, &hidden, &layers) || !attention_gqa(h, hidden, "full", NULL) ||
      !get_int(h, "intermediate_size", true, 1, &inter) || !get_int(h, "num_experts", true, 1, &experts) ||
      !get_int(h, "num_experts_per_tok", true, 1, &topk) || !topk_fits(h, topk, experts, "num_experts"))
    return false;
  emit(h, "  moe:\n    experts: %lld\n    top_k: %lld\n    expert_intermediate: %lld\n", (long long)experts,
       (long long)topk, (long long)inter);
  return moe_conventions(h, false);
}

/* Qwen2-MoE / Qwen3-MoE's dense layers (Qwen2MoeDecoderLayer: a layer is sparse when it is not
 * in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0) as the spec's first_dense_layers
 * and interleave (model.c: layer l >= first is MoE when (l - first + 1) % interleave == 0): the
 * first pair that gives the same layers, or an error at mlp_only_layers when none does. */
static bool qwen_dense_layers(Hf *h, int64_t layers, int64_t step, int64_t *first, int64_t *every) {
  json_t *only = json_object_get(h->cfg, "mlp_only_layers"), *v;
  size_t i;
  if (only && !json_is_null(only) && !json_is_array(only))
    return diag_error(h->d, key_loc(h, "mlp_only_layers"), "\"mlp_only_layers\" is not a list; expected a list "
                      "of layer indices");
  if (layers > 100000)
    return diag_error(h->d, key_loc(h, "num_hidden_layers"), "\"num_hidden_layers\" is %lld; expected at most "
                      "100000", (long long)layers);
  bool *dense = mem_array(h->m, (size_t)layers, sizeof *dense);
  for (int64_t l = 0; l < layers; l++) dense[l] = (l + 1) % step != 0;
  if (only && json_is_array(only))
    json_array_foreach(only, i, v) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= layers)
        return diag_error(h->d, key_loc(h, "mlp_only_layers"), "\"mlp_only_layers\" has an entry that is not a "
                          "layer index; expected integers 0 to %lld", (long long)layers - 1);
      dense[json_integer_value(v)] = true;
    }
  for (int64_t f = 0; f <= layers; f++)
    for (int64_t s = 1; s <= layers; s++) {
      bool same = true;
      for (int64_t l = 0; l < layers && same; l++) same = dense[l] == (l < f || (l - f + 1) % s != 0);
      if (same) return *first = f, *every = s, true;
    }
  return diag_error(h->d, key_loc(h, only ? "mlp_only_layers" : "decoder_sparse_step"), "the dense layers "
                    "(mlp_only_layers, decoder_sparse_step) follow no pattern a spec can say; expected the first N "
                    "layers dense, then every K-th layer MoE (model.moe.first_dense_layers, interleave)");
}

/* Qwen2-MoE / Qwen3-MoE: MoE every decoder_sparse_step-th layer; mlp_only_layers must be empty
 * (a list of arbitrary dense layers has no spec form yet). Qwen3 normalizes q and k per head. */
static bool qwen_moe(Hf *h, bool qwen3) {
  int64_t hidden, layers, experts, topk, inter, moe_inter, step, shared;
  bool qkv_bias = false; /* Qwen2MoeAttention: bias=config.qkv_bias (default true) on q, k, v_proj */
  if (!qwen3 && !opt_bool(h, "qkv_bias", true, &qkv_bias)) return false;
  if (!common(h, &hidden, &layers) ||
      !attention_gqa(h, hidden, qwen3 ? "per_head" : NULL, qwen3 ? NULL : qkv_bias ? "qkv" : "none") ||
      !get_int(h, "num_experts", true, 1, &experts) || !get_int(h, "num_experts_per_tok", true, 1, &topk) ||
      !get_int(h, "moe_intermediate_size", true, 1, &moe_inter) || !get_int(h, "intermediate_size", true, 1, &inter) ||
      !opt_int(h, "decoder_sparse_step", 1, 1, &step) || !opt_int(h, "shared_expert_intermediate_size", 0, 0, &shared) ||
      !topk_fits(h, topk, experts, "num_experts"))
    return false;
  int64_t first = 0, every = step;
  if (!qwen_dense_layers(h, layers, step, &first, &every)) return false;
  if (first > 0 || every > 1) emit(h, "  mlp:\n    intermediate: %lld\n", (long long)inter);
  emit(h, "  moe:\n    experts: %lld\n    top_k: %lld\n    expert_intermediate: %lld\n", (long long)experts,
       (long long)topk, (long long)moe_inter);
  if (shared) emit(h, "    shared_experts: 1\n    shared_intermediate: %lld\n", (long long)shared);
  if (shared && !qwen3) /* Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(x)) x the shared expert */
    emit(h, "    shared_expert_gate: true\n");
  if (first) emit(h, "    first_dense_layers: %lld\n", (long long)first);
  if (every > 1) emit(h, "    interleave: %lld\n", (long long)every);
  return moe_conventions(h, false);
}

/* DeepSeek's balancing loss (the remote modeling_deepseek.py's MoEGate: alpha = aux_loss_alpha,
 * seq_aux: per sequence, else over the batch). Absent, alpha is 0: transformers' own DeepSeek
 * classes have neither field nor a loss (the published configs set both: V2-Lite 0.001, true). seq_aux
 * becomes model.moe.seq_aux_loss_coef beside either balancing (V3's complementary loss beside
 * aux_free); the batch-wise form is model.moe.aux_loss_coef, whose scores are softmax probabilities:
 * refused beside aux_free or a sigmoid router, where it would be another loss. Without aux_free,
 * mtc's own default batch-wise loss is turned off (aux_loss_coef 0) unless the config asks for it. */
static bool deepseek_aux(Hf *h, bool aux_free, bool sigmoid) {
  bool seq;
  json_t *a = json_object_get(h->cfg, "aux_loss_alpha");
  if (a && !json_is_null(a) && (!json_is_number(a) || json_number_value(a) < 0))
    return diag_error(h->d, key_loc(h, "aux_loss_alpha"), "\"aux_loss_alpha\" is not a number >= 0; expected one "
                      "such as 0.001");
  double alpha = a && json_is_number(a) ? json_number_value(a) : 0;
  if (!opt_bool(h, "seq_aux", true, &seq)) return false;
  if (!seq && alpha > 0 && (aux_free || sigmoid))
    return unsupported(h, "seq_aux", mem_printf(h->m, "is false with aux_loss_alpha %g and %s (a batch-wise balancing "
                       "loss of %s scores; mtc's batch-wise loss is of softmax probabilities and not beside aux_free; "
                       "seq_aux true is model.moe.seq_aux_loss_coef)", alpha, aux_free ? "topk_method noaux_tc" :
                       "scoring_func sigmoid", sigmoid ? "sigmoid" : "softmax"));
  if (!aux_free) emit(h, "    aux_loss_coef: %.9g\n", seq ? 0 : alpha);
  if (seq && alpha > 0) emit(h, "    seq_aux_loss_coef: %.9g\n", alpha);
  return true;
}

/* DeepSeek-V2 and V3 (configuration_deepseek.py of deepseek-ai's models; transformers'
 * configuration_deepseek_v3.py): MLA with or without q-LoRA, first_k_dense_replace dense layers,
 * shared experts, softmax (V2) or sigmoid (V3) scores, group-limited routing, YaRN.
 * V2's MoEGate: topk_method greedy (or its default's spelling "gready") takes the top-k of all
 * experts, group_limited_greedy the top-k of the topk_group groups with the best probability;
 * routed_scaling_factor multiplies the weights when they are not renormalized (norm_topk_prob,
 * default false). V3's: noaux_tc (sigmoid scores + e_score_correction_bias, groups by their two
 * best), weights renormalized (default true) then times routed_scaling_factor. */
static bool deepseek(Hf *h, bool v2) {
  int64_t hidden, layers, heads = 0, q_rank, kv_rank, nope, rope_dim, v, experts, shared, topk, moe_inter, inter, first,
      freq;
  bool ok = true, abias;
  if (!common(h, &hidden, &layers) || !get_int(h, "num_attention_heads", true, 1, &heads) ||
      !get_int(h, "kv_lora_rank", true, 1, &kv_rank) || !get_int(h, "qk_nope_head_dim", true, 1, &nope) ||
      !get_int(h, "qk_rope_head_dim", true, 1, &rope_dim) || !get_int(h, "v_head_dim", true, 1, &v) ||
      !get_int(h, "n_routed_experts", true, 1, &experts) || !get_int(h, "num_experts_per_tok", true, 1, &topk) ||
      !get_int(h, "moe_intermediate_size", true, 1, &moe_inter) || !get_int(h, "intermediate_size", true, 1, &inter) ||
      !opt_int(h, "q_lora_rank", 0, 0, &q_rank) || !opt_int(h, "n_shared_experts", 0, 0, &shared) ||
      !opt_int(h, "first_k_dense_replace", 0, 0, &first) || !opt_int(h, "moe_layer_freq", 1, 1, &freq) ||
      !topk_fits(h, topk, experts, "n_routed_experts") || !get_bool(h, "attention_bias", &abias))
    return false;
  /* DeepseekV2Attention / V3's: attention_bias puts biases on q(_a)_proj, kv_a_proj_with_mqa and o_proj */
  if (abias) return unsupported(h, "attention_bias", "is true (biases on MLA's projections)");
  /* rope_interleave (transformers' DeepseekV3, default true; DeepSeek's own code always): RoPE on
   * pairs (2i, 2i + 1) of the rope rows; false: mtc's half-split pairs (i, i + rope / 2). The same
   * model up to a fixed permutation of the rope rows of q_b_proj/q_proj and kv_a_proj_with_mqa
   * (which mtc export --spec applies, writing rope_interleave true): either value imports as is. */
  bool interleave;
  if (!opt_bool(h, "rope_interleave", true, &interleave)) return false;
  const char *score = get_str(h, "scoring_func", &ok), *topk_method = get_str(h, "topk_method", &ok);
  if (!ok) return false;
  /* absent: the family's defaults (V2's config: softmax, greedy; V3's config and transformers'
   * DeepseekV3TopkRouter, which reads neither field: sigmoid, noaux_tc) */
  if (!score) score = v2 ? "softmax" : "sigmoid";
  if (!topk_method) topk_method = v2 ? "greedy" : "noaux_tc";
  if (score && strcmp(score, "sigmoid") && strcmp(score, "softmax"))
    return diag_error(h->d, key_loc(h, "scoring_func"), "\"scoring_func\" is '%s'; expected sigmoid or softmax", score);
  bool sigmoid = score && !strcmp(score, "sigmoid"), noaux = topk_method && !strcmp(topk_method, "noaux_tc");
  bool grouped = !v2 || (topk_method && !strcmp(topk_method, "group_limited_greedy"));
  if (v2 && topk_method && !grouped && strcmp(topk_method, "greedy") && strcmp(topk_method, "gready"))
    return diag_error(h->d, key_loc(h, "topk_method"), "\"topk_method\" is '%s'; expected greedy or "
                      "group_limited_greedy (model_type deepseek_v2)", topk_method);
  if (v2 && sigmoid) /* V2's MoEGate raises NotImplementedError for it */
    return diag_error(h->d, key_loc(h, "scoring_func"), "\"scoring_func\" is 'sigmoid'; model_type deepseek_v2 "
                      "scores experts by softmax only; expected softmax");
  /* DeepSeek-V3 §2.2: multi-token prediction modules beside the main model, trained with their
   * own loss; transformers' DeepseekV3ForCausalLM drops their weights on load. mtc plans and
   * trains the main model: said in the spec, not refused (every V3 config has one) */
  int64_t mtp;
  if (!opt_int(h, "num_nextn_predict_layers", 0, 0, &mtp)) return false;
  if (mtp)
    emit(h, "  # num_nextn_predict_layers %lld is not modeled: DeepSeek-V3's multi-token prediction modules and their\n"
         "  # loss are not planned or trained (the main model only, as transformers' class loads it)\n", (long long)mtp);
  emit(h, "  attention:\n    kind: mla\n    heads: %lld\n", (long long)heads);
  if (q_rank) emit(h, "    q_lora_rank: %lld\n", (long long)q_rank);
  emit(h, "    kv_lora_rank: %lld\n    qk_nope_head_dim: %lld\n    qk_rope_head_dim: %lld\n    v_head_dim: %lld\n",
       (long long)kv_rank, (long long)nope, (long long)rope_dim, (long long)v);
  if (!rope(h)) return false;
  if (first > 0 || freq > 1) emit(h, "  mlp:\n    intermediate: %lld\n", (long long)inter);
  emit(h, "  moe:\n    experts: %lld\n    top_k: %lld\n    shared_experts: %lld\n    expert_intermediate: %lld\n",
       (long long)experts, (long long)topk, (long long)shared, (long long)moe_inter);
  if (first) emit(h, "    first_dense_layers: %lld\n", (long long)first);
  if (freq > 1) emit(h, "    interleave: %lld\n", (long long)freq);
  if (sigmoid) emit(h, "    router: sigmoid\n");
  if (noaux) emit(h, "    router_bias: true\n    load_balance: aux_free\n");
  int64_t groups, topk_group;
  double scale;
  bool norm;
  if (!opt_int(h, "n_group", 1, 1, &groups) || !opt_int(h, "topk_group", 1, 1, &topk_group) ||
      !get_real(h, "routed_scaling_factor", 1, &scale) || !opt_bool(h, "norm_topk_prob", !v2, &norm))
    return false;
  if (grouped && experts % groups != 0)
    return diag_error(h->d, key_loc(h, "n_group"), "\"n_group\" is %lld, which does not divide n_routed_experts "
                      "%lld; expected a divisor (experts are routed in equal groups)", (long long)groups,
                      (long long)experts);
  if (grouped && topk_group > groups)
    return diag_error(h->d, key_loc(h, "topk_group"), "\"topk_group\" is %lld, more than n_group %lld; expected 1 "
                      "to %lld groups", (long long)topk_group, (long long)groups, (long long)groups);
  if (v2 && norm && topk > 1 && scale != 1) /* V2's MoEGate scales only the weights it does not renormalize */
    return unsupported(h, "routed_scaling_factor", mem_printf(h->m, "is %g with norm_topk_prob true (DeepSeek-V2's "
                       "MoEGate then leaves the renormalized weights unscaled; mtc scales them)", scale));
  if (grouped && groups > 1) emit(h, "    n_group: %lld\n    topk_group: %lld\n", (long long)groups, (long long)topk_group);
  if (!norm) emit(h, "    norm_topk_prob: false\n");
  if (scale != 1) emit(h, "    routed_scaling_factor: %.9g\n", scale);
  return deepseek_aux(h, noaux, sigmoid);
}

/* A number or boolean field as a double (dflt when absent or null; NAN when another type). */
static double raw_num(Hf *h, const char *key, double dflt) {
  json_t *v = json_object_get(h->cfg, key);
  if (!v || json_is_null(v)) return dflt;
  if (json_is_boolean(v)) return json_is_true(v);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Fails naming field `key` when the config sets it to other than the value mtc's math has. */
static bool need_real(Hf *h, const char *key, double want, double dflt, const char *why) {
  double v = raw_num(h, key, dflt);
  if (v == want) return true;
  return diag_error(h->d, key_loc(h, key), "\"%s\" is %g, which mtc cannot represent (%s); expected %g", key, v,
                    why, want);
}

static bool need_bool(Hf *h, const char *key, bool want, bool dflt, const char *why) {
  if (raw_num(h, key, dflt) == (want ? 1 : 0)) return true;
  return diag_error(h->d, key_loc(h, key), "\"%s\" is %s, which mtc cannot represent (%s); expected %s", key,
                    want ? "false" : "true", why, want ? "true" : "false");
}

/* The model's name from the config file's path, for a config without "_name_or_path": the
 * directory holding a config.json (Qwen3-30B-A3B/config.json), else the file's name without .json
 * (qwen3-30b-a3b.json); NULL when neither gives one. */
static const char *name_of_file(Mem *m, const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t n = strlen(base);
  if (n > 5 && strcmp(base + n - 5, ".json") == 0 && strcmp(base, "config.json") != 0)
    return mem_printf(m, "%.*s", (int)(n - 5), base);
  char *full = realpath(path, NULL); /* config.json: its directory's name */
  const char *dir = NULL;
  if (full) {
    char *s = strrchr(full, '/');
    if (s) *s = '\0';
    s = strrchr(full, '/');
    if (s && s[1]) dir = mem_printf(m, "%s", s + 1);
    free(full);
  }
  return dir;
}

/* GPT-2 (transformers' configuration_gpt2.py / modeling_gpt2.py): LayerNorm with bias, learned
 * positions (n_positions), biases on every linear, multi-head attention, a 4·n_embd GELU MLP
 * (n_inner), tied embeddings (tie_word_embeddings, default true). What mtc's program cannot
 * compute is refused by field: dropout, another GELU than the tanh form (gelu_new,
 * gelu_pytorch_tanh), unscaled or layer-scaled attention, cross-attention. layer_norm_epsilon is
 * model.norm_eps (the epsilon of every norm, LayerNorm's too). */
static bool gpt2(Hf *h) {
  int64_t hidden = 0, layers, vocab, heads = 0, positions, inner = 0;
  bool ok = true;
  if (!get_int(h, "n_embd", true, 1, &hidden) || !get_int(h, "n_layer", true, 1, &layers) ||
      !get_int(h, "vocab_size", true, 1, &vocab) || !get_int(h, "n_head", true, 1, &heads) ||
      !get_int(h, "n_positions", true, 1, &positions) || !opt_int(h, "n_inner", 1, 0, &inner))
    return false;
  const char *act = get_str(h, "activation_function", &ok);
  if (!ok) return false;
  if (act && strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
    return diag_error(h->d, (Loc){h->src, 0, 0}, "\"activation_function\" is '%s', which mtc cannot represent "
                      "(its GELU is the tanh approximation); expected gelu_new or gelu_pytorch_tanh", act);
  static const char *const drops[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};
  for (int i = 0; i < 3; i++)
    if (!need_real(h, drops[i], 0, 0.1, "the program has no dropout")) return false;
  double eps;
  if (!get_real(h, "layer_norm_epsilon", 1e-5, &eps) ||
      !need_bool(h, "scale_attn_weights", true, true, "attention scores are scaled by 1/sqrt(head_dim)") ||
      !need_bool(h, "scale_attn_by_inverse_layer_idx", false, false, "no per-layer score scaling") ||
      !need_bool(h, "add_cross_attention", false, false, "a decoder-only model"))
    return false;
  emit(h, "model:\n  layers: %lld\n  hidden: %lld\n  vocab: %lld\n", (long long)layers, (long long)hidden, (long long)vocab);
  if (raw_num(h, "tie_word_embeddings", 1) != 0) emit(h, "  tie_embeddings: true\n");
  if (eps != 1e-5) emit(h, "  norm_eps: %.9g\n", eps);
  if (positions < h->seq_len) h->seq_len = positions;
  emit(h, "  norm: layernorm\n  position: learned\n  max_position: %lld\n  bias: true\n", (long long)positions);
  emit(h, "  attention:\n    kind: mha\n    heads: %lld\n    kv_heads: %lld\n", (long long)heads, (long long)heads);
  emit(h, "  mlp:\n    intermediate: %lld\n    activation: gelu\n", (long long)(inner ? inner : 4 * hidden));
  return true;
}

char *import_hf(Mem *m, Diag *d, const char *path) {
  const Source *src = diag_read_source(m, d, path, YAML_MAX_FILE, "a Hugging Face config.json");
  if (!src) return NULL;
  json_error_t je;
  json_t *cfg = json_loadb(src->text, src->len, JSON_REJECT_DUPLICATES, &je); /* a key twice: which one? refused */
  if (!cfg) {
    diag_error(d, (Loc){src, je.line > 0 ? je.line - 1 : 0, je.column > 0 ? je.column - 1 : 0},
               "not JSON: %s; expected a transformers config.json", je.text);
    return NULL;
  }
  Hf h = {m, d, src, cfg, NULL, "", 4096};
  bool ok = json_is_object(cfg) || diag_error(d, (Loc){src, 0, 0}, "not a JSON object; expected a transformers "
                                                                     "config.json");
  const char *type = ok ? get_str(&h, "model_type", &ok) : NULL;
  h.family = type ? type : "(none)";
  const char *base = strrchr(path, '/');
  emit(&h, "# Imported by `mtc import-hf` from %s (model_type %s). Check the model section\n"
           "# against the model card; set cluster and training for your run.\n", out_comment(m, base ? base + 1 : path),
       out_comment(m, h.family)); /* a YAML comment: no line break can end it */
  const char *name = ok ? get_str(&h, "_name_or_path", &ok) : NULL;
  if (!name || !*name) name = name_of_file(m, path);
  const char *slash = name ? strrchr(name, '/') : NULL;
  char safe[65] = "imported";
  if (name && *(slash ? slash + 1 : name)) {
    snprintf(safe, sizeof safe, "%s", slash ? slash + 1 : name);
    for (char *c = safe; *c; c++)
      if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' || *c == '-'))
        *c = '-';
    if (safe[0] == '.' || safe[0] == '-') safe[0] = 'm';
  }
  emit(&h, "name: %s\n", safe);
  if (!ok) { /* model_type or _name_or_path was not text: reported */
  } else if (!type) ok = diag_error(d, (Loc){src, 0, 0}, "no \"model_type\"; expected llama, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3 or gpt2");
  else if (!strcmp(type, "llama") || !strcmp(type, "qwen2") || !strcmp(type, "qwen3")) ok = llama(&h, type);
  else if (!strcmp(type, "olmoe")) ok = olmoe(&h);
  else if (!strcmp(type, "mixtral")) ok = mixtral(&h);
  else if (!strcmp(type, "qwen3_moe")) ok = qwen_moe(&h, true);
  else if (!strcmp(type, "qwen2_moe")) ok = qwen_moe(&h, false);
  else if (!strcmp(type, "deepseek_v3") || !strcmp(type, "deepseek_v2")) ok = deepseek(&h, !strcmp(type, "deepseek_v2"));
  else if (!strcmp(type, "gpt2")) ok = gpt2(&h);
  else ok = diag_error(d, (Loc){src, 0, 0}, "\"model_type\" is '%s', which mtc cannot import yet; expected "
                       "llama, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3 or gpt2", type);
  if (ok)
    emit(&h, "cluster:                        # edit: your machines\n  preset: jupiter-booster\n  nodes: 1\n"
             "training:                       # edit: your run\n  seq_len: %lld\n  global_batch: 4\n"
             "  optimizer: adamw\n  lr: 3.0e-4\n  steps: 1000\n", (long long)h.seq_len);
  json_decref(cfg);
  return ok ? h.out : NULL;
}
