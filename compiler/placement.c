/* placement.c — which rank owns which experts, and which rank orthogonalizes each matrix.
 *
 * Ranks of an FSDP group are numbered 0..fsdp-1; EP rank of FSDP rank r is r % ep (an EP group
 * is ep consecutive ranks, inside a node), and EP rank e holds experts [e·E/ep, (e+1)·E/ep)
 * whole, sharded over the fsdp/ep ranks r with r % ep == e.
 * Muon (when the spec's optimizer is muon) needs each matrix whole on one rank. Experts are
 * sharded whole (FlexShard): the shard group's rank j holds experts [j·per, (j+1)·per) of its
 * EP rank, per = ceil(experts per EP rank / shard group) (the last ranks fewer when it does not
 * divide: padded to the largest), and orthogonalizes them where they are held, with no
 * communication. Dense matrices then go, largest first, to the least-loaded rank of the whole
 * group (LPT, Graham 1969): each rank sends its pieces to the owners in one all-to-all per group
 * and step, and gets the updates back in another. Costs are Newton-Schulz FLOPs (model.c). */
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

typedef struct {
  const Param *p;
  int layer;
  double cost;
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
  int64_t F = ch->fsdp, ep = ch->ep, shard = ch->efsdp;
  double *load = mem_array(m, (size_t)F, sizeof *load);
  int ndense = 0, nruns = 0;
  for (int i = 0; i < md->nops; i++)
    for (int j = 0; j < md->ops[i].nparams; j++) {
      const Param *p = &md->ops[i].params[j];
      if (!muon_matrix(p)) continue;
      if (p->kind == PK_ROUTED) nruns += (int)ep;
      else ndense++;
    }
  pl->runs = mem_array(m, (size_t)nruns + 1, sizeof *pl->runs);
  pl->dense = mem_array(m, (size_t)ndense + 1, sizeof *pl->dense);
  Dense *dense = mem_array(m, (size_t)ndense + 1, sizeof *dense);
  int nd = 0;
  for (int i = 0; i < md->nops; i++) {
    const Op *o = &md->ops[i];
    for (int j = 0; j < o->nparams; j++) {
      const Param *p = &o->params[j];
      if (!muon_matrix(p)) continue;
      double cost = ns_cost(p);
      pl->matrices += p->ndim == 3 ? p->shape[0] : 1;
      pl->ns_flops_total += cost * (double)(p->ndim == 3 ? p->shape[0] : 1);
      if (p->kind != PK_ROUTED) {
        dense[nd++] = (Dense){p, o->layer, cost};
        pl->dense_params += p->count;
        continue;
      }
      int64_t n = p->shape[0] / ep, per = (n + shard - 1) / shard; /* experts of one EP rank, of one holder */
      for (int64_t e = 0; e < ep; e++) {
        ExpertRun *r = &pl->runs[pl->nruns++];
        *r = (ExpertRun){o->layer, p->name, e, e * n, n, per};
        for (int64_t k = 0; k < n; k++) load[e + ep * (k / per)] += cost;
      }
    }
  }
  qsort(dense, (size_t)nd, sizeof *dense, by_cost_desc);
  int64_t *heap = mem_array(m, (size_t)F, sizeof *heap); /* ranks, least loaded on top */
  for (int64_t r = 0; r < F; r++) heap[r] = r;
  for (int64_t r = F / 2 - 1; r >= 0; r--) sift(heap, F, r, load);
  for (int i = 0; i < nd; i++) {
    int64_t best = heap[0];
    load[best] += dense[i].cost;
    sift(heap, F, 0, load);
    pl->dense[pl->ndense++] = (DenseOwner){dense[i].layer, dense[i].p->name, best};
  }
  qsort(pl->dense, (size_t)pl->ndense, sizeof *pl->dense, by_layer);
  if (F > 1) { /* each rank holds 1/F of a matrix and owns 1/F of them: (F−1)/F² of the bytes leave it, twice */
    pl->moving_matrices = nd;
    pl->moving_bytes_rank = 2.0 * 4.0 * (double)pl->dense_params * (double)(F - 1) / ((double)F * (double)F);
  }
  for (int64_t r = 0; r < F; r++)
    if (load[r] > pl->ns_flops_max_rank) pl->ns_flops_max_rank = load[r];
  return pl;
}
