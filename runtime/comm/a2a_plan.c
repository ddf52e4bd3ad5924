/* a2a_plan.c — the MoE token exchange's counts, rounds, displacements and regroup blocks
 * (mtrt_a2a.h), shared by the cpu (moe_a2a.c, MPI) and cuda (comm_nccl.c, NCCL) backends.
 *
 * Receiver d's expert-major sequence is blocks (k, s) in the order k = 0..El-1, s = 0..ep-1,
 * block (k, s) holding cnt_all[s][d][k] rows. Round r is the window [r·cap, (r+1)·cap) of that
 * sequence; every quantity of a round is a block clipped to the window (clip below). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_a2a.h"

/* The arrays' sizes, one table for rt_a2a_init and rt_a2a_bytes: cnt_all (ep, ep, El) ints,
 * off (ep·El + 1) ints, sc/sd/rc/rd (4, ep) int64, blocks (El, ep), the MPI scratch (4, ep) ints. */
enum { Z_CNT, Z_OFF, Z_ROWS, Z_BLOCKS, Z_MPI, Z_N };
static void sizes(int ep, int El, size_t z[Z_N]) {
  size_t pe = (size_t)ep * (size_t)El;
  z[Z_CNT] = (size_t)ep * pe * sizeof(int);
  z[Z_OFF] = (pe + 1) * sizeof(int);
  z[Z_ROWS] = (size_t)ep * 4 * sizeof(int64_t);
  z[Z_BLOCKS] = pe * sizeof(RtA2ABlock);
  z[Z_MPI] = (size_t)ep * 4 * sizeof(int);
}

size_t rt_a2a_bytes(int ep, int El) {
  size_t z[Z_N], n = 0;
  sizes(ep, El, z);
  for (int i = 0; i < Z_N; i++) n += z[i];
  return n;
}

int rt_a2a_init(RtA2A *a, int ep, int El, int me, int64_t cap, int64_t mean) {
  memset(a, 0, sizeof *a);
  if (ep < 1 || El < 1 || me < 0 || me >= ep || cap < 1 || cap > INT_MAX) return -1;
  size_t z[Z_N];
  sizes(ep, El, z);
  a->ep = ep, a->El = El, a->me = me, a->cap = cap, a->mean = mean, a->rounds = 1;
  a->cnt_all = calloc(1, z[Z_CNT]);
  a->off = calloc(1, z[Z_OFF]);
  a->sc = calloc(1, z[Z_ROWS]);
  a->blocks = calloc(1, z[Z_BLOCKS]);
  a->mpi = calloc(1, z[Z_MPI]);
  if (!a->cnt_all || !a->off || !a->sc || !a->blocks || !a->mpi) {
    rt_a2a_free(a);
    return -1;
  }
  a->sd = a->sc + ep, a->rc = a->sc + 2 * ep, a->rd = a->sc + 3 * ep;
  return 0;
}

void rt_a2a_free(RtA2A *a) {
  free(a->cnt_all);
  free(a->off);
  free(a->sc);
  free(a->blocks);
  free(a->mpi);
  memset(a, 0, sizeof *a);
}

/* cnt_all[s][d][k] */
static int64_t cnt(const RtA2A *a, int s, int d, int k) {
  return a->cnt_all[((size_t)s * (size_t)a->ep + (size_t)d) * (size_t)a->El + (size_t)k];
}

/* x clipped to [lo, hi] */
static int64_t clip(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

void rt_a2a_plan_counts(RtA2A *a) {
  int pe = a->ep * a->El;
  int *mine = a->cnt_all + (size_t)a->me * (size_t)pe;
  for (int i = 0; i < pe; i++) mine[i] = a->off[i + 1] - a->off[i];
}

int rt_a2a_plan_rounds(RtA2A *a) {
  int64_t busiest = 0;
  for (int d = 0; d < a->ep; d++) {
    int64_t rows = 0;
    for (int s = 0; s < a->ep; s++)
      for (int k = 0; k < a->El; k++) rows += cnt(a, s, d, k);
    if (rows > busiest) busiest = rows;
  }
  a->busiest = busiest;
  a->rounds = busiest > a->cap ? (int)((busiest + a->cap - 1) / a->cap) : 1;
  return a->rounds;
}

void rt_a2a_plan_round(RtA2A *a, int r, int *eoff) {
  int ep = a->ep, El = a->El, me = a->me;
  int64_t lo = (int64_t)r * a->cap, hi = lo + a->cap;
  a->round = r;
  /* send: my blocks (k, me) in receiver d's sequence, clipped to the window; the rows before
   * the window are a prefix of my rows for d in xp, the rows inside it the run after them */
  for (int d = 0; d < ep; d++) {
    int64_t at = 0, before = 0, inside = 0; /* at: expert k's first row in d's sequence */
    for (int k = 0; k < El; k++) {
      int64_t p = at, n = cnt(a, me, d, k);
      for (int s = 0; s < me; s++) p += cnt(a, s, d, k);
      before += clip(lo, p, p + n) - p;
      inside += clip(p + n, lo, hi) - clip(p, lo, hi);
      for (int s = 0; s < ep; s++) at += cnt(a, s, d, k);
    }
    a->sd[d] = a->off[d * El] + before, a->sc[d] = inside;
  }
  /* receive, expert-major: block (k, s) of my sequence clipped to the window */
  int64_t at = 0;
  for (int k = 0; k < El; k++) {
    eoff[k] = (int)(clip(at, lo, hi) - lo);
    for (int s = 0; s < ep; s++) {
      RtA2ABlock *b = &a->blocks[k * ep + s];
      int64_t n = cnt(a, s, me, k);
      b->expert_row = clip(at, lo, hi) - lo;
      b->rows = clip(at + n, lo, hi) - clip(at, lo, hi);
      at += n;
    }
  }
  a->rows_recv = clip(at, lo, hi) - lo;
  eoff[El] = (int)a->rows_recv;
  /* receive, source-major: peer s's clipped blocks in turn, its experts in order */
  int64_t rows = 0;
  for (int s = 0; s < ep; s++) {
    a->rd[s] = rows;
    for (int k = 0; k < El; k++) {
      RtA2ABlock *b = &a->blocks[k * ep + s];
      b->source_row = rows;
      rows += b->rows;
    }
    a->rc[s] = rows - a->rd[s];
  }
}

void rt_a2a_regroup(const RtA2A *a, void *xe, void *buf, size_t row_bytes, int to_expert,
                    void (*copy)(void *dst, const void *src, size_t bytes)) {
  for (int i = 0; i < a->ep * a->El; i++) {
    const RtA2ABlock *b = &a->blocks[i];
    if (!b->rows) continue;
    char *e = (char *)xe + (size_t)b->expert_row * row_bytes, *m = (char *)buf + (size_t)b->source_row * row_bytes;
    size_t n = (size_t)b->rows * row_bytes;
    if (to_expert) copy(e, m, n);
    else copy(m, e, n);
  }
}
