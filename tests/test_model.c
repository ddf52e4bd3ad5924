/* test_model.c — model accounting against published counts and hand computations; spec
 * defaults, --set and preset merging.   usage: test_model SOURCE_DIR */
#include <stdlib.h>

#include "check.h"
#include "mtc.h"

static const char *src_dir;

/* Loads a spec (a file under SOURCE_DIR, or text when given) with --set overrides. */
static Model *load(Mem *m, const char *path, const char *text, const char *const *sets, int n) {
  Diag d = {.mem = m};
  char *full = text ? (char *)path : mem_printf(m, "%s/%s", src_dir, path);
  Spec *s = spec_load(m, &d, full, text, text ? strlen(text) : 0, sets, n);
  Model *md = s ? model_build(m, &d, s) : NULL;
  if (!md) fprintf(stderr, "unexpected error:\n%s", d.msg ? d.msg : "(none)\n");
  return md;
}

/* An error message, or NULL if the spec loads. */
static const char *load_error(Mem *m, const char *text, const char *const *sets, int n) {
  Diag d = {.mem = m};
  Spec *s = spec_load(m, &d, "t.yaml", text, strlen(text), sets, n);
  if (s) model_build(m, &d, s);
  return d.msg;
}

static void published_counts(void) {
  Mem m = {0};
  /* europa-1t: docs/reference-run.md (951.9B total, 32.8B active; 951.8B / 32.77B with the chosen
   * attention layout) */
  Model *md = load(&m, "specs/europa-1t.yaml", NULL, NULL, 0);
  CHECK(md != NULL);
  if (md) {
    CHECK_NEAR(md->params_total, 951.9e9, 0.005);
    CHECK_NEAR(md->params_active, 32.8e9, 0.005);
    CHECK_NEAR(md->params_total, 951.8e9, 0.0005);
    CHECK_NEAR(md->params_active, 32.77e9, 0.0005);
    CHECK_EQ(md->n_moe_layers, 74);
    /* docs/reference-run.md: boundary activations 65,536 x 6,144 x 2 B x 74 = 55.5 GiB per GPU */
    CHECK_EQ(md->layers[0].saved_bytes[SAVE_BOUNDARY] * 65536 * 74, 65536LL * 6144 * 2 * 74);
  }
  /* DeepSeek-V3 technical report: 671B without the MTP module */
  md = load(&m, "specs/deepseek-v3.yaml", NULL, NULL, 0);
  CHECK(md != NULL);
  if (md) {
    CHECK_NEAR(md->params_total, 671.0e9, 0.005);
    CHECK_NEAR(md->params_active, 37e9, 0.02); /* "37B activated"; 37.5B here with embeddings */
    CHECK_EQ(md->n_moe_layers, 58);
    CHECK(md->layers[2].kind == LAYER_DENSE && md->layers[3].kind == LAYER_MOE);
    CHECK_EQ(md->qk_head_dim, 192);
    CHECK_EQ(md->v_head_dim, 128);
  }
  /* Mixtral 8x7B paper: 46.7B total, 12.9B active (Hugging Face safetensors: 46,702,792,704) */
  md = load(&m, "specs/mixtral-8x7b.yaml", NULL, NULL, 0);
  CHECK(md != NULL);
  if (md) {
    CHECK_NEAR(md->params_total, 46.70e9, 0.005);
    CHECK_NEAR(md->params_active, 12.88e9, 0.005);
    CHECK_EQ(md->params_total, 46702792704LL);
  }
  /* Llama 3.1 8B: 8.03B (Hugging Face safetensors: 8,030,261,248) */
  md = load(&m, "specs/llama-3.1-8b.yaml", NULL, NULL, 0);
  CHECK(md != NULL);
  if (md) {
    CHECK_NEAR(md->params_total, 8.03e9, 0.005);
    CHECK_EQ(md->params_total, 8030261248LL);
    CHECK_EQ(md->params_active, md->params_total); /* dense: a token touches everything */
    CHECK_EQ(md->n_moe_layers, 0);
  }
  mem_free(&m);
}

/* tiny-moe by hand: L=4, H=128, V=256, 4 heads of 32, 2 KV heads, 8 experts top-2 of 256,
 * one shared expert of 256, untied. */
static void tiny_by_hand(void) {
  Mem m = {0};
  Model *md = load(&m, "specs/tiny-moe.yaml", NULL, NULL, 0);
  CHECK(md != NULL);
  if (!md) return;
  int64_t attn = 128 * 128 + 64 * 128 + 64 * 128 + 128 * 128; /* q k v o */
  int64_t expert = 3 * 128 * 256;                             /* gate up down */
  int64_t layer = attn + 2 * 128 + 8 * 128 + 8 * expert + expert;
  CHECK_EQ(md->layers[0].params, layer);
  CHECK_EQ(md->params_total, 4 * layer + 2 * 256 * 128 + 128);
  int64_t layer_active = attn + 2 * 128 + 8 * 128 + 2 * expert + expert;
  CHECK_EQ(md->params_active, 4 * layer_active + 2 * 256 * 128 + 128);
  CHECK_EQ(md->params_active_nonembedding, 4 * layer_active + 128);
  CHECK_EQ(md->by_kind_total[PK_ROUTED], 4 * 8 * expert);
  CHECK_EQ(md->by_kind_active[PK_ROUTED], 4 * 2 * expert);
  CHECK_EQ(md->by_kind_total[PK_ROUTER], 4 * 8 * 128);
  /* MFU numerator: 6 x (attention + top-2 and shared experts + LM head) + causal attention */
  int64_t matmul = 4 * (attn + 3 * expert) + 256 * 128;
  CHECK_EQ(md->active_matmul, matmul);
  CHECK_EQ((int64_t)md->flops_per_token, 6 * matmul + 6 * 4 * 256 * 4 * (32 + 32) / 2);
  /* saved activations per token of one layer, by class (bf16 = 2 B, fp32 = 4 B) */
  CHECK_EQ(md->layers[0].saved_bytes[SAVE_BOUNDARY], 2 * 128);
  CHECK_EQ(md->layers[0].saved_bytes[SAVE_ATTN], 2 * (128 + 64 + 64 + 128) + 4 * 4);
  /* experts: top-2 copies of x, gate, up, act, y; shared: gate, up, act */
  CHECK_EQ(md->layers[0].saved_bytes[SAVE_EXPERT], 2 * (2 * (128 + 3 * 256 + 128) + 3 * 256));
  mem_free(&m);
}

static const char base[] =
    "name: t\n"
    "model:\n"
    "  layers: 8\n"
    "  hidden: 64\n"
    "  vocab: 100\n"
    "  attention:\n"
    "    heads: 4\n"
    "  mlp:\n"
    "    intermediate: 96\n"
    "cluster:\n"
    "  preset: jupiter-booster\n"
    "  nodes: 2\n"
    "  gpu:\n"
    "    hbm: 80 GB\n"
    "training:\n"
    "  seq_len: 128\n"
    "  global_batch: 8\n"
    "  lr: 1e-3\n"
    "  steps: 10\n";

static void defaults_sets_presets(void) {
  Mem m = {0};
  Model *md = load(&m, "t.yaml", base, NULL, 0);
  CHECK(md != NULL);
  if (!md) return;
  const Spec *s = md->spec;
  /* defaults from the table */
  CHECK_EQ(s->model.attention.kv_heads, 4);
  CHECK_EQ(s->model.attention.head_dim, 16);
  CHECK(s->model.attention.kind == ATTN_GQA);
  CHECK(s->model.attention.rope_theta == 10000);
  CHECK(s->model.norm == NORM_RMSNORM && s->model.position == POS_ROPE);
  CHECK(!s->model.tie_embeddings && !s->model.bias);
  CHECK(s->model.mlp.activation == ACT_SWIGLU);
  CHECK_EQ(s->training.micro_batch, 1);
  CHECK(s->training.optimizer == OPT_ADAMW && s->training.grad_reduce_dtype == WIRE_BF16);
  CHECK(!s->plan.present && s->plan.fsdp == 0 && s->plan.tp == 1);
  CHECK(s->plan.activation_checkpoint == AC_AUTO && s->plan.offload_activations == OFF_AUTO);
  /* preset under the spec: the spec's hbm wins, the rest comes from jupiter-booster */
  CHECK(s->cluster.gpu.hbm == 80e9);
  CHECK(s->cluster.gpu.bf16_flops == 989e12);
  CHECK(s->cluster.links.internode == 25e9);
  CHECK_EQ(s->cluster.gpus_per_node, 4);
  CHECK_EQ(s->cluster.nodes, 2);
  CHECK(!s->cluster.nvme.present);
  /* dense swiglu: 3 matrices; untied head */
  CHECK_EQ(md->params_total, 8 * (4 * 64 * 64 + 3 * 64 * 96 + 2 * 64) + 2 * 100 * 64 + 64);

  /* --set overrides, with units, applied before the preset */
  const char *sets[] = {"training.seq_len=256", "cluster.nodes=48", "cluster.gpu.hbm=141GB",
                        "model.attention.kv_heads=2", "plan.fsdp=8", "cluster.host.memory=1 TiB"};
  md = load(&m, "t.yaml", base, sets, 6);
  CHECK(md != NULL);
  if (md) {
    s = md->spec;
    CHECK_EQ(s->training.seq_len, 256);
    CHECK_EQ(s->cluster.nodes, 48);
    CHECK(s->cluster.gpu.hbm == 141e9);
    CHECK(s->cluster.host.memory == 1099511627776.0);
    CHECK_EQ(s->model.attention.kv_heads, 2);
    CHECK_EQ(s->plan.fsdp, 8);
    CHECK(s->plan.present);
    CHECK(md->flops_attention == 6.0 * 8 * 256 * 4 * (16 + 16) / 2);
  }
  /* a later --set wins over an earlier one */
  const char *twice[] = {"cluster.nodes=3", "cluster.nodes=5"};
  md = load(&m, "t.yaml", base, twice, 2);
  CHECK(md && md->spec->cluster.nodes == 5);

  /* errors from --set point at the argument */
  const char *bad[] = {"training.seq_lenn=5"};
  const char *msg = load_error(&m, base, bad, 1);
  CHECK(msg && strstr(msg, "--set:1:10: error: unknown key 'training.seq_lenn'; did you mean 'training.seq_len'?"));
  mem_free(&m);
}

/* Variants: each changes the count by what a hand computation says. */
static int64_t total_with(const char *extra_model, const char *const *sets, int n) {
  Mem m = {0};
  char *text = mem_printf(&m, "%s", base);
  if (extra_model) { /* insert after "  vocab: 100\n" */
    char *at = strstr(text, "  vocab: 100\n") + strlen("  vocab: 100\n");
    text = mem_printf(&m, "%.*s%s%s", (int)(at - text), text, extra_model, at);
  }
  Model *md = load(&m, "t.yaml", text, sets, n);
  int64_t t = md ? md->params_total : -1;
  mem_free(&m);
  return t;
}

static void variants(void) {
  int64_t t0 = total_with(NULL, NULL, 0);
  CHECK_EQ(total_with("  tie_embeddings: true\n", NULL, 0), t0 - 100 * 64);
  /* biases: q k v o (64 x 4), gate up (96 x 2) down (64), two norms (64 x 2) per layer;
   * final norm bias 64 */
  CHECK_EQ(total_with("  bias: true\n", NULL, 0), t0 + 8 * (4 * 64 + 2 * 96 + 64 + 2 * 64) + 64);
  CHECK_EQ(total_with("  position: learned\n  max_position: 512\n", NULL, 0), t0 + 512 * 64);
  const char *gelu[] = {"model.mlp.activation=gelu"};
  CHECK_EQ(total_with(NULL, gelu, 1), t0 - 8 * 64 * 96);
  const char *qkn[] = {"model.attention.qk_norm=per_head"};
  CHECK_EQ(total_with(NULL, qkn, 1), t0 + 8 * 2 * 16);
  const char *qkf[] = {"model.attention.qk_norm=full", "model.attention.kv_heads=2"};
  CHECK_EQ(total_with(NULL, qkf, 2), t0 - 8 * 2 * 32 * 64 + 8 * (64 + 32));
  /* MoE every 2nd layer after 2 dense ones: layers 3, 5, 7 (0-based) */
  const char *moe[] = {"model.moe.experts=4", "model.moe.top_k=1", "model.moe.expert_intermediate=32",
                       "model.moe.first_dense_layers=2", "model.moe.interleave=2"};
  Mem m = {0};
  Model *md = load(&m, "t.yaml", base, moe, 5);
  CHECK(md != NULL);
  if (md) {
    int want[8] = {0, 0, 0, 1, 0, 1, 0, 1};
    for (int l = 0; l < 8; l++) CHECK_EQ(md->layers[l].kind == LAYER_MOE, want[l]);
    CHECK_EQ(md->n_moe_layers, 3);
    CHECK_EQ(md->params_total, t0 + 3 * (4 * 3 * 64 * 32 + 4 * 64 - 3 * 64 * 96));
  }
  /* MLA without q-LoRA: q [nh (nope+rope), H], kv_a [r + rope, H], kv_a_norm [r],
   * kv_b [nh (nope + v), r], o [H, nh v] */
  const char *mla[] = {"model.attention.kind=mla", "model.attention.kv_lora_rank=32",
                       "model.attention.qk_nope_head_dim=16", "model.attention.qk_rope_head_dim=8",
                       "model.attention.v_head_dim=16"};
  int64_t mla_attn = 4 * 24 * 64 + 40 * 64 + 32 + 4 * 32 * 32 + 64 * 64;
  CHECK_EQ(total_with(NULL, mla, 5), t0 - 8 * 4 * 64 * 64 + 8 * mla_attn);
  const char *mla_q[] = {"model.attention.kind=mla", "model.attention.kv_lora_rank=32",
                         "model.attention.qk_nope_head_dim=16", "model.attention.qk_rope_head_dim=8",
                         "model.attention.v_head_dim=16", "model.attention.q_lora_rank=24"};
  int64_t q_lora = 24 * 64 + 24 + 4 * 24 * 24 - 4 * 24 * 64;
  CHECK_EQ(total_with(NULL, mla_q, 6), t0 - 8 * 4 * 64 * 64 + 8 * (mla_attn + q_lora));
  mem_free(&m);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_model SOURCE_DIR\n");
    return 2;
  }
  src_dir = argv[1];
  published_counts();
  tiny_by_hand();
  defaults_sets_presets();
  variants();
  return CHECK_DONE("test_model");
}
