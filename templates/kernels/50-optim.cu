// ==== templates/kernels/50-optim.cu: AdamW, reduce-scatter sums, gradient norm, Muon ====

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

