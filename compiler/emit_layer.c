/* emit_layer.c — one dense layer's forward and backward in step.c (norms, attention with its
 * RoPE and qk-norm, the MLP, residuals) and the emitter's text helpers; the MoE part of a layer
 * is emit_moe.c's, the schedule around the layers emit_step.c's. */
#include <errno.h>
#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"

/* Writes text to e->f. The emitters write every arena buffer as R(NAME); for a buffer of the
 * activation arena (em_arena_of) it is written A(NAME), so that one spelling serves code and
 * the buffer's type follows the layout. */
static void put_text(Em *e, const char *text) {
  for (const char *p = text; *p;) {
    const char *r = strstr(p, "R(");
    if (!r) {
      fputs(p, e->f);
      break;
    }
    fwrite(p, 1, (size_t)(r - p), e->f);
    bool word = r > text && (isalnum((unsigned char)r[-1]) || r[-1] == '_'); /* e.g. "STDERR(" */
    size_t len = strspn(r + 2, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_");
    char name[128];
    if (!word && len && len < sizeof name && r[2 + len] == ')') {
      memcpy(name, r + 2, len), name[len] = 0;
      fputs(em_real_in_act(e, name) ? "RA(" : em_arena_of(e, name) == EM_ACT ? "A(" : "R(", e->f);
    } else {
      fputs("R(", e->f);
    }
    p = r + 2;
  }
}

void em_printf(Em *e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char small[4096], *text = (size_t)n < sizeof small ? small : malloc((size_t)n + 1);
  if (!text) abort(); /* out of memory */
  va_start(ap, fmt);
  vsnprintf(text, (size_t)n + 1, fmt, ap);
  va_end(ap);
  put_text(e, text);
  if (text != small) free(text);
}

/* Offset of tensor key (model.c's name) in group g; the emitter asks only for tensors the
 * model graph has. Scans only the group's own range of tensors (one layer's). */
int64_t em_off(Em *e, int g, const char *key) {
  for (int i = e->groups[g].first; i <= e->groups[g].last; i++)
    if (e->tensors[i].group == g && strcmp(e->tensors[i].key, key) == 0) return e->tensors[i].offset;
  fprintf(stderr, "mtc: internal error: no tensor %s in group %d\n", key, g);
  abort();
}

/* The bias of the linear layer whose weight is wkey in group g, as a call argument through
 * macro m (W, or DW for its gradient): "NULL" when the model graph has none (mtrt_ops.h's rt_matmul_*). */
const char *em_bias_arg(Em *e, int g, const char *wkey, const char *m) {
  size_t n = strlen(wkey) - strlen("weight");
  const char *key = mem_printf(e->m, "%.*sbias", (int)n, wkey);
  for (int i = e->groups[g].first; i <= e->groups[g].last; i++)
    if (e->tensors[i].group == g && strcmp(e->tensors[i].key, key) == 0)
      return mem_printf(e->m, "%s(%lld)", m, (long long)e->tensors[i].offset);
  return "NULL";
}

/* ---- norms -------------------------------------------------------------------------------- */

/* Norm `name` (input_layernorm, post_attention_layernorm, norm: its weight name.weight in group g,
 * its bias name.bias under model.bias) of buffer x into out; stats holds rstd (N), then the mean
 * (N) for LayerNorm (emit_layout.c sizes it). RMSNorm with a bias adds it after the norm. */
void em_norm_forward(Em *e, int g, const char *out, const char *stats, const char *x, const char *name) {
  long long N = e->N, C = e->C, w = off(e, g, mem_printf(e->m, "%s.weight", name));
  const char *b = e->s->model.bias ? mem_printf(e->m, "W(%lld)", (long long)off(e, g, mem_printf(e->m, "%s.bias", name))) : NULL;
  const char *what = strcmp(name, "norm") == 0 ? "model.norm" : name;
  if (e->s->model.norm == NORM_LAYERNORM) {
    P(e, "  rt_layernorm_forward(R(%s), R(%s + %lld), R(%s), R(%s), W(%lld), %s, %lld, %lld, EPS); /* %s */\n", out, stats,
      N, stats, x, w, b ? b : "NULL", N, C, what);
    return;
  }
  P(e, "  rt_rmsnorm_forward(R(%s), R(%s), R(%s), W(%lld), %lld, %lld, EPS); /* %s */\n", out, stats, x, w, N, C, what);
  if (b) P(e, "  rt_bias_forward(R(%s), %s, %lld, %lld); /* %s.bias */\n", out, b, N, C, name);
}

/* Its backward: the gradient of out is in DLN; adds that of x into dx. */
void em_norm_backward(Em *e, int g, const char *dx, const char *x, const char *stats, const char *name) {
  long long N = e->N, C = e->C, w = off(e, g, mem_printf(e->m, "%s.weight", name));
  const char *db = e->s->model.bias ? mem_printf(e->m, "DW(%lld)", (long long)off(e, g, mem_printf(e->m, "%s.bias", name))) : NULL;
  if (e->s->model.norm == NORM_LAYERNORM) {
    P(e, "  rt_layernorm_backward(R(%s), DW(%lld), %s, R(DLN), R(%s), W(%lld), R(%s + %lld), R(%s), %lld, %lld);\n", dx, w,
      db ? db : "NULL", x, w, stats, N, stats, N, C);
    return;
  }
  if (db) P(e, "  rt_bias_backward(%s, R(DLN), %lld, %lld); /* %s.bias */\n", db, N, C, name);
  P(e, "  rt_rmsnorm_backward(R(%s), DW(%lld), R(DLN), R(%s), W(%lld), R(%s), %lld, %lld);\n", dx, w, x, w, stats, N, C);
}

const char *em_dln_gemm(Em *e) {
  bool first = !e->dln_live;
  e->dln_live = true;
  return first ? "rt_matmul_backward_set" : "rt_matmul_backward";
}

int64_t em_gu_weight(Em *e, int g, const char *prefix, int64_t F) {
  int64_t w = off(e, g, mem_printf(e->m, "%s.gate_proj.weight", prefix));
  if (off(e, g, mem_printf(e->m, "%s.up_proj.weight", prefix)) != w + F * e->C) {
    fprintf(stderr, "mtc: internal error: %s gate and up weights not adjacent in group %d\n", prefix, g);
    abort();
  }
  return w;
}

void em_dln_zero(Em *e) {
  if (!e->dln_live) P(e, "  rt_zero(R(DLN), %lld);\n", (long long)(e->N * e->C));
  e->dln_live = true;
}

/* ---- one layer ---------------------------------------------------------------------------- */

/* Whether RoPE has Llama 3.1's frequency scaling (model.rope_scaling type llama3) or YaRN. */
static bool llama3(const Em *e) {
  return e->s->model.rope_scaling.present && e->s->model.rope_scaling.type != ROPE_SCALING_NONE;
}

/* YaRN's get_mscale (transformers' modeling_rope_utils.py): 0.1 m ln(s) + 1 for s > 1. */
static double yarn_mscale(double s, double m) { return s <= 1 ? 1 : 0.1 * m * log(s) + 1; }

/* rt_rope_yarn_<dir> on buffer x of h heads, with transformers' attention factor: the ratio of
 * get_mscale(factor, mscale) to get_mscale(factor, mscale_all_dim) when both are set, else
 * get_mscale(factor). */
static void rope_yarn(Em *e, const char *ind, const char *x, int64_t h, const char *dir) {
  const RopeScalingSpec *r = &e->s->model.rope_scaling;
  double attn = r->mscale && r->mscale_all_dim ? yarn_mscale(r->factor, r->mscale) / yarn_mscale(r->factor, r->mscale_all_dim)
                                               : yarn_mscale(r->factor, 1);
  P(e, "%srt_rope_yarn_%s(R(%s), %lld, %lld, %lld, %lld, %.17g, %.17g, %lld, %.17g, %.17g, %.17g); /* B, T, heads, "
       "head_dim, theta, rope_scaling factor, original_max_position, beta_fast, beta_slow, attention factor */\n",
    ind, dir, x, (long long)e->B, (long long)e->T, (long long)h, (long long)e->hd, e->s->model.attention.rope_theta,
    r->factor, (long long)r->original_max_position, r->beta_fast, r->beta_slow, attn);
}

/* rt_rope_llama3_<dir> on buffer x of h heads: RoPE with model.rope_scaling's factors. */
static void rope_llama3(Em *e, const char *ind, const char *x, int64_t h, const char *dir) {
  const RopeScalingSpec *r = &e->s->model.rope_scaling;
  if (r->type == ROPE_SCALING_YARN) {
    rope_yarn(e, ind, x, h, dir);
    return;
  }
  P(e, "%srt_rope_llama3_%s(R(%s), %lld, %lld, %lld, %lld, %.17g, %.17g, %.17g, %.17g, %lld); /* B, T, heads, "
       "head_dim, theta, rope_scaling factor, low_freq_factor, high_freq_factor, original_max_position */\n",
    ind, dir, x, (long long)e->B, (long long)e->T, (long long)h, (long long)e->hd, e->s->model.attention.rope_theta,
    r->factor, r->low_freq_factor, r->high_freq_factor, (long long)r->original_max_position);
}

/* qk-norm's rows and width for heads h (per_head: a row per token and head of head_dim; full:
 * a row per token of every head's channels). */
static void qk_rows(const Em *e, int64_t h, long long *rows, long long *width) {
  bool full = e->qk_norm == QKN_FULL;
  *rows = full ? e->N : e->N * h, *width = full ? h * e->hd : e->hd;
}

/* q and k normalized before RoPE: QR, KR (the projections) -> Q, K (Qwen3's q_norm / k_norm over
 * head_dim, modeling_qwen3.py; OLMoE's over all heads, modeling_olmoe.py). */
static void qk_norm_forward(Em *e, int l, const char *ind) {
  int g = e->layer_dense[l];
  for (int i = 0; i < 2; i++) {
    long long rows, width;
    qk_rows(e, i ? e->nkv : e->nh, &rows, &width);
    P(e, "%srt_qk_norm_forward(R(%s), R(%s), R(%s), W(%lld), %lld, %lld, EPS); /* %s_norm */\n", ind,
      A(e, l, i ? "K" : "Q"), A(e, l, i ? "RSTDK" : "RSTDQ"), A(e, l, i ? "KR" : "QR"),
      (long long)off(e, g, i ? "attn.k_norm.weight" : "attn.q_norm.weight"), rows, width, i ? "k" : "q");
  }
}

/* The backward of qk_norm_forward: DQ, DK (gradients of the normalized q, k) -> DQR, DKR. */
static void qk_norm_backward(Em *e, int l) {
  int g = e->layer_dense[l];
  for (int i = 0; i < 2; i++) {
    long long rows, width;
    qk_rows(e, i ? e->nkv : e->nh, &rows, &width);
    int64_t o = off(e, g, i ? "attn.k_norm.weight" : "attn.q_norm.weight");
    P(e, "  rt_zero(R(%s), %lld);\n", i ? "DKR" : "DQR", rows * width);
    P(e, "  rt_qk_norm_backward(R(%s), DW(%lld), R(%s), R(%s), W(%lld), R(%s), %lld, %lld); /* %s_norm */\n",
      i ? "DKR" : "DQR", (long long)o, i ? "DK" : "DQ", A(e, l, i ? "KR" : "QR"), (long long)o,
      A(e, l, i ? "RSTDK" : "RSTDQ"), rows, width, i ? "k" : "q");
  }
}

static void attention_qkv(Em *e, int l, const char *ind);

/* The fused projection's weight (or gradient) offset: q_proj's, with k_proj's and v_proj's (and
 * their biases) right after it, as model.c lays them out (plan_qkv_fused); an emitter bug if not. */
static int64_t qkv_weight(Em *e, int g) {
  int64_t q = off(e, g, "attn.q_proj.weight");
  if (off(e, g, "attn.k_proj.weight") != q + e->Q * e->C || off(e, g, "attn.v_proj.weight") != q + (e->Q + e->KV) * e->C) {
    fprintf(stderr, "mtc: internal error: q, k, v weights not adjacent in group %d\n", g);
    abort();
  }
  return q;
}

void em_rope_span(Em *e, const char *ind, const char *dir, const char *x, int64_t heads, int64_t stride, int64_t rd) {
  P(e, "%srt_rope_span_%s(%s, %lld, %lld, %lld, %lld, %lld, %.17g, CP_LO, CP_HI); /* B, T / cp, heads, stride, rope "
       "dims, theta, this rank's chunks' first positions */\n", ind, dir, x, (long long)e->B, (long long)(e->T / e->cp),
    (long long)heads, (long long)stride, (long long)rd, e->s->model.attention.rope_theta);
}

/* Context parallelism: the keys and values of the whole sequences (every rank's chunks, in
 * position order) all-gathered over the cp group into KVG: K (B, T, kv_heads x head_dim), then V. */
static void cp_gather(Em *e, const char *ind, const char *k, const char *v) {
  long long B = e->B, Tl = e->T / e->cp;
  P(e, "%srt_comm_cp_gather(c->comm.cp_comm, PLAN_CP, A(KVG), A(%s), %lld, %lld, %lld); /* keys of the whole sequences */\n",
    ind, k, B, Tl, (long long)e->KV);
  P(e, "%srt_comm_cp_gather(c->comm.cp_comm, PLAN_CP, A(KVG + %lld), A(%s), %lld, %lld, %lld); /* and values */\n", ind,
    (long long)(e->B * e->T * e->KV), v, B, Tl, (long long)e->VW);
}

static void attention_forward(Em *e, int l) {
  int g = e->layer_dense[l];
  const char *ln1 = A(e, l, "LN1"), *q = A(e, l, "Q"), *k = A(e, l, "K"),
             *v = A(e, l, "V"), *att = A(e, l, "ATT"), *lse = A(e, l, "LSE");
  em_norm_forward(e, g, ln1, A(e, l, "RSTD1"), mem_printf(e->m, "X%d", l), "input_layernorm");
  const char *ind = e->ac == AC_SELECTIVE ? "    " : "  ";
  if (e->mla) em_mla_forward(e, l); /* opens the selective block itself */
  else attention_qkv(e, l, ind);
  if (e->qkv_fused) {
    P(e, "%srt_attention_qkv_forward(R(%s), R(%s), R(%s), %lld, %lld, %lld, %lld, %lld); /* B, T, heads, kv_heads, "
         "head_dim: q, k, v strided views of the rows */\n", ind, att, lse, A(e, l, "QKV"), (long long)e->B,
      (long long)e->T, (long long)e->nh, (long long)e->nkv, (long long)e->hd);
  } else if (e->cp > 1) {
    cp_gather(e, ind, k, v);
    P(e, "%srt_attention_span_forward(R(%s), R(%s), R(%s), R(KVG), A(KVG + %lld), %lld, %lld, %lld, CP_LO, CP_HI, %lld, "
         "%lld, %lld, %lld); /* B, T / cp, T, this rank's chunks' first positions, heads, kv_heads, head_dim, "
         "v_head_dim */\n", ind, att, lse, q, (long long)(e->B * e->T * e->KV), (long long)e->B,
      (long long)(e->T / e->cp), (long long)e->T, (long long)e->nh, (long long)e->nkv, (long long)e->hd, (long long)e->vd);
  } else
  P(e, "%srt_attention_forward(R(%s), R(%s), R(%s), R(%s), R(%s), %lld, %lld, %lld, %lld, %lld, %lld); /* B, T, heads, "
       "kv_heads, head_dim, v_head_dim */\n", ind, att,
    lse, q, k, v, (long long)e->B, (long long)e->T, (long long)e->nh, (long long)e->nkv, (long long)e->hd, (long long)e->vd);
  if (e->ac == AC_SELECTIVE) P(e, "  }\n");
  P(e, "  rt_matmul_forward(R(WS_Y), R(%s), W(%lld), %s, %lld, %lld, %lld); /* o_proj */\n", att,
    (long long)off(e, g, "attn.o_proj.weight"), bias_arg(e, g, "attn.o_proj.weight", "W"), (long long)e->N, (long long)e->AO, (long long)e->C);
  if (e->s->model.norm == NORM_RMSNORM && !e->s->model.bias) { /* one pass: the residual add and the norm after it */
    P(e, "  rt_add_rmsnorm_forward(R(%s), R(%s), R(%s), R(X%d), R(WS_Y), W(%lld), %lld, %lld, EPS); /* residual, "
         "post_attention_layernorm */\n", A(e, l, "RES"), A(e, l, "LN2"), A(e, l, "RSTD2"), l,
      (long long)off(e, g, "post_attention_layernorm.weight"), (long long)e->N, (long long)e->C);
    return;
  }
  P(e, "  rt_add(R(%s), R(X%d), R(WS_Y), %lld); /* residual */\n", A(e, l, "RES"), l, (long long)(e->N * e->C));
  em_norm_forward(e, g, A(e, l, "LN2"), A(e, l, "RSTD2"), A(e, l, "RES"), "post_attention_layernorm");
}

/* mha/gqa's q, k, v from LN1 (qk-norm, RoPE) into Q, K, V; opens the selective block. */
static void attention_qkv(Em *e, int l, const char *ind) {
  int g = e->layer_dense[l];
  const char *ln1 = A(e, l, "LN1"), *q = A(e, l, "Q"), *k = A(e, l, "K"), *v = A(e, l, "V");
  if (e->ac == AC_SELECTIVE)
    P(e, "  if (!recompute) { /* selective checkpointing: q, k, v and the attention core are saved */\n");
  if (e->qkv_fused) { /* one GEMM: each token's row q | k | v, then RoPE on q's and k's heads of it */
    const char *qkv = A(e, l, "QKV");
    int64_t w = qkv_weight(e, g);
    P(e, "%srt_matmul_forward(R(%s), R(%s), W(%lld), %s, %lld, %lld, %lld); /* q_proj, k_proj, v_proj */\n", ind, qkv,
      ln1, (long long)w, bias_arg(e, g, "attn.q_proj.weight", "W"), (long long)e->N, (long long)e->C,
      (long long)(e->Q + 2 * e->KV));
    if (e->rope)
      P(e, "%srt_rope_qkv_forward(R(%s), %lld, %lld, %lld, %lld, %lld, %.17g); /* B, T, heads, kv_heads, head_dim, "
           "theta */\n", ind, qkv, (long long)e->B, (long long)e->T, (long long)e->nh, (long long)e->nkv,
        (long long)e->hd, e->s->model.attention.rope_theta);
    return;
  }
  const char *qr = e->qk_norm ? A(e, l, "QR") : q, *kr = e->qk_norm ? A(e, l, "KR") : k;
  P(e, "%srt_matmul_forward(R(%s), R(%s), W(%lld), %s, %lld, %lld, %lld); /* q_proj */\n", ind, qr, ln1,
    (long long)off(e, g, "attn.q_proj.weight"), bias_arg(e, g, "attn.q_proj.weight", "W"), (long long)e->N, (long long)e->C, (long long)e->Q);
  P(e, "%srt_matmul_forward(R(%s), R(%s), W(%lld), %s, %lld, %lld, %lld); /* k_proj */\n", ind, kr, ln1,
    (long long)off(e, g, "attn.k_proj.weight"), bias_arg(e, g, "attn.k_proj.weight", "W"), (long long)e->N, (long long)e->C, (long long)e->KV);
  P(e, "%srt_matmul_forward(R(%s), R(%s), W(%lld), %s, %lld, %lld, %lld); /* v_proj */\n", ind, v, ln1,
    (long long)off(e, g, "attn.v_proj.weight"), bias_arg(e, g, "attn.v_proj.weight", "W"), (long long)e->N, (long long)e->C, (long long)e->KV);
  if (e->qk_norm) qk_norm_forward(e, l, ind);
  double theta = e->s->model.attention.rope_theta;
  if (e->rope && llama3(e)) {
    rope_llama3(e, ind, q, e->nh, "forward");
    rope_llama3(e, ind, k, e->nkv, "forward");
  } else if (e->rope && e->cp > 1) {
    em_rope_span(e, ind, "forward", mem_printf(e->m, "A(%s)", q), e->nh, e->hd, e->hd);
    em_rope_span(e, ind, "forward", mem_printf(e->m, "A(%s)", k), e->nkv, e->hd, e->hd);
  } else if (e->rope) {
    P(e, "%srt_rope_forward(R(%s), %lld, %lld, %lld, %lld, %.17g); /* B, T, heads, head_dim, theta */\n", ind, q, (long long)e->B, (long long)e->T,
      (long long)e->nh, (long long)e->hd, theta);
    P(e, "%srt_rope_forward(R(%s), %lld, %lld, %lld, %lld, %.17g);\n", ind, k, (long long)e->B, (long long)e->T,
      (long long)e->nkv, (long long)e->hd, theta);
  }
}

static void mlp_forward(Em *e, int l) {
  int g = e->layer_dense[l];
  int64_t N = e->N, C = e->C, F = e->s->model.mlp.intermediate;
  const char *ln2 = A(e, l, "LN2"), *u = A(e, l, "U"), *h = A(e, l, "H");
  if (e->gu_fused[0]) { /* one GEMM: each token's row g | u; SwiGLU reads both halves */
    const char *gu = A(e, l, "GU");
    P(e, "  rt_matmul_forward(R(%s), R(%s), W(%lld), NULL, %lld, %lld, %lld); /* gate_proj, up_proj */\n", gu, ln2,
      (long long)em_gu_weight(e, g, "mlp", F), (long long)N, (long long)C, (long long)(2 * F));
    P(e, "  rt_swiglu_rows_forward(R(%s), R(%s), %lld, %lld);\n", h, gu, (long long)N, (long long)F);
    P(e, "  rt_matmul_forward(R(WS_Y), R(%s), W(%lld), %s, %lld, %lld, %lld); /* down_proj */\n", h,
      (long long)off(e, g, "mlp.down_proj.weight"), bias_arg(e, g, "mlp.down_proj.weight", "W"), (long long)N, (long long)F,
      (long long)C);
    return;
  }
  P(e, "  rt_matmul_forward(R(%s), R(%s), W(%lld), %s, %lld, %lld, %lld); /* up_proj */\n", u, ln2,
    (long long)off(e, g, "mlp.up_proj.weight"), bias_arg(e, g, "mlp.up_proj.weight", "W"), (long long)N, (long long)C, (long long)F);
  if (e->s->model.mlp.activation == ACT_SWIGLU) {
    const char *gg = A(e, l, "G");
    P(e, "  rt_matmul_forward(R(%s), R(%s), W(%lld), %s, %lld, %lld, %lld); /* gate_proj */\n", gg, ln2,
      (long long)off(e, g, "mlp.gate_proj.weight"), bias_arg(e, g, "mlp.gate_proj.weight", "W"), (long long)N, (long long)C, (long long)F);
    P(e, "  rt_swiglu_forward(R(%s), R(%s), R(%s), %lld);\n", h, gg, u, (long long)(N * F));
  } else {
    P(e, "  rt_gelu_forward(R(%s), R(%s), %lld);\n", h, u, (long long)(N * F));
  }
  P(e, "  rt_matmul_forward(R(WS_Y), R(%s), W(%lld), %s, %lld, %lld, %lld); /* down_proj */\n", h,
    (long long)off(e, g, "mlp.down_proj.weight"), bias_arg(e, g, "mlp.down_proj.weight", "W"), (long long)N, (long long)F, (long long)C);
}

/* Whole-expert shards (plan_expert_per > 0: efsdp > 1 divides El): the gathered experts of a
 * layer are efsdp shards one after another, each holding per experts of every routed tensor, so
 * the experts' ops run once per shard on its experts (flat: once, on all El). EXW(o) is the weight (or gradient) at gathered offset o of the shard's
 * first expert, EXO(offs) its offsets, EXN its experts; EXLOOP the loop over shards ("" when flat). */
void em_layer_forward(Em *e, int l) {
  bool moe = e->md->layers[l].kind == LAYER_MOE;
  if (e->ac == AC_NONE)
    P(e, "\n/* layer %d (%s), forward: X%d -> X%d; every activation stays for the backward (no\n"
         " * checkpointing: recompute is always false). */\n", l, moe ? "MoE" : "dense", l, l + 1);
  else
    P(e, "\n/* layer %d (%s), forward: X%d -> X%d. With recompute, the backward re-runs it from the\n"
         " * saved boundary X%d (%s checkpointing). */\n", l, moe ? "MoE" : "dense", l, l + 1, l, plan_ac_name(e->ac));
  P(e, "static void layer%d_forward(RtCtx *c, bool recompute) {\n", l);
  if (!moe && e->ac != AC_SELECTIVE) P(e, "  (void)recompute; /* a dense layer recomputes everything or nothing */\n");
  attention_forward(e, l);
  if (moe) em_moe_forward(e, l);
  else mlp_forward(e, l);
  P(e, "  %srt_add(R(X%d), R(%s), R(WS_Y), %lld); /* residual */\n}\n", e->ac == AC_NONE ? "" : "if (!recompute) ", l + 1, A(e, l, "RES"),
    (long long)(e->N * e->C));
}

static void mlp_backward(Em *e, int l, const char *dy) {
  int g = e->layer_dense[l];
  long long N = e->N, C = e->C, F = e->s->model.mlp.intermediate;
  const char *ln2 = A(e, l, "LN2"), *u = A(e, l, "U"), *h = A(e, l, "H");
  P(e, "  rt_matmul_backward_set(R(DH), DW(%lld), %s, R(%s), R(%s), W(%lld), %lld, %lld, %lld); /* down_proj */\n",
    (long long)off(e, g, "mlp.down_proj.weight"), bias_arg(e, g, "mlp.down_proj.weight", "DW"), dy, h, (long long)off(e, g, "mlp.down_proj.weight"), N, F, C);
  if (e->gu_fused[0]) { /* the gradient of the rows g | u, then one GEMM */
    int64_t w = em_gu_weight(e, g, "mlp", F);
    P(e, "  rt_swiglu_rows_backward(R(DGU), R(DH), R(%s), %lld, %lld);\n", A(e, l, "GU"), N, F);
    P(e, "  %s(R(DLN), DW(%lld), NULL, R(DGU), R(%s), W(%lld), %lld, %lld, %lld); /* gate_proj, up_proj */\n",
      em_dln_gemm(e), (long long)w, ln2, (long long)w, N, C, 2 * F);
    return;
  }
  if (e->s->model.mlp.activation == ACT_SWIGLU) {
    const char *gg = A(e, l, "G");
    P(e, "  rt_swiglu_backward(R(DG), R(DU), R(DH), R(%s), R(%s), %lld);\n", gg, u, N * F);
    P(e, "  %s(R(DLN), DW(%lld), %s, R(DG), R(%s), W(%lld), %lld, %lld, %lld); /* gate_proj */\n", em_dln_gemm(e),
      (long long)off(e, g, "mlp.gate_proj.weight"), bias_arg(e, g, "mlp.gate_proj.weight", "DW"), ln2, (long long)off(e, g, "mlp.gate_proj.weight"), N, C, F);
  } else {
    P(e, "  rt_gelu_backward(R(DU), R(DH), R(%s), %lld);\n", u, N * F);
  }
  P(e, "  %s(R(DLN), DW(%lld), %s, R(DU), R(%s), W(%lld), %lld, %lld, %lld); /* up_proj */\n", em_dln_gemm(e),
    (long long)off(e, g, "mlp.up_proj.weight"), bias_arg(e, g, "mlp.up_proj.weight", "DW"), ln2, (long long)off(e, g, "mlp.up_proj.weight"), N, C, F);
}

void em_layer_backward(Em *e, int l, const char *dy, const char *dx) {
  bool moe = e->md->layers[l].kind == LAYER_MOE;
  int g = e->layer_dense[l];
  long long N = e->N, C = e->C, Q = e->Q, KV = e->KV, AO = e->AO;
  P(e, "\n/* layer %d (%s), backward: %s (gradient of X%d) -> %s (gradient of X%d); weight gradients\n"
       " * into DW%s. */\n",
    l, moe ? "MoE" : "dense", dy, l + 1, dx, l, moe ? " and DWE" : "");
  P(e, "static void layer%d_backward(RtCtx *c) {\n", l);
  P(e, "  /* an input gradient's first writer writes it (rt_matmul_backward_set, the attention, the\n"
       "   * activations' backward), later ones add; a buffer only adders reach is zeroed first */\n");
  e->dln_live = false;
  if (moe) em_moe_backward(e, l, dy);
  else mlp_backward(e, l, dy);
  P(e, "  rt_copy(R(%s), R(%s), %lld); /* the residual passes the gradient through */\n", dx, dy, N * C);
  em_norm_backward(e, g, dx, A(e, l, "RES"), A(e, l, "RSTD2"), "post_attention_layernorm");
  int64_t o = off(e, g, "attn.o_proj.weight");
  P(e, "  rt_matmul_backward_set(R(DATT), DW(%lld), %s, R(%s), R(%s), W(%lld), %lld, %lld, %lld); /* o_proj */\n",
    (long long)o, bias_arg(e, g, "attn.o_proj.weight", "DW"), dx, A(e, l, "ATT"), (long long)o, N, AO, C);
  e->dln_live = false; /* DLN's next values: the q, k, v projections' */
  if (e->qkv_fused) { /* the gradient of the rows q | k | v, RoPE's back, one GEMM into DLN */
    const char *qkv = A(e, l, "QKV");
    P(e, "  rt_attention_qkv_backward(R(DQKV), R(DATT), R(%s), R(%s), R(%s), %lld, %lld, %lld, %lld, %lld);\n", qkv,
      A(e, l, "ATT"), A(e, l, "LSE"), (long long)e->B, (long long)e->T, (long long)e->nh, (long long)e->nkv,
      (long long)e->hd);
    if (e->rope)
      P(e, "  rt_rope_qkv_backward(R(DQKV), %lld, %lld, %lld, %lld, %lld, %.17g);\n", (long long)e->B, (long long)e->T,
        (long long)e->nh, (long long)e->nkv, (long long)e->hd, e->s->model.attention.rope_theta);
    int64_t w = qkv_weight(e, g);
    P(e, "  %s(R(DLN), DW(%lld), %s, R(DQKV), R(%s), W(%lld), %lld, %lld, %lld); /* q_proj, k_proj, v_proj */\n",
      em_dln_gemm(e), (long long)w, bias_arg(e, g, "attn.q_proj.weight", "DW"), A(e, l, "LN1"), (long long)w, N, C,
      Q + 2 * KV);
    em_norm_backward(e, g, dx, mem_printf(e->m, "X%d", l), A(e, l, "RSTD1"), "input_layernorm");
    P(e, "}\n");
    return;
  }
  if (e->cp > 1) { /* the span backward adds into DQ; DK and DV come from the reduce-scatters */
    P(e, "  rt_zero(R(DQ), %lld);\n  rt_zero(R(DK), %lld);\n  rt_zero(R(DV), %lld);\n", N * Q, N * KV, N * (long long)e->VW);
    /* the keys' and values' gradient over the whole sequences, then each rank's chunks of it */
    long long kvn = e->B * e->T * e->KV;
    cp_gather(e, "  ", A(e, l, "K"), A(e, l, "V"));
    P(e, "  rt_zero(R(DKVG), %lld);\n", kvn + e->B * e->T * e->VW);
    P(e, "  rt_attention_span_backward(R(DQ), R(DKVG), A(DKVG + %lld), R(DATT), R(%s), R(KVG), A(KVG + %lld), R(%s), "
         "R(%s), %s, %lld, %lld, %lld, CP_LO, CP_HI, %lld, %lld, %lld, %lld);\n", kvn, A(e, l, "Q"), kvn, A(e, l, "ATT"),
      A(e, l, "LSE"), plan_attention_cudnn(e->md) ? "R(DKV1)" : "NULL", (long long)e->B, (long long)(e->T / e->cp), (long long)e->T, (long long)e->nh, (long long)e->nkv,
      (long long)e->hd, (long long)e->vd);
    P(e, "  rt_comm_cp_reduce_scatter(c->comm.cp_comm, PLAN_CP, A(DK), A(DKVG), %lld, %lld, %lld);\n", (long long)e->B,
      (long long)(e->T / e->cp), (long long)e->KV);
    P(e, "  rt_comm_cp_reduce_scatter(c->comm.cp_comm, PLAN_CP, A(DV), A(DKVG + %lld), %lld, %lld, %lld);\n", kvn,
      (long long)e->B, (long long)(e->T / e->cp), (long long)e->VW);
  } else
  P(e, "  rt_attention_backward(R(DQ), R(DK), R(DV), R(DATT), R(%s), R(%s), R(%s), R(%s), R(%s), %lld, %lld, %lld, "
       "%lld, %lld, %lld);\n",
    A(e, l, "Q"), A(e, l, "K"), A(e, l, "V"), A(e, l, "ATT"), A(e, l, "LSE"),
    (long long)e->B, (long long)e->T, (long long)e->nh, (long long)e->nkv, (long long)e->hd, (long long)e->vd);
  if (e->mla) {
    em_mla_backward(e, l);
    em_norm_backward(e, g, dx, mem_printf(e->m, "X%d", l), A(e, l, "RSTD1"), "input_layernorm");
    P(e, "}\n");
    return;
  }
  double theta = e->s->model.attention.rope_theta;
  if (e->rope && llama3(e)) {
    rope_llama3(e, "  ", "DQ", e->nh, "backward");
    rope_llama3(e, "  ", "DK", e->nkv, "backward");
  } else if (e->rope && e->cp > 1) {
    em_rope_span(e, "  ", "backward", "A(DQ)", e->nh, e->hd, e->hd);
    em_rope_span(e, "  ", "backward", "A(DK)", e->nkv, e->hd, e->hd);
  } else if (e->rope) {
    P(e, "  rt_rope_backward(R(DQ), %lld, %lld, %lld, %lld, %.17g);\n", (long long)e->B, (long long)e->T,
      (long long)e->nh, (long long)e->hd, theta);
    P(e, "  rt_rope_backward(R(DK), %lld, %lld, %lld, %lld, %.17g);\n", (long long)e->B, (long long)e->T,
      (long long)e->nkv, (long long)e->hd, theta);
  }
  if (e->qk_norm) qk_norm_backward(e, l);
  const char *ln1 = A(e, l, "LN1");
  static const char *const qkv[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++) {
    const char *key = i == 0 ? "attn.q_proj.weight" : i == 1 ? "attn.k_proj.weight" : "attn.v_proj.weight";
    o = off(e, g, key);
    const char *dproj = i == 2 || !e->qk_norm ? mem_printf(e->m, "D%c", "QKV"[i]) : i ? "DKR" : "DQR";
    P(e, "  %s(R(DLN), DW(%lld), %s, R(%s), R(%s), W(%lld), %lld, %lld, %lld); /* %s_proj */\n", em_dln_gemm(e),
      (long long)o, bias_arg(e, g, key, "DW"), dproj, ln1, (long long)o, N, C, i ? KV : Q, qkv[i]);
  }
  em_norm_backward(e, g, dx, mem_printf(e->m, "X%d", l), A(e, l, "RSTD1"), "input_layernorm");
  P(e, "}\n");
}

