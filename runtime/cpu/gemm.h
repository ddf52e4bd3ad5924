/* gemm.h — CBLAS in the compute type of the build (float, or double for gradient checks). */
#ifndef MTRT_GEMM_H
#define MTRT_GEMM_H
#include <cblas.h>

#include "mtrt_ops.h"

#ifdef MTRT_REAL_DOUBLE
#define GEMM cblas_dgemm
#define EXP exp
#define LOG log
#define SQRT sqrt
#define TANH tanh
#define COS cos
#define SIN sin
#define POW pow
#else
#define GEMM cblas_sgemm
#define EXP expf
#define LOG logf
#define SQRT sqrtf
#define TANH tanhf
#define COS cosf
#define SIN sinf
#define POW powf
#endif

#endif
