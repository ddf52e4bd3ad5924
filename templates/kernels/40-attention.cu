// ==== templates/kernels/40-attention.cu: warp-per-row attention, MLA's key/value assembly and partial RoPE ====

// ---- causal GQA attention, O(SEQ_LEN) memory: one warp per (token, query head), scores
// recomputed in backward from the saved log-sum-exp (the structure of FlashAttention, Dao et
// al. 2022, without its tiling: correct first, fast later). q (TOKENS, HEADS, HEAD_DIM); k
// (TOKENS, KV_HEADS, HEAD_DIM); v (TOKENS, KV_HEADS, V_DIM); out (TOKENS, HEADS, V_DIM); lse
// (TOKENS, HEADS). q, k, v (and dq, dk, dv) are read at token strides qld, kld, vld (elements:
// HEADS·HEAD_DIM etc. when contiguous, the fused row's width when views of one QKV buffer). V_DIM is MLA's v_head_dim (HEAD_DIM = qk_nope + qk_rope there), else HEAD_DIM.
// Block 128 threads = 4 warps.
#ifndef V_DIM
#define V_DIM HEAD_DIM
#endif
#define DPL ((HEAD_DIM + 31) / 32) // head dimensions per lane
#define VPL ((V_DIM + 31) / 32)    // value dimensions per lane
#define GROUP (HEADS / KV_HEADS)

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A row of W values, lane's share (W + 31) / 32 of them.
template <int W> __device__ __forceinline__ void load_row(float *r, const act *p, int lane) {
#pragma unroll
  for (int i = 0; i < (W + 31) / 32; i++) r[i] = lane + 32 * i < W ? f32(p[lane + 32 * i]) : 0.f;
}

template <int W> __device__ __forceinline__ float row_dot(const float *a, const act *p, int lane) {
  float s = 0;
#pragma unroll
  for (int i = 0; i < (W + 31) / 32; i++)
    if (lane + 32 * i < W) s += a[i] * f32(p[lane + 32 * i]);
  return warp_sum(s);
}

extern "C" __global__ void attention_forward(act *out, float *lse, const act *q, const act *k, const act *v, int qld, int kld,
                                              int vld) {
  int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= TOKENS * HEADS) return;
  int n = w / HEADS, h = w % HEADS, t = n % SEQ_LEN, first = n - t, kvh = h / GROUP;
  const float scale = rsqrtf((float)HEAD_DIM);
  float qr[DPL], acc[VPL], m = NEG_INF, l = 0;
  load_row<HEAD_DIM>(qr, q + (size_t)n * qld + h * HEAD_DIM, lane);
#pragma unroll
  for (int i = 0; i < VPL; i++) acc[i] = 0;
  for (int j = 0; j <= t; j++) {
    size_t kv = (size_t)(first + j) * kld + kvh * HEAD_DIM, vv = (size_t)(first + j) * vld + kvh * V_DIM;
    float s = scale * row_dot<HEAD_DIM>(qr, k + kv, lane), mn = fmaxf(m, s), corr = __expf(m - mn), p = __expf(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < VPL; i++)
      acc[i] = acc[i] * corr + (lane + 32 * i < V_DIM ? p * f32(v[vv + lane + 32 * i]) : 0.f);
    m = mn;
  }
  act *o = out + ((size_t)n * HEADS + h) * V_DIM;
#pragma unroll
  for (int i = 0; i < VPL; i++)
    if (lane + 32 * i < V_DIM) o[lane + 32 * i] = to_act(acc[i] / l);
  if (lane == 0) lse[(size_t)n * HEADS + h] = m + __logf(l);
}

// dq (written) and delta = dout · out per (token, head), saved for attention_backward_dkv.
extern "C" __global__ void attention_backward_dq(act *dq, float *delta, const act *dout, const act *q,
                                                 const act *k, const act *v, const act *out, const float *lse,
                                                 int qld, int kld, int vld) {
  int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= TOKENS * HEADS) return;
  int n = w / HEADS, h = w % HEADS, t = n % SEQ_LEN, first = n - t, kvh = h / GROUP;
  const float scale = rsqrtf((float)HEAD_DIM);
  size_t row = (size_t)n * qld + h * HEAD_DIM, vrow = ((size_t)n * HEADS + h) * V_DIM;
  float qr[DPL], dor[VPL], acc[DPL];
  load_row<HEAD_DIM>(qr, q + row, lane), load_row<V_DIM>(dor, dout + vrow, lane);
  float D = row_dot<V_DIM>(dor, out + vrow, lane), L = lse[(size_t)n * HEADS + h];
#pragma unroll
  for (int i = 0; i < DPL; i++) acc[i] = 0;
  for (int j = 0; j <= t; j++) {
    size_t kv = (size_t)(first + j) * kld + kvh * HEAD_DIM, vv = (size_t)(first + j) * vld + kvh * V_DIM;
    float p = __expf(scale * row_dot<HEAD_DIM>(qr, k + kv, lane) - L), ds = p * (row_dot<V_DIM>(dor, v + vv, lane) - D);
#pragma unroll
    for (int i = 0; i < DPL; i++)
      if (lane + 32 * i < HEAD_DIM) acc[i] += scale * ds * f32(k[kv + lane + 32 * i]);
  }
#pragma unroll
  for (int i = 0; i < DPL; i++)
    if (lane + 32 * i < HEAD_DIM) dq[row + lane + 32 * i] = to_act(acc[i]);
  if (lane == 0) delta[(size_t)n * HEADS + h] = D;
}

// dk, dv (written): one warp per (token j, KV head), summing over the GROUP query heads and the
// queries t >= j that attend to it.
extern "C" __global__ void attention_backward_dkv(act *dk, act *dv, const act *dout, const act *q, const act *k,
                                                  const act *v, const float *lse, const float *delta, int qld,
                                                  int kld, int vld) {
  int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= TOKENS * KV_HEADS) return;
  int n = w / KV_HEADS, kvh = w % KV_HEADS, j = n % SEQ_LEN, first = n - j;
  const float scale = rsqrtf((float)HEAD_DIM);
  size_t kv = (size_t)n * kld + kvh * HEAD_DIM, vv = (size_t)n * vld + kvh * V_DIM;
  float kr[DPL], vr[VPL], dkacc[DPL], dvacc[VPL];
  load_row<HEAD_DIM>(kr, k + kv, lane), load_row<V_DIM>(vr, v + vv, lane);
#pragma unroll
  for (int i = 0; i < DPL; i++) dkacc[i] = 0;
#pragma unroll
  for (int i = 0; i < VPL; i++) dvacc[i] = 0;
  for (int g = 0; g < GROUP; g++) {
    int h = kvh * GROUP + g;
    for (int t = j; t < SEQ_LEN; t++) {
      size_t row = (size_t)(first + t) * qld + h * HEAD_DIM, vrow = ((size_t)(first + t) * HEADS + h) * V_DIM;
      float p = __expf(scale * row_dot<HEAD_DIM>(kr, q + row, lane) - lse[(size_t)(first + t) * HEADS + h]);
      float ds = p * (row_dot<V_DIM>(vr, dout + vrow, lane) - delta[(size_t)(first + t) * HEADS + h]);
#pragma unroll
      for (int i = 0; i < VPL; i++)
        if (lane + 32 * i < V_DIM) dvacc[i] += p * f32(dout[vrow + lane + 32 * i]);
#pragma unroll
      for (int i = 0; i < DPL; i++)
        if (lane + 32 * i < HEAD_DIM) dkacc[i] += scale * ds * f32(q[row + lane + 32 * i]);
    }
  }
#pragma unroll
  for (int i = 0; i < DPL; i++)
    if (lane + 32 * i < HEAD_DIM) dk[kv + lane + 32 * i] = to_act(dkacc[i]);
#pragma unroll
  for (int i = 0; i < VPL; i++)
    if (lane + 32 * i < V_DIM) dv[vv + lane + 32 * i] = to_act(dvacc[i]);
}

// ---- MLA (DeepSeek-V2 §2.1; HF modeling_deepseek_v3.py): the cpu's rt_mla_kv_* and
// rt_rope_strided_*. kvb (n, nh, nope + vd) is kv_b_proj's output (k_nope, then the value, per
// head); kr (n, rope) the RoPE key every head shares. k (n, nh, nope + rope), v (n, nh, vd).
// One thread per value of k, then per value of v; grid ceil(n nh (nope + rope + vd) / 128).
extern "C" __global__ void mla_kv_forward(act *k, act *v, const act *kvb, const act *kr, long long n, int nh,
                                          int nope, int rope, int vd, float kscale) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, nk = n * nh * (nope + rope);
  if (i < nk) {
    long long row = i / (nope + rope);
    int c = (int)(i % (nope + rope));
    k[i] = to_act(kscale * f32(c < nope ? kvb[row * (nope + vd) + c] : kr[row / nh * rope + (c - nope)]));
  } else if (i < nk + n * nh * vd) {
    i -= nk;
    long long row = i / vd;
    v[i] = kvb[row * (nope + vd) + nope + i % vd];
  }
}

// dkvb += [dk's nope part, dv] (one thread per value of dkvb), then dkr += Σ_h dk's rope part
// (one thread per (token, rope channel)); grid ceil((n nh (nope + vd) + n rope) / 128).
extern "C" __global__ void mla_kv_backward(act *dkvb, act *dkr, const act *dk, const act *dv, long long n, int nh,
                                           int nope, int rope, int vd, float kscale) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, nb = n * nh * (nope + vd);
  if (i < nb) {
    long long row = i / (nope + vd);
    int c = (int)(i % (nope + vd));
    float g = c < nope ? kscale * f32(dk[row * (nope + rope) + c]) : f32(dv[row * vd + (c - nope)]);
    dkvb[i] = to_act(f32(dkvb[i]) + g);
  } else if (i < nb + n * rope) {
    i -= nb;
    long long t = i / rope;
    int c = (int)(i % rope);
    float s = 0;
    for (int h = 0; h < nh; h++) s += f32(dk[(t * nh + h) * (nope + rope) + nope + c]);
    dkr[i] = to_act(f32(dkr[i]) + kscale * s);
  }
}

// RoPE on the first rd channels of each of `heads` heads `stride` values apart, x at the first
// rotated channel (MLA's qk_rope_head_dim part), half-split pairs (i, i + rd/2), angle pos ·
// θ^(−2i/rd) in double as rope's; sign −1 rotates back. With factor > 1, YaRN over rd as
// rope_yarn (ramp between pairs lo and hi, rotation scaled by attn); factor 1, attn 1: plain.
// grid TOKENS, block 128.
extern "C" __global__ void rope_strided(act *x, int heads, int stride, int rd, float sign, float factor, float lo,
                                        float hi, float attn) {
  int t = blockIdx.x, pos = t % SEQ_LEN, half = rd / 2;
  for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
    int h = k / half, i = k % half;
    double f = exp2(-2.0 * i / rd * log2((double)ROPE_THETA));
    if (factor > 1) {
      double ramp = ((double)i - lo) / ((double)hi - lo);
      ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
      f = f / factor * ramp + f * (1 - ramp);
    }
    double sd, cd;
    sincos((double)pos * f, &sd, &cd);
    float c = attn * (float)cd, s = sign * attn * (float)sd;
    act *p = x + ((size_t)t * heads + h) * stride;
    float a = f32(p[i]), b = f32(p[i + half]);
    p[i] = to_act(a * c - b * s);
    p[i + half] = to_act(a * s + b * c);
  }
}

