/*
 * profile.c — MTC_PROFILE=1: where the cuda program's time goes, per op. Each kernel launch,
 * cuBLAS GEMM, grouped expert GEMM and offload copy is timed on the host between two device-wide
 * synchronizations, so the figure is the op's GPU time plus its launch; the time between one
 * op's end and the next op's start is "host and unprofiled work" (the host's own code, NCCL
 * collectives, memory copies, MPI). The synchronizations remove every overlap, so the total is
 * a serialized step, longer than a normal one: read the shares, not the sum. The table goes to
 * stderr at exit from the process that rank 0 of MPI_COMM_WORLD runs (every step, the first
 * with cuBLAS's and NVRTC's warm-up, included).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cu_internal.h"

enum { PROF_ROWS = 256 };
typedef struct {
  const char *name; /* a string literal or a kernel's name: compared by pointer, then by text */
  double s;         /* seconds, summed */
  long n;           /* calls */
} ProfRow;

static ProfRow rows[PROF_ROWS + 1]; /* the last row gathers names past PROF_ROWS */
static int nrows;
static double last_end = -1, host_s;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ProfRow *row(const char *name) {
  for (int i = 0; i < nrows; i++)
    if (rows[i].name == name || strcmp(rows[i].name, name) == 0) return &rows[i];
  if (nrows == PROF_ROWS) return rows[PROF_ROWS].name = "(other ops)", &rows[PROF_ROWS];
  rows[nrows].name = name;
  return &rows[nrows++];
}

static int by_time(const void *a, const void *b) {
  double x = ((const ProfRow *)a)->s, y = ((const ProfRow *)b)->s;
  return (x < y) - (x > y);
}

static void report(void) {
  int rank = 0, inited = 0, done = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&done);
  if (inited && !done) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0 || !nrows) return;
  int n = nrows + (rows[PROF_ROWS].n > 0);
  if (rows[PROF_ROWS].n) rows[nrows] = rows[PROF_ROWS];
  qsort(rows, (size_t)n, sizeof rows[0], by_time);
  double ops = 0;
  for (int i = 0; i < n; i++) ops += rows[i].s;
  double all = ops + host_s;
  fprintf(stderr, "profile (MTC_PROFILE=1, every op synchronized; shares of %.3f s):\n", all);
  fprintf(stderr, "  %-40s %10s %8s %10s %7s\n", "op", "total ms", "calls", "ms/call", "share");
  for (int i = 0; i < n; i++)
    fprintf(stderr, "  %-40s %10.2f %8ld %10.4f %6.1f%%\n", rows[i].name, 1e3 * rows[i].s, rows[i].n,
            1e3 * rows[i].s / (double)rows[i].n, 100 * rows[i].s / all);
  fprintf(stderr, "  %-40s %10.2f %8s %10s %6.1f%%\n", "host and unprofiled work (NCCL, copies)", 1e3 * host_s,
          "", "", 100 * host_s / all);
}

void cu_prof_init(void) {
  const char *p = getenv("MTC_PROFILE");
  cu.profile = p && strcmp(p, "1") == 0;
  if (cu.profile) atexit(report);
}

double cu_prof_begin(void) {
  cu_check(cudaDeviceSynchronize(), "MTC_PROFILE synchronization");
  double t = now();
  if (last_end >= 0) host_s += t - last_end;
  return t;
}

void cu_prof_end(const char *name, double t0) {
  cu_check(cudaDeviceSynchronize(), name);
  double t = now();
  ProfRow *r = row(name);
  r->s += t - t0, r->n++;
  last_end = t;
}
