/* diff.c — `mtc diff A B`: what changes between two plans (two plan.json files, or two specs,
 * the --set overrides applied to B): layout, checkpointing, memory per tier and per item,
 * predicted times, as a table of the rows that differ. */
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

/* plan.json of a spec (with sets), or the JSON of a file ending in .json. */
static json_t *load(Mem *m, Diag *d, const char *path, const char *const *sets, int nsets) {
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
  report_plan_json(j, plan_search(m, md), false); /* as mtc compile plans it */
  return j;
}

int diff_run(const char *a_path, const char *b_path, const char *const *sets, int nsets, bool all) {
  Mem m = {0};
  Diag d = {.mem = &m};
  json_t *a = load(&m, &d, a_path, NULL, 0), *b = a ? load(&m, &d, b_path, sets, nsets) : NULL;
  if (!a || !b) {
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
      printf("%-56s %26s %26s %9s\n", f->keys[i], show(&m, f->keys[i], va), show(&m, f->keys[i], vb), change);
      shown++;
    }
  }
  if (!shown) printf("(no differences)\n");
  for (int i = 0; i < fa.n; i++) json_decref(fa.vals[i]);
  for (int i = 0; i < fb.n; i++) json_decref(fb.vals[i]);
  json_decref(a), json_decref(b);
  mem_free(&m);
  return EXIT_DONE;
}
