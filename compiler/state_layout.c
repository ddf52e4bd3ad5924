/* state_layout.c — the optimizer tier's state block: the figures that size the plan's
 * master.fp32_shard, grads.fp32_shard and optimizer items, so that they hold exactly what the
 * program's state arena holds (emit_layout.c lays that arena out item by item in the same order).
 *
 * The parameter groups are laid out as emit_layout.c lays them (embedding, per layer dense and
 * experts, head; tensors in op order, a dense tensor at a multiple of 8 elements, routed ones
 * with El experts each; an expert group in whole-expert shards when plan_expert_per says so,
 * else every group in flat shards of plan_flat_shard). Per group the program holds, in fp32:
 * the master shard, the gradient shard and the first moment (AdamW's, or Muon's momentum) of S
 * values each, and AdamW's second moment of the values of the AdamW tensors only, compacted in
 * the order the runtime visits them (RT_FOR_PIECES): sized by the most any rank's shard holds.
 * Each buffer is rounded up to 16 values (64 bytes), as emit_layout.c's add_buf. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* A change at rank k of plan_shard_values_max's sweep: cnt values in k's shard, full ranges that
 * cover shards from k on whole (+1 from the first covered rank, -1 at the range's last rank). */
typedef struct {
  int64_t k, cnt, full;
} ShardEvent;

static int by_rank(const void *a, const void *b) {
  const ShardEvent *x = a, *y = b;
  return x->k < y->k ? -1 : x->k > y->k;
}

int64_t plan_shard_values_max(Mem *m, const int64_t *r, int n, int64_t shard, int64_t ranks) {
  if (n == 0 || shard <= 0) return 0;
  /* the ranks a range ends or starts in get its values there; those it covers whole, shard each
   * (a difference array, kept sparse: at most 3 events a range, so O(n log n), not O(ranks)) */
  ShardEvent *ev = mem_array(m, 3 * (size_t)n + 1, sizeof *ev);
  int ne = 0;
  for (int i = 0; i < n; i++) {
    int64_t a = r[2 * i], b = r[2 * i + 1];
    if (b <= a) continue;
    int64_t r0 = a / shard, r1 = (b - 1) / shard;
    if (r1 >= ranks) r1 = ranks - 1, b = ranks * shard; /* (never: the ranges lie in the group) */
    if (r0 == r1) {
      ev[ne++] = (ShardEvent){r0, b - a, 0};
      continue;
    }
    ev[ne++] = (ShardEvent){r0, (r0 + 1) * shard - a, 0};
    ev[ne++] = (ShardEvent){r1, b - r1 * shard, -1};
    ev[ne++] = (ShardEvent){r0 + 1, 0, 1};
  }
  qsort(ev, (size_t)ne, sizeof *ev, by_rank);
  /* rank k holds cnt[k] + cover(k) × shard, cover(k) the sum of full up to k. A rank without
   * events holds cover × shard of the last event rank before it (0 before the first), no more
   * than that rank: only event ranks (below ranks) can hold the most */
  int64_t most = 0, cover = 0;
  for (int i = 0; i < ne && ev[i].k < ranks;) {
    int64_t k = ev[i].k, cnt = 0;
    for (; i < ne && ev[i].k == k; i++) cnt += ev[i].cnt, cover += ev[i].full;
    if (cnt + cover * shard > most) most = cnt + cover * shard;
  }
  return most;
}

static bool muon_matrix(const Spec *s, const Param *p) {
  return s->training.optimizer == OPT_MUON && p->matmul && p->kind != PK_EMBEDDING && p->kind != PK_ROUTER &&
         p->kind != PK_HEAD;
}

/* Group index of parameter p of op o: 0 embedding, 1 + 2l layer l dense, 2 + 2l its experts,
 * 2L + 1 head (the embedding's when tied), as muon_work.c's. */
static int group_of(const Model *md, const Op *o, const Param *p) {
  if (o->layer < 0)
    return o->kind == OP_EMBED || o->kind == OP_POS_EMBED || md->spec->model.tie_embeddings ? 0 : 2 * md->nlayers + 1;
  return 1 + 2 * o->layer + (p->kind == PK_ROUTED);
}

static PlanState compute(const Model *md, const Choice *ch) {
  PlanState st = {0, 0};
  const Spec *s = md->spec;
  Mem m = {0};
  int ng = 2 * md->nlayers + 2;
  int64_t El = s->model.moe.present ? s->model.moe.experts / ch->ep : 0, per = plan_expert_per(El, ch->efsdp);
  int64_t *elems = mem_array(&m, (size_t)ng, sizeof *elems), *second = mem_array(&m, (size_t)ng, sizeof *second);
  int *nr = mem_array(&m, (size_t)ng, sizeof *nr), *cap = mem_array(&m, (size_t)ng, sizeof *cap);
  int64_t **ranges = mem_array(&m, (size_t)ng, sizeof *ranges);
  bool *any = mem_array(&m, (size_t)ng, sizeof *any);
  for (int i = 0; i < md->nops; i++)
    for (int j = 0; j < md->ops[i].nparams; j++) {
      const Op *o = &md->ops[i];
      const Param *p = &o->params[j];
      int g = group_of(md, o, p);
      bool routed = p->kind == PK_ROUTED;
      int64_t rows = routed ? p->shape[1] : p->shape[0], cols = routed ? p->shape[2] : (p->ndim > 1 ? p->shape[1] : 1);
      int64_t count = rows * cols, n = count * (routed ? (per ? per : El) : 1);
      if (!routed) elems[g] = round_up(elems[g], 8);
      any[g] = true;
      if (!muon_matrix(s, p)) {
        if (routed && per) second[g] += n; /* whole-expert shards: the same n values in every shard */
        else {
          if (nr[g] == cap[g]) {
            int c = cap[g] ? 2 * cap[g] : 16;
            int64_t *v = mem_array(&m, 2 * (size_t)c, sizeof *v);
            if (nr[g]) memcpy(v, ranges[g], 2 * (size_t)nr[g] * sizeof *v);
            ranges[g] = v, cap[g] = c;
          }
          ranges[g][2 * nr[g]] = elems[g], ranges[g][2 * nr[g] + 1] = elems[g] + n, nr[g]++;
        }
      }
      elems[g] += n;
    }
  for (int g = 0; g < ng; g++) {
    if (!any[g]) continue;
    bool experts = g > 0 && g < ng - 1 && g % 2 == 0;
    int64_t ranks = experts ? ch->efsdp : ch->fsdp;
    bool whole = experts && per;
    int64_t shard = whole ? round_up(elems[g], 8) : plan_flat_shard(elems[g], ranks);
    int64_t v = whole ? second[g] : plan_shard_values_max(&m, ranges[g], nr[g], shard, ranks);
    st.shards += round_up(shard, 16);
    st.second += round_up(v, 16);
  }
  mem_free(&m);
  return st;
}

/* A fingerprint of what compute() reads: the optimizer, tying, the experts and every parameter's
 * group, kind and shape (FNV-1a 64), so that the memo never answers for another model. */
static uint64_t fingerprint(const Model *md) {
  uint64_t h = 1469598103934665603ull;
#define MIX(x) (h = (h ^ (uint64_t)(x)) * 1099511628211ull)
  MIX(md->spec->training.optimizer), MIX(md->spec->model.tie_embeddings), MIX(md->nlayers);
  MIX(md->spec->model.moe.present ? md->spec->model.moe.experts : 0);
  for (int i = 0; i < md->nops; i++)
    for (int j = 0; j < md->ops[i].nparams; j++) {
      const Param *p = &md->ops[i].params[j];
      MIX(group_of(md, &md->ops[i], p)), MIX(p->kind), MIX(p->matmul), MIX(p->ndim);
      for (int d = 0; d < p->ndim; d++) MIX(p->shape[d]);
    }
#undef MIX
  return h;
}

PlanState plan_state(const Model *md, const Choice *ch) {
  enum { MEMO = 32 }; /* the search asks again for each policy of a layout */
  static struct { uint64_t key; int64_t fsdp, ep; PlanState v; } memo[MEMO];
  static int next;
  /* the fingerprint of the model asked last, kept while the model is the same (one compile asks
   * for every candidate of its search) */
  static struct { const Model *md; const Op *ops; const Spec *spec; int nops, opt, tie; int64_t params; uint64_t key; } last;
  const int opt = (int)md->spec->training.optimizer, tie = md->spec->model.tie_embeddings;
  if (last.md != md || last.ops != md->ops || last.spec != md->spec || last.nops != md->nops ||
      last.params != md->params_total || last.opt != opt || last.tie != tie)
    last.md = md, last.ops = md->ops, last.spec = md->spec, last.nops = md->nops, last.params = md->params_total,
    last.opt = opt, last.tie = tie, last.key = fingerprint(md);
  uint64_t key = last.key;
  for (int i = 0; i < MEMO; i++)
    if (memo[i].key == key && memo[i].fsdp == ch->fsdp && memo[i].ep == ch->ep) return memo[i].v;
  PlanState v = compute(md, ch);
  memo[next].key = key, memo[next].fsdp = ch->fsdp, memo[next].ep = ch->ep, memo[next].v = v;
  next = (next + 1) % MEMO;
  return v;
}
