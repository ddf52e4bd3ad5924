// kernels.cu — the cuda backend's elementwise, normalization, routing, loss and attention
// kernels (the GEMMs go to cuBLAS; attention is a flash kernel below, or a simple one where
// head_dim and seq_len do not fit its tiles). mtc writes this file into each
// generated program after a prelude of #defines with the plan's shapes, so every loop bound is a
// compile-time constant; the program compiles it at start-up with NVRTC for the device's
// architecture (sm_90a on Hopper), and `train --check-kernels` compiles it without a GPU.
//
// Storage type `act`: bf16 by default (the activation arena of the program's cuda build), fp32
// with ACT_FLOAT (the runtime prepends it when built with fp32 activations, mtrt_cuda_f32act);
// arithmetic is always fp32. Row kernels
// use one block per token row and 16-byte accesses (VEC values per load); HIDDEN must be a
// multiple of 8: mtc compile says so and `mtc build --backend cuda` refuses another (the #error
// below is the last guard). Backward kernels ADD into the gradients they are given, as the cpu
// ops do (mtrt_ops.h); forward kernels overwrite their outputs.
// Expected from the prelude: TOKENS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, SEQ_LEN, ROPE_THETA,
// VOCAB, VOCAB_CHUNK, EXPERTS (0: dense), TOP_K, RMS_EPS; V_DIM (default HEAD_DIM).
#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;
#ifdef ACT_FLOAT
typedef float act;
__device__ __forceinline__ act to_act(float x) { return x; }
#else
typedef bf16 act;
__device__ __forceinline__ act to_act(float x) { return __float2bfloat16(x); }
#endif
__device__ __forceinline__ float f32(float x) { return x; }
__device__ __forceinline__ float f32(bf16 x) { return __bfloat162float(x); }
#define NEG_INF (-__int_as_float(0x7f800000)) // -inf without <math.h>
#if HIDDEN % 8 != 0
#error "the cuda kernels need hidden to be a multiple of 8"
#endif

#define ROW_THREADS 128
#define VEC (16 / (int)sizeof(act)) // values per 16-byte access

union Vec {
  uint4 u;
  act h[VEC];
};

__device__ __forceinline__ float block_sum(float v, float *shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : 0.f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) shared[0] = v;
  __syncthreads();
  float r = shared[0];
  __syncthreads();
  return r;
}

// out (TOKENS, HIDDEN) = wte[tok]; grid TOKENS, block ROW_THREADS.
extern "C" __global__ void embedding_forward(act *out, const int *tok, const act *wte) {
  const uint4 *src = (const uint4 *)(wte + (size_t)tok[blockIdx.x] * HIDDEN);
  uint4 *dst = (uint4 *)(out + (size_t)blockIdx.x * HIDDEN);
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) dst[i] = src[i];
}

// dwte (VOCAB, HIDDEN, act) += dout rows at their tokens: one atomic add per token and column
// (bf16: each add rounds; tokens that repeat in the micro-batch accumulate in bf16).
extern "C" __global__ void embedding_backward(act *dwte, const act *dout, const int *tok) {
  act *d = dwte + (size_t)tok[blockIdx.x] * HIDDEN;
  const act *g = dout + (size_t)blockIdx.x * HIDDEN;
  for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) atomicAdd(&d[i], g[i]);
}

// Learned absolute positions (GPT-2; HF modeling_gpt2.py): x (TOKENS, HIDDEN) += wpe[t], t the
// row's position in its sequence (row % SEQ_LEN); grid TOKENS, block ROW_THREADS.
extern "C" __global__ void position_forward(act *x, const act *wpe) {
  act *r = x + (size_t)blockIdx.x * HIDDEN;
  const act *p = wpe + (size_t)(blockIdx.x % SEQ_LEN) * HIDDEN;
  for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) r[i] = to_act(f32(r[i]) + f32(p[i]));
}


// RMSNorm (Zhang & Sennrich 2019): out = x / sqrt(mean x² + eps) ⊙ w; rstd (TOKENS) saved.
extern "C" __global__ void rmsnorm_forward(act *out, float *rstd, const act *x, const act *w) {
  __shared__ float shared[32];
  const Vec *xv = (const Vec *)(x + (size_t)blockIdx.x * HIDDEN), *wv = (const Vec *)w;
  float ss = 0;
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) {
    Vec a = xv[i];
#pragma unroll
    for (int j = 0; j < VEC; j++) ss += f32(a.h[j]) * f32(a.h[j]);
  }
  float r = rsqrtf(block_sum(ss, shared) / HIDDEN + RMS_EPS);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  Vec *ov = (Vec *)(out + (size_t)blockIdx.x * HIDDEN);
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) {
    Vec a = xv[i], b = wv[i], o;
#pragma unroll
    for (int j = 0; j < VEC; j++) o.h[j] = to_act(f32(a.h[j]) * r * f32(b.h[j]));
    ov[i] = o;
  }
}

// dx += r (dy w) − x r³ / C · Σ (dy w x) (dw: colsum_add). One block of ROW_THREADS threads
// per RMS_BWD_ROWS rows (grid ceil(TOKENS / RMS_BWD_ROWS)).
#define RMS_BWD_ROWS 16
#define RMS_COLS ((HIDDEN + ROW_THREADS - 1) / ROW_THREADS) // columns per thread
extern "C" __global__ void rmsnorm_backward(act *dx, const act *dout, const act *x, const act *w,
                                            const float *rstd) {
  __shared__ float shared[32];
  int r0 = blockIdx.x * RMS_BWD_ROWS;
  for (int n = r0; n < r0 + RMS_BWD_ROWS && n < TOKENS; n++) {
    size_t row = (size_t)n * HIDDEN;
    float r = rstd[n], dot = 0;
#pragma unroll
    for (int k = 0; k < RMS_COLS; k++) {
      int i = threadIdx.x + k * ROW_THREADS;
      if (i >= HIDDEN) break;
      float dy = f32(dout[row + i]), xi = f32(x[row + i]);
      dot += dy * f32(w[i]) * xi;
    }
    dot = block_sum(dot, shared);
#pragma unroll
    for (int k = 0; k < RMS_COLS; k++) {
      int i = threadIdx.x + k * ROW_THREADS;
      if (i >= HIDDEN) break;
      float dy = f32(dout[row + i]), xi = f32(x[row + i]);
      float g = r * dy * f32(w[i]) - xi * r * r * r / HIDDEN * dot;
      dx[row + i] = to_act(f32(dx[row + i]) + g);
    }
  }
}

// qk-norm (Qwen3 per head, OLMoE over all heads): RMSNorm of rows of `width` values (a runtime
// size: HEAD_DIM, or heads × HEAD_DIM), out = x r w with r = 1/sqrt(mean x² + eps) into rstd.
// One block of ROW_THREADS threads per row; grid rows (the cpu's rt_qk_norm_forward).
extern "C" __global__ void qk_norm_forward(act *out, float *rstd, const act *x, const act *w, int width, float eps) {
  __shared__ float shared[32];
  size_t row = (size_t)blockIdx.x * width;
  float ss = 0;
  for (int i = threadIdx.x; i < width; i += blockDim.x) ss += f32(x[row + i]) * f32(x[row + i]);
  float r = rsqrtf(block_sum(ss, shared) / width + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int i = threadIdx.x; i < width; i += blockDim.x) out[row + i] = to_act(f32(x[row + i]) * r * f32(w[i]));
}

// dx += r (dy w) − x r³ / width · Σ (dy w x), over `rows` rows of `width` (dw: colsum_add).
// One block per QK_BWD_ROWS rows (grid ceil(rows / QK_BWD_ROWS)): the rows' dot products first
// (in shared memory), then each thread's columns over the block's rows.
#define QK_BWD_ROWS 16
extern "C" __global__ void qk_norm_backward(act *dx, const act *dout, const act *x, const act *w,
                                            const float *rstd, long long rows, int width) {
  __shared__ float shared[32], dots[QK_BWD_ROWS];
  long long r0 = (long long)blockIdx.x * QK_BWD_ROWS;
  int nr = rows - r0 < QK_BWD_ROWS ? (int)(rows - r0) : QK_BWD_ROWS;
  for (int j = 0; j < nr; j++) {
    size_t row = (size_t)(r0 + j) * width;
    float dot = 0;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dot += f32(dout[row + i]) * f32(w[i]) * f32(x[row + i]);
    dot = block_sum(dot, shared);
    if (threadIdx.x == 0) dots[j] = dot;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    float wi = f32(w[i]);
    for (int j = 0; j < nr; j++) {
      size_t at = (size_t)(r0 + j) * width + i;
      float r = rstd[r0 + j], dy = f32(dout[at]), xi = f32(x[at]);
      dx[at] = to_act(f32(dx[at]) + r * dy * wi - xi * r * r * r / width * dots[j]);
    }
  }
}

// LayerNorm (Ba et al. 2016; torch.nn.LayerNorm, HF modeling_gpt2.py): out = (x − mean) rstd ⊙ w
// + b, rstd = 1 / sqrt(biased variance + RMS_EPS); b may be NULL (no bias). mean, rstd (TOKENS)
// saved. grid TOKENS, block ROW_THREADS.
extern "C" __global__ void layernorm_forward(act *out, float *mean, float *rstd, const act *x, const act *w,
                                             const act *b) {
  __shared__ float shared[32];
  const act *xr = x + (size_t)blockIdx.x * HIDDEN;
  float s = 0;
  for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) s += f32(xr[i]);
  float m = block_sum(s, shared) / HIDDEN, v = 0;
  for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) v += (f32(xr[i]) - m) * (f32(xr[i]) - m);
  float r = rsqrtf(block_sum(v, shared) / HIDDEN + RMS_EPS);
  if (threadIdx.x == 0) mean[blockIdx.x] = m, rstd[blockIdx.x] = r;
  act *o = out + (size_t)blockIdx.x * HIDDEN;
  for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x)
    o[i] = to_act((f32(xr[i]) - m) * r * f32(w[i]) + (b ? f32(b[i]) : 0.f));
}

// Its backward, RMS_BWD_ROWS rows per block as rmsnorm_backward: with x̂ = (x − mean) rstd and
// g = dout ⊙ w, dx += rstd (g − mean(g) − x̂ mean(g x̂)) (dw += dout x̂ and db += dout: colsum_add).
extern "C" __global__ void layernorm_backward(act *dx, const act *dout, const act *x, const act *w,
                                              const float *mean, const float *rstd) {
  __shared__ float shared[32];
  int r0 = blockIdx.x * RMS_BWD_ROWS;
  for (int n = r0; n < r0 + RMS_BWD_ROWS && n < TOKENS; n++) {
    size_t row = (size_t)n * HIDDEN;
    float m = mean[n], r = rstd[n], gm = 0, gx = 0;
#pragma unroll
    for (int k = 0; k < RMS_COLS; k++) {
      int i = threadIdx.x + k * ROW_THREADS;
      if (i >= HIDDEN) break;
      float dy = f32(dout[row + i]), xh = (f32(x[row + i]) - m) * r, g = dy * f32(w[i]);
      gm += g, gx += g * xh;
    }
    gm = block_sum(gm, shared) / HIDDEN;
    gx = block_sum(gx, shared) / HIDDEN;
#pragma unroll
    for (int k = 0; k < RMS_COLS; k++) {
      int i = threadIdx.x + k * ROW_THREADS;
      if (i >= HIDDEN) break;
      float dy = f32(dout[row + i]), xh = (f32(x[row + i]) - m) * r;
      dx[row + i] = to_act(f32(dx[row + i]) + r * (dy * f32(w[i]) - gm - xh * gx));
    }
  }
}

// A bias over columns: out (rows, cols) += b, n = rows × cols values; one thread per value.
extern "C" __global__ void bias_forward(act *out, const act *b, long n, int cols) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = to_act(f32(out[i]) + f32(b[i % cols]));
}

// The weight gradients of the norms, biases and learned positions: dw (cols, act) += Σ over
// rows of a term of (row, col), summed in fp32 over all rows and added once (one rounding to act):
// mode 0: a; 1: a b s[row] (RMSNorm, qk-norm); 2: a (b − m[row]) s[row] (LayerNorm). a, b (rows,
// cols); s, m (rows). grid ceil(cols / 32), block 256 = 8 rows × 32 columns at a time; no atomics.
extern "C" __global__ void colsum_add(act *dw, const act *a, const act *b, const float *s, const float *m,
                                      long long rows, int cols, int mode) {
  __shared__ float part[8][32];
  int tx = threadIdx.x % 32, ty = threadIdx.x / 32, c = blockIdx.x * 32 + tx;
  float acc = 0;
  if (c < cols)
    for (long long r = ty; r < rows; r += 8) {
      size_t at = (size_t)r * cols + c;
      float v = f32(a[at]);
      if (mode == 1) v *= f32(b[at]) * s[r];
      else if (mode == 2) v *= (f32(b[at]) - m[r]) * s[r];
      acc += v;
    }
  part[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < cols) {
    float t = 0;
    for (int k = 0; k < 8; k++) t += part[k][tx];
    dw[c] = to_act(f32(dw[c]) + t);
  }
}

// RoPE (Su et al. 2021), half-split pairs (i, i + HEAD_DIM/2), in place on x (TOKENS, heads,
// HEAD_DIM); sign -1 rotates back (the backward). grid TOKENS, block heads × HEAD_DIM/2.
extern "C" __global__ void rope(act *x, int heads, float sign) {
  int t = blockIdx.x, pos = t % SEQ_LEN;
  for (int k = threadIdx.x; k < heads * (HEAD_DIM / 2); k += blockDim.x) {
    int h = k / (HEAD_DIM / 2), i = k % (HEAD_DIM / 2);
    // the angle in double: at positions in the tens of thousands, fast-math float powf/sinf
    // would be off by 1e-3 rad (double is untouched by --use_fast_math)
    double sd, cd;
    sincos((double)pos * exp2(-2.0 * i / HEAD_DIM * log2((double)ROPE_THETA)), &sd, &cd);
    float c = (float)cd, s = sign * (float)sd;
    act *p = x + ((size_t)t * heads + h) * HEAD_DIM;
    float a = f32(p[i]), b = f32(p[i + HEAD_DIM / 2]);
    p[i] = to_act(a * c - b * s);
    p[i + HEAD_DIM / 2] = to_act(a * s + b * c);
  }
}

// RoPE with YaRN (model.rope_scaling type yarn; the cpu's rt_rope_yarn_*): pair i's inverse
// frequency blends θ^(−2i/HEAD_DIM) and it / factor by a ramp between pairs lo and hi (computed
// by the host as transformers does), and the rotation is scaled by attn. sign −1 with the same
// attn is the backward (the transposed map). grid TOKENS, block heads × HEAD_DIM/2.
extern "C" __global__ void rope_yarn(act *x, int heads, float sign, float factor, float lo, float hi, float attn) {
  int t = blockIdx.x, pos = t % SEQ_LEN;
  for (int k = threadIdx.x; k < heads * (HEAD_DIM / 2); k += blockDim.x) {
    int h = k / (HEAD_DIM / 2), i = k % (HEAD_DIM / 2);
    double f = exp2(-2.0 * i / HEAD_DIM * log2((double)ROPE_THETA));
    double ramp = ((double)i - lo) / ((double)hi - lo);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    f = f / factor * ramp + f * (1 - ramp);
    double sd, cd;
    sincos((double)pos * f, &sd, &cd);
    float c = attn * (float)cd, s = sign * attn * (float)sd;
    act *p = x + ((size_t)t * heads + h) * HEAD_DIM;
    float a = f32(p[i]), b = f32(p[i + HEAD_DIM / 2]);
    p[i] = to_act(a * c - b * s);
    p[i + HEAD_DIM / 2] = to_act(a * s + b * c);
  }
}

// RoPE with Llama 3.1's frequency scaling (model.rope_scaling type llama3; the cpu's
// rt_rope_llama3_*): inverse frequency f = θ^(−2i/HEAD_DIM) of wavelength λ = 2π/f is kept where
// λ < orig/high, divided by factor where λ > orig/low, and blended by s = (orig/λ − low)/(high −
// low) between. Angles in double, as rope's. grid TOKENS, block heads × HEAD_DIM/2.
extern "C" __global__ void rope_llama3(act *x, int heads, float sign, float factor, float low, float high,
                                       float orig) {
  int t = blockIdx.x, pos = t % SEQ_LEN;
  for (int k = threadIdx.x; k < heads * (HEAD_DIM / 2); k += blockDim.x) {
    int h = k / (HEAD_DIM / 2), i = k % (HEAD_DIM / 2);
    double f = exp2(-2.0 * i / HEAD_DIM * log2((double)ROPE_THETA)), wavelen = 2 * 3.14159265358979323846 / f;
    if (wavelen > (double)orig / low) {
      f /= factor;
    } else if (wavelen >= (double)orig / high) {
      double s = ((double)orig / wavelen - low) / ((double)high - low);
      f = (1 - s) * f / factor + s * f;
    }
    double sd, cd;
    sincos((double)pos * f, &sd, &cd);
    float c = (float)cd, s = sign * (float)sd;
    act *p = x + ((size_t)t * heads + h) * HEAD_DIM;
    float a = f32(p[i]), b = f32(p[i + HEAD_DIM / 2]);
    p[i] = to_act(a * c - b * s);
    p[i + HEAD_DIM / 2] = to_act(a * s + b * c);
  }
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// SwiGLU (Shazeer 2020): h = silu(g) ⊙ u over n elements (n a multiple of 8).
// Vector kernels take n values in n / VEC 16-byte vectors, and thread n / VEC (launch n / VEC + 1
// threads) does the scalar tail when n is not a multiple of VEC.
#define SCALAR_TAIL(i, n, stmt) \
  if ((i) == (n) / VEC) {       \
    for (long t = (n) / VEC * VEC; t < (n); t++) stmt; \
    return;                     \
  }

extern "C" __global__ void swiglu_forward(act *h, const act *g, const act *u, long n) {
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x);
  SCALAR_TAIL(i, n, h[t] = to_act(silu(f32(g[t])) * f32(u[t])))
  if (i >= n / VEC) return;
  Vec a = ((const Vec *)g)[i], b = ((const Vec *)u)[i], o;
#pragma unroll
  for (int j = 0; j < VEC; j++) o.h[j] = to_act(silu(f32(a.h[j])) * f32(b.h[j]));
  ((Vec *)h)[i] = o;
}

__device__ __forceinline__ void swiglu_backward_one(act *dg, act *du, const act *dh, const act *g, const act *u, long t) {
  float x = f32(g[t]), s = 1.f / (1.f + __expf(-x)), dy = f32(dh[t]);
  dg[t] = to_act(f32(dg[t]) + dy * f32(u[t]) * s * (1.f + x * (1.f - s)));
  du[t] = to_act(f32(du[t]) + dy * x * s);
}

extern "C" __global__ void swiglu_backward(act *dg, act *du, const act *dh, const act *g, const act *u, long n) {
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x);
  SCALAR_TAIL(i, n, swiglu_backward_one(dg, du, dh, g, u, t))
  if (i >= n / VEC) return;
  Vec a = ((const Vec *)g)[i], b = ((const Vec *)u)[i], d = ((const Vec *)dh)[i];
  Vec og = ((const Vec *)dg)[i], ou = ((const Vec *)du)[i];
#pragma unroll
  for (int j = 0; j < VEC; j++) {
    float x = f32(a.h[j]), s = 1.f / (1.f + __expf(-x)), up = f32(b.h[j]);
    float dy = f32(d.h[j]);
    og.h[j] = to_act(f32(og.h[j]) + dy * up * s * (1.f + x * (1.f - s)));
    ou.h[j] = to_act(f32(ou.h[j]) + dy * x * s);
  }
  ((Vec *)dg)[i] = og, ((Vec *)du)[i] = ou;
}

// GELU, tanh approximation (Hendrycks & Gimpel 2016): h = gelu(x); backward dx += dh gelu'(x).
#define GELU_K 0.7978845608f // sqrt(2 / pi)
extern "C" __global__ void gelu_forward(act *h, const act *x, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float a = f32(x[i]);
  h[i] = to_act(0.5f * a * (1.f + tanhf(GELU_K * (a + 0.044715f * a * a * a))));
}

extern "C" __global__ void gelu_backward(act *dx, const act *dh, const act *x, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float a = f32(x[i]), th = tanhf(GELU_K * (a + 0.044715f * a * a * a));
  float d = 0.5f * (1.f + th) + 0.5f * a * (1.f - th * th) * GELU_K * (1.f + 3.f * 0.044715f * a * a);
  dx[i] = to_act(f32(dx[i]) + f32(dh[i]) * d);
}

// acc += x over n elements (a multiple of 8): a second branch's gradient or output.
extern "C" __global__ void accumulate(act *acc, const act *x, long n) {
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x);
  SCALAR_TAIL(i, n, acc[t] = to_act(f32(acc[t]) + f32(x[t])))
  if (i >= n / VEC) return;
  Vec y = ((const Vec *)acc)[i], b = ((const Vec *)x)[i];
#pragma unroll
  for (int j = 0; j < VEC; j++) y.h[j] = to_act(f32(y.h[j]) + f32(b.h[j]));
  ((Vec *)acc)[i] = y;
}

// acc += x over n fp32 values (a reduce-scatter's result into a gradient shard, which may be in
// pinned host memory); one thread per value.
extern "C" __global__ void accumulate_f32(float *acc, const float *x, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += x[i];
}

// acc (n, fp32) += x (n, act): a reduce-scatter's received piece of a unit's gradient added into
// the fp32 gradient shard.
extern "C" __global__ void accumulate_act_f32(float *acc, const act *x, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += f32(x[i]);
}

// out (n, fp32) = x (n, act): a unit's gradient into the fp32 wire buffer (grad_reduce_dtype fp32).
extern "C" __global__ void cast_act_f32(float *out, const act *x, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = f32(x[i]);
}

// x (n, fp32) rounded to bf16 values in place (nearest even): the fp32-activation runtime's
// gradient before a bf16-on-the-wire reduce-scatter, which then sums the bf16 values in fp32.
extern "C" __global__ void round_bf16(float *x, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __bfloat162float(__float2bfloat16(x[i]));
}

// x[i] = v for n fp32 values (a running maximum's -inf start).
extern "C" __global__ void fill(float *x, float v, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}

// out = a + b (the residual connection), n elements, a multiple of 8.
extern "C" __global__ void residual_add(act *out, const act *a, const act *b, long n) {
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x);
  SCALAR_TAIL(i, n, out[t] = to_act(f32(a[t]) + f32(b[t])))
  if (i >= n / VEC) return;
  Vec x = ((const Vec *)a)[i], y = ((const Vec *)b)[i], o;
#pragma unroll
  for (int j = 0; j < VEC; j++) o.h[j] = to_act(f32(x.h[j]) + f32(y.h[j]));
  ((Vec *)out)[i] = o;
}

// ---- causal GQA attention, O(SEQ_LEN) memory: one warp per (token, query head), scores
// recomputed in backward from the saved log-sum-exp (the structure of FlashAttention, Dao et
// al. 2022, without its tiling: correct first, fast later). q (TOKENS, HEADS, HEAD_DIM); k
// (TOKENS, KV_HEADS, HEAD_DIM); v (TOKENS, KV_HEADS, V_DIM); out (TOKENS, HEADS, V_DIM); lse
// (TOKENS, HEADS). V_DIM is MLA's v_head_dim (HEAD_DIM = qk_nope + qk_rope there), else HEAD_DIM.
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

extern "C" __global__ void attention_forward(act *out, float *lse, const act *q, const act *k, const act *v) {
  int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= TOKENS * HEADS) return;
  int n = w / HEADS, h = w % HEADS, t = n % SEQ_LEN, first = n - t, kvh = h / GROUP;
  const float scale = rsqrtf((float)HEAD_DIM);
  float qr[DPL], acc[VPL], m = NEG_INF, l = 0;
  load_row<HEAD_DIM>(qr, q + ((size_t)n * HEADS + h) * HEAD_DIM, lane);
#pragma unroll
  for (int i = 0; i < VPL; i++) acc[i] = 0;
  for (int j = 0; j <= t; j++) {
    size_t kv = ((size_t)(first + j) * KV_HEADS + kvh) * HEAD_DIM, vv = ((size_t)(first + j) * KV_HEADS + kvh) * V_DIM;
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

// dq (added to) and delta = dout · out per (token, head), saved for attention_backward_dkv.
extern "C" __global__ void attention_backward_dq(act *dq, float *delta, const act *dout, const act *q,
                                                 const act *k, const act *v, const act *out, const float *lse) {
  int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= TOKENS * HEADS) return;
  int n = w / HEADS, h = w % HEADS, t = n % SEQ_LEN, first = n - t, kvh = h / GROUP;
  const float scale = rsqrtf((float)HEAD_DIM);
  size_t row = ((size_t)n * HEADS + h) * HEAD_DIM, vrow = ((size_t)n * HEADS + h) * V_DIM;
  float qr[DPL], dor[VPL], acc[DPL];
  load_row<HEAD_DIM>(qr, q + row, lane), load_row<V_DIM>(dor, dout + vrow, lane);
  float D = row_dot<V_DIM>(dor, out + vrow, lane), L = lse[(size_t)n * HEADS + h];
#pragma unroll
  for (int i = 0; i < DPL; i++) acc[i] = 0;
  for (int j = 0; j <= t; j++) {
    size_t kv = ((size_t)(first + j) * KV_HEADS + kvh) * HEAD_DIM, vv = ((size_t)(first + j) * KV_HEADS + kvh) * V_DIM;
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

// dk, dv (added to): one warp per (token j, KV head), summing over the GROUP query heads and the
// queries t >= j that attend to it.
extern "C" __global__ void attention_backward_dkv(act *dk, act *dv, const act *dout, const act *q, const act *k,
                                                  const act *v, const float *lse, const float *delta) {
  int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= TOKENS * KV_HEADS) return;
  int n = w / KV_HEADS, kvh = w % KV_HEADS, j = n % SEQ_LEN, first = n - j;
  const float scale = rsqrtf((float)HEAD_DIM);
  size_t kv = ((size_t)n * KV_HEADS + kvh) * HEAD_DIM, vv = ((size_t)n * KV_HEADS + kvh) * V_DIM;
  float kr[DPL], vr[VPL], dkacc[DPL], dvacc[VPL];
  load_row<HEAD_DIM>(kr, k + kv, lane), load_row<V_DIM>(vr, v + vv, lane);
#pragma unroll
  for (int i = 0; i < DPL; i++) dkacc[i] = 0;
#pragma unroll
  for (int i = 0; i < VPL; i++) dvacc[i] = 0;
  for (int g = 0; g < GROUP; g++) {
    int h = kvh * GROUP + g;
    for (int t = j; t < SEQ_LEN; t++) {
      size_t row = ((size_t)(first + t) * HEADS + h) * HEAD_DIM, vrow = ((size_t)(first + t) * HEADS + h) * V_DIM;
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
    if (lane + 32 * i < HEAD_DIM) dk[kv + lane + 32 * i] = to_act(f32(dk[kv + lane + 32 * i]) + dkacc[i]);
#pragma unroll
  for (int i = 0; i < VPL; i++)
    if (lane + 32 * i < V_DIM) dv[vv + lane + 32 * i] = to_act(f32(dv[vv + lane + 32 * i]) + dvacc[i]);
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

// ---- optimizer and casts (fp32 master weights, bf16 copies for compute) ----

// AdamW (Loshchilov & Hutter 2019) on n values: c1, c2 the bias corrections 1 − beta^step.
extern "C" __global__ void adamw(float *param, float *m, float *v, const float *grad, long n, float lr, float beta1,
                                 float beta2, float eps, float wd, float c1, float c2, float grad_scale) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = grad[i] * grad_scale;
  m[i] = beta1 * m[i] + (1 - beta1) * g;
  v[i] = beta2 * v[i] + (1 - beta2) * g * g;
  param[i] -= lr * ((m[i] / c1) / (sqrtf(v[i] / c2) + eps) + wd * param[i]);
}

extern "C" __global__ void cast_bf16(bf16 *out, const float *in, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(in[i]);
}

// out (count, fp32) = Σ over g pieces of count bf16 values each, in piece (rank) order: the
// receive side of a reduce-scatter with bf16 on the wire and fp32 accumulation.
extern "C" __global__ void sum_bf16_pieces(float *out, const bf16 *pieces, int g, long count) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float acc = 0;
  for (int r = 0; r < g; r++) acc += __bfloat162float(pieces[(size_t)r * count + i]);
  out[i] = acc;
}

// *out += Σ g² over n values (the global gradient norm's part of one shard), in double across
// blocks as the cpu backend sums.
extern "C" __global__ void sum_squares(double *out, const float *g, long n) {
  __shared__ float shared[32];
  float s = 0;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) s += g[i] * g[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) atomicAdd(out, (double)s);
}

// ---- Muon on the device (runtime/cuda/muon_cuda.c), fp32 as runtime/optim/muon.c ----

// Muon's Nesterov momentum on n values: g = grad · grad_scale, m ← mu m + g, out = g + mu m.
extern "C" __global__ void muon_momentum(float *m, const float *grad, float *out, long n, float grad_scale, float mu) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = grad[i] * grad_scale;
  m[i] = mu * m[i] + g;
  out[i] = g + mu * m[i];
}

// Muon's update on n values: param ← param − lr (u + wd param).
extern "C" __global__ void muon_apply(float *param, const float *u, long n, float lr, float wd) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float p = param[i];
  param[i] = p - lr * (u[i] + wd * p);
}

// Newton-Schulz's normalization, one block of 256 threads per matrix (grid: batch): inv[b] =
// 1 / (||g_b||_F + 1e-7) of the b-th matrix of n values, the sum in double as the host's.
extern "C" __global__ void __launch_bounds__(256) ns_inv_norm(float *inv, const float *g, long n) {
  __shared__ double part[256];
  const float *x = g + (size_t)blockIdx.x * n;
  double s = 0;
  for (long i = threadIdx.x; i < n; i += blockDim.x) s += (double)x[i] * (double)x[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int h = 128; h > 0; h >>= 1) {
    if ((int)threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) inv[blockIdx.x] = (float)(1.0 / (sqrt(part[0]) + 1e-7));
}

// x_b = g_b · inv[b] for matrix b = blockIdx.y of (rows, cols), stored transposed (cols, rows)
// when tr (so that X is (r, k), r <= k); grid.x covers rows · cols.
extern "C" __global__ void ns_prep(float *x, const float *g, const float *inv, int rows, int cols, int tr) {
  long n = (long)rows * cols, i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  size_t b = blockIdx.y;
  float v = g[b * n + i] * inv[b];
  if (tr) x[b * n + (long)(i % cols) * rows + i / cols] = v;
  else x[b * n + i] = v;
}

// out_b (rows, cols) = scale · X_b, X_b read transposed when tr; the inverse of ns_prep's layout.
extern "C" __global__ void ns_finish(float *out, const float *x, int rows, int cols, int tr, float scale) {
  long n = (long)rows * cols, i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  size_t b = blockIdx.y;
  float v = tr ? x[b * n + (long)(i % cols) * rows + i / cols] : x[b * n + i];
  out[b * n + i] = v * scale;
}

// Cross-entropy over one vocabulary chunk of `cols` logits (fp32, from cuBLAS; cols <=
// VOCAB_CHUNK, less for a last partial chunk) starting at column `first`: an online log-sum-exp
// per row merged into (mx, sum) across chunks (mx starts at -inf, sum at 0), and the target's
// logit picked when it falls in the chunk. grid TOKENS.
extern "C" __global__ void cross_entropy_chunk(float *mx, float *sum, float *target_logit, const float *logits,
                                               const int *targets, int first, int cols) {
  __shared__ float shared[32];
  const float *l = logits + (size_t)blockIdx.x * cols;
  float m = NEG_INF;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, l[i]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = m;
  __syncthreads();
  m = NEG_INF;
  for (int w = 0; w < (int)blockDim.x / 32; w++) m = fmaxf(m, shared[w]);
  __syncthreads();
  float s = 0;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) s += __expf(l[i] - m);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) {
    float M = fmaxf(mx[blockIdx.x], m);
    sum[blockIdx.x] = sum[blockIdx.x] * __expf(mx[blockIdx.x] - M) + s * __expf(m - M);
    mx[blockIdx.x] = M;
    int t = targets[blockIdx.x] - first;
    if (t >= 0 && t < cols) target_logit[blockIdx.x] = l[t];
  }
}

// After the last chunk: lse = mx + log(sum) per token (in place of mx) and *loss += Σ (lse −
// target logit), the summed cross-entropy (the host divides by TOKENS). One thread per token.
extern "C" __global__ void cross_entropy_finish(float *lse, float *loss, const float *sum, const float *target_logit) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  float l = lse[n] + __logf(sum[n]);
  lse[n] = l;
  atomicAdd(loss, l - target_logit[n]);
}

// dlogits (TOKENS, cols) = scale × (softmax − one-hot(target)) for the chunk at column `first`,
// from each token's log-sum-exp over the whole vocabulary; scale = dloss / TOKENS. dlogits must
// not overlap logits (with bf16 storage its elements are narrower: in place would race). grid TOKENS.
extern "C" __global__ void cross_entropy_backward(act *dlogits, const float *logits, const float *lse_,
                                                  const int *targets, int first, int cols, float scale) {
  size_t row = (size_t)blockIdx.x * cols;
  float lse = lse_[blockIdx.x];
  int t = targets[blockIdx.x] - first;
  for (int i = threadIdx.x; i < cols; i += blockDim.x)
    dlogits[row + i] = to_act(scale * (__expf(logits[row + i] - lse) - (i == t ? 1.f : 0.f)));
}

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
  for (int e = 0; e < EXPERTS; e++) dl[e] -= __expf(l[e] - m) / den * wdw;
#pragma unroll
  for (int k = 0; k < TOP_K; k++) dl[ix[k]] += w[k] * dw[k];
}

// Qwen2-MoE's gated shared expert: y += σ(logit) · x per token row (the cpu's
// rt_sigmoid_gate_forward). grid TOKENS, block ROW_THREADS.
extern "C" __global__ void sigmoid_gate_forward(act *y, const act *x, const float *logit) {
  size_t row = (size_t)blockIdx.x * HIDDEN;
  float g = 1.f / (1.f + __expf(-logit[blockIdx.x]));
  for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) y[row + i] = to_act(f32(y[row + i]) + g * f32(x[row + i]));
}

// Its backward: dx += σ dy; dlogit += σ (1 − σ) Σ dy x. grid TOKENS, block ROW_THREADS.
extern "C" __global__ void sigmoid_gate_backward(act *dx, float *dlogit, const act *dy, const act *x,
                                                 const float *logit) {
  __shared__ float shared[32];
  size_t row = (size_t)blockIdx.x * HIDDEN;
  float g = 1.f / (1.f + __expf(-logit[blockIdx.x])), dot = 0;
  for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) {
    dot += f32(dy[row + i]) * f32(x[row + i]);
    dx[row + i] = to_act(f32(dx[row + i]) + g * f32(dy[row + i]));
  }
  dot = block_sum(dot, shared);
  if (threadIdx.x == 0) dlogit[blockIdx.x] += g * (1.f - g) * dot;
}

// Switch-Transformer balancing loss (Fedus et al. 2021), α·E·Σ f_e P_e: stats (2 × EXPERTS,
// zeroed before) += P (mean softmax over tokens) and f (fraction of assignments).
extern "C" __global__ void aux_loss_stats(float *stats, const float *logits, const int *idx) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= TOKENS) return;
  const float *l = logits + (size_t)n * EXPERTS;
  float m = NEG_INF, s = 0;
  for (int e = 0; e < EXPERTS; e++) m = fmaxf(m, l[e]);
  for (int e = 0; e < EXPERTS; e++) s += __expf(l[e] - m);
  for (int e = 0; e < EXPERTS; e++) atomicAdd(&stats[e], __expf(l[e] - m) / s / TOKENS);
#pragma unroll
  for (int k = 0; k < TOP_K; k++) atomicAdd(&stats[EXPERTS + idx[n * TOP_K + k]], 1.f / (TOKENS * TOP_K));
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

// y[n] += Σ_k wts[n, k] · yp[pos[n, k]]: grid TOKENS.
extern "C" __global__ void moe_combine(act *y, const act *yp, const float *wts, const int *pos) {
  size_t n = blockIdx.x;
  for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) {
    float acc = f32(y[n * HIDDEN + i]);
#pragma unroll
    for (int k = 0; k < TOP_K; k++)
      acc += wts[n * TOP_K + k] * f32(yp[(size_t)pos[n * TOP_K + k] * HIDDEN + i]);
    y[n * HIDDEN + i] = to_act(acc);
  }
}
// dyp (set) = w · dy at each copy's row; dwts (added to) += dy · yp. grid TOKENS.
extern "C" __global__ void moe_combine_backward(act *dyp, float *dwts, const act *dy, const act *yp, const float *wts,
                                                const int *pos) {
  __shared__ float shared[32];
  size_t n = blockIdx.x;
#pragma unroll
  for (int k = 0; k < TOP_K; k++) {
    size_t r = (size_t)pos[n * TOP_K + k] * HIDDEN;
    float w = wts[n * TOP_K + k], d = 0;
    for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) {
      float g = f32(dy[n * HIDDEN + i]);
      dyp[r + i] = to_act(w * g);
      d += g * f32(yp[r + i]);
    }
    d = block_sum(d, shared);
    if (threadIdx.x == 0) dwts[n * TOP_K + k] += d;
  }
}

// dx[n] += Σ_k dxp[pos[n, k]]. grid TOKENS.
extern "C" __global__ void moe_gather_backward(act *dx, const act *dxp, const int *pos) {
  size_t n = blockIdx.x;
  for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) {
    float acc = f32(dx[n * HIDDEN + i]);
#pragma unroll
    for (int k = 0; k < TOP_K; k++) acc += f32(dxp[(size_t)pos[n * TOP_K + k] * HIDDEN + i]);
    dx[n * HIDDEN + i] = to_act(acc);
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
#endif

// ---- tiled causal GQA flash attention on tensor cores (FlashAttention-2, Dao 2023) ----------
// The same layouts and results as attention_forward / attention_backward_{dq,dkv} above, tiled:
// a block of FLASH_WARPS warps owns FLASH_BQ rows (16 per warp) and walks the tiles of the other
// side through shared memory (bf16, whatever `act` is); the products Q·Kᵀ, P·V, dO·Vᵀ, dS·K,
// Pᵀ·dO, dSᵀ·Q are bf16 16x16x16 wmma fragments with fp32 accumulation; softmax, masking and
// the log-sum-exp are fp32, per warp through shared memory (the fragments' element layout is
// unspecified, so it is never assumed: the rows of accumulator elements are read off a fragment
// loaded from a matrix of row numbers, acc_rows). P and dS are rounded to bf16 for their products,
// as in FlashAttention. Causal: query t sees keys j <= t of its own sequence; tiles entirely
// above the diagonal are never visited, the diagonal ones are masked elementwise.
//   forward:  out, lse (overwritten)            flash_attention_forward
//   backward: delta = rowsum(dout · out)        flash_attention_backward_prep
//             dq += scale · dS K                flash_attention_backward_dq  (query tiles)
//             dk += scale · dSᵀ Q, dv += Pᵀ dO  flash_attention_backward_dkv (key tiles, all GROUP heads)
//   with P = exp(scale · Q Kᵀ − lse), dS = P ⊙ (dO Vᵀ − delta).
// All shared memory is static (< 48 KB; launch with 0 dynamic bytes). Needs sm_80+ (bf16 wmma).
// The kernels exist where HAVE_FLASH_ATTENTION is defined: head_dim a multiple of 16 up to 128,
// the value head size equal to it (not MLA's), seq_len a multiple of FLASH_BQ; elsewhere (or when a name lookup fails) the host keeps the
// warp-per-row kernels above.
#define FLASH_BQ 64    // rows per block: queries (forward, dq) or keys (dkv); 16 per warp
#define FLASH_BK 64    // keys per step of the forward loop
#define FLASH_BB 32    // per step of the backward loops: keys (dq) or queries (dkv); one per lane
#define FLASH_WARPS (FLASH_BQ / 16)
#define FLASH_THREADS (32 * FLASH_WARPS) // 128: the block of every flash kernel
#if HEAD_DIM % 16 == 0 && HEAD_DIM <= 128 && V_DIM == HEAD_DIM && SEQ_LEN % FLASH_BQ == 0 && \
    (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
#define HAVE_FLASH_ATTENTION 1
#include <mma.h>
using namespace nvcuda;

#define FLASH_LD (HEAD_DIM + 8) // bf16 row pitch of Q, K, V, dO tiles (padded against bank conflicts)
#define FLASH_SLD (FLASH_BK + 4) // fp32 row pitch of the forward's per-warp score scratch (16 x FLASH_BK)
#define FLASH_PLD (FLASH_BK + 8) // bf16 row pitch of the forward's per-warp P (16 x FLASH_BK)
#define FLASH_BSLD (FLASH_BB + 4) // fp32 row pitch of the backward's per-warp scratch (16 x FLASH_BB)
#define FLASH_BPLD (FLASH_BB + 8) // bf16 row pitch of the backward's per-warp P, dS (16 x FLASH_BB)
#define FLASH_BATCH (TOKENS / SEQ_LEN)
// launch configurations (grid x, y, z; block FLASH_THREADS; static shared memory in bytes)
#define FLASH_FWD_GRID SEQ_LEN / FLASH_BQ, HEADS, FLASH_BATCH
#define FLASH_FWD_SMEM (FLASH_BK * FLASH_LD * 2 + FLASH_WARPS * 16 * (FLASH_SLD * 4 + FLASH_PLD * 2 + 4))
#define FLASH_PREP_THREADS 128 // one warp per (token, head)
#define FLASH_PREP_BLOCKS (TOKENS * HEADS / (FLASH_PREP_THREADS / 32))
#define FLASH_DQ_GRID SEQ_LEN / FLASH_BQ, HEADS, FLASH_BATCH
#define FLASH_DQ_SMEM (2 * FLASH_BB * FLASH_LD * 2 + FLASH_WARPS * 16 * (FLASH_BSLD * 4 + FLASH_BPLD * 2 + 8))
#define FLASH_DKV_GRID SEQ_LEN / FLASH_BQ, KV_HEADS, FLASH_BATCH
#define FLASH_DKV_SMEM \
  (2 * FLASH_BB * FLASH_LD * 2 + FLASH_WARPS * 16 * (FLASH_BSLD * 4 + 2 * FLASH_BPLD * 2) + 8 * FLASH_BB)
static_assert(FLASH_BQ == 2 * FLASH_BB && FLASH_BK == FLASH_BQ && FLASH_BB == 32, "flash tiles");
static_assert(HEADS % KV_HEADS == 0, "query heads must be a multiple of kv heads");
static_assert(FLASH_FWD_SMEM <= 48 * 1024 && FLASH_DQ_SMEM <= 48 * 1024 && FLASH_DKV_SMEM <= 48 * 1024,
              "flash attention shared memory");

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA; // A (m, k) row-major
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB; // B (k, n) row-major
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBt; // B = Xᵀ, X (n, k) row-major
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
#define ACC_N Acc::num_elements

// rows × HEAD_DIM values (row r at src + r·stride) to bf16 shared memory of pitch FLASH_LD.
__device__ __forceinline__ void flash_load(bf16 *dst, const act *src, size_t stride, int rows) {
  for (int i = threadIdx.x; i < rows * (HEAD_DIM / VEC); i += blockDim.x) {
    int r = i / (HEAD_DIM / VEC), c = i % (HEAD_DIM / VEC) * VEC;
    Vec a;
    a.u = *(const uint4 *)(src + r * stride + c);
#pragma unroll
    for (int j = 0; j < VEC; j++) dst[r * FLASH_LD + c + j] = __float2bfloat16(f32(a.h[j]));
  }
}

// rows[i]: the row (0..15) of element i of an accumulator fragment, read off a fragment loaded
// from a matrix whose entries are their row numbers; scratch: 16 x ld floats of this warp.
__device__ __forceinline__ void acc_rows(int *rows, float *scratch, int ld) {
  for (int i = threadIdx.x % 32; i < 256; i += 32) scratch[i / 16 * ld + i % 16] = (float)(i / 16);
  __syncwarp();
  Acc f;
  wmma::load_matrix_sync(f, scratch, ld, wmma::mem_row_major);
#pragma unroll
  for (int i = 0; i < ACC_N; i++) rows[i] = (int)f.x[i];
  __syncwarp();
}

// dst (16 rows of pitch dst_ld) = (add: +=) the warp's 16 x (16·NF) accumulators a[0..NF),
// through scratch (16 x ld floats, ld >= 16·per), per fragments at a time.
template <int NF, int per, bool add>
__device__ __forceinline__ void flash_write(act *dst, size_t dst_ld, Acc *a, float *scratch, int ld) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int g = 0; g < NF; g += per) {
#pragma unroll
    for (int f = g; f < g + per && f < NF; f++)
      wmma::store_matrix_sync(scratch + (f - g) * 16, a[f], ld, wmma::mem_row_major);
    __syncwarp();
    int nc = 16 * (NF - g < per ? NF - g : per);
    for (int i = lane; i < 16 * nc; i += 32) {
      act *p = dst + (i / nc) * dst_ld + g * 16 + i % nc;
      *p = to_act((add ? f32(*p) : 0.f) + scratch[i / nc * ld + i % nc]);
    }
    __syncwarp();
  }
}

// out, lse: grid (SEQ_LEN / FLASH_BQ, HEADS, TOKENS / SEQ_LEN) = FLASH_FWD_GRID, block
// FLASH_THREADS, static shared memory FLASH_FWD_SMEM bytes. Block (x, h, b): the queries of tile
// qt (the last first: the longest rows start first) of head h in sequence b; warp w its rows
// 16w..16w+15, Q in registers, O in fp32 accumulators, the running max m and sum l per row held
// by the lane pair that owns the row in the softmax (row lane / 2, columns half (lane % 2)).
extern "C" __global__ void __launch_bounds__(FLASH_THREADS)
    flash_attention_forward(act *out, float *lse, const act *q, const act *k, const act *v) {
  __shared__ __align__(128) bf16 kv[FLASH_BK * FLASH_LD]; // the Q tile, then K and V of each step
  __shared__ __align__(128) float scr[FLASH_WARPS][16 * FLASH_SLD]; // scores S (16, FLASH_BK)
  __shared__ __align__(128) bf16 pb[FLASH_WARPS][16 * FLASH_PLD];   // probabilities P (16, FLASH_BK)
  __shared__ float rowv[FLASH_WARPS][16];                           // per row: rescale, then 1 / l
  int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, kvh = h / GROUP, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  int q0 = qt * FLASH_BQ, r = lane / 2, half = lane % 2, t = q0 + 16 * w + r; // t: this lane's query
  size_t tok0 = (size_t)blockIdx.z * SEQ_LEN;                                 // the sequence's first token
  const float scale = rsqrtf((float)HEAD_DIM);
  float *S = scr[w], *rv = rowv[w];
  bf16 *P = pb[w];
  int rows[ACC_N];
  acc_rows(rows, S, FLASH_SLD);
  flash_load(kv, q + ((tok0 + q0) * HEADS + h) * HEAD_DIM, HEADS * HEAD_DIM, FLASH_BQ);
  __syncthreads();
  FragA qf[HEAD_DIM / 16];
  Acc o[HEAD_DIM / 16];
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++) {
    wmma::load_matrix_sync(qf[d], kv + 16 * w * FLASH_LD + 16 * d, FLASH_LD);
    wmma::fill_fragment(o[d], 0.f);
  }
  float m = NEG_INF, l = 0;
  for (int kt = 0; kt <= qt; kt++) {
    int k0 = kt * FLASH_BK;
    __syncthreads(); // every warp is done with kv (Q, or V of the last step)
    flash_load(kv, k + ((tok0 + k0) * KV_HEADS + kvh) * HEAD_DIM, KV_HEADS * HEAD_DIM, FLASH_BK);
    __syncthreads();
    // S (16, FLASH_BK) = Q_w Kᵀ
#pragma unroll
    for (int n = 0; n < FLASH_BK / 16; n++) {
      Acc s;
      wmma::fill_fragment(s, 0.f);
#pragma unroll
      for (int d = 0; d < HEAD_DIM / 16; d++) {
        FragBt kb;
        wmma::load_matrix_sync(kb, kv + 16 * n * FLASH_LD + 16 * d, FLASH_LD);
        wmma::mma_sync(s, qf[d], kb, s);
      }
      wmma::store_matrix_sync(S + 16 * n, s, FLASH_SLD, wmma::mem_row_major);
    }
    __syncwarp();
    // online softmax of row r over keys j0..j0 + FLASH_BK / 2 - 1 (masked: j > t)
    const float *sr = S + r * FLASH_SLD + half * (FLASH_BK / 2);
    int j0 = k0 + half * (FLASH_BK / 2);
    float mx = NEG_INF, sum = 0;
    for (int c = 0; c < FLASH_BK / 2; c++)
      if (j0 + c <= t) mx = fmaxf(mx, sr[c]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    // mn is finite from the first step on (key 0 <= t is in it), where corr = exp(-inf) = 0
    float mn = fmaxf(m, scale * mx), corr = __expf(m - mn);
    for (int c = 0; c < FLASH_BK / 2; c++) {
      float p = j0 + c <= t ? __expf(scale * sr[c] - mn) : 0.f;
      sum += p;
      P[r * FLASH_PLD + half * (FLASH_BK / 2) + c] = __float2bfloat16(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum, m = mn;
    if (half == 0) rv[r] = corr;
    __syncwarp();
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 16; d++)
#pragma unroll
      for (int i = 0; i < ACC_N; i++) o[d].x[i] *= rv[rows[i]];
    __syncthreads(); // every warp is done with K
    flash_load(kv, v + ((tok0 + k0) * KV_HEADS + kvh) * HEAD_DIM, KV_HEADS * HEAD_DIM, FLASH_BK);
    __syncthreads();
    // O += P V
    FragA pf[FLASH_BK / 16];
#pragma unroll
    for (int c = 0; c < FLASH_BK / 16; c++) wmma::load_matrix_sync(pf[c], P + 16 * c, FLASH_PLD);
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 16; d++)
#pragma unroll
      for (int c = 0; c < FLASH_BK / 16; c++) {
        FragB vb;
        wmma::load_matrix_sync(vb, kv + 16 * c * FLASH_LD + 16 * d, FLASH_LD);
        wmma::mma_sync(o[d], pf[c], vb, o[d]);
      }
  }
  if (half == 0) rv[r] = 1.f / l, lse[(tok0 + t) * HEADS + h] = m + __logf(l);
  __syncwarp();
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++)
#pragma unroll
    for (int i = 0; i < ACC_N; i++) o[d].x[i] *= rv[rows[i]];
  flash_write<HEAD_DIM / 16, FLASH_BK / 16, false>(out + ((tok0 + q0 + 16 * w) * HEADS + h) * HEAD_DIM,
                                                   HEADS * HEAD_DIM, o, S, FLASH_SLD);
}

// delta (TOKENS, HEADS) = Σ_d dout · out: grid FLASH_PREP_BLOCKS = TOKENS · HEADS / 4, block
// FLASH_PREP_THREADS; one warp per (token, head).
extern "C" __global__ void flash_attention_backward_prep(float *delta, const act *dout, const act *out) {
  int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= TOKENS * HEADS) return;
  const act *a = dout + (size_t)w * HEAD_DIM, *b = out + (size_t)w * HEAD_DIM;
  float s = 0;
  for (int i = lane; i < HEAD_DIM; i += 32) s += f32(a[i]) * f32(b[i]);
  s = warp_sum(s);
  if (lane == 0) delta[w] = s;
}

// dq += scale · dS K: grid (SEQ_LEN / FLASH_BQ, HEADS, TOKENS / SEQ_LEN) = FLASH_DQ_GRID, block
// FLASH_THREADS, static shared memory FLASH_DQ_SMEM bytes. Block (x, h, b): the queries of tile
// qt (the last first) of head h in sequence b, over the key steps of FLASH_BB keys up to the
// diagonal; warp w its rows 16w..16w+15 (Q, dO in registers, dQ in fp32 accumulators); in the
// elementwise passes lane = key column, looping over the warp's 16 rows.
extern "C" __global__ void __launch_bounds__(FLASH_THREADS)
    flash_attention_backward_dq(act *dq, const act *dout, const act *q, const act *k, const act *v, const float *lse,
                                const float *delta) {
  __shared__ __align__(128) bf16 kvs[2 * FLASH_BB * FLASH_LD]; // the Q, then dO tile; then K and V of each step
  __shared__ __align__(128) float scr[FLASH_WARPS][16 * FLASH_BSLD]; // S, then dP (16, FLASH_BB)
  __shared__ __align__(128) bf16 dsb[FLASH_WARPS][16 * FLASH_BPLD];  // scale · dS (16, FLASH_BB)
  __shared__ float rowl[FLASH_WARPS][16], rowd[FLASH_WARPS][16];     // lse, delta of the warp's rows
  int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, kvh = h / GROUP, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  int q0 = qt * FLASH_BQ, tw = q0 + 16 * w; // tw: the warp's first query
  size_t tok0 = (size_t)blockIdx.z * SEQ_LEN;
  const float scale = rsqrtf((float)HEAD_DIM);
  bf16 *ks = kvs, *vs = kvs + FLASH_BB * FLASH_LD, *DS = dsb[w];
  float *S = scr[w];
  if (lane < 16) {
    rowl[w][lane] = lse[(tok0 + tw + lane) * HEADS + h];
    rowd[w][lane] = delta[(tok0 + tw + lane) * HEADS + h];
  }
  FragA qf[HEAD_DIM / 16], of[HEAD_DIM / 16];
  Acc acc[HEAD_DIM / 16];
  flash_load(kvs, q + ((tok0 + q0) * HEADS + h) * HEAD_DIM, HEADS * HEAD_DIM, FLASH_BQ);
  __syncthreads();
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++) wmma::load_matrix_sync(qf[d], kvs + 16 * w * FLASH_LD + 16 * d, FLASH_LD);
  __syncthreads();
  flash_load(kvs, dout + ((tok0 + q0) * HEADS + h) * HEAD_DIM, HEADS * HEAD_DIM, FLASH_BQ);
  __syncthreads();
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++) {
    wmma::load_matrix_sync(of[d], kvs + 16 * w * FLASH_LD + 16 * d, FLASH_LD);
    wmma::fill_fragment(acc[d], 0.f);
  }
  for (int k0 = 0; k0 < q0 + FLASH_BQ; k0 += FLASH_BB) {
    __syncthreads(); // every warp is done with kvs
    flash_load(ks, k + ((tok0 + k0) * KV_HEADS + kvh) * HEAD_DIM, KV_HEADS * HEAD_DIM, FLASH_BB);
    flash_load(vs, v + ((tok0 + k0) * KV_HEADS + kvh) * HEAD_DIM, KV_HEADS * HEAD_DIM, FLASH_BB);
    __syncthreads();
    if (k0 > tw + 15) continue; // every key of the step is after the warp's queries
    // S (16, FLASH_BB) = Q_w Kᵀ, then P = exp(scale · S − lse) of column j = k0 + lane
#pragma unroll
    for (int n = 0; n < FLASH_BB / 16; n++) {
      Acc s;
      wmma::fill_fragment(s, 0.f);
#pragma unroll
      for (int d = 0; d < HEAD_DIM / 16; d++) {
        FragBt kb;
        wmma::load_matrix_sync(kb, ks + 16 * n * FLASH_LD + 16 * d, FLASH_LD);
        wmma::mma_sync(s, qf[d], kb, s);
      }
      wmma::store_matrix_sync(S + 16 * n, s, FLASH_BSLD, wmma::mem_row_major);
    }
    __syncwarp();
    int j = k0 + lane;
    float p[16];
#pragma unroll
    for (int r = 0; r < 16; r++) p[r] = j <= tw + r ? __expf(scale * S[r * FLASH_BSLD + lane] - rowl[w][r]) : 0.f;
    __syncwarp();
    // dP (16, FLASH_BB) = dO_w Vᵀ, then scale · dS = scale · P (dP − delta)
#pragma unroll
    for (int n = 0; n < FLASH_BB / 16; n++) {
      Acc s;
      wmma::fill_fragment(s, 0.f);
#pragma unroll
      for (int d = 0; d < HEAD_DIM / 16; d++) {
        FragBt vb;
        wmma::load_matrix_sync(vb, vs + 16 * n * FLASH_LD + 16 * d, FLASH_LD);
        wmma::mma_sync(s, of[d], vb, s);
      }
      wmma::store_matrix_sync(S + 16 * n, s, FLASH_BSLD, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; r++)
      DS[r * FLASH_BPLD + lane] = __float2bfloat16(scale * p[r] * (S[r * FLASH_BSLD + lane] - rowd[w][r]));
    __syncwarp();
    // dQ_w += (scale · dS) K
    FragA df[FLASH_BB / 16];
#pragma unroll
    for (int c = 0; c < FLASH_BB / 16; c++) wmma::load_matrix_sync(df[c], DS + 16 * c, FLASH_BPLD);
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 16; d++)
#pragma unroll
      for (int c = 0; c < FLASH_BB / 16; c++) {
        FragB kb;
        wmma::load_matrix_sync(kb, ks + 16 * c * FLASH_LD + 16 * d, FLASH_LD);
        wmma::mma_sync(acc[d], df[c], kb, acc[d]);
      }
  }
  flash_write<HEAD_DIM / 16, FLASH_BB / 16, true>(dq + ((tok0 + tw) * HEADS + h) * HEAD_DIM, HEADS * HEAD_DIM, acc, S,
                                                 FLASH_BSLD);
}

// dk += scale · dSᵀ Q, dv += Pᵀ dO: grid (SEQ_LEN / FLASH_BQ, KV_HEADS, TOKENS / SEQ_LEN) =
// FLASH_DKV_GRID, block FLASH_THREADS, static shared memory FLASH_DKV_SMEM bytes. Block (x, g, b):
// the keys of tile x of KV head g in sequence b, over the GROUP query heads that read it and, for
// each, the query steps of FLASH_BB queries from the diagonal on; warp w its keys 16w..16w+15 (K,
// V in registers, dK, dV in fp32 accumulators). Everything is transposed (keys are rows): Sᵀ =
// K Qᵀ, dPᵀ = V dOᵀ; in the elementwise passes lane = query column, looping over the 16 keys.
extern "C" __global__ void __launch_bounds__(FLASH_THREADS)
    flash_attention_backward_dkv(act *dk, act *dv, const act *dout, const act *q, const act *k, const act *v,
                                 const float *lse, const float *delta) {
  __shared__ __align__(128) bf16 qds[2 * FLASH_BB * FLASH_LD]; // the K, then V tile; then Q and dO of each step
  __shared__ __align__(128) float scr[FLASH_WARPS][16 * FLASH_BSLD]; // Sᵀ, then dPᵀ (16, FLASH_BB)
  __shared__ __align__(128) bf16 pb[FLASH_WARPS][16 * FLASH_BPLD];   // Pᵀ (16, FLASH_BB)
  __shared__ __align__(128) bf16 dsb[FLASH_WARPS][16 * FLASH_BPLD];  // scale · dSᵀ (16, FLASH_BB)
  __shared__ float tl[FLASH_BB], td[FLASH_BB];                       // lse, delta of the step's queries
  int kvh = blockIdx.y, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  int k0 = blockIdx.x * FLASH_BQ, jw = k0 + 16 * w; // jw: the warp's first key
  size_t tok0 = (size_t)blockIdx.z * SEQ_LEN;
  const float scale = rsqrtf((float)HEAD_DIM);
  bf16 *qs = qds, *dos = qds + FLASH_BB * FLASH_LD, *P = pb[w], *DS = dsb[w];
  float *S = scr[w];
  FragA kf[HEAD_DIM / 16], vf[HEAD_DIM / 16];
  Acc dka[HEAD_DIM / 16], dva[HEAD_DIM / 16];
  flash_load(qds, k + ((tok0 + k0) * KV_HEADS + kvh) * HEAD_DIM, KV_HEADS * HEAD_DIM, FLASH_BQ);
  __syncthreads();
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++) wmma::load_matrix_sync(kf[d], qds + 16 * w * FLASH_LD + 16 * d, FLASH_LD);
  __syncthreads();
  flash_load(qds, v + ((tok0 + k0) * KV_HEADS + kvh) * HEAD_DIM, KV_HEADS * HEAD_DIM, FLASH_BQ);
  __syncthreads();
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++) {
    wmma::load_matrix_sync(vf[d], qds + 16 * w * FLASH_LD + 16 * d, FLASH_LD);
    wmma::fill_fragment(dka[d], 0.f);
    wmma::fill_fragment(dva[d], 0.f);
  }
  for (int h = kvh * GROUP; h < (kvh + 1) * GROUP; h++)
    for (int q0 = k0; q0 < SEQ_LEN; q0 += FLASH_BB) {
      __syncthreads(); // every warp is done with qds, tl, td
      flash_load(qs, q + ((tok0 + q0) * HEADS + h) * HEAD_DIM, HEADS * HEAD_DIM, FLASH_BB);
      flash_load(dos, dout + ((tok0 + q0) * HEADS + h) * HEAD_DIM, HEADS * HEAD_DIM, FLASH_BB);
      if (threadIdx.x < FLASH_BB) {
        tl[threadIdx.x] = lse[(tok0 + q0 + threadIdx.x) * HEADS + h];
        td[threadIdx.x] = delta[(tok0 + q0 + threadIdx.x) * HEADS + h];
      }
      __syncthreads();
      if (q0 + FLASH_BB - 1 < jw) continue; // every query of the step is before the warp's keys
      // Sᵀ (16, FLASH_BB) = K_w Qᵀ, then Pᵀ = exp(scale · Sᵀ − lse) of column t = q0 + lane
#pragma unroll
      for (int n = 0; n < FLASH_BB / 16; n++) {
        Acc s;
        wmma::fill_fragment(s, 0.f);
#pragma unroll
        for (int d = 0; d < HEAD_DIM / 16; d++) {
          FragBt qb;
          wmma::load_matrix_sync(qb, qs + 16 * n * FLASH_LD + 16 * d, FLASH_LD);
          wmma::mma_sync(s, kf[d], qb, s);
        }
        wmma::store_matrix_sync(S + 16 * n, s, FLASH_BSLD, wmma::mem_row_major);
      }
      __syncwarp();
      int t = q0 + lane;
      float p[16], L = tl[lane], D = td[lane];
#pragma unroll
      for (int r = 0; r < 16; r++) {
        p[r] = jw + r <= t ? __expf(scale * S[r * FLASH_BSLD + lane] - L) : 0.f;
        P[r * FLASH_BPLD + lane] = __float2bfloat16(p[r]);
      }
      __syncwarp();
      // dPᵀ (16, FLASH_BB) = V_w dOᵀ, then scale · dSᵀ = scale · Pᵀ (dPᵀ − delta)
#pragma unroll
      for (int n = 0; n < FLASH_BB / 16; n++) {
        Acc s;
        wmma::fill_fragment(s, 0.f);
#pragma unroll
        for (int d = 0; d < HEAD_DIM / 16; d++) {
          FragBt ob;
          wmma::load_matrix_sync(ob, dos + 16 * n * FLASH_LD + 16 * d, FLASH_LD);
          wmma::mma_sync(s, vf[d], ob, s);
        }
        wmma::store_matrix_sync(S + 16 * n, s, FLASH_BSLD, wmma::mem_row_major);
      }
      __syncwarp();
#pragma unroll
      for (int r = 0; r < 16; r++)
        DS[r * FLASH_BPLD + lane] = __float2bfloat16(scale * p[r] * (S[r * FLASH_BSLD + lane] - D));
      __syncwarp();
      // dV_w += Pᵀ dO, dK_w += (scale · dSᵀ) Q
      FragA pf[FLASH_BB / 16], df[FLASH_BB / 16];
#pragma unroll
      for (int c = 0; c < FLASH_BB / 16; c++) {
        wmma::load_matrix_sync(pf[c], P + 16 * c, FLASH_BPLD);
        wmma::load_matrix_sync(df[c], DS + 16 * c, FLASH_BPLD);
      }
#pragma unroll
      for (int d = 0; d < HEAD_DIM / 16; d++)
#pragma unroll
        for (int c = 0; c < FLASH_BB / 16; c++) {
          FragB ob, qb;
          wmma::load_matrix_sync(ob, dos + 16 * c * FLASH_LD + 16 * d, FLASH_LD);
          wmma::mma_sync(dva[d], pf[c], ob, dva[d]);
          wmma::load_matrix_sync(qb, qs + 16 * c * FLASH_LD + 16 * d, FLASH_LD);
          wmma::mma_sync(dka[d], df[c], qb, dka[d]);
        }
    }
  size_t row = ((tok0 + jw) * KV_HEADS + kvh) * HEAD_DIM;
  flash_write<HEAD_DIM / 16, FLASH_BB / 16, true>(dk + row, KV_HEADS * HEAD_DIM, dka, S, FLASH_BSLD);
  flash_write<HEAD_DIM / 16, FLASH_BB / 16, true>(dv + row, KV_HEADS * HEAD_DIM, dva, S, FLASH_BSLD);
}
#endif // HAVE_FLASH_ATTENTION

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
