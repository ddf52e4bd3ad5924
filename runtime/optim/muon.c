/* muon.c — Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers"), with the update
 * scaled to AdamW's RMS as in Moonlight (Liu et al. 2025, "Muon is Scalable for LLM
 * Training"): each matrix orthogonalized whole on one rank. A matrix that lies whole in one
 * rank's shard (an expert under whole-expert sharding) is orthogonalized there with no
 * communication; the others go to their owners in one all-to-all per group and step and come
 * back in another (FlexShard, issue 13). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu/gemm.h"
#include "mtrt_optim.h"
#include "mtrt_train.h"

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

/* One Muon matrix of a group: elements [a, a + n) of the gathered vector, rows × cols. */
typedef struct {
  int64_t a, n;
  int rows, cols;
  int owner;  /* the rank that orthogonalizes it: its holder when it lies in one shard */
  bool local; /* whole in the owner's shard: no communication */
} Mat;

/* The i-th Muon matrix of group g in table order (expert by expert), or false past the last. */
static bool mat_at(const RtTensor *t, int nt, int g, int64_t S, int ranks, int *ti, int *k, Mat *m) {
  for (; *ti < nt; (*ti)++, *k = 0) {
    const RtTensor *T = &t[*ti];
    if (T->group != g || !T->muon) continue;
    int ne = T->experts ? T->experts : 1;
    if (*k >= ne) continue;
    m->a = rt_expert_at(T, *k), m->n = T->rows * T->cols, m->rows = (int)T->rows, m->cols = (int)T->cols;
    int64_t r = m->a / S;
    m->local = m->a + m->n <= (r + 1) * S;
    m->owner = m->local ? (int)r : (T->owner + *k) % ranks;
    (*k)++;
    return true;
  }
  return false;
}

#define FOR_MATS(m) for (int ti_ = 0, k_ = 0; mat_at(t, nt, g, S, ranks, &ti_, &k_, &(m));)

/* Newton-Schulz on G (n = rows·cols values) into U, scaled by 0.2·sqrt(max(rows, cols)). */
static void orthogonalize(real *U, const real *G, int rows, int cols, real *ns) {
  int64_t n = (int64_t)rows * cols;
  rt_newton_schulz(U, G, rows, cols, ns);
  real scale = (real)(0.2 * sqrt((double)(rows > cols ? rows : cols)));
  for (int64_t i = 0; i < n; i++) U[i] *= scale;
}

/* Momentum of len values at shard index at; the Nesterov gradient g + μ·m into out. */
static void momentum(float *mom, const real *grad, int64_t at, int64_t len, float grad_scale, const RtMuon *h,
                     real *out) {
  for (int64_t i = 0; i < len; i++) {
    float gi = (float)grad[at + i] * grad_scale;
    mom[at + i] = h->momentum * mom[at + i] + gi;
    out[i] = (real)(gi + h->momentum * mom[at + i]);
  }
}

/* p ← p − lr·(u + wd·p) on len values at shard index at. */
static void apply(real *param, int64_t at, const real *u, int64_t len, const RtMuon *h) {
  for (int64_t i = 0; i < len; i++) {
    real p = param[at + i];
    param[at + i] = p - (real)h->lr * (u[i] + (real)h->weight_decay * p);
  }
}

static int as_int(int64_t x) {
  if (x > INT_MAX) {
    fprintf(stderr, "error: Muon: %lld values in one message exceed MPI's int counts\n", (long long)x);
    abort();
  }
  return (int)x;
}

size_t rt_muon_group_work(const RtTensor *t, int nt, int g, int64_t S, int ranks) {
  int64_t most = 0, ns = 0;
  for (int r = 0; r < ranks; r++) {
    int64_t owned = 0;
    Mat m;
    FOR_MATS(m) {
      if (!m.local && m.owner == r) owned += m.n;
      size_t w = 2 * (size_t)m.n + rt_newton_schulz_work(m.rows, m.cols);
      if ((int64_t)w > ns) ns = (int64_t)w;
    }
    if (owned > most) most = owned;
  }
  return (size_t)(S + most + ns);
}

void rt_muon_group(MPI_Comm comm, int ranks, real *param, float *mom, const real *grad, const RtTensor *t, int nt,
                   int g, int64_t S, float grad_scale, const RtMuon *h, real *work, int *counts, RtMuonStats *st) {
  int me;
  MPI_Comm_rank(comm, &me);
  int *sc = counts, *sd = counts + ranks, *rc = counts + 2 * ranks, *rd = counts + 3 * ranks;
  int64_t sent = 0, owned = 0, from, len;
  bool moving = false; /* some matrix is split over ranks (the same answer on every rank) */
  for (int r = 0; r < ranks; r++) sc[r] = rc[r] = 0;
  Mat m;
  FOR_MATS(m) { /* the all-to-all's counts: pieces sent to each owner, received from each holder */
    if (m.local) continue;
    moving = true;
    piece(me, S, m.a, m.n, &from, &len);
    sc[m.owner] += as_int(len);
    sent += len;
    for (int r = 0; m.owner == me && r < ranks; r++) {
      piece(r, S, m.a, m.n, &from, &len);
      rc[r] += as_int(len);
      owned += len;
    }
  }
  for (int r = 0, s = 0, q = 0; r < ranks; r++) sd[r] = s, rd[r] = q, s += sc[r], q += rc[r];
  /* work: send buffer (pieces by owner, in matrix order) | received pieces | G | U | scratch */
  real *snd = work, *rcv = snd + sent, *G = rcv + owned;
  int *put = counts + 4 * ranks;
  for (int r = 0; r < ranks; r++) put[r] = 0;
  FOR_MATS(m) {
    if (m.local) continue;
    piece(me, S, m.a, m.n, &from, &len);
    momentum(mom, grad, from - (int64_t)me * S, len, grad_scale, h, snd + sd[m.owner] + put[m.owner]);
    put[m.owner] += (int)len;
  }
  MPI_Request req = MPI_REQUEST_NULL; /* (no collective when nothing moves: experts' groups) */
  if (moving) RT_MPI_CHECK(MPI_Ialltoallv(snd, sc, sd, MTRT_MPI_REAL, rcv, rc, rd, MTRT_MPI_REAL, comm, &req));
  FOR_MATS(m) { /* while it flies: the matrices held whole here */
    if (!m.local || m.owner != me) continue;
    real *U = G + m.n;
    int64_t at = m.a - (int64_t)me * S;
    momentum(mom, grad, at, m.n, grad_scale, h, G);
    orthogonalize(U, G, m.rows, m.cols, U + m.n);
    apply(param, at, U, m.n, h);
    if (st) st->local++;
  }
  RT_MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
  if (!moving) return;
  for (int r = 0; r < ranks; r++) put[r] = 0;
  FOR_MATS(m) { /* the owner's: assembled from the holders' pieces, the update written back in place */
    if (m.local || m.owner != me) continue;
    real *U = G + m.n;
    for (int r = 0; r < ranks; r++) {
      piece(r, S, m.a, m.n, &from, &len);
      memcpy(G + (from - m.a), rcv + rd[r] + put[r], (size_t)len * sizeof(real));
    }
    orthogonalize(U, G, m.rows, m.cols, U + m.n);
    for (int r = 0; r < ranks; r++) {
      piece(r, S, m.a, m.n, &from, &len);
      memcpy(rcv + rd[r] + put[r], U + (from - m.a), (size_t)len * sizeof(real));
      put[r] += (int)len;
    }
    if (st) st->owned++;
  }
  RT_MPI_CHECK(MPI_Alltoallv(rcv, rc, rd, MTRT_MPI_REAL, snd, sc, sd, MTRT_MPI_REAL, comm));
  for (int r = 0; r < ranks; r++) put[r] = 0;
  FOR_MATS(m) {
    if (m.local) continue;
    piece(me, S, m.a, m.n, &from, &len);
    apply(param, from - (int64_t)me * S, snd + sd[m.owner] + put[m.owner], len, h);
    put[m.owner] += (int)len;
  }
  if (st) st->sent += sent, st->received += owned;
}

bool rt_muon_exchange(MPI_Comm comm, int ranks, real *nest, const RtTensor *t, int nt, int g, int64_t S,
                      RtMuonOrth orth, void *ctx, real *work, int *counts, RtMuonStats *st) {
  int me;
  MPI_Comm_rank(comm, &me);
  int *sc = counts, *sd = counts + ranks, *rc = counts + 2 * ranks, *rd = counts + 3 * ranks, *put = counts + 4 * ranks;
  int64_t sent = 0, owned = 0, from, len, most = 0;
  bool moving = false;
  for (int r = 0; r < ranks; r++) sc[r] = rc[r] = put[r] = 0;
  Mat m;
  FOR_MATS(m) { /* the counts, as rt_muon_group's */
    if (m.local) continue;
    moving = true;
    if (m.n > most) most = m.n;
    piece(me, S, m.a, m.n, &from, &len);
    sc[m.owner] += as_int(len);
    sent += len;
    for (int r = 0; m.owner == me && r < ranks; r++) {
      piece(r, S, m.a, m.n, &from, &len);
      rc[r] += as_int(len);
      owned += len;
    }
  }
  if (!moving) return false;
  for (int r = 0, s = 0, q = 0; r < ranks; r++) sd[r] = s, rd[r] = q, s += sc[r], q += rc[r];
  real *snd = work, *rcv = snd + sent, *G = rcv + owned, *U = G + most; /* work: as rt_muon_group's */
  FOR_MATS(m) {
    if (m.local) continue;
    piece(me, S, m.a, m.n, &from, &len);
    memcpy(snd + sd[m.owner] + put[m.owner], nest + (from - (int64_t)me * S), (size_t)len * sizeof(real));
    put[m.owner] += (int)len;
  }
  RT_MPI_CHECK(MPI_Alltoallv(snd, sc, sd, MTRT_MPI_REAL, rcv, rc, rd, MTRT_MPI_REAL, comm));
  for (int r = 0; r < ranks; r++) put[r] = 0;
  FOR_MATS(m) { /* the owner's: assembled, orthogonalized, the update written back in place */
    if (m.local || m.owner != me) continue;
    for (int r = 0; r < ranks; r++) {
      piece(r, S, m.a, m.n, &from, &len);
      memcpy(G + (from - m.a), rcv + rd[r] + put[r], (size_t)len * sizeof(real));
    }
    orth(U, G, m.rows, m.cols, ctx);
    for (int r = 0; r < ranks; r++) {
      piece(r, S, m.a, m.n, &from, &len);
      memcpy(rcv + rd[r] + put[r], U + (from - m.a), (size_t)len * sizeof(real));
      put[r] += (int)len;
    }
    if (st) st->owned++;
  }
  RT_MPI_CHECK(MPI_Alltoallv(rcv, rc, rd, MTRT_MPI_REAL, snd, sc, sd, MTRT_MPI_REAL, comm));
  for (int r = 0; r < ranks; r++) put[r] = 0;
  FOR_MATS(m) {
    if (m.local) continue;
    piece(me, S, m.a, m.n, &from, &len);
    memcpy(nest + (from - (int64_t)me * S), snd + sd[m.owner] + put[m.owner], (size_t)len * sizeof(real));
    put[m.owner] += (int)len;
  }
  if (st) st->sent += sent, st->received += owned;
  return true;
}
