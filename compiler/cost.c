/* cost.c — the step-time model of a candidate plan.
 *
 * Kernels: each op's forward and backward seconds come from cost_kernel.c (GEMMs with their
 * shapes, flash attention, memory-bound work by the bytes the stack's kernels move).
 * Collectives: ring cost, bytes × (g − 1) / g over the group's bus bandwidth (group_bw: NVLink
 * inside a node; between nodes the NICs of the group's GPUs in a node, one ring per rail) ×
 * network efficiency (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms", 2009; NCCL's
 * busbw convention).
 * Overlap: a two-stream simulation per pass — the all-gather of layer i+depth runs while layer
 * i computes, once a gathered buffer is free; the MoE all-to-all runs on the compute stream
 * (exposed). Offload copies overlap compute layer by layer on NVLink-C2C. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "mtc.h"

/* Per-GPU bandwidth of a group of g ranks, `stride` apart, in bytes/s. Inside a node it
 * depends on the node's topology (cluster.links.topology): in a point-to-point mesh (a GH200
 * node: an NVLink 4 link between every pair) a GPU drives its g − 1 pair links to the group
 * at once (NCCL runs several rings; an all-to-all sends to every peer in parallel), g − 1 ×
 * links.nvlink; behind an NVSwitch every GPU reaches every other through the switch at its
 * full NVLink bandwidth, links.nvlink whatever g. Between nodes NCCL runs one ring per channel,
 * the channels spread over the node's NICs (rails): each ring crosses each node boundary once,
 * on one NIC, and carries its share of the data, so the m GPUs of the group in a node send their
 * node's inter-node traffic over m NICs at once while the rings' hops inside the node ride
 * NVLink: the bus bandwidth is min(m × links.internode, the node's NVLink bandwidth as above). Measured: NCCL all-reduce
 * busbw about 350 GB/s over 248 nodes of 8 H200 with 8 × 400 Gb/s NICs (NVIDIA/nccl-tests
 * issue 283), all-gather about 200 GB/s over 32 nodes of 8 H100 (NVIDIA/nccl issue 1218), against
 * 50 GB/s for one NIC; the fidelity rows of 32 to 128 GPUs (tests/specs/fidelity) agree. */
static double group_bw(const Spec *s, int64_t g, int64_t stride) {
  const ClusterSpec *c = &s->cluster;
  if (g * stride > c->gpus_per_node) {
    int64_t m = stride < c->gpus_per_node ? c->gpus_per_node / stride : 1; /* the group's GPUs in a node */
    double ib = (double)m * c->links.internode;
    double nv = (c->links.topology == TOPO_NVSWITCH || m < 3 ? 1 : (double)(m - 1)) * c->links.nvlink;
    return (ib < nv ? ib : nv) * c->efficiency.network;
  }
  double links = c->links.topology == TOPO_NVSWITCH ? 1 : (double)(g > 1 ? g - 1 : 1);
  return links * c->links.nvlink * c->efficiency.network;
}

static double ring(double bytes, int64_t g, double bw) {
  return g > 1 ? bytes * (double)(g - 1) / (double)g / bw : 0;
}

/* An all-to-all over ep consecutive ranks (the EP group: inside one node, or ep / gpus_per_node
 * whole nodes). Each rank sends `bytes`, 1/ep of it to each rank of the group (uniform routing;
 * the imbalance is already in bytes). Of the ep − 1 peers, l = min(ep, gpus_per_node) − 1 are
 * in the node and r = ep − min(ep, gpus_per_node) are not; the two shares travel at once on
 * different links, so
 *   t = max( bytes·l/ep / (l · nvlink · eff),  bytes·r/ep / (internode · eff) )
 * — NVLink: one pair link per peer, all driven in parallel (NCCL's all-to-all posts every
 * send/recv at once); between nodes: the GPU's share of the InfiniBand rails. This is the
 * link-by-link bound of a flat all-to-all (DeepSeek-V3 technical report, arXiv:2412.19437,
 * §3.2.2: the cross-node dispatch is limited by IB, NVLink carrying the intra-node part).
 * eff is efficiency.all_to_all (default: network). Inside a node (r = 0) with the default it
 * equals ring(bytes, ep, group_bw(ep)) as before. */
double cost_all_to_all(const Spec *s, double bytes, int64_t ep) {
  if (ep <= 1) return 0;
  const ClusterSpec *c = &s->cluster;
  int64_t in_node = ep < c->gpus_per_node ? ep : c->gpus_per_node;
  double e = c->efficiency.all_to_all > 0 ? c->efficiency.all_to_all : c->efficiency.network;
  double l = (double)(in_node - 1), r = (double)(ep - in_node);
  double t_nv = l > 0 ? bytes * l / (double)ep / (l * c->links.nvlink * e) : 0;
  double t_ib = r > 0 ? bytes * r / (double)ep / (c->links.internode * e) : 0;
  return t_nv > t_ib ? t_nv : t_ib;
}

/* The hierarchical exchange of an EP group over N = ep / gpus_per_node whole nodes (g GPUs
 * each), DeepSeek-V3's dispatch (arXiv:2412.19437, §3.2.2): a token goes over InfiniBand once to
 * each other node that holds at least one of its top_k experts — to the GPU with the sender's
 * local index there — and is forwarded over NVLink to the GPUs of that node holding its experts
 * (the combine sums inside the node before crossing back: the same bytes the other way).
 * Per token copy (bytes / k each) InfiniBand carries
 *   ib = bytes / k · cost_remote_nodes(…)            (flat: bytes · (ep − g) / ep)
 * and NVLink the copies not for the receiving GPU itself, (g − 1)/g of the k, over g − 1 pair
 * links: nv = bytes · (g − 1) / g. The two stages are pipelined (NVLink forwards while
 * InfiniBand receives), so t = max(ib / (internode · eff), nv / ((g − 1) · nvlink · eff)). */
double cost_remote_nodes(const Spec *s, int64_t ep, int64_t top_k) {
  int64_t g = s->cluster.gpus_per_node, nodes = ep / g, ng = s->model.moe.n_group, tg = s->model.moe.topk_group;
  double N = (double)nodes, k = (double)top_k;
  if (ep <= g || top_k < 1) return 0;
  double uniform = (N - 1) * (1 - pow(1 - 1 / N, k)), limited = uniform;
  if (ng > 1 && tg < ng && ep % g == 0 && ng % nodes == 0) {
    /* each node holds G = n_group / N whole groups: it is touched only if one of them is among
     * the topk_group chosen, P = 1 − C(n_group − G, topk_group) / C(n_group, topk_group) */
    int64_t G = ng / nodes;
    double none = 1; /* C(ng − G, tg) / C(ng, tg) = Π_{i<tg} (ng − G − i) / (ng − i) */
    for (int64_t i = 0; i < tg; i++) none *= ng - G - i > 0 ? (double)(ng - G - i) / (double)(ng - i) : 0;
    limited = (N - 1) * (1 - none);
  } else if (ng > 1 && tg < ng && ep % g == 0 && nodes % ng == 0) {
    /* each group spans N / n_group nodes: the top_k experts fall on the M = topk_group · N /
     * n_group nodes of the chosen groups (the sender's own among them with probability M / N) */
    double M = (double)tg * N / (double)ng;
    limited = M * (1 - 1 / N) * (1 - pow(1 - 1 / M, k));
  }
  return limited < uniform ? limited : uniform;
}

double cost_all_to_all_hier(const Spec *s, double bytes, int64_t ep, int64_t top_k) {
  const ClusterSpec *c = &s->cluster;
  int64_t g = c->gpus_per_node;
  if (ep <= g || top_k < 1) return cost_all_to_all(s, bytes, ep);
  double e = c->efficiency.all_to_all > 0 ? c->efficiency.all_to_all : c->efficiency.network;
  double k = (double)top_k;
  double ib = bytes / k * cost_remote_nodes(s, ep, top_k);
  double t_ib = ib / (c->links.internode * e);
  double t_nv = g > 1 ? bytes * (double)(g - 1) / (double)g / ((double)(g - 1) * c->links.nvlink * e) : 0;
  return t_ib > t_nv ? t_ib : t_nv;
}

void cost_layer(const Model *md, const Choice *ch, int l, LayerTime *t) {
  const Spec *s = md->spec;
  const Layer *ly = &md->layers[l];
  const int64_t cp = plan_cp(ch);
  /* per rank: micro_batch x seq_len / cp tokens; the attention's causal work is the mean rank's
   * (cost_op prices T queries against seq keys at half density): with the load-balanced chunks of
   * c tokens, rank r's chunks r and 2 cp - 1 - r see (r + 1/2) c + (2 cp - 1 - r + 1/2) c = 2 cp c
   * keys per query pair, every rank the same */
  double seq = (double)s->training.seq_len, T = (double)ch->micro_batch * seq / (double)cp;
  *t = (LayerTime){0};
  double attn_fwd = 0, attn_bwd = 0;
  /* the routed experts' GEMMs run on the busiest EP rank's rows: moe_imbalance x the mean */
  double imbalance = plan_moe_imbalance(s, ch->ep);
  for (int i = ly->first_op; i < ly->first_op + ly->nops; i++) {
    OpTime o = cost_op(s, md, &md->ops[i], T, seq, ch->ep, imbalance);
    OpKind k = md->ops[i].kind;
    if (k == OP_ATTN_CORE) attn_fwd += o.fwd, attn_bwd += o.bwd;
    if (k >= OP_QKV && k <= OP_ATTN_OUT) t->attn_fwd += o.fwd, t->attn_bwd += o.bwd;
    if (k == OP_MLP || (k >= OP_ROUTER && k <= OP_COMBINE)) t->ffn_fwd += o.fwd, t->ffn_bwd += o.bwd;
    t->fwd += o.fwd;
    t->bwd += o.bwd;
    if (plan_recomputes(ch->ac, k)) t->recompute += o.fwd;
    /* the hierarchical all-to-all's backward needs the experts' outputs at their owner (the routing
     * weights' gradient; emit_moe.c): a recomputed forward leaves them there, else the experts'
     * forward runs again */
    if (k == OP_EXPERTS && ch->ep > 1 && plan_hier(s, ch) && !plan_recomputes(ch->ac, OP_EXPERTS))
      t->bwd += o.fwd, t->ffn_bwd += o.fwd;
  }
  if (ly->kind == LAYER_MOE && ch->ep > 1) {
    /* dispatch and combine: the token copies that leave the rank, on the links they cross */
    double b = T * (double)s->model.moe.top_k * (double)s->model.hidden * 2 * plan_moe_imbalance(s, ch->ep);
    double one = ch->dispatch == DISPATCH_HIERARCHICAL ? cost_all_to_all_hier(s, b, ch->ep, s->model.moe.top_k)
                                                       : cost_all_to_all(s, b, ch->ep);
    t->a2a_fwd = 2 * one;
    t->a2a_bwd = 2 * one + (ch->ac == AC_NONE ? 0 : 2 * one); /* recompute re-dispatches */
  }
  double wire = s->training.grad_reduce_dtype == WIRE_BF16 ? 1.0 : 2.0; /* vs bf16 */
  if (cp > 1) {
    /* K/V over the cp group (cp consecutive ranks: NVLink inside a node, InfiniBand when the
     * group spans nodes): each rank all-gathers cp x its bf16 keys and values, in the forward
     * and again in the backward (one layer's gathered at a time), and reduce-scatters their
     * gradient (on the wire as the gradients are). The gather overlaps the part of the
     * attention that needs only the rank's own keys: its chunks' diagonal blocks and the late
     * chunk against the early one, 2 of the 2 cp chunk-halves of its work, 1 / cp of it (the
     * Llama 3 paper's all-gather CP, arXiv:2407.21783 §3.3.2, with that overlap); the dK/dV
     * reduce-scatter overlaps the layer's backward after the attention's (the projections'
     * weight and input gradients) */
    double kv = 2.0 * T * plan_cp_kv_elems(s, md) * (double)cp, bw = group_bw(s, cp, 1);
    t->kv_ag = ring(kv, cp, bw);
    t->kv_rs = wire * t->kv_ag;
    t->kv_fwd = fmax(0, t->kv_ag - attn_fwd / (double)cp);
    t->kv_bwd = fmax(0, t->kv_ag - attn_bwd / (double)cp) + fmax(0, t->kv_rs - (t->bwd - attn_bwd));
    /* (a recomputed forward's attention reads the backward's one gather) */
  }
  double dense = 2.0 * (double)(ly->params - ly->routed_params);
  double experts = 2.0 * (double)ly->routed_params / (double)ch->ep;
  t->ag_experts = ring(experts, ch->efsdp, group_bw(s, ch->efsdp, ch->ep));
  t->ag = ring(dense, ch->fsdp, group_bw(s, ch->fsdp, 1)) + t->ag_experts;
  t->rs = wire * t->ag;
}

/* Where a simulation records its events for timeline.json (NULL: nowhere). */
typedef struct {
  json_t *events; /* Chrome trace events */
  double t0;      /* seconds: the start of the pass being simulated */
  const int *layer; /* layer of each position of the pass */
  const double *a2a;/* the all-to-all part of each compute (own track) */
  const double *kv; /* the exposed K/V exchange part of each compute (own track; NULL: none) */
  int *flows;       /* arrows drawn so far (their ids) */
  const Model *md;
  const LayerTime *times; /* the layer times (times[rep[l]]), to split each compute into its parts */
  const int *rep;
  bool backward;
  double copy;           /* seconds of an offloaded boundary's copy (0: not offloaded) */
  const char *copy_name; /* its slice's name */
} Sink;

const char *const cost_track_names[TR__COUNT] = {
    "compute", "communication (FSDP)", "MoE all-to-all (compute stream)", "offload D2H", "offload H2D",
    "optimizer", "context-parallel K/V exchange (exposed, compute stream)"};

/* One slice on a track; cat is its category (NULL: the track's name). */
static void slice(json_t *events, int track, const char *cat, const char *name, double start, double dur, int layer) {
  if (!events || dur <= 0) return;
  json_t *e = json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i}", "name", name, "cat", cat ? cat : cost_track_names[track],
                        "ph", "X", "ts", start * 1e6, "dur", dur * 1e6, "pid", 0, "tid", track);
  if (layer >= 0) json_object_set_new(e, "args", json_pack("{s:i}", "layer", layer));
  json_array_append_new(events, e);
}

static void event(json_t *events, int track, const char *name, double start, double dur, int layer) {
  slice(events, track, NULL, name, start, dur, layer);
}

/* Layer l's kernels of one pass, dur seconds from start, as consecutive slices by category:
 * forward: attention, experts (or MLP), the rest (norms, residuals); backward: the recomputed
 * forward first, then the same three. The slices add up to dur. */
static void compute_parts(const Sink *sk, int l, double start, double dur) {
  const LayerTime *t = &sk->times[sk->rep[l]];
  bool moe = sk->md->layers[l].kind == LAYER_MOE;
  const char *ffn = moe ? "experts" : "mlp";
  double re = sk->backward ? t->recompute : 0;
  double attn = sk->backward ? t->attn_bwd : t->attn_fwd, f = sk->backward ? t->ffn_bwd : t->ffn_fwd;
  const char *dir = sk->backward ? "backward" : "forward";
  char a[40], b[40], c[40];
  snprintf(a, sizeof a, "attention %s", dir);
  snprintf(b, sizeof b, "%s %s", moe ? "experts" : "MLP", dir);
  snprintf(c, sizeof c, "norms, residuals %s", dir);
  double x = sk->t0 + start;
  slice(sk->events, TR_COMPUTE, "recompute", "recompute (forward again)", x, re, l);
  slice(sk->events, TR_COMPUTE, "attention", a, x + re, attn, l);
  slice(sk->events, TR_COMPUTE, ffn, b, x + re + attn, f, l);
  slice(sk->events, TR_COMPUTE, "other", c, x + re + attn + f, dur - re - attn - f, l);
}

/* An arrow in the trace from the end of a gather to the compute that waited for it (Chrome
 * trace flow events: "s" inside the gather's slice, "f" bound to the enclosing compute slice). */
static void flow(json_t *events, int id, double from, double to) {
  json_array_append_new(events, json_pack("{s:s, s:s, s:s, s:i, s:f, s:i, s:i}", "name", "waits for", "cat", "dependency",
                                          "ph", "s", "id", id, "ts", from * 1e6 - 0.5, "pid", 0, "tid", TR_COMM));
  json_array_append_new(events, json_pack("{s:s, s:s, s:s, s:s, s:i, s:f, s:i, s:i}", "name", "waits for", "cat",
                                          "dependency", "ph", "f", "bp", "e", "id", id, "ts", to * 1e6 + 0.5, "pid", 0,
                                          "tid", TR_COMPUTE));
}

/* One pass over n layers in execution order on two streams. Compute of layer i waits for its
 * all-gather ag[i]; there are depth + 1 gathered buffers, so the all-gather of layer
 * i + depth + 1 is issued when layer i's compute ends, followed on the same comm stream by
 * layer i's reduce-scatter rs[i] (backward; rs NULL in forward). Returns the time until both
 * streams are idle: the last reduce-scatter is exposed. */
static double simulate(const double *ag, const double *rs, const double *compute, int n, int depth, Mem *m,
                       const Sink *sk) {
  double *ready = mem_array(m, (size_t)n, sizeof *ready), *issued = mem_array(m, (size_t)n, sizeof *issued);
  double comm_free = 0, compute_free = 0;
  for (int j = 0; j <= depth && j < n; j++) issued[j] = comm_free, ready[j] = comm_free += ag[j];
  for (int i = 0; i < n; i++) {
    bool waited = ready[i] > compute_free; /* the compute stream idles until the gather ends */
    double start = waited ? ready[i] : compute_free, end = start + compute[i];
    compute_free = end;
    if (i + depth + 1 < n) {
      issued[i + depth + 1] = comm_free > end ? comm_free : end;
      ready[i + depth + 1] = comm_free = issued[i + depth + 1] + ag[i + depth + 1];
    }
    double rs_start = comm_free > end ? comm_free : end;
    if (rs) comm_free = rs_start + rs[i];
    if (sk && sk->events) {
      int l = sk->layer[i];
      double a = sk->a2a[i], kv = sk->kv ? sk->kv[i] : 0;
      if (waited && ag[i] > 0) flow(sk->events, ++*sk->flows, sk->t0 + ready[i], sk->t0 + start);
      event(sk->events, TR_COMM, "all-gather", sk->t0 + issued[i], ag[i], l);
      compute_parts(sk, l, start, compute[i] - a - kv);
      /* an offloaded boundary goes out when its layer's forward ends and is back when its
       * backward (recompute first) starts, overlapped with the neighbours' compute */
      if (sk->backward) event(sk->events, TR_H2D, sk->copy_name, fmax(0, sk->t0 + start - sk->copy), sk->copy, l);
      else event(sk->events, TR_D2H, sk->copy_name, sk->t0 + end, sk->copy, l);
      event(sk->events, TR_CP, "K/V exchange", sk->t0 + end - a - kv, kv, l);
      event(sk->events, TR_A2A, "all-to-all", sk->t0 + end - a, a, l);
      if (rs) event(sk->events, TR_COMM, "reduce-scatter", sk->t0 + rs_start, rs[i], l);
    }
  }
  return comm_free > compute_free ? comm_free : compute_free;
}

/* Seconds per step to bring the gradient shard to host memory when it lives there (host
 * optimizer tier): each of the A micro-batches' reduce-scattered bf16 shards crosses NVLink-C2C
 * (2 B per parameter, c2c bytes/s) and lands in the fp32 shard in host memory, the first by a
 * conversion (read 2, write 4 B), the others by accumulation (read 2 + 4, write 4 B), at
 * host_bw bytes/s. Exposed: conservative, it could overlap the next micro-batch. */
double cost_host_grad(double shard, double A, bool on_host, double c2c, double host_bw) {
  if (!on_host) return 0;
  return shard * (A * 2 / c2c + (6 + 10 * (A - 1)) / host_bw);
}

/* A placement depends on the graph, fsdp and ep only, so the search's candidates share one
 * per (graph, fsdp, ep) in a small memo. */
double cost_ns_flops_busiest(const Model *md, const Choice *ch, double *moving_experts) {
  enum { MEMO = 32 };
  static struct { const Op *ops; int nops; double ns_flops; int64_t fsdp, ep; double v, mx; } memo[MEMO];
  static int next;
  for (int i = 0; i < MEMO; i++)
    if (memo[i].ops == md->ops && memo[i].nops == md->nops && memo[i].ns_flops == md->ns_flops &&
        memo[i].fsdp == ch->fsdp && memo[i].ep == ch->ep) {
      if (moving_experts) *moving_experts = memo[i].mx;
      return memo[i].v;
    }
  double r = (double)md->muon_max_rows, cc = (double)md->muon_max_cols;
  double v = fmax(md->ns_flops / (double)ch->fsdp, 5 * (4 * r * r * cc + 2 * r * r * r));
  /* split expert matrices (flat expert groups): the placement's count, or for groups too large to
   * list every routed Muon matrix of an EP rank */
  const Spec *s = md->spec;
  int64_t El = s->model.moe.present ? s->model.moe.experts / ch->ep : 0;
  double mx = !plan_expert_per(El, ch->efsdp) && ch->efsdp > 1
                  ? (double)(md->muon_params - md->muon_dense_params) / (double)ch->ep : 0;
  PlanMuonSummary pl = plan_muon_summary(md, ch); /* (one placement with the memory items') */
  if (pl.listed) v = pl.ns_flops_max_rank, mx = pl.moving_expert_params;
  if (moving_experts) *moving_experts = mx;
  memo[next].ops = md->ops, memo[next].nops = md->nops, memo[next].ns_flops = md->ns_flops;
  memo[next].fsdp = ch->fsdp, memo[next].ep = ch->ep, memo[next].v = v, memo[next].mx = mx;
  next = (next + 1) % MEMO;
  return v;
}

static void step(const Model *md, Candidate *c, json_t *events, CostMemo *memo);

void cost_step(const Model *md, Candidate *c) { step(md, c, NULL, NULL); }
void cost_step_trace(const Model *md, Candidate *c, void *trace) { step(md, c, trace, NULL); }
void cost_step_memo(const Model *md, Candidate *c, CostMemo *memo) { step(md, c, NULL, memo); }
void cost_memo_free(CostMemo *memo) {
  mem_free(&memo->mem);
  mem_free(&memo->scratch);
  *memo = (CostMemo){0};
}

/* Whether layers a and b are priced alike by cost_layer: the same figures and the same ops
 * with the same parameter shapes (DeepSeek-V3's 58 MoE layers are one layer 58 times). */
static bool same_layer(const Model *md, int a, int b) {
  const Layer *x = &md->layers[a], *y = &md->layers[b];
  if (x->kind != y->kind || x->nops != y->nops || x->params != y->params || x->active_params != y->active_params ||
      x->routed_params != y->routed_params || x->saved_routed != y->saved_routed || x->ffn_width != y->ffn_width ||
      x->routed_width != y->routed_width || memcmp(x->saved_bytes, y->saved_bytes, sizeof x->saved_bytes) != 0)
    return false;
  for (int i = 0; i < x->nops; i++) {
    const Op *o = &md->ops[x->first_op + i], *q = &md->ops[y->first_op + i];
    if (o->kind != q->kind || strcmp(o->name, q->name) != 0 || o->nparams != q->nparams ||
        o->param_count != q->param_count || o->active_params != q->active_params ||
        o->active_matmul != q->active_matmul || o->gemm_flops != q->gemm_flops ||
        o->attn_flops_per_seq != q->attn_flops_per_seq || o->in_bytes != q->in_bytes ||
        o->out_bytes != q->out_bytes || o->nsaved != q->nsaved)
      return false;
    for (int j = 0; j < o->nparams; j++) {
      const Param *u = &o->params[j], *v = &q->params[j];
      if (u->ndim != v->ndim || u->count != v->count || u->kind != v->kind || u->matmul != v->matmul ||
          memcmp(u->shape, v->shape, sizeof u->shape) != 0)
        return false;
    }
    for (int j = 0; j < o->nsaved; j++) {
      const Saved *u = &o->saved[j], *v = &q->saved[j];
      if (u->elems != v->elems || u->dtype != v->dtype || u->cls != v->cls || u->routed != v->routed) return false;
    }
  }
  return true;
}

/* Whether a and b give the same layer times and edge ops (CostMemo's key). */
static bool same_key(const Choice *a, const Choice *b) {
  return a->micro_batch == b->micro_batch && plan_cp(a) == plan_cp(b) && a->fsdp == b->fsdp && a->ep == b->ep &&
         a->efsdp == b->efsdp && a->ac == b->ac && a->dispatch == b->dispatch;
}

/* The passes' per-layer inputs (CostMemo.lanes), nlayers each, in execution order: forward
 * gathers and compute (the exposed all-to-all and K/V exchange in it), backward gathers, compute
 * and reduce-scatters, and the all-to-all and K/V parts of each compute (for the trace). */
enum { LANE_COMM_F, LANE_COMP_F, LANE_COMM_B, LANE_COMP_B, LANE_RS_B, LANE_A2A_F, LANE_A2A_B, LANE_KV_F, LANE_KV_B,
       COST_LANES };

/* memo's work for ch's key: which layers are priced alike (once per memo), the layer times, the
 * edge ops, the lanes and their sums; kept while the key stays the same. */
static void key_work(const Model *md, const Choice *ch, CostMemo *memo) {
  const Spec *s = md->spec;
  const int L = md->nlayers;
  if (!memo->rep) { /* layers priced alike are priced once: rep[l] is the first layer like l */
    memo->rep = mem_array(&memo->mem, (size_t)L + 1, sizeof *memo->rep);
    memo->times = mem_array(&memo->mem, (size_t)L + 1, sizeof *memo->times);
    memo->lanes = mem_array(&memo->mem, (size_t)COST_LANES * (size_t)L + 1, sizeof *memo->lanes);
    for (int l = 0; l < L; l++) {
      memo->rep[l] = l;
      for (int j = 0; j < l; j++)
        if (memo->rep[j] == j && same_layer(md, j, l)) {
          memo->rep[l] = j;
          break;
        }
    }
  }
  if (memo->valid && same_key(&memo->key, ch)) return;
  const int *rep = memo->rep;
  LayerTime *times = memo->times;
  double *lane[COST_LANES];
  for (int k = 0; k < COST_LANES; k++) lane[k] = memo->lanes + (size_t)k * (size_t)L;
  double compute = 0, recompute = 0, a2a = 0, comm_total = 0, kvx = 0;
  for (int l = 0; l < L; l++) {
    if (rep[l] == l) cost_layer(md, ch, l, &times[l]);
    LayerTime t = times[rep[l]];
    lane[LANE_COMM_F][l] = t.ag;
    lane[LANE_COMP_F][l] = t.fwd + t.a2a_fwd + t.kv_fwd;
    lane[LANE_COMM_B][L - 1 - l] = t.ag; /* FSDP re-gathers for backward, then reduce-scatters */
    lane[LANE_RS_B][L - 1 - l] = t.rs;
    lane[LANE_COMP_B][L - 1 - l] = t.bwd + t.recompute + t.a2a_bwd + t.kv_bwd;
    lane[LANE_KV_F][l] = t.kv_fwd, lane[LANE_KV_B][L - 1 - l] = t.kv_bwd, kvx += t.kv_fwd + t.kv_bwd;
    lane[LANE_A2A_F][l] = t.a2a_fwd, lane[LANE_A2A_B][L - 1 - l] = t.a2a_bwd;
    compute += t.fwd + t.bwd + t.recompute;
    recompute += t.recompute;
    a2a += t.a2a_fwd + t.a2a_bwd;
    comm_total += 2 * t.ag + t.rs;
  }
  /* embedding, final norm, LM head and loss: outside the layer pipeline */
  const double seq = (double)s->training.seq_len, T = (double)ch->micro_batch * seq / (double)plan_cp(ch);
  double edge = 0;
  for (int i = 0; i < md->nops; i++)
    if (md->ops[i].layer < 0) {
      OpTime o = cost_op(s, md, &md->ops[i], T, seq, 1, 1);
      edge += o.fwd + o.bwd;
    }
  memo->compute = compute, memo->recompute = recompute, memo->a2a = a2a, memo->comm_total = comm_total;
  memo->kvx = kvx, memo->edge = edge;
  memset(memo->has_offload, 0, sizeof memo->has_offload);
  memo->npasses = 0;
  memo->key = *ch, memo->valid = true;
}

/* Offloaded boundaries travel over NVLink-C2C to host memory, or to NVMe at its bandwidth (through
 * host memory: the slower of the two): seconds per boundary copy under ch's offload policy. */
static double boundary_copy(const Spec *s, const Choice *ch) {
  const ClusterSpec *cl = &s->cluster;
  double c2c = cl->links.c2c * cl->efficiency.c2c;
  double off_bw = ch->offload == OFF_NVME ? fmin(c2c, cl->nvme.bandwidth) : c2c;
  double T = (double)ch->micro_batch * (double)s->training.seq_len / (double)plan_cp(ch);
  return 2.0 * (double)s->model.hidden * T / off_bw;
}

/* One micro-batch's exposed offload under ch's policy: each boundary copied out after its layer's
 * forward and back before its backward, hidden behind that compute (memo's key work done). */
static double offload_exposed(const Model *md, const Choice *ch, CostMemo *memo) {
  int o = (int)ch->offload;
  if (memo->has_offload[o]) return memo->offload[o];
  double offload = 0;
  if (ch->offload != OFF_NONE) {
    double copy = boundary_copy(md->spec, ch);
    for (int l = 0; l < md->nlayers; l++) {
      LayerTime t = memo->times[memo->rep[l]];
      offload += fmax(0, copy - t.fwd) + fmax(0, copy - t.bwd - t.recompute);
    }
  }
  memo->has_offload[o] = true;
  return memo->offload[o] = offload;
}

/* Simulates ch's passes over memo's lanes (key work done) into *out; with events, records the
 * first micro-batch's, its forward from emb_ag, its backward after the edge ops. */
static void simulate_passes(const Model *md, const Choice *ch, CostMemo *memo, json_t *events, double emb_ag,
                            int *flows, CostPasses *out) {
  const int L = md->nlayers;
  Mem *m = &memo->scratch;
  mem_reset(m);
  const double *lane[COST_LANES];
  for (int k = 0; k < COST_LANES; k++) lane[k] = memo->lanes + (size_t)k * (size_t)L;
  const double *comm_f = lane[LANE_COMM_F], *comp_f = lane[LANE_COMP_F], *comm_b = lane[LANE_COMM_B];
  const double *comp_b = lane[LANE_COMP_B], *rs_b = lane[LANE_RS_B];
  /* reshard per group: what a micro-batch after the first gathers (forward, and backward of
   * every micro-batch), the groups kept gathered left out */
  const bool keep_d = ch->reshard == RESHARD_AFTER_STEP, keep_e = ch->reshard_experts == RESHARD_AFTER_STEP;
  const bool keep = keep_d || keep_e;
  double *again_f = mem_array(m, (size_t)L + 1, sizeof(double)), *again_b = mem_array(m, (size_t)L + 1, sizeof(double));
  int *order_f = mem_array(m, (size_t)L + 1, sizeof(int)), *order_b = mem_array(m, (size_t)L + 1, sizeof(int));
  for (int l = 0; l < L; l++) {
    LayerTime t = memo->times[memo->rep[l]];
    again_f[l] = again_b[L - 1 - l] = (keep_d ? 0 : t.ag - t.ag_experts) + (keep_e ? 0 : t.ag_experts);
    order_f[l] = l, order_b[L - 1 - l] = l;
  }
  double comm_total = memo->comm_total;
  if (keep) /* the backward re-gathers only again_b: comm_total is then Σ (ag + again + rs) */
    for (int l = 0; l < L; l++) comm_total -= comm_b[l] - again_b[l];
  /* one micro-batch: embedding/head gathers, forward pass, head and loss, backward pass */
  double copy = events && ch->offload != OFF_NONE ? boundary_copy(md->spec, ch) : 0;
  bool nvme = ch->offload == OFF_NVME;
  Sink fwd = {events, emb_ag, order_f, lane[LANE_A2A_F], lane[LANE_KV_F], flows, md, memo->times,
              memo->rep, false, copy, nvme ? "boundary to NVMe" : "boundary to host"};
  double pass_f = simulate(comm_f, NULL, comp_f, L, ch->prefetch, m, &fwd);
  Sink bwd = {events, emb_ag + pass_f + memo->edge, order_b, lane[LANE_A2A_B], lane[LANE_KV_B], flows,
              md, memo->times, memo->rep, true, copy, nvme ? "boundary from NVMe" : "boundary from host"};
  double pass = pass_f + simulate(keep ? again_b : comm_b, rs_b, comp_b, L, ch->prefetch, m, &bwd);
  /* the later micro-batches: the same, or gathering only the groups not kept */
  double pass_rest = keep ? simulate(again_f, NULL, comp_f, L, ch->prefetch, m, NULL) +
                                simulate(again_b, rs_b, comp_b, L, ch->prefetch, m, NULL)
                          : pass;
  double ag_once = 0; /* after_step: the kept groups' forward gathers, once per step */
  for (int l = 0; keep && l < L; l++) ag_once += comm_f[l] - again_f[l];
  *out = (CostPasses){keep_d, keep_e, ch->prefetch, pass_f, pass, pass_rest, ag_once, comm_total};
}

/* ch's passes: simulated once per reshard pair and prefetch depth of memo's key. */
static CostPasses passes(const Model *md, const Choice *ch, CostMemo *memo) {
  const bool keep_d = ch->reshard == RESHARD_AFTER_STEP, keep_e = ch->reshard_experts == RESHARD_AFTER_STEP;
  int n = memo->npasses < COST_PASSES ? memo->npasses : COST_PASSES;
  for (int i = 0; i < n; i++) {
    const CostPasses *x = &memo->passes[i];
    if (x->keep_d == keep_d && x->keep_e == keep_e && x->depth == ch->prefetch) return *x;
  }
  CostPasses x;
  simulate_passes(md, ch, memo, NULL, 0, NULL, &x);
  memo->passes[memo->npasses++ % COST_PASSES] = x;
  return x;
}

static void step(const Model *md, Candidate *c, json_t *events, CostMemo *memo) {
  const Spec *s = md->spec;
  const Choice *ch = &c->ch;
  const ClusterSpec *cl = &s->cluster;
  const EfficiencySpec *e = &cl->efficiency;
  const double seq = (double)s->training.seq_len;
  CostMemo local = {0};
  if (!memo) memo = &local;
  key_work(md, ch, memo);
  double compute = memo->compute, recompute = memo->recompute, a2a = memo->a2a, kvx = memo->kvx;
  double offload = offload_exposed(md, ch, memo), edge = memo->edge;
  double c2c = cl->links.c2c * e->c2c;
  const bool keep_d = ch->reshard == RESHARD_AFTER_STEP, keep_e = ch->reshard_experts == RESHARD_AFTER_STEP;
  compute += edge;
  /* embedding and LM head: gathered for forward and again for backward, their gradients
   * reduce-scattered; counted as exposed (they bracket the layer pipeline) */
  double wire_rs = s->training.grad_reduce_dtype == WIRE_BF16 ? 1.0 : 2.0;
  double emb_one = ring(2.0 * (double)(md->by_kind_total[PK_EMBEDDING] + md->by_kind_total[PK_HEAD]), ch->fsdp,
                        group_bw(s, ch->fsdp, 1));
  /* reshard after_step keeps what the first micro-batch's forward gathered until the
   * optimizer step: its backward and every later micro-batch gather only the groups not kept
   * (again_f, again_b; their gradients are still reduce-scattered per micro-batch). The
   * embedding and head are in the dense group. */
  bool keep = keep_d || keep_e;
  double emb_ag = (keep_d ? 1 + wire_rs : 2 + wire_rs) * emb_one, emb_rest = keep_d ? wire_rs * emb_one : emb_ag;
  int flows = 0;
  CostPasses pp;
  if (events) simulate_passes(md, ch, memo, events, emb_ag, &flows, &pp);
  else pp = passes(md, ch, memo);
  double pass_f = pp.pass_f, pass = pp.pass, pass_rest = pp.pass_rest, ag_once = pp.ag_once;
  double comm_total = pp.comm_total;
  event(events, TR_COMM, "embedding + LM head gathers, their reduce-scatter", 0, emb_ag, -1);
  event(events, TR_COMPUTE, "embedding, LM head and loss", emb_ag + pass_f, edge, -1);
  double P = (double)md->params_total, shard = P / (double)ch->fsdp;
  double host_bw = cl->host.bandwidth * e->host_memory; /* bytes/s the host cores stream */
  double per_micro = pass + edge + emb_ag + offload, per_rest = pass_rest + edge + emb_rest + offload;
  double A = (double)ch->accum;
  Cost *k = &c->cost;
  *k = (Cost){0};
  k->compute = A * compute;
  k->recompute = A * recompute;
  k->a2a = A * a2a;
  k->cp_exchange = A * kvx;
  k->exposed_offload = A * offload;
  k->host_grad = cost_host_grad(shard, A, ch->opt_tier == TIER_HOST, c2c, host_bw);
  k->exposed_comm = per_micro + (A - 1) * per_rest - A * (offload + compute + a2a + kvx);
  if (k->exposed_comm < 0) k->exposed_comm = 0;
  /* every_micro_batch: each micro-batch gathers twice and reduce-scatters once (comm_total);
   * after_step: the kept groups' gathers once per step, the rest per micro-batch */
  k->comm_total = keep ? ag_once + A * (comm_total - ag_once) + emb_ag + (A - 1) * emb_rest
                       : A * (comm_total + emb_ag);

  /* gradients across replicas: ring all-reduce of the shard, between nodes */
  double wire_b = s->training.grad_reduce_dtype == WIRE_BF16 ? 2 : 4;
  if (ch->dp_replicate > 1)
    k->dp_allreduce = 2 * ring(wire_b * shard, ch->dp_replicate, group_bw(s, ch->dp_replicate, ch->fsdp));

  /* optimizer step */
  bool muon = s->training.optimizer == OPT_MUON;
  double p_muon = muon ? (double)md->muon_params : 0, p_adam = P - p_muon;
  double opt = 0;
  if (muon) {
    /* the dense matrices' pieces to their owners and the updates back (fp32), inside the FSDP
     * group: each rank sends (F−1)/F of its 1/F of them each way (placement.c's moving_bytes_rank);
     * experts in whole-expert shards are orthogonalized where they are held: nothing moves; in a
     * flat expert group (plan_expert_per 0) the split ones move the same way inside the shard group */
    opt += 2 * ring(4 * (double)md->muon_dense_params / (double)ch->fsdp, ch->fsdp, group_bw(s, ch->fsdp, 1));
    double moving_experts = 0; /* elements of one EP rank's split expert matrices */
    double per_rank = memo->bound ? 0 : cost_ns_flops_busiest(md, ch, &moving_experts); /* the busiest owner rank's */
    opt += 2 * ring(4 * moving_experts / (double)ch->efsdp, ch->efsdp, group_bw(s, ch->efsdp, ch->ep));
    /* Newton-Schulz: fp32 GEMMs on the host's cores, or on the GPU with bf16 operands and fp32
     * accumulation on the tensor cores (runtime/cuda/muon_cuda.c) */
    opt += ch->opt_on_host ? per_rank / (cl->host.fp32_flops * e->host_gemm)
                           : per_rank / (cl->gpu.bf16_flops * e->dense_gemm);
  }
  /* elementwise update: AdamW reads master, grad, 2 moments and writes them + bf16 param
   * (30 B/param); Muon's reads master, grad, momentum and writes them + bf16 (22 B/param) */
  double touched = (30 * p_adam + 22 * p_muon) / (double)ch->fsdp;
  double opt_eff = e->optimizer_update > 0 ? e->optimizer_update : e->elementwise; /* efficiency.optimizer_update */
  opt += ch->opt_on_host ? touched / host_bw : touched / (cl->gpu.hbm_bandwidth * opt_eff);
  if (ch->opt_tier == TIER_HOST && !ch->opt_on_host) /* stream state over C2C, both ways */
    opt += 2 * (16 * p_adam + 12 * p_muon) / (double)ch->fsdp / c2c;
  if (ch->opt_on_host) opt += 2 * shard / c2c; /* updated bf16 parameters back to HBM */
  k->optimizer = opt;

  k->step = k->compute + k->exposed_comm + k->a2a + k->cp_exchange + k->exposed_offload + k->host_grad +
            k->optimizer + k->dp_allreduce;
  if (events) { /* the other micro-batches as one event per track, then the step's tail */
    double t = per_micro;
    if (A > 1) {
      event(events, TR_COMPUTE, "micro-batches 2..N: compute", t, (A - 1) * compute, -1);
      event(events, TR_A2A, "micro-batches 2..N: all-to-all", t, (A - 1) * a2a, -1);
      event(events, TR_CP, "micro-batches 2..N: K/V exchange", t, (A - 1) * kvx, -1);
      event(events, TR_COMM, "micro-batches 2..N: FSDP collectives", t,
            (A - 1) * (keep ? comm_total - ag_once + emb_rest : comm_total + emb_ag), -1);
      t += (A - 1) * per_rest;
    }
    if (offload > 0) event(events, TR_D2H, "exposed activation offload", t - offload, offload, -1);
    event(events, TR_D2H, "gradient shard to host, accumulated in fp32", t, k->host_grad, -1);
    t += k->host_grad;
    event(events, TR_COMM, "data-parallel all-reduce", t, k->dp_allreduce, -1);
    event(events, TR_OPT, ch->opt_on_host ? "optimizer step (host)" : "optimizer step", t + k->dp_allreduce, k->optimizer, -1);
  }
  double world = (double)(cl->nodes * cl->gpus_per_node);
  k->tokens_per_s_per_gpu = (double)s->training.global_batch * seq / k->step / world;
  k->mfu = md->flops_per_token * k->tokens_per_s_per_gpu / cl->gpu.bf16_flops;
  struct { const char *name; double v; } parts[] = {
      {"compute", k->compute}, {"exposed FSDP communication", k->exposed_comm},
      {"MoE all-to-all", k->a2a}, {"context-parallel K/V exchange", k->cp_exchange},
      {"activation offload", k->exposed_offload},
      {"host gradient accumulation", k->host_grad},
      {"optimizer step", k->optimizer}, {"data-parallel all-reduce", k->dp_allreduce}};
  k->bottleneck = parts[0].name;
  double best = parts[0].v;
  for (int i = 1; i < (int)(sizeof parts / sizeof parts[0]); i++)
    if (parts[i].v > best) best = parts[i].v, k->bottleneck = parts[i].name;
  k->bottleneck_seconds = best;
  if (memo == &local) cost_memo_free(&local);
}
