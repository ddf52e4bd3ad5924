/* pmpi_count.c — a PMPI interposer for tests: counts the bytes each rank hands to MPI's
 * collectives (what leaves the rank: a collective's send buffer, less what an all-to-all keeps
 * for itself; a root's broadcast or scatter). LD_PRELOAD it into an MPI program; at
 * MPI_Finalize each rank appends "rank BYTES CALLS" to the file named by $PMPI_COUNT_OUT.
 * Calls: Allgather, Allreduce, Reduce_scatter_block, Alltoall, Alltoallv, Ialltoallv, Alltoallw,
 * Ialltoallw (Muon's exchange past INT_MAX values), Bcast, Gather, Gatherv, Scatterv (every
 * collective the runtime calls, and the Gatherv / Scatterv of the Muon before FlexShard). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static long long bytes, calls;

static long long size_of(MPI_Datatype t) {
  int s;
  PMPI_Type_size(t, &s);
  return s;
}

static int me(MPI_Comm c) {
  int r;
  PMPI_Comm_rank(c, &r);
  return r;
}

static int ranks(MPI_Comm c) {
  int n;
  PMPI_Comm_size(c, &n);
  return n;
}

int MPI_Allgather(const void *sb, int sc, MPI_Datatype st, void *rb, int rc, MPI_Datatype rt, MPI_Comm c) {
  calls++, bytes += sb == MPI_IN_PLACE ? rc * size_of(rt) : sc * size_of(st);
  return PMPI_Allgather(sb, sc, st, rb, rc, rt, c);
}

int MPI_Allreduce(const void *sb, void *rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  calls++, bytes += n * size_of(t);
  return PMPI_Allreduce(sb, rb, n, t, op, c);
}

int MPI_Reduce_scatter_block(const void *sb, void *rb, int rc, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  calls++, bytes += (long long)rc * ranks(c) * size_of(t);
  return PMPI_Reduce_scatter_block(sb, rb, rc, t, op, c);
}

int MPI_Alltoall(const void *sb, int sc, MPI_Datatype st, void *rb, int rc, MPI_Datatype rt, MPI_Comm c) {
  calls++, bytes += (long long)sc * (ranks(c) - 1) * size_of(st);
  return PMPI_Alltoall(sb, sc, st, rb, rc, rt, c);
}

static long long sent_v(const int *sc, MPI_Datatype st, MPI_Comm c) {
  long long n = 0;
  for (int r = 0, m = me(c); r < ranks(c); r++)
    if (r != m) n += sc[r];
  return n * size_of(st);
}

int MPI_Alltoallv(const void *sb, const int *sc, const int *sd, MPI_Datatype st, void *rb, const int *rc,
                  const int *rd, MPI_Datatype rt, MPI_Comm c) {
  calls++, bytes += sent_v(sc, st, c);
  return PMPI_Alltoallv(sb, sc, sd, st, rb, rc, rd, rt, c);
}

int MPI_Ialltoallv(const void *sb, const int *sc, const int *sd, MPI_Datatype st, void *rb, const int *rc,
                   const int *rd, MPI_Datatype rt, MPI_Comm c, MPI_Request *q) {
  calls++, bytes += sent_v(sc, st, c);
  return PMPI_Ialltoallv(sb, sc, sd, st, rb, rc, rd, rt, c, q);
}

static long long sent_w(const int *sc, const MPI_Datatype *st, MPI_Comm c) {
  long long n = 0;
  for (int r = 0, m = me(c); r < ranks(c); r++) {
    MPI_Count s = 0;
    if (r != m && sc[r]) PMPI_Type_size_x(st[r], &s);
    n += (long long)sc[r] * (long long)s;
  }
  return n;
}

int MPI_Alltoallw(const void *sb, const int *sc, const int *sd, const MPI_Datatype *st, void *rb, const int *rc,
                  const int *rd, const MPI_Datatype *rt, MPI_Comm c) {
  calls++, bytes += sent_w(sc, st, c);
  return PMPI_Alltoallw(sb, sc, sd, st, rb, rc, rd, rt, c);
}

int MPI_Ialltoallw(const void *sb, const int *sc, const int *sd, const MPI_Datatype *st, void *rb, const int *rc,
                   const int *rd, const MPI_Datatype *rt, MPI_Comm c, MPI_Request *q) {
  calls++, bytes += sent_w(sc, st, c);
  return PMPI_Ialltoallw(sb, sc, sd, st, rb, rc, rd, rt, c, q);
}

int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  calls++;
  if (me(c) == root) bytes += (long long)n * size_of(t);
  return PMPI_Bcast(b, n, t, root, c);
}

int MPI_Gather(const void *sb, int sc, MPI_Datatype st, void *rb, int rc, MPI_Datatype rt, int root, MPI_Comm c) {
  calls++;
  if (me(c) != root) bytes += (long long)sc * size_of(st);
  return PMPI_Gather(sb, sc, st, rb, rc, rt, root, c);
}

int MPI_Gatherv(const void *sb, int sc, MPI_Datatype st, void *rb, const int *rc, const int *rd, MPI_Datatype rt,
                int root, MPI_Comm c) {
  calls++;
  if (me(c) != root) bytes += (long long)sc * size_of(st);
  return PMPI_Gatherv(sb, sc, st, rb, rc, rd, rt, root, c);
}

int MPI_Scatterv(const void *sb, const int *sc, const int *sd, MPI_Datatype st, void *rb, int rc, MPI_Datatype rt,
                 int root, MPI_Comm c) {
  calls++;
  if (me(c) == root) bytes += sent_v(sc, st, c);
  return PMPI_Scatterv(sb, sc, sd, st, rb, rc, rt, root, c);
}

int MPI_Finalize(void) {
  const char *out = getenv("PMPI_COUNT_OUT");
  FILE *f = out ? fopen(out, "a") : NULL;
  if (f) {
    fprintf(f, "%d %lld %lld\n", me(MPI_COMM_WORLD), bytes, calls);
    fclose(f);
  }
  return PMPI_Finalize();
}
