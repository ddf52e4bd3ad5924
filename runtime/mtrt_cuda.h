/*
 * mtrt_cuda.h — the cuda backend's kernel loader: the plan's kernels.cu compiled at start-up by
 * NVRTC for the device's architecture, cached on disk by a hash of source and options. It needs
 * no GPU and no driver (NVRTC is a library), so `train --check-kernels` runs on CI.
 * The training step on the GPU (cuBLAS GEMMs, attention, NCCL collectives) is not written yet.
 */
#ifndef MTRT_CUDA_H
#define MTRT_CUDA_H

#include <stddef.h>

/* Compiles src (n bytes, named name in messages) for arch ("sm_90a") with the CUDA headers in
 * include_dir. A cached CUBIN under cache_dir (NULL: $MTC_KERNEL_CACHE, else
 * $HOME/.cache/mtc-kernels) whose name is the FNV-1a hash of source and options is used when
 * present (*cached = 1); otherwise the result is written there. On success returns 0 with the
 * CUBIN's size, the number of kernels (extern "C" __global__ functions) in *kernels and, when
 * cubin is not NULL, the CUBIN itself (malloc'ed; the caller frees it); on failure -1 with
 * NVRTC's log (file:line: error ...) in log. */
int rt_cuda_compile(const char *src, size_t n, const char *name, const char *arch, const char *include_dir,
                    const char *cache_dir, void **cubin, size_t *cubin_bytes, int *kernels, int *cached, char *log,
                    size_t loglen);

/* The architecture of GPU 0 as NVRTC names it ("sm_90a" for compute capability 9.0, which
 * needs the a-suffix for wgmma; "sm_XY" otherwise); -1 when there is no usable GPU. */
int rt_cuda_arch(char *arch, size_t n);

/* The CUDA runtime, cuBLAS, NVRTC and NCCL versions this program runs with, and the GPUs the
 * runtime sees (none, with the reason, on a machine without a driver), as one line in buf. */
void rt_cuda_versions(char *buf, size_t n);

#endif
