/* comm_mpi.c — the cpu backend's collectives over MPI (bootstrap: comm_init.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_comm.h"

#define MPI_CHECK(call) RT_MPI_CHECK(call)

void rt_comm_all_gather(MPI_Comm comm, real *out, const real *in, size_t count) {
  int n = rt_mpi_count(count, "all-gather");
  MPI_CHECK(MPI_Allgather(in, n, MTRT_MPI_REAL, out, n, MTRT_MPI_REAL, comm));
}

void rt_comm_all_gather_start(MPI_Comm comm, real *out, const real *in, size_t count, int slot) {
  (void)slot;
  rt_comm_all_gather(comm, out, in, count);
}

void rt_comm_all_gather_wait(int slot) { (void)slot; }

void rt_comm_reduce_scatter(MPI_Comm comm, real *out, const real *in, size_t count) {
  int n = rt_mpi_count(count, "reduce-scatter");
  MPI_CHECK(MPI_Reduce_scatter_block(in, out, n, MTRT_MPI_REAL, MPI_SUM, comm));
}

void rt_comm_reduce_scatter_bf16(MPI_Comm comm, real *out, const real *in, size_t count, uint16_t *wire) {
  int g;
  MPI_CHECK(MPI_Comm_size(comm, &g));
  size_t total = (size_t)g * count;
  uint16_t *send = wire, *recv = wire + total;
  for (size_t i = 0; i < total; i++) send[i] = rt_bf16_from_float((float)in[i]);
  int n = rt_mpi_count(count, "reduce-scatter (bf16)");
  MPI_CHECK(MPI_Alltoall(send, n, MPI_UINT16_T, recv, n, MPI_UINT16_T, comm));
  for (size_t i = 0; i < count; i++) {
    float acc = 0;
    for (int r = 0; r < g; r++) acc += rt_float_from_bf16(recv[(size_t)r * count + i]);
    out[i] = (real)acc;
  }
}

void rt_comm_all_to_all_v(MPI_Comm comm, const real *send, const int *scount, const int *sdispl,
                          real *recv, const int *rcount, const int *rdispl) {
  MPI_CHECK(MPI_Alltoallv(send, scount, sdispl, MTRT_MPI_REAL, recv, rcount, rdispl, MTRT_MPI_REAL, comm));
}
