/* placement_oracle.h — the placement (compiler/placement.c) and Muon's scratch
 * (compiler/muon_work.c) as they were before their per-expert loops became per-shard
 * arithmetic (branch h24c, 2026-12-01): one loop over every expert of every tensor of every
 * layer. test_placement.c checks that the compiler's functions give the same results, field
 * by field, on small models and every layout. Kept verbatim but for the names (o_, w_,
 * oracle_); do not "fix" it: it is the reference. Since branch h25d the placement lists EP rank
 * 0's runs only (ExpertRun has no ep_rank): the oracle still makes every EP rank's (o_Run, in
 * *all) and returns EP rank 0's in the Placement, so that test_placement can check the rule that
 * gives the others from them. */
#ifndef MTC_PLACEMENT_ORACLE_H
#define MTC_PLACEMENT_ORACLE_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

static double o_ns_cost(const Param *p) {
  double r = (double)p->shape[p->ndim - 2], c = (double)p->shape[p->ndim - 1];
  if (r > c) {
    double t = r;
    r = c, c = t;
  }
  return 5.0 * (4.0 * r * r * c + 2.0 * r * r * r);
}

static bool o_muon_matrix(const Param *p) {
  return p->matmul && p->kind != PK_EMBEDDING && p->kind != PK_ROUTER && p->kind != PK_HEAD;
}

/* One EP rank's run of one expert matrix kind of one layer. */
typedef struct {
  int64_t ep_rank;
  ExpertRun r;
} o_Run;

/* A matrix that moves to an owner: a dense one (run NULL) or a run of a layer's split experts. */
typedef struct {
  const Param *p;
  int layer;
  double cost;
  o_Run *run;     /* experts: the run of EP rank 0 (the others follow it) */
  bool *moves;    /* experts: which of the run's count matrices are split over ranks */
} o_Dense;

static int o_by_cost_desc(const void *a, const void *b) {
  const o_Dense *x = a, *y = b;
  if (x->cost != y->cost) return x->cost < y->cost ? 1 : -1;
  if (x->layer != y->layer) return x->layer - y->layer;
  return strcmp(x->p->name, y->p->name);
}

/* Min-heap of ranks by (load, rank): restores the order below position i. */
static bool o_lighter(const double *load, int64_t a, int64_t b) {
  return load[a] < load[b] || (load[a] == load[b] && a < b);
}

static void o_sift(int64_t *heap, int64_t n, int64_t i, const double *load) {
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, min = i;
    if (l < n && o_lighter(load, heap[l], heap[min])) min = l;
    if (r < n && o_lighter(load, heap[r], heap[min])) min = r;
    if (min == i) return;
    int64_t t = heap[i];
    heap[i] = heap[min], heap[min] = t;
    i = min;
  }
}

static int o_by_layer(const void *a, const void *b) {
  const DenseOwner *x = a, *y = b;
  if (x->layer != y->layer) return x->layer - y->layer;
  return strcmp(x->matrix, y->matrix);
}

static Placement *oracle_placement(Mem *m, const Model *md, const Choice *ch, o_Run **all, int *nall) {
  *all = NULL, *nall = 0;
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
      if (!o_muon_matrix(p)) continue;
      nitems++;
      if (p->kind == PK_ROUTED) nruns += (int)ep;
    }
  o_Run *runs = mem_array(m, (size_t)nruns + 1, sizeof *runs);
  int nrun = 0;
  pl->dense = mem_array(m, (size_t)nitems + 1, sizeof *pl->dense);
  o_Dense *dense = mem_array(m, (size_t)nitems + 1, sizeof *dense);
  int nd = 0;
  for (int i = 0; i < md->nops; i++) {
    const Op *o = &md->ops[i];
    for (int j = 0; j < o->nparams; j++) {
      const Param *p = &o->params[j];
      int64_t off = 0;
      if (p->kind == PK_ROUTED && o->layer >= 0) off = at[o->layer], at[o->layer] += p->count / p->shape[0] * El;
      if (!o_muon_matrix(p)) continue;
      double cost = o_ns_cost(p);
      pl->matrices += p->ndim == 3 ? p->shape[0] : 1;
      pl->ns_flops_total += cost * (double)(p->ndim == 3 ? p->shape[0] : 1);
      if (p->kind != PK_ROUTED) {
        dense[nd++] = (o_Dense){p, o->layer, cost, NULL, NULL};
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
      o_Run *first = &runs[nrun];
      for (int64_t e = 0; e < ep; e++) {
        o_Run *r = &runs[nrun++];
        *r = (o_Run){e, {o->layer, p->name, e * n, n, per, 0, moving}};
        for (int64_t k = 0; k < n; k++) /* held whole in one shard: orthogonalized by its holder */
          if (per) load[e + ep * (k / per)] += cost;
          else if (!moves[k]) load[e + ep * ((off + k * size) / S)] += cost;
      }
      if (moving) {
        dense[nd++] = (o_Dense){p, o->layer, cost, first, moves};
        pl->moving_expert_matrices += moving * ep;
        pl->moving_expert_params += moving * size;
      }
    }
  }
  qsort(dense, (size_t)nd, sizeof *dense, o_by_cost_desc);
  int64_t *heap = mem_array(m, (size_t)F, sizeof *heap); /* ranks, least loaded on top */
  for (int64_t r = 0; r < F; r++) heap[r] = r;
  for (int64_t r = F / 2 - 1; r >= 0; r--) o_sift(heap, F, r, load);
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
      o_Run *r = dense[i].run;
      for (int64_t e = 0; e < ep; e++) {
        r[e].r.owner = best;
        for (int64_t k = 0; k < r[e].r.count; k++)
          if (dense[i].moves[k]) load[e + ep * ((best + k) % X)] += dense[i].cost;
      }
      for (int64_t q = F / 2 - 1; q >= 0; q--) o_sift(heap, F, q, load);
      continue;
    }
    int64_t best = heap[0];
    load[best] += dense[i].cost;
    o_sift(heap, F, 0, load);
    pl->dense[pl->ndense++] = (DenseOwner){dense[i].layer, dense[i].p->name, best};
    ndense++;
  }
  qsort(pl->dense, (size_t)pl->ndense, sizeof *pl->dense, o_by_layer);
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
  pl->runs = mem_array(m, (size_t)nrun + 1, sizeof *pl->runs);
  for (int i = 0; i < nrun; i++)
    if (runs[i].ep_rank == 0) pl->runs[pl->nruns++] = runs[i].r;
  *all = runs, *nall = nrun;
  return pl;
}

static int64_t w_round8(int64_t x) { return (x + 7) / 8 * 8; }

typedef struct {
  int64_t offset, rows, cols, owner;
  int experts, per; /* routed: El and plan_expert_per; dense: 0 */
  bool muon;
} w_Tens;

typedef struct {
  int64_t elems, shard;
  bool experts;
  int first, n; /* its tensors: tens[first .. first + n) (kept contiguous by filling group by group) */
} w_Grp;

static bool w_muon_matrix(const Param *p) {
  return p->matmul && p->kind != PK_EMBEDDING && p->kind != PK_ROUTER && p->kind != PK_HEAD;
}

/* Group index of parameter p of op o: 0 embedding, 1 + 2l layer l dense, 2 + 2l its experts,
 * 2L + 1 head (the embedding's when tied). */
static int w_group_of(const Model *md, const Op *o, const Param *p) {
  if (o->layer < 0)
    return o->kind == OP_EMBED || o->kind == OP_POS_EMBED || md->spec->model.tie_embeddings ? 0 : 2 * md->nlayers + 1;
  return 1 + 2 * o->layer + (p->kind == PK_ROUTED);
}

/* Start of expert k of tensor T (runtime's rt_expert_at). */
static int64_t w_expert_at(const w_Tens *T, int64_t k, int64_t block) {
  int64_t n = T->rows * T->cols;
  return T->per ? T->offset + k / T->per * block + k % T->per * n : T->offset + k * n;
}

/* Group G's part (ranks ranks): adds to owned[r] the values rank r owns of its matrices that
 * move; *ns: the most of 4 n + 2 r² over its Muon matrices (0: it has none); *batch: the cuda
 * backend's largest batch of matrices held whole in one shard. */
static void w_group_parts(const w_Grp *G, const w_Tens *tens, int64_t ranks, int64_t *owned, int64_t *sent, bool *moves,
                          int64_t *ns, int64_t *batch) {
  int64_t S = G->shard;
  *ns = *batch = 0;
  *moves = false;
  for (int i = G->first; i < G->first + G->n; i++) { /* a moving matrix's pieces all go to its owner */
    const w_Tens *t = &tens[i];
    if (!t->muon) continue;
    int64_t n = t->rows * t->cols, q = t->rows < t->cols ? t->rows : t->cols;
    if (4 * n + 2 * q * q > *ns) *ns = 4 * n + 2 * q * q;
    for (int64_t k = 0; k < (t->experts ? t->experts : 1); k++) {
      int64_t a = w_expert_at(t, k, S);
      if (a + n <= (a / S + 1) * S) continue;
      owned[(t->owner + k) % ranks] += n, *moves = true;
      for (int64_t r = 0; r < ranks; r++) { /* rank r's piece of it (runtime/optim/muon.c's piece) */
        int64_t lo = r * S > a ? r * S : a, hi = (r + 1) * S < a + n ? (r + 1) * S : a + n;
        sent[r] += hi > lo ? hi - lo : 0;
      }
    }
  }
  for (int i = G->first; i < G->first + G->n; i++) { /* the cuda backend's batches */
    const w_Tens *t = &tens[i];
    if (!t->muon) continue;
    int64_t n = t->rows * t->cols, q = t->rows < t->cols ? t->rows : t->cols, ne = t->experts ? t->experts : 1;
    for (int64_t k = 0, b; k < ne; k += b) {
      int64_t a = w_expert_at(t, k, S), lo = a / S * S;
      b = 1;
      if (a + n > lo + S) continue; /* split over shards: gathered to its owner */
      for (; k + b < ne; b++) {
        int64_t a2 = w_expert_at(t, k + b, S);
        if (a2 != a + b * n || a2 + n > lo + S) break;
      }
      if (b * (2 * n + 2 * q * q + 1) > *batch) *batch = b * (2 * n + 2 * q * q + 1);
    }
  }
}

static int64_t w_most_of(const int64_t *v, int64_t n) {
  int64_t most = 0;
  for (int64_t i = 0; i < n; i++) most = v[i] > most ? v[i] : most;
  return most;
}

static int64_t w_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The scope of layer l's matrices in a MemMap of owners (l >= -1), as emit_layout.c's. */
static const void *w_layer_tag(int l) { return (const void *)(uintptr_t)(l + 2); }

static PlanMuonWork oracle_muon_work(Mem *m, const Model *md, const Choice *ch, const Placement *pl) {
  PlanMuonWork w = {0, 0, 0};
  if (md->spec->training.optimizer != OPT_MUON) return w;
  int ng = 2 * md->nlayers + 2, np = 0;
  for (int i = 0; i < md->nops; i++) np += md->ops[i].nparams;
  w_Grp *grp = mem_array(m, (size_t)ng, sizeof *grp);
  w_Tens *tens = mem_array(m, (size_t)np + 1, sizeof *tens);
  int64_t *owned = mem_array(m, (size_t)ch->fsdp + 1, sizeof *owned), *dense = mem_array(m, (size_t)ch->fsdp + 1, sizeof *dense);
  int64_t *sent = mem_array(m, (size_t)ch->fsdp + 1, sizeof *sent), *dsent = mem_array(m, (size_t)ch->fsdp + 1, sizeof *dsent);
  int64_t dense_S = 0, dense_ns = 0, dense_moving = 0; /* the dense groups, exchanged together (rt_muon_groups) */
  int64_t El = md->spec->model.moe.present ? md->spec->model.moe.experts / ch->ep : 0;
  int per = (int)plan_expert_per(El, ch->efsdp);
  if (pl && pl->too_large) pl = NULL; /* no lists: every owner 0, as the emitter's */
  /* owners by (layer, matrix): the last entry wins, as in emit_layout.c's maps */
  MemMap dense_owner = {0}, run_owner = {0};
  for (int i = 0; pl && i < pl->ndense; i++)
    mem_map_put(m, &dense_owner, w_layer_tag(pl->dense[i].layer), pl->dense[i].matrix, &pl->dense[i].owner);
  for (int i = 0; pl && i < pl->nruns; i++)
    mem_map_put(m, &run_owner, w_layer_tag(pl->runs[i].layer), pl->runs[i].matrix, &pl->runs[i].owner);
  /* each parameter's group, then the groups' tensors in op order, group after group */
  int *gof = mem_array(m, (size_t)np + 1, sizeof *gof), *count = mem_array(m, (size_t)ng + 1, sizeof *count);
  for (int i = 0, j0 = 0; i < md->nops; j0 += md->ops[i].nparams, i++)
    for (int j = 0; j < md->ops[i].nparams; j++) count[gof[j0 + j] = w_group_of(md, &md->ops[i], &md->ops[i].params[j])]++;
  for (int g = 0, at = 0; g < ng; at += count[g], g++) grp[g].first = at, grp[g].n = 0;
  for (int i = 0, j0 = 0; i < md->nops; j0 += md->ops[i].nparams, i++)
    for (int j = 0; j < md->ops[i].nparams; j++) {
      const Op *o = &md->ops[i];
      const Param *p = &o->params[j];
      w_Grp *G = &grp[gof[j0 + j]];
      bool routed = p->kind == PK_ROUTED;
      w_Tens *t = &tens[G->first + G->n++];
      t->rows = routed ? p->shape[1] : p->shape[0];
      t->cols = routed ? p->shape[2] : (p->ndim > 1 ? p->shape[1] : 1);
      t->offset = G->elems, t->experts = routed ? (int)El : 0, t->per = routed ? per : 0;
      t->muon = w_muon_matrix(p);
      const int64_t *o_ = t->muon ? mem_map_get(routed ? &run_owner : &dense_owner, w_layer_tag(o->layer), p->name) : NULL;
      t->owner = o_ ? *o_ : 0;
      G->elems += t->rows * t->cols * (routed ? (per ? per : El) : 1);
    }
  for (int g = 0; g < ng; g++) {
    w_Grp *G = &grp[g];
    G->experts = g > 0 && g < ng - 1 && g % 2 == 0;
    int64_t ranks = G->experts ? ch->efsdp : ch->fsdp;
    G->shard = G->experts && per ? w_round8(G->elems) : plan_flat_shard(G->elems, ranks);
    int64_t ns, batch;
    bool moves;
    for (int64_t r = 0; r < ranks; r++) owned[r] = sent[r] = 0;
    w_group_parts(G, tens, ranks, G->experts ? owned : dense, G->experts ? sent : dsent, &moves, &ns, &batch);
    if (!ns) continue; /* no Muon matrix */
    w.elems = w_max64(w.elems, G->shard + batch);
    if (G->experts) { /* an expert group alone on its shard communicator */
      w.step = w_max64(w.step, G->shard + w_most_of(owned, ranks) + ns);
      for (int64_t r = 0; moves && r < ranks; r++) w.exchange = w_max64(w.exchange, G->shard + sent[r] + owned[r]);
    } else
      dense_S += G->shard, dense_ns = w_max64(dense_ns, ns), dense_moving += moves ? G->shard : 0;
  }
  if (dense_S) w.step = w_max64(w.step, dense_S + w_most_of(dense, ch->fsdp) + dense_ns);
  for (int64_t r = 0; dense_moving && r < ch->fsdp; r++)
    w.exchange = w_max64(w.exchange, dense_moving + dsent[r] + dense[r]);
  w.elems = w_max64(w.elems, w.step);
  return w;
}

#endif
