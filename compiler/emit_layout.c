/* emit_layout.c — the generated program's memory: its parameter groups and tensors (from the
 * model graph) and one arena holding every buffer at a fixed offset (from the plan's layout
 * and checkpoint policy). emit_step.c writes the code that uses them. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"

enum { ALIGN = 16 }; /* elements: 64 bytes of float */

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

static void push_buf(Em *e, EmBuf b) {
  if (e->nbufs == e->capbufs) {
    int cap = e->capbufs ? 2 * e->capbufs : 256;
    EmBuf *nb = mem_array(e->m, (size_t)cap, sizeof(EmBuf));
    if (e->nbufs) memcpy(nb, e->bufs, sizeof *nb * (size_t)e->nbufs);
    e->bufs = nb, e->capbufs = cap;
  }
  e->bufs[e->nbufs++] = b;
}

/* Adds buffer name of n elements (n > 0) to arena a. */
static void add_buf(Em *e, const char *name, int64_t n, const char *what, EmArena a) {
  if (n <= 0 || mem_map_get(&e->bufnames, NULL, name)) return; /* workspace: first registration sizes it */
  mem_map_put(e->m, &e->bufnames, NULL, name, (void *)(uintptr_t)(a + 1));
  push_buf(e, (EmBuf){name, e->top[a], n, what, a, NULL, 0, false, e->item});
  e->top[a] += round_up(n, ALIGN);
}

int64_t em_buf_bytes(const EmBuf *b) {
  if (b->arena == EM_STATE) return round_up(b->elems, ALIGN) * 4;
  return round_up(b->elems * (b->arena == EM_ACT ? 2 : 4), 64);
}

EmBuf *em_find_buf(Em *e, const char *name) {
  for (int i = 0; i < e->nbufs; i++)
    if (strcmp(e->bufs[i].name, name) == 0) return &e->bufs[i];
  return NULL;
}

/* Buffer name of n elements in the bytes of buffer `of` (registered, itself maybe an alias) from
 * its element at on, inside it: the two are never live at the same time (what says why). */
static void alias_buf(Em *e, const char *name, const char *of, int64_t at, int64_t n, const char *what) {
  if (n <= 0 || mem_map_get(&e->bufnames, NULL, name)) return;
  EmBuf *t = em_find_buf(e, of);
  if (!t || at < 0 || at + n > t->elems) { /* (a layout bug: the larger buffer is registered first) */
    fprintf(stderr, "mtc: internal error: alias %s of %s\n", name, of);
    abort();
  }
  mem_map_put(e->m, &e->bufnames, NULL, name, (void *)(uintptr_t)(t->arena + 1));
  push_buf(e, (EmBuf){name, t->offset + at, n, what, t->arena, t->name, at, false, t->item});
}

/* A buffer of fp32 or int32 values (R), or of activations (A). */
static void buf(Em *e, const char *name, int64_t n, const char *what) { add_buf(e, name, n, what, EM_REAL); }
static void abuf(Em *e, const char *name, int64_t n, const char *what) { add_buf(e, name, n, what, EM_ACT); }

/* bufnames' value of a buffer of fp32 values in the activation arena's bytes (alias_real) */
enum { REAL_IN_ACT = EM__ARENAS + 1 };

/* Buffer name of n fp32 values in the bytes of activation buffer `of` from its element at on
 * (2 act elements per value, whatever act is), never live at the same time as it (what: why). */
static void alias_real(Em *e, const char *name, const char *of, int64_t at, int64_t n, const char *what) {
  if (n <= 0 || mem_map_get(&e->bufnames, NULL, name)) return;
  alias_buf(e, name, of, at, 2 * n, what);
  e->bufs[e->nbufs - 1].real = true;
  mem_map_put(e->m, &e->bufnames, NULL, name, (void *)(uintptr_t)REAL_IN_ACT);
}

bool em_real_in_act(const Em *e, const char *name) {
  return (uintptr_t)mem_map_get(&e->bufnames, NULL, name) == REAL_IN_ACT;
}

int em_arena_of(const Em *e, const char *name) {
  uintptr_t a = (uintptr_t)mem_map_get(&e->bufnames, NULL, name);
  if (a == REAL_IN_ACT) return EM_ACT;
  if (a) return (int)a - 1;
  if (name[0] == 'X' && name[1] >= '0' && name[1] <= '9') return EM_ACT; /* X<l>: an alias of XSLOT<l % 3> */
  return -1;
}

/* Whether buffers of class cls get one copy per layer (saved for backward) or one shared
 * workspace (recomputed in backward) under the plan's checkpoint policy: the planner's rule. */
static bool per_layer(const Em *e, SaveClass cls) { return plan_keeps(e->ac, cls); }

const Saved *em_saved(const Em *e, int l, const char *name) {
  if (e->ep == 1 && strcmp(name, "XP") == 0) name = "XE"; /* no all-to-all: the copies are the input */
  const Layer *ly = &e->md->layers[l];
  for (int i = ly->first_op; i < ly->first_op + ly->nops; i++)
    for (int j = 0; j < e->md->ops[i].nsaved; j++)
      if (strcmp(e->md->ops[i].saved[j].name, name) == 0) return &e->md->ops[i].saved[j];
  return NULL;
}

static _Noreturn void no_save(int l, const char *name) { /* (a bug: model.c and the emitter disagree) */
  fprintf(stderr, "mtc: internal error: layer %d has no save %s in the model graph (compiler/model.c), "
          "which the program's buffer needs\n", l, name);
  exit(70);
}

int64_t em_saved_elems(const Em *e, int l, const char *name) {
  const Saved *sv = em_saved(e, l, name);
  if (!sv) no_save(l, name);
  return sv->routed ? sv->elems / e->K * e->R : sv->elems * e->N;
}

/* A layer's buffers that are not per-token saves, so not the model graph's (which counts per
 * token): their sizes do not grow with the tokens. Each goes with the class of the saves it
 * indexes. */
static const struct {
  const char *name;
  SaveClass cls;
} tables[] = {
    {"OFFSETS", SAVE_OTHER}, /* first row of each expert (E + 1): with the permutation POS */
    {"EOFF", SAVE_EXPERT},   /* first row of each local expert in a round (El + 1): with the rows XE */
};

/* Index of table name in tables, or -1. */
static int table_of(const char *name) {
  for (int t = 0; t < (int)(sizeof tables / sizeof *tables); t++)
    if (strcmp(tables[t].name, name) == 0) return t;
  return -1;
}

const char *em_act(Em *e, int l, const char *name) {
  /* the fused q | k | v and g | u rows: the model graph's Q, K and V (G and U) in one buffer */
  const char *of = !strcmp(name, "QKV") ? "Q" : !strcmp(name, "GU") ? "G" : !strcmp(name, "SGU") ? "SG" : name;
  const Saved *sv = em_saved(e, l, of);
  int t = sv ? -1 : table_of(name);
  if (!sv && t < 0) no_save(l, name);
  SaveClass cls = sv ? sv->cls : tables[t].cls;
  return per_layer(e, cls) ? mem_printf(e->m, "L%d_%s", l, name) : mem_printf(e->m, "WS_%s", name);
}

/* The plan item of layer l's buffers of class cls: its activations.saved[l] when kept per layer
 * (plan.c names the stacked items so), else the one layer's workspace, activations.forward_layer
 * (alive from the first forward to the last backward: the program's WS_ buffers serve the
 * forward and the backward's recompute alike). */
static const char *layer_item(Em *e, int l, SaveClass cls) {
  return per_layer(e, cls) ? mem_printf(e->m, "activations.saved[%d]", l) : "activations.forward_layer";
}

/* Registers buffer `name` of layer l as the model graph describes it (em_saved): its elements
 * (em_saved_elems), its class (kept per layer or workspace) and its arena (bf16 saves are
 * activations, A; fp32 and int32 ones, statistics and routing, are R). */
static void act(Em *e, int l, const char *name, const char *what) {
  const Saved *sv = em_saved(e, l, name);
  if (!sv) no_save(l, name);
  e->item = layer_item(e, l, sv->cls);
  add_buf(e, em_act(e, l, name), em_saved_elems(e, l, name), what, sv->dtype == DT_BF16 ? EM_ACT : EM_REAL);
}
/* A per-layer table (tables above: n int32 elements, not per token) of layer l. */
static void table(Em *e, int l, const char *name, int64_t n, const char *what) {
  e->item = layer_item(e, l, tables[table_of(name)].cls);
  buf(e, em_act(e, l, name), n, what);
}

/* HF name of a model.c parameter of layer l ("attn.q_proj.weight" ->
 * "model.layers.2.self_attn.q_proj.weight"): export_raw_name, which mtc export maps on. */
static const char *hf_name(Em *e, int l, const char *p, bool expert) {
  (void)expert;
  return export_raw_name(e->m, l, p);
}

static int add_group(Em *e, const char *name, const char *cname, int comm) {
  EmGroup *g = &e->groups[e->ngroups];
  memset(g, 0, sizeof *g);
  g->name = name, g->cname = cname, g->comm = comm;
  g->first = INT_MAX, g->last = -1, g->kept_at = -1;
  return e->ngroups++;
}

/* The scope of layer l's matrices in a MemMap of owners (l >= -1). */
static const void *layer_tag(int l) { return (const void *)(uintptr_t)(l + 2); }

/* Adds parameter p of layer l to group g; owners maps (layer_tag, matrix) to the DenseOwner of a
 * dense Muon matrix, runs to the ExpertRun of EP rank 0 of a routed one (whole-expert shards: none
 * move; flat: the owner of expert 0 of those split over ranks, expert k's (owner + k) mod efsdp). */
static void add_tensor(Em *e, int g, int l, const Param *p, const MemMap *owners, const MemMap *runs) {
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
  /* a dense tensor starts at a multiple of 8 elements (16 bytes of bf16: the cuda kernels read
   * norm weights and rows 16 bytes at a time); every tensor of a model with hidden a multiple of 8
   * is, but MLA's latent norms (q_lora_rank, kv_lora_rank values) and small biases need not be: the
   * gap before such a tensor stays zero (no tensor's, never initialized or exported) */
  if (!routed) e->groups[g].elems = round_up(e->groups[g].elems, 8);
  t->offset = e->groups[g].elems;
  /* whole-expert shards (plan_expert_per: efsdp divides El): a shard holds per = El / efsdp
   * whole experts of every routed tensor; otherwise (per 0) the group is sharded flat */
  t->per = routed ? (int)plan_expert_per(e->El, e->efsdp) : 0;
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
  if (t->muon && !routed) {
    const DenseOwner *o = mem_map_get(owners, layer_tag(l), p->name);
    if (o) t->owner = (int)o->owner;
  } else if (t->muon) { /* (whole-expert shards: orthogonalized where they are held; owner 0 unused) */
    const ExpertRun *r = mem_map_get(runs, layer_tag(l), p->name);
    if (r) t->owner = (int)r->owner;
  }
  if (t->muon) G->muon = true;
  else G->adamw = true;
}

/* MUON_WORK: plan_muon_work's figure (compiler/muon_work.c), the same the plan's
 * workspace.shared holds: the most rt_muon_groups_work (runtime/optim/muon.c: the dense groups
 * together, each expert group alone) or the cuda backend's Newton-Schulz batches ask. Its step
 * figure (rt_muon_groups_work alone: the host's MUON_WORK with the step there, the plan's
 * workspace.newton_schulz) and exchange figure (the cuda step's host scratch, the plan's
 * workspace.muon_exchange_host) beside it. */
static void muon_work(Em *e) {
  PlanMuonWork w = plan_muon_work(e->m, e->md, &e->p->best.ch, e->p->placement);
  e->muon_work = w.elems, e->muon_step = w.step, e->muon_host = w.exchange;
}

/* The shared workspace (the plan's workspace.shared, or moe.a2a_staging with expert
 * parallelism): one buffer, LWS (A2A when ep > 1), holding in turn groups of buffers of which
 * only one group is ever live, each group from the buffer's start:
 *   - the FFN gradients of gate, up and activation: a dense MLP's (DG, DU, DH: tokens x
 *     intermediate), the shared experts' (DSG, DSU, DSH) and the routed experts' (EDG, EDU, EDH:
 *     a round's rows x expert width), live only inside their FFN's backward; those run one after
 *     another (shared experts, then routed): one slot per role, the widest, the others in it;
 *   - the attention's gradients (DATT, DQ, DK, DV, DQR, DKR; with MLA its backward's buffers in
 *     their dead bytes: plan_ws_attention, compiler/attn_ws.c): from the o_proj backward to the
 *     q/k/v projections' backward, after the layer's FFN backward;
 *   - MLA's forward temporaries (WS_QAN, WS_KVN, WS_KRP, WS_KVB: plan_ws_mla_forward): inside a
 *     layer's forward (or its recompute), from the latent norms to rt_mla_kv_forward, before the
 *     attention core;
 *   - a block's output before the residual add (WS_Y: ungated shared experts write it and the
 *     routed experts' combine adds to it): inside a layer's forward (or its recompute), between
 *     its FFN's ops and its residual add;
 *   - the final norm's output LNF and the LM head's chunk logits CE (fp32): from the final norm's
 *     forward to the LM head's backward, when no layer's buffers are live;
 *   - the router logits' gradient DLOGITS (fp32): after a MoE layer's last all-to-all, before its
 *     attention's backward;
 *   - Muon's scratch MUON_WORK (fp32): the optimizer step, after the micro-batches.
 * With ep > 1, A2A also stages one all-to-all round (MOE_CAP_ROWS x HIDDEN, source-rank order),
 * but only inside rt_moe_dispatch / rt_moe_undispatch, which the compute stream waits for before
 * its next op: no group above is live across one. Sized by the largest group. */
static void shared_ws(Em *e) {
  const Spec *s = e->s;
  const int64_t N = e->N, C = e->C;
  bool moe = e->md->n_moe_layers > 0, in_a2a = moe && e->ep > 1;
  int64_t F = s->model.mlp.present ? s->model.mlp.intermediate : 0;
  int64_t n[3] = {N * F, moe ? N * e->Fs : 0, moe ? e->R * e->Fe : 0};
  bool gate[3] = {s->model.mlp.activation == ACT_SWIGLU, !e->gelu_experts, !e->gelu_experts};
  static const char *const names[3][3] = {{"DG", "DSG", "EDG"}, {"DU", "DSU", "EDU"}, {"DH", "DSH", "EDH"}};
  static const char *const whats[3][3] = {
      {"gradient of the mlp gate", "shared experts' gate gradient", "routed experts' gate gradient"},
      {"gradient of the mlp up", "shared experts' up gradient", "routed experts' up gradient"},
      {"gradient of the mlp activation", "shared experts' activation gradient", "routed experts' activation gradient"}};
  int big[3];
  int64_t at[3], ffn = 0;
  for (int r = 0; r < 3; r++) {
    big[r] = -1;
    for (int j = 0; j < 3; j++)
      if (n[j] > 0 && (r || gate[j]) && (big[r] < 0 || n[j] > n[big[r]])) big[r] = j;
    at[r] = ffn;
    if (big[r] >= 0) ffn += round_up(n[big[r]], ALIGN);
  }
  /* the attention backward's group and MLA's forward group, laid out by attn_ws.c (the plan's
   * figures); then the other groups: (name, elements of act, or fp32 values for the real ones) in
   * order */
  PlanWsGroup att = plan_ws_attention(s, e->md, N, e->cp), mla = plan_ws_mla_forward(s, N);
  struct {
    const char *name, *what;
    int64_t n;
    bool real;
  } g[4][2] = {
      {{"WS_Y", "a block's output before the residual add", N * C, false}},
      {{"LNF", "final norm output", N * C, false},
       {"CE", "logits of one vocabulary chunk (fp32) and their gradient", 2 * N * e->chunk, true}},
      {{"DLOGITS", "gradient of the router logits (fp32)", moe ? N * e->E : 0, true}},
      {{"MUON_WORK", "Muon: the pieces sent to owners and received, a matrix's gradient, its update and "
                     "Newton-Schulz scratch (fp32)", e->muon_work, true}}};
  static const char *const when[4] = {"a layer's forward", "the loss", "a MoE layer's backward after its all-to-alls",
                                      "the optimizer step"};
  int64_t size = ffn > att.size ? ffn : att.size, gat[4][2];
  if (mla.size > size) size = mla.size;
  for (int k = 0; k < 4; k++) {
    int64_t top = 0;
    for (int i = 0; i < 2; i++) {
      gat[k][i] = top;
      if (g[k][i].name && g[k][i].n > 0) top += round_up(g[k][i].real ? 2 * g[k][i].n : g[k][i].n, ALIGN);
    }
    if (top > size) size = top;
  }
  const char *ws = in_a2a ? "A2A" : "LWS";
  e->item = in_a2a ? "moe.a2a_staging" : "workspace.shared";
  if (in_a2a) {
    int64_t a2a = e->R * C;
    abuf(e, ws, a2a > size ? a2a : size,
         "all-to-all staging of one round (source-rank order: its first MOE_CAP_ROWS x HIDDEN); between "
         "all-to-alls, the shared workspace (emit_layout.c shared_ws: one group of the buffers in it at a time)");
  } else {
    abuf(e, ws, size, "shared workspace (emit_layout.c shared_ws): one group of the buffers in it at a time");
  }
  /* a fused gate|up FFN (Em.gu_fused) has one gradient of rows g | u instead of its gate's and
   * up's: from the gate slot's start over the up slot (both at least as wide as its gate) */
  for (int r = 0; r < 3; r++) {
    if (big[r] < 0) continue;
    const char *w = whats[r][big[r]];
    alias_buf(e, names[r][big[r]], ws, at[r], n[big[r]],
              mem_printf(e->m, "%s: in %s (an FFN's backward)", w, ws));
    for (int j = 0; j < 3; j++)
      if (j != big[r] && n[j] > 0 && (r || gate[j]) && !(r < 2 && j < 2 && e->gu_fused[j]))
        alias_buf(e, names[r][j], names[r][big[r]], 0, n[j],
                  mem_printf(e->m, "%s: in %s (one FFN's backward at a time)", whats[r][j], names[r][big[r]]));
  }
  for (int j = 0; j < 2; j++)
    if (e->gu_fused[j] && n[j] > 0)
      alias_buf(e, j ? "DSGU" : "DGU", ws, at[0], 2 * n[j],
                mem_printf(e->m, "%s's gradient, each token's row g | u: in %s (an FFN's backward)",
                           j ? "shared experts' gate and up" : "mlp gate and up", ws));
  for (int i = 0; i < att.nb; i++)
    alias_buf(e, att.b[i].name, ws, att.b[i].at, att.b[i].n,
              mem_printf(e->m, "%s: in %s (the attention's backward)", att.b[i].what, ws));
  for (int i = 0; i < mla.nb; i++)
    alias_buf(e, mla.b[i].name, ws, mla.b[i].at, mla.b[i].n,
              mem_printf(e->m, "%s: in %s (a layer's forward, from the latent norms to the keys and values)",
                         mla.b[i].what, ws));
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 2; i++) {
      if (!g[k][i].name || g[k][i].n <= 0) continue;
      const char *w = mem_printf(e->m, "%s: in %s (%s)", g[k][i].what, ws, when[k]);
      if (g[k][i].real) alias_real(e, g[k][i].name, ws, gat[k][i], g[k][i].n, w);
      else alias_buf(e, g[k][i].name, ws, gat[k][i], g[k][i].n, w);
    }
}

/* A dense layer's FFN (WS_G, WS_U, WS_H: class other) and a MoE layer's routed experts' (WS_EG,
 * WS_EU, WS_EH: class expert) are never alive together (a layer is one or the other, and its
 * forward, recompute and backward run alone): with both recomputed (workspace) in a model with
 * both kinds of layers, the narrower of each pair lies in the wider's bytes, as the plan's
 * activations.forward_layer holds the widest layer only. Registered before
 * the layers (whose act() calls then find them), described as the model describes the saves G, U, H
 * and EG, EU, EH. */
static void ffn_union(Em *e) {
  const Model *md = e->md;
  if (per_layer(e, SAVE_OTHER) || per_layer(e, SAVE_EXPERT) || !md->n_moe_layers || md->n_moe_layers == e->L) return;
  int64_t nd = e->N * e->s->model.mlp.intermediate, nx = e->R * e->Fe;
  bool gd = e->s->model.mlp.activation == ACT_SWIGLU, gx = !e->gelu_experts;
  static const char *const dense[3] = {"WS_G", "WS_U", "WS_H"}, *const routed[3] = {"WS_EG", "WS_EU", "WS_EH"};
  int ld = 0, lx = 0; /* a dense layer and a MoE layer: their saves describe the buffers */
  while (md->layers[ld].kind != LAYER_DENSE) ld++;
  while (md->layers[lx].kind != LAYER_MOE) lx++;
  e->item = "activations.forward_layer";
  for (int r = 0; r < 3; r++) {
    if (r == 0 && !(gd && gx)) continue; /* a gate on one side only: no pair */
    const Saved *sd = em_saved(e, ld, dense[r] + 3), *sx = em_saved(e, lx, routed[r] + 3);
    if (!sd) no_save(ld, dense[r] + 3);
    if (!sx) no_save(lx, routed[r] + 3);
    const char *dwhat = sd->what, *xwhat = sx->what;
    bool wide = nd > nx; /* the dense one is the wider */
    abuf(e, wide ? dense[r] : routed[r], wide ? nd : nx, wide ? dwhat : xwhat);
    alias_buf(e, wide ? routed[r] : dense[r], wide ? dense[r] : routed[r], 0, wide ? nx : nd,
              mem_printf(e->m, "%s: in %s (a dense layer's FFN and a MoE layer's experts are never alive together)",
                         wide ? xwhat : dwhat, wide ? dense[r] : routed[r]));
  }
}

/* Reshard after_step (Em.keep): the buffers that hold the kept groups from the first
 * micro-batch's forward to the optimizer step, each group at its kept_at, in forward order (a
 * tied head is the embedding group: held once). One buffer for both kinds, as the plan's
 * gathered.params_kept (2 B x (params - routed params + routed params / ep)), or one for the kind
 * kept, as gathered.dense_kept (2 B x (params - routed params)) or gathered.experts_kept (2 B x
 * routed params / ep); each group padded as its all-gather writes it (full), to whole 64-byte
 * lines. Before the scratch: they live across micro-batches. */
static void kept_buffers(Em *e) {
  int64_t n[2] = {0, 0};
  bool both = e->keep[0] && e->keep[1];
  for (int g = 0; g < e->ngroups; g++) {
    EmGroup *G = &e->groups[g];
    int k = G->comm ? 1 : 0;
    if (!e->keep[k]) continue;
    int b = both ? 0 : k; /* which buffer */
    G->kept_at = n[b];
    n[b] += round_up(G->full, ALIGN);
  }
  e->item = both ? "gathered.params_kept" : e->keep[0] ? "gathered.dense_kept" : "gathered.experts_kept";
  if (both) {
    e->kept_buf[0] = e->kept_buf[1] = "KEPT";
    abuf(e, "KEPT", n[0], "reshard after_step: every group gathered by the first micro-batch's forward, kept "
         "until the optimizer step (the plan's gathered.params_kept)");
    return;
  }
  if (e->keep[0]) {
    e->kept_buf[0] = "DENSE_KEPT";
    abuf(e, "DENSE_KEPT", n[0], "reshard after_step: all but the routed experts, gathered by the first "
         "micro-batch's forward, kept until the optimizer step (the plan's gathered.dense_kept)");
  }
  if (e->keep[1] && n[1]) {
    e->kept_buf[1] = "EXPERTS_KEPT";
    abuf(e, "EXPERTS_KEPT", n[1], "reshard_experts after_step: this EP rank's routed experts, gathered by the "
         "first micro-batch's forward, kept until the optimizer step (the plan's gathered.experts_kept)");
  }
}

/* Layer l's MoE buffers that are not the model's saves, registered before the experts' saves
 * (model.c's moe.experts: YP, XE, then the experts' FFN): the permutation's table OFFSETS, then
 * the token copies in expert order. With one EP rank they are the experts' input rows, the save
 * XE itself, kept as the program's XP (no all-to-all: the copies are the input; the one save the
 * program names otherwise, em_saved). With ep > 1 they are the send side WS_XP (workspace), which
 * shares bytes with DXE. */
static void moe_send(Em *e, int l) {
  const int64_t N = e->N, C = e->C, K = e->K;
  table(e, l, "OFFSETS", e->E + 1, "first row of each expert (int32)");
  if (e->ep == 1) {
    act(e, l, "XP", "token copies in expert order: the experts' input");
    return;
  }
  /* WS_XP and DXE share one buffer: WS_XP is read by the dispatches only (the forward's, and the
   * backward's rebuild of each round, rounds > 1, which gathers it again from LN2 first); DXE
   * is written after the round's last dispatch and read by its undispatch */
  e->item = "moe.dispatch_send";
  if (e->R * C > N * K * C) {
    abuf(e, "DXE", e->R * C, "gradient of the received rows (backward); in the forward, WS_XP");
    alias_buf(e, "WS_XP", "DXE", 0, N * K * C, "token copies in expert order, to send (all-to-all): in DXE "
              "(dead once dispatched; the backward gathers them again for each round it rebuilds)");
  } else {
    abuf(e, "WS_XP", N * K * C, "token copies in expert order, to send (all-to-all)");
    alias_buf(e, "DXE", "WS_XP", 0, e->R * C, "gradient of the received rows: in WS_XP (dead once dispatched; "
              "the backward gathers them again for each round it rebuilds)");
  }
}

/* Registers layer l's save sv (model.c) as its buffer: act() with the save's description, but
 *   - X, the boundary, is X<l> (registered with the boundaries);
 *   - XE with one EP rank is XP (moe_send);
 *   - YP recomputed with ep > 1 (WS_YP) lies in WS_XP: the outputs come back into the rows just
 *     sent. Undispatch of round r writes exactly the rows dispatch r read (rows of other rounds
 *     untouched), the combine reads them after the last round, and the backward's rebuild of WS_XP
 *     (rounds > 1) comes after rt_moe_combine_backward, their last reader;
 *   - XE with ep > 1 (the rows received) is followed by the experts' outputs before they go back
 *     (WS_YE, workspace) and the round's table EOFF. */
static void layer_save(Em *e, int l, const Saved *sv) {
  const char *n = sv->name;
  if (strcmp(n, "X") == 0 || (e->ep == 1 && strcmp(n, "XE") == 0)) return;
  if (e->qkv_fused && (strcmp(n, "K") == 0 || strcmp(n, "V") == 0)) return; /* in QKV */
  for (int f = 0; f < 2; f++) { /* the gate and up projections' rows g | u in one buffer */
    const char *g = f ? "SG" : "G", *u = f ? "SU" : "U";
    if (!e->gu_fused[f]) continue;
    if (strcmp(n, u) == 0) return; /* in GU / SGU */
    if (strcmp(n, g) == 0) {
      e->item = layer_item(e, l, sv->cls);
      add_buf(e, em_act(e, l, f ? "SGU" : "GU"), em_saved_elems(e, l, g) + em_saved_elems(e, l, u),
              f ? "shared experts' gate and up: each token's row g | u, the fused projection's output"
                : "mlp gate and up: each token's row g | u, the fused projection's output", EM_ACT);
      return;
    }
  }
  if (e->qkv_fused && strcmp(n, "Q") == 0) { /* one GEMM's output: Q, K, V's bytes as one buffer */
    e->item = layer_item(e, l, sv->cls);
    add_buf(e, em_act(e, l, "QKV"), em_saved_elems(e, l, "Q") + em_saved_elems(e, l, "K") + em_saved_elems(e, l, "V"),
            "queries and keys (rotated) and values: each token's row q | k | v, the fused projection's output",
            EM_ACT);
    return;
  }
  if (e->ep > 1 && strcmp(n, "YP") == 0 && !per_layer(e, SAVE_EXPERT)) {
    alias_buf(e, "WS_YP", "WS_XP", 0, e->N * e->K * e->C, "expert outputs in expert order: in WS_XP's rows (each "
              "round's outputs land in the rows that round sent; dead after rt_moe_combine_backward, before WS_XP is rebuilt)");
    return;
  }
  act(e, l, n, sv->what);
  if (e->ep > 1 && strcmp(n, "XE") == 0) {
    e->item = "moe.combine_send";
    abuf(e, "WS_YE", e->R * e->C, "their outputs, before going back");
    table(e, l, "EOFF", e->El + 1, "first row of each local expert in the round (int32)");
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
  const ModelSpec *ms = &e->s->model;
  bool unioned = !per_layer(e, SAVE_OTHER) && !per_layer(e, SAVE_EXPERT) && md->n_moe_layers && md->n_moe_layers < e->L;
  e->gu_fused[0] = ms->mlp.present && ms->mlp.activation == ACT_SWIGLU && !ms->bias && !unioned;
  e->gu_fused[1] = md->n_moe_layers && e->Fs && !e->gelu_experts && !ms->bias;

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
  MemMap owners = {0}, runs = {0}; /* the last entry of a (layer, matrix) wins, as in the placement's lists */
  const Placement *pl = e->p->placement;
  for (int i = 0; pl && i < pl->ndense; i++)
    mem_map_put(e->m, &owners, layer_tag(pl->dense[i].layer), pl->dense[i].matrix, &pl->dense[i]);
  for (int i = 0; pl && i < pl->nruns; i++)
    mem_map_put(e->m, &runs, layer_tag(pl->runs[i].layer), pl->runs[i].matrix, &pl->runs[i]);
  for (int i = 0; i < md->nops; i++) {
    const Op *o = &md->ops[i];
    for (int j = 0; j < o->nparams; j++) {
      const Param *p = &o->params[j];
      int g = o->layer < 0 ? (o->kind == OP_EMBED || o->kind == OP_POS_EMBED ? e->g_embed : e->g_head)
                           : (p->kind == PK_ROUTED ? e->layer_experts[o->layer] : e->layer_dense[o->layer]);
      add_tensor(e, g, o->layer, p, &owners, &runs);
    }
  }
  for (int g = 0; g < e->ngroups; g++) {
    EmGroup *G = &e->groups[g];
    int64_t ranks = G->comm ? e->efsdp : e->fsdp;
    bool whole = G->comm && G->first <= G->last && e->tensors[G->first].per;
    /* shards of whole 16-byte vectors of bf16 (cuda kernels) */
    G->full = whole ? ranks * round_up(G->elems, 8) : ranks * plan_flat_shard(G->elems, ranks);
    G->shard = G->full / ranks;
    for (int i = G->first; whole && i <= G->last; i++) e->tensors[i].block = G->shard;
  }

  muon_work(e);
  /* the state arena (fp32, in the plan's optimizer tier), laid out as the plan's state block
   * (plan.c, sized by plan_state): every group's master shard (master.fp32_shard), then every
   * gradient shard (grads.fp32_shard), then every first moment (AdamW's, or Muon's momentum:
   * optimizer.momentum under Muon, else optimizer.adamw_moments), then AdamW's second moments
   * (optimizer.adamw_second_moment under Muon): only the values of a group's AdamW tensors in this
   * rank's shard, compacted in the order rt_adamw_shard visits them, sized by the most any rank
   * holds (none for a group of Muon matrices only) */
  const bool muon_opt = e->s->training.optimizer == OPT_MUON;
  for (int g = 0; g < e->ngroups; g++) {
    EmGroup *G = &e->groups[g];
    int n = 0;
    int64_t *r = mem_array(e->m, 2 * (size_t)(G->last - G->first + 1) + 2, sizeof *r), whole = 0;
    for (int i = G->first; i <= G->last; i++) {
      const EmTensor *t = &e->tensors[i];
      if (t->group != g || t->muon) continue;
      if (t->experts && t->per) whole += t->count * t->per; /* the same values in every shard */
      else r[2 * n] = t->offset, r[2 * n + 1] = t->offset + t->count * (t->experts ? t->experts : 1), n++;
    }
    int64_t ranks = G->comm ? e->efsdp : e->fsdp;
    G->second = whole + plan_shard_values_max(e->m, r, n, G->shard, ranks);
  }
  static const char *const part[3] = {"MASTER", "GRAD", "ADAM_M"};
  for (int k = 0; k < 4; k++) {
    e->item = k == 0 ? "master.fp32_shard" : k == 1 ? "grads.fp32_shard" : !muon_opt ? "optimizer.adamw_moments"
              : k == 2 ? "optimizer.momentum" : "optimizer.adamw_second_moment";
    for (int g = 0; g < e->ngroups; g++) {
      EmGroup *G = &e->groups[g];
      const char *name = mem_printf(e->m, "%s_%s", G->cname, k < 3 ? part[k] : "ADAM_V");
      const char *what = k == 0 ? mem_printf(e->m, "%s: this rank's fp32 master shard", G->name)
                         : k == 1 ? mem_printf(e->m, "%s: its gradient, accumulated over micro-batches", G->name)
                         : k == 2 ? mem_printf(e->m, "%s: %s", G->name, !G->muon ? "AdamW first moment (fp32)"
                                                                        : G->adamw ? "Muon momentum and AdamW first moment (fp32)"
                                                                                   : "Muon momentum (fp32)")
                                  : mem_printf(e->m, "%s: AdamW second moment of its AdamW tensors' values in the shard, "
                                               "compacted (fp32)", G->name);
      add_buf(e, name, k < 3 ? G->shard : G->second, what, EM_STATE);
    }
  }
  /* the arenas R and A: first what lives across micro-batches (tokens, aux_free's expert loads;
   * the shards gathered from when the master is on the host), then what each micro-batch writes
   * before it reads it */
  e->item = "data.tokens";
  buf(e, "INPUTS", N, "token ids of the micro-batch (int32)");
  buf(e, "TARGETS", N, "next-token targets (int32)");
  e->item = "moe.expert_loads";
  for (int l = 0; e->aux_free && l < e->L; l++)
    if (md->layers[l].kind == LAYER_MOE) buf(e, mem_printf(e->m, "L%d_LOAD", l), e->E, "tokens per expert this step (aux_free)");
  /* the shards the all-gathers read, in the activation type: with the master on the host, every
   * group's (the plan's params.bf16_shard), refreshed after each optimizer step; with the master
   * in HBM, a unit's shards are cast into CAST<u % (P + 1)> (dense, then experts) just before its
   * gathers start (the plan's params.bf16_cast: one per buffer of the gathered pool) */
  e->item = "params.bf16_shard";
  if (e->state_host)
    for (int g = 0; g < e->ngroups; g++)
      abuf(e, mem_printf(e->m, "%s_PARAM", e->groups[g].cname), e->groups[g].shard,
           "its shard cast to the activation type, gathered from: refreshed after each optimizer step");
  kept_buffers(e);
  e->scratch[EM_REAL] = e->top[EM_REAL], e->scratch[EM_ACT] = e->top[EM_ACT];
  e->nlive = e->nbufs;
  if (!e->state_host) {
    int64_t unit = e->groups[e->g_embed].shard > e->groups[e->g_head].shard ? e->groups[e->g_embed].shard
                                                                             : e->groups[e->g_head].shard;
    for (int l = 0; l < e->L; l++) {
      int64_t u = e->groups[e->layer_dense[l]].shard + (e->layer_experts[l] >= 0 ? e->groups[e->layer_experts[l]].shard : 0);
      if (u > unit) unit = u;
    }
    e->item = "params.bf16_cast";
    for (int i = 0; i <= e->prefetch; i++)
      abuf(e, mem_printf(e->m, "CAST%d", i), unit,
           mem_printf(e->m, "units u with u %% %d = %d: their master shards cast to the activation type just before "
                      "their all-gathers (dense, then experts), read by them until waited for", e->prefetch + 1, i));
  }
  /* units (embedding 0, layer l = l + 1, head L + 1): while one computes, the next P units' gathers
   * (P the plan's prefetch depth) are in flight into the other buffers of the pool, and in the
   * backward the previous unit's gradient is reduce-scattered from the other of two gradient
   * buffers. A unit's dense group and its experts share one buffer (dense first), as the plan's
   * gathered.params[i] and grads.bf16_unsharded[i] items hold a layer: sized by the largest unit
   * (the pool by the largest unit's groups not kept gathered: the plan's gathered_group_bytes) */
  int64_t max_unit = 0, max_pool = 0;
  for (int u = 0; u <= e->L + 1; u++) {
    int gd = u == 0 ? e->g_embed : u == e->L + 1 ? e->g_head : e->layer_dense[u - 1];
    int gx = u >= 1 && u <= e->L ? e->layer_experts[u - 1] : -1;
    int64_t d = e->groups[gd].full, x = gx >= 0 ? e->groups[gx].full : 0;
    int64_t pool = (e->keep[0] ? 0 : d) + (e->keep[1] ? 0 : x);
    if (d + x > max_unit) max_unit = d + x;
    if (pool > max_pool) max_pool = pool;
  }
  for (int i = 0; max_pool && i <= e->prefetch; i++) { /* the plan's gathered.params[i]: unit u in GATHERED<u % (P + 1)> */
    e->item = mem_printf(e->m, "gathered.params[%d]", i);
    abuf(e, mem_printf(e->m, "GATHERED%d", i), max_pool,
        mem_printf(e->m, "units u with u %% %d = %d: parameters all-gathered, %s", e->prefetch + 1, i,
                   e->keep[0] ? "the routed experts (the rest is kept in DENSE_KEPT)"
                   : e->keep[1] ? "all but the routed experts (kept in EXPERTS_KEPT)" : "dense then experts"));
  }
  /* the plan's grads.bf16_unsharded[0..1]: the unit's weight gradients in the activation type
   * (bf16 on cuda), reduce-scattered from these bytes (bf16 wire: in place) */
  e->item = "grads.bf16_unsharded[0]";
  abuf(e, "GRAD0", max_unit, "an even unit's gradient, dense then experts, then its reduce-scatters' input (in place)");
  e->item = "grads.bf16_unsharded[1]";
  abuf(e, "GRAD1", max_unit, "an odd unit's (in flight while the next unit's backward runs)");
  /* grad_reduce_dtype fp32 (the plan's grads.fp32_wire[0..1]): a unit's gradient cast to fp32 and
   * reduce-scattered there in place, laid out as GRAD<u % 2> */
  if (e->s->training.grad_reduce_dtype != WIRE_BF16 && e->fsdp > 1)
    for (int i = 0; i < 2; i++) {
      e->item = mem_printf(e->m, "grads.fp32_wire[%d]", i);
      buf(e, mem_printf(e->m, "RS_WIRE%d", i), max_unit,
          mem_printf(e->m, "fp32 on the wire: GRAD%d's values in fp32, reduce-scattered in place", i));
    }
  if (e->offload) /* X0..XL are aliases of these (step.c's map) */
    for (int i = 0; i < 3; i++) {
      e->item = mem_printf(e->m, "activations.offload_staging[%d]", i);
      abuf(e, mem_printf(e->m, "XSLOT%d", i), N * C, mem_printf(e->m, "boundaries l with l %% 3 = %d (residual stream)", i));
    }
  else
    for (int l = 0; l <= e->L; l++) { /* the plan's stacked item of layer l (its boundary); X<L>: its own */
      e->item = l == e->L        ? "activations.final_boundary"
                : e->ac == AC_FULL ? mem_printf(e->m, "activations.boundary[%d]", l)
                                   : mem_printf(e->m, "activations.saved[%d]", l);
      abuf(e, mem_printf(e->m, "X%d", l), l < e->L ? em_saved_elems(e, l, "X") : N * C, /* (X<L>: the final norm's) */
          l < e->L ? mem_printf(e->m, "boundary: input of layer %d (residual stream)", l) : "output of the last layer");
    }
  e->host_elems = e->offload && e->L >= 3 ? (e->L - 2) * N * C : 0;
  ffn_union(e);
  int64_t st = e->s->model.norm == NORM_LAYERNORM ? 2 : 1; /* norm statistics per token: rstd (and the mean) */
  /* each layer's buffers: the model graph's saves of the layer, op by op, save by save
   * (layer_save), with the experts' tables and send sides before the experts' saves (moe_send) */
  for (int l = 0; l < e->L; l++) {
    const Layer *ly = &md->layers[l];
    for (int i = ly->first_op; i < ly->first_op + ly->nops; i++) {
      const Op *o = &md->ops[i];
      if (o->kind == OP_EXPERTS) moe_send(e, l);
      for (int j = 0; j < o->nsaved; j++) layer_save(e, l, &o->saved[j]);
    }
  }
  /* workspace: forward temporaries and backward gradients, reused by every layer */
  e->item = "activations.grad_residual[0]";
  abuf(e, "DX_A", N * C, "gradient of the residual stream (even layers' output)");
  e->item = "activations.grad_residual[1]";
  abuf(e, "DX_B", N * C, "gradient of the residual stream (odd layers' output)");
  e->item = "activations.grad_norm";
  abuf(e, "DLN", N * C, "gradient of a norm's output");
  if (e->cp > 1) { /* context parallelism: one layer's keys and values of the whole sequences, and their gradient */
    e->item = "attention.kv_gathered";
    abuf(e, "KVG", e->B * e->T * (e->KV + e->VW), "keys (B, T, kv_heads x head_dim) then values of the whole sequences, "
         "all-gathered over the cp group");
    e->item = "attention.dkv_gathered";
    abuf(e, "DKVG", e->B * e->T * (e->KV + e->VW), "their gradient over the whole sequences, reduce-scattered over the "
         "cp group");
  }
  shared_ws(e);
  if (md->n_moe_layers) {
    e->item = "moe.grad_routing_weights";
    buf(e, "DWTS", N * K, "gradient of the routing weights");
    e->item = "moe.grad_expert_out";
    if (!e->hier) /* (hierarchical: the gradient goes to the owners per token and comes back summed) */
      abuf(e, "DYP", N * K * C, "gradient of the expert outputs");
    if (e->ep > 1 && !e->hier) /* undispatch of round r writes the rows dispatch r sent, as WS_YP in WS_XP */
      alias_buf(e, "DXP", "DYP", 0, N * K * C, "gradient of the token copies: in DYP's rows (each round's "
                "gradients land in the rows that round dispatched; rows of other rounds untouched)");
    /* (one rank: the backward writes the token copies' gradient into the layer's YP, WS_YP or
     * L<l>_YP, dead after rt_moe_combine_backward; rt_experts_backward reads DYP while it writes it) */
    if (e->ep > 1) {
      alias_buf(e, "DYE", "WS_YE", 0, e->R * C, "gradient of the received rows' outputs: in WS_YE (the outputs of "
                "the backward's (re)computed forward, which nothing reads: dispatched into after them in each round)");
      e->item = "moe.tables";
      buf(e, "WS_EOFF", e->El + 1, "backward's first row of each local expert in the round (int32)");
    }
    if (e->hier) { /* the hierarchical all-to-all (mtrt_hier.h) */
      const PlanHierRows *h = &e->hr;
      e->item = "moe.hier_staging";
      abuf(e, "HS", (h->us + h->ur + h->st) * C, "the hierarchical all-to-all's staging: HUS, HUR, HST");
      alias_buf(e, "HUS", "HS", 0, h->us * C, "the origin's rows, one per token and destination node");
      alias_buf(e, "HUR", "HS", h->us * C, h->ur * C, "the relay's rows, one per token and origin node (summed "
                "there by the combine)");
      alias_buf(e, "HST", "HS", (h->us + h->ur) * C, h->st * C, "the relay's staging of copies for a peer of its "
                "node (a message's most)");
      e->item = "moe.hier_scalars";
      buf(e, "HEW", e->R, "the gates of the rows received (the backward's dispatch)");
      buf(e, "HDV", e->R, "their gradient, the output's gradient x the output, going back to the routing weights");
      alias_buf(e, "WS_YH", "WS_XP", 0, N * C, "the experts' outputs summed per token over the rounds (the "
                "forward: WS_XP holds no copies with the hierarchical all-to-all)");
    }
    if (e->Fs) {
      if (e->s->model.moe.shared_expert_gate) {
        e->item = "moe.grad_shared_gate";
        abuf(e, "DSO", N * C, "gradient of the shared experts' output before the gate");
        buf(e, "DSGL", N, "gradient of the gate's logits (fp32)");
      }
    }
    e->item = "moe.tables";
    /* the sequence-wise loss's cuda statistics: 2 E per sequence of the micro-batch */
    int64_t aux = e->s->model.moe.seq_aux_loss_coef > 0 && 2 * e->B > 3 ? 2 * e->B * e->E : 3 * e->E;
    buf(e, "AUX", aux, "load-balancing loss scratch");
  }
  e->item = "activations.loss_stats";
  buf(e, "RSTDF", N * st, st == 2 ? "its rstd, then its mean, per token" : "its 1/rms per token");
  buf(e, "LSEF", N, "log-sum-exp of each token's logits");
}
