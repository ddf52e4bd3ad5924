/* test_comm.c — the MPI comm layer: groups of a plan's layout and each collective's result.
 *   usage: [mpirun -np W] test_comm FSDP EP DP_REPLICATE [--mismatch]
 * With --mismatch, the launch is expected to have the wrong world size: rt_comm_init must
 * refuse it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mtrt_comm.h"
#include "mtrt_hier.h"
#include "mtrt_ops.h"

static int size_of(MPI_Comm c) {
  int n;
  MPI_Comm_size(c, &n);
  return n;
}
static int rank_in(MPI_Comm c) {
  int r;
  MPI_Comm_rank(c, &r);
  return r;
}

/* World rank of member i of each group of c, from the layout's formulas. */
static int fsdp_member(const RtComm *c, int i) { return c->replica * c->fsdp + i; }
static int ep_member(const RtComm *c, int i) { return c->replica * c->fsdp + c->shard_rank * c->ep + i; }
static int shard_member(const RtComm *c, int i) { return c->replica * c->fsdp + i * c->ep + c->ep_rank; }
static int replicate_member(const RtComm *c, int i) { return i * c->fsdp + c->fsdp_rank; }

/* all-gather, reduce-scatter and all-reduce in group g of size n whose member i is world
 * rank member(c, i). */
static void collectives(const RtComm *c, MPI_Comm g, int (*member)(const RtComm *, int)) {
  enum { CNT = 3 };
  int n = size_of(g), me = rank_in(g);
  CHECK_EQ(member(c, me), c->rank);
  float in[CNT], *out = malloc(sizeof(float) * CNT * (size_t)n), *big = malloc(sizeof(float) * CNT * (size_t)n);
  for (int i = 0; i < CNT; i++) in[i] = (float)(c->rank * 10 + i);
  rt_comm_all_gather(g, out, in, CNT);
  int bad = 0;
  for (int r = 0; r < n; r++)
    for (int i = 0; i < CNT; i++) bad += out[r * CNT + i] != (float)(member(c, r) * 10 + i);
  CHECK_EQ(bad, 0);
  for (int j = 0; j < CNT * n; j++) big[j] = (float)(c->rank + j);
  float rs[CNT];
  rt_comm_reduce_scatter(g, rs, big, CNT);
  for (int i = 0; i < CNT; i++) {
    float want = 0;
    for (int r = 0; r < n; r++) want += (float)(member(c, r) + me * CNT + i);
    CHECK(rs[i] == want);
  }
  /* bf16 on the wire, fp32 accumulation: within bf16 rounding of the fp32 reduction. Values
   * with 24 significant bits, so that rounding to bf16 happens: bf16 keeps 8 significant bits, so
   * each conversion errs by at most 2^-8 of its value, the fp32 sum adds n rounding steps of 2^-24. */
  enum { BIG = 1000 };
  float *x = malloc(sizeof(float) * BIG * (size_t)n), *r32 = malloc(sizeof(float) * BIG),
        *r16 = malloc(sizeof(float) * BIG);
  uint16_t *wire = malloc(sizeof(uint16_t) * 2 * BIG * (size_t)n);
  for (int j = 0; j < BIG * n; j++) x[j] = (float)((c->rank * 7919 + j * 104729) % 1000003) / 1000003.0f - 0.5f;
  rt_comm_reduce_scatter(g, r32, x, BIG);
  rt_comm_reduce_scatter_bf16(g, r16, x, BIG, wire);
  int over = 0, rounded = 0;
  for (int i = 0; i < BIG; i++) {
    float abs_sum = 0;
    for (int r = 0; r < n; r++) {
      int rank = member(c, r), j = me * BIG + i;
      abs_sum += fabsf((float)((rank * 7919 + j * 104729) % 1000003) / 1000003.0f - 0.5f);
    }
    float err = fabsf(r16[i] - r32[i]);
    over += err > abs_sum * (0x1p-8f + (float)n * 0x1p-23f);
    rounded += err > 0;
  }
  CHECK_EQ(over, 0);
  /* the overlapped reduce-scatter (in place in its input, added into acc): as the calls above,
   * fp32 and bf16 on the wire */
  float *inp = malloc(sizeof(float) * BIG * (size_t)n), *acc = calloc(BIG, sizeof(float));
  memcpy(inp, x, sizeof(float) * BIG * (size_t)n);
  rt_comm_reduce_scatter_start(g, acc, inp, BIG, false, NULL, 0);
  rt_comm_reduce_scatter_wait(0);
  int diff = 0;
  for (int i = 0; i < BIG; i++) diff += fabsf(acc[i] - r32[i]) > 1e-5f, acc[i] = 0; /* (a sum order may differ) */
  memcpy(inp, x, sizeof(float) * BIG * (size_t)n);
  rt_comm_reduce_scatter_start(g, acc, inp, BIG, true, NULL, 1);
  rt_comm_reduce_scatter_wait(1);
  for (int i = 0; i < BIG; i++) diff += acc[i] != (n > 1 ? r16[i] : r32[i]); /* (one rank: no wire) */
  CHECK_EQ(diff, 0);
  free(inp), free(acc);
  CHECK(rounded > 0); /* bf16 did round: the test would pass an fp32 wire otherwise */
  CHECK(rt_float_from_bf16(rt_bf16_from_float(1.0f + 0x1p-8f)) == 1.0f); /* a tie rounds to even */
  CHECK(rt_float_from_bf16(rt_bf16_from_float(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f);
  free(x), free(r32), free(r16), free(wire);
  float v = (float)c->rank, want = 0;
  rt_comm_all_reduce(g, &v, 1);
  for (int r = 0; r < n; r++) want += (float)member(c, r);
  CHECK(v == want);
  free(out), free(big);
}

/* The MoE token exchange in the EP group (El 2 experts per rank, rows of C 3 values): rank q sends
 * (q + e) % 3 rows to global expert e, value c of its row i being q·1000 + i·10 + c. Buffers hold
 * cap rows exactly; the route must plan ceil(busiest / cap) rounds (busiest: the most rows a rank
 * receives), and each round's dispatch must deliver rows [r·cap, (r+1)·cap) of this rank's
 * expert-major sequence (expert k's rows from sources 0..ep-1 in turn, then expert k+1's).
 * Undispatch of ye = xe + 1 writes yp = xp + 1 at that round's rows only; at the end all of yp. */
static void moe_exchange(const RtComm *c, int cap) {
  enum { El = 2, C = 3 };
  int ep = c->ep, me = c->ep_rank, E = ep * El;
  int *off = malloc(sizeof(int) * (size_t)(E + 1)), eoff[El + 1];
  off[0] = 0;
  for (int e = 0; e < E; e++) off[e + 1] = off[e] + (me + e) % 3;
  int rows = off[E], most = 2 * ep * El; /* this rank's sequence: at most 2 rows per (source, expert) */
  int *seq = malloc(sizeof(int) * 2 * (size_t)most), n = 0, busiest = 0;
  for (int k = 0; k < El; k++) /* seq[g] = (source, row of its xp) of row g of this rank's sequence */
    for (int s = 0; s < ep; s++) {
      int e = me * El + k, first = 0;
      for (int e2 = 0; e2 < e; e2++) first += (s + e2) % 3;
      for (int i = 0; i < (s + e) % 3; i++, n++) seq[2 * n] = s, seq[2 * n + 1] = first + i;
    }
  for (int d = 0; d < ep; d++) {
    int got = 0;
    for (int s = 0; s < ep; s++)
      for (int e = d * El; e < (d + 1) * El; e++) got += (s + e) % 3;
    busiest = got > busiest ? got : busiest;
  }
  real *xp = malloc(sizeof(real) * C * (size_t)rows), *yp = malloc(sizeof(real) * C * (size_t)rows);
  real *xe = malloc(sizeof(real) * C * (size_t)cap), *tmp = malloc(sizeof(real) * C * (size_t)cap);
  for (int i = 0; i < rows * C; i++) xp[i] = (real)(me * 1000 + i / C * 10 + i % C), yp[i] = -1;
  RtA2A a;
  CHECK_EQ(rt_a2a_init(&a, ep, El, me, cap, rows), 0);
  int rounds = rt_moe_route(c->ep_comm, &a, off);
  CHECK_EQ(rounds, busiest > cap ? (busiest + cap - 1) / cap : 1);
  CHECK_EQ(a.busiest, busiest);
  int bad = 0, done = 0, stray = 0;
  for (int r = 0; r < rounds; r++) {
    rt_moe_dispatch(c->ep_comm, &a, r, xe, eoff, tmp, xp, C);
    int want = n - r * cap < cap ? n - r * cap : cap;
    CHECK_EQ(a.rows_recv, want > 0 ? want : 0);
    CHECK_EQ(eoff[El], a.rows_recv);
    for (int k = 0, start = 0; k < El; k++) { /* expert k's first row: its sequence start, clipped */
      int lo = r * cap, at = start < lo ? lo : start > lo + cap ? lo + cap : start;
      CHECK_EQ(eoff[k], at - lo);
      for (int s = 0; s < ep; s++) start += (s + me * El + k) % 3;
    }
    for (int row = 0; row < a.rows_recv; row++) {
      const int *q = &seq[2 * (r * cap + row)];
      for (int j = 0; j < C; j++) bad += xe[row * C + j] != (real)(q[0] * 1000 + q[1] * 10 + j);
    }
    for (int i = 0; i < a.rows_recv * C; i++) xe[i] += 1;
    rt_moe_undispatch(c->ep_comm, &a, yp, tmp, xe, C);
    for (int d = 0; d < ep; d++) done += (int)a.sc[d];
    int now = 0;
    for (int i = 0; i < rows; i++) {
      now += yp[i * C] != -1;
      for (int j = 0; j < C; j++) stray += yp[i * C] != -1 && yp[i * C + j] != xp[i * C + j] + 1;
    }
    CHECK_EQ(now, done); /* only this round's rows were written, on top of the earlier rounds' */
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(stray, 0);
  CHECK_EQ(done, rows);
  rt_a2a_free(&a);
  free(off), free(seq), free(xp), free(yp), free(xe), free(tmp);
}

/* The hierarchical exchange (mtrt_hier.h) against the flat one, the EP group as nodes of g ranks:
 * N tokens of K copies routed to experts b, b + 1, b + 3 (b = (me + 2t) mod E, so a token often has
 * two copies on one node), rows of C values me·1000 + t·10 + c, gates 1/2, 1/4, 1/8 (the sums
 * are exact). Each round's xe must equal the flat dispatch's bit for bit; the gated combine of ye =
 * 2 xe + 1 must equal the flat undispatch + rt_moe_combine, the ungated one rt_moe_gather_backward
 * of the same rows, and one scalar per row (its first value + expert / 2) must come back to its
 * copy's slot. The relay's staging holds st_rows rows (its messages' most). */
static void hier_exchange(const RtComm *c, int g, int cap, int st_rows) {
  enum { El = 2, C = 3, N = 5, K = 3 };
  int ep = c->ep, me = c->ep_rank, E = ep * El, nodes = ep / g;
  int32_t idx[N * K], pos[N * K];
  real wts[N * K], x[N * C], xp[N * K * C], yp[N * K * C], yf[N * C], yh[N * C], dxf[N * C], dxh[N * C];
  real dw[N * K];
  int off[64], eoff[El + 1], eoff2[El + 1];
  for (int t = 0; t < N; t++) {
    int b = (me + 2 * t) % E, o[K] = {0, 1, 3};
    for (int j = 0; j < K; j++) idx[t * K + j] = (b + o[j]) % E, wts[t * K + j] = (real)(0.5 / (1 << j)), dw[t * K + j] = 0;
    for (int k = 0; k < C; k++) x[t * C + k] = (real)(me * 1000 + t * 10 + k);
  }
  memset(yf, 0, sizeof yf), memset(yh, 0, sizeof yh), memset(dxf, 0, sizeof dxf), memset(dxh, 0, sizeof dxh);
  rt_moe_permute(pos, off, idx, N, E, K);
  rt_moe_gather(xp, x, pos, N, K, C);
  int us_rows = N * (K < nodes ? K : nodes), ur_rows = N * nodes;
  real *xe = malloc(sizeof(real) * C * (size_t)cap), *xe2 = malloc(sizeof(real) * C * (size_t)cap),
       *tmp = malloc(sizeof(real) * C * (size_t)cap), *st = malloc(sizeof(real) * C * (size_t)st_rows),
       *us = malloc(sizeof(real) * C * (size_t)us_rows), *ur = malloc(sizeof(real) * C * (size_t)ur_rows),
       *ew = malloc(sizeof(real) * (size_t)cap), *v = malloc(sizeof(real) * (size_t)cap);
  RtA2A a, b;
  RtHier h;
  CHECK_EQ(rt_a2a_init(&a, ep, El, me, cap, N * K), 0);
  CHECK_EQ(rt_a2a_init(&b, ep, El, me, cap, N * K), 0);
  CHECK_EQ(rt_hier_init(&h, c->ep_comm, ep, me, g, N, K, cap, st_rows), 0);
  rt_hier_slots(&h, pos);
  int rounds = rt_moe_route(c->ep_comm, &a, off);
  CHECK_EQ(rt_moe_route(c->ep_comm, &b, off), rounds);
  int bad = 0, wrong_w = 0;
  for (int r = 0; r < rounds; r++) {
    rt_moe_dispatch(c->ep_comm, &a, r, xe, eoff, tmp, xp, C);
    rt_moe_hier_dispatch(&h, &b, r, xe2, eoff2, ew, x, wts, us, ur, st, tmp, C);
    for (int k = 0; k <= El; k++) bad += eoff[k] != eoff2[k];
    if (rounds == 1) /* one row per token and node holding any of its experts: what crosses to that node */
      for (int m = 0; m < nodes; m++) {
        int want = 0;
        for (int t = 0; t < N; t++) {
          bool there = false;
          for (int j = 0; j < K; j++) there |= idx[t * K + j] / El / g == m;
          want += there;
        }
        CHECK_EQ(h.hs[m * (g + 1)], want);
      }
    for (int64_t i = 0; i < a.rows_recv * C; i++) bad += xe[i] != xe2[i];
    for (int k = 0; k < El; k++) /* a row's gate: the one its token gave that expert */
      for (int row = eoff2[k]; row < eoff2[k + 1]; row++) {
        int src = (int)xe2[row * C] / 1000, t = ((int)xe2[row * C] % 1000) / 10, o[K] = {0, 1, 3}, want = -1;
        for (int j = 0; j < K; j++) /* the slot of source src's token t that chose this expert */
          if ((src + 2 * t + o[j]) % E == me * El + k) want = j;
        wrong_w += want < 0 || ew[row] != (real)(0.5 / (1 << want));
      }
    for (int64_t i = 0; i < a.rows_recv * C; i++) xe[i] = 2 * xe[i] + 1;
    rt_moe_undispatch(c->ep_comm, &a, yp, tmp, xe, C);
    rt_moe_hier_combine(&h, &b, yh, xe, true, us, ur, st, tmp, C);
    rt_moe_hier_combine(&h, &b, dxh, xe, false, us, ur, st, tmp, C);
    for (int k = 0; k < El; k++)
      for (int row = eoff2[k]; row < eoff2[k + 1]; row++) v[row] = xe2[row * C] + (real)(me * El + k) / 2;
    rt_moe_hier_scalars_back(&h, &b, dw, v);
  }
  rt_moe_combine(yf, yp, wts, pos, N, K, C);
  rt_moe_gather_backward(dxf, yp, pos, N, K, C);
  for (int i = 0; i < N * C; i++) bad += yf[i] != yh[i], bad += dxf[i] != dxh[i];
  for (int s = 0; s < N * K; s++) bad += dw[s] != x[s / K * C] + (real)idx[s] / 2;
  CHECK_EQ(bad, 0);
  CHECK_EQ(wrong_w, 0);
  rt_hier_free(&h);
  rt_a2a_free(&a), rt_a2a_free(&b);
  free(xe), free(xe2), free(tmp), free(st), free(us), free(ur), free(ew), free(v);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: test_comm FSDP EP DP_REPLICATE [--mismatch]\n");
    return 2;
  }
  int fsdp = atoi(argv[1]), ep = atoi(argv[2]), dp = atoi(argv[3]);
  bool mismatch = argc > 4 && strcmp(argv[4], "--mismatch") == 0;
  RtComm c = {0};
  int rc = rt_comm_init(&c, &argc, &argv, fsdp, ep, dp, "spec.yaml", 4);
  if (mismatch) {
    CHECK_EQ(rc, -1);
    rt_comm_finalize(&c);
    return c.rank == 0 ? CHECK_DONE("test_comm (mismatch)") : check_failures != 0;
  }
  CHECK_EQ(rc, 0);
  if (rc) return 1;
  if (getenv("MTC_MPI_PIECE")) /* (ctest comm_pieces: the collectives below go through the pieces) */
    CHECK_EQ(rt_mpi_piece_max(), (size_t)atoll(getenv("MTC_MPI_PIECE")));
  CHECK_EQ(size_of(c.fsdp_comm), fsdp);
  CHECK_EQ(size_of(c.ep_comm), ep);
  CHECK_EQ(size_of(c.shard_comm), fsdp / ep);
  CHECK_EQ(size_of(c.replicate_comm), dp);
  collectives(&c, c.fsdp_comm, fsdp_member);
  collectives(&c, c.ep_comm, ep_member);
  collectives(&c, c.shard_comm, shard_member);
  collectives(&c, c.replicate_comm, replicate_member);
  /* all-to-all-v in the EP group, counts in rows of W values: member q sends (p + 1) rows to
   * member p, value i of row r being q·1000 + p·100 + r·10 + i */
  enum { W = 3 };
  int n = ep, me = c.ep_rank;
  int *sc = calloc((size_t)n, sizeof *sc), *sd = calloc((size_t)n, sizeof *sd);
  int *rcnt = calloc((size_t)n, sizeof *rcnt), *rd = calloc((size_t)n, sizeof *rd);
  int stot = 0, rtot = 0;
  for (int p = 0; p < n; p++) sd[p] = stot, sc[p] = p + 1, stot += p + 1;
  for (int q = 0; q < n; q++) rd[q] = rtot, rcnt[q] = me + 1, rtot += me + 1;
  float *send = malloc(sizeof(float) * W * (size_t)stot), *recv = malloc(sizeof(float) * W * (size_t)rtot);
  for (int p = 0; p < n; p++)
    for (int r = 0; r < sc[p]; r++)
      for (int i = 0; i < W; i++) send[(sd[p] + r) * W + i] = (float)(me * 1000 + p * 100 + r * 10 + i);
  rt_comm_all_to_all_v(c.ep_comm, send, sc, sd, recv, rcnt, rd, W);
  int bad = 0;
  for (int q = 0; q < n; q++)
    for (int r = 0; r < rcnt[q]; r++)
      for (int i = 0; i < W; i++) bad += recv[(rd[q] + r) * W + i] != (float)(q * 1000 + me * 100 + r * 10 + i);
  CHECK_EQ(bad, 0);
  free(send), free(recv), free(sc), free(sd), free(rcnt), free(rd);
  moe_exchange(&c, 2 * c.ep * c.ep * 2); /* the dropless worst case: one round */
  moe_exchange(&c, 3);                   /* several rounds */
  moe_exchange(&c, 1);
  for (int g = 1; g < c.ep; g *= 2) /* nodes of g EP ranks: 1 (every rank a node), 2, ... */
    if (c.ep % g == 0) {
      hier_exchange(&c, g, 3 * 5 * c.ep, 3 * 5 * c.ep); /* the dropless worst case: one round */
      hier_exchange(&c, g, 3 * 5 * c.ep, 2);            /* one round, messages of 2 rows */
      hier_exchange(&c, g, 4, 4);                       /* several rounds */
      hier_exchange(&c, g, 4, 1);                       /* several rounds, messages of 1 row */
    }
  int failures = check_failures, total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (c.rank == 0) fprintf(stderr, "test_comm fsdp %d ep %d dp %d: %d ranks, %d checks each, %d failed in all\n",
                           fsdp, ep, dp, c.world, check_count, total);
  rt_comm_finalize(&c);
  return total != 0;
}
