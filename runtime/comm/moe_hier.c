/* moe_hier.c — the hierarchical MoE token exchange's rows over MPI (cpu backend; mtrt_hier.h; the
 * tables are hier_plan.c's), and its op at the experts' owner (rt_moe_gate_rows): one inter-node
 * copy of a token per destination node (cross_comm), then the node-local copies (node_comm, in g
 * shifted steps); rounds and the expert-major layout are the flat exchange's (a2a_plan.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_hier.h"

#define MPI_CHECK(call) RT_MPI_CHECK(call)

void rt_hier_slots(RtHier *h, const int32_t *pos) {
  for (int32_t s = 0; s < (int32_t)h->N * h->K; s++) h->slot[pos[s]] = s;
}

static MPI_Datatype row_type(int C) {
  MPI_Datatype t;
  MPI_CHECK(MPI_Type_contiguous(C, MTRT_MPI_REAL, &t));
  MPI_CHECK(MPI_Type_commit(&t));
  return t;
}

void rt_moe_hier_dispatch(RtHier *h, RtA2A *a, int r, act *xe, int *eoff, real *ew, const act *x,
                          const real *wts, act *us, act *ur, act *st, act *tmp, int C) {
  int64_t u = rt_hier_plan(h, a, r, eoff, wts);
  int g = h->g, Nn = h->nodes;
  size_t row = sizeof(act) * (size_t)C;
  for (int64_t v = 0; v < u; v++) memcpy((char *)us + (size_t)v * row, x + (size_t)h->utok[v] * (size_t)C, row);
  int *m = h->m8;
  rt_hier_cross_counts(h, true);
  rt_comm_all_to_all_v(h->cross_comm, us, m, m + Nn, ur, m + 2 * Nn, m + 3 * Nn, C);
  /* relay to owners: step q sends local rank li + q its copies, receives from li − q; the rows in
   * messages of at most st rows (both sides cut a pair's rows the same way), the receives posted
   * before any send */
  MPI_Datatype t = row_type(C);
  for (int q = 0; q < g; q++) {
    int to = (h->li + q) % g, fr = (h->li - q + g) % g, nreq = 0;
    int64_t rn = h->fromd[fr + 1] - h->fromd[fr];
    for (int64_t at = 0; at < rn; at += h->st)
      MPI_CHECK(MPI_Irecv((char *)tmp + (size_t)(h->fromd[fr] + at) * row,
                          rt_mpi_count((size_t)(rn - at < h->st ? rn - at : h->st), "hierarchical all-to-all rows"), t,
                          fr, 0, h->node_comm, &h->req[nreq++]));
    int64_t held = 0;
    for (int n = 0; n < Nn; n++)
      for (int64_t ci = rt_hier_desc_at(h, n, to), e = 0; e < rt_hier_hdr_r(h, n)[1 + to]; e++, ci++) {
        memcpy((char *)st + (size_t)held++ * row, (char *)ur + (size_t)(h->urd[n] + h->rdesc[ci]) * row, row);
        if (held == h->st) {
          MPI_CHECK(MPI_Send(st, (int)held, t, to, 0, h->node_comm));
          held = 0;
        }
      }
    if (held) MPI_CHECK(MPI_Send(st, (int)held, t, to, 0, h->node_comm));
    MPI_CHECK(MPI_Waitall(nreq, h->req, MPI_STATUSES_IGNORE));
  }
  MPI_CHECK(MPI_Type_free(&t));
  rt_hier_regroup(h, a, xe, tmp, row, true);
  if (wts && ew) rt_hier_gates_to_owners(h, a, ew); /* the backward's (the forward's combine gates at the relay) */
}

void rt_moe_hier_combine(RtHier *h, const RtA2A *a, act *y, const act *ye, bool gated, act *us, act *ur,
                         act *st, act *tmp, int C) {
  int g = h->g, Nn = h->nodes;
  size_t row = sizeof(act) * (size_t)C;
  rt_hier_regroup(h, a, (act *)ye, tmp, row, false);
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
    for (int n = 0; n < Nn; n++) total += rt_hier_hdr_r(h, n)[1 + to];
    for (int n = 0; n < Nn; n++)
      for (int64_t ci = rt_hier_desc_at(h, n, to), e = 0; e < rt_hier_hdr_r(h, n)[1 + to]; e++, ci++, got++) {
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
  rt_hier_cross_counts(h, true);
  rt_comm_all_to_all_v(h->cross_comm, ur, m + 2 * Nn, m + 3 * Nn, us, m, m + Nn, C);
  int64_t u = 0;
  for (int k = 0; k < Nn; k++) u += rt_hier_hdr_s(h, k)[0];
  for (int64_t v = 0; v < u; v++) {
    act *dst = y + (size_t)h->utok[v] * (size_t)C;
    const act *src = us + (size_t)v * (size_t)C;
    for (int k = 0; k < C; k++) dst[k] += src[k];
  }
}

void rt_moe_hier_scalars_back(RtHier *h, const RtA2A *a, real *dw, const real *v) {
  int64_t c = rt_hier_scalars_home(h, a, v);
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
