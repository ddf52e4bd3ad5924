/*
 * emit.h — the program emitter's private state, shared by emit_layout.c (parameter groups and
 * the arena), emit_layer.c and emit_moe.c (one layer's code) and emit_step.c (the schedule,
 * step.h and step.c). The public entry points are in
 * mtc.h (emit_program, build_run).
 */
#ifndef MTC_EMIT_H
#define MTC_EMIT_H

#include <math.h>
#include <stdio.h>

#include "mtc.h"

/* All-gathers the program's runtime keeps in flight at most (runtime/mtrt_comm.h RT_AG_SLOTS):
 * 2 per unit of the prefetch pool, so a plan's prefetch depth is at most 7. */
enum { EM_AG_SLOTS = 16 };

/* The generated program's arenas, each one array of one element type, allocated at start-up:
 *   EM_STATE  S(o), `real`: fp32 master shards, their gradients and optimizer moments, in the
 *             tier the plan chose for them (HBM, or host memory the GPU reads over C2C);
 *   EM_REAL   R(o), `real`: fp32 statistics, routing, gradients, loss and communication scratch,
 *             and int32 buffers (one element per value), in HBM;
 *   EM_ACT    A(o), `act`: activations and their gradients, gathered parameters and the shards
 *             gathered from, in HBM (the activation type: bf16 on the cuda backend, real on the
 *             cpu backend). */
typedef enum { EM_STATE, EM_REAL, EM_ACT, EM__ARENAS } EmArena;

/* One buffer of the generated program: offset and size in elements of its arena's type. */
typedef struct {
  const char *name; /* the C macro: "L2_Q", "WS_Q", "X3", "L2_DENSE_MASTER" */
  int64_t offset, elems;
  const char *what;
  EmArena arena;
  const char *alias; /* NULL, or the buffer whose bytes this one reuses from element alias_at on:
                      * step.c's map says `#define NAME ALIAS` or `(ALIAS + alias_at)`, with why
                      * their lifetimes never overlap */
  int64_t alias_at;
  bool real; /* fp32 values in the activation arena's bytes (an alias there): elems counts 2 act
              * elements per value, enough for any act type; step.c writes it RA(NAME) */
  const char *item; /* the plan's memory item whose bytes hold it, as plan.json names it under
                     * memory ("workspace.shared", "activations.saved[3]", "gathered.params[1]");
                     * an alias's is its target's. step.c's arena map shows it. */
} EmBuf;

/* A parameter group (see runtime/mtrt_train.h): elems before padding; full = padded to a
 * multiple of its ranks; shard = full / ranks. */
typedef struct {
  const char *name, *cname; /* "layer 2 dense", "L2_DENSE" */
  int comm;                 /* 0 FSDP group, 1 expert-shard group */
  int64_t elems, full, shard;
  int first, last;          /* its tensors are among tensors[first..last] (none: first > last) */
  bool adamw, muon;         /* some tensor is optimized by AdamW (two moments), by Muon (one) */
  int64_t second;           /* AdamW's second moment: the most values of its AdamW tensors one
                               rank's shard holds (plan_shard_values_max; 0: no ADAM_V buffer) */
  int64_t kept_at;          /* kept gathered (Em.keep): its first element in its kind's kept
                               buffer (Em.kept_buf); else -1 */
} EmGroup;

/* A parameter tensor in its group (one expert's size for routed tensors). */
typedef struct {
  const char *key;  /* model.c's name: "attn.q_proj.weight" */
  const char *name; /* Hugging Face name (routed: a pattern with %d) */
  int layer, group, experts;
  int64_t offset, count, rows, cols;
  double init_std;
  bool init_one, decay;
  bool muon;  /* optimized by Muon */
  int owner;  /* Muon owner: rank in the group's communicator (routed: of expert 0) */
  int per;      /* whole-expert shards: experts per shard (0: flat) */
  int64_t block;/* and the shard's elements: expert k at offset + (k / per)·block + (k % per)·count */
} EmTensor;

typedef struct {
  Mem *m;
  FILE *f;
  const Spec *s;
  const Model *md;
  const Plan *p;
  /* shapes: B sequences of T tokens (N = B·T), C hidden, V vocabulary, nh/nkv heads of hd,
   * Q = nh·hd, KV = nkv·hd, E experts (El per EP rank), K top_k, Fe expert width, Fs shared
   * width (all shared experts), R rows an EP rank's experts may receive, chunk of the vocab */
  int64_t B, T, N, C, V, nh, nkv, hd, Q, KV, E, El, K, Fe, Fs, R, chunk, L;
  int64_t cp;             /* context-parallel ranks a sequence is split over (N = B T / cp) */
  /* values: vd per head (hd; MLA's v_head_dim), VW = nkv·vd per token, AO = nh·vd the attention
   * output. MLA (mla true; nkv = nh, hd = nope + rope): q_lora_rank qr (0: none), kv_lora_rank
   * kvr, qk_nope_head_dim nope, qk_rope_head_dim rope */
  int64_t vd, VW, AO, qr, kvr, nope, rope_dim;
  bool mla;
  int64_t fsdp, ep, efsdp, dpr, accum, world;
  bool hier;         /* the MoE all-to-all is hierarchical (plan_hier): rows per stage in hr */
  PlanHierRows hr;
  int prefetch; /* the plan's prefetch depth P: units u+1..u+P are gathered while u computes */
  /* the plan's reshard (keep[0]: every group but the routed experts) and reshard_experts
   * (keep[1]) after_step: those groups are gathered by the first micro-batch's forward into
   * kept_buf[k] (the plan's gathered.params_kept "KEPT" for both, gathered.dense_kept
   * "DENSE_KEPT", gathered.experts_kept "EXPERTS_KEPT") and stay there until the optimizer
   * step; the pool GATHERED<i> holds the other kind only (none when both are kept) */
  bool keep[2];
  const char *kept_buf[2];
  CheckpointPolicy ac;
  bool aux_free, sigmoid;
  QkNorm qk_norm; /* model.attention.qk_norm: q and k normalized before RoPE (Qwen3, OLMoE) */
  bool qkv_fused; /* plan_qkv_fused: one q|k|v GEMM into the layer's QKV (gradient DQKV), strided views */
  /* one gate|up GEMM (SwiGLU, no biases: gate_proj's and up_proj's weights adjacent) into rows
   * g | u (GU, SGU; gradients DGU, DSGU): [0] the dense MLP (not where its recomputed buffers share
   * the routed experts' bytes: emit_layout.c ffn_union), [1] the shared experts (em_gu_fused) */
  bool gu_fused[2];
  bool rope;         /* model.position rope; else learned absolute positions (embed_positions) */
  bool gelu_experts; /* model.moe.activation gelu: routed and shared experts are up/down with GELU, no gate */
  /* activation offload (full checkpointing with boundaries on host or NVMe): boundary l lives
   * in device slot l % 3 (XSLOT0-2), and boundaries 0..L-3 wait for the backward in the host
   * arena (HX0..): host_elems elements of it */
  bool offload;
  int64_t host_elems;
  /* em_place, the host tier: the program's one host allocation (HOST_ELEMS: units of 2 bytes of
   * the tier, one act element on the cuda backend) spans the plan's host items the program holds,
   * from byte 0 (the state block, when the plan keeps it there) to the top of the last of them;
   * hx[l] is boundary l's offset in it (the plan's activations.boundary[l]; with NVMe, past the
   * plan's items), muon_host_at and muon_step_at those of workspace.muon_exchange_host and
   * workspace.newton_schulz (0: no such item), all in the same units */
  int64_t host_span, *hx, muon_host_at, muon_step_at;
  EmBuf *bufs;
  int nbufs, capbufs;
  const char *item; /* the plan item of the buffers em_layout registers next (EmBuf.item) */
  MemMap bufnames; /* name -> its arena + 1 (EmArena): each buffer registered once */
  int64_t top[EM__ARENAS]; /* elements of each arena (em_place: the one HBM span's units) */
  int64_t base;            /* em_place: the HBM tier's byte at unit 0 (the state block's end) */
  int nlive;                   /* bufs[0..nlive): the state and the buffers that live across
                                  micro-batches (tokens, expert loads, shards, kept parameters) */
  int64_t scratch[EM__ARENAS]; /* first element of R and A past the buffers that live across
                                  micro-batches */
  bool state_host; /* the plan keeps the state (master, gradient shard, moments) in host memory */
  bool step_host;  /* and runs the optimizer step on the host CPU */
  int64_t muon_work; /* MUON_WORK elements: the most rt_muon_group_work asks of any group */
  int64_t muon_step, muon_host; /* MUON_STEP_ELEMS, MUON_HOST_ELEMS: plan_muon_work's step and exchange */
  /* a layer's backward: whether DLN already holds this pass's values (its first writer writes
   * it, later ones add: em_dln_gemm, em_dln_zero) */
  bool dln_live;
  EmGroup *groups;
  int ngroups, g_embed, g_head;
  int *layer_dense, *layer_experts; /* group of each layer (-1: no experts) */
  EmTensor *tensors;
  int ntensors;
} Em;

/* Sets e up for plan p (shapes, layout, policy) and lays out its groups, tensors and arena
 * (em_layout); allocations in m. */
void em_init(Em *e, Mem *m, const Plan *p);
/* Fills e's groups, tensors and arena from its model and plan. */
void em_layout(Em *e);
/* Places every buffer but the state's where the plan's HBM tier has it (after em_init, on a
 * plan from plan_search: plan_exact's bytes, packed): at its item's offset plus the bytes
 * (em_buf_bytes) of the item's buffers registered before it; an alias at its target's offset
 * plus its own. Offsets become units of 2 bytes of the tier (one act element on the cuda
 * backend) from the byte after the state block (Em.base: 0 with the state on the host), for real
 * and int32 buffers too (step.h's R(o), I(o)); alias_at likewise. top[EM_ACT] is then the span
 * from base to the top of the program's items, top[EM_REAL] 0. The host tier likewise
 * (Em.host_span, hx, muon_host_at, muon_step_at): each host buffer at its item's offset, in one
 * allocation from the tier's byte 0. An inconsistent plan is an internal error (abort). */
/* The registered buffer named name (an alias included), or NULL. */
EmBuf *em_find_buf(Em *e, const char *name);
void em_place(Em *e);
/* Bytes buffer b takes in its plan item (plan_exact, test_plan_items): a state buffer its
 * elements rounded up to 16 (64 B of fp32, plan_state's rule); any other its cuda bytes (act
 * 2 B, real and int32 4 B an element; a real alias in act: 2 act elements per value) rounded
 * up to 64 B. An alias takes none of its own (its target's bytes hold it): callers skip it. */
int64_t em_buf_bytes(const EmBuf *b);
/* Whether the generated program implements spec s's model (emit_step.c; else mtc compile
 * writes no program). */
bool em_implements(const Spec *s);
/* The arena macro of activation `name` of layer l under the checkpoint policy: "L2_Q" when
 * saved per layer, "WS_Q" when the layer recomputes it in backward; its class is the model
 * graph's (em_saved), or for the per-layer tables OFFSETS and EOFF the class of the saves they
 * go with. A name neither knows is an internal error (exit 70, naming layer and buffer). */
const char *em_act(Em *e, int l, const char *name);
/* The model graph's save (compiler/model.c) that program buffer `name` of layer l holds, or
 * NULL: the entry of that name among layer l's ops; with one EP rank buffer XP holds the
 * experts' input rows, the save XE. */
const Saved *em_saved(const Em *e, int l, const char *name);
/* Elements of program buffer `name` of layer l: its save's elements per token times the
 * tokens N, or for a routed save times the rows R one rank's experts take per round
 * (elements per token / top_k per row). An internal error (exit 70) when the model has no such
 * save. */
int64_t em_saved_elems(const Em *e, int l, const char *name);
/* The arena of buffer name (registered by em_layout; the boundaries X<l> are activations), or
 * -1 for a name that is no buffer. */
int em_arena_of(const Em *e, const char *name);
/* Whether buffer name holds fp32 values in the activation arena's bytes (EmBuf.real: RA(NAME)). */
bool em_real_in_act(const Em *e, const char *name);

/* ---- emit_layer.c and emit_moe.c: a layer's code in step.c ---------------------------------- */

/* Writes printf-style text to e->f; every R(NAME) of an activation-arena buffer (em_arena_of)
 * is written A(NAME) (RA(NAME) for fp32 values there: em_real_in_act), so that one spelling
 * serves the code and the type follows the layout. */
void em_printf(Em *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Offset (elements) of tensor key (model.c's name) in group g; aborts on a key the group lacks
 * (an emitter bug: the emitter asks only for tensors the model graph has). */
int64_t em_off(Em *e, int g, const char *key);
/* The bias of the linear layer whose weight is wkey in group g as a call argument through
 * macro m (W, or DW for its gradient): "NULL" when the model graph gives it none (model.bias,
 * model.attention.bias). */
const char *em_bias_arg(Em *e, int g, const char *wkey, const char *m);
/* A norm's forward (out, stats <- x) and backward (dx += through the norm, its weight's
 * gradient) with group g's weights `name` (rmsnorm or layernorm as the spec says). */
void em_norm_forward(Em *e, int g, const char *out, const char *stats, const char *x, const char *name);
void em_norm_backward(Em *e, int g, const char *dx, const char *x, const char *stats, const char *name);
/* The backward GEMM whose dx is DLN: rt_matmul_backward_set for DLN's first writer in a layer's
 * backward (e->dln_live false; then true), rt_matmul_backward (adding) after it. em_dln_zero: zeroes
 * DLN before an op that only adds into it, unless something wrote it already. */
const char *em_dln_gemm(Em *e);
/* A fused gate|up FFN's weight (or gradient) offset: prefix's gate_proj ("mlp", "moe.shared_experts")
 * in group g, with up_proj's F x hidden values right after it (model.c's order); aborts if not. */
int64_t em_gu_weight(Em *e, int g, const char *prefix, int64_t F);
void em_dln_zero(Em *e);
/* The functions layer<l>_forward and layer<l>_backward of step.c (dy, dx: the arena names of
 * the incoming and outgoing boundary gradients). */
/* Context parallelism: RoPE at this rank's positions (rt_rope_span_<dir>, CP_LO and CP_HI of step.c)
 * on x (an expression of the step code: "A(Q)") of heads heads `stride` apart, rd channels each. */
void em_rope_span(Em *e, const char *ind, const char *dir, const char *x, int64_t heads, int64_t stride, int64_t rd);
void em_layer_forward(Em *e, int l);
void em_layer_backward(Em *e, int l, const char *dy, const char *dx);
/* The MoE part of layer l, called inside the layer's functions. */
void em_moe_forward(Em *e, int l);
void em_moe_backward(Em *e, int l, const char *dy);
/* emit_mla.c: multi-head latent attention's q, k, v of layer l: the forward from LN1 into Q, K,
 * V (under selective checkpointing it opens `if (!recompute) {` after the latents, and the
 * caller writes the attention core and closes it); the backward from DQ, DK, DV into DLN
 * (its first GEMM writes it: em_dln_gemm) and the weight gradients. Its saved latents and their 1/rms are model.c's
 * saves (laid out with every layer's by em_layout); the buffers the layers share are groups of
 * the shared workspace (shared_ws, laid out by compiler/attn_ws.c). */
void em_mla_forward(Em *e, int l);
void em_mla_backward(Em *e, int l);

/* Shorthands of the layer emitters (emit_layer.c, emit_moe.c, emit_step.c). */
#define P em_printf
#define off em_off
#define bias_arg em_bias_arg
#define A em_act

#endif
