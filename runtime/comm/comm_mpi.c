/* comm_mpi.c — the cpu backend's collectives over MPI (bootstrap: comm_init.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_comm.h"
#include "mtrt_ops.h"

#define MPI_CHECK(call) RT_MPI_CHECK(call)

/* Large counts (mtrt_comm.h): a call moves at most rt_mpi_piece_max() values per rank, a larger
 * count in pieces. An all-gather's or all-to-all's piece [at, at + n) of each rank's block of
 * count values is one element of a contiguous type of n values resized to count values' extent
 * (MPI_Aint bytes), so that block r's piece lands at r count + at. */
static MPI_Datatype strided(MPI_Datatype base, size_t bytes, int n, size_t count) {
  MPI_Datatype t, r;
  MPI_CHECK(MPI_Type_contiguous(n, base, &t));
  MPI_CHECK(MPI_Type_create_resized(t, 0, (MPI_Aint)(count * bytes), &r));
  MPI_CHECK(MPI_Type_free(&t));
  MPI_CHECK(MPI_Type_commit(&r));
  return r;
}

void rt_comm_all_gather(MPI_Comm comm, act *out, const act *in, size_t count) {
  size_t piece = rt_mpi_piece_max();
  if (count <= piece) {
    int n = rt_mpi_count(count, "all-gather values per rank");
    MPI_CHECK(MPI_Allgather(in, n, MTRT_MPI_REAL, out, n, MTRT_MPI_REAL, comm));
    return;
  }
  for (size_t at = 0; at < count; at += piece) {
    int n = (int)rt_mpi_piece_len(count, at, piece);
    MPI_Datatype t = strided(MTRT_MPI_REAL, sizeof(act), n, count);
    MPI_CHECK(MPI_Allgather(in + at, n, MTRT_MPI_REAL, out + at, 1, t, comm));
    MPI_CHECK(MPI_Type_free(&t));
  }
}

/* The all-to-all of g blocks of count bf16 values (block r of send to rank r, rank r's into block
 * r of recv), in pieces past rt_mpi_piece_max(). */
static void all_to_all_u16(MPI_Comm comm, const uint16_t *send, uint16_t *recv, size_t count) {
  size_t piece = rt_mpi_piece_max();
  if (count <= piece) {
    int n = rt_mpi_count(count, "reduce-scatter (bf16) values per rank");
    MPI_CHECK(MPI_Alltoall(send, n, MPI_UINT16_T, recv, n, MPI_UINT16_T, comm));
    return;
  }
  for (size_t at = 0; at < count; at += piece) {
    MPI_Datatype t = strided(MPI_UINT16_T, sizeof(uint16_t), (int)rt_mpi_piece_len(count, at, piece), count);
    MPI_CHECK(MPI_Alltoall(send + at, 1, t, recv + at, 1, t, comm));
    MPI_CHECK(MPI_Type_free(&t));
  }
}

/* The fp32 reduce-scatter of g blocks of count values (block r summed into rank r), past
 * rt_mpi_piece_max() values: rank r's block is one MPI_Reduce to root r per piece (contiguous
 * predefined types: MPI's sums need no derived type). out: NULL for in place, the sum then in
 * in[0, count) (this rank's block moved there once every reduce has read block 0). */
static void reduce_scatter_pieces(MPI_Comm comm, real *out, real *in, size_t count) {
  size_t piece = rt_mpi_piece_max();
  int g, me;
  MPI_CHECK(MPI_Comm_size(comm, &g));
  MPI_CHECK(MPI_Comm_rank(comm, &me));
  for (int r = 0; r < g; r++)
    for (size_t at = 0; at < count; at += piece) {
      int n = (int)rt_mpi_piece_len(count, at, piece);
      real *block = in + (size_t)r * count + at;
      if (r != me)
        MPI_CHECK(MPI_Reduce(block, NULL, n, MTRT_MPI_REAL, MPI_SUM, r, comm));
      else if (out)
        MPI_CHECK(MPI_Reduce(block, out + at, n, MTRT_MPI_REAL, MPI_SUM, r, comm));
      else
        MPI_CHECK(MPI_Reduce(MPI_IN_PLACE, block, n, MTRT_MPI_REAL, MPI_SUM, r, comm));
    }
  if (!out && me) memmove(in, in + (size_t)me * count, count * sizeof(real));
}

void rt_comm_all_gather_start(MPI_Comm comm, act *out, const act *in, size_t count, int slot) {
  (void)slot;
  rt_comm_all_gather(comm, out, in, count);
}

void rt_comm_all_gather_wait(int slot) { (void)slot; }

void rt_comm_reduce_scatter(MPI_Comm comm, real *out, const real *in, size_t count) {
  if (count > rt_mpi_piece_max()) { /* (in is only read: reduce_scatter_pieces writes out) */
    reduce_scatter_pieces(comm, out, (real *)in, count);
    return;
  }
  int n = rt_mpi_count(count, "reduce-scatter values per rank");
  MPI_CHECK(MPI_Reduce_scatter_block(in, out, n, MTRT_MPI_REAL, MPI_SUM, comm));
}

/* The bf16 reduce-scatter of rt_comm_reduce_scatter_bf16 with the received pieces in recv. */
static void reduce_scatter_bf16(MPI_Comm comm, real *out, const real *in, size_t count, uint16_t *send, uint16_t *recv) {
  int g;
  MPI_CHECK(MPI_Comm_size(comm, &g));
  size_t total = (size_t)g * count;
  for (size_t i = 0; i < total; i++) send[i] = rt_bf16_from_float((float)in[i]);
  all_to_all_u16(comm, send, recv, count);
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

/* The slots started and not yet waited for (rt_comm_reduce_scatter_wait): start adds already. */
static bool rs_busy[4];

/* bf16 on the wire with in's own bytes as the buffers (act is real here, >= 4 bytes a value):
 * in rounded to bf16 into bytes [0, 2 g count) (in order: value i's bf16 never overwrites a value
 * not yet read), the all-to-all into bytes [2 g count, 4 g count), then acc += each part's fp32
 * sum of its g pieces in rank order. */
static void reduce_scatter_bf16_in_place(MPI_Comm comm, int g, real *acc, act *in, size_t count) {
  char *bytes = (char *)in;
  size_t total = (size_t)g * count;
  for (size_t i = 0; i < total; i++) {
    real v;
    memcpy(&v, bytes + i * sizeof(real), sizeof v);
    uint16_t h = rt_bf16_from_float((float)v);
    memcpy(bytes + 2 * i, &h, sizeof h);
  }
  uint16_t *recv = (uint16_t *)(bytes + 2 * total);
  all_to_all_u16(comm, (const uint16_t *)bytes, recv, count);
  for (size_t i = 0; i < count; i++) {
    float sum = 0;
    for (int r = 0; r < g; r++) sum += rt_float_from_bf16(recv[(size_t)r * count + i]);
    acc[i] += (real)sum;
  }
}

void rt_comm_reduce_scatter_start(MPI_Comm comm, real *acc, act *in, size_t count, bool bf16, real *wire, int slot) {
  (void)wire; /* act is real: every sum happens in in's own bytes */
  if (slot < 0 || slot >= 4 || rs_busy[slot]) {
    fprintf(stderr, "mtrt: reduce-scatter slot %d out of range or still in use (at %s)\n", slot, rt_comm_where());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int g;
  MPI_CHECK(MPI_Comm_size(comm, &g));
  if (g > 1 && bf16) {
    reduce_scatter_bf16_in_place(comm, g, acc, in, count);
  } else {
    if (g > 1 && count > rt_mpi_piece_max()) {
      reduce_scatter_pieces(comm, NULL, in, count); /* into in[0, count) */
    } else if (g > 1) {
      int n = rt_mpi_count(count, "reduce-scatter values per rank");
      MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, in, n, MTRT_MPI_REAL, MPI_SUM, comm)); /* into in[0, count) */
    }
    for (size_t i = 0; i < count; i++) acc[i] += in[i];
  }
  rs_busy[slot] = true;
}

void rt_comm_reduce_scatter_wait(int slot) {
  if (slot >= 0 && slot < 4) rs_busy[slot] = false; /* (start added the sum) */
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

/* The step's expert loads of auxiliary-loss-free balancing (mtrt_ops.h), summed over the world. */
void rt_moe_load_all_reduce(real *load, int E) { rt_comm_all_reduce(MPI_COMM_WORLD, load, (size_t)E); }
