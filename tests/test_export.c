/* test_export.c — mtc export's Hugging Face side (export_hf.c), without a checkpoint:
 *   round trip  for specs of every family: the config.json export writes, read back by
 *               `mtc import-hf` (import_hf), gives a model with the same parameters (total,
 *               active, by kind), the same layers, every convention that changes the math, and
 *               the same plan (the original spec's cluster and training with the imported model
 *               section: the same layout and predicted step)
 *   names       for small configs of each family, the tensor names and shapes export writes are
 *               the state dict of the family's modeling_<family>.py class (lists written here by
 *               hand from those files, cited per family)
 *   refusals    a model no family expresses is refused at the spec key that says why
 * usage: test_export SOURCE_DIR */
#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>

#include "../compiler/mtc.h"
#include "check.h"

static const char *src_dir;

static Spec *load(Mem *m, Diag *d, const char *spec, const char *const *sets, int n) {
  Spec *s = spec_load(m, d, mem_printf(m, "%s/%s", src_dir, spec), NULL, 0, sets, n);
  if (!s) fprintf(stderr, "%s: %s", spec, d->msg);
  return s;
}

/* The model section of the spec `mtc import-hf` makes of config c (written to a file first). */
static Spec *import_config(Mem *m, json_t *c) {
  char path[] = "/tmp/mtc-test-export-XXXXXX";
  int fd = mkstemp(path);
  char *text = json_dumps(c, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
  if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) return free(text), NULL;
  close(fd);
  free(text);
  Diag d = {.mem = m};
  char *spec = import_hf(m, &d, path);
  unlink(path);
  Spec *s = spec ? spec_load(m, &d, "(imported)", spec, strlen(spec), NULL, 0) : NULL;
  if (!s) fprintf(stderr, "import-hf of the exported config: %s", d.msg ? d.msg : "?");
  return s;
}

/* spec + sets exports as family, and its config imports back to the same model and plan. */
static void round_trip(const char *spec, const char *const *sets, int n, const char *family) {
  Mem m = {0};
  Diag d = {.mem = &m};
  fprintf(stderr, "round trip: %s", spec);
  for (int i = 0; i < n; i++) fprintf(stderr, " --set %s", sets[i]);
  fprintf(stderr, "\n");
  Spec *s = load(&m, &d, spec, sets, n);
  Model *md = s ? model_build(&m, &d, s) : NULL;
  const char *fam = md ? export_family(&d, s) : NULL;
  CHECK_STR(fam, family);
  if (!fam) {
    fprintf(stderr, "  %s", d.msg ? d.msg : "?");
    mem_free(&m);
    return;
  }
  json_t *c = export_config(s, fam, "float32");
  CHECK_STR(json_string_value(json_object_get(c, "model_type")), family);
  Spec *s2 = import_config(&m, c);
  json_decref(c);
  CHECK(s2 != NULL);
  Model *md2 = s2 ? model_build(&m, &d, s2) : NULL;
  if (!md2) {
    mem_free(&m);
    return;
  }
  CHECK_EQ(md2->params_total, md->params_total);
  CHECK_EQ(md2->params_active, md->params_active);
  for (int k = 0; k < PK__COUNT; k++) CHECK_EQ(md2->by_kind_total[k], md->by_kind_total[k]);
  CHECK_EQ(md2->nlayers, md->nlayers);
  for (int l = 0; l < md->nlayers && l < md2->nlayers; l++) CHECK_EQ(md2->layers[l].kind, md->layers[l].kind);
  const ModelSpec *a = &s->model, *b = &s2->model;
  CHECK_EQ(b->tie_embeddings, a->tie_embeddings);
  CHECK_EQ(b->norm, a->norm);
  CHECK_EQ(b->position, a->position);
  CHECK_EQ(b->bias, a->bias);
  CHECK_NEAR(b->norm_eps, a->norm_eps, 1e-12);
  CHECK_EQ(b->attention.heads, a->attention.heads);
  CHECK_EQ(md2->qk_head_dim, md->qk_head_dim);
  CHECK_EQ(md2->v_head_dim, md->v_head_dim);
  if (a->attention.kind != ATTN_MLA) CHECK_EQ(b->attention.kv_heads, a->attention.kv_heads);
  CHECK_EQ(b->attention.qk_norm, a->attention.qk_norm);
  CHECK_EQ(b->attention.bias, a->attention.bias);
  if (a->position == POS_ROPE) CHECK_NEAR(b->attention.rope_theta, a->attention.rope_theta, 1e-12);
  CHECK_EQ(b->rope_scaling.type, a->rope_scaling.type);
  if (a->rope_scaling.type != ROPE_SCALING_NONE) {
    CHECK_NEAR(b->rope_scaling.factor, a->rope_scaling.factor, 1e-12);
    CHECK_EQ(b->rope_scaling.original_max_position, a->rope_scaling.original_max_position);
    CHECK_NEAR(b->rope_scaling.low_freq_factor, a->rope_scaling.low_freq_factor, 1e-12);
    CHECK_NEAR(b->rope_scaling.high_freq_factor, a->rope_scaling.high_freq_factor, 1e-12);
    CHECK_NEAR(b->rope_scaling.beta_fast, a->rope_scaling.beta_fast, 1e-12);
    CHECK_NEAR(b->rope_scaling.beta_slow, a->rope_scaling.beta_slow, 1e-12);
    CHECK_NEAR(b->rope_scaling.mscale, a->rope_scaling.mscale, 1e-12);
    CHECK_NEAR(b->rope_scaling.mscale_all_dim, a->rope_scaling.mscale_all_dim, 1e-12);
  }
  CHECK_EQ(b->mlp.activation, a->mlp.activation);
  CHECK_EQ(b->moe.present, a->moe.present);
  if (a->moe.present && b->moe.present) {
    CHECK_EQ(b->moe.top_k, a->moe.top_k);
    CHECK_EQ(b->moe.router, a->moe.router);
    CHECK_EQ(b->moe.router_bias, a->moe.router_bias);
    CHECK_EQ(b->moe.load_balance, a->moe.load_balance);
    CHECK_EQ(b->moe.norm_topk_prob, a->moe.norm_topk_prob);
    CHECK_NEAR(b->moe.routed_scaling_factor, a->moe.routed_scaling_factor, 1e-12);
    CHECK_EQ(b->moe.shared_expert_gate, a->moe.shared_expert_gate);
    CHECK_EQ(b->moe.n_group, a->moe.n_group);
    if (a->moe.n_group > 1) CHECK_EQ(b->moe.topk_group, a->moe.topk_group);
    if (a->moe.load_balance == LB_AUX_LOSS) CHECK_NEAR(b->moe.aux_loss_coef, a->moe.aux_loss_coef, 1e-12);
    CHECK_NEAR(b->moe.seq_aux_loss_coef, a->moe.seq_aux_loss_coef, 1e-12);
  }
  /* the same plan: the original cluster and training with the imported model section */
  Spec s3 = *s;
  s3.model = s2->model;
  Model *md3 = model_build(&m, &d, &s3);
  Plan *p1 = plan_search(&m, md), *p3 = md3 ? plan_search(&m, md3) : NULL;
  CHECK(p3 != NULL);
  if (p3) {
    CHECK_EQ(p3->feasible, p1->feasible);
    CHECK_EQ(p3->best.ch.fsdp, p1->best.ch.fsdp);
    CHECK_EQ(p3->best.ch.ep, p1->best.ch.ep);
    CHECK_EQ(p3->best.ch.micro_batch, p1->best.ch.micro_batch);
    CHECK_EQ(p3->best.ch.ac, p1->best.ch.ac);
    CHECK_EQ(p3->best.arena[TIER_HBM], p1->best.arena[TIER_HBM]);
    CHECK_NEAR(p3->best.cost.step, p1->best.cost.step, 1e-12);
  }
  mem_free(&m);
}

/* spec + sets exports as family with exactly the tensors in want ("name rows" or
 * "name rows cols" per entry, any order). */
static void names(const char *spec, const char *const *sets, int n, const char *family, const char *const *want,
                  int nwant) {
  Mem m = {0};
  Diag d = {.mem = &m};
  Spec *s = load(&m, &d, spec, sets, n);
  Model *md = s ? model_build(&m, &d, s) : NULL;
  const char *fam = md ? export_family(&d, s) : NULL;
  CHECK_STR(fam, family);
  if (!fam) {
    mem_free(&m);
    return;
  }
  int count = 0;
  ExportTensor *ts = export_tensors(&m, md, fam, &count);
  bool *seen = calloc((size_t)nwant + 1, 1);
  for (int i = 0; i < count; i++) {
    const char *got = ts[i].cols ? mem_printf(&m, "%s %lld %lld", ts[i].name, (long long)ts[i].rows, (long long)ts[i].cols)
                                 : mem_printf(&m, "%s %lld", ts[i].name, (long long)ts[i].rows);
    int j = 0;
    while (j < nwant && strcmp(want[j], got) != 0) j++;
    check_count++;
    if (j == nwant || seen[j]) {
      check_failures++;
      fprintf(stderr, "%s (%s): exported %s, which %s\n", spec, family, got,
              j == nwant ? "the family's class does not have (or of another shape)" : "comes twice");
    } else {
      seen[j] = true;
    }
  }
  for (int j = 0; j < nwant; j++)
    if (!seen[j]) check_failures++, fprintf(stderr, "%s (%s): %s not exported\n", spec, family, want[j]);
  free(seen);
  mem_free(&m);
}

/* spec + sets is refused with a message containing `why` at spec key position. */
static void refused(const char *spec, const char *const *sets, int n, const char *why) {
  Mem m = {0};
  Diag d = {.mem = &m};
  Spec *s = load(&m, &d, spec, sets, n);
  Model *md = s ? model_build(&m, &d, s) : NULL;
  const char *fam = md ? export_family(&d, s) : "(no model)";
  CHECK(fam == NULL);
  check_count++;
  if (!fam && (!d.msg || !strstr(d.msg, why) || !strstr(d.msg, "no Hugging Face family expresses this model"))) {
    check_failures++;
    fprintf(stderr, "%s: expected a refusal saying '%s', got: %s", spec, why, d.msg ? d.msg : "(none)\n");
  }
  mem_free(&m);
}


/* Whether two config values are the same (numbers within 1e-12 relative, objects key by key). */
static bool same_value(json_t *a, json_t *b) {
  if (json_is_number(a) && json_is_number(b)) {
    double x = json_number_value(a), y = json_number_value(b);
    return x == y || fabs(x - y) <= 1e-12 * fabs(y);
  }
  if (json_is_object(a) && json_is_object(b)) {
    const char *k;
    json_t *v;
    json_object_foreach(a, k, v) if (!json_object_get(b, k) || !same_value(v, json_object_get(b, k))) return false;
    json_object_foreach(b, k, v) if (!json_object_get(a, k)) return false;
    return true;
  }
  return json_equal(a, b);
}

/* The published config tests/hf/NAME.json, imported (import-hf) and exported again (export_config),
 * gives the published value of every field both have (but those named in `differ`: fields export
 * sets from the spec's training section or that do not change the math). */
static void published(const char *name, const char *const *differ, int ndiffer) {
  Mem m = {0};
  Diag d = {.mem = &m};
  const char *path = mem_printf(&m, "%s/tests/hf/%s.json", src_dir, name);
  char *text = import_hf(&m, &d, path);
  Spec *s = text ? spec_load(&m, &d, "(imported)", text, strlen(text), NULL, 0) : NULL;
  const char *fam = s ? export_family(&d, s) : NULL;
  json_error_t je;
  json_t *pub = json_load_file(path, 0, &je);
  CHECK(fam != NULL && pub != NULL);
  if (!fam || !pub) {
    fprintf(stderr, "%s: %s", name, d.msg ? d.msg : "not read\n");
    json_decref(pub), mem_free(&m);
    return;
  }
  json_t *c = export_config(s, fam, "bfloat16"), *v;
  const char *k;
  json_object_foreach(c, k, v) {
    json_t *want = json_object_get(pub, k);
    bool skip = !want;
    for (int i = 0; i < ndiffer; i++) skip = skip || !strcmp(differ[i], k);
    if (skip) continue;
    check_count++;
    if (!same_value(v, want)) {
      check_failures++;
      char *a = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT), *b = json_dumps(want, JSON_ENCODE_ANY | JSON_COMPACT);
      fprintf(stderr, "tests/hf/%s.json: exported \"%s\" is %s, published %s\n", name, k, a, b);
      free(a), free(b);
    }
  }
  json_decref(c), json_decref(pub);
  mem_free(&m);
}

#define N(a) (int)(sizeof(a) / sizeof *(a))

int main(int argc, char **argv) {
  src_dir = argc > 1 ? argv[1] : ".";

  /* ---- round trips, one or more per family ---- */
  round_trip("tests/specs/gpt2-style.yaml", NULL, 0, "gpt2");
  const char *gpt2_untied[] = {"model.tie_embeddings=false", "model.norm_eps=1e-6"};
  round_trip("tests/specs/gpt2-style.yaml", gpt2_untied, N(gpt2_untied), "gpt2");
  round_trip("specs/llama-3.1-8b.yaml", NULL, 0, "llama");            /* llama3 rope_scaling */
  const char *dense_tied[] = {"model.tie_embeddings=true", "model.norm_eps=1e-6"};
  round_trip("tests/specs/calib-dense.yaml", dense_tied, N(dense_tied), "llama");
  const char *qwen3[] = {"model.attention.qk_norm=per_head", "model.rope_scaling.type=yarn",
                         "model.rope_scaling.factor=4", "model.rope_scaling.original_max_position=64"};
  round_trip("tests/specs/calib-dense.yaml", qwen3, N(qwen3), "qwen3");
  round_trip("specs/mixtral-8x7b.yaml", NULL, 0, "mixtral");
  round_trip("tests/specs/calib-moe.yaml", NULL, 0, "mixtral");
  round_trip("specs/qwen3-30b-a3b.yaml", NULL, 0, "qwen3_moe");
  /* tests/specs/conventions.yaml (norm_eps 1e-6, norm_topk_prob false, a first dense layer) in
   * the forms a family has: gated shared expert (qwen2_moe), qk-norm per head (qwen3_moe) */
  const char *gate[] = {"model.moe.shared_expert_gate=true", "model.moe.routed_scaling_factor=1"};
  round_trip("tests/specs/conventions.yaml", gate, N(gate), "qwen2_moe");
  const char *gate_interleave[] = {"model.moe.shared_expert_gate=true", "model.moe.routed_scaling_factor=1",
                                   "model.moe.first_dense_layers=0", "model.moe.interleave=2", "model.layers=4"};
  round_trip("tests/specs/conventions.yaml", gate_interleave, N(gate_interleave), "qwen2_moe");
  const char *tiny_gate[] = {"model.moe.shared_expert_gate=true", "model.moe.norm_topk_prob=false"};
  round_trip("specs/tiny-moe.yaml", tiny_gate, N(tiny_gate), "qwen2_moe");
  const char *qk_head[] = {"model.attention.qk_norm=per_head", "model.moe.shared_experts=0",
                           "model.moe.routed_scaling_factor=1", "model.rope_scaling.type=llama3",
                           "model.rope_scaling.factor=8", "model.rope_scaling.original_max_position=1024"};
  round_trip("tests/specs/conventions.yaml", qk_head, N(qk_head), "qwen3_moe");
  const char *qk_full[] = {"model.attention.qk_norm=full", "model.moe.norm_topk_prob=false", "model.norm_eps=1e-6"};
  round_trip("tests/specs/calib-moe.yaml", qk_full, N(qk_full), "olmoe");
  round_trip("specs/deepseek-v3.yaml", NULL, 0, "deepseek_v3"); /* MLA, yarn, groups, scaling */
  /* model.attention.bias: Llama's attention_bias (qkvo), Qwen2's q/k/v biases, Qwen2-MoE's qkv_bias */
  const char *llama_qkvo[] = {"model.attention.bias=qkvo"};
  round_trip("tests/specs/calib-dense.yaml", llama_qkvo, 1, "llama");
  const char *qwen2_qkv[] = {"model.attention.bias=qkv"};
  round_trip("tests/specs/calib-dense.yaml", qwen2_qkv, 1, "qwen2");
  const char *qwen3_qkvo[] = {"model.attention.bias=qkvo", "model.attention.qk_norm=per_head"};
  round_trip("tests/specs/calib-dense.yaml", qwen3_qkvo, N(qwen3_qkvo), "qwen3");
  const char *gate_qkv[] = {"model.moe.shared_expert_gate=true", "model.moe.routed_scaling_factor=1",
                            "model.attention.bias=qkv"};
  round_trip("tests/specs/conventions.yaml", gate_qkv, N(gate_qkv), "qwen2_moe");
  const char *olmoe_qkvo[] = {"model.attention.qk_norm=full", "model.attention.bias=qkvo"};
  round_trip("tests/specs/calib-moe.yaml", olmoe_qkvo, N(olmoe_qkvo), "olmoe");

  /* ---- published configs: import, export, the same fields ---- */
  /* not compared: what the spec does not hold and the math does not read (the model's name, its
   * storage dtype; max_position_embeddings, which default and llama3 RoPE ignore: export writes
   * training.seq_len there; the dense intermediate_size of a model without dense layers) */
  const char *common[] = {"_name_or_path", "torch_dtype", "use_cache", "initializer_range", "max_position_embeddings"};
  const char *hf_names[] = {"llama-3.1-8b", "mixtral-8x7b", "qwen3-8b", "olmoe-1b-7b", "gpt2"};
  for (int i = 0; i < N(hf_names); i++) published(hf_names[i], common, N(common));
  const char *q3moe[] = {"_name_or_path", "torch_dtype", "use_cache", "initializer_range", "max_position_embeddings",
                         "intermediate_size", "sliding_window"}; /* sliding_window: set but off (use_sliding_window) */
  published("qwen3-30b-a3b", q3moe, N(q3moe));
  published("deepseek-v3", common, N(common) - 1); /* YaRN: max_position_embeddings compared */
  const char *qwen2_pub[] = {"_name_or_path", "torch_dtype", "use_cache", "initializer_range", "max_position_embeddings",
                             "sliding_window"}; /* Qwen2.5's is set but off: use_sliding_window false */
  published("qwen2.5-7b", qwen2_pub, N(qwen2_pub));
  published("qwen1.5-moe-a2.7b", q3moe, N(q3moe));

  /* ---- names, against each family's modeling file ---- */
  /* modeling_gpt2.py: GPT2Model (wte, wpe, h, ln_f), GPT2Block (ln_1, attn, ln_2, mlp),
   * GPT2Attention (c_attn = Conv1D(3 n_embd, n_embd), c_proj = Conv1D(n_embd, n_embd)),
   * GPT2MLP (c_fc = Conv1D(n_inner, n_embd), c_proj = Conv1D(n_embd, n_inner)); Conv1D(nf, nx)
   * has weight [nx, nf] and bias [nf]; lm_head tied to wte (not saved). n_embd 32, n_inner 128. */
  const char *one_layer[] = {"model.layers=1"};
  const char *gpt2_want[] = {"transformer.wte.weight 256 32", "transformer.wpe.weight 32 32",
      "transformer.h.0.ln_1.weight 32", "transformer.h.0.ln_1.bias 32",
      "transformer.h.0.attn.c_attn.weight 32 96", "transformer.h.0.attn.c_attn.bias 96",
      "transformer.h.0.attn.c_proj.weight 32 32", "transformer.h.0.attn.c_proj.bias 32",
      "transformer.h.0.ln_2.weight 32", "transformer.h.0.ln_2.bias 32",
      "transformer.h.0.mlp.c_fc.weight 32 128", "transformer.h.0.mlp.c_fc.bias 128",
      "transformer.h.0.mlp.c_proj.weight 128 32", "transformer.h.0.mlp.c_proj.bias 32",
      "transformer.ln_f.weight 32", "transformer.ln_f.bias 32"};
  names("tests/specs/gpt2-style.yaml", one_layer, 1, "gpt2", gpt2_want, N(gpt2_want));
  /* modeling_llama.py: LlamaModel (embed_tokens, layers, norm), LlamaDecoderLayer
   * (input_layernorm, self_attn, post_attention_layernorm, mlp), LlamaAttention (q_proj
   * [heads x head_dim, hidden], k_proj, v_proj [kv_heads x head_dim, hidden], o_proj),
   * LlamaMLP (gate_proj, up_proj [intermediate, hidden], down_proj), LlamaForCausalLM.lm_head.
   * calib-dense: hidden 192, 6 heads, 2 kv heads (head_dim 32), intermediate 512, vocab 256. */
  const char *llama_want[] = {"model.embed_tokens.weight 256 192", "model.layers.0.input_layernorm.weight 192",
      "model.layers.0.self_attn.q_proj.weight 192 192", "model.layers.0.self_attn.k_proj.weight 64 192",
      "model.layers.0.self_attn.v_proj.weight 64 192", "model.layers.0.self_attn.o_proj.weight 192 192",
      "model.layers.0.post_attention_layernorm.weight 192", "model.layers.0.mlp.gate_proj.weight 512 192",
      "model.layers.0.mlp.up_proj.weight 512 192", "model.layers.0.mlp.down_proj.weight 192 512",
      "model.norm.weight 192", "lm_head.weight 256 192"};
  names("tests/specs/calib-dense.yaml", one_layer, 1, "llama", llama_want, N(llama_want));
  /* modeling_qwen2.py: Llama's tree; Qwen2Attention's q_proj, k_proj, v_proj with bias=True, o_proj
   * without. */
  const char *qwen2_sets[] = {"model.layers=1", "model.attention.bias=qkv"};
  const char *qwen2_want[N(llama_want) + 3];
  for (int i = 0; i < N(llama_want); i++) qwen2_want[i] = llama_want[i];
  qwen2_want[N(llama_want)] = "model.layers.0.self_attn.q_proj.bias 192";
  qwen2_want[N(llama_want) + 1] = "model.layers.0.self_attn.k_proj.bias 64";
  qwen2_want[N(llama_want) + 2] = "model.layers.0.self_attn.v_proj.bias 64";
  names("tests/specs/calib-dense.yaml", qwen2_sets, N(qwen2_sets), "qwen2", qwen2_want, N(qwen2_want));
  /* modeling_qwen3.py: Llama's tree, Qwen3Attention adds q_norm, k_norm = Qwen3RMSNorm(head_dim). */
  const char *qwen3_sets[] = {"model.layers=1", "model.attention.qk_norm=per_head", "model.tie_embeddings=true"};
  const char *qwen3_want[] = {"model.embed_tokens.weight 256 192", "model.layers.0.input_layernorm.weight 192",
      "model.layers.0.self_attn.q_proj.weight 192 192", "model.layers.0.self_attn.k_proj.weight 64 192",
      "model.layers.0.self_attn.v_proj.weight 64 192", "model.layers.0.self_attn.o_proj.weight 192 192",
      "model.layers.0.self_attn.q_norm.weight 32", "model.layers.0.self_attn.k_norm.weight 32",
      "model.layers.0.post_attention_layernorm.weight 192", "model.layers.0.mlp.gate_proj.weight 512 192",
      "model.layers.0.mlp.up_proj.weight 512 192", "model.layers.0.mlp.down_proj.weight 192 512",
      "model.norm.weight 192"};
  names("tests/specs/calib-dense.yaml", qwen3_sets, N(qwen3_sets), "qwen3", qwen3_want, N(qwen3_want));
  /* modeling_mixtral.py: MixtralDecoderLayer.block_sparse_moe = MixtralSparseMoeBlock (gate =
   * Linear(hidden, num_local_experts), experts = MixtralBlockSparseTop2MLP: w1, w3 [ffn, hidden],
   * w2 [hidden, ffn]). calib-moe: hidden 160, 5 heads (head_dim 32), expert ffn 128. */
  const char *mix_sets[] = {"model.layers=1", "model.moe.experts=2", "model.moe.top_k=1"};
  const char *mix_want[] = {"model.embed_tokens.weight 256 160", "model.layers.0.input_layernorm.weight 160",
      "model.layers.0.self_attn.q_proj.weight 160 160", "model.layers.0.self_attn.k_proj.weight 160 160",
      "model.layers.0.self_attn.v_proj.weight 160 160", "model.layers.0.self_attn.o_proj.weight 160 160",
      "model.layers.0.post_attention_layernorm.weight 160", "model.layers.0.block_sparse_moe.gate.weight 2 160",
      "model.layers.0.block_sparse_moe.experts.0.w1.weight 128 160",
      "model.layers.0.block_sparse_moe.experts.0.w2.weight 160 128",
      "model.layers.0.block_sparse_moe.experts.0.w3.weight 128 160",
      "model.layers.0.block_sparse_moe.experts.1.w1.weight 128 160",
      "model.layers.0.block_sparse_moe.experts.1.w2.weight 160 128",
      "model.layers.0.block_sparse_moe.experts.1.w3.weight 128 160", "model.norm.weight 160", "lm_head.weight 256 160"};
  names("tests/specs/calib-moe.yaml", mix_sets, N(mix_sets), "mixtral", mix_want, N(mix_want));
  /* modeling_qwen2_moe.py: Qwen2MoeDecoderLayer.mlp is Qwen2MoeMLP(intermediate_size) in
   * mlp_only_layers (layer 0 here), else Qwen2MoeSparseMoeBlock: gate = Linear(hidden,
   * num_experts), experts.E = Qwen2MoeMLP(moe_intermediate_size) (gate_proj, up_proj, down_proj),
   * shared_expert = Qwen2MoeMLP(shared_expert_intermediate_size), shared_expert_gate =
   * Linear(hidden, 1). conventions: hidden 32, 4 heads (head_dim 8), 2 kv heads, mlp 48, experts
   * of 16, one shared of 16. */
  const char *q2_sets[] = {"model.moe.shared_expert_gate=true", "model.moe.routed_scaling_factor=1",
                           "model.moe.experts=2", "model.moe.top_k=1"};
  const char *attn32[] = {"model.embed_tokens.weight 256 32", "model.norm.weight 32", "lm_head.weight 256 32",
      "model.layers.0.input_layernorm.weight 32", "model.layers.0.post_attention_layernorm.weight 32",
      "model.layers.0.self_attn.q_proj.weight 32 32", "model.layers.0.self_attn.k_proj.weight 16 32",
      "model.layers.0.self_attn.v_proj.weight 16 32", "model.layers.0.self_attn.o_proj.weight 32 32",
      "model.layers.1.input_layernorm.weight 32", "model.layers.1.post_attention_layernorm.weight 32",
      "model.layers.1.self_attn.q_proj.weight 32 32", "model.layers.1.self_attn.k_proj.weight 16 32",
      "model.layers.1.self_attn.v_proj.weight 16 32", "model.layers.1.self_attn.o_proj.weight 32 32"};
  const char *dense0[] = {"model.layers.0.mlp.gate_proj.weight 48 32", "model.layers.0.mlp.up_proj.weight 48 32",
      "model.layers.0.mlp.down_proj.weight 32 48"};
  const char *experts1[] = {"model.layers.1.mlp.gate.weight 2 32",
      "model.layers.1.mlp.experts.0.gate_proj.weight 16 32", "model.layers.1.mlp.experts.0.up_proj.weight 16 32",
      "model.layers.1.mlp.experts.0.down_proj.weight 32 16", "model.layers.1.mlp.experts.1.gate_proj.weight 16 32",
      "model.layers.1.mlp.experts.1.up_proj.weight 16 32", "model.layers.1.mlp.experts.1.down_proj.weight 32 16"};
  const char *q2_extra[] = {"model.layers.1.mlp.shared_expert.gate_proj.weight 16 32",
      "model.layers.1.mlp.shared_expert.up_proj.weight 16 32", "model.layers.1.mlp.shared_expert.down_proj.weight 32 16",
      "model.layers.1.mlp.shared_expert_gate.weight 1 32"};
  const char *q2_want[N(attn32) + N(dense0) + N(experts1) + N(q2_extra)];
  int k = 0;
  for (int i = 0; i < N(attn32); i++) q2_want[k++] = attn32[i];
  for (int i = 0; i < N(dense0); i++) q2_want[k++] = dense0[i];
  for (int i = 0; i < N(experts1); i++) q2_want[k++] = experts1[i];
  for (int i = 0; i < N(q2_extra); i++) q2_want[k++] = q2_extra[i];
  names("tests/specs/conventions.yaml", q2_sets, N(q2_sets), "qwen2_moe", q2_want, k);
  /* modeling_qwen3_moe.py: Qwen3MoeSparseMoeBlock (gate, experts.E.{gate,up,down}_proj; no shared
   * expert), Qwen3MoeAttention's q_norm, k_norm of head_dim (8). */
  const char *q3_sets[] = {"model.attention.qk_norm=per_head", "model.moe.shared_experts=0",
                           "model.moe.routed_scaling_factor=1", "model.moe.experts=2", "model.moe.top_k=1"};
  const char *q3_extra[] = {"model.layers.0.self_attn.q_norm.weight 8", "model.layers.0.self_attn.k_norm.weight 8",
      "model.layers.1.self_attn.q_norm.weight 8", "model.layers.1.self_attn.k_norm.weight 8"};
  const char *q3_want[N(attn32) + N(dense0) + N(experts1) + N(q3_extra)];
  k = 0;
  for (int i = 0; i < N(attn32); i++) q3_want[k++] = attn32[i];
  for (int i = 0; i < N(dense0); i++) q3_want[k++] = dense0[i];
  for (int i = 0; i < N(experts1); i++) q3_want[k++] = experts1[i];
  for (int i = 0; i < N(q3_extra); i++) q3_want[k++] = q3_extra[i];
  names("tests/specs/conventions.yaml", q3_sets, N(q3_sets), "qwen3_moe", q3_want, k);
  /* modeling_olmoe.py: OlmoeAttention's q_norm = OlmoeRMSNorm(hidden) and k_norm =
   * OlmoeRMSNorm(hidden / heads x kv_heads) over all heads; OlmoeSparseMoeBlock (gate,
   * experts.E.{gate,up,down}_proj) in every layer. */
  const char *ol_sets[] = {"model.attention.qk_norm=full", "model.layers=1", "model.moe.experts=2",
                           "model.moe.top_k=1"};
  const char *ol_want[] = {"model.embed_tokens.weight 256 160", "model.norm.weight 160", "lm_head.weight 256 160",
      "model.layers.0.input_layernorm.weight 160", "model.layers.0.post_attention_layernorm.weight 160",
      "model.layers.0.self_attn.q_proj.weight 160 160", "model.layers.0.self_attn.k_proj.weight 160 160",
      "model.layers.0.self_attn.v_proj.weight 160 160", "model.layers.0.self_attn.o_proj.weight 160 160",
      "model.layers.0.self_attn.q_norm.weight 160", "model.layers.0.self_attn.k_norm.weight 160",
      "model.layers.0.mlp.gate.weight 2 160", "model.layers.0.mlp.experts.0.gate_proj.weight 128 160",
      "model.layers.0.mlp.experts.0.up_proj.weight 128 160", "model.layers.0.mlp.experts.0.down_proj.weight 160 128",
      "model.layers.0.mlp.experts.1.gate_proj.weight 128 160", "model.layers.0.mlp.experts.1.up_proj.weight 128 160",
      "model.layers.0.mlp.experts.1.down_proj.weight 160 128"};
  names("tests/specs/calib-moe.yaml", ol_sets, N(ol_sets), "olmoe", ol_want, N(ol_want));
  /* modeling_deepseek_v3.py: DeepseekV3Attention (q_a_proj [q_lora_rank, hidden], q_a_layernorm,
   * q_b_proj [heads x (nope + rope), q_lora_rank], kv_a_proj_with_mqa [kv_lora_rank + rope,
   * hidden], kv_a_layernorm, kv_b_proj [heads x (nope + v), kv_lora_rank], o_proj [hidden, heads x
   * v]); DeepseekV3MoE (gate = DeepseekV3TopkRouter: weight [experts, hidden] and
   * e_score_correction_bias [experts]; experts.E; shared_experts of moe_intermediate x
   * n_shared_experts); layer 0 (first_k_dense_replace 1) a DeepseekV3MLP. */
  const char *ds_sets[] = {"model.layers=2", "model.attention.kind=mla", "model.attention.kv_heads=4", "model.attention.q_lora_rank=16",
      "model.attention.kv_lora_rank=8", "model.attention.qk_nope_head_dim=8", "model.attention.qk_rope_head_dim=4",
      "model.attention.v_head_dim=8", "model.moe.router=sigmoid", "model.moe.router_bias=true",
      "model.moe.load_balance=aux_free", "model.moe.experts=2", "model.moe.top_k=1", "model.moe.norm_topk_prob=true"};
  const char *ds_want[] = {"model.embed_tokens.weight 256 32", "model.norm.weight 32", "lm_head.weight 256 32",
      "model.layers.0.input_layernorm.weight 32", "model.layers.0.post_attention_layernorm.weight 32",
      "model.layers.1.input_layernorm.weight 32", "model.layers.1.post_attention_layernorm.weight 32",
      "model.layers.0.self_attn.q_a_proj.weight 16 32", "model.layers.0.self_attn.q_a_layernorm.weight 16",
      "model.layers.0.self_attn.q_b_proj.weight 48 16", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight 12 32",
      "model.layers.0.self_attn.kv_a_layernorm.weight 8", "model.layers.0.self_attn.kv_b_proj.weight 64 8",
      "model.layers.0.self_attn.o_proj.weight 32 32",
      "model.layers.1.self_attn.q_a_proj.weight 16 32", "model.layers.1.self_attn.q_a_layernorm.weight 16",
      "model.layers.1.self_attn.q_b_proj.weight 48 16", "model.layers.1.self_attn.kv_a_proj_with_mqa.weight 12 32",
      "model.layers.1.self_attn.kv_a_layernorm.weight 8", "model.layers.1.self_attn.kv_b_proj.weight 64 8",
      "model.layers.1.self_attn.o_proj.weight 32 32",
      "model.layers.0.mlp.gate_proj.weight 48 32", "model.layers.0.mlp.up_proj.weight 48 32",
      "model.layers.0.mlp.down_proj.weight 32 48", "model.layers.1.mlp.gate.weight 2 32",
      "model.layers.1.mlp.gate.e_score_correction_bias 2",
      "model.layers.1.mlp.experts.0.gate_proj.weight 16 32", "model.layers.1.mlp.experts.0.up_proj.weight 16 32",
      "model.layers.1.mlp.experts.0.down_proj.weight 32 16", "model.layers.1.mlp.experts.1.gate_proj.weight 16 32",
      "model.layers.1.mlp.experts.1.up_proj.weight 16 32", "model.layers.1.mlp.experts.1.down_proj.weight 32 16",
      "model.layers.1.mlp.shared_experts.gate_proj.weight 16 32",
      "model.layers.1.mlp.shared_experts.up_proj.weight 16 32",
      "model.layers.1.mlp.shared_experts.down_proj.weight 32 16"};
  names("tests/specs/conventions.yaml", ds_sets, N(ds_sets), "deepseek_v3", ds_want, N(ds_want));
  round_trip("tests/specs/conventions.yaml", ds_sets, N(ds_sets), "deepseek_v3");
  /* DeepSeek-V3's complementary sequence-wise loss beside aux_free: aux_loss_alpha with seq_aux */
  const char *ds_seq[N(ds_sets) + 1];
  for (int i = 0; i < N(ds_sets); i++) ds_seq[i] = ds_sets[i];
  ds_seq[N(ds_sets)] = "model.moe.seq_aux_loss_coef=0.0001";
  round_trip("tests/specs/conventions.yaml", ds_seq, N(ds_seq), "deepseek_v3");

  /* ---- refusals: the key, and why ---- */
  refused("specs/tiny-moe.yaml", NULL, 0, "shared experts without a gate");
  refused("tests/specs/conventions.yaml", NULL, 0, "routed_scaling_factor without MLA");
  refused("tests/specs/gelu-experts.yaml", NULL, 0, "model.norm is rmsnorm with a GPT-2 feature");
  const char *gpt_moe[] = {"model.norm=layernorm", "model.position=learned", "model.max_position=64", "model.bias=true"};
  refused("tests/specs/gelu-experts.yaml", gpt_moe, N(gpt_moe), "no family has biased or GELU experts");
  const char *gelu_moe[] = {"model.moe.activation=gelu"};
  refused("specs/tiny-moe.yaml", gelu_moe, 1, "GELU experts");
  refused("tests/specs/layernorm.yaml", NULL, 0, "model.position is rope with a GPT-2 feature");
  refused("tests/specs/biases.yaml", NULL, 0, "model.norm is rmsnorm with a GPT-2 feature");
  refused("tests/specs/learned-positions.yaml", NULL, 0, "model.norm is rmsnorm with a GPT-2 feature");
  const char *sig[] = {"model.moe.router=sigmoid", "model.moe.shared_experts=0", "model.moe.routed_scaling_factor=1"};
  refused("tests/specs/conventions.yaml", sig, N(sig), "a sigmoid router or a score-correction bias without MLA");
  const char *mixtral_raw[] = {"model.moe.norm_topk_prob=false"};
  refused("tests/specs/calib-moe.yaml", mixtral_raw, 1, "norm_topk_prob false without qk-norm or a shared expert");
  const char *dense_full[] = {"model.attention.qk_norm=full"};
  refused("tests/specs/calib-dense.yaml", dense_full, 1, "qk-norm over all heads in a dense model");
  const char *mix_bias[] = {"model.attention.bias=qkvo"};
  refused("tests/specs/calib-moe.yaml", mix_bias, 1, "attention bias qkvo in a mixtral-shaped model");
  const char *q2_qkvo[] = {"model.moe.shared_expert_gate=true", "model.moe.routed_scaling_factor=1",
                           "model.attention.bias=qkvo"};
  refused("tests/specs/conventions.yaml", q2_qkvo, N(q2_qkvo), "Qwen2MoeAttention's o_proj has no bias");
  const char *q3_qkv[] = {"model.attention.bias=qkv", "model.attention.qk_norm=per_head"};
  refused("tests/specs/calib-dense.yaml", q3_qkv, N(q3_qkv), "its attention_bias puts biases on q, k, v and o_proj");
  const char *mla_dense[] = {"model.attention.kind=mla", "model.attention.kv_heads=6", "model.attention.kv_lora_rank=8",
      "model.attention.qk_nope_head_dim=8", "model.attention.qk_rope_head_dim=4", "model.attention.v_head_dim=8"};
  refused("tests/specs/calib-dense.yaml", mla_dense, N(mla_dense), "MLA in a dense model");

  printf("test_export: %d checks, %d failed\n", check_count, check_failures);
  return check_failures != 0;
}
