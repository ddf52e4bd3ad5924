/* train.c — the training program mtc writes next to its step code; do not edit here: regenerate with `mtc compile`.
 * (mtc's templates/train/NN-*.c in name order, each part after the first opening with a ==== line;
 * output.c knows a program file of mtc's by the "regenerate with" phrase above, on one line.)
 *
 *   train --data PATH [--steps N] [--metrics PATH] [--seed S]     (N: stop after step N; the
 *         learning-rate schedule always spans the spec's training.steps)
 *         [--checkpoint-dir DIR [--checkpoint-every K] [--keep-checkpoints N]] [--max-skips K]
 *         [--progress-every N] [--profile FILE]
 *         [--inject-nan FIRST:COUNT] [--inject-kill-at-save STEP]       (fault injection, for tests)
 *   train --data PATH --grad-check          (one rank, built with -DMTC_REAL=double)
 *   train --check-kernels [--arch sm_90a]   (cuda build: compile kernels.cu with NVRTC, exit)
 *   train --memory                          (bytes this build allocates per GPU at start-up, JSON)
 * The cuda build runs the same step.c with its arena on the GPU (one cudaMalloc at start-up) and
 * its state arena (master shards, gradients, moments) where the plan keeps the optimizer state:
 * in pinned host memory that the GPU reads and writes over C2C (the host reads it directly for
 * initialization and checkpoints), or on the GPU with a host mirror for those. The optimizer
 * step runs where the plan says (Muon too: its Newton-Schulz on the GPU, cuBLAS batched GEMMs).
 * With --checkpoint-dir, a run resumes from the newest complete checkpoint there and saves
 * every K steps and at the end; --steps counts from the start of training. A step whose loss
 * or gradient norm is not finite is skipped (no update); K consecutive skips (default 5) save
 * the last good state and stop. SIGUSR1 (what launch.sbatch has Slurm send before the job's
 * time limit), SIGTERM or SIGINT (Ctrl-C) stops the run at the end of the step, with a checkpoint saved;
 * one before the first step stops it there, the checkpoint directory as it was. At start-up the
 * program checks that the plan.json of its directory (DIR of DIR/build/train) is the plan it was
 * compiled from (step.h's PLAN_HASH).
 *
 * It runs the plan in step.h: two arenas allocated at start-up, parameters initialized shard by
 * shard, then per optimizer step ACCUM micro-batches of forward and backward (step.c), the
 * gradients' global norm and clipping, AdamW on this rank's shards, and one line of metrics
 * (rank 0 prints it with the step's time and MFU, and appends it to the metrics file as JSON with
 * the time, step seconds, tokens per second and run id, written whole at once; a write error stops
 * the run with exit 1, and a resumed run first drops the lines past its checkpoint). Every
 * --progress-every steps and at the end, rank 0 prints the elapsed time and the ETA. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mtrt_ckpt.h"
#include "mtrt_data.h"
#include "mtrt_ops.h"
#include "mtrt_profile.h"
#include "step.h"

#ifndef MOE_HIER_G /* step.h defines them with the hierarchical all-to-all: EP ranks per node, staging rows */
#define MOE_HIER_G 0
#define MOE_HIER_ST 1
#endif

/* Where the host reads and writes the training state (HOST): the state arena itself when the
 * host can read it (the cpu backend; the cuda backend when the plan keeps the state in host
 * memory), else a host mirror of it, copied to (to_device) and from (to_host) the GPU. to_host
 * also waits for the GPU's writes to a state arena in host memory. The optimizer and the gradient
 * norm run where the state is, unless OPT_ON_HOST. */
#ifdef MTC_BACKEND_CUDA
#include "mtrt_cuda.h"
static real *state_mirror;   /* STATE_ELEMS, when the state arena is on the GPU */
static int32_t *host_tokens; /* a micro-batch's inputs and targets (2 x TOKENS), uploaded */
#define HOST(c) (STATE_ON_HOST ? (c)->state : state_mirror)
static void to_device(RtCtx *c, int64_t off, int64_t n) {
  if (!STATE_ON_HOST) rt_cuda_upload(c->state + off, state_mirror + off, (size_t)n * sizeof(real));
}
static void to_host(RtCtx *c, int64_t off, int64_t n) {
  if (STATE_ON_HOST) rt_cuda_sync("reading the state arena on the host");
  else rt_cuda_download(state_mirror + off, c->state + off, (size_t)n * sizeof(real));
}
#define TOKENS_HOST(c) host_tokens
static void tokens_to_device(RtCtx *c) {
  rt_cuda_upload(c->acts + INPUTS, host_tokens, TOKENS * sizeof(int32_t));
  rt_cuda_upload(c->acts + TARGETS, host_tokens + TOKENS, TOKENS * sizeof(int32_t));
}
#define ADAMW_SHARD rt_cu_adamw_shard
#define GRAD_ALL_REDUCE rt_cu_all_reduce
/* The optimizer step on the host (Grace, on GH200) only where the plan puts it there: with the
 * state on the GPU, gradients come down and master weights go up. Muon's Newton-Schulz runs
 * where the step runs (rt_cu_muon_groups on the GPU). */
#define OPT_ON_HOST OPT_STEP_ON_HOST
#else
#define OPT_ON_HOST 0
#define HOST(c) ((c)->state)
static void to_device(RtCtx *c, int64_t off, int64_t n) { (void)c, (void)off, (void)n; }
static void to_host(RtCtx *c, int64_t off, int64_t n) { (void)c, (void)off, (void)n; }
#define TOKENS_HOST(c) host_tokens
static int32_t host_tokens[2 * TOKENS]; /* the loader's batch, copied into INPUTS and TARGETS */
static void tokens_to_device(RtCtx *c) {
  memcpy(c->acts + INPUTS, host_tokens, TOKENS * sizeof(int32_t));
  memcpy(c->acts + TARGETS, host_tokens + TOKENS, TOKENS * sizeof(int32_t));
}
#define ADAMW_SHARD rt_adamw_shard
#define SUM_SQUARES rt_sum_squares
#define GRAD_ALL_REDUCE rt_comm_all_reduce
#endif

/* The groups from g on whose gradient shards lie one after another in the state arena (the
 * layout places them so): their count, and their values in *len. One launch or call covers them. */
static int grad_run(int g, size_t *len) {
  int n = 1;
  *len = (size_t)step_groups[g].shard;
  while (g + n < N_GROUPS && step_groups[g + n].grad == step_groups[g].grad + (int64_t)*len)
    *len += (size_t)step_groups[g + n++].shard;
  return n;
}

/* Zeroes every group's gradient shard (a new step), a run of adjacent shards at a time. On the
 * cuda backend a kernel on the stream (the state arena on the GPU, or in pinned host memory
 * written over C2C): the host does not wait. */
static void zero_grads(RtCtx *c) {
  for (int g = 0, n; g < N_GROUPS; g += n) {
    size_t len;
    n = grad_run(g, &len);
#ifdef MTC_BACKEND_CUDA
    rt_cu_zero_state(c->state + step_groups[g].grad, len);
#else
    rt_zero_real(c->state + step_groups[g].grad, len);
#endif
  }
}

/* The all-gathers read each group's master shard cast to the activation type (RtGroup.param):
 * refreshed after every change of the master (initialization, resume, optimizer step), one cast
 * per run of groups whose masters and casts both lie one after another. A group with param -1
 * (the master in HBM) is cast by step.c before each of its gathers. */
static void refresh_params(RtCtx *c) {
  for (int g = 0, n; g < N_GROUPS; g += n) {
    size_t len = (size_t)step_groups[g].shard;
    for (n = 1; step_groups[g].param >= 0 && g + n < N_GROUPS &&
                step_groups[g + n].param == step_groups[g].param + (int64_t)len &&
                step_groups[g + n].master == step_groups[g].master + (int64_t)len;
         n++)
      len += (size_t)step_groups[g + n].shard;
    if (step_groups[g].param >= 0) rt_cast_to_act(c->acts + step_groups[g].param, c->state + step_groups[g].master, len);
  }
}

/* The gradient shards summed over the data-parallel replicas. NCCL reads device memory: a state
 * arena in host memory goes through STATE_STAGING (GRAD0, free between steps), in pieces of as
 * many real values as its bytes hold. */
static void grads_all_reduce(RtCtx *c) {
  for (int g = 0; g < N_GROUPS; g++) {
    real *grad = c->state + step_groups[g].grad;
    size_t n = (size_t)step_groups[g].shard;
#ifdef MTC_BACKEND_CUDA
    if (STATE_ON_HOST) {
      real *st = (real *)(void *)(c->acts + STATE_STAGING);
      size_t cap = (size_t)STATE_STAGING_ELEMS * sizeof(act) / sizeof(real);
      for (size_t o = 0; o < n; o += cap) {
        size_t k = n - o < cap ? n - o : cap;
        rt_copy_real(st, grad + o, k), GRAD_ALL_REDUCE(c->comm.replicate_comm, st, k), rt_copy_real(grad + o, st, k);
      }
      continue;
    }
#endif
    GRAD_ALL_REDUCE(c->comm.replicate_comm, grad, n);
  }
}

