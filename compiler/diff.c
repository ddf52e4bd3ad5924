/* diff.c — `mtc diff A B`: what changes between two plans (two plan.json files, or two specs,
 * the --set overrides applied to B): layout, checkpointing, memory per tier and per item,
 * predicted times, as a table of the rows that differ; with --html OUT (two specs), also a page
 * with the two plans side by side: headlines, timelines and memory on one scale, layouts, and
 * the table. */
#include <jansson.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "mtc.h"

typedef struct {
  const char *key;
  json_t *a, *b; /* borrowed */
} Row;

typedef struct {
  Mem *m;
  const char **keys;
  json_t **vals;
  int n, cap;
} Flat;

static void put(Flat *f, const char *key, json_t *v) {
  for (int i = 0; i < f->n; i++) /* folded items add up */
    if (!strcmp(f->keys[i], key)) {
      if (json_is_integer(f->vals[i]) && json_is_integer(v))
        json_integer_set(f->vals[i], json_integer_value(f->vals[i]) + json_integer_value(v));
      return;
    }
  if (f->n == f->cap) {
    int cap = f->cap ? 2 * f->cap : 128;
    const char **k = mem_array(f->m, (size_t)cap, sizeof *k);
    json_t **vv = mem_array(f->m, (size_t)cap, sizeof *vv);
    if (f->n) memcpy(k, f->keys, sizeof *k * (size_t)f->n), memcpy(vv, f->vals, sizeof *vv * (size_t)f->n);
    f->keys = k, f->vals = vv, f->cap = cap;
  }
  f->keys[f->n] = key;
  f->vals[f->n++] = json_is_integer(v) ? json_integer(json_integer_value(v)) : json_incref(v);
}

/* Scalars under obj, dotted; memory items as memory.TIER.items.NAME (per-layer items folded:
 * "activations.boundary[]" is the sum over layers). Skips the per-layer and placement lists. */
static void flatten(Flat *f, json_t *obj, const char *prefix) {
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    const char *key = prefix[0] ? mem_printf(f->m, "%s.%s", prefix, k) : k;
    if (!strcmp(key, "model.layer_list") || !strcmp(key, "placement") || !strcmp(key, "model.params_by_kind") ||
        !strcmp(key, "search"))
      continue;
    if (json_is_object(v)) {
      flatten(f, v, key);
    } else if (json_is_array(v) && !strcmp(k, "items")) {
      size_t i;
      json_t *it;
      json_array_foreach(v, i, it) {
        const char *name = json_string_value(json_object_get(it, "name"));
        if (!name) continue;
        const char *br = strchr(name, '[');
        char *stem = br ? mem_printf(f->m, "%.*s[]", (int)(br - name), name) : (char *)name;
        put(f, mem_printf(f->m, "%s.%s", key, stem), json_object_get(it, "bytes"));
      }
    } else if (!json_is_array(v)) {
      put(f, key, v);
    }
  }
}

static bool is_bytes(const char *key) {
  if (strstr(key, "flops")) return false; /* cluster.peak_bf16_flops_per_gpu is a rate, not bytes */
  return strstr(key, "bytes") || strstr(key, ".items.") || strstr(key, "peak") || strstr(key, "capacity");
}

static const char *show(Mem *m, const char *key, json_t *v) {
  char buf[64];
  if (!v) return "-";
  if (json_is_string(v)) return json_string_value(v);
  if (json_is_boolean(v)) return json_is_true(v) ? "true" : "false";
  double x = json_number_value(v);
  if (is_bytes(key)) units_fmt_bytes_dec(buf, sizeof buf, x);
  else if (json_is_integer(v) && fabs(x) < 1e15) snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
  else snprintf(buf, sizeof buf, "%.4g", x);
  return mem_strdup(m, buf);
}

/* plan.json of a spec (with sets), or the JSON of a file ending in .json; *plan: the spec's plan
 * (NULL for a plan.json). */
static json_t *load(Mem *m, Diag *d, const char *path, const char *const *sets, int nsets, Plan **plan) {
  *plan = NULL;
  size_t n = strlen(path);
  if (n > 5 && !strcmp(path + n - 5, ".json")) {
    if (nsets) /* --set changes a spec; a plan.json is already planned */
      return diag_error(d, (Loc){0}, "--set %s: B (%s) is a plan.json, which --set cannot change (it applies to B's "
                        "spec before planning); expected B to be a spec (such as the one the plan.json came from), "
                        "or no --set", sets[0], path), NULL;
    struct stat st; /* a FIFO would block the read: only a regular file is read */
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
      return diag_error(d, (Loc){0}, "%s: not a plan.json: %s; expected a plan.json file", path,
                        stat(path, &st) != 0 ? strerror(errno) : "not a regular file"), NULL;
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) return diag_error(d, (Loc){0}, "%s:%d:%d: not a plan.json: %s", path, je.line, je.column, je.text), NULL;
    /* a plan.json of mtc's: name, model, feasible, layout and memory (a checkpoint manifest or {} is not) */
    static const char *const keys[] = {"name", "model", "feasible", "layout", "memory"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
      if (!json_object_get(j, keys[i])) {
        json_decref(j);
        return diag_error(d, (Loc){0}, "%s: not a plan.json of mtc's: it has no '%s'; expected a plan.json that mtc "
                          "plan --json or mtc compile wrote, or a spec", path, keys[i]), NULL;
      }
    return j;
  }
  Spec *s = spec_load(m, d, path, NULL, 0, sets, nsets);
  Model *md = s ? model_build(m, d, s) : NULL;
  if (!md) return NULL;
  json_t *j = report_json(md);
  *plan = plan_search(m, md);
  report_plan_json(j, *plan, false); /* as mtc compile plans it */
  return j;
}

/* The two plans side by side: headlines, the predicted steps on one time scale, memory on one
 * scale per tier, the layouts, then the rows that differ (rows: n of key, A, B, change). */
static bool write_html(Diag *d, const char *path, const char *an, const char *bn, Plan *pa, Plan *pb,
                       const char *const *rows, int n) {
  OutFile o;
  FILE *f = out_open(d, &o, path);
  if (!f) return false;
  Plan *pl[2] = {pa, pb};
  const char *names[2] = {an, bn};
  fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>mtc diff</title>\n<style>%s"
             "body{max-width:1500px}.pair svg{width:100%%;height:auto}</style></head><body>\n<h1>", emit_html_style);
  emit_escape(f, an, strlen(an));
  fputs(" against ", f);
  emit_escape(f, bn, strlen(bn));
  fputs("</h1>\n<div class=\"pair\" id=\"headlines\">", f);
  for (int i = 0; i < 2; i++) {
    fprintf(f, "<div><h2>%c: ", 'A' + i);
    emit_escape(f, names[i], strlen(names[i]));
    fputs("</h2>\n", f);
    emit_html_headline(f, pl[i]);
    fputs("</div>\n", f);
  }
  json_t *ev[2] = {emit_step_events(pa), emit_step_events(pb)};
  double span = fmax(emit_step_span(ev[0], false), emit_step_span(ev[1], false));
  if (span > 0) {
    fputs("</div>\n<h2>The predicted steps, on one time scale</h2>\n<div class=\"pair\" id=\"timelines\">", f);
    for (int i = 0; i < 2; i++) {
      fputs("<div>", f);
      if (pl[i]->feasible) emit_steps_svg_to(f, pl[i], ev[i], i ? "timeline-b" : "timeline-a", false, span, 840 / span);
      else fputs("<p class=\"bad\">No plan fits.</p>", f);
      fputs("</div>\n", f);
    }
  }
  json_decref(ev[0]), json_decref(ev[1]);
  MemScale sc = emit_memory_scale(pa), sb = emit_memory_scale(pb);
  for (int t = 0; t < TIER__COUNT; t++) {
    sc.shown[t] = sc.shown[t] || sb.shown[t];
    if (sb.top[t] > sc.top[t]) sc.top[t] = sb.top[t];
  }
  fputs("</div>\n<h2>Memory per GPU, on one scale per tier</h2>\n<div class=\"pair\" id=\"memories\">", f);
  for (int i = 0; i < 2; i++) fputs("<div>", f), emit_memory_svg_to(f, pl[i], &sc), fputs("</div>\n", f);
  fputs("</div>\n<h2>The layouts</h2>\n<div class=\"pair\" id=\"layouts\">", f);
  for (int i = 0; i < 2; i++) {
    fputs("<div>", f);
    if (pl[i]->feasible) emit_ranks_svg_to(f, pl[i], i ? "layout-b" : "layout-a");
    fputs("</div>\n", f);
  }
  fputs("</div>\n<h2>What differs</h2>\n<table id=\"differences\"><tr><th>key</th><th>A</th><th>B</th><th>change</th></tr>\n", f);
  for (int i = 0; i < n; i++) {
    fputs("<tr>", f);
    for (int k = 0; k < 4; k++) {
      const char *v = rows[4 * i + k];
      fputs("<td>", f);
      emit_escape(f, v, strlen(v));
      fputs("</td>", f);
    }
    fputs("</tr>\n", f);
  }
  if (!n) fputs("<tr><td colspan=\"4\">(no differences)</td></tr>\n", f);
  fputs("</table>\n<p>Written by mtc " MTC_VERSION ".</p>\n</body></html>\n", f);
  return out_close(d, &o);
}

int diff_run(const char *a_path, const char *b_path, const char *const *sets, int nsets, bool all,
             const char *html) {
  Mem m = {0};
  Diag d = {.mem = &m};
  Plan *pa = NULL, *pb = NULL;
  json_t *a = load(&m, &d, a_path, NULL, 0, &pa), *b = a ? load(&m, &d, b_path, sets, nsets, &pb) : NULL;
  if (a && b && html && (!pa || !pb))
    diag_error(&d, (Loc){0}, "--html %s: %s is a plan.json, which holds no schedule to draw; expected A and B to be "
               "specs (such as the ones the plan.json files came from)", html, pa ? b_path : a_path);
  if (!a || !b || d.msg) {
    fputs(d.msg, stderr);
    json_decref(a), json_decref(b);
    mem_free(&m);
    return EXIT_BAD_INPUT;
  }
  Flat fa = {&m, NULL, NULL, 0, 0}, fb = {&m, NULL, NULL, 0, 0};
  flatten(&fa, a, "");
  flatten(&fb, b, "");
  printf("%-56s %26s %26s %9s\n", "key", "A", "B", "change");
  int shown = 0;
  const char **rows = mem_array(&m, (size_t)(fa.n + fb.n) * 4 + 1, sizeof *rows); /* key, A, B, change */
  for (int pass = 0; pass < 2; pass++) { /* A's keys in order, then keys only B has */
    Flat *f = pass ? &fb : &fa, *o = pass ? &fa : &fb;
    for (int i = 0; i < f->n; i++) {
      json_t *other = NULL;
      for (int j = 0; j < o->n; j++)
        if (!strcmp(o->keys[j], f->keys[i])) other = o->vals[j];
      if (pass && other) continue;
      json_t *va = pass ? other : f->vals[i], *vb = pass ? f->vals[i] : other;
      bool same = va && vb && json_equal(va, vb);
      if (va && vb && json_is_number(va) && json_is_number(vb)) {
        double x = json_number_value(va), y = json_number_value(vb);
        same = fabs(x - y) <= 1e-9 * fmax(fabs(x), fabs(y));
      }
      if (same && !all) continue;
      char change[32] = "";
      if (va && vb && json_is_number(va) && json_is_number(vb) && json_number_value(va) != 0)
        snprintf(change, sizeof change, "%+.1f%%", 100 * (json_number_value(vb) / json_number_value(va) - 1));
      const char **r = rows + 4 * shown;
      r[0] = f->keys[i], r[1] = show(&m, f->keys[i], va), r[2] = show(&m, f->keys[i], vb), r[3] = mem_strdup(&m, change);
      printf("%-56s %26s %26s %9s\n", r[0], r[1], r[2], r[3]);
      shown++;
    }
  }
  if (!shown) printf("(no differences)\n");
  json_t *ta = json_object_get(json_object_get(a, "training"), "tokens_per_step");
  json_t *tb = json_object_get(json_object_get(b, "training"), "tokens_per_step");
  if (json_is_integer(ta) && json_is_integer(tb) && json_integer_value(ta) != json_integer_value(tb))
    report_wrap(stdout, mem_printf(&m, "note: A trains on %lld tokens per step and B on %lld: a step's time and "
                                   "memory compare different work; tokens/s and MFU compare the rates (a batch in "
                                   "training.global_batch_tokens keeps the tokens when seq_len changes)\n",
                                   (long long)json_integer_value(ta), (long long)json_integer_value(tb)));
  int status = EXIT_DONE;
  if (html && !write_html(&d, html, a_path, nsets ? mem_printf(&m, "%s with --set %s%s", b_path, sets[0],
                                                                nsets > 1 ? " ..." : "") : b_path,
                          pa, pb, rows, shown))
    fputs(d.msg, stderr), status = EXIT_BAD_INPUT;
  else if (html)
    printf("wrote %s\n", html);
  for (int i = 0; i < fa.n; i++) json_decref(fa.vals[i]);
  for (int i = 0; i < fb.n; i++) json_decref(fb.vals[i]);
  json_decref(a), json_decref(b);
  mem_free(&m);
  return status;
}
