/* muon.c — Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers"), with the update
 * scaled to AdamW's RMS as in Moonlight (Liu et al. 2025, "Muon is Scalable for LLM
 * Training"): each matrix orthogonalized whole on one rank. A matrix that lies whole in one
 * rank's shard (an expert under whole-expert sharding) is orthogonalized there with no
 * communication; the others go to their owners in one all-to-all per call and step (the
 * program's dense groups in one call, each flat expert group in its own) and come back in
 * another (FlexShard, issue 13), with int64 counts (derived datatypes past INT_MAX). */
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
  int64_t a, n, S; /* S: its group's shard */
  int rows, cols;
  int owner;  /* the rank that orthogonalizes it: its holder when it lies in one shard */
  bool local; /* whole in the owner's shard: no communication */
  int gi;     /* its group's index in the call's list */
} Mat;

/* The i-th Muon matrix of group g in table order (expert by expert), or false past the last. */
static bool mat_at(const RtTensor *t, int nt, int g, int64_t S, int ranks, int *ti, int *k, Mat *m) {
  for (; *ti < nt; (*ti)++, *k = 0) {
    const RtTensor *T = &t[*ti];
    if (T->group != g || !T->muon) continue;
    int ne = T->experts ? T->experts : 1;
    if (*k >= ne) continue;
    m->a = rt_expert_at(T, *k), m->n = T->rows * T->cols, m->rows = (int)T->rows, m->cols = (int)T->cols, m->S = S;
    int64_t r = m->a / S;
    m->local = m->a + m->n <= (r + 1) * S;
    m->owner = m->local ? (int)r : (T->owner + *k) % ranks;
    (*k)++;
    return true;
  }
  return false;
}

/* Every Muon matrix of the groups gs[0 .. ng) in list order, then table order. */
#define FOR_MATS(m)                                                                                                  \
  for (int gi_ = 0; gi_ < ng; gi_++)                                                                                 \
    for (int ti_ = 0, k_ = 0; mat_at(t, nt, gs[gi_].g, gs[gi_].S, ranks, &ti_, &k_, &(m)) && ((m).gi = gi_, true);)

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

/* An all-to-all of real values with int64 counts and displacements (elements), started now and
 * finished by a2a_wait. When every count and displacement fits rt_muon_msg_limit (INT_MAX but
 * in tests) it is one MPI_Ialltoallv; otherwise one MPI_Ialltoallw whose per-peer datatype is a
 * struct of chunks of rt_muon_msg_limit values at the piece's byte offset (an MPI_Aint), as
 * BigMPI does (Hammond, Schäfer, Latham 2014, "To INT_MAX... and beyond!"). */
typedef struct {
  int ranks;
  int64_t *sc, *sd, *rc, *rd, *put; /* per rank: sent, its offsets; received, its offsets; fill */
  int *isc, *isd, *irc, *ird;       /* MPI's int counts and displacements */
  MPI_Datatype *st, *rt;            /* the derived datatypes of the large path */
  bool big;
  MPI_Request req;
} Xchg;

int64_t rt_muon_msg_limit = INT_MAX;

size_t rt_muon_counts_bytes(int ranks) {
  return (size_t)ranks * (5 * sizeof(int64_t) + 4 * sizeof(int) + 2 * sizeof(MPI_Datatype));
}

/* The exchange's arrays in the caller's counts scratch; reset: zero the counts (a new exchange). */
static Xchg xchg(void *counts, int ranks, bool reset) {
  Xchg x = {.ranks = ranks, .req = MPI_REQUEST_NULL};
  int64_t *c = counts;
  x.sc = c, x.sd = c + ranks, x.rc = c + 2 * ranks, x.rd = c + 3 * ranks, x.put = c + 4 * ranks;
  int *i = (int *)(c + 5 * ranks);
  x.isc = i, x.isd = i + ranks, x.irc = i + 2 * ranks, x.ird = i + 3 * ranks;
  x.st = (MPI_Datatype *)(i + 4 * ranks), x.rt = x.st + ranks;
  for (int r = 0; reset && r < ranks; r++) x.sc[r] = x.rc[r] = x.put[r] = 0;
  for (int r = 0; !reset && r < ranks; r++) x.put[r] = 0;
  return x;
}

/* n values at byte offset at of a buffer, in chunks of the limit. */
static MPI_Datatype big_type(MPI_Aint at, int64_t n) {
  int64_t C = rt_muon_msg_limit, q = n / C, rem = n % C;
  int len[2], nb = 0;
  MPI_Aint disp[2];
  MPI_Datatype ty[2], out;
  if (q) {
    RT_MPI_CHECK(MPI_Type_contiguous((int)C, MTRT_MPI_REAL, &ty[nb]));
    len[nb] = (int)q, disp[nb++] = at;
  }
  if (rem) {
    RT_MPI_CHECK(MPI_Type_contiguous((int)rem, MTRT_MPI_REAL, &ty[nb]));
    len[nb] = 1, disp[nb++] = at + (MPI_Aint)(q * C) * (MPI_Aint)sizeof(real);
  }
  RT_MPI_CHECK(MPI_Type_create_struct(nb, len, disp, ty, &out));
  RT_MPI_CHECK(MPI_Type_commit(&out));
  for (int i = 0; i < nb; i++) MPI_Type_free(&ty[i]);
  return out;
}

/* Starts sending sc[r] values from snd + sd[r] to each rank r and receiving rc[r] into rcv + rd[r]. */
static void a2a_start(MPI_Comm comm, Xchg *x, const real *snd, const int64_t *sc, const int64_t *sd, real *rcv,
                      const int64_t *rc, const int64_t *rd) {
  int R = x->ranks;
  x->big = false;
  for (int r = 0; r < R; r++)
    if (sc[r] > rt_muon_msg_limit || sd[r] > rt_muon_msg_limit || rc[r] > rt_muon_msg_limit ||
        rd[r] > rt_muon_msg_limit)
      x->big = true;
  if (!x->big) {
    for (int r = 0; r < R; r++)
      x->isc[r] = (int)sc[r], x->isd[r] = (int)sd[r], x->irc[r] = (int)rc[r], x->ird[r] = (int)rd[r];
    RT_MPI_CHECK(MPI_Ialltoallv(snd, x->isc, x->isd, MTRT_MPI_REAL, rcv, x->irc, x->ird, MTRT_MPI_REAL, comm, &x->req));
    return;
  }
  for (int r = 0; r < R; r++) { /* one value of a struct type per peer; its offset inside the type */
    x->isd[r] = x->ird[r] = 0;
    x->isc[r] = sc[r] > 0, x->irc[r] = rc[r] > 0;
    x->st[r] = sc[r] > 0 ? big_type((MPI_Aint)sd[r] * (MPI_Aint)sizeof(real), sc[r]) : MTRT_MPI_REAL;
    x->rt[r] = rc[r] > 0 ? big_type((MPI_Aint)rd[r] * (MPI_Aint)sizeof(real), rc[r]) : MTRT_MPI_REAL;
  }
  RT_MPI_CHECK(MPI_Ialltoallw(snd, x->isc, x->isd, x->st, rcv, x->irc, x->ird, x->rt, comm, &x->req));
}

static void a2a_wait(Xchg *x) {
  RT_MPI_CHECK(MPI_Wait(&x->req, MPI_STATUS_IGNORE));
  for (int r = 0; x->big && r < x->ranks; r++) {
    if (x->isc[r]) MPI_Type_free(&x->st[r]);
    if (x->irc[r]) MPI_Type_free(&x->rt[r]);
  }
  x->big = false;
}

/* The counts of the exchange of groups gs on rank me: the pieces sent to each owner, received
 * from each holder (sc, rc and their offsets sd, rd, in (group, matrix) order); *sent, *owned:
 * their sums; *most: the largest moving matrix. Returns whether any matrix is split over ranks
 * (the same answer on every rank). */
static bool plan_xchg(Xchg *x, int me, const RtTensor *t, int nt, const RtMuonShard *gs, int ng, int64_t *sent,
                      int64_t *owned, int64_t *most) {
  int ranks = x->ranks;
  int64_t from, len;
  bool moving = false;
  *sent = *owned = *most = 0;
  Mat m;
  FOR_MATS(m) {
    if (m.local) continue;
    moving = true;
    if (m.n > *most) *most = m.n;
    piece(me, m.S, m.a, m.n, &from, &len);
    x->sc[m.owner] += len;
    *sent += len;
    for (int r = 0; m.owner == me && r < ranks; r++) {
      piece(r, m.S, m.a, m.n, &from, &len);
      x->rc[r] += len;
      *owned += len;
    }
  }
  for (int64_t r = 0, s = 0, q = 0; r < ranks; r++) x->sd[r] = s, x->rd[r] = q, s += x->sc[r], q += x->rc[r];
  return moving;
}

size_t rt_muon_groups_work(const RtTensor *t, int nt, const RtMuonShard *gs, int ng, int ranks) {
  int64_t most = 0, ns = 0, S = 0;
  for (int i = 0; i < ng; i++) S += gs[i].S;
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

size_t rt_muon_exchange_work(const RtTensor *t, int nt, const RtMuonShard *gs, int ng, int ranks) {
  int64_t most = 0, from, len;
  for (int r = 0; r < ranks; r++) {
    int64_t sent = 0, owned = 0; /* as plan_xchg's on rank r */
    Mat m;
    FOR_MATS(m) {
      if (m.local) continue;
      piece(r, m.S, m.a, m.n, &from, &len);
      sent += len;
      if (m.owner == r) owned += m.n;
    }
    if (sent + owned > most) most = sent + owned;
  }
  return (size_t)most;
}

size_t rt_muon_group_work(const RtTensor *t, int nt, int g, int64_t S, int ranks) {
  RtMuonShard one = {.g = g, .S = S};
  return rt_muon_groups_work(t, nt, &one, 1, ranks);
}

void rt_muon_groups(MPI_Comm comm, int ranks, const RtMuonShard *gs, int ng, const RtTensor *t, int nt,
                    float grad_scale, const RtMuon *h, real *work, void *counts, RtMuonStats *st) {
  int me;
  MPI_Comm_rank(comm, &me);
  Xchg x = xchg(counts, ranks, true);
  int64_t sent, owned, most, from, len, *put = x.put;
  bool moving = plan_xchg(&x, me, t, nt, gs, ng, &sent, &owned, &most);
  /* work: send buffer (pieces by owner, in (group, matrix) order) | received pieces | G | U | scratch */
  real *snd = work, *rcv = snd + sent, *G = rcv + owned;
  Mat m;
  FOR_MATS(m) {
    if (m.local) continue;
    const RtMuonShard *q = &gs[m.gi];
    piece(me, m.S, m.a, m.n, &from, &len);
    momentum(q->mom, q->grad, from - (int64_t)me * m.S, len, grad_scale, h, snd + x.sd[m.owner] + put[m.owner]);
    put[m.owner] += len;
  }
  /* (no collective when nothing moves: experts' groups) */
  if (moving) a2a_start(comm, &x, snd, x.sc, x.sd, rcv, x.rc, x.rd);
  if (moving && st) st->large += x.big;
  FOR_MATS(m) { /* while it flies: the matrices held whole here */
    if (!m.local || m.owner != me) continue;
    const RtMuonShard *q = &gs[m.gi];
    real *U = G + m.n;
    int64_t at = m.a - (int64_t)me * m.S;
    momentum(q->mom, q->grad, at, m.n, grad_scale, h, G);
    orthogonalize(U, G, m.rows, m.cols, U + m.n);
    apply(q->param, at, U, m.n, h);
    if (st) st->local++;
  }
  if (!moving) return;
  a2a_wait(&x);
  for (int r = 0; r < ranks; r++) put[r] = 0;
  FOR_MATS(m) { /* the owner's: assembled from the holders' pieces, the update written back in place */
    if (m.local || m.owner != me) continue;
    real *U = G + m.n;
    for (int r = 0; r < ranks; r++) {
      piece(r, m.S, m.a, m.n, &from, &len);
      memcpy(G + (from - m.a), rcv + x.rd[r] + put[r], (size_t)len * sizeof(real));
    }
    orthogonalize(U, G, m.rows, m.cols, U + m.n);
    for (int r = 0; r < ranks; r++) {
      piece(r, m.S, m.a, m.n, &from, &len);
      memcpy(rcv + x.rd[r] + put[r], U + (from - m.a), (size_t)len * sizeof(real));
      put[r] += len;
    }
    if (st) st->owned++;
  }
  a2a_start(comm, &x, rcv, x.rc, x.rd, snd, x.sc, x.sd); /* the updates back */
  if (st) st->large += x.big, st->exchanges++;
  a2a_wait(&x);
  for (int r = 0; r < ranks; r++) put[r] = 0;
  FOR_MATS(m) {
    if (m.local) continue;
    piece(me, m.S, m.a, m.n, &from, &len);
    apply(gs[m.gi].param, from - (int64_t)me * m.S, snd + x.sd[m.owner] + put[m.owner], len, h);
    put[m.owner] += len;
  }
  if (st) st->sent += sent, st->received += owned;
}

void rt_muon_group(MPI_Comm comm, int ranks, real *param, float *mom, const real *grad, const RtTensor *t, int nt,
                   int g, int64_t S, float grad_scale, const RtMuon *h, real *work, void *counts, RtMuonStats *st) {
  RtMuonShard one = {g, S, param, mom, grad, NULL};
  rt_muon_groups(comm, ranks, &one, 1, t, nt, grad_scale, h, work, counts, st);
}

bool rt_muon_exchange_start(MPI_Comm comm, int ranks, const RtMuonShard *gs, int ng, const RtTensor *t, int nt,
                            real *work, void *counts, RtMuonXchg *xs) {
  int me;
  MPI_Comm_rank(comm, &me);
  Xchg x = xchg(counts, ranks, true);
  int64_t sent, owned, most, from, len;
  *xs = (RtMuonXchg){comm, ranks, me, gs, ng, t, nt, work, counts, 0, 0, 0, MPI_REQUEST_NULL, false};
  if (!plan_xchg(&x, me, t, nt, gs, ng, &sent, &owned, &most)) return false;
  real *snd = work, *rcv = snd + sent; /* work: as rt_muon_groups' */
  Mat m;
  FOR_MATS(m) {
    if (m.local) continue;
    piece(me, m.S, m.a, m.n, &from, &len);
    memcpy(snd + x.sd[m.owner] + x.put[m.owner], gs[m.gi].nest + (from - (int64_t)me * m.S),
           (size_t)len * sizeof(real));
    x.put[m.owner] += len;
  }
  a2a_start(comm, &x, snd, x.sc, x.sd, rcv, x.rc, x.rd);
  xs->sent = sent, xs->owned = owned, xs->most = most, xs->req = x.req, xs->big = x.big;
  return true;
}

void rt_muon_exchange_finish(RtMuonXchg *xs, RtMuonOrth orth, void (*done)(void *ctx), void *ctx, RtMuonStats *st) {
  Xchg x = xchg(xs->counts, xs->ranks, false); /* the start's counts, put reset */
  x.req = xs->req, x.big = xs->big;
  const RtTensor *t = xs->t;
  const RtMuonShard *gs = xs->gs;
  int nt = xs->nt, ng = xs->ng, ranks = xs->ranks, me = xs->me;
  int64_t from, len, *put = x.put;
  real *snd = xs->work, *rcv = snd + xs->sent;
  real **at = malloc((size_t)ranks * sizeof *at);
  int64_t *lens = malloc((size_t)ranks * sizeof *lens);
  if (!at || !lens) {
    fprintf(stderr, "error: Muon's exchange: no host memory for %d pieces\n", ranks);
    MPI_Abort(xs->comm, 2);
  }
  a2a_wait(&x);
  Mat m;
  FOR_MATS(m) { /* the owner's: its pieces in rank order, orthogonalized in place */
    if (m.local || m.owner != me) continue;
    for (int r = 0; r < ranks; r++) {
      piece(r, m.S, m.a, m.n, &from, &len);
      at[r] = rcv + x.rd[r] + put[r], lens[r] = len;
      put[r] += len;
    }
    orth(at, lens, ranks, m.rows, m.cols, ctx);
    if (st) st->owned++;
  }
  if (done) done(ctx);
  free(at);
  free(lens);
  a2a_start(xs->comm, &x, rcv, x.rc, x.rd, snd, x.sc, x.sd);
  if (st) st->large += xs->big + x.big, st->exchanges++;
  a2a_wait(&x);
  for (int r = 0; r < ranks; r++) put[r] = 0;
  FOR_MATS(m) {
    if (m.local) continue;
    piece(me, m.S, m.a, m.n, &from, &len);
    memcpy(gs[m.gi].nest + (from - (int64_t)me * m.S), snd + x.sd[m.owner] + put[m.owner], (size_t)len * sizeof(real));
    put[m.owner] += len;
  }
  if (st) st->sent += xs->sent, st->received += xs->owned;
}
