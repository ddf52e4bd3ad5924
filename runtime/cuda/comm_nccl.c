/* comm_nccl.c — the cuda backend's collectives (the mtrt_comm.h calls step.c makes) over NCCL.
 *
 * Bootstrap as nccl-tests does: rank 0's ncclUniqueId is broadcast over MPI and every rank
 * joins one world communicator; each of the plan's groups (fsdp, ep, expert shard, replicate) is
 * then split from it with ncclCommSplit (color: the group's first world rank). step.c names a
 * group by its MPI communicator (RtComm, or MPI_COMM_WORLD for the world communicator itself: the
 * aux-free balancing's expert loads), so the collectives look up the NCCL communicator that
 * belongs to it. A group of one rank needs no NCCL: its collectives are copies.
 *
 * Every NCCL call runs on its group's communication stream, after the compute stream's work so
 * far (an event): the EP group's MoE all-to-alls on a stream of their own, so that they never
 * queue behind the FSDP groups' prefetching all-gathers and reduce-scatters. The prefetching
 * all-gathers (rt_comm_all_gather_start) return at once and the compute stream waits for them
 * only in rt_comm_all_gather_wait, so the next layer's parameters arrive while this layer
 * computes. Every collective is waited for on the device (the compute stream waits for an event
 * recorded after it on the communication stream): the host never blocks on one.
 *
 * The host blocks only where it must read the device (the MoE counts, the step's scalars,
 * Muon's exchange, checkpoints): rt_cu_host_wait, which polls an event of the compute stream
 * and, while it is not done, ncclCommGetAsyncError of every group. Each collective is also
 * recorded in a ring of the last WATCH ones (group, op, values, where the step was, the host's
 * clock when it was issued: its event), so that a peer that died or a network error aborts the
 * job naming the rank, the oldest collective still pending, its group, size and layer, and
 * where the host waited.
 *
 * $MTC_NCCL_TIMEOUT (seconds, default 600) bounds each collective, measured from when the host
 * issued it (its ncclX call returned), not from when the device reached it: a collective queued
 * behind compute counts that compute's time too (the host runs ahead of the device by about the
 * work it queued since its previous wait at most). It is checked while the host waits: every
 * poll compares the oldest collective still pending with it, so a collective issued long before
 * the wait (a prefetched all-gather, an overlapped reduce-scatter) is caught as soon as it is
 * overdue, however short the wait so far. Why not from when the device reached it: that needs a
 * host callback on the communication stream (cudaLaunchHostFunc, which stalls the stream) or
 * timing events (which give only the time between two completed ones); the issue time costs one
 * clock read per collective. A wait with no collective pending (a kernel or copy that never
 * ends) aborts after $MTC_NCCL_TIMEOUT seconds of the wait itself, as before. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cu_internal.h"
#include "mtrt_comm.h"
#include "mtrt_ops.h"

/* The NCCL type of the activation type (mtrt_real.h): gathered parameters and the MoE rows. */
#define NCCL_ACT (MTRT_ACT_IS_BF16 ? ncclBfloat16 : ncclFloat32)

typedef struct {
  MPI_Comm mpi;
  ncclComm_t nccl; /* NULL: one rank */
  cudaStream_t s;  /* its communication stream (cs, or cs_ep for the EP group) */
  int size, rank;
  const char *name;
} Group;

enum { N_GROUPS = 8 }; /* fsdp, ep, expert shard, replicate, world (its NCCL communicator: world_nccl), cp, and the
                          hierarchical all-to-all's node and cross groups (cu_comm_split) */
static Group groups[N_GROUPS];
static ncclComm_t world_nccl;
static int world_rank;
static cudaStream_t cs, cs_ep;                /* the communication streams: FSDP groups, EP group */
static cudaEvent_t ev_ready, ev_done, ev_slot[RT_AG_SLOTS];
static struct {
  const Group *g; /* NULL: nothing in flight (or a copy on the compute stream) */
  size_t count;
} slot_info[RT_AG_SLOTS];

static void nccl_check(ncclResult_t r, const char *what) {
  if (r != ncclSuccess) rt_cuda_fail(what, ncclGetErrorString(r));
}

static Group *group_of(MPI_Comm comm, const char *op) {
  for (int i = 0; i < N_GROUPS; i++)
    if (groups[i].name && groups[i].mpi == comm) return &groups[i];
  rt_cuda_fail(op, "no NCCL communicator for this MPI communicator (rt_comm_nccl_init not called?)");
  return NULL;
}

/* g's communication stream waits for the compute stream's work so far. */
static void begin(const Group *g, const char *op) {
  cu_check(cudaEventRecord(ev_ready, cu.stream), op);
  cu_check(cudaStreamWaitEvent(g->s, ev_ready, 0), op);
}

/* The ring of the last WATCH collectives, for the host waits' diagnosis and the timeout: each
 * with an event recorded after it on its group's stream (its own: a device wait uses another)
 * and the host's clock when it was issued. Every collective but the prefetched all-gathers (at
 * most RT_AG_SLOTS) is done when a host wait returns, so at most the collectives issued between
 * two host waits are pending (europa-1t: about 10 per layer). Were more than WATCH pending, the
 * overwritten ones would be lost to the naming and to the timeout (the next one in the ring is
 * timed from its own issue), and the host wait's own bound still holds. */
enum { WATCH = 1024 };
static struct {
  cudaEvent_t ev;
  const Group *g; /* NULL: never used */
  const char *op, *where;
  size_t count;
  double issued; /* the host's CLOCK_MONOTONIC, seconds, when the collective was issued */
} watch[WATCH];
/* Entries watch_tail .. watch_next - 1 (mod WATCH) may be pending; older ones are done or lost.
 * watch_tail moves on only past entries found done (overdue) or overwritten (watched). */
static unsigned watch_next, watch_tail;
static int waited; /* the compute stream waits for a collective issued since the last host wait */

/* CLOCK_MONOTONIC in seconds. */
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Records the collective op of count values just issued on g's stream into the ring. */
static void watched(const Group *g, const char *op, size_t count) {
  if (watch_next - watch_tail == WATCH) watch_tail++; /* its oldest entry is overwritten */
  unsigned i = watch_next++ % WATCH;
  if (!watch[i].ev) cu_check(cudaEventCreateWithFlags(&watch[i].ev, cudaEventDisableTiming), op);
  cu_check(cudaEventRecord(watch[i].ev, g->s), op);
  watch[i].g = g, watch[i].op = op, watch[i].where = rt_comm_where(), watch[i].count = count;
  watch[i].issued = now_s();
}

/* The oldest collective of the ring still pending that was issued more than timeout seconds
 * before now, or -1. The entries are in issue order, so it looks at the oldest not known done
 * (watch_tail) only: done, it moves on; younger than timeout, so are the rest. Queries an event
 * only once it is overdue: at most once per collective over the run, besides a pending one's
 * once per poll. */
static int overdue(double now, double timeout) {
  for (; watch_tail != watch_next; watch_tail++) {
    unsigned i = watch_tail % WATCH;
    if (!watch[i].g) continue; /* (the groups were freed) */
    if (now - watch[i].issued <= timeout) return -1;
    if (cudaEventQuery(watch[i].ev) == cudaErrorNotReady) return (int)i;
  }
  return -1;
}

/* The oldest collective of the ring not done yet (of group g, when g is not NULL), or -1. */
static int oldest_pending(const Group *g) {
  for (unsigned k = 0; k < WATCH; k++) {
    unsigned i = (watch_next + k) % WATCH;
    if (watch[i].g && (!g || watch[i].g == g) && cudaEventQuery(watch[i].ev) == cudaErrorNotReady) return (int)i;
  }
  return -1;
}

/* msg: "OP of N values in group G (R ranks) issued at WHERE" for ring entry i; describe_pending:
 * that of the oldest pending collective (of g when g is not NULL), or g's name alone when the
 * ring holds none. */
static void describe(char *msg, size_t n, int i) {
  snprintf(msg, n, "%s of %zu values in group %s (%d ranks) issued at %s", watch[i].op, watch[i].count, watch[i].g->name,
           watch[i].g->size, watch[i].where);
}
static void describe_pending(char *msg, size_t n, const Group *g) {
  int i = oldest_pending(g);
  if (i >= 0)
    describe(msg, n, i);
  else if (g)
    snprintf(msg, n, "a collective in group %s (%d ranks)", g->name, g->size);
  else
    snprintf(msg, n, "no collective (none pending)");
}

static cudaEvent_t marked; /* rt_cu_host_mark's */

/* Polls ev until it is done, watching the groups' communicators (rt_cu_host_wait's loop). */
static void host_poll(cudaEvent_t ev, const char *why, bool all);

void rt_cu_host_wait(const char *why) {
  static cudaEvent_t ev;
  if (!ev) cu_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), why);
  cu_check(cudaEventRecord(ev, cu.stream), why);
  host_poll(ev, why, true);
}

void cu_host_wait_event(cudaEvent_t ev, const char *why) { host_poll(ev, why, false); }

void rt_cu_host_mark(void) {
  if (!marked) cu_check(cudaEventCreateWithFlags(&marked, cudaEventDisableTiming), "a host wait's mark");
  cu_check(cudaEventRecord(marked, cu.stream), "a host wait's mark");
}

void rt_cu_host_wait_mark(const char *why) {
  if (!marked) rt_cuda_fail(why, "no mark recorded (rt_cu_host_mark)");
  host_poll(marked, why, false); /* a collective waited for after the mark may be pending */
}

static void host_poll(cudaEvent_t ev, const char *why, bool all) {
  static double timeout = -1;
  if (timeout < 0) timeout = getenv("MTC_NCCL_TIMEOUT") ? atof(getenv("MTC_NCCL_TIMEOUT")) : 600;
  struct timespec nap = {0, 20000};
  double t0 = now_s();
  for (;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) {
      if (all) waited = 0, cu.ring_waited = cu.ring_issued; /* every copy issued before is done */
      return;
    }
    char msg[700], what[300];
    if (e != cudaErrorNotReady) {
      describe_pending(what, sizeof what, NULL);
      snprintf(msg, sizeof msg, "%s (waiting at %s; pending: %s)", cudaGetErrorString(e), rt_comm_where(), what);
      rt_cuda_fail(why, msg);
    }
    const Group *bad = NULL;
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < N_GROUPS && !bad; i++)
      if (groups[i].nccl) {
        ncclCommGetAsyncError(groups[i].nccl, &r);
        if (r != ncclSuccess && r != ncclInProgress) bad = &groups[i];
      }
    if (bad) {
      describe_pending(what, sizeof what, bad);
      snprintf(msg, sizeof msg, "%s failed: %s (found waiting at %s)", what, ncclGetErrorString(r), rt_comm_where());
      ncclCommAbort(bad->nccl);
      rt_cuda_fail(why, msg);
    }
    double t = now_s();
    int i = overdue(t, timeout); /* a collective pending for longer than the timeout */
    if (i >= 0) {
      describe(what, sizeof what, i);
      snprintf(msg, sizeof msg, "%s did not finish in %g s (MTC_NCCL_TIMEOUT: pending %.1f s since it was issued; "
               "found %.1f s into the host's wait at %s); a peer rank may have died", what, timeout, t - watch[i].issued,
               t - t0, rt_comm_where());
      if (watch[i].g->nccl) ncclCommAbort(watch[i].g->nccl);
      rt_cuda_fail(why, msg);
    }
    if (t - t0 > timeout) { /* no collective of the ring pending: the wait itself is bounded */
      describe_pending(what, sizeof what, NULL);
      snprintf(msg, sizeof msg, "the device did not finish its work in %g s (MTC_NCCL_TIMEOUT; waiting at %s; %s): "
               "a kernel or copy that never ends?", timeout, rt_comm_where(), what);
      rt_cuda_fail(why, msg);
    }
    nanosleep(&nap, NULL);
  }
}

/* After a collective op of count values on g's stream: recorded in the ring, and the compute
 * stream waits for it (on the device). */
static void finish(const Group *g, const char *op, size_t count) {
  watched(g, op, count);
  cu_check(cudaEventRecord(ev_done, g->s), op);
  cu_check(cudaStreamWaitEvent(cu.stream, ev_done, 0), op);
  waited = 1;
}

int cu_comm_waited(void) { return waited; }

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
      (ce = cudaStreamCreateWithFlags(&cs_ep, cudaStreamNonBlocking)) != cudaSuccess ||
      (ce = cudaEventCreateWithFlags(&ev_ready, cudaEventDisableTiming)) != cudaSuccess ||
      (ce = cudaEventCreateWithFlags(&ev_done, cudaEventDisableTiming)) != cudaSuccess)
    return snprintf(err, errlen, "the communication stream: %s", cudaGetErrorString(ce)), -1;
  for (int i = 0; i < RT_AG_SLOTS; i++)
    if ((ce = cudaEventCreateWithFlags(&ev_slot[i], cudaEventDisableTiming)) != cudaSuccess)
      return snprintf(err, errlen, "the prefetch events: %s", cudaGetErrorString(ce)), -1;
  for (int i = 0; i < 4; i++) {
    Group *g = &groups[i];
    g->mpi = mpis[i], g->name = names[i], g->nccl = NULL, g->s = i == 1 ? cs_ep : cs;
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
  Group *w = &groups[4]; /* the world: world_nccl itself (freed once, below), on the FSDP stream */
  w->mpi = MPI_COMM_WORLD, w->name = "world", w->nccl = c->world > 1 ? world_nccl : NULL, w->s = cs;
  w->size = c->world, w->rank = c->rank;
  if (c->cp > 1) { /* context parallelism: the cp group (rt_comm_cp_init), on the FSDP stream */
    Group *g = &groups[5];
    g->mpi = c->cp_comm, g->name = "cp", g->nccl = NULL, g->s = cs, g->size = c->cp, g->rank = c->cp_rank;
    int root = c->rank;
    RT_MPI_CHECK(MPI_Bcast(&root, 1, MPI_INT, 0, g->mpi));
    if ((r = ncclCommSplit(world_nccl, root, g->rank, &g->nccl, NULL)) != ncclSuccess)
      return snprintf(err, errlen, "ncclCommSplit (group cp): %s", ncclGetErrorString(r)), -1;
  }
  return 0;
}

void rt_comm_nccl_free(void) {
  for (int i = 0; i < N_GROUPS; i++)
    if (i != 4 && groups[i].nccl) ncclCommDestroy(groups[i].nccl);
  if (world_nccl) ncclCommDestroy(world_nccl);
  if (cs) cudaStreamDestroy(cs);
  if (cs_ep) cudaStreamDestroy(cs_ep);
  cs = cs_ep = NULL;
  memset(groups, 0, sizeof groups);
  for (int i = 0; i < WATCH; i++) watch[i].g = NULL; /* (the groups are gone) */
  watch_tail = watch_next;
  world_nccl = NULL;
}

void rt_comm_all_gather_start(MPI_Comm comm, act *out, const act *in, size_t count, int slot) {
  Group *g = group_of(comm, "all-gather (prefetch)");
  if (slot < 0 || slot >= RT_AG_SLOTS) rt_cuda_fail("all-gather (prefetch)", "slot out of range");
  slot_info[slot].g = NULL;
  if (!g->nccl) { /* one rank: a copy, in order on the compute stream */
    if (out != in)
      cu_check(cudaMemcpyAsync(out, in, count * sizeof(act), cudaMemcpyDeviceToDevice, cu.stream), "all-gather");
    return;
  }
  begin(g, "all-gather (prefetch)");
  nccl_check(ncclAllGather(in, out, count, NCCL_ACT, g->nccl, g->s), "ncclAllGather");
  cu_check(cudaEventRecord(ev_slot[slot], g->s), "all-gather (prefetch)");
  watched(g, "all-gather (prefetched)", count);
  slot_info[slot].g = g, slot_info[slot].count = count;
}

void rt_comm_all_gather_wait(int slot) {
  if (slot < 0 || slot >= RT_AG_SLOTS) rt_cuda_fail("all-gather (prefetch)", "slot out of range");
  if (slot_info[slot].g) cu_check(cudaStreamWaitEvent(cu.stream, ev_slot[slot], 0), "all-gather (prefetched)"), waited = 1;
  slot_info[slot].g = NULL;
}

/* The reduce-scatters in flight: the collective on the group's stream, ended by ev_rs[slot]; the
 * add of this rank's piece into the shard runs on the compute stream in the wait. */
static cudaEvent_t ev_rs[4];
static struct {
  const Group *g;    /* NULL: the slot is free */
  real *acc;
  const void *piece; /* this rank's summed piece (count values): act, or real (fp32 wire from bf16) */
  int piece_real;
  size_t count;
  int pending;       /* an NCCL collective to wait for */
} rs_info[4];

void rt_comm_reduce_scatter_start(MPI_Comm comm, real *acc, act *in, size_t count, bool bf16, real *wire, int slot) {
  Group *g = group_of(comm, "reduce-scatter (overlapped)");
  const char *op = "reduce-scatter (overlapped)";
  if (slot < 0 || slot >= 4 || rs_info[slot].g) rt_cuda_fail(op, "slot out of range or in use");
  if (!ev_rs[slot]) cu_check(cudaEventCreateWithFlags(&ev_rs[slot], cudaEventDisableTiming), "reduce-scatter events");
  rs_info[slot].g = g, rs_info[slot].acc = acc, rs_info[slot].count = count;
  rs_info[slot].piece = in, rs_info[slot].piece_real = 0, rs_info[slot].pending = 0;
  if (!g->nccl) return; /* one rank: its piece is in */
  long total = (long)g->size * (long)count;
  size_t at = (size_t)g->rank * count; /* in place: this rank's piece is its part of the buffer */
  if (bf16 && MTRT_ACT_IS_BF16) {
    begin(g, op);
    nccl_check(ncclReduceScatter(in, in + at, count, ncclBfloat16, ncclSum, g->nccl, g->s), "ncclReduceScatter");
    rs_info[slot].piece = in + at;
  } else if (!MTRT_ACT_IS_BF16) { /* fp32 act: in place in in, its values rounded to bf16 first for a bf16 wire */
    if (bf16) cu_launch(K_ROUND_BF16, cu_blocks(total, 256), 256, (void *[]){&in, &total});
    begin(g, op);
    nccl_check(ncclReduceScatter(in, in + at, count, ncclFloat32, ncclSum, g->nccl, g->s), "ncclReduceScatter");
    rs_info[slot].piece = in + at;
  } else { /* fp32 wire from bf16 storage: in's values into wire, summed there in place */
    if (!wire) rt_cuda_fail(op, "an fp32 reduce-scatter of bf16 gradients needs the plan's fp32 wire buffer");
    cu_launch(K_CAST_ACT_F32, cu_blocks(total, 256), 256, (void *[]){&wire, &in, &total});
    begin(g, op);
    nccl_check(ncclReduceScatter(wire, wire + at, count, ncclFloat32, ncclSum, g->nccl, g->s), "ncclReduceScatter");
    rs_info[slot].piece = wire + at, rs_info[slot].piece_real = 1;
  }
  rs_info[slot].pending = 1;
  cu_check(cudaEventRecord(ev_rs[slot], g->s), op);
  watched(g, op, count);
}

void rt_comm_reduce_scatter_wait(int slot) {
  if (slot < 0 || slot >= 4 || !rs_info[slot].g) return; /* nothing in flight */
  if (rs_info[slot].pending)
    cu_check(cudaStreamWaitEvent(cu.stream, ev_rs[slot], 0), "reduce-scatter (overlapped)"), waited = 1;
  real *acc = rs_info[slot].acc;
  const void *piece = rs_info[slot].piece;
  long n = (long)rs_info[slot].count;
  if (n)
    cu_launch(rs_info[slot].piece_real ? K_ACCUMULATE_F32 : K_ACCUMULATE_ACT_F32, cu_blocks(n, 256), 256,
              (void *[]){&acc, &piece, &n});
  rs_info[slot].g = NULL;
}

void rt_cu_all_reduce(MPI_Comm comm, float *buf, size_t count) {
  Group *g = group_of(comm, "all-reduce");
  if (!g->nccl) return;
  begin(g, "all-reduce");
  nccl_check(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, g->nccl, g->s), "ncclAllReduce");
  finish(g, "all-reduce", count);
}

/* ---- context parallelism (mtrt_comm.h's rt_comm_cp_*) over the cp group's communicator ----
 * Chunk j of a sequence (2 cp chunks of T / 2 tokens) is rank j's first chunk for j < cp and rank
 * 2 cp − 1 − j's second for j >= cp: the first chunks all-gather straight into slots 0..cp−1 (rank
 * order), the second ones into slots cp..2cp−1 in rank order, the reverse of position order, which
 * cp_reverse (kernels.cu) turns around on the compute stream; the reduce-scatter the other way. Each
 * collective per sequence (B of them, the micro-batch) on the FSDP stream; the compute stream waits
 * for them on the device. */

/* In each of B sequences of full (S values apart), the cp second-chunk slots of c values reversed. */
static void cp_reverse(act *full, int cp, size_t c, size_t S, int B) {
  act *x = full + (size_t)cp * c;
  long long len = (long long)c, stride = (long long)S, n = (long long)B * (cp / 2) * len;
  cu_launch(K_CP_REVERSE, cu_blocks(n, 256), 256, (void *[]){&x, &cp, &len, &stride, &n});
}

void rt_comm_cp_gather(MPI_Comm comm, int cp, act *full, const act *local, int B, int T, int64_t width) {
  const char *op = "cp all-gather (keys, values)";
  Group *g = group_of(comm, op);
  if (!g->nccl || g->size != cp) rt_cuda_fail(op, "the cp group has no NCCL communicator of cp ranks");
  size_t c = (size_t)(T / 2) * (size_t)width, S = (size_t)cp * (size_t)T * (size_t)width;
  begin(g, op);
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int b = 0; b < B; b++) {
    const act *l = local + (size_t)b * T * (size_t)width;
    nccl_check(ncclAllGather(l, full + (size_t)b * S, c, NCCL_ACT, g->nccl, g->s), "ncclAllGather");
    nccl_check(ncclAllGather(l + c, full + (size_t)b * S + (size_t)cp * c, c, NCCL_ACT, g->nccl, g->s), "ncclAllGather");
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  finish(g, op, 2 * (size_t)B * c * (size_t)cp);
  cp_reverse(full, cp, c, S, B);
}

void rt_comm_cp_reduce_scatter(MPI_Comm comm, int cp, act *local, act *full, int B, int T, int64_t width) {
  const char *op = "cp reduce-scatter (keys' and values' gradient)";
  Group *g = group_of(comm, op);
  if (!g->nccl || g->size != cp) rt_cuda_fail(op, "the cp group has no NCCL communicator of cp ranks");
  size_t c = (size_t)(T / 2) * (size_t)width, S = (size_t)cp * (size_t)T * (size_t)width;
  cp_reverse(full, cp, c, S, B); /* the second chunks' slots in rank order */
  begin(g, op);
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int b = 0; b < B; b++) {
    act *l = local + (size_t)b * T * (size_t)width, *f = full + (size_t)b * S;
    nccl_check(ncclReduceScatter(f, l, c, NCCL_ACT, ncclSum, g->nccl, g->s), "ncclReduceScatter");
    nccl_check(ncclReduceScatter(f + (size_t)cp * c, l + c, c, NCCL_ACT, ncclSum, g->nccl, g->s), "ncclReduceScatter");
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  finish(g, op, 2 * (size_t)B * c);
}

void rt_comm_cp_mean(MPI_Comm comm, int cp, real *buf, size_t n) {
  rt_cu_all_reduce(comm, buf, n);
  float s = 1.f / (float)cp;
  long ln = (long)n;
  cu_launch(K_SCALE_F32, cu_blocks(ln, 256), 256, (void *[]){&buf, &s, &ln});
}

/* ---- the MoE token exchange (mtrt_comm.h): counts over MPI, rows over NCCL ----
 * No host synchronization: the counts are on the host since the permutation (cu_offsets), each
 * all-to-all is waited for on the device (the compute stream waits for the EP stream's event), and
 * the regroup between the received order and the experts' is one kernel (moe_regroup) over a table
 * of the round's blocks uploaded with the round's eoff in one copy from pageable memory, which
 * returns without waiting for the device. */

/* Rows sc/sd out, rc/rd in (rows of C values; element counts and offsets as size_t); the compute
 * stream waits for it on the device. */
static void exchange(Group *g, const act *send, const int64_t *sc, const int64_t *sd, act *recv, const int64_t *rc,
                     const int64_t *rd, int C, const char *op) {
  size_t c = (size_t)C, rows = 0;
  begin(g, op);
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int p = 0; p < g->size; p++) {
    rows += (size_t)rc[p];
    if (sc[p]) nccl_check(ncclSend(send + (size_t)sd[p] * c, (size_t)sc[p] * c, NCCL_ACT, p, g->nccl, g->s), "ncclSend");
    if (rc[p]) nccl_check(ncclRecv(recv + (size_t)rd[p] * c, (size_t)rc[p] * c, NCCL_ACT, p, g->nccl, g->s), "ncclRecv");
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  finish(g, op, rows * c); /* (the values received) */
}

/* Round a->round's blocks to the device (cu.moe's table, eoff after it): the non-empty blocks in
 * the received (source-major) order; returns their count. With eoff, the round's first row per
 * local expert too, copied into eoff (El + 1 ints). One copy up, through the copy ring. */
static int upload_blocks(const RtA2A *a, int *eoff, const int *e) {
  size_t cnt, tab, eo, E = (size_t)cu.cfg.experts;
  cu_moe_layout(E, &cnt, &tab, &eo);
  long long *t = (long long *)((char *)cu.moe_host + tab);
  int nb = 0;
  for (int s = 0; s < a->ep; s++)
    for (int k = 0; k < a->El; k++) {
      const RtA2ABlock *b = &a->blocks[k * a->ep + s];
      if (b->rows) t[nb] = b->source_row, t[E + nb] = b->expert_row, nb++;
    }
  size_t bytes = eo - tab;
  if (e) memcpy((char *)cu.moe_host + eo, e, sizeof(int) * (size_t)(a->El + 1)), bytes += sizeof(int) * (size_t)(a->El + 1);
  cu_ring_upload((char *)cu.moe + tab, t, bytes);
  if (e)
    cu_check(cudaMemcpyAsync(eoff, (char *)cu.moe + eo, sizeof(int) * (size_t)(a->El + 1), cudaMemcpyDeviceToDevice,
                             cu.stream), "moe regroup");
  return nb;
}

/* The round's rows between buf (received order) and xe (expert order), on the compute stream. */
static void regroup(const RtA2A *a, int nb, act *xe, act *buf, int to_expert) {
  size_t cnt, tab, eo;
  cu_moe_layout((size_t)cu.cfg.experts, &cnt, &tab, &eo);
  long long *t = (long long *)((char *)cu.moe + tab);
  int stride = cu.cfg.experts;
  if (nb) cu_launch(K_MOE_REGROUP, (unsigned)a->rows_recv, 128, (void *[]){&xe, &buf, &t, &nb, &stride, &to_expert});
}

int rt_moe_route(MPI_Comm ep_comm, RtA2A *a, const int *offsets) {
  Group *g = group_of(ep_comm, "moe route");
  int pe = a->ep * a->El;
  if (!g->nccl) rt_cuda_fail("moe route", "an EP group of one rank needs no route (step.c skips it)");
  /* the offsets on the host: the permutation learned them there (cu_offsets) */
  memcpy(a->off, cu_offsets(offsets, (size_t)pe + 1), sizeof(int) * (size_t)(pe + 1));
  rt_a2a_plan_counts(a);
  RT_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a->cnt_all, pe, MPI_INT, ep_comm));
  return rt_a2a_plan_rounds(a);
}

void rt_moe_dispatch(MPI_Comm ep_comm, RtA2A *a, int r, act *xe, int *eoff, act *tmp, const act *xp, int C) {
  Group *g = group_of(ep_comm, "moe dispatch");
  int e[a->El + 1];
  if (!g->nccl) rt_cuda_fail("moe dispatch", "an EP group of one rank needs no dispatch (step.c skips it)");
  if (r < 0 || r >= a->rounds) rt_cuda_fail("moe dispatch", "round out of range of the last route");
  if (a->El > cu.cfg.experts) rt_cuda_fail("moe dispatch", "more local experts than the runtime was sized for");
  rt_a2a_plan_round(a, r, e);
  exchange(g, xp, a->sc, a->sd, tmp, a->rc, a->rd, C, "moe dispatch (all-to-all-v)");
  regroup(a, upload_blocks(a, eoff, e), xe, tmp, 1);
  cu_offsets_known(eoff, e, (size_t)a->El + 1);
}

int cu_comm_split(MPI_Comm comm, const char *name, char *err, size_t errlen) {
  Group *g = NULL;
  for (int i = 6; i < N_GROUPS && !g; i++)
    if (!groups[i].name) g = &groups[i];
  if (!g) return snprintf(err, errlen, "no room for NCCL group %s", name), -1;
  g->mpi = comm, g->name = name, g->nccl = NULL, g->s = cs_ep;
  RT_MPI_CHECK(MPI_Comm_size(comm, &g->size));
  RT_MPI_CHECK(MPI_Comm_rank(comm, &g->rank));
  if (!world_nccl) return 0; /* one rank in the world */
  int root = world_rank; /* color: the world rank of the group's first member */
  RT_MPI_CHECK(MPI_Bcast(&root, 1, MPI_INT, 0, comm));
  ncclResult_t r = ncclCommSplit(world_nccl, g->size > 1 ? root : NCCL_SPLIT_NOCOLOR, g->rank, &g->nccl, NULL);
  if (r != ncclSuccess) return snprintf(err, errlen, "ncclCommSplit (group %s): %s", name, ncclGetErrorString(r)), -1;
  if (g->size == 1) g->nccl = NULL;
  return 0;
}

void cu_comm_rows(MPI_Comm comm, const act *send, const int64_t *sc, const int64_t *sd, act *recv, const int64_t *rc,
                  const int64_t *rd, int C, const char *op) {
  Group *g = group_of(comm, op);
  if (g->nccl) {
    exchange(g, send, sc, sd, recv, rc, rd, C, op);
    return;
  }
  if (sc[0] != rc[0]) rt_cuda_fail(op, "a group of one rank receives other rows than it sends");
  if (sc[0])
    cu_check(cudaMemcpyAsync(recv + (size_t)rd[0] * (size_t)C, send + (size_t)sd[0] * (size_t)C,
                             (size_t)sc[0] * (size_t)C * sizeof(act), cudaMemcpyDeviceToDevice, cu.stream), op);
}

void rt_moe_undispatch(MPI_Comm ep_comm, const RtA2A *a, act *yp, act *tmp, const act *ye, int C) {
  Group *g = group_of(ep_comm, "moe undispatch");
  regroup(a, upload_blocks(a, NULL, NULL), (act *)ye, tmp, 0);
  exchange(g, tmp, a->rc, a->rd, yp, a->sc, a->sd, C, "moe undispatch (all-to-all-v)");
}
