/* gemm.c — the cuda backend's GEMMs through cuBLAS: bf16 operands, fp32 accumulation, row-major
 * tensors as in mtrt_ops.h (a row-major R = A·Bᵀ is the column-major Rᵀ = B·Aᵀ that cuBLAS
 * computes), and the routed experts as one grouped GEMM (cublasGemmGroupedBatchedEx), never a
 * loop of per-expert launches. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_cuda.h"

int rt_cublas_init(RtCublas *b, int max_groups) {
  memset(b, 0, sizeof *b);
  if (cublasCreate(&b->handle) != CUBLAS_STATUS_SUCCESS) return -1;
  b->max_groups = max_groups;
  if (max_groups > 0 && cudaMalloc((void **)&b->ptrs, sizeof(void *) * 3 * (size_t)max_groups) != cudaSuccess) {
    rt_cublas_free(b);
    return -1;
  }
  return 0;
}

void rt_cublas_free(RtCublas *b) {
  if (b->ptrs) cudaFree(b->ptrs);
  if (b->handle) cublasDestroy(b->handle);
  memset(b, 0, sizeof *b);
}

int rt_cu_matmul_forward(RtCublas *b, void *out, const void *x, const void *w, int N, int IC, int OC) {
  const float one = 1, zero = 0;
  return (int)cublasGemmEx(b->handle, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &one, w, CUDA_R_16BF, IC, x, CUDA_R_16BF,
                           IC, &zero, out, CUDA_R_16BF, OC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

int rt_cu_matmul_backward(RtCublas *b, void *dx, float *dw, const void *dout, const void *x, const void *w, int N, int IC,
                          int OC) {
  const float one = 1;
  int rc = 0;
  if (dx) /* dxᵀ (IC, N) += wᵀ · doutᵀ */
    rc = (int)cublasGemmEx(b->handle, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, w, CUDA_R_16BF, IC, dout, CUDA_R_16BF,
                           OC, &one, dx, CUDA_R_16BF, IC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (!rc && dw) /* dwᵀ (IC, OC) += xᵀ · dout, in fp32 */
    rc = (int)cublasGemmEx(b->handle, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, &one, x, CUDA_R_16BF, IC, dout, CUDA_R_16BF,
                           OC, &one, dw, CUDA_R_32F, IC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return rc;
}

int rt_cu_grouped_forward(RtCublas *b, void *out, const void *x, const void *w, const int *offsets, int E, int IC,
                          int OC) {
  if (E > b->max_groups) return -1;
  enum { MAXG = 1024 };
  if (E > MAXG) return -1;
  static cublasOperation_t ta[MAXG], tb[MAXG];
  static int m[MAXG], n[MAXG], k[MAXG], lda[MAXG], ldb[MAXG], ldc[MAXG], size[MAXG];
  static float alpha[MAXG], beta[MAXG];
  static void *host[3 * MAXG];
  int g = 0;
  for (int e = 0; e < E; e++) {
    int rows = offsets[e + 1] - offsets[e];
    if (!rows) continue;
    ta[g] = CUBLAS_OP_T, tb[g] = CUBLAS_OP_N, m[g] = OC, n[g] = rows, k[g] = IC;
    lda[g] = IC, ldb[g] = IC, ldc[g] = OC, size[g] = 1, alpha[g] = 1, beta[g] = 0;
    host[g] = (char *)w + (size_t)e * OC * IC * 2;                   /* A: expert e's weight */
    host[MAXG + g] = (char *)x + (size_t)offsets[e] * IC * 2;        /* B: its rows */
    host[2 * MAXG + g] = (char *)out + (size_t)offsets[e] * OC * 2;  /* C */
    g++;
  }
  if (!g) return 0;
  void **d = b->ptrs; /* device arrays of device pointers: A, B, C */
  if (cudaMemcpy(d, host, sizeof(void *) * (size_t)g, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(d + b->max_groups, host + MAXG, sizeof(void *) * (size_t)g, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(d + 2 * b->max_groups, host + 2 * MAXG, sizeof(void *) * (size_t)g, cudaMemcpyHostToDevice) != cudaSuccess)
    return -1;
  return (int)cublasGemmGroupedBatchedEx(b->handle, ta, tb, m, n, k, alpha, (const void *const *)d, CUDA_R_16BF, lda,
                                         (const void *const *)(d + b->max_groups), CUDA_R_16BF, ldb, beta,
                                         d + 2 * b->max_groups, CUDA_R_16BF, ldc, g, size, CUBLAS_COMPUTE_32F);
}
