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
 * group), and gets the updates back in another. Costs are Newton-Schulz FLOPs (model.c). */
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

int64_t plan_runtime_scratch(int64_t tokens, int64_t heads, int64_t experts) {
  int64_t E = experts > 0 ? experts : 1;
  int64_t cnt = 4 * 2 * E, tab = (cnt + 4 * E + 7) / 8 * 8, moe = tab + 8 * 2 * E + 4 * (E + 1);
  return 4 * tokens * heads + 4 * (2 * tokens + 1) + 8 + 8 * 8 * 3 * E + 2 * tokens * E + moe;
}

/* A matrix that moves to an owner: a dense one (run NULL) or a run of a layer's split experts. */
typedef struct {
  const Param *p;
  int layer;
  double cost;
  ExpertRun *run; /* experts: the run of EP rank 0 (the others have the same owners) */
  bool *moves;    /* experts: which of the run's count matrices are split over ranks */
} Dense;

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
  int nitems = 0, nruns = 0;
  for (int i = 0; i < md->nops; i++)
    for (int j = 0; j < md->ops[i].nparams; j++) {
      const Param *p = &md->ops[i].params[j];
      if (p->kind == PK_ROUTED && md->ops[i].layer >= 0) group[md->ops[i].layer] += p->count / p->shape[0] * El;
      if (!muon_matrix(p)) continue;
      nitems++;
      if (p->kind == PK_ROUTED) nruns += (int)ep;
    }
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
      bool *moves = per ? NULL : mem_array(m, (size_t)n + 1, sizeof *moves);
      int64_t moving = 0;
      for (int64_t k = 0; !per && k < n; k++) {
        int64_t a = off + k * size;
        moves[k] = a / S != (a + size - 1) / S;
        moving += moves[k];
      }
      ExpertRun *first = &pl->runs[pl->nruns];
      for (int64_t e = 0; e < ep; e++) {
        ExpertRun *r = &pl->runs[pl->nruns++];
        *r = (ExpertRun){o->layer, p->name, e, e * n, n, per, 0, moving};
        for (int64_t k = 0; k < n; k++) /* held whole in one shard: orthogonalized by its holder */
          if (per) load[e + ep * (k / per)] += cost;
          else if (!moves[k]) load[e + ep * ((off + k * size) / S)] += cost;
      }
      if (moving) {
        dense[nd++] = (Dense){p, o->layer, cost, first, moves};
        pl->moving_expert_matrices += moving * ep;
        pl->moving_expert_params += moving * size;
      }
    }
  }
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
      ExpertRun *r = dense[i].run;
      for (int64_t e = 0; e < ep; e++) {
        r[e].owner = best;
        for (int64_t k = 0; k < r[e].count; k++)
          if (dense[i].moves[k]) load[e + ep * ((best + k) % X)] += dense[i].cost;
      }
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
