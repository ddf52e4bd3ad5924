/* dump.c — linked into both builds of a program (-Wl,--wrap=step_forward,--wrap=step_backward):
 * with $EMU_DUMP_DIR set, the whole arena is written after each of the first $EMU_DUMP_CALLS
 * (default 1) forward and backward passes of every rank, as DIR/rankR-fwdK.bin and -bwdK.bin
 * (ARENA_ELEMS floats), so arena_diff can compare the cpu and the cuda backend buffer by buffer
 * (both run the same step.c, so the arena map is the same). With $EMU_POISON_ARENA=1 everything
 * after the training state (tokens, master shards, gradients, moments) is set to NaN before
 * each forward: an op that reads a buffer the step has not written in this micro-batch (an op
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

static void dump(RtCtx *c, const char *pass, int *calls) {
  const char *dir = getenv("EMU_DUMP_DIR");
  int max = getenv("EMU_DUMP_CALLS") ? atoi(getenv("EMU_DUMP_CALLS")) : 1;
  if (!dir || *calls >= max) return;
  size_t n = (size_t)ARENA_ELEMS;
  real *h = c->arena;
#ifdef MTC_BACKEND_CUDA
  h = malloc(n * sizeof(real));
  if (!h || cudaMemcpy(h, c->arena, n * sizeof(real), cudaMemcpyDeviceToHost) != cudaSuccess) abort();
#endif
  char path[1024];
  snprintf(path, sizeof path, "%s/rank%d-%s%d.bin", dir, c->comm.rank, pass, *calls);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(h, sizeof(real), n, f) != n || fclose(f) != 0) fprintf(stderr, "dump: cannot write %s\n", path);
#ifdef MTC_BACKEND_CUDA
  free(h);
#endif
  (*calls)++;
}

/* Elements [0, state) of the arena live across micro-batches (train.c's state_elems). */
static int64_t state_elems(void) {
  int64_t top = TARGETS + TOKENS;
  for (int g = 0; g < N_GROUPS; g++) {
    const RtGroup *G = &step_groups[g];
    int64_t a = G->master > G->grad ? G->master : G->grad, b = G->adam_m > G->adam_v ? G->adam_m : G->adam_v;
    a = (a > b ? a : b) + G->shard;
    if (a > top) top = a;
  }
  return top;
}

static void poison(RtCtx *c) {
  if (!getenv("EMU_POISON_ARENA") || atoi(getenv("EMU_POISON_ARENA")) == 0) return;
  size_t lo = (size_t)state_elems(), n = (size_t)ARENA_ELEMS - lo;
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
