/* emit_layout.c — the generated program's memory: its parameter groups and tensors (from the
 * model graph) and one arena holding every buffer at a fixed offset (from the plan's layout
 * and checkpoint policy). emit_step.c writes the code that uses them. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "emit.h"

enum { ALIGN = 16 }; /* elements: 64 bytes of float */

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Adds buffer name of n elements (n > 0) to arena a. */
static void add_buf(Em *e, const char *name, int64_t n, const char *what, EmArena a) {
  if (n <= 0 || mem_map_get(&e->bufnames, NULL, name)) return; /* workspace: first registration sizes it */
  mem_map_put(e->m, &e->bufnames, NULL, name, (void *)(uintptr_t)(a + 1));
  if (e->nbufs == e->capbufs) {
    int cap = e->capbufs ? 2 * e->capbufs : 256;
    EmBuf *nb = mem_array(e->m, (size_t)cap, sizeof(EmBuf));
    if (e->nbufs) memcpy(nb, e->bufs, sizeof *nb * (size_t)e->nbufs);
    e->bufs = nb, e->capbufs = cap;
  }
  e->bufs[e->nbufs++] = (EmBuf){name, e->top[a], n, what, a};
  e->top[a] += round_up(n, ALIGN);
}

/* A buffer of fp32 or int32 values (R), or of activations (A). */
static void buf(Em *e, const char *name, int64_t n, const char *what) { add_buf(e, name, n, what, EM_REAL); }
static void abuf(Em *e, const char *name, int64_t n, const char *what) { add_buf(e, name, n, what, EM_ACT); }

int em_arena_of(const Em *e, const char *name) {
  uintptr_t a = (uintptr_t)mem_map_get(&e->bufnames, NULL, name);
  if (a) return (int)a - 1;
  if (name[0] == 'X' && name[1] >= '0' && name[1] <= '9') return EM_ACT; /* X<l>: an alias of XSLOT<l % 3> */
  return -1;
}

/* Whether buffers of class cls get one copy per layer (saved for backward) or one shared
 * workspace (recomputed in backward) under the plan's checkpoint policy: the planner's rule. */
static bool per_layer(const Em *e, SaveClass cls) { return plan_keeps(e->ac, cls); }

const char *em_act(Em *e, int l, const char *name, SaveClass cls) {
  return per_layer(e, cls) ? mem_printf(e->m, "L%d_%s", l, name) : mem_printf(e->m, "WS_%s", name);
}

/* Registers activation `name` of layer l (n elements) under its class: activations (A), or fp32
 * and int32 values that go with them (statistics, routing: R). */
static void act(Em *e, int l, const char *name, SaveClass cls, int64_t n, const char *what) {
  abuf(e, em_act(e, l, name, cls), n, what);
}
static void stat(Em *e, int l, const char *name, SaveClass cls, int64_t n, const char *what) {
  buf(e, em_act(e, l, name, cls), n, what);
}

/* HF name of a model.c parameter of layer l ("attn.q_proj.weight" ->
 * "model.layers.2.self_attn.q_proj.weight"). */
static const char *hf_name(Em *e, int l, const char *p, bool expert) {
  const char *rest = p;
  const char *pre = "";
  if (strncmp(p, "attn.", 5) == 0) pre = "self_attn.", rest = p + 5;
  else if (strncmp(p, "moe.gate.", 9) == 0) pre = "mlp.gate.", rest = p + 9;
  else if (strncmp(p, "moe.experts.", 12) == 0) pre = "mlp.experts.%d.", rest = p + 12;
  else if (strncmp(p, "moe.shared_experts.", 19) == 0) pre = "mlp.shared_experts.", rest = p + 19;
  else if (strncmp(p, "moe.shared_expert_gate.", 23) == 0) pre = "mlp.shared_expert_gate.", rest = p + 23;
  (void)expert;
  if (l < 0) return strcmp(p, "lm_head.weight") == 0 ? p : mem_printf(e->m, "model.%s", p);
  return mem_printf(e->m, "model.layers.%d.%s%s", l, pre, rest);
}

static int add_group(Em *e, const char *name, const char *cname, int comm) {
  EmGroup *g = &e->groups[e->ngroups];
  memset(g, 0, sizeof *g);
  g->name = name, g->cname = cname, g->comm = comm;
  g->first = INT_MAX, g->last = -1;
  return e->ngroups++;
}

/* The scope of layer l's matrices in a MemMap of owners (l >= -1). */
static const void *layer_tag(int l) { return (const void *)(uintptr_t)(l + 2); }

/* Adds parameter p of layer l to group g; owners maps (layer_tag, matrix) to the DenseOwner of a
 * dense Muon matrix (experts have none: they are orthogonalized where they are held). */
static void add_tensor(Em *e, int g, int l, const Param *p, const MemMap *owners) {
  bool routed = p->kind == PK_ROUTED;
  EmTensor *t = &e->tensors[e->ntensors++];
  memset(t, 0, sizeof *t);
  t->key = p->name, t->layer = l, t->group = g;
  EmGroup *G = &e->groups[g];
  if (G->first > e->ntensors - 1) G->first = e->ntensors - 1;
  G->last = e->ntensors - 1;
  t->name = hf_name(e, l, p->name, routed);
  t->experts = routed ? (int)e->El : 0;
  t->rows = routed ? p->shape[1] : p->shape[0];
  t->cols = routed ? p->shape[2] : (p->ndim > 1 ? p->shape[1] : 1);
  t->count = t->rows * t->cols;
  t->offset = e->groups[g].elems;
  /* whole-expert shards: a shard holds per = ceil(El / efsdp) whole experts of every routed
   * tensor (the last shards fewer when efsdp does not divide El: padded to the largest) */
  t->per = routed && e->efsdp > 1 ? (int)((e->El + e->efsdp - 1) / e->efsdp) : 0;
  e->groups[g].elems += t->count * (routed ? (t->per ? t->per : e->El) : 1);
  bool matrix = p->ndim >= 2;
  bool out_proj = strstr(p->name, "o_proj") || strstr(p->name, "down_proj");
  t->init_one = p->kind == PK_NORM;
  /* GPT-2 / Megatron initialization: N(0, 0.02²), output projections scaled by 1/sqrt(2L)
   * (Radford et al. 2019); norms start at 1, biases (router score correction) at 0 */
  t->init_std = matrix ? (out_proj ? 0.02 / sqrt(2.0 * (double)e->L) : 0.02) : 0;
  t->decay = matrix;
  /* Muon: every 2-D GEMM weight but the embedding, router and LM head (placement.c's rule),
   * owned as the plan's placement says */
  t->muon = e->s->training.optimizer == OPT_MUON && p->matmul && p->kind != PK_EMBEDDING &&
            p->kind != PK_ROUTER && p->kind != PK_HEAD;
  if (t->muon && !routed) { /* (experts: orthogonalized where they are held, whole; owner 0 unused) */
    const DenseOwner *o = mem_map_get(owners, layer_tag(l), p->name);
    if (o) t->owner = (int)o->owner;
  }
  if (t->muon) G->muon = true;
  else G->adamw = true;
}

/* The pieces of gathered [a, a + n) in shard r of S elements. */
static int64_t piece_len(int64_t r, int64_t S, int64_t a, int64_t n) {
  int64_t lo = r * S > a ? r * S : a, hi = (r + 1) * S < a + n ? (r + 1) * S : a + n;
  return hi > lo ? hi - lo : 0;
}

/* The cuda backend's Newton-Schulz batches (runtime/cuda/muon_cuda.c): the most any run of
 * same-shaped matrices held whole in one shard (a shard's experts of one tensor) needs, b (2 n +
 * 2 r² + 1) values (rt_cu_newton_schulz_work), so that each run is one batch of strided GEMMs. */
static int64_t ns_batch_work(const Em *e, const EmGroup *G) {
  int64_t S = G->shard, most = 0;
  for (int i = G->first; i <= G->last; i++) {
    const EmTensor *t = &e->tensors[i];
    if (!t->muon) continue;
    int64_t n = t->rows * t->cols, q = t->rows < t->cols ? t->rows : t->cols;
    int ne = t->experts ? t->experts : 1;
    for (int k = 0, b; k < ne; k += b) {
      int64_t a = t->per ? t->offset + k / t->per * t->block + k % t->per * n : t->offset + k * n, lo = a / S * S;
      b = 1;
      if (a + n > lo + S) continue; /* split over shards: gathered to its owner, batch 1 */
      for (; k + b < ne; b++) {
        int64_t a2 = t->per ? t->offset + (k + b) / t->per * t->block + (k + b) % t->per * n : t->offset + (k + b) * n;
        if (a2 != a + b * n || a2 + n > lo + S) break;
      }
      if (b * (2 * n + 2 * q * q + 1) > most) most = b * (2 * n + 2 * q * q + 1);
    }
  }
  return most;
}

/* MUON_WORK: rt_muon_group_work's figure (runtime/optim/muon.c) of the neediest group: its shard
 * + the most one rank owns of the matrices that move (not whole in one shard) + 2 n + 2 n + 2 r²
 * of its largest matrix (gradient, update, Newton-Schulz's scratch); or, when more, its shard +
 * the cuda backend's largest Newton-Schulz batch (ns_batch_work). The plan's
 * workspace.newton_schulz item counts one matrix in bf16, not these fp32 batches. */
static void muon_work(Em *e) {
  for (int g = 0; g < e->ngroups; g++) {
    const EmGroup *G = &e->groups[g];
    int64_t ranks = G->comm ? e->efsdp : e->fsdp, S = G->shard, ns = 0, most = 0;
    for (int64_t r = 0; r < ranks; r++) {
      int64_t owned = 0;
      for (int i = G->first; i <= G->last; i++) {
        const EmTensor *t = &e->tensors[i];
        if (!t->muon) continue;
        int64_t n = t->rows * t->cols, q = t->rows < t->cols ? t->rows : t->cols;
        if (4 * n + 2 * q * q > ns) ns = 4 * n + 2 * q * q;
        for (int k = 0; k < (t->experts ? t->experts : 1); k++) {
          int64_t a = t->per ? t->offset + k / t->per * t->block + k % t->per * n : t->offset + k * n;
          bool local = a + n <= (a / S + 1) * S;
          if (!local && (t->owner + k) % ranks == r)
            for (int64_t q2 = 0; q2 < ranks; q2++) owned += piece_len(q2, S, a, n);
        }
      }
      if (owned > most) most = owned;
    }
    int64_t batch = ns_batch_work(e, G);
    if (ns && S + most + ns > e->muon_work) e->muon_work = S + most + ns;
    if (ns && S + batch > e->muon_work) e->muon_work = S + batch;
  }
}

void em_layout(Em *e) {
  const Model *md = e->md;
  int64_t N = e->N, C = e->C, K = e->K;
  e->groups = mem_array(e->m, 2 * (size_t)e->L + 2, sizeof(EmGroup));
  int np = 0;
  for (int i = 0; i < md->nops; i++) np += md->ops[i].nparams;
  e->tensors = mem_array(e->m, (size_t)np + 1, sizeof(EmTensor));
  e->layer_dense = mem_array(e->m, (size_t)e->L, sizeof(int));
  e->layer_experts = mem_array(e->m, (size_t)e->L, sizeof(int));

  /* parameter groups in forward order: embedding, per layer dense (+ experts), head */
  e->g_embed = add_group(e, "embedding", "EMBED", 0);
  for (int l = 0; l < e->L; l++) {
    e->layer_dense[l] = add_group(e, mem_printf(e->m, "layer %d dense", l), mem_printf(e->m, "L%d_DENSE", l), 0);
    e->layer_experts[l] = md->layers[l].kind == LAYER_MOE
                              ? add_group(e, mem_printf(e->m, "layer %d experts", l), mem_printf(e->m, "L%d_EXPERTS", l), 1)
                              : -1;
  }
  /* tied embeddings (model.tie_embeddings): the head is the embedding group again, gathered a
   * second time for the LM head; its gradient is reduce-scattered after the head's backward and
   * after the embedding's, both adding into the one shard gradient of embed_tokens.weight */
  e->g_head = e->s->model.tie_embeddings ? e->g_embed : add_group(e, "head", "HEAD", 0);
  MemMap owners = {0}; /* the last entry of a (layer, matrix) wins, as in the placement's lists */
  const Placement *pl = e->p->placement;
  for (int i = 0; pl && i < pl->ndense; i++)
    mem_map_put(e->m, &owners, layer_tag(pl->dense[i].layer), pl->dense[i].matrix, &pl->dense[i]);
  for (int i = 0; i < md->nops; i++) {
    const Op *o = &md->ops[i];
    for (int j = 0; j < o->nparams; j++) {
      const Param *p = &o->params[j];
      int g = o->layer < 0 ? (o->kind == OP_EMBED || o->kind == OP_POS_EMBED ? e->g_embed : e->g_head)
                           : (p->kind == PK_ROUTED ? e->layer_experts[o->layer] : e->layer_dense[o->layer]);
      add_tensor(e, g, o->layer, p, &owners);
    }
  }
  for (int g = 0; g < e->ngroups; g++) {
    EmGroup *G = &e->groups[g];
    int64_t ranks = G->comm ? e->efsdp : e->fsdp;
    bool whole = G->comm && G->first <= G->last && e->tensors[G->first].per;
    /* shards of whole 16-byte vectors of bf16 (cuda kernels) */
    G->full = whole ? ranks * round_up(G->elems, 8) : round_up(G->elems, ranks * 8);
    G->shard = G->full / ranks;
    for (int i = G->first; whole && i <= G->last; i++) e->tensors[i].block = G->shard;
  }

  muon_work(e);
  /* the state arena (fp32, in the plan's optimizer tier): each group's master shard, its gradient
   * and its optimizer moments (AdamW's two, or Muon's momentum in ADAM_M for a group of Muon
   * matrices only: the plan's optimizer.muon_momentum and optimizer.adamw_moments) */
  for (int g = 0; g < e->ngroups; g++) {
    EmGroup *G = &e->groups[g];
    const char *n = G->cname;
    add_buf(e, mem_printf(e->m, "%s_MASTER", n), G->shard, mem_printf(e->m, "%s: this rank's fp32 master shard", G->name), EM_STATE);
    add_buf(e, mem_printf(e->m, "%s_GRAD", n), G->shard, "its gradient, accumulated over micro-batches", EM_STATE);
    add_buf(e, mem_printf(e->m, "%s_ADAM_M", n), G->shard,
            G->adamw ? "AdamW first moment (fp32)" : "Muon momentum (fp32)", EM_STATE);
    if (G->adamw) add_buf(e, mem_printf(e->m, "%s_ADAM_V", n), G->shard, "AdamW second moment (fp32)", EM_STATE);
  }
  /* the arenas R and A: first what lives across micro-batches (tokens, aux_free's expert loads;
   * the shards gathered from when the master is on the host), then what each micro-batch writes
   * before it reads it */
  buf(e, "INPUTS", N, "token ids of the micro-batch (int32)");
  buf(e, "TARGETS", N, "next-token targets (int32)");
  for (int l = 0; e->aux_free && l < e->L; l++)
    if (md->layers[l].kind == LAYER_MOE) buf(e, mem_printf(e->m, "L%d_LOAD", l), e->E, "tokens per expert this step (aux_free)");
  /* the shards the all-gathers read, in the activation type: the plan's params.bf16_shard with
   * the master on the host; with the master in HBM the plan casts one layer at a time
   * (params.bf16_cast), the program keeps every shard cast (2 B x params / fsdp more) */
  for (int g = 0; g < e->ngroups; g++)
    abuf(e, mem_printf(e->m, "%s_PARAM", e->groups[g].cname), e->groups[g].shard,
         "its shard cast to the activation type, gathered from: refreshed after each optimizer step");
  e->scratch[EM_REAL] = e->top[EM_REAL], e->scratch[EM_ACT] = e->top[EM_ACT];
  /* units (embedding 0, layer l = l + 1, head L + 1): while one computes, the next P units' gathers
   * (P the plan's prefetch depth) are in flight into the other buffers of the pool, and in the
   * backward the previous unit's gradient is reduce-scattered from the other of two gradient
   * buffers. A unit's dense group and its experts share one buffer (dense first), as the plan's
   * gathered.params[i] and grads.bf16_unsharded[i] items hold a layer: sized by the largest unit */
  int64_t max_unit = e->groups[e->g_embed].full > e->groups[e->g_head].full ? e->groups[e->g_embed].full
                                                                             : e->groups[e->g_head].full;
  for (int l = 0; l < e->L; l++) {
    int64_t u = e->groups[e->layer_dense[l]].full + (e->layer_experts[l] >= 0 ? e->groups[e->layer_experts[l]].full : 0);
    if (u > max_unit) max_unit = u;
  }
  for (int i = 0; i <= e->prefetch; i++) /* the plan's gathered.params[i]: unit u in GATHERED<u % (P + 1)> */
    abuf(e, mem_printf(e->m, "GATHERED%d", i), max_unit,
        mem_printf(e->m, "units u with u %% %d = %d: parameters all-gathered, dense then experts", e->prefetch + 1, i));
  /* the plan's grads.bf16_unsharded[0..1]: the unit's weight gradients in the activation type
   * (bf16 on cuda), reduce-scattered from these bytes (bf16 wire: in place) */
  abuf(e, "GRAD0", max_unit, "an even unit's gradient, dense then experts, then its reduce-scatters' input (in place)");
  abuf(e, "GRAD1", max_unit, "an odd unit's (in flight while the next unit's backward runs)");
  buf(e, "MUON_WORK", e->muon_work, "Muon: the pieces sent to owners and received, a matrix's gradient, its update and Newton-Schulz scratch");
  /* grad_reduce_dtype fp32 (the plan's grads.fp32_wire[0..1]): a unit's gradient cast to fp32 and
   * reduce-scattered there in place, laid out as GRAD<u % 2> */
  if (e->s->training.grad_reduce_dtype != WIRE_BF16 && e->fsdp > 1)
    for (int i = 0; i < 2; i++)
      buf(e, mem_printf(e->m, "RS_WIRE%d", i), max_unit,
          mem_printf(e->m, "fp32 on the wire: GRAD%d's values in fp32, reduce-scattered in place", i));
  if (e->offload) /* X0..XL are aliases of these (step.c's map) */
    for (int i = 0; i < 3; i++)
      abuf(e, mem_printf(e->m, "XSLOT%d", i), N * C, mem_printf(e->m, "boundaries l with l %% 3 = %d (residual stream)", i));
  else
    for (int l = 0; l <= e->L; l++)
      abuf(e, mem_printf(e->m, "X%d", l), N * C,
          l < e->L ? mem_printf(e->m, "boundary: input of layer %d (residual stream)", l) : "output of the last layer");
  e->host_elems = e->offload && e->L >= 3 ? (e->L - 2) * N * C : 0;
  int64_t st = e->s->model.norm == NORM_LAYERNORM ? 2 : 1; /* norm statistics per token: rstd (and the mean) */
  for (int l = 0; l < e->L; l++) {
    const Layer *ly = &md->layers[l];
    act(e, l, "LN1", SAVE_OTHER, N * C, "attention norm output");
    stat(e, l, "RSTD1", SAVE_OTHER, N * st, st == 2 ? "its rstd, then its mean, per token" : "its 1/rms per token");
    act(e, l, "Q", SAVE_ATTN, N * e->Q, "queries (rotated)");
    act(e, l, "K", SAVE_ATTN, N * e->KV, "keys (rotated)");
    if (e->qk_norm) {
      bool full = e->qk_norm == QKN_FULL;
      act(e, l, "QR", SAVE_ATTN, N * e->Q, "queries before qk-norm");
      act(e, l, "KR", SAVE_ATTN, N * e->KV, "keys before qk-norm");
      stat(e, l, "RSTDQ", SAVE_ATTN, full ? N : N * e->nh, "qk-norm: 1/rms per token (full) or per token and head");
      stat(e, l, "RSTDK", SAVE_ATTN, full ? N : N * e->nkv, "the same for the keys");
    }
    act(e, l, "V", SAVE_ATTN, N * e->KV, "values");
    act(e, l, "ATT", SAVE_ATTN, N * e->Q, "attention output");
    stat(e, l, "LSE", SAVE_ATTN, N * e->nh, "attention log-sum-exp per head and query");
    act(e, l, "RES", SAVE_OTHER, N * C, "residual stream after attention");
    act(e, l, "LN2", SAVE_OTHER, N * C, "mlp norm output");
    stat(e, l, "RSTD2", SAVE_OTHER, N * st, st == 2 ? "its rstd, then its mean, per token" : "its 1/rms per token");
    if (ly->kind == LAYER_DENSE) {
      int64_t F = e->s->model.mlp.intermediate;
      if (e->s->model.mlp.activation == ACT_SWIGLU) act(e, l, "G", SAVE_OTHER, N * F, "mlp gate");
      act(e, l, "U", SAVE_OTHER, N * F, "mlp up");
      act(e, l, "H", SAVE_OTHER, N * F, "mlp activation");
      continue;
    }
    stat(e, l, "LOGITS", SAVE_OTHER, N * e->E, "router logits");
    stat(e, l, "IDX", SAVE_OTHER, N * K, "selected experts (int32)");
    stat(e, l, "WTS", SAVE_OTHER, N * K, "their weights");
    stat(e, l, "POS", SAVE_OTHER, N * K, "row of each assignment in expert order (int32)");
    stat(e, l, "OFFSETS", SAVE_OTHER, e->E + 1, "first row of each expert (int32)");
    /* the experts' input and output rows: with ep 1 the token copies in expert order are the
     * experts' input (saved); with ep > 1 the rows received are (XE), and the send side (WS_XP)
     * and the outputs before they go back (WS_YE) are workspace */
    if (e->ep == 1) act(e, l, "XP", SAVE_EXPERT, N * K * C, "token copies in expert order: the experts' input");
    act(e, l, "YP", SAVE_EXPERT, N * K * C, "expert outputs in that order");
    if (e->ep > 1) {
      abuf(e, "WS_XP", N * K * C, "token copies in expert order, to send (all-to-all)");
      act(e, l, "XE", SAVE_EXPERT, e->R * C, "rows this rank's experts received in one all-to-all round (MOE_CAP_ROWS)");
      abuf(e, "WS_YE", e->R * C, "their outputs, before going back");
      stat(e, l, "EOFF", SAVE_EXPERT, e->El + 1, "first row of each local expert in the round (int32)");
    }
    if (!e->gelu_experts) act(e, l, "EG", SAVE_EXPERT, e->R * e->Fe, "routed experts' gate");
    act(e, l, "EU", SAVE_EXPERT, e->R * e->Fe, e->gelu_experts ? "routed experts' up (GELU's input)" : "routed experts' up");
    act(e, l, "EH", SAVE_EXPERT, e->R * e->Fe, "routed experts' activation");
    if (e->Fs) {
      if (!e->gelu_experts) act(e, l, "SG", SAVE_EXPERT, N * e->Fs, "shared experts' gate");
      act(e, l, "SU", SAVE_EXPERT, N * e->Fs, "shared experts' up");
      act(e, l, "SH", SAVE_EXPERT, N * e->Fs, "shared experts' activation");
      if (e->s->model.moe.shared_expert_gate) {
        act(e, l, "SO", SAVE_EXPERT, N * C, "shared experts' output before the gate");
        stat(e, l, "SGL", SAVE_EXPERT, N, "shared_expert_gate's logit per token (fp32, as the router's)");
      }
    }
  }
  /* workspace: forward temporaries and backward gradients, reused by every layer */
  abuf(e, "WS_Y", N * C, "a block's output before the residual add");
  abuf(e, "WS_Y2", N * C, "shared experts' output");
  abuf(e, "DX_A", N * C, "gradient of the residual stream (even layers' output)");
  abuf(e, "DX_B", N * C, "gradient of the residual stream (odd layers' output)");
  abuf(e, "DLN", N * C, "gradient of a norm's output");
  abuf(e, "DATT", N * e->Q, "gradient of the attention output");
  abuf(e, "DQ", N * e->Q, "gradient of the queries");
  abuf(e, "DK", N * e->KV, "gradient of the keys");
  abuf(e, "DV", N * e->KV, "gradient of the values");
  if (e->qk_norm) {
    abuf(e, "DQR", N * e->Q, "gradient of the queries before qk-norm");
    abuf(e, "DKR", N * e->KV, "gradient of the keys before qk-norm");
  }
  int64_t F = e->s->model.mlp.present ? e->s->model.mlp.intermediate : 0;
  if (F) {
    abuf(e, "DG", N * F, "gradient of the mlp gate");
    abuf(e, "DU", N * F, "gradient of the mlp up");
    abuf(e, "DH", N * F, "gradient of the mlp activation");
  }
  if (md->n_moe_layers) {
    buf(e, "DLOGITS", N * e->E, "gradient of the router logits");
    buf(e, "DWTS", N * K, "gradient of the routing weights");
    abuf(e, "DYP", N * K * C, "gradient of the expert outputs");
    abuf(e, "DXP", N * K * C, "gradient of the token copies");
    if (e->ep > 1) {
      abuf(e, "DYE", e->R * C, "gradient of the received rows' outputs");
      abuf(e, "DXE", e->R * C, "gradient of the received rows");
      abuf(e, "A2A", e->R * C, "all-to-all staging of one round (source-rank order)");
      buf(e, "WS_EOFF", e->El + 1, "backward's first row of each local expert in the round (int32)");
    }
    if (!e->gelu_experts) abuf(e, "EDG", e->R * e->Fe, "routed experts' gate gradient");
    abuf(e, "EDU", e->R * e->Fe, "routed experts' up gradient");
    abuf(e, "EDH", e->R * e->Fe, "routed experts' activation gradient");
    if (e->Fs) {
      if (!e->gelu_experts) abuf(e, "DSG", N * e->Fs, "shared experts' gate gradient");
      abuf(e, "DSU", N * e->Fs, "shared experts' up gradient");
      abuf(e, "DSH", N * e->Fs, "shared experts' activation gradient");
      if (e->s->model.moe.shared_expert_gate) {
        abuf(e, "DSO", N * C, "gradient of the shared experts' output before the gate");
        buf(e, "DSGL", N, "gradient of the gate's logits (fp32)");
      }
    }
    buf(e, "AUX", 3 * e->E, "load-balancing loss scratch");
  }
  abuf(e, "LNF", N * C, "final norm output");
  buf(e, "RSTDF", N * st, st == 2 ? "its rstd, then its mean, per token" : "its 1/rms per token");
  buf(e, "LSEF", N, "log-sum-exp of each token's logits");
  buf(e, "CE", 2 * N * e->chunk, "logits of one vocabulary chunk and their gradient");
}
