/* ops_moe.c — cpu ops of the MoE path: router with top-k, load-balancing loss, token
 * permutation, gather/combine, and the routed experts' SwiGLU FFNs. */
#include <math.h>
#include <string.h>

#include "gemm.h"
#include "mtrt_ckpt.h" /* rt_fnv1a */

uint64_t rt_route_hash;

static real sigmoid(real x) { return 1 / (1 + EXP(-x)); }

/* The K best of score[0..E) into idx (descending; ties to the lower index). */
static void top_k(int32_t *idx, const real *score, const real *bias, bool sig, int E, int K) {
  for (int j = 0; j < K; j++) idx[j] = -1;
  for (int e = 0; e < E; e++) {
    real s = sig ? sigmoid(score[e]) : score[e];
    if (bias) s += bias[e];
    int j = K;
    while (j > 0) {
      int32_t o = idx[j - 1];
      real so = 0;
      if (o >= 0) so = (sig ? sigmoid(score[o]) : score[o]) + (bias ? bias[o] : 0);
      if (o >= 0 && so >= s) break;
      j--;
    }
    if (j == K) continue;
    memmove(idx + j + 1, idx + j, sizeof *idx * (size_t)(K - j - 1));
    idx[j] = e;
  }
}

void rt_router_forward(int32_t *idx, real *wts, const real *logits, const real *bias, int N, int E,
                       int K, bool sig) {
  for (int n = 0; n < N; n++) {
    const real *l = logits + (size_t)n * E;
    int32_t *ix = idx + (size_t)n * K;
    real *w = wts + (size_t)n * K;
    top_k(ix, l, bias, sig, E, K);
    real sum = 0;
    if (sig) {
      for (int j = 0; j < K; j++) sum += w[j] = sigmoid(l[ix[j]]);
    } else {
      real m = l[ix[0]];
      for (int j = 0; j < K; j++) sum += w[j] = EXP(l[ix[j]] - m);
    }
    for (int j = 0; j < K; j++) w[j] /= sum;
  }
  rt_route_hash = rt_fnv1a(rt_route_hash, idx, sizeof *idx * (size_t)N * (size_t)K);
}

/* Both weightings are w_j = a_j / Σ a: dA_j = (dw_j − Σ_i w_i dw_i) / Σ a; then through
 * a = exp(l − m) (da/dl = a) or a = σ(l) (da/dl = a (1 − a)). */
void rt_router_backward(real *dlogits, const real *dwts, const real *logits, const int32_t *idx,
                        const real *wts, int N, int E, int K, bool sig) {
  for (int n = 0; n < N; n++) {
    const real *l = logits + (size_t)n * E, *w = wts + (size_t)n * K, *dw = dwts + (size_t)n * K;
    const int32_t *ix = idx + (size_t)n * K;
    real wdw = 0;
    for (int j = 0; j < K; j++) wdw += w[j] * dw[j];
    memset(dlogits + (size_t)n * E, 0, sizeof(real) * (size_t)E); /* written: 0 where not selected */
    for (int j = 0; j < K; j++) {
      real g = w[j] * (dw[j] - wdw); /* = a_j dA_j */
      if (sig) g *= 1 - sigmoid(l[ix[j]]);
      dlogits[(size_t)n * E + ix[j]] += g;
    }
  }
}

/* The n best of key[0..m) into out (descending; ties to the lower index). */
static void best_n(int32_t *out, const real *key, int m, int n) {
  for (int j = 0; j < n; j++) out[j] = -1;
  for (int e = 0; e < m; e++) {
    int j = n;
    while (j > 0 && !(out[j - 1] >= 0 && key[out[j - 1]] >= key[e])) j--;
    if (j == n) continue;
    memmove(out + j + 1, out + j, sizeof *out * (size_t)(n - j - 1));
    out[j] = e;
  }
}

/* A selection key of group-limited routing: σ(l_e) or exp(l_e − m) (softmax's order), + bias_e. */
static real group_key(const real *l, const act *bias, int e, bool sig, real m) {
  return (sig ? sigmoid(l[e]) : EXP(l[e] - m)) + (bias ? bias[e] : 0);
}

void rt_router_group_forward(int32_t *idx, real *wts, const real *logits, const act *bias, int N, int E, int K,
                             int n_group, int topk_group, bool sig) {
  int per = E / n_group;
  for (int n = 0; n < N; n++) {
    const real *l = logits + (size_t)n * E;
    int32_t *ix = idx + (size_t)n * K;
    real *w = wts + (size_t)n * K, m = -INFINITY;
    for (int e = 0; e < E && !sig; e++) m = l[e] > m ? l[e] : m;
    real gscore[RT_MAX_GROUPS];
    int32_t chosen[RT_MAX_GROUPS];
    bool in[RT_MAX_GROUPS] = {0};
    for (int g = 0; g < n_group; g++) { /* sigmoid: the sum of the group's two best keys; softmax: its best */
      real a = -INFINITY, b = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; e++) {
        real k = group_key(l, bias, e, sig, m);
        if (k > a) b = a, a = k;
        else if (k > b) b = k;
      }
      gscore[g] = sig ? a + b : a;
    }
    best_n(chosen, gscore, n_group, topk_group);
    for (int j = 0; j < topk_group; j++) in[chosen[j]] = true;
    for (int j = 0; j < K; j++) ix[j] = -1;
    for (int e = 0; e < E; e++) { /* insertion by key, 0 outside the chosen groups */
      real k = in[e / per] ? group_key(l, bias, e, sig, m) : 0;
      int j = K;
      while (j > 0) {
        int32_t o = ix[j - 1];
        if (o >= 0 && (in[o / per] ? group_key(l, bias, o, sig, m) : 0) >= k) break;
        j--;
      }
      if (j == K) continue;
      memmove(ix + j + 1, ix + j, sizeof *ix * (size_t)(K - j - 1));
      ix[j] = e;
    }
    real sum = 0;
    for (int j = 0; j < K; j++) sum += w[j] = sig ? sigmoid(l[ix[j]]) : EXP(l[ix[j]] - m);
    for (int j = 0; j < K; j++) w[j] /= sum;
  }
  rt_route_hash = rt_fnv1a(rt_route_hash, idx, sizeof *idx * (size_t)N * (size_t)K);
}

void rt_router_weights(real *wts, const real *logits, const int32_t *idx, int N, int E, int K, bool sig, bool norm,
                       real scale) {
  for (int n = 0; n < N; n++) {
    const real *l = logits + (size_t)n * E;
    const int32_t *ix = idx + (size_t)n * K;
    real *w = wts + (size_t)n * K;
    real m = l[ix[0]], den = 0;
    if (!sig && !norm) /* the softmax over every expert */
      for (int e = 1; e < E; e++) m = fmax(m, l[e]);
    else
      for (int j = 1; j < K; j++) m = fmax(m, l[ix[j]]);
    for (int j = 0; j < K; j++) w[j] = sig ? sigmoid(l[ix[j]]) : EXP(l[ix[j]] - m);
    if (norm) for (int j = 0; j < K; j++) den += w[j];
    else if (!sig) for (int e = 0; e < E; e++) den += EXP(l[e] - m);
    else den = 1;
    for (int j = 0; j < K; j++) w[j] = scale * w[j] / den;
  }
}

void rt_router_weights_backward(real *dlogits, const real *dwts, const real *logits, const int32_t *idx,
                                const real *wts, int N, int E, int K, bool sig, bool norm, real scale) {
  for (int n = 0; n < N; n++) {
    const real *l = logits + (size_t)n * E, *w = wts + (size_t)n * K, *dw = dwts + (size_t)n * K;
    const int32_t *ix = idx + (size_t)n * K;
    real *dl = dlogits + (size_t)n * E;
    real wdw = 0; /* Σ_j w_j dw_j = Σ_j u_j (s dw_j) */
    for (int j = 0; j < K; j++) wdw += w[j] * dw[j];
    memset(dl, 0, sizeof(real) * (size_t)E); /* written: 0 where no gradient flows */
    if (norm) {
      for (int j = 0; j < K; j++) {
        real g = w[j] / scale * (scale * dw[j] - wdw);
        if (sig) g *= 1 - sigmoid(l[ix[j]]);
        dl[ix[j]] += g;
      }
    } else if (sig) {
      for (int j = 0; j < K; j++) {
        real a = sigmoid(l[ix[j]]);
        dl[ix[j]] += scale * dw[j] * a * (1 - a);
      }
    } else {
      real m = l[0], den = 0;
      for (int e = 1; e < E; e++) m = fmax(m, l[e]);
      for (int e = 0; e < E; e++) den += EXP(l[e] - m);
      for (int e = 0; e < E; e++) dl[e] -= EXP(l[e] - m) / den * wdw;
      for (int j = 0; j < K; j++) dl[ix[j]] += w[j] * dw[j]; /* p_e s dw_e = w_j dw_j */
    }
  }
}

void rt_sigmoid_gate_forward(act *y, const act *x, const real *logit, int N, int C) {
  for (int n = 0; n < N; n++) {
    real g = sigmoid(logit[n]);
    for (int c = 0; c < C; c++) y[(size_t)n * C + c] += g * x[(size_t)n * C + c];
  }
}

void rt_sigmoid_gate_backward(act *dx, real *dlogit, const act *dy, const act *x, const real *logit, int N, int C) {
  for (int n = 0; n < N; n++) {
    real g = sigmoid(logit[n]), dot = 0;
    for (int c = 0; c < C; c++) {
      dot += dy[(size_t)n * C + c] * x[(size_t)n * C + c];
      dx[(size_t)n * C + c] += g * dy[(size_t)n * C + c];
    }
    dlogit[n] += g * (1 - g) * dot;
  }
}

static void softmax_row(real *p, const real *l, int E) {
  real m = l[0], s = 0;
  for (int e = 1; e < E; e++) m = fmax(m, l[e]);
  for (int e = 0; e < E; e++) s += p[e] = EXP(l[e] - m);
  for (int e = 0; e < E; e++) p[e] /= s;
}

real rt_aux_loss_forward(const real *logits, const int32_t *idx, int N, int E, int K, real alpha,
                         real *scratch) {
  real *p = scratch, *f = scratch + E, *P = scratch + 2 * E, loss = 0;
  memset(f, 0, sizeof(real) * 2 * (size_t)E);
  for (int a = 0; a < N * K; a++) f[idx[a]] += (real)1 / (real)(N * K);
  for (int n = 0; n < N; n++) {
    softmax_row(p, logits + (size_t)n * E, E);
    for (int e = 0; e < E; e++) P[e] += p[e] / (real)N;
  }
  for (int e = 0; e < E; e++) loss += f[e] * P[e];
  return alpha * (real)E * loss;
}

void rt_aux_loss_stats(const real *logits, const int32_t *idx, int N, int E, int K, real *scratch) {
  real *p = scratch, *f = scratch + E, *P = scratch + 2 * E;
  memset(f, 0, sizeof(real) * 2 * (size_t)E);
  for (int a = 0; a < N * K; a++) f[idx[a]] += (real)1 / (real)(N * K);
  for (int n = 0; n < N; n++) {
    softmax_row(p, logits + (size_t)n * E, E);
    for (int e = 0; e < E; e++) P[e] += p[e] / (real)N;
  }
}

real rt_aux_loss_value(const real *scratch, int E, real alpha) {
  real loss = 0;
  for (int e = 0; e < E; e++) loss += scratch[E + e] * scratch[2 * E + e];
  return alpha * (real)E * loss;
}

void rt_aux_loss_backward_stats(real *dlogits, const real *logits, int N, int E, real alpha, real dloss,
                                real *scratch) {
  real *p = scratch, *f = scratch + E;
  for (int n = 0; n < N; n++) {
    softmax_row(p, logits + (size_t)n * E, E);
    real pg = 0;
    for (int e = 0; e < E; e++) pg += p[e] * f[e];
    for (int e = 0; e < E; e++)
      dlogits[(size_t)n * E + e] += dloss * alpha * (real)E / (real)N * p[e] * (f[e] - pg);
  }
}

/* dL/dp_{n,e} = alpha E f_e / N; through softmax: dl_e = p_e (g_e − Σ p g). */
void rt_aux_loss_backward(real *dlogits, const real *logits, const int32_t *idx, int N, int E,
                          int K, real alpha, real dloss, real *scratch) {
  real *p = scratch, *f = scratch + E;
  memset(f, 0, sizeof(real) * (size_t)E);
  for (int a = 0; a < N * K; a++) f[idx[a]] += (real)1 / (real)(N * K);
  for (int n = 0; n < N; n++) {
    softmax_row(p, logits + (size_t)n * E, E);
    real pg = 0;
    for (int e = 0; e < E; e++) pg += p[e] * f[e];
    for (int e = 0; e < E; e++)
      dlogits[(size_t)n * E + e] += dloss * alpha * (real)E / (real)N * p[e] * (f[e] - pg);
  }
}

/* The affinities of one token (row l of E logits) into p: softmax, or sigmoid normalized to sum 1. */
static void affinity_row(real *p, const real *l, int E, bool sig) {
  if (!sig) { softmax_row(p, l, E); return; }
  real s = 0;
  for (int e = 0; e < E; e++) s += p[e] = sigmoid(l[e]);
  for (int e = 0; e < E; e++) p[e] /= s;
}

/* f (E) = E / (K T) · the assignments of the T tokens from idx (T · K entries) to each expert. */
static void seq_fractions(real *f, const int32_t *idx, int E, int K, int T) {
  memset(f, 0, sizeof(real) * (size_t)E);
  for (int a = 0; a < T * K; a++) f[idx[a]] += (real)E / (real)(K * T);
}

real rt_seq_aux_loss_forward(const real *logits, const int32_t *idx, int N, int E, int K, int T, bool sig,
                             real alpha, real *scratch) {
  real *p = scratch, *f = scratch + E, loss = 0;
  int B = N / T;
  for (int b = 0; b < B; b++) {
    seq_fractions(f, idx + (size_t)b * T * K, E, K, T);
    for (int t = 0; t < T; t++) {
      affinity_row(p, logits + ((size_t)b * T + t) * E, E, sig);
      for (int e = 0; e < E; e++) loss += f[e] * p[e];
    }
  }
  return alpha * loss / (real)(B * T);
}

/* dL/ds_{t,e} = g_e = alpha f_{b,e} / (B T). Softmax: dl_e = p_e (g_e − Σ p g); normalized sigmoid
 * s'_e = σ_e / S: dl_e = σ_e (1 − σ_e) / S · (g_e − Σ s' g). */
void rt_seq_aux_loss_backward(real *dlogits, const real *logits, const int32_t *idx, int N, int E, int K, int T,
                              bool sig, real alpha, real dloss, real *scratch) {
  real *p = scratch, *f = scratch + E;
  int B = N / T;
  real c = dloss * alpha / (real)(B * T);
  for (int b = 0; b < B; b++) {
    seq_fractions(f, idx + (size_t)b * T * K, E, K, T);
    for (int t = 0; t < T; t++) {
      size_t n = (size_t)b * T + t;
      const real *l = logits + n * E;
      affinity_row(p, l, E, sig);
      real pg = 0, S = 0;
      for (int e = 0; e < E; e++) pg += p[e] * f[e];
      for (int e = 0; sig && e < E; e++) S += sigmoid(l[e]);
      for (int e = 0; e < E; e++) {
        real d = sig ? sigmoid(l[e]) * (1 - sigmoid(l[e])) / S : p[e];
        dlogits[n * E + e] += c * d * (f[e] - pg);
      }
    }
  }
}

void rt_moe_permute(int32_t *pos, int *offsets, const int32_t *idx, int N, int E, int K) {
  for (int e = 0; e <= E; e++) offsets[e] = 0;
  for (int a = 0; a < N * K; a++) offsets[idx[a] + 1]++;
  for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
  /* stable: within an expert, assignments keep token order; offsets[e] is restored below */
  for (int a = 0; a < N * K; a++) pos[a] = offsets[idx[a]]++;
  for (int e = E; e > 0; e--) offsets[e] = offsets[e - 1];
  offsets[0] = 0;
}

void rt_moe_gather(act *xp, const act *x, const int32_t *pos, int N, int K, int C) {
  for (int n = 0; n < N; n++)
    for (int j = 0; j < K; j++)
      memcpy(xp + (size_t)pos[n * K + j] * C, x + (size_t)n * C, sizeof(real) * (size_t)C);
}

void rt_moe_gather_backward(act *dx, const act *dxp, const int32_t *pos, int N, int K, int C) {
  for (int n = 0; n < N; n++)
    for (int j = 0; j < K; j++) {
      const real *g = dxp + (size_t)pos[n * K + j] * C;
      for (int c = 0; c < C; c++) dx[(size_t)n * C + c] += g[c];
    }
}

void rt_moe_combine(act *y, const act *yp, const real *wts, const int32_t *pos, int N, int K, int C) {
  for (int n = 0; n < N; n++)
    for (int j = 0; j < K; j++) {
      const real *r = yp + (size_t)pos[n * K + j] * C;
      real w = wts[n * K + j];
      for (int c = 0; c < C; c++) y[(size_t)n * C + c] += w * r[c];
    }
}

void rt_moe_combine_backward(act *dyp, real *dwts, const act *dy, const act *yp, const real *wts, const int32_t *pos,
                             int N, int K, int C) {
  for (int n = 0; n < N; n++)
    for (int j = 0; j < K; j++) {
      size_t row = (size_t)pos[n * K + j] * C;
      const real *g = dy + (size_t)n * C;
      real w = wts[n * K + j], s = 0;
      for (int c = 0; c < C; c++) {
        if (dyp) dyp[row + c] = w * g[c];
        s += g[c] * yp[row + c];
      }
      if (dwts) dwts[n * K + j] = s;
    }
}

/* Element offset of expert e's (OC × IC = mat elements) matrix: shards of `per` whole experts,
 * `stride` elements apart (mtrt_ops.h). */
static size_t expert_at(int e, int per, int64_t stride, size_t mat) {
  return (size_t)(e / per) * (size_t)stride + (size_t)(e % per) * mat;
}

void rt_experts_forward(act *yp, act *g, act *u, act *h, const act *xp, const act *wg, const act *wu, const act *wd,
                        const int *offsets, int E, int per, int64_t stride, int C, int F) {
  for (int e = 0; e < E; e++) {
    int r0 = offsets[e], rows = offsets[e + 1] - r0;
    if (!rows) continue;
    size_t ri = (size_t)r0 * F, rc = (size_t)r0 * C, we = expert_at(e, per, stride, (size_t)F * C);
    rt_matmul_forward(u + ri, xp + rc, wu + we, NULL, rows, C, F);
    if (wg) {
      rt_matmul_forward(g + ri, xp + rc, wg + we, NULL, rows, C, F);
      rt_swiglu_forward(h + ri, g + ri, u + ri, (int64_t)rows * F);
    } else {
      rt_gelu_forward(h + ri, u + ri, (int64_t)rows * F); /* GELU experts: h = gelu(u) */
    }
    rt_matmul_forward(yp + rc, h + ri, wd + we, NULL, rows, F, C);
  }
}

void rt_experts_backward(act *dxp, act *dwg, act *dwu, act *dwd, const act *dyp, const act *xp, const act *g,
                         const act *u, const act *h, const act *wg, const act *wu, const act *wd, const int *offsets,
                         int E, int per, int64_t stride, int C, int F, act *dh, act *dg, act *du) {
  for (int e = 0; e < E; e++) {
    int r0 = offsets[e], rows = offsets[e + 1] - r0;
    if (!rows) continue;
    size_t ri = (size_t)r0 * F, rc = (size_t)r0 * C, we = expert_at(e, per, stride, (size_t)F * C);
    /* dh, then dg and du, are written; dxp's rows by their first writer (gate, else up) */
    rt_matmul_backward_set(dh + ri, dwd ? dwd + we : NULL, NULL, dyp + rc, h + ri, wd + we, rows, F, C);
    if (wg) {
      rt_swiglu_backward(dg + ri, du + ri, dh + ri, g + ri, u + ri, (int64_t)rows * F);
      rt_matmul_backward_set(dxp ? dxp + rc : NULL, dwg ? dwg + we : NULL, NULL, dg + ri, xp + rc, wg + we, rows, C, F);
    } else {
      rt_gelu_backward(du + ri, dh + ri, u + ri, (int64_t)rows * F);
    }
    (wg ? rt_matmul_backward : rt_matmul_backward_set)(dxp ? dxp + rc : NULL, dwu ? dwu + we : NULL, NULL, du + ri,
                                                       xp + rc, wu + we, rows, C, F);
  }
}

void rt_moe_count(real *load, const int32_t *idx, int64_t n) {
  for (int64_t i = 0; i < n; i++) load[idx[i]] += 1;
}

void rt_router_bias_update(real *shard, int64_t lo, int64_t n, int64_t off, const real *load, int E, real rate) {
  real mean = 0;
  for (int e = 0; e < E; e++) mean += load[e] / (real)E;
  for (int e = 0; e < E; e++) {
    int64_t i = off + e - lo;
    if (i < 0 || i >= n) continue;
    shard[i] += load[e] < mean ? rate : load[e] > mean ? -rate : 0;
  }
}
