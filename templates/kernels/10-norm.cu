// ==== templates/kernels/10-norm.cu: embeddings, positions, norms, biases, column sums ====

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

// The residual add and the RMSNorm after it: res = x + y (residual_add's rounding), then
// rmsnorm_forward of res's stored values into out, rstd; one row per block, as rmsnorm_forward.
extern "C" __global__ void add_rmsnorm_forward(act *res, act *out, float *rstd, const act *x, const act *y,
                                               const act *w) {
  __shared__ float shared[32];
  size_t row = (size_t)blockIdx.x * HIDDEN;
  const Vec *xv = (const Vec *)(x + row), *yv = (const Vec *)(y + row), *wv = (const Vec *)w;
  Vec *rv = (Vec *)(res + row), *ov = (Vec *)(out + row);
  float ss = 0;
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) {
    Vec a = xv[i], b = yv[i], s;
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      s.h[j] = to_act(f32(a.h[j]) + f32(b.h[j]));
      ss += f32(s.h[j]) * f32(s.h[j]);
    }
    rv[i] = s;
  }
  float r = rsqrtf(block_sum(ss, shared) / HIDDEN + RMS_EPS);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int i = threadIdx.x; i < HIDDEN / VEC; i += blockDim.x) { // this thread's own res vectors
    Vec a = rv[i], b = wv[i], o;
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

