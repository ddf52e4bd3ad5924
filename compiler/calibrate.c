/* calibrate.c — `mtc calibrate PROFILE... --preset NAME -o PRESET.yaml`: fits a cluster preset's
 * cost-model factors to what `train --profile` measured, and writes the preset with them.
 *
 * Each factor prices one op class of the profile (runtime/mtrt_profile.h) in the cost model
 * (cost_kernel.c): its time is work / (rate × factor), work the class's FLOPs or bytes and rate
 * the preset's figure (gpu.bf16_flops × efficiency.sustained for GEMMs and attention,
 * gpu.hbm_bandwidth for the memory-bound classes). Over the profiles i, least squares of the
 * measured seconds m_i against that model, in 1/factor:
 *     factor = Σ w_i² / (rate · Σ w_i m_i)
 * (one profile: factor = w / (rate · m)). The memory-bound classes (norm, rope, activation,
 * loss, permute, elementwise) share efficiency.elementwise: their bytes and seconds are summed
 * per profile first. The optimizer step fits efficiency.optimizer_update from the bytes the
 * cost model counts for it (30 B per AdamW parameter of the rank's shard, 22 per Muon one) at
 * hbm_bandwidth, when the step ran on the device. Factors with no measurement in any profile
 * keep the preset's value.
 *
 * The collectives of a profile of more than one rank fit the link factors the same way, their
 * work the bytes a rank sends and their rate the link the cost model (cost.c) prices them on:
 * efficiency.network from the all-gathers, reduce-scatters and all-reduces (ring bytes
 * (g − 1)/g of the buffer, a group of g = fsdp ranks, the world's for the all-reduce, over
 * links.nvlink behind an NVSwitch, (g − 1) pair links in a mesh, links.internode when the
 * group spans nodes), efficiency.all_to_all from the MoE exchange (the rows sent to the other
 * ep − 1 ranks over ep − 1 pair links of links.nvlink; an EP group across nodes is not fitted).
 * The rate then differs per profile, so the fit is in u_i = w_i / rate_i, the seconds at the
 * full rate: factor = Σ u_i² / Σ u_i m_i. Seconds are the time a rank is blocked in the
 * collective: a transfer hidden behind compute makes the link look faster than it is (a fit
 * above 1 is refused, as for the memory-bound factors). A compute factor above 1 (a GEMM faster
 * than the preset's gpu.bf16_flops, as a real core is than the cpu preset's guess) raises
 * gpu.bf16_flops to the fastest measured rate instead, with a comment saying so, and the compute
 * factors are fitted against that. A profile of the cpu backend fits only a cpu preset (gpu.name
 * "cpu ..."), a cuda one only a GPU preset: anything else is refused.
 *
 * The output is the base preset's text with the fitted keys of its efficiency section
 * rewritten, each with a comment citing the profiles and the figures it came from instead of
 * its old comment (the comment lines right before it and its continuation lines); everything
 * else is kept. It is named by its file: put it in $MTC_PRESET_DIR and say cluster.preset: STEM. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "mtc.h"

enum { MAX_PROFILES = 64 };

typedef enum { RATE_PEAK, RATE_HBM, RATE_RING, RATE_A2A } RateKind;
typedef struct {
  const char *key;        /* efficiency.KEY */
  const char *classes[5]; /* profile classes whose work and seconds are summed into it */
  const char *unpriced[6]; /* classes whose seconds are added but not their work (below) */
  const char *what;       /* "flops" or "bytes" */
  RateKind rate;          /* bf16_flops × sustained, hbm_bandwidth, or the collective's link */
  bool multi_rank;        /* fitted from profiles of more than one rank only */
} Factor;

/* The cost model prices the norms, RoPE, the activations and the loss by their bytes, and not
 * the MoE permute or the residual adds, copies and zeroing (cost_kernel.c): their seconds go
 * into elementwise, their bytes do not, so that the fitted factor prices that time with the
 * bytes the model counts. So do the collectives of a 1-rank profile: with one rank they are
 * local copies (the all-gather's of the shard, the reduce-scatter's add), which the model does
 * not price either. */
static const char *const one_rank_copies[] = {"all_gather", "reduce_scatter", "all_reduce", NULL};
enum { F_ELEMENTWISE = 4 }; /* indices in factors[] */
static const Factor factors[] = {
    {"dense_gemm", {"gemm"}, {NULL}, "flops", RATE_PEAK, false},
    {"grouped_gemm", {"grouped_gemm"}, {NULL}, "flops", RATE_PEAK, false},
    {"attention", {"attention_fwd"}, {NULL}, "flops", RATE_PEAK, false},
    {"attention_bwd", {"attention_bwd"}, {NULL}, "flops", RATE_PEAK, false},
    {"elementwise", {"norm", "rope", "activation", "loss"}, {"permute", "elementwise"}, "bytes", RATE_HBM, false},
    {"network", {"all_gather", "reduce_scatter", "all_reduce"}, {NULL}, "bytes", RATE_RING, true},
    {"all_to_all", {"all_to_all"}, {NULL}, "bytes", RATE_A2A, true},
    {"optimizer_update", {"optimizer"}, {NULL}, "bytes", RATE_HBM, false},
};
enum { F_OPTIMIZER = 7 };
enum { NFACTORS = sizeof factors / sizeof factors[0] };

/* The preset text o with the fitted factors (have[f]) added to cluster.evidence.measured, which
 * reports print beside every prediction: the line rewritten with the base's words and these, or
 * added under `evidence:`, or the section added at the end. In m. */
static char *evidence_measured(Mem *m, char *o, const bool *have) {
  char *ev = strncmp(o, "evidence:", 9) == 0 ? o : strstr(o, "\nevidence:");
  if (ev && ev != o) ev++;
  if (!ev) ev = o = mem_printf(m, "%sevidence:\n", o), ev = strstr(o, "\nevidence:\n") + 1;
  char *body = strchr(ev, '\n') + 1, *end = body; /* the section: indented or comment lines */
  while (*end && (*end == ' ' || *end == '#' || *end == '\n')) end = strchr(end, '\n') ? strchr(end, '\n') + 1 : end + strlen(end);
  char *line = NULL;
  for (char *l = body; l < end; l = strchr(l, '\n') + 1)
    if (strncmp(l, "  measured:", 11) == 0) line = l;
  const char *old = "";
  if (line) {
    size_t n = strcspn(line + 11, "#\n");
    old = mem_printf(m, "%.*s", (int)n, line + 11);
  }
  char *words = mem_printf(m, "%s", old);
  while (*words == ' ') words++;
  size_t wl = strlen(words);
  while (wl && words[wl - 1] == ' ') words[--wl] = 0;
  for (int f = 0; f < NFACTORS; f++) {
    if (!have[f] || strstr(mem_printf(m, " %s ", words), mem_printf(m, " %s ", factors[f].key))) continue;
    words = mem_printf(m, "%s%s%s", words, words[0] ? " " : "", factors[f].key);
  }
  const char *mine = mem_printf(m, "  measured: %s   # with the factors fitted by mtc calibrate\n", words);
  if (line) {
    char *eol = strchr(line, '\n');
    return mem_printf(m, "%.*s%s%s", (int)(line - o), o, mine, eol ? eol + 1 : "");
  }
  return mem_printf(m, "%.*s%s%s", (int)(body - o), o, mine, body);
}

/* The base preset's rates, bytes or FLOPs per second (links: per GPU and direction). */
typedef struct {
  double peak, hbm, nvlink, internode;
  long gpus_per_node;
  bool nvswitch;
} Rates;

typedef struct {
  const char *path;
  double w[NFACTORS], s[NFACTORS]; /* work and seconds per step, per factor */
  double u[NFACTORS];              /* the work at the full rate: seconds, rate included */
  long world, fsdp, ep;
  char backend[16]; /* what measured it: "cpu" or "cuda"; "" when the profile does not say */
  char desc[512]; /* model, backend, device (the GPU's name, or "cpu"), ranks, steps */
} Profile;

/* The link rate of a collective class over a group of g ranks, as cost.c prices it; 0 when the
 * cost model does not price it that way (an all-to-all across nodes). */
static double link_rate(const Rates *r, const char *cls, long g) {
  if (g <= 1) return 0;
  if (strcmp(cls, "all_to_all") == 0) return g <= r->gpus_per_node ? (double)(g - 1) * r->nvlink : 0;
  if (g > r->gpus_per_node) return r->internode;
  return r->nvswitch ? r->nvlink : (double)(g - 1) * r->nvlink;
}

static bool bad(Diag *d, const char *path, const char *fmt, const char *field, const char *expected) {
  return diag_error(d, (Loc){0}, "%s: %s: %s; expected %s", path, field, fmt, expected);
}

static bool load_profile(Mem *m, Diag *d, const char *path, const Rates *r, Profile *p) {
  struct stat st; /* never waited on: a FIFO would block json_load_file */
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return diag_error(d, (Loc){0}, "%s: not a regular file; expected a profile that `train --profile FILE` wrote",
                      path);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root && je.line < 1)
    return diag_error(d, (Loc){0}, "%s: %s; expected a profile that `train --profile FILE` wrote", path, je.text);
  if (!root)
    return diag_error(d, (Loc){0}, "%s:%d:%d: %s; expected the JSON that `train --profile FILE` writes", path,
                      je.line, je.column, je.text);
  bool ok = false;
  *p = (Profile){.path = path};
  json_t *fmt = json_object_get(root, "format"), *cls = json_object_get(root, "classes");
  if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "mtc-profile-1") != 0) {
    bad(d, path, "missing or not \"mtc-profile-1\"", "format", "a profile from `train --profile FILE`");
    goto done;
  }
  if (!json_is_object(cls)) {
    bad(d, path, "missing or not an object", "classes", "an object of op classes");
    goto done;
  }
  json_t *world = json_object_get(root, "world");
  json_t *fsdp = json_object_get(root, "fsdp"), *ep = json_object_get(root, "ep");
  p->world = json_is_integer(world) ? (long)json_integer_value(world) : 1;
  p->fsdp = json_is_integer(fsdp) ? (long)json_integer_value(fsdp) : p->world;
  p->ep = json_is_integer(ep) ? (long)json_integer_value(ep) : 1;
  for (int f = 0; f < NFACTORS; f++) {
    if (factors[f].multi_rank && p->world <= 1) continue; /* local copies: elementwise's (below) */
    /* a step on the host is priced at host.bandwidth x host_memory, not by optimizer_update;
     * a profile from before the optimizer's bytes were counted has none */
    if (f == F_OPTIMIZER && (json_is_true(json_object_get(root, "optimizer_on_host")) ||
                             !json_object_get(json_object_get(cls, "optimizer"), "bytes")))
      continue;
    for (int c = 0; c < 5 && factors[f].classes[c]; c++) {
      const char *name = factors[f].classes[c];
      json_t *o = json_object_get(cls, name);
      if (!o) continue;
      json_t *s = json_object_get(o, "seconds"), *w = json_object_get(o, factors[f].what);
      const char *field = mem_printf(m, "classes.%s.%s", name, !json_is_number(s) ? "seconds" : factors[f].what);
      if (!json_is_number(s) || !json_is_number(w) || json_number_value(s) < 0 || json_number_value(w) < 0 ||
          !isfinite(json_number_value(s)) || !isfinite(json_number_value(w))) {
        bad(d, path, "missing or not a number >= 0", field, "seconds and the class's FLOPs or bytes per step");
        goto done;
      }
      double rate = factors[f].rate == RATE_PEAK ? r->peak : factors[f].rate == RATE_HBM ? r->hbm
                    : link_rate(r, name, strcmp(name, "all_to_all") == 0 ? p->ep
                                         : strcmp(name, "all_reduce") == 0 ? p->world : p->fsdp);
      if (rate <= 0) continue; /* not priced on a link the fit can invert */
      p->w[f] += json_number_value(w), p->s[f] += json_number_value(s), p->u[f] += json_number_value(w) / rate;
    }
  }
  for (int f = 0; f < NFACTORS; f++) {
    const char *names[12];
    int n = 0;
    for (int c = 0; c < 6 && factors[f].unpriced[c]; c++) names[n++] = factors[f].unpriced[c];
    if (f == F_ELEMENTWISE && p->world <= 1)
      for (int c = 0; one_rank_copies[c]; c++) names[n++] = one_rank_copies[c];
    for (int c = 0; c < n; c++) {
      json_t *o = json_object_get(cls, names[c]), *s = json_object_get(o, "seconds");
      if (!o) continue;
      if (!json_is_number(s) || json_number_value(s) < 0 || !isfinite(json_number_value(s))) {
        bad(d, path, "missing or not a number >= 0", mem_printf(m, "classes.%s.seconds", names[c]), "seconds per step");
        goto done;
      }
      p->s[f] += json_number_value(s);
    }
  }
  json_t *model = json_object_get(root, "model"), *backend = json_object_get(root, "backend"), *steps = json_object_get(root, "steps");
  json_t *device = json_object_get(root, "device"); /* (absent in profiles of an mtc before it) */
  snprintf(p->backend, sizeof p->backend, "%s", json_is_string(backend) ? json_string_value(backend) : "");
  char shown[3][128]; /* the profile's text on one line of a comment or terminal: control bytes as \ooo */
  out_text(shown[0], sizeof shown[0], json_is_string(model) ? json_string_value(model) : "?", false);
  out_text(shown[1], sizeof shown[1], json_is_string(backend) ? json_string_value(backend) : "?", false);
  out_text(shown[2], sizeof shown[2], json_is_string(device) ? json_string_value(device) : "not recorded", false);
  snprintf(p->desc, sizeof p->desc, "%s, %s backend on %s, %lld rank(s), %lld steps", shown[0], shown[1], shown[2],
           json_is_integer(world) ? (long long)json_integer_value(world) : 0,
           json_is_integer(steps) ? (long long)json_integer_value(steps) : 0);
  ok = true;
done:
  json_decref(root);
  return ok;
}

/* A rate of the base preset, in base units: the preset's value, or 0 with a diagnostic. */
static double rate(Diag *d, const YNode *root, const char *path, Quantity q, const char *name) {
  YNode *n = yaml_path(root, path);
  char err[200];
  double v = 0;
  if (!n || n->kind != Y_SCALAR)
    return diag_error(d, root->loc, "preset %s has no %s; expected one to calibrate against", name, path), 0;
  if (!units_parse(n->str, q, &v, err, sizeof err)) return diag_error(d, n->loc, "%s: %s", path, err), 0;
  return v;
}

static double fraction(const YNode *root, const char *path, double dflt) {
  YNode *n = yaml_path(root, path);
  char *end;
  if (!n || n->kind != Y_SCALAR) return dflt;
  double v = strtod(n->str, &end);
  return *end || v <= 0 ? dflt : v;
}

/* The efficiency section of text: [*lo, *hi) byte range of its indented lines; false if none. */
static bool find_section(const char *text, size_t *lo, size_t *hi) {
  const char *p = text;
  while (*p) {
    const char *eol = strchr(p, '\n');
    size_t n = eol ? (size_t)(eol - p) : strlen(p);
    if (strncmp(p, "efficiency:", 11) == 0) {
      const char *q = eol ? eol + 1 : p + n;
      *lo = (size_t)(q - text);
      while (*q && (*q == ' ' || *q == '#' || *q == '\n')) {
        if (*q == '#' ) break; /* a comment at column 0 ends it */
        const char *e = strchr(q, '\n');
        q = e ? e + 1 : q + strlen(q);
      }
      *hi = (size_t)(q - text);
      return true;
    }
    p = eol ? eol + 1 : p + n;
  }
  return false;
}

int calibrate_run(const char *const *paths, int npaths, const char *preset, const char *out) {
  Mem m = {0};
  Diag d = {.mem = &m};
  int status = EXIT_BAD_INPUT;
  Profile *pr = mem_alloc(&m, sizeof *pr * (size_t)(npaths ? npaths : 1));
  YNode *root = NULL;
  root = preset_load(&m, &d, preset, NULL, (Loc){0});
  if (!root) goto done;
  double peak = rate(&d, root, "gpu.bf16_flops", Q_FLOPS, preset), hbm = rate(&d, root, "gpu.hbm_bandwidth", Q_RATE, preset);
  if (!peak || !hbm) goto done;
  double sustained = fraction(root, "efficiency.sustained", 1);
  Rates rates = {.peak = peak * sustained, .hbm = hbm, .gpus_per_node = (long)fraction(root, "gpus_per_node", 1)};
  YNode *topo = yaml_path(root, "links.topology");
  rates.nvswitch = topo && topo->kind == Y_SCALAR && strcmp(topo->str, "nvswitch") == 0;
  char err[200];
  YNode *nv = yaml_path(root, "links.nvlink"), *ib = yaml_path(root, "links.internode");
  if (nv && nv->kind == Y_SCALAR && !units_parse(nv->str, Q_RATE, &rates.nvlink, err, sizeof err))
    diag_error(&d, nv->loc, "links.nvlink: %s", err);
  if (ib && ib->kind == Y_SCALAR && !units_parse(ib->str, Q_RATE, &rates.internode, err, sizeof err))
    diag_error(&d, ib->loc, "links.internode: %s", err);
  if (d.msg) goto done;
  /* a profile fits the preset of the hardware that measured it: the cpu backend's ranks fit a
   * cpu preset (gpu.name "cpu ...", as emit_prog.c tells them), the cuda backend's GPUs a GPU
   * one; across the two the factors are off by the ratio of the machines (1e-5 for a core
   * against a GH200), which no fit can tell from a slow kernel */
  YNode *gname = yaml_path(root, "gpu.name");
  const char *gpu = gname && gname->kind == Y_SCALAR ? gname->str : "";
  bool cpu_preset = strncmp(gpu, "cpu", 3) == 0;
  for (int i = 0; i < npaths; i++) {
    if (!load_profile(&m, &d, paths[i], &rates, &pr[i])) goto done;
    const char *b = pr[i].backend;
    if (*b && (strcmp(b, "cpu") == 0) != cpu_preset) {
      diag_error(&d, (Loc){0}, "%s: measured by the %s backend, but preset %s is %s (gpu.name '%s'); expected a "
                 "profile of the hardware the preset describes: %s", paths[i], b, preset,
                 cpu_preset ? "the cpu backend's ranks" : "a GPU cluster's", gpu,
                 cpu_preset ? "calibrate a cuda build's profile against the GPU's preset (e.g. --preset "
                              "jupiter-booster)"
                            : "calibrate a cpu build's profile against --preset cpu (or a copy of it), or profile "
                              "a cuda build (mtc build DIR --backend cuda) on that cluster's GPUs");
      goto done;
    }
  }

  /* the fit */
  double fit[NFACTORS];
  bool have[NFACTORS];
  char *why[NFACTORS];
  for (int f = 0; f < NFACTORS; f++) {
    double uu = 0, um = 0, w = 0, s = 0, u = 0, n = 0; /* w, s: the mean work and seconds (the comment's) */
    for (int i = 0; i < npaths; i++)
      if (pr[i].s[f] > 0 && pr[i].u[f] > 0)
        uu += pr[i].u[f] * pr[i].u[f], um += pr[i].u[f] * pr[i].s[f], w += pr[i].w[f], s += pr[i].s[f],
            u += pr[i].u[f], n++;
    if (n) w /= n, s /= n, u /= n;
    have[f] = um > 0;
    if (!have[f]) continue;
    fit[f] = uu / um;
    RateKind rk = factors[f].rate;
    bool flops = rk == RATE_PEAK;
    /* the rate the work was priced at (a mean over the profiles for the links) and its name */
    const char *rname = rk == RATE_PEAK ? "bf16_flops" : rk == RATE_HBM ? "hbm_bandwidth"
                        : rk == RATE_A2A ? "(ep - 1) x links.nvlink" : "the group's link (links.nvlink / internode)";
    const char *fix = rk == RATE_PEAK ? "gpu.bf16_flops" : rk == RATE_HBM ? "gpu.hbm_bandwidth" : "links.nvlink / links.internode";
    char *cite = "";
    for (int i = 0; i < npaths; i++)
      if (pr[i].s[f] > 0 && pr[i].u[f] > 0) cite = mem_printf(&m, "%s%s%s", cite, *cite ? ", " : "", paths[i]);
    why[f] = mem_printf(&m, "%.4g %s in %.4g s per step and rank%s = %.4g %s, / %s %.4g%s", flops ? w / 1e9 : w / 1e6,
                        flops ? "GFLOP" : "MB", s, n > 1 ? " (mean)" : "", w / s / 1e9, flops ? "GFLOP/s" : "GB/s",
                        rname, w / u / 1e9,
                        flops ? (sustained != 1 ? " GFLOP/s x sustained" : " GFLOP/s") : " GB/s");
    why[f] = mem_printf(&m, "fitted from %s: %s", cite, why[f]);
    if (fit[f] > 1 && !flops) {
      diag_error(&d, (Loc){0}, "%s: efficiency.%s would be %.3g, above 1: the measured rate (%.4g %s/s) beats the "
                 "preset's %s; expected a preset whose peak rates are at least what the machine does (raise "
                 "%s in %s)", paths[0], factors[f].key, fit[f], w / s / 1e9, "GB", rname, fix, preset);
      goto done;
    }
  }
  /* a compute rate above the preset's peak: the peak was set too low (the cpu preset's guess for a
   * core), so it is raised to the fastest measured rate, and every compute factor is then a
   * fraction of that (the fastest 1); the written preset says so at gpu.bf16_flops */
  double raise = 1;
  int fastest = -1;
  for (int f = 0; f < NFACTORS; f++)
    if (have[f] && factors[f].rate == RATE_PEAK && fit[f] > raise) raise = fit[f], fastest = f;
  char *raised = NULL;
  if (fastest >= 0) {
    for (int f = 0; f < NFACTORS; f++)
      if (have[f] && factors[f].rate == RATE_PEAK)
        fit[f] /= raise, why[f] = mem_printf(&m, "%s; against gpu.bf16_flops raised to %.4g GFLOP/s", why[f],
                                             peak * raise / 1e9);
    raised = mem_printf(&m, "  bf16_flops: %.4g GFLOP/s   # raised by mtc calibrate from %s's %.4g GFLOP/s: "
                        "efficiency.%s measured %.4g times that (a peak is at least what the machine does)\n",
                        peak * raise / 1e9, preset, peak / 1e9, factors[fastest].key, raise);
  }
  bool any = false;
  for (int f = 0; f < NFACTORS; f++) any |= have[f];
  if (!any) {
    diag_error(&d, (Loc){0}, "%s: no op class with seconds and FLOPs or bytes; expected a profile of at least one "
               "step (train --steps 2 or more: the first step is not profiled)", paths[0]);
    goto done;
  }

  /* the new text: the header, then the base text with the efficiency section rewritten */
  const char *text = root->loc.src->text;
  char *files = "";
  for (int i = 0; i < npaths; i++) files = mem_printf(&m, "%s%s%s (%s)", files, i ? ", " : "", paths[i], pr[i].desc);
  time_t now = time(NULL);
  char date[32];
  strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
  char *o = mem_printf(&m, "# Calibrated by `mtc calibrate` on %s from %s, with preset %s (%s) as the base:\n"
                           "# the efficiency keys marked \"fitted\" are least-squares fits of the measured time per op\n"
                           "# class against the cost model's; everything else is the base preset's.\n",
                       date, files, preset, root->loc.src->name);
  size_t lo, hi;
  bool has = find_section(text, &lo, &hi);
  if (!has) lo = hi = strlen(text);
  o = mem_printf(&m, "%s%.*s%s", o, (int)lo, text, has ? "" : (lo && text[lo - 1] != '\n' ? "\nefficiency:\n" : "efficiency:\n"));
  /* comment lines before a key describe it and go with it when it is fitted; those deeper
   * than the keys right after a key continue its comment */
  bool done_key[NFACTORS] = {0}, after_fitted = false;
  const char *pending = NULL; /* comment lines not yet written */
  size_t npending = 0;
  for (const char *p = text + lo; p < text + hi;) {
    const char *eol = memchr(p, '\n', (size_t)(text + hi - p));
    size_t n = eol ? (size_t)(eol - p) + 1 : (size_t)(text + hi - p);
    const char *k = p;
    while (k < p + n && *k == ' ') k++;
    if (*k == '#' || *k == '\n') {
      bool continuation = *k == '#' && k - p > 2;
      if (!(continuation && after_fitted)) {
        if (!pending) pending = p;
        npending = (size_t)(p + n - pending);
      }
      p += n;
      continue;
    }
    int which = -1;
    for (int f = 0; f < NFACTORS; f++) {
      size_t kl = strlen(factors[f].key);
      if (have[f] && strncmp(k, factors[f].key, kl) == 0 && k[kl] == ':') which = f;
    }
    if (which >= 0) {
      o = mem_printf(&m, "%s  %s: %.4g   # %s\n", o, factors[which].key, fit[which], why[which]);
      done_key[which] = true;
    } else
      o = mem_printf(&m, "%s%.*s%.*s", o, (int)npending, pending ? pending : "", (int)n, p);
    after_fitted = which >= 0, pending = NULL, npending = 0;
    p += n;
  }
  if (pending) o = mem_printf(&m, "%s%.*s", o, (int)npending, pending);
  for (int f = 0; f < NFACTORS; f++)
    if (have[f] && !done_key[f]) o = mem_printf(&m, "%s  %s: %.4g   # %s\n", o, factors[f].key, fit[f], why[f]);
  o = mem_printf(&m, "%s%s", o, text + hi);
  if (o[0] && o[strlen(o) - 1] != '\n') o = mem_printf(&m, "%s\n", o);
  char *bf = raised ? strstr(o, "\n  bf16_flops:") : NULL; /* gpu.bf16_flops' line, replaced */
  if (bf) {
    char *eol = strchr(bf + 1, '\n');
    o = mem_printf(&m, "%.*s\n%s%s", (int)(bf - o), o, raised, eol ? eol + 1 : "");
  } else if (raised) {
    diag_error(&d, (Loc){0}, "%s: no gpu.bf16_flops line to raise to %.4g GFLOP/s; expected a preset that states it",
               preset, peak * raise / 1e9);
    goto done;
  }

  o = evidence_measured(&m, o, have);

  OutFile of; /* PATH.tmp renamed over PATH: never through a link, a FIFO or a device */
  FILE *fp = out_open(&d, &of, out);
  if (!fp) goto done;
  fputs(o, fp); /* a write error is out_close's: ferror */
  if (!out_close(&d, &of)) goto done;
  printf("wrote %s: preset %s calibrated from %d profile(s)\n", out, preset, npaths);
  for (int i = 0; i < npaths; i++) printf("  profile %s: %s\n", paths[i], pr[i].desc);
  if (raised)
    printf("note: gpu.bf16_flops raised from %.4g to %.4g GFLOP/s: efficiency.%s measured faster than the preset's "
           "peak\n", peak / 1e9, peak * raise / 1e9, factors[fastest].key);
  for (int f = 0; f < NFACTORS; f++)
    if (have[f]) printf("  efficiency.%-14s %.4g  (%s)\n", factors[f].key, fit[f], why[f]);
  status = EXIT_DONE;
done:
  if (d.msg) fprintf(stderr, "%s", d.msg);
  mem_free(&m);
  return status;
}
