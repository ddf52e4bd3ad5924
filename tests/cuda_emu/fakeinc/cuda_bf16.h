// cuda_bf16.h for the CPU emulation of kernels.cu (emu_device.h): bf16 as the top 16 bits of an
// IEEE float, rounded to nearest even, NaN kept quiet. With EMU_BF16_EXACT (cmake
// -DEMU_BF16_EXACT=ON) it keeps a whole float instead: with it, a difference from the cpu backend
// that remains is not bf16 rounding (single rank only: bf16 on the wire needs 2 bytes).
#pragma once
#include "../emu_device.h"

#ifdef EMU_BF16_EXACT // a diagnostic: "bf16" keeps the whole float, so only the arithmetic differs
struct __nv_bfloat16 {
  float f;
};
typedef __nv_bfloat16 nv_bfloat16;
inline __nv_bfloat16 __float2bfloat16(float f) { return {f}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {f}; }
inline float __bfloat162float(__nv_bfloat16 h) { return h.f; }
#else
struct __nv_bfloat16 {
  uint16_t b;
};
typedef __nv_bfloat16 nv_bfloat16;

inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  __nv_bfloat16 h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h.b = (uint16_t)((u >> 16) | 0x40);
    return h;
  }
  u += 0x7fffu + ((u >> 16) & 1);
  h.b = (uint16_t)(u >> 16);
  return h;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif

// atomicAdd of bf16 (sm_80+ in CUDA): a compare-and-swap of the value, the sum rounded to bf16
#ifdef EMU_BF16_EXACT
inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v) { return {atomicAdd(&p->f, v.f)}; }
#else
inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v) {
  uint16_t old = __atomic_load_n(&p->b, __ATOMIC_RELAXED);
  for (;;) {
    __nv_bfloat16 o = {old};
    uint16_t nw = __float2bfloat16(__bfloat162float(o) + __bfloat162float(v)).b;
    if (__atomic_compare_exchange_n(&p->b, &old, nw, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return o;
  }
}
#endif
