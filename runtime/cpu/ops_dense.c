/* ops_dense.c — cpu ops of the dense path: embedding, learned positions, RMSNorm, LayerNorm, biases, linear layers, RoPE,
 * activations, and the LM head with chunked cross-entropy. */
#include <math.h>
#include <string.h>

#include "gemm.h"

void rt_add(act *out, const act *a, const act *b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void rt_accumulate(act *acc, const act *x, size_t n) {
  for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

void rt_zero(act *x, size_t n) { memset(x, 0, n * sizeof(real)); }
void rt_copy(act *dst, const act *src, size_t n) { memcpy(dst, src, n * sizeof(real)); }

void rt_zero_real(real *x, size_t n) { memset(x, 0, n * sizeof(real)); }
void rt_copy_real(real *dst, const real *src, size_t n) { memcpy(dst, src, n * sizeof(real)); }

/* (act is real on the cpu backend: the router's layer is a linear layer) */
void rt_router_logits_forward(real *logits, const act *x, const act *w, int N, int IC, int E) {
  rt_matmul_forward(logits, x, w, NULL, N, IC, E);
}

void rt_router_logits_backward(act *dx, act *dw, const real *dlogits, const act *x, const act *w, int N, int IC,
                               int E) {
  rt_matmul_backward(dx, dw, NULL, dlogits, x, w, N, IC, E);
}

void rt_cast_to_act(act *dst, const real *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = (act)src[i];
}

void rt_embedding_forward(act *out, const int32_t *tok, const act *wte, int N, int C) {
  for (int n = 0; n < N; n++) memcpy(out + (size_t)n * C, wte + (size_t)tok[n] * C, sizeof(real) * (size_t)C);
}

void rt_embedding_backward(act *dwte, const act *dout, const int32_t *tok, int N, int C) {
  for (int n = 0; n < N; n++) {
    real *d = dwte + (size_t)tok[n] * C;
    const real *g = dout + (size_t)n * C;
    for (int c = 0; c < C; c++) d[c] += g[c];
  }
}

void rt_position_forward(act *x, const act *wpe, int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) rt_accumulate(x + ((size_t)b * T + t) * C, wpe + (size_t)t * C, (size_t)C);
}

void rt_position_backward(act *dwpe, const act *dx, int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) rt_accumulate(dwpe + (size_t)t * C, dx + ((size_t)b * T + t) * C, (size_t)C);
}

void rt_add_rmsnorm_forward(act *res, act *out, real *rstd, const act *x, const act *y, const act *w, int N, int C,
                            real eps) {
  rt_add(res, x, y, (size_t)N * C);
  rt_rmsnorm_forward(out, rstd, res, w, N, C, eps);
}

void rt_rmsnorm_forward(act *out, real *rstd, const act *x, const act *w, int N, int C, real eps) {
  for (int n = 0; n < N; n++) {
    const real *xn = x + (size_t)n * C;
    real ss = 0;
    for (int c = 0; c < C; c++) ss += xn[c] * xn[c];
    real r = 1 / SQRT(ss / (real)C + eps);
    rstd[n] = r;
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = xn[c] * r * w[c];
  }
}

/* y = x r w, r = (mean x² + eps)^(-1/2): dx = r (dy w) − x r³ / C · Σ (dy w x). */
void rt_rmsnorm_backward(act *dx, act *dw, const act *dout, const act *x, const act *w, const real *rstd, int N,
                         int C) {
  for (int n = 0; n < N; n++) {
    const real *xn = x + (size_t)n * C, *dy = dout + (size_t)n * C;
    real r = rstd[n], dot = 0;
    for (int c = 0; c < C; c++) {
      dot += dy[c] * w[c] * xn[c];
      if (dw) dw[c] += dy[c] * xn[c] * r;
    }
    if (!dx) continue;
    real k = dot * r * r * r / (real)C;
    for (int c = 0; c < C; c++) dx[(size_t)n * C + c] += dy[c] * w[c] * r - xn[c] * k;
  }
}

void rt_qk_norm_forward(act *out, real *rstd, const act *x, const act *w, int64_t rows, int width, real eps) {
  for (int64_t r = 0; r < rows; r++) /* row by row: rows × width may pass 2^31 */
    rt_rmsnorm_forward(out + r * width, rstd + r, x + r * width, w, 1, width, eps);
}

void rt_qk_norm_backward(act *dx, act *dw, const act *dout, const act *x, const act *w, const real *rstd,
                         int64_t rows, int width) {
  for (int64_t r = 0; r < rows; r++)
    rt_rmsnorm_backward(dx ? dx + r * width : NULL, dw, dout + r * width, x + r * width, w, rstd + r, 1, width);
}

void rt_layernorm_forward(act *out, real *mean, real *rstd, const act *x, const act *w, const act *b, int N, int C,
                          real eps) {
  for (int n = 0; n < N; n++) {
    const real *xn = x + (size_t)n * C;
    real m = 0, v = 0;
    for (int c = 0; c < C; c++) m += xn[c];
    m /= (real)C;
    for (int c = 0; c < C; c++) v += (xn[c] - m) * (xn[c] - m);
    real r = 1 / SQRT(v / (real)C + eps);
    mean[n] = m, rstd[n] = r;
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (xn[c] - m) * r * w[c] + (b ? b[c] : 0);
  }
}

void rt_layernorm_backward(act *dx, act *dw, act *db, const act *dout, const act *x, const act *w, const real *mean,
                           const real *rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    const real *xn = x + (size_t)n * C, *dy = dout + (size_t)n * C;
    real m = mean[n], r = rstd[n], gm = 0, gx = 0;
    for (int c = 0; c < C; c++) {
      real xh = (xn[c] - m) * r, g = dy[c] * w[c];
      gm += g, gx += g * xh;
      if (dw) dw[c] += dy[c] * xh;
      if (db) db[c] += dy[c];
    }
    if (!dx) continue;
    gm /= (real)C, gx /= (real)C;
    for (int c = 0; c < C; c++) dx[(size_t)n * C + c] += r * (dy[c] * w[c] - gm - (xn[c] - m) * r * gx);
  }
}

void rt_bias_forward(act *out, const act *b, int N, int C) {
  for (int n = 0; n < N; n++) rt_accumulate(out + (size_t)n * C, b, (size_t)C);
}

void rt_bias_backward(act *db, const act *dout, int N, int C) {
  for (int n = 0; n < N; n++) rt_accumulate(db, dout + (size_t)n * C, (size_t)C);
}

void rt_matmul_forward(act *out, const act *x, const act *w, const act *bias, int N, int IC, int OC) {
  GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1, x, IC, w, IC, 0, out, OC);
  if (bias)
    for (int n = 0; n < N; n++)
      for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

/* dx = dout · w + dx_beta dx; dw, dbias added. */
static void matmul_backward(act *dx, act *dw, act *dbias, const act *dout, const act *x, const act *w, int N, int IC,
                            int OC, real dx_beta) {
  if (dx) GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1, dout, OC, w, IC, dx_beta, dx, IC);
  if (dw) GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1, dout, OC, x, IC, 1, dw, IC);
  if (dbias)
    for (int n = 0; n < N; n++)
      for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)n * OC + o];
}

void rt_matmul_backward(act *dx, act *dw, act *dbias, const act *dout, const act *x, const act *w, int N, int IC,
                        int OC) {
  matmul_backward(dx, dw, dbias, dout, x, w, N, IC, OC, 1);
}

void rt_matmul_backward_set(act *dx, act *dw, act *dbias, const act *dout, const act *x, const act *w, int N, int IC,
                            int OC) {
  matmul_backward(dx, dw, dbias, dout, x, w, N, IC, OC, 0);
}

/* Rotates each (i, i + rd/2) pair of the first rd channels of H heads `stride` apart, tokens ld
 * apart, by sign × angle (angle = pos · theta^(−2i/rd), pos = lo + t in the first half of the T
 * tokens, hi + t − T/2 in the second: rt_rope_span_forward's; t itself with lo 0, hi T/2). */
static void rope_span_ld(real *x, int B, int T, int H, int stride, size_t ld, int rd, real theta, int64_t lo,
                         int64_t hi, real sign) {
  int half = rd / 2;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int i = 0; i < half; i++) {
        int64_t pos = t < T / 2 ? lo + t : hi + (t - T / 2);
        real angle = sign * (real)pos * POW(theta, -2 * (real)i / (real)rd);
        real cs = COS(angle), sn = SIN(angle);
        for (int h = 0; h < H; h++) {
          real *p = x + ((size_t)b * T + t) * ld + (size_t)h * stride;
          real a = p[i], c = p[i + half];
          p[i] = a * cs - c * sn;
          p[i + half] = a * sn + c * cs;
        }
      }
}

static void rope_span(real *x, int B, int T, int H, int stride, int rd, real theta, int64_t lo, int64_t hi, real sign) {
  rope_span_ld(x, B, T, H, stride, (size_t)H * stride, rd, theta, lo, hi, sign);
}

static void rope_strided(real *x, int B, int T, int H, int stride, int rd, real theta, real sign) {
  rope_span(x, B, T, H, stride, rd, theta, 0, T / 2, sign);
}

static void rope(real *x, int B, int T, int H, int hd, real theta, real sign) {
  rope_strided(x, B, T, H, hd, hd, theta, sign);
}

void rt_rope_span_forward(act *x, int B, int T, int H, int stride, int rd, real theta, int64_t lo, int64_t hi) {
  rope_span(x, B, T, H, stride, rd, theta, lo, hi, 1);
}
void rt_rope_span_backward(act *dx, int B, int T, int H, int stride, int rd, real theta, int64_t lo, int64_t hi) {
  rope_span(dx, B, T, H, stride, rd, theta, lo, hi, -1);
}

static void rope_yarn(real *x, int B, int T, int H, int stride, int hd, real theta, real factor, real orig,
                      real beta_fast, real beta_slow, real attn, double sign);

void rt_rope_strided_forward(act *x, int B, int T, int H, int stride, int rd, real theta, real factor, real orig,
                             real beta_fast, real beta_slow, real attn) {
  if (factor > 1) rope_yarn(x, B, T, H, stride, rd, theta, factor, orig, beta_fast, beta_slow, attn, 1);
  else rope_strided(x, B, T, H, stride, rd, theta, 1);
}
void rt_rope_strided_backward(act *dx, int B, int T, int H, int stride, int rd, real theta, real factor, real orig,
                              real beta_fast, real beta_slow, real attn) {
  if (factor > 1) rope_yarn(dx, B, T, H, stride, rd, theta, factor, orig, beta_fast, beta_slow, attn, -1);
  else rope_strided(dx, B, T, H, stride, rd, theta, -1);
}
void rt_rope_forward(act *x, int B, int T, int H, int hd, real theta) { rope(x, B, T, H, hd, theta, 1); }
void rt_rope_backward(act *dx, int B, int T, int H, int hd, real theta) { rope(dx, B, T, H, hd, theta, -1); }
/* q's and k's heads: the first nh + nkv of each fused row of (nh + 2 nkv) hd values */
void rt_rope_qkv_forward(act *qkv, int B, int T, int nh, int nkv, int hd, real theta) {
  rope_span_ld(qkv, B, T, nh + nkv, hd, (size_t)(nh + 2 * nkv) * hd, hd, theta, 0, T / 2, 1);
}
void rt_rope_qkv_backward(act *dqkv, int B, int T, int nh, int nkv, int hd, real theta) {
  rope_span_ld(dqkv, B, T, nh + nkv, hd, (size_t)(nh + 2 * nkv) * hd, hd, theta, 0, T / 2, -1);
}

/* Llama 3.1's inverse frequency for pair i of hd (see mtrt_ops.h), in double. */
static double llama3_inv_freq(int i, int hd, double theta, double factor, double low, double high, double orig) {
  double f = pow(theta, -2.0 * i / hd), wavelen = 6.283185307179586 / f; /* 2π / f */
  if (wavelen < orig / high) return f;
  if (wavelen > orig / low) return f / factor;
  double s = (orig / wavelen - low) / (high - low);
  return (1 - s) * f / factor + s * f;
}

static void rope_llama3(real *x, int B, int T, int H, int hd, real theta, real factor, real low, real high, real orig,
                        double sign) {
  int half = hd / 2;
  for (int i = 0; i < half; i++) {
    double f = llama3_inv_freq(i, hd, theta, factor, low, high, orig);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        double angle = sign * t * f;
        real cs = (real)cos(angle), sn = (real)sin(angle);
        for (int h = 0; h < H; h++) {
          real *p = x + (((size_t)b * T + t) * H + h) * hd;
          real a = p[i], c = p[i + half];
          p[i] = a * cs - c * sn;
          p[i + half] = a * sn + c * cs;
        }
      }
  }
}

/* YaRN's inverse frequency for pair i of hd (see mtrt_ops.h), in double. */
static double yarn_inv_freq(int i, int hd, double theta, double factor, double orig, double beta_fast, double beta_slow) {
  double lo = floor(hd * log(orig / (beta_fast * 6.283185307179586)) / (2 * log(theta)));
  double hi = ceil(hd * log(orig / (beta_slow * 6.283185307179586)) / (2 * log(theta)));
  if (lo < 0) lo = 0;
  if (hi > hd - 1) hi = hd - 1;
  if (lo == hi) hi += 0.001;
  double ramp = ((double)i - lo) / (hi - lo), f = pow(theta, -2.0 * i / hd);
  ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
  double extrapolate = 1 - ramp;
  return f / factor * (1 - extrapolate) + f * extrapolate;
}

/* (heads `stride` values apart, hd channels of each rotated) */
static void rope_yarn(real *x, int B, int T, int H, int stride, int hd, real theta, real factor, real orig,
                      real beta_fast, real beta_slow, real attn, double sign) {
  int half = hd / 2;
  for (int i = 0; i < half; i++) {
    double f = yarn_inv_freq(i, hd, theta, factor, orig, beta_fast, beta_slow);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        double angle = sign * t * f;
        real cs = (real)(attn * cos(angle)), sn = (real)(attn * sin(angle));
        for (int h = 0; h < H; h++) {
          real *p = x + (((size_t)b * T + t) * H + h) * stride;
          real a = p[i], c = p[i + half];
          p[i] = a * cs - c * sn;
          p[i + half] = a * sn + c * cs;
        }
      }
  }
}

void rt_rope_yarn_forward(act *x, int B, int T, int H, int hd, real theta, real factor, real orig, real beta_fast,
                          real beta_slow, real attn) {
  rope_yarn(x, B, T, H, hd, hd, theta, factor, orig, beta_fast, beta_slow, attn, 1);
}

void rt_rope_yarn_backward(act *dx, int B, int T, int H, int hd, real theta, real factor, real orig, real beta_fast,
                           real beta_slow, real attn) {
  rope_yarn(dx, B, T, H, hd, hd, theta, factor, orig, beta_fast, beta_slow, attn, -1);
}

void rt_rope_llama3_forward(act *x, int B, int T, int H, int hd, real theta, real factor, real low, real high,
                            real orig) {
  rope_llama3(x, B, T, H, hd, theta, factor, low, high, orig, 1);
}

void rt_rope_llama3_backward(act *dx, int B, int T, int H, int hd, real theta, real factor, real low, real high,
                             real orig) {
  rope_llama3(dx, B, T, H, hd, theta, factor, low, high, orig, -1);
}

/* MLA's keys and values from kv_b_proj's output (see mtrt_ops.h). */
void rt_mla_kv_forward(act *k, act *v, const act *kvb, const act *kr, int64_t N, int nh, int nope, int rope, int vd,
                       real kscale) {
  int hd = nope + rope, w = nope + vd;
  for (int64_t n = 0; n < N; n++)
    for (int h = 0; h < nh; h++) {
      const act *src = kvb + ((size_t)n * nh + h) * w;
      act *kk = k + ((size_t)n * nh + h) * hd, *vv = v + ((size_t)n * nh + h) * vd;
      for (int i = 0; i < nope; i++) kk[i] = kscale * src[i];
      for (int i = 0; i < rope; i++) kk[nope + i] = kscale * kr[(size_t)n * rope + i];
      memcpy(vv, src + nope, sizeof(act) * (size_t)vd);
    }
}

void rt_mla_kv_backward(act *dkvb, act *dkr, const act *dk, const act *dv, int64_t N, int nh, int nope, int rope,
                        int vd, real kscale) {
  int hd = nope + rope, w = nope + vd;
  for (int64_t n = 0; n < N; n++)
    for (int h = 0; h < nh; h++) {
      act *dst = dkvb + ((size_t)n * nh + h) * w;
      const act *dkk = dk + ((size_t)n * nh + h) * hd, *dvv = dv + ((size_t)n * nh + h) * vd;
      for (int i = 0; i < nope; i++) dst[i] += kscale * dkk[i];
      for (int i = 0; i < vd; i++) dst[nope + i] += dvv[i];
      for (int i = 0; i < rope; i++) dkr[(size_t)n * rope + i] += kscale * dkk[nope + i];
    }
}

static real sigmoid(real x) { return 1 / (1 + EXP(-x)); }

void rt_swiglu_forward(act *h, const act *g, const act *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

/* silu'(g) = σ(g) (1 + g (1 − σ(g))). */
void rt_swiglu_backward(act *dg, act *du, const act *dh, const act *g, const act *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    real s = sigmoid(g[i]);
    if (dg) dg[i] = dh[i] * u[i] * s * (1 + g[i] * (1 - s));
    if (du) du[i] = dh[i] * g[i] * s;
  }
}

void rt_swiglu_rows_forward(act *h, const act *gu, int64_t rows, int F) {
  for (int64_t r = 0; r < rows; r++) rt_swiglu_forward(h + r * F, gu + r * 2 * F, gu + r * 2 * F + F, F);
}

void rt_swiglu_rows_backward(act *dgu, const act *dh, const act *gu, int64_t rows, int F) {
  for (int64_t r = 0; r < rows; r++)
    rt_swiglu_backward(dgu + r * 2 * F, dgu + r * 2 * F + F, dh + r * F, gu + r * 2 * F, gu + r * 2 * F + F, F);
}

#define GELU_K 0.7978845608028654 /* sqrt(2/π) */

void rt_gelu_forward(act *h, const act *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    real a = x[i];
    h[i] = (real)0.5 * a * (1 + TANH((real)GELU_K * (a + (real)0.044715 * a * a * a)));
  }
}

void rt_gelu_backward(act *dx, const act *dh, const act *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    real a = x[i], inner = (real)GELU_K * (a + (real)0.044715 * a * a * a);
    real th = TANH(inner), sech2 = 1 - th * th;
    real d = (real)0.5 * (1 + th) + (real)0.5 * a * sech2 * (real)GELU_K * (1 + 3 * (real)0.044715 * a * a);
    dx[i] = dh[i] * d;
  }
}

/* Online log-sum-exp over vocabulary chunks (Milakov & Gimelshein 2018). */
real rt_lm_head_ce_forward(real *lse, const act *x, const act *w, const int32_t *targets, int N, int C, int V,
                           int chunk, real *scratch) {
  real loss = 0;
  for (int n = 0; n < N; n++) lse[n] = -INFINITY;
  for (int v0 = 0; v0 < V; v0 += chunk) {
    int cv = V - v0 < chunk ? V - v0 : chunk;
    rt_matmul_forward(scratch, x, w + (size_t)v0 * C, NULL, N, C, cv);
    for (int n = 0; n < N; n++) {
      const real *row = scratch + (size_t)n * cv;
      real m = lse[n];
      for (int j = 0; j < cv; j++) m = fmax(m, row[j]);
      real s = lse[n] == -INFINITY ? 0 : EXP(lse[n] - m);
      for (int j = 0; j < cv; j++) s += EXP(row[j] - m);
      lse[n] = m + LOG(s);
      if (targets[n] >= v0 && targets[n] < v0 + cv) loss -= row[targets[n] - v0];
    }
  }
  for (int n = 0; n < N; n++) loss += lse[n];
  return loss / (real)N;
}

void rt_lm_head_ce_backward(act *dx, act *dw, const act *x, const act *w, const int32_t *targets, const real *lse,
                            int N, int C, int V, int chunk, real *scratch, real dloss) {
  real scale = dloss / (real)N;
  for (int v0 = 0; v0 < V; v0 += chunk) {
    int cv = V - v0 < chunk ? V - v0 : chunk;
    rt_matmul_forward(scratch, x, w + (size_t)v0 * C, NULL, N, C, cv);
    for (int n = 0; n < N; n++) {
      real *row = scratch + (size_t)n * cv;
      for (int j = 0; j < cv; j++) row[j] = scale * (EXP(row[j] - lse[n]) - (targets[n] == v0 + j));
    }
    rt_matmul_backward(dx, dw ? dw + (size_t)v0 * C : NULL, NULL, scratch, x, w + (size_t)v0 * C, N, C, cv);
  }
}
