/* ops_attention.c — the cpu backend's causal GQA attention (mtrt_ops.h), plain and over a context-
 * parallel span, as GEMMs. For each sequence, query head and tile of up to ATT_TQ queries at
 * consecutive positions, the keys 0..(last position) are visited in blocks of ATT_TK: the scores
 * of a block are one GEMM (q kᵀ), the block's share of the output another (p v). The forward
 * keeps a running max and sum per query and rescales the tile's output when the max grows (the
 * online softmax of Milakov & Gimelshein 2018, as in FlashAttention); the backward recomputes
 * the probabilities from the saved log-sum-exp and runs three GEMMs per block for dq, dk and dv
 * (Dao, FlashAttention-2, Algorithm 2). q, k and v may be strided views of one fused q | k | v row
 * (rt_attention_qkv_*). Scratch: two tiles of ATT_TQ × ATT_TK on the stack. */
#include <math.h>
#include <string.h>

#include "gemm.h"

enum { ATT_TQ = 64, ATT_TK = 256 };

/* A tile's queries: rows t0.. of T tokens, m of them, at positions pos0.. (consecutive). */
typedef struct {
  int t0, m;
  int64_t pos0;
} Tile;

/* The next tile of the span's T tokens from row t, inside one of its two chunks (rows < T/2 at
 * lo + t, the rest at hi + t − T/2; mtrt_ops.h). */
static Tile tile_at(int t, int T, int64_t lo, int64_t hi) {
  int half = T / 2, end = t < half ? half : T, m = end - t < ATT_TQ ? end - t : ATT_TQ;
  return (Tile){t, m, t < half ? lo + t : hi + (t - half)};
}

/* How many of a block's n keys from j0 the query at position pos sees (keys 0..pos: causal). */
static int visible(int64_t pos, int64_t j0, int n) {
  int64_t v = pos + 1 - j0;
  return v < 0 ? 0 : v < n ? (int)v : n;
}

/* p[i][j] = exp(s[i][j] − base[i]) for key j0 + j at or before query i's position (pos0 + i),
 * else 0; m × n, row stride n. */
static void masked_exp(real *p, const real *s, const real *base, int m, int n, int64_t pos0, int64_t j0) {
  for (int i = 0; i < m; i++) {
    int valid = visible(pos0 + i, j0, n);
    const real *si = s + (size_t)i * n;
    real *pi = p + (size_t)i * n;
    for (int j = 0; j < valid; j++) pi[j] = EXP(si[j] - base[i]);
    for (int j = valid; j < n; j++) pi[j] = 0;
  }
}

/* rt_attention_span_forward with the rows of q, k and v ldq, ldk and ldv values apart (a fused
 * q | k | v row's width, or each one's own). */
static void span_forward(act *out, real *lse, const act *q, const act *k, const act *v, int B, int T, int S, int64_t lo,
                         int64_t hi, int nh, int nkv, int hd, int vd, int ldq, int ldk, int ldv) {
  real scale = 1 / SQRT((real)hd), s[ATT_TQ * ATT_TK], p[ATT_TQ * ATT_TK], mx[ATT_TQ], sum[ATT_TQ], base[ATT_TQ];
  int group = nh / nkv, ldo = nh * vd;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++)
      for (int t = 0; t < T;) {
        Tile tl = tile_at(t, T, lo, hi);
        const real *qt = q + ((size_t)b * T + tl.t0) * ldq + (size_t)h * hd;
        const real *kb = k + (size_t)b * S * ldk + (size_t)(h / group) * hd;
        const real *vb = v + (size_t)b * S * ldv + (size_t)(h / group) * vd;
        real *o = out + ((size_t)b * T + tl.t0) * ldo + (size_t)h * vd;
        int64_t keys = tl.pos0 + tl.m; /* keys 0..pos of the tile's last query */
        for (int i = 0; i < tl.m; i++) mx[i] = -INFINITY, sum[i] = 0, memset(o + (size_t)i * ldo, 0, sizeof(real) * vd);
        for (int64_t j0 = 0; j0 < keys; j0 += ATT_TK) {
          int n = keys - j0 < ATT_TK ? (int)(keys - j0) : ATT_TK;
          GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, tl.m, n, hd, scale, qt, ldq, kb + (size_t)j0 * ldk, ldk, 0, s,
               n);
          for (int i = 0; i < tl.m; i++) { /* the new max of each row over its visible keys */
            int valid = visible(tl.pos0 + i, j0, n);
            real m = mx[i];
            for (int j = 0; j < valid; j++) m = s[(size_t)i * n + j] > m ? s[(size_t)i * n + j] : m;
            real corr = EXP(mx[i] - m); /* 0 on the first block (mx = -inf), 1 when the max holds */
            if (corr != 1) {
              sum[i] *= corr;
              for (int d = 0; d < vd; d++) o[(size_t)i * ldo + d] *= corr;
            }
            mx[i] = base[i] = m;
          }
          masked_exp(p, s, base, tl.m, n, tl.pos0, j0);
          for (int i = 0; i < tl.m; i++)
            for (int j = 0; j < n; j++) sum[i] += p[(size_t)i * n + j];
          GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, tl.m, vd, n, 1, p, n, vb + (size_t)j0 * ldv, ldv, 1, o, ldo);
        }
        for (int i = 0; i < tl.m; i++) {
          for (int d = 0; d < vd; d++) o[(size_t)i * ldo + d] /= sum[i];
          lse[((size_t)b * nh + h) * T + tl.t0 + i] = mx[i] + LOG(sum[i]);
        }
        t += tl.m;
      }
}

void rt_attention_span_forward(act *out, real *lse, const act *q, const act *k, const act *v, int B, int T, int S,
                               int64_t lo, int64_t hi, int nh, int nkv, int hd, int vd) {
  span_forward(out, lse, q, k, v, B, T, S, lo, hi, nh, nkv, hd, vd, nh * hd, nkv * hd, nkv * vd);
}

void rt_attention_forward(act *out, real *lse, const act *q, const act *k, const act *v, int B, int T, int nh,
                          int nkv, int hd, int vd) {
  rt_attention_span_forward(out, lse, q, k, v, B, T, T, 0, T / 2, nh, nkv, hd, vd);
}

/* With P = softmax(S), D_i = Σ dO·O: dS = P (dO vᵀ − D); dq += scale dS k; dk += scale dSᵀ q;
 * dv += Pᵀ dO (Dao et al., FlashAttention-2, Algorithm 2): ADDS into dq, dk, dv (NULL: not
 * computed), whose rows are ldq, ldk and ldv values apart as q's, k's and v's. */
static void span_backward(act *dq, act *dk, act *dv, const act *dout, const act *q, const act *k, const act *v,
                          const act *out, const real *lse, int B, int T, int S, int64_t lo, int64_t hi, int nh, int nkv,
                          int hd, int vd, int ldq, int ldk, int ldv) {
  real scale = 1 / SQRT((real)hd), s[ATT_TQ * ATT_TK], p[ATT_TQ * ATT_TK], D[ATT_TQ], l[ATT_TQ];
  int group = nh / nkv, ldo = nh * vd;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++)
      for (int t = 0; t < T;) {
        Tile tl = tile_at(t, T, lo, hi);
        size_t qrow = ((size_t)b * T + tl.t0) * ldq + (size_t)h * hd;
        size_t orow = ((size_t)b * T + tl.t0) * ldo + (size_t)h * vd;
        size_t krow = (size_t)b * S * ldk + (size_t)(h / group) * hd;
        size_t vrow = (size_t)b * S * ldv + (size_t)(h / group) * vd;
        int64_t keys = tl.pos0 + tl.m;
        for (int i = 0; i < tl.m; i++) {
          const real *dd = dout + orow + (size_t)i * ldo, *oo = out + orow + (size_t)i * ldo;
          real acc = 0;
          for (int d = 0; d < vd; d++) acc += dd[d] * oo[d];
          D[i] = acc, l[i] = lse[((size_t)b * nh + h) * T + tl.t0 + i];
        }
        for (int64_t j0 = 0; j0 < keys; j0 += ATT_TK) {
          int n = keys - j0 < ATT_TK ? (int)(keys - j0) : ATT_TK;
          const real *kj = k + krow + (size_t)j0 * ldk, *vj = v + vrow + (size_t)j0 * ldv;
          GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, tl.m, n, hd, scale, q + qrow, ldq, kj, ldk, 0, s, n);
          masked_exp(p, s, l, tl.m, n, tl.pos0, j0); /* P */
          if (dv)
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, n, vd, tl.m, 1, p, n, dout + orow, ldo, 1,
                 dv + vrow + (size_t)j0 * ldv, ldv);
          if (!dq && !dk) continue;
          GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, tl.m, n, vd, 1, dout + orow, ldo, vj, ldv, 0, s, n); /* dP */
          for (int i = 0; i < tl.m; i++)
            for (int j = 0; j < n; j++) s[(size_t)i * n + j] = p[(size_t)i * n + j] * (s[(size_t)i * n + j] - D[i]);
          if (dq) GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, tl.m, hd, n, scale, s, n, kj, ldk, 1, dq + qrow, ldq);
          if (dk)
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, tl.m, scale, s, n, q + qrow, ldq, 1,
                 dk + krow + (size_t)j0 * ldk, ldk);
        }
        t += tl.m;
      }
}

void rt_attention_span_backward(act *dq, act *dk, act *dv, const act *dout, const act *q, const act *k,
                                const act *v, const act *out, const real *lse, act *work, int B, int T, int S,
                                int64_t lo, int64_t hi, int nh, int nkv, int hd, int vd) {
  (void)work; /* the cuda backend's cuDNN scratch (mtrt_ops.h) */
  span_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, S, lo, hi, nh, nkv, hd, vd, nh * hd, nkv * hd, nkv * vd);
}

void rt_attention_backward(act *dq, act *dk, act *dv, const act *dout, const act *q, const act *k, const act *v,
                           const act *out, const real *lse, int B, int T, int nh, int nkv, int hd, int vd) {
  size_t n = (size_t)B * T; /* the span backward adds: this one writes (mtrt_ops.h) */
  if (dq) memset(dq, 0, sizeof(act) * n * nh * hd);
  if (dk) memset(dk, 0, sizeof(act) * n * nkv * hd);
  if (dv) memset(dv, 0, sizeof(act) * n * nkv * vd);
  span_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, T, 0, T / 2, nh, nkv, hd, vd, nh * hd, nkv * hd, nkv * vd);
}

void rt_attention_qkv_forward(act *out, real *lse, const act *qkv, int B, int T, int nh, int nkv, int hd) {
  int w = (nh + 2 * nkv) * hd, kq = nh * hd, vq = kq + nkv * hd;
  span_forward(out, lse, qkv, qkv + kq, qkv + vq, B, T, T, 0, T / 2, nh, nkv, hd, hd, w, w, w);
}

void rt_attention_qkv_backward(act *dqkv, const act *dout, const act *qkv, const act *out, const real *lse, int B,
                               int T, int nh, int nkv, int hd) {
  int w = (nh + 2 * nkv) * hd, kq = nh * hd, vq = kq + nkv * hd;
  memset(dqkv, 0, sizeof(act) * (size_t)B * T * w); /* written (mtrt_ops.h) */
  span_backward(dqkv, dqkv + kq, dqkv + vq, dout, qkv, qkv + kq, qkv + vq, out, lse, B, T, T, 0, T / 2, nh, nkv, hd,
                hd, w, w, w);
}
