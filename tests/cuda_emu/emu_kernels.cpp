// emu_kernels.cpp — a generated program's kernels.cu compiled for the CPU (emu_device.h and
// fakeinc/ stand in for the CUDA headers), and the table of its extern "C" __global__ kernels
// (emu_kernel_list.inc, written by gen_kernel_list.sh from the preprocessed source): name, a
// trampoline that unpacks cudaLaunchKernel's void **args into the kernel's parameters (types
// deduced from the function's type), which parameters are pointers, and __launch_bounds__; and
// the source's text (.inc.src), by which the runtime's CUBIN is matched to these kernels.
#include "emu_device.h"

#include EMU_KERNELS_CU

#include <type_traits>
#include <utility>

#include "emu_sched.h"

template <class T> struct EmuArity;
template <class... A> struct EmuArity<void (*)(A...)> {
  static constexpr int n = sizeof...(A);
  static_assert(n <= EMU_MAX_PARAMS, "too many kernel parameters");
};

template <class... A, size_t... I> static void call(void (*f)(A...), void **args, std::index_sequence<I...>) {
  f(*static_cast<std::remove_cv_t<A> *>(args[I])...);
}
template <auto F> static void run(void **args) { call(F, args, std::make_index_sequence<EmuArity<decltype(F)>::n>()); }


template <class... A> static EmuKernel describe(const char *name, void (*f)(A...), void (*r)(void **), int lb) {
  EmuKernel k{EMU_KERNEL_MAGIC, name, r, (int)sizeof...(A), {}, {}, lb};
  int i = 0;
  ((k.is_ptr[i] = std::is_pointer<A>::value, k.size[i] = (unsigned char)sizeof(A), i++), ...);
  (void)f;
  return k;
}

#define EMU_KERNEL(name, bounds) describe(#name, &name, &run<&name>, bounds),
#ifndef EMU_KERNEL_LIST
#define EMU_KERNEL_LIST "emu_kernel_list.inc"
#define EMU_KERNEL_SOURCE "emu_kernel_list.inc.src"
#endif
extern "C" {
extern const EmuKernel emu_kernels[];
extern const int emu_nkernels;
extern const unsigned char emu_kernels_source[];
extern const unsigned long emu_kernels_source_len;
const EmuKernel emu_kernels[] = {
#include EMU_KERNEL_LIST
};
const int emu_nkernels = sizeof emu_kernels / sizeof emu_kernels[0];
// the source itself, to tell it from another kernels.cu the runtime may compile
const unsigned char emu_kernels_source[] = {
#include EMU_KERNEL_SOURCE
    0};
const unsigned long emu_kernels_source_len = sizeof emu_kernels_source - 1;
}
