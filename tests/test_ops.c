/* test_ops.c — every cpu op's backward against central finite differences of its forward, in
 * double: each op's output is reduced to a loss L = Σ out ⊙ R with a fixed random R, and
 * every input and parameter gradient must match (L(p+h) − L(p−h)) / 2h to 1e-6 relative. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mtrt_ops.h"

#if !defined(MTRT_REAL_DOUBLE)
#error "test_ops checks gradients in double: link mtrt_ops_f64"
#endif

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rnd(void) { /* xorshift64*, uniform in [-1, 1) */
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ull) >> 11) / 4503599627370496.0 - 1.0;
}
static double *allocs[256]; /* every test array, freed at exit */
static int nallocs;
static double *zeros(int n) {
  double *a = calloc((size_t)n, sizeof *a);
  if (!a || nallocs == 256) abort();
  return allocs[nallocs++] = a;
}
static double *arr(int n) {
  double *a = zeros(n);
  for (int i = 0; i < n; i++) a[i] = rnd();
  return a;
}
static double sum_prod(const double *a, const double *b, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

static double (*loss_fn)(void);

/* Largest relative error of the gradient g of p (n elements) against central differences. */
static double grad_err(double *p, const double *g, int n) {
  const double h = 1e-5;
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double s = p[i];
    p[i] = s + h;
    double lp = loss_fn();
    p[i] = s - h;
    double lm = loss_fn();
    p[i] = s;
    double num = (lp - lm) / (2 * h);
    double err = fabs(num - g[i]) / fmax(1e-2, fmax(fabs(num), fabs(g[i])));
    if (err > worst) worst = err;
  }
  return worst;
}

#define GRAD_OK(p, g, n)                                                             \
  do {                                                                               \
    double e_ = grad_err(p, g, n);                                                   \
    check_count++;                                                                   \
    if (!(e_ < 1e-6)) {                                                              \
      check_failures++;                                                              \
      fprintf(stderr, "%s:%d: gradient of %s: relative error %.3g\n", __FILE__, __LINE__, #p, e_); \
    }                                                                                \
  } while (0)

/* ---- rmsnorm */
enum { RN = 3, RC = 8 };
static double *rn_x, *rn_w, *rn_R, rn_out[RN * RC], rn_rstd[RN];
static double rn_loss(void) {
  rt_rmsnorm_forward(rn_out, rn_rstd, rn_x, rn_w, RN, RC, 1e-5);
  return sum_prod(rn_out, rn_R, RN * RC);
}
static void test_rmsnorm(void) {
  rn_x = arr(RN * RC), rn_w = arr(RC), rn_R = arr(RN * RC);
  double *dx = zeros(RN * RC), *dw = zeros(RC);
  loss_fn = rn_loss;
  rn_loss();
  rt_rmsnorm_backward(dx, dw, rn_R, rn_x, rn_w, rn_rstd, RN, RC);
  GRAD_OK(rn_x, dx, RN * RC);
  GRAD_OK(rn_w, dw, RC);
}

/* ---- qk-norm: per head (rows of head_dim) and full (one row per token) */
enum { QN = 3, QNH = 2, QNW = 4 };
static double *qn_x, *qn_w, *qn_R, qn_out[QN * QNH * QNW], qn_rstd[QN * QNH];
static int64_t qn_rows;
static int qn_width;
static double qn_loss(void) {
  rt_qk_norm_forward(qn_out, qn_rstd, qn_x, qn_w, qn_rows, qn_width, 1e-6);
  return sum_prod(qn_out, qn_R, QN * QNH * QNW);
}
static void test_qk_norm(void) {
  for (int full = 0; full < 2; full++) {
    qn_rows = full ? QN : QN * QNH, qn_width = full ? QNH * QNW : QNW;
    qn_x = arr(QN * QNH * QNW), qn_w = arr(qn_width), qn_R = arr(QN * QNH * QNW);
    double *dx = zeros(QN * QNH * QNW), *dw = zeros(qn_width);
    loss_fn = qn_loss;
    qn_loss();
    rt_qk_norm_backward(dx, dw, qn_R, qn_x, qn_w, qn_rstd, qn_rows, qn_width);
    GRAD_OK(qn_x, dx, QN * QNH * QNW);
    GRAD_OK(qn_w, dw, qn_width);
  }
}

/* ---- the residual add and RMSNorm in one call: rt_add then rt_rmsnorm_forward, exactly */
static void test_add_rmsnorm(void) {
  enum { AN = 3, AC = 8 };
  double *x = arr(AN * AC), *y = arr(AN * AC), *w = arr(AC), *res = zeros(AN * AC), *out = zeros(AN * AC);
  double *rstd = zeros(AN), *res2 = zeros(AN * AC), *out2 = zeros(AN * AC), *rstd2 = zeros(AN), worst = 0;
  rt_add_rmsnorm_forward(res, out, rstd, x, y, w, AN, AC, 1e-5);
  rt_add(res2, x, y, AN * AC);
  rt_rmsnorm_forward(out2, rstd2, res2, w, AN, AC, 1e-5);
  for (int i = 0; i < AN * AC; i++) worst = fmax(worst, fmax(fabs(res[i] - res2[i]), fabs(out[i] - out2[i])));
  for (int i = 0; i < AN; i++) worst = fmax(worst, fabs(rstd[i] - rstd2[i]));
  CHECK(worst == 0);
}

/* ---- matmul with bias */
enum { MN = 3, MI = 5, MO = 4 };
static double *mm_x, *mm_w, *mm_b, *mm_R, mm_out[MN * MO];
static double mm_loss(void) {
  rt_matmul_forward(mm_out, mm_x, mm_w, mm_b, MN, MI, MO);
  return sum_prod(mm_out, mm_R, MN * MO);
}
static void test_matmul(void) {
  mm_x = arr(MN * MI), mm_w = arr(MO * MI), mm_b = arr(MO), mm_R = arr(MN * MO);
  double *dx = zeros(MN * MI), *dw = zeros(MO * MI), *db = zeros(MO);
  loss_fn = mm_loss;
  rt_matmul_backward(dx, dw, db, mm_R, mm_x, mm_w, MN, MI, MO);
  GRAD_OK(mm_x, dx, MN * MI);
  GRAD_OK(mm_w, dw, MO * MI);
  GRAD_OK(mm_b, db, MO);
  /* the first writer of dx: its old values (non-zero) are overwritten, dw and db still add */
  double *dx2 = arr(MN * MI), *dw2 = zeros(MO * MI), *db2 = zeros(MO);
  rt_matmul_backward_set(dx2, dw2, db2, mm_R, mm_x, mm_w, MN, MI, MO);
  GRAD_OK(mm_x, dx2, MN * MI);
  rt_matmul_backward_set(dx2, dw2, db2, mm_R, mm_x, mm_w, MN, MI, MO);
  for (int i = 0; i < MO * MI; i++) CHECK(fabs(dw2[i] - 2 * dw[i]) < 1e-12);
  for (int i = 0; i < MO; i++) CHECK(fabs(db2[i] - 2 * db[i]) < 1e-12);
}

/* ---- rope */
enum { QB = 2, QT = 3, QH = 2, QD = 4 };
static double *rp_x, *rp_R, rp_tmp[QB * QT * QH * QD];
static double rp_loss(void) {
  memcpy(rp_tmp, rp_x, sizeof rp_tmp);
  rt_rope_forward(rp_tmp, QB, QT, QH, QD, 10000);
  return sum_prod(rp_tmp, rp_R, QB * QT * QH * QD);
}
static void test_rope(void) {
  int n = QB * QT * QH * QD;
  rp_x = arr(n), rp_R = arr(n);
  double *dx = zeros(n);
  memcpy(dx, rp_R, sizeof(double) * (size_t)n);
  rt_rope_backward(dx, QB, QT, QH, QD, 10000);
  loss_fn = rp_loss;
  GRAD_OK(rp_x, dx, n);
}

/* ---- rope with Llama 3.1's scaling (factor 8, low 1, high 4, orig 32: wavelengths below 8
 * kept, above 32 divided, between blended). hd 4 has two pairs, of wavelengths 2π and 2π·√θ:
 * θ 10 puts the second (19.9) in the blend, θ 100 (62.8) among the divided */
static double rl_theta;
static double rl_loss(void) {
  memcpy(rp_tmp, rp_x, sizeof rp_tmp);
  rt_rope_llama3_forward(rp_tmp, QB, QT, QH, QD, rl_theta, 8, 1, 4, 32);
  return sum_prod(rp_tmp, rp_R, QB * QT * QH * QD);
}
static void test_rope_llama3(void) {
  int n = QB * QT * QH * QD;
  for (int k = 0; k < 2; k++) {
    rl_theta = k ? 100 : 10;
    double *dx = zeros(n);
    memcpy(dx, rp_R, sizeof(double) * (size_t)n);
    rt_rope_llama3_backward(dx, QB, QT, QH, QD, rl_theta, 8, 1, 4, 32);
    loss_fn = rl_loss;
    GRAD_OK(rp_x, dx, n);
  }
  /* factor 1 is plain RoPE */
  double a[QB * QT * QH * QD], b[QB * QT * QH * QD];
  memcpy(a, rp_x, sizeof a), memcpy(b, rp_x, sizeof b);
  rt_rope_forward(a, QB, QT, QH, QD, 10);
  rt_rope_llama3_forward(b, QB, QT, QH, QD, 10, 1, 1, 4, 32);
  for (int i = 0; i < n; i++) CHECK(fabs(a[i] - b[i]) < 1e-12);
}

/* ---- rope with YaRN (factor 4, orig 8, beta_fast 2, beta_slow 1 over hd 8, θ 10: the ramp spans
 * the pairs, so extrapolated, blended and interpolated frequencies all occur), attention factor
 * 1.2 */
enum { YD = 8 };
static double *yr_x, *yr_R, yr_tmp[QB * QT * QH * YD];
static double yr_loss(void) {
  memcpy(yr_tmp, yr_x, sizeof yr_tmp);
  rt_rope_yarn_forward(yr_tmp, QB, QT, QH, YD, 10, 4, 8, 2, 1, 1.2);
  return sum_prod(yr_tmp, yr_R, QB * QT * QH * YD);
}
static void test_rope_yarn(void) {
  int n = QB * QT * QH * YD;
  yr_x = arr(n), yr_R = arr(n);
  double *dx = zeros(n);
  memcpy(dx, yr_R, sizeof(double) * (size_t)n);
  rt_rope_yarn_backward(dx, QB, QT, QH, YD, 10, 4, 8, 2, 1, 1.2);
  loss_fn = yr_loss;
  GRAD_OK(yr_x, dx, n);
  /* factor 1, attention factor 1: plain RoPE */
  double a[QB * QT * QH * YD], b[QB * QT * QH * YD];
  memcpy(a, yr_x, sizeof a), memcpy(b, yr_x, sizeof b);
  rt_rope_forward(a, QB, QT, QH, YD, 10);
  rt_rope_yarn_forward(b, QB, QT, QH, YD, 10, 1, 8, 2, 1, 1);
  for (int i = 0; i < n; i++) CHECK(fabs(a[i] - b[i]) < 1e-12);
}

/* ---- causal GQA attention: 4 query heads over 2 KV heads, values of the head size and of
 * another (MLA's v_head_dim) */
enum { AB = 2, AT = 4, AH = 4, AKV = 2, AD = 3, AVD = 5 };
static int at_vd;
static double *at_q, *at_k, *at_v, *at_R, at_out[AB * AT * AH * AVD], at_lse[AB * AH * AT];
static double at_loss(void) {
  rt_attention_forward(at_out, at_lse, at_q, at_k, at_v, AB, AT, AH, AKV, AD, at_vd);
  return sum_prod(at_out, at_R, AB * AT * AH * at_vd);
}
static void test_attention(void) {
  for (int c = 0; c < 2; c++) {
    at_vd = c ? AVD : AD;
    int nq = AB * AT * AH * AD, nk = AB * AT * AKV * AD, nv = AB * AT * AKV * at_vd, no = AB * AT * AH * at_vd;
    at_q = arr(nq), at_k = arr(nk), at_v = arr(nv), at_R = arr(no);
    double *dq = arr(nq), *dk = arr(nk), *dv = arr(nv); /* written, not added to: start non-zero */
    loss_fn = at_loss;
    at_loss();
    rt_attention_backward(dq, dk, dv, at_R, at_q, at_k, at_v, at_out, at_lse, AB, AT, AH, AKV, AD, at_vd);
    GRAD_OK(at_q, dq, nq);
    GRAD_OK(at_k, dk, nk);
    GRAD_OK(at_v, dv, nv);
    /* causal: the first position sees only itself, so its output is its own value */
    for (int d = 0; d < at_vd; d++) CHECK(fabs(at_out[d] - at_v[d]) < 1e-12);
  }
}

/* ---- attention past one tile: 600 tokens (ops_attention.c visits 64 queries at a time against
 * blocks of 256 keys) against the definition written out, softmax(q kᵀ / sqrt(hd)) v with its
 * gradients dP = dO vᵀ, dS = P (dP − rowsum(P dP)), dq = dS k / sqrt(hd), dk = dSᵀ q / sqrt(hd),
 * dv = Pᵀ dO; then the same rows from two cp ranks' spans of the sequence. */
enum { LT = 600, LH = 2, LKV = 1, LD = 3, LVD = 2 };
static void naive_attention(double *out, double *lse, double *dq, double *dk, double *dv, const double *q,
                            const double *k, const double *v, const double *dout) {
  static double P[LT], dP[LT];
  for (int h = 0; h < LH; h++)
    for (int t = 0; t < LT; t++) {
      const double *qt = q + ((size_t)t * LH + h) * LD, *dot = dout + ((size_t)t * LH + h) * LVD;
      double m = -INFINITY, z = 0, D = 0;
      for (int j = 0; j <= t; j++) {
        P[j] = 0;
        for (int d = 0; d < LD; d++) P[j] += qt[d] * k[(size_t)j * LD + d] / sqrt((double)LD);
        m = fmax(m, P[j]);
      }
      for (int j = 0; j <= t; j++) z += P[j] = exp(P[j] - m);
      lse[(size_t)h * LT + t] = m + log(z);
      for (int j = 0; j <= t; j++) {
        P[j] /= z, dP[j] = 0;
        for (int d = 0; d < LVD; d++) {
          out[((size_t)t * LH + h) * LVD + d] += P[j] * v[(size_t)j * LVD + d];
          dP[j] += dot[d] * v[(size_t)j * LVD + d];
        }
        D += P[j] * dP[j];
      }
      for (int j = 0; j <= t; j++) {
        double ds = P[j] * (dP[j] - D) / sqrt((double)LD);
        for (int d = 0; d < LD; d++) {
          dq[((size_t)t * LH + h) * LD + d] += ds * k[(size_t)j * LD + d];
          dk[(size_t)j * LD + d] += ds * qt[d];
        }
        for (int d = 0; d < LVD; d++) dv[(size_t)j * LVD + d] += P[j] * dot[d];
      }
    }
}
static void test_attention_long(void) {
  int nq = LT * LH * LD, nk = LT * LKV * LD, nv = LT * LKV * LVD, no = LT * LH * LVD, c = LT / 4;
  double *q = arr(nq), *k = arr(nk), *v = arr(nv), *dout = arr(no);
  double *out = zeros(no), *lse = zeros(LH * LT), *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nv);
  double *rout = zeros(no), *rlse = zeros(LH * LT), *rdq = zeros(nq), *rdk = zeros(nk), *rdv = zeros(nv);
  for (int i = 0; i < nq; i++) q[i] *= 3; /* peaked rows: the running max moves between key blocks */
  naive_attention(rout, rlse, rdq, rdk, rdv, q, k, v, dout);
  rt_attention_forward(out, lse, q, k, v, 1, LT, LH, LKV, LD, LVD);
  rt_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, 1, LT, LH, LKV, LD, LVD);
  double worst = 0;
  for (int i = 0; i < no; i++) worst = fmax(worst, fabs(out[i] - rout[i]));
  for (int i = 0; i < LH * LT; i++) worst = fmax(worst, fabs(lse[i] - rlse[i]));
  for (int i = 0; i < nq; i++) worst = fmax(worst, fabs(dq[i] - rdq[i]));
  for (int i = 0; i < nk; i++) worst = fmax(worst, fabs(dk[i] - rdk[i]));
  for (int i = 0; i < nv; i++) worst = fmax(worst, fabs(dv[i] - rdv[i]));
  CHECK(worst < 1e-10);
  /* cp 2: rank r holds chunks r and 3 − r of c = 150 tokens; its dk, dv over the whole range */
  double *sdk = zeros(nk), *sdv = zeros(nv);
  worst = 0;
  for (int r = 0; r < 2; r++) {
    int64_t lo = (int64_t)r * c, hi = (int64_t)(3 - r) * c;
    double *lq = zeros(2 * c * LH * LD), *ldo = zeros(2 * c * LH * LVD), *lout = zeros(2 * c * LH * LVD),
           *llse = zeros(LH * 2 * c), *ldq = zeros(2 * c * LH * LD);
    for (int t = 0; t < 2 * c; t++) {
      int64_t pos = t < c ? lo + t : hi + t - c;
      memcpy(lq + (size_t)t * LH * LD, q + pos * LH * LD, sizeof(double) * LH * LD);
      memcpy(ldo + (size_t)t * LH * LVD, dout + pos * LH * LVD, sizeof(double) * LH * LVD);
    }
    rt_attention_span_forward(lout, llse, lq, k, v, 1, 2 * c, LT, lo, hi, LH, LKV, LD, LVD);
    rt_attention_span_backward(ldq, sdk, sdv, ldo, lq, k, v, lout, llse, NULL, 1, 2 * c, LT, lo, hi, LH, LKV, LD, LVD);
    for (int t = 0; t < 2 * c; t++) {
      int64_t pos = t < c ? lo + t : hi + t - c;
      for (int i = 0; i < LH * LVD; i++)
        worst = fmax(worst, fabs(lout[(size_t)t * LH * LVD + i] - rout[pos * LH * LVD + i]));
      for (int i = 0; i < LH * LD; i++)
        worst = fmax(worst, fabs(ldq[(size_t)t * LH * LD + i] - rdq[pos * LH * LD + i]));
      for (int h = 0; h < LH; h++)
        worst = fmax(worst, fabs(llse[(size_t)h * 2 * c + t] - rlse[(size_t)h * LT + pos]));
    }
  }
  for (int i = 0; i < nk; i++) worst = fmax(worst, fabs(sdk[i] - rdk[i]));
  for (int i = 0; i < nv; i++) worst = fmax(worst, fabs(sdv[i] - rdv[i]));
  CHECK(worst < 1e-10);
}

/* ---- MLA's parts: RoPE on the rope channels of each head (stride 7, 4 rotated from channel 3)
 * equals rt_rope_forward on those channels copied out, the rest untouched; rt_mla_kv_* against
 * its definition and the gradient check */
enum { MH = 3, MNOPE = 3, MROPE = 4, MVD = 2, MST = MNOPE + MROPE, MTOK = QB * QT };
static double mk_s = 1, *mk_kvb, *mk_kr, *mk_Rk, *mk_Rv, mk_k[MTOK * MH * MST], mk_v[MTOK * MH * MVD];
static double mk_loss(void) {
  rt_mla_kv_forward(mk_k, mk_v, mk_kvb, mk_kr, MTOK, MH, MNOPE, MROPE, MVD, mk_s);
  return sum_prod(mk_k, mk_Rk, MTOK * MH * MST) + sum_prod(mk_v, mk_Rv, MTOK * MH * MVD);
}
static double *rs_x, *rs_R, rs_tmp[MTOK * MH * MST], rs_f = 1, rs_attn = 1;
static double rs_loss(void) {
  memcpy(rs_tmp, rs_x, sizeof rs_tmp);
  rt_rope_strided_forward(rs_tmp + MNOPE, QB, QT, MH, MST, MROPE, 10, rs_f, 8, 2, 1, rs_attn);
  return sum_prod(rs_tmp, rs_R, MTOK * MH * MST);
}
static void test_mla(void) {
  int n = MTOK * MH * MST;
  rs_x = arr(n), rs_R = arr(n);
  double a[MTOK * MH * MST], b[MTOK * MH * MROPE];
  memcpy(a, rs_x, sizeof a);
  rt_rope_strided_forward(a + MNOPE, QB, QT, MH, MST, MROPE, 10, 1, 1, 1, 1, 1);
  for (int r = 0; r < MTOK * MH; r++) memcpy(b + r * MROPE, rs_x + r * MST + MNOPE, sizeof(double) * MROPE);
  rt_rope_forward(b, QB, QT, MH, MROPE, 10);
  for (int r = 0; r < MTOK * MH; r++)
    for (int i = 0; i < MST; i++)
      CHECK(fabs(a[r * MST + i] - (i < MNOPE ? rs_x[r * MST + i] : b[r * MROPE + i - MNOPE])) < 1e-12);
  for (int y = 0; y < 2; y++) { /* plain, then YaRN (factor 4 over orig 8, attention factor 1.2) */
    rs_f = y ? 4 : 1, rs_attn = y ? 1.2 : 1;
    double *dx = zeros(n);
    memcpy(dx, rs_R, sizeof(double) * (size_t)n);
    rt_rope_strided_backward(dx + MNOPE, QB, QT, MH, MST, MROPE, 10, rs_f, 8, 2, 1, rs_attn);
    loss_fn = rs_loss;
    GRAD_OK(rs_x, dx, n);
  }

  int nb = MTOK * MH * (MNOPE + MVD);
  mk_kvb = arr(nb), mk_kr = arr(MTOK * MROPE), mk_Rk = arr(MTOK * MH * MST), mk_Rv = arr(MTOK * MH * MVD);
  mk_loss();
  for (int t = 0; t < MTOK; t++)
    for (int h = 0; h < MH; h++) {
      const double *src = mk_kvb + (t * MH + h) * (MNOPE + MVD);
      for (int i = 0; i < MST; i++)
        CHECK(mk_k[(t * MH + h) * MST + i] == (i < MNOPE ? src[i] : mk_kr[t * MROPE + i - MNOPE]));
      for (int i = 0; i < MVD; i++) CHECK(mk_v[(t * MH + h) * MVD + i] == src[MNOPE + i]);
    }
  for (int y = 0; y < 2; y++) { /* k scaled by 1, then by 1.7 (YaRN's softmax factor) */
    mk_s = y ? 1.7 : 1;
    double *dkvb = zeros(nb), *dkr = zeros(MTOK * MROPE);
    rt_mla_kv_backward(dkvb, dkr, mk_Rk, mk_Rv, MTOK, MH, MNOPE, MROPE, MVD, mk_s);
    loss_fn = mk_loss;
    GRAD_OK(mk_kvb, dkvb, nb);
    GRAD_OK(mk_kr, dkr, MTOK * MROPE);
  }
}

/* ---- activations */
enum { SN = 10 };
static double *sw_g, *sw_u, *sw_R, sw_h[SN];
static double sw_loss(void) {
  rt_swiglu_forward(sw_h, sw_g, sw_u, SN);
  return sum_prod(sw_h, sw_R, SN);
}
static double gl_h[SN];
static double gl_loss(void) {
  rt_gelu_forward(gl_h, sw_g, SN);
  return sum_prod(gl_h, sw_R, SN);
}
static void test_activations(void) {
  sw_g = arr(SN), sw_u = arr(SN), sw_R = arr(SN);
  double *dg = arr(SN), *du = arr(SN), *dx = arr(SN); /* written, not added to: start non-zero */
  loss_fn = sw_loss;
  rt_swiglu_backward(dg, du, sw_R, sw_g, sw_u, SN);
  GRAD_OK(sw_g, dg, SN);
  GRAD_OK(sw_u, du, SN);
  loss_fn = gl_loss;
  rt_gelu_backward(dx, sw_R, sw_g, SN);
  GRAD_OK(sw_g, dx, SN);
  /* the fused gate|up rows (rows x [g | u]) against the plain op on the halves */
  enum { GR = 3, GF = 5 };
  double *gu = arr(GR * 2 * GF), *dh = arr(GR * GF), *h = zeros(GR * GF), *dgu = arr(GR * 2 * GF), worst = 0;
  rt_swiglu_rows_forward(h, gu, GR, GF);
  rt_swiglu_rows_backward(dgu, dh, gu, GR, GF);
  for (int r = 0; r < GR; r++) {
    double hr[GF], dgr[GF], dur[GF];
    rt_swiglu_forward(hr, gu + r * 2 * GF, gu + r * 2 * GF + GF, GF);
    rt_swiglu_backward(dgr, dur, dh + r * GF, gu + r * 2 * GF, gu + r * 2 * GF + GF, GF);
    for (int j = 0; j < GF; j++)
      worst = fmax(worst, fmax(fabs(hr[j] - h[r * GF + j]),
                               fmax(fabs(dgr[j] - dgu[r * 2 * GF + j]), fabs(dur[j] - dgu[r * 2 * GF + GF + j]))));
  }
  CHECK(worst < 1e-15);
}

/* ---- router (both kinds) and the load-balancing loss */
enum { RTN = 5, RTE = 6, RTK = 2 };
static double *ro_l, *ro_R, *ro_bias, ro_w[RTN * RTK], ro_scratch[3 * RTE];
static int32_t ro_idx[RTN * RTK];
static bool ro_sig;
static double ro_loss(void) {
  int32_t idx[RTN * RTK];
  rt_router_forward(idx, ro_w, ro_l, ro_bias, RTN, RTE, RTK, ro_sig);
  if (memcmp(idx, ro_idx, sizeof idx) != 0) fprintf(stderr, "router: selection changed under h\n");
  return sum_prod(ro_w, ro_R, RTN * RTK);
}
static double aux_loss(void) { return rt_aux_loss_forward(ro_l, ro_idx, RTN, RTE, RTK, 0.01, ro_scratch); }
static void test_router(void) {
  ro_l = arr(RTN * RTE), ro_R = arr(RTN * RTK), ro_bias = arr(RTE);
  for (int sig = 0; sig < 2; sig++) {
    ro_sig = sig;
    double *dl = arr(RTN * RTE); /* stale values: the router's backward writes dlogits */
    rt_router_forward(ro_idx, ro_w, ro_l, sig ? ro_bias : NULL, RTN, RTE, RTK, sig);
    double *bias = ro_bias;
    if (!sig) ro_bias = NULL;
    loss_fn = ro_loss;
    rt_router_backward(dl, ro_R, ro_l, ro_idx, ro_w, RTN, RTE, RTK, sig);
    GRAD_OK(ro_l, dl, RTN * RTE);
    ro_bias = bias;
    /* weights of a token sum to 1; the selected scores are the K best */
    for (int n = 0; n < RTN; n++) CHECK(fabs(ro_w[n * RTK] + ro_w[n * RTK + 1] - 1) < 1e-12);
  }
  double *dl = zeros(RTN * RTE);
  loss_fn = aux_loss;
  rt_aux_loss_backward(dl, ro_l, ro_idx, RTN, RTE, RTK, 0.01, 1, ro_scratch);
  GRAD_OK(ro_l, dl, RTN * RTE);
  /* perfectly balanced routing with uniform probabilities gives alpha */
  double flat[4 * 4] = {0};
  int32_t idx[4] = {0, 1, 2, 3};
  CHECK(fabs(rt_aux_loss_forward(flat, idx, 4, 4, 1, 0.01, ro_scratch) - 0.01) < 1e-15);
}

/* ---- the routing weights' conventions: norm_topk_prob true/false × softmax/sigmoid, with a
 * routed_scaling_factor (the selection is rt_router_forward's, fixed) */
static bool rw_norm;
static const double rw_scale = 2.5;
static double rw_loss(void) {
  rt_router_weights(ro_w, ro_l, ro_idx, RTN, RTE, RTK, ro_sig, rw_norm, rw_scale);
  return sum_prod(ro_w, ro_R, RTN * RTK);
}
static void test_router_weights(void) {
  for (int c = 0; c < 4; c++) {
    ro_sig = c & 1, rw_norm = c & 2;
    rt_router_forward(ro_idx, ro_w, ro_l, NULL, RTN, RTE, RTK, ro_sig);
    double ref[RTN * RTK];
    memcpy(ref, ro_w, sizeof ref);
    double *dl = arr(RTN * RTE); /* stale values: written */
    loss_fn = rw_loss;
    rw_loss();
    rt_router_weights_backward(dl, ro_R, ro_l, ro_idx, ro_w, RTN, RTE, RTK, ro_sig, rw_norm, rw_scale);
    GRAD_OK(ro_l, dl, RTN * RTE);
    rw_loss();
    for (int i = 0; i < RTN * RTK; i++) {
      /* normalized: rt_router_forward's weights times the scale; raw softmax: below them */
      if (rw_norm) CHECK(fabs(ro_w[i] - rw_scale * ref[i]) < 1e-12);
      else if (!ro_sig) CHECK(ro_w[i] < rw_scale * ref[i] + 1e-12);
    }
  }
}

/* ---- group-limited routing: 6 experts in 3 groups of 2, the best group kept */
static void test_router_group(void) {
  /* group scores (sums of sigmoids): {0,1} σ(5) + σ(-5) = 1.00, {2,3} 2σ(2) = 1.76, {4,5} 2σ(1) =
   * 1.46. Plain top-2 takes experts 0 and 2; with one group of the three kept, 2 and 3 */
  double l[6] = {5, -5, 2, 2, 1, 1}, w[2], w0[2];
  int32_t ix[2], ix0[2];
  rt_router_group_forward(ix, w, l, NULL, 1, 6, 2, 3, 1, true);
  rt_router_forward(ix0, w0, l, NULL, 1, 6, 2, true);
  CHECK(ix0[0] == 0 && ix0[1] == 2);
  CHECK(ix[0] == 2 && ix[1] == 3);
  CHECK(fabs(w[0] - 0.5) < 1e-12 && fabs(w[1] - 0.5) < 1e-12);
  /* every group kept: the plain selection */
  rt_router_group_forward(ix, w, l, NULL, 1, 6, 2, 3, 3, true);
  CHECK(ix[0] == ix0[0] && ix[1] == ix0[1] && fabs(w[0] - w0[0]) < 1e-12);
  /* softmax (DeepSeek-V2's group_limited_greedy): a group scores its best probability, {0,1}
   * e^0, {2,3} e^-3, {4,5} e^-4: one group kept is {0,1}, weights 1 and e^-10 renormalized */
  rt_router_group_forward(ix, w, l, NULL, 1, 6, 2, 3, 1, false);
  CHECK(ix[0] == 0 && ix[1] == 1);
  CHECK(fabs(w[0] - 1 / (1 + exp(-10.0))) < 1e-12 && fabs(w[1] - exp(-10.0) / (1 + exp(-10.0))) < 1e-12);
  /* two groups kept, {0,1} and {2,3}: the plain softmax top-2 (0 and 2), its weights */
  rt_router_group_forward(ix, w, l, NULL, 1, 6, 2, 3, 2, false);
  rt_router_forward(ix0, w0, l, NULL, 1, 6, 2, false);
  CHECK(ix[0] == ix0[0] && ix[1] == ix0[1] && fabs(w[0] - w0[0]) < 1e-12 && fabs(w[1] - w0[1]) < 1e-12);
}

/* ---- Qwen2-MoE's gated shared expert: y += sigmoid(logit) x */
enum { GN = 3, GC = 5 };
static double *gt_x, *gt_l, *gt_R, gt_y[GN * GC];
static double gt_loss(void) {
  memset(gt_y, 0, sizeof gt_y);
  rt_sigmoid_gate_forward(gt_y, gt_x, gt_l, GN, GC);
  return sum_prod(gt_y, gt_R, GN * GC);
}
static void test_sigmoid_gate(void) {
  gt_x = arr(GN * GC), gt_l = arr(GN), gt_R = arr(GN * GC);
  double *dx = zeros(GN * GC), *dl = zeros(GN);
  loss_fn = gt_loss;
  rt_sigmoid_gate_backward(dx, dl, gt_R, gt_x, gt_l, GN, GC);
  GRAD_OK(gt_x, dx, GN * GC);
  GRAD_OK(gt_l, dl, GN);
}

/* ---- the MoE path: permute, gather, experts, combine (x, routing weights, expert weights) */
enum { XN = 4, XC = 5, XE = 3, XK = 2, XF = 4 };
static double *mx_x, *mx_wts, *mx_wg, *mx_wu, *mx_wd, *mx_R;
static int32_t mx_idx[XN * XK] = {0, 2, 1, 2, 2, 0, 1, 0}, mx_pos[XN * XK];
static int mx_off[XE + 1];
static double mx_xp[XN * XK * XC], mx_g[XN * XK * XF], mx_u[XN * XK * XF], mx_h[XN * XK * XF],
    mx_yp[XN * XK * XC], mx_y[XN * XC];
static double mx_loss(void) {
  rt_moe_gather(mx_xp, mx_x, mx_pos, XN, XK, XC);
  rt_experts_forward(mx_yp, mx_g, mx_u, mx_h, mx_xp, mx_wg, mx_wu, mx_wd, mx_off, XE, XE, 0, XC, XF);
  memset(mx_y, 0, sizeof mx_y);
  rt_moe_combine(mx_y, mx_yp, mx_wts, mx_pos, XN, XK, XC);
  return sum_prod(mx_y, mx_R, XN * XC);
}
static void test_moe(void) {
  mx_x = arr(XN * XC), mx_wts = arr(XN * XK), mx_R = arr(XN * XC);
  mx_wg = arr(XE * XF * XC), mx_wu = arr(XE * XF * XC), mx_wd = arr(XE * XC * XF);
  rt_moe_permute(mx_pos, mx_off, mx_idx, XN, XE, XK);
  /* expert 0 has assignments (0,0) (2,1) (3,1); expert 1: (1,0) (3,0); expert 2: the rest */
  CHECK_EQ(mx_off[1], 3);
  CHECK_EQ(mx_off[2], 5);
  CHECK_EQ(mx_off[3], 8);
  CHECK_EQ(mx_pos[0], 0);
  CHECK_EQ(mx_pos[5], 1);
  CHECK_EQ(mx_pos[7], 2);
  loss_fn = mx_loss;
  mx_loss();
  /* stale values where the ops write (dyp, dwts, dxp and the scratch dh, dg, du), zeros where they add */
  double *dyp = arr(XN * XK * XC), *dwts = arr(XN * XK), *dxp = arr(XN * XK * XC);
  double *dx = zeros(XN * XC), *dwg = zeros(XE * XF * XC), *dwu = zeros(XE * XF * XC), *dwd = zeros(XE * XC * XF);
  double *dh = arr(XN * XK * XF), *dg = arr(XN * XK * XF), *du = arr(XN * XK * XF);
  rt_moe_combine_backward(dyp, dwts, mx_R, mx_yp, mx_wts, mx_pos, XN, XK, XC);
  rt_experts_backward(dxp, dwg, dwu, dwd, dyp, mx_xp, mx_g, mx_u, mx_h, mx_wg, mx_wu, mx_wd, mx_off,
                      XE, XE, 0, XC, XF, dh, dg, du);
  rt_moe_gather_backward(dx, dxp, mx_pos, XN, XK, XC);
  GRAD_OK(mx_x, dx, XN * XC);
  GRAD_OK(mx_wts, dwts, XN * XK);
  GRAD_OK(mx_wg, dwg, XE * XF * XC);
  GRAD_OK(mx_wu, dwu, XE * XF * XC);
  GRAD_OK(mx_wd, dwd, XE * XC * XF);

  /* the same experts in whole-expert shards of 2 (the last one short), 2·F·C + 3 elements apart:
   * identical outputs and gradients, bit for bit, and the gaps untouched */
  mx_loss(); /* the activations again, from the unperturbed weights */
  enum { SP = 2, SST = SP * XF * XC + 3, SSN = 2 * SST };
  double *sw[3], *sdw[3], *fw[3] = {mx_wg, mx_wu, mx_wd}, *fdw[3] = {dwg, dwu, dwd};
  for (int i = 0; i < 3; i++) {
    sw[i] = arr(SSN), sdw[i] = zeros(SSN);
    for (int e = 0; e < XE; e++)
      memcpy(sw[i] + (e / SP) * SST + (e % SP) * XF * XC, fw[i] + e * XF * XC, sizeof(double) * XF * XC);
  }
  double *yp = zeros(XN * XK * XC), *g = zeros(XN * XK * XF), *u = zeros(XN * XK * XF), *h = zeros(XN * XK * XF);
  double *sdxp = arr(XN * XK * XC);
  rt_experts_forward(yp, g, u, h, mx_xp, sw[0], sw[1], sw[2], mx_off, XE, SP, SST, XC, XF);
  CHECK(memcmp(yp, mx_yp, sizeof mx_yp) == 0 && memcmp(h, mx_h, sizeof mx_h) == 0);
  rt_experts_backward(sdxp, sdw[0], sdw[1], sdw[2], dyp, mx_xp, g, u, h, sw[0], sw[1], sw[2], mx_off, XE, SP, SST,
                      XC, XF, dh, dg, du);
  CHECK(memcmp(sdxp, dxp, sizeof(double) * XN * XK * XC) == 0);
  for (int i = 0; i < 3; i++) {
    for (int e = 0; e < XE; e++)
      CHECK(memcmp(sdw[i] + (e / SP) * SST + (e % SP) * XF * XC, fdw[i] + e * XF * XC, sizeof(double) * XF * XC) == 0);
    for (int j = 0; j < 3; j++) CHECK(sdw[i][SP * XF * XC + j] == 0 && sdw[i][SST + SP * XF * XC + j] == 0);
  }
}

/* ---- learned positions: x (B,T,C) + wpe[t] (B 2, T 3, C 4; wpe has 5 rows, 2 unused) */
static double *ps_x, *ps_w, *ps_R, ps_out[2 * 3 * 4];
static double ps_loss(void) {
  memcpy(ps_out, ps_x, sizeof ps_out);
  rt_position_forward(ps_out, ps_w, 2, 3, 4);
  return sum_prod(ps_out, ps_R, 2 * 3 * 4);
}
static void test_position(void) {
  ps_x = arr(2 * 3 * 4), ps_w = arr(5 * 4), ps_R = arr(2 * 3 * 4);
  double *dw = zeros(5 * 4);
  loss_fn = ps_loss;
  rt_position_backward(dw, ps_R, 2, 3, 4);
  GRAD_OK(ps_w, dw, 5 * 4);
  CHECK(dw[16] == 0 && dw[19] == 0); /* rows past T get no gradient */
}

/* ---- LayerNorm with and without bias, and a bias over columns (N 3, C 7) */
static double *lnx, *lnw, *lnb, *lnR, ln_out[3 * 7], ln_mean[3], ln_rstd[3];
static const double *ln_bias;
static double lnorm_loss(void) {
  rt_layernorm_forward(ln_out, ln_mean, ln_rstd, lnx, lnw, ln_bias, 3, 7, 1e-5);
  return sum_prod(ln_out, lnR, 3 * 7);
}
static double bias_loss(void) {
  memcpy(ln_out, lnx, sizeof ln_out);
  rt_bias_forward(ln_out, lnb, 3, 7);
  return sum_prod(ln_out, lnR, 3 * 7);
}
static void test_layernorm(void) {
  lnx = arr(3 * 7), lnw = arr(7), lnb = arr(7), lnR = arr(3 * 7);
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    ln_bias = with_bias ? lnb : NULL;
    loss_fn = lnorm_loss;
    lnorm_loss();
    double *dx = zeros(3 * 7), *dw = zeros(7), *db = zeros(7);
    rt_layernorm_backward(dx, dw, with_bias ? db : NULL, lnR, lnx, lnw, ln_mean, ln_rstd, 3, 7);
    GRAD_OK(lnx, dx, 3 * 7);
    GRAD_OK(lnw, dw, 7);
    if (with_bias) GRAD_OK(lnb, db, 7);
  }
  loss_fn = bias_loss;
  double *db = zeros(7);
  rt_bias_backward(db, lnR, 3, 7);
  GRAD_OK(lnb, db, 7);
}

/* GELU experts (wg NULL): yp = gelu(xp wuᵀ) wdᵀ; no gate, g and dg unused. */
static double mx_gelu_loss(void) {
  rt_moe_gather(mx_xp, mx_x, mx_pos, XN, XK, XC);
  rt_experts_forward(mx_yp, NULL, mx_u, mx_h, mx_xp, NULL, mx_wu, mx_wd, mx_off, XE, XE, 0, XC, XF);
  memset(mx_y, 0, sizeof mx_y);
  rt_moe_combine(mx_y, mx_yp, mx_wts, mx_pos, XN, XK, XC);
  return sum_prod(mx_y, mx_R, XN * XC);
}
static void test_moe_gelu(void) {
  loss_fn = mx_gelu_loss;
  mx_gelu_loss();
  double *dyp = arr(XN * XK * XC), *dwts = arr(XN * XK), *dxp = arr(XN * XK * XC); /* stale: written */
  double *dx = zeros(XN * XC), *dwu = zeros(XE * XF * XC), *dwd = zeros(XE * XC * XF);
  double *dh = arr(XN * XK * XF), *du = arr(XN * XK * XF);
  rt_moe_combine_backward(dyp, dwts, mx_R, mx_yp, mx_wts, mx_pos, XN, XK, XC);
  rt_experts_backward(dxp, NULL, dwu, dwd, dyp, mx_xp, NULL, mx_u, mx_h, NULL, mx_wu, mx_wd, mx_off,
                      XE, XE, 0, XC, XF, dh, NULL, du);
  rt_moe_gather_backward(dx, dxp, mx_pos, XN, XK, XC);
  GRAD_OK(mx_x, dx, XN * XC);
  GRAD_OK(mx_wts, dwts, XN * XK);
  GRAD_OK(mx_wu, dwu, XE * XF * XC);
  GRAD_OK(mx_wd, dwd, XE * XC * XF);
}

/* ---- embedding and the LM head with chunked cross-entropy (chunks of 4 over 10 words) */
enum { LN = 3, LC = 4, LV = 10 };
static double *lm_x, *lm_w, lm_lse[LN], lm_scratch[LN * 4];
static int32_t lm_t[LN] = {7, 0, 9};
static double lm_loss(void) { return rt_lm_head_ce_forward(lm_lse, lm_x, lm_w, lm_t, LN, LC, LV, 4, lm_scratch); }
static double *em_w, *em_R, em_out[LN * LC];
static double em_loss(void) {
  rt_embedding_forward(em_out, lm_t, em_w, LN, LC);
  return sum_prod(em_out, em_R, LN * LC);
}
static void test_head(void) {
  lm_x = arr(LN * LC), lm_w = arr(LV * LC);
  double *dx = zeros(LN * LC), *dw = zeros(LV * LC);
  loss_fn = lm_loss;
  double loss = lm_loss();
  rt_lm_head_ce_backward(dx, dw, lm_x, lm_w, lm_t, lm_lse, LN, LC, LV, 4, lm_scratch, 1);
  GRAD_OK(lm_x, dx, LN * LC);
  GRAD_OK(lm_w, dw, LV * LC);
  /* the chunked loss equals the loss over whole rows of logits */
  double ref = 0;
  for (int n = 0; n < LN; n++) {
    double z[LV], m = -INFINITY, s = 0;
    for (int v = 0; v < LV; v++) z[v] = sum_prod(lm_x + n * LC, lm_w + v * LC, LC), m = fmax(m, z[v]);
    for (int v = 0; v < LV; v++) s += exp(z[v] - m);
    ref += m + log(s) - z[lm_t[n]];
  }
  CHECK(fabs(loss - ref / LN) < 1e-12);
  em_w = arr(LV * LC), em_R = arr(LN * LC);
  double *dew = zeros(LV * LC);
  rt_embedding_backward(dew, em_R, lm_t, LN, LC);
  loss_fn = em_loss;
  GRAD_OK(em_w, dew, LV * LC);
}

/* ---- the fused projection's rows q | k | v: rt_rope_qkv_* and rt_attention_qkv_* equal the plain
 * ops on the parts copied out (forward, backward; dqkv written over non-zero values) */
static void test_qkv(void) {
  enum { FB = 2, FT = 6, FH = 4, FKV = 2, FD = 4, FQ = FH * FD, FK = FKV * FD, FW = FQ + 2 * FK, FN = FB * FT };
  double *qkv = arr(FN * FW), *dout = arr(FN * FQ), *q = zeros(FN * FQ), *k = zeros(FN * FK), *v = zeros(FN * FK);
  double *out = zeros(FN * FQ), *lse = zeros(FN * FH), *fout = zeros(FN * FQ), *flse = zeros(FN * FH);
  double *dq = zeros(FN * FQ), *dk = zeros(FN * FK), *dv = zeros(FN * FK), *dqkv = arr(FN * FW), worst = 0;
  rt_rope_qkv_forward(qkv, FB, FT, FH, FKV, FD, 100);
  for (int n = 0; n < FN; n++) {
    memcpy(q + n * FQ, qkv + n * FW, sizeof(double) * FQ);
    memcpy(k + n * FK, qkv + n * FW + FQ, sizeof(double) * FK);
    memcpy(v + n * FK, qkv + n * FW + FQ + FK, sizeof(double) * FK);
  }
  rt_rope_qkv_backward(qkv, FB, FT, FH, FKV, FD, 100); /* back to the projections */
  double *q0 = zeros(FN * FQ), *k0 = zeros(FN * FK);
  for (int n = 0; n < FN; n++)
    memcpy(q0 + n * FQ, qkv + n * FW, sizeof(double) * FQ), memcpy(k0 + n * FK, qkv + n * FW + FQ, sizeof(double) * FK);
  rt_rope_forward(q0, FB, FT, FH, FD, 100), rt_rope_forward(k0, FB, FT, FKV, FD, 100);
  for (int i = 0; i < FN * FQ; i++) worst = fmax(worst, fabs(q0[i] - q[i]));
  for (int i = 0; i < FN * FK; i++) worst = fmax(worst, fabs(k0[i] - k[i]));
  rt_rope_qkv_forward(qkv, FB, FT, FH, FKV, FD, 100);
  rt_attention_forward(out, lse, q, k, v, FB, FT, FH, FKV, FD, FD);
  rt_attention_qkv_forward(fout, flse, qkv, FB, FT, FH, FKV, FD);
  for (int i = 0; i < FN * FQ; i++) worst = fmax(worst, fabs(fout[i] - out[i]));
  for (int i = 0; i < FN * FH; i++) worst = fmax(worst, fabs(flse[i] - lse[i]));
  rt_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, FB, FT, FH, FKV, FD, FD);
  rt_attention_qkv_backward(dqkv, dout, qkv, out, lse, FB, FT, FH, FKV, FD);
  for (int n = 0; n < FN; n++) {
    for (int i = 0; i < FQ; i++) worst = fmax(worst, fabs(dqkv[n * FW + i] - dq[n * FQ + i]));
    for (int i = 0; i < FK; i++) worst = fmax(worst, fabs(dqkv[n * FW + FQ + i] - dk[n * FK + i]));
    for (int i = 0; i < FK; i++) worst = fmax(worst, fabs(dqkv[n * FW + FQ + FK + i] - dv[n * FK + i]));
  }
  printf("fused q|k|v rows against the plain ops: worst difference %.1e\n", worst);
  CHECK(worst < 1e-12);
}

/* ---- context parallelism: a rank's chunks (positions [lo, lo + c) and [hi, hi + c) of each sequence of
 * S) against the whole sequences: rt_attention_span_* and rt_rope_span_* give the rows the plain ops
 * give at those positions, and the ranks' dk, dv over the whole range add up to the plain ones. */
enum { SB = 2, SS = 8, SH = 4, SKV = 2, SD = 4, SCP = 2 };
static void test_span(void) {
  const int T = SS / SCP, c = T / 2, q1 = SH * SD, k1 = SKV * SD;
  double *q = arr(SB * SS * q1), *k = arr(SB * SS * k1), *v = arr(SB * SS * k1), *dout = arr(SB * SS * q1);
  double *out = zeros(SB * SS * q1), *lse = zeros(SB * SH * SS), *dq = zeros(SB * SS * q1), *dk = zeros(SB * SS * k1),
         *dv = zeros(SB * SS * k1), *rq = zeros(SB * SS * q1);
  rt_attention_forward(out, lse, q, k, v, SB, SS, SH, SKV, SD, SD);
  rt_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, SB, SS, SH, SKV, SD, SD);
  memcpy(rq, q, sizeof(double) * SB * SS * q1);
  rt_rope_forward(rq, SB, SS, SH, SD, 10000);
  double *sk = zeros(SB * SS * k1), *sv = zeros(SB * SS * k1), worst = 0;
  for (int r = 0; r < SCP; r++) {
    int64_t lo = (int64_t)r * c, hi = (int64_t)(2 * SCP - 1 - r) * c;
    double *lq = zeros(SB * T * q1), *ldo = zeros(SB * T * q1), *lo_ = zeros(SB * T * q1), *llse = zeros(SB * SH * T);
    double *ldq = zeros(SB * T * q1), *lrq = zeros(SB * T * q1);
    for (int b = 0; b < SB; b++)
      for (int t = 0; t < T; t++) {
        int64_t pos = t < c ? lo + t : hi + t - c;
        memcpy(lq + ((size_t)b * T + t) * q1, q + ((size_t)b * SS + pos) * q1, sizeof(double) * q1);
        memcpy(ldo + ((size_t)b * T + t) * q1, dout + ((size_t)b * SS + pos) * q1, sizeof(double) * q1);
      }
    memcpy(lrq, lq, sizeof(double) * SB * T * q1);
    rt_rope_span_forward(lrq, SB, T, SH, SD, SD, 10000, lo, hi);
    rt_attention_span_forward(lo_, llse, lq, k, v, SB, T, SS, lo, hi, SH, SKV, SD, SD);
    rt_attention_span_backward(ldq, sk, sv, ldo, lq, k, v, lo_, llse, NULL, SB, T, SS, lo, hi, SH, SKV, SD, SD);
    for (int b = 0; b < SB; b++)
      for (int t = 0; t < T; t++) {
        int64_t pos = t < c ? lo + t : hi + t - c;
        for (int i = 0; i < q1; i++) {
          size_t a = ((size_t)b * T + t) * q1 + i, f = ((size_t)b * SS + pos) * q1 + i;
          worst = fmax(worst, fmax(fabs(lo_[a] - out[f]), fmax(fabs(ldq[a] - dq[f]), fabs(lrq[a] - rq[f]))));
        }
        for (int h = 0; h < SH; h++)
          worst = fmax(worst, fabs(llse[((size_t)b * SH + h) * T + t] - lse[((size_t)b * SH + h) * SS + pos]));
      }
  }
  for (int i = 0; i < SB * SS * k1; i++) worst = fmax(worst, fmax(fabs(sk[i] - dk[i]), fabs(sv[i] - dv[i])));
  CHECK(worst < 1e-12);
}

int main(void) {
  test_rmsnorm();
  test_qk_norm();
  test_matmul();
  test_rope();
  test_rope_llama3();
  test_rope_yarn();
  test_attention();
  test_attention_long();
  test_add_rmsnorm();
  test_qkv();
  test_span();
  test_mla();
  test_activations();
  test_router();
  test_router_weights();
  test_sigmoid_gate();
  test_router_group();
  test_moe();
  test_moe_gelu();
  test_position();
  test_layernorm();
  test_head();
  while (nallocs) free(allocs[--nallocs]);
  return CHECK_DONE("test_ops");
}
