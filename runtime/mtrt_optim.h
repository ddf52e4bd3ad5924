/*
 * mtrt_optim.h — the optimizer step and its schedule: AdamW with decoupled weight decay
 * (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019), linear warmup then
 * cosine decay of the learning rate, and global-norm gradient clipping. Muon comes with its
 * own issue; it uses the same schedule and clipping.
 */
#ifndef MTRT_OPTIM_H
#define MTRT_OPTIM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "mtrt_real.h"

typedef struct {
  float lr;           /* this step's learning rate (from rt_lr_at) */
  float beta1, beta2; /* 0.9, 0.95 as in most LLM pretraining */
  float eps;          /* 1e-8 */
  float weight_decay; /* decoupled: param -= lr · wd · param; 0 for norms and biases */
  int64_t step;       /* 1-based, for bias correction (64-bit: training.steps allows 2^40) */
} RtAdamW;

/* One AdamW update of n parameters: m, v (n, fp32 moments) and param (n, real: fp32 master weights) updated in place
 * from grad (n) scaled by grad_scale (1 / accumulation, times the clipping factor). */
void rt_adamw_update(real *param, float *m, float *v, const real *grad, size_t n, float grad_scale,
                     const RtAdamW *h);

/* Muon's hyperparameters: the same learning rate and decoupled weight decay as AdamW (the
 * update is scaled to AdamW's RMS), Nesterov momentum 0.95. */
typedef struct {
  float lr, weight_decay, momentum;
} RtMuon;

/* Newton-Schulz quintic iteration: out (rows, cols) ≈ the orthogonal factor U Vᵀ of
 * g = U S Vᵀ. Five steps of X ← a X + (b A + c A²) X, A = X Xᵀ, (a, b, c) = (3.4445, −4.7750,
 * 2.0315), on g / ||g||_F, transposed when rows > cols (Jordan et al. 2024). Singular values
 * come out in about [0.7, 1.2], not exactly 1: the coefficients trade accuracy for speed.
 * work holds rt_newton_schulz_work(rows, cols) values. */
void rt_newton_schulz(real *out, const real *g, int rows, int cols, real *work);
size_t rt_newton_schulz_work(int rows, int cols);

/* Learning rate at step s (0-based) of `steps`: linear warmup from lr/warmup to lr over
 * `warmup` steps, then cosine decay to min_ratio × lr at the last step. Steps are 64-bit
 * (training.steps allows 2^40); the fractions are computed in double. */
float rt_lr_at(int64_t s, int64_t steps, int64_t warmup, float lr, float min_ratio);

/* Sum of squares of n gradient values (the caller sums over tensors and ranks, then takes the
 * square root: the global norm). */
double rt_sum_squares(const real *g, size_t n);
/* The factor that brings a global norm down to max_norm (1 if already below; max_norm <= 0
 * disables clipping). */
float rt_clip_scale(double norm, float max_norm);

#endif
