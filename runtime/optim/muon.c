/* muon.c — Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers"), with the update
 * scaled to AdamW's RMS as in Moonlight (Liu et al. 2025, "Muon is Scalable for LLM
 * Training"), orthogonalized whole on one owner rank per matrix. */
#include <math.h>
#include <string.h>

#include "../cpu/gemm.h"
#include "mtrt_optim.h"

size_t rt_newton_schulz_work(int rows, int cols) {
  size_t r = (size_t)(rows < cols ? rows : cols), n = (size_t)rows * (size_t)cols;
  return 2 * n + 2 * r * r;
}

void rt_newton_schulz(real *out, const real *g, int rows, int cols, real *work) {
  const real a = (real)3.4445, b = (real)-4.7750, c = (real)2.0315;
  int tr = rows > cols, r = tr ? cols : rows, k = tr ? rows : cols; /* X is (r, k), r <= k */
  size_t n = (size_t)rows * (size_t)cols;
  real *x = work, *y = work + n, *A = work + 2 * n, *B = A + (size_t)r * r;
  double ss = 0;
  for (size_t i = 0; i < n; i++) ss += (double)g[i] * (double)g[i];
  real inv = (real)(1.0 / (sqrt(ss) + 1e-7));
  if (tr) /* X = Gᵀ / ||G|| */
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < cols; j++) x[(size_t)j * rows + i] = g[(size_t)i * cols + j] * inv;
  else
    for (size_t i = 0; i < n; i++) x[i] = g[i] * inv;
  for (int it = 0; it < 5; it++) {
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, r, r, k, 1, x, k, x, k, 0, A, r);   /* A = X Xᵀ */
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, r, r, c, A, r, A, r, 0, B, r); /* B = c A² */
    for (size_t i = 0; i < (size_t)r * r; i++) B[i] += b * A[i];                      /*   + b A  */
    memcpy(y, x, n * sizeof(real));
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, k, r, 1, B, r, y, k, a, x, k); /* X = a X + B X */
  }
  if (tr)
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < cols; j++) out[(size_t)i * cols + j] = x[(size_t)j * rows + i];
  else
    memcpy(out, x, n * sizeof(real));
}

/* The part of gathered elements [a, a + n) that rank r's shard [r·S, (r+1)·S) holds. */
static void piece(int64_t r, int64_t S, int64_t a, int64_t n, int64_t *from, int64_t *len) {
  int64_t lo = r * S > a ? r * S : a, hi = (r + 1) * S < a + n ? (r + 1) * S : a + n;
  *from = lo, *len = hi > lo ? hi - lo : 0;
}

void rt_muon_matrix(MPI_Comm comm, int owner, real *param, float *mom, const real *grad, int64_t S, int64_t a,
                    int rows, int cols, float grad_scale, const RtMuon *h, real *work, int *counts, int *displs) {
  int me, g;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &g);
  int64_t n = (int64_t)rows * cols, from, len;
  piece(me, S, a, n, &from, &len);
  int64_t at = from - (int64_t)me * S; /* index of the piece in this rank's shard */
  real *G = work, *U = work + n, *ns = work + 2 * n, *mine = U;
  /* momentum on this rank's piece; Nesterov: the step uses g + μ·m */
  for (int64_t i = 0; i < len; i++) {
    float gi = (float)grad[at + i] * grad_scale;
    mom[at + i] = h->momentum * mom[at + i] + gi;
    mine[i] = (real)(gi + h->momentum * mom[at + i]);
  }
  for (int r = 0; r < g; r++) {
    int64_t f, l;
    piece(r, S, a, n, &f, &l);
    counts[r] = (int)l, displs[r] = (int)(f - a);
  }
  MPI_Gatherv(mine, (int)len, MTRT_MPI_REAL, G, counts, displs, MTRT_MPI_REAL, owner, comm);
  if (me == owner) {
    rt_newton_schulz(U, G, rows, cols, ns);
    real scale = (real)(0.2 * sqrt((double)(rows > cols ? rows : cols)));
    for (int64_t i = 0; i < n; i++) U[i] *= scale;
  }
  MPI_Scatterv(U, counts, displs, MTRT_MPI_REAL, G, (int)len, MTRT_MPI_REAL, owner, comm);
  for (int64_t i = 0; i < len; i++) {
    real p = param[at + i];
    param[at + i] = p - (real)h->lr * (G[i] + (real)h->weight_decay * p);
  }
}
