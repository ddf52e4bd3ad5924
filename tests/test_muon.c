/* test_muon.c — Muon's Newton-Schulz iteration and its owner-rank update.
 *   usage: [mpirun -np W] test_muon
 * Checks that the iteration's output has singular values in [0.5, 1.5] (wide and tall random
 * matrices), and that a matrix sharded over W ranks, gathered to its owner, orthogonalized and
 * scattered back, gets bitwise the same update as the whole matrix on one rank. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mtrt_optim.h"

/* A pseudo-random value in [-0.5, 0.5) for index i (splitmix64: full rank, unlike a linear
 * congruence, whose matrices have rank 2). */
static float value(int64_t i, int salt) {
  uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull + (uint64_t)salt * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (float)(x >> 40) / 16777216.0f - 0.5f;
}

/* Eigenvalues of the symmetric n × n matrix a (destroyed) by cyclic Jacobi rotations. */
static void jacobi(double *a, int n, double *eig) {
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) off += a[p * n + q] * a[p * n + q];
    if (off < 1e-22) break;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) {
        double apq = a[p * n + q];
        if (fabs(apq) < 1e-300) continue;
        double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        double t = (theta >= 0 ? 1 : -1) / (fabs(theta) + sqrt(theta * theta + 1)), c = 1 / sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; k++) { /* columns p, q */
          double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq, a[k * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; k++) { /* rows p, q */
          double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk, a[q * n + k] = s * apk + c * aqk;
        }
      }
  }
  for (int i = 0; i < n; i++) eig[i] = a[i * n + i];
}

static void singular_values(int rows, int cols) {
  int n = rows * cols, r = rows < cols ? rows : cols;
  real *g = malloc(sizeof(real) * (size_t)n), *o = malloc(sizeof(real) * (size_t)n);
  real *work = malloc(sizeof(real) * rt_newton_schulz_work(rows, cols));
  for (int i = 0; i < n; i++) g[i] = value(i, rows);
  rt_newton_schulz(o, g, rows, cols, work);
  double *gram = calloc((size_t)r * r, sizeof(double)), *eig = malloc(sizeof(double) * (size_t)r);
  for (int i = 0; i < r; i++) /* the r × r Gram matrix of the short side */
    for (int j = 0; j < r; j++)
      for (int k = 0; k < (rows < cols ? cols : rows); k++)
        gram[i * r + j] += rows < cols ? (double)o[i * cols + k] * o[j * cols + k] : (double)o[k * cols + i] * o[k * cols + j];
  jacobi(gram, r, eig);
  double lo = 1e9, hi = 0;
  for (int i = 0; i < r; i++) {
    double sv = sqrt(fmax(eig[i], 0));
    lo = fmin(lo, sv), hi = fmax(hi, sv);
  }
  printf("Newton-Schulz %dx%d: singular values in [%.3f, %.3f]\n", rows, cols, lo, hi);
  CHECK(lo >= 0.5 && hi <= 1.5);
  free(g), free(o), free(work), free(gram), free(eig);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (rank == 0) singular_values(64, 32), singular_values(24, 40);

  /* a 40 x 24 matrix at offset 7 of a group vector sharded over the world */
  enum { ROWS = 40, COLS = 24, AT = 7 };
  int64_t total = AT + ROWS * COLS + 5, S = (total + world - 1) / world, full = S * world;
  real *p = malloc(sizeof(real) * (size_t)full), *gr = malloc(sizeof(real) * (size_t)full);
  float *m = calloc((size_t)full, sizeof(float));
  for (int64_t i = 0; i < full; i++) p[i] = value(i, 1), gr[i] = value(i, 2);
  size_t wn = 2 * (size_t)ROWS * COLS + rt_newton_schulz_work(ROWS, COLS);
  real *work = malloc(sizeof(real) * wn);
  int *counts = malloc(sizeof(int) * 2 * (size_t)world);
  RtMuon h = {0.01f, 0.1f, 0.95f};
  /* sharded: this rank's shard is [rank·S, (rank+1)·S); owner = the last rank */
  real *ps = malloc(sizeof(real) * (size_t)S), *gs = malloc(sizeof(real) * (size_t)S);
  float *ms = calloc((size_t)S, sizeof(float));
  memcpy(ps, p + rank * S, sizeof(real) * (size_t)S), memcpy(gs, gr + rank * S, sizeof(real) * (size_t)S);
  for (int step = 0; step < 2; step++) /* twice: the second step uses the momentum */
    rt_muon_matrix(MPI_COMM_WORLD, world - 1, ps, ms, gs, S, AT, ROWS, COLS, 0.5f, &h, work, counts, counts + world);
  real *back = malloc(sizeof(real) * (size_t)full);
  MPI_Allgather(ps, (int)S, MTRT_MPI_REAL, back, (int)S, MTRT_MPI_REAL, MPI_COMM_WORLD);
  /* whole, on one rank */
  for (int step = 0; step < 2; step++)
    rt_muon_matrix(MPI_COMM_SELF, 0, p, m, gr, full, AT, ROWS, COLS, 0.5f, &h, work, counts, counts + world);
  CHECK(memcmp(back, p, sizeof(real) * (size_t)full) == 0);
  int changed = 0;
  for (int64_t i = 0; i < full; i++) changed += p[i] != value(i, 1);
  CHECK_EQ(changed, ROWS * COLS); /* the matrix moved, nothing else did */
  if (rank == 0) printf("Muon on %d rank(s): the owner's update equals the one-rank update bit for bit\n", world);
  free(p), free(gr), free(m), free(work), free(counts), free(ps), free(gs), free(ms), free(back);
  MPI_Finalize();
  return check_failures ? 1 : 0;
}
