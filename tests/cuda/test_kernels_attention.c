/* test_kernels_attention.c — test_kernels' checks of RoPE, MLA's keys and values, causal GQA
 * attention and context parallelism's span attention, flash or simple as the pass says
 * (templates/kernels/20-rope.cu, 40-attention.cu, 45-context.cu, 80-flash.cu, or cuDNN's:
 * runtime/cuda/attn_cudnn.c, ops_cp.c): the cuda ops against the cpu ops (test_kernels.h). */
#include "test_kernels.h"
#if MTRT_ACT_IS_BF16
#include "cuda/attn_cudnn.h" /* cuDNN's attention on a query chunk */
#endif

/* RoPE in place, forward and backward: plain, Llama 3.1's scaling, YaRN, and MLA's on a part of
 * each head (strided); MLA's keys and values from kv_b_proj's output and the shared RoPE key,
 * forward and backward (added to). */
void test_rope(void) {
  size_t nq = (size_t)N * NH * HD, nk = (size_t)N * NKV * HD;
  float *q = rnd(nq, 2), *k = rnd(nk, 2);
  act *dq = deva(q, nq), *dk = deva(k, nk);
  ref_rope_forward(q, B, T, NH, HD, THETA), rt_rope_forward(dq, B, T, NH, HD, THETA);
  check_dev("rope_forward", dq, q, nq, TOL);
  ref_rope_backward(k, B, T, NKV, HD, THETA), rt_rope_backward(dk, B, T, NKV, HD, THETA);
  check_dev("rope_backward", dk, k, nk, TOL);
  /* Llama 3.1's scaling with original_max_position 64 over T 128: the pairs' wavelengths fall
   * below 16 (kept), between 16 and 64 (blended) and above 64 (divided by 8) */
  ref_rope_llama3_forward(q, B, T, NH, HD, THETA, 8, 1, 4, 64), rt_rope_llama3_forward(dq, B, T, NH, HD, THETA, 8, 1, 4, 64);
  check_dev("rope_llama3_forward", dq, q, nq, TOL);
  ref_rope_llama3_backward(k, B, T, NKV, HD, THETA, 8, 1, 4, 64), rt_rope_llama3_backward(dk, B, T, NKV, HD, THETA, 8, 1, 4, 64);
  check_dev("rope_llama3_backward", dk, k, nk, TOL);
  /* YaRN: factor 4 over original_max_position 32, beta 32 / 1 (the ramp inside HD's pairs),
   * attention factor 1.1386 (= 0.1 ln 4 + 1) */
  ref_rope_yarn_forward(q, B, T, NH, HD, THETA, 4, 32, 32, 1, 1.1386f), rt_rope_yarn_forward(dq, B, T, NH, HD, THETA, 4, 32, 32, 1, 1.1386f);
  check_dev("rope_yarn_forward", dq, q, nq, TOL);
  ref_rope_yarn_backward(k, B, T, NKV, HD, THETA, 4, 32, 32, 1, 1.1386f), rt_rope_yarn_backward(dk, B, T, NKV, HD, THETA, 4, 32, 32, 1, 1.1386f);
  check_dev("rope_yarn_backward", dk, k, nk, TOL);
  /* MLA: RoPE on channels [8, 24) of each head (stride HD), and the keys and values built from
   * kv_b_proj's output (nope 8, rope 16, v 24 per head) and the shared RoPE key */
  ref_rope_strided_forward(q + 8, B, T, NH, HD, 16, THETA, 1, 1, 1, 1, 1),
      rt_rope_strided_forward(dq + 8, B, T, NH, HD, 16, THETA, 1, 1, 1, 1, 1);
  check_dev("rope_strided_forward", dq, q, nq, TOL);
  ref_rope_strided_backward(k + 8, B, T, NKV, HD, 16, THETA, 1, 1, 1, 1, 1),
      rt_rope_strided_backward(dk + 8, B, T, NKV, HD, 16, THETA, 1, 1, 1, 1, 1);
  check_dev("rope_strided_backward", dk, k, nk, TOL);
  /* with YaRN over the 16 rotated channels (factor 4, orig 32, beta 32 / 1, attention factor 1.1386) */
  ref_rope_strided_forward(q + 8, B, T, NH, HD, 16, THETA, 4, 32, 32, 1, 1.1386f),
      rt_rope_strided_forward(dq + 8, B, T, NH, HD, 16, THETA, 4, 32, 32, 1, 1.1386f);
  check_dev("rope_strided_forward yarn", dq, q, nq, TOL);
  ref_rope_strided_backward(k + 8, B, T, NKV, HD, 16, THETA, 4, 32, 32, 1, 1.1386f),
      rt_rope_strided_backward(dk + 8, B, T, NKV, HD, 16, THETA, 4, 32, 32, 1, 1.1386f);
  check_dev("rope_strided_backward yarn", dk, k, nk, TOL);
  enum { MNOPE = 8, MROPE = 16, MVD = 24 };
  size_t nb = (size_t)N * NH * (MNOPE + MVD), nmk = (size_t)N * NH * (MNOPE + MROPE), nmv = (size_t)N * NH * MVD;
  float *kvb = rnd(nb, 2), *kr = rnd((size_t)N * MROPE, 2), *mk = host(nmk), *mv = host(nmv);
  act *dkvb_ = deva(kvb, nb), *dkr_ = deva(kr, (size_t)N * MROPE), *dmk = deva(NULL, nmk), *dmv = deva(NULL, nmv);
  ref_mla_kv_forward(mk, mv, kvb, kr, N, NH, MNOPE, MROPE, MVD, 1.5f),
      rt_mla_kv_forward(dmk, dmv, dkvb_, dkr_, N, NH, MNOPE, MROPE, MVD, 1.5f);
  check_dev("mla_kv_forward k", dmk, mk, nmk, TOL);
  check_dev("mla_kv_forward v", dmv, mv, nmv, TOL);
  float *gk = rnd(nmk, 1), *gv = rnd(nmv, 1);
  act *dgk = deva(gk, nmk), *dgv = deva(gv, nmv);
  ref_mla_kv_backward(kvb, kr, gk, gv, N, NH, MNOPE, MROPE, MVD, 1.5f),
      rt_mla_kv_backward(dkvb_, dkr_, dgk, dgv, N, NH, MNOPE, MROPE, MVD, 1.5f);
  check_dev("mla_kv_backward dkvb", dkvb_, kvb, nb, TOL);
  check_dev("mla_kv_backward dkr", dkr_, kr, (size_t)N * MROPE, TOL);
}


/* Causal GQA attention of head dims hd (q, k) and vd (v): lse is (B, NH, T) on the cpu, and on the
 * GPU (tokens, NH) from the own kernels, (B, NH, T) from cuDNN (each backend reads only its own);
 * each backward runs from its own forward's out and lse. */
static void attention(const Pass *p, const char *name, int hd, int vd) {
  size_t nq = (size_t)N * NH * hd, nk = (size_t)N * NKV * hd, no = (size_t)N * NH * vd, nv = (size_t)N * NKV * vd;
  float *q = rnd(nq, 4), *k = rnd(nk, 4), *v = rnd(nv, 2), *out = host(no), *lse = host((size_t)N * NH);
  /* every backend writes dq, dk, dv (mtrt_ops.h): they start non-zero */
  float *dy = rnd(no, 2), *lse_t = host((size_t)N * NH);
  float *dq = rnd(nq, 1), *dk = rnd(nk, 1), *dv = rnd(nv, 1);
  float *dlse = devf(NULL, (size_t)N * NH);
  act *dq_ = deva(q, nq), *dk_ = deva(k, nk), *dv_ = deva(v, nv), *dout = deva(NULL, no);
  act *ddy = deva(dy, no), *ddq = deva(dq, nq), *ddk = deva(dk, nk), *ddv = deva(dv, nv);
  char what[96];
  ref_attention_forward(out, lse, q, k, v, B, T, NH, NKV, hd, vd), rt_attention_forward(dout, dlse, dq_, dk_, dv_, B, T, NH, NKV, hd, vd);
  snprintf(what, sizeof what, "%s forward out", name), check_dev(what, dout, out, no, p->attn_tol);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++)
        lse_t[p->cudnn ? ((size_t)b * NH + h) * T + t : ((size_t)b * T + t) * NH + h] = lse[((size_t)b * NH + h) * T + t];
  snprintf(what, sizeof what, "%s forward lse", name), check_dev(what, dlse, lse_t, (size_t)N * NH, p->attn_tol);
  ref_attention_backward(dq, dk, dv, dy, q, k, v, out, lse, B, T, NH, NKV, hd, vd);
  rt_attention_backward(ddq, ddk, ddv, ddy, dq_, dk_, dv_, dout, dlse, B, T, NH, NKV, hd, vd);
  snprintf(what, sizeof what, "%s backward dq", name), check_dev(what, ddq, dq, nq, 2 * p->attn_tol);
  snprintf(what, sizeof what, "%s backward dk", name), check_dev(what, ddk, dk, nk, 2 * p->attn_tol);
  snprintf(what, sizeof what, "%s backward dv", name), check_dev(what, ddv, dv, nv, 2 * p->attn_tol);
}

/* The fused projection's rows q | k | v (rt_rope_qkv_*, rt_attention_qkv_*: strided views for the
 * own kernels and cuDNN alike): RoPE, forward out and lse, the backward's whole dqkv (written over
 * non-zero values). */
static void attention_qkv(const Pass *p) {
  enum { W = (NH + 2 * NKV) * HD };
  size_t nr = (size_t)N * W, no = (size_t)N * NH * HD;
  float *qkv = rnd(nr, 4), *out = host(no), *lse = host((size_t)N * NH), *dy = rnd(no, 2), *dqkv = rnd(nr, 1);
  float *lse_t = host((size_t)N * NH), *dlse = devf(NULL, (size_t)N * NH);
  act *dqkv_in = deva(qkv, nr), *dout = deva(NULL, no), *ddy = deva(dy, no), *ddqkv = deva(dqkv, nr);
  ref_rope_qkv_forward(qkv, B, T, NH, NKV, HD, THETA), rt_rope_qkv_forward(dqkv_in, B, T, NH, NKV, HD, THETA);
  check_dev("rope_qkv_forward", dqkv_in, qkv, nr, TOL);
  for (size_t i = 0; i < nr; i++) qkv[i] = act_exact(qkv[i]); /* both sides from the same rotated rows */
  dqkv_in = deva(qkv, nr);
  ref_attention_qkv_forward(out, lse, qkv, B, T, NH, NKV, HD), rt_attention_qkv_forward(dout, dlse, dqkv_in, B, T, NH, NKV, HD);
  check_dev("attention qkv forward out", dout, out, no, p->attn_tol);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++)
        lse_t[p->cudnn ? ((size_t)b * NH + h) * T + t : ((size_t)b * T + t) * NH + h] = lse[((size_t)b * NH + h) * T + t];
  check_dev("attention qkv forward lse", dlse, lse_t, (size_t)N * NH, p->attn_tol);
  ref_attention_qkv_backward(dqkv, dy, qkv, out, lse, B, T, NH, NKV, HD);
  rt_attention_qkv_backward(ddqkv, ddy, dqkv_in, dout, dlse, B, T, NH, NKV, HD);
  check_dev("attention qkv backward dqkv", ddqkv, dqkv, nr, 2 * p->attn_tol);
  ref_rope_qkv_backward(dqkv, B, T, NH, NKV, HD, THETA), rt_rope_qkv_backward(ddqkv, B, T, NH, NKV, HD, THETA);
  check_dev("rope_qkv_backward", ddqkv, dqkv, nr, 2 * p->attn_tol);
}

#if MTRT_ACT_IS_BF16
/* cuDNN's attention of the last SQ queries of each sequence against all T keys (bottom-right
 * causal: context parallelism's query chunk), the queries, output and gradients strided views
 * into the whole sequence's buffers: equal to the last SQ rows of the whole causal attention, and,
 * with dO zero on the earlier rows, dK and dV equal to the whole backward's. */
static void attention_chunk(const Pass *p) {
  enum { SQ = T / 2 };
  size_t nq = (size_t)N * NH * HD, nk = (size_t)N * NKV * HD;
  float *q = rnd(nq, 4), *k = rnd(nk, 4), *v = rnd(nk, 2), *out = host(nq), *lse = host((size_t)N * NH);
  float *dy = rnd(nq, 2), *dq = host(nq), *dk = host(nk), *dv = host(nk);
  for (int b = 0; b < B; b++) memset(dy + (size_t)b * T * NH * HD, 0, sizeof(float) * (T - SQ) * NH * HD);
  ref_attention_forward(out, lse, q, k, v, B, T, NH, NKV, HD, HD);
  ref_attention_backward(dq, dk, dv, dy, q, k, v, out, lse, B, T, NH, NKV, HD, HD);
  float *zero = host(nq);
  act *dq_ = deva(q, nq), *dk_ = deva(k, nk), *dv_ = deva(v, nk), *dout = deva(zero, nq), *ddy = deva(dy, nq);
  act *ddq = deva(zero, nq), *ddk = deva(NULL, nk), *ddv = deva(NULL, nk);
  float *dlse = devf(NULL, (size_t)B * NH * SQ), *delta = devf(NULL, (size_t)B * NH * SQ);
  float *acc = devf(NULL, (size_t)B * NH * SQ * HD);
  CuAttnShape a;
  memset(&a, 0, sizeof a);
  a.b = B, a.hq = NH, a.hkv = NKV, a.sq = SQ, a.skv = T, a.dqk = a.dv = HD;
  a.q = a.o = (CuAttnView){(int64_t)T * NH * HD, HD, NH * HD};
  a.k = a.v = (CuAttnView){(int64_t)T * NKV * HD, HD, NKV * HD};
  size_t skip = (size_t)(T - SQ) * NH * HD; /* the chunk's first query in each sequence */
  cu_attn_cudnn_forward(&a, dout + skip, dlse, dq_ + skip, dk_, dv_);
  cu_attn_cudnn_backward(&a, ddq + skip, ddk, ddv, ddy + skip, dq_ + skip, dk_, dv_, dout + skip, dlse, delta, acc);
  /* the references' last SQ rows; the first T − SQ rows stay 0 on the device (uploaded zeros) */
  float *ro = host(nq), *rq = host(nq), *rl = host((size_t)B * NH * SQ);
  for (int b = 0; b < B; b++) {
    size_t at = (size_t)b * T * NH * HD + skip, n = (size_t)SQ * NH * HD;
    memcpy(ro + at, out + at, sizeof(float) * n), memcpy(rq + at, dq + at, sizeof(float) * n);
    for (int h = 0; h < NH; h++)
      memcpy(rl + ((size_t)b * NH + h) * SQ, lse + ((size_t)b * NH + h) * T + (T - SQ), sizeof(float) * SQ);
  }
  check_dev("attention chunk forward out", dout, ro, nq, p->attn_tol);
  check_dev("attention chunk forward lse", dlse, rl, (size_t)B * NH * SQ, p->attn_tol);
  check_dev("attention chunk backward dq", ddq, rq, nq, 2 * p->attn_tol);
  check_dev("attention chunk backward dk", ddk, dk, nk, 2 * p->attn_tol);
  check_dev("attention chunk backward dv", ddv, dv, nk, 2 * p->attn_tol);
}
#endif

/* GQA at kernels.cu's head dim; through cuDNN also MLA's unequal q/k and v head dims (the own
 * kernels have theirs compiled in) and a query chunk against a longer key sequence. */
void test_attention(const Pass *p) {
  attention(p, "attention", HD, HD);
  attention_qkv(p);
  if (p->cudnn) attention(p, "attention mla", MLA_HD, MLA_VD);
#if MTRT_ACT_IS_BF16
  if (p->cudnn) attention_chunk(p);
#endif
}

/* Context parallelism's span attention (mtrt_ops.h's rt_attention_span_*: runtime/cuda/ops_cp.c
 * over 80-flash.cu's tiled kernels, 45-context.cu's warp-per-row ones or cuDNN's chunks, as the
 * pass says) of rank r of CP: its CP_T queries of each sequence at positions lo.. and hi.. against
 * the CP_S keys and values of the whole sequences, GQA, at test_kernels.h's uneven shape.
 * Forward out and lse; backward dq, dk, dv from each side's own out and lse. The own kernels add
 * into dq, dk, dv (mtrt_ops.h): they start non-zero; cuDNN's chunks write them (the step zeroes
 * them first): they start at zero. lse is (B·CP_T, NH) from the own kernels, chunk c of sequence b
 * at ((2 b + c) NH + h) CP_T/2 from cuDNN (ops_cp.c). */
void test_attention_span(const Pass *p, int r) {
  enum { HT = CP_T / 2, NQ = B * CP_T * NH * HD, NK = B * CP_S * NKV * HD, NL = B * CP_T * NH };
  int64_t lo = (int64_t)r * HT, hi = (int64_t)(2 * CP - 1 - r) * HT;
  float *q = rnd(NQ, 4), *k = rnd(NK, 4), *v = rnd(NK, 2), *dy = rnd(NQ, 2), *out = host(NQ), *lse = host(NL);
  float *dq = p->cudnn ? host(NQ) : rnd(NQ, 1), *dk = p->cudnn ? host(NK) : rnd(NK, 1), *dv = p->cudnn ? host(NK) : rnd(NK, 1);
  act *dq_ = deva(q, NQ), *dk_ = deva(k, NK), *dv_ = deva(v, NK), *ddy = deva(dy, NQ), *dout = deva(NULL, NQ);
  act *ddq = deva(dq, NQ), *ddk = deva(dk, NK), *ddv = deva(dv, NK);
  act *work = p->cudnn ? deva(NULL, (size_t)CP_S / 2 * NKV * 2 * HD) : NULL; /* the plan's DKV1 */
  float *dlse = devf(NULL, NL), *lse_t = host(NL);
  char what[96];
  ref_attention_span_forward(out, lse, q, k, v, B, CP_T, CP_S, lo, hi, NH, NKV, HD, HD);
  rt_attention_span_forward(dout, dlse, dq_, dk_, dv_, B, CP_T, CP_S, lo, hi, NH, NKV, HD, HD);
  snprintf(what, sizeof what, "attention span r%d forward out", r), check_dev(what, dout, out, NQ, p->attn_tol);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < CP_T; t++)
        lse_t[p->cudnn ? ((size_t)(2 * b + t / HT) * NH + h) * HT + t % HT : ((size_t)b * CP_T + t) * NH + h] =
            lse[((size_t)b * NH + h) * CP_T + t];
  snprintf(what, sizeof what, "attention span r%d forward lse", r), check_dev(what, dlse, lse_t, NL, p->attn_tol);
  ref_attention_span_backward(dq, dk, dv, dy, q, k, v, out, lse, NULL, B, CP_T, CP_S, lo, hi, NH, NKV, HD, HD);
  rt_attention_span_backward(ddq, ddk, ddv, ddy, dq_, dk_, dv_, dout, dlse, work, B, CP_T, CP_S, lo, hi, NH, NKV, HD, HD);
  snprintf(what, sizeof what, "attention span r%d backward dq", r), check_dev(what, ddq, dq, NQ, 2 * p->attn_tol);
  snprintf(what, sizeof what, "attention span r%d backward dk", r), check_dev(what, ddk, dk, NK, 2 * p->attn_tol);
  snprintf(what, sizeof what, "attention span r%d backward dv", r), check_dev(what, ddv, dv, NK, 2 * p->attn_tol);
}
