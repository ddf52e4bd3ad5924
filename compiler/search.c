/* search.c — the planner's search: every layout × checkpoint policy × activation offload ×
 * optimizer-state tier × prefetch depth the spec's pins allow; those over a memory budget
 * are rejected with the tier and the overage; the fastest predicted step wins, ties going to
 * the first in enumeration order (deterministic). When nothing fits, the advice is computed
 * by searching again with more nodes and with shorter sequences. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mtc.h"

enum { MAX_ALTS = 12 };

typedef struct {
  Candidate best;    /* items are not kept: plan_search rebuilds the winner's */
  bool feasible, any;
  Candidate closest; /* smallest overage, when nothing fits */
  Candidate *alts;
  int nalts, n;
} Found;

static int64_t gcd(int64_t a, int64_t b) { return b ? gcd(b, a % b) : a; }

/* Candidates worth showing next to the best: fitting ones by step time, then rejected ones
 * by overage. */
static bool better_alt(const Candidate *a, const Candidate *b) {
  if (a->fits != b->fits) return a->fits;
  if (a->fits) return a->cost.step < b->cost.step;
  return a->over_bytes < b->over_bytes;
}

/* The same decisions but for the prefetch depth: alternatives list one of them. */
static bool same_but_depth(const Choice *a, const Choice *b) {
  return a->fsdp == b->fsdp && a->ep == b->ep && a->ac == b->ac && a->offload == b->offload &&
         a->opt_tier == b->opt_tier && a->opt_on_host == b->opt_on_host;
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

static void evaluate(Mem *scratch, const Model *md, const Choice *ch, Found *f) {
  Candidate c = {.ch = *ch, .quick = true};
  mem_reset(scratch);
  plan_memory(scratch, md, &c);
  c.items = NULL, c.nitems = 0;
  f->n++;
  if (c.fits) {
    cost_step(md, &c);
    if (!f->feasible || c.cost.step < f->best.cost.step) {
      if (f->feasible) keep_alt(f, &f->best);
      f->best = c, f->feasible = true;
      return;
    }
  } else if (!f->any || c.over_bytes < f->closest.over_bytes) {
    f->closest = c, f->any = true;
  }
  keep_alt(f, &c);
}

/* One search over md's spec. */
static void search_once(const Model *md, Found *f) {
  const Spec *s = md->spec;
  const PlanSpec *pin = &s->plan;
  int64_t gpn = s->cluster.gpus_per_node, W = s->cluster.nodes * gpn;
  int64_t per_step = s->training.micro_batch * W;
  if (s->training.global_batch % per_step != 0) return; /* no layout: reported by the caller */
  int64_t experts = s->model.moe.present ? s->model.moe.experts : 1;
  int64_t ep_max = gcd(gpn, experts);
  static const CheckpointPolicy acs[] = {AC_NONE, AC_SELECTIVE, AC_FULL};
  static const struct { Tier tier; bool host_step; } opts[] = {
      {TIER_HBM, false}, {TIER_HOST, false}, {TIER_HOST, true}};
  Mem scratch = {0}; /* reused by every candidate */
  int64_t *divs = malloc(sizeof(int64_t) * 4096), nd = 0; /* W <= 12.8M has < 4096 divisors */
  if (!divs) return;
  for (int64_t d = 1; d * d <= W; d++)
    if (W % d == 0) divs[nd++] = d;
  for (int64_t i = nd - 1; i >= 0; i--)
    if (divs[i] * divs[i] != W) divs[nd++] = W / divs[i];
  for (int64_t di = 0; di < nd; di++) {
    int64_t fsdp = divs[di];
    if (pin->fsdp && fsdp != pin->fsdp) continue;
    if (pin->dp_replicate && W / fsdp != pin->dp_replicate) continue;
    for (int64_t ep = 1; ep <= ep_max; ep++) {
      if (ep_max % ep || fsdp % ep || (pin->ep && ep != pin->ep)) continue;
      for (int a = 0; a < 3; a++) {
        if (pin->activation_checkpoint != AC_AUTO && acs[a] != pin->activation_checkpoint) continue;
        for (int off = OFF_NONE; off <= OFF_NVME; off++) {
          if (pin->offload_activations != OFF_AUTO && off != (int)pin->offload_activations) continue;
          if (off != OFF_NONE && acs[a] != AC_FULL) continue; /* offload moves layer boundaries */
          if (off == OFF_NVME && !s->cluster.nvme.present) continue;
          for (int o = 0; o < 3; o++)
            for (int depth = 1; depth <= 2; depth++) {
              Choice ch = {fsdp, ep, W / fsdp, fsdp / ep, s->training.global_batch / per_step,
                           acs[a], (OffloadPolicy)off, opts[o].tier, opts[o].host_step, depth};
              evaluate(&scratch, md, &ch, f);
            }
        }
      }
    }
  }
  free(divs);
  mem_free(&scratch);
}

/* The advice searches stop after this many candidates in all (a deterministic bound, so an
 * enormous spec cannot make `mtc plan` take minutes). */
enum { ADVICE_BUDGET = 20000 };

/* The search over md with spec u instead of md's (u changes values that do not change the
 * model graph); adds the candidates it tried to *spent. */
static Found search_variant(Mem *m, const Model *md, const Spec *u, int *spent) {
  Model *copy = mem_alloc(m, sizeof *copy);
  *copy = *md, copy->spec = u;
  Found f = {0};
  f.alts = mem_array(m, MAX_ALTS, sizeof *f.alts);
  search_once(copy, &f);
  *spent += f.n;
  return f;
}

/* Whether md fits with another node count and sequence length, for "what would make it fit". */
static bool fits_with(Mem *m, const Model *md, int64_t nodes, int64_t seq, int *spent) {
  Spec *s = mem_alloc(m, sizeof *s);
  *s = *md->spec;
  s->cluster.nodes = nodes;
  s->training.seq_len = seq;
  s->plan.fsdp = s->plan.dp_replicate = 0; /* pins that name the old world size are dropped */
  return search_variant(m, md, s, spent).feasible;
}

static const char *advise(Mem *m, const Model *md) {
  const Spec *s = md->spec;
  int64_t W = s->cluster.nodes * s->cluster.gpus_per_node;
  if (s->training.global_batch % (s->training.micro_batch * W) != 0)
    return mem_printf(m, "global_batch %lld is not a multiple of micro_batch x GPUs = %lld x %lld; "
                      "choose a global_batch that is, or another node count",
                      (long long)s->training.global_batch, (long long)s->training.micro_batch, (long long)W);
  char *out = "";
  int spent = 0;
  for (int64_t k = 2; k <= 64 && spent < ADVICE_BUDGET; k *= 2) { /* more nodes, if the batch divides */
    int64_t nodes = s->cluster.nodes * k;
    if (s->training.global_batch % (s->training.micro_batch * nodes * s->cluster.gpus_per_node) == 0 &&
        fits_with(m, md, nodes, s->training.seq_len, &spent)) {
      out = mem_printf(m, "it fits on %lld nodes (--set cluster.nodes=%lld, with global_batch a "
                       "multiple of micro_batch x GPUs)", (long long)nodes, (long long)nodes);
      break;
    }
  }
  for (int64_t seq = s->training.seq_len / 2; seq >= 128 && spent < ADVICE_BUDGET; seq /= 2)
    if (fits_with(m, md, s->cluster.nodes, seq, &spent)) {
      out = mem_printf(m, "%s%sit fits at seq_len %lld (--set training.seq_len=%lld)", out,
                       out[0] ? "; " : "", (long long)seq, (long long)seq);
      break;
    }
  const PlanSpec *p = &s->plan;
  if (p->activation_checkpoint != AC_AUTO || p->offload_activations != OFF_AUTO || p->fsdp || p->ep) {
    Spec *u = mem_alloc(m, sizeof *u);
    *u = *s;
    u->plan.activation_checkpoint = AC_AUTO, u->plan.offload_activations = OFF_AUTO;
    u->plan.fsdp = u->plan.ep = u->plan.dp_replicate = 0;
    Found g = search_variant(m, md, u, &spent);
    if (g.feasible)
      out = mem_printf(m, "%s%sunpinned, the search finds fsdp %lld, ep %lld, %s checkpointing%s", out,
                       out[0] ? "; " : "", (long long)g.best.ch.fsdp, (long long)g.best.ch.ep,
                       plan_ac_words(g.best.ch.ac), g.best.ch.offload == OFF_NONE ? "" :
                       g.best.ch.offload == OFF_HOST ? " with host offload" : " with NVMe offload");
  }
  if (out[0]) return out;
  return spent >= ADVICE_BUDGET ? "no tried change fits (the advice search stopped at its budget of 20000 candidates)"
                                : "no tried change fits (up to 64x the nodes, seq_len down to 128)";
}

/* A plan that is communication-bound with gradient accumulation re-gathers every parameter
 * for each micro-batch: fewer, larger micro-batches cut that. Searches again with the
 * micro-batch doubled while the batch divides; returns the advice if some size is at least
 * 10% faster, else NULL. */
static const char *micro_batch_hint(Mem *m, const Model *md, const Candidate *best) {
  const Spec *s = md->spec;
  if (best->ch.accum < 2 || best->cost.exposed_comm < 0.3 * best->cost.step) return NULL;
  int64_t W = s->cluster.nodes * s->cluster.gpus_per_node, best_mb = 0;
  double best_step = 0.9 * best->cost.step;
  int spent = 0;
  for (int64_t mb = 2 * s->training.micro_batch; mb * W <= s->training.global_batch && spent < ADVICE_BUDGET; mb *= 2) {
    if (s->training.global_batch % (mb * W)) continue;
    Spec *u = mem_alloc(m, sizeof *u);
    *u = *s;
    u->training.micro_batch = mb;
    Found f = search_variant(m, md, u, &spent);
    if (f.feasible && f.best.cost.step < best_step) best_step = f.best.cost.step, best_mb = mb;
  }
  if (!best_mb) return NULL;
  return mem_printf(m, "FSDP re-gathers every parameter for each of the %lld micro-batches of a step; "
                    "with --set training.micro_batch=%lld (%lld micro-batches) a plan fits and the step "
                    "takes %.1f s instead of %.1f s", (long long)best->ch.accum, (long long)best_mb,
                    (long long)(s->training.global_batch / (best_mb * W)), best_step, best->cost.step);
}

Plan *plan_search(Mem *m, const Model *md) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  Plan *p = mem_alloc(m, sizeof *p);
  p->md = md;
  p->world = md->spec->cluster.nodes * md->spec->cluster.gpus_per_node;
  Found f = {0};
  f.alts = mem_array(m, MAX_ALTS, sizeof *f.alts);
  search_once(md, &f);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  p->search_seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  p->ncandidates = f.n;
  p->feasible = f.feasible;
  p->best = f.feasible ? f.best : f.closest;
  p->best.quick = false;
  if (p->ncandidates) plan_memory(m, md, &p->best); /* items again, in the caller's arena */
  if (p->feasible) cost_step(md, &p->best);
  p->alts = f.alts, p->nalts = f.nalts;
  if (!p->feasible) p->advice = advise(m, md);
  else p->hint = micro_batch_hint(m, md, &p->best);
  if (p->ncandidates) p->placement = plan_placement(m, md, &p->best.ch);
  return p;
}
