/* fuzz_spec.c — libFuzzer target for the spec front end: YAML parsing, --set, preset merge,
 * schema conversion, validation, the model graph and the planner. Any input must end in a spec or in one
 * diagnostic; never a crash, a leak past mem_free, or a hang.
 * An input whose first line starts with '!' uses the rest of that line as a --set. */
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "mtc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Mem m = {0};
  Diag d = {.mem = &m};
  const char *text = (const char *)data;
  const char *sets[1];
  int nsets = 0;
  if (size > 0 && data[0] == '!') {
    const uint8_t *nl = memchr(data, '\n', size);
    size_t n = nl ? (size_t)(nl - data) : size;
    sets[nsets++] = mem_strndup(&m, text + 1, n - 1);
    text += nl ? n + 1 : n;
    size -= nl ? n + 1 : n;
  }
  Spec *s = spec_load(&m, &d, "fuzz.yaml", text, size, sets, nsets);
  if (s) {
    Model *md = model_build(&m, &d, s);
    /* the planner too, on models and clusters small enough that an instrumented search takes
     * milliseconds (its cost on large specs is a benchmark, not a fuzzing matter) */
    if (md && md->nlayers <= 128 && s->cluster.nodes * s->cluster.gpus_per_node <= 1024) {
      Plan *p = plan_search(&m, md);
      json_t *j = report_json(md);
      report_plan_json(j, p, false);
      json_decref(j);
    }
  }
  mem_free(&m);
  return 0;
}
