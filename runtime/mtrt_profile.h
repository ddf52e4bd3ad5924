/*
 * mtrt_profile.h — `train --profile FILE`: the measured time of each op class and collective of a
 * run, with the FLOPs or bytes it did, as JSON that `mtc calibrate` fits a preset's factors to.
 *
 * The classes are the cost model's (compiler/cost_kernel.c): GEMMs and grouped (expert) GEMMs
 * by FLOPs; attention forward and backward by the model's FLOPs (causal: 2·B·T²·nh·hd forward,
 * 2.5× that backward); the memory-bound work (norms, RoPE, activations, the loss, the MoE
 * permute, residual adds and copies) by the bytes its arguments span, in this build's `act`
 * size; the optimizer step by the bytes the cost model counts for it (rt_opt_bytes, and whether
 * it ran on the host); collectives by the bytes each rank sends and the time
 * the rank is blocked in them. Seconds are exclusive: a GEMM inside another timed op (the LM
 * head's, the experts') counts as a GEMM only.
 *
 * The cpu backend times with the clock at a waist the ops do not see: the linker's --wrap
 * turns the program's calls of the wrapped entry points (runtime/cpu/profile_ops.c) and of
 * cblas_?gemm into calls of timed wrappers. The cuda backend feeds the same classes from
 * MTC_PROFILE's timings (runtime/cuda/profile.c: each kernel and GEMM between two device
 * synchronizations, the class from its name; FLOPs for the GEMMs only, no collectives).
 * rt_prof_fence is the backend's barrier before a clock read (cpu: none; cuda: a device
 * synchronization).
 */
#ifndef MTRT_PROFILE_H
#define MTRT_PROFILE_H

#include <stdbool.h>

/* ORDER prof_names (profile.c) */
typedef enum {
  RT_PROF_GEMM,
  RT_PROF_GROUPED_GEMM,
  RT_PROF_ATTENTION_FWD,
  RT_PROF_ATTENTION_BWD,
  RT_PROF_NORM,
  RT_PROF_ROPE,
  RT_PROF_ACTIVATION,
  RT_PROF_LOSS,
  RT_PROF_PERMUTE,
  RT_PROF_ELEMENTWISE,
  RT_PROF_OPTIMIZER,
  RT_PROF_ALL_GATHER,
  RT_PROF_REDUCE_SCATTER,
  RT_PROF_ALL_REDUCE,
  RT_PROF_ALL_TO_ALL,
  RT_PROF_CLASSES
} RtProfClass;

extern bool rt_prof_on; /* set by rt_prof_start; the wrappers time only while it is */

void rt_prof_start(void);
/* Forget what was measured so far (train: after the first step, which holds the warm-up, so
 * that the profile covers the steps of the throughput line). */
void rt_prof_reset(void);
/* Time an op: t0 = rt_prof_begin(); ...; rt_prof_end(class, t0, flops, bytes). Nested calls
 * (a GEMM inside an op) are taken out of the enclosing op's seconds. */
double rt_prof_begin(void);
void rt_prof_end(RtProfClass c, double t0, double flops, double bytes);
/* Adds one timed call measured by the backend itself (the cuda backend's CUDA_PROF_END). */
void rt_prof_add(RtProfClass c, double seconds, double flops, double bytes);
/* The backend's barrier before a clock read (weak no-op; the cuda backend synchronizes). */
void rt_prof_fence(void);

/* Writes FILE (rank 0; every rank's figures are averaged over the world first). steps: the
 * steps measured; step_seconds: their mean wall time; tokens: tokens per step per rank. The
 * file also holds the process's CPU seconds per step (getrusage since the reset): next to
 * step_seconds, how much of a core a rank had.
 * Returns 0, or -1 with err filled. Collective: every rank calls it. */
typedef struct {
  const char *spec, *model, *backend;
  const char *device; /* what ran it: the GPU's name (cudaGetDeviceProperties), or "cpu" */
  int world, fsdp, ep;
  long steps;
  double step_seconds, tokens_per_step, predicted_step_seconds;
  int optimizer_on_host; /* the step ran on the host CPU (the plan's optimizer_step: host) */
} RtProfRun;
int rt_prof_write(const char *path, const RtProfRun *run, char *err, int errlen);
/* Whether `train --profile path` can be written, checked at start-up rather than after the run:
 * the file is replaced atomically (mtrt_ckpt.h's rt_replace_begin: path.tmp, then a rename; a
 * directory, FIFO, device or link refused), path.tmp is created and removed here, and an existing
 * non-empty file that is not an mtc profile (no "mtc-profile-1" in its first 256 bytes: the
 * data, code) is refused, untouched. Returns 0, or -1 with err filled. Call on rank 0. */
int rt_prof_check(const char *path, char *err, int errlen);

#endif
