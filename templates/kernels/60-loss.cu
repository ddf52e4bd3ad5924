// ==== templates/kernels/60-loss.cu: chunked cross-entropy ====

// Cross-entropy over one vocabulary chunk of `cols` logits (fp32, from cuBLAS; cols <=
// VOCAB_CHUNK, less for a last partial chunk) starting at column `first`: an online log-sum-exp
// per row merged into (mx, sum) across chunks (the first chunk, first 0, starts them: no fill
// before), and the target's logit picked when it falls in the chunk. The last chunk (first + cols
// = VOCAB) then leaves lse = mx + log(sum) in mx and adds lse − target logit to *loss (zeroed
// before): the summed cross-entropy (the host divides by TOKENS). grid TOKENS.
extern "C" __global__ void cross_entropy_chunk(float *mx, float *sum, float *target_logit, float *loss,
                                               const float *logits, const int *targets, int first, int cols) {
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
    float M = first ? fmaxf(mx[blockIdx.x], m) : m;
    float S = first ? sum[blockIdx.x] * __expf(mx[blockIdx.x] - M) + s * __expf(m - M) : s;
    int t = targets[blockIdx.x] - first;
    if (t >= 0 && t < cols) target_logit[blockIdx.x] = l[t];
    if (first + cols < VOCAB) {
      sum[blockIdx.x] = S, mx[blockIdx.x] = M;
    } else {
      float lse = M + __logf(S);
      mx[blockIdx.x] = lse;
      atomicAdd(loss, lse - target_logit[blockIdx.x]);
    }
  }
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

