/*
 * mtrt_comm.h — libmtrt's bootstrap and collectives over MPI (the cpu backend; the cuda
 * backend bootstraps NCCL over the same groups).
 *
 * Ranks follow the plan's layout: world = dp_replicate × fsdp. World rank w is in replica
 * w / fsdp at FSDP rank f = w % fsdp; its EP rank is f % ep (EP groups are ep consecutive
 * ranks, inside a node) and it shards its EP rank's experts with the fsdp / ep ranks of its
 * replica that have the same EP rank (the expert-shard group, index f / ep).
 */
#ifndef MTRT_COMM_H
#define MTRT_COMM_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mtrt_a2a.h"
#include "mtrt_real.h"

/* A failed MPI call: prints host, rank, file, line, the call and MPI's message; aborts the job. */
void rt_mpi_fail(int rc, const char *call, const char *file, int line);
#define RT_MPI_CHECK(call)                                                                \
  do {                                                                                    \
    int rc_ = (call);                                                                     \
    if (rc_ != MPI_SUCCESS) rt_mpi_fail(rc_, #call, __FILE__, __LINE__);                  \
  } while (0)
/* Where the step is (a string literal, "layer 3 backward"), set by step.c before each unit, so
 * that a failed or hung collective names its layer. */
void rt_comm_label(const char *where);
const char *rt_comm_where(void);
/* n as an MPI int count; past INT_MAX aborts the job printing "what: n" and where the step is. */
int rt_mpi_count(size_t n, const char *what);
/* Large counts: the cpu backend's collectives move at most rt_mpi_piece_max() values per rank in
 * one MPI call (2^30, or $MTC_MPI_PIECE when set: a test hook that sends small counts through the
 * pieces), a larger count in pieces of that many values (the last one shorter). */
size_t rt_mpi_piece_max(void);
/* The values in the piece that starts at value at (< count) of count values cut in pieces of at
 * most piece (> 0): min(piece, count - at). */
size_t rt_mpi_piece_len(size_t count, size_t at, size_t piece);
/* The number of pieces of at most piece (> 0) values in count values: ceil(count / piece). */
size_t rt_mpi_pieces(size_t count, size_t piece);

/* One process's place in the layout and a communicator per group. */
typedef struct {
  int world, rank;
  int fsdp, ep, dp_replicate;
  int replica, fsdp_rank, ep_rank, shard_rank;
  MPI_Comm fsdp_comm;      /* the fsdp ranks of one replica: dense parameters */
  MPI_Comm ep_comm;        /* ep consecutive ranks: the token all-to-all */
  MPI_Comm shard_comm;     /* fsdp / ep ranks with one EP rank: expert parameters */
  MPI_Comm replicate_comm; /* one FSDP rank across replicas: gradient all-reduce */
  int cp, cp_rank;         /* context parallelism: cp consecutive FSDP ranks split each sequence */
  MPI_Comm cp_comm;        /* those cp ranks (MPI_COMM_NULL with cp 1): K/V, the balancing loss */
} RtComm;

/* Initializes MPI (a world of 1 runs without mpirun) and splits the groups of a plan with
 * world = fsdp × dp_replicate. If the launch has another world size, rank 0 prints both numbers
 * and what to do: relaunch, or recompile spec for the launched size (cluster.nodes when it is
 * a multiple of gpus_per_node, else one node of that many ranks); returns -1. Returns 0 on
 * success. */
int rt_comm_init(RtComm *c, int *argc, char ***argv, int fsdp, int ep, int dp_replicate, const char *spec,
                 int gpus_per_node);
void rt_comm_finalize(RtComm *c);
/* Context parallelism after rt_comm_init: the cp group of cp consecutive ranks of an FSDP group
 * (cp_rank = fsdp_rank % cp). cp 1: no group. */
void rt_comm_cp_init(RtComm *c, int cp);
/* comm_cp.c over MPI (cpu backend), comm_nccl.c over NCCL (cuda). Each of B sequences of S = cp T
 * tokens is split over the cp group in 2 cp chunks of T / 2, cp_rank r holding chunks r and
 * 2 cp - 1 - r (mtrt_ops.h's lo, hi).
 * gather: full (B, S, width) = every rank's local (B, T, width) in position order.
 * reduce_scatter: local (B, T, width) = Σ over the group of full's rows at local's positions;
 * full is consumed (its blocks reordered in place). */
void rt_comm_cp_gather(MPI_Comm comm, int cp, act *full, const act *local, int B, int T, int64_t width);
void rt_comm_cp_reduce_scatter(MPI_Comm comm, int cp, act *local, act *full, int B, int T, int64_t width);
/* buf (n) = the mean over the group of buf, in place. */
void rt_comm_cp_mean(MPI_Comm comm, int cp, real *buf, size_t n);

/* out (g × count values, rank order) = every rank's in (count values) in group comm. cpu backend
 * only (comm_mpi.c: its start below; test_comm): the programs call the started form. */
void rt_comm_all_gather(MPI_Comm comm, act *out, const act *in, size_t count);
/* All-gathers in flight at once, at most: 2 (dense, experts) per gathered unit of the plan's
 * prefetch pool (prefetch depth + 1 units; the compiler refuses a deeper plan). */
enum { RT_AG_SLOTS = 16 };
/* Prefetch: the same all-gather, started now and waited for later, so that it overlaps the
 * compute in between (the next layers' parameters while this layer runs). slot (0 to
 * RT_AG_SLOTS - 1) names it in rt_comm_all_gather_wait, after which out may be read. The cpu
 * backend's MPI all-gather blocks, so there start does all the work and wait nothing. */
void rt_comm_all_gather_start(MPI_Comm comm, act *out, const act *in, size_t count, int slot);
void rt_comm_all_gather_wait(int slot);
/* out (count) = Σ over ranks of in[rank × count .. +count) (in: g × count values). This and the
 * bf16 form below: cpu backend only (comm_mpi.c, test_comm); the programs call the overlapped
 * rt_comm_reduce_scatter_start. */
void rt_comm_reduce_scatter(MPI_Comm comm, real *out, const real *in, size_t count);
/* The same with bf16 on the wire and fp32 accumulation, as the reference run reduces gradients:
 * in is rounded to bf16 (nearest even), the pieces are exchanged by an all-to-all, and each rank
 * sums the g pieces of its part in fp32, in rank order. wire: scratch of 2 × g × count uint16. */
void rt_comm_reduce_scatter_bf16(MPI_Comm comm, real *out, const real *in, size_t count, uint16_t *wire);
/* bf16 (the top 16 bits of an IEEE float, rounded to nearest even) and back. */
uint16_t rt_bf16_from_float(float f);
float rt_float_from_bf16(uint16_t h);
/* A unit's gradient reduce-scattered, started now and finished later, so that it overlaps the
 * next unit's backward: acc (count real values: this rank's fp32 gradient shard) += the sum over
 * the group's g ranks of their piece of in (g × count act values, rank order: the unit's
 * unsharded gradient, GRAD0/1; consumed: in must not be touched until the wait).
 *   bf16 (true): bf16 on the wire. cuda with bf16 storage: in itself is reduce-scattered in bf16
 *     (NCCL's sum, in place: this rank's piece lands at in + rank × count); cuda's fp32-act
 *     runtime: in is rounded to bf16 values, then summed in fp32 in place; cpu: in is rounded to
 *     bf16 into the first half of its own bytes, exchanged by an all-to-all into the second half
 *     and each part's g pieces are summed in fp32 in rank order (as the reference run reduces).
 *   bf16 (false): fp32 on the wire. Where act is real (cpu, cuda fp32-act) in place in in; with
 *     bf16 storage in's values go to wire (g × count real: RS_WIRE0/1, the plan's
 *     grads.fp32_wire) and are reduce-scattered there in place. wire may be NULL where act is real.
 * A group of one rank adds in. rt_comm_reduce_scatter_wait(slot) then adds the piece into acc in
 * the compute's order. slot 0-3. The cpu backend's MPI collective blocks: start does all of it
 * (the adds into a shard keep their order). The cuda backend runs it on the group's communication
 * stream, and wait makes the compute stream wait for it on the device (the host does not block)
 * before the add. */
void rt_comm_reduce_scatter_start(MPI_Comm comm, real *acc, act *in, size_t count, bool bf16, real *wire, int slot);
void rt_comm_reduce_scatter_wait(int slot);
/* buf (count) = Σ over ranks of buf, in place. */
void rt_comm_all_reduce(MPI_Comm comm, real *buf, size_t count);
/* Variable all-to-all of rows of `row` reals: send rows [sdispl[r], +scount[r]) go to rank r,
 * which receives them at recv rows [rdispl[me], +rcount[me]); counts and displacements in ROWS,
 * g entries each (MPI ints: one row is an MPI datatype of `row` reals, so the values may pass
 * INT_MAX; callers check rows with rt_mpi_count). */
void rt_comm_all_to_all_v(MPI_Comm comm, const real *send, const int *scount, const int *sdispl,
                          real *recv, const int *rcount, const int *rdispl, int row);

/* ---- MoE token exchange over the EP group (expert parallelism) ----
 * The layouts, counts, rounds and sizes: mtrt_a2a.h (RtA2A, allocated at start-up by
 * rt_a2a_init). Dispatch sends each expert's rows to its owner, which receives them grouped by
 * local expert (expert-major, source rank minor) so one grouped FFN runs per expert; undispatch
 * sends results back in the reverse order. With ep = 1 the generated code skips all three.
 * A layer pass:
 *     rounds = rt_moe_route(ep_comm, a, offsets);
 *     for r < rounds: rt_moe_dispatch(.., r, xe, ..); the experts on xe; rt_moe_undispatch(..)
 * Buffers xe, ye and tmp hold a->cap rows of C reals (not the dropless worst case). */
/* Gathers every EP rank's counts per (destination, expert) from offsets (ep·El + 1 permuted-row
 * offsets of this rank, device memory on cuda: their host copy is the one the permutation's
 * count copy made, so no synchronization here) into
 * a->cnt_all, then plans the rounds (rt_a2a_plan_rounds). Collective over ep_comm. Returns the
 * rounds, the same on every rank. */
int rt_moe_route(MPI_Comm ep_comm, RtA2A *a, const int *offsets);
/* Round r of the last route: xe (rows_recv ≤ cap rows, C) and eoff (El + 1, where the backend's
 * ops read offsets: device memory on cuda) = this round's rows of this rank's experts from every
 * EP peer, expert-major; xp holds this rank's permuted rows (N·K, C). tmp: cap rows. Collective
 * over ep_comm; r outside [0, rounds) aborts the job. */
void rt_moe_dispatch(MPI_Comm ep_comm, RtA2A *a, int r, act *xe, int *eoff, act *tmp, const act *xp, int C);
/* The reverse of the last dispatch: ye (rows_recv, C) in xe's order goes back to its source
 * ranks, arriving in yp at the rows of their xp (rows of other rounds are untouched). tmp as in
 * dispatch. */
void rt_moe_undispatch(MPI_Comm ep_comm, const RtA2A *a, act *yp, act *tmp, const act *ye, int C);

#endif
