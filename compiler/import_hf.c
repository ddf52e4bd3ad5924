/* import_hf.c — `mtc import-hf config.json`: a Hugging Face transformers config becomes a
 * spec (its model section from the config; cluster and training sections to edit).
 * Families: llama, qwen3, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3. Field names are
 * those of transformers' configuration_<family>.py. Every field that changes the math is kept
 * (rms_norm_eps, norm_topk_prob, routed_scaling_factor, router_aux_loss_coef, qk-norm,
 * rope_scaling llama3 and yarn, Qwen2-MoE's shared_expert_gate, n_group/topk_group) or, when the
 * spec cannot say it yet (other rope types, Qwen2-MoE's q/k/v biases, clip_qkv, sliding
 * windows), refused with an error naming the field. */
#include <jansson.h>
#include <stdarg.h>
#include <string.h>

#include "mtc.h"

typedef struct {
  Mem *m;
  Diag *d;
  const Source *src;
  json_t *cfg;
  const char *family;
  char *out; /* the spec being written */
} Hf;

static void emit(Hf *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(Hf *h, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[512];
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  h->out = mem_printf(h->m, "%s%s", h->out, buf);
}

/* An integer field; required ones fail with the field named. */
static bool get_int(Hf *h, const char *key, bool required, int64_t *out) {
  json_t *v = json_object_get(h->cfg, key);
  if (!v || json_is_null(v)) {
    if (required)
      return diag_error(h->d, (Loc){h->src, 0, 0}, "missing \"%s\", required for model_type '%s'; "
                        "expected a transformers config.json of that family", key, h->family);
    return false;
  }
  if (!json_is_integer(v))
    return diag_error(h->d, (Loc){h->src, 0, 0}, "\"%s\" is not an integer; expected a count", key);
  *out = json_integer_value(v);
  return true;
}

static double get_real(Hf *h, const char *key, double dflt) {
  json_t *v = json_object_get(h->cfg, key);
  return v && json_is_number(v) ? json_number_value(v) : dflt;
}

static bool get_bool(Hf *h, const char *key, bool dflt) {
  json_t *v = json_object_get(h->cfg, key);
  return v && json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *get_str(Hf *h, const char *key) {
  json_t *v = json_object_get(h->cfg, key);
  return v && json_is_string(v) ? json_string_value(v) : NULL;
}

/* An error for a config field whose math mtc cannot represent yet. */
static bool unsupported(Hf *h, const char *key, const char *what) {
  return diag_error(h->d, (Loc){h->src, 0, 0}, "\"%s\" %s, which mtc cannot represent yet; expected a config "
                    "without it (the imported model would train different math)", key, what);
}

/* Whether field key is present and not null (or false, for a boolean). */
static bool set_field(Hf *h, const char *key) {
  json_t *v = json_object_get(h->cfg, key);
  return v && !json_is_null(v) && !json_is_false(v);
}

/* The fields every family shares whose math the spec cannot say: sliding windows, clip_qkv. */
static bool refuse_common(Hf *h) {
  if (get_bool(h, "use_sliding_window", false)) return unsupported(h, "use_sliding_window", "is true (sliding-window attention)");
  if (set_field(h, "clip_qkv")) return unsupported(h, "clip_qkv", "is set (q, k, v clamped)");
  return true;
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
    return diag_error(h->d, (Loc){h->src, 0, 0}, "\"rope_scaling\" (%s) lacks a numeric factor or an integer "
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
static void moe_conventions(Hf *h, bool norm_default) {
  if (!get_bool(h, "norm_topk_prob", norm_default)) emit(h, "    norm_topk_prob: false\n");
  json_t *c = json_object_get(h->cfg, "router_aux_loss_coef");
  if (c && json_is_number(c)) emit(h, "    aux_loss_coef: %.9g\n", json_number_value(c));
}

/* The activation: silu/swish (gated) → swiglu; gelu variants → gelu. */
static bool activation(Hf *h, const char **out) {
  const char *a = get_str(h, "hidden_act");
  if (!a || !strcmp(a, "silu") || !strcmp(a, "swish")) return *out = "swiglu", true;
  if (!strncmp(a, "gelu", 4)) return *out = "gelu", true;
  return diag_error(h->d, (Loc){h->src, 0, 0}, "\"hidden_act\" is '%s'; expected silu or gelu", a);
}

static bool attention_gqa(Hf *h, int64_t hidden, const char *qk_norm) {
  int64_t heads, kv = 0, hd = 0;
  if (!get_int(h, "num_attention_heads", true, &heads)) return false;
  get_int(h, "num_key_value_heads", false, &kv);
  get_int(h, "head_dim", false, &hd);
  emit(h, "  attention:\n    kind: gqa\n    heads: %lld\n", (long long)heads);
  if (kv) emit(h, "    kv_heads: %lld\n", (long long)kv);
  if (hd && hd * heads != hidden) emit(h, "    head_dim: %lld\n", (long long)hd);
  emit(h, "    rope_theta: %g\n", get_real(h, "rope_theta", 10000));
  if (qk_norm) emit(h, "    qk_norm: %s\n", qk_norm);
  return true;
}

static bool common(Hf *h, int64_t *hidden, int64_t *layers) {
  int64_t vocab;
  if (!get_int(h, "hidden_size", true, hidden) || !get_int(h, "num_hidden_layers", true, layers) ||
      !get_int(h, "vocab_size", true, &vocab))
    return false;
  emit(h, "model:\n  layers: %lld\n  hidden: %lld\n  vocab: %lld\n", (long long)*layers, (long long)*hidden,
       (long long)vocab);
  if (get_bool(h, "tie_word_embeddings", false)) emit(h, "  tie_embeddings: true\n");
  if (get_bool(h, "attention_bias", false) || get_bool(h, "mlp_bias", false)) emit(h, "  bias: true\n");
  json_t *eps = json_object_get(h->cfg, "rms_norm_eps");
  if (eps && json_is_number(eps)) emit(h, "  norm_eps: %.9g\n", json_number_value(eps));
  return refuse_common(h) && rope_scaling(h);
}

/* Llama, and Qwen3 (dense): Llama's layout with q and k normalized per head (modeling_qwen3.py). */
static bool llama(Hf *h, bool qwen3) {
  int64_t hidden, layers, inter;
  const char *act = "swiglu";
  if (!common(h, &hidden, &layers) || !attention_gqa(h, hidden, qwen3 ? "per_head" : NULL) ||
      !get_int(h, "intermediate_size", true, &inter) || !activation(h, &act))
    return false;
  emit(h, "  mlp:\n    intermediate: %lld\n    activation: %s\n", (long long)inter, act);
  return true;
}

static bool mixtral(Hf *h) {
  int64_t hidden, layers, inter, experts, topk;
  if (!common(h, &hidden, &layers) || !attention_gqa(h, hidden, NULL) ||
      !get_int(h, "intermediate_size", true, &inter) || !get_int(h, "num_local_experts", true, &experts) ||
      !get_int(h, "num_experts_per_tok", true, &topk))
    return false;
  emit(h, "  moe:\n    experts: %lld\n    top_k: %lld\n    expert_intermediate: %lld\n", (long long)experts,
       (long long)topk, (long long)inter);
  moe_conventions(h, true); /* Mixtral renormalizes its top-k softmax: no norm_topk_prob field */
  return true;
}

/* OLMoE (modeling_olmoe.py): every layer MoE, q and k normalized over all heads' channels
 * (q_norm of hidden, k_norm of kv_heads x head_dim), softmax top-k not renormalized by default. */
static bool olmoe(Hf *h) {
  int64_t hidden, layers, inter, experts, topk;
  if (!common(h, &hidden, &layers) || !attention_gqa(h, hidden, "full") ||
      !get_int(h, "intermediate_size", true, &inter) || !get_int(h, "num_experts", true, &experts) ||
      !get_int(h, "num_experts_per_tok", true, &topk))
    return false;
  emit(h, "  moe:\n    experts: %lld\n    top_k: %lld\n    expert_intermediate: %lld\n", (long long)experts,
       (long long)topk, (long long)inter);
  moe_conventions(h, false);
  return true;
}

/* Qwen2-MoE / Qwen3-MoE: MoE every decoder_sparse_step-th layer; mlp_only_layers must be empty
 * (a list of arbitrary dense layers has no spec form yet). Qwen3 normalizes q and k per head. */
static bool qwen_moe(Hf *h, bool qwen3) {
  int64_t hidden, layers, experts, topk, inter, moe_inter, step = 1, shared = 0;
  if (!common(h, &hidden, &layers) || !attention_gqa(h, hidden, qwen3 ? "per_head" : NULL) ||
      !get_int(h, "num_experts", true, &experts) || !get_int(h, "num_experts_per_tok", true, &topk) ||
      !get_int(h, "moe_intermediate_size", true, &moe_inter) || !get_int(h, "intermediate_size", true, &inter))
    return false;
  get_int(h, "decoder_sparse_step", false, &step);
  get_int(h, "shared_expert_intermediate_size", false, &shared);
  json_t *only = json_object_get(h->cfg, "mlp_only_layers");
  if (only && json_is_array(only) && json_array_size(only) > 0)
    return diag_error(h->d, (Loc){h->src, 0, 0}, "\"mlp_only_layers\" lists dense layers; expected an empty "
                      "list (a spec gives dense layers as first_dense_layers and interleave)");
  if (step > 1) emit(h, "  mlp:\n    intermediate: %lld\n", (long long)inter);
  emit(h, "  moe:\n    experts: %lld\n    top_k: %lld\n    expert_intermediate: %lld\n", (long long)experts,
       (long long)topk, (long long)moe_inter);
  if (!qwen3 && get_bool(h, "qkv_bias", true)) /* Qwen2MoeAttention: bias=config.qkv_bias (default true) */
    return unsupported(h, "qkv_bias", "is true (biases on q_proj, k_proj and v_proj only)");
  if (shared) emit(h, "    shared_experts: 1\n    shared_intermediate: %lld\n", (long long)shared);
  if (shared && !qwen3) /* Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(x)) x the shared expert */
    emit(h, "    shared_expert_gate: true\n");
  if (step > 1) emit(h, "    interleave: %lld\n", (long long)step);
  moe_conventions(h, false);
  return true;
}

static bool deepseek_v3(Hf *h) {
  int64_t hidden, layers, heads, q_rank = 0, kv_rank, nope, rope, v, experts, shared = 0, topk, moe_inter,
      inter, first = 0, freq = 1;
  if (!common(h, &hidden, &layers) || !get_int(h, "num_attention_heads", true, &heads) ||
      !get_int(h, "kv_lora_rank", true, &kv_rank) || !get_int(h, "qk_nope_head_dim", true, &nope) ||
      !get_int(h, "qk_rope_head_dim", true, &rope) || !get_int(h, "v_head_dim", true, &v) ||
      !get_int(h, "n_routed_experts", true, &experts) || !get_int(h, "num_experts_per_tok", true, &topk) ||
      !get_int(h, "moe_intermediate_size", true, &moe_inter) || !get_int(h, "intermediate_size", true, &inter))
    return false;
  get_int(h, "q_lora_rank", false, &q_rank);
  get_int(h, "n_shared_experts", false, &shared);
  get_int(h, "first_k_dense_replace", false, &first);
  get_int(h, "moe_layer_freq", false, &freq);
  emit(h, "  attention:\n    kind: mla\n    heads: %lld\n", (long long)heads);
  if (q_rank) emit(h, "    q_lora_rank: %lld\n", (long long)q_rank);
  emit(h, "    kv_lora_rank: %lld\n    qk_nope_head_dim: %lld\n    qk_rope_head_dim: %lld\n    v_head_dim: %lld\n",
       (long long)kv_rank, (long long)nope, (long long)rope, (long long)v);
  emit(h, "    rope_theta: %g\n", get_real(h, "rope_theta", 10000));
  if (first > 0 || freq > 1) emit(h, "  mlp:\n    intermediate: %lld\n", (long long)inter);
  emit(h, "  moe:\n    experts: %lld\n    top_k: %lld\n    shared_experts: %lld\n    expert_intermediate: %lld\n",
       (long long)experts, (long long)topk, (long long)shared, (long long)moe_inter);
  if (first) emit(h, "    first_dense_layers: %lld\n", (long long)first);
  if (freq > 1) emit(h, "    interleave: %lld\n", (long long)freq);
  const char *score = get_str(h, "scoring_func"), *topk_method = get_str(h, "topk_method");
  if (score && !strcmp(score, "sigmoid")) emit(h, "    router: sigmoid\n");
  if (topk_method && !strcmp(topk_method, "noaux_tc")) emit(h, "    router_bias: true\n    load_balance: aux_free\n");
  int64_t groups = 1, topk_group = 1;
  get_int(h, "n_group", false, &groups);
  get_int(h, "topk_group", false, &topk_group);
  if (groups > 1) emit(h, "    n_group: %lld\n    topk_group: %lld\n", (long long)groups, (long long)topk_group);
  double scale = get_real(h, "routed_scaling_factor", 1);
  if (scale != 1) emit(h, "    routed_scaling_factor: %.9g\n", scale);
  moe_conventions(h, true); /* DeepseekV3Config: norm_topk_prob true by default */
  return true;
}

char *import_hf(Mem *m, Diag *d, const char *path) {
  const Source *src = diag_read_source(m, d, path, YAML_MAX_FILE);
  if (!src) return NULL;
  json_error_t je;
  json_t *cfg = json_loadb(src->text, src->len, 0, &je);
  if (!cfg) {
    diag_error(d, (Loc){src, je.line > 0 ? je.line - 1 : 0, je.column > 0 ? je.column - 1 : 0},
               "not JSON: %s; expected a transformers config.json", je.text);
    return NULL;
  }
  Hf h = {m, d, src, cfg, NULL, ""};
  const char *type = get_str(&h, "model_type");
  h.family = type ? type : "(none)";
  const char *base = strrchr(path, '/');
  emit(&h, "# Imported by `mtc import-hf` from %s (model_type %s). Check the model section\n"
           "# against the model card; set cluster and training for your run.\n", base ? base + 1 : path, h.family);
  const char *name = get_str(&h, "_name_or_path");
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
  bool ok;
  if (!type) ok = diag_error(d, (Loc){src, 0, 0}, "no \"model_type\"; expected llama, qwen3, mixtral, qwen2_moe, qwen3_moe, olmoe or deepseek_v3");
  else if (!strcmp(type, "llama")) ok = llama(&h, false);
  else if (!strcmp(type, "qwen3")) ok = llama(&h, true);
  else if (!strcmp(type, "olmoe")) ok = olmoe(&h);
  else if (!strcmp(type, "mixtral")) ok = mixtral(&h);
  else if (!strcmp(type, "qwen3_moe")) ok = qwen_moe(&h, true);
  else if (!strcmp(type, "qwen2_moe")) ok = qwen_moe(&h, false);
  else if (!strcmp(type, "deepseek_v3")) ok = deepseek_v3(&h);
  else ok = diag_error(d, (Loc){src, 0, 0}, "\"model_type\" is '%s', which mtc cannot import yet; expected "
                       "llama, qwen3, mixtral, qwen2_moe, qwen3_moe, olmoe or deepseek_v3", type);
  if (ok)
    emit(&h, "cluster:                        # edit: your machines\n  preset: jupiter-booster\n  nodes: 1\n"
             "training:                       # edit: your run\n  seq_len: 4096\n  global_batch: 4\n"
             "  optimizer: adamw\n  lr: 3.0e-4\n  steps: 1000\n");
  json_decref(cfg);
  return ok ? h.out : NULL;
}
