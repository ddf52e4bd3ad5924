/* dump.c — linked into both builds of a program (-Wl,--wrap=step_forward,--wrap=step_backward):
 * with $EMU_DUMP_DIR set, the whole arena and then the state arena are written after each of the
 * first $EMU_DUMP_CALLS (default 1) forward and backward passes of every rank, as
 * DIR/rankR-fwdK.bin and -bwdK.bin (ARENA_ELEMS + STATE_ELEMS floats), so arena_diff can compare
 * the cpu and the cuda backend buffer by buffer (both run the same step.c, so the maps are the
 * same). With $EMU_POISON_ARENA=1 the arena from ARENA_SCRATCH on (past the tokens and what else
 * lives across micro-batches) is set to NaN before each forward: an op that reads a buffer the step has not written in this micro-batch (an op
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
void emu_arena_checks(int on); /* fake_cuda.cpp */
void __real_step_backward(RtCtx *c);

/* Copies n reals of the arena at p (device memory on the cuda backend) to h (n reals). */
static void fetch(real *h, const real *p, size_t n) {
#ifdef MTC_BACKEND_CUDA
  if (cudaMemcpy(h, p, n * sizeof(real), cudaMemcpyDefault) != cudaSuccess) abort();
#else
  memcpy(h, p, n * sizeof(real));
#endif
}

static void dump(RtCtx *c, const char *pass, int *calls) {
  const char *dir = getenv("EMU_DUMP_DIR");
  int max = getenv("EMU_DUMP_CALLS") ? atoi(getenv("EMU_DUMP_CALLS")) : 1;
  if (!dir || *calls >= max) return;
  size_t n = (size_t)ARENA_ELEMS, ns = (size_t)STATE_ELEMS;
  real *h = malloc((n + ns) * sizeof(real));
  if (!h) abort();
  fetch(h, c->arena, n), fetch(h + n, c->state, ns);
  char path[1024];
  snprintf(path, sizeof path, "%s/rank%d-%s%d.bin", dir, c->comm.rank, pass, *calls);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(h, sizeof(real), n + ns, f) != n + ns || fclose(f) != 0) fprintf(stderr, "dump: cannot write %s\n", path);
  free(h);
  (*calls)++;
}

/* Elements [ARENA_SCRATCH, ARENA_ELEMS) of the arena: what each micro-batch writes before reading. */
static void poison(RtCtx *c) {
  if (!getenv("EMU_POISON_ARENA") || atoi(getenv("EMU_POISON_ARENA")) == 0) return;
  size_t lo = (size_t)ARENA_SCRATCH, n = (size_t)ARENA_ELEMS - lo;
#ifdef MTC_BACKEND_CUDA
  emu_arena_checks(0); /* one memset over many buffers, on purpose */
  if (cudaMemset(c->arena + lo, 0xff, n * sizeof(real)) != cudaSuccess) abort();
  emu_arena_checks(1);
#else
  memset(c->arena + lo, 0xff, n * sizeof(real));
#endif
}

real __wrap_step_forward(RtCtx *c) {
  static int calls;
  poison(c);
  real loss = __real_step_forward(c);
  dump(c, "fwd", &calls);
  return loss;
}

void __wrap_step_backward(RtCtx *c) {
  static int calls;
  __real_step_backward(c);
  dump(c, "bwd", &calls);
}
