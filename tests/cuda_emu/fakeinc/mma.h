// mma.h for the CPU emulation of kernels.cu: the bf16 16x16x16 wmma subset. matrix_a and
// matrix_b fragments hold the whole tile in every lane (the kernels never touch their elements);
// accumulators hold 8 elements per lane under a fixed random permutation of the 256 positions
// (emu_acc_map, emu_sched.cpp), so a kernel that assumes an accumulator layout shows it. Products
// are exact fp32 sums of bf16 operands, as the tensor cores' fp32 accumulation (up to order).
#pragma once
#include <type_traits>

#include "cuda_bf16.h"

extern int emu_acc_map[32][8]; // (lane, i) -> r * 16 + c
[[noreturn]] void emu_fail(const char *fmt, ...);

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class L = void> struct fragment;
template <class Use, class T, class L> struct fragment<Use, 16, 16, 16, T, L> {
  enum { num_elements = 256 };
  float x[256]; // x[r * 16 + c]: logical (m, k) for matrix_a, (k, n) for matrix_b
};
template <> struct fragment<accumulator, 16, 16, 16, float, void> {
  enum { num_elements = 8 };
  float x[8];
};
inline void emu_check(const void *p, unsigned ldm, unsigned elem, const char *what) {
  if ((uintptr_t)p % 32 != 0 || (ldm * elem) % 16 != 0)
    emu_fail("wmma::%s: pointer %p not 32-byte aligned or ldm %u not a multiple of 16 bytes", what, p, ldm);
}
template <class Use, class L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L> &f, const __nv_bfloat16 *p, unsigned ldm) {
  emu_check(p, ldm, 2, "load_matrix_sync");
  bool rm = std::is_same<L, row_major>::value;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.x[r * 16 + c] = __bfloat162float(rm ? p[r * ldm + c] : p[c * ldm + r]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm, layout_t l) {
  emu_check(p, ldm, 4, "load_matrix_sync");
  int lane = emu_self->lane;
  for (int i = 0; i < 8; i++) {
    int r = emu_acc_map[lane][i] / 16, c = emu_acc_map[lane][i] % 16;
    f.x[i] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t l) {
  emu_check(p, ldm, 4, "store_matrix_sync");
  int lane = emu_self->lane;
  for (int i = 0; i < 8; i++) {
    int r = emu_acc_map[lane][i] / 16, c = emu_acc_map[lane][i] % 16;
    (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[i];
  }
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v) {
  for (int i = 0; i < 8; i++) f.x[i] = v;
}
template <class La, class Lb>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, La> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, Lb> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
  int lane = emu_self->lane;
  float out[8];
  for (int i = 0; i < 8; i++) {
    int r = emu_acc_map[lane][i] / 16, cc = emu_acc_map[lane][i] % 16;
    float s = 0;
    for (int k = 0; k < 16; k++) s += a.x[r * 16 + k] * b.x[k * 16 + cc];
    out[i] = s + c.x[i];
  }
  for (int i = 0; i < 8; i++) d.x[i] = out[i];
}
} // namespace wmma
} // namespace nvcuda
