// ==== templates/kernels/30-elementwise.cu: activations, sums, casts ====

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
  dg[t] = to_act(dy * f32(u[t]) * s * (1.f + x * (1.f - s)));
  du[t] = to_act(dy * x * s);
}

extern "C" __global__ void swiglu_backward(act *dg, act *du, const act *dh, const act *g, const act *u, long n) {
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x);
  SCALAR_TAIL(i, n, swiglu_backward_one(dg, du, dh, g, u, t))
  if (i >= n / VEC) return;
  Vec a = ((const Vec *)g)[i], b = ((const Vec *)u)[i], d = ((const Vec *)dh)[i];
  Vec og, ou;
#pragma unroll
  for (int j = 0; j < VEC; j++) {
    float x = f32(a.h[j]), s = 1.f / (1.f + __expf(-x)), up = f32(b.h[j]);
    float dy = f32(d.h[j]);
    og.h[j] = to_act(dy * up * s * (1.f + x * (1.f - s)));
    ou.h[j] = to_act(dy * x * s);
  }
  ((Vec *)dg)[i] = og, ((Vec *)du)[i] = ou;
}

// SwiGLU over one fused gate|up projection's rows: gu (rows, 2F), row r's g at r·2F, its u at
// r·2F + F; h (rows, F). One thread per element of h (n = rows · F).
extern "C" __global__ void swiglu_rows_forward(act *h, const act *gu, long n, int F) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  long r = i / F, j = i % F;
  h[i] = to_act(silu(f32(gu[r * 2 * F + j])) * f32(gu[r * 2 * F + F + j]));
}

// Its backward: dgu (rows, 2F) written, the same layout.
extern "C" __global__ void swiglu_rows_backward(act *dgu, const act *dh, const act *gu, long n, int F) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  long r = i / F, j = i % F, g = r * 2 * F + j;
  float x = f32(gu[g]), s = 1.f / (1.f + __expf(-x)), dy = f32(dh[i]);
  dgu[g] = to_act(dy * f32(gu[g + F]) * s * (1.f + x * (1.f - s)));
  dgu[g + F] = to_act(dy * x * s);
}

// GELU, tanh approximation (Hendrycks & Gimpel 2016): h = gelu(x); backward dx = dh gelu'(x).
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
  dx[i] = to_act(f32(dh[i]) * d);
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

