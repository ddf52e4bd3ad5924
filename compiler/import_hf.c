/* import_hf.c — `mtc import-hf config.json`: a Hugging Face transformers config becomes a
 * spec (its model section from the config; cluster and training sections to edit).
 * Families: llama, mixtral, qwen3_moe (and qwen2_moe), deepseek_v3, gpt2. Field names are those
 * of transformers' configuration_<family>.py. */
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
  int64_t seq_len; /* training.seq_len to write: 4096, or less where the model's positions end */
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

/* The activation: silu/swish (gated) → swiglu; gelu variants → gelu. */
static bool activation(Hf *h, const char **out) {
  const char *a = get_str(h, "hidden_act");
  if (!a || !strcmp(a, "silu") || !strcmp(a, "swish")) return *out = "swiglu", true;
  if (!strncmp(a, "gelu", 4)) return *out = "gelu", true;
  return diag_error(h->d, (Loc){h->src, 0, 0}, "\"hidden_act\" is '%s'; expected silu or gelu", a);
}

static bool attention_gqa(Hf *h, int64_t hidden, bool qk_norm) {
  int64_t heads, kv = 0, hd = 0;
  if (!get_int(h, "num_attention_heads", true, &heads)) return false;
  get_int(h, "num_key_value_heads", false, &kv);
  get_int(h, "head_dim", false, &hd);
  emit(h, "  attention:\n    kind: gqa\n    heads: %lld\n", (long long)heads);
  if (kv) emit(h, "    kv_heads: %lld\n", (long long)kv);
  if (hd && hd * heads != hidden) emit(h, "    head_dim: %lld\n", (long long)hd);
  emit(h, "    rope_theta: %g\n", get_real(h, "rope_theta", 10000));
  if (qk_norm) emit(h, "    qk_norm: per_head\n");
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
  return true;
}

static bool llama(Hf *h) {
  int64_t hidden, layers, inter;
  const char *act = "swiglu";
  if (!common(h, &hidden, &layers) || !attention_gqa(h, hidden, false) ||
      !get_int(h, "intermediate_size", true, &inter) || !activation(h, &act))
    return false;
  emit(h, "  mlp:\n    intermediate: %lld\n    activation: %s\n", (long long)inter, act);
  return true;
}

static bool mixtral(Hf *h) {
  int64_t hidden, layers, inter, experts, topk;
  if (!common(h, &hidden, &layers) || !attention_gqa(h, hidden, false) ||
      !get_int(h, "intermediate_size", true, &inter) || !get_int(h, "num_local_experts", true, &experts) ||
      !get_int(h, "num_experts_per_tok", true, &topk))
    return false;
  emit(h, "  moe:\n    experts: %lld\n    top_k: %lld\n    expert_intermediate: %lld\n", (long long)experts,
       (long long)topk, (long long)inter);
  return true;
}

/* Qwen2-MoE / Qwen3-MoE: MoE every decoder_sparse_step-th layer; mlp_only_layers must be empty
 * (a list of arbitrary dense layers has no spec form yet). Qwen3 normalizes q and k per head. */
static bool qwen_moe(Hf *h, bool qwen3) {
  int64_t hidden, layers, experts, topk, inter, moe_inter, step = 1, shared = 0;
  if (!common(h, &hidden, &layers) || !attention_gqa(h, hidden, qwen3) ||
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
  if (shared) emit(h, "    shared_experts: 1\n    shared_intermediate: %lld\n", (long long)shared);
  if (step > 1) emit(h, "    interleave: %lld\n", (long long)step);
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
  return true;
}

/* Fails naming field `key` when the config sets it to other than the value mtc's math has. */
static bool need_real(Hf *h, const char *key, double want, double dflt, const char *why) {
  double v = get_real(h, key, dflt);
  if (v == want) return true;
  return diag_error(h->d, (Loc){h->src, 0, 0}, "\"%s\" is %g, which mtc cannot represent (%s); expected %g", key, v,
                    why, want);
}

static bool need_bool(Hf *h, const char *key, bool want, bool dflt, const char *why) {
  if (get_bool(h, key, dflt) == want) return true;
  return diag_error(h->d, (Loc){h->src, 0, 0}, "\"%s\" is %s, which mtc cannot represent (%s); expected %s", key,
                    want ? "false" : "true", why, want ? "true" : "false");
}

/* GPT-2 (transformers' configuration_gpt2.py / modeling_gpt2.py): LayerNorm with bias, learned
 * positions (n_positions), biases on every linear, multi-head attention, a 4·n_embd GELU MLP
 * (n_inner), tied embeddings (tie_word_embeddings, default true). What mtc's program cannot
 * compute is refused by field: dropout, another GELU than the tanh form (gelu_new,
 * gelu_pytorch_tanh), another layer_norm_epsilon than 1e-5, unscaled or layer-scaled attention,
 * cross-attention. */
static bool gpt2(Hf *h) {
  int64_t hidden, layers, vocab, heads, positions, inner = 0;
  if (!get_int(h, "n_embd", true, &hidden) || !get_int(h, "n_layer", true, &layers) ||
      !get_int(h, "vocab_size", true, &vocab) || !get_int(h, "n_head", true, &heads) ||
      !get_int(h, "n_positions", true, &positions))
    return false;
  get_int(h, "n_inner", false, &inner);
  const char *act = get_str(h, "activation_function");
  if (act && strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
    return diag_error(h->d, (Loc){h->src, 0, 0}, "\"activation_function\" is '%s', which mtc cannot represent "
                      "(its GELU is the tanh approximation); expected gelu_new or gelu_pytorch_tanh", act);
  static const char *const drops[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};
  for (int i = 0; i < 3; i++)
    if (!need_real(h, drops[i], 0, 0.1, "the program has no dropout")) return false;
  if (!need_real(h, "layer_norm_epsilon", 1e-5, 1e-5, "its norm epsilon is 1e-5") ||
      !need_bool(h, "scale_attn_weights", true, true, "attention scores are scaled by 1/sqrt(head_dim)") ||
      !need_bool(h, "scale_attn_by_inverse_layer_idx", false, false, "no per-layer score scaling") ||
      !need_bool(h, "add_cross_attention", false, false, "a decoder-only model"))
    return false;
  emit(h, "model:\n  layers: %lld\n  hidden: %lld\n  vocab: %lld\n", (long long)layers, (long long)hidden, (long long)vocab);
  if (get_bool(h, "tie_word_embeddings", true)) emit(h, "  tie_embeddings: true\n");
  if (positions < h->seq_len) h->seq_len = positions;
  emit(h, "  norm: layernorm\n  position: learned\n  max_position: %lld\n  bias: true\n", (long long)positions);
  emit(h, "  attention:\n    kind: mha\n    heads: %lld\n    kv_heads: %lld\n", (long long)heads, (long long)heads);
  emit(h, "  mlp:\n    intermediate: %lld\n    activation: gelu\n", (long long)(inner ? inner : 4 * hidden));
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
  Hf h = {m, d, src, cfg, NULL, "", 4096};
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
  if (!type) ok = diag_error(d, (Loc){src, 0, 0}, "no \"model_type\"; expected llama, mixtral, qwen2_moe, qwen3_moe, deepseek_v3 or gpt2");
  else if (!strcmp(type, "llama")) ok = llama(&h);
  else if (!strcmp(type, "mixtral")) ok = mixtral(&h);
  else if (!strcmp(type, "qwen3_moe")) ok = qwen_moe(&h, true);
  else if (!strcmp(type, "qwen2_moe")) ok = qwen_moe(&h, false);
  else if (!strcmp(type, "deepseek_v3")) ok = deepseek_v3(&h);
  else if (!strcmp(type, "gpt2")) ok = gpt2(&h);
  else ok = diag_error(d, (Loc){src, 0, 0}, "\"model_type\" is '%s', which mtc cannot import yet; expected "
                       "llama, mixtral, qwen2_moe, qwen3_moe, deepseek_v3 or gpt2", type);
  if (ok)
    emit(&h, "cluster:                        # edit: your machines\n  preset: jupiter-booster\n  nodes: 1\n"
             "training:                       # edit: your run\n  seq_len: %lld\n  global_batch: 4\n"
             "  optimizer: adamw\n  lr: 3.0e-4\n  steps: 1000\n", (long long)h.seq_len);
  json_decref(cfg);
  return ok ? h.out : NULL;
}
