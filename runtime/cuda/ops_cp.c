/* ops_cp.c — context parallelism's ops on the cuda backend (mtrt_ops.h's rt_rope_span_* and
 * rt_attention_span_*, device pointers): RoPE at the tokens' true positions, and the attention of
 * this rank's two query chunks (T / 2 tokens each, at positions lo.. and hi..) against the keys and
 * values of the whole sequences (S tokens, all-gathered by the caller).
 *
 * Through cuDNN where the plan picks it: each chunk of each sequence is one bottom-right causal
 * attention of its T / 2 queries over the keys 0 .. p0 + T/2 − 1 (attn_cudnn.h: s_q < s_kv), a
 * plan per chunk built at start-up (cu_attn_span_prepare). cuDNN writes dK and dV for all of a
 * call's keys, and the second chunk's keys include the first's: the second chunk writes into the
 * caller's dk, dv (zeroed by the step), the first into work (the plan's DKV1, in the attention
 * backward's group of the shared workspace: compiler/attn_ws.c), which is then added in. The lse of chunk c of sequence b is at
 * lse + (2 b + c) · nh · T/2 (cuDNN's b × hq × s_q layout; only this backend reads it). Elsewhere
 * (head dims cuDNN does not serve, the fp32-activation build, $MTC_ATTENTION): kernels.cu's
 * own kernels, whose lse is (B·T, nh): the tiled flash kernels (80-flash.cu, the same kernels as
 * cp 1's with this rank's lo, hi and the whole sequences' keys; one launch for both chunks, 64
 * queries or keys a block) where kernels.cu has them (equal head dims, a multiple of 16 up to 128;
 * T a multiple of 64), else the warp-per-row span kernels (45-context.cu). */
#include <string.h>

#include "cu_internal.h"
#include "mtrt_ops.h"

static void need(int ok, const char *op, const char *what) {
  if (!ok) rt_cuda_fail(op, what);
}

static void rope_span(act *x, int B, int T, int H, int stride, int rd, int64_t lo, int64_t hi, float sign) {
  long long l = lo, h = hi;
  cu_launch(K_ROPE_SPAN, (unsigned)(B * T), 128, (void *[]){&x, &H, &stride, &rd, &sign, &l, &h});
}

/* θ is kernels.cu's ROPE_THETA (the plan's). */
void rt_rope_span_forward(act *x, int B, int T, int H, int stride, int rd, real theta, int64_t lo, int64_t hi) {
  (void)theta;
  rope_span(x, B, T, H, stride, rd, lo, hi, 1.f);
}
void rt_rope_span_backward(act *dx, int B, int T, int H, int stride, int rd, real theta, int64_t lo, int64_t hi) {
  (void)theta;
  rope_span(dx, B, T, H, stride, rd, lo, hi, -1.f);
}

/* One chunk of one sequence for cuDNN: T / 2 queries (rows of nh heads of this rank's T) at positions
 * p0.. against the keys 0 .. p0 + T/2 − 1 (rows of nkv heads, packed). */
static CuAttnShape chunk_shape(int T, int64_t p0, int nh, int nkv, int hd, int vd) {
  CuAttnShape a;
  memset(&a, 0, sizeof a);
  a.b = 1, a.hq = nh, a.hkv = nkv, a.sq = T / 2, a.skv = p0 + T / 2, a.dqk = hd, a.dv = vd;
  a.q = (CuAttnView){(int64_t)T * nh * hd, hd, (int64_t)nh * hd};
  a.k = (CuAttnView){a.skv * nkv * hd, hd, (int64_t)nkv * hd};
  a.v = (CuAttnView){a.skv * nkv * vd, vd, (int64_t)nkv * vd};
  a.o = (CuAttnView){(int64_t)T * nh * vd, vd, (int64_t)nh * vd};
  return a;
}

/* This rank's chunks' first positions (mtrt_ops.h: lo = r T/2, hi = (2 cp − 1 − r) T/2). */
static int64_t chunk_pos(int c, int T) {
  int r = cu.cfg.cp_rank, cp = cu.cfg.cp;
  return (int64_t)(c ? 2 * cp - 1 - r : r) * (T / 2);
}

void cu_attn_span_prepare(void) {
  const RtCudaConfig *f = &cu.cfg;
  int T = f->seq / f->cp;
  for (int c = 0; c < 2; c++) {
    CuAttnShape a = chunk_shape(T, chunk_pos(c, T), f->heads, f->kv_heads, f->head_dim, f->v_head_dim);
    cu_attn_cudnn_prepare(&a);
  }
}

/* The shapes kernels.cu and the runtime's scratch were made for. */
static void check_shape(const char *op, int B, int T, int S, int64_t lo, int64_t hi) {
  need((size_t)B * T == (size_t)cu.cfg.tokens && S == cu.cfg.seq && cu.cfg.cp > 1 && S == cu.cfg.cp * T, op,
       "the shape is not the plan's (RtCudaConfig's tokens, seq, cp)");
  need(lo == chunk_pos(0, T) && hi == chunk_pos(1, T), op, "the chunks are not this rank's (RtCudaConfig's cp_rank)");
}

void rt_attention_span_forward(act *out, real *lse, const act *q, const act *k, const act *v, int B, int T, int S,
                               int64_t lo, int64_t hi, int nh, int nkv, int hd, int vd) {
  check_shape("rt_attention_span_forward", B, T, S, lo, hi);
  if (cu_attention_cudnn()) {
    for (int b = 0; b < B; b++)
      for (int c = 0; c < 2; c++) {
        CuAttnShape a = chunk_shape(T, c ? hi : lo, nh, nkv, hd, vd);
        size_t row = (size_t)b * T + (size_t)c * (T / 2); /* the chunk's first query */
        cu_attn_cudnn_forward(&a, out + row * nh * vd, lse + ((size_t)2 * b + c) * nh * (T / 2), q + row * nh * hd,
                              k + (size_t)b * S * nkv * hd, v + (size_t)b * S * nkv * vd);
      }
    return;
  }
  long long l = lo, h = hi;
  if (cu_attention_flash()) {
    int qld = nh * hd, kld = nkv * hd, vld = nkv * vd;
    cu_launch3(K_FLASH_FORWARD, (unsigned)(T / 64), (unsigned)nh, (unsigned)B, 128,
               (void *[]){&out, &lse, &q, &k, &v, &qld, &kld, &vld, &l, &h});
    return;
  }
  cu_launch(K_ATTENTION_SPAN_FORWARD, cu_blocks((long long)B * T * nh * 32, 128), 128,
            (void *[]){&out, &lse, &q, &k, &v, &l, &h});
}

void rt_attention_span_backward(act *dq, act *dk, act *dv, const act *dout, const act *q, const act *k, const act *v,
                                const act *out, const real *lse, act *work, int B, int T, int S, int64_t lo, int64_t hi,
                                int nh, int nkv, int hd, int vd) {
  check_shape("rt_attention_span_backward", B, T, S, lo, hi);
  need(dq && dk && dv, "rt_attention_span_backward", "dq, dk and dv are required on the cuda backend");
  float *delta = cu.delta;
  if (cu_attention_cudnn()) {
    need(work != NULL, "rt_attention_span_backward", "cuDNN's span backward needs the plan's DKV1 (work)");
    for (int b = 0; b < B; b++) {
      act *dkb = dk + (size_t)b * S * nkv * hd, *dvb = dv + (size_t)b * S * nkv * vd;
      const act *kb = k + (size_t)b * S * nkv * hd, *vb = v + (size_t)b * S * nkv * vd;
      for (int c = 1; c >= 0; c--) { /* the second chunk first: it writes dk, dv of every key the first reads */
        CuAttnShape a = chunk_shape(T, c ? hi : lo, nh, nkv, hd, vd);
        size_t row = (size_t)b * T + (size_t)c * (T / 2);
        act *tk = c ? dkb : work, *tv = c ? dvb : work + (size_t)a.skv * nkv * hd;
        cu_attn_cudnn_backward(&a, dq + row * nh * hd, tk, tv, dout + row * nh * vd, q + row * nh * hd, kb, vb,
                               out + row * nh * vd, lse + ((size_t)2 * b + c) * nh * (T / 2), delta, cu.dqacc);
        if (!c) rt_accumulate(dkb, tk, (size_t)a.skv * nkv * hd), rt_accumulate(dvb, tv, (size_t)a.skv * nkv * vd);
      }
    }
    return;
  }
  long long l = lo, h = hi;
  if (cu_attention_flash()) { /* dq, dk, dv added to (add 1); the key tiles up to the last position */
    int qld = nh * hd, kld = nkv * hd, vld = nkv * vd, add = 1;
    unsigned ktiles = (unsigned)((hi + T / 2 + 63) / 64);
    cu_launch(K_FLASH_BACKWARD_PREP, cu_blocks((long long)B * T * nh, 4), 128, (void *[]){&delta, &dout, &out});
    cu_launch3(K_FLASH_BACKWARD_DQ, (unsigned)(T / 64), (unsigned)nh, (unsigned)B, 128,
               (void *[]){&dq, &dout, &q, &k, &v, &lse, &delta, &qld, &kld, &vld, &l, &h, &add});
    cu_launch3(K_FLASH_BACKWARD_DKV, ktiles, (unsigned)nkv, (unsigned)B, 128,
               (void *[]){&dk, &dv, &dout, &q, &k, &v, &lse, &delta, &qld, &kld, &vld, &l, &h, &add});
    return;
  }
  cu_launch(K_ATTENTION_SPAN_BACKWARD_DQ, cu_blocks((long long)B * T * nh * 32, 128), 128,
            (void *[]){&dq, &delta, &dout, &q, &k, &v, &out, &lse, &l, &h});
  cu_launch(K_ATTENTION_SPAN_BACKWARD_DKV, cu_blocks((long long)B * S * nkv * 32, 128), 128,
            (void *[]){&dk, &dv, &dout, &q, &k, &v, &lse, &delta, &l, &h});
}
