/* moe_hier.c — the hierarchical MoE token exchange on the cuda backend (mtrt_hier.h): the tables
 * are the host's (comm/hier_plan.c, as on the cpu backend), the rows move on the device: the
 * origin's unique rows gathered by a kernel (hier_rows), one NCCL all-to-all over the cross group
 * (one GPU per node with the same local index) to the relays, the relays' copies expanded into the
 * staging HST and sent to the node's GPUs over the node group in messages of at most st rows (g
 * shifted steps, the cpu backend's order), the owner's relay-major rows regrouped into the experts'
 * layout (moe_regroup). The combine goes back the same way: each message's copies summed into the
 * relay's unique rows by target (hier_rows over a table grouped by target, in the copies' order),
 * one crossing back, and the nodes' sums added into the tokens' rows node by node.
 *
 * Host synchronizations per MoE pass, besides the route's: the positions (rt_hier_slots), the
 * routing weights (once per pass, when a dispatch sends gates), the rows' scalars (the backward's
 * rt_moe_hier_scalars_back), each a copy down through the pinned ring; and one before each round's
 * tables go over MPI while collectives are in flight (settle). Every table goes up through
 * the ring (no pageable asynchronous copy). The gates and scalars between relays and owners move on
 * the host over MPI (hier_plan.c), as on the cpu backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_internal.h"
#include "mtrt_hier.h"

/* The device and host tables of rt_hier_cuda_bytes, in its order. */
typedef struct {
  void *host, *dev;
  /* host */
  int32_t *relay;      /* (5 g·cap + 1) this round's relay tables, laid out as on the device (below) */
  int32_t *head;       /* (N · nodes) a unique row's target in the message being grouped, -1: none */
  void *hw;            /* (N·K) the positions (rt_hier_slots), then the routing weights, downloaded */
  float *hv;           /* (cap) the rows' scalars downloaded, or the owners' gates to upload */
  int32_t *tb;         /* (g (cap / st + 1) + 1) the first target of each message, local ranks in turn */
  int64_t *sc, *sd, *rc, *rd; /* (max(nodes, g)) a collective's rows per peer */
  int64_t *rstart, *kb;       /* (g + 1) the first copy / message for each local rank */
  const real *wts_dev; /* the routing weights hw holds (since the last rt_hier_slots), NULL: none */
  /* device */
  int32_t *utok;       /* (N · min(K, nodes)) the origin's unique rows' tokens */
  int32_t *drelay;     /* (5 g·cap + 1) the relay tables */
  int32_t *cslot;      /* (N·K) the copies' slots (rt_moe_hier_scalars_back) */
  float *cw;           /* (N·K) their scalars */
} CuHier;

/* The relay tables for c copies (both sides): src (c: the unique row of each copy in send order:
 * local rank 0's copies, origin node-major, then local rank 1's, ...), w (c: their gates, send
 * order), rows (c: within each message, the copies grouped by target, as indices into the message),
 * tgt (the targets, at most c), start (their first entry in rows, + 1 at the end). */
enum { R_SRC, R_ROWS, R_W, R_TGT, R_START };
static int32_t *rel(int32_t *base, int64_t c, int part) { return base + (size_t)part * (size_t)c; }

int rt_cu_hier_init(RtHier *h, char *err, size_t errlen) {
  if (cu_comm_split(h->node_comm, "hier-node", err, errlen) != 0 ||
      cu_comm_split(h->cross_comm, "hier-cross", err, errlen) != 0)
    return -1;
  if (5 * (int64_t)h->g * h->cap + 1 >= INT32_MAX)
    return snprintf(err, errlen, "the hierarchical all-to-all relays up to %lld copies, past its int32 tables",
                    (long long)h->g * (long long)h->cap), -1;
  CuHier *d = calloc(1, sizeof *d);
  size_t host, dev = rt_hier_cuda_bytes(h->ep, h->g, h->N, h->K, h->cap, h->st, &host);
  if (!d || !(d->host = malloc(host))) {
    free(d);
    return snprintf(err, errlen, "no host memory for the hierarchical all-to-all's cuda tables"), -1;
  }
  if (!(d->dev = rt_cuda_alloc(dev, err, errlen))) {
    free(d->host), free(d);
    return -1;
  }
  size_t nodes = (size_t)h->nodes, g = (size_t)h->g, nk = (size_t)h->N * (size_t)h->K, cap = (size_t)h->cap,
         per = (size_t)h->K < nodes ? (size_t)h->K : nodes, wide = nodes > g ? nodes : g;
  char *p = d->host;
  d->relay = (int32_t *)p, p += 4 * (5 * g * cap + 1);
  d->head = (int32_t *)p, p += 4 * (size_t)h->N * nodes;
  d->hw = p, p += 4 * nk;
  d->hv = (float *)p, p += 4 * cap;
  d->tb = (int32_t *)p, p += 4 * (g * (size_t)(h->cap / h->st + 1) + 1);
  int64_t *q = (int64_t *)((char *)d->host + host - 8 * (4 * wide + 2 * (g + 1)));
  d->sc = q, d->sd = q + wide, d->rc = q + 2 * wide, d->rd = q + 3 * wide;
  d->rstart = q + 4 * wide, d->kb = q + 4 * wide + g + 1;
  for (size_t i = 0; i < (size_t)h->N * nodes; i++) d->head[i] = -1;
  p = d->dev;
  d->utok = (int32_t *)p, p += 4 * (size_t)h->N * per;
  d->drelay = (int32_t *)p, p += 4 * (5 * g * cap + 1);
  d->cslot = (int32_t *)p, p += 4 * nk;
  d->cw = (float *)p;
  h->dev = d;
  return 0;
}

void rt_cu_hier_free(RtHier *h) {
  CuHier *d = h->dev;
  if (!d) return;
  rt_cuda_free(d->dev);
  free(d->host), free(d);
  h->dev = NULL;
}

static CuHier *state(const RtHier *h, const char *op) {
  if (!h->dev) rt_cuda_fail(op, "the hierarchical all-to-all's cuda tables are missing (rt_cu_hier_init not called?)");
  return h->dev;
}

/* out rows = in rows (hier_rows, kernels.cu) for nb blocks. */
static void rows(act *out, const act *in, const int32_t *oi, const int32_t *ii, const int32_t *start, const float *w,
                 int add, int64_t nb) {
  if (nb > 0) cu_launch(K_HIER_ROWS, (unsigned)nb, 128, (void *[]){&out, &in, &oi, &ii, &start, &w, &add});
}

void rt_hier_slots(RtHier *h, const int32_t *pos) {
  CuHier *d = state(h, "hierarchical all-to-all");
  size_t nk = (size_t)h->N * (size_t)h->K;
  cu_ring_download(d->hw, pos, 4 * nk);
  const int32_t *p = d->hw;
  for (int32_t s = 0; s < (int32_t)nk; s++) h->slot[p[s]] = s;
  d->wts_dev = NULL; /* (hw holds the positions now) */
}

/* The relay's tables of the last rt_hier_plan (gates from rw when gated), uploaded. */
static void relay_tables(RtHier *h, CuHier *d, bool gated) {
  int g = h->g, Nn = h->nodes;
  int64_t c = h->crd[Nn], p = 0, st = h->st, B = 0, nm = 0;
  int32_t *src = rel(d->relay, c, R_SRC), *rw = rel(d->relay, c, R_ROWS), *tgt = rel(d->relay, c, R_TGT),
          *sa = rel(d->relay, c, R_START);
  float *w = (float *)rel(d->relay, c, R_W);
  for (int to = 0; to < g; to++) {
    d->rstart[to] = p;
    for (int n = 0; n < Nn; n++)
      for (int64_t ci = rt_hier_desc_at(h, n, to), e = 0; e < rt_hier_hdr_r(h, n)[1 + to]; e++, ci++, p++) {
        src[p] = (int32_t)(h->urd[n] + h->rdesc[ci]);
        if (gated) w[p] = h->rw[ci];
      }
  }
  d->rstart[g] = p;
  /* each message's copies grouped by target, in their order within a target (a counting sort) */
  for (int to = 0; to < g; to++) {
    d->kb[to] = nm;
    for (int64_t at = d->rstart[to]; at < d->rstart[to + 1]; at += st) {
      int64_t end = at + st < d->rstart[to + 1] ? at + st : d->rstart[to + 1], B0 = B;
      d->tb[nm++] = (int32_t)B;
      for (int64_t i = at; i < end; i++) {
        int32_t t = src[i];
        if (d->head[t] < 0) d->head[t] = (int32_t)B, tgt[B] = t, sa[B + 1] = 0, B++;
        sa[d->head[t] + 1]++;
      }
      sa[B0] = (int32_t)at;
      for (int64_t b = B0; b < B; b++) sa[b + 1] += sa[b];
      for (int64_t i = at; i < end; i++) rw[sa[d->head[src[i]]]++] = (int32_t)(i - at);
      for (int64_t b = B; b > B0; b--) sa[b] = sa[b - 1]; /* (the fill moved each start to the next) */
      sa[B0] = (int32_t)at;
      for (int64_t b = B0; b < B; b++) d->head[tgt[b]] = -1;
    }
  }
  d->kb[g] = nm, d->tb[nm] = (int32_t)B, sa[B] = (int32_t)c;
  if (c) cu_ring_upload(d->drelay, d->relay, 4 * (size_t)(5 * c + 1));
}

/* The round's rows between xe (expert-major) and buf (the owner's relay-major order) by a table of
 * its blocks in buf's order (moe_regroup); with e, the round's first row per local expert into the
 * device's eoff too. */
static void regroup(const RtHier *h, const RtA2A *a, act *xe, act *buf, int to_expert, const int *e, int *eoff) {
  size_t cnt, tab, eo, E = (size_t)cu.cfg.experts;
  cu_moe_layout(E, &cnt, &tab, &eo);
  if ((size_t)a->ep * (size_t)a->El > E) rt_cuda_fail("hierarchical all-to-all", "more experts than the runtime was sized for");
  long long *t = (long long *)((char *)cu.moe_host + tab);
  int nb = 0, g = h->g;
  for (int i = 0; i < g; i++)
    for (int n = 0; n < h->nodes; n++) {
      int s = n * g + i;
      for (int k = 0; k < a->El; k++) {
        const RtA2ABlock *b = &a->blocks[k * a->ep + s];
        if (b->rows) t[nb] = h->hrd[s] + b->source_row - a->rd[s], t[E + nb] = b->expert_row, nb++;
      }
    }
  size_t bytes = eo - tab;
  if (e) memcpy((char *)cu.moe_host + eo, e, sizeof(int) * (size_t)(a->El + 1)), bytes += sizeof(int) * (size_t)(a->El + 1);
  cu_ring_upload((char *)cu.moe + tab, t, bytes);
  if (e)
    cu_check(cudaMemcpyAsync(eoff, (char *)cu.moe + eo, sizeof(int) * (size_t)(a->El + 1), cudaMemcpyDeviceToDevice,
                             cu.stream), "hierarchical all-to-all");
  long long *dt = (long long *)((char *)cu.moe + tab);
  int stride = (int)E;
  if (nb) cu_launch(K_MOE_REGROUP, (unsigned)a->rows_recv, 128, (void *[]){&xe, &buf, &dt, &nb, &stride, &to_expert});
}

/* Rows per node over the cross group: unique rows to each node (hs) and from each (urd); out: the
 * origin's to the relays, else back. */
static void cross(RtHier *h, CuHier *d, act *us, act *ur, int C, bool out) {
  int64_t at = 0;
  for (int k = 0; k < h->nodes; k++) {
    d->sc[k] = rt_hier_hdr_s(h, k)[0], d->sd[k] = at, at += d->sc[k];
    d->rc[k] = h->urd[k + 1] - h->urd[k], d->rd[k] = h->urd[k];
  }
  if (out) cu_comm_rows(h->cross_comm, us, d->sc, d->sd, ur, d->rc, d->rd, C, "hierarchical all-to-all (to the relays)");
  else cu_comm_rows(h->cross_comm, ur, d->rc, d->rd, us, d->sc, d->sd, C, "hierarchical combine (to the origins)");
}

/* One message over the node group: sn rows from send + so to local rank to, rn rows from local
 * rank fr into recv + ro. */
static void message(RtHier *h, CuHier *d, const act *send, int to, int64_t sn, int64_t so, act *recv, int fr,
                    int64_t rn, int64_t ro, int C, const char *op) {
  for (int j = 0; j < h->g; j++) d->sc[j] = d->sd[j] = d->rc[j] = d->rd[j] = 0;
  d->sc[to] = sn, d->sd[to] = so, d->rc[fr] = rn, d->rd[fr] = ro;
  cu_comm_rows(h->node_comm, send, d->sc, d->sd, recv, d->rc, d->rd, C, op);
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Before the host's MPI over the EP group (rt_hier_plan, rt_hier_scalars_home): the device done
 * with the collectives issued so far. A GPU runs them without the host, but a host blocked in MPI
 * must not be what a peer's queued collective waits for (the emulation's lazy streams run a
 * rank's collectives only while its host waits on the device). */
static void settle(const char *why) {
  if (cu_comm_waited()) rt_cu_host_wait(why);
}

void rt_moe_hier_dispatch(RtHier *h, RtA2A *a, int r, act *xe, int *eoff, real *ew, const act *x,
                          const real *wts, act *us, act *ur, act *st, act *tmp, int C) {
  CuHier *d = state(h, "hierarchical all-to-all");
  if (a->El > cu.cfg.experts) rt_cuda_fail("hierarchical all-to-all", "more local experts than the runtime was sized for");
  const real *w = NULL;
  if (wts) { /* the gates on the host, once per pass */
    if (d->wts_dev != wts) cu_ring_download(d->hw, wts, 4 * (size_t)h->N * (size_t)h->K), d->wts_dev = wts;
    w = d->hw;
  }
  int e[a->El + 1];
  settle("hierarchical all-to-all (its tables over MPI)");
  int64_t u = rt_hier_plan(h, a, r, e, w);
  if (wts && ew) { /* the backward's gates at the owners (the forward's stay at the relays): host tables only */
    rt_hier_gates_to_owners(h, a, d->hv);
    if (a->rows_recv) cu_ring_upload(ew, d->hv, sizeof(real) * (size_t)a->rows_recv);
  }
  /* origin: one row per token and destination node, then over the nodes to the relays */
  if (u) cu_ring_upload(d->utok, h->utok, 4 * (size_t)u);
  rows(us, x, NULL, d->utok, NULL, NULL, 0, u);
  cross(h, d, us, ur, C, true);
  /* relay: each local rank's copies, in messages of at most st rows (step q: to li + q, from li − q;
   * its own straight into the receive buffer) */
  relay_tables(h, d, wts != NULL);
  const int32_t *src = rel(d->drelay, h->crd[h->nodes], R_SRC);
  int g = h->g, li = h->li;
  for (int q = 0; q < g; q++) {
    int to = (li + q) % g, fr = (li - q + g) % g;
    int64_t p0 = d->rstart[to], sn = d->rstart[to + 1] - p0, rn = h->fromd[fr + 1] - h->fromd[fr];
    if (q == 0) {
      rows(tmp + (size_t)h->fromd[li] * (size_t)C, ur, NULL, src + p0, NULL, NULL, 0, sn);
      continue;
    }
    for (int64_t at = 0; at < sn || at < rn; at += h->st) {
      int64_t ns = sn > at ? min64(h->st, sn - at) : 0, nr = rn > at ? min64(h->st, rn - at) : 0;
      rows(st, ur, NULL, src + p0 + at, NULL, NULL, 0, ns);
      message(h, d, st, to, ns, 0, tmp, fr, nr, h->fromd[fr] + at, C, "hierarchical all-to-all (to the owners)");
    }
  }
  regroup(h, a, xe, tmp, 1, e, eoff);
  cu_offsets_known(eoff, e, (size_t)a->El + 1);
}

void rt_moe_hier_combine(RtHier *h, const RtA2A *a, act *y, const act *ye, bool gated, act *us, act *ur,
                         act *st, act *tmp, int C) {
  CuHier *d = state(h, "hierarchical combine");
  int g = h->g, li = h->li, Nn = h->nodes;
  int64_t c = h->crd[Nn];
  regroup(h, a, (act *)ye, tmp, 0, NULL, NULL);
  if (h->urd[Nn])
    cu_check(cudaMemsetAsync(ur, 0, (size_t)h->urd[Nn] * (size_t)C * sizeof(act), cu.stream), "hierarchical combine");
  const int32_t *ri = rel(d->drelay, c, R_ROWS), *tgt = rel(d->drelay, c, R_TGT), *sa = rel(d->drelay, c, R_START);
  const float *w = (const float *)rel(d->drelay, c, R_W);
  /* owners to relays, the dispatch's steps reversed in the same messages; each relay sums a message's
   * copies into their unique rows */
  for (int q = 0; q < g; q++) {
    int to = (li + q) % g, fr = (li - q + g) % g;
    int64_t p0 = d->rstart[to], nr = d->rstart[to + 1] - p0, sn = h->fromd[fr + 1] - h->fromd[fr];
    for (int64_t at = 0; at < sn || at < nr; at += h->st) {
      int64_t ns = sn > at ? min64(h->st, sn - at) : 0, nm = nr > at ? min64(h->st, nr - at) : 0;
      const act *in = st;
      if (q == 0) in = tmp + (size_t)(h->fromd[li] + at) * (size_t)C; /* its own rows: no message */
      else message(h, d, tmp, fr, ns, h->fromd[fr] + at, st, to, nm, 0, C, "hierarchical combine (to the relays)");
      if (!nm) continue;
      int64_t k = d->kb[to] + at / h->st, b0 = d->tb[k];
      rows(ur, in, tgt + b0, ri, sa + b0, gated ? w + p0 + at : NULL, 1, d->tb[k + 1] - b0);
    }
  }
  /* relays to origins over the nodes; each origin adds the nodes' sums in node order */
  cross(h, d, us, ur, C, false);
  int64_t v0 = 0;
  for (int m = 0; m < Nn; m++) {
    int64_t n = rt_hier_hdr_s(h, m)[0];
    rows(y, us + (size_t)v0 * (size_t)C, d->utok + v0, NULL, NULL, NULL, 1, n);
    v0 += n;
  }
}

void rt_moe_hier_scalars_back(RtHier *h, const RtA2A *a, real *dw, const real *v) {
  CuHier *d = state(h, "hierarchical scalars");
  if (a->rows_recv) cu_ring_download(d->hv, v, sizeof(real) * (size_t)a->rows_recv);
  else settle("hierarchical scalars (over MPI)");
  int64_t c = rt_hier_scalars_home(h, a, d->hv);
  if (!c) return;
  cu_ring_upload(d->cslot, h->cslot, 4 * (size_t)c);
  cu_ring_upload(d->cw, h->cw, 4 * (size_t)c);
  long long n = c;
  const int32_t *sl = d->cslot;
  const float *cw = d->cw;
  cu_launch(K_HIER_SCALARS_ADD, cu_blocks(n, 256), 256, (void *[]){&dw, &sl, &cw, &n});
}

void rt_moe_gate_rows(act *dye, real *dv, const act *dyu, const real *ew, int64_t rows_, int C) {
  (void)C;
  if (rows_ > 0) cu_launch(K_MOE_GATE_ROWS, (unsigned)rows_, 128, (void *[]){&dye, &dv, &dyu, &ew});
}
