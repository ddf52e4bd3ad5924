/* emit_step.c — step.h and step.c of the generated program: the forward and backward of
 * every layer as straight-line calls into libmtrt, with every shape, arena offset, group and
 * collective of the plan written out as a constant. One function per layer and direction, so
 * that a person can follow one layer's step; the schedule (gathers, recomputation,
 * reduce-scatters) reads top to bottom in forward() and backward(). */
#include <errno.h>
#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
/* ---- the schedule --------------------------------------------------------------------------- */

/* Units of the schedule: 0 the embedding, 1..L the layers, L+1 the head. Unit u's group k (0
 * dense, 1 experts; -1 when the unit has none) is gathered into GATHERED<u % (P + 1)> (dense
 * first, then experts; all-gather slot 2(u % (P + 1)) + k), P the plan's prefetch depth, so the
 * gathers of units u+1..u+P overlap unit u's compute; in the backward its gradient goes to
 * GRAD<u % 2> and is reduce-scattered in slot 2(u % 2) + k while the next unit's backward runs. */
static int unit_group(const Em *e, int u, int k) {
  if (k) return u >= 1 && u <= e->L ? e->layer_experts[u - 1] : -1;
  return u == 0 ? e->g_embed : u == e->L + 1 ? e->g_head : e->layer_dense[u - 1];
}

static const char *const kind_comm[2] = {"fsdp_comm", "shard_comm"};

/* Where group kind k (0 dense, 1 experts) of unit u starts in its unit's buffer (GATHERED<u % 2>,
 * GRAD<u % 2>): "" for the dense group, " + <the dense group's size>" for the experts. */
static const char *in_unit(Em *e, int u, int k) {
  int g = unit_group(e, u, 0);
  return k && g >= 0 ? mem_printf(e->m, " + %lld", (long long)e->groups[g].full) : "";
}

/* Where unit u's group of kind k is gathered to and read from: its place in the kept buffer when
 * the plan keeps that kind gathered (Em.keep), else GATHERED<u % (P + 1)>, dense first, then the
 * experts (only the kinds not kept are in the pool: with the dense groups kept, the experts
 * start at 0). */
static const char *unit_at(Em *e, int u, int k) {
  const EmGroup *G = &e->groups[unit_group(e, u, k)];
  if (e->keep[k])
    return G->kept_at ? mem_printf(e->m, "R(%s) + %lld", e->kept_buf[k], (long long)G->kept_at)
                      : mem_printf(e->m, "R(%s)", e->kept_buf[k]);
  return mem_printf(e->m, "R(GATHERED%d)%s", u % (e->prefetch + 1), e->keep[0] ? "" : in_unit(e, u, k));
}

/* Whether unit u's group of kind k, kept gathered, was gathered by an earlier unit of the forward:
 * the head of tied embeddings is the embedding group. */
static bool gathered_earlier(const Em *e, int u, int k) {
  return e->keep[k] && k == 0 && u == e->L + 1 && e->g_head == e->g_embed;
}

/* Starts the all-gathers of unit u's groups (a prefetch: waited for in use_unit). A group kept
 * gathered (Em.keep) is gathered only in the forward (fwd) of the first micro-batch of a step
 * (c->gather_kept), once (gathered_earlier); a backward or a later micro-batch reads it where it
 * is. */
static void start_unit(Em *e, int u, const char *why, bool fwd) {
  if (u > e->L + 1) return; /* past the head: nothing to prefetch */
  for (int k = 0; k < 2; k++) {
    int g = unit_group(e, u, k);
    if (g < 0 || (e->keep[k] && (!fwd || gathered_earlier(e, u, k)))) continue;
    const EmGroup *G = &e->groups[g];
    int b = u % (e->prefetch + 1);
    const char *cond = e->keep[k] ? "if (c->gather_kept) " : ""; /* kept: the first micro-batch's forward only */
    const char *src = mem_printf(e->m, "R(%s_PARAM)", G->cname);
    if (!e->state_host) { /* the master in HBM: cast on the compute stream, which the gather waits for */
      int gd = unit_group(e, u, 0);
      src = mem_printf(e->m, "R(CAST%d)%s", b, k && gd >= 0 ? mem_printf(e->m, " + %lld", (long long)e->groups[gd].shard) : "");
      P(e, "  %srt_cast_to_act(%s, S(%s_MASTER), %lld); /* its master shard, cast for the gather */\n", cond, src,
        G->cname, (long long)G->shard);
    }
    P(e, "  %srt_comm_all_gather_start(c->comm.%s, %s, %s, %lld, %d); /* %s: %lld ranks x %lld%s */\n", cond,
      kind_comm[k], unit_at(e, u, k), src, (long long)G->shard, 2 * b + k, G->name, (long long)(k ? e->efsdp : e->fsdp),
      (long long)G->shard, e->keep[k] ? mem_printf(e->m, "%s, kept until the optimizer step", why) : why);
  }
}

/* Waits for unit u's gathers (those start_unit started) and points W and WE at them. */
static void use_unit(Em *e, int u, bool fwd) {
  bool experts = unit_group(e, u, 1) >= 0;
  int b = u % (e->prefetch + 1);
  const char *kept = ""; /* the waits for kept groups: only when this forward gathered them */
  for (int k = 0; k < (experts ? 2 : 1); k++) {
    if (!e->keep[k]) P(e, "  rt_comm_all_gather_wait(%d);\n", 2 * b + k);
    else if (fwd && !gathered_earlier(e, u, k))
      kept = mem_printf(e->m, "%s%srt_comm_all_gather_wait(%d)", kept, kept[0] ? ", " : "", 2 * b + k);
  }
  if (kept[0]) P(e, "  if (c->gather_kept) %s;\n", kept);
  P(e, "  c->wd = %s;\n", experts ? mem_printf(e->m, "%s, c->we = %s", unit_at(e, u, 0), unit_at(e, u, 1)) : unit_at(e, u, 0));
}

/* Unit u's backward begins: the reduce-scatters that last used its parity's gradient buffer are
 * waited for (their results added to the shards), then DW and DWE point into that buffer, zeroed
 * over the unit's groups. */
static void begin_grads(Em *e, int u) {
  int p = u % 2;
  if (u + 2 <= e->L + 1) /* the backward runs the units from L + 1 down: unit u + 2 used these buffers */
    P(e, "  rt_comm_reduce_scatter_wait(%d), rt_comm_reduce_scatter_wait(%d); /* unit %d's: the buffer is free */\n",
      2 * p, 2 * p + 1, u + 2);
  P(e, "  c->dwd = R(GRAD%d)%s;\n", p,
    unit_group(e, u, 1) >= 0 ? mem_printf(e->m, ", c->dwe = R(GRAD%d)%s", p, in_unit(e, u, 1)) : "");
  int64_t n = 0;
  for (int k = 0; k < 2; k++)
    if (unit_group(e, u, k) >= 0) n += e->groups[unit_group(e, u, k)].full;
  P(e, "  rt_zero(R(GRAD%d), %lld);\n", p, (long long)n);
}

/* Unit u's gradients: each group's reduce-scatter starts, overlapping what follows: from its
 * part of GRAD<u % 2> (act), in place with bf16 on the wire, else through RS_WIRE<u % 2> (fp32),
 * into the group's fp32 gradient shard. */
static void reduce_scatter(Em *e, int u) {
  for (int k = 0; k < 2; k++) {
    int g = unit_group(e, u, k);
    if (g < 0) continue;
    const EmGroup *G = &e->groups[g];
    int64_t ranks = k ? e->efsdp : e->fsdp;
    int slot = 2 * (u % 2) + k;
    bool bf16 = ranks > 1 && e->s->training.grad_reduce_dtype == WIRE_BF16;
    bool wire = ranks > 1 && !bf16 && em_arena_of(e, "RS_WIRE0") >= 0;
    P(e, "  rt_comm_reduce_scatter_start(c->comm.%s, S(%s_GRAD), R(GRAD%d)%s, %lld, %s, %s, %d); /* %s: %lld ranks%s */\n",
      kind_comm[k], G->cname, u % 2, in_unit(e, u, k), (long long)G->shard, bf16 ? "true" : "false",
      wire ? mem_printf(e->m, "R(RS_WIRE%d)%s", u % 2, in_unit(e, u, k)) : "NULL", slot, G->name, (long long)ranks,
      ranks == 1 ? "" : bf16 ? ", bf16 on the wire" : ", fp32 on the wire");
  }
}

/* The LM head's weight: lm_head.weight, or with tied embeddings the input embedding (HF's
 * tie_word_embeddings: the output projection is embed_tokens.weight; Press & Wolf 2017). */
static const char *head_key(const Em *e) {
  return e->s->model.tie_embeddings ? "embed_tokens.weight" : "lm_head.weight";
}

static void schedule(Em *e) {
  long long N = e->N, C = e->C, V = e->V;
  int L = (int)e->L;
  int gh = e->g_head;
  P(e, "\n/* ---- one micro-batch ---------------------------------------------------------------- */\n\n");
  int D = e->prefetch;
  P(e, "/* Forward: embedding, layers 0-%d, final norm and loss. The next %d unit(s)' parameters are\n"
       " * all-gathered while this one computes (the plan's prefetch depth; the cpu backend's MPI\n"
       " * all-gathers block, so there it only orders the calls). Returns the mean cross-entropy of\n"
       " * the micro-batch. */\n",
    L - 1, D);
  P(e, "real step_forward(RtCtx *c) {\n");
  P(e, "  rt_comm_label(\"embedding forward\");\n");
  for (int u = 0; u < D; u++) start_unit(e, u, u ? ", prefetch" : "", true);
  use_unit(e, 0, true);
  start_unit(e, D, ", prefetch", true);
  P(e, "  rt_embedding_forward(R(X0), I(INPUTS), W(0), %lld, %lld);\n", N, C);
  if (!e->rope)
    P(e, "  rt_position_forward(R(X0), W(%lld), %lld, %lld, %lld); /* + learned positions (embed_positions) */\n",
      (long long)off(e, e->g_embed, "embed_positions.weight"), (long long)e->B, (long long)e->T, C);
  for (int l = 0; l < L; l++) {
    P(e, "  rt_comm_label(\"layer %d forward\");\n", l);
    use_unit(e, l + 1, true);
    start_unit(e, l + 1 + D, ", prefetch", true);
    if (e->host_elems && l >= 2 && l - 2 <= L - 3)
      P(e, "  rt_offload_wait(c, %d); /* X%d is on the host: its slot takes X%d */\n", l - 2, l - 2, l + 1);
    P(e, "  layer%d_forward(c, false);\n", l);
    if (e->host_elems && l <= L - 3)
      P(e, "  rt_offload_store(c, %d, H(HX%d), R(X%d), %lld); /* to the host while the next layers run */\n", l, l, l, N * C);
  }
  P(e, "  rt_comm_label(\"head forward\");\n");
  use_unit(e, L + 1, true);
  em_norm_forward(e, gh, "LNF", "RSTDF", mem_printf(e->m, "X%d", L), "norm");
  P(e, "  return rt_lm_head_ce_forward(R(LSEF), R(LNF), W(%lld), I(TARGETS), %lld, %lld, %lld, %lld, R(CE));\n}\n",
    (long long)off(e, gh, head_key(e)), N, C, V, (long long)e->chunk);

  P(e, "\n/* Backward, in reverse: each unit's gradient is reduce-scattered over its ranks as soon as\n"
       " * its backward is done, while the next unit's backward runs (the units alternate between two\n"
       " * gradient buffers), and added to this rank's shard (accumulation over micro-batches) before\n"
       " * its buffer is used again. */\n");
  P(e, "void step_backward(RtCtx *c) {\n");
  P(e, "  /* head (its parameters are still gathered from the forward) */\n");
  P(e, "  rt_comm_label(\"head backward\");\n");
  for (int u = L; u > L - D && u >= 1; u--) start_unit(e, u, ", prefetch", false);
  begin_grads(e, L + 1);
  P(e, "  rt_zero(R(DLN), %lld);\n", N * C);
  int64_t o = off(e, gh, head_key(e));
  P(e, "  rt_lm_head_ce_backward(R(DLN), DW(%lld), R(LNF), W(%lld), I(TARGETS), R(LSEF), %lld, %lld, %lld, %lld, "
       "R(CE), c->dloss);\n",
    (long long)o, (long long)o, N, C, V, (long long)e->chunk);
  P(e, "  rt_zero(R(DX_A), %lld);\n", N * C);
  em_norm_backward(e, gh, "DX_A", mem_printf(e->m, "X%d", L), "RSTDF", "norm");
  reduce_scatter(e, L + 1);
  const char *dy = "DX_A", *dx = "DX_B";
  for (int l = L - 1; l >= 0; l--) {
    P(e, "  /* layer %d */\n", l);
    P(e, "  rt_comm_label(\"layer %d backward\");\n", l);
    use_unit(e, l + 1, false);
    if (l + 1 - D >= 1) start_unit(e, l + 1 - D, ", prefetch", false);
    if (e->host_elems && l <= L - 3) P(e, "  rt_offload_wait(c, %d); /* X%d is back */\n", l, l);
    if (e->ac != AC_NONE) P(e, "  layer%d_forward(c, true); /* recompute from X%d (%s checkpointing) */\n", l, l, plan_ac_name(e->ac));
    if (e->host_elems && l >= 2 && l - 2 <= L - 3)
      P(e, "  rt_offload_load(c, %d, R(X%d), H(HX%d), %lld); /* prefetch: X%d's slot is free */\n", l - 2, l - 2, l - 2, N * C,
        l + 1);
    begin_grads(e, l + 1);
    P(e, "  layer%d_backward(c);\n", l);
    reduce_scatter(e, l + 1);
    const char *t = dy;
    dy = dx, dx = t;
  }
  P(e, "  /* embedding */\n");
  P(e, "  rt_comm_label(\"embedding backward\");\n");
  begin_grads(e, 0);
  P(e, "  rt_embedding_backward(DW(0), R(%s), I(INPUTS), %lld, %lld);\n", dy, N, C);
  if (!e->rope)
    P(e, "  rt_position_backward(DW(%lld), R(%s), %lld, %lld, %lld); /* learned positions */\n",
      (long long)off(e, e->g_embed, "embed_positions.weight"), dy, (long long)e->B, (long long)e->T, C);
  reduce_scatter(e, 0);
  P(e, "  /* the last reduce-scatters: every shard has this micro-batch's gradient */\n");
  P(e, "  for (int slot = 0; slot < 4; slot++) rt_comm_reduce_scatter_wait(slot);\n");
  P(e, "}\n");

  P(e, "\n/* After the optimizer step (apply: false when the step was skipped): %s */\n"
       "void step_end(RtCtx *c, bool apply) {\n",
    e->aux_free ? "each MoE layer's router bias moves toward balance (aux_free; DeepSeek-V3, sec. 2.1.2)"
                : "nothing to do for this model");
  if (!e->aux_free) P(e, "  (void)c, (void)apply;\n");
  for (int l = 0; e->aux_free && l < L; l++) {
    if (e->layer_experts[l] < 0) continue;
    int g = e->layer_dense[l];
    P(e, "  rt_moe_load_all_reduce(R(L%d_LOAD), %lld);\n", l, (long long)e->E);
    P(e, "  if (apply) rt_router_bias_update(S(%s_MASTER), shard_lo(c, %d), %lld, %lld, R(L%d_LOAD), %lld, %.9g);\n",
      e->groups[g].cname, g, (long long)e->groups[g].shard, (long long)off(e, g, "moe.gate.e_score_correction_bias"),
      l, (long long)e->E, e->s->model.moe.bias_update_rate);
    P(e, "  rt_zero_real(R(L%d_LOAD), %lld);\n", l, (long long)e->E);
  }
  P(e, "}\n");
}

/* ---- tables and files ------------------------------------------------------------------------- */

static void tables(Em *e) {
  P(e, "\n/* Parameter groups: sharded over the FSDP group (%lld ranks) or, for experts, over the\n"
       " * %lld ranks that share an EP rank. Offsets of this rank's master, gradient and moments in the\n"
       " * state arena (adam_v: AdamW's second moment, its AdamW tensors' values only, compacted; -1: a group of Muon\n"
       " * matrices only has none), and of the shard the\n"
       " * all-gathers read in the activation arena (-1: cast into CAST<b> before each gather). */\n",
    (long long)e->fsdp, (long long)e->efsdp);
  P(e, "const RtGroup step_groups[N_GROUPS] = {\n");
  for (int g = 0; g < e->ngroups; g++) {
    const EmGroup *G = &e->groups[g];
    P(e, "    {\"%s\", %s, %lld, %lld, %s_MASTER, %s_GRAD, %s_ADAM_M, %s, %s},\n", G->name,
      G->comm ? "RT_GROUP_EXPERT_SHARD" : "RT_GROUP_FSDP", (long long)G->full, (long long)G->shard, G->cname,
      G->cname, G->cname, G->second ? mem_printf(e->m, "%s_ADAM_V", G->cname) : "-1",
      e->state_host ? mem_printf(e->m, "%s_PARAM", G->cname) : "-1");
  }
  P(e, "};\n\n/* Parameter tensors: Hugging Face name, group, offset, count, experts, shape, init, decay,\n"
       " * Muon and its owner rank; routed tensors in whole-expert shards: experts per shard and the shard's size\n"
       " * (0, 0: flat). */\n");
  P(e, "const RtTensor step_tensors[N_TENSORS] = {\n");
  for (int i = 0; i < e->ntensors; i++) {
    const EmTensor *t = &e->tensors[i];
    P(e, "    {\"%s\", %d, %lld, %lld, %d, %lld, %lld, %.9g, %s, %s, %s, %d, %d, %lld},\n", t->name, t->group,
      (long long)t->offset, (long long)t->count, t->experts, (long long)t->rows, (long long)t->cols, t->init_std,
      t->init_one ? "true" : "false", t->decay ? "true" : "false", t->muon ? "true" : "false", t->owner, t->per,
      (long long)t->block);
  }
  P(e, "};\n");
}

/* The offset of buffer name (registered by em_layout), or -1. */
static int64_t buf_offset(const Em *e, const char *name) {
  for (int i = 0; i < e->nbufs; i++)
    if (strcmp(e->bufs[i].name, name) == 0) return e->bufs[i].offset;
  return -1;
}

/* Buffers step.h defines (train.c uses them), not step.c's maps. */
static bool in_header(const char *name) {
  return strcmp(name, "INPUTS") == 0 || strcmp(name, "TARGETS") == 0 || strcmp(name, "MUON_WORK") == 0;
}

static void header(Em *e, const char *spec_base, const char *plan_hash) {
  const Spec *s = e->s;
  const Candidate *b = &e->p->best;
  P(e, "/* step.h — generated by mtc from %s; do not edit: regenerate with `mtc compile`.\n"
       " * The plan's constants for train.c, the arena map and the step's entry points. */\n",
    out_comment(e->m, spec_base));
  P(e, "#ifndef STEP_H\n#define STEP_H\n\n#include \"mtrt_train.h\"\n\n");
  P(e, "#define MODEL_NAME \"%s\"\n#define SPEC_FILE \"%s\"\n", out_c_string(e->m, s->name),
    out_c_string(e->m, spec_base));
  /* one key per line: "model.layers 4, " "model.hidden 64, " ... */
  char *keys = spec_model_keys(e->m, s), *lines = "";
  for (char *k = keys, *next; k && *k; k = next) {
    next = strstr(k, ", ");
    if (next) *next = 0, next += 2;
    lines = mem_printf(e->m, "%s \\\n  \"%s%s\"", lines, out_c_string(e->m, k), next ? ", " : "");
  }
  P(e, "/* the model's keys as resolved (spec_model_keys): recorded in each checkpoint's manifest (model_keys);\n"
       " * mtc export compares them with the spec it writes config.json from, a resume notes a change */\n"
       "#define MODEL_KEYS%s\n", lines);
  P(e, "/* the plan.json this program was written with (FNV-1a 64 of its bytes): mtc build checks it */\n"
       "#define PLAN_HASH \"%s\"\n", plan_hash);
  P(e, "/* layout: world = dp_replicate x fsdp; ep experts-parallel ranks inside the FSDP group */\n");
  P(e, "#define PLAN_WORLD %lld\n#define PLAN_FSDP %lld\n#define PLAN_EP %lld\n#define PLAN_DP_REPLICATE %lld\n",
    (long long)e->world, (long long)e->fsdp, (long long)e->ep, (long long)e->dpr);
  P(e, "/* context parallelism: each sequence split over PLAN_CP consecutive ranks of an FSDP group */\n"
       "#define PLAN_CP %lld\n", (long long)e->cp);
  P(e, "#define EXPERTS_PER_RANK %lld\n#define CHECKPOINT_POLICY \"%s\"\n", (long long)e->El, plan_ac_name(e->ac));
  if (plan_expert_per(e->El, e->efsdp) > 0 && e->md->n_moe_layers) { /* the expert groups' shard: every MoE layer's is the same */
    int64_t shard = 0;
    for (int l = 0; l < e->L && !shard; l++)
      if (e->layer_experts[l] >= 0) shard = e->groups[e->layer_experts[l]].shard;
    P(e, "#define SHARD_EXPERTS %lld /* whole experts per rank of an EP rank's shard group */\n"
         "#define SHARD_EXPERTS_ELEMS %lld /* elements of such a shard: gathered experts b·SHARD_EXPERTS.. at b x it */\n",
      (long long)plan_expert_per(e->El, e->efsdp), (long long)shard);
  }
  P(e, "#define OPTIMIZER \"%s\" /* muon: Muon for hidden matrices, AdamW for the rest */\n#define GRAD_REDUCE_DTYPE \"%s\"\n",
    s->training.optimizer == OPT_MUON ? "muon" : "adamw", s->training.grad_reduce_dtype == WIRE_BF16 ? "bf16" : "fp32");
  P(e, "/* training */\n#define GLOBAL_BATCH %lld\n#define MICRO_BATCH %lld\n#define ACCUM %lld\n#define SEQ_LEN %lld\n"
       "#define VOCAB %lld\n#define TOKENS %lld /* per micro-batch and rank */\n",
    (long long)s->training.global_batch, (long long)e->B, (long long)e->accum, (long long)e->T, (long long)e->V,
    (long long)e->N);
  P(e, "/* model shapes the cuda runtime sizes its scratch and builds its attention plans by (kernels.cu has them all) */\n"
       "#define HIDDEN %lld\n#define HEADS %lld\n#define KV_HEADS %lld\n#define HEAD_DIM %lld /* q and k */\n"
       "#define V_HEAD_DIM %lld\n#define ATTENTION_CUDNN %d /* the plan's attention: 1 cuDNN's fused flash attention, 0 the "
       "own kernels (plan_attention_cudnn) */\n#define QKV_FUSED %d /* q, k, v: views of one row q | k | v (plan_qkv_fused) */\n"
       "#define EXPERTS %lld\n#define TOP_K %lld\n#define AUX_FREE %d\n",
    (long long)e->C, (long long)e->nh, (long long)e->nkv, (long long)e->hd, (long long)e->vd,
    plan_attention_cudnn(e->md) ? 1 : 0, e->qkv_fused ? 1 : 0, (long long)e->E, (long long)e->K, e->aux_free ? 1 : 0);
  P(e, "#define MOE_CAP_ROWS %lld /* rows a rank's experts take per all-to-all round (moe_imbalance x tokens x top_k) */\n"
       "#define MOE_MEAN_ROWS %lld /* rows a rank sends per MoE layer pass: tokens x top_k */\n",
    (long long)e->R, (long long)(e->N * e->K));
  if (e->hier)
    P(e, "/* the hierarchical all-to-all (mtrt_hier.h): EP ranks per node, and the staging rows of HS: the origin's\n"
       " * unique rows, the relay's, the relay's staging of copies (its messages' most) */\n#define MOE_HIER_G %lld\n"
       "#define MOE_HIER_US %lld\n#define MOE_HIER_UR %lld\n#define MOE_HIER_ST %lld\n",
      (long long)e->hr.g, (long long)e->hr.us, (long long)e->hr.ur, (long long)e->hr.st);
  P(e, "#define EXPERT_LOOP_ROWS %lld /* the experts' GEMMs: one cuBLAS GEMM per expert over 4 streams when a pass's experts "
       "with rows average at least this many, else one grouped call (0: always grouped; plan.txt's experts line) */\n",
    (long long)(e->E ? cost_expert_loop_rows(s, e->ep) : 0));
  P(e, "#define TRAIN_STEPS %lld\n#define LR %.9g\n#define WARMUP_STEPS %lld\n#define MIN_LR_RATIO %.9g\n"
       "#define WEIGHT_DECAY %.9g\n#define GRAD_CLIP %.9g\n",
    (long long)s->training.steps, s->training.lr, (long long)s->training.warmup_steps, s->training.min_lr_ratio,
    s->training.weight_decay, s->training.grad_clip);
  P(e, "#define FLOPS_PER_TOKEN %.6e /* training FLOPs per token (plan.json model.flops_per_token) */\n",
    e->md->flops_per_token);
  P(e, "#define PREDICTED_TOKENS_PER_S_PER_GPU %.6g /* the plan's prediction for the spec's cluster */\n",
    b->cost.tokens_per_s_per_gpu);
  P(e, "#define PEAK_FLOPS_PER_GPU %.6e /* the MFU denominator: bf16 peak per GPU (plan.json "
       "cluster.peak_bf16_flops_per_gpu) */\n", s->cluster.gpu.bf16_flops);
  P(e, "#define SPEC_GPU_NAME \"%s\" /* cluster.gpu.name: what that peak is of (\"cpu ...\": a core, the cpu "
       "preset's rank) */\n", out_c_string(e->m, s->cluster.gpu.name ? s->cluster.gpu.name : ""));
  P(e, "#define SPEC_GPUS_PER_NODE %lld /* to say which mtc compile --set fits another launch */\n",
    (long long)s->cluster.gpus_per_node);
  P(e, "#define PLAN_HBM_BYTES %lld /* the plan's packed HBM arena per GPU (plan.json memory) */\n"
       "#define PLAN_HOST_BYTES %lld /* its host (Grace) arena per GPU */\n",
    (long long)b->arena[TIER_HBM], (long long)b->arena[TIER_HOST]);
  /* the reserve items: the program allocates cuBLAS's workspace; the CUDA context, NCCL's buffers
   * and the host reserve are the driver's, NCCL's and the system's */
  int64_t reserve[TIER__COUNT] = {0}, workspace = 0;
  for (int i = 0; i < b->nitems; i++) {
    const MemItem *it = &b->items[i];
    if (it->cat != CAT_RESERVE) continue;
    if (strcmp(it->name, "reserve.cublas_workspace") == 0) workspace = it->bytes;
    else reserve[it->tier] += it->bytes;
  }
  P(e, "#define PLAN_HBM_RESERVE_BYTES %lld /* of it, reserved for the CUDA context and NCCL (not allocated here) */\n"
       "#define PLAN_HOST_RESERVE_BYTES %lld /* of the host arena, reserved for the system */\n"
       "#define PLAN_CUBLAS_WORKSPACE_BYTES %lld /* cuBLAS's workspace (an HBM reserve item the program allocates) */\n",
    (long long)reserve[TIER_HBM], (long long)reserve[TIER_HOST], (long long)workspace);
  int64_t staging = buf_offset(e, "GRAD0"), staging_elems = 0;
  for (int i = 0; i < e->nbufs; i++)
    if (strcmp(e->bufs[i].name, "GRAD0") == 0) staging_elems = e->bufs[i].elems;
  P(e, "\n/* the state arena: %lld elements of real (fp32 master shards, gradients, moments) in\n"
       " * %s memory; the optimizer step runs on the %s */\n#define STATE_ELEMS %lld\n#define STATE_ON_HOST %d\n#define OPT_STEP_ON_HOST %d\n",
    (long long)e->top[EM_STATE], e->state_host ? "host (Grace)" : "device (HBM)",
    e->step_host ? "host CPU" : e->state_host ? "GPU, over C2C" : "GPU", (long long)e->top[EM_STATE],
    e->state_host ? 1 : 0, e->step_host ? 1 : 0);
  P(e, "/* the plan's HBM tier but its state block and the items outside the program (reserves, the\n"
       " * runtime's scratch): one span of ACT_ELEMS units, unit o at byte %lld + 2 o of the tier (plan.json\n"
       " * memory.hbm: each item's offset) on the cuda backend, x sizeof(act) / 2 on the cpu backend;\n"
       " * every buffer, act, real or int32, at a unit offset (R, A, I below). ARENA_ELEMS is 0 (no\n"
       " * separate fp32 arena) and no range is scratch only (ARENA_SCRATCH, ACT_SCRATCH at the ends) */\n"
       "#define ARENA_ELEMS 0\n#define ARENA_SCRATCH 0\n#define ACT_ELEMS %lld\n#define ACT_SCRATCH %lld\n"
       "#define INPUTS %lld /* [data.tokens] */\n#define TARGETS %lld /* [data.tokens] */\n",
    (long long)e->base, (long long)e->top[EM_ACT], (long long)e->scratch[EM_ACT], (long long)buf_offset(e, "INPUTS"),
    (long long)buf_offset(e, "TARGETS"));
  /* the HBM span's units that live across micro-batches (tests/cuda_emu/dump.c poisons the rest
   * before each forward): each such buffer's [offset, offset + units), real and int32 values 2
   * units each, in registration order */
  P(e, "/* the HBM span's ranges [unit, unit + n) that live across micro-batches (tokens, expert loads,\n"
       " * shards, kept parameters); the rest is written by each micro-batch before it is read */\n"
       "#define STEP_LIVE_RANGES {");
  int nl = 0;
  for (int i = 0; i < e->nlive; i++) {
    const EmBuf *lb = &e->bufs[i];
    if (lb->arena == EM_STATE || lb->alias) continue;
    P(e, "%s{%lld, %lld}", nl++ ? ", " : "", (long long)lb->offset,
      (long long)(lb->elems * (lb->arena == EM_REAL ? 2 : 1)));
  }
  P(e, "%s}\n#define STEP_N_LIVE_RANGES %d\n", nl ? "" : "{0, 0}", nl);
  P(e, "#define STATE_STAGING %lld /* GRAD0 (activation arena), free between steps: a state arena on the host\n"
       "                             goes through it to NCCL in pieces of its bytes */\n#define STATE_STAGING_ELEMS %lld\n",
    (long long)staging, (long long)staging_elems);
  for (int i = 0; i < e->nbufs; i++)
    if (strcmp(e->bufs[i].name, "MUON_WORK") == 0)
      P(e, "#define MUON_WORK %lld /* [%s] Muon's scratch: fp32 values in the activation arena's bytes (in %s, "
           "free during the optimizer step) */\n#define MUON_WORK_ELEMS %lld\n"
           "#define MUON_STEP_ELEMS %lld /* [workspace.newton_schulz] what the step on the host uses of it: its "
           "own host copy when the step is there */\n"
           "#define MUON_HOST_ELEMS %lld /* [workspace.muon_exchange_host] the cuda step on the GPU: its exchange's "
           "pinned host scratch */\n", (long long)e->bufs[i].offset,
        e->bufs[i].item, e->bufs[i].alias, (long long)e->muon_work, (long long)e->muon_step, (long long)e->muon_host);
  P(e, "#define HOST_ELEMS %lld /* the host arena, units of 2 B of the plan's host tier (HOST_ELEMS x sizeof(act) "
       "bytes, one allocation: pinned on cuda): the state when the plan keeps it there (from 0), the boundaries "
       "waiting for the backward (HX<l>), Muon's host scratch (MUON_HOST_AT, MUON_STEP_AT), each at its plan "
       "item's offset */\n#define MUON_HOST_AT %lld /* [workspace.muon_exchange_host] in the host arena (0: none) */\n"
       "#define MUON_STEP_AT %lld /* [workspace.newton_schulz] in the host arena (0: none) */\n",
    (long long)e->host_span, (long long)e->muon_host_at, (long long)e->muon_step_at);
  P(e, "#define OFFLOAD_IDS %lld /* boundaries that go to the host and back */\n",
    (long long)(e->host_elems ? e->L - 2 : 0));
  if (e->host_elems && e->p->best.ch.offload == OFF_NVME)
    P(e, "#define PLAN_OFFLOAD_NVME 1 /* the plan says NVMe; this program keeps the boundaries in host memory */\n");
  P(e, "#define N_GROUPS %d\n#define N_TENSORS %d\n", e->ngroups, e->ntensors);
  P(e, "extern const RtGroup step_groups[N_GROUPS];\nextern const RtTensor step_tensors[N_TENSORS];\n\n");
  P(e, "/* One micro-batch (inputs and targets in the arena): forward returns the mean cross-entropy\n"
       " * and adds the load-balancing loss to c->aux_loss; backward adds c->dloss times the gradient\n"
       " * of (cross-entropy + aux loss) into this rank's gradient shards. */\n");
  P(e, "real step_forward(RtCtx *c);\nvoid step_backward(RtCtx *c);\n");
  P(e, "/* After each optimizer step (router-bias updates; apply false: a skipped step). */\n"
       "void step_end(RtCtx *c, bool apply);\n\n#endif\n");
}

static void body(Em *e, const char *spec_base) {
  const Candidate *b = &e->p->best;
  P(e, "/* step.c — generated by mtc from %s; do not edit: regenerate with `mtc compile`.\n *\n",
    out_comment(e->m, spec_base));
  P(e, " * The plan: %lld ranks = %lld replica(s) x %lld-way FSDP, EP %lld (%lld experts per rank),\n"
       " * %s activation checkpointing; %lld micro-batch(es) of %lld x %lld tokens per rank and step.\n",
    (long long)e->world, (long long)e->dpr, (long long)e->fsdp, (long long)e->ep, (long long)e->El,
    plan_ac_words(e->ac), (long long)e->accum, (long long)e->B, (long long)e->T);
  if ((e->keep[0] || e->keep[1]) && e->kept_buf[e->keep[0] ? 0 : 1]) { /* (a kind kept that has groups) */
    bool both = e->keep[0] && e->keep[1];
    P(e, " * Reshard after_step: %s gathered once per step, by the first micro-batch's forward, into\n"
         " * %s, and read there by every forward and backward until the optimizer step (c->gather_kept)%s\n"
         " * gradients are reduce-scattered after each micro-batch's backward.\n",
      both ? "every parameter group is" : e->keep[0] ? "all but the routed experts are" : "the routed experts are",
      e->kept_buf[e->keep[0] ? 0 : 1],
      both ? ";" : e->keep[0] ? ";\n * the routed experts are re-gathered into GATHERED<i> for each pass;"
                              : ";\n * the rest is re-gathered into GATHERED<i> for each pass;");
  }
  P(e, " * Every buffer is at its plan item's bytes (plan.json memory): the state in the state arena, the\n"
       " * rest in one span of the HBM tier, both allocated once at start-up: the maps below. Tokens are\n"
       " * B x T = %lld rows of hidden %lld.\n */\n",
    (long long)e->N, (long long)e->C);
  (void)b;
  P(e, "#include <stdbool.h>\n#include <string.h>\n\n#include \"mtrt_comm.h\"\n#include \"mtrt_ops.h\"\n#include \"step.h\"\n\n");
  P(e, "#define S(o) (c->state + (o))                    /* state buffer at state arena offset o */\n");
  P(e, "#define R(o) ((real *)(c->acts + (o)))          /* real buffer at unit o of the HBM span */\n");
  P(e, "#define A(o) (c->acts + (o))                     /* activation (act) buffer at unit o */\n");
  P(e, "#define RA(o) ((real *)(c->acts + (o)))         /* real values in an activation buffer's bytes at unit o */\n");
  P(e, "#define I(o) ((int32_t *)(c->acts + (o)))       /* int32 buffer at unit o */\n");
  P(e, "#define W(o) (c->wd + (o))                      /* a gathered dense parameter */\n");
  P(e, "#define DW(o) (c->dwd + (o))                    /* its gradient (in GRAD0 or 1) */\n");
  P(e, "#define WE(o) (c->we + (o))                     /* a gathered expert parameter */\n");
  P(e, "#define DWE(o) (c->dwe + (o))                   /* its gradient (in GRAD0 or 1) */\n");
  P(e, "#define EPS ((real)%.9g)                        /* the norms' epsilon (model.norm_eps) */\n", e->s->model.norm_eps);
  if (e->offload) P(e, "#define H(o) (c->host + (o))                     /* host arena buffer (activation offload) */\n");
  if (e->cp > 1) /* each sequence in 2 cp chunks of T / (2 cp): this rank holds chunks cp_rank and 2 cp - 1 - cp_rank */
    P(e, "#define CP_LO ((int64_t)c->comm.cp_rank * %lld) /* first position of this rank's first chunk */\n"
         "#define CP_HI ((int64_t)(2 * PLAN_CP - 1 - c->comm.cp_rank) * %lld) /* and of its second */\n",
      (long long)(e->T / (2 * e->cp)), (long long)(e->T / (2 * e->cp)));
  P(e, "\n");
  static const char *const maps[EM__ARENAS] = {"the state arena map (elements of real)",
                                               "the HBM span's real and int32 buffers (offsets in units of 2 B)",
                                               "the HBM span's activation buffers (offsets in units of 2 B)"};
  for (int a = 0; a < EM__ARENAS; a++) {
    P(e, "%s/* ---- %s ---- */\n", a ? "\n" : "", maps[a]);
    if (a == EM_STATE) { /* the plan's state block (plan.c pack, plan_state): its items at these offsets */
      const Candidate *c = &e->p->best;
      int64_t base = -1;
      for (int j = 0; j < c->nitems; j++)
        if (c->items[j].state) {
          if (base < 0) {
            base = c->items[j].offset;
            P(e, "/* the plan's state block, from byte %lld of its %s arena (plan.json memory): item by item, byte = 4 x "
                 "element:\n", (long long)base, plan_tier_name(c->items[j].tier));
          }
          P(e, " *   %-30s from element %12lld, %12lld bytes\n", c->items[j].name, (long long)((c->items[j].offset - base) / 4),
            (long long)c->items[j].bytes);
        }
      if (base >= 0) P(e, " */\n");
    }
    for (int i = 0; i < e->nbufs; i++) {
      const EmBuf *bf = &e->bufs[i];
      if ((int)bf->arena != a || in_header(bf->name)) continue;
      if (bf->alias && bf->alias_at)
        P(e, "#define %-22s (%s + %lld) /* %10lld [%s]: %s */\n", bf->name, bf->alias, (long long)bf->alias_at,
          (long long)bf->elems, bf->item, bf->what);
      else if (bf->alias)
        P(e, "#define %-22s %12s /* %10lld [%s]: %s */\n", bf->name, bf->alias, (long long)bf->elems, bf->item, bf->what);
      else
        P(e, "#define %-22s %12lld /* %10lld [%s]: %s */\n", bf->name, (long long)bf->offset, (long long)bf->elems,
          bf->item, bf->what);
    }
  }
  if (e->offload) {
    P(e, "\n/* Activation offload (%s): boundary l lives in device slot l %% 3; boundaries 0-%lld go to the\n"
         " * host arena after their layer's forward and come back two layers before their backward. */\n",
      e->p->best.ch.offload == OFF_NVME ? "the plan says NVMe; this program keeps them in host memory" : "host",
      (long long)e->L - 3);
    for (int l = 0; l <= e->L; l++) P(e, "#define X%-3d XSLOT%d\n", l, l % 3);
    for (int l = 0; l + 3 <= e->L; l++)
      P(e, "#define HX%-3d %12lld /* host: boundary %d (activations.boundary[%d]) */\n", l, (long long)e->hx[l], l, l);
  }
  tables(e);
  if (e->aux_free)
    P(e, "\n/* first gathered index of this rank's shard of group g */\nstatic int64_t shard_lo(const RtCtx *c, int g) {\n"
         "  return (step_groups[g].comm == RT_GROUP_FSDP ? c->comm.fsdp_rank : c->comm.shard_rank) * step_groups[g].shard;\n}\n");
  for (int l = 0; l < e->L; l++) em_layer_forward(e, l);
  const char *dy = "DX_A", *dx = "DX_B";
  for (int l = (int)e->L - 1; l >= 0; l--) {
    em_layer_backward(e, l, dy, dx);
    const char *t = dy;
    dy = dx, dx = t;
  }
  schedule(e);
}

/* The features the generated program implements; others are refused at their spec key. */
static bool supported(Diag *d, const Spec *s) {
  const ModelSpec *m = &s->model;
  const char *key = NULL, *what = NULL;
  bool mla = m->attention.kind == ATTN_MLA;
  if (mla && m->bias) key = "model.bias", what = "mla with biases (DeepSeek's attention_bias)";
  else if (mla && m->norm != NORM_RMSNORM) key = "model.norm", what = "mla with layernorm";
  else if (mla && m->rope_scaling.present && m->rope_scaling.type == ROPE_SCALING_LLAMA3)
    key = "model.rope_scaling", what = "mla with llama3 rope_scaling (mla takes yarn, DeepSeek's)";
  else if (m->bias && m->moe.present) key = "model.bias", what = "biases on routed experts";
  else if (m->attention.qk_norm != QKN_NONE && (m->norm != NORM_RMSNORM || m->bias))
    key = "model.attention.qk_norm", what = "qk-norm with layernorm or biases";
  if (!key) return true;
  return diag_error(d, spec_loc(s, key), "the generated training program does not implement %s yet, so no "
                    "program was written (plan.json, plan.txt and the reports were); expected a model without it%s "
                    "for a program, or mtc plan for the plan alone", what,
                    "");
}

const char *em_cp_unsupported(const Spec *s) {
  const ModelSpec *m = &s->model;
  if (m->rope_scaling.present && m->rope_scaling.type != ROPE_SCALING_NONE)
    return "RoPE with rope_scaling (llama3 or yarn) under context parallelism";
  if (m->position == POS_LEARNED) return "learned positions under context parallelism";
  if (m->moe.present && m->moe.seq_aux_loss_coef > 0) return "the sequence-wise balance loss under context parallelism";
  return NULL;
}

bool em_implements(const Spec *s) {
  Mem m = {0};
  Diag d = {.mem = &m};
  bool ok = supported(&d, s);
  mem_free(&m);
  return ok;
}

void em_init(Em *e, Mem *m, const Plan *p) {
  const Model *md = p->md;
  const Spec *s = md->spec;
  *e = (Em){0};
  e->m = m, e->s = s, e->md = md, e->p = p;
  const Choice *ch = &p->best.ch;
  /* per rank: B sequences of T tokens, or with context parallelism B x T / cp tokens, two chunks
   * of T / (2 cp) of each sequence (rank r's chunks r and 2 cp - 1 - r) */
  e->cp = plan_cp(ch);
  e->B = s->training.micro_batch, e->T = s->training.seq_len, e->N = e->B * e->T / e->cp;
  e->C = s->model.hidden, e->V = s->model.vocab, e->L = s->model.layers;
  e->nh = s->model.attention.heads, e->nkv = s->model.attention.kv_heads, e->hd = s->model.attention.head_dim;
  const AttentionSpec *at = &s->model.attention;
  e->mla = at->kind == ATTN_MLA;
  if (e->mla) {
    e->nkv = e->nh, e->qr = at->q_lora_rank, e->kvr = at->kv_lora_rank;
    e->nope = at->qk_nope_head_dim, e->rope_dim = at->qk_rope_head_dim;
    e->hd = e->nope + e->rope_dim, e->vd = at->v_head_dim;
  } else {
    e->vd = e->hd;
  }
  e->Q = e->nh * e->hd, e->KV = e->nkv * e->hd, e->VW = e->nkv * e->vd, e->AO = e->nh * e->vd;
  e->qk_norm = s->model.attention.qk_norm;
  e->rope = s->model.position == POS_ROPE;
  e->qkv_fused = plan_qkv_fused(s, e->cp);
  e->fsdp = ch->fsdp, e->ep = ch->ep, e->efsdp = ch->efsdp, e->dpr = ch->dp_replicate, e->accum = ch->accum;
  e->world = p->world, e->ac = ch->ac, e->prefetch = ch->prefetch;
  e->keep[0] = ch->reshard == RESHARD_AFTER_STEP, e->keep[1] = ch->reshard_experts == RESHARD_AFTER_STEP;
  e->offload = (ch->offload == OFF_HOST || ch->offload == OFF_NVME) && ch->ac == AC_FULL;
  e->state_host = ch->opt_tier == TIER_HOST, e->step_host = ch->opt_on_host;
  if (s->model.moe.present) {
    e->E = s->model.moe.experts, e->K = s->model.moe.top_k, e->El = e->E / e->ep, e->Fe = s->model.moe.expert_intermediate;
    e->Fs = s->model.moe.shared_experts * s->model.moe.shared_intermediate;
    /* rows one rank's experts take per round: the plan's moe_imbalance x the mean (tokens x top_k),
     * capped at the dropless worst case; routing past it runs in extra rounds (rt_moe_route) */
    e->R = e->ep > 1 ? (int64_t)ceil(plan_moe_imbalance(s, e->ep) * (double)(e->N * e->K) - 1e-9) : e->N * e->K;
    e->hier = plan_hier(s, ch);
    if (e->hier) e->hr = plan_hier_rows(s, e->ep, e->N, e->R);
    e->aux_free = s->model.moe.load_balance == LB_AUX_FREE;
    e->sigmoid = s->model.moe.router == ROUTER_SIGMOID;
    e->gelu_experts = s->model.moe.activation == ACT_GELU;
  }
  e->chunk = plan_logits_chunk(e->N, e->V);
  em_layout(e);
}

/* The program has no NVMe tier yet: it keeps what the plan puts on NVMe in host memory. */
static void nvme_warning(const Em *e) {
  fprintf(stderr, "warning: the plan puts the layer boundaries on NVMe, but the program keeps them in host memory: "
          "%.1f MiB per GPU that the plan's host memory does not count; expected that much free host memory, or "
          "--set plan.offload_activations=host for a plan that counts it\n",
          (double)e->host_elems * (double)sizeof(float) / 1048576.0);
}

bool emit_step(Mem *m, Diag *d, const Plan *p, const char *dir, const char *spec_base, const char *plan_hash) {
  const Model *md = p->md;
  const Spec *s = md->spec;
  if (!supported(d, s)) return false;
  if (plan_cp(&p->best.ch) > 1 && em_cp_unsupported(s))
    return diag_error(d, spec_loc(s, "plan.cp"), "the generated training program does not implement %s yet, so no "
                      "program was written (plan.json, plan.txt and the reports were); expected plan.cp: 1 for a "
                      "program, or mtc plan for the plan alone", em_cp_unsupported(s));
  Em e;
  em_init(&e, m, p);
  em_place(&e); /* every buffer at its plan item's bytes */
  if (2 * (e.prefetch + 1) > EM_AG_SLOTS)
    return diag_error(d, spec_loc(s, "plan.prefetch"), "prefetch depth %d needs %d all-gathers in flight; the program "
                      "keeps at most %d (prefetch %d); expected plan.prefetch %d or less", e.prefetch,
                      2 * (e.prefetch + 1), EM_AG_SLOTS, EM_AG_SLOTS / 2 - 1, EM_AG_SLOTS / 2 - 1);
  if (e.R > INT32_MAX) /* the runtime counts a round's rows in int (its offsets are int32) */
    return diag_error(d, spec_loc(s, "plan.moe_imbalance"), "one all-to-all round would take %lld rows per rank "
                      "(moe_imbalance x tokens x top_k), more than 2^31 - 1; expected a lower plan.moe_imbalance, "
                      "training.micro_batch or training.seq_len", (long long)e.R);
  if (e.host_elems && p->best.ch.offload == OFF_NVME) nvme_warning(&e);
  const char *names[2] = {"step.h", "step.c"};
  for (int i = 0; i < 2; i++) {
    const char *path = mem_printf(m, "%s/%s", dir, names[i]);
    OutFile o;
    if (!(e.f = out_open(d, &o, path))) return false;
    if (i == 0) header(&e, spec_base, plan_hash);
    else body(&e, spec_base);
    if (!out_close(d, &o)) return false;
  }
  return true;
}

