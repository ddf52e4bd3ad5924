/* plan.c — memory items of a candidate plan, their tiers and lifetimes, and the static
 * arena of each tier packed from them.
 *
 * Everything is per GPU. T = micro_batch × seq_len / cp tokens per micro-batch (cp: the
 * context-parallel ranks a sequence is split over); P = parameters;
 * L = layers. Lifetimes are in phases of one step (PHASE_* in mtc.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

enum { PHASE_MAX = 1 << 30 };

static const char *const tier_names[TIER__COUNT] = {"hbm", "host", "nvme"};
static const char *const cat_names[CAT__COUNT] = {
    "parameters", "gathered parameters", "gradients", "optimizer state", "activations",
    "MoE buffers", "workspace", "reserve"};
static const char *const ac_names[] = {"auto", "none", "selective", "full"};
static const char *const offload_names[] = {"auto", "none", "host", "nvme"};

const char *plan_tier_name(Tier t) { return tier_names[t]; }
const char *plan_cat_name(ItemCategory c) { return cat_names[c]; }
const char *plan_ac_name(CheckpointPolicy p) { return ac_names[p]; }
const char *plan_ac_words(CheckpointPolicy p) { return p == AC_NONE ? "no" : ac_names[p]; }
const char *plan_offload_name(OffloadPolicy p) { return offload_names[p]; }

int64_t plan_cp(const Choice *ch) { return ch->cp > 1 ? ch->cp : 1; }

typedef struct {
  Mem *m;
  Candidate *c;
  int cap;
} Items;

/* A formatted item name or formula, or "" while the search packs a candidate (Candidate.quick):
 * only the winner's items are read. */
#define TEXT(it, ...) ((it)->c->quick ? "" : mem_printf((it)->m, __VA_ARGS__))

static void item(Items *it, const char *name, ItemCategory cat, Tier tier, double bytes, int start,
                 int end, const char *formula) {
  Candidate *c = it->c;
  if (c->nitems == it->cap) {
    int cap = it->cap ? 2 * it->cap : 64;
    MemItem *n = mem_array_raw(it->m, (size_t)cap, sizeof *n); /* (each written whole by the line below) */
    if (c->nitems) memcpy(n, c->items, (size_t)c->nitems * sizeof *n);
    c->items = n, it->cap = cap;
  }
  c->items[c->nitems++] = (MemItem){name, formula, cat, tier, (int64_t)bytes, start, end, 0, false};
}

/* Largest bf16 bytes one GPU gathers for one layer: its dense parameters whole and the routed
 * experts of its EP rank (E / ep of them) whole. The embedding and LM head gather through
 * the same buffers. */
static double gathered_group_bytes(const Model *md, int64_t ep, bool dense, bool experts) {
  double best = 0;
  for (int l = 0; l < md->nlayers; l++) {
    const Layer *ly = &md->layers[l];
    double p = (dense ? (double)(ly->params - ly->routed_params) : 0) +
               (experts ? (double)ly->routed_params / (double)ep : 0);
    if (p > best) best = p;
  }
  /* the units outside the layers as the program groups them (emit_layout.c): the embedding
   * (with learned positions) and the head, which holds the final norm (a tied head: the
   * embedding group again) */
  double emb = md->unit_embed_params, head = md->unit_head_params;
  if (md->spec->model.tie_embeddings) head = emb;
  if (dense && emb > best) best = emb;
  if (dense && head > best) best = head;
  return 2.0 * best;
}

static double gathered_bytes(const Model *md, int64_t ep) { return gathered_group_bytes(md, ep, true, true); }

/* bf16 bytes one GPU holds with every parameter gathered (reshard after_step): all of the
 * model but the routed experts whole, and the routed experts of its EP rank (E / ep of them):
 * 2 B × (P − P_routed + P_routed / ep). */
static double kept_gathered_bytes(const Model *md, int64_t ep) {
  double routed = 0;
  for (int l = 0; l < md->nlayers; l++) routed += (double)md->layers[l].routed_params;
  return 2.0 * ((double)md->params_total - routed + routed / (double)ep);
}

bool plan_keeps(CheckpointPolicy ac, SaveClass cls) {
  if (cls == SAVE_BOUNDARY || ac == AC_NONE) return true;
  return ac == AC_SELECTIVE && cls == SAVE_ATTN;
}

bool plan_recomputes(CheckpointPolicy ac, OpKind k) {
  if (ac == AC_NONE) return false;
  if (ac == AC_FULL) return true;
  return !(k == OP_QKV || k == OP_QK_NORM || k == OP_ROPE || k == OP_ATTN_CORE); /* selective */
}

double plan_moe_imbalance_max(const Spec *s, int64_t ep) {
  const MoeSpec *moe = &s->model.moe;
  if (!moe->present || ep <= 1) return 1.0;
  int64_t per_rank = moe->experts / ep, k = moe->top_k;
  return (double)ep * (double)(k < per_rank ? k : per_rank) / (double)k;
}

double plan_moe_imbalance(const Spec *s, int64_t ep) {
  double max = plan_moe_imbalance_max(s, ep);
  return s->plan.moe_imbalance < max ? s->plan.moe_imbalance : max;
}

bool plan_hier(const Spec *s, const Choice *ch) {
  return ch->dispatch == DISPATCH_HIERARCHICAL && ch->ep > s->cluster.gpus_per_node &&
         ch->ep % s->cluster.gpus_per_node == 0;
}

PlanHierRows plan_hier_rows(const Spec *s, int64_t ep, int64_t tokens, int64_t cap) {
  int64_t g = s->cluster.gpus_per_node, nodes = ep / g, k = s->model.moe.top_k;
  return (PlanHierRows){g, nodes, tokens * (k < nodes ? k : nodes), tokens * nodes, (cap + g - 1) / g};
}

/* Expert activations per token, the routed part grown by the imbalance an EP rank sees. */
static double expert_bytes(const Layer *ly, double imb) {
  return (double)(ly->saved_bytes[SAVE_EXPERT] - ly->saved_routed) + imb * (double)ly->saved_routed;
}

/* Bytes per token of one class of a layer's saves, the routed part grown by imb. */
static double class_bytes(const Layer *ly, SaveClass c, double imb) {
  return c == SAVE_EXPERT ? expert_bytes(ly, imb) : (double)ly->saved_bytes[c];
}

/* Bytes per token of everything a layer keeps under policy ac (plan_keeps). */
static double kept_per_token(const Layer *ly, CheckpointPolicy ac, double imb) {
  double b = 0;
  for (int c = SAVE_BOUNDARY; c <= SAVE_OTHER; c++)
    if (plan_keeps(ac, (SaveClass)c)) b += class_bytes(ly, (SaveClass)c, imb);
  return b;
}

/* What one layer rebuilds during its backward under policy ac, per token. */
static double recomputed_per_token(const Layer *ly, CheckpointPolicy ac, double imb) {
  double b = 0;
  for (int c = SAVE_BOUNDARY; c <= SAVE_OTHER; c++)
    if (!plan_keeps(ac, (SaveClass)c)) b += class_bytes(ly, (SaveClass)c, imb);
  return b;
}

/* Whether layers a and b save the same bytes per token (kept_per_token and recomputed_per_token
 * give the same for both). */
static bool same_saves(const Layer *a, const Layer *b) {
  return a->saved_routed == b->saved_routed && memcmp(a->saved_bytes, b->saved_bytes, sizeof a->saved_bytes) == 0;
}

static void build_items(Items *it, const Model *md) {
  const Spec *s = md->spec;
  const Choice *ch = &it->c->ch;
  const int L = md->nlayers, END = PHASE_END(L);
  const int64_t cp = plan_cp(ch);
  const double T = (double)ch->micro_batch * (double)s->training.seq_len / (double)cp;
  const double P = (double)md->params_total, H = (double)s->model.hidden;
  /* experts' shards (plan_expert_per): whole experts, per of them on each rank of an EP rank's
   * shard group, only where efsdp divides E / ep, else flat; so no shard is padded to a largest
   * share (pad elements: per − El / efsdp experts, 0 under this rule) */
  const int64_t E = s->model.moe.present ? s->model.moe.experts : 0, El = E ? E / ch->ep : 0;
  const int64_t per = plan_expert_per(El, ch->efsdp);
  double routed = 0;
  for (int l = 0; l < L; l++) routed += (double)md->layers[l].routed_params;
  const double pad = E && per ? routed / (double)E * ((double)per - (double)El / (double)ch->efsdp) : 0;
  const double shard = P / (double)ch->fsdp + pad;
  const bool muon = s->training.optimizer == OPT_MUON;
  const Tier ot = ch->opt_tier;
  const ReserveSpec *r = &s->cluster.reserve;

  /* static state, sharded over the FSDP group (experts: P_e / (ep × fsdp/ep) = P_e / fsdp).
   * With the fp32 master in HBM the bf16 copy is cast per layer into the all-gather (as
   * FSDP2 does); with the master on host, a bf16 shard stays in HBM to gather from. */
  double g = gathered_bytes(md, ch->ep);
  if (ot == TIER_HOST)
    item(it, "params.bf16_shard", CAT_PARAMS, TIER_HBM, 2 * shard, 0, END, "2 B x params / fsdp");
  else
    /* (a unit's shard per GPU: its dense parameters / fsdp and its EP rank's experts / (fsdp / ep),
     * i.e. all of its parameters / fsdp) */
    item(it, "params.bf16_cast", CAT_PARAMS, TIER_HBM,
         (double)(ch->prefetch + 1) * gathered_group_bytes(md, 1, true, true) / (double)ch->fsdp, 1, PHASE_OPT(L),
         "(prefetch + 1) x 2 B x the largest unit's parameters (a layer with all its experts, the embedding or the "
         "head) / fsdp: a unit's shard cast to bf16 for its all-gathers, one per buffer of the gathered pool");
  /* the state block (plan_state: the groups laid out as the program's state arena, each part
   * rounded to 64 B per group), contiguous in this order, as the program's state arena holds it:
   * every group's master shard, then every gradient shard, then the first moments (AdamW's, or
   * Muon's momentum: one fp32 per value of the shard), then AdamW's second moments (only the
   * AdamW tensors' values, compacted: under Muon, not its matrices') */
  const PlanState ps = plan_state(md, ch);
  const double S4 = 4 * (double)ps.shards, V4 = 4 * (double)ps.second;
  const int first_state = it->c->nitems;
  item(it, "master.fp32_shard", CAT_OPTIMIZER, ot, S4, 0, END,
       pad > 0 ? "4 B x (params / fsdp + the padding of whole-expert shards to the largest share), per group rounded "
                 "to 16 values"
               : "4 B x params / fsdp, per group rounded to 16 values");
  item(it, "grads.fp32_shard", CAT_GRADS, ot, S4, 0, END,
       "as master.fp32_shard: the gradient shards (reduce-scattered, accumulated in fp32)");
  if (muon) {
    item(it, "optimizer.momentum", CAT_OPTIMIZER, ot, S4, 0, END,
         "as master.fp32_shard: one fp32 first moment per value (Muon's momentum; AdamW's first moment of the rest)");
    item(it, "optimizer.adamw_second_moment", CAT_OPTIMIZER, ot, V4, 0, END,
         "4 B x the most values of AdamW tensors (embedding, head, norms, routers, biases) one rank's shard of a group "
         "holds, per group rounded to 16 values: AdamW's second moment, compacted (none for Muon's matrices)");
  } else
    item(it, "optimizer.adamw_moments", CAT_OPTIMIZER, ot, S4 + V4, 0, END,
         "as master.fp32_shard (first moment) + 4 B x the most values one rank's shard of a group holds, per group "
         "rounded to 16 values (second moment)");
  for (int i = first_state; i < it->c->nitems; i++) it->c->items[i].state = true;
  /* the state in HBM: the cuda program keeps a host copy of it (pageable), which initialization,
   * resume and checkpoints read and write (templates/train/00-backend.c's state_mirror) */
  if (ot == TIER_HBM)
    item(it, "state.host_mirror", CAT_OPTIMIZER, TIER_HOST, 3 * S4 + V4, 0, END,
         "master.fp32_shard + grads.fp32_shard + the optimizer's moments: the host copy of the HBM state "
         "(initialization, resume, checkpoints)");
  if (ot == TIER_HBM) it->c->items[it->c->nitems - 1].outside = true; /* (its own allocation) */

  /* per-layer working buffers: a pool of gathered layers (the computing one + prefetch) and
   * two unsharded bf16 gradient buffers (one computing, one in reduce-scatter) */
  const bool keep_d = ch->reshard == RESHARD_AFTER_STEP, keep_e = ch->reshard_experts == RESHARD_AFTER_STEP;
  double routed_all = 0;
  for (int l = 0; l < L; l++) routed_all += (double)md->layers[l].routed_params;
  if (keep_d && keep_e)
    item(it, "gathered.params_kept", CAT_GATHERED, TIER_HBM, kept_gathered_bytes(md, ch->ep), 1, PHASE_OPT(L),
         "2 B x (params - routed params + routed params / ep): every layer, embedding and head kept "
         "gathered from the first forward to the optimizer step (reshard after_step)");
  else if (keep_d || keep_e) { /* one group kept, the other through a pool of its own size */
    if (keep_d)
      item(it, "gathered.dense_kept", CAT_GATHERED, TIER_HBM, 2.0 * ((double)md->params_total - routed_all), 1,
           PHASE_OPT(L), "2 B x (params - routed params): every parameter but the routed experts kept gathered "
           "from the first forward to the optimizer step (reshard after_step)");
    else
      item(it, "gathered.experts_kept", CAT_GATHERED, TIER_HBM, 2.0 * routed_all / (double)ch->ep, 1, PHASE_OPT(L),
           "2 B x routed params / ep: the EP rank's routed experts kept gathered from the first forward to the "
           "optimizer step (reshard_experts after_step)");
    double gp = gathered_group_bytes(md, ch->ep, !keep_d, !keep_e);
    for (int i = 0; i <= ch->prefetch; i++)
      item(it, TEXT(it, "gathered.params[%d]", i), CAT_GATHERED, TIER_HBM, gp, 1, PHASE_OPT(L),
           keep_d ? "2 B x the routed experts / ep of the largest layer (re-gathered per micro-batch)"
                  : "2 B x the largest layer's dense params, embedding or head (re-gathered per micro-batch)");
  } else
    for (int i = 0; i <= ch->prefetch; i++)
      item(it, TEXT(it, "gathered.params[%d]", i), CAT_GATHERED, TIER_HBM, g, 1, PHASE_OPT(L),
           "2 B x (dense params of the largest layer + its routed experts / ep)");
  for (int i = 0; i < 2; i++)
    item(it, TEXT(it, "grads.bf16_unsharded[%d]", i), CAT_GRADS, TIER_HBM, g,
         PHASE_LOSS(L), PHASE_OPT(L), "as gathered.params: one layer's gradient before reduce-scatter");
  /* grad_reduce_dtype fp32: each gradient buffer's values cast to fp32 and reduce-scattered there
   * in place (bf16: the bf16 buffer itself is reduce-scattered in place) */
  if (s->training.grad_reduce_dtype != WIRE_BF16 && ch->fsdp > 1)
    for (int i = 0; i < 2; i++)
      item(it, TEXT(it, "grads.fp32_wire[%d]", i), CAT_GRADS, TIER_HBM, 2 * g, PHASE_LOSS(L), PHASE_OPT(L),
           "4 B per value of grads.bf16_unsharded: its gradient in fp32 on the wire (grad_reduce_dtype fp32)");

  /* activations kept from each layer's forward to its backward; the experts' side of the
   * all-to-all receives up to moe_imbalance × the mean tokens when ep > 1 */
  const double imb = plan_moe_imbalance(s, ch->ep);
  bool off = ch->offload == OFF_HOST || ch->offload == OFF_NVME;
  Tier off_tier = ch->offload == OFF_NVME ? TIER_NVME : TIER_HOST;
  /* (while the search packs a candidate, the layers' items are one item per tier, as pack()
   * stacks them: each layer's bytes in turn, 256-byte aligned, alive over their lifetimes' union) */
  double per_token = 0; /* kept_per_token of the last layer whose saves differ from the one before */
  int64_t stack_bytes = 0;
  int stack_start = PHASE_MAX, stack_end = 0;
  Tier stack_tier = off && ch->ac == AC_FULL ? off_tier : TIER_HBM;
  for (int l = 0; l < L; l++) {
    const Layer *ly = &md->layers[l];
    if (l == 0 || !same_saves(ly, ly - 1)) per_token = kept_per_token(ly, ch->ac, imb);
    double kept = per_token * T;
    const char *what = ch->ac == AC_FULL ? "activations.boundary" : "activations.saved";
    Tier t = stack_tier;
    /* offloaded: the last two boundaries never leave the device (the program's OFFLOAD_IDS is
     * L - 2): they stay in activations.offload_staging's buffers until their backward */
    if (t != TIER_HBM && l >= L - 2) continue;
    if (it->c->quick) {
      stack_bytes = (stack_bytes + (int64_t)kept + 255) / 256 * 256;
      if (PHASE_FWD(L, l) < stack_start) stack_start = PHASE_FWD(L, l);
      if (PHASE_BWD(L, l) + 1 > stack_end) stack_end = PHASE_BWD(L, l) + 1;
      continue;
    }
    item(it, TEXT(it, "%s[%d]", what, l), CAT_ACTIVATIONS, t, kept, PHASE_FWD(L, l),
         PHASE_BWD(L, l) + 1,
         ch->ac == AC_FULL ? "2 B x hidden x tokens (the layer's input)"
                           : "saved bytes per token of the layer (model graph) x tokens");
    it->c->items[it->c->nitems - 1].stacked = true;
  }
  if (it->c->quick && stack_end > 0) {
    item(it, "", CAT_ACTIVATIONS, stack_tier, (double)stack_bytes, stack_start, stack_end, "");
    it->c->items[it->c->nitems - 1].stacked = true;
  }
  if (it->c->bound == 1) goto outside;
  /* with ep > 1 and the experts' activations recomputed, y_combined (the experts' outputs back in
   * token order) lives in moe.dispatch_send's bytes: each round's outputs come back into the rows
   * that round sent (the program's WS_YP is WS_XP) */
  const double kH2 = md->n_moe_layers ? 2 * (double)s->model.moe.top_k * H : 0;
  const bool yp_in_send = ch->ep > 1 && !plan_keeps(ch->ac, SAVE_EXPERT);
  double boundary = 2 * H * T, rebuilt = 0, ffn_gate = 0, ffn = 0;
  const bool mlp_glu = s->model.mlp.activation == ACT_SWIGLU, moe_glu = s->model.moe.activation == ACT_SWIGLU;
  for (int l = 0; l < L; l++) {
    const Layer *ly = &md->layers[l];
    double yc = ly->kind == LAYER_MOE && yp_in_send ? kH2 : 0;
    /* what the layer does not keep (never its input boundary: its stacked item or an offload slot) */
    if (l == 0 || !same_saves(ly, ly - 1)) per_token = recomputed_per_token(ly, ch->ac, imb);
    double re = per_token * T;
    if (re > 0) re -= yc * T;
    bool glu = ly->kind == LAYER_MOE ? moe_glu : mlp_glu;
    double w = fmax((double)ly->ffn_width, imb * (double)ly->routed_width);
    if (re > rebuilt) rebuilt = re;
    if (w > ffn) ffn = w;
    if (glu && w > ffn_gate) ffn_gate = w;
  }
  /* offloaded boundaries: the program's three device slots XSLOT<l % 3> (layer l's input, its
   * output, and the boundary in flight to or from the host); without offload the last layer's
   * output X<L> has a buffer of its own (the others are the stacked items above) */
  if (off && ch->ac == AC_FULL)
    for (int i = 0; i < 3; i++)
      item(it, TEXT(it, "activations.offload_staging[%d]", i), CAT_ACTIVATIONS, TIER_HBM,
           boundary, 1, PHASE_OPT(L), "2 B x hidden x tokens: boundary l in slot l % 3 (a layer's input, its output, "
           "one in flight to/from host)");
  else
    item(it, "activations.final_boundary", CAT_ACTIVATIONS, TIER_HBM, boundary, PHASE_FWD(L, L - 1), PHASE_LOSS(L) + 1,
         "2 B x hidden x tokens: the last layer's output, the final norm's input");
  if (ch->offload == OFF_NVME && ch->ac == AC_FULL) /* NVMe reads and writes go through host memory */
    for (int i = 0; i < 2; i++)
      item(it, TEXT(it, "activations.nvme_bounce[%d]", i), CAT_ACTIVATIONS, TIER_HOST, boundary, 1,
           PHASE_OPT(L), "2 B x hidden x tokens: a boundary between HBM and NVMe");
  /* the layer workspace: what one layer does not keep, live in its forward and again in its
   * backward's recompute (the program's WS_ buffers serve both: one item alive from the first
   * forward to the last backward) */
  if (ch->ac != AC_NONE)
    item(it, "activations.forward_layer", CAT_ACTIVATIONS, TIER_HBM, rebuilt, 1, PHASE_OPT(L),
         yp_in_send ? "saved bytes per token of the widest layer that the policy does not keep x tokens (the layer's "
                      "workspace, in its forward and its backward's recompute; what it keeps is activations.saved), "
                      "less y_combined (in moe.dispatch_send)"
                    : "saved bytes per token of the widest layer that the policy does not keep x tokens (the layer's "
                      "workspace, in its forward and its backward's recompute; what it keeps is activations.saved)");
  for (int i = 0; i < 2; i++)
    item(it, TEXT(it, "activations.grad_residual[%d]", i), CAT_ACTIVATIONS, TIER_HBM, boundary,
         PHASE_LOSS(L), PHASE_OPT(L), "2 B x hidden x tokens: gradient of the residual stream in/out");
  /* context parallelism: a layer's attention all-gathers the keys and values of the whole
   * sequences over the cp group (cp x the rank's own, in position order), and its backward
   * computes their gradient for that whole range before reduce-scattering it back to the cp
   * ranks; one layer's at a time (the backward gathers again) */
  if (cp > 1) {
    const double kv = plan_cp_kv_elems(s, md) * T * (double)cp;
    item(it, "attention.kv_gathered", CAT_ACTIVATIONS, TIER_HBM, 2 * kv, 1, PHASE_OPT(L),
         "2 B x micro_batch x seq_len x (kv_heads x (qk_head_dim + v_head_dim)): one layer's keys and values of the "
         "whole sequences, all-gathered over the cp group");
    item(it, "attention.dkv_gathered", CAT_ACTIVATIONS, TIER_HBM, 2 * kv, PHASE_LOSS(L), PHASE_OPT(L),
         "as attention.kv_gathered: their gradient over the whole sequences, reduce-scattered over the cp group");
  }
  /* the shared workspace (the program's LWS, or A2A with ep > 1): buffers of which at most one
   * group is live at a time, each group at its start: the FFN gradients of gate, up and act (one
   * FFN's backward at a time), the attention's gradients with MLA's backward buffers (its
   * backward), MLA's forward temporaries (its q, k, v), a block's outputs before
   * the residual add (a layer's forward), the final norm's output and one vocabulary chunk's
   * logits and their gradient (the loss), the router logits' gradient (a MoE layer's backward,
   * after its all-to-alls) and Muon's scratch (the optimizer step); fp32 values count 4 B. With
   * ep > 1 it is moe.a2a_staging, which holds one all-to-all round only inside a dispatch or
   * undispatch, when none of these is live. */
  const double grad_ffn = 2 * T * (2 * ffn + ffn_gate);
  /* the attention's backward group and MLA's forward group, laid out by attn_ws.c for plan and
   * program alike (MLA's backward buffers in the dead bytes of d(out), dQ, dK and dV) */
  const double grad_attn = 2 * (double)plan_ws_attention(s, md, (int64_t)T, cp).size;
  const double mla_fwd = 2 * (double)plan_ws_mla_forward(s, (int64_t)T).size;
  const double outputs = 2 * T * H;
  const double chunk = (double)plan_logits_chunk((int64_t)T, s->model.vocab);
  const double loss = 2 * T * H + 2 * 4 * T * chunk;
  const double grad_router = md->n_moe_layers ? 4 * T * (double)s->model.moe.experts : 0;
  /* Muon's scratch (plan_muon_work, fp32), the optimizer step's group: the program lays it in
   * these bytes whichever backend runs the step */
  const double muon_ws =
      s->training.optimizer == OPT_MUON && !it->c->bound ? 4 * (double)plan_muon_summary(md, ch).work.elems : 0;
  double shared = fmax(fmax(fmax(fmax(grad_ffn, grad_attn), fmax(fmax(outputs, loss), grad_router)), muon_ws), mla_fwd);
  const char *shared_what =
      "max(2 B x tokens x (2 x widest FFN + widest gated FFN) (routed: top_k x width x imbalance): the FFN "
      "gradients; 2 B x tokens x (q + kv + heads x v_head_dim + kv_heads x v_head_dim (+ q + kv with qk-norm)): the attention's "
      "(MLA's backward buffers in their dead bytes, or past them: plan_ws_attention); 2 B x tokens x (q_lora_rank + "
      "kv_lora_rank + qk_rope_head_dim + heads x (qk_nope_head_dim + v_head_dim)): MLA's forward; 2 B x hidden x tokens: "
      "a block's output; 2 B x hidden x tokens + 2 x 4 B x tokens x "
      "vocabulary chunk (<= 4096 columns, <= 1 GiB): the final norm's output and the loss's logits; 4 B x "
      "tokens x experts: the router logits' gradient; 4 B x MUON_WORK: Muon's scratch)";
  const bool ffn_in_a2a = md->n_moe_layers && ch->ep > 1;
  if (!ffn_in_a2a)
    item(it, "workspace.shared", CAT_WORKSPACE, TIER_HBM, shared, 1, END,
         TEXT(it, "%s: one group at a time", shared_what));
  /* the final norm's statistics and each token's log-sum-exp (fp32: RSTDF, LSEF), the tokens and
   * targets (int32: INPUTS, TARGETS) */
  const double st = s->model.norm == NORM_LAYERNORM ? 2 : 1;
  item(it, "activations.loss_stats", CAT_ACTIVATIONS, TIER_HBM, 4 * T * (st + 1), PHASE_LOSS(L), PHASE_OPT(L),
       "4 B x tokens x (norm statistics + 1): the final norm's 1/rms (and mean) and the loss's log-sum-exp");
  item(it, "data.tokens", CAT_WORKSPACE, TIER_HBM, 2 * 4 * T, 0, END, "2 x 4 B x tokens: token ids and targets (int32)");
  item(it, "activations.grad_norm", CAT_ACTIVATIONS, TIER_HBM, 2 * H * T, PHASE_LOSS(L), PHASE_OPT(L),
       "2 B x hidden x tokens: gradient of a norm's output (a layer's backward, the LM head's)");

  /* MoE: the receiving sides of both all-to-alls are saved activations (x_permuted, and
   * y_combined in token order); what remains are the send sides — this rank's token copies
   * grouped by destination, and the experts' outputs before they go back — the staging of one
   * round, and the backward's gradients of both. A round holds at most moe_imbalance x the mean
   * rows (MOE_CAP_ROWS); the backward reuses the forward's send buffers where their lifetimes
   * allow (the program's arena map says why) */
  if (md->n_moe_layers) {
    double b = T * (double)s->model.moe.top_k * H * 2;
    if (ch->ep > 1) {
      item(it, "moe.dispatch_send", CAT_MOE, TIER_HBM, fmax(b, b * imb), 1, PHASE_OPT(L),
           yp_in_send ? "tokens x top_k x hidden x 2 B x max(1, moe_imbalance): the token copies to send, then "
                        "y_combined in their rows; in the backward, the gradient of the rows received"
                      : "tokens x top_k x hidden x 2 B x max(1, moe_imbalance): the token copies to send; in the "
                        "backward, the gradient of the rows received");
      item(it, "moe.combine_send", CAT_MOE, TIER_HBM, b * imb, 1, PHASE_OPT(L),
           "tokens x top_k x hidden x 2 B x moe_imbalance (the experts' outputs; in the backward, their gradient "
           "received)");
      item(it, "moe.a2a_staging", CAT_MOE, TIER_HBM, fmax(b * imb, shared), 1, END,
           TEXT(it, "max(tokens x top_k x hidden x 2 B x moe_imbalance: one round's rows in source-rank "
                      "order; between all-to-alls, the shared workspace, %s)", shared_what));
      if (!plan_hier(s, ch))
        item(it, "moe.grad_expert_out", CAT_MOE, TIER_HBM, b, PHASE_LOSS(L) + 1, PHASE_OPT(L),
             "tokens x top_k x hidden x 2 B: gradient of the experts' outputs, then of the token copies in its rows");
      else { /* the hierarchical exchange: its staging; the outputs' gradient lies in combine_send */
        int64_t cap = (int64_t)ceil(imb * T * (double)s->model.moe.top_k - 1e-9);
        PlanHierRows hr = plan_hier_rows(s, ch->ep, (int64_t)T, cap);
        item(it, "moe.hier_staging", CAT_MOE, TIER_HBM, 2 * H * (double)(hr.us + hr.ur + hr.st), 1, PHASE_OPT(L),
             "2 B x hidden x (tokens x min(top_k, nodes) + tokens x nodes + moe_imbalance x tokens x top_k / g): the "
             "hierarchical all-to-all's unique rows sent, the relay's unique rows received, its staging of the copies "
             "(messages of at most a g-th of a round: g = gpus_per_node)");
        item(it, "moe.hier_scalars", CAT_MOE, TIER_HBM, 2 * 4 * (double)cap, PHASE_LOSS(L) + 1, PHASE_OPT(L),
             "2 x 4 B x moe_imbalance x tokens x top_k: the gates of the rows received and their gradient (the "
             "backward)");
        item(it, "moe.hier_tables", CAT_MOE, TIER_HOST,
             (double)plan_hier_host_tables(ch->ep, hr.g, (int64_t)T, s->model.moe.top_k, cap, hr.st), 0, END,
             "16 B x tokens x top_k + 4 B x tokens x (1 + min(top_k, nodes)) + 8 B x g x cap + 8 B x cap + the "
             "headers, first rows and MPI requests (about 40 B x nodes x g + 8 B x (g + 2)): the hierarchical "
             "all-to-all's host tables (slots, unique rows, the relay's descriptors and gates; plan_hier_host_tables)");
        it->c->items[it->c->nitems - 1].outside = true; /* (the runtime's own malloc) */
        int64_t ihost = 0,
                idev = plan_hier_cuda_tables(ch->ep, hr.g, (int64_t)T, s->model.moe.top_k, cap, hr.st, &ihost);
        item(it, "moe.hier_index", CAT_MOE, TIER_HBM, (double)idev, 0, END,
             "4 B x (tokens x min(top_k, nodes) + 5 x g x cap + 1 + 2 x tokens x top_k): the cuda runtime's tables "
             "of the hierarchical all-to-all on the device (the unique rows' tokens, the relay's copies by send order "
             "and by target, the slots and scalars sent home; plan_hier_cuda_tables)");
        it->c->items[it->c->nitems - 1].outside = true; /* (the cuda runtime's own cudaMalloc) */
        item(it, "moe.hier_index_host", CAT_MOE, TIER_HOST, (double)ihost, 0, END,
             "their host side: the relay's part, 4 B x (tokens x nodes + tokens x top_k + cap + g x (cap / st + 1) + "
             "1) and 8 B x (4 max(nodes, g) + 2 (g + 1)): the cuda runtime's own malloc (plan_hier_cuda_tables)");
        it->c->items[it->c->nitems - 1].outside = true;
      }
    } else {
      item(it, "moe.grad_expert_out", CAT_MOE, TIER_HBM, b, PHASE_LOSS(L) + 1, PHASE_OPT(L),
           "tokens x top_k x hidden x 2 B: gradient of the experts' outputs (that of the token copies goes into "
           "y_combined's bytes, dead once combined)");
      /* (the gradient of the token copies lies in the layer's y_combined, dead once combined) */
    }
  }

  if (md->n_moe_layers) {
    const MoeSpec *mo = &s->model.moe;
    item(it, "moe.grad_routing_weights", CAT_MOE, TIER_HBM, 4 * T * (double)mo->top_k, PHASE_LOSS(L) + 1,
         PHASE_OPT(L), "4 B x tokens x top_k: gradient of the routing weights (a MoE layer's backward)");
    /* (with the experts' saves recomputed the backward's row offsets are the layer workspace's) */
    const bool eoff = ch->ep > 1 && plan_keeps(ch->ac, SAVE_EXPERT);
    /* the balancing losses' scratch: 3 x experts, or with the sequence-wise loss 2 x experts per
     * sequence of the micro-batch when that is more (emit_layout.c's AUX) */
    const bool seq = mo->seq_aux_loss_coef > 0 && 2 * ch->micro_batch > 3;
    const double aux = seq ? 2 * (double)ch->micro_batch * (double)E : 3 * (double)E;
    const char *aux_what = seq ? "4 B x 2 x experts x sequences of a micro-batch: the balancing losses' scratch"
                               : "4 B x 3 x experts: the load-balancing loss's scratch";
    item(it, "moe.tables", CAT_MOE, TIER_HBM, 4 * aux + (eoff ? 4 * (double)(El + 1) : 0), 1, PHASE_OPT(L),
         eoff ? TEXT(it, "%s; 4 B x (experts / ep + 1): the backward's first row of each local expert in a "
                              "round", aux_what) : aux_what);
    if (s->model.moe.load_balance == LB_AUX_FREE)
      item(it, "moe.expert_loads", CAT_MOE, TIER_HBM, 4 * (double)E * (double)md->n_moe_layers, 0, END,
           "4 B x experts x MoE layers: tokens per expert this step (aux_free's bias update)");
    if (mo->shared_experts && mo->shared_expert_gate)
      item(it, "moe.grad_shared_gate", CAT_MOE, TIER_HBM, 2 * H * T + 4 * T, PHASE_LOSS(L) + 1, PHASE_OPT(L),
           "2 B x hidden x tokens + 4 B x tokens: gradient of the shared experts' output before their gate and of the "
           "gate's logits");
  }
outside:
  /* the cuda runtime's scratch (plan_runtime_scratch): attention's backward keeps one fp32 delta
   * per token and head and cuDNN's fp32 dQ accumulator, the cross-entropy's sums, the grouped
   * GEMMs' pointer arrays, the MoE counts and tables */
  item(it, "workspace.runtime", CAT_WORKSPACE, TIER_HBM,
       (double)plan_runtime_scratch((int64_t)T, s->model.attention.heads, md->qk_head_dim, E), 0, END,
       "4 B x tokens x heads x (1 + qk_head_dim) + 4 B x (2 tokens + 1) + 8 + 192 B x experts + 2 B x tokens x "
       "experts + the MoE count/table scratch (about 32 B x experts): the cuda runtime's own device buffers (the "
       "attention's delta and cuDNN's fp32 dQ accumulator among them)");
  it->c->items[it->c->nitems - 1].outside = true; /* (the runtime's own cudaMalloc) */
  /* its host side (plan_runtime_host_scratch): the MoE scratch's mirror, the offsets cache and
   * the pinned readback buffer of the step's scalars with the copy ring */
  item(it, "workspace.runtime_host", CAT_WORKSPACE, TIER_HOST, (double)plan_runtime_host_scratch(E), 0, END,
       "2 x m + 256 B x (experts + 1) + 3,072 B + 1 MiB, m = the MoE count/table scratch (12 x experts rounded up "
       "to 8 B, + 20 x experts + 4: about 32 B x experts; experts 0 counts as 1): the cuda runtime's own host buffers "
       "(the MoE scratch's mirror, 64 cached offsets arrays of experts + 1 int32, and the pinned readback buffer: 256 "
       "fp64 sums of squares, 256 fp32 losses, the copy ring of 64 x 16 KiB every copy between pageable host memory "
       "and the GPU passes through, and a staging copy of the MoE scratch)");
  it->c->items[it->c->nitems - 1].outside = true; /* (the runtime's own cudaMallocHost and malloc) */
  item(it, "data.host_tables", CAT_WORKSPACE, TIER_HOST, (double)plan_host_tables((int64_t)T, ch->fsdp, ch->ep, El), 0,
       END, ch->ep > 1 ? "2 x 4 B x tokens: the loader's token ids and targets; 72 B x fsdp: Muon's exchange counts; 4 B x "
                         "ep^2 x experts per EP rank + 28 B x ep x experts per EP rank + 48 B x ep + 4: the all-to-all's "
                         "counts, offsets and regroup blocks"
                       : "2 x 4 B x tokens: the loader's token ids and targets; 72 B x fsdp: Muon's exchange counts");
  it->c->items[it->c->nitems - 1].outside = true; /* (the loader's and the runtime's own) */
  /* Muon's scratch as the program allocates it (fp32: plan_muon_work). MUON_WORK, the most
   * either step uses, is a group of workspace.shared (the optimizer step's). With the step on
   * the host, the host's own copy of what that step uses: the pieces sent to owners (all dense
   * groups in one exchange, each expert group in its own) and received, a gathered matrix's
   * gradient, update and Newton-Schulz scratch. With the step on the GPU (Newton-Schulz there,
   * batched), only its exchange goes through host memory: the Nesterov gradients of the groups
   * whose matrices move, and the pieces sent and received */
  if (muon && !it->c->bound) {
    PlanMuonWork w = plan_muon_summary(md, ch).work;
    if (ch->opt_on_host)
      item(it, "workspace.newton_schulz", CAT_WORKSPACE, TIER_HOST, 4 * (double)w.step, PHASE_OPT(L), END,
           "4 B x (the dense shards' sum or an expert shard + the most one rank owns of their moving matrices + "
           "4 n + 2 r^2 of the largest matrix), the larger");
    else if (w.exchange)
      item(it, "workspace.muon_exchange_host", CAT_WORKSPACE, TIER_HOST, 4 * (double)w.exchange, PHASE_OPT(L), END,
           "4 B x (the shards of the dense groups with a moving matrix, summed, or of such an expert group + the "
           "most one rank sends and receives of their moving matrices), the larger: the exchange's host copy, pinned "
           "(its copies to and from the GPU asynchronous, waited for once each way)");
  }
  item(it, "reserve.cuda_context", CAT_RESERVE, TIER_HBM, r->cuda_context, 0, END, "cluster.reserve.cuda_context");
  item(it, "reserve.nccl_buffers", CAT_RESERVE, TIER_HBM, r->nccl_buffers, 0, END, "cluster.reserve.nccl_buffers");
  item(it, "reserve.cublas_workspace", CAT_RESERVE, TIER_HBM, r->cublas_workspace, 0, END,
       "cluster.reserve.cublas_workspace");
  item(it, "reserve.host", CAT_RESERVE, TIER_HOST, r->host, 0, END, "cluster.reserve.host");
  for (int i = 0; i < it->c->nitems; i++)
    if (it->c->items[i].cat == CAT_RESERVE) it->c->items[i].outside = true;
}

static int by_size_desc(const void *a, const void *b) {
  const MemItem *x = *(MemItem *const *)a, *y = *(MemItem *const *)b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  return x < y ? -1 : x > y; /* stable: build order */
}

/* Packs a tier: first the state block (master, gradient and optimizer shards, alive the whole
 * step) contiguous from offset 0 in build order, which is the program's state arena's order
 * (emit_layout.c), each item at the previous one's end; then the per-layer activations as a
 * stack in layer order (their lifetimes nest: layer l lives from its forward to its backward);
 * then every other item largest first at the lowest offset that no item alive at the same time
 * overlaps (greedy interval packing, 256-byte aligned); last the items outside the program's
 * arena (MemItem.outside: reserves, the runtime's scratch, the state's host copy), back to
 * back from the top of the rest, so the program's items span [0, that top). Each block counts
 * as one item alive over the union of its items' lifetimes. placed[] is kept sorted by offset,
 * so one scan finds the gap: O(m²) for the m other items. Returns the arena size. */
static int64_t pack(Mem *m, MemItem **v, int n) {
  MemItem **rest = mem_array(m, (size_t)n + 1, sizeof *rest);
  MemItem **stack = mem_array(m, (size_t)n + 1, sizeof *stack);
  MemItem **top = mem_array(m, (size_t)n + 1, sizeof *top);
  MemItem block = {.start = PHASE_MAX, .end = 0}, state = {.start = PHASE_MAX, .end = 0};
  int np = 0, ns = 0, nr = 0, nt = 0;
  for (int i = 0; i < n; i++) /* v is in build order: the state block's order, layer order for the stack */
    if (v[i]->state) {
      v[i]->offset = state.bytes;
      state.bytes += v[i]->bytes;
      if (v[i]->start < state.start) state.start = v[i]->start;
      if (v[i]->end > state.end) state.end = v[i]->end;
    } else if (v[i]->stacked) stack[ns++] = v[i];
    else if (v[i]->outside) top[nt++] = v[i];
    else rest[nr++] = v[i];
  for (int i = 1; i < nr; i++) /* insertion sort by by_size_desc, a total order (a few dozen items) */
    for (int j = i; j > 0 && by_size_desc(&rest[j - 1], &rest[j]) > 0; j--) {
      MemItem *x = rest[j];
      rest[j] = rest[j - 1], rest[j - 1] = x;
    }
  MemItem **placed = mem_array(m, (size_t)nr + 3, sizeof *placed);
  if (state.bytes) placed[np++] = &state;
  block.offset = (state.bytes + 255) / 256 * 256;
  block.bytes = 0;
  for (int i = 0; i < ns; i++) {
    stack[i]->offset = block.offset + block.bytes;
    block.bytes = (block.bytes + stack[i]->bytes + 255) / 256 * 256;
    if (stack[i]->start < block.start) block.start = stack[i]->start;
    if (stack[i]->end > block.end) block.end = stack[i]->end;
  }
  int64_t size = ns ? block.offset + block.bytes : state.bytes;
  if (ns) placed[np++] = &block;
  for (int i = 0; i < nr; i++) {
    MemItem *x = rest[i];
    int64_t off = 0;
    for (int j = 0; j < np; j++) {
      const MemItem *y = placed[j];
      if (y->start >= x->end || x->start >= y->end) continue; /* not alive together */
      if (y->offset >= off + x->bytes) break;
      int64_t e = (y->offset + y->bytes + 255) / 256 * 256;
      if (e > off) off = e;
    }
    x->offset = off;
    int k = np++;
    while (k > 0 && placed[k - 1]->offset > off) placed[k] = placed[k - 1], k--;
    placed[k] = x;
    if (off + x->bytes > size) size = off + x->bytes;
  }
  for (int i = 0; i < nt; i++) { /* build order */
    size = (size + 255) / 256 * 256;
    top[i]->offset = size;
    size += top[i]->bytes;
  }
  return size;
}

void plan_items(Mem *m, const Model *md, Candidate *c) {
  Items it = {m, c, 0};
  c->nitems = 0;
  build_items(&it, md);
}

void plan_memory(Mem *m, const Model *md, Candidate *c) {
  plan_items(m, md, c);
  plan_pack(m, md, c);
}

int64_t plan_over_bound(Mem *m, const Model *md, const Candidate *c) {
  const Spec *s = md->spec;
  const int64_t cap[TIER__COUNT] = {(int64_t)s->cluster.gpu.hbm, (int64_t)s->cluster.host.memory,
                                    s->cluster.nvme.present ? (int64_t)s->cluster.nvme.capacity : 0};
  const MemItem **rest = mem_array_raw(m, (size_t)c->nitems + 1, sizeof *rest);
  int64_t over = INT64_MIN;
  for (int t = 0; t < TIER__COUNT; t++) {
    int64_t state = 0, block = 0, outside = 0;
    int bs = PHASE_MAX, be = 0, nr = 0;
    for (int i = 0; i < c->nitems; i++) {
      const MemItem *x = &c->items[i];
      if (x->tier != (Tier)t) continue;
      if (x->state) state += x->bytes;
      else if (x->outside) outside += x->bytes;
      else if (x->stacked) {
        block += x->bytes;
        if (x->start < bs) bs = x->start;
        if (x->end > be) be = x->end;
      } else if (x->bytes >= 256) /* (a smaller one may sit in the alignment gap below the block) */
        rest[nr++] = x;
    }
    /* the most bytes alive at one phase inside the block's life and outside it: the live sum
     * changes only at an item's start, so its most in a span is at a start or the span's first
     * phase (bs, be) */
    int64_t in = 0, out = 0;
    for (int k = -2; k < nr; k++) {
      int p = k == -2 ? bs : k == -1 ? be : rest[k]->start;
      if (k < 0 && !block) continue;
      int64_t sum = 0;
      for (int i = 0; i < nr; i++) sum += rest[i]->start <= p && p < rest[i]->end ? rest[i]->bytes : 0;
      int64_t *most = block && p >= bs && p < be ? &in : &out;
      if (sum > *most) *most = sum;
    }
    int64_t least = state + (block + in > out ? block + in : out) + outside;
    if (least - cap[t] > over) over = least - cap[t];
  }
  return over;
}

void plan_pack(Mem *m, const Model *md, Candidate *c) {
  const Spec *s = md->spec;
  c->capacity[TIER_HBM] = (int64_t)s->cluster.gpu.hbm;
  c->capacity[TIER_HOST] = (int64_t)s->cluster.host.memory;
  c->capacity[TIER_NVME] = s->cluster.nvme.present ? (int64_t)s->cluster.nvme.capacity : 0;
  MemItem **v = mem_array(m, (size_t)c->nitems + 1, sizeof *v);
  c->fits = true;
  c->over_bytes = 0;
  int nphase = PHASE_END(md->nlayers);
  int64_t *live = c->quick ? NULL : mem_array(m, (size_t)nphase + 1, sizeof *live);
  for (int t = 0; t < TIER__COUNT; t++) {
    int n = 0;
    if (live) memset(live, 0, ((size_t)nphase + 1) * sizeof *live);
    for (int i = 0; i < c->nitems; i++) /* difference array: + at start, - at end */
      if (c->items[i].tier == (Tier)t) {
        v[n++] = &c->items[i];
        if (!live) continue;
        live[c->items[i].start] += c->items[i].bytes;
        live[c->items[i].end] -= c->items[i].bytes;
      }
    c->arena[t] = n ? pack(m, v, n) : 0;
    c->live_peak[t] = 0;
    int64_t sum = 0;
    for (int p = 0; p < nphase && !c->quick; p++) { /* (the search reads arenas only) */
      sum += live[p];
      if (sum > c->live_peak[t]) c->live_peak[t] = sum, c->peak_phase[t] = p;
    }
    int64_t over = c->arena[t] - c->capacity[t];
    if (n && over > 0 && (c->fits || over > c->over_bytes)) {
      c->fits = false;
      c->over_tier = (Tier)t;
      c->over_bytes = over;
    }
  }
}

double plan_cp_kv_elems(const Spec *s, const Model *md) {
  const AttentionSpec *a = &s->model.attention;
  double nkv = (double)(a->kind == ATTN_MLA ? a->heads : a->kv_heads);
  return nkv * (double)(md->qk_head_dim + md->v_head_dim);
}
