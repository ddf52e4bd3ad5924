/* report.c — the model accounting as `mtc plan` text and as plan.json (jansson). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

static const char *const save_names[] = {"boundary", "attention_core", "experts", "other"};

/* The spec recorded in outputs: its file name only, so that outputs do not depend on where
 * the checkout lives or how the path was typed. */
static const char *shown_path(const char *p) {
  const char *slash = strrchr(p, '/');
  return slash ? slash + 1 : p;
}

static void describe_model(FILE *out, const Model *md) {
  const ModelSpec *ms = &md->spec->model;
  const AttentionSpec *a = &ms->attention;
  fprintf(out, "model      %lld layers", (long long)ms->layers);
  if (ms->moe.present)
    fprintf(out, " (%d MoE, %lld dense)", md->n_moe_layers, (long long)ms->layers - md->n_moe_layers);
  fprintf(out, ", hidden %lld, vocab %lld, %s, %s positions, %s embeddings%s\n",
          (long long)ms->hidden, (long long)ms->vocab, spec_norm_name(ms->norm),
          ms->position == POS_ROPE ? "RoPE" : "learned", ms->tie_embeddings ? "tied" : "untied",
          ms->bias ? ", biases" : "");
  if (a->kind == ATTN_MLA)
    fprintf(out, "attention  mla, %lld heads, q rank %lld, kv rank %lld, qk %lld+%lld, v %lld",
            (long long)a->heads, (long long)a->q_lora_rank, (long long)a->kv_lora_rank,
            (long long)a->qk_nope_head_dim, (long long)a->qk_rope_head_dim, (long long)a->v_head_dim);
  else
    fprintf(out, "attention  %s, %lld heads, %lld KV heads, head_dim %lld", spec_attn_name(a->kind),
            (long long)a->heads, (long long)a->kv_heads, (long long)a->head_dim);
  fprintf(out, "; on cuda %s\n", plan_attention_cudnn(md) ? "cuDNN's fused flash attention"
                                                            : "the own kernels (head dims cuDNN does not serve)");
  if (ms->mlp.present)
    fprintf(out, "mlp        %s, intermediate %lld\n", spec_act_name(ms->mlp.activation),
            (long long)ms->mlp.intermediate);
  if (ms->moe.present) {
    const MoeSpec *m = &ms->moe;
    fprintf(out, "moe        %lld routed experts, top-%lld, %lld shared, %s experts of %lld, "
                 "%s router%s\n", (long long)m->experts, (long long)m->top_k,
            (long long)m->shared_experts, spec_act_name(m->activation),
            (long long)m->expert_intermediate, spec_router_name(m->router),
            m->router_bias ? " with bias" : "");
  }
}

void report_text(FILE *out, const Model *md) {
  const Spec *s = md->spec;
  char a[64], b[64], c[64], e[64];
  size_t n = 4 * strlen(shown_path(s->path)) + 8;
  char *shown = malloc(n);
  if (shown) out_text(shown, n, shown_path(s->path), false);
  fprintf(out, "%s (%s)\n\n", s->name, shown ? shown : "?");
  free(shown);
  describe_model(out, md);

  fprintf(out, "\nparameters          %19s %8s %19s\n", "total", "share", "active/token");
  for (int k = 0; k < PK__COUNT; k++) {
    if (!md->by_kind_total[k] && !md->by_kind_active[k]) continue;
    units_fmt_int(a, sizeof a, md->by_kind_total[k]);
    units_fmt_int(b, sizeof b, md->by_kind_active[k]);
    fprintf(out, "  %-17s %19s %7.2f%% %19s\n", model_kind_name((ParamKind)k), a,
            100.0 * (double)md->by_kind_total[k] / (double)md->params_total, b);
  }
  units_fmt_int(a, sizeof a, md->params_total);
  units_fmt_int(b, sizeof b, md->params_active);
  units_fmt_count(c, sizeof c, (double)md->params_total);
  units_fmt_count(e, sizeof e, (double)md->params_active);
  fprintf(out, "  %-17s %19s %8s %19s\n", "total", a, "", b);
  fprintf(out, "  = %s total, %s active per token", c, e);
  units_fmt_count(c, sizeof c, (double)md->params_active_nonembedding);
  fprintf(out, " (%s without embedding and LM head)\n", c);

  fprintf(out, "\nlayers (bf16 weights)\n");
  for (int l = 0; l < md->nlayers;) {
    int r = l;
    while (r + 1 < md->nlayers && md->layers[r + 1].kind == md->layers[l].kind &&
           md->layers[r + 1].params == md->layers[l].params)
      r++;
    units_fmt_int(a, sizeof a, md->layers[l].params);
    units_fmt_bytes_dec(b, sizeof b, 2.0 * (double)md->layers[l].params);
    char range[32];
    snprintf(range, sizeof range, r > l ? "%d-%d" : "%d", l, r);
    fprintf(out, "  %-9s %-5s %19s params  %10s each\n", range,
            md->layers[l].kind == LAYER_MOE ? "moe" : "dense", a, b);
    l = r + 1;
  }

  const ModelSpec *ms = &s->model;
  units_fmt_int(a, sizeof a, md->active_matmul);
  fprintf(out, "\ntraining FLOPs per token (no recomputation; the MFU numerator)\n");
  fprintf(out, "  6 x %s active matmul params (LM head in, embedding and router out)\n", a);
  fprintf(out, "    = %.4g\n", md->flops_matmul);
  fprintf(out, "  + 6 x %lld layers x %lld seq x %lld heads x (%lld + %lld) / 2 (causal attention)\n",
          (long long)ms->layers, (long long)s->training.seq_len, (long long)ms->attention.heads,
          (long long)md->qk_head_dim, (long long)md->v_head_dim);
  fprintf(out, "    = %.4g\n", md->flops_attention);
  fprintf(out, "  = %.4g FLOPs per token\n", md->flops_per_token);

  /* activations of the widest layer, per token, by who keeps them under checkpointing */
  const Layer *ly = &md->layers[0];
  for (int l = 1; l < md->nlayers; l++)
    if (md->layers[l].kind == LAYER_MOE) { ly = &md->layers[l]; break; }
  fprintf(out, "\nsaved activations per token of a %s layer (for backward)\n",
          ly->kind == LAYER_MOE ? "MoE" : "dense");
  for (int k = 0; k < 4; k++) {
    units_fmt_int(a, sizeof a, ly->saved_bytes[k]);
    fprintf(out, "  %-16s %12s B\n", save_names[k], a);
  }
  double boundary = (double)ly->saved_bytes[SAVE_BOUNDARY] * (double)s->training.seq_len *
                    (double)md->nlayers;
  units_fmt_bytes_bin(a, sizeof a, boundary);
  fprintf(out, "  layer-boundary activations of one %lld-token sequence over %d layers: %s\n",
          (long long)s->training.seq_len, md->nlayers, a);
}

static json_t *jint(int64_t v) { return json_integer((json_int_t)v); }

static json_t *jflops(double v) {
  return v < 0x1p53 ? json_integer((json_int_t)llround(v)) : json_real(v);
}

void *report_json(const Model *md) {
  const Spec *s = md->spec;
  const ModelSpec *ms = &s->model;
  json_t *root = json_object();
  json_object_set_new(root, "name", json_string(s->name));
  size_t n = 4 * strlen(shown_path(s->path)) + 8;
  char *shown = malloc(n);
  if (shown) out_text(shown, n, shown_path(s->path), false);
  json_t *spec = shown ? json_string(shown) : NULL; /* NULL when the name is not UTF-8: then its bytes as \ooo */
  if (!spec && shown) out_text(shown, n, shown_path(s->path), true), spec = json_string(shown);
  free(shown);
  json_object_set_new(root, "spec", spec);
  json_object_set_new(root, "mtc_version", json_string(MTC_VERSION));

  json_t *m = json_object();
  json_object_set_new(m, "params_total", jint(md->params_total));
  json_object_set_new(m, "params_active", jint(md->params_active));
  json_object_set_new(m, "params_active_nonembedding", jint(md->params_active_nonembedding));
  json_object_set_new(m, "active_matmul_params", jint(md->active_matmul));
  json_object_set_new(m, "flops_per_token", jflops(md->flops_per_token));
  json_object_set_new(m, "flops_per_token_matmul", jflops(md->flops_matmul));
  json_object_set_new(m, "flops_per_token_attention", jflops(md->flops_attention));
  json_object_set_new(m, "flops_formula",
                      json_string("6 * active_matmul_params + 6 * layers * seq_len * heads * "
                                  "(qk_head_dim + v_head_dim) / 2"));
  json_object_set_new(m, "layers", jint(ms->layers));
  json_object_set_new(m, "moe_layers", json_integer(md->n_moe_layers));
  json_object_set_new(m, "hidden", jint(ms->hidden));
  json_object_set_new(m, "vocab", jint(ms->vocab));
  json_object_set_new(m, "seq_len", jint(s->training.seq_len));
  json_object_set_new(m, "qk_head_dim", jint(md->qk_head_dim));
  json_object_set_new(m, "v_head_dim", jint(md->v_head_dim));

  json_t *kinds = json_object();
  for (int k = 0; k < PK__COUNT; k++) {
    json_t *o = json_object();
    json_object_set_new(o, "total", jint(md->by_kind_total[k]));
    json_object_set_new(o, "active", jint(md->by_kind_active[k]));
    json_object_set_new(kinds, model_kind_name((ParamKind)k), o);
  }
  json_object_set_new(m, "params_by_kind", kinds);

  json_t *layers = json_array();
  for (int l = 0; l < md->nlayers; l++) {
    const Layer *ly = &md->layers[l];
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(l));
    json_object_set_new(o, "kind", json_string(ly->kind == LAYER_MOE ? "moe" : "dense"));
    json_object_set_new(o, "params", jint(ly->params));
    json_object_set_new(o, "params_active", jint(ly->active_params));
    json_object_set_new(o, "bf16_bytes", jint(2 * ly->params));
    json_t *sv = json_object();
    for (int k = 0; k < 4; k++) json_object_set_new(sv, save_names[k], jint(ly->saved_bytes[k]));
    json_object_set_new(o, "saved_bytes_per_token", sv);
    json_array_append_new(layers, o);
  }
  json_object_set_new(m, "layer_list", layers);
  json_object_set_new(root, "model", m);
  return root;
}

bool report_write_json(Diag *d, void *obj, const char *path) {
  OutFile o;
  FILE *f = path ? out_open(d, &o, path) : stdout;
  if (!f) return false;
  bool ok = json_dumpf(obj, f, JSON_INDENT(2)) == 0 && fputc('\n', f) != EOF;
  if (path) return out_close(d, &o) && ok;
  return true; /* stdout: a failed write is main's finish()'s one error */
}
