// emu_sched.h — what the emulated runtime (fake_cuda.cpp), the kernel table (emu_kernels.cpp)
// and the grid runner (emu_sched.cpp) share.
#pragma once
#include <stddef.h>

#include <stdint.h>

struct EmuDim {
  unsigned x, y, z;
};

enum { EMU_MAX_PARAMS = 32 };

// A kernel of the program's kernels.cu, compiled for the CPU: run(args) is one thread's body
// with the parameters unpacked from cudaLaunchKernel's args.
struct EmuKernel {
  unsigned magic;
  const char *name;
  void (*run)(void **args);
  int nparams;
  unsigned char is_ptr[EMU_MAX_PARAMS];
  unsigned char size[EMU_MAX_PARAMS];
  int launch_bounds; // __launch_bounds__ (max threads per block), 0: none
};
enum { EMU_KERNEL_MAGIC = 0x6b65726e };

// Runs the grid; returns when every block is done.
void emu_run_grid(const EmuKernel *k, void **args, EmuDim grid, EmuDim block);
// For messages: the kernel running now (fake_cuda.cpp).
const char *emu_current_kernel(void);
// A barrier (what) completed with `exited` threads gone: reported once per kernel.
void emu_exited_barrier(const char *what, int exited);
[[noreturn]] void emu_fail(const char *fmt, ...);
