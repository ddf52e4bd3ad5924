/* moe_a2a.c — the MoE token exchange of expert parallelism over MPI (cpu backend), in bounded
 * rounds; the counts, rounds, displacements and regroup blocks come from a2a_plan.c. */
#include <stdio.h>
#include <string.h>

#include "mtrt_comm.h"

static void copy_host(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

/* The row all-to-all-v: rows sc/sd out, rc/rd in (int64 rows, checked into MPI ints). */
static void exchange(MPI_Comm comm, const RtA2A *a, const real *send, const int64_t *sc, const int64_t *sd,
                     real *recv, const int64_t *rc, const int64_t *rd, int C) {
  int ep = a->ep, *m = a->mpi;
  for (int p = 0; p < ep; p++) {
    m[p] = rt_mpi_count((size_t)sc[p], "moe all-to-all rows sent to a peer");
    m[ep + p] = rt_mpi_count((size_t)sd[p], "moe all-to-all first row sent to a peer");
    m[2 * ep + p] = rt_mpi_count((size_t)rc[p], "moe all-to-all rows received from a peer");
    m[3 * ep + p] = rt_mpi_count((size_t)rd[p], "moe all-to-all first row received from a peer");
  }
  rt_comm_all_to_all_v(comm, send, m, m + ep, recv, m + 2 * ep, m + 3 * ep, C);
}

int rt_moe_route(MPI_Comm ep_comm, RtA2A *a, const int *offsets) {
  int pe = a->ep * a->El;
  memcpy(a->off, offsets, sizeof(int) * (size_t)(pe + 1));
  rt_a2a_plan_counts(a);
  RT_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a->cnt_all, pe, MPI_INT, ep_comm));
  return rt_a2a_plan_rounds(a);
}

void rt_moe_dispatch(MPI_Comm ep_comm, RtA2A *a, int r, act *xe, int *eoff, act *tmp, const act *xp, int C) {
  if (r < 0 || r >= a->rounds) {
    fprintf(stderr, "mtrt: moe dispatch of round %d, but the route planned %d (at %s)\n", r, a->rounds,
            rt_comm_where());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  rt_a2a_plan_round(a, r, eoff);
  exchange(ep_comm, a, xp, a->sc, a->sd, tmp, a->rc, a->rd, C);
  rt_a2a_regroup(a, xe, tmp, sizeof(real) * (size_t)C, 1, copy_host);
}

void rt_moe_undispatch(MPI_Comm ep_comm, const RtA2A *a, act *yp, act *tmp, const act *ye, int C) {
  rt_a2a_regroup(a, (real *)ye, tmp, sizeof(real) * (size_t)C, 0, copy_host);
  exchange(ep_comm, a, tmp, a->rc, a->rd, yp, a->sc, a->sd, C);
}
