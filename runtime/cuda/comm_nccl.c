/* comm_nccl.c — the cuda backend's collectives (the mtrt_comm.h calls step.c makes) over NCCL.
 *
 * Bootstrap as nccl-tests does: rank 0's ncclUniqueId is broadcast over MPI and every rank
 * joins one world communicator; each of the plan's groups (fsdp, ep, expert shard, replicate) is
 * then split from it with ncclCommSplit (color: the group's first world rank). step.c names a
 * group by its MPI communicator (RtComm), so the collectives look up the NCCL communicator that
 * belongs to it. A group of one rank needs no NCCL: its collectives are copies.
 *
 * Every NCCL call runs on one communication stream, after the compute stream's work so far (an
 * event). The prefetching all-gathers (rt_comm_all_gather_start) return at once and the compute
 * stream waits for them only in rt_comm_all_gather_wait, so the next layer's parameters arrive
 * while this layer computes; the other collectives are waited for at once. Every wait polls
 * ncclCommGetAsyncError: a peer that died or a network error aborts the job naming the rank,
 * the collective, the group and the size, after $MTC_NCCL_TIMEOUT seconds (default 600) at the
 * latest. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cu_internal.h"
#include "mtrt_comm.h"

typedef struct {
  MPI_Comm mpi;
  ncclComm_t nccl; /* NULL: one rank */
  int size, rank;
  const char *name;
} Group;

static Group groups[4];
static ncclComm_t world_nccl;
static int world_rank;
static cudaStream_t cs;                       /* the communication stream */
static cudaEvent_t ev_ready, ev_done, ev_slot[4];
static struct {
  const Group *g; /* NULL: nothing in flight (or a copy on the compute stream) */
  size_t count;
} slot_info[4];

static void nccl_check(ncclResult_t r, const char *what) {
  if (r != ncclSuccess) rt_cuda_fail(what, ncclGetErrorString(r));
}

static Group *group_of(MPI_Comm comm, const char *op) {
  for (int i = 0; i < 4; i++)
    if (groups[i].name && groups[i].mpi == comm) return &groups[i];
  rt_cuda_fail(op, "no NCCL communicator for this MPI communicator (rt_comm_nccl_init not called?)");
  return NULL;
}

/* The communication stream waits for the compute stream's work so far. */
static void begin(const char *op) {
  cu_check(cudaEventRecord(ev_ready, cu.stream), op);
  cu_check(cudaStreamWaitEvent(cs, ev_ready, 0), op);
}

/* Waits on the host for event ev (recorded on the communication stream), polling NCCL's
 * asynchronous error, then makes the compute stream wait for it too. */
static void wait_for(cudaEvent_t ev, const Group *g, const char *op, size_t count) {
  static double timeout = -1;
  if (timeout < 0) timeout = getenv("MTC_NCCL_TIMEOUT") ? atof(getenv("MTC_NCCL_TIMEOUT")) : 600;
  struct timespec t0, t, nap = {0, 20000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) break;
    char msg[300];
    if (e != cudaErrorNotReady) {
      snprintf(msg, sizeof msg, "%s of %zu values in group %s at %s: %s", op, count, g->name, rt_comm_where(),
               cudaGetErrorString(e));
      rt_cuda_fail(op, msg);
    }
    ncclResult_t r = ncclSuccess;
    if (g->nccl) ncclCommGetAsyncError(g->nccl, &r);
    clock_gettime(CLOCK_MONOTONIC, &t);
    double s = (double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec);
    if (r != ncclSuccess && r != ncclInProgress) {
      snprintf(msg, sizeof msg, "%s of %zu values in group %s (%d ranks) at %s failed: %s", op, count, g->name, g->size,
               rt_comm_where(), ncclGetErrorString(r));
      ncclCommAbort(g->nccl);
      rt_cuda_fail(op, msg);
    }
    if (s > timeout) {
      snprintf(msg, sizeof msg, "%s of %zu values in group %s (%d ranks) at %s did not finish in %.0f s "
               "(MTC_NCCL_TIMEOUT); a peer rank may have died", op, count, g->name, g->size, rt_comm_where(), timeout);
      if (g->nccl) ncclCommAbort(g->nccl);
      rt_cuda_fail(op, msg);
    }
    nanosleep(&nap, NULL);
  }
  cu_check(cudaStreamWaitEvent(cu.stream, ev, 0), op);
}

/* After a collective on the communication stream: wait for it. */
static void finish(const Group *g, const char *op, size_t count) {
  cu_check(cudaEventRecord(ev_done, cs), op);
  wait_for(ev_done, g, op, count);
}

int rt_comm_nccl_init(const RtComm *c, char *err, size_t errlen) {
  MPI_Comm mpis[4] = {c->fsdp_comm, c->ep_comm, c->shard_comm, c->replicate_comm};
  static const char *const names[4] = {"fsdp", "ep", "expert-shard", "replicate"};
  world_rank = c->rank;
  ncclResult_t r;
  if (c->world > 1) {
    ncclUniqueId id;
    if (c->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess)
      return snprintf(err, errlen, "ncclGetUniqueId: %s", ncclGetErrorString(r)), -1;
    RT_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    if ((r = ncclCommInitRank(&world_nccl, c->world, id, c->rank)) != ncclSuccess)
      return snprintf(err, errlen, "ncclCommInitRank (world of %d): %s", c->world, ncclGetErrorString(r)), -1;
  }
  cudaError_t ce;
  if ((ce = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking)) != cudaSuccess ||
      (ce = cudaEventCreateWithFlags(&ev_ready, cudaEventDisableTiming)) != cudaSuccess ||
      (ce = cudaEventCreateWithFlags(&ev_done, cudaEventDisableTiming)) != cudaSuccess)
    return snprintf(err, errlen, "the communication stream: %s", cudaGetErrorString(ce)), -1;
  for (int i = 0; i < 4; i++)
    if ((ce = cudaEventCreateWithFlags(&ev_slot[i], cudaEventDisableTiming)) != cudaSuccess)
      return snprintf(err, errlen, "the prefetch events: %s", cudaGetErrorString(ce)), -1;
  for (int i = 0; i < 4; i++) {
    Group *g = &groups[i];
    g->mpi = mpis[i], g->name = names[i], g->nccl = NULL;
    RT_MPI_CHECK(MPI_Comm_size(g->mpi, &g->size));
    RT_MPI_CHECK(MPI_Comm_rank(g->mpi, &g->rank));
    if (c->world == 1) continue;
    int root = c->rank; /* color: the world rank of the group's first member */
    RT_MPI_CHECK(MPI_Bcast(&root, 1, MPI_INT, 0, g->mpi));
    /* collective over the world: every rank splits every group, in the same order */
    if ((r = ncclCommSplit(world_nccl, g->size > 1 ? root : NCCL_SPLIT_NOCOLOR, g->rank, &g->nccl, NULL)) != ncclSuccess)
      return snprintf(err, errlen, "ncclCommSplit (group %s): %s", g->name, ncclGetErrorString(r)), -1;
    if (g->size == 1) g->nccl = NULL;
  }
  return 0;
}

void rt_comm_nccl_free(void) {
  for (int i = 0; i < 4; i++)
    if (groups[i].nccl) ncclCommDestroy(groups[i].nccl);
  if (world_nccl) ncclCommDestroy(world_nccl);
  if (cs) cudaStreamDestroy(cs);
  cs = NULL;
  memset(groups, 0, sizeof groups);
  world_nccl = NULL;
}

void rt_comm_all_gather(MPI_Comm comm, real *out, const real *in, size_t count) {
  Group *g = group_of(comm, "all-gather");
  if (!g->nccl) {
    if (out != in) cu_check(cudaMemcpyAsync(out, in, count * sizeof(real), cudaMemcpyDeviceToDevice, cu.stream), "all-gather");
    return;
  }
  begin("all-gather");
  nccl_check(ncclAllGather(in, out, count, ncclFloat32, g->nccl, cs), "ncclAllGather");
  finish(g, "all-gather", count);
}

void rt_comm_all_gather_start(MPI_Comm comm, real *out, const real *in, size_t count, int slot) {
  Group *g = group_of(comm, "all-gather (prefetch)");
  if (slot < 0 || slot >= 4) rt_cuda_fail("all-gather (prefetch)", "slot out of range");
  slot_info[slot].g = NULL;
  if (!g->nccl) { /* one rank: a copy, in order on the compute stream */
    if (out != in)
      cu_check(cudaMemcpyAsync(out, in, count * sizeof(real), cudaMemcpyDeviceToDevice, cu.stream), "all-gather");
    return;
  }
  begin("all-gather (prefetch)");
  nccl_check(ncclAllGather(in, out, count, ncclFloat32, g->nccl, cs), "ncclAllGather");
  cu_check(cudaEventRecord(ev_slot[slot], cs), "all-gather (prefetch)");
  slot_info[slot].g = g, slot_info[slot].count = count;
}

void rt_comm_all_gather_wait(int slot) {
  if (slot < 0 || slot >= 4) rt_cuda_fail("all-gather (prefetch)", "slot out of range");
  if (slot_info[slot].g) wait_for(ev_slot[slot], slot_info[slot].g, "all-gather (prefetched)", slot_info[slot].count);
  slot_info[slot].g = NULL;
}

void rt_comm_reduce_scatter(MPI_Comm comm, real *out, const real *in, size_t count) {
  Group *g = group_of(comm, "reduce-scatter");
  if (!g->nccl) {
    if (out != in) cu_check(cudaMemcpyAsync(out, in, count * sizeof(real), cudaMemcpyDeviceToDevice, cu.stream), "reduce-scatter");
    return;
  }
  begin("reduce-scatter");
  nccl_check(ncclReduceScatter(in, out, count, ncclFloat32, ncclSum, g->nccl, cs), "ncclReduceScatter");
  finish(g, "reduce-scatter", count);
}

/* As the cpu backend: round to bf16, exchange the pieces (grouped send/recv: an all-to-all),
 * sum the g pieces of this rank's part in fp32 in rank order. */
void rt_comm_reduce_scatter_bf16(MPI_Comm comm, real *out, const real *in, size_t count, uint16_t *wire) {
  Group *g = group_of(comm, "reduce-scatter (bf16)");
  long total = (long)g->size * (long)count, n = (long)count;
  uint16_t *send = wire, *recv = g->nccl ? wire + total : wire;
  cu_launch(K_CAST_BF16, cu_blocks(total, 256), 256, (void *[]){&send, &in, &total});
  if (g->nccl) {
    begin("reduce-scatter (bf16)");
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < g->size; r++) {
      nccl_check(ncclSend(send + (size_t)r * count, count, ncclBfloat16, r, g->nccl, cs), "ncclSend");
      nccl_check(ncclRecv(recv + (size_t)r * count, count, ncclBfloat16, r, g->nccl, cs), "ncclRecv");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    finish(g, "reduce-scatter (bf16)", count);
  }
  int gs = g->size;
  cu_launch(K_SUM_BF16_PIECES, cu_blocks(n, 256), 256, (void *[]){&out, &recv, &gs, &n});
}

void rt_cu_all_reduce(MPI_Comm comm, float *buf, size_t count) {
  Group *g = group_of(comm, "all-reduce");
  if (!g->nccl) return;
  begin("all-reduce");
  nccl_check(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, g->nccl, cs), "ncclAllReduce");
  finish(g, "all-reduce", count);
}

/* ---- the MoE token exchange (mtrt_comm.h): counts over MPI, rows over NCCL ---- */

/* Rows between the source-major receive buffer and the expert-major layout (as moe_a2a.c). */
static void regroup(const RtA2A *a, real *expert_major, real *src_major, int C, int to_expert) {
  size_t row = 0;
  for (int k = 0; k < a->El; k++)
    for (int s = 0; s < a->ep; s++) {
      size_t at = (size_t)a->rd[s] / (size_t)C;
      for (int k2 = 0; k2 < k; k2++) at += (size_t)a->cnt_recv[s * a->El + k2];
      size_t n = (size_t)a->cnt_recv[s * a->El + k] * (size_t)C;
      real *e = expert_major + row * (size_t)C, *m = src_major + at * (size_t)C;
      if (n)
        cu_check(cudaMemcpyAsync(to_expert ? e : m, to_expert ? m : e, n * sizeof(real), cudaMemcpyDeviceToDevice,
                                 cu.stream), "moe regroup");
      row += (size_t)a->cnt_recv[s * a->El + k];
    }
}

static void exchange(Group *g, const real *send, const int *sc, const int *sd, real *recv, const int *rc, const int *rd,
                     const char *op) {
  begin(op);
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int p = 0; p < g->size; p++) {
    if (sc[p]) nccl_check(ncclSend(send + sd[p], (size_t)sc[p], ncclFloat32, p, g->nccl, cs), "ncclSend");
    if (rc[p]) nccl_check(ncclRecv(recv + rd[p], (size_t)rc[p], ncclFloat32, p, g->nccl, cs), "ncclRecv");
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  finish(g, op, 0);
}

void rt_moe_dispatch(MPI_Comm ep_comm, RtA2A *a, real *xe, int *eoff, real *tmp, const real *xp, const int *offsets,
                     int C) {
  Group *g = group_of(ep_comm, "moe dispatch");
  int ep = a->ep, El = a->El, *off = cu.off_host;
  if (!g->nccl) rt_cuda_fail("moe dispatch", "an EP group of one rank needs no dispatch (step.c skips it)");
  rt_cuda_download(off, offsets, sizeof(int) * (size_t)(ep * El + 1));
  for (int j = 0; j < ep; j++) {
    for (int k = 0; k < El; k++) a->cnt_send[j * El + k] = off[j * El + k + 1] - off[j * El + k];
    a->sc[j] = (off[(j + 1) * El] - off[j * El]) * C;
    a->sd[j] = off[j * El] * C;
  }
  RT_MPI_CHECK(MPI_Alltoall(a->cnt_send, El, MPI_INT, a->cnt_recv, El, MPI_INT, ep_comm));
  int rows = 0;
  for (int s = 0; s < ep; s++) {
    int n = 0;
    for (int k = 0; k < El; k++) n += a->cnt_recv[s * El + k];
    a->rc[s] = n * C, a->rd[s] = rows * C;
    rows += n;
  }
  a->rows_recv = rows;
  exchange(g, xp, a->sc, a->sd, tmp, a->rc, a->rd, "moe dispatch (all-to-all-v)");
  regroup(a, xe, tmp, C, 1);
  int *e = off; /* the counts are taken: reuse the offsets' host buffer (E + 1 >= El + 1) */
  e[0] = 0;
  for (int k = 0; k < El; k++) {
    int n = 0;
    for (int s = 0; s < ep; s++) n += a->cnt_recv[s * El + k];
    e[k + 1] = e[k] + n;
  }
  rt_cuda_upload(eoff, e, sizeof(int) * (size_t)(El + 1));
}

void rt_moe_undispatch(MPI_Comm ep_comm, const RtA2A *a, real *yp, real *tmp, const real *ye, int C) {
  Group *g = group_of(ep_comm, "moe undispatch");
  regroup(a, (real *)ye, tmp, C, 0);
  exchange(g, tmp, a->rc, a->rd, yp, a->sc, a->sd, "moe undispatch (all-to-all-v)");
}
