/* placement.c — which rank owns which experts, and which rank orthogonalizes each matrix.
 *
 * Ranks of an FSDP group are numbered 0..fsdp-1; EP rank of FSDP rank r is r % ep (an EP group
 * is ep consecutive ranks, inside a node), and EP rank e holds experts [e·E/ep, (e+1)·E/ep)
 * whole, sharded over the fsdp/ep ranks r with r % ep == e (its shard group, X = efsdp ranks).
 * How they are sharded is one rule, plan_expert_per: whole experts (FlexShard) when X divides
 * the El = E/ep experts, rank j of the group holding experts [j·per, (j+1)·per), per = El / X;
 * otherwise the group is sharded flat like a dense group, with no padding to a largest share.
 * Muon (when the spec's optimizer is muon) needs each matrix whole on one rank. A matrix that
 * lies in one rank's shard (every expert under whole-expert sharding) is orthogonalized there,
 * with no communication. The others move: largest first, dense matrices to the least-loaded
 * rank of the whole group and each run of a layer's split expert matrices of one kind round
 * robin from the least-loaded rank of its shard group (LPT, Graham 1969): each rank sends its
 * pieces to the owners in one all-to-all a step for all the dense groups (one per flat expert
 * group), and gets the updates back in another. Costs are Newton-Schulz FLOPs (model.c).
 * A layout costs O(expert tensors × shards + ranks), not O(experts): whole experts are counted
 * per shard and split ones found per shard boundary, with the same results, bit for bit, as a
 * loop over every expert (tests/placement_oracle.h; the search places every layout it tries).
 * Only EP rank 0's expert runs are listed: every EP rank's experts group has the same layout, so
 * EP rank r's runs are EP rank 0's with first + r × El and the same owner and moving (ExpertRun;
 * plan.json's expert_runs_of_ep_rank_r): europa-1t at ep 65,536 lists 222 runs, not 14.5 M. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

static double ns_cost(const Param *p) {
  double r = (double)p->shape[p->ndim - 2], c = (double)p->shape[p->ndim - 1];
  if (r > c) {
    double t = r;
    r = c, c = t;
  }
  return 5.0 * (4.0 * r * r * c + 2.0 * r * r * r);
}

static bool muon_matrix(const Param *p) {
  return p->matmul && p->kind != PK_EMBEDDING && p->kind != PK_ROUTER && p->kind != PK_HEAD;
}

int64_t plan_expert_per(int64_t El, int64_t efsdp) {
  return efsdp > 1 && El > 0 && El % efsdp == 0 ? El / efsdp : 0;
}

int64_t plan_flat_shard(int64_t elems, int64_t ranks) {
  return (elems + ranks * 8 - 1) / (ranks * 8) * 8;
}

int64_t plan_logits_chunk(int64_t tokens, int64_t vocab) {
  const int64_t gib = (int64_t)1 << 30;
  if (tokens <= 0 || vocab <= 0 || 4 * tokens * vocab <= gib) return vocab;
  int64_t c = gib / (4 * tokens);
  if (c > 4096) c = 4096;
  if (c >= 128) c = c / 128 * 128;
  return c < 1 ? 1 : c;
}

int64_t plan_runtime_scratch(int64_t tokens, int64_t heads, int64_t qk_head_dim, int64_t experts) {
  int64_t E = experts > 0 ? experts : 1;
  int64_t cnt = 4 * 2 * E, tab = (cnt + 4 * E + 7) / 8 * 8, moe = tab + 8 * 2 * E + 4 * (E + 1);
  return 4 * tokens * heads + 4 * tokens * heads * qk_head_dim + 4 * (2 * tokens + 1) + 8 + 8 * 8 * 3 * E + 2 * tokens * E + moe;
}

int64_t plan_runtime_host_scratch(int64_t experts) {
  /* runtime/cuda/cu_scratch.h's CU_OFF_CACHE, CU_SCALARS, CU_RING_SLOTS, CU_RING_SLOT */
  enum { OFF_CACHE = 64, SCALARS = 256, RING_SLOTS = 64, RING_SLOT = 16 << 10 };
  int64_t E = experts > 0 ? experts : 1;
  int64_t cnt = 4 * 2 * E, tab = (cnt + 4 * E + 7) / 8 * 8, moe = tab + 8 * 2 * E + 4 * (E + 1);
  int64_t stage = (8 * SCALARS + 4 * SCALARS + 255) / 256 * 256 + (int64_t)RING_SLOTS * RING_SLOT;
  return moe + 4 * OFF_CACHE * (E + 1) + stage + moe;
}

int64_t plan_hier_host_tables(int64_t ep, int64_t g, int64_t tokens, int64_t top_k, int64_t cap, int64_t st) {
  int64_t nodes = ep / g, nk = tokens * top_k, per = top_k < nodes ? top_k : nodes;
  return 4 * (4 * nk + tokens + tokens * per) + 2 * 4 * nodes * (g + 1) + 4 * 8 * nodes + 2 * 8 * (nodes + 1) +
         2 * 4 * g * cap + 2 * 4 * cap + 8 * ep + 8 * (g + 1) + 8 * (cap / st + 2);
}

int64_t plan_hier_cuda_tables(int64_t ep, int64_t g, int64_t tokens, int64_t top_k, int64_t cap, int64_t st,
                              int64_t *host) {
  int64_t nodes = ep / g, nk = tokens * top_k, per = top_k < nodes ? top_k : nodes, relay = 5 * g * cap + 1,
          chunks = g * (cap / st + 1) + 1, wide = nodes > g ? nodes : g;
  *host = 4 * (relay + tokens * nodes + nk + cap + chunks) + 8 * (4 * wide + 2 * (g + 1));
  return 4 * (tokens * per + relay + 2 * nk);
}

int64_t plan_host_tables(int64_t tokens, int64_t fsdp, int64_t ep, int64_t El) {
  int64_t muon = fsdp * (5 * 8 + 4 * 4 + 2 * 8); /* runtime/optim/muon.c rt_muon_counts_bytes */
  int64_t a2a = ep > 1 ? 4 * ep * ep * El + 4 * (ep * El + 1) + 8 * 4 * ep + 24 * ep * El + 4 * 4 * ep : 0;
  return 2 * 4 * tokens + muon + a2a;
}

/* A matrix that moves to an owner: a dense one (run NULL) or a run of a layer's split experts. */
typedef struct {
  const Param *p;
  int layer;
  double cost;
  ExpertRun *run;  /* experts: the run of EP rank 0 (every EP rank's has the same owner) */
  int64_t *moves;  /* experts: which of the run's count matrices are split over ranks, ascending */
} Dense;

/* Experts k < n of size elements each, expert k at element off + k·size of a flat group in
 * shards of S elements: how many lie whole in shard q (start and end in [q S, (q+1) S)). */
static int64_t whole_in_shard(int64_t off, int64_t size, int64_t n, int64_t S, int64_t q) {
  int64_t lo = q * S - off, hi = (q + 1) * S - off; /* the shard, from expert 0's start */
  if (hi < size) return 0;
  int64_t k0 = lo <= 0 ? 0 : (lo + size - 1) / size, k1 = hi / size < n ? hi / size : n;
  return k1 > k0 ? k1 - k0 : 0;
}

/* The same experts: those split over shards (a shard boundary strictly inside), ascending, into
 * out (NULL: only counted); returns how many. A step per boundary or split expert, at most
 * min(n, the boundaries in the experts' range) + 1. */
static int64_t split_experts(int64_t off, int64_t size, int64_t n, int64_t S, int64_t *out) {
  int64_t count = 0, end = off + n * size;
  for (int64_t B = (off / S + 1) * S; B < end;) {
    int64_t k = (B - off) / size, a = off + k * size; /* B lies in expert k: a <= B < a + size */
    if (a == B) {
      B += S; /* a boundary between two experts */
      continue;
    }
    if (out) out[count] = k;
    count++;
    B = ((a + size - 1) / S + 1) * S; /* the first boundary past expert k */
  }
  return count;
}

/* The exponent of the lowest set bit of x, a finite double > 0 (x = odd × 2^result). */
static int low_bit(double x) {
  int e;
  int64_t mant = (int64_t)ldexp(frexp(x, &e), 53), z = 0; /* x = mant × 2^(e − 53) */
  while (mant && !(mant & 1)) mant >>= 1, z++;
  return (int)(e - 53 + z);
}

/* L + c + c + ... (m times, L >= 0, c > 0), each sum rounded to a double as a loop of m
 * additions rounds it, in a few steps per binade. While the sums are exact (multiples of 2^z
 * below 2^(53 + z)) it is L + m c. Otherwise, inside a binade [top/2, top) with ulp u, L + c
 * rounds to L + c rounded to a multiple of u (ties to the even multiple): after one such step
 * every next step adds the same d, until the exact sum reaches top. */
static double add_repeated(double L, double c, int64_t m) {
  while (m > 0) {
    int z = L > 0 && low_bit(L) < low_bit(c) ? low_bit(L) : low_bit(c);
    if (L + (double)m * c < ldexp(1.0, 52 + z)) return L + (double)m * c; /* a factor 2 for this bound's rounding */
    int k;
    frexp(L, &k);
    double top = ldexp(1.0, k); /* L in [top/2, top) */
    if (L == 0 || L + c >= top) { /* a step that leaves L's binade */
      L += c, m--;
      continue;
    }
    double L1 = L + c, L2;
    if (--m == 0 || L1 + c >= top) {
      L = L1;
      continue;
    }
    L2 = L1 + c, m--;
    double d = L2 - L1; /* exact (c < L1) */
    if (d == 0) return L2;
    /* steps from L2 while L2 + i d + c < top; 2 fewer for the quotient's rounding */
    double room = floor((top - L2 - c) / d) - 2;
    int64_t j = room <= 0 ? 0 : room >= (double)m ? m : (int64_t)room;
    L = L2 + (double)j * d, m -= j; /* exact: a multiple of u below top */
  }
  return L;
}

static int by_cost_desc(const void *a, const void *b) {
  const Dense *x = a, *y = b;
  if (x->cost != y->cost) return x->cost < y->cost ? 1 : -1;
  if (x->layer != y->layer) return x->layer - y->layer;
  return strcmp(x->p->name, y->p->name);
}

/* Min-heap of ranks by (load, rank): restores the order below position i. */
static bool lighter(const double *load, int64_t a, int64_t b) {
  return load[a] < load[b] || (load[a] == load[b] && a < b);
}

static void sift(int64_t *heap, int64_t n, int64_t i, const double *load) {
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, min = i;
    if (l < n && lighter(load, heap[l], heap[min])) min = l;
    if (r < n && lighter(load, heap[r], heap[min])) min = r;
    if (min == i) return;
    int64_t t = heap[i];
    heap[i] = heap[min], heap[min] = t;
    i = min;
  }
}

static int by_layer(const void *a, const void *b) {
  const DenseOwner *x = a, *y = b;
  if (x->layer != y->layer) return x->layer - y->layer;
  return strcmp(x->matrix, y->matrix);
}

Placement *plan_placement(Mem *m, const Model *md, const Choice *ch) {
  const Spec *s = md->spec;
  Placement *pl = mem_alloc(m, sizeof *pl);
  pl->ep = ch->ep;
  pl->experts_per_rank = s->model.moe.present ? s->model.moe.experts / ch->ep : 0;
  pl->muon = s->training.optimizer == OPT_MUON;
  if (!pl->muon) return pl;
  if (ch->fsdp > PLACEMENT_MAX_RANKS) { /* the rule still holds; the list would be too long */
    pl->too_large = true;
    return pl;
  }
  int64_t F = ch->fsdp, ep = ch->ep, X = ch->efsdp, El = pl->experts_per_rank, per = plan_expert_per(El, X);
  double *load = mem_array(m, (size_t)F, sizeof *load);
  /* each layer's experts group (flat): its elements, as emit_layout.c lays it out (routed tensors
   * in op order, El experts each), so that a split matrix is known by its offset */
  int64_t *group = mem_array(m, (size_t)md->nlayers + 1, sizeof *group), *at = mem_array(m, (size_t)md->nlayers + 1, sizeof *at);
  int nitems = 0, nruns = 0, low = 1 << 30;
  double held = 0; /* Newton-Schulz FLOPs of all expert matrices: a bound on a rank's load before the LPT */
  for (int i = 0; i < md->nops; i++)
    for (int j = 0; j < md->ops[i].nparams; j++) {
      const Param *p = &md->ops[i].params[j];
      if (p->kind == PK_ROUTED && md->ops[i].layer >= 0) group[md->ops[i].layer] += p->count / p->shape[0] * El;
      if (!muon_matrix(p)) continue;
      nitems++;
      if (p->kind != PK_ROUTED) continue;
      nruns++;
      held += ns_cost(p) * (double)p->shape[0];
      if (low_bit(ns_cost(p)) < low) low = low_bit(ns_cost(p));
    }
  /* The loads of the matrices orthogonalized where they are held are added a shard at a time
   * (count × cost) rather than a matrix at a time: the same doubles when every partial sum is
   * exact, i.e. all are multiples of 2^low below 2^(53 + low) (held < 2^(52 + low) leaves a
   * factor 2 for held's own rounding). Otherwise (never for the example specs) each shard's
   * sum is the one its matrices' additions, one at a time in op order, round to (add_repeated):
   * a rank's sums come in the same order either way (by tensor, then by expert). */
  bool exact = held < ldexp(1.0, 52 + low);
  /* Those loads depend on the rank's place in its shard group only (q = rank / ep): summed
   * once per shard group rank, in the same order, then copied to its ep ranks. */
  double *held_by = mem_array(m, (size_t)X, sizeof *held_by);
  pl->runs = mem_array(m, (size_t)nruns + 1, sizeof *pl->runs);
  pl->dense = mem_array(m, (size_t)nitems + 1, sizeof *pl->dense);
  Dense *dense = mem_array(m, (size_t)nitems + 1, sizeof *dense);
  int nd = 0;
  for (int i = 0; i < md->nops; i++) {
    const Op *o = &md->ops[i];
    for (int j = 0; j < o->nparams; j++) {
      const Param *p = &o->params[j];
      int64_t off = 0;
      if (p->kind == PK_ROUTED && o->layer >= 0) off = at[o->layer], at[o->layer] += p->count / p->shape[0] * El;
      if (!muon_matrix(p)) continue;
      double cost = ns_cost(p);
      pl->matrices += p->ndim == 3 ? p->shape[0] : 1;
      pl->ns_flops_total += cost * (double)(p->ndim == 3 ? p->shape[0] : 1);
      if (p->kind != PK_ROUTED) {
        dense[nd++] = (Dense){p, o->layer, cost, NULL, NULL};
        pl->dense_params += p->count;
        continue;
      }
      int64_t n = p->shape[0] / ep, size = p->count / p->shape[0]; /* experts of one EP rank; elements of one */
      int64_t S = per ? 0 : plan_flat_shard(group[o->layer], X);
      int64_t moving = per ? 0 : split_experts(off, size, n, S, NULL);
      int64_t *moves = moving ? mem_array(m, (size_t)moving, sizeof *moves) : NULL;
      if (moving) split_experts(off, size, n, S, moves);
      ExpertRun *first = &pl->runs[pl->nruns]; /* EP rank 0's; EP rank e's: first + e·n, the rest the same */
      pl->runs[pl->nruns++] = (ExpertRun){o->layer, p->name, 0, n, per, 0, moving};
      /* the shards [q0, q1] hold the run: whole experts are orthogonalized by their holder (flat:
       * none when an expert is larger than a shard; then q1 − q0 could be as large as X) */
      int64_t q0 = per ? 0 : off / S, q1 = per ? n / per - 1 : (off + n * size - 1) / S;
      for (int64_t q = q0; (per || size <= S) && q <= q1; q++) {
        int64_t whole = per ? per : whole_in_shard(off, size, n, S, q);
        held_by[q] = exact ? held_by[q] + (double)whole * cost : add_repeated(held_by[q], cost, whole);
      }
      if (moving) {
        dense[nd++] = (Dense){p, o->layer, cost, first, moves};
        pl->moving_expert_matrices += moving * ep;
        pl->moving_expert_params += moving * size;
      }
    }
  }
  for (int64_t r = 0; r < F; r++) load[r] = held_by[r / ep];
  qsort(dense, (size_t)nd, sizeof *dense, by_cost_desc);
  int64_t *heap = mem_array(m, (size_t)F, sizeof *heap); /* ranks, least loaded on top */
  for (int64_t r = 0; r < F; r++) heap[r] = r;
  for (int64_t r = F / 2 - 1; r >= 0; r--) sift(heap, F, r, load);
  int ndense = 0;
  for (int i = 0; i < nd; i++) {
    if (dense[i].run) { /* a run of split experts: round robin from the least-loaded rank of the shard group */
      int64_t best = 0;
      double least = 0;
      for (int64_t q = 0; q < X; q++) {
        double l = 0;
        for (int64_t e = 0; e < ep; e++) l += load[e + ep * q];
        if (q == 0 || l < least) least = l, best = q;
      }
      dense[i].run->owner = best; /* every EP rank's run of this matrix kind */
      for (int64_t e = 0; e < ep; e++)
        for (int64_t k = 0; k < dense[i].run->moving; k++) load[e + ep * ((best + dense[i].moves[k]) % X)] += dense[i].cost;
      for (int64_t q = F / 2 - 1; q >= 0; q--) sift(heap, F, q, load);
      continue;
    }
    int64_t best = heap[0];
    load[best] += dense[i].cost;
    sift(heap, F, 0, load);
    pl->dense[pl->ndense++] = (DenseOwner){dense[i].layer, dense[i].p->name, best};
    ndense++;
  }
  qsort(pl->dense, (size_t)pl->ndense, sizeof *pl->dense, by_layer);
  /* each rank holds 1/F of a dense matrix and owns 1/F of them: (F−1)/F² of the bytes leave it,
   * twice; of a split expert matrix 1/X of its EP rank's, (X−1)/X² */
  if (F > 1) {
    pl->moving_matrices = ndense + pl->moving_expert_matrices;
    pl->moving_bytes_rank = 2.0 * 4.0 * (double)pl->dense_params * (double)(F - 1) / ((double)F * (double)F);
  }
  if (X > 1)
    pl->moving_bytes_rank += 2.0 * 4.0 * (double)pl->moving_expert_params * (double)(X - 1) / ((double)X * (double)X);
  for (int64_t r = 0; r < F; r++)
    if (load[r] > pl->ns_flops_max_rank) pl->ns_flops_max_rank = load[r];
  return pl;
}
