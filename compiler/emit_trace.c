/* emit_trace.c — timeline.json: the predicted step as a Chrome trace (chrome://tracing,
 * ui.perfetto.dev), one track per stream, from the cost model's own simulation. */
#include <jansson.h>

#include "mtc.h"

bool emit_timeline(Diag *d, const Plan *p, const char *path) {
  static const char *const tracks[] = {"compute", "communication (FSDP)", "MoE all-to-all (compute stream)",
                                       "offload D2H", "offload H2D", "optimizer"}; /* ORDER TR_ in cost.c */
  json_t *events = json_array();
  for (int t = 0; t < 6; t++)
    json_array_append_new(events, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M",
                                            "pid", 0, "tid", t, "args", "name", tracks[t]));
  Candidate c = p->best;
  if (p->feasible) cost_step_trace(p->md, &c, events);
  json_t *root = json_pack("{s:o, s:s, s:{s:s, s:f, s:f}}", "traceEvents", events, "displayTimeUnit", "ms",
                           "otherData", "spec", p->md->spec->name, "step_seconds", p->feasible ? c.cost.step : 0.0,
                           "compute_seconds", p->feasible ? c.cost.compute : 0.0);
  bool ok = report_write_json(d, root, path);
  json_decref(root);
  return ok;
}
