/* hier_plan.c — the host side of the hierarchical MoE exchange (mtrt_hier.h) that both backends
 * share: a round's tables (the origin's unique rows and copies, the headers, the relays'
 * descriptors and gates over cross_comm, the owner's receive layout), the gates to the owners and
 * the scalars back to their copies (MPI on host arrays). The rows move in comm/moe_hier.c (cpu:
 * MPI) or runtime/cuda/moe_hier.c (cuda: kernels and NCCL). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_hier.h"

#define MPI_CHECK(call) RT_MPI_CHECK(call)

const int *rt_hier_hdr_r(const RtHier *h, int n) { return h->hr + (size_t)n * (size_t)(h->g + 1); }
const int *rt_hier_hdr_s(const RtHier *h, int m) { return h->hs + (size_t)m * (size_t)(h->g + 1); }

int64_t rt_hier_copies(const int *hdr, int g) {
  int64_t n = 0;
  for (int j = 0; j < g; j++) n += hdr[1 + j];
  return n;
}

int64_t rt_hier_desc_at(const RtHier *h, int n, int j) {
  int64_t at = h->crd[n];
  for (int q = 0; q < j; q++) at += rt_hier_hdr_r(h, n)[1 + q];
  return at;
}

void rt_hier_cross_counts(RtHier *h, bool rows) {
  int Nn = h->nodes, *m = h->m8;
  int64_t s = 0;
  for (int k = 0; k < Nn; k++) {
    int64_t n = rows ? rt_hier_hdr_s(h, k)[0] : rt_hier_copies(rt_hier_hdr_s(h, k), h->g);
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

void rt_hier_regroup(const RtHier *h, const RtA2A *a, void *xe, void *buf, size_t bytes, bool to_expert) {
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

int64_t rt_hier_plan(RtHier *h, RtA2A *a, int r, int *eoff, const real *wts) {
  if (r < 0 || r >= a->rounds) {
    fprintf(stderr, "mtrt: moe dispatch of round %d, but the route planned %d (at %s)\n", r, a->rounds,
            rt_comm_where());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  rt_a2a_plan_round(a, r, eoff);
  int g = h->g, Nn = h->nodes, K = h->K;
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
  MPI_CHECK(MPI_Alltoall(h->hs, g + 1, MPI_INT, h->hr, g + 1, MPI_INT, h->cross_comm));
  h->urd[0] = h->crd[0] = 0;
  for (int n = 0; n < Nn; n++)
    h->urd[n + 1] = h->urd[n] + rt_hier_hdr_r(h, n)[0],
              h->crd[n + 1] = h->crd[n] + rt_hier_copies(rt_hier_hdr_r(h, n), g);
  if (h->crd[Nn] > (int64_t)g * h->cap) {
    fprintf(stderr, "mtrt: hierarchical all-to-all relays %lld copies, over its %lld (at %s)\n",
            (long long)h->crd[Nn], (long long)g * (long long)h->cap, rt_comm_where());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* the descriptors (and gates) of the copies to the relays */
  int *m = h->m8, *mc = h->m8 + 4 * Nn;
  rt_hier_cross_counts(h, false);
  memcpy(mc, m, sizeof(int) * 4 * (size_t)Nn);
  MPI_CHECK(MPI_Alltoallv(h->cu, mc, mc + Nn, MPI_INT, h->rdesc, mc + 2 * Nn, mc + 3 * Nn, MPI_INT, h->cross_comm));
  if (wts)
    MPI_CHECK(MPI_Alltoallv(h->cw, mc, mc + Nn, MTRT_MPI_REAL, h->rw, mc + 2 * Nn, mc + 3 * Nn, MTRT_MPI_REAL,
                            h->cross_comm));
  owner_layout(h, a);
  return u;
}

void rt_hier_gates_to_owners(RtHier *h, const RtA2A *a, real *ew) {
  int g = h->g, Nn = h->nodes;
  for (int q = 0; q < g; q++) { /* step q: to local rank li + q, from li − q */
    int to = (h->li + q) % g, fr = (h->li - q + g) % g;
    int64_t rows = 0, rn = h->fromd[fr + 1] - h->fromd[fr];
    for (int n = 0; n < Nn; n++)
      for (int64_t ci = rt_hier_desc_at(h, n, to), e = 0; e < rt_hier_hdr_r(h, n)[1 + to]; e++, ci++)
        h->sw[rows++] = h->rw[ci];
    MPI_CHECK(MPI_Sendrecv(h->sw, rt_mpi_count((size_t)rows, "hierarchical all-to-all gates"), MTRT_MPI_REAL, to, 1,
                           h->ow + h->fromd[fr], rt_mpi_count((size_t)rn, "hierarchical all-to-all gates"),
                           MTRT_MPI_REAL, fr, 1, h->node_comm, MPI_STATUS_IGNORE));
  }
  rt_hier_regroup(h, a, ew, h->ow, sizeof(real), true);
}

int64_t rt_hier_scalars_home(RtHier *h, const RtA2A *a, const real *v) {
  int g = h->g, Nn = h->nodes;
  rt_hier_regroup(h, a, (real *)v, h->ow, sizeof(real), false);
  for (int q = 0; q < g; q++) {
    int to = (h->li + q) % g, fr = (h->li - q + g) % g;
    int64_t rows = 0;
    for (int n = 0; n < Nn; n++) rows += rt_hier_hdr_r(h, n)[1 + to];
    int sn = rt_mpi_count((size_t)(h->fromd[fr + 1] - h->fromd[fr]), "hierarchical scalars to a relay"),
        rn = rt_mpi_count((size_t)rows, "hierarchical scalars from a local rank");
    MPI_CHECK(MPI_Sendrecv(h->ow + h->fromd[fr], sn, MTRT_MPI_REAL, fr, 3, h->sw, rn, MTRT_MPI_REAL, to, 3,
                           h->node_comm, MPI_STATUS_IGNORE));
    rows = 0;
    for (int n = 0; n < Nn; n++)
      for (int64_t ci = rt_hier_desc_at(h, n, to), e = 0; e < rt_hier_hdr_r(h, n)[1 + to]; e++, ci++)
        h->rw[ci] = h->sw[rows++];
  }
  int *m = h->m8;
  rt_hier_cross_counts(h, false);
  MPI_CHECK(MPI_Alltoallv(h->rw, m + 2 * Nn, m + 3 * Nn, MTRT_MPI_REAL, h->cw, m, m + Nn, MTRT_MPI_REAL,
                          h->cross_comm));
  int64_t c = 0;
  for (int k = 0; k < Nn; k++) c += rt_hier_copies(rt_hier_hdr_s(h, k), g);
  return c;
}
