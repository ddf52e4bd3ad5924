/* offload.c — activation offload on the cuda backend: boundaries go to the pinned host arena on
 * a device-to-host stream and come back on a host-to-device stream, each copy ordered after the
 * compute stream's work so far (an event), and the compute stream waits for a copy's event only
 * where step.c calls rt_offload_wait, so the copies overlap the layers in between. */
#include <stdio.h>
#include <stdlib.h>

#include "cu_internal.h"

static cudaStream_t d2h, h2d;
static cudaEvent_t *done; /* per id: its last copy */
static int nids;

int rt_offload_init(int ids) {
  nids = ids;
  if (!ids) return 0;
  done = calloc((size_t)ids, sizeof *done);
  if (!done || cudaStreamCreateWithFlags(&d2h, cudaStreamNonBlocking) != cudaSuccess ||
      cudaStreamCreateWithFlags(&h2d, cudaStreamNonBlocking) != cudaSuccess)
    return -1;
  for (int i = 0; i < ids; i++)
    if (cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming) != cudaSuccess) return -1;
  return 0;
}

static void copy(cudaStream_t s, int id, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                 const char *what) {
  static cudaEvent_t ready; /* the compute stream's position now */
  if (id < 0 || id >= nids) rt_cuda_fail(what, "offload id out of range (rt_offload_init)");
  if (!ready) cu_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
  cu_check(cudaEventRecord(ready, cu.stream), what);
  cu_check(cudaStreamWaitEvent(s, ready, 0), what);
  CU_PROF_BEGIN();
  cu_check(cudaMemcpyAsync(dst, src, bytes, kind, s), what);
  cu_check(cudaEventRecord(done[id], s), what);
  if (cu.sync_each) cu_check(cudaStreamSynchronize(s), what);
  CU_PROF_END(what);
}

void rt_offload_store(RtCtx *c, int id, act *host, const act *dev, size_t n) {
  copy(d2h, id, host, dev, n * sizeof(act), cudaMemcpyDeviceToHost, "offload store");
}

void rt_offload_load(RtCtx *c, int id, act *dev, const act *host, size_t n) {
  copy(h2d, id, dev, host, n * sizeof(act), cudaMemcpyHostToDevice, "offload load");
}

void rt_offload_wait(RtCtx *c, int id) {
  if (id < 0 || id >= nids) rt_cuda_fail("offload wait", "offload id out of range");
  cu_check(cudaStreamWaitEvent(cu.stream, done[id], 0), "offload wait");
}

void *rt_cuda_alloc_host(size_t bytes, char *err, size_t errlen) {
  void *p = NULL;
  cudaError_t e = cudaMallocHost(&p, bytes);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cannot allocate %.2f GiB of pinned host memory: %s", (double)bytes / (1u << 30),
             cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

void rt_cuda_free_host(void *p) {
  if (p) cudaFreeHost(p);
}
