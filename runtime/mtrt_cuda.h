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

/* ---- GEMMs through cuBLAS (gemm.c): bf16 operands, fp32 accumulation, row-major as the
 * cpu ops (mtrt_ops.h). Return 0 or a cublasStatus_t / -1. Not yet run on a GPU. ---- */
typedef struct cublasContext *cublasHandle_t;
typedef struct {
  cublasHandle_t handle;
  void **ptrs;    /* device: 3 × max_groups pointers for grouped GEMMs */
  int max_groups; /* experts one grouped GEMM may cover */
} RtCublas;

int rt_cublas_init(RtCublas *b, int max_groups);
void rt_cublas_free(RtCublas *b);
/* out (N, OC) = x (N, IC) · wᵀ, w (OC, IC); all bf16 on the device. */
int rt_cu_matmul_forward(RtCublas *b, void *out, const void *x, const void *w, int N, int IC, int OC);
/* dx (N, IC, bf16) += dout · w and dw (OC, IC, fp32) += doutᵀ · x; either may be NULL. */
int rt_cu_matmul_backward(RtCublas *b, void *dx, float *dw, const void *dout, const void *x, const void *w, int N, int IC,
                          int OC);
/* The routed experts' GEMM: rows [offsets[e], offsets[e+1]) of x (rows, IC) times expert e's
 * wᵀ (w: E × (OC, IC)) into the same rows of out (rows, OC), for every expert with rows, in one
 * cublasGemmGroupedBatchedEx. offsets (E + 1) on the host. */
int rt_cu_grouped_forward(RtCublas *b, void *out, const void *x, const void *w, const int *offsets, int E, int IC,
                          int OC);

/* The CUDA runtime, cuBLAS, NVRTC and NCCL versions this program runs with, and the GPUs the
 * runtime sees (none, with the reason, on a machine without a driver), as one line in buf. */
void rt_cuda_versions(char *buf, size_t n);

#endif
