/* test_muon.c — Muon's Newton-Schulz iteration and its group step (rt_muon_group, rt_muon_groups).
 *   usage: [mpirun -np W] test_muon [EP]
 * Checks that the iteration's output has singular values in the quintic's band, about
 * [0.68, 1.13], checked as [0.65, 1.16] (wide and tall random
 * matrices), and that a dense group sharded flat over the W ranks (its matrices gathered to
 * their owners in one all-to-all) and an expert group over the X = W / EP ranks of each EP rank
 * get bitwise the same update as everything on one rank. The experts' shards follow the
 * compiler's rule (plan_expert_per): 4 experts per EP rank divide X = 2 and 4, so they are
 * whole-expert shards and nothing moves; 5 do not, so the group is sharded flat (no padding)
 * and the matrices split over ranks go to their owners like dense ones. Each case runs with
 * MPI's int counts, with every message on the derived-datatype path that messages past
 * INT_MAX take (rt_muon_msg_limit 7), and (ep 1) with both groups in one exchange a step
 * (rt_muon_groups, as the program exchanges its dense groups). */
#include "mtrt_train.h"
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mtrt_optim.h"

/* A pseudo-random value in [-0.5, 0.5) for index i (splitmix64: full rank, unlike a linear
 * congruence, whose matrices have rank 2). */
static float value(int64_t i, int salt) {
  uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull + (uint64_t)salt * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (float)(x >> 40) / 16777216.0f - 0.5f;
}

/* Eigenvalues of the symmetric n × n matrix a (destroyed) by cyclic Jacobi rotations. */
static void jacobi(double *a, int n, double *eig) {
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) off += a[p * n + q] * a[p * n + q];
    if (off < 1e-22) break;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) {
        double apq = a[p * n + q];
        if (fabs(apq) < 1e-300) continue;
        double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        double t = (theta >= 0 ? 1 : -1) / (fabs(theta) + sqrt(theta * theta + 1)), c = 1 / sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; k++) { /* columns p, q */
          double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq, a[k * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; k++) { /* rows p, q */
          double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk, a[q * n + k] = s * apk + c * aqk;
        }
      }
  }
  for (int i = 0; i < n; i++) eig[i] = a[i * n + i];
}

static void singular_values(int rows, int cols) {
  int n = rows * cols, r = rows < cols ? rows : cols;
  real *g = malloc(sizeof(real) * (size_t)n), *o = malloc(sizeof(real) * (size_t)n);
  real *work = malloc(sizeof(real) * rt_newton_schulz_work(rows, cols));
  for (int i = 0; i < n; i++) g[i] = value(i, rows);
  rt_newton_schulz(o, g, rows, cols, work);
  double *gram = calloc((size_t)r * r, sizeof(double)), *eig = malloc(sizeof(double) * (size_t)r);
  for (int i = 0; i < r; i++) /* the r × r Gram matrix of the short side */
    for (int j = 0; j < r; j++)
      for (int k = 0; k < (rows < cols ? cols : rows); k++)
        gram[i * r + j] += rows < cols ? (double)o[i * cols + k] * o[j * cols + k] : (double)o[k * cols + i] * o[k * cols + j];
  jacobi(gram, r, eig);
  double lo = 1e9, hi = 0;
  for (int i = 0; i < r; i++) {
    double sv = sqrt(fmax(eig[i], 0));
    lo = fmin(lo, sv), hi = fmax(hi, sv);
  }
  printf("Newton-Schulz %dx%d: singular values in [%.3f, %.3f]\n", rows, cols, lo, hi);
  CHECK(lo >= 0.65 && hi <= 1.16); /* the quintic's band, about [0.68, 1.13] */
  free(g), free(o), free(work), free(gram), free(eig);
}

/* The test's model: a dense group (a vector, then matrices 40 x 24 and 16 x 32, owners 1 and 0)
 * and an expert group (gate 8 x 12 and down 12 x 10 of 4 or 5 experts per EP rank; when flat and
 * split, expert k of gate owned by rank (1 + k) mod X, of down by k mod X). */
enum { NT = 5 };

/* Tables for W dense ranks and an expert shard group of X ranks: whole-expert shards when X > 1
 * divides the experts (compiler/placement.c's plan_expert_per), else flat. */
static void tables(RtTensor *t, RtGroup *g, int W, int X, int experts) {
  int per = X > 1 && experts % X == 0 ? experts / X : 0;
  t[0] = (RtTensor){"v", 0, 0, 5, 0, 5, 1, 0.02f, false, false, false, 0, 0, 0};
  t[1] = (RtTensor){"a", 0, 5, 40 * 24, 0, 40, 24, 0.02f, false, true, true, 1 % W, 0, 0};
  t[2] = (RtTensor){"b", 0, 5 + 960, 16 * 32, 0, 16, 32, 0.02f, false, true, true, 0, 0, 0};
  int64_t dense = 5 + 960 + 512, S = (dense + 4 * W - 1) / (4 * W) * 4;
  g[0] = (RtGroup){"dense", RT_GROUP_FSDP, S * W, S, 0, 0, 0, 0, -1};
  int64_t room = per ? per : experts, shard = (room * 216 + 3) / 4 * 4;
  int64_t eshard = per ? shard : (shard + X - 1) / X;
  t[3] = (RtTensor){"e.%d.gate", 1, 0, 96, experts, 8, 12, 0.02f, false, true, true, 1 % X, per, per ? shard : 0};
  t[4] = (RtTensor){"e.%d.down", 1, room * 96, 120, experts, 12, 10, 0.02f, false, true, true, 0, per, per ? shard : 0};
  g[1] = (RtGroup){"experts", RT_GROUP_EXPERT_SHARD, eshard * X, eshard, 0, 0, 0, 0, -1};
}

/* Fills [lo, hi) of group gi: parameter (salt 1) or gradient (salt 2) of (tensor, global expert, i). */
static void fill(real *v, const RtTensor *t, int gi, int64_t lo, int64_t hi, int ep_rank, int salt) {
  for (int64_t i = 0; i < hi - lo; i++) v[i] = 0;
  RT_FOR_PIECES(t, NT, gi, lo, hi, {
    int e = T->experts ? ep_rank * T->experts + k : 0;
    for (int64_t i = 0; i < len; i++) v[at + i] = value((int64_t)(ti * 1000 + e) * 100000 + first + i, salt);
  })
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, world, ep = argc > 1 ? atoi(argv[1]) : 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (rank == 0) singular_values(64, 32), singular_values(24, 40);
  if (world % ep) ep = 1;
  int X = world / ep, ep_rank = rank % ep; /* EP rank r % ep; its shard group: the ranks with that EP rank */
  MPI_Comm shard_comm;
  MPI_Comm_split(MPI_COMM_WORLD, ep_rank, rank, &shard_comm);
  int srank;
  MPI_Comm_rank(shard_comm, &srank);
  RtMuon h = {0.01f, 0.1f, 0.95f};
  void *counts = malloc(rt_muon_counts_bytes(world));
  /* three passes: MPI's int counts, group by group; every message past a limit of 7 values (the
   * derived-datatype path that messages past INT_MAX take, in chunks of 7); with ep 1 (one
   * communicator's ranks for both groups), both groups in one exchange (rt_muon_groups) */
  for (int pass = 0; pass < 3; pass++)
  for (int EL = 4; EL <= 5; EL++) {
  if (pass == 2 && ep != 1) continue;
  rt_muon_msg_limit = pass == 1 ? 7 : INT_MAX;
  RtTensor t[NT], t1[NT];
  RtGroup g[2], g1[2];
  tables(t, g, world, X, EL);
  tables(t1, g1, 1, 1, EL * ep); /* one rank: every expert */
  bool ok = true, whole = t[3].per > 0;
  int64_t moved = 0, local = 0, emoved = 0, large = 0, exchanges = 0;
  RtMuonShard gs[2];
  RtMuonStats st[2] = {{0}};
  for (int gi = 0; gi < 2; gi++) {
    int me = gi ? srank : rank;
    int64_t S = g[gi].shard, lo = me * S;
    gs[gi] = (RtMuonShard){gi, S, malloc(sizeof(real) * (size_t)S), calloc((size_t)S, sizeof(float)),
                           malloc(sizeof(real) * (size_t)S), NULL};
    fill(gs[gi].param, t, gi, lo, lo + S, ep_rank, 1), fill((real *)gs[gi].grad, t, gi, lo, lo + S, ep_rank, 2);
  }
  for (int gi = 0; gi < 2; gi++) { /* group by group; both at once in pass 2 */
    MPI_Comm comm = gi ? shard_comm : MPI_COMM_WORLD;
    int ranks = gi ? X : world, ng = pass == 2 ? 2 : 1;
    const RtMuonShard *q = pass == 2 ? gs : &gs[gi];
    real *work = malloc(sizeof(real) * rt_muon_groups_work(t, NT, q, ng, ranks));
    for (int step = 0; step < 2; step++) /* twice: the second step uses the momentum */
      rt_muon_groups(comm, ranks, q, ng, t, NT, 0.5f, &h, work, counts, &st[gi]);
    free(work);
    /* the exchange's part of the scratch (the cuda backend's host scratch past the nests) is the
     * most any rank sent and received in one exchange: what the steps moved, measured */
    int64_t xchg = (st[gi].sent + st[gi].received) / 2, most = 0;
    MPI_Allreduce(&xchg, &most, 1, MPI_INT64_T, MPI_MAX, comm);
    CHECK_EQ(rt_muon_exchange_work(t, NT, q, ng, ranks), most);
    if (pass == 2) break;
  }
  for (int gi = 0; gi < 2; gi++) {
    int me = gi ? srank : rank;
    int64_t S = g[gi].shard, lo = me * S, S1 = g1[gi].shard;
    const real *p = gs[gi].param;
    /* one rank, everything */
    real *p1 = malloc(sizeof(real) * (size_t)S1), *g1v = malloc(sizeof(real) * (size_t)S1);
    float *m1 = calloc((size_t)S1, sizeof(float));
    fill(p1, t1, gi, 0, S1, 0, 1), fill(g1v, t1, gi, 0, S1, 0, 2);
    real *work = malloc(sizeof(real) * rt_muon_group_work(t1, NT, gi, S1, 1));
    for (int step = 0; step < 2; step++) rt_muon_group(MPI_COMM_SELF, 1, p1, m1, g1v, t1, NT, gi, S1, 0.5f, &h, work, counts, NULL);
    /* every value of this shard equals the one-rank value of the same (tensor, expert, index) */
    RT_FOR_PIECES(t, NT, gi, lo, lo + S, {
      const RtTensor *T1 = &t1[ti];
      int e = T->experts ? ep_rank * T->experts + k : 0;
      const real *ref = p1 + rt_expert_at(T1, e) + first;
      if (memcmp(p + at, ref, sizeof(real) * (size_t)len) != 0) ok = false;
      if (T->muon && p[at] == value((int64_t)(ti * 1000 + e) * 100000 + first, 1)) ok = false; /* it moved */
    })
    large += st[gi].large, exchanges += st[gi].exchanges;
    if (pass == 2) local += st[gi].local + st[gi].owned; /* (what moved: one figure for both groups) */
    else if (gi) local += st[gi].local + st[gi].owned, emoved += st[gi].sent;
    else moved += st[gi].sent;
    if (pass < 2 && gi && (whole || X == 1)) CHECK_EQ(st[gi].sent + st[gi].received, 0); /* whole experts: no communication */
    free(gs[gi].param), free(gs[gi].mom), free((real *)gs[gi].grad), free(work), free(p1), free(g1v), free(m1);
  }
  CHECK(ok);
  int64_t all_local = 0, all_emoved = 0;
  MPI_Allreduce(&local, &all_local, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&emoved, &all_emoved, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  /* every expert matrix, twice, by one rank (pass 2: the dense ones too, 2 of them) */
  CHECK_EQ(all_local, 2 * 2 * EL * ep + (pass == 2 ? 2 * 2 : 0));
  if (pass < 2 && !whole && X > 1) CHECK(all_emoved > 0); /* flat: the split expert matrices moved */
  if (world > 1) CHECK(pass == 1 ? large > 0 : large == 0); /* the path the limit asks for */
  if (world > 1 && pass == 2) CHECK_EQ(exchanges, 2); /* one exchange a step for both groups */
  if (rank == 0)
    printf("Muon on %d rank(s), ep %d (%d experts per EP rank over %d ranks, %s): the update equals the one-rank "
           "update bit for bit; dense values sent to owners by rank 0: %lld, expert values by all: %lld%s\n", world, ep,
           EL, X, whole ? "whole-expert shards" : "flat", (long long)moved, (long long)all_emoved,
           pass == 1 ? " (derived datatypes, 7-value chunks)" : pass == 2 ? " (both groups in one exchange a step)" : "");
  }
  free(counts);
  MPI_Comm_free(&shard_comm);
  MPI_Finalize();
  return check_failures ? 1 : 0;
}
