/* comm_mpi.c — the cpu backend's collectives over MPI (bootstrap: comm_init.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_comm.h"

#define MPI_CHECK(call) RT_MPI_CHECK(call)

void rt_comm_all_gather(MPI_Comm comm, act *out, const act *in, size_t count) {
  int n = rt_mpi_count(count, "all-gather values per rank");
  MPI_CHECK(MPI_Allgather(in, n, MTRT_MPI_REAL, out, n, MTRT_MPI_REAL, comm));
}

void rt_comm_all_gather_start(MPI_Comm comm, act *out, const act *in, size_t count, int slot) {
  (void)slot;
  rt_comm_all_gather(comm, out, in, count);
}

void rt_comm_all_gather_wait(int slot) { (void)slot; }

void rt_comm_reduce_scatter(MPI_Comm comm, real *out, const real *in, size_t count) {
  int n = rt_mpi_count(count, "reduce-scatter values per rank");
  MPI_CHECK(MPI_Reduce_scatter_block(in, out, n, MTRT_MPI_REAL, MPI_SUM, comm));
}

/* The bf16 reduce-scatter of rt_comm_reduce_scatter_bf16 with the received pieces in recv. */
static void reduce_scatter_bf16(MPI_Comm comm, real *out, const real *in, size_t count, uint16_t *send, uint16_t *recv) {
  int g;
  MPI_CHECK(MPI_Comm_size(comm, &g));
  size_t total = (size_t)g * count;
  for (size_t i = 0; i < total; i++) send[i] = rt_bf16_from_float((float)in[i]);
  int n = rt_mpi_count(count, "reduce-scatter (bf16) values per rank");
  MPI_CHECK(MPI_Alltoall(send, n, MPI_UINT16_T, recv, n, MPI_UINT16_T, comm));
  for (size_t i = 0; i < count; i++) {
    float acc = 0;
    for (int r = 0; r < g; r++) acc += rt_float_from_bf16(recv[(size_t)r * count + i]);
    out[i] = (real)acc;
  }
}

void rt_comm_reduce_scatter_bf16(MPI_Comm comm, real *out, const real *in, size_t count, uint16_t *wire) {
  int g;
  MPI_CHECK(MPI_Comm_size(comm, &g));
  reduce_scatter_bf16(comm, out, in, count, wire, wire + (size_t)g * count);
}

/* The reduce-scatters started and not yet added (rt_comm_reduce_scatter_wait). */
static struct {
  real *acc;
  const real *out;
  size_t count;
} rs_slot[4];

void rt_comm_reduce_scatter_start(MPI_Comm comm, real *acc, real *out, real *in, size_t count, uint16_t *wire,
                                  int slot) {
  if (slot < 0 || slot >= 4 || rs_slot[slot].acc) {
    fprintf(stderr, "mtrt: reduce-scatter slot %d out of range or still in use (at %s)\n", slot, rt_comm_where());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (wire) reduce_scatter_bf16(comm, out, in, count, wire, (uint16_t *)in); /* in is consumed by the cast */
  else rt_comm_reduce_scatter(comm, out, in, count);
  rs_slot[slot].acc = acc, rs_slot[slot].out = out, rs_slot[slot].count = count;
}

void rt_comm_reduce_scatter_wait(int slot) {
  if (slot < 0 || slot >= 4 || !rs_slot[slot].acc) return; /* nothing in flight */
  real *acc = rs_slot[slot].acc;
  const real *out = rs_slot[slot].out;
  for (size_t i = 0; i < rs_slot[slot].count; i++) acc[i] += out[i];
  rs_slot[slot].acc = NULL;
}

/* Counts and displacements in rows: one row is a contiguous datatype of `row` reals. */
void rt_comm_all_to_all_v(MPI_Comm comm, const real *send, const int *scount, const int *sdispl,
                          real *recv, const int *rcount, const int *rdispl, int row) {
  MPI_Datatype t;
  MPI_CHECK(MPI_Type_contiguous(row, MTRT_MPI_REAL, &t));
  MPI_CHECK(MPI_Type_commit(&t));
  MPI_CHECK(MPI_Alltoallv(send, scount, sdispl, t, recv, rcount, rdispl, t, comm));
  MPI_CHECK(MPI_Type_free(&t));
}
