/* moe_hier.c — the hierarchical MoE token exchange over MPI (cpu backend; mtrt_hier.h), and its
 * op at the experts' owner (rt_moe_gate_rows): one
 * inter-node copy of a token per destination node (cross_comm), then the node-local copies
 * (node_comm, in g shifted steps); rounds and the expert-major layout are the flat exchange's
 * (a2a_plan.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_hier.h"

#define MPI_CHECK(call) RT_MPI_CHECK(call)

void rt_hier_slots(RtHier *h, const int32_t *pos) {
  for (int32_t s = 0; s < (int32_t)h->N * h->K; s++) h->slot[pos[s]] = s;
}

/* header of origin node n as received by this relay: [0] unique rows, [1 + j] copies for local rank j */
static const int *hdr_r(const RtHier *h, int n) { return h->hr + (size_t)n * (size_t)(h->g + 1); }
static const int *hdr_s(const RtHier *h, int m) { return h->hs + (size_t)m * (size_t)(h->g + 1); }
static int64_t copies(const int *hdr, int g) {
  int64_t n = 0;
  for (int j = 0; j < g; j++) n += hdr[1 + j];
  return n;
}
/* the first descriptor of origin n's copies for local rank j */
static int64_t desc_at(const RtHier *h, int n, int j) {
  int64_t at = h->crd[n];
  for (int q = 0; q < j; q++) at += hdr_r(h, n)[1 + q];
  return at;
}

static MPI_Datatype row_type(int C) {
  MPI_Datatype t;
  MPI_CHECK(MPI_Type_contiguous(C, MTRT_MPI_REAL, &t));
  MPI_CHECK(MPI_Type_commit(&t));
  return t;
}

/* cross_comm counts into m8: [0] send counts, [1] send displacements, [2] receive counts, [3]
 * receive displacements (nodes each), of unique rows (rows) or of copies */
static void cross_counts(RtHier *h, bool rows) {
  int Nn = h->nodes, *m = h->m8;
  int64_t s = 0;
  for (int k = 0; k < Nn; k++) {
    int64_t n = rows ? hdr_s(h, k)[0] : copies(hdr_s(h, k), h->g);
    m[k] = rt_mpi_count((size_t)n, "hierarchical all-to-all rows to a node"), m[Nn + k] = (int)s, s += n;
    int64_t at = rows ? h->urd[k] : h->crd[k], got = (rows ? h->urd[k + 1] : h->crd[k + 1]) - at;
    m[2 * Nn + k] = rt_mpi_count((size_t)got, "hierarchical all-to-all rows from a node");
    m[3 * Nn + k] = rt_mpi_count((size_t)at, "hierarchical all-to-all first row from a node");
  }
  rt_mpi_count((size_t)s, "hierarchical all-to-all rows sent");
}

/* The owner's receive layout: relay i's rows first by origin node, relays in turn. */
static void owner_layout(RtHier *h, const RtA2A *a) {
  int g = h->g;
  int64_t at = 0;
  for (int i = 0; i < g; i++) {
    h->fromd[i] = at;
    for (int n = 0; n < h->nodes; n++) h->hrd[n * g + i] = at, at += a->rc[n * g + i];
  }
  h->fromd[g] = at;
}

/* xe (expert-major) and buf (relay-major) by the round's blocks: buf to xe when to_expert */
static void regroup(const RtHier *h, const RtA2A *a, void *xe, void *buf, size_t bytes, bool to_expert) {
  for (int b = 0; b < a->ep * a->El; b++) {
    const RtA2ABlock *k = &a->blocks[b];
    if (!k->rows) continue;
    int s = b % a->ep;
    char *e = (char *)xe + (size_t)k->expert_row * bytes,
         *m = (char *)buf + (size_t)(h->hrd[s] + k->source_row - a->rd[s]) * bytes;
    if (to_expert) memcpy(e, m, (size_t)k->rows * bytes);
    else memcpy(m, e, (size_t)k->rows * bytes);
  }
}

void rt_moe_hier_dispatch(RtHier *h, RtA2A *a, int r, act *xe, int *eoff, real *ew, const act *x,
                          const real *wts, act *us, act *ur, act *st, act *tmp, int C) {
  if (r < 0 || r >= a->rounds) {
    fprintf(stderr, "mtrt: moe dispatch of round %d, but the route planned %d (at %s)\n", r, a->rounds,
            rt_comm_where());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  rt_a2a_plan_round(a, r, eoff);
  int g = h->g, Nn = h->nodes, K = h->K;
  size_t row = sizeof(act) * (size_t)C;
  /* origin: node m's copies in its local ranks' order, one unique row per token */
  int64_t u = 0, c = 0;
  for (int m = 0; m < Nn; m++) {
    int64_t u0 = u;
    int *hdr = h->hs + (size_t)m * (size_t)(g + 1);
    for (int j = 0; j < g; j++) {
      int d = m * g + j;
      hdr[1 + j] = (int)a->sc[d];
      for (int64_t p = a->sd[d]; p < a->sd[d] + a->sc[d]; p++, c++) {
        int32_t s = h->slot[p], t = s / K;
        if (h->mark[t] < 0) h->mark[t] = (int32_t)(u - u0), h->utok[u++] = t;
        h->cu[c] = h->mark[t], h->cslot[c] = s;
        if (wts) h->cw[c] = wts[s];
      }
    }
    hdr[0] = (int)(u - u0);
    for (int64_t v = u0; v < u; v++) h->mark[h->utok[v]] = -1;
  }
  for (int64_t v = 0; v < u; v++) memcpy((char *)us + (size_t)v * row, x + (size_t)h->utok[v] * (size_t)C, row);
  MPI_CHECK(MPI_Alltoall(h->hs, g + 1, MPI_INT, h->hr, g + 1, MPI_INT, h->cross_comm));
  h->urd[0] = h->crd[0] = 0;
  for (int n = 0; n < Nn; n++)
    h->urd[n + 1] = h->urd[n] + hdr_r(h, n)[0], h->crd[n + 1] = h->crd[n] + copies(hdr_r(h, n), g);
  if (h->crd[Nn] > (int64_t)g * h->cap) {
    fprintf(stderr, "mtrt: hierarchical all-to-all relays %lld copies, over its %lld (at %s)\n",
            (long long)h->crd[Nn], (long long)g * (long long)h->cap, rt_comm_where());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int *m = h->m8, *mc = h->m8 + 4 * Nn;
  cross_counts(h, true);
  rt_comm_all_to_all_v(h->cross_comm, us, m, m + Nn, ur, m + 2 * Nn, m + 3 * Nn, C);
  cross_counts(h, false);
  memcpy(mc, m, sizeof(int) * 4 * (size_t)Nn);
  MPI_CHECK(MPI_Alltoallv(h->cu, mc, mc + Nn, MPI_INT, h->rdesc, mc + 2 * Nn, mc + 3 * Nn, MPI_INT, h->cross_comm));
  if (wts)
    MPI_CHECK(MPI_Alltoallv(h->cw, mc, mc + Nn, MTRT_MPI_REAL, h->rw, mc + 2 * Nn, mc + 3 * Nn, MTRT_MPI_REAL,
                            h->cross_comm));
  /* relay to owners: step q sends local rank li + q its copies, receives from li − q; the rows in
   * messages of at most st rows (both sides cut a pair's rows the same way), the receives posted
   * before any send */
  owner_layout(h, a);
  MPI_Datatype t = row_type(C);
  for (int q = 0; q < g; q++) {
    int to = (h->li + q) % g, fr = (h->li - q + g) % g, nreq = 0;
    int64_t rn = h->fromd[fr + 1] - h->fromd[fr];
    for (int64_t at = 0; at < rn; at += h->st)
      MPI_CHECK(MPI_Irecv((char *)tmp + (size_t)(h->fromd[fr] + at) * row,
                          rt_mpi_count((size_t)(rn - at < h->st ? rn - at : h->st), "hierarchical all-to-all rows"), t,
                          fr, 0, h->node_comm, &h->req[nreq++]));
    int64_t rows = 0, held = 0;
    for (int n = 0; n < Nn; n++)
      for (int64_t ci = desc_at(h, n, to), e = 0; e < hdr_r(h, n)[1 + to]; e++, ci++, rows++) {
        memcpy((char *)st + (size_t)held++ * row, (char *)ur + (size_t)(h->urd[n] + h->rdesc[ci]) * row, row);
        if (ew) h->sw[rows] = h->rw[ci];
        if (held == h->st) {
          MPI_CHECK(MPI_Send(st, (int)held, t, to, 0, h->node_comm));
          held = 0;
        }
      }
    if (held) MPI_CHECK(MPI_Send(st, (int)held, t, to, 0, h->node_comm));
    MPI_CHECK(MPI_Waitall(nreq, h->req, MPI_STATUSES_IGNORE));
    if (wts && ew) /* the owners' gates: the backward's (the forward's combine gates at the relay) */
      MPI_CHECK(MPI_Sendrecv(h->sw, rt_mpi_count((size_t)rows, "hierarchical all-to-all gates"), MTRT_MPI_REAL, to, 1,
                             h->ow + h->fromd[fr], rt_mpi_count((size_t)rn, "hierarchical all-to-all gates"),
                             MTRT_MPI_REAL, fr, 1, h->node_comm, MPI_STATUS_IGNORE));
  }
  MPI_CHECK(MPI_Type_free(&t));
  regroup(h, a, xe, tmp, row, true);
  if (wts && ew) regroup(h, a, ew, h->ow, sizeof(real), true);
}

void rt_moe_hier_combine(RtHier *h, const RtA2A *a, act *y, const act *ye, bool gated, act *us, act *ur,
                         act *st, act *tmp, int C) {
  int g = h->g, Nn = h->nodes;
  size_t row = sizeof(act) * (size_t)C;
  regroup(h, a, (act *)ye, tmp, row, false);
  memset(ur, 0, (size_t)h->urd[Nn] * row);
  MPI_Datatype t = row_type(C);
  /* owners to relays, the dispatch's steps reversed, in the same messages (the sends posted before
   * any receive); each relay sums a token's copies */
  for (int q = 0; q < g; q++) {
    int to = (h->li + q) % g, fr = (h->li - q + g) % g, nreq = 0;
    int64_t sn = h->fromd[fr + 1] - h->fromd[fr];
    for (int64_t at = 0; at < sn; at += h->st)
      MPI_CHECK(MPI_Isend((char *)tmp + (size_t)(h->fromd[fr] + at) * row,
                          rt_mpi_count((size_t)(sn - at < h->st ? sn - at : h->st), "hierarchical combine rows"), t, fr,
                          2, h->node_comm, &h->req[nreq++]));
    int64_t total = 0, held = 0, got = 0;
    for (int n = 0; n < Nn; n++) total += hdr_r(h, n)[1 + to];
    for (int n = 0; n < Nn; n++)
      for (int64_t ci = desc_at(h, n, to), e = 0; e < hdr_r(h, n)[1 + to]; e++, ci++, got++) {
        if (!held) { /* the next message */
          held = total - got < h->st ? total - got : h->st;
          MPI_CHECK(MPI_Recv(st, (int)held, t, to, 2, h->node_comm, MPI_STATUS_IGNORE));
        }
        act *dst = ur + (size_t)(h->urd[n] + h->rdesc[ci]) * (size_t)C;
        const act *src = st + (size_t)(got % h->st) * (size_t)C; /* (messages start at multiples of st) */
        real w = gated ? h->rw[ci] : 1;
        for (int k = 0; k < C; k++) dst[k] += w * src[k];
        held--;
      }
    MPI_CHECK(MPI_Waitall(nreq, h->req, MPI_STATUSES_IGNORE));
  }
  MPI_CHECK(MPI_Type_free(&t));
  /* relays to origins over the nodes, the dispatch's first stage reversed */
  int *m = h->m8;
  cross_counts(h, true);
  rt_comm_all_to_all_v(h->cross_comm, ur, m + 2 * Nn, m + 3 * Nn, us, m, m + Nn, C);
  int64_t u = 0;
  for (int k = 0; k < Nn; k++) u += hdr_s(h, k)[0];
  for (int64_t v = 0; v < u; v++) {
    act *dst = y + (size_t)h->utok[v] * (size_t)C;
    const act *src = us + (size_t)v * (size_t)C;
    for (int k = 0; k < C; k++) dst[k] += src[k];
  }
}

void rt_moe_hier_scalars_back(RtHier *h, const RtA2A *a, real *dw, const real *v) {
  int g = h->g, Nn = h->nodes;
  regroup(h, a, (real *)v, h->ow, sizeof(real), false);
  for (int q = 0; q < g; q++) {
    int to = (h->li + q) % g, fr = (h->li - q + g) % g;
    int64_t rows = 0;
    for (int n = 0; n < Nn; n++) rows += hdr_r(h, n)[1 + to];
    int sn = rt_mpi_count((size_t)(h->fromd[fr + 1] - h->fromd[fr]), "hierarchical scalars to a relay"),
        rn = rt_mpi_count((size_t)rows, "hierarchical scalars from a local rank");
    MPI_CHECK(MPI_Sendrecv(h->ow + h->fromd[fr], sn, MTRT_MPI_REAL, fr, 3, h->sw, rn, MTRT_MPI_REAL, to, 3,
                           h->node_comm, MPI_STATUS_IGNORE));
    rows = 0;
    for (int n = 0; n < Nn; n++)
      for (int64_t ci = desc_at(h, n, to), e = 0; e < hdr_r(h, n)[1 + to]; e++, ci++) h->rw[ci] = h->sw[rows++];
  }
  int *m = h->m8;
  cross_counts(h, false);
  MPI_CHECK(MPI_Alltoallv(h->rw, m + 2 * Nn, m + 3 * Nn, MTRT_MPI_REAL, h->cw, m, m + Nn, MTRT_MPI_REAL,
                          h->cross_comm));
  int64_t c = 0;
  for (int k = 0; k < Nn; k++) c += copies(hdr_s(h, k), g);
  for (int64_t i = 0; i < c; i++) dw[h->cslot[i]] += h->cw[i];
}

void rt_moe_gate_rows(act *dye, real *dv, const act *dyu, const real *ew, int64_t rows, int C) {
  for (int64_t r = 0; r < rows; r++) {
    act *o = dye + r * C;
    const act *g = dyu + r * C;
    real d = 0;
    for (int k = 0; k < C; k++) d += g[k] * o[k];
    dv[r] = d;
    for (int k = 0; k < C; k++) o[k] = ew[r] * g[k];
  }
}
