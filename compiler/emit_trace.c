/* emit_trace.c — timeline.json: the predicted step as a Chrome trace (chrome://tracing,
 * ui.perfetto.dev), one track per stream, from the cost model's own simulation; a layer's
 * compute is split by category (attention, experts or mlp, recompute, other). A track is named
 * only when it has events. */
#include <jansson.h>

#include "mtc.h"

bool emit_timeline(Diag *d, const Plan *p, const char *path) {
  json_t *slices = json_array(), *events = json_array();
  Candidate c = p->best;
  if (p->feasible) cost_step_trace(p->md, &c, slices);
  bool used[TR__COUNT] = {false};
  size_t i;
  json_t *e;
  json_array_foreach(slices, i, e) {
    json_int_t tid = json_integer_value(json_object_get(e, "tid"));
    if (tid >= 0 && tid < TR__COUNT) used[tid] = true;
  }
  for (int t = 0; t < TR__COUNT; t++)
    if (used[t])
      json_array_append_new(events, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M",
                                              "pid", 0, "tid", t, "args", "name", cost_track_names[t]));
  json_array_extend(events, slices);
  json_decref(slices);
  json_t *root = json_pack("{s:o, s:s, s:{s:s, s:f, s:f}}", "traceEvents", events, "displayTimeUnit", "ms",
                           "otherData", "spec", p->md->spec->name, "step_seconds", p->feasible ? c.cost.step : 0.0,
                           "compute_seconds", p->feasible ? c.cost.compute : 0.0);
  bool ok = report_write_json(d, root, path);
  json_decref(root);
  return ok;
}
