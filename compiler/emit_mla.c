/* emit_mla.c — multi-head latent attention in step.c (DeepSeek-V2, arXiv:2405.04434 §2.1; Hugging
 * Face modeling_deepseek_v3.py, DeepseekV3Attention), composed of the ops every model uses:
 *
 *   q      = q_b_proj(q_a_layernorm(q_a_proj(x)))  (or q_proj(x) without q-LoRA)   (N, nh, nope+rope)
 *   [c, kr] = kv_a_proj_with_mqa(x)                 c (N, kvr) the latent, kr (N, rope)
 *   kvb    = kv_b_proj(kv_a_layernorm(c))           (N, nh, nope+vd): k_nope and v per head
 *   k      = [k_nope, RoPE(kr)] (kr shared by the heads), v; q's rope part rotated
 *   out    = softmax(q kᵀ / sqrt(nope + rope)) v     (N, nh, vd), then o_proj (emit_layer.c)
 *
 * Under model.rope_scaling yarn the RoPE is YaRN's over qk_rope_head_dim and the softmax scale
 * gets mscale(factor, mscale_all_dim)² (HF's DeepseekV3Attention.scaling), applied to k.
 *
 * kv_a_proj_with_mqa runs as two GEMMs over its rows [0, kvr) and [kvr, kvr + rope), so that
 * the latent and the RoPE key land in buffers of their own. The latent norms are RMSNorms over
 * rows of qr or kvr (rt_qk_norm_*, which takes any width). Saved per layer (model.c's MLA saves,
 * of the same names): the pre-norm latents QA and KVL, their 1/rms RSTDQA and RSTDKV; the
 * normalized latents are recomputed in the backward from them. */
#include "emit.h"

static long long ll(int64_t v) { return (long long)v; }

/* YaRN's get_mscale (transformers' modeling_rope_utils.py): 0.1 m ln(s) + 1 for s > 1. */
static double mscale(double s, double m) { return s <= 1 ? 1 : 0.1 * m * log(s) + 1; }

/* rt_rope_strided_*'s arguments after theta: YaRN's factor, original_max_position, beta_fast,
 * beta_slow and attention factor (as emit_layer.c's rope_yarn: get_mscale(factor, mscale) /
 * get_mscale(factor, mscale_all_dim) when both are set, else get_mscale(factor)) under
 * model.rope_scaling yarn; factor 1 (plain RoPE) otherwise. */
static const char *rope_args(Em *e) {
  const RopeScalingSpec *r = &e->s->model.rope_scaling;
  if (!r->present || r->type != ROPE_SCALING_YARN) return "1, 1, 1, 1, 1";
  double attn = r->mscale && r->mscale_all_dim ? mscale(r->factor, r->mscale) / mscale(r->factor, r->mscale_all_dim)
                                               : mscale(r->factor, 1);
  return mem_printf(e->m, "%.17g, %lld, %.17g, %.17g, %.17g", r->factor, (long long)r->original_max_position,
                    r->beta_fast, r->beta_slow, attn);
}

/* The softmax scale's factor beyond 1/sqrt(nope + rope), applied to k (rt_mla_kv_*): HF
 * DeepseekV3Attention's self.scaling × mscale(factor, mscale_all_dim)² under YaRN with
 * mscale_all_dim set; 1 otherwise. */
static double kscale(const Em *e) {
  const RopeScalingSpec *r = &e->s->model.rope_scaling;
  if (!r->present || r->type != ROPE_SCALING_YARN || !r->mscale_all_dim) return 1;
  double m = mscale(r->factor, r->mscale_all_dim);
  return m * m;
}

/* kv_a_proj_with_mqa's rows [r0, r0 + n) as one GEMM of LN1 into out. */
static void kv_a_part(Em *e, int g, const char *ind, const char *ln1, const char *out, int64_t r0, int64_t n,
                      const char *what) {
  int64_t w = off(e, g, "attn.kv_a_proj_with_mqa.weight") + r0 * e->C;
  P(e, "%srt_matmul_forward(R(%s), R(%s), W(%lld), NULL, %lld, %lld, %lld); /* kv_a_proj_with_mqa: %s */\n", ind, out,
    ln1, ll(w), ll(e->N), ll(e->C), ll(n), what);
}

void em_mla_forward(Em *e, int l) {
  int g = e->layer_dense[l];
  long long N = e->N, C = e->C;
  const char *ln1 = A(e, l, "LN1"), *q = A(e, l, "Q"), *k = A(e, l, "K"), *v = A(e, l, "V");
  const char *kvl = A(e, l, "KVL");
  /* the latents and their norms: outside `if (!recompute)` under selective checkpointing, whose
   * backward needs them (class other) */
  if (e->qr) {
    const char *qa = A(e, l, "QA");
    P(e, "  rt_matmul_forward(R(%s), R(%s), W(%lld), NULL, %lld, %lld, %lld); /* q_a_proj */\n", qa, ln1,
      ll(off(e, g, "attn.q_a_proj.weight")), N, C, ll(e->qr));
    P(e, "  rt_qk_norm_forward(R(WS_QAN), R(%s), R(%s), W(%lld), %lld, %lld, EPS); /* q_a_layernorm */\n",
      A(e, l, "RSTDQA"), qa, ll(off(e, g, "attn.q_a_layernorm.weight")), N, ll(e->qr));
  }
  kv_a_part(e, g, "  ", ln1, kvl, 0, e->kvr, "the latent");
  P(e, "  rt_qk_norm_forward(R(WS_KVN), R(%s), R(%s), W(%lld), %lld, %lld, EPS); /* kv_a_layernorm */\n",
    A(e, l, "RSTDKV"), kvl, ll(off(e, g, "attn.kv_a_layernorm.weight")), N, ll(e->kvr));
  const char *ind = "  ";
  if (e->ac == AC_SELECTIVE) {
    P(e, "  if (!recompute) { /* selective checkpointing: q, k, v and the attention core are saved */\n");
    ind = "    ";
  }
  if (e->qr)
    P(e, "%srt_matmul_forward(R(%s), R(WS_QAN), W(%lld), NULL, %lld, %lld, %lld); /* q_b_proj */\n", ind, q,
      ll(off(e, g, "attn.q_b_proj.weight")), N, ll(e->qr), ll(e->Q));
  else
    P(e, "%srt_matmul_forward(R(%s), R(%s), W(%lld), NULL, %lld, %lld, %lld); /* q_proj */\n", ind, q, ln1,
      ll(off(e, g, "attn.q_proj.weight")), N, C, ll(e->Q));
  kv_a_part(e, g, ind, ln1, "WS_KRP", e->kvr, e->rope_dim, "the RoPE key");
  P(e, "%srt_matmul_forward(R(WS_KVB), R(WS_KVN), W(%lld), NULL, %lld, %lld, %lld); /* kv_b_proj */\n", ind,
    ll(off(e, g, "attn.kv_b_proj.weight")), N, ll(e->kvr), ll(e->nh * (e->nope + e->vd)));
  double theta = e->s->model.attention.rope_theta;
  const char *ra = rope_args(e);
  if (e->cp > 1) { /* (no YaRN with context parallelism: em_cp_unsupported) */
    em_rope_span(e, ind, "forward", "A(WS_KRP)", 1, e->rope_dim, e->rope_dim);
    em_rope_span(e, ind, "forward", mem_printf(e->m, "A(%s + %lld)", q, ll(e->nope)), e->nh, e->hd, e->rope_dim);
  } else {
  P(e, "%srt_rope_strided_forward(R(WS_KRP), %lld, %lld, 1, %lld, %lld, %.17g, %s); /* B, T, heads, stride, rope dims, "
       "theta, yarn factor, original_max_position, beta_fast, beta_slow, attention factor (factor 1: none) */\n", ind,
    ll(e->B), ll(e->T), ll(e->rope_dim), ll(e->rope_dim), theta, ra);
  P(e, "%srt_rope_strided_forward(A(%s + %lld), %lld, %lld, %lld, %lld, %lld, %.17g, %s); /* q's rope part */\n", ind, q,
    ll(e->nope), ll(e->B), ll(e->T), ll(e->nh), ll(e->hd), ll(e->rope_dim), theta, ra);
  }
  P(e, "%srt_mla_kv_forward(R(%s), R(%s), R(WS_KVB), R(WS_KRP), %lld, %lld, %lld, %lld, %lld, %.17g); /* N, heads, nope, "
       "rope, v_head_dim, softmax scale factor */\n", ind, k, v, N, ll(e->nh), ll(e->nope), ll(e->rope_dim), ll(e->vd),
    kscale(e));
  /* the caller writes the attention core and closes the block */
}

/* The backward, q's part first and then k's and v's, so that each part's buffers reuse the bytes
 * of the attention gradients the other has consumed (compiler/attn_ws.c lays them out: its OP_*
 * are these calls in this order); DLN gathers q_a_proj's (or q_proj's), then the latent's and the
 * RoPE key's contributions, in that order. */
void em_mla_backward(Em *e, int l) {
  int g = e->layer_dense[l];
  long long N = e->N, C = e->C, qr = e->qr, kvr = e->kvr, rd = e->rope_dim;
  double theta = e->s->model.attention.rope_theta;
  const char *ln1 = A(e, l, "LN1"), *kvl = A(e, l, "KVL");
  int64_t wkvb = off(e, g, "attn.kv_b_proj.weight"), wkva = off(e, g, "attn.kv_a_proj_with_mqa.weight");
  int64_t wkvn = off(e, g, "attn.kv_a_layernorm.weight");
  const char *ra = rope_args(e);
  if (e->cp > 1) em_rope_span(e, "  ", "backward", mem_printf(e->m, "A(DQ + %lld)", ll(e->nope)), e->nh, e->hd, rd);
  else
  P(e, "  rt_rope_strided_backward(A(DQ + %lld), %lld, %lld, %lld, %lld, %lld, %.17g, %s); /* q's rope part */\n",
    ll(e->nope), ll(e->B), ll(e->T), ll(e->nh), ll(e->hd), rd, theta, ra);
  if (qr) { /* q_b_proj and q_a_layernorm, the normalized latent recomputed (same values, same 1/rms) */
    const char *qa = A(e, l, "QA");
    int64_t wqb = off(e, g, "attn.q_b_proj.weight"), wqn = off(e, g, "attn.q_a_layernorm.weight");
    int64_t w = off(e, g, "attn.q_a_proj.weight");
    P(e, "  rt_qk_norm_forward(R(RQAN), R(%s), R(%s), W(%lld), %lld, %lld, EPS); /* q_a_layernorm again */\n",
      A(e, l, "RSTDQA"), qa, ll(wqn), N, qr);
    P(e, "  rt_matmul_backward_set(R(DQAN), DW(%lld), NULL, R(DQ), R(RQAN), W(%lld), %lld, %lld, %lld); /* q_b_proj */\n",
      ll(wqb), ll(wqb), N, qr, ll(e->Q));
    P(e, "  rt_zero(R(DQA), %lld);\n", N * qr);
    P(e, "  rt_qk_norm_backward(R(DQA), DW(%lld), R(DQAN), R(%s), W(%lld), R(%s), %lld, %lld); /* q_a_layernorm */\n",
      ll(wqn), qa, ll(wqn), A(e, l, "RSTDQA"), N, qr);
    P(e, "  %s(R(DLN), DW(%lld), NULL, R(DQA), R(%s), W(%lld), %lld, %lld, %lld); /* q_a_proj */\n", em_dln_gemm(e),
      ll(w), ln1, ll(w), N, C, qr);
  } else {
    int64_t w = off(e, g, "attn.q_proj.weight");
    P(e, "  %s(R(DLN), DW(%lld), NULL, R(DQ), R(%s), W(%lld), %lld, %lld, %lld); /* q_proj */\n", em_dln_gemm(e),
      ll(w), ln1, ll(w), N, C, ll(e->Q));
  }
  P(e, "  rt_zero(R(DKVB), %lld);\n  rt_zero(R(DKRP), %lld);\n", N * e->nh * (e->nope + e->vd), N * rd);
  P(e, "  rt_mla_kv_backward(R(DKVB), R(DKRP), R(DK), R(DV), %lld, %lld, %lld, %lld, %lld, %.17g);\n", N, ll(e->nh),
    ll(e->nope), rd, ll(e->vd), kscale(e));
  if (e->cp > 1) em_rope_span(e, "  ", "backward", "A(DKRP)", 1, rd, rd);
  else
  P(e, "  rt_rope_strided_backward(R(DKRP), %lld, %lld, 1, %lld, %lld, %.17g, %s);\n", ll(e->B), ll(e->T), rd, rd, theta,
    ra);
  /* kv_b_proj and kv_a_layernorm, the normalized latent recomputed (same values, same 1/rms) */
  P(e, "  rt_qk_norm_forward(R(RKVN), R(%s), R(%s), W(%lld), %lld, %lld, EPS); /* kv_a_layernorm again */\n",
    A(e, l, "RSTDKV"), kvl, ll(wkvn), N, kvr);
  P(e, "  rt_matmul_backward_set(R(DKVN), DW(%lld), NULL, R(DKVB), R(RKVN), W(%lld), %lld, %lld, %lld); /* kv_b_proj */\n",
    ll(wkvb), ll(wkvb), N, kvr, ll(e->nh * (e->nope + e->vd)));
  P(e, "  rt_zero(R(DKVL), %lld);\n", N * kvr);
  P(e, "  rt_qk_norm_backward(R(DKVL), DW(%lld), R(DKVN), R(%s), W(%lld), R(%s), %lld, %lld); /* kv_a_layernorm */\n",
    ll(wkvn), kvl, ll(wkvn), A(e, l, "RSTDKV"), N, kvr);
  P(e, "  %s(R(DLN), DW(%lld), NULL, R(DKVL), R(%s), W(%lld), %lld, %lld, %lld); /* kv_a_proj_with_mqa: "
       "the latent */\n", em_dln_gemm(e), ll(wkva), ln1, ll(wkva), N, C, kvr);
  P(e, "  %s(R(DLN), DW(%lld), NULL, R(DKRP), R(%s), W(%lld), %lld, %lld, %lld); /* kv_a_proj_with_mqa: "
       "the RoPE key */\n", em_dln_gemm(e), ll(wkva + kvr * C), ln1, ll(wkva + kvr * C), N, C, rd);
}
