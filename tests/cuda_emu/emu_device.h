// emu_device.h — CUDA device code on the CPU: force-included before a generated program's
// kernels.cu when it is compiled as C++ (emu_kernels.cpp). A block's threads are fibers on one
// OS thread (emu_sched.cpp): __syncthreads and __syncwarp are barriers that switch fibers,
// warp shuffles go through per-warp slots, __shared__ is a thread_local static (one block runs
// on a worker thread at a time), atomics are real atomics (blocks may run on several workers).
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __restrict__ __restrict

#include "emu_sched.h"

struct EmuThreadPub { EmuDim tid; unsigned lane, warp, shfl; };
extern __thread EmuThreadPub *emu_self; // the fiber running now (__thread: no TLS wrapper)
extern __thread EmuDim blockIdx, blockDim, gridDim;
#define threadIdx (emu_self->tid)
#define warpSize 32

struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) uint2 { unsigned x, y; };
struct __align__(8) float2 { float x, y; };

inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }

// ---- synchronization (emu_sched.cpp; never inlined: a fiber may switch inside) ----
void emu_syncthreads(void);
void emu_syncwarp(unsigned mask);
uint64_t emu_shfl(uint64_t v, int src_lane, unsigned mask); // value of lane src_lane
inline void __syncthreads() { emu_syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu_syncwarp(mask); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

template <class T> inline T emu_shfl_t(T v, int src, unsigned mask) {
  static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof v);
  u = emu_shfl(u, src, mask);
  T r;
  memcpy(&r, &u, sizeof r);
  return r;
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int o, int width = 32) {
  return emu_shfl_t(v, (int)((emu_self->lane & ~(unsigned)(width - 1)) | ((emu_self->lane ^ o) & (width - 1))), mask);
}
template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return emu_shfl_t(v, (int)((emu_self->lane & ~(unsigned)(width - 1)) + (src & (width - 1))), mask);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
  unsigned l = emu_self->lane, s = (l & (width - 1)) + d < (unsigned)width ? l + d : l;
  return emu_shfl_t(v, (int)s, mask);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
  unsigned l = emu_self->lane, s = (l & (width - 1)) >= d ? l - d : l;
  return emu_shfl_t(v, (int)s, mask);
}

// ---- atomics (blocks may run concurrently on several worker threads) ----
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <class F, class U> inline F emu_atomic_add_fp(F *p, F v) {
  U *u = (U *)p, old = __atomic_load_n(u, __ATOMIC_RELAXED), nw;
  for (;;) {
    F f, g;
    memcpy(&f, &old, sizeof f);
    g = f + v;
    memcpy(&nw, &g, sizeof nw);
    if (__atomic_compare_exchange_n(u, &old, nw, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return f;
  }
}
inline float atomicAdd(float *p, float v) { return emu_atomic_add_fp<float, uint32_t>(p, v); }
inline double atomicAdd(double *p, double v) { return emu_atomic_add_fp<double, uint64_t>(p, v); }
inline int atomicMax(int *p, int v) {
  int o = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (o < v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return o;
}
inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
inline int atomicCAS(int *p, int c, int v) {
  __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return c;
}
