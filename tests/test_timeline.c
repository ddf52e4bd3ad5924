/* test_timeline.c — timeline.json of every example spec is a valid Chrome trace whose compute
 * track sums to the predicted compute time.   usage: test_timeline SOURCE_DIR TMPDIR */
#include <jansson.h>

#include "check.h"
#include "mtc.h"

static void check_spec(const char *src, const char *tmp, const char *name) {
  Mem m = {0};
  Diag d = {.mem = &m};
  Spec *s = spec_load(&m, &d, mem_printf(&m, "%s/specs/%s.yaml", src, name), NULL, 0, NULL, 0);
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
  double compute = 0;
  int bad = 0, names = 0, starts = 0, finishes = 0;
  long ids = 0;
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e) {
    const char *ph = json_string_value(json_object_get(e, "ph"));
    int tid = (int)json_integer_value(json_object_get(e, "tid"));
    if (!ph || tid < 0 || tid > 5 || !json_is_string(json_object_get(e, "name"))) bad++;
    if (ph && ph[0] == 'M') names++;
    if (ph && ph[0] == 's') starts++, ids += (long)json_integer_value(json_object_get(e, "id"));
    if (ph && ph[0] == 'f') finishes++, ids -= (long)json_integer_value(json_object_get(e, "id"));
    if (!ph || ph[0] != 'X') continue;
    double ts = json_number_value(json_object_get(e, "ts")), dur = json_number_value(json_object_get(e, "dur"));
    if (!(ts >= 0) || !(dur > 0)) bad++;
    if (tid == 0) compute += dur / 1e6;
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(names, 6); /* every track is named */
  CHECK_EQ(starts, finishes); /* every arrow has both ends, with the same id */
  CHECK_EQ(ids, 0);
  CHECK_NEAR(compute, p->best.cost.compute, 1e-9);
  fprintf(stderr, "%s: %zu events, %d arrows, compute track %.3f s = predicted compute\n", name,
          json_array_size(events), starts, compute);
  json_decref(root);
  mem_free(&m);
}

int main(int argc, char **argv) {
  if (argc != 3) return fprintf(stderr, "usage: test_timeline SOURCE_DIR TMPDIR\n"), 2;
  const char *specs[] = {"europa-1t", "deepseek-v3", "llama-3.1-8b", "mixtral-8x7b", "tiny-moe"};
  for (int i = 0; i < 5; i++) check_spec(argv[1], argv[2], specs[i]);
  return CHECK_DONE("test_timeline");
}
