/* muon_work.c — Muon's scratch (the program's MUON_WORK buffer), one figure that the plan's
 * workspace.newton_schulz item and the emitter both read, so that plan and program agree.
 *
 * It lays the parameter groups out as emit_layout.c does (embedding, per layer dense and
 * experts, head; tensors in op order, routed ones El experts each, whole-expert shards when
 * plan_expert_per says so, else flat shards of plan_flat_shard) and takes, over the groups,
 * the most of (runtime/optim/muon.c's rt_muon_groups_work and runtime/cuda/muon_cuda.c's use):
 *   the dense groups, exchanged together once a step: the sum of their shards + (the most one
 *       rank owns of their matrices that move) + (4 n + 2 r²) of their largest Muon matrix
 *       (gradient, update, Newton-Schulz scratch: rt_newton_schulz_work);
 *   each expert group, exchanged on its own: the same of its shard and matrices;
 *   each group's shard S + the largest run of same-shaped matrices held whole in one shard (a
 *       shard's experts of one tensor) as one cuBLAS batch, b (2 n + 2 r² + 1) values
 *       (rt_cu_newton_schulz_work).
 * Only groups with a Muon matrix count. Owners come from the placement (DenseOwner, ExpertRun).
 * Two more figures: step, the first two alone (what the step on the host, rt_muon_groups, uses:
 * the host's MUON_WORK when the plan puts the step there, MUON_STEP_ELEMS), and exchange, the
 * host scratch of the cuda backend's step on the GPU (rt_cu_muon_groups: the Nesterov gradients
 * of a call's groups with a matrix that moves, one shard each, then the pieces a rank sends and
 * receives; no assembled matrix, no update: those are on the device; MUON_HOST_ELEMS). */
#include <stdint.h>
#include <string.h>

#include "mtc.h"

static int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

typedef struct {
  int64_t offset, rows, cols, owner;
  int experts, per; /* routed: El and plan_expert_per; dense: 0 */
  bool muon;
} Tens;

typedef struct {
  int64_t elems, shard;
  bool experts;
  int first, n; /* its tensors: tens[first .. first + n) (kept contiguous by filling group by group) */
} Grp;

static bool muon_matrix(const Param *p) {
  return p->matmul && p->kind != PK_EMBEDDING && p->kind != PK_ROUTER && p->kind != PK_HEAD;
}

/* Group index of parameter p of op o: 0 embedding, 1 + 2l layer l dense, 2 + 2l its experts,
 * 2L + 1 head (the embedding's when tied). */
static int group_of(const Model *md, const Op *o, const Param *p) {
  if (o->layer < 0)
    return o->kind == OP_EMBED || o->kind == OP_POS_EMBED || md->spec->model.tie_embeddings ? 0 : 2 * md->nlayers + 1;
  return 1 + 2 * o->layer + (p->kind == PK_ROUTED);
}

/* Group G's part (ranks ranks): adds to owned[r] the values rank r owns of its matrices that
 * move and to sent[r] the values of them rank r's shard holds (the pieces it sends to their
 * owners); *moves: whether any of its Muon matrices moves; *ns: the most of 4 n + 2 r² over its
 * Muon matrices (0: it has none); *batch: the cuda
 * backend's largest batch of matrices held whole in one shard. The runtime walks a tensor's
 * matrices one by one (rt_expert_at: matrix k of a flat tensor at offset + k n; of whole-expert
 * shards at offset + (k / per) S + (k % per) n); this counts the same per shard boundary:
 *   whole-expert shards: no matrix crosses a boundary (offset + per n <= S), and each shard's
 *       per matrices of the tensor are one batch;
 *   flat (a dense tensor is one matrix): matrix k moves when a boundary lies strictly inside
 *       it, to rank (owner + k) mod ranks; a batch is the matrices whole in one shard (they
 *       are consecutive, and the runtime's batch stops at the first that ends past the shard). */
static void group_parts(const Grp *G, const Tens *tens, int64_t ranks, int64_t *owned, int64_t *sent, bool *moves,
                        int64_t *ns, int64_t *batch) {
  int64_t S = G->shard;
  *ns = *batch = 0;
  *moves = false;
  for (int i = G->first; i < G->first + G->n; i++) {
    const Tens *t = &tens[i];
    if (!t->muon) continue;
    int64_t n = t->rows * t->cols, q = t->rows < t->cols ? t->rows : t->cols, ne = t->experts ? t->experts : 1;
    if (4 * n + 2 * q * q > *ns) *ns = 4 * n + 2 * q * q;
    int64_t most = t->per; /* matrices in one batch */
    if (!t->per) {
      most = 0;
      int64_t end = t->offset + ne * n;
      for (int64_t B = (t->offset / S + 1) * S; B < end;) { /* split matrices: all pieces go to the owner */
        int64_t k = (B - t->offset) / n, a = t->offset + k * n; /* a <= B < a + n */
        if (a == B) {
          B += S;
          continue;
        }
        owned[(t->owner + k) % ranks] += n;
        for (int64_t r = a / S; r <= (a + n - 1) / S; r++) /* its pieces, one per shard it spans */
          sent[r] += (a + n < (r + 1) * S ? a + n : (r + 1) * S) - (a > r * S ? a : r * S);
        *moves = true;
        B = ((a + n - 1) / S + 1) * S;
      }
      for (int64_t sh = t->offset / S; n <= S && sh <= (end - 1) / S; sh++) { /* whole matrices per shard (none when n > S) */
        int64_t lo = sh * S - t->offset, hi = (sh + 1) * S - t->offset;
        int64_t k0 = lo <= 0 ? 0 : (lo + n - 1) / n, k1 = hi < n ? 0 : hi / n < ne ? hi / n : ne;
        if (k1 - k0 > most) most = k1 - k0;
      }
    }
    if (most * (2 * n + 2 * q * q + 1) > *batch) *batch = most * (2 * n + 2 * q * q + 1);
  }
}

static int64_t most_of(const int64_t *v, int64_t n) {
  int64_t most = 0;
  for (int64_t i = 0; i < n; i++) most = v[i] > most ? v[i] : most;
  return most;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The most over ranks r < n of a[r] + b[r]. */
static int64_t most_sum(const int64_t *a, const int64_t *b, int64_t n) {
  int64_t most = 0;
  for (int64_t i = 0; i < n; i++) most = max64(most, a[i] + b[i]);
  return most;
}

/* The scope of layer l's matrices in a MemMap of owners (l >= -1), as emit_layout.c's. */
static const void *layer_tag(int l) { return (const void *)(uintptr_t)(l + 2); }

PlanMuonWork plan_muon_work(Mem *m, const Model *md, const Choice *ch, const Placement *pl) {
  PlanMuonWork w = {0, 0, 0};
  if (md->spec->training.optimizer != OPT_MUON) return w;
  int ng = 2 * md->nlayers + 2, np = 0;
  for (int i = 0; i < md->nops; i++) np += md->ops[i].nparams;
  Grp *grp = mem_array(m, (size_t)ng, sizeof *grp);
  Tens *tens = mem_array(m, (size_t)np + 1, sizeof *tens);
  int64_t *owned = mem_array(m, (size_t)ch->fsdp + 1, sizeof *owned), *dense = mem_array(m, (size_t)ch->fsdp + 1, sizeof *dense);
  int64_t *sent = mem_array(m, (size_t)ch->fsdp + 1, sizeof *sent), *dense_sent = mem_array(m, (size_t)ch->fsdp + 1, sizeof *sent);
  int64_t dense_S = 0, dense_ns = 0; /* the dense groups, exchanged together (rt_muon_groups) */
  int64_t dense_moving_S = 0;        /* their shards whose Nesterov gradients go through the host (cuda) */
  int64_t El = md->spec->model.moe.present ? md->spec->model.moe.experts / ch->ep : 0;
  int per = (int)plan_expert_per(El, ch->efsdp);
  if (pl && pl->too_large) pl = NULL; /* no lists: every owner 0, as the emitter's */
  /* owners by (layer, matrix): the last entry wins, as in emit_layout.c's maps */
  MemMap dense_owner = {0}, run_owner = {0};
  for (int i = 0; pl && i < pl->ndense; i++)
    mem_map_put(m, &dense_owner, layer_tag(pl->dense[i].layer), pl->dense[i].matrix, &pl->dense[i].owner);
  for (int i = 0; pl && i < pl->nruns; i++)
    mem_map_put(m, &run_owner, layer_tag(pl->runs[i].layer), pl->runs[i].matrix, &pl->runs[i].owner);
  /* each parameter's group, then the groups' tensors in op order, group after group */
  int *gof = mem_array(m, (size_t)np + 1, sizeof *gof), *count = mem_array(m, (size_t)ng + 1, sizeof *count);
  for (int i = 0, j0 = 0; i < md->nops; j0 += md->ops[i].nparams, i++)
    for (int j = 0; j < md->ops[i].nparams; j++) count[gof[j0 + j] = group_of(md, &md->ops[i], &md->ops[i].params[j])]++;
  for (int g = 0, at = 0; g < ng; at += count[g], g++) grp[g].first = at, grp[g].n = 0;
  for (int i = 0, j0 = 0; i < md->nops; j0 += md->ops[i].nparams, i++)
    for (int j = 0; j < md->ops[i].nparams; j++) {
      const Op *o = &md->ops[i];
      const Param *p = &o->params[j];
      Grp *G = &grp[gof[j0 + j]];
      bool routed = p->kind == PK_ROUTED;
      Tens *t = &tens[G->first + G->n++];
      t->rows = routed ? p->shape[1] : p->shape[0];
      t->cols = routed ? p->shape[2] : (p->ndim > 1 ? p->shape[1] : 1);
      t->offset = G->elems, t->experts = routed ? (int)El : 0, t->per = routed ? per : 0;
      t->muon = muon_matrix(p);
      const int64_t *o_ = t->muon ? mem_map_get(routed ? &run_owner : &dense_owner, layer_tag(o->layer), p->name) : NULL;
      t->owner = o_ ? *o_ : 0;
      G->elems += t->rows * t->cols * (routed ? (per ? per : El) : 1);
    }
  for (int g = 0; g < ng; g++) {
    Grp *G = &grp[g];
    G->experts = g > 0 && g < ng - 1 && g % 2 == 0;
    int64_t ranks = G->experts ? ch->efsdp : ch->fsdp;
    G->shard = G->experts && per ? round8(G->elems) : plan_flat_shard(G->elems, ranks);
    int64_t ns, batch;
    bool moves;
    for (int64_t r = 0; G->experts && r < ranks; r++) owned[r] = sent[r] = 0; /* (a dense group adds to dense) */
    group_parts(G, tens, ranks, G->experts ? owned : dense, G->experts ? sent : dense_sent, &moves, &ns, &batch);
    if (!ns) continue; /* no Muon matrix */
    w.elems = max64(w.elems, G->shard + batch);
    if (G->experts) { /* an expert group alone on its shard communicator */
      w.step = max64(w.step, G->shard + most_of(owned, ranks) + ns);
      if (moves) w.exchange = max64(w.exchange, G->shard + most_sum(sent, owned, ranks));
    } else
      dense_S += G->shard, dense_ns = max64(dense_ns, ns), dense_moving_S += moves ? G->shard : 0;
  }
  if (dense_S) w.step = max64(w.step, dense_S + most_of(dense, ch->fsdp) + dense_ns);
  if (dense_moving_S) w.exchange = max64(w.exchange, dense_moving_S + most_sum(dense_sent, dense, ch->fsdp));
  w.elems = max64(w.elems, w.step);
  return w;
}

PlanMuonSummary plan_muon_summary(const Model *md, const Choice *ch) {
  enum { MEMO = 32 }; /* the search asks again for each policy of a layout */
  static struct { const Op *ops; int nops; double ns_flops; int64_t fsdp, ep; PlanMuonSummary v; } memo[MEMO];
  static int next;
  PlanMuonSummary v = {{0, 0}, false, 0, 0};
  if (md->spec->training.optimizer != OPT_MUON) return v;
  for (int i = 0; i < MEMO; i++)
    if (memo[i].ops == md->ops && memo[i].nops == md->nops && memo[i].ns_flops == md->ns_flops &&
        memo[i].fsdp == ch->fsdp && memo[i].ep == ch->ep)
      return memo[i].v;
  Mem m = {0};
  const Placement *pl = plan_placement(&m, md, ch);
  v.work = plan_muon_work(&m, md, ch, pl);
  if (pl->muon && !pl->too_large)
    v.listed = true, v.ns_flops_max_rank = pl->ns_flops_max_rank, v.moving_expert_params = (double)pl->moving_expert_params;
  mem_free(&m);
  memo[next].ops = md->ops, memo[next].nops = md->nops, memo[next].ns_flops = md->ns_flops;
  memo[next].fsdp = ch->fsdp, memo[next].ep = ch->ep, memo[next].v = v;
  next = (next + 1) % MEMO;
  return v;
}
