/* dump.c — linked into both builds of a program (-Wl,--wrap=step_forward,--wrap=step_backward):
 * with $EMU_DUMP_DIR set, the arena, the activation arena (as real) and the state arena are written
 * after each of the first $EMU_DUMP_CALLS (default 1) forward and backward passes of every rank, as
 * DIR/rankR-fwdK.bin and -bwdK.bin (ARENA_ELEMS + ACT_ELEMS + STATE_ELEMS floats), so arena_diff can compare
 * the cpu and the cuda backend buffer by buffer (both run the same step.c, so the maps are the
 * same). With $EMU_POISON_ARENA=1 the HBM span but what lives across micro-batches (step.h's
 * STEP_LIVE_RANGES: the tokens, expert loads, shards, kept parameters) is set to NaN before each forward: an op that reads a buffer the step has not written in this micro-batch (an op
 * that adds where the other backend overwrites) turns the loss into NaN. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step.h"
#ifdef MTC_BACKEND_CUDA
#include <cuda_runtime_api.h>
#endif

real __real_step_forward(RtCtx *c);
#ifdef MTC_BACKEND_CUDA
void emu_arena_checks(int on);              /* fake_cuda.cpp */
void emu_counting(int on);                  /* EMU_COUNTS: off while the arena is poisoned or dumped */
void emu_counts_step(int rank, long step); /* EMU_COUNTS: the lines of the steps before */
#endif
void __real_step_backward(RtCtx *c);

/* Copies n values of `bytes` each at p (device memory on the cuda backend) to h. */
static void fetch(void *h, const void *p, size_t n, size_t bytes) {
#ifdef MTC_BACKEND_CUDA
  if (cudaMemcpy(h, p, n * bytes, cudaMemcpyDefault) != cudaSuccess) abort();
#else
  memcpy(h, p, n * bytes);
#endif
}

static void dump(RtCtx *c, const char *pass, int *calls) {
  const char *dir = getenv("EMU_DUMP_DIR");
  int max = getenv("EMU_DUMP_CALLS") ? atoi(getenv("EMU_DUMP_CALLS")) : 1;
  if (!dir || *calls >= max) return;
  size_t n = (size_t)ARENA_ELEMS, na = (size_t)ACT_ELEMS, ns = (size_t)STATE_ELEMS;
  real *h = malloc((n + na + ns) * sizeof(real));
  act *a = malloc(na * sizeof(act) + 1);
  if (!h || !a) abort();
  fetch(a, c->acts, na, sizeof(act)), fetch(h + n + na, c->state, ns, sizeof(real)); /* (ARENA_ELEMS n: 0) */
  for (size_t i = 0; i < na; i++) h[n + i] = (real)mtrt_act_float(a[i]); /* activations as real */
  free(a);
  n += na + ns;
  char path[1024];
  snprintf(path, sizeof path, "%s/rank%d-%s%d.bin", dir, c->comm.rank, pass, *calls);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(h, sizeof(real), n, f) != n || fclose(f) != 0) fprintf(stderr, "dump: cannot write %s\n", path);
  free(h);
  (*calls)++;
}

/* The HBM span but its ranges that live across micro-batches (step.h's STEP_LIVE_RANGES) holds
 * what each micro-batch writes before reading it: set to NaN (all bits set), gap by gap. */
static void poison(RtCtx *c) {
  if (!getenv("EMU_POISON_ARENA") || atoi(getenv("EMU_POISON_ARENA")) == 0) return;
  static const int64_t live[][2] = STEP_LIVE_RANGES;
  char *lo = (char *)(void *)c->acts, *end = lo + (size_t)ACT_ELEMS * sizeof(act);
  char *p = lo;
#ifdef MTC_BACKEND_CUDA
  emu_arena_checks(0); /* one memset over many buffers, on purpose */
#endif
  /* each gap between the live ranges (listed in any order), lowest first */
  for (;;) {
    char *next = end, *next_end = end;
    for (int i = 0; i < STEP_N_LIVE_RANGES; i++) {
      char *a = lo + live[i][0] * (int64_t)sizeof(act), *b = a + live[i][1] * (int64_t)sizeof(act);
      if (b > p && a < next) next = a < p ? p : a, next_end = b;
    }
    if (next > p) {
#ifdef MTC_BACKEND_CUDA
      if (cudaMemset(p, 0xff, (size_t)(next - p)) != cudaSuccess) abort();
#else
      memset(p, 0xff, (size_t)(next - p));
#endif
    }
    if (next >= end) break;
    p = next_end > p ? next_end : p;
  }
#ifdef MTC_BACKEND_CUDA
  emu_arena_checks(1);
#endif
}

/* EMU_COUNTS (cuda build): a training step starts at the first forward pass of its ACCUM
 * micro-batches; the counts of the step before (from its first forward pass to this one: its
 * micro-batches, gradient norm, optimizer step and metrics, and this step's gradient clear) are
 * written then, the last step's at exit (with what the program does after it). The checker's own
 * poison and dumps are not counted. */
#ifdef MTC_BACKEND_CUDA
static int counts_rank;
static long forwards; /* forward passes so far */
static void counts_at_exit(void) { emu_counts_step(counts_rank, (forwards + ACCUM - 1) / ACCUM); }
static void count_step(RtCtx *c) {
  if (forwards == 0) counts_rank = c->comm.rank, atexit(counts_at_exit);
  if (forwards % ACCUM == 0) emu_counts_step(c->comm.rank, forwards / ACCUM);
  forwards++;
}
#define COUNTING(on) emu_counting(on)
#else
#define count_step(c) (void)(c)
#define COUNTING(on) (void)0
#endif

real __wrap_step_forward(RtCtx *c) {
  static int calls;
  count_step(c);
  COUNTING(0), poison(c), COUNTING(1);
  real loss = __real_step_forward(c);
  COUNTING(0), dump(c, "fwd", &calls), COUNTING(1);
  return loss;
}

void __wrap_step_backward(RtCtx *c) {
  static int calls;
  __real_step_backward(c);
  COUNTING(0), dump(c, "bwd", &calls), COUNTING(1);
}
