// kernels.cu — the cuda backend's elementwise, normalization, routing, loss and attention
// kernels (the GEMMs go to cuBLAS; attention is a flash kernel below, or a simple one where
// head_dim and seq_len do not fit its tiles). mtc writes templates/kernels/*.cu, in name order
// (this file first, then one file per op family, each opening with a ==== line), into each
// generated program's kernels.cu after a prelude of #defines with the plan's shapes, so every
// loop bound is a compile-time constant; the program compiles it at start-up with NVRTC for the
// device's architecture (sm_90a on Hopper), and `train --check-kernels` compiles it without a GPU.
//
// Storage type `act`: bf16 by default (the activation arena of the program's cuda build), fp32
// with ACT_FLOAT (the runtime prepends it when built with fp32 activations, mtrt_cuda_f32act);
// arithmetic is always fp32. Row kernels
// use one block per token row and 16-byte accesses (VEC values per load); HIDDEN must be a
// multiple of 8: mtc compile says so and `mtc build --backend cuda` refuses another (the #error
// below is the last guard). Backward kernels ADD into the gradients they are given, as the cpu
// ops do (mtrt_ops.h); forward kernels overwrite their outputs.
// Expected from the prelude: TOKENS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, SEQ_LEN, ROPE_THETA,
// VOCAB, VOCAB_CHUNK, EXPERTS (0: dense), TOP_K, RMS_EPS; V_DIM (default HEAD_DIM); CP_SEQ_LEN
// (context parallelism: the whole sequence, TOKENS and SEQ_LEN then a rank's; default SEQ_LEN).
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

