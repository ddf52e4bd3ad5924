/* test_a2a.c — the MoE all-to-all's arithmetic (mtrt_a2a.h) at europa-1t's shapes, without the
 * data: ep 4, El 96 (E 384), N 65536, K 8, C 6144, every EP rank simulated in one process (its own
 * RtA2A and me; the counts' all-gather is a copy). With cap = 1.25 × N × K rows: balanced routing
 * takes 1 round, identical to the single exchange (displacements whose element offsets pass 2^31);
 * a 2.3× skew takes ceil(busiest / cap); everything to one rank ceil(ep·N·K / cap). For every round:
 * rows <= cap, the pieces tile each receiver's expert-major sequence once across rounds, each
 * sender's piece per (round, receiver) is one run of its xp and all of them tile its xp once, eoff
 * agrees with the blocks. Then the same at small shapes for many caps, a round trip with data
 * (dispatch, regroup, +1, undispatch as copies between the simulated ranks) in 3+ rounds, and the
 * 64-bit element counts of the elementwise ops. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "mtrt_a2a.h"
#include "mtrt_comm.h"
#include "mtrt_ops.h"

enum { EP = 4, EL = 96, E = EP * EL, N = 65536, K = 8, C = 6144, F = 1792 };
static const int64_t CAP = (int64_t)N * K * 5 / 4; /* 655,360 rows: moe_imbalance 1.25 */

/* cnt[s][d·El + k]: rows rank s sends to rank d's local expert k (ep × ep·El) */
static int64_t **counts(int ep, int E_) {
  int64_t **c = malloc(sizeof *c * (size_t)ep);
  for (int r = 0; r < ep; r++) c[r] = calloc((size_t)E_, sizeof **c);
  return c;
}

static void free_counts(int64_t **c, int ep) {
  for (int r = 0; r < ep; r++) free(c[r]);
  free(c);
}

static void free_all(RtA2A *a, int ep) {
  for (int r = 0; r < ep; r++) rt_a2a_free(&a[r]);
}

static int64_t clip(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* A route of ep simulated ranks (what rt_moe_route does, the all-gather a copy): a[s] gets cap,
 * its offsets from cnt[s] and everyone's counts; all must agree on rounds and busiest, which must
 * be the most rows any rank receives over cap, rounded up. Returns rounds. */
static int route(RtA2A *a, int ep, int El, int64_t cap, int64_t **cnt) {
  int pe = ep * El;
  for (int s = 0; s < ep; s++) {
    int64_t sent = 0;
    for (int e = 0; e < pe; e++) sent += cnt[s][e];
    CHECK_EQ(rt_a2a_init(&a[s], ep, El, s, cap, sent), 0);
    a[s].off[0] = 0;
    for (int e = 0; e < pe; e++) a[s].off[e + 1] = a[s].off[e] + (int)cnt[s][e];
    rt_a2a_plan_counts(&a[s]);
  }
  for (int s = 0; s < ep; s++) /* the all-gather: rank s's part to every rank */
    for (int x = 0; x < ep; x++)
      memcpy(a[x].cnt_all + (size_t)s * pe, a[s].cnt_all + (size_t)s * pe, sizeof(int) * (size_t)pe);
  int64_t busiest = 0;
  for (int d = 0; d < ep; d++) {
    int64_t rows = 0;
    for (int s = 0; s < ep; s++)
      for (int k = 0; k < El; k++) rows += cnt[s][d * El + k];
    busiest = rows > busiest ? rows : busiest;
  }
  int rounds = busiest > 0 ? (int)((busiest + cap - 1) / cap) : 1;
  for (int x = 0; x < ep; x++) {
    CHECK_EQ(rt_a2a_plan_rounds(&a[x]), rounds);
    CHECK_EQ(a[x].busiest, busiest);
  }
  return rounds;
}

/* Plans every round on every rank (eoff: ep × (El + 1)) and checks what holds for any counts;
 * a[] is left planned for the last round. */
static void check_rounds(RtA2A *a, int *eoff, int ep, int El, int64_t **cnt) {
  int pe = ep * El, bad = 0;
  int64_t cap = a[0].cap, *first = malloc(sizeof(int64_t) * (size_t)(ep * pe)), *total = calloc((size_t)ep, sizeof(int64_t));
  int64_t *next = malloc(sizeof(int64_t) * (size_t)(ep * pe));
  unsigned char **cover = malloc(sizeof *cover * (size_t)ep); /* per sender: times each xp row is sent */
  for (int d = 0; d < ep; d++) /* first[(d·El + k)·ep + s]: block (k, s)'s first row in d's sequence */
    for (int k = 0; k < El; k++)
      for (int s = 0; s < ep; s++) {
        first[(d * El + k) * ep + s] = next[(d * El + k) * ep + s] = total[d];
        total[d] += cnt[s][d * El + k];
      }
  for (int s = 0; s < ep; s++) cover[s] = calloc((size_t)a[s].off[pe] + 1, 1);
  for (int r = 0; r < a[0].rounds; r++) {
    for (int x = 0; x < ep; x++) {
      rt_a2a_plan_round(&a[x], r, eoff + x * (El + 1));
      CHECK_EQ(a[x].round, r);
    }
    for (int d = 0; d < ep; d++) {
      const RtA2A *x = &a[d];
      const int *eo = eoff + d * (El + 1);
      CHECK(x->rows_recv <= cap);
      CHECK_EQ(x->rows_recv, clip(total[d] - r * cap, 0, cap)); /* every round full but the last */
      int64_t rows = 0;
      for (int s = 0; s < ep; s++) { /* source-major: s's piece, its experts in turn */
        const RtA2A *y = &a[s];
        bad += x->rd[s] != rows || x->rc[s] != y->sc[d];
        bad += y->sd[d] < y->off[d * El] || y->sd[d] + y->sc[d] > y->off[(d + 1) * El];
        for (int k = 0; k < El; k++) {
          const RtA2ABlock *b = &x->blocks[k * ep + s];
          bad += b->source_row != rows;
          rows += b->rows;
          if (!b->rows) continue;
          int64_t g = r * cap + b->expert_row, *nx = &next[(d * El + k) * ep + s];
          int64_t xrow = y->sd[d] + b->source_row - x->rd[s]; /* the row of s's xp it carries */
          bad += g != *nx || xrow != y->off[d * El + k] + (g - first[(d * El + k) * ep + s]);
          *nx += b->rows;
          for (int64_t i = 0; i < b->rows && xrow + i < y->off[pe] && xrow >= 0; i++) cover[s][xrow + i]++;
        }
        bad += rows - x->rd[s] != x->rc[s];
      }
      CHECK_EQ(rows, x->rows_recv);
      rows = 0;
      for (int k = 0; k < El; k++) { /* expert-major: expert k's rows, the sources in turn */
        bad += eo[k] != rows;
        for (int s = 0; s < ep; s++) {
          bad += x->blocks[k * ep + s].expert_row != rows;
          rows += x->blocks[k * ep + s].rows;
        }
      }
      CHECK_EQ(eo[El], rows);
      CHECK_EQ(rows, x->rows_recv);
    }
  }
  CHECK_EQ(bad, 0);
  for (int d = 0; d < ep; d++) /* every block delivered whole, once, in order */
    for (int k = 0; k < El; k++)
      for (int s = 0; s < ep; s++)
        bad += next[(d * El + k) * ep + s] != first[(d * El + k) * ep + s] + cnt[s][d * El + k];
  CHECK_EQ(bad, 0);
  for (int s = 0; s < ep; s++) { /* every xp row sent exactly once */
    for (int i = 0; i < a[s].off[pe]; i++) bad += cover[s][i] != 1;
    free(cover[s]);
  }
  CHECK_EQ(bad, 0);
  free(first), free(next), free(total), free(cover);
}

/* With one round: the single exchange as it was before rounds (every block, empty ones too). */
static void check_single(const RtA2A *a, const int *eoff, int ep, int El, int64_t **cnt) {
  for (int r = 0; r < ep; r++) {
    const RtA2A *x = &a[r];
    const int *eo = eoff + r * (El + 1);
    CHECK_EQ(x->rounds, 1);
    for (int j = 0; j < ep; j++) {
      CHECK_EQ(x->sd[j], x->off[j * El]);
      CHECK_EQ(x->sc[j], x->off[(j + 1) * El] - x->off[j * El]);
    }
    int64_t rows = 0;
    for (int s = 0; s < ep; s++) { /* source-major: peer s's part is what s sent r, in order */
      CHECK_EQ(x->rd[s], rows);
      CHECK_EQ(x->rc[s], a[s].sc[r]);
      for (int k = 0; k < El; k++) {
        const RtA2ABlock *b = &x->blocks[k * ep + s];
        CHECK_EQ(b->source_row, rows);
        CHECK_EQ(b->rows, cnt[s][r * El + k]);
        rows += b->rows;
      }
    }
    CHECK_EQ(x->rows_recv, rows);
    rows = 0;
    CHECK_EQ(eo[0], 0);
    for (int k = 0; k < El; k++) /* expert-major: expert k's rows from peers 0..ep-1 in turn */
      for (int s = 0; s < ep; s++) {
        const RtA2ABlock *b = &x->blocks[k * ep + s];
        CHECK_EQ(b->expert_row, rows);
        rows += b->rows;
        if (s == ep - 1) CHECK_EQ(eo[k + 1], rows);
      }
    CHECK_EQ(rows, x->rows_recv);
  }
}

/* Balanced: each rank sends N·K / ep = 131072 rows to each peer, 1365 or 1366 per expert. */
static void balanced(void) {
  static RtA2A a[EP];
  static int eoff[EP * (EL + 1)];
  int64_t **cnt = counts(EP, E);
  for (int r = 0; r < EP; r++)
    for (int e = 0; e < E; e++) cnt[r][e] = N * K / E + (e % EL < N * K / EP % EL);
  CHECK_EQ(CAP, 655360);
  CHECK_EQ(route(a, EP, EL, CAP, cnt), 1);
  CHECK_EQ(a[0].busiest, 524288);
  check_rounds(a, eoff, EP, EL, cnt);
  check_single(a, eoff, EP, EL, cnt);
  for (int r = 0; r < EP; r++) {
    CHECK_EQ(a[r].sc[3], 131072);
    CHECK_EQ(a[r].sd[3] * C, 2415919104LL); /* 393,216 rows × 6144: past 2^31 */
    CHECK_EQ(a[r].rc[3], 131072);
    CHECK_EQ(a[r].rd[3], 393216);
    CHECK_EQ(a[r].rd[3] * C, 2415919104LL);
    CHECK_EQ(a[r].rows_recv, 524288);
    CHECK_EQ(a[r].rows_recv * C, 3221225472LL);
    CHECK_EQ(eoff[r * (EL + 1) + 1], 4 * 1366);
    CHECK_EQ(eoff[r * (EL + 1) + EL], 524288);
    CHECK_EQ(a[r].blocks[(EL - 1) * EP + 3].source_row * C, (393216LL + 131072 - 1365) * 6144);
  }
  free_all(a, EP);
  free_counts(cnt, EP);
  /* cnt_all, off, sc/sd/rc/rd, blocks, the MPI scratch */
  CHECK_EQ(rt_a2a_bytes(EP, EL), 4 * 384 * 4 + 385 * 4 + 16 * 8 + 384 * 24 + 16 * 4);
  RtA2A x;
  CHECK_EQ(rt_a2a_init(&x, EP, EL, 0, 0, 1), -1);
  CHECK_EQ(rt_a2a_init(&x, EP, EL, 0, (int64_t)INT32_MAX + 1, 1), -1);
  CHECK_EQ(rt_a2a_init(&x, EP, EL, EP, CAP, 1), -1);
  rt_a2a_free(&x); /* zeroed by the failed init: freeing again is harmless */
}

/* Skewed: every source sends expert 0 2.3× its balanced share of a peer (301466 of 131072 rows),
 * the rest spread evenly; then the worst case, every source's N·K rows to expert 0. Each with
 * cap (rounds) and with the dropless cap ep·N·K (one round: the single exchange). */
static void skewed(void) {
  static RtA2A a[EP];
  static int eoff[EP * (EL + 1)];
  int64_t **cnt = counts(EP, E);
  const int64_t hot = 301466, rest = (int64_t)N * K - hot, dropless = (int64_t)EP * N * K; /* 2.3 × 131072 rounded up */
  for (int r = 0; r < EP; r++) {
    cnt[r][0] = hot;
    for (int e = 1; e < E; e++) cnt[r][e] = rest / (E - 1) + (e - 1 < rest % (E - 1));
  }
  int64_t r0 = 4 * hot + 4 * (95 * (rest / (E - 1)) + 95); /* rest % 383 = 299 > 95: all +1 */
  CHECK_EQ(r0, 1427024);
  CHECK_EQ(route(a, EP, EL, CAP, cnt), 3); /* ceil(1427024 / 655360) */
  CHECK_EQ(a[0].busiest, r0);
  check_rounds(a, eoff, EP, EL, cnt);
  CHECK_EQ(a[0].rows_recv, r0 - 2 * CAP); /* the last round: 116,304 rows */
  CHECK(CAP * C > INT32_MAX);               /* a full round's elements on one rank */
  free_all(a, EP);
  CHECK_EQ(route(a, EP, EL, dropless, cnt), 1);
  check_rounds(a, eoff, EP, EL, cnt);
  check_single(a, eoff, EP, EL, cnt);
  CHECK_EQ(a[0].rows_recv, r0);
  CHECK_EQ(eoff[1], 4 * hot);
  CHECK_EQ(a[0].rows_recv * C, 8767635456LL);
  CHECK_EQ(a[0].rd[3] * C, 3 * (r0 / 4) * 6144);
  free_all(a, EP);

  for (int r = 0; r < EP; r++)
    for (int e = 0; e < E; e++) cnt[r][e] = e == 0 ? (int64_t)N * K : 0;
  CHECK_EQ(route(a, EP, EL, CAP, cnt), 4); /* ceil(ep·N·K / cap) = ceil(3.2) */
  CHECK_EQ(a[0].busiest, dropless);
  check_rounds(a, eoff, EP, EL, cnt);
  CHECK_EQ(a[0].rows_recv, dropless - 3 * CAP); /* the last round: source 3's last 131,072 rows */
  CHECK_EQ(a[0].rc[3], 131072);
  CHECK_EQ(a[3].sd[0], N * K - 131072);
  rt_a2a_plan_round(&a[0], 1, eoff); /* round 1: source 1's tail, source 2's head */
  rt_a2a_plan_round(&a[1], 1, eoff + EL + 1);
  CHECK_EQ(a[0].rc[0], 0);
  CHECK_EQ(a[0].rc[1], 393216);
  CHECK_EQ(a[0].rd[2], 393216);
  CHECK_EQ(a[0].rc[2], 262144);
  CHECK_EQ(a[1].sd[0], 131072);
  CHECK_EQ(a[1].sc[0], 393216);
  for (int r = 1; r < EP; r++) CHECK_EQ(a[r].rows_recv, 0);
  free_all(a, EP);
  CHECK_EQ(route(a, EP, EL, dropless, cnt), 1);
  check_rounds(a, eoff, EP, EL, cnt);
  check_single(a, eoff, EP, EL, cnt);
  CHECK_EQ(a[0].rows_recv, 2097152); /* ep · N · K */
  CHECK_EQ(a[0].rd[3] * C, 9663676416LL);
  CHECK_EQ(a[0].rows_recv * C, 12884901888LL);
  CHECK_EQ(eoff[1], 2097152);
  CHECK_EQ(eoff[EL], 2097152);
  for (int r = 0; r < EP; r++) {
    CHECK_EQ(a[r].sc[0], 524288);
    CHECK_EQ(a[r].sd[3], 524288); /* nothing for peers 1..3: their parts start at the end */
    CHECK_EQ(a[r].sc[3], 0);
  }
  for (int r = 1; r < EP; r++) {
    CHECK_EQ(a[r].rows_recv, 0);
    CHECK_EQ(eoff[r * (EL + 1) + EL], 0);
  }
  free_all(a, EP);
  free_counts(cnt, EP);
}

static uint32_t lcg(uint32_t *x) { return *x = *x * 1664525u + 1013904223u, *x >> 16; }

/* Small shapes, many caps: ep 3, El 2, pseudo-random counts 0..4 (rank 2 sends nothing in the
 * second draw), every cap from 1 to past the busiest rank. */
static void small_caps(void) {
  enum { P = 3, L = 2 };
  RtA2A a[P];
  int eoff[P * (L + 1)];
  int64_t **cnt = counts(P, P * L);
  uint32_t seed = 7;
  for (int draw = 0; draw < 2; draw++) {
    for (int s = 0; s < P; s++)
      for (int e = 0; e < P * L; e++) cnt[s][e] = draw && s == 2 ? 0 : lcg(&seed) % 5;
    for (int64_t cap = 1; cap <= 30; cap++) {
      route(a, P, L, cap, cnt);
      check_rounds(a, eoff, P, L, cnt);
      free_all(a, P);
    }
  }
  free_counts(cnt, P);
}

static void copy_host(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

/* A round trip with data at ep 3, El 2, rows of 2 floats, pseudo-random counts 0..5: value
 * (s, i, c) = 1000 s + 10 i + c for row i of rank s's xp. Per round, dispatch (s's piece for d
 * copied into d's round buffer, regrouped into xe, cap rows exactly) must deliver d's sequence's
 * rows of the round; the experts add 1; undispatch (regroup back, copy home) writes each yp row
 * once; at the end yp = xp + 1. */
static void round_trip(int64_t cap, int min_rounds) {
  enum { P = 3, L = 2, W = 2, MAXR = 64 };
  RtA2A a[P];
  int eoff[P * (L + 1)];
  int64_t **cnt = counts(P, P * L);
  uint32_t seed = 11;
  for (int s = 0; s < P; s++)
    for (int e = 0; e < P * L; e++) cnt[s][e] = lcg(&seed) % 6;
  int rounds = route(a, P, L, cap, cnt);
  CHECK(rounds >= min_rounds);
  float xp[P][MAXR * W], yp[P][MAXR * W];
  int seq[P][P * MAXR][2]; /* seq[d][g] = (s, xp row) of row g of d's expert-major sequence */
  for (int s = 0; s < P; s++) {
    CHECK(a[s].off[P * L] <= MAXR);
    for (int i = 0; i < MAXR * W; i++) xp[s][i] = (float)(1000 * s + 10 * (i / W) + i % W), yp[s][i] = -1;
  }
  for (int d = 0; d < P; d++) {
    int g = 0;
    for (int k = 0; k < L; k++)
      for (int s = 0; s < P; s++)
        for (int i = 0; i < cnt[s][d * L + k]; i++, g++) seq[d][g][0] = s, seq[d][g][1] = a[s].off[d * L + k] + i;
  }
  float *buf[P], *xe[P];
  for (int d = 0; d < P; d++) buf[d] = malloc(sizeof(float) * W * (size_t)cap), xe[d] = malloc(sizeof(float) * W * (size_t)cap);
  int bad = 0, twice = 0;
  for (int r = 0; r < rounds; r++) {
    for (int x = 0; x < P; x++) rt_a2a_plan_round(&a[x], r, eoff + x * (L + 1));
    for (int d = 0; d < P; d++) { /* dispatch to d */
      for (int s = 0; s < P; s++) {
        CHECK_EQ(a[d].rc[s], a[s].sc[d]);
        memcpy(buf[d] + a[d].rd[s] * W, xp[s] + a[s].sd[d] * W, sizeof(float) * W * (size_t)a[s].sc[d]);
      }
      rt_a2a_regroup(&a[d], xe[d], buf[d], sizeof(float) * W, 1, copy_host);
      for (int k = 0; k < L; k++)
        for (int row = eoff[d * (L + 1) + k]; row < eoff[d * (L + 1) + k + 1]; row++) {
          const int *q = seq[d][r * cap + row];
          for (int c = 0; c < W; c++) bad += xe[d][row * W + c] != xp[q[0]][q[1] * W + c];
        }
      for (int i = 0; i < a[d].rows_recv * W; i++) xe[d][i] += 1;
      memset(buf[d], 0, sizeof(float) * W * (size_t)cap);
      rt_a2a_regroup(&a[d], xe[d], buf[d], sizeof(float) * W, 0, copy_host);
    }
    for (int d = 0; d < P; d++) /* undispatch from d */
      for (int s = 0; s < P; s++)
        for (int i = 0; i < a[s].sc[d] * W; i++) {
          twice += yp[s][a[s].sd[d] * W + i] != -1;
          yp[s][a[s].sd[d] * W + i] = buf[d][a[d].rd[s] * W + i];
        }
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(twice, 0);
  for (int s = 0; s < P; s++)
    for (int i = 0; i < a[s].off[P * L] * W; i++) bad += yp[s][i] != xp[s][i] + 1;
  CHECK_EQ(bad, 0);
  for (int d = 0; d < P; d++) free(buf[d]), free(xe[d]);
  free_all(a, P);
  free_counts(cnt, P);
}

/* The elementwise ops take 64-bit element counts (an int prototype fails to compile here). */
#define WIDE(f, type) _Static_assert(_Generic(&f, type: 1, default: 0), #f " takes an int64_t n")
WIDE(rt_swiglu_forward, void (*)(real *, const real *, const real *, int64_t));
WIDE(rt_swiglu_backward, void (*)(real *, real *, const real *, const real *, const real *, int64_t));
WIDE(rt_gelu_forward, void (*)(real *, const real *, int64_t));
WIDE(rt_gelu_backward, void (*)(real *, const real *, const real *, int64_t));
WIDE(rt_moe_count, void (*)(real *, const int32_t *, int64_t));

static void wide_ops(void) {
  int64_t n = (int64_t)N * K * F * 23 / 10; /* a rank with 2.3× the balanced rows: the experts' n */
  CHECK_EQ(n, 2160905420LL);
  CHECK(n > INT32_MAX);
  real g[3] = {0, 1, -2}, u[3] = {1, 2, 3}, h[3];
  rt_swiglu_forward(h, g, u, (int64_t)3);
  CHECK_NEAR(h[1], 2.0 / (1.0 + exp(-1.0)), 1e-6);
  real load[2] = {0, 0};
  int32_t idx[3] = {1, 0, 1};
  rt_moe_count(load, idx, (int64_t)3);
  CHECK_EQ(load[1], 2);
}

/* The cpu backend's large-count pieces (mtrt_comm.h) for counts past 2^31, without allocating:
 * every piece fits MPI's int count, the pieces cover [0, count) exactly, the last is the rest,
 * and a strided piece's extent and offsets in bytes (count values of 2 or 4 bytes, rank r's block
 * at r count) stay exact in 64 bits. */
static void mpi_pieces(void) {
  const size_t piece = (size_t)1 << 30, counts[] = {3 * ((size_t)1 << 31) + 5, (size_t)1 << 32, piece, piece + 1};
  const size_t want[] = {7, 4, 1, 2};
  for (int i = 0; i < 4; i++) {
    size_t count = counts[i], covered = 0, n = 0, last = 0;
    int over = 0;
    CHECK_EQ(rt_mpi_pieces(count, piece), want[i]);
    for (size_t at = 0; at < count; at += piece, n++) {
      last = rt_mpi_piece_len(count, at, piece);
      over += last > (size_t)INT_MAX || last == 0;
      covered += last;
    }
    CHECK_EQ(over, 0);
    CHECK_EQ(n, want[i]);
    CHECK_EQ(covered, count);
    CHECK_EQ(last, count - (want[i] - 1) * piece);
  }
  CHECK_EQ(rt_mpi_piece_len(3 * ((size_t)1 << 31) + 5, 6 * piece, piece), 5);
  /* a world of 8, bf16 and fp32 blocks of 3·2^31 + 5 values: rank 7's last piece in bytes */
  size_t count = 3 * ((size_t)1 << 31) + 5;
  int64_t extent16 = (int64_t)(count * 2), at = (int64_t)(7 * count + 6 * piece) * 4;
  CHECK_EQ(extent16, 12884901898LL);
  CHECK_EQ(at, 4 * (7 * 6442450949LL + 6442450944LL));
  CHECK(rt_mpi_piece_max() > 0 && rt_mpi_piece_max() <= (size_t)INT_MAX);
}

int main(void) {
  mpi_pieces();
  balanced();
  skewed();
  small_caps();
  round_trip(4, 3);
  round_trip(1, 3);
  round_trip(1000, 1);
  wide_ops();
  return CHECK_DONE("test_a2a");
}
