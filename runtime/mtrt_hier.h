/*
 * mtrt_hier.h — the hierarchical MoE token exchange of an EP group that spans nodes (DeepSeek-V3's
 * dispatch, arXiv:2412.19437 §3.2.2): a token crosses the inter-node link once per destination
 * node, to the relay there (the rank with the sender's local index), which forwards one copy per
 * expert over the node-local link; the combine goes back the same way, the relay summing a
 * token's copies (weighted by their gates in the forward) before the one crossing back.
 *
 * The EP group of ep = nodes · g ranks: EP rank q is on node q / g with local index q % g (the
 * plan's layout: EP groups are consecutive ranks, nodes filled in blocks). node_comm: the g EP
 * ranks of one node (by local index); cross_comm: the nodes EP ranks with one local index (by
 * node). Rounds, windows and the expert-major layout are the flat exchange's (mtrt_a2a.h): round
 * r delivers to each rank exactly the rows the flat dispatch of round r delivers, in the same
 * expert-major order, so the experts run unchanged.
 *
 * Roles in a round (every rank plays all three):
 *   origin  (n, i): its permuted rows for the peers of node m, deduplicated by token: one row of
 *           x per token, sent to relay (m, i) with one descriptor per copy (the token's unique
 *           row, and its gate);
 *   relay   (m, i): expands the unique rows into copies and sends each local rank j its copies
 *           from origins (0, i), (1, i), ... in that order, in g shifted steps (step q: to local
 *           rank i + q, from i − q), in messages of at most st rows (its staging);
 *   owner   (m, j): receives relay-major (relay 0's copies, origin node-major, then relay 1's, ...)
 *           and regroups them into the flat expert-major layout.
 *
 * Sizes, rows of C reals: us (origin's unique rows) <= N · min(K, nodes); ur (relay's unique rows)
 * <= N · nodes; the relay's staging st rows (any >= 1: the messages of a step); the owner's
 * receive <= cap; the relay keeps <= g · cap descriptors and gates (host memory, allocated at
 * start-up).
 */
#ifndef MTRT_HIER_H
#define MTRT_HIER_H

#include <stdint.h>

#include "mtrt_comm.h"

/* One hierarchical exchange, allocated by rt_hier_init at start-up; rewritten by every round. */
typedef struct {
  int ep, g, nodes, node, li; /* EP ranks, per node, nodes; this rank's node and local index */
  int N, K;                   /* this rank's tokens and copies per token (N·K permuted rows) */
  int64_t cap;                /* the flat exchange's rows per round (RtA2A.cap) */
  int64_t st;                 /* rows of the relay's staging: a node-local message's most */
  MPI_Comm node_comm, cross_comm;
  int32_t *slot;   /* (N·K) slot t·K + j of each permuted row: the inverse of rt_moe_permute's pos */
  int32_t *mark;   /* (N) scratch: a token's unique row in the node being planned, -1 when none */
  /* origin: round plan, node-major (node m's part: its local ranks' copies in order) */
  int32_t *utok;   /* (N · min(K, nodes)) token of each unique row sent */
  int32_t *cu;     /* (N·K) unique row (within its node's part) of each copy sent */
  int32_t *cslot;  /* (N·K) slot of each copy sent */
  real *cw;        /* (N·K) each copy's gate, or the scalar it brings back */
  int *hs, *hr;    /* (nodes, g + 1) headers sent / received: unique rows, then copies per local rank */
  int *m8;         /* (8, nodes) MPI scratch: counts and displacements */
  /* relay */
  int64_t *urd, *crd; /* (nodes + 1) first unique row / first descriptor from each origin node */
  int32_t *rdesc;     /* (g·cap) unique row (within its origin's part) of each copy relayed */
  real *rw;           /* (g·cap) the gate of each copy relayed (or the scalar it brings back) */
  real *sw;           /* (cap) staging of one peer's gates */
  /* owner */
  int64_t *hrd;       /* (ep) first row of each source's copies in the relay-major receive order */
  int64_t *fromd;     /* (g + 1) first row from each relay */
  real *ow;           /* (cap) gates received, relay-major */
  MPI_Request *req;   /* (cap / st + 2) a step's messages in flight */
  void *dev;          /* the cuda backend's own (runtime/cuda/moe_hier.c: NCCL communicators, device tables) */
} RtHier;

/* Splits node_comm and cross_comm from ep_comm (this rank's EP index me, g ranks per node, g
 * divides ep) and allocates the arrays for N tokens of K copies, rounds of cap rows and a relay's
 * staging of st rows. Returns 0, or -1 (nothing left allocated) when g < 1, ep % g, N < 1, K < 1,
 * st < 1 or out of memory. Collective over ep_comm. */
int rt_hier_init(RtHier *h, MPI_Comm ep_comm, int ep, int me, int g, int N, int K, int64_t cap, int64_t st);
void rt_hier_free(RtHier *h);
/* The host bytes rt_hier_init allocates (the memory report); exact. */
size_t rt_hier_bytes(int ep, int g, int N, int K, int64_t cap, int64_t st);
/* The cuda backend's tables (runtime/cuda/moe_hier.c), 4-byte values: on the device, returned,
 * the origin's unique rows' tokens (N · min(K, nodes)), the relay's copies in send order (source
 * rows, then grouped by target: rows, gates, targets, their first rows + 1: 5 · g · cap + 1), and
 * the origin's slots and scalars (2 · N · K); *host, their host side: the relay's part, a mark per
 * unique row received (N · nodes), the routing weights or positions (N · K), the rows' scalars
 * (cap), the first target of each message (g · (cap / st + 1) + 1), and 4 · max(nodes, g) + 2 · (g + 1)
 * int64 counts. Exact; the plan's moe.hier_index and moe.hier_index_host. */
size_t rt_hier_cuda_bytes(int ep, int g, int N, int K, int64_t cap, int64_t st, size_t *host);
/* After rt_moe_permute: slot[pos[s]] = s for the N·K slots (pos: the backend's, host or device). */
void rt_hier_slots(RtHier *h, const int32_t *pos);

/* ---- the host tables both backends share (comm/hier_plan.c) ---- */
/* Round r of the last route: rt_a2a_plan_round (eoff: host), the origin's unique rows (utok, the
 * headers hs) and copies (cu, cslot; cw their gates from wts, host memory by slot, when not NULL),
 * the headers received (hr, urd, crd), the relays' descriptors rdesc (and gates rw, with wts) over
 * cross_comm, and the owner's receive layout (hrd, fromd). Returns the unique rows this origin sends.
 * Collective over the EP group; aborts the job when the relay's copies pass g · cap. */
int64_t rt_hier_plan(RtHier *h, RtA2A *a, int r, int *eoff, const real *wts);
/* The header from origin node n as this relay received it / to node m as sent: [0] unique rows,
 * [1 + j] copies for local rank j; rt_hier_copies: the copies of a header. */
const int *rt_hier_hdr_r(const RtHier *h, int n);
const int *rt_hier_hdr_s(const RtHier *h, int m);
int64_t rt_hier_copies(const int *hdr, int g);
/* The relay's first descriptor (index into rdesc, rw) of origin n's copies for local rank j. */
int64_t rt_hier_desc_at(const RtHier *h, int n, int j);
/* m8[0..4·nodes): the cross_comm counts and displacements of unique rows (rows) or copies: sent
 * to each node, first sent, received from each node, first received. */
void rt_hier_cross_counts(RtHier *h, bool rows);
/* The round's rows between xe (expert-major) and buf (the owner's relay-major receive order), rows
 * of bytes bytes: buf to xe when to_expert (host memory). */
void rt_hier_regroup(const RtHier *h, const RtA2A *a, void *xe, void *buf, size_t bytes, bool to_expert);
/* The relays' gates (rw) to the owners over node_comm: ew (rows_recv, expert-major, host). */
void rt_hier_gates_to_owners(RtHier *h, const RtA2A *a, real *ew);
/* One scalar per received row (v: rows_recv, expert-major, host) back over node_comm and
 * cross_comm to its copy: cw[i] for the copy of slot cslot[i]; returns the copies (i's). */
int64_t rt_hier_scalars_home(RtHier *h, const RtA2A *a, const real *v);

/* Round r of the last route (rt_moe_route over the EP group; a holds its counts): xe (rows_recv
 * <= cap rows of C) and eoff (El + 1) = this rank's experts' rows of the round, exactly as
 * rt_moe_dispatch writes them; x (N, C) the tokens' rows (each copy is its token's row). ew
 * (rows_recv, expert-major) = each row's gate wts[slot] (wts: N·K; both NULL: no gates sent).
 * us, ur, st: the staging buffers above (st: h->st rows); tmp: cap rows (the owner's receive). */
void rt_moe_hier_dispatch(RtHier *h, RtA2A *a, int r, act *xe, int *eoff, real *ew, const act *x,
                          const real *wts, act *us, act *ur, act *st, act *tmp, int C);
/* The reverse of the last dispatch: y (N, C) += for each token, the sum over its copies of the
 * round of gate · ye (gated: the gates the dispatch sent; else 1), ye in xe's layout. Each relay
 * sums its node's copies of a token, each origin adds the nodes' sums in node order. */
void rt_moe_hier_combine(RtHier *h, const RtA2A *a, act *y, const act *ye, bool gated, act *us, act *ur,
                         act *st, act *tmp, int C);
/* One scalar per row back to its copy: dw[slot] += v[row] for the rows of the last dispatch (v:
 * rows_recv, expert-major). */
void rt_moe_hier_scalars_back(RtHier *h, const RtA2A *a, real *dw, const real *v);


/* The owner's side of the routing weights' gradient, one round (rows rows of C, expert-major):
 * dv[row] = dyu[row] · dye[row] (dye holds the experts' outputs on entry), then dye[row] =
 * ew[row] · dyu[row] (the gradient of the outputs). cpu: comm/moe_hier.c; cuda: cuda/moe_hier.c. */
void rt_moe_gate_rows(act *dye, real *dv, const act *dyu, const real *ew, int64_t rows, int C);

#endif
