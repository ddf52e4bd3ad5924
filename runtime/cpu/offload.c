/* offload.c — activation offload on the cpu backend: the host arena is ordinary memory, so a
 * store or load is a copy, done at once, and there is nothing to wait for. What this checks is
 * the generated schedule: an offloaded run gives the same numbers as one without offload only if
 * no boundary slot is reused while its value is still needed. */
#include <string.h>

#include "mtrt_train.h"

int rt_offload_init(int ids) { return ids >= 0 ? 0 : -1; }

void rt_offload_store(RtCtx *c, int id, act *host, const act *dev, size_t n) {
  (void)c, (void)id;
  memcpy(host, dev, n * sizeof(act));
}

void rt_offload_load(RtCtx *c, int id, act *dev, const act *host, size_t n) {
  (void)c, (void)id;
  memcpy(dev, host, n * sizeof(act));
}

void rt_offload_wait(RtCtx *c, int id) { (void)c, (void)id; }
