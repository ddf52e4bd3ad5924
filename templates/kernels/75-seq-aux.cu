// ==== templates/kernels/75-seq-aux.cu: DeepSeek's sequence-wise balance loss ====

// Sequence-wise balance loss (DeepSeek-V2 seq_aux; DeepSeek-V3's complementary loss, eqs. 17-20;
// the cpu op rt_seq_aux_loss_forward in runtime/cpu/ops_moe.c): per sequence b of T tokens (the spec's seq_len),
// stats[b · 2E + e] += P_{b,e} (mean affinity: softmax, or sigmoid normalized over the experts when
// sig) and stats[b · 2E + E + e] += f_{b,e} = E / (K · T) per assignment. Zeroed before.
__device__ __forceinline__ float seq_aux_affinity(const float *l, int e, float m, float s, int sig) {
  return sig ? 1.f / (1.f + __expf(-l[e])) / s : __expf(l[e] - m) / s;
}
// m and s of a row: the max logit and Σ exp(l − m) (softmax), or Σ σ(l) (sigmoid; m unused)
__device__ __forceinline__ void seq_aux_row(const float *l, int sig, float *m, float *s) {
  *m = NEG_INF, *s = 0;
  if (sig) {
    for (int e = 0; e < EXPERTS; e++) *s += 1.f / (1.f + __expf(-l[e]));
    return;
  }
  for (int e = 0; e < EXPERTS; e++) *m = fmaxf(*m, l[e]);
  for (int e = 0; e < EXPERTS; e++) *s += __expf(l[e] - *m);
}
extern "C" __global__ void seq_aux_stats(float *stats, const float *logits, const int *idx, int T, int sig) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  const float *l = logits + (size_t)n * EXPERTS;
  float *st = stats + (size_t)(n / T) * 2 * EXPERTS, m, s;
  seq_aux_row(l, sig, &m, &s);
  for (int e = 0; e < EXPERTS; e++) atomicAdd(&st[e], seq_aux_affinity(l, e, m, s, sig) / T);
#pragma unroll
  for (int k = 0; k < TOP_K; k++) atomicAdd(&st[EXPERTS + idx[n * TOP_K + k]], (float)EXPERTS / (TOP_K * T));
}

// dlogits += coef · d_e ⊙ (f_b − Σ s f_b) per token, coef = dloss · α / TOKENS; d_e = p_e (softmax)
// or σ_e (1 − σ_e) / Σ_j σ_j (normalized sigmoid).
extern "C" __global__ void seq_aux_backward(float *dlogits, const float *logits, const float *stats, int T,
                                            float coef, int sig) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  const float *l = logits + (size_t)n * EXPERTS, *f = stats + (size_t)(n / T) * 2 * EXPERTS + EXPERTS;
  float m, s, pf = 0;
  seq_aux_row(l, sig, &m, &s);
  for (int e = 0; e < EXPERTS; e++) pf += seq_aux_affinity(l, e, m, s, sig) * f[e];
  for (int e = 0; e < EXPERTS; e++) {
    float p = seq_aux_affinity(l, e, m, s, sig), g = 1.f / (1.f + __expf(-l[e]));
    dlogits[(size_t)n * EXPERTS + e] += coef * (sig ? g * (1.f - g) / s : p) * (f[e] - pf);
  }
}

// loss = alpha / B · Σ_b Σ_e P_{b,e} f_{b,e} from seq_aux_stats' statistics into out[0]: one block
// (a multiple of 32 threads), so that the loss comes down with the routing's counts in one copy.
extern "C" __global__ void seq_aux_loss_sum(float *out, const float *stats, int B, float alpha) {
  __shared__ float shared[32];
  float s = 0;
  for (int i = threadIdx.x; i < B * EXPERTS; i += blockDim.x) {
    size_t b = (size_t)(i / EXPERTS) * 2 * EXPERTS;
    s += stats[b + i % EXPERTS] * stats[b + EXPERTS + i % EXPERTS];
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = alpha * s / B;
}
