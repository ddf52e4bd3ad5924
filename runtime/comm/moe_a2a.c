/* moe_a2a.c — the MoE token exchange of expert parallelism over MPI (cpu backend). */
#include <stdlib.h>
#include <string.h>

#include "mtrt_comm.h"

/* Copies rows between the source-major layout of the all-to-all buffer (peer s's rows for
 * local experts 0..El-1 in turn) and the expert-major layout the FFN runs on. */
static void regroup(const RtA2A *a, real *expert_major, real *src_major, int C, int to_expert) {
  size_t row = 0;
  for (int k = 0; k < a->El; k++)
    for (int s = 0; s < a->ep; s++) {
      size_t at = (size_t)a->rd[s] / (size_t)C;
      for (int k2 = 0; k2 < k; k2++) at += (size_t)a->cnt_recv[s * a->El + k2];
      size_t n = (size_t)a->cnt_recv[s * a->El + k] * (size_t)C;
      real *e = expert_major + row * (size_t)C, *m = src_major + at * (size_t)C;
      if (to_expert) memcpy(e, m, n * sizeof(real));
      else memcpy(m, e, n * sizeof(real));
      row += (size_t)a->cnt_recv[s * a->El + k];
    }
}

void rt_moe_dispatch(MPI_Comm ep_comm, RtA2A *a, real *xe, int *eoff, real *tmp, const real *xp,
                     const int *offsets, int C) {
  int ep = a->ep, El = a->El;
  for (int j = 0; j < ep; j++) {
    for (int k = 0; k < El; k++)
      a->cnt_send[j * El + k] = offsets[j * El + k + 1] - offsets[j * El + k];
    a->sc[j] = (offsets[(j + 1) * El] - offsets[j * El]) * C;
    a->sd[j] = offsets[j * El] * C;
  }
  MPI_Alltoall(a->cnt_send, El, MPI_INT, a->cnt_recv, El, MPI_INT, ep_comm);
  int rows = 0;
  for (int s = 0; s < ep; s++) {
    int n = 0;
    for (int k = 0; k < El; k++) n += a->cnt_recv[s * El + k];
    a->rc[s] = n * C, a->rd[s] = rows * C;
    rows += n;
  }
  a->rows_recv = rows;
  rt_comm_all_to_all_v(ep_comm, xp, a->sc, a->sd, tmp, a->rc, a->rd);
  regroup(a, xe, tmp, C, 1);
  eoff[0] = 0;
  for (int k = 0; k < El; k++) {
    int n = 0;
    for (int s = 0; s < ep; s++) n += a->cnt_recv[s * El + k];
    eoff[k + 1] = eoff[k] + n;
  }
}

void rt_moe_undispatch(MPI_Comm ep_comm, const RtA2A *a, real *yp, real *tmp, const real *ye, int C) {
  regroup(a, (real *)ye, tmp, C, 0);
  rt_comm_all_to_all_v(ep_comm, tmp, a->rc, a->rd, yp, a->sc, a->sd);
}
