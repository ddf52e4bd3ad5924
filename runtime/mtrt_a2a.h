/*
 * mtrt_a2a.h — the arithmetic of the MoE token exchange (expert parallelism), shared by both
 * backends: counts, displacements and the regrouping of rows. No MPI, no CUDA, no data.
 *
 * EP rank j owns experts [j·El, (j+1)·El) of each MoE layer (E = ep·El). A rank's permuted rows
 * xp are ordered by global expert (offsets, E + 1 entries, from rt_moe_permute). Dispatch sends
 * peer j rows of its El experts (within rows [offsets[j·El], offsets[(j+1)·El]) of xp, a round's
 * share: RtA2A); the receiver's all-to-all buffer is source-major (peer 0's rows for its experts
 * in turn, then peer 1's, ...), and regrouping makes it expert-major (expert 0's rows from peers
 * 0..ep-1 in turn, then expert 1's, ...), the layout one grouped FFN per expert runs on.
 *
 * Sizes: rows per (peer, expert) and per round fit int (at most N·K rows per (peer, expert),
 * cap rows per round; cap <= INT_MAX); rows reaching one rank over all rounds may not (up to
 * ep·N·K: 2,097,152 at europa-1t's ep 4, N 65536, K 8), nor does rows × C (393,216 rows × 6144 =
 * 2,415,919,104 values), so sums, displacements and rounds' rows are kept in ROWS as int64_t
 * and every element count or offset is formed as int64_t rows × C.
 */
#ifndef MTRT_A2A_H
#define MTRT_A2A_H

#include <stddef.h>
#include <stdint.h>

/* One run of rows regrouping copies: rows [source_row, +rows) of the source-major buffer are
 * rows [expert_row, +rows) of the expert-major layout. */
typedef struct {
  int64_t expert_row, source_row, rows;
} RtA2ABlock;

/* The exchange's counts, allocated at start-up by rt_a2a_init (the step never allocates),
 * rewritten by each route and dispatch and read by the undispatch that reverses it.
 *
 * Bounded buffers in rounds: a rank's expert-side buffers hold `cap` rows (the plan's
 * moe_imbalance × tokens × top_k, at most the dropless worst case). A route all-gathers every
 * rank's counts over the EP group, so all ranks agree on `rounds` = the most rows any rank
 * receives, divided by cap, rounded up (at least 1). Round r carries rows [r·cap, (r+1)·cap) of
 * each receiver's expert-major sequence; every sender's part of a round for one receiver is
 * one contiguous run of its xp rows (a tail of one expert's block, whole blocks, a head), so a
 * round is one all-to-all-v. No row is dropped and no buffer is written past cap rows. */
typedef struct {
  int ep, El;
  int me;                     /* this rank's index in the EP group */
  int64_t cap;                /* rows a rank's expert-side buffers hold */
  int64_t mean;               /* rows a rank sends per route (tokens × top_k): the mean received */
  int *cnt_all;               /* (ep, ep, El): [s][d][k] rows from rank s to rank d's expert k,
                                 all-gathered by rt_moe_route */
  int *off;                   /* (ep·El + 1) this rank's permuted-row offsets of the last route
                                 (host memory) */
  int rounds;                 /* of the last route */
  int64_t busiest;            /* the most rows any rank receives in the last route */
  int round;                  /* the round of the last dispatch (undispatch reverses it) */
  int64_t *sc, *sd, *rc, *rd; /* (ep) round `round`: rows sent to / received from each peer, and
                                 the first row of each peer's part of the send (xp) / receive
                                 (source-major round) buffer */
  int64_t rows_recv;          /* rows this rank's experts receive in round `round` (<= cap) */
  RtA2ABlock *blocks;         /* (El, ep) round `round`'s regroup blocks, expert-major: [k·ep + s]
                                 is local expert k's rows from peer s (expert_row relative to the
                                 round's first row r·cap); they tile [0, rows_recv) on both sides */
  int *mpi;                   /* (4, ep) scratch: sc, sd, rc, rd as MPI ints (cpu backend) */
} RtA2A;

/* Allocates the arrays of an exchange over ep ranks of El experts each, for EP rank me whose
 * expert-side buffers hold cap rows and which sends mean rows per route (tokens × top_k).
 * Returns 0, or -1 when out of memory, ep < 1, El < 1, me outside [0, ep), or cap outside
 * [1, INT_MAX] (a round's expert offsets eoff are ints); then nothing is left allocated. */
int rt_a2a_init(RtA2A *a, int ep, int El, int me, int64_t cap, int64_t mean);
/* Frees what rt_a2a_init allocated and zeroes *a (a zeroed RtA2A may be freed again). */
void rt_a2a_free(RtA2A *a);
/* The host bytes rt_a2a_init allocates for ep ranks of El experts (the memory report); exact. */
size_t rt_a2a_bytes(int ep, int El);

/* This rank's part of the route's all-gather: cnt_all[me][d][k] = off[d·El + k + 1] -
 * off[d·El + k], from a->off (ep·El + 1 permuted-row offsets, nondecreasing, as rt_moe_permute
 * makes them). The backends then all-gather cnt_all in place over the EP group. */
void rt_a2a_plan_counts(RtA2A *a);
/* After cnt_all and off are filled: rounds and busiest (the same on every rank of the group).
 * Returns rounds. */
int rt_a2a_plan_rounds(RtA2A *a);
/* Round r (0 <= r < rounds) of the last route: sc/sd (rows of this rank's xp sent to each peer:
 * one contiguous run each), rc/rd (rows received from each peer, source-major in the round's
 * buffer), rows_recv (<= cap), the regroup blocks, round = r, and eoff (El + 1, host memory): the
 * first row of each local expert in the round's expert-major buffer, eoff[El] = rows_recv. A peer
 * with nothing in the round gets sc 0 and sd the xp row where its part would start. */
void rt_a2a_plan_round(RtA2A *a, int r, int *eoff);

/* Copies every block's rows (row_bytes bytes each) between the expert-major layout xe and the
 * source-major buffer buf: buf to xe when to_expert, else xe to buf. copy(dst, src, bytes) does
 * the copying (memcpy on the cpu backend; the cuda backend copies the blocks in one kernel,
 * comm_nccl.c); empty blocks are skipped. */
void rt_a2a_regroup(const RtA2A *a, void *xe, void *buf, size_t row_bytes, int to_expert,
                    void (*copy)(void *dst, const void *src, size_t bytes));

#endif
