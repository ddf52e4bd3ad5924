// ==== templates/kernels/45-context.cu: context parallelism: RoPE and attention over a key range ====

// A rank holds SEQ_LEN tokens of each of its TOKENS / SEQ_LEN sequences of CP_SEQ_LEN tokens, in
// two chunks of SEQ_LEN / 2: its token t < SEQ_LEN / 2 is at position lo + t of its sequence, the
// others at hi + t − SEQ_LEN / 2 (the cpu's rt_attention_span_*, rt_rope_span_*). The keys k
// (B, CP_SEQ_LEN, KV_HEADS, HEAD_DIM) and values v (B, CP_SEQ_LEN, KV_HEADS, V_DIM) are those of
// the whole sequences (all-gathered over the cp group); the query at position p attends to keys
// 0..p. Without context parallelism CP_SEQ_LEN is SEQ_LEN, and lo 0, hi SEQ_LEN / 2 is the plain
// causal layout. Warp-per-row kernels as attention_forward's (block 128 = 4 warps); lse and delta
// (TOKENS, HEADS) as theirs. The tiled tensor-core kernels of 80-flash.cu take the same lo, hi and
// layouts (the host prefers them where kernels.cu has them: runtime/cuda/ops_cp.c); these serve
// the shapes they do not (MLA's unequal head dims, SEQ_LEN no multiple of 64).
#ifndef CP_SEQ_LEN
#define CP_SEQ_LEN SEQ_LEN
#endif

// The position in its sequence of local token t (0..SEQ_LEN − 1).
__device__ __forceinline__ long long span_pos(int t, long long lo, long long hi) {
  return t < SEQ_LEN / 2 ? lo + t : hi + (t - SEQ_LEN / 2);
}

// RoPE on the first rd channels of each of `heads` heads `stride` values apart (rope_strided's
// layout, plain frequencies θ^(−2i/rd)) at the tokens' positions; sign −1 rotates back.
// grid TOKENS, block 128.
extern "C" __global__ void rope_span(act *x, int heads, int stride, int rd, float sign, long long lo, long long hi) {
  int t = blockIdx.x, half = rd / 2;
  long long pos = span_pos(t % SEQ_LEN, lo, hi);
  for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
    int h = k / half, i = k % half;
    double sd, cd;
    sincos((double)pos * exp2(-2.0 * i / rd * log2((double)ROPE_THETA)), &sd, &cd);
    float c = (float)cd, s = sign * (float)sd;
    act *p = x + ((size_t)t * heads + h) * stride;
    float a = f32(p[i]), b = f32(p[i + half]);
    p[i] = to_act(a * c - b * s);
    p[i + half] = to_act(a * s + b * c);
  }
}

// out, lse: one warp per (local token, query head). grid ceil(TOKENS · HEADS · 32 / 128).
extern "C" __global__ void attention_span_forward(act *out, float *lse, const act *q, const act *k, const act *v,
                                                  long long lo, long long hi) {
  int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= TOKENS * HEADS) return;
  int n = w / HEADS, h = w % HEADS, kvh = h / GROUP;
  long long pos = span_pos(n % SEQ_LEN, lo, hi);
  size_t first = (size_t)(n / SEQ_LEN) * CP_SEQ_LEN; // the sequence's first key
  const float scale = rsqrtf((float)HEAD_DIM);
  float qr[DPL], acc[VPL], m = NEG_INF, l = 0;
  load_row<HEAD_DIM>(qr, q + ((size_t)n * HEADS + h) * HEAD_DIM, lane);
#pragma unroll
  for (int i = 0; i < VPL; i++) acc[i] = 0;
  for (long long j = 0; j <= pos; j++) {
    size_t kv = ((first + j) * KV_HEADS + kvh) * HEAD_DIM, vv = ((first + j) * KV_HEADS + kvh) * V_DIM;
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

// dq (added to) and delta = dout · out per (local token, head), for attention_span_backward_dkv.
extern "C" __global__ void attention_span_backward_dq(act *dq, float *delta, const act *dout, const act *q,
                                                      const act *k, const act *v, const act *out, const float *lse,
                                                      long long lo, long long hi) {
  int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= TOKENS * HEADS) return;
  int n = w / HEADS, h = w % HEADS, kvh = h / GROUP;
  long long pos = span_pos(n % SEQ_LEN, lo, hi);
  size_t first = (size_t)(n / SEQ_LEN) * CP_SEQ_LEN;
  const float scale = rsqrtf((float)HEAD_DIM);
  size_t row = ((size_t)n * HEADS + h) * HEAD_DIM, vrow = ((size_t)n * HEADS + h) * V_DIM;
  float qr[DPL], dor[VPL], acc[DPL];
  load_row<HEAD_DIM>(qr, q + row, lane), load_row<V_DIM>(dor, dout + vrow, lane);
  float D = row_dot<V_DIM>(dor, out + vrow, lane), L = lse[(size_t)n * HEADS + h];
#pragma unroll
  for (int i = 0; i < DPL; i++) acc[i] = 0;
  for (long long j = 0; j <= pos; j++) {
    size_t kv = ((first + j) * KV_HEADS + kvh) * HEAD_DIM, vv = ((first + j) * KV_HEADS + kvh) * V_DIM;
    float p = __expf(scale * row_dot<HEAD_DIM>(qr, k + kv, lane) - L), ds = p * (row_dot<V_DIM>(dor, v + vv, lane) - D);
#pragma unroll
    for (int i = 0; i < DPL; i++)
      if (lane + 32 * i < HEAD_DIM) acc[i] += scale * ds * f32(k[kv + lane + 32 * i]);
  }
#pragma unroll
  for (int i = 0; i < DPL; i++)
    if (lane + 32 * i < HEAD_DIM) dq[row + lane + 32 * i] = to_act(f32(dq[row + lane + 32 * i]) + acc[i]);
  if (lane == 0) delta[(size_t)n * HEADS + h] = D;
}

// dk, dv (B, CP_SEQ_LEN, ...; added to): one warp per (key j of the whole sequence, KV head),
// summing over the GROUP query heads and this rank's queries at positions >= j (of each chunk, the
// local tokens from max(chunk start, j − chunk position) on). grid ceil(B · CP_SEQ_LEN · KV_HEADS · 32 / 128).
extern "C" __global__ void attention_span_backward_dkv(act *dk, act *dv, const act *dout, const act *q, const act *k,
                                                       const act *v, const float *lse, const float *delta,
                                                       long long lo, long long hi) {
  long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (w >= (long long)(TOKENS / SEQ_LEN) * CP_SEQ_LEN * KV_HEADS) return;
  long long n = w / KV_HEADS, j = n % CP_SEQ_LEN;
  int kvh = (int)(w % KV_HEADS);
  size_t qfirst = (size_t)(n / CP_SEQ_LEN) * SEQ_LEN; // the sequence's first local token
  const float scale = rsqrtf((float)HEAD_DIM);
  size_t kv = ((size_t)n * KV_HEADS + kvh) * HEAD_DIM, vv = ((size_t)n * KV_HEADS + kvh) * V_DIM;
  float kr[DPL], vr[VPL], dkacc[DPL], dvacc[VPL];
  load_row<HEAD_DIM>(kr, k + kv, lane), load_row<V_DIM>(vr, v + vv, lane);
#pragma unroll
  for (int i = 0; i < DPL; i++) dkacc[i] = 0;
#pragma unroll
  for (int i = 0; i < VPL; i++) dvacc[i] = 0;
  for (int c = 0; c < 2; c++) {
    long long p0 = c ? hi : lo, from = j - p0 > 0 ? j - p0 : 0; // the chunk's first position; its first query >= j
    for (int g = 0; g < GROUP; g++) {
      int h = kvh * GROUP + g;
      for (long long t = c * (SEQ_LEN / 2) + from; t < (c + 1) * (SEQ_LEN / 2); t++) {
        size_t m = qfirst + (size_t)t, row = (m * HEADS + h) * HEAD_DIM, vrow = (m * HEADS + h) * V_DIM;
        float p = __expf(scale * row_dot<HEAD_DIM>(kr, q + row, lane) - lse[m * HEADS + h]);
        float ds = p * (row_dot<V_DIM>(vr, dout + vrow, lane) - delta[m * HEADS + h]);
#pragma unroll
        for (int i = 0; i < VPL; i++)
          if (lane + 32 * i < V_DIM) dvacc[i] += p * f32(dout[vrow + lane + 32 * i]);
#pragma unroll
        for (int i = 0; i < DPL; i++)
          if (lane + 32 * i < HEAD_DIM) dkacc[i] += scale * ds * f32(q[row + lane + 32 * i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < DPL; i++)
    if (lane + 32 * i < HEAD_DIM) dk[kv + lane + 32 * i] = to_act(f32(dk[kv + lane + 32 * i]) + dkacc[i]);
#pragma unroll
  for (int i = 0; i < VPL; i++)
    if (lane + 32 * i < V_DIM) dv[vv + lane + 32 * i] = to_act(f32(dv[vv + lane + 32 * i]) + dvacc[i]);
}

// The cp group's exchange: in each of the n / (cp / 2 · len) sequences `stride` values apart, the
// order of the cp blocks of len values at x reversed (the second chunks arrive in rank order, which
// is the reverse of position order). One thread per swapped pair; grid ceil(n / 256).
extern "C" __global__ void cp_reverse(act *x, int cp, long long len, long long stride, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, per = (long long)(cp / 2) * len;
  if (i >= n) return;
  long long b = i / per, blk = i % per / len, e = i % len;
  act *a = x + b * stride + blk * len + e, *z = x + b * stride + (cp - 1 - blk) * len + e;
  act t = *a;
  *a = *z, *z = t;
}

// x (n fp32) *= s: the cp group's mean after its sum. grid ceil(n / 256).
extern "C" __global__ void scale_f32(float *x, float s, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
