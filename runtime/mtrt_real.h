/*
 * mtrt_real.h — the compute type of libmtrt's cpu backend: float, or double when built with
 * MTRT_REAL_DOUBLE (gradient checks against finite differences). libmtrt is built once per
 * type (mtrt_f32, mtrt_f64); a generated program picks one with -DMTC_REAL=float|double.
 */
#ifndef MTRT_REAL_H
#define MTRT_REAL_H

#ifdef MTRT_REAL_DOUBLE
typedef double real;
#define MTRT_MPI_REAL MPI_DOUBLE
#else
typedef float real;
#define MTRT_MPI_REAL MPI_FLOAT
#endif

/* The activation type `act`: activations and their gradients, gathered parameters and the
 * activation-offload arena (a generated program's activation arena, A(o)). Arithmetic is in
 * real (fp32). The cuda backend stores it in bf16 (MTRT_ACT_BF16: the upper 16 bits of an IEEE
 * float, round to nearest even), as the plan's items count it; the cpu backend, and the cuda
 * runtime built for exact checks (mtrt_cuda_f32act), keep real. Host code only moves act
 * values; mtrt_act_float reads one. */
#ifdef MTRT_ACT_BF16
#include <stdint.h>
#include <string.h>
typedef struct {
  uint16_t bits;
} act;
static inline float mtrt_act_float(act a) {
  uint32_t u = (uint32_t)a.bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
#else
typedef real act;
static inline real mtrt_act_float(act a) { return a; }
#endif

#endif
