/* test_timeline.c — timeline.json of every example spec is a valid Chrome trace whose compute
 * track sums to the predicted compute time, with attention, experts (MoE) and recompute (when
 * checkpointing) as their own categories, the same recompute time as the cost model, only the
 * tracks with events named, and the offloaded boundaries both ways (an offload pin of
 * llama-3.1-8b).   usage: test_timeline SOURCE_DIR TMPDIR */
#include <jansson.h>
#include <string.h>

#include "check.h"
#include "mtc.h"

static void check_spec(const char *src, const char *tmp, const char *name, const char *set) {
  Mem m = {0};
  Diag d = {.mem = &m};
  const char *sets[] = {set};
  Spec *s = spec_load(&m, &d, mem_printf(&m, "%s/specs/%s.yaml", src, name), NULL, 0, sets, set ? 1 : 0);
  Model *md = s ? model_build(&m, &d, s) : NULL;
  CHECK(md != NULL);
  if (!md) return;
  Plan *p = plan_search(&m, md);
  CHECK(p->feasible);
  const char *path = mem_printf(&m, "%s/%s.timeline.json", tmp, name);
  CHECK(emit_timeline(&d, p, path));
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  CHECK(root != NULL);
  json_t *events = json_object_get(root, "traceEvents");
  CHECK(json_is_array(events) && json_array_size(events) > 6);
  int L = md->nlayers, moe = 0;
  double compute = 0, recompute = 0;
  /* per layer: the end of its forward compute, the start of its backward (recompute first), and
   * its boundary's copies out (start) and back (end) */
  double *fwd_end = mem_array(&m, (size_t)L, sizeof(double)), *bwd_start = mem_array(&m, (size_t)L, sizeof(double));
  double *out_start = mem_array(&m, (size_t)L, sizeof(double)), *back_end = mem_array(&m, (size_t)L, sizeof(double));
  for (int l = 0; l < L; l++) bwd_start[l] = 1e30;
  int bad = 0, names = 0, starts = 0, finishes = 0, attention = 0, experts = 0, h2d = 0, d2h = 0;
  bool named[TR__COUNT] = {false}, used[TR__COUNT] = {false};
  long ids = 0;
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e) {
    const char *ph = json_string_value(json_object_get(e, "ph"));
    int tid = (int)json_integer_value(json_object_get(e, "tid"));
    if (!ph || tid < 0 || tid >= TR__COUNT || !json_is_string(json_object_get(e, "name"))) {
      bad++;
      continue;
    }
    if (ph[0] == 'M') names++, named[tid] = true;
    if (ph && ph[0] == 's') starts++, ids += (long)json_integer_value(json_object_get(e, "id"));
    if (ph && ph[0] == 'f') finishes++, ids -= (long)json_integer_value(json_object_get(e, "id"));
    if (!ph || ph[0] != 'X') continue;
    double ts = json_number_value(json_object_get(e, "ts")), dur = json_number_value(json_object_get(e, "dur"));
    if (!(ts >= 0) || !(dur > 0)) bad++;
    used[tid] = true;
    const char *cat = json_string_value(json_object_get(e, "cat"));
    bool layer = json_is_integer(json_object_get(json_object_get(e, "args"), "layer"));
    if (tid == TR_COMPUTE) compute += dur / 1e6;
    if (tid == TR_COMPUTE && cat && !strcmp(cat, "recompute")) recompute += dur / 1e6;
    if (tid == TR_COMPUTE && cat && !strcmp(cat, "attention") && layer) attention++;
    if (tid == TR_COMPUTE && cat && !strcmp(cat, "experts") && layer) experts++;
    int l = layer ? (int)json_integer_value(json_object_get(json_object_get(e, "args"), "layer")) : -1;
    const char *nm = json_string_value(json_object_get(e, "name"));
    size_t nl = strlen(nm);
    bool backward = (cat && !strcmp(cat, "recompute")) || (nl > 8 && !strcmp(nm + nl - 8, "backward"));
    if (tid == TR_COMPUTE && l >= 0 && l < L && backward && ts < bwd_start[l]) bwd_start[l] = ts;
    if (tid == TR_COMPUTE && l >= 0 && l < L && !backward && ts + dur > fwd_end[l]) fwd_end[l] = ts + dur;
    if (tid == TR_H2D && l >= 0 && l < L) h2d++, back_end[l] = ts + dur;
    if (tid == TR_D2H && l >= 0 && l < L) d2h++, out_start[l] = ts;
  }
  for (int t = 0; t < TR__COUNT; t++) CHECK(named[t] == used[t]); /* no empty track is declared */
  for (int l = 0; l < L; l++) moe += md->layers[l].kind == LAYER_MOE;
  int early = 0; /* copies out before the layer's forward ends, or back after its backward starts */
  for (int l = 0; l < L && h2d; l++) early += out_start[l] < fwd_end[l] - 1e-3 || back_end[l] > bwd_start[l] + 1e-3;
  CHECK_EQ(early, 0); /* (µs; a thousandth of one for the printed digits) */
  CHECK_EQ(attention, 2 * L); /* every layer's attention, forward and backward */
  CHECK_EQ(experts, 2 * moe);
  /* the first micro-batch's recompute, A of them in Cost.recompute */
  CHECK_NEAR(recompute * (double)p->best.ch.accum, p->best.cost.recompute, 1e-9);
  if (p->best.ch.ac != AC_NONE) CHECK(recompute > 0);
  CHECK_EQ(h2d, p->best.ch.offload != OFF_NONE ? L : 0); /* every offloaded boundary comes back */
  CHECK_EQ(d2h, p->best.ch.offload != OFF_NONE ? L : 0);
  CHECK_EQ(bad, 0);
  CHECK_EQ(starts, finishes); /* every arrow has both ends, with the same id */
  CHECK_EQ(ids, 0);
  CHECK_NEAR(compute, p->best.cost.compute, 1e-9);
  fprintf(stderr, "%s%s%s: %zu events, %d tracks, %d arrows, compute track %.3f s = predicted compute, "
          "recompute %.3f s, %d boundaries back from the host\n", name, set ? " " : "", set ? set : "",
          json_array_size(events), names, starts, compute, recompute, h2d);
  json_decref(root);
  mem_free(&m);
}

int main(int argc, char **argv) {
  if (argc != 3) return fprintf(stderr, "usage: test_timeline SOURCE_DIR TMPDIR\n"), 2;
  const char *specs[] = {"europa-1t", "deepseek-v3", "llama-3.1-8b", "mixtral-8x7b", "tiny-moe"};
  for (int i = 0; i < 5; i++) check_spec(argv[1], argv[2], specs[i], NULL);
  check_spec(argv[1], argv[2], "llama-3.1-8b", "plan.offload_activations=host");
  return CHECK_DONE("test_timeline");
}
