/* test_comm.c — the MPI comm layer: groups of a plan's layout and each collective's result.
 *   usage: [mpirun -np W] test_comm FSDP EP DP_REPLICATE [--mismatch]
 * With --mismatch, the launch is expected to have the wrong world size: rt_comm_init must
 * refuse it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mtrt_comm.h"

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
  CHECK_EQ(size_of(c.fsdp_comm), fsdp);
  CHECK_EQ(size_of(c.ep_comm), ep);
  CHECK_EQ(size_of(c.shard_comm), fsdp / ep);
  CHECK_EQ(size_of(c.replicate_comm), dp);
  collectives(&c, c.fsdp_comm, fsdp_member);
  collectives(&c, c.ep_comm, ep_member);
  collectives(&c, c.shard_comm, shard_member);
  collectives(&c, c.replicate_comm, replicate_member);
  /* all-to-all-v in the EP group: member q sends (p + 1) values q·100 + p to member p */
  int n = ep, me = c.ep_rank;
  int *sc = calloc((size_t)n, sizeof *sc), *sd = calloc((size_t)n, sizeof *sd);
  int *rcnt = calloc((size_t)n, sizeof *rcnt), *rd = calloc((size_t)n, sizeof *rd);
  int stot = 0, rtot = 0;
  for (int p = 0; p < n; p++) sd[p] = stot, sc[p] = p + 1, stot += p + 1;
  for (int q = 0; q < n; q++) rd[q] = rtot, rcnt[q] = me + 1, rtot += me + 1;
  float *send = malloc(sizeof(float) * (size_t)stot), *recv = malloc(sizeof(float) * (size_t)rtot);
  for (int p = 0; p < n; p++)
    for (int i = 0; i < sc[p]; i++) send[sd[p] + i] = (float)(me * 100 + p);
  rt_comm_all_to_all_v(c.ep_comm, send, sc, sd, recv, rcnt, rd);
  int bad = 0;
  for (int q = 0; q < n; q++)
    for (int i = 0; i < rcnt[q]; i++) bad += recv[rd[q] + i] != (float)(q * 100 + me);
  CHECK_EQ(bad, 0);
  free(send), free(recv), free(sc), free(sd), free(rcnt), free(rd);
  int failures = check_failures, total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (c.rank == 0) fprintf(stderr, "test_comm fsdp %d ep %d dp %d: %d ranks, %d checks each, %d failed in all\n",
                           fsdp, ep, dp, c.world, check_count, total);
  rt_comm_finalize(&c);
  return total != 0;
}
