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
 * real (fp32); the cuda backend is to store act in bf16, as the plan's items count it (issue
 * 12); today it is real on both backends. */
typedef real act;

#endif
