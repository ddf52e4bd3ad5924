/* test_kernels.h — what the files of test_kernels share: the test's shapes, the tolerances, a
 * pass's host and device buffers, and the checks that compare a device buffer with the cpu
 * reference (all defined in test_kernels.c, which holds main and the passes). A check's error is
 * max |cuda − cpu| / max |cpu| over a tensor, recorded per op and pass for the table main prints.
 * The checks by op family, each drawing its inputs, running both backends and comparing:
 *   test_kernels_norm.c       elementwise ops and activations, embeddings, norms, the bias
 *   test_kernels_attention.c  RoPE (all variants), MLA's keys and values, causal GQA attention,
 *                             context parallelism's span attention (its own set-up per cp rank)
 *   test_kernels_gemm.c       linear layers and the router's logits (cuBLAS), the routed experts'
 *                             grouped GEMMs (SwiGLU and GELU), the LM head with cross-entropy
 *   test_kernels_moe.c        routers, balancing losses, permutation, gather, combine, the loads
 *   test_kernels_optim.c      AdamW and the squared norm on the device, Newton-Schulz
 * Built twice (tests/CMakeLists.txt, tests/cuda_emu/CMakeLists.txt): with fp32 activations and,
 * as test_kernels_bf16, with MTRT_ACT_BF16 (act is bf16). */
#ifndef MTC_TEST_KERNELS_H
#define MTC_TEST_KERNELS_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_SHARED /* one count of checks for every file (defined in test_kernels.c) */
#include "check.h"
#include "mtrt_cuda.h"
#include "mtrt_ops.h" /* rt_: the cuda ops (mtrt_cuda), device pointers */
#include "mtrt_optim.h"
#include "ref_ops.h" /* ref_: the cpu ops, host pointers */

#ifdef MTRT_ACT_BF16
#define MTRT_ACT_IS_BF16 1
#else
#define MTRT_ACT_IS_BF16 0
#endif

/* Shapes: B sequences of T tokens, C hidden, NH query / NKV KV heads of HD, V vocabulary in
 * chunks of CH, E experts (top K) of width F, NE elementwise values. T is two flash tiles of 64
 * and HD a multiple of 16, so both attention kernels exist; C is no multiple of a row kernel's
 * 128 threads; CH leaves a partial last chunk; NE is no multiple of the 4-value vectors (the
 * scalar tail runs). */
enum { B = 2, T = 128, N = B * T, C = 96, NH = 4, NKV = 2, HD = 32, V = 256, CH = 96, E = 8, K = 2, F = 48 };
enum { NE = 1003, OC = 80 /* a linear layer's outputs */ };
/* The context-parallel pass (test_attention_span): each of B sequences of CP_S tokens split over
 * CP ranks, a rank's CP_T tokens in two chunks of CP_T / 2 = 96: three query tiles of 64, the
 * middle one across the chunks, chunk offsets no multiple of 64 (rank 0: 0 and 288), six key tiles. */
enum { CP = 2, CP_T = 192, CP_S = CP * CP_T };
#define THETA 10000.0f
typedef struct {
  const char *name, *gemm, *attention; /* $MTC_GEMM, $MTC_ATTENTION (NULL: cuDNN in the bf16 build, else flash) */
  double gemm_tol, attn_tol;           /* for outputs of GEMMs, of the attention kernels */
  int cudnn;                           /* the attention is cuDNN's (attn_cudnn.c) */
  int loop_rows;                       /* RtCudaConfig's expert_loop_rows: 1 the experts' GEMM loop, 0 the grouped call */
} Pass;
enum { MLA_HD = 48, MLA_VD = 32 }; /* the cuDNN pass's unequal head dims (q/k, v), as MLA's 192/128 */

/* Tolerances: TOL for an op without GEMMs or attention kernels; a pass's gemm_tol and attn_tol
 * (test_kernels.c's passes) for those. */
#ifndef MTRT_ACT_BF16
#define TOL 1e-4 /* fp32 arithmetic in another order, fast-math exp */
#else
/* bf16 activations. An error is max |cuda − cpu| / max |cpu| over a tensor, the inputs exact
 * (rnd draws bf16 values): what is left is the rounding of act results to bf16 (unit roundoff
 * u = 2^-9 = 1.95e-3 of the value, at most u of the max), plus, where a kernel or a chain of ops
 * stores an intermediate in bf16 and computes on (swiglu's backward reads its bf16 h, rope over
 * a tensor rotated before, the attention backward from the device's bf16 out), a few more
 * roundings, each at most u of the max. ACT_TOL = 8u = 1.6e-2 allows 8 such roundings.
 * GEMMs (cuBLAS, bf16 operands, fp32 accumulation) and reductions over n terms: the fp32 sums are
 * exact to ~n·2^-24 (< 1e-4 for n ≤ 1000), so their results are off by the output's rounding
 * and the rounded intermediates (the experts' g, u, h feed the next GEMM; each term carries u,
 * summed over the reduction's n ≤ 520 terms of random sign: ~u·√n of the typical term, while
 * the max result grows as √n of it too): ACT_TOL holds there as well. The attention kernels'
 * own bf16 tensor-core products (flash) are as in the fp32 pass above (2e-2): 2·ACT_TOL with
 * the bf16 stores on top; the backward 2× that as in every pass. */
#define ACT_TOL 1.6e-2
#define TOL ACT_TOL
#endif

/* ---- a pass's buffers (freed at its end) and inputs: every pass draws the same ---- */
/* f as act holds it: bf16-exact in the bf16 build (rounded to nearest even, as kernels.cu's
 * cast_bf16 and __float2bfloat16_rn; the inputs are finite); itself in the fp32 build. */
float act_exact(float f);
/* n zeroed floats (or ints) on the host */
float *host(size_t n);
/* n values uniform in [−scale/2, scale/2), bf16-exact in the bf16 build */
float *rnd(size_t n, float scale);
/* an index uniform in [0, n) (the same generator as rnd) */
int32_t rnd_index(int n);
/* n floats (ints) on the device (rt_cuda_alloc: zeroed), a copy of x unless NULL */
float *devf(const float *x, size_t n);
int32_t *devi(const int32_t *x, size_t n);
/* n act values on the device (zeroed when x is NULL, else x converted to act) */
act *deva(const float *x, size_t n);

/* ---- the checks: each records its error in this pass, a failure when above tol (or NaN) ---- */
/* `name`: n floats of device buffer d against the reference. In the bf16 build an fp32 result
 * (rstd, lse, logits, router weights, losses, the optimizer's state) of bf16-exact inputs is
 * fp32 arithmetic as in the fp32 build: a tol of ACT_TOL is checked at 1e-4. */
void check_real(const char *name, const float *d, const float *ref, size_t n, double tol);
#ifdef MTRT_ACT_BF16
/* `name`: n act values of device buffer d, read back as float, against the reference. */
void check_act(const char *name, const act *d, const float *ref, size_t n, double tol);
/* check_dev: check_act for an act buffer, check_real for an fp32 one */
#define check_dev(name, d, ref, n, tol) \
  _Generic((d), act *: check_act, const act *: check_act, default: check_real)(name, d, ref, n, tol)
#else
#define check_dev check_real
#endif
/* `name`: n ints of device buffer d equal the reference (the error is the mismatch count). */
void check_ints(const char *name, const int32_t *d, const int32_t *ref, size_t n);
/* `name`: a scalar, relative to the reference (in the bf16 build ACT_TOL is 1e-4, as check_real). */
void check_scalar(const char *name, double got, double ref, double tol);

/* ---- the families' checks, as run_pass calls them (in this order: the inputs are drawn in it) ---- */
void test_elementwise(void);           /* test_kernels_norm.c */
void test_norms(void);                 /* test_kernels_norm.c */
void test_rope(void);                  /* test_kernels_attention.c */
void test_matmul(const Pass *p);       /* test_kernels_gemm.c */
void test_attention(const Pass *p);    /* test_kernels_attention.c */
/* context parallelism's span attention of rank r (the runtime set up for a cp plan's rank r) */
void test_attention_span(const Pass *p, int r); /* test_kernels_attention.c */
void test_moe(void);                   /* test_kernels_moe.c */
void test_experts(const Pass *p);      /* test_kernels_gemm.c */
void test_experts_gelu(const Pass *p); /* test_kernels_gemm.c */
void test_lm_head(const Pass *p);      /* test_kernels_gemm.c */
void test_optimizer(void);             /* test_kernels_optim.c */
void test_newton_schulz(void);         /* test_kernels_optim.c */

#endif
