/*
 * profile.c — MTC_PROFILE=1: where the cuda program's time goes, per op. Each kernel launch,
 * cuBLAS GEMM, grouped expert GEMM and offload copy is timed on the host between two device-wide
 * synchronizations, so the figure is the op's GPU time plus its launch; the time between one
 * op's end and the next op's start is "host and unprofiled work" (the host's own code, NCCL
 * collectives, memory copies, MPI). The synchronizations remove every overlap, so the total is
 * a serialized step, longer than a normal one: read the shares, not the sum. The table goes to
 * stderr at exit from the process that rank 0 of MPI_COMM_WORLD runs (every step, the first
 * with cuBLAS's and NVRTC's warm-up, included).
 * `train --profile FILE` (mtrt_profile.h) uses the same timings, per op class; NCCL's
 * collectives are not timed here, so the cuda profile has no collective classes.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cu_internal.h"
#include "mtrt_profile.h"

enum { PROF_ROWS = 256 };
typedef struct {
  const char *name; /* a string literal or a kernel's name: compared by pointer, then by text */
  double s;         /* seconds, summed */
  long n;           /* calls */
} ProfRow;

double cu_prof_flops;

/* `train --profile`: an op's class from its name (kernels.cu's kernel names, cu_gemm's op
 * names). GEMMs carry their FLOPs; the kernels' FLOPs and bytes are not known here, so the
 * other classes have seconds and calls only (mtc calibrate fits what has work). */
static RtProfClass class_of(const char *name) {
  static const struct {
    const char *prefix;
    RtProfClass c;
  } map[] = {{"experts", RT_PROF_GROUPED_GEMM},     {"matmul", RT_PROF_GEMM},
             {"router forward", RT_PROF_GEMM},      {"router backward d", RT_PROF_GEMM},
             {"lm head", RT_PROF_GEMM},             {"flash_attention_forward", RT_PROF_ATTENTION_FWD},
             {"attention_forward", RT_PROF_ATTENTION_FWD}, {"flash_attention_backward", RT_PROF_ATTENTION_BWD},
             {"attention_backward", RT_PROF_ATTENTION_BWD}, {"rmsnorm", RT_PROF_NORM},
             {"layernorm", RT_PROF_NORM},           {"qk_norm", RT_PROF_NORM},
             {"rope", RT_PROF_ROPE},                {"swiglu", RT_PROF_ACTIVATION},
             {"gelu", RT_PROF_ACTIVATION},          {"cross_entropy", RT_PROF_LOSS},
             {"moe_", RT_PROF_PERMUTE},             {"adamw", RT_PROF_OPTIMIZER},
             {"muon", RT_PROF_OPTIMIZER},           {"ns_", RT_PROF_OPTIMIZER}};
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (strncmp(name, map[i].prefix, strlen(map[i].prefix)) == 0) return map[i].c;
  return RT_PROF_ELEMENTWISE;
}

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

/* train --profile's barrier before a clock read (mtrt_profile.h): the device's work done */
void rt_prof_fence(void) { cu_check(cudaDeviceSynchronize(), "train --profile synchronization"); }

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
  if (rt_prof_on) rt_prof_add(class_of(name), t - t0, cu_prof_flops, 0);
  cu_prof_flops = 0;
  if (!cu.profile) return;
  ProfRow *r = row(name);
  r->s += t - t0, r->n++;
  last_end = t;
}
