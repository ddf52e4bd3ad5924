/*
 * attn_cudnn.c — causal attention through cuDNN's fused flash attention, from C over cuDNN's
 * backend API: an operation graph per shape (forward, backward), its engine from cuDNN's
 * heuristics, an execution plan built once and kept (cached by shape), executed on the runtime's
 * stream. bf16 Q, K, V, O, dO, dQ, dK, dV; fp32 softmax statistics (the log-sum-exp of each
 * scaled score row, natural log: the layer's LSE item, b·h·s_q fp32); MHA and GQA (query head h
 * reads KV head h / (h_q / h_kv)); qk and v head dims apart (MLA's 192/128); strided views.
 *
 * The graphs are the pattern of cudnn-frontend's composite SDPA nodes (its CompositeSDPANode and
 * CompositeSDPABackwardNode, the path it takes for cuDNN before 9.21, whose unified SDPA operation
 * has no causal mask): Q·Kᵀ, × scale, the causal mask as index arithmetic and a select, softmax
 * with its statistics, ·V; the backward recomputes P from the statistics. A query block that is
 * the last s_q positions of s_kv keys (s_kv > s_q) has its diagonal aligned bottom-right (row +
 * s_kv − s_q ≥ column). The backward needs two fp32 buffers besides the engine's workspace: the
 * rows' Σ dO·O (b·h·s_q: the runtime's delta) and dQ's accumulator (b·h_q·s_q·d_qk: its dqacc);
 * the engine's workspace shares cuBLAS's (one stream), and a plan whose workspace is larger stops
 * the program naming the spec key. The backward is cuDNN's default, non-deterministic one.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cudnn_graph.h>

#include "cu_internal.h"

enum { MAX_OPS = 40, MAX_DESC = 160, MAX_PLANS = 16, MAX_UIDS = 24 };

/* Tensor ids of the variant pack (the by-value scalars included). */
enum {
  U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_SCALE, U_NINF, U_SKV, U_SQ, U_ONE, U_DELTA, U_DQACC,
  U_VIRTUAL = 100 /* virtual tensors from here */
};

/* A graph under construction: its descriptors (destroyed with it) and operations. */
typedef struct {
  cudnnBackendDescriptor_t d[MAX_DESC], ops[MAX_OPS];
  int nd, nops;
  int64_t next_uid;
  const char *bad; /* the first call that failed */
  cudnnStatus_t st;
} G;

static cudnnBackendDescriptor_t make(G *g, cudnnBackendDescriptorType_t t, const char *what) {
  cudnnBackendDescriptor_t d = NULL;
  if (g->bad) return NULL;
  cudnnStatus_t s = cudnnBackendCreateDescriptor(t, &d);
  if (s != CUDNN_STATUS_SUCCESS || g->nd == MAX_DESC) return g->bad = what, g->st = s, NULL;
  return g->d[g->nd++] = d;
}
static void set(G *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                int64_t n, const void *v, const char *what) {
  if (g->bad) return;
  cudnnStatus_t s = cudnnBackendSetAttribute(d, a, t, n, v);
  if (s != CUDNN_STATUS_SUCCESS) g->bad = what, g->st = s;
}
static void fin(G *g, cudnnBackendDescriptor_t d, const char *what) {
  if (g->bad) return;
  cudnnStatus_t s = cudnnBackendFinalize(d);
  if (s != CUDNN_STATUS_SUCCESS) g->bad = what, g->st = s;
}
static void drop(G *g) {
  for (int i = g->nd - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->d[i]);
  g->nd = g->nops = 0;
}

/* A tensor: dims and strides (4 each, elements), its type; uid 0: a new virtual one. */
static cudnnBackendDescriptor_t tensor(G *g, int64_t uid, cudnnDataType_t type, const int64_t dim[4],
                                       const int64_t str[4], int by_value) {
  cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
  bool virt = uid == 0, byval = by_value != 0;
  int64_t align = 16;
  if (virt) uid = g->next_uid++;
  set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
  set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dims");
  set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str, "tensor strides");
  set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id");
  set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
  set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor virtual");
  if (byval) set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval, "tensor by value");
  fin(g, t, "tensor");
  return t;
}
/* A by-value scalar (dims 1 × 1 × 1 × 1), its value passed in the variant pack. */
static cudnnBackendDescriptor_t scalar(G *g, int64_t uid, cudnnDataType_t type) {
  static const int64_t one[4] = {1, 1, 1, 1};
  return tensor(g, uid, type, one, one, 1);
}
/* A virtual tensor of shape b × h × r × c, row-major (or, transposed, column-major in r × c). */
static cudnnBackendDescriptor_t virt(G *g, cudnnDataType_t type, int64_t b, int64_t h, int64_t r, int64_t c) {
  const int64_t dim[4] = {b, h, r, c}, str[4] = {h * r * c, r * c, c, 1};
  return tensor(g, 0, type, dim, str, 0);
}

static void add_op(G *g, cudnnBackendDescriptor_t op, const char *what) {
  fin(g, op, what);
  if (!g->bad && g->nops < MAX_OPS) g->ops[g->nops++] = op;
  else if (!g->bad) g->bad = "too many operations";
}

/* y = mode(x [, b [, t]]) elementwise with broadcasting; axis for GEN_INDEX (else -1); prec the math. */
static void pw(G *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis, cudnnBackendDescriptor_t x,
               cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t p = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
  set(g, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
  set(g, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
  if (axis >= 0) set(g, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
  fin(g, p, "pointwise descriptor");
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p, "pointwise op");
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
  if (b) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise b");
  if (t) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise t");
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
  add_op(g, op, "pointwise operation");
}
/* c = a · b over the last two dims, batched over the first two (b's broadcast or grouped). */
static void mm(G *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t m = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
  set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "matmul type");
  fin(g, m, "matmul descriptor");
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul b");
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m, "matmul desc");
  add_op(g, op, "matmul operation");
}
/* y = reduce(x) over the dims where y is 1 (or grouped where y's dim divides x's). */
static void red(G *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
  set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction mode");
  set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "reduction type");
  fin(g, r, "reduction descriptor");
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, "reduction desc");
  add_op(g, op, "reduction operation");
}
/* y = x viewed with y's dims and strides (the frontend's transposes of P, dS and K). */
static void reshape(G *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
  set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape x");
  set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape y");
  add_op(g, op, "reshape operation");
}

/* The causal mask on scores s (b × h × s_q × s_kv, fp32): keeps row + s_kv − s_q ≥ column, else −∞. */
static cudnnBackendDescriptor_t causal(G *g, const CuAttnShape *a, cudnnBackendDescriptor_t s) {
  const int64_t b = a->b, h = a->hq, sq = a->sq, skv = a->skv;
  cudnnBackendDescriptor_t row = virt(g, CUDNN_DATA_INT32, b, h, sq, skv), col = virt(g, CUDNN_DATA_INT32, b, h, sq, skv);
  pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, s, NULL, NULL, row);
  pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, s, NULL, NULL, col);
  if (skv != sq) { /* bottom-right: row + s_kv − s_q */
    cudnnBackendDescriptor_t r1 = virt(g, CUDNN_DATA_INT32, b, h, sq, skv), r2 = virt(g, CUDNN_DATA_INT32, b, h, sq, skv);
    pw(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, 3, row, scalar(g, U_SKV, CUDNN_DATA_INT32), NULL, r1);
    pw(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_INT32, 3, r1, scalar(g, U_SQ, CUDNN_DATA_INT32), NULL, r2);
    row = r2;
  }
  cudnnBackendDescriptor_t keep = virt(g, CUDNN_DATA_BOOLEAN, b, h, sq, skv), out = virt(g, CUDNN_DATA_FLOAT, b, h, sq, skv);
  pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
  pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, scalar(g, U_NINF, CUDNN_DATA_FLOAT), keep, out);
  return out;
}

/* The strided views: Q (b, h_q, s_q, d_qk), Kᵀ (b, h_kv, d_qk, s_kv), V (b, h_kv, s_kv, d_v), O and dO
 * (b, h_q, s_q, d_v), K (b, h_kv, s_kv, d_qk), Vᵀ (b, h_kv, d_v, s_kv); the statistics (b, h_q, s_q, 1). */
static cudnnBackendDescriptor_t view(G *g, int64_t uid, const CuAttnShape *a, char which) {
  const CuAttnView *v = which == 'q' ? &a->q : which == 'o' ? &a->o : which == 'v' || which == 'V' ? &a->v : &a->k;
  int64_t h = which == 'q' || which == 'o' ? a->hq : a->hkv, s = which == 'q' || which == 'o' ? a->sq : a->skv;
  int64_t d = which == 'o' || which == 'v' || which == 'V' ? a->dv : a->dqk;
  int64_t dim[4] = {a->b, h, s, d}, str[4] = {v->batch, v->head, v->token, 1};
  if (which == 'K' || which == 'V') { /* transposed */
    dim[2] = d, dim[3] = s, str[2] = 1, str[3] = v->token;
  }
  return tensor(g, uid, CUDNN_DATA_BFLOAT16, dim, str, 0);
}
static cudnnBackendDescriptor_t stats(G *g, int64_t uid, const CuAttnShape *a) {
  const int64_t dim[4] = {a->b, a->hq, a->sq, 1}, str[4] = {a->hq * a->sq, a->sq, 1, 1};
  return tensor(g, uid, CUDNN_DATA_FLOAT, dim, str, 0);
}

/* The forward: O = softmax(mask(scale · Q Kᵀ)) V, Stats = the rows' log-sum-exp. */
static void graph_forward(G *g, const CuAttnShape *a) {
  const int64_t b = a->b, h = a->hq, sq = a->sq, skv = a->skv;
  const cudnnDataType_t F = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t q = view(g, U_Q, a, 'q'), kt = view(g, U_K, a, 'K'), v = view(g, U_V, a, 'v');
  cudnnBackendDescriptor_t o = view(g, U_O, a, 'o'), st = stats(g, U_STATS, a);
  cudnnBackendDescriptor_t s = virt(g, F, b, h, sq, skv), ss = virt(g, F, b, h, sq, skv);
  mm(g, q, kt, s);
  pw(g, CUDNN_POINTWISE_MUL, F, -1, s, scalar(g, U_SCALE, F), NULL, ss);
  cudnnBackendDescriptor_t m = causal(g, a, ss);
  cudnnBackendDescriptor_t mx = virt(g, F, b, h, sq, 1), d = virt(g, F, b, h, sq, skv), e = virt(g, F, b, h, sq, skv);
  cudnnBackendDescriptor_t sum = virt(g, F, b, h, sq, 1), lg = virt(g, F, b, h, sq, 1);
  cudnnBackendDescriptor_t p = virt(g, CUDNN_DATA_BFLOAT16, b, h, sq, skv);
  red(g, CUDNN_REDUCE_TENSOR_MAX, m, mx);
  pw(g, CUDNN_POINTWISE_SUB, F, -1, m, mx, NULL, d);
  pw(g, CUDNN_POINTWISE_EXP, F, -1, d, NULL, NULL, e);
  red(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
  pw(g, CUDNN_POINTWISE_LOG, F, -1, sum, NULL, NULL, lg);
  pw(g, CUDNN_POINTWISE_ADD, F, -1, mx, lg, NULL, st);
  pw(g, CUDNN_POINTWISE_DIV, F, -1, e, sum, NULL, p);
  mm(g, p, v, o);
}

/* The backward: P = exp(mask(scale · Q Kᵀ) − Stats), dV = Pᵀ dO, dS = scale · P ∘ (dO Vᵀ − Σ dO∘O),
 * dK = dSᵀ Q, dQ = dS K (accumulated in fp32); with GQA dK and dV summed over each KV head's group. */
static void graph_backward(G *g, const CuAttnShape *a) {
  const int64_t b = a->b, h = a->hq, sq = a->sq, skv = a->skv, dqk = a->dqk, dv = a->dv;
  const cudnnDataType_t F = CUDNN_DATA_FLOAT, BF = CUDNN_DATA_BFLOAT16;
  cudnnBackendDescriptor_t q = view(g, U_Q, a, 'q'), kt = view(g, U_K, a, 'K'), vt = view(g, U_V, a, 'V');
  cudnnBackendDescriptor_t o = view(g, U_O, a, 'o'), dout = view(g, U_DO, a, 'o'), st = stats(g, U_STATS, a);
  cudnnBackendDescriptor_t dq = view(g, U_DQ, a, 'q'), dk = view(g, U_DK, a, 'k'), dvv = view(g, U_DV, a, 'v');
  /* Σ dO ∘ O per row, into the runtime's delta */
  const int64_t tdim[4] = {b, h, sq, dv}, tstr[4] = {h * sq * dv, sq * dv, h * dv, 1};
  cudnnBackendDescriptor_t t = tensor(g, 0, F, tdim, tstr, 0), r = virt(g, F, b, h, sq, 1);
  cudnnBackendDescriptor_t delta = stats(g, U_DELTA, a);
  pw(g, CUDNN_POINTWISE_MUL, F, -1, dout, o, NULL, t);
  red(g, CUDNN_REDUCE_TENSOR_ADD, t, r);
  pw(g, CUDNN_POINTWISE_MUL, F, -1, r, scalar(g, U_ONE, F), NULL, delta);
  /* P, recomputed */
  cudnnBackendDescriptor_t s = virt(g, F, b, h, sq, skv), ss = virt(g, F, b, h, sq, skv);
  cudnnBackendDescriptor_t scale = scalar(g, U_SCALE, F);
  mm(g, q, kt, s);
  pw(g, CUDNN_POINTWISE_MUL, F, -1, s, scale, NULL, ss);
  cudnnBackendDescriptor_t m = causal(g, a, ss), d = virt(g, F, b, h, sq, skv), e = virt(g, F, b, h, sq, skv);
  pw(g, CUDNN_POINTWISE_SUB, F, -1, m, st, NULL, d);
  pw(g, CUDNN_POINTWISE_EXP, F, -1, d, NULL, NULL, e);
  /* dV = Pᵀ dO (per query head, then summed over the group) */
  const int64_t tdim2[4] = {b, h, skv, sq}, tstr2[4] = {h * sq * skv, sq * skv, 1, skv};
  cudnnBackendDescriptor_t pt = tensor(g, 0, BF, tdim2, tstr2, 0);
  reshape(g, e, pt);
  if (a->hq == a->hkv) mm(g, pt, dout, dvv);
  else {
    cudnnBackendDescriptor_t full = virt(g, BF, b, h, skv, dv);
    mm(g, pt, dout, full);
    red(g, CUDNN_REDUCE_TENSOR_ADD, full, dvv);
  }
  /* dS */
  cudnnBackendDescriptor_t dp = virt(g, F, b, h, sq, skv), dp1 = virt(g, F, b, h, sq, skv);
  cudnnBackendDescriptor_t dp2 = virt(g, F, b, h, sq, skv), ds = virt(g, F, b, h, sq, skv);
  mm(g, dout, vt, dp);
  pw(g, CUDNN_POINTWISE_SUB, F, -1, dp, delta, NULL, dp1);
  pw(g, CUDNN_POINTWISE_MUL, F, -1, dp1, e, NULL, dp2);
  pw(g, CUDNN_POINTWISE_MUL, F, -1, dp2, scale, NULL, ds);
  /* dK = dSᵀ Q */
  cudnnBackendDescriptor_t dst = tensor(g, 0, BF, tdim2, tstr2, 0);
  reshape(g, ds, dst);
  if (a->hq == a->hkv) mm(g, dst, q, dk);
  else {
    cudnnBackendDescriptor_t full = virt(g, BF, b, h, skv, dqk);
    mm(g, dst, q, full);
    red(g, CUDNN_REDUCE_TENSOR_ADD, full, dk);
  }
  /* dQ = dS K, through the fp32 accumulator */
  const int64_t kdim[4] = {b, a->hkv, skv, dqk}, kstr[4] = {a->k.batch, a->k.head, a->k.token, 1};
  cudnnBackendDescriptor_t kk = tensor(g, 0, BF, kdim, kstr, 0);
  reshape(g, kt, kk);
  const int64_t adim[4] = {b, h, sq, dqk}, astr[4] = {h * sq * dqk, sq * dqk, dqk, 1};
  cudnnBackendDescriptor_t acc = tensor(g, U_DQACC, F, adim, astr, 0);
  mm(g, ds, kk, acc);
  pw(g, CUDNN_POINTWISE_IDENTITY, F, -1, acc, NULL, NULL, dq);
}

/* ---- plans: built once per shape, kept ---- */

typedef struct {
  CuAttnShape shape;
  int backward;
  cudnnBackendDescriptor_t plan;
  G g;           /* the graph's descriptors, alive with the plan */
  int64_t engine; /* cuDNN's global engine index */
  int64_t workspace;
} Plan;

static Plan plans[2 * MAX_PLANS];
static int nplans;
static cudnnHandle_t handle;
static char report[1024];

static const char *status_name(cudnnStatus_t s) { return cudnnGetErrorString(s); }

/* Shape in words, for messages: "b 1 x s_q 4096 / s_kv 4096, heads 48/16, head dims 128/128". */
static void shape_words(const CuAttnShape *a, char *buf, size_t n) {
  snprintf(buf, n, "batch %lld, s_q %lld, s_kv %lld, heads %lld/%lld, head dims %lld/%lld", (long long)a->b,
           (long long)a->sq, (long long)a->skv, (long long)a->hq, (long long)a->hkv, (long long)a->dqk, (long long)a->dv);
}

/* Builds the plan of one graph: heuristics (mode A, then the fallback list), the first engine
 * configuration whose plan finalizes. Returns 0, or -1 with the reason in err. */
static int build(Plan *p, char *err, size_t errlen) {
  G *g = &p->g;
  char sh[200];
  shape_words(&p->shape, sh, sizeof sh);
  memset(g, 0, sizeof *g);
  g->next_uid = U_VIRTUAL;
  if (p->backward) graph_backward(g, &p->shape);
  else graph_forward(g, &p->shape);
  cudnnBackendDescriptor_t og = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops, "graph operations");
  set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  fin(g, og, "operation graph");
  if (g->bad)
    return snprintf(err, errlen, "cuDNN refused the attention %s graph (%s) at %s: %s", p->backward ? "backward" : "forward",
                    sh, g->bad, status_name(g->st)), -1;
  static const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
  for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
    G h = {0};
    cudnnBackendDescriptor_t heur = make(&h, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    set(&h, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og, "heuristics graph");
    set(&h, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi], "heuristics mode");
    fin(&h, heur, "heuristics");
    int64_t n = 0;
    if (!h.bad && cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL) !=
                      CUDNN_STATUS_SUCCESS)
      n = 0;
    if (n > 8) n = 8;
    cudnnBackendDescriptor_t cfg[8];
    for (int64_t i = 0; i < n; i++) cfg[i] = make(&h, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
    int64_t got = 0;
    if (n && !h.bad &&
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfg) !=
            CUDNN_STATUS_SUCCESS)
      got = 0;
    for (int64_t i = 0; i < got && i < n; i++) {
      cudnnBackendDescriptor_t plan = NULL;
      if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS) continue;
      if (cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle) != CUDNN_STATUS_SUCCESS ||
          cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]) !=
              CUDNN_STATUS_SUCCESS ||
          cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS) {
        cudnnBackendDestroyDescriptor(plan);
        continue;
      }
      int64_t cnt = 0, ws = 0, idx = -1;
      cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &ws);
      cudnnBackendDescriptor_t eng = NULL;
      if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
        if (cudnnBackendGetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt, &eng) ==
            CUDNN_STATUS_SUCCESS)
          cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, &idx);
        cudnnBackendDestroyDescriptor(eng);
      }
      drop(&h);
      p->plan = plan, p->engine = idx, p->workspace = ws;
      return 0;
    }
    drop(&h);
  }
  return snprintf(err, errlen,
                  "cuDNN has no engine for the attention %s (%s, bf16, causal); expected a cuDNN >= 9.13 on an sm_80+ "
                  "GPU (head dims up to 256)", p->backward ? "backward" : "forward", sh), -1;
}

/* The plan of shape a (forward or backward), built on first use; aborts the job when cuDNN has
 * none or its workspace exceeds the runtime's. */
static Plan *plan_of(const CuAttnShape *a, int backward) {
  for (int i = 0; i < nplans; i++)
    if (plans[i].backward == backward && memcmp(&plans[i].shape, a, sizeof *a) == 0) return &plans[i];
  if (nplans == (int)(sizeof plans / sizeof *plans)) rt_cuda_fail("attention (cuDNN)", "more attention shapes than the plan cache holds");
  Plan *p = &plans[nplans];
  memset(p, 0, sizeof *p);
  p->shape = *a, p->backward = backward;
  char err[512];
  if (build(p, err, sizeof err)) rt_cuda_fail("attention (cuDNN)", err);
  size_t have = cu_attn_workspace_bytes();
  if ((size_t)p->workspace > have) {
    char sh[200];
    shape_words(a, sh, sizeof sh);
    snprintf(err, sizeof err,
             "cuDNN's attention %s engine %lld for %s needs a %lld-byte workspace, and the runtime's (shared with "
             "cuBLAS) is %zu bytes; raise cluster.reserve.cublas_workspace to at least %lld bytes",
             backward ? "backward" : "forward", (long long)p->engine, sh, (long long)p->workspace, have,
             (long long)p->workspace);
    rt_cuda_fail("attention (cuDNN)", err);
  }
  nplans++;
  size_t len = strlen(report);
  snprintf(report + len, sizeof report - len, "%s%s engine %lld (%lld B workspace)", len ? ", " : "",
           backward ? "bwd" : "fwd", (long long)p->engine, (long long)p->workspace);
  return p;
}

static void execute(Plan *p, const int64_t *uids, void **ptrs, int n, const char *what) {
  cudnnBackendDescriptor_t vp = NULL;
  cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  void *ws = cu_attn_workspace();
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(vp);
  CU_PROF_BEGIN();
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendExecute(handle, p->plan, vp);
  if (vp) cudnnBackendDestroyDescriptor(vp);
  if (s != CUDNN_STATUS_SUCCESS) rt_cuda_fail(what, status_name(s));
  if (cu.sync_each) cu_check(cudaStreamSynchronize(cu.stream), what);
  CU_PROF_END(what);
}

int cu_attn_cudnn_init(char *err, size_t errlen) {
  size_t v = cudnnGetVersion();
  if (v == 91000 || v == 91001)
    return snprintf(err, errlen, "cuDNN %zu.%zu.%zu is known-bad for attention; expected cuDNN >= 9.13 (pip install "
                    "nvidia-cudnn-cu13, or CUDA's cuDNN 9.13+)", v / 10000, v / 100 % 100, v % 100), -1;
  if (v < 91300)
    return snprintf(err, errlen, "cuDNN %zu.%zu.%zu is older than 9.13; expected cuDNN >= 9.13 (pip install "
                    "nvidia-cudnn-cu13, or CUDA's cuDNN 9.13+)", v / 10000, v / 100 % 100, v % 100), -1;
  cudnnStatus_t s = cudnnCreate(&handle);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnSetStream(handle, cu.stream);
  if (s != CUDNN_STATUS_SUCCESS) return snprintf(err, errlen, "cudnnCreate: %s", status_name(s)), -1;
  nplans = 0, report[0] = 0;
  return 0;
}

void cu_attn_cudnn_teardown(void) {
  for (int i = 0; i < nplans; i++) cudnnBackendDestroyDescriptor(plans[i].plan), drop(&plans[i].g);
  nplans = 0;
  if (handle) cudnnDestroy(handle);
  handle = NULL;
}

void cu_attn_cudnn_prepare(const CuAttnShape *a) { plan_of(a, 0), plan_of(a, 1); }

const char *cu_attn_cudnn_report(void) { return report; }

void cu_attn_cudnn_forward(const CuAttnShape *a, void *out, float *lse, const void *q, const void *k, const void *v) {
  Plan *p = plan_of(a, 0);
  float scale = (float)(1.0 / sqrt((double)a->dqk)), ninf = -INFINITY;
  int32_t skv = (int32_t)a->skv, sq = (int32_t)a->sq;
  int64_t uids[] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NINF, U_SKV, U_SQ};
  void *ptrs[] = {(void *)q, (void *)k, (void *)v, out, lse, &scale, &ninf, &skv, &sq};
  execute(p, uids, ptrs, a->skv != a->sq ? 9 : 7, "attention_forward (cuDNN)");
}

void cu_attn_cudnn_backward(const CuAttnShape *a, void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const void *out, const float *lse, float *delta,
                            float *dqacc) {
  Plan *p = plan_of(a, 1);
  float scale = (float)(1.0 / sqrt((double)a->dqk)), ninf = -INFINITY, one = 1;
  int32_t skv = (int32_t)a->skv, sq = (int32_t)a->sq;
  int64_t uids[] = {U_Q, U_K, U_V, U_O, U_DO, U_STATS, U_DQ, U_DK, U_DV, U_DELTA, U_DQACC, U_SCALE, U_NINF, U_ONE, U_SKV, U_SQ};
  void *ptrs[] = {(void *)q, (void *)k, (void *)v, (void *)out, (void *)dout, (void *)lse, dq, dk, dv, delta, dqacc,
                  &scale, &ninf, &one, &skv, &sq};
  execute(p, uids, ptrs, a->skv != a->sq ? 16 : 14, "attention_backward (cuDNN)");
}
