/* report_plan.c — the plan as `mtc plan` text and as plan.json keys (layout, checkpoint,
 * memory, predicted, search, feasible). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

static const char *phase_name(Mem *m, int L, int p) {
  if (p == 0) return "static";
  if (p <= L) return mem_printf(m, "forward of layer %d", p - 1);
  if (p == PHASE_LOSS(L)) return "LM head and loss";
  if (p < PHASE_OPT(L)) return mem_printf(m, "backward of layer %d", 2 * L + 1 - p);
  return "optimizer step";
}

static const char *lifetime(Mem *m, int L, const MemItem *x, bool per_layer) {
  if (x->start == 0 && x->end == PHASE_END(L)) return "whole step";
  if (per_layer) return "its layer fwd..bwd";
  if (x->start == 1 && x->end == PHASE_OPT(L)) return "forward+backward";
  if (x->start == 1 && x->end == PHASE_LOSS(L)) return "forward";
  if (x->start >= PHASE_LOSS(L) && x->end == PHASE_OPT(L)) return "backward";
  if (x->start == PHASE_LOSS(L) && x->end == PHASE_LOSS(L) + 1) return "loss";
  if (x->start == PHASE_OPT(L)) return "optimizer step";
  return mem_printf(m, "%s..%s", phase_name(m, L, x->start), phase_name(m, L, x->end - 1));
}

/* One line of report text (s, n bytes, no newline) to out, broken at spaces into lines of at most
 * REPORT_WIDTH characters: continuation lines start under a leading label's text ("placement  EP
 * rank...": column 11), under a bullet's text ("- "), under the line's own indentation when it is 6
 * or more, else 4 past it. A word longer than a line stays whole. */
static void wrap_line(FILE *out, const char *s, size_t n) {
  size_t lead = 0;
  while (lead < n && s[lead] == ' ') lead++;
  size_t ind = lead + 1 < n && s[lead] == '-' && s[lead + 1] == ' ' ? lead + 2 : lead >= 6 ? lead : lead + 4;
  if (lead == 0) { /* a label: its word, then two or more spaces, then the text */
    size_t w = 0, t;
    while (w < n && s[w] != ' ') w++;
    for (t = w; t < n && s[t] == ' ';) t++;
    if (t - w >= 2 && t <= 16) ind = t;
  }
  size_t pos = 0, width = REPORT_WIDTH;
  while (n - pos > width) {
    size_t brk = pos + width; /* < n */
    while (brk > pos && s[brk] != ' ') brk--;
    if (brk <= pos + (pos ? 0 : lead)) { /* one word fills the line: break after it */
      brk = pos + width;
      while (brk < n && s[brk] != ' ') brk++;
      if (brk >= n) break;
    }
    size_t e = brk;
    while (e > pos && s[e - 1] == ' ') e--;
    fwrite(s + pos, 1, e - pos, out);
    for (pos = brk; pos < n && s[pos] == ' ';) pos++;
    fprintf(out, "\n%*s", (int)ind, "");
    width = REPORT_WIDTH - ind;
  }
  fwrite(s + pos, 1, n - pos, out);
  fputc('\n', out);
}

void report_wrap(FILE *out, const char *text) {
  for (const char *s = text; *s;) {
    const char *nl = strchr(s, '\n');
    size_t n = nl ? (size_t)(nl - s) : strlen(s);
    if (!nl && !n) break;
    wrap_line(out, s, n);
    s += n + (nl ? 1 : 0);
  }
}

/* Calls body(f, p) on a buffer and writes what it printed to out through report_wrap (or straight
 * to out when no buffer can be had). */
static void wrapped(FILE *out, const Plan *p, bool timing, void (*body)(FILE *, const Plan *, bool)) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) {
    body(out, p, timing);
    return;
  }
  body(f, p, timing);
  fclose(f);
  report_wrap(out, text);
  free(text);
}

const char *report_overs(Mem *m, const Candidate *c) {
  const char *r = "";
  char a[32], b[32], d[32];
  for (int t = 0; t < TIER__COUNT; t++) {
    if (c->arena[t] <= c->capacity[t]) continue;
    units_fmt_bytes_bin(a, sizeof a, (double)(c->arena[t] - c->capacity[t]));
    units_fmt_bytes_bin(b, sizeof b, (double)c->arena[t]);
    units_fmt_bytes_bin(d, sizeof d, (double)c->capacity[t]);
    r = mem_printf(m, "%s%s%s over by %s (%s of %s)", r, r[0] ? ", " : "", plan_tier_name((Tier)t), a, b, d);
  }
  if (r[0]) return r;
  units_fmt_bytes_bin(a, sizeof a, (double)c->over_bytes); /* (a misfit the search did not pack) */
  return mem_printf(m, "%s over by %s", plan_tier_name(c->over_tier), a);
}

/* Whether the space-separated list names key. */
static bool listed(const char *list, const char *key) {
  size_t k = strlen(key);
  for (const char *w = list ? list : ""; *w;) {
    size_t n = strcspn(w, " ,");
    if (n == k && strncmp(w, key, n) == 0) return true;
    w += n + strspn(w + n, " ,");
  }
  return false;
}

double report_time_factor(const Spec *s, const char **why) {
  const EvidenceSpec *ev = &s->cluster.evidence;
  bool mtc = s->cluster.stack == STACK_MTC, band = ev->band_rows > 0;
  double f = 1.2;
  const char *w = band || (mtc && ev->program_ratio > 0) ? "1.2, the least margin" : "no evidence bounds it: a 20% margin, assumed";
  if (band && ev->band_high > f) f = ev->band_high, w = "the fidelity band's top";
  if (mtc && ev->program_ratio > 0 && 1 / ev->program_ratio > f) f = 1 / ev->program_ratio, w = "1 / the measured ratio of mtc's program";
  if (mtc && ev->program_ratio <= 0 && band) /* the band is of published (PyTorch) runs */
    w = f > 1.2 ? "the fidelity band's top, of published runs: mtc's program was never measured here"
                : "1.2: the fidelity band is of published runs, and mtc's program was never measured here";
  if (why) *why = w;
  return f;
}

const char *report_provenance(Mem *m, const Spec *s, bool brief) {
  const EvidenceSpec *ev = &s->cluster.evidence;
  const char *kinds[3] = {"", "", ""}; /* measured, fitted, assumed */
  int count[3] = {0, 0, 0};
  for (int i = 0; spec_efficiency_key(i); i++) {
    const char *k = spec_efficiency_key(i);
    int c = listed(ev->measured, k) ? 0 : listed(ev->fitted, k) ? 1 : 2;
    kinds[c] = mem_printf(m, "%s%s%s", kinds[c], count[c] ? ", " : "", k);
    count[c]++;
  }
  const char *band = ev->band_rows > 0
      ? mem_printf(m, "predicted / published tokens/s %.2f..%.2f over %lld fidelity rows", ev->band_low, ev->band_high,
                   (long long)ev->band_rows)
      : s->cluster.gpu.name && strncmp(s->cluster.gpu.name, "cpu", 3) == 0 ? "no fidelity row on this machine"
                                                                             : "no fidelity row on this GPU";
  bool mtc = s->cluster.stack == STACK_MTC;
  const char *prog = !mtc ? ""
      : ev->program_ratio > 0 ? mem_printf(m, "mtc's program measured at %.2fx its prediction", ev->program_ratio)
      : s->cluster.gpu.name && strncmp(s->cluster.gpu.name, "cpu", 3) == 0 ? "mtc's program never measured on this machine"
                                                                          : "mtc's program never measured on this GPU";
  const char *why;
  double f = report_time_factor(s, &why);
  const char *run = mtc && ev->program_ratio > 0 && ev->program_source /* by its source's first words */
      ? mem_printf(m, " (%.*s)", (int)strcspn(ev->program_source, ",(:;"), ev->program_source) : "";
  if (brief)
    return mem_printf(m, "rates%s%s: %d measured, %d fitted, %d assumed (cluster.evidence); %s%s%s%s; time limits allow "
                         "%.2fx the prediction (%s)", s->cluster.preset ? " of " : "",
                      s->cluster.preset ? s->cluster.preset : "", count[0], count[1], count[2], band, mtc ? "; " : "", prog,
                      run, f, why);
  const char *r = mem_printf(m, "\nwhere the predictions come from (cluster.evidence%s%s)\n",
                             s->cluster.preset ? " of preset " : "", s->cluster.preset ? s->cluster.preset : "");
  r = mem_printf(m, "%s  efficiencies measured or from a published microbenchmark (the preset cites each): %s\n", r,
                 count[0] ? kinds[0] : "none");
  if (count[1]) r = mem_printf(m, "%s  fitted to whole published runs: %s\n", r, kinds[1]);
  r = mem_printf(m, "%s  assumed: %s\n", r, count[2] ? kinds[2] : "none");
  r = mem_printf(m, "%s  fidelity: %s%s%s%s\n", r, band, ev->band_source ? " (" : "", ev->band_source ? ev->band_source : "",
                 ev->band_source ? ")" : "");
  if (mtc)
    r = mem_printf(m, "%s  cluster.stack mtc: %s%s%s%s\n", r, prog, ev->program_source ? " (" : "",
                   ev->program_source ? ev->program_source : "", ev->program_source ? ")" : "");
  return mem_printf(m, "%s  launch.sbatch's time limit allows %.2fx the predicted run (%s; the largest of 1.2, the "
                       "band's top%s)\n", r, f, why, mtc ? " and 1 / the program's measured ratio" : "");
}

static const char *choice_text(Mem *m, const Choice *ch) {
  return mem_printf(m, "fsdp %lld x dp %lld, ep %lld%s%s, micro_batch %lld, %s checkpointing%s, optimizer state in %s%s, "
                    "%s",
                    (long long)ch->fsdp, (long long)ch->dp_replicate, (long long)ch->ep,
                    ch->dispatch == DISPATCH_HIERARCHICAL ? " (hierarchical all-to-all)" : "",
                    plan_cp(ch) > 1 ? mem_printf(m, ", cp %lld", (long long)ch->cp) : "", (long long)ch->micro_batch,
                    plan_ac_words(ch->ac),
                    ch->offload == OFF_HOST ? " + boundaries on host" : ch->offload == OFF_NVME ? " + boundaries on NVMe" : "",
                    plan_tier_name(ch->opt_tier), ch->opt_on_host ? " (step on host CPU)" : "",
                    ch->reshard == RESHARD_AFTER_STEP && ch->reshard_experts == RESHARD_AFTER_STEP
                        ? "parameters kept gathered until the optimizer step"
                        : mem_printf(m, "%sprefetch %d",
                                     ch->reshard == ch->reshard_experts ? ""
                                     : ch->reshard == RESHARD_AFTER_STEP
                                         ? "all but the routed experts kept gathered until the optimizer step, "
                                         : "routed experts kept gathered until the optimizer step, ",
                                     ch->prefetch));
}

/* The length of s without its trailing spaces, for "%.*s". */
static int trimmed(const char *s) {
  size_t n = strlen(s);
  while (n && s[n - 1] == ' ') n--;
  return (int)n;
}

/* Rows of identical items ("activations.boundary[0]", "[1]"...) fold into one. */
static void print_items(FILE *out, Mem *m, const Candidate *c, Tier t, int L) {
  char b[32], cap[32];
  for (int i = 0; i < c->nitems;) {
    const MemItem *x = &c->items[i];
    int j = i + 1;
    const char *br = strchr(x->name, '[');
    size_t stem = br ? (size_t)(br - x->name) : strlen(x->name);
    while (j < c->nitems && br && strncmp(c->items[j].name, x->name, stem) == 0 &&
           c->items[j].name[stem] == '[' && c->items[j].bytes == x->bytes && c->items[j].tier == x->tier)
      j++;
    if (x->tier == t) {
      units_fmt_bytes_bin(b, sizeof b, (double)x->bytes);
      const char *name = j - i > 1 ? mem_printf(m, "%.*s[%d]", (int)stem, x->name, j - i) : x->name;
      snprintf(cap, sizeof cap, "%5.1f%%", 100.0 * (double)x->bytes * (j - i) / (double)c->capacity[t]);
      const char *life = lifetime(m, L, x, x->stacked);
      const char *row = mem_printf(m, "  %-34s %4s%10s %s  %-22s", name, j - i > 1 ? mem_printf(m, "%dx", j - i) : "",
                                   b, cap, life);
      size_t fl = strlen(x->formula);
      if (strlen(row) + 1 + fl <= REPORT_WIDTH) fprintf(out, "%s %s\n", row, x->formula);
      else if (fl <= 3 * (REPORT_WIDTH - 6)) fprintf(out, "%.*s\n      %s\n", trimmed(row), row, x->formula);
      else /* (a formula of many terms: plan.json has it whole) */
        fprintf(out, "%.*s\n      formula: plan.json memory.%s.items, \"formula\" of \"%s\" (%zu characters)\n",
                trimmed(row), row, plan_tier_name(t), x->name, fl);
    }
    i = j;
  }
}

static void print_placement(FILE *out, const Plan *p) {
  const Placement *pl = p->placement;
  const Choice *ch = &p->best.ch;
  if (!pl) return;
  int64_t El = pl->experts_per_rank, per = plan_expert_per(El, ch->efsdp);
  char how[200] = "whole";
  if (per) snprintf(how, sizeof how, "in shards of %lld whole experts", (long long)per);
  else if (ch->efsdp > 1)
    snprintf(how, sizeof how, "flat, like a dense group (%lld ranks do not divide %lld experts: whole experts "
                              "would pad every shard to the largest share)", (long long)ch->efsdp, (long long)El);
  if (El && ch->ep == 1)
    fprintf(out, "placement  every rank computes all %lld experts of a layer; they are sharded over the %lld ranks %s\n",
            (long long)El, (long long)ch->fsdp, how);
  else if (El)
    fprintf(out, "placement  EP rank e = FSDP rank %% %lld holds experts [%lld e, %lld e + %lld), sharded over the %lld "
                 "ranks of its FSDP group with that EP rank %s\n",
            (long long)ch->ep, (long long)El, (long long)El, (long long)El, (long long)ch->efsdp, how);
  int64_t gpn = p->md->spec->cluster.gpus_per_node;
  if (pl->experts_per_rank && ch->ep > gpn && ch->dispatch == DISPATCH_HIERARCHICAL) {
    const Spec *sp = p->md->spec;
    fprintf(out, "           across nodes: an EP group is %lld consecutive ranks on %lld nodes; the group's node j "
                 "(j < %lld) holds experts [%lld j, %lld j + %lld), %lld per GPU; the hierarchical all-to-all sends a "
                 "token's row once to each other node holding one of its experts, to the GPU with the sender's local "
                 "index there (%.2f rows over InfiniBand per token against %.2f of its %lld copies flat), which "
                 "forwards it over NVLink\n",
            (long long)ch->ep, (long long)(ch->ep / gpn), (long long)(ch->ep / gpn),
            (long long)(gpn * pl->experts_per_rank), (long long)(gpn * pl->experts_per_rank),
            (long long)(gpn * pl->experts_per_rank), (long long)pl->experts_per_rank,
            cost_remote_nodes(sp, ch->ep, sp->model.moe.top_k),
            (double)sp->model.moe.top_k * (double)(ch->ep - gpn) / (double)ch->ep, (long long)sp->model.moe.top_k);
  } else if (pl->experts_per_rank && ch->ep > gpn) /* EP groups of whole nodes (consecutive ranks) */
    fprintf(out, "           across nodes: an EP group is %lld consecutive ranks on %lld nodes; the group's node j "
                 "(j < %lld) holds experts [%lld j, %lld j + %lld), %lld per GPU; the all-to-all sends %lld/%lld of "
                 "the token copies over InfiniBand, %lld/%lld over NVLink\n",
            (long long)ch->ep, (long long)(ch->ep / gpn), (long long)(ch->ep / gpn),
            (long long)(gpn * pl->experts_per_rank), (long long)(gpn * pl->experts_per_rank),
            (long long)(gpn * pl->experts_per_rank), (long long)pl->experts_per_rank, (long long)(ch->ep - gpn),
            (long long)ch->ep, (long long)(gpn - 1), (long long)ch->ep);
  if (!pl->muon) {
    fprintf(out, "           AdamW: every parameter sharded elementwise over its FSDP group\n");
    return;
  }
  if (pl->too_large) {
    fprintf(out, "           Muon: owners as in the rule of plan.json (FSDP group over %d ranks: not listed)\n",
            PLACEMENT_MAX_RANKS);
    return;
  }
  char a[32];
  units_fmt_int(a, sizeof a, pl->matrices);
  double mean = pl->ns_flops_total / (double)ch->fsdp;
  fprintf(out, "           Muon: %s matrices, each orthogonalized whole by one owner rank (%s; dense matrices "
               "largest first to the least loaded); Newton-Schulz per step: busiest rank %.3g FLOPs, %.1f%% above the "
               "mean; every owner in plan.json \"placement\"\n", a,
          per || ch->efsdp <= 1 ? "experts where they are held, whole, with no communication"
                                : "experts held whole in one shard where they are held, the split ones largest first "
                                  "round robin from the least loaded rank of their shard group",
          pl->ns_flops_max_rank,
          mean > 0 ? 100.0 * (pl->ns_flops_max_rank / mean - 1) : 0.0);
  char mv[32], by[32], ex[96];
  units_fmt_int(mv, sizeof mv, pl->moving_matrices);
  units_fmt_int(ex, sizeof ex, pl->moving_expert_matrices);
  if (pl->moving_expert_matrices) strncat(ex, " of them, split over the ranks of a flat expert group", sizeof ex - strlen(ex) - 1);
  units_fmt_bytes_dec(by, sizeof by, pl->moving_bytes_rank);
  fprintf(out, "           Muon traffic per step: %s matrices move (pieces to their owner in one all-to-all "
               "for all the dense groups and one per flat expert group, updates back in another): %s per rank, fp32, "
               "both ways; experts: %s\n", mv, by,
          pl->moving_expert_matrices ? ex : "none");
}

/* The generated program's path for the routed experts' GEMMs (runtime/cuda/ops_moe.c), at the plan's
 * mean rows per expert, and why: both paths priced for one forward up projection of the local
 * experts (cost_expert_gemm). Fills path, why; returns the loop's threshold (EXPERT_LOOP_ROWS). */
static int64_t expert_path(Mem *m, const Plan *p, double *rows, const char **path, const char **why) {
  const Spec *s = p->md->spec;
  const Choice *ch = &p->best.ch;
  const MoeSpec *ms = &s->model.moe;
  double T = (double)(ch->micro_batch * s->training.seq_len / plan_cp(ch));
  int64_t lr = cost_expert_loop_rows(s, ch->ep);
  double local = (double)(ms->experts / ch->ep), N = (double)ms->expert_intermediate, K = (double)s->model.hidden;
  *rows = cost_expert_rows(s, T, ch->ep);
  bool loop = lr > 0 && *rows >= (double)lr;
  double tl = cost_expert_gemm(s, *rows, N, K, local, true), tg = cost_expert_gemm(s, *rows, N, K, local, false);
  *path = loop ? "loop" : "grouped";
  *why = mem_printf(m, "at %.0f rows per expert, one up projection of the %.0f local experts (%.0f x %.0f each) is "
                       "priced %.1f us as a loop of cuBLAS GEMMs (expert_gemm_loop, one launch each) and %.1f us as one "
                       "grouped call (grouped_gemm_cublas); %s",
                    *rows, local, N, K, 1e6 * tl, 1e6 * tg,
                    lr ? mem_printf(m, "the loop is priced no slower from %lld rows per expert", (long long)lr)
                       : "the loop is priced slower at any rows (EXPERT_LOOP_ROWS 0)");
  return lr;
}

static void print_experts(FILE *out, Mem *m, const Plan *p) {
  if (!p->md->spec->model.moe.present || !p->ncandidates) return;
  double rows;
  const char *path, *why;
  int64_t lr = expert_path(m, p, &rows, &path, &why);
  fprintf(out, "experts    GEMMs %s: %s at the plan's rows; each pass of the program picks by its own rows "
               "(step.h EXPERT_LOOP_ROWS %lld)\n  why: %s\n",
          path, strcmp(path, "loop") == 0 ? "one cuBLAS GEMM per expert over 4 streams" : "one cuBLAS grouped GEMM per projection",
          (long long)lr, why);
}

/* One row per distinct layer kind: what a layer's step does on each stream. */
static void print_schedule(FILE *out, const Plan *p) {
  const Model *md = p->md;
  const Choice *ch = &p->best.ch;
  fprintf(out, "\nschedule per layer and micro-batch (ms; compute stream | comm stream)\n");
  fprintf(out, "  %-12s %9s %9s %9s %9s | %9s %9s\n", "layer", "forward", "backward", "recompute",
          "all2all", "gather", "reduce");
  bool seen[2] = {false, false};
  for (int l = 0; l < md->nlayers; l++) {
    LayerKind kind = md->layers[l].kind;
    if (seen[kind]) continue;
    seen[kind] = true;
    LayerTime t;
    cost_layer(md, ch, l, &t);
    char name[32];
    snprintf(name, sizeof name, "%d (%s)", l, kind == LAYER_MOE ? "moe" : "dense");
    fprintf(out, "  %-12s %9.1f %9.1f %9.1f %9.1f | %9.1f %9.1f\n", name, 1e3 * t.fwd, 1e3 * t.bwd,
            1e3 * t.recompute, 1e3 * (t.a2a_fwd + t.a2a_bwd), 1e3 * 2 * t.ag, 1e3 * t.rs);
  }
  fprintf(out, "  (forward, backward, recompute: one pass each; all2all: the forward's and the backward's dispatch + "
               "combine, summed; gather: the forward's all-gather + the backward's re-gather, summed (2 x one "
               "layer's); reduce: the backward's reduce-scatter of the layer's gradient)\n");
  if (plan_cp(ch) > 1) {
    LayerTime t;
    cost_layer(md, ch, 0, &t);
    fprintf(out, "  K/V exchange over the cp group of %lld, per layer: all-gather %.1f ms (forward, and again in the "
                 "backward), dK/dV reduce-scatter %.1f ms; exposed %.1f ms forward, %.1f ms backward (the rest hidden "
                 "behind the attention on the rank's own keys, the reduce-scatter behind the layer's other backward)\n",
            (long long)ch->cp, 1e3 * t.kv_ag, 1e3 * t.kv_rs, 1e3 * t.kv_fwd, 1e3 * t.kv_bwd);
  }
  if (ch->reshard != ch->reshard_experts)
    fprintf(out, "  order: the first micro-batch's forward gathers layer l+%d while layer l computes and keeps %s "
                 "gathered until the optimizer step; the %s are re-gathered for every micro-batch's forward and "
                 "backward; then each layer's gradient is reduce-scattered (every micro-batch)\n",
            ch->prefetch, ch->reshard == RESHARD_AFTER_STEP ? "all but the routed experts" : "the routed experts",
            ch->reshard == RESHARD_AFTER_STEP ? "routed experts" : "other parameters");
  else if (ch->reshard == RESHARD_AFTER_STEP)
    fprintf(out, "  order: the first micro-batch's forward gathers layer l+%d while layer l computes and keeps every "
                 "layer gathered until the optimizer step (gather column: once per step, forward only); backward, "
                 "layer l %sruns backward, then its gradient is reduce-scattered (every micro-batch)\n",
            ch->prefetch, ch->ac == AC_NONE ? "" : "recomputes and ");
  else
    fprintf(out, "  order: forward, layer l computes while layers up to l+%d are gathered; backward, layer l "
                 "%sruns backward while layers down to l-%d are gathered (again), then its gradient is "
                 "reduce-scattered\n", ch->prefetch, ch->ac == AC_NONE ? "" : "recomputes and ", ch->prefetch);
}

/* Whether the cluster's "GPUs" are cpu ranks (the cpu preset: gpu.name "cpu ..."). */
static bool cpu_ranks(const Plan *p) {
  const char *n = p->md->spec->cluster.gpu.name;
  return n && strncmp(n, "cpu", 3) == 0;
}

static void plan_text(FILE *out, const Plan *p, bool timing) {
  Mem m = {0};
  const Model *md = p->md;
  const Spec *s = md->spec;
  const Candidate *c = &p->best;
  int L = md->nlayers;
  char a[32], b[32], d[32];
  fprintf(out, "\n%s\n", p->feasible ? "PLAN" : "NO FEASIBLE PLAN");
  if (cpu_ranks(p))
    fprintf(out, "  (cpu ranks: below, a GPU is one MPI rank, HBM its memory budget (cluster.gpu.hbm) and MFU a\n"
                 "  fraction of cluster.gpu.bf16_flops, an assumed rate per rank)\n");
  if (!p->ncandidates) {
    fprintf(out, "  no layout: %s\n", p->advice);
    mem_free(&m);
    return;
  }
  const Choice *ch = &c->ch;
  fprintf(out, "layout     %lld GPUs = %lld replica(s) x %lld-way FSDP", (long long)p->world,
          (long long)ch->dp_replicate, (long long)ch->fsdp);
  if (s->model.moe.present)
    fprintf(out, "; EP %lld %s (%lld experts per rank, each sharded over %lld ranks)", (long long)ch->ep,
            ch->ep > s->cluster.gpus_per_node
                ? mem_printf(&m, "across %lld nodes", (long long)(ch->ep / s->cluster.gpus_per_node))
                : "inside a node",
            (long long)(s->model.moe.experts / ch->ep), (long long)ch->efsdp);
  if (plan_cp(ch) > 1)
    fprintf(out, "; CP %lld: each sequence split over %lld consecutive ranks of an FSDP group (%lld chunks of %lld "
                 "tokens, rank r holding chunks r and %lld - r; keys and values all-gathered per layer); %lld "
                 "micro-batch(es) of %lld sequence(s) per CP group per step, %lld tokens per GPU each\n",
            (long long)ch->cp, (long long)ch->cp, (long long)(2 * ch->cp),
            (long long)(s->training.seq_len / (2 * ch->cp)), (long long)(2 * ch->cp - 1), (long long)ch->accum,
            (long long)s->training.micro_batch, (long long)(s->training.micro_batch * s->training.seq_len / ch->cp));
  else
    fprintf(out, "; %lld micro-batch(es) of %lld sequence(s) per GPU per step\n", (long long)ch->accum,
            (long long)s->training.micro_batch);
  fprintf(out, "policy     %s\n", choice_text(&m, ch));
  units_fmt_int(a, sizeof a, s->training.global_batch * s->training.seq_len);
  fprintf(out, "batch      %s tokens per step = %lld sequences x %lld tokens%s\n", a, (long long)s->training.global_batch,
          (long long)s->training.seq_len, s->training.global_batch_tokens ? " (training.global_batch_tokens)" : "");
  if (plan_cp(ch) > 1 && em_cp_unsupported(s))
    fprintf(out, "note       plan.cp is pinned above 1, but the program does not implement %s with context "
                 "parallelism yet: `mtc compile` writes this plan and no program\n", em_cp_unsupported(s));
  print_placement(out, p);
  print_experts(out, &m, p);
  for (int t = 0; t < TIER__COUNT; t++) {
    if (!c->capacity[t] && !c->arena[t]) continue;
    units_fmt_bytes_dec(a, sizeof a, (double)c->capacity[t]);
    units_fmt_bytes_bin(b, sizeof b, (double)c->capacity[t]);
    fprintf(out, "\nmemory per GPU: %s (capacity %s = %s)\n", plan_tier_name((Tier)t), a, b);
    print_items(out, &m, c, (Tier)t, L);
    units_fmt_bytes_dec(a, sizeof a, (double)c->arena[t]);
    units_fmt_bytes_bin(b, sizeof b, (double)c->arena[t]);
    units_fmt_bytes_bin(d, sizeof d, (double)c->live_peak[t]);
    fprintf(out, "  peak (packed arena) %s = %s, %.1f%% of capacity; items alive at the fullest "
                 "phase (%s): %s\n", a, b, c->capacity[t] ? 100.0 * (double)c->arena[t] / (double)c->capacity[t] : 0,
            phase_name(&m, L, c->peak_phase[t]), d);
  }
  if (p->feasible) {
    const Cost *k = &c->cost;
    print_schedule(out, p);
    if (s->cluster.stack == STACK_MTC) fprintf(out, "\npredicted step (seconds)\n");
    else fprintf(out, "\npredicted step (seconds; %s kernels, cluster.stack)\n", spec_stack_name(s->cluster.stack));
    fprintf(out, "  compute                    %9.3f  (forward, backward and recompute of every layer and micro-batch; "
                 "recompute %.3f of it)\n", k->compute, k->recompute);
    fprintf(out, "  exposed FSDP communication %9.3f  (of %.3f all-gather + reduce-scatter)\n",
            k->exposed_comm, k->comm_total);
    fprintf(out, "  MoE all-to-all             %9.3f\n", k->a2a);
    if (plan_cp(ch) > 1)
      fprintf(out, "  exposed K/V exchange (cp)  %9.3f\n", k->cp_exchange);
    fprintf(out, "  exposed activation offload %9.3f\n", k->exposed_offload);
    fprintf(out, "  host gradient accumulation %9.3f\n", k->host_grad);
    fprintf(out, "  optimizer step             %9.3f\n", k->optimizer);
    fprintf(out, "  data-parallel all-reduce   %9.3f\n", k->dp_allreduce);
    fprintf(out, "  step                       %9.3f  (the sum of the terms above) -> %.0f tokens/s per GPU, MFU %.1f%%\n",
            k->step, k->tokens_per_s_per_gpu, 100 * k->mfu);
    fprintf(out, "  bottleneck: %s, the largest term (%.3f s of %.3f)\n", k->bottleneck, k->bottleneck_seconds, k->step);
    fputs(report_provenance(&m, s, false), out);
    if (p->hint) fprintf(out, "hint: %s\n", p->hint);
    if (p->batch_note) fprintf(out, "note: %s\n", p->batch_note);
  } else {
    fprintf(out, "\nclosest candidate (the least overage, all tiers together): %s\n", report_overs(&m, c));
    fprintf(out, "advice: %s\n", p->advice);
  }
  fprintf(out, "\nalternatives\n");
  for (int i = 0; i < p->nalts; i++) {
    const Candidate *x = &p->alts[i];
    if (x->fits)
      fprintf(out, "  step %.3f s, MFU %.1f%%: %s\n", x->cost.step, 100 * x->cost.mfu, choice_text(&m, &x->ch));
    else
      fprintf(out, "  rejected, %s: %s\n", report_overs(&m, x), choice_text(&m, &x->ch));
  }
  fprintf(out, "\nsearch     %d candidates", p->ncandidates);
  if (timing) fprintf(out, " (%d packed) in %.1f ms", p->npacked, 1e3 * p->search_seconds);
  fprintf(out, "\n");
  mem_free(&m);
}

void report_plan_text(FILE *out, const Plan *p, bool timing) { wrapped(out, p, timing, plan_text); }

static void headline(FILE *out, const Plan *p, bool timing) {
  (void)timing;
  Mem m = {0};
  const Candidate *c = &p->best;
  if (!p->ncandidates)
    fprintf(out, "NO FEASIBLE PLAN: no layout: %s\n\n", p->advice);
  else
    fprintf(out, "NO FEASIBLE PLAN: nothing fits on %lld GPUs; closest candidate (the least overage, all tiers "
                 "together): %s; %s\nadvice: %s\n(its memory below, and again at the end with the rejected "
                 "alternatives)\n\n", (long long)p->world, choice_text(&m, &c->ch), report_overs(&m, c), p->advice);
  mem_free(&m);
}

void report_plan_headline(FILE *out, const Plan *p) {
  if (!p->feasible) wrapped(out, p, false, headline);
}

static void summary(FILE *out, const Plan *p, bool timing) {
  (void)timing;
  Mem m = {0};
  const Candidate *c = &p->best;
  char a[32], b[32];
  units_fmt_bytes_bin(a, sizeof a, (double)c->live_peak[TIER_HBM]);
  units_fmt_bytes_bin(b, sizeof b, (double)c->capacity[TIER_HBM]);
  bool cpu = cpu_ranks(p);
  if (p->feasible)
    fprintf(out, "plan: %s; %s %s of %s; predicted step %.3g s, %.0f tokens/s per %s, MFU %.1f%%%s\n",
            choice_text(&m, &c->ch), cpu ? "memory per rank" : "HBM", a, b, c->cost.step,
            c->cost.tokens_per_s_per_gpu, cpu ? "rank" : "GPU", 100 * c->cost.mfu,
            cpu ? " of the preset's assumed rate per rank" : "");
  if (p->feasible) fprintf(out, "  (%s)\n", report_provenance(&m, p->md->spec, true));
  if (p->feasible && p->batch_note) fprintf(out, "note: %s\n", p->batch_note);
  if (!p->feasible && p->ncandidates)
    fprintf(out, "plan: nothing fits; closest: %s; advice: %s\n", report_overs(&m, c), p->advice);
  mem_free(&m);
}

void report_summary(FILE *out, const Plan *p) { summary(out, p, false); }

/* The fastest plan with its EP group inside a node against the fastest with EP groups across
 * nodes, component by component, and the components that decided it. */
static void explain_ep(FILE *out, Mem *m, const Plan *p) {
  if (!p->feasible || !p->has_in_node || !p->has_across) {
    if (p->feasible && p->md->spec->model.moe.present && !p->has_across)
      fprintf(out, "\nEP across nodes: no plan with ep > gpus_per_node fits or is allowed (ep must be a multiple "
                   "of gpus_per_node dividing the experts and fsdp, or pinned otherwise)\n");
    return;
  }
  const Candidate *a = &p->in_node, *b = &p->across;
  bool won_in = p->best.ch.ep <= p->md->spec->cluster.gpus_per_node;
  fprintf(out, "\nEP inside a node against EP across nodes (the best of each)\n");
  fprintf(out, "  in a node   %s\n              step %.3f s%s\n", choice_text(m, &a->ch), a->cost.step,
          won_in ? " (chosen)" : "");
  fprintf(out, "  across      %s\n              step %.3f s%s\n", choice_text(m, &b->ch), b->cost.step,
          won_in ? "" : " (chosen)");
  struct { const char *name; double x, y; } rows[] = {
      {"compute", a->cost.compute, b->cost.compute},
      {"exposed FSDP communication", a->cost.exposed_comm, b->cost.exposed_comm},
      {"MoE all-to-all", a->cost.a2a, b->cost.a2a},
      {"exposed activation offload", a->cost.exposed_offload, b->cost.exposed_offload},
      {"optimizer step", a->cost.optimizer, b->cost.optimizer},
      {"data-parallel all-reduce", a->cost.dp_allreduce, b->cost.dp_allreduce}};
  fprintf(out, "  %-28s %12s %12s %12s\n", "seconds per step", "in a node", "across", "across - in");
  int most = 0;
  for (int i = 0; i < 6; i++) {
    double dlt = rows[i].y - rows[i].x;
    fprintf(out, "  %-28s %12.3f %12.3f %+12.3f\n", rows[i].name, rows[i].x, rows[i].y, dlt);
    double best = rows[most].y - rows[most].x;
    if (won_in ? dlt > best : dlt < best) most = i;
  }
  const Spec *s = p->md->spec;
  double gpn = (double)s->cluster.gpus_per_node, k = (double)s->model.moe.top_k;
  const char *how = mem_printf(m, "%lld of the %lld peers of the all-to-all are on other nodes: their share of the "
                               "token copies goes over InfiniBand", (long long)(b->ch.ep - (int64_t)gpn),
                               (long long)(b->ch.ep - 1));
  if (b->ch.dispatch == DISPATCH_HIERARCHICAL) { /* copies per token over IB: cost_all_to_all_hier's */
    how = mem_printf(m, "the all-to-all is hierarchical: a token crosses InfiniBand once per other node holding one "
                     "of its experts, %.2f of its %.0f copies on average (flat: %.2f)%s, then NVLink inside the node",
                     cost_remote_nodes(s, b->ch.ep, s->model.moe.top_k), k, k * ((double)b->ch.ep - gpn) / (double)b->ch.ep,
                     s->model.moe.n_group > 1 ? " with group-limited routing" : "");
  }
  /* bf16 bytes one rank gathers for its largest MoE layer: dense part + its experts / ep */
  double dense = 0, routed = 0;
  for (int l = 0; l < p->md->nlayers; l++)
    if (p->md->layers[l].routed_params > routed)
      routed = (double)p->md->layers[l].routed_params,
      dense = (double)(p->md->layers[l].params - p->md->layers[l].routed_params);
  fprintf(out, "  why: %s wins by %.3f s, most of it in %s. Across nodes, %s (%.0f GB/s per GPU against "
               "NVLink's %.0f GB/s per pair); across nodes also shrinks what FSDP gathers: a MoE layer is "
               "%.2f GB per rank with ep %lld against %.2f GB with ep %lld (experts / ep per rank, sharded over "
               "fsdp / ep ranks)\n",
          won_in ? "EP inside a node" : "EP across nodes", fabs(b->cost.step - a->cost.step), rows[most].name, how,
          s->cluster.links.internode / 1e9, s->cluster.links.nvlink / 1e9,
          2 * (dense + routed / (double)b->ch.ep) / 1e9, (long long)b->ch.ep,
          2 * (dense + routed / (double)a->ch.ep) / 1e9, (long long)a->ch.ep);
}

/* The best plan of each context-parallel degree the search tried, side by side, and why the
 * chosen one wins: per rank a larger cp holds 1 / cp of each sequence's activations and does
 * 1 / cp of its attention, but all-gathers the keys and values of the whole sequences per layer
 * and (with the batch fixed) reads fewer sequences at a time, so more micro-batches per step. */
static void explain_cp(FILE *out, Mem *m, const Plan *p) {
  if (p->nby_cp < 2) return;
  const Choice *won = &p->best.ch;
  fprintf(out, "\ncontext parallelism: the best plan of each cp tried\n");
  fprintf(out, "  %4s %9s %9s %9s %9s %9s %9s  %s\n", "cp", "step s", "compute", "FSDP exp", "K/V exp", "all2all",
          "HBM GiB", "layout");
  for (int i = 0; i < p->nby_cp; i++) {
    const Candidate *x = &p->by_cp[i];
    bool chosen = p->feasible && plan_cp(&x->ch) == plan_cp(won);
    if (x->fits)
      fprintf(out, "  %4lld %9.3f %9.3f %9.3f %9.3f %9.3f %9.1f  %s%s\n", (long long)plan_cp(&x->ch), x->cost.step,
              x->cost.compute, x->cost.exposed_comm, x->cost.cp_exchange, x->cost.a2a,
              (double)x->arena[TIER_HBM] / 1073741824.0, choice_text(m, &x->ch), chosen ? " (chosen)" : "");
    else
      fprintf(out, "  %4lld  rejected: %s  %s\n", (long long)plan_cp(&x->ch), report_overs(m, x), choice_text(m, &x->ch));
  }
  if (!p->feasible) return;
  const Candidate *runner = NULL; /* the fastest fitting plan of another cp */
  for (int i = 0; i < p->nby_cp; i++)
    if (p->by_cp[i].fits && plan_cp(&p->by_cp[i].ch) != plan_cp(won) && (!runner || p->by_cp[i].cost.step < runner->cost.step))
      runner = &p->by_cp[i];
  const Spec *s = p->md->spec;
  int64_t cp = plan_cp(won);
  if (!runner) {
    fprintf(out, "  why: only cp %lld fits: every other cp tried is over a memory tier (above)\n", (long long)cp);
    return;
  }
  const Cost *a = &p->best.cost, *b = &runner->cost;
  struct { const char *name; double d; } rows[] = {
      {"compute", b->compute - a->compute}, {"exposed FSDP communication", b->exposed_comm - a->exposed_comm},
      {"K/V exchange", b->cp_exchange - a->cp_exchange}, {"MoE all-to-all", b->a2a - a->a2a},
      {"activation offload", b->exposed_offload - a->exposed_offload}, {"optimizer step", b->optimizer - a->optimizer}};
  int most = 0;
  for (int i = 1; i < 6; i++)
    if (rows[i].d > rows[most].d) most = i;
  fprintf(out, "  why: cp %lld wins by %.3f s over cp %lld (%s), most of it in %s (%+.3f s). Per GPU a micro-batch of "
               "%lld sequence(s) is %lld tokens with cp %lld against %lld with cp %lld (%lld micro-batches a step "
               "against %lld); a larger cp shrinks every activation and the attention per rank by cp but all-gathers "
               "each layer's keys and values over the cp group (exposed above when the attention on the rank's "
               "own keys cannot hide it)\n",
          (long long)cp, b->step - a->step, (long long)plan_cp(&runner->ch), choice_text(m, &runner->ch),
          rows[most].name, rows[most].d, (long long)won->micro_batch,
          (long long)(won->micro_batch * s->training.seq_len / cp), (long long)cp,
          (long long)(runner->ch.micro_batch * s->training.seq_len / plan_cp(&runner->ch)),
          (long long)plan_cp(&runner->ch), (long long)won->accum, (long long)runner->ch.accum);
}

static void explain(FILE *out, const Plan *p, bool timing) {
  (void)timing;
  Mem m = {0};
  const Candidate *c = &p->best;
  if (!p->ncandidates) {
    fprintf(out, "no layout: %s\n", p->advice);
    mem_free(&m);
    return;
  }
  if (p->feasible)
    fprintf(out, "chosen     %s\n           step %.3f s, %.0f tokens/s per GPU, MFU %.1f%%; bottleneck: %s\n"
                 "           (%s)\n",
            choice_text(&m, &c->ch), c->cost.step, c->cost.tokens_per_s_per_gpu, 100 * c->cost.mfu,
            c->cost.bottleneck, report_provenance(&m, p->md->spec, true));
  else
    fprintf(out, "nothing fits; closest: %s, %s\nadvice: %s\n", choice_text(&m, &c->ch), report_overs(&m, c),
            p->advice);
  explain_ep(out, &m, p);
  explain_cp(out, &m, p);
  fprintf(out, "\nalternatives (fitting ones by step time, then rejected ones by overage)\n");
  for (int i = 0; i < p->nalts;) {
    const Candidate *x = &p->alts[i];
    if (x->fits) {
      fprintf(out, "  %2d. %s\n      step %.3f s (%+.1f%%), MFU %.1f%%\n", i + 1, choice_text(&m, &x->ch),
              x->cost.step, p->feasible ? 100 * (x->cost.step / c->cost.step - 1) : 0, 100 * x->cost.mfu);
      i++;
      continue;
    }
    /* rejected ones with the same overage: one line for the reason, then their layouts */
    const char *why = report_overs(&m, x);
    int j = i + 1;
    while (j < p->nalts && !p->alts[j].fits && strcmp(report_overs(&m, &p->alts[j]), why) == 0) j++;
    if (j - i == 1)
      fprintf(out, "  %2d. %s\n      rejected: %s\n", i + 1, choice_text(&m, &x->ch), why);
    else {
      fprintf(out, "  %2d.-%d. %d layouts rejected: %s\n", i + 1, j, j - i, why);
      for (int k = i; k < j; k++) fprintf(out, "      - %s\n", choice_text(&m, &p->alts[k].ch));
    }
    i = j;
  }
  fprintf(out, "\n%d candidates evaluated\n", p->ncandidates);
  mem_free(&m);
}

void report_explain(FILE *out, const Plan *p) { explain(out, p, false); } /* (one line per item, for grep) */

static json_t *jint(int64_t v) { return json_integer((json_int_t)v); }

void report_plan_json(void *rootp, const Plan *p, bool timing) {
  json_t *root = rootp;
  const Model *md = p->md;
  const Spec *s = md->spec;
  const Candidate *c = &p->best;
  const Choice *ch = &c->ch;
  json_object_set_new(root, "feasible", json_boolean(p->feasible));
  json_t *lay = json_object();
  json_object_set_new(lay, "world", jint(p->world));
  json_object_set_new(lay, "fsdp", jint(ch->fsdp));
  json_object_set_new(lay, "ep", jint(ch->ep));
  json_object_set_new(lay, "dp_replicate", jint(ch->dp_replicate));
  json_object_set_new(lay, "expert_shard", jint(ch->efsdp));
  json_object_set_new(lay, "grad_accum", jint(ch->accum));
  json_object_set_new(lay, "tp", json_integer(1));
  json_object_set_new(lay, "pp", json_integer(1));
  json_object_set_new(lay, "cp", jint(plan_cp(ch)));
  json_object_set_new(lay, "prefetch", json_integer(ch->prefetch));
  json_object_set_new(lay, "micro_batch", jint(ch->micro_batch));
  json_object_set_new(lay, "reshard", json_string(plan_reshard_name(ch->reshard)));
  json_object_set_new(lay, "reshard_experts", json_string(plan_reshard_name(ch->reshard_experts)));
  json_object_set_new(lay, "moe_dispatch", json_string(ch->dispatch == DISPATCH_HIERARCHICAL ? "hierarchical" : "flat"));
  /* nodes one EP group spans: 1 inside a node, else ep / gpus_per_node whole nodes */
  json_object_set_new(lay, "ep_nodes", jint(ch->ep > s->cluster.gpus_per_node ? ch->ep / s->cluster.gpus_per_node : 1));
  /* the imbalance the MoE buffers are sized by: the spec's, capped at its physical maximum */
  json_object_set_new(lay, "moe_imbalance", json_real(plan_moe_imbalance(s, ch->ep)));
  json_object_set_new(root, "layout", lay);
  json_t *tr = json_object();
  json_object_set_new(tr, "optimizer", json_string(s->training.optimizer == OPT_MUON ? "muon" : "adamw"));
  json_object_set_new(tr, "grad_reduce_dtype", json_string(s->training.grad_reduce_dtype == WIRE_BF16 ? "bf16" : "fp32"));
  json_object_set_new(tr, "micro_batch", jint(s->training.micro_batch));
  json_object_set_new(tr, "global_batch", jint(s->training.global_batch));
  json_object_set_new(tr, "seq_len", jint(s->training.seq_len));
  json_object_set_new(tr, "tokens_per_step", jint(s->training.global_batch * s->training.seq_len));
  json_object_set_new(root, "training", tr);
  json_t *cl = json_object(); /* what MFU is measured against: tools read it from here */
  json_object_set_new(cl, "gpus_per_node", jint(s->cluster.gpus_per_node));
  json_object_set_new(cl, "topology", json_string(s->cluster.links.topology == TOPO_NVSWITCH ? "nvswitch" : "mesh"));
  json_object_set_new(cl, "peak_bf16_flops_per_gpu", json_real(s->cluster.gpu.bf16_flops));
  json_object_set_new(cl, "stack", json_string(spec_stack_name(s->cluster.stack))); /* whose kernels were priced */
  json_object_set_new(root, "cluster", cl);

  int64_t T = s->training.micro_batch * s->training.seq_len / plan_cp(ch), offloaded = 0;
  for (int i = 0; i < c->nitems; i++)
    if (c->items[i].cat == CAT_ACTIVATIONS && c->items[i].tier != TIER_HBM) offloaded += c->items[i].bytes;
  json_t *ck = json_object();
  json_object_set_new(ck, "policy", json_string(plan_ac_name(ch->ac)));
  json_object_set_new(ck, "offload", json_string(plan_offload_name(ch->offload)));
  json_object_set_new(ck, "boundary_bytes_per_gpu", jint(2 * s->model.hidden * T * md->nlayers));
  json_object_set_new(ck, "offloaded_bytes_per_gpu", jint(offloaded));
  json_object_set_new(root, "checkpoint", ck);

  json_t *mem = json_object();
  for (int t = 0; t < TIER__COUNT; t++) {
    if (!c->capacity[t] && !c->arena[t]) continue;
    json_t *tier = json_object();
    json_object_set_new(tier, "capacity", jint(c->capacity[t]));
    json_object_set_new(tier, "peak", jint(c->arena[t]));
    json_object_set_new(tier, "live_peak", jint(c->live_peak[t]));
    json_t *items = json_array();
    for (int i = 0; i < c->nitems; i++) {
      const MemItem *x = &c->items[i];
      if (x->tier != (Tier)t) continue;
      json_t *o = json_object();
      json_object_set_new(o, "name", json_string(x->name));
      json_object_set_new(o, "category", json_string(plan_cat_name(x->cat)));
      json_object_set_new(o, "bytes", jint(x->bytes));
      json_object_set_new(o, "offset", jint(x->offset));
      json_object_set_new(o, "start_phase", json_integer(x->start));
      json_object_set_new(o, "end_phase", json_integer(x->end));
      json_object_set_new(o, "formula", json_string(x->formula));
      json_array_append_new(items, o);
    }
    json_object_set_new(tier, "items", items);
    json_object_set_new(mem, plan_tier_name((Tier)t), tier);
  }
  json_object_set_new(mem, "optimizer_state_tier", json_string(plan_tier_name(ch->opt_tier)));
  json_object_set_new(mem, "optimizer_step_on", json_string(ch->opt_on_host ? "host" : "gpu"));
  json_object_set_new(root, "memory", mem);

  if (p->feasible) {
    const Cost *k = &c->cost;
    json_t *pr = json_object();
    json_object_set_new(pr, "step_seconds", json_real(k->step));
    json_object_set_new(pr, "tokens_per_second_per_gpu", json_real(k->tokens_per_s_per_gpu));
    json_object_set_new(pr, "mfu", json_real(k->mfu));
    json_object_set_new(pr, "exposed_comm_seconds", json_real(k->exposed_comm));
    json_object_set_new(pr, "bottleneck", json_string(k->bottleneck));
    json_t *br = json_object();
    json_object_set_new(br, "compute", json_real(k->compute));
    json_object_set_new(br, "recompute", json_real(k->recompute));
    json_object_set_new(br, "exposed_comm", json_real(k->exposed_comm));
    json_object_set_new(br, "moe_all_to_all", json_real(k->a2a));
    json_object_set_new(br, "cp_kv_exchange", json_real(k->cp_exchange));
    json_object_set_new(br, "exposed_offload", json_real(k->exposed_offload));
    json_object_set_new(br, "host_grad_accumulation", json_real(k->host_grad));
    json_object_set_new(br, "optimizer", json_real(k->optimizer));
    json_object_set_new(br, "dp_all_reduce", json_real(k->dp_allreduce));
    json_object_set_new(pr, "breakdown", br);
    const EvidenceSpec *ev = &s->cluster.evidence; /* where the rates come from (cluster.evidence) */
    json_t *pv = json_object(), *kind[3] = {json_array(), json_array(), json_array()};
    for (int i = 0; spec_efficiency_key(i); i++) {
      const char *key = spec_efficiency_key(i);
      json_array_append_new(kind[listed(ev->measured, key) ? 0 : listed(ev->fitted, key) ? 1 : 2], json_string(key));
    }
    json_object_set_new(pv, "measured", kind[0]);
    json_object_set_new(pv, "fitted", kind[1]);
    json_object_set_new(pv, "assumed", kind[2]);
    json_object_set_new(pv, "band_low", json_real(ev->band_low));
    json_object_set_new(pv, "band_high", json_real(ev->band_high));
    json_object_set_new(pv, "band_rows", jint(ev->band_rows));
    if (ev->band_source) json_object_set_new(pv, "band_source", json_string(ev->band_source));
    json_object_set_new(pv, "program_ratio", json_real(ev->program_ratio));
    if (ev->program_source) json_object_set_new(pv, "program_source", json_string(ev->program_source));
    json_object_set_new(pv, "time_factor", json_real(report_time_factor(s, NULL)));
    json_object_set_new(pr, "provenance", pv);
    if (p->hint) json_object_set_new(pr, "hint", json_string(p->hint));
    if (p->batch_note) json_object_set_new(pr, "batch_note", json_string(p->batch_note));
    json_object_set_new(root, "predicted", pr);
  } else {
    json_t *why = json_object();
    if (p->ncandidates) {
      json_object_set_new(why, "closest_tier", json_string(plan_tier_name(c->over_tier)));
      json_object_set_new(why, "closest_over_bytes", jint(c->over_bytes));
      json_t *over = json_array(); /* every tier the closest candidate overflows */
      for (int t = 0; t < TIER__COUNT; t++)
        if (c->arena[t] > c->capacity[t])
          json_array_append_new(over, json_pack("{s:s, s:I, s:I}", "tier", plan_tier_name((Tier)t), "peak",
                                                (json_int_t)c->arena[t], "capacity", (json_int_t)c->capacity[t]));
      json_object_set_new(why, "over", over);
    }
    json_object_set_new(why, "advice", json_string(p->advice ? p->advice : ""));
    json_object_set_new(root, "infeasible", why);
  }
  const Placement *pl = p->placement;
  if (pl) {
    json_t *po = json_object();
    json_object_set_new(po, "ep_rank_of_fsdp_rank", json_string("fsdp_rank % ep"));
    json_object_set_new(po, "experts_per_ep_rank", jint(pl->experts_per_rank));
    int64_t per = plan_expert_per(pl->experts_per_rank, c->ch.efsdp);
    json_object_set_new(po, "expert_shards", json_string(per ? "whole" : "flat"));
    json_object_set_new(po, "experts_per_shard", jint(per));
    json_object_set_new(po, "optimizer_matrices", json_string(pl->muon ? "muon: one owner per matrix; experts owned where held when whole in one shard" : "adamw: elementwise shards"));
    if (pl->muon) {
      json_object_set_new(po, "expert_owner_rule",
                          json_string(per ? "expert first+k of a run is held whole and orthogonalized by fsdp rank ep_rank + ep * (k / per)"
                                          : "expert first+k of a run, when whole in one flat shard, is orthogonalized by its holder; "
                                            "when split, by fsdp rank ep_rank + ep * ((owner + k) % (fsdp / ep))"));
      json_object_set_new(po, "muon_moving_expert_matrices", jint(pl->moving_expert_matrices));
      json_object_set_new(po, "muon_moving_matrices", jint(pl->moving_matrices));
      json_object_set_new(po, "muon_moving_bytes_per_rank", json_real(pl->moving_bytes_rank));
      json_object_set_new(po, "muon_matrices", jint(pl->matrices));
      json_object_set_new(po, "ns_flops_total", json_real(pl->ns_flops_total));
      json_object_set_new(po, "ns_flops_busiest_rank", json_real(pl->ns_flops_max_rank));
      json_t *dense = json_array(), *runs = json_array();
      for (int i = 0; i < pl->ndense; i++)
        json_array_append_new(dense, json_pack("{s:i, s:s, s:I}", "layer", pl->dense[i].layer, "matrix",
                                               pl->dense[i].matrix, "owner", (json_int_t)pl->dense[i].owner));
      for (int i = 0; i < pl->nruns; i++) {
        const ExpertRun *r = &pl->runs[i];
        json_array_append_new(runs, json_pack("{s:i, s:s, s:I, s:I, s:I, s:I, s:I}", "layer", r->layer, "matrix",
                                              r->matrix, "first", (json_int_t)r->first, "count", (json_int_t)r->count,
                                              "per", (json_int_t)r->per, "owner", (json_int_t)r->owner,
                                              "moving", (json_int_t)r->moving));
      }
      json_object_set_new(po, "dense_owners", dense);
      json_object_set_new(po, "expert_runs_ep_rank_0", runs);
      json_object_set_new(po, "expert_runs_of_ep_rank_r",
                          json_string("those of EP rank 0 with first + r * experts_per_ep_rank; layer, matrix, count, per, "
                                      "owner and moving the same"));
    }
    json_object_set_new(root, "placement", po);
  }
  if (s->model.moe.present && p->ncandidates) {
    Mem m = {0};
    double rows;
    const char *path, *why;
    int64_t lr = expert_path(&m, p, &rows, &path, &why);
    json_t *ex = json_object();
    json_object_set_new(ex, "path", json_string(path));
    json_object_set_new(ex, "loop_from_rows", jint(lr));
    json_object_set_new(ex, "rows_per_expert", json_real(rows));
    json_object_set_new(ex, "why", json_string(why));
    json_object_set_new(root, "experts", ex);
    mem_free(&m);
  }
  json_t *se = json_object();
  json_object_set_new(se, "candidates", json_integer(p->ncandidates));
  if (timing) json_object_set_new(se, "seconds", json_real(p->search_seconds));
  json_object_set_new(root, "search", se);
}
