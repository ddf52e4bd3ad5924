/* sweep.c — `mtc sweep`: the best plan for every point of a grid of spec values, one row
 * each ("how many nodes do I need for 128K tokens?"). */
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

enum { SWEEP_MAX_POINTS = 10000 };
enum { SWEEP_MAX_PROV = 8 }; /* distinct provenance footnotes a sweep prints (points of other clusters) */

typedef struct {
  const char *key;
  char **vals;
  int n;
} Axis;

/* Splits "KEY=V1,V2,..." into an axis; false with a message if malformed. */
static bool parse_over(Mem *m, const char *arg, Axis *ax, Diag *d) {
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg || !eq[1])
    return diag_error(d, (Loc){0}, "--over '%s' needs KEY=V1,V2,...; expected e.g. --over "
                                   "cluster.nodes=24,48,96", arg);
  ax->key = mem_strndup(m, arg, (size_t)(eq - arg));
  int n = 1;
  for (const char *c = eq + 1; *c; c++) n += *c == ',';
  ax->vals = mem_array(m, (size_t)n, sizeof *ax->vals);
  ax->n = 0;
  for (const char *p = eq + 1;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (!len) return diag_error(d, (Loc){0}, "--over '%s' has an empty value; expected V1,V2,...", arg);
    ax->vals[ax->n++] = mem_strndup(m, p, len);
    if (!comma) break;
    p = comma + 1;
  }
  return true;
}

/* Point pt of the grid (the last axis fastest): idx its value per axis, then the spec (in
 * *spec) and model of path with the --set overrides and the point's --over values, in m. NULL
 * (an error in d, naming the --over argument and value where one is bad) when the point's spec
 * or model is invalid. */
static Model *load_point(Mem *m, Diag *d, const char *path, const Axis *ax, const char *const *overs, int nover,
                         int64_t pt, int *idx, const char *const *sets, int nsets, Spec **spec) {
  int64_t rest = pt;
  for (int i = nover - 1; i >= 0; i--) idx[i] = (int)(rest % ax[i].n), rest /= ax[i].n;
  *spec = spec_load_point(m, d, path, sets, nsets, overs, idx, nover);
  return *spec ? model_build(m, d, *spec) : NULL;
}

int sweep_run(const char *path, const char *const *sets, int nsets, const char *const *overs,
              int nover, bool csv) {
  Mem mem = {0};
  Diag d = {.mem = &mem};
  Axis *ax = mem_array(&mem, (size_t)nover + 1, sizeof *ax);
  int64_t points = 1;
  for (int i = 0; i < nover; i++) {
    if (!parse_over(&mem, overs[i], &ax[i], &d)) goto bad;
    for (int j = 0; j < i; j++)
      if (strcmp(ax[j].key, ax[i].key) == 0) { /* the later --over would silently win at every point */
        diag_error(&d, (Loc){0}, "--over %s is given twice ('%s' and '%s'); expected each key once, with all its "
                   "values in one list (--over %s=V1,V2,...)", ax[i].key, overs[j], overs[i], ax[i].key);
        goto bad;
      }
    points *= ax[i].n;
    if (points > SWEEP_MAX_POINTS) {
      diag_error(&d, (Loc){0}, "the grid has more than %d points; expected fewer --over values", SWEEP_MAX_POINTS);
      goto bad;
    }
  }
  int *idx = mem_array(&mem, (size_t)nover + 1, sizeof *idx);
  /* every point's spec and model first, so that a bad value is an error before any row (exit 2
   * with a table cut short read as a result) */
  for (int64_t pt = 0; pt < points; pt++) {
    Mem m = {0};
    Diag pd = {.mem = &m};
    Spec *s;
    if (!load_point(&m, &pd, path, ax, overs, nover, pt, idx, sets, nsets, &s)) {
      fputs(pd.msg, stderr);
      mem_free(&m);
      mem_free(&mem);
      return EXIT_BAD_INPUT;
    }
    mem_free(&m);
  }
  const char *sep = csv ? "," : " ";
  const char *provs[SWEEP_MAX_PROV];
  int nprov = 0;
  for (int i = 0; i < nover; i++) printf(csv ? "%s%s" : "%-14s%s", ax[i].key, sep);
  if (csv)
    printf("fits,fsdp,dp_replicate,ep,cp,checkpoint,offload,optimizer_state,prefetch,micro_batch,reshard,tokens_per_s_per_gpu,mfu,hbm_peak_bytes,host_peak_bytes,step_seconds,tokens_per_step,bottleneck_or_reason\n");
  else
    printf("%-4s %-11s %-3s %-3s %-9s %-5s %-8s %-2s %-4s %-5s %10s %6s %9s %9s %9s %12s  %s\n", "fits", "fsdp x dp", "ep", "cp",
           "ckpt", "offl", "opt", "pf", "mb", "keep", "tok/s/GPU", "MFU", "HBM GiB", "host GiB", "step s", "tokens/step",
           "bottleneck / why not");
  for (int64_t pt = 0; pt < points; pt++) {
    Mem m = {0};
    Diag pd = {.mem = &m};
    Spec *s;
    Model *md = load_point(&m, &pd, path, ax, overs, nover, pt, idx, sets, nsets, &s);
    if (!md) {
      fputs(pd.msg, stderr);
      mem_free(&m);
      mem_free(&mem);
      return EXIT_BAD_INPUT;
    }
    Plan *p = plan_search_bare(&m, md); /* (a row shows neither advice nor hint) */
    const char *prov = report_provenance(&m, s, true); /* the footnote: each distinct one once */
    bool seen = false;
    for (int i = 0; i < nprov && !seen; i++) seen = strcmp(provs[i], prov) == 0;
    if (!seen && nprov < SWEEP_MAX_PROV) provs[nprov++] = mem_printf(&mem, "%s", prov);
    for (int i = 0; i < nover; i++) printf(csv ? "%s%s" : "%-14s%s", ax[i].vals[idx[i]], sep);
    const Candidate *c = &p->best;
    const Choice *ch = &c->ch;
    char why[200] = "";
    if (!p->feasible && p->ncandidates) {
      char b[32];
      units_fmt_bytes_bin(b, sizeof b, (double)c->over_bytes);
      snprintf(why, sizeof why, "%s over by %s", plan_tier_name(c->over_tier), b);
    } else if (!p->feasible) {
      snprintf(why, sizeof why, "no layout: global_batch %lld is not a multiple of %lld GPUs x micro_batch %lld%s",
               (long long)s->training.global_batch, (long long)p->world, (long long)s->training.micro_batch,
               s->plan.cp == 1 ? "" : " / cp for any cp");
    }
    const char *opt = ch->opt_tier == TIER_HBM ? "hbm" : ch->opt_on_host ? "host-cpu" : "host";
    int64_t tokens = s->training.global_batch * s->training.seq_len; /* (grows with seq_len when global_batch counts sequences) */
    char tok[32];
    units_fmt_int(tok, sizeof tok, tokens);
    if (csv) {
      printf("%s,%lld,%lld,%lld,%lld,%s,%s,%s,%d,%lld,%s,%.1f,%.4f,%lld,%lld,%.3f,%lld,%s\n", p->feasible ? "yes" : "no",
             (long long)ch->fsdp, (long long)ch->dp_replicate, (long long)ch->ep, (long long)plan_cp(ch), plan_ac_name(ch->ac),
             plan_offload_name(ch->offload), opt, ch->prefetch, (long long)ch->micro_batch,
             ch->reshard == ch->reshard_experts
                 ? plan_reshard_name(ch->reshard)
                 : ch->reshard == RESHARD_AFTER_STEP ? "dense:after_step experts:every_micro_batch"
                                                     : "dense:every_micro_batch experts:after_step",
             p->feasible ? c->cost.tokens_per_s_per_gpu : 0,
             p->feasible ? c->cost.mfu : 0, (long long)c->arena[TIER_HBM], (long long)c->arena[TIER_HOST],
             p->feasible ? c->cost.step : 0, (long long)tokens, p->feasible ? c->cost.bottleneck : why);
    } else {
      char lay[32];
      snprintf(lay, sizeof lay, "%lld x %lld", (long long)ch->fsdp, (long long)ch->dp_replicate);
      if (p->feasible)
        printf("%-4s %-11s %-3lld %-3lld %-9s %-5s %-8s %-2d %-4lld %-5s %10.0f %5.1f%% %9.1f %9.1f %9.2f %12s  %s\n", "yes", lay,
               (long long)ch->ep, (long long)plan_cp(ch), plan_ac_name(ch->ac), plan_offload_name(ch->offload), opt, ch->prefetch,
               (long long)ch->micro_batch, ch->reshard == ch->reshard_experts ? ch->reshard == RESHARD_AFTER_STEP ? "step" : "micro"
               : ch->reshard == RESHARD_AFTER_STEP ? "stp-d" : "stp-e",
               c->cost.tokens_per_s_per_gpu,
               100 * c->cost.mfu, (double)c->arena[TIER_HBM] / 0x1p30, (double)c->arena[TIER_HOST] / 0x1p30,
               c->cost.step, tok, c->cost.bottleneck);
      else
        printf("%-4s %-11s %-3s %-3s %-9s %-5s %-8s %-2s %-4s %-5s %10s %6s %9s %9s %9s %12s  %s\n", "no",
               p->ncandidates ? lay : "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", tok, why);
    }
    mem_free(&m);
  }
  if (!csv) fputs("\nwhere the predictions (step, tokens/s, MFU) come from:\n", stdout);
  for (int i = 0; i < nprov && !csv; i++) report_wrap(stdout, mem_printf(&mem, "  - %s\n", provs[i]));
  if (!csv)
    fputs("\ncolumns: fits: the plan fits every memory tier; fsdp x dp: FSDP group x its replicas; ep: expert-parallel\n"
          "  ranks; cp: context-parallel ranks; ckpt: activation checkpointing (none, selective, full); offl: where\n"
          "  layer-boundary activations wait for the backward (none: HBM, host, nvme); opt: where the optimizer state\n"
          "  lives (hbm, host; host-cpu: host, stepped by the host CPU); pf: all-gathers in flight ahead (prefetch);\n"
          "  mb: sequences per GPU per micro-batch; keep: when gathered parameters are freed (micro: after each\n"
          "  micro-batch, step: kept until the optimizer step, stp-d: the dense ones kept and the routed experts\n"
          "  freed, stp-e: the experts kept); tok/s/GPU, MFU, step s: predicted; HBM GiB, host GiB: packed peaks per\n"
          "  GPU; tokens/step: global_batch x seq_len (it grows with seq_len unless the spec gives\n"
          "  training.global_batch_tokens); bottleneck: the largest term of the predicted step\n", stdout);
  mem_free(&mem);
  return EXIT_DONE;
bad:
  fputs(d.msg, stderr);
  mem_free(&mem);
  return EXIT_BAD_INPUT;
}
