/* search.c — the planner's search: every layout (fsdp, ep inside a node or across whole nodes)
 * × micro-batch size × checkpoint policy × activation offload × optimizer-state tier ×
 * reshard policy (per group: all but the routed experts, the routed experts) × MoE dispatch
 * (those compile emits, plan_dispatch_emitted, or the pin) × prefetch depth the spec's pins allow;
 * those over a memory budget are rejected with the tier and the overage; the fastest predicted step wins, ties going to
 * the first in enumeration order (deterministic). Each candidate is priced before its memory is
 * packed, and packed only when it could change what is returned (cannot_matter, least_over):
 * the result is the one an exhaustive search gives (tests/plans.sh). When nothing fits, the advice is computed
 * by searching again with more nodes and with shorter sequences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mtc.h"

enum { MAX_ALTS = 12, CP_SLOTS = 8 };

typedef struct {
  Candidate best;    /* items are not kept: plan_search rebuilds the winner's */
  bool feasible, any;
  Candidate closest; /* the closest misfit (closer), when nothing fits */
  Candidate *alts;
  int nalts, n, nfit;         /* candidates evaluated, and how many fit */
  Candidate in_node, across; /* the fastest fitting with ep <= / > gpus_per_node */
  bool has_in_node, has_across;
  Candidate by_cp[CP_SLOTS]; /* per cp tried (ascending): the fastest fitting, else the closest */
  int nby_cp;
  bool cp_ends;              /* the advice's searches with more nodes or shorter sequences: cp 1
                              * and the largest cp allowed only (memory falls with cp) */
  bool coarse;               /* the advice's searches: one reshard policy for both groups and the
                              * flat all-to-all (neither the split nor the dispatch changes what
                              * blocks a fit much, and they would spend its candidate budget) */
  double cutoff;             /* > 0: only a plan faster than this matters (the pin note's search):
                              * slower candidates are not packed, alternatives not kept */
  int npacked;               /* candidates whose memory was packed (the rest priced only) */
  bool fast;                 /* candidates whose state alone overflows a tier are not packed
                              * (hopeless): exact unless the closest misfit or a rejected
                              * alternative is wanted, when search_once searches again without */
  bool fit_only;             /* only whether something fits, and the closest misfit (the advice's
                              * tries of more nodes or shorter sequences): nothing is priced, and
                              * once one candidate of a micro-batch size fits the rest are counted */
  int mb_fit;                /* nfit when this micro-batch size began */
  int nhopeless;
  double hopeless_over;      /* the least of their overages' lower bounds */
  CostMemo memo;             /* pricing's reuse between candidates (search_once frees it) */
  Choice *unpacked;          /* this micro-batch size's candidates skipped unpacked (malloc'd) */
  int nunpacked, capunpacked;
  bool unpacked_over;        /* out of memory for the list: larger sizes are tried anyway */
} Found;



/* The bytes by which a packed candidate overflows its tiers, all of them together. */
static int64_t total_over(const Candidate *c) {
  int64_t sum = 0;
  for (int t = 0; t < TIER__COUNT; t++)
    if (c->arena[t] > c->capacity[t]) sum += c->arena[t] - c->capacity[t];
  return sum;
}

/* Whether packed misfit a is closer to fitting than b: a smaller overage of all tiers together
 * (total_over; at least over_bytes, so a lower bound of over_bytes bounds it too), and between
 * equal ones, of its fullest tier. */
static bool closer(const Candidate *a, const Candidate *b) {
  int64_t ta = total_over(a), tb = total_over(b);
  return ta != tb ? ta < tb : a->over_bytes < b->over_bytes;
}

/* Candidates worth showing next to the best: fitting ones by step time, then rejected ones
 * by overage (closer). */
static bool better_alt(const Candidate *a, const Candidate *b) {
  if (a->fits != b->fits) return a->fits;
  if (a->fits) return a->cost.step < b->cost.step;
  return closer(a, b);
}

/* The same decisions but for the prefetch depth: alternatives list one of them. */
static bool same_but_depth(const Choice *a, const Choice *b) {
  return a->fsdp == b->fsdp && a->ep == b->ep && plan_cp(a) == plan_cp(b) && a->ac == b->ac && a->offload == b->offload &&
         a->opt_tier == b->opt_tier && a->opt_on_host == b->opt_on_host &&
         a->micro_batch == b->micro_batch && a->reshard == b->reshard &&
         a->reshard_experts == b->reshard_experts && a->dispatch == b->dispatch;
}

static void keep_alt(Found *f, const Candidate *c) {
  Candidate x = *c;
  x.items = NULL, x.nitems = 0;
  for (int k = 0; k < f->nalts; k++)
    if (same_but_depth(&f->alts[k].ch, &x.ch)) {
      if (!better_alt(&x, &f->alts[k])) return;
      for (; k + 1 < f->nalts; k++) f->alts[k] = f->alts[k + 1]; /* drop it; x goes in below */
      f->nalts--;
      break;
    }
  if (f->feasible && same_but_depth(&f->best.ch, &x.ch)) return; /* the winner's own variant */
  int i = f->nalts;
  if (i == MAX_ALTS) {
    if (!better_alt(&x, &f->alts[MAX_ALTS - 1])) return;
    i = MAX_ALTS - 1;
  } else {
    f->nalts++;
  }
  f->alts[i] = x;
  for (; i > 0 && better_alt(&f->alts[i], &f->alts[i - 1]); i--) {
    Candidate t = f->alts[i];
    f->alts[i] = f->alts[i - 1], f->alts[i - 1] = t;
  }
}

static void consider(const Model *md, Candidate c, Found *f);

/* The slot of ch's cp in f->by_cp (f->nby_cp when it has none yet). */
static int cp_slot(const Found *f, const Choice *ch) {
  int i = 0;
  while (i < f->nby_cp && plan_cp(&f->by_cp[i].ch) != plan_cp(ch)) i++;
  return i;
}

/* Whether a priced candidate c cannot change what the search returns, whether it fits or not:
 * not the best, not one of the alternatives kept, not the best of its class (EP inside a node or
 * across nodes). Costs depend only on the choice, so this is known before packing its memory. */
static bool cannot_matter(const Found *f, const Candidate *c, int64_t gpn) {
  if (f->cutoff > 0) return c->cost.step >= f->cutoff || (f->feasible && c->cost.step >= f->best.cost.step);
  bool across = c->ch.ep > gpn;
  if (across ? !f->has_across : !f->has_in_node) return false;
  int i = cp_slot(f, &c->ch); /* the fastest of its cp (mtc explain sets each cp's side by side) */
  if (i == f->nby_cp || !f->by_cp[i].fits || c->cost.step < f->by_cp[i].cost.step) return false;
  if (c->cost.step < (across ? f->across : f->in_node).cost.step) return false;
  /* the alternatives only get faster: a full list of fitting ones keeps nothing slower */
  return f->nalts == MAX_ALTS && f->alts[MAX_ALTS - 1].fits && c->cost.step >= f->alts[MAX_ALTS - 1].cost.step;
}

/* Whether a candidate that cannot fit, its overage at least lo (plan_over_bound), cannot change
 * what the search returns: not closer than the closest misfit, not its cp's representative, not
 * a rejected alternative kept (consider's rules for a rejected candidate). */
static bool misfit_cannot_matter(const Found *f, const Choice *ch, int64_t lo) {
  /* (lo bounds the candidate's total_over too; an equal one may still be closer by its fullest tier) */
  if (!f->any || lo <= total_over(&f->closest)) return false;
  int i = cp_slot(f, ch);
  if (i == f->nby_cp ? i < CP_SLOTS : !f->by_cp[i].fits && lo <= total_over(&f->by_cp[i])) return false;
  if (f->cutoff > 0) return true;
  return f->nalts == MAX_ALTS && (f->alts[MAX_ALTS - 1].fits || lo > total_over(&f->alts[MAX_ALTS - 1]));
}

/* The least overage ch can have, from bytes every arena of a tier holds, known without building its
 * items (plan.c): the state block in the optimizer's tier (master, gradient and first-moment
 * shards, at least 4 B each per parameter / fsdp; AdamW's second moments too when the optimizer
 * is AdamW), its host copy when the state is in HBM, and the reserves. > 0: ch cannot fit
 * (hopeless), and its over_bytes is at least this. */
static double least_over(const Model *md, const Choice *ch) {
  const Spec *s = md->spec;
  const ReserveSpec *r = &s->cluster.reserve;
  double per = (double)md->params_total / (double)ch->fsdp;
  double state = (s->training.optimizer == OPT_MUON ? 12 : 16) * per;
  double hbm = (double)r->cuda_context + (double)r->nccl_buffers + (double)r->cublas_workspace;
  double host = (double)r->host;
  if (ch->opt_tier == TIER_HBM) hbm += state, host += state; /* (the host mirror: 3 shards + moments) */
  else host += state;
  return fmax(hbm - s->cluster.gpu.hbm, host - s->cluster.host.memory);
}

/* Counts a candidate not packed because it cannot matter, and remembers it for the micro-batch
 * loop's fit test. */
static void skip_unpacked(Found *f, const Choice *ch) {
  f->n++;
  if (f->nunpacked == f->capunpacked) {
    int cap = f->capunpacked ? 2 * f->capunpacked : 256;
    Choice *u = realloc(f->unpacked, sizeof *u * (size_t)cap);
    if (u) f->unpacked = u, f->capunpacked = cap;
  }
  if (f->nunpacked < f->capunpacked) f->unpacked[f->nunpacked++] = *ch;
  else f->unpacked_over = true;
}

/* The candidate ch with each MoE dispatch in dispatches (a bit per DispatchPolicy): they hold
 * the same memory, so it is packed once, and only when some dispatch's cost could matter
 * (cannot_matter); the others are counted, and remembered for the micro-batch loop's fit test. */
static void evaluate(Mem *scratch, const Model *md, const Choice *ch, unsigned dispatches, Found *f) {
  Candidate c = {.ch = *ch, .quick = true};
  bool packed = false;
  for (int dp = DISPATCH_FLAT; dp <= DISPATCH_HIERARCHICAL; dp++)
    if (dispatches & 1u << dp) {
      c.ch.dispatch = (DispatchPolicy)dp;
      if (f->fit_only && f->nfit > f->mb_fit) {
        f->n++;
        return; /* this size fits already: the rest only counted */
      }
      double lo = !packed && f->fast ? least_over(md, &c.ch) : 0;
      if (lo > 0) { /* hopeless */
        f->n++, f->nhopeless++;
        if (f->nhopeless == 1 || lo < f->hopeless_over) f->hopeless_over = lo;
        return; /* (a rejected candidate: listed once) */
      }
      if (!f->fit_only && !packed) {
        /* bounds first, without the Muon placement: the step's (cannot_matter only grows with the
         * step) and, at the last dispatch (where skipping ends the candidate as packing it would),
         * the overage's */
        f->memo.bound = true;
        cost_step_memo(md, &c, &f->memo);
        f->memo.bound = false;
        if (cannot_matter(f, &c, md->spec->cluster.gpus_per_node)) {
          skip_unpacked(f, &c.ch);
          continue;
        }
        for (int level = 1; level <= 2 && !(dispatches >> (dp + 1)); level++) { /* (Candidate.bound) */
          mem_reset(scratch);
          c.bound = level;
          plan_items(scratch, md, &c);
          int64_t least = plan_over_bound(scratch, md, &c);
          c.bound = 0, c.items = NULL, c.nitems = 0;
          if (least > 0 && misfit_cannot_matter(f, &c.ch, least)) {
            f->n++;
            return;
          }
        }
      }
      if (!f->fit_only) cost_step_memo(md, &c, &f->memo);
      if (!f->fit_only && !packed && cannot_matter(f, &c, md->spec->cluster.gpus_per_node)) {
        skip_unpacked(f, &c.ch);
        continue;
      }
      if (!packed) {
        Cost k = c.cost;
        mem_reset(scratch);
        plan_items(scratch, md, &c);
        int64_t least = plan_over_bound(scratch, md, &c);
        if (least > 0 && misfit_cannot_matter(f, &c.ch, least)) { /* rejected whatever its packing: listed once */
          f->n++;
          return;
        }
        plan_pack(scratch, md, &c);
        c.items = NULL, c.nitems = 0, c.cost = k;
        packed = true;
        f->npacked++;
      }
      consider(md, c, f);
      if (!c.fits) return; /* a rejected candidate is listed once */
    }
}

/* After a micro-batch size whose packed candidates all failed to fit: whether one it skipped
 * unpacked fits (then larger sizes are still tried, as if it had been packed). */
static bool unpacked_fits(Mem *scratch, const Model *md, Found *f) {
  if (f->unpacked_over) return true; /* (out of memory) keep going: never fewer candidates */
  for (int i = 0; i < f->nunpacked; i++) {
    Candidate c = {.ch = f->unpacked[i], .quick = true};
    if (f->fast && least_over(md, &c.ch) > 0) continue;
    mem_reset(scratch);
    plan_items(scratch, md, &c);
    if (plan_over_bound(scratch, md, &c) > 0) continue; /* (cannot fit) */
    plan_pack(scratch, md, &c);
    f->npacked++;
    if (c.fits) return true;
  }
  return false;
}

/* Keeps c as its cp's representative when it is the fastest fitting, or the closest to fitting
 * while none fits (c priced when it fits). */
static void keep_by_cp(Found *f, const Candidate *c) {
  int i = cp_slot(f, &c->ch);
  if (i == f->nby_cp) {
    if (i == CP_SLOTS) return;
    f->nby_cp++;
  } else {
    const Candidate *o = &f->by_cp[i];
    bool better = c->fits ? !o->fits || c->cost.step < o->cost.step : !o->fits && closer(c, o);
    if (!better) return;
  }
  f->by_cp[i] = *c;
  f->by_cp[i].items = NULL, f->by_cp[i].nitems = 0;
  if (!c->fits) f->by_cp[i].cost = (Cost){0};
}

static void consider(const Model *md, Candidate c, Found *f) {
  const Choice *ch = &c.ch;
  f->n++;
  f->nfit += c.fits;
  keep_by_cp(f, &c);
  if (c.fits) { /* priced by evaluate */
    bool across = ch->ep > md->spec->cluster.gpus_per_node;
    Candidate *cls = across ? &f->across : &f->in_node;
    bool *has = across ? &f->has_across : &f->has_in_node;
    if (!*has || c.cost.step < cls->cost.step) *cls = c, *has = true;
    if (!f->feasible || c.cost.step < f->best.cost.step) {
      if (f->feasible) keep_alt(f, &f->best);
      f->best = c, f->feasible = true;
      return;
    }
  } else if (!f->any || closer(&c, &f->closest)) {
    c.cost = (Cost){0}; /* a rejected candidate has no step */
    f->closest = c, f->any = true;
  }
  if (!c.fits) c.cost = (Cost){0};
  if (f->cutoff <= 0) keep_alt(f, &c);
}

/* Whether the optimizer's state tier and step place agree with the spec's pins. */
static bool pinned_optimizer(const PlanSpec *pin, Tier tier, bool host_step) {
  if (pin->optimizer_tier == PIN_TIER_HBM && tier != TIER_HBM) return false;
  if (pin->optimizer_tier == PIN_TIER_HOST && tier != TIER_HOST) return false;
  if (pin->optimizer_step == PIN_STEP_GPU && host_step) return false;
  if (pin->optimizer_step == PIN_STEP_HOST && !host_step) return false;
  return true;
}

/* Whether the spec wrote training.micro_batch other than auto (in the file or by --set): then it
 * is pinned. */
static bool micro_batch_pinned(const Spec *s) { return !s->training.micro_batch_searched; }

/* Divisors of n, ascending, into d (capacity cap); returns how many. */
static int64_t divisors(int64_t n, int64_t *d, int64_t cap) {
  int64_t k = 0;
  for (int64_t x = 1; x * x <= n && k < cap; x++)
    if (n % x == 0) d[k++] = x;
  for (int64_t i = k - 1; i >= 0 && k < cap; i--)
    if (d[i] * d[i] != n) d[k++] = n / d[i];
  return k;
}

/* Whether ep ranks make an EP group the program and the cost model lay out: ep consecutive
 * ranks inside one node (ep divides gpus_per_node) or whole nodes side by side (a multiple of
 * it); ep divides the experts and the FSDP group. */
static bool ep_allowed(const Spec *s, int64_t ep, int64_t fsdp) {
  int64_t gpn = s->cluster.gpus_per_node, experts = s->model.moe.present ? s->model.moe.experts : 1;
  return experts % ep == 0 && fsdp % ep == 0 && (gpn % ep == 0 || ep % gpn == 0);
}

/* The largest context-parallel degree the search tries (pinned, plan.cp may be any divisor of
 * fsdp that check.c accepts). */
enum { CP_MAX = 64 };

/* Whether cp ranks may split each sequence of the spec in a layout with an FSDP group of fsdp:
 * cp divides fsdp, seq_len splits in 2 cp chunks, the W / cp sequences read at a time divide
 * global_batch (and with a pinned micro_batch, micro_batch x W / cp does); the search tries
 * powers of two up to CP_MAX, or the pin; cp > 1 only where the program implements it. */
static bool cp_allowed(const Spec *s, int64_t cp, int64_t fsdp, int64_t W) {
  const int64_t G = s->training.global_batch;
  if (s->plan.cp ? cp != s->plan.cp : (cp & (cp - 1)) != 0 || cp > CP_MAX) return false;
  if (fsdp % cp != 0 || (cp > 1 && s->training.seq_len % (2 * cp) != 0) || G % (W / cp) != 0) return false;
  if (cp > 1 && !s->plan.cp && em_cp_unsupported(s)) return false; /* (a pin is planned; compile writes no program) */
  return !micro_batch_pinned(s) || G % (s->training.micro_batch * (W / cp)) == 0;
}

/* One pass of the search over md's spec. */
static void search_pass(const Model *md, Found *f) {
  const Spec *s = md->spec;
  const PlanSpec *pin = &s->plan;
  int64_t gpn = s->cluster.gpus_per_node, W = s->cluster.nodes * gpn;
  int64_t G = s->training.global_batch;
  /* no layout (reported by the caller) unless some cp lets the W / cp data ranks divide the batch */
  bool any = false;
  for (int64_t cp = pin->cp ? pin->cp : 1; cp <= W && !any; cp = pin->cp ? W + 1 : 2 * cp)
    any = W % cp == 0 && cp_allowed(s, cp, W, W);
  if (!any) return;
  static const CheckpointPolicy acs[] = {AC_NONE, AC_SELECTIVE, AC_FULL};
  static const struct { Tier tier; bool host_step; } opts[] = {
      {TIER_HBM, false}, {TIER_HOST, false}, {TIER_HOST, true}};
  Mem scratch = {0}; /* reused by every candidate */
  int64_t *divs = malloc(sizeof(int64_t) * 3 * 4096); /* W <= 12.8M has < 4096 divisors */
  if (!divs) return;
  int64_t *mbs = divs + 4096, *eps = divs + 2 * 4096;
  int64_t nd = divisors(W, divs, 4096), nmb = 1;
  int64_t nep = divisors(s->model.moe.present ? s->model.moe.experts : 1, eps, 4096);
  for (int64_t di = 0; di < nd; di++) {
    int64_t fsdp = divs[di];
    if (pin->fsdp && fsdp != pin->fsdp) continue;
    if (pin->dp_replicate && W / fsdp != pin->dp_replicate) continue;
    /* cp ascending: a larger cp only saves memory (every activation / cp) at the price of the K/V
     * exchange and, for the same tokens per micro-batch, nothing else: so past the first cp at
     * which something fits, one more is tried (explain sets them side by side) and no further */
    int64_t fit_at = 0, fit0 = f->nfit;
    for (int64_t cp = pin->cp ? pin->cp : 1; cp <= fsdp && (!fit_at || cp <= 2 * fit_at);
         cp = pin->cp ? fsdp + 1 : 2 * cp) {
    if (!fit_at && cp > 1 && f->nfit > fit0) fit_at = cp / 2;
    if (fit_at && cp > 2 * fit_at) break;
    if (!cp_allowed(s, cp, fsdp, W)) continue;
    if (f->cp_ends && cp > 1 && cp_allowed(s, 2 * cp, fsdp, W)) continue;
    /* W / cp data ranks: each reads G / (W / cp) sequences a step, in micro-batches */
    if (micro_batch_pinned(s)) mbs[0] = s->training.micro_batch;
    else nmb = divisors(G / (W / cp), mbs, 4096);
    for (int64_t ei = 0; ei < nep; ei++) {
      int64_t ep = eps[ei];
      if (!ep_allowed(s, ep, fsdp) || (pin->ep && ep != pin->ep)) continue;
      /* a pinned hierarchical all-to-all: only EP groups across nodes (inside one it is the flat
       * exchange, and the pin would have no effect) */
      if (pin->moe_dispatch == DISPATCH_HIERARCHICAL && ep <= gpn) continue;
      /* micro-batch sizes ascending: memory only grows with the size, so once nothing fits at
       * one size, nothing fits at a larger one (for this fsdp and ep) */
      for (int64_t mi = 0, fit = f->nfit, more = 1; mi < nmb && more; mi++) {
        fit = f->mb_fit = f->nfit;
        f->nunpacked = 0, f->unpacked_over = false;
        for (int a = 0; a < 3; a++) {
          if (pin->activation_checkpoint != AC_AUTO && acs[a] != pin->activation_checkpoint) continue;
          for (int off = OFF_NONE; off <= OFF_NVME; off++) {
            if (pin->offload_activations != OFF_AUTO && off != (int)pin->offload_activations) continue;
            if (off != OFF_NONE && acs[a] != AC_FULL) continue; /* offload moves layer boundaries */
            if (off == OFF_NVME && !s->cluster.nvme.present) continue;
            for (int r = RESHARD_EVERY_MICRO_BATCH; r <= RESHARD_AFTER_STEP; r++) {
              if (pin->reshard != RESHARD_AUTO && r != (int)pin->reshard) continue;
              for (int re = RESHARD_EVERY_MICRO_BATCH; re <= RESHARD_AFTER_STEP; re++) {
              /* the experts' policy: pinned, else as the rest's when that is pinned (or the model
               * has no experts), else searched */
              ReshardPolicy pe = pin->reshard_experts != RESHARD_AUTO ? pin->reshard_experts
                                 : pin->reshard != RESHARD_AUTO || !s->model.moe.present ? (ReshardPolicy)r
                                                                                         : RESHARD_AUTO;
              if (pe != RESHARD_AUTO && re != (int)pe) continue;
              if (f->coarse && re != r) continue;
              /* experts not sharded (efsdp 1) are never gathered: their policy changes nothing
               * but where they sit, so only the pair with the rest's policy is tried */
              if (fsdp / ep == 1 && pe == RESHARD_AUTO && re != r) continue;
              for (int o = 0; o < 3; o++) {
                if (!pinned_optimizer(pin, opts[o].tier, opts[o].host_step)) continue;
                int d0 = pin->prefetch ? (int)pin->prefetch : 1, d1 = pin->prefetch ? (int)pin->prefetch : 2;
                for (int depth = d0; depth <= d1; depth++) {
                  if (r == RESHARD_AFTER_STEP && re == RESHARD_AFTER_STEP && depth > 1)
                    continue; /* every layer stays gathered */
                  /* hierarchical only where the EP group spans nodes (inside one it is the flat
                   * exchange) and where the program emits it */
                  unsigned dispatches = 1u << DISPATCH_FLAT;
                  if (ep > gpn && plan_dispatch_emitted(DISPATCH_HIERARCHICAL) && !f->coarse) {
                    if (pin->moe_dispatch != DISPATCH_FLAT) dispatches |= 1u << DISPATCH_HIERARCHICAL;
                    if (pin->moe_dispatch == DISPATCH_HIERARCHICAL) dispatches = 1u << DISPATCH_HIERARCHICAL;
                  }
                  Choice ch = {.fsdp = fsdp, .ep = ep, .dp_replicate = W / fsdp, .efsdp = fsdp / ep,
                               .micro_batch = mbs[mi], .accum = G / (mbs[mi] * (W / cp)), .reshard = (ReshardPolicy)r,
                               .reshard_experts = (ReshardPolicy)re, .dispatch = DISPATCH_FLAT,
                               .ac = acs[a], .offload = (OffloadPolicy)off, .opt_tier = opts[o].tier,
                               .opt_on_host = opts[o].host_step, .prefetch = depth, .cp = cp};
                  evaluate(&scratch, md, &ch, dispatches, f);
                }
              }
              }
            }
          }
        }
        more = mi + 1 < nmb && (f->nfit > fit || unpacked_fits(&scratch, md, f)); /* (no larger size: not asked) */
      }
    }
    }
  }
  free(divs);
  free(f->unpacked);
  f->unpacked = NULL, f->nunpacked = f->capunpacked = 0;
  mem_free(&scratch);
  cost_memo_free(&f->memo);
}

/* The search over md's spec: a fast pass (hopeless candidates not packed), again exactly when
 * what it skipped could show: as the closest misfit (nothing fits) or a rejected alternative
 * (fewer than MAX_ALTS fitting ones kept), unless their overages' lower bound already exceeds
 * those shown. The pin note's search (cutoff) and the advice's (coarse) show no alternatives. */
static void search_once(const Model *md, Found *f) {
  Found start = *f;
  f->fast = true;
  search_pass(md, f);
  if (!f->nhopeless) return;
  bool need_alts = f->cutoff <= 0 && !f->coarse;
  bool alts_ok = !need_alts || (f->nalts == MAX_ALTS && (f->alts[MAX_ALTS - 1].fits ||
                                                          f->hopeless_over > (double)total_over(&f->alts[MAX_ALTS - 1])));
  bool closest_ok = f->feasible || f->cutoff > 0 || (f->any && f->hopeless_over > (double)total_over(&f->closest));
  if (alts_ok && closest_ok) return;
  int packed = f->npacked;
  *f = start;
  f->npacked = packed;
  search_pass(md, f);
}

/* The advice searches stop after this many candidates in all (a deterministic bound, so an
 * enormous spec cannot make `mtc plan` take minutes). */
enum { ADVICE_BUDGET = 20000 };

/* The search over md with spec u instead of md's (u changes values that do not change the
 * model graph); adds the candidates it tried to *spent. coarse: see Found. */
static Found search_variant(Mem *m, const Model *md, const Spec *u, int *spent, bool coarse, double cutoff,
                            bool fit_only) {
  Model *copy = mem_alloc(m, sizeof *copy);
  *copy = *md, copy->spec = u;
  Found f = {.coarse = coarse, .cutoff = cutoff, .fit_only = fit_only, .cp_ends = fit_only};
  f.alts = mem_array(m, MAX_ALTS, sizeof *f.alts);
  search_once(copy, &f);
  *spent += f.n;
  return f;
}

/* The search with another node count and sequence length, for "what would make it fit": only
 * whether something fits and, if not, the closest misfit (fit_only; cp 1 and the largest cp). */
static Found search_with(Mem *m, const Model *md, int64_t nodes, int64_t seq, int *spent) {
  Spec *s = mem_alloc(m, sizeof *s);
  *s = *md->spec;
  s->cluster.nodes = nodes;
  s->training.seq_len = seq;
  s->plan.fsdp = s->plan.dp_replicate = 0; /* pins that name the old world size are dropped */
  if (s->plan.ep && !ep_allowed(s, s->plan.ep, nodes * s->cluster.gpus_per_node)) s->plan.ep = 0;
  return search_variant(m, md, s, spent, true, 0, true);
}

/* Sequences per step that every rank must divide: micro_batch × GPUs when micro_batch is
 * pinned, else GPUs (micro_batch 1 is always tried). */
static int64_t batch_quantum(const Spec *s, int64_t nodes) {
  return (micro_batch_pinned(s) ? s->training.micro_batch : 1) * nodes * s->cluster.gpus_per_node;
}

/* The smallest cp (a power of two up to CP_MAX, or the pin) with which the nodes' GPUs read the
 * batch in whole micro-batches: global_batch a multiple of batch_quantum / cp, seq_len of 2 cp;
 * 0 when none. */
static int64_t cp_for_batch(const Spec *s, int64_t nodes) {
  int64_t q = batch_quantum(s, nodes), G = s->training.global_batch;
  for (int64_t cp = s->plan.cp ? s->plan.cp : 1; cp <= CP_MAX; cp = s->plan.cp ? CP_MAX + 1 : 2 * cp)
    if (q % cp == 0 && G % (q / cp) == 0 && (cp == 1 || s->training.seq_len % (2 * cp) == 0)) return cp;
  return 0;
}

/* "hbm over by 3.2 GiB" for the closest candidate of a search that found nothing. */
static const char *why_not(Mem *m, const Found *g) {
  if (!g->any) return "no layout";
  char b[32];
  units_fmt_bytes_bin(b, sizeof b, (double)g->closest.over_bytes);
  return mem_printf(m, "%s over by %s", plan_tier_name(g->closest.over_tier), b);
}

/* The plan keys the search decides, all set to auto (searched). */
static void unpin_plan(PlanSpec *p) {
  p->activation_checkpoint = AC_AUTO, p->offload_activations = OFF_AUTO;
  p->optimizer_tier = PIN_TIER_AUTO, p->optimizer_step = PIN_STEP_AUTO, p->prefetch = 0;
  p->fsdp = p->ep = p->dp_replicate = p->cp = 0;
  p->reshard = RESHARD_AUTO, p->reshard_experts = RESHARD_AUTO, p->moe_dispatch = DISPATCH_AUTO;
}

/* Whether p pins any key the search decides. */
static bool plan_pinned(const PlanSpec *p) {
  return p->activation_checkpoint != AC_AUTO || p->offload_activations != OFF_AUTO || p->fsdp || p->ep ||
         p->dp_replicate || p->reshard != RESHARD_AUTO || p->reshard_experts != RESHARD_AUTO ||
         p->moe_dispatch != DISPATCH_AUTO || p->optimizer_tier != PIN_TIER_AUTO || p->optimizer_step != PIN_STEP_AUTO ||
         p->prefetch || p->cp;
}

/* What would make an infeasible spec fit, from searches really run: more nodes (where the
 * batch divides), shorter sequences, no pins. When nothing fits, says what each try came to
 * and what kept larger node counts from being tried, with the --set that would allow them. */
static const char *advise(Mem *m, const Model *md, bool layouts) {
  const Spec *s = md->spec;
  int64_t N = s->cluster.nodes, G = s->training.global_batch;
  if (!layouts && G % batch_quantum(s, N) != 0) /* (with layouts, a cp > 1 made the batch divide) */
    return mem_printf(m, "global_batch %lld%s is not a multiple of micro_batch x GPUs = %lld x %lld (nor of it / cp "
                      "for a cp that splits the sequences); expected %s %s (the nearest that are), or another "
                      "node count", (long long)G,
                      s->training.global_batch_tokens ? mem_printf(m, " (training.global_batch_tokens %lld)",
                                                                   (long long)s->training.global_batch_tokens) : "",
                      (long long)(micro_batch_pinned(s) ? s->training.micro_batch : 1),
                      (long long)(N * s->cluster.gpus_per_node), spec_batch_key(s),
                      spec_batch_nearest(m, s, batch_quantum(s, N)));
  char *out = "", *tried = "", *blocked = "";
  int spent = 0;
  for (int64_t k = 2; k <= 64 && spent < ADVICE_BUDGET; k *= 2) { /* more nodes, if the batch divides */
    int64_t nodes = N * k, q = batch_quantum(s, nodes);
    if (!cp_for_batch(s, nodes)) {
      if (!blocked[0]) /* the first node count the batch keeps out, and how to let it in */
        blocked = mem_printf(m, "%lld nodes and more were not tried: global_batch %lld is not a multiple of %s"
                             "GPUs / cp = %lld / cp for any cp that splits the sequences (--set "
                             "%s=%lld would allow %lld nodes)",
                             (long long)nodes, (long long)G, micro_batch_pinned(s) ? "micro_batch x " : "",
                             (long long)q, spec_batch_key(s),
                             (long long)((G + q - 1) / q * q * (s->training.global_batch_tokens ? s->training.seq_len : 1)),
                             (long long)nodes);
      continue;
    }
    Found g = search_with(m, md, nodes, s->training.seq_len, &spent);
    if (g.feasible) {
      out = mem_printf(m, "it fits on %lld nodes%s (--set cluster.nodes=%lld)", (long long)nodes,
                       plan_cp(&g.best.ch) > 1 ? mem_printf(m, " with cp %lld", (long long)g.best.ch.cp) : "",
                       (long long)nodes);
      break;
    }
    tried = mem_printf(m, "%s%s%lld nodes: %s", tried, tried[0] ? ", " : "", (long long)nodes, why_not(m, &g));
  }
  for (int64_t seq = s->training.seq_len / 2; seq >= 128 && spent < ADVICE_BUDGET; seq /= 2) {
    Found g = search_with(m, md, N, seq, &spent);
    if (g.feasible) {
      out = mem_printf(m, "%s%sit fits at seq_len %lld%s (--set training.seq_len=%lld)", out,
                       out[0] ? "; " : "", (long long)seq,
                       plan_cp(&g.best.ch) > 1 ? mem_printf(m, " with cp %lld", (long long)g.best.ch.cp) : "",
                       (long long)seq);
      break;
    }
    if (seq < 128 * 2 || spent >= ADVICE_BUDGET) /* the last one tried */
      tried = mem_printf(m, "%s%sseq_len %lld down to %lld (at %lld: %s)", tried, tried[0] ? ", " : "",
                         (long long)(s->training.seq_len / 2), (long long)seq, (long long)seq, why_not(m, &g));
  }
  const PlanSpec *p = &s->plan;
  if (plan_pinned(p)) {
    Spec *u = mem_alloc(m, sizeof *u);
    *u = *s;
    unpin_plan(&u->plan);
    Found g = search_variant(m, md, u, &spent, true, 0, false);
    if (g.feasible)
      out = mem_printf(m, "%s%sunpinned, the search finds fsdp %lld, ep %lld%s, %s checkpointing%s", out,
                       out[0] ? "; " : "", (long long)g.best.ch.fsdp, (long long)g.best.ch.ep,
                       plan_cp(&g.best.ch) > 1 ? mem_printf(m, ", cp %lld (each sequence split over %lld ranks: "
                                                            "--set plan.cp=%lld)", (long long)g.best.ch.cp,
                                                            (long long)g.best.ch.cp, (long long)g.best.ch.cp) : "",
                       plan_ac_words(g.best.ch.ac), g.best.ch.offload == OFF_NONE ? "" :
                       g.best.ch.offload == OFF_HOST ? " with host offload" : " with NVMe offload");
    else
      tried = mem_printf(m, "%s%swithout the plan pins: %s", tried, tried[0] ? ", " : "", why_not(m, &g));
  }
  if (out[0]) return out;
  return mem_printf(m, "no tried change fits (tried %s%s%s%s)", tried[0] ? tried : "nothing",
                    blocked[0] ? "; " : "", blocked,
                    spent >= ADVICE_BUDGET ? "; the advice search stopped at its budget of 20000 candidates" : "");
}

/* "training.micro_batch 1 (europa-1t.yaml:31:16; the search picks 4)" for one pinned key whose
 * searched value differs, appended to list; pinned and chosen as text. */
static char *pin_diff(Mem *m, char *list, const Spec *s, const char *key, const char *pinned, const char *chosen) {
  if (strcmp(pinned, chosen) == 0) return list;
  Loc l = spec_loc(s, key);
  return mem_printf(m, "%s%s%s %s (%s:%d:%d; the search picks %s)", list, list[0] ? ", " : "", key, pinned,
                    l.src ? l.src->name : "?", l.line + 1, l.col + 1, chosen);
}

/* A spec that pins searched keys (training.micro_batch, plan.*) to values the search would beat
 * by more than 10% in tokens/s: searches again with every such key auto; returns a note naming
 * the pinned keys whose searched value differs, with both figures, or NULL. */
static const char *pin_note(Mem *m, const Model *md, const Candidate *best) {
  const Spec *s = md->spec;
  const PlanSpec *p = &s->plan;
  if (!plan_pinned(p) && s->training.micro_batch_searched) return NULL;
  if (!plan_pinned(p)) { /* only micro_batch: nothing to gain when it is the only size the batch allows */
    int64_t W = s->cluster.nodes * s->cluster.gpus_per_node / plan_cp(&best->ch), one[2];
    if (s->training.global_batch % W == 0 && divisors(s->training.global_batch / W, one, 2) == 1) return NULL;
  }
  Spec *u = mem_alloc(m, sizeof *u);
  *u = *s;
  unpin_plan(&u->plan);
  u->training.micro_batch_searched = true;
  int spent = 0;
  Found f = search_variant(m, md, u, &spent, false, best->cost.step / 1.1, false);
  if (!f.feasible || best->cost.step <= 1.1 * f.best.cost.step) return NULL; /* (cutoff: only faster ones were packed) */
  const Choice *a = &best->ch, *b = &f.best.ch;
  char *keys = "";
#define NUM(x) mem_printf(m, "%lld", (long long)(x))
  if (!s->training.micro_batch_searched)
    keys = pin_diff(m, keys, s, "training.micro_batch", NUM(a->micro_batch), NUM(b->micro_batch));
  if (p->fsdp) keys = pin_diff(m, keys, s, "plan.fsdp", NUM(a->fsdp), NUM(b->fsdp));
  if (p->ep) keys = pin_diff(m, keys, s, "plan.ep", NUM(a->ep), NUM(b->ep));
  if (p->dp_replicate) keys = pin_diff(m, keys, s, "plan.dp_replicate", NUM(a->dp_replicate), NUM(b->dp_replicate));
  if (p->prefetch) keys = pin_diff(m, keys, s, "plan.prefetch", NUM(a->prefetch), NUM(b->prefetch));
  if (p->cp) keys = pin_diff(m, keys, s, "plan.cp", NUM(plan_cp(a)), NUM(plan_cp(b)));
#undef NUM
  if (p->activation_checkpoint != AC_AUTO)
    keys = pin_diff(m, keys, s, "plan.activation_checkpoint", plan_ac_name(a->ac), plan_ac_name(b->ac));
  if (p->offload_activations != OFF_AUTO)
    keys = pin_diff(m, keys, s, "plan.offload_activations", plan_offload_name(a->offload), plan_offload_name(b->offload));
  if (p->optimizer_tier != PIN_TIER_AUTO)
    keys = pin_diff(m, keys, s, "plan.optimizer_tier", plan_tier_name(a->opt_tier), plan_tier_name(b->opt_tier));
  if (p->optimizer_step != PIN_STEP_AUTO)
    keys = pin_diff(m, keys, s, "plan.optimizer_step", a->opt_on_host ? "host" : "gpu", b->opt_on_host ? "host" : "gpu");
  if (p->reshard != RESHARD_AUTO)
    keys = pin_diff(m, keys, s, "plan.reshard", plan_reshard_name(a->reshard), plan_reshard_name(b->reshard));
  if (p->reshard_experts != RESHARD_AUTO)
    keys = pin_diff(m, keys, s, "plan.reshard_experts", plan_reshard_name(a->reshard_experts),
                    plan_reshard_name(b->reshard_experts));
  if (p->moe_dispatch != DISPATCH_AUTO)
    keys = pin_diff(m, keys, s, "plan.moe_dispatch", plan_dispatch_name(a->dispatch), plan_dispatch_name(b->dispatch));
  double tok_a = (double)s->training.seq_len * (double)s->training.global_batch / best->cost.step;
  double tok_b = (double)s->training.seq_len * (double)s->training.global_batch / f.best.cost.step;
  double W = (double)(s->cluster.nodes * s->cluster.gpus_per_node);
  return mem_printf(m, "pinned %s: with the pinned keys auto (--set KEY=auto) the search finds %.0f tokens/s per GPU "
                    "against the pinned %.0f (+%.0f%%; step %.1f s against %.1f s)", keys[0] ? keys : "searched keys",
                    tok_b / W, tok_a / W, 100 * (tok_b / tok_a - 1), f.best.cost.step, best->cost.step);
}

/* A batch that the GPUs read only by splitting sequences (global_batch not a multiple of
 * batch_quantum, so the search had to take a cp > 1 for it to divide): searches the nearest
 * multiples of batch_quantum below and above; returns a note naming them and both MFUs when one
 * reaches more than 1.2 x the chosen plan's MFU, or NULL. */
static const char *batch_note(Mem *m, const Model *md, const Candidate *best) {
  const Spec *s = md->spec;
  int64_t q = batch_quantum(s, s->cluster.nodes), G = s->training.global_batch, L = s->training.seq_len;
  if (G % q == 0) return NULL;
  int64_t sizes[2] = {G / q * q, G / q * q + q};
  char *found = "";
  int spent = 0;
  for (int i = 0; i < 2; i++) {
    if (sizes[i] <= 0) continue;
    Spec *u = mem_alloc(m, sizeof *u);
    *u = *s;
    u->training.global_batch = sizes[i];
    if (u->training.global_batch_tokens) u->training.global_batch_tokens = sizes[i] * L;
    /* (only plans above 1.2 x the MFU: the step time of sizes[i] sequences at that rate) */
    Found f = search_variant(m, md, u, &spent, false, best->cost.step * (double)sizes[i] / (double)G / 1.2, false);
    if (!f.feasible || f.best.cost.mfu <= 1.2 * best->cost.mfu) continue;
    found = mem_printf(m, "%s%sMFU %.1f%% at %lld sequences (--set %s=%lld%s)", found, found[0] ? " and " : "",
                       100 * f.best.cost.mfu, (long long)sizes[i], spec_batch_key(s),
                       (long long)(s->training.global_batch_tokens ? sizes[i] * L : sizes[i]),
                       plan_cp(&f.best.ch) > 1 ? mem_printf(m, ", cp %lld", (long long)f.best.ch.cp) : "");
  }
  if (!found[0]) return NULL;
  return mem_printf(m, "global_batch %lld divides over the %lld GPUs only with cp %lld (%lld-token chunks), at MFU "
                    "%.1f%%; the nearest batch sizes that are multiples of micro_batch x GPUs = %lld x %lld reach %s",
                    (long long)G, (long long)(s->cluster.nodes * s->cluster.gpus_per_node), (long long)plan_cp(&best->ch),
                    (long long)(L / (2 * plan_cp(&best->ch))), 100 * best->cost.mfu,
                    (long long)(micro_batch_pinned(s) ? s->training.micro_batch : 1),
                    (long long)(s->cluster.nodes * s->cluster.gpus_per_node), found);
}

/* A copy of md whose spec carries micro_batch mb (the model graph does not depend on it). */
static const Model *with_micro_batch(Mem *m, const Model *md, int64_t mb) {
  if (md->spec->training.micro_batch == mb) return md;
  Spec *s = mem_alloc(m, sizeof *s);
  *s = *md->spec;
  s->training.micro_batch = mb;
  Model *copy = mem_alloc(m, sizeof *copy);
  *copy = *md, copy->spec = s;
  return copy;
}

const char *plan_dispatch_name(DispatchPolicy d) {
  static const char *const names[] = {"auto", "flat", "hierarchical"}; /* ORDER DispatchPolicy */
  return names[d];
}

const char *plan_reshard_name(ReshardPolicy r) {
  static const char *const names[] = {"auto", "every_micro_batch", "after_step"}; /* ORDER ReshardPolicy */
  return names[r];
}

bool plan_dispatch_emitted(DispatchPolicy d) { return d == DISPATCH_FLAT || d == DISPATCH_HIERARCHICAL; }

static Plan *search(Mem *m, const Model *md, bool notes) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  Plan *p = mem_alloc(m, sizeof *p);
  p->world = md->spec->cluster.nodes * md->spec->cluster.gpus_per_node;
  Found f = {0};
  f.alts = mem_array(m, MAX_ALTS, sizeof *f.alts);
  search_once(md, &f);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  p->search_seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  p->ncandidates = f.n;
  p->npacked = f.npacked;
  p->feasible = f.feasible;
  p->best = f.feasible ? f.best : f.closest;
  p->best.quick = false;
  p->md = p->ncandidates ? with_micro_batch(m, md, p->best.ch.micro_batch) : md;
  if (p->ncandidates) plan_memory(m, p->md, &p->best); /* items again, in the caller's arena */
  if (p->feasible) cost_step(p->md, &p->best);
  p->alts = f.alts, p->nalts = f.nalts;
  p->in_node = f.in_node, p->has_in_node = f.has_in_node;
  p->nby_cp = f.nby_cp;
  p->by_cp = mem_array(m, (size_t)f.nby_cp + 1, sizeof *p->by_cp);
  if (f.nby_cp) memcpy(p->by_cp, f.by_cp, (size_t)f.nby_cp * sizeof *p->by_cp);
  for (int i = 1; i < p->nby_cp; i++) /* ascending cp (insertion sort: a handful) */
    for (int j = i; j > 0 && plan_cp(&p->by_cp[j].ch) < plan_cp(&p->by_cp[j - 1].ch); j--) {
      Candidate t = p->by_cp[j];
      p->by_cp[j] = p->by_cp[j - 1], p->by_cp[j - 1] = t;
    }
  p->across = f.across, p->has_across = f.has_across;
  if (notes && !p->feasible) p->advice = advise(m, md, p->ncandidates > 0);
  else if (notes) p->hint = pin_note(m, md, &p->best), p->batch_note = batch_note(m, md, &p->best);
  if (p->ncandidates) p->placement = plan_placement(m, p->md, &p->best.ch);
  plan_exact(m, p); /* the items the program holds: its bytes */
  return p;
}

Plan *plan_search(Mem *m, const Model *md) { return search(m, md, true); }
Plan *plan_search_bare(Mem *m, const Model *md) { return search(m, md, false); }
