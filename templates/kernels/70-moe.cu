// ==== templates/kernels/70-moe.cu: routing, balancing losses, permutation, all-to-all regroup ====

#if EXPERTS > 0
// Router: the TOP_K largest scores (+ bias, which only selects) of EXPERTS logits per token, ties
// to the lower index; weights softmax over the selected logits (Mixtral) or, with SIGMOID, the
// selected sigmoid scores normalized (DeepSeek-V3). One thread per token.
extern "C" __global__ void router_topk(int *idx, float *wts, const float *logits, const act *bias, int sigmoid) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  const float *l = logits + (size_t)n * EXPERTS;
  int pick[TOP_K];
  float val[TOP_K];
#pragma unroll
  for (int k = 0; k < TOP_K; k++) pick[k] = -1, val[k] = NEG_INF;
  for (int e = 0; e < EXPERTS; e++) {
    float s = sigmoid ? 1.f / (1.f + __expf(-l[e])) : l[e];
    float key = s + (bias ? f32(bias[e]) : 0.f);
    // insertion into the sorted top list, as the cpu's top_k: past every empty slot and every
    // entry not >= key, so a NaN score still fills the list with valid experts
    int j = TOP_K;
    while (j > 0 && !(pick[j - 1] >= 0 && val[j - 1] >= key)) j--;
    if (j == TOP_K) continue;
    for (int i = TOP_K - 1; i > j; i--) val[i] = val[i - 1], pick[i] = pick[i - 1];
    val[j] = key, pick[j] = e;
  }
  float w[TOP_K], total = 0, m = NEG_INF;
#pragma unroll
  for (int k = 0; k < TOP_K; k++) m = fmaxf(m, l[pick[k]]);
#pragma unroll
  for (int k = 0; k < TOP_K; k++) {
    w[k] = sigmoid ? 1.f / (1.f + __expf(-l[pick[k]])) : __expf(l[pick[k]] - m);
    total += w[k];
  }
#pragma unroll
  for (int k = 0; k < TOP_K; k++) idx[n * TOP_K + k] = pick[k], wts[n * TOP_K + k] = w[k] / total;
}

// dlogits += the gradient through the routing weights w_j = a_j / Σ a (a = exp(l − m) for
// softmax, σ(l) for sigmoid): a_j dA_j = w_j (dw_j − Σ_i w_i dw_i), times (1 − σ) for sigmoid.
extern "C" __global__ void router_backward(float *dlogits, const float *dwts, const float *logits, const int *idx,
                                           const float *wts, int sigmoid) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  float wdw = 0;
#pragma unroll
  for (int j = 0; j < TOP_K; j++) wdw += wts[n * TOP_K + j] * dwts[n * TOP_K + j];
  for (int e = 0; e < EXPERTS; e++) dlogits[(size_t)n * EXPERTS + e] = 0.f; // written: 0 where not selected
#pragma unroll
  for (int j = 0; j < TOP_K; j++) {
    int e = idx[n * TOP_K + j];
    float g = wts[n * TOP_K + j] * (dwts[n * TOP_K + j] - wdw);
    if (sigmoid) g *= 1.f - 1.f / (1.f + __expf(-logits[(size_t)n * EXPERTS + e]));
    dlogits[(size_t)n * EXPERTS + e] += g;
  }
}

// Group-limited routing (rt_router_group_forward), one thread per token: selection keys k_e =
// σ(l_e) (sigmoid) or exp(l_e − max l) (softmax: the order of its probabilities) + bias_e; groups
// scored by the sum of their two best keys (DeepSeek-V3's noaux_tc) or by their best key
// (softmax: DeepSeek-V2's group_limited_greedy); the topk_group best kept, the other experts'
// keys 0, the TOP_K largest selected (ties to the lower index); weights a_j / Σ selected a, a = σ(l)
// or exp(l − max l).
extern "C" __global__ void router_topk_grouped(int *idx, float *wts, const float *logits, const act *bias,
                                               int n_group, int topk_group, int sigmoid) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  const float *l = logits + (size_t)n * EXPERTS;
  float m = NEG_INF;
  for (int e = 0; e < EXPERTS && !sigmoid; e++) m = fmaxf(m, l[e]);
#define GROUP_SCORE(e) ((sigmoid ? 1.f / (1.f + __expf(-l[e])) : __expf(l[e] - m)) + (bias ? f32(bias[e]) : 0.f))
  int per = EXPERTS / n_group;
  unsigned long long keep = 0; // bit g: group g chosen
  for (int c = 0; c < topk_group; c++) {
    int best = -1;
    float bs = 0;
    for (int g = 0; g < n_group; g++) {
      if (keep >> g & 1ull) continue;
      float a = NEG_INF, b = NEG_INF;
      for (int e = g * per; e < (g + 1) * per; e++) {
        float k = GROUP_SCORE(e);
        if (k > a) b = a, a = k;
        else if (k > b) b = k;
      }
      float s = sigmoid ? a + b : a;
      if (best < 0 || s > bs) best = g, bs = s;
    }
    keep |= 1ull << best;
  }
  int pick[TOP_K];
  float val[TOP_K];
#pragma unroll
  for (int k = 0; k < TOP_K; k++) pick[k] = -1, val[k] = 0;
  for (int e = 0; e < EXPERTS; e++) {
    float key = keep >> (e / per) & 1ull ? GROUP_SCORE(e) : 0.f;
    int j = TOP_K;
    while (j > 0 && !(pick[j - 1] >= 0 && val[j - 1] >= key)) j--;
    if (j == TOP_K) continue;
    for (int i = TOP_K - 1; i > j; i--) val[i] = val[i - 1], pick[i] = pick[i - 1];
    val[j] = key, pick[j] = e;
  }
#undef GROUP_SCORE
  float w[TOP_K], total = 0;
#pragma unroll
  for (int k = 0; k < TOP_K; k++) total += w[k] = sigmoid ? 1.f / (1.f + __expf(-l[pick[k]])) : __expf(l[pick[k]] - m);
#pragma unroll
  for (int k = 0; k < TOP_K; k++) idx[n * TOP_K + k] = pick[k], wts[n * TOP_K + k] = w[k] / total;
}

// The routing weights of the selected experts under model.moe's conventions, overwriting wts:
// a_j = exp(l_j − m) or σ(l_j); norm: w_j = scale · a_j / Σ_selected a; not norm: scale · softmax
// over all EXPERTS (Qwen2-MoE's norm_topk_prob: false) or scale · σ(l_j) (sigmoid). scale is
// DeepSeek-V3's routed_scaling_factor. One thread per token (the cpu's rt_router_weights).
extern "C" __global__ void router_weights(float *wts, const float *logits, const int *idx, int sigmoid, int norm,
                                          float scale) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  const float *l = logits + (size_t)n * EXPERTS;
  const int *ix = idx + (size_t)n * TOP_K;
  float m = NEG_INF, den = 0, w[TOP_K];
  if (!sigmoid && !norm)
    for (int e = 0; e < EXPERTS; e++) m = fmaxf(m, l[e]);
  else
#pragma unroll
    for (int k = 0; k < TOP_K; k++) m = fmaxf(m, l[ix[k]]);
#pragma unroll
  for (int k = 0; k < TOP_K; k++) w[k] = sigmoid ? 1.f / (1.f + __expf(-l[ix[k]])) : __expf(l[ix[k]] - m);
  if (norm) {
#pragma unroll
    for (int k = 0; k < TOP_K; k++) den += w[k];
  } else if (!sigmoid) {
    for (int e = 0; e < EXPERTS; e++) den += __expf(l[e] - m);
  } else {
    den = 1;
  }
#pragma unroll
  for (int k = 0; k < TOP_K; k++) wts[n * TOP_K + k] = scale * w[k] / den;
}

// dlogits += the gradient of router_weights' weights wts given dwts (the cpu's
// rt_router_weights_backward): norm: u_j (s dw_j − Σ w dw) with u = w / s, times (1 − σ) for
// sigmoid; softmax, not norm: p_e (s dw_e [selected] − Σ w dw) for every e; sigmoid, not norm:
// s dw_j σ_j (1 − σ_j). One thread per token.
extern "C" __global__ void router_weights_backward(float *dlogits, const float *dwts, const float *logits,
                                                   const int *idx, const float *wts, int sigmoid, int norm,
                                                   float scale) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  const float *l = logits + (size_t)n * EXPERTS;
  float *dl = dlogits + (size_t)n * EXPERTS;
  const int *ix = idx + (size_t)n * TOP_K;
  const float *w = wts + (size_t)n * TOP_K, *dw = dwts + (size_t)n * TOP_K;
  float wdw = 0;
#pragma unroll
  for (int k = 0; k < TOP_K; k++) wdw += w[k] * dw[k];
  if (norm || sigmoid) {
    for (int e = 0; e < EXPERTS; e++) dl[e] = 0.f; // written: 0 where not selected
#pragma unroll
    for (int k = 0; k < TOP_K; k++) {
      float a = 1.f / (1.f + __expf(-l[ix[k]]));
      float g = norm ? w[k] / scale * (scale * dw[k] - wdw) : scale * dw[k] * a;
      if (sigmoid) g *= 1.f - a;
      dl[ix[k]] += g;
    }
    return;
  }
  float m = NEG_INF, den = 0;
  for (int e = 0; e < EXPERTS; e++) m = fmaxf(m, l[e]);
  for (int e = 0; e < EXPERTS; e++) den += __expf(l[e] - m);
  for (int e = 0; e < EXPERTS; e++) dl[e] = -__expf(l[e] - m) / den * wdw;
#pragma unroll
  for (int k = 0; k < TOP_K; k++) dl[ix[k]] += w[k] * dw[k];
}

// Qwen2-MoE's gated shared expert: y += σ(logit) · x per token row (the cpu's
// rt_sigmoid_gate_forward), VEC values per 16-byte access. grid TOKENS, block ROW_THREADS.
extern "C" __global__ void sigmoid_gate_forward(act *y, const act *x, const float *logit) {
  size_t row = (size_t)blockIdx.x * HIDDEN / VEC;
  float g = 1.f / (1.f + __expf(-logit[blockIdx.x]));
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) {
    Vec a, b;
    a.u = ((const uint4 *)y)[row + i], b.u = ((const uint4 *)x)[row + i];
#pragma unroll
    for (int j = 0; j < VEC; j++) a.h[j] = to_act(f32(a.h[j]) + g * f32(b.h[j]));
    ((uint4 *)y)[row + i] = a.u;
  }
}

// Its backward: dx += σ dy; dlogit += σ (1 − σ) Σ dy x. grid TOKENS, block ROW_THREADS.
extern "C" __global__ void sigmoid_gate_backward(act *dx, float *dlogit, const act *dy, const act *x,
                                                 const float *logit) {
  __shared__ float shared[32];
  size_t row = (size_t)blockIdx.x * HIDDEN / VEC;
  float g = 1.f / (1.f + __expf(-logit[blockIdx.x])), dot = 0;
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) {
    Vec d, a, o;
    d.u = ((const uint4 *)dy)[row + i], a.u = ((const uint4 *)x)[row + i], o.u = ((const uint4 *)dx)[row + i];
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      dot += f32(d.h[j]) * f32(a.h[j]);
      o.h[j] = to_act(f32(o.h[j]) + g * f32(d.h[j]));
    }
    ((uint4 *)dx)[row + i] = o.u;
  }
  dot = block_sum(dot, shared);
  if (threadIdx.x == 0) dlogit[blockIdx.x] += g * (1.f - g) * dot;
}

// Switch-Transformer balancing loss (Fedus et al. 2021), α·E·Σ f_e P_e: stats (2 × EXPERTS,
// zeroed before) += P (mean softmax over tokens) and f (fraction of assignments); with cnt (EXPERTS
// ints, zeroed before) not NULL, moe_count's counts of the same assignments too (one pass for the
// forward's statistics and the permutation's counts). One thread per token.
extern "C" __global__ void aux_loss_stats(float *stats, int *cnt, const float *logits, const int *idx) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  const float *l = logits + (size_t)n * EXPERTS;
  float m = NEG_INF, s = 0;
  for (int e = 0; e < EXPERTS; e++) m = fmaxf(m, l[e]);
  for (int e = 0; e < EXPERTS; e++) s += __expf(l[e] - m);
  for (int e = 0; e < EXPERTS; e++) atomicAdd(&stats[e], __expf(l[e] - m) / s / TOKENS);
#pragma unroll
  for (int k = 0; k < TOP_K; k++) atomicAdd(&stats[EXPERTS + idx[n * TOP_K + k]], 1.f / (TOKENS * TOP_K));
  // (an expert out of range is not counted: the host finds the counts' sum short and aborts)
  for (int k = 0; k < TOP_K && cnt; k++)
    if ((unsigned)idx[n * TOP_K + k] < (unsigned)EXPERTS) atomicAdd(&cnt[idx[n * TOP_K + k]], 1);
}

// dlogits += coef · p ⊙ (f − Σ p f) per token, coef = dloss · α · E / TOKENS.
extern "C" __global__ void aux_loss_backward(float *dlogits, const float *logits, const float *stats, float coef) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  const float *l = logits + (size_t)n * EXPERTS, *f = stats + EXPERTS;
  float m = NEG_INF, s = 0, pf = 0;
  for (int e = 0; e < EXPERTS; e++) m = fmaxf(m, l[e]);
  for (int e = 0; e < EXPERTS; e++) s += __expf(l[e] - m);
  for (int e = 0; e < EXPERTS; e++) pf += __expf(l[e] - m) / s * f[e];
  for (int e = 0; e < EXPERTS; e++) dlogits[(size_t)n * EXPERTS + e] += coef * __expf(l[e] - m) / s * (f[e] - pf);
}

// xp[pos[n, k]] = x[n]: grid TOKENS × TOP_K rows of HIDDEN.
extern "C" __global__ void moe_gather(act *xp, const act *x, const int *pos) {
  const uint4 *src = (const uint4 *)(x + (size_t)(blockIdx.x / TOP_K) * HIDDEN);
  uint4 *dst = (uint4 *)(xp + (size_t)pos[blockIdx.x] * HIDDEN);
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) dst[i] = src[i];
}

// The gather, combine and their backward move token rows of HIDDEN values, a multiple of 8
// (00-common.cu's #error), as HIDDEN / VEC 16-byte vectors: no scalar tail exists.
// y[n] += Σ_k wts[n, k] · yp[pos[n, k]]: grid TOKENS.
extern "C" __global__ void moe_combine(act *y, const act *yp, const float *wts, const int *pos) {
  size_t n = blockIdx.x;
  uint4 *yr = (uint4 *)(y + n * HIDDEN);
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) {
    Vec o, v;
    o.u = yr[i];
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) acc[j] = f32(o.h[j]);
#pragma unroll
    for (int k = 0; k < TOP_K; k++) {
      float w = wts[n * TOP_K + k];
      v.u = ((const uint4 *)(yp + (size_t)pos[n * TOP_K + k] * HIDDEN))[i];
#pragma unroll
      for (int j = 0; j < VEC; j++) acc[j] += w * f32(v.h[j]);
    }
#pragma unroll
    for (int j = 0; j < VEC; j++) o.h[j] = to_act(acc[j]);
    yr[i] = o.u;
  }
}
// dyp (set) = w · dy at each copy's row; dwts (added to) += dy · yp. grid TOKENS.
extern "C" __global__ void moe_combine_backward(act *dyp, float *dwts, const act *dy, const act *yp, const float *wts,
                                                const int *pos) {
  __shared__ float shared[32];
  size_t n = blockIdx.x;
  const uint4 *dr = (const uint4 *)(dy + n * HIDDEN);
#pragma unroll
  for (int k = 0; k < TOP_K; k++) {
    size_t r = (size_t)pos[n * TOP_K + k] * HIDDEN;
    float w = wts[n * TOP_K + k], d = 0;
    for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) {
      Vec g, v, o;
      g.u = dr[i], v.u = ((const uint4 *)(yp + r))[i];
#pragma unroll
      for (int j = 0; j < VEC; j++) {
        o.h[j] = to_act(w * f32(g.h[j]));
        d += f32(g.h[j]) * f32(v.h[j]);
      }
      ((uint4 *)(dyp + r))[i] = o.u;
    }
    d = block_sum(d, shared);
    if (threadIdx.x == 0) dwts[n * TOP_K + k] = d;
  }
}

// dx[n] += Σ_k dxp[pos[n, k]]. grid TOKENS.
extern "C" __global__ void moe_gather_backward(act *dx, const act *dxp, const int *pos) {
  size_t n = blockIdx.x;
  uint4 *xr = (uint4 *)(dx + n * HIDDEN);
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) {
    Vec o, v;
    o.u = xr[i];
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) acc[j] = f32(o.h[j]);
#pragma unroll
    for (int k = 0; k < TOP_K; k++) {
      v.u = ((const uint4 *)(dxp + (size_t)pos[n * TOP_K + k] * HIDDEN))[i];
#pragma unroll
      for (int j = 0; j < VEC; j++) acc[j] += f32(v.h[j]);
    }
#pragma unroll
    for (int j = 0; j < VEC; j++) o.h[j] = to_act(acc[j]);
    xr[i] = o.u;
  }
}

// The grouped GEMM's device pointer arrays (ops_moe.c's grouped): for the g experts of off
// (EXPERTS + 1 row offsets at most, E of them used) with rows, in expert order, A at d[i], B at
// d[g + i], C at d[2 g + i]. kind 0 forward (A the weight, B x's rows, C out's rows), 1 input
// gradient (the same with x the output gradient), 2 weight gradient (A x's rows, B y's rows, C the
// expert's slot of out). Expert e's matrix lies (e / per) · stride + (e % per) · OC · IC elements
// from w (or out). Built on the device in stream order, so no host array is copied up and none
// can be rewritten before the GEMM reads it. One thread: E is at most a few hundred.
extern "C" __global__ void moe_group_ptrs(void **d, const int *off, int E, int g, int kind, act *out, const act *x,
                                          const act *y, const act *w, int per, long long stride, int IC, int OC) {
  if (blockIdx.x || threadIdx.x) return;
  int i = 0;
  for (int e = 0; e < E && i < g; e++) {
    long long r0 = off[e], rows = off[e + 1] - r0;
    if (!rows) continue;
    long long we = (long long)(e / per) * stride + (long long)(e % per) * OC * IC;
    const act *a, *b;
    act *c;
    if (kind == 0) a = w + we, b = x + r0 * IC, c = out + r0 * OC;
    else if (kind == 1) a = w + we, b = x + r0 * OC, c = out + r0 * IC;
    else a = x + r0 * IC, b = y + r0 * OC, c = out + we;
    d[i] = (void *)a, d[g + i] = (void *)b, d[2 * g + i] = (void *)c;
    i++;
  }
}

// The permutation on the device (rt_moe_permute), in the cpu backend's order: by expert, then by
// assignment a = token · TOP_K + k. moe_count: cnt[e] (EXPERTS ints, zeroed) += the assignments
// to expert e; grid TOKENS · TOP_K / 256.
extern "C" __global__ void moe_count(int *cnt, const int *idx) {
  int a = blockIdx.x * blockDim.x + threadIdx.x;
  // an expert out of range is not counted: the host finds the counts' sum short and aborts
  if (a < TOKENS * TOP_K && (unsigned)idx[a] < (unsigned)EXPERTS) atomicAdd(&cnt[idx[a]], 1);
}

// Auxiliary-loss-free balancing's load (rt_moe_count): load[e] (fp32, EXPERTS) += the assignments
// among idx[0..n) to expert e. Adding 1.0f is exact below 2^24 per expert, so the sum does not
// depend on the order of the atomics.
extern "C" __global__ void moe_load_add(float *load, const int *idx, long long n) {
  long long a = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (a < n && (unsigned)idx[a] < (unsigned)EXPERTS) atomicAdd(&load[idx[a]], 1.0f);
}

// rt_router_bias_update: bias_e += rate x sign(mean load - load_e) for the biases at gathered
// offset off of a group whose shard [lo, lo + n) this rank holds (only those change); one
// thread per expert, each summing the mean in the cpu backend's order (the same float).
extern "C" __global__ void router_bias_update(float *shard, long long lo, long long n, long long off,
                                              const float *load, float rate) {
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= EXPERTS) return;
  float mean = 0;
  for (int j = 0; j < EXPERTS; j++) mean += load[j] / (float)EXPERTS;
  long long i = off + e - lo;
  if (i < 0 || i >= n) return;
  shard[i] += load[e] < mean ? rate : load[e] > mean ? -rate : 0.0f;
}

// moe_positions: offsets[e + 1] = Σ_{e' <= e} cnt[e'] (offsets[0] = 0) and, for each a with
// idx[a] = e, pos[a] = offsets[e] + the assignments before a that chose e (stable). Grid EXPERTS,
// MOE_PERM_THREADS threads: thread t counts its own run of assignments, a scan in shared memory
// orders the runs, and a second pass writes the positions (no atomics: deterministic).
#define MOE_PERM_THREADS 256
extern "C" __global__ void __launch_bounds__(MOE_PERM_THREADS)
    moe_positions(int *pos, int *offsets, const int *cnt, const int *idx) {
  __shared__ int part[MOE_PERM_THREADS];
  __shared__ int base;
  const int n = TOKENS * TOP_K, seg = (n + MOE_PERM_THREADS - 1) / MOE_PERM_THREADS;
  int e = blockIdx.x, t = threadIdx.x, lo = t * seg < n ? t * seg : n, hi = lo + seg < n ? lo + seg : n, b = 0;
  for (int i = t; i < e; i += MOE_PERM_THREADS) b += cnt[i];
  part[t] = b;
  __syncthreads();
  if (t == 0) {
    int s = 0;
    for (int i = 0; i < MOE_PERM_THREADS; i++) s += part[i];
    base = s;
  }
  __syncthreads();
  int m = 0;
  for (int a = lo; a < hi; a++) m += idx[a] == e;
  part[t] = m;
  __syncthreads();
  if (t == 0) {
    int s = base;
    for (int i = 0; i < MOE_PERM_THREADS; i++) {
      int c = part[i];
      part[i] = s, s += c;
    }
    if (e == 0) offsets[0] = 0;
    offsets[e + 1] = s;
  }
  __syncthreads();
  int p = part[t];
  for (int a = lo; a < hi; a++)
    if (idx[a] == e) pos[a] = p++;
}

// One all-to-all round's rows between the received order (buf: source-major) and the experts'
// (xe: expert-major), as a2a_plan.c's blocks say: tab[i] is block i's first row in buf and
// tab[stride + i] its first row in xe, for the nb non-empty blocks in buf's order. to_expert:
// buf -> xe, else xe -> buf. Grid: the round's rows, one block each.
extern "C" __global__ void moe_regroup(act *xe, act *buf, const long long *tab, int nb, int stride, int to_expert) {
  long long r = blockIdx.x;
  int lo = 0, hi = nb - 1;
  while (lo < hi) { // the last block that starts at or before row r
    int mid = (lo + hi + 1) / 2;
    if (tab[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  uint4 *e = (uint4 *)(xe + (size_t)(tab[stride + lo] + (r - tab[lo])) * HIDDEN);
  uint4 *m = (uint4 *)(buf + (size_t)r * HIDDEN);
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) {
    if (to_expert) e[i] = m[i];
    else m[i] = e[i];
  }
}

// The hierarchical all-to-all's row moves (runtime/cuda/moe_hier.c): block b writes out row
// (oi ? oi[b] : b) = (add ? that row : 0) + the sum over i in [lo, hi) of (w ? w[r] : 1) · in row r,
// r = ii ? ii[i] : i, [lo, hi) = [start[b], start[b + 1]), or [b, b + 1) without start; in fp32, in
// i's order. Grid: the rows written.
extern "C" __global__ void hier_rows(act *out, const act *in, const int *oi, const int *ii, const int *start,
                                     const float *w, int add) {
  int b = blockIdx.x, lo = start ? start[b] : b, hi = start ? start[b + 1] : b + 1;
  uint4 *o = (uint4 *)(out + (size_t)(oi ? oi[b] : b) * HIDDEN);
  for (int v = threadIdx.x; v < HIDDEN / VEC; v += blockDim.x) {
    Vec a, x;
    float acc[VEC];
    if (add) a.u = o[v];
#pragma unroll
    for (int j = 0; j < VEC; j++) acc[j] = add ? f32(a.h[j]) : 0.f;
    for (int i = lo; i < hi; i++) {
      int r = ii ? ii[i] : i;
      float g = w ? w[r] : 1.f;
      x.u = ((const uint4 *)(in + (size_t)r * HIDDEN))[v];
#pragma unroll
      for (int j = 0; j < VEC; j++) acc[j] += g * f32(x.h[j]);
    }
#pragma unroll
    for (int j = 0; j < VEC; j++) a.h[j] = to_act(acc[j]);
    o[v] = a.u;
  }
}

// dw[slot[i]] += v[i] for i < n (the slots distinct): the scalars back at their copies.
extern "C" __global__ void hier_scalars_add(float *dw, const int *slot, const float *v, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dw[slot[i]] += v[i];
}

// At the experts' owner, per received row r (rt_moe_gate_rows): dv[r] = dyu[r] · dye[r] (dye holds
// the experts' outputs), then dye[r] = ew[r] · dyu[r]. Grid: the rows.
extern "C" __global__ void moe_gate_rows(act *dye, float *dv, const act *dyu, const float *ew) {
  __shared__ float shared[32];
  size_t row = (size_t)blockIdx.x * HIDDEN / VEC;
  float g = ew[blockIdx.x], d = 0;
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) {
    Vec o, u;
    o.u = ((const uint4 *)dye)[row + i], u.u = ((const uint4 *)dyu)[row + i];
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      d += f32(u.h[j]) * f32(o.h[j]);
      o.h[j] = to_act(g * f32(u.h[j]));
    }
    ((uint4 *)dye)[row + i] = o.u;
  }
  d = block_sum(d, shared);
  if (threadIdx.x == 0) dv[blockIdx.x] = d;
}
#endif

