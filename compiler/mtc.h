/*
 * mtc.h — the compiler's one internal header, in sections per file (as chibicc does).
 *
 * Every file of compiler/ (tests/docs.sh checks that this index and the README's repository
 * section name them all):
 *   arena.c       mem_     one arena per compile, overflow-checked sizes, a hash map in it
 *   diag.c        diag_    sources and FILE:LINE:COL diagnostics with a caret
 *   units.c       units_   sizes, rates and FLOP/s with units
 *   yaml.c        yaml_    libyaml events -> a small tree with marks; --set; preset merge
 *   spec.c        spec_    the spec schema (one table of keys, types, defaults) -> typed structs
 *   check.c       spec_    loading (file, --set, preset), semantic validation, derived defaults
 *   presets.c     preset_  cluster presets (embedded copies of specs/clusters/ + search path)
 *   model.c       model_   the model graph: layers × ops, parameters, activations, FLOPs
 *   plan.c        plan_    memory items of a candidate, their tiers and lifetimes, the arenas
 *   placement.c   plan_    which rank owns which experts and orthogonalizes which matrix (Muon)
 *   muon_work.c   plan_    Muon's scratch (MUON_WORK): one figure for the plan's item and the program
 *   state_layout.c plan_   the state block (master, gradients, moments): the plan's items as the state arena
 *   attn_ws.c     plan_    the attention's groups of the shared workspace (MLA's too), for plan and program
 *   plan_exact.c  plan_    the chosen plan's items the program holds: the program's own bytes, packed again
 *   cost.c        cost_    the predicted step time of a candidate (and its Chrome trace)
 *   cost_kernel.c cost_    the seconds of one op's kernels on one GPU, per stack (cluster.stack)
 *   search.c      plan_    every layout × policy the pins allow; the fastest that fits; advice
 *   report.c      report_  the model accounting as text and as plan.json (jansson)
 *   report_plan.c report_  the plan as text, summary, explain and plan.json keys
 *   emit_svg.c    emit_    memory.svg, and emit_escape for HTML/SVG text
 *   emit_trace.c  emit_    timeline.json (the predicted step as a Chrome trace)
 *   emit_steps_svg.c emit_ the predicted step as an SVG timeline (report.html, diff --html)
 *   emit_ranks_svg.c emit_ the layout drawn: nodes, GPUs, EP/FSDP/CP groups (report.html)
 *   emit_html.c   emit_    report.html
 *   emit_layout.c em_      the program's parameter groups, tensors and arena (emit.h)
 *   emit_place.c  em_      where the buffers are: each at its plan item's offset, per tier (emit.h)
 *   emit_step.c   emit_    step.h and step.c: the schedule, tables and files around the layers
 *   emit_layer.c  em_      a dense layer's forward and backward in step.c (emit.h)
 *   emit_moe.c    em_      the MoE part of a layer in step.c (emit.h)
 *   emit_mla.c    em_      multi-head latent attention's q, k, v in step.c (emit.h)
 *   emit_prog.c   emit_    train.c, kernels.cu, CMakeLists.txt, launch.sbatch; mtc build
 *   output.c      out_     atomic compile outputs, output directories, plan identity, escaping
 *   export.c      export_  mtc export: a checkpoint as safetensors (and config.json)
 *   export_hf.c   export_  the Hugging Face family of a spec: config.json and tensor names
 *   import_hf.c   import_  mtc import-hf: a spec from a Hugging Face config.json
 *   diff.c        diff_    mtc diff: what changes between two plans
 *   calibrate.c   calibrate_ mtc calibrate: a preset's factors fitted to train --profile files
 *   sweep.c       sweep_   mtc sweep: the best plan at every point of a grid
 *   main.c                 the command line
 *
 * Errors never exit: a function that can fail returns false (or NULL) after recording one
 * diagnostic in the Diag it was given; main prints it and chooses the exit status.
 */
#ifndef MTC_H
#define MTC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MTC_VERSION "0.1.0"

/* Exit statuses of every command (docs/commands.md). */
enum { EXIT_DONE = 0, EXIT_NO_PLAN = 1, EXIT_BAD_INPUT = 2 };

/* ------------------------------------------------------------------ arena.c */

/* A bump allocator: every allocation of one compile lives until mem_free. Memory is zeroed.
 * Out of memory is fatal (prints and exits 2): there is nothing sensible to recover. */
typedef struct MemChunk MemChunk;
typedef struct {
  MemChunk *head;
} Mem;

void *mem_alloc(Mem *m, size_t size);
/* count × size with overflow check; overflow is reported like out-of-memory. */
void *mem_array(Mem *m, size_t count, size_t size);
/* mem_array without zeroing, for arrays whose elements are written before they are read. */
void *mem_array_raw(Mem *m, size_t count, size_t size);
char *mem_strndup(Mem *m, const char *s, size_t n);
char *mem_strdup(Mem *m, const char *s);
/* printf into the arena. */
char *mem_printf(Mem *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mem_free(Mem *m);
/* Forgets every allocation but keeps the memory (one chunk as large as all of them), for a
 * loop that allocates the same amount each round. */
void mem_reset(Mem *m);

/* A hash map in the arena from (owner, key) to a non-NULL value: a lookup in expected O(1)
 * where a list scan would make a long input quadratic (a mapping's keys, YAML anchors, the
 * emitter's buffer names). owner scopes keys (the mapping they belong to; NULL for one flat
 * namespace); key must live as long as the map. Zero-initialize a MemMap before first use. */
typedef struct {
  struct MemMapSlot *slots;
  size_t cap, n; /* cap: a power of two, or 0 */
} MemMap;
/* The value stored under (owner, key), or NULL. */
void *mem_map_get(const MemMap *h, const void *owner, const char *key);
/* Stores val (non-NULL) under (owner, key), replacing any value there. */
void mem_map_put(Mem *m, MemMap *h, const void *owner, const char *key, void *val);

/* ------------------------------------------------------------------ diag.c */

/* A text the user wrote: a spec file, a preset, or one --set argument. */
typedef struct {
  const char *name; /* as shown in diagnostics: the path given, or "--set" */
  const char *text; /* NUL-terminated copy of the contents */
  size_t len;       /* bytes in text, without the NUL */
} Source;

/* A position in a Source. line and col are 0-based (libyaml marks); printed +1. */
typedef struct {
  const Source *src;
  int line, col;
} Loc;

/* The first error of a run, fully formatted ("FILE:LINE:COL: error: ...\n  line\n  ^\n"). */
typedef struct {
  Mem *mem;
  char *msg; /* NULL while no error */
} Diag;

/* Records an error at loc (loc.src may be NULL: no position). Keeps only the first error.
 * Always returns false so that callers can `return diag_error(...)`. */
bool diag_error(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Reads a whole file into a Source (arena-owned). Refuses files over limit bytes and anything
 * but a regular file; what names the file expected in messages ("a spec file"). */
const Source *diag_read_source(Mem *m, Diag *d, const char *path, size_t limit, const char *what);
const Source *diag_source(Mem *m, const char *name, const char *text, size_t len);
/* Bytes of the line break at p (LF, CR, CRLF, U+0085, U+2028, U+2029, as YAML counts them),
 * or 0 if p does not start one. */
int diag_line_break(const char *p, const char *end);

/* ------------------------------------------------------------------ units.c */

/* What a quantity measures; each has its own units. */
typedef enum { Q_SIZE, Q_RATE, Q_FLOPS, Q_COUNT } Quantity;

/* Parses "96 GB", "120GiB", "25 GB/s", "989 TFLOP/s", or a count "25M" / "24Mi tokens" / plain
 * 4096 into base units (bytes, bytes/s, FLOP/s, ones). A size, rate or compute rate needs its
 * unit: a bare number is refused with a suggestion ("did you mean '80 GB'?"); only a count may
 * be a plain number. Decimal prefixes k M G T P are 10^3n,
 * binary Ki Mi Gi Ti Pi are 2^10n. On failure returns false and writes a message (what was
 * wrong; what was expected) into err (errlen bytes). The value must be finite, > 0 and, for
 * sizes and counts, below 2^62; a count must be whole. */
bool units_parse(const char *text, Quantity q, double *out, char *err, size_t errlen);
/* Formats bytes with binary units ("55.5 GiB"), and with decimal units ("59.6 GB"). */
void units_fmt_bytes_bin(char *buf, size_t n, double bytes);
void units_fmt_bytes_dec(char *buf, size_t n, double bytes);
/* Formats a count with an SI suffix, 2 decimals: 951.80 B (billions), 12.88 B, 8.03 B. */
void units_fmt_count(char *buf, size_t n, double count);
/* Formats an integer with thousands separators: 951,791,394,816. */
void units_fmt_int(char *buf, size_t n, int64_t v);

/* ------------------------------------------------------------------ yaml.c */

typedef enum { Y_SCALAR, Y_MAP, Y_SEQ } YKind;

typedef struct YNode YNode;
typedef struct YPair YPair;

/* One entry of a mapping (key != NULL) or a sequence (key == NULL). */
struct YPair {
  YNode *key; /* a scalar */
  YNode *val;
  YPair *next;
};

/* A YAML node. Aliases point at their anchor's node, so the tree is a DAG. */
struct YNode {
  YKind kind;
  Loc loc;         /* where the node starts */
  const char *str; /* Y_SCALAR: the text, NUL-terminated */
  bool quoted;     /* Y_SCALAR: written in quotes or as a block scalar */
  YPair *first;    /* Y_MAP / Y_SEQ: entries in document order */
  int64_t weight;  /* nodes under this one, aliases expanded (alias-bomb guard) */
};

/* Limits on what a spec may be (specs are a few hundred nodes). */
enum {
  YAML_MAX_FILE = 1 << 20,     /* bytes */
  YAML_MAX_DEPTH = 32,         /* nested collections */
  YAML_MAX_EXPANDED = 100000,  /* nodes with aliases expanded */
};

/* Parses one YAML document whose top level is a mapping. Rejects: syntax errors, empty
 * documents, several documents, tabs in indentation, NUL/binary bytes, duplicate or
 * non-scalar keys, tags, unknown anchors, and aliases that expand past YAML_MAX_EXPANDED
 * nodes. what names the expected top level in messages ("a mapping with name, model..."). */
YNode *yaml_parse(Mem *m, Diag *d, const Source *src, const char *what);
/* The value under key in map (NULL if absent or map is not a mapping). */
YNode *yaml_get(const YNode *map, const char *key);
/* The pair for key in map, or NULL. */
YPair *yaml_pair(const YNode *map, const char *key);
/* Follows a dotted path ("model.attention.heads") from root; NULL if absent. */
YNode *yaml_path(const YNode *root, const char *path);
/* Applies one "--set KEY=VALUE" to root: walks/creates mappings along KEY and sets the
 * scalar; VALUE null or ~ removes KEY instead (it takes its default, or the preset's value),
 * so that one of two exclusive keys can be dropped without editing the file. The new nodes'
 * marks point into a Source named "--set" holding arg. */
bool yaml_set(Mem *m, Diag *d, YNode *root, const char *arg);
/* The same for value index (0-based) of one "--over KEY=V1,V2,..." of mtc sweep: the marks
 * point into a Source named "--over" holding the whole arg, at that value. */
bool yaml_set_over(Mem *m, Diag *d, YNode *root, const char *arg, int index);
/* Adds to dst every key of src that dst lacks, recursively for mappings present in both
 * (dst wins). Used to lay a cluster preset under the spec's cluster section. */
void yaml_merge_under(Mem *m, YNode *dst, const YNode *src);

/* ------------------------------------------------------------------ spec.c / check.c */

typedef enum { NORM_RMSNORM, NORM_LAYERNORM } NormKind;                 /* ORDER norm_names */
typedef enum { POS_ROPE, POS_LEARNED } PosKind;                         /* ORDER pos_names */
typedef enum { ATTN_MHA, ATTN_GQA, ATTN_MLA } AttnKind;                 /* ORDER attn_names */
typedef enum { QKN_NONE, QKN_PER_HEAD, QKN_FULL } QkNorm;               /* ORDER qkn_names */
/* Biases on the attention projections alone (model.bias puts them on every linear and norm):
 * qkv on q_proj, k_proj, v_proj (Qwen1.5/Qwen2/Qwen2-MoE's Qwen2Attention: bias=True there,
 * none on o_proj); qkvo also on o_proj (transformers' LlamaAttention with attention_bias). */
typedef enum { ABIAS_NONE, ABIAS_QKV, ABIAS_QKVO } AttnBias;           /* ORDER abias_names */
typedef enum { ROPE_SCALING_NONE, ROPE_SCALING_LLAMA3, ROPE_SCALING_YARN } RopeScalingKind; /* ORDER rope_scaling_names */
typedef enum { ACT_SWIGLU, ACT_GELU } Activation;                       /* ORDER act_names */
typedef enum { ROUTER_SOFTMAX, ROUTER_SIGMOID } RouterKind;             /* ORDER router_names */
typedef enum { LB_AUX_LOSS, LB_AUX_FREE } LoadBalance;                  /* ORDER lb_names */
typedef enum { OPT_MUON, OPT_ADAMW } Optimizer;                         /* ORDER opt_names */
typedef enum { WIRE_BF16, WIRE_FP32 } WireDtype;                        /* ORDER wire_names */
typedef enum { AC_AUTO, AC_NONE, AC_SELECTIVE, AC_FULL } CheckpointPolicy; /* ORDER ac_names */
typedef enum { OFF_AUTO, OFF_NONE, OFF_HOST, OFF_NVME } OffloadPolicy;  /* ORDER off_names */
typedef enum { PIN_TIER_AUTO, PIN_TIER_HBM, PIN_TIER_HOST } PinTier;     /* ORDER opt_tier_names */
typedef enum { PIN_STEP_AUTO, PIN_STEP_GPU, PIN_STEP_HOST } PinStep;     /* ORDER opt_step_names */
/* When gathered parameters are freed: after each micro-batch's use (re-gathered for the next
 * micro-batch's forward and backward), or kept from the first micro-batch's forward until the
 * optimizer step (one all-gather per layer and step). */
typedef enum { RESHARD_AUTO, RESHARD_EVERY_MICRO_BATCH, RESHARD_AFTER_STEP } ReshardPolicy; /* ORDER reshard_names */

/* How an EP group that spans nodes exchanges tokens: flat (every token copy straight to the
 * rank of its expert: the copies for other nodes each cross InfiniBand), or hierarchical
 * (DeepSeek-V3's dispatch: one copy per destination node over InfiniBand to the GPU of the same
 * local index there, forwarded over NVLink to the GPUs holding its experts; the combine sums
 * inside the node first). Planned; the generated program runs flat. */
typedef enum { DISPATCH_AUTO, DISPATCH_FLAT, DISPATCH_HIERARCHICAL } DispatchPolicy; /* ORDER dispatch_names */

/* Every struct below mirrors one section of the spec; spec.c's tables name each field's key,
 * type, default and range. Counts are plain integers; sizes are bytes, rates bytes/s,
 * compute FLOP/s (all as double: 96 GB = 9.6e10 exactly). "0 = auto" for plan pins. */
typedef struct {
  bool present;
  AttnKind kind;
  int64_t heads, kv_heads;  /* kv_heads: default heads; mla ignores it */
  int64_t head_dim;         /* default hidden / heads */
  double rope_theta;
  QkNorm qk_norm;
  AttnBias bias;            /* biases on the attention projections only (gqa, mha) */
  int64_t q_lora_rank;      /* mla: 0 = no q-LoRA (q projected from hidden directly) */
  int64_t kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; /* mla only */
} AttentionSpec;

typedef struct {
  bool present;
  int64_t intermediate;
  Activation activation;
} MlpSpec;

typedef struct {
  bool present;
  int64_t experts, top_k, shared_experts, expert_intermediate;
  int64_t shared_intermediate; /* default expert_intermediate */
  Activation activation;       /* of routed and shared experts */
  int64_t first_dense_layers, interleave;
  bool router_bias;
  RouterKind router;
  LoadBalance load_balance;
  double aux_loss_coef;    /* aux_loss: weight of the balancing loss */
  double bias_update_rate; /* aux_free: bias step per optimizer step */
  double seq_aux_loss_coef; /* sequence-wise balance loss weight (DeepSeek-V2 seq_aux, V3's complementary
                               loss); 0: off; with either load_balance */
  bool norm_topk_prob;       /* true: the top-k weights renormalized to sum 1 (Mixtral, Qwen3-MoE);
                                false: the raw softmax (or sigmoid) scores (Qwen2-MoE) */
  double routed_scaling_factor; /* routed experts' weights times this (DeepSeek-V3; default 1) */
  bool shared_expert_gate;      /* shared experts' output times sigmoid(x . w), w (hidden) (Qwen2-MoE) */
  int64_t n_group, topk_group;  /* group-limited routing: experts in n_group groups, top_k chosen from the
                                   topk_group best groups (DeepSeek-V3); 1 and n_group: none */
} MoeSpec;

/* model.rope_scaling: RoPE's frequencies for contexts past the pre-training length.
 * llama3: Llama 3.1's per-frequency scaling (transformers' _compute_llama3_parameters);
 * yarn: YaRN (Peng et al. 2023, arXiv:2309.00071; transformers' _compute_yarn_parameters). */
typedef struct {
  bool present;
  RopeScalingKind type;
  double factor;                  /* context extension factor (> 1) */
  int64_t original_max_position;  /* pre-training context (0: not given) */
  double low_freq_factor, high_freq_factor; /* llama3 */
  double beta_fast, beta_slow, mscale, mscale_all_dim; /* yarn */
} RopeScalingSpec;

typedef struct {
  bool present;
  int64_t layers, hidden, vocab;
  bool tie_embeddings;
  NormKind norm;
  PosKind position;
  int64_t max_position; /* 0 = not given; required by position: learned */
  bool bias;
  double norm_eps; /* epsilon of every RMSNorm (inside the square root); default 1e-5 */
  RopeScalingSpec rope_scaling;
  AttentionSpec attention;
  MlpSpec mlp;
  MoeSpec moe;
} ModelSpec;

typedef struct {
  bool present;
  const char *name;
  double hbm;            /* bytes per GPU */
  double hbm_bandwidth;  /* bytes/s */
  double bf16_flops;     /* dense bf16 tensor FLOP/s */
  int64_t sms;
} GpuSpec;

typedef struct {
  bool present;
  double memory;    /* bytes of host (Grace) memory per GPU */
  double bandwidth; /* bytes/s of host memory per GPU */
  int64_t cores;    /* CPU cores per GPU */
  double fp32_flops;/* FLOP/s of those cores in fp32 (the optimizer step on the host) */
} HostSpec;

/* Fractions of a peak rate that real kernels and collectives reach: named parameters of the
 * cost model, each with its source or stated as an assumption in the preset. */
typedef struct {
  bool present;
  double dense_gemm, grouped_gemm, attention, elementwise, host_gemm, network, c2c;
  double host_memory;    /* of host.bandwidth the host cores' streaming reaches */
  double attention_bwd;  /* of bf16_flops flash attention's backward reaches (0: attention) */
  double attention_cudnn, attention_cudnn_bwd; /* the same for cuDNN's, the generated program's (0: attention, attention_bwd) */
  double expert_gemm_loop;    /* of bf16_flops each routed expert's own cuBLAS GEMM reaches (the program's loop; 0: dense_gemm) */
  double grouped_gemm_cublas; /* of bf16_flops cublasGemmGroupedBatchedEx reaches (the program's grouped path; 0: grouped_gemm) */
  double gemm_tile_rows, gemm_tile_cols; /* output tile of a GEMM kernel (tile and wave
                                            quantization, with gpu.sms) */
  double kernel_launch;  /* seconds: the least time one kernel takes (launch and dispatch) */
  double all_to_all;     /* of a link's rate the MoE all-to-all reaches (0: network) */
  double sustained;      /* of the best-shape rates (dense_gemm, attention) a whole training
                            step sustains: clocks under power and thermal limits */
  double optimizer_update; /* of hbm_bandwidth the optimizer's elementwise update on the GPU
                            reaches (AdamW 30 B, Muon 22 B per parameter; 0: elementwise) */
} EfficiencySpec;

/* Whose kernels the cost model prices (cluster.stack): the generated program's, or PyTorch's
 * in eager mode or under torch.compile (TorchTitan, llm-foundry). */
typedef enum { STACK_MTC, STACK_PYTORCH_EAGER, STACK_PYTORCH_COMPILE } Stack; /* ORDER stack_names */

/* Fixed per-GPU memory the plan reserves (bytes). */
typedef struct {
  bool present;
  double cuda_context, nccl_buffers, cublas_workspace; /* HBM */
  double host;                                         /* host memory */
} ReserveSpec;

typedef struct {
  bool present;     /* absent: no NVMe tier */
  double capacity;  /* bytes per GPU */
  double bandwidth; /* bytes/s per GPU */
} NvmeSpec;

/* How the GPUs of a node are connected: a link between every pair (mesh: nvlink is one pair
 * link) or through an NVSwitch (nvlink is one GPU's bandwidth into the switch). */
typedef enum { TOPO_MESH, TOPO_NVSWITCH } NodeTopology; /* ORDER topo_names */

typedef struct {
  bool present;
  NodeTopology topology;
  double c2c;       /* GPU <-> its host memory, bytes/s per direction */
  double nvlink;    /* GPU <-> GPU in a node, bytes/s per direction (see topology) */
  double internode; /* per GPU between nodes, bytes/s per direction */
} LinksSpec;

/* Where the cost model's rates for this cluster come from (cluster.evidence, data in the presets):
 * reports print it beside every prediction, and launch.sbatch's time limit follows from it. */
typedef struct {
  bool present;
  const char *measured;       /* efficiency keys measured or taken from a published microbenchmark,
                                 space-separated (NULL: none); the rest are assumptions */
  const char *fitted;         /* efficiency keys fitted to whole published runs (NULL: none) */
  double band_low, band_high; /* predicted / published tokens/s over the fidelity rows of
                                 tests/specs/fidelity on this GPU (0: no rows) */
  int64_t band_rows;          /* how many rows */
  const char *band_source;    /* which rows (NULL: none) */
  double program_ratio;       /* measured / predicted tokens/s of mtc's generated program (0: never
                                 measured) */
  const char *program_source; /* the run and the GPU it ran on (NULL: none) */
} EvidenceSpec;

typedef struct {
  bool present;
  const char *preset;
  Stack stack;
  int64_t nodes, gpus_per_node;
  GpuSpec gpu;
  HostSpec host;
  NvmeSpec nvme;
  LinksSpec links;
  EfficiencySpec efficiency;
  ReserveSpec reserve;
  EvidenceSpec evidence;
} ClusterSpec;

typedef struct {
  bool present;
  int64_t seq_len, global_batch, micro_batch;
  int64_t global_batch_tokens; /* tokens per step when written (global_batch then = it / seq_len), else 0 */
  bool micro_batch_searched;  /* micro_batch unwritten or auto: the search chooses it (micro_batch 1 until then) */
  Optimizer optimizer;
  WireDtype grad_reduce_dtype;
  double lr;
  int64_t steps;
  int64_t warmup_steps;
  double min_lr_ratio, weight_decay, grad_clip;
} TrainingSpec;

typedef struct {
  bool present;
  int64_t fsdp, ep, dp_replicate; /* 0 = auto */
  int64_t tp, pp;                 /* only 1 is supported */
  int64_t cp;                     /* context-parallel ranks a sequence is split over; 0 = auto */
  CheckpointPolicy activation_checkpoint;
  OffloadPolicy offload_activations;
  ReshardPolicy reshard;          /* when gathered parameters are freed (auto: searched) */
  ReshardPolicy reshard_experts;  /* the same for the routed experts alone (auto: as reshard) */
  DispatchPolicy moe_dispatch;    /* MoE all-to-all across nodes: flat or hierarchical (auto: searched) */
  double moe_imbalance;           /* most tokens an EP rank receives / the mean */
  PinTier optimizer_tier;         /* where master, gradient shard and optimizer state live */
  PinStep optimizer_step;         /* where the optimizer step runs */
  int64_t prefetch;               /* all-gathers in flight; 0 = auto */
} PlanSpec;

/* A parsed, validated spec. root is the YAML tree after --set and preset merge; its marks
 * let later stages point errors at the key that caused them (spec_loc). */
typedef struct {
  const char *path; /* as given on the command line */
  const char *name;
  ModelSpec model;
  ClusterSpec cluster;
  TrainingSpec training;
  PlanSpec plan;
  YNode *root;
} Spec;

/* Loads path (or, if text != NULL, the buffer text of len bytes named path), applies the
 * --set overrides in order, merges the cluster preset, converts by the schema and validates.
 * Returns NULL with one diagnostic in d on any error. */
Spec *spec_load(Mem *m, Diag *d, const char *path, const char *text, size_t len,
                const char *const *sets, int nsets);
/* spec_load of file path for one point of mtc sweep's grid: the --set overrides, then value
 * idx[i] of each "--over KEY=V1,V2,..." overs[i] (errors name the --over argument). */
Spec *spec_load_point(Mem *m, Diag *d, const char *path, const char *const *sets, int nsets,
                      const char *const *overs, const int *idx, int nover);
/* Where key (dotted path) was written; if absent, its nearest present parent; else 1:1. */
Loc spec_loc(const Spec *s, const char *path);
/* Whether the dotted key src->text[0, klen) is one of the schema's keys or sections; else
 * false with an "unknown key" diagnostic (did you mean ...) at the segment that is not. */
bool spec_key_check(Diag *d, const Source *src, size_t klen);
/* Converts the tree to typed structs by the schema (spec.c). */
bool spec_convert(Diag *d, Spec *s);
/* Semantic checks and derived defaults (check.c). */
bool spec_validate(Diag *d, Spec *s);
/* The batch key the spec wrote: "training.global_batch_tokens" when it counts tokens, else
 * "training.global_batch". */
const char *spec_batch_key(const Spec *s);
/* The batch sizes nearest the spec's that are multiples of q sequences, below (when above 0) and
 * above, in the unit of spec_batch_key: "3840 or 4224", or "15728640 (3840 x 4096) or 17301504
 * (4224 x 4096)" for tokens; a batch on that grid gets its two neighbours. */
const char *spec_batch_nearest(Mem *m, const Spec *s, int64_t q);
/* Every key of the model section as resolved (defaults and derived values filled in), in the
 * schema's order, as "model.layers 4, model.hidden 64, model.attention.rope_theta 10000, ...":
 * the model's conventions and shapes that a checkpoint records (step.h MODEL_KEYS, the
 * manifest's model_keys), for mtc export to compare with the spec it is given. A section with
 * required keys adds "model.moe written" or "model.moe absent". Allocated in m. */
char *spec_model_keys(Mem *m, const Spec *s);
/* Prints the spec reference (every key, type, default, meaning) as a markdown table. */
void spec_print_keys(FILE *out);
/* The names of an enum value, for output ("gqa", "full"...). */
const char *spec_attn_name(AttnKind k);
const char *spec_act_name(Activation a);
const char *spec_router_name(RouterKind r);
const char *spec_norm_name(NormKind n);
/* The i-th key of cluster.efficiency (from 0), NULL past the last. */
const char *spec_efficiency_key(int i);
/* cluster.stack's name: "mtc", "pytorch-eager", "pytorch-compile". */
const char *spec_stack_name(Stack st);

/* ------------------------------------------------------------------ presets.c */

/* An embedded copy of specs/clusters/NAME.yaml, compiled into mtc (presets_data.c is
 * generated by CMake from the files). */
typedef struct {
  const char *name; /* "jupiter-booster" */
  const char *path; /* "specs/clusters/jupiter-booster.yaml", shown in diagnostics */
  const char *text;
  size_t len;
} PresetFile;

extern const PresetFile preset_files[];
extern const int preset_count;

/* Finds preset NAME: $MTC_PRESET_DIR/NAME.yaml, then clusters/NAME.yaml next to the spec
 * file, then the embedded copy. Returns the parsed mapping, or NULL with a diagnostic at
 * `at` (the preset's value in the spec). */
YNode *preset_load(Mem *m, Diag *d, const char *name, const char *spec_path, Loc at);

/* ------------------------------------------------------------------ model.c */

typedef enum { DT_BF16, DT_FP32, DT_INT32 } DType;

/* Parameter kinds of the accounting breakdown.  ORDER kind_names in model.c */
typedef enum {
  PK_EMBEDDING, /* input token embedding and learned positions */
  PK_ATTENTION, /* q/k/v/o projections (and MLA's low-rank ones), their biases */
  PK_MLP,       /* dense feed-forward */
  PK_ROUTED,    /* routed experts */
  PK_SHARED,    /* shared experts */
  PK_ROUTER,    /* router weights and score-correction bias */
  PK_NORM,      /* every norm's weight and bias (incl. qk-norm, MLA's latent norms) */
  PK_HEAD,      /* LM head (0 when tied to the embedding) */
  PK__COUNT
} ParamKind;

/* What the forward pass keeps for backward, by who may drop it (checkpoint policies). */
typedef enum {
  SAVE_BOUNDARY, /* the layer's input (residual stream): kept by every policy */
  SAVE_ATTN,     /* attention core: q, k, v, output, log-sum-exp (kept by none and selective) */
  SAVE_EXPERT,   /* routed/shared expert internals (kept by none only) */
  SAVE_OTHER     /* everything else inside the layer (kept by none only) */
} SaveClass;

typedef enum {
  OP_EMBED, OP_POS_EMBED, OP_NORM, OP_QKV, OP_QK_NORM, OP_ROPE, OP_ATTN_CORE, OP_ATTN_OUT,
  OP_RESIDUAL, OP_MLP, OP_ROUTER, OP_DISPATCH, OP_EXPERTS, OP_SHARED, OP_COMBINE,
  OP_FINAL_NORM, OP_LM_HEAD, OP_LOSS
} OpKind;

/* A parameter tensor. shape has ndim entries (rows first, as in PyTorch's nn.Linear:
 * [out, in]); routed experts have a leading [experts] dimension. */
typedef struct {
  const char *name;  /* "attn.q_proj.weight" */
  int ndim;
  int64_t shape[3];
  int64_t count;     /* product of shape */
  ParamKind kind;
  bool matmul;       /* a weight matrix of a GEMM (for flops_per_token and Muon) */
} Param;

/* One activation a backward pass needs, per token. Its name is the generated program's buffer
 * (emit_layout.c: L<l>_NAME when its class is kept, WS_NAME when recomputed; "X" is the boundary
 * X<l>): the planner counts these entries and the emitter lays out a layer's buffers from them,
 * op by op and save by save in this order (em_layout), sized, classed and described by them (em_saved), one
 * description of a layer (tests/test_layout.c checks them name for name). */
typedef struct {
  const char *name;  /* "Q", "RSTD1" */
  int64_t elems;     /* elements per token (routed ones scaled by top_k) */
  DType dtype;
  SaveClass cls;
  bool routed;       /* lives on the experts' side of the all-to-all: grows with the tokens an
                        EP rank receives (plan.moe_imbalance) */
  const char *what;  /* what it holds, for people: "queries (rotated)" (step.c's arena map) */
} Saved;

enum { OP_MAX_PARAMS = 16, OP_MAX_SAVED = 6 };

/* One op of the graph, in forward order. All "per token" figures are averages over a
 * sequence; attention's FLOPs depend on the sequence length. */
typedef struct {
  OpKind kind;
  const char *name;           /* "attention.core" */
  int layer;                  /* -1 for ops outside the layers */
  Param params[OP_MAX_PARAMS];
  int nparams;
  int64_t param_count;        /* all parameters of the op */
  int64_t active_params;      /* parameters one token touches (top_k of the experts) */
  int64_t active_matmul;      /* GEMM weights one token touches (router included; a tied
                                 LM head counts the embedding it multiplies by) */
  double gemm_flops;          /* forward GEMM FLOPs per token: 2 × active_matmul */
  double attn_flops_per_seq;  /* forward causal attention FLOPs per token per sequence
                                 position: heads·(qk_dim + v_dim); × seq gives
                                 2·seq·heads·(qk+v)/2 (half the scores are masked) */
  int64_t in_bytes, out_bytes;/* activation bytes read and written per token (bf16) */
  Saved saved[OP_MAX_SAVED];
  int nsaved;
} Op;

typedef enum { LAYER_DENSE, LAYER_MOE } LayerKind;

typedef struct {
  LayerKind kind;
  int first_op, nops;    /* range in Model.ops */
  int64_t params;        /* all parameters of the layer */
  int64_t active_params;
  int64_t saved_bytes[4];/* per token, by SaveClass */
  int64_t saved_routed;  /* per token: the part of saved_bytes[SAVE_EXPERT] that is routed */
  int64_t routed_params; /* of the routed experts (all E of them) */
  int64_t ffn_width;     /* hidden units per token of the dense MLP or the shared experts */
  int64_t routed_width;  /* hidden units per token of the routed experts: top_k × width */
} Layer;

/* The expanded model. ops hold every op in forward order: embedding, the layers, the head. */
typedef struct {
  const Spec *spec;
  Op *ops;
  int nops, cap;
  Layer *layers;
  int nlayers, n_moe_layers;
  int64_t qk_head_dim, v_head_dim; /* per attention head (MLA: nope + rope, v_head_dim) */

  /* accounting (parameters) */
  int64_t params_total, params_active, params_active_nonembedding;
  int64_t by_kind_total[PK__COUNT], by_kind_active[PK__COUNT];
  int64_t active_matmul;           /* LM head in; input embedding and router out */
  /* training FLOPs per token, without recomputation (docs/plan-json.md):
   * 6 × active_matmul + 6 · layers · seq · heads · (qk + v) / 2 */
  double flops_matmul, flops_attention, flops_per_token;

  /* for the optimizer: matrices Muon would orthogonalize (2-D GEMM weights other than the
   * embedding, router and LM head; each expert's matrix counted on its own) */
  int64_t muon_params, muon_matrices;
  int64_t muon_dense_params;       /* of them, those of matrices other than routed experts' */
  double ns_flops;                 /* Newton-Schulz, 5 iterations over all of them (see model.c) */
  int64_t muon_max_rows, muon_max_cols; /* the largest one, rows <= cols */
  /* parameters of the units outside the layers as the program groups them (emit_layout.c): the
   * embedding (with learned positions), and the head with the final norm; summed in op order */
  double unit_embed_params, unit_head_params;
} Model;

/* Expands spec's model. Fails only on 64-bit overflow of a count (error at the model key). */
Model *model_build(Mem *m, Diag *d, const Spec *s);
const char *model_kind_name(ParamKind k);
int64_t model_dtype_bytes(DType t);

/* ------------------------------------------------------------------ plan.c / cost.c */

typedef enum { TIER_HBM, TIER_HOST, TIER_NVME, TIER__COUNT } Tier; /* ORDER tier_names */

/* What a memory item holds, for reports.  ORDER cat_names in plan.c */
typedef enum {
  CAT_PARAMS, CAT_GATHERED, CAT_GRADS, CAT_OPTIMIZER, CAT_ACTIVATIONS, CAT_MOE, CAT_WORKSPACE,
  CAT_RESERVE, CAT__COUNT
} ItemCategory;

/* Phases of one optimizer step, the unit of lifetimes (L = layers):
 *   0 before the step (static) | 1+l forward of layer l | L+1 LM head and loss |
 *   2L+1-l backward of layer l | 2L+2 optimizer step | 2L+3 = end. */
#define PHASE_FWD(L, l) (1 + (l))
#define PHASE_LOSS(L) ((L) + 1)
#define PHASE_BWD(L, l) (2 * (L) + 1 - (l))
#define PHASE_OPT(L) (2 * (L) + 2)
#define PHASE_END(L) (2 * (L) + 3)

/* One planned buffer of one GPU: bytes, tier and lifetime [start, end) in phases; offset in
 * its tier's arena after packing. */
typedef struct {
  const char *name;    /* "activations.boundary" */
  const char *formula; /* how bytes was computed */
  ItemCategory cat;
  Tier tier;
  int64_t bytes;
  int start, end;
  int64_t offset;
  bool stacked;        /* per-layer activations: nested lifetimes, packed as a stack */
  bool state;          /* the state block (plan_state): packed first, contiguous, in build order */
  bool outside;        /* not in the program's arena (reserves, the cuda runtime's own scratch, the
                          state's host copy): packed last, at the top of its tier */
  bool exact;          /* bytes are the program's own (plan_exact), not the formula's */
} MemItem;

/* The decisions of one candidate plan. */
typedef struct {
  int64_t fsdp, ep, dp_replicate;
  int64_t efsdp;            /* ranks an expert's parameters are sharded over: fsdp / ep */
  int64_t micro_batch;      /* sequences per rank per forward/backward */
  int64_t accum;            /* micro-batches per step: global_batch / (micro_batch × world) */
  ReshardPolicy reshard;    /* every_micro_batch or after_step: every parameter but the routed experts */
  ReshardPolicy reshard_experts; /* the same for the routed experts (= reshard for a dense model) */
  DispatchPolicy dispatch;  /* flat or hierarchical (only when the EP group spans nodes) */
  CheckpointPolicy ac;      /* none, selective or full */
  OffloadPolicy offload;    /* none, host or nvme: where boundary activations wait */
  Tier opt_tier;            /* fp32 master weights, gradients and optimizer state */
  bool opt_on_host;         /* optimizer step on the Grace cores (else on the GPU) */
  int prefetch;             /* all-gathers in flight ahead of the computing layer */
  int64_t cp;               /* context parallelism: cp consecutive ranks of the FSDP group split each
                               sequence in 2 cp chunks, rank r holding chunks r and 2 cp - 1 - r
                               (0 reads as 1: plan_cp) */
} Choice;

/* ch's context-parallel degree, at least 1. Tokens per rank and micro-batch: micro_batch x
 * seq_len / cp; sequences per step over the world: W / cp data ranks (the cp ranks of a group
 * read chunks of the same sequences). */
int64_t plan_cp(const Choice *ch);
/* Elements per token of one layer's keys and values as context parallelism all-gathers them:
 * kv_heads x (qk_head_dim + v_head_dim) (MLA: heads, its expanded keys and values) (plan.c). */
double plan_cp_kv_elems(const Spec *s, const Model *md);

/* Predicted times of one step, seconds. */
typedef struct {
  double compute;           /* forward + backward + recompute kernels, all micro-batches */
  double recompute;         /* the part of compute spent recomputing activations */
  double exposed_comm;      /* FSDP all-gather / reduce-scatter not hidden behind compute */
  double a2a;               /* MoE all-to-all (exposed: on the compute stream) */
  double exposed_offload;   /* activation copies to/from host not hidden behind compute */
  double host_grad;         /* gradient shards to host memory, accumulated there in fp32 */
  double optimizer;         /* optimizer step incl. Muon gathers and host streaming */
  double dp_allreduce;      /* gradient all-reduce across replicas */
  double cp_exchange;       /* context parallelism: the K/V all-gathers and the dK/dV reduce-scatters
                               not hidden behind the attention (on the compute stream) */
  double step;
  double tokens_per_s_per_gpu, mfu;
  double comm_total;        /* all FSDP collective time, hidden or not */
  const char *bottleneck;   /* the largest component */
  double bottleneck_seconds; /* and its seconds */
} Cost;

/* A candidate plan: choice, memory items packed per tier, and (if it fits) its cost. */
typedef struct {
  Choice ch;
  bool quick;                    /* search mode: items without names or formulas (only the winner's are read) */
  int bound;                     /* plan_items for plan_over_bound only: 1, the state, stacked and outside
                                    items; 2, all but the Muon placement's (its scratch 0 B, its host items
                                    left out); 0: all */
  MemItem *items;
  int nitems;
  int64_t capacity[TIER__COUNT]; /* bytes; 0 = no such tier */
  int64_t arena[TIER__COUNT];    /* packed arena size = the tier's peak */
  int64_t live_peak[TIER__COUNT];/* sum of item sizes at the fullest phase */
  int peak_phase[TIER__COUNT];
  bool fits;
  Tier over_tier;                /* when !fits: the tier most over, and by how much */
  int64_t over_bytes;
  Cost cost;
} Candidate;

/* ------------------------------------------------------------------ placement.c */

enum { PLACEMENT_MAX_RANKS = 1 << 16 }; /* larger FSDP groups get the rule, not the list */

/* The one rule for how an EP rank's experts are sharded over its shard group (efsdp ranks), read
 * by the planner, the placement, the emitter and (through RtTensor.per in the generated tables)
 * the runtime: whole experts, per = El / efsdp of every routed tensor in each shard, when efsdp
 * divides El (no padding: europa-1t, El 96 over 96 ranks); otherwise (and with one rank) 0: the
 * group is sharded flat like a dense group, and an expert matrix split over ranks moves to an
 * owner for Muon like a dense one (mixtral-8x7b: 8 experts over 32 ranks, no 4x padding). */
int64_t plan_expert_per(int64_t El, int64_t efsdp);

/* Elements per rank of a flat group of elems elements over ranks ranks: shards of whole 16-byte
 * vectors of bf16 (emit_layout.c lays the groups out with it; placement.c finds what moves). */
int64_t plan_flat_shard(int64_t elems, int64_t ranks);

/* Vocabulary columns of one LM-head / cross-entropy chunk for tokens rows: the whole vocabulary
 * when its fp32 logits fit in 1 GiB, else at most 4096 columns and 1 GiB of fp32 logits (a
 * multiple of 128 when >= 128). The plan's workspace item and the program's CE buffer (2 x tokens
 * x chunk fp32: the logits and their gradient) both use it. */
int64_t plan_logits_chunk(int64_t tokens, int64_t vocab);

/* Bytes of the cuda runtime's own device scratch besides cuBLAS's workspace, as
 * runtime/cuda/ops.c's scratch_of allocates it: attention's delta (4 x tokens x heads) and
 * cuDNN's dQ accumulator (4 x tokens x heads x qk_head_dim), the
 * cross-entropy's sums (4 x (2 tokens + 1)), one double, the grouped GEMMs' pointer arrays (8 x 8
 * slots x 3 x experts), the bf16 router-logit copy (2 x tokens x experts) and the MoE count/table
 * scratch (cu_moe_layout). experts 0 (dense) counts as 1. */
int64_t plan_runtime_scratch(int64_t tokens, int64_t heads, int64_t qk_head_dim, int64_t experts);
/* Bytes of the cuda runtime's own host scratch, as runtime/cuda/cu_scratch.h's cu_host_scratch
 * (what ops.c's scratch_of allocates on the host) computes them, equal byte for byte
 * (tests/test_runtime_scratch.c): pageable, the MoE scratch's mirror (m = cu_moe_layout: 4 x 2E,
 * rounded up to 8 B with 4 x E more, + 8 x 2E + 4 x (E + 1)) and 64 offsets arrays of 4 x (E + 1);
 * pinned, the readback buffer, 8 x 256 + 4 x 256 + m. experts 0 (dense) counts as 1. */
int64_t plan_runtime_host_scratch(int64_t experts);
/* Bytes of the program's small host tables (templates/train/40-start.c), equal to what it
 * allocates (tests/test_runtime_scratch.c): the loader's token ids and targets (2 x 4 B x tokens),
 * Muon's exchange counts (rt_muon_counts_bytes: 72 B x fsdp, allocated with any optimizer; MPI
 * handles taken as 8 B, Open MPI's) and with ep > 1 the all-to-all's tables (rt_a2a_bytes: 4 B x
 * ep^2 x El counts, 4 B x (ep El + 1) offsets, 32 B x ep rows, 24 B x ep El regroup blocks, 16 B x
 * ep MPI counts), El the experts per EP rank. */
int64_t plan_host_tables(int64_t tokens, int64_t fsdp, int64_t ep, int64_t El);
/* Bytes of the hierarchical all-to-all's host tables (runtime/mtrt_hier.h, rt_hier_bytes; equal
 * to it, tests/test_runtime_scratch.c): per permuted row (tokens x top_k) its slot, unique row,
 * slot sent and gate (4 x 4 B); per token a mark and min(top_k, nodes) unique rows (4 B each);
 * headers and MPI counts (4 B x nodes x (g + 1) x 2, 32 B x nodes); first rows (16 B x (nodes +
 * 1), 8 B x ep, 8 B x (g + 1)); the relay's descriptors and gates (2 x 4 B x g x cap), the
 * gates staged and received (2 x 4 B x cap) and a step's messages in flight (MPI requests, taken
 * as 8 B, Open MPI's: 8 B x (cap / st + 2), st the staging rows). */
int64_t plan_hier_host_tables(int64_t ep, int64_t g, int64_t tokens, int64_t top_k, int64_t cap, int64_t st);
/* Bytes of the cuda runtime's tables of the same exchange (rt_hier_cuda_bytes; equal to it,
 * tests/test_runtime_scratch.c), returned for the device: the unique rows' tokens (4 B x tokens x
 * min(top_k, nodes)), the relay's copies by send order and by target (4 B x (5 g cap + 1)), the
 * slots and scalars sent home (2 x 4 B x tokens x top_k); *host for their host side: the relay's
 * part, a mark per unique row received (4 B x tokens x nodes), the routing weights (4 B x tokens x
 * top_k), the rows' scalars (4 B x cap), each message's first target (4 B x (g (cap / st + 1) + 1))
 * and counts (8 B x (4 max(nodes, g) + 2 (g + 1))). */
int64_t plan_hier_cuda_tables(int64_t ep, int64_t g, int64_t tokens, int64_t top_k, int64_t cap, int64_t st,
                              int64_t *host);

/* ------------------------------------------------------------------ attn_ws.c */

enum { PLAN_WS_MAX = 16 };
/* One buffer of a group of the shared workspace: the program's macro name, at element `at` of
 * the group for n elements of the activation type, alive over ops [first, last] of its phase. */
typedef struct {
  const char *name, *what;
  int64_t at, n;
  int first, last;
} PlanWsBuf;
/* A group of the shared workspace: its buffers and its size in elements (each buffer rounded up
 * to 16 elements, as the program's arena map rounds). */
typedef struct {
  PlanWsBuf b[PLAN_WS_MAX];
  int nb;
  int64_t size;
} PlanWsGroup;
/* The attention backward's group for tokens tokens per micro-batch and rank: DATT, DQ, DK, DV (DQR,
 * DKR with qk-norm; one DQKV where plan_qkv_fused), with cp > 1 and cuDNN DKV1 (a first query
 * chunk's dK, dV of one sequence), and with MLA its backward's buffers in their dead bytes (attn_ws.c
 * says how). */
PlanWsGroup plan_ws_attention(const Spec *s, const Model *md, int64_t tokens, int64_t cp);
/* Whether the program projects q, k and v with one GEMM into one buffer of rows q | k | v (the
 * layer's QKV, its gradient DQKV) that the attention and RoPE read as strided views: mha/gqa
 * without qk-norm, RoPE without rope_scaling (or learned positions), context parallelism 1 (its
 * all-gathers take whole K and V). model.c's q, k, v weights (and biases) are adjacent in every
 * layout, so their one GEMM is the concatenated nn.Linear. */
bool plan_qkv_fused(const Spec *s, int64_t cp);
/* MLA's forward group (WS_QAN, WS_KVN, WS_KRP, WS_KVB); empty (size 0) without MLA. */
PlanWsGroup plan_ws_mla_forward(const Spec *s, int64_t tokens);
/* Whether the cuda program's attention is cuDNN's fused flash attention: the head dims it serves
 * (q/k and v each a multiple of 8, at most 256: cuDNN's support matrix for bf16 on sm_80+); else
 * the program's own attention kernels. The cost model prices the one this says (cost_kernel.c). */
bool plan_attention_cudnn(const Model *md);

/* Owners of one expert matrix kind of one layer on EP rank 0; EP rank r's run of it is the same
 * with first + r × count (every field else equal: each EP rank's experts group has the same
 * layout, and the LPT places a moving run for all EP ranks at once). Whole-expert shards
 * (per > 0): expert first + k (k < count) is orthogonalized where it is held, by FSDP rank
 * r + ep × (k / per). Flat (per 0): expert k is held by the ranks its elements fall on; when it
 * lies in one rank's shard it is orthogonalized there, otherwise (moving) by the rank of its
 * shard group (owner + k) mod efsdp, i.e. FSDP rank r + ep × that (owner: placed by LPT, as
 * dense). tests/test_placement.c checks the shift against every EP rank's per-expert loop. */
typedef struct {
  int layer;
  const char *matrix; /* "moe.experts.gate_proj.weight" */
  int64_t first, count, per; /* EP rank 0's: first 0, count = experts per EP rank */
  int64_t owner;      /* flat: the shard-group rank that owns expert 0 when it moves (0 when whole) */
  int64_t moving;     /* flat: how many of the count matrices are split over ranks (0 when whole) */
} ExpertRun;

/* The owner (FSDP rank) of one dense matrix. */
typedef struct {
  int layer;          /* -1 outside the layers */
  const char *matrix;
  int64_t owner;
} DenseOwner;

/* Experts per EP rank, and (for Muon) the owner of every matrix with the resulting balance. */
typedef struct {
  int64_t ep, experts_per_rank;
  bool muon, too_large;
  ExpertRun *runs;            /* EP rank 0's, one per layer and expert matrix kind */
  int nruns;
  DenseOwner *dense;
  int ndense;
  int64_t matrices;
  double ns_flops_total, ns_flops_max_rank; /* Newton-Schulz FLOPs: all, and the busiest rank */
  /* what moves per step: the dense matrices and the expert matrices split over ranks of a flat
   * expert group (plan_expert_per 0); their pieces go to their owner in one all-to-all a step for
   * all the dense groups (one per flat expert group) and come back in another (fp32).
   * Whole-expert shards move nothing. */
  int64_t dense_params;       /* elements of the dense Muon matrices */
  int64_t moving_matrices;    /* matrices split over ranks: dense (all when fsdp > 1) + experts' */
  int64_t moving_expert_matrices; /* of them, expert matrices (all EP ranks') */
  int64_t moving_expert_params;   /* their elements, of one EP rank */
  double moving_bytes_rank;   /* bytes one rank sends, gather and return: 2 × 4 × (dense (F−1)/F²
                                 + moving experts of its EP rank (X−1)/X², X = efsdp) */
} Placement;

/* The placement of choice ch (scratch and result in m): O(expert tensors × shards + ranks),
 * never O(experts × EP ranks), since only EP rank 0's runs are listed (ExpertRun: the rule for
 * the others). */
Placement *plan_placement(Mem *m, const Model *md, const Choice *ch);

/* ------------------------------------------------------------------ muon_work.c */

/* Muon's scratch on one rank, in fp32 values, 0 without Muon. elems: the program's MUON_WORK (in
 * the activation arena: the most of the two steps' needs). step: what the step on the host
 * (runtime/optim/muon.c rt_muon_groups) uses of it, the pieces sent and received, an assembled
 * matrix, its update and Newton-Schulz scratch (the host's MUON_WORK when the plan puts the step
 * there: MUON_STEP_ELEMS). exchange: the host scratch of the cuda step on the GPU
 * (runtime/cuda/muon_cuda.c rt_cu_muon_groups: a call's moving groups' Nesterov gradients, one
 * shard each, then the most one rank sends and receives; MUON_HOST_ELEMS, pinned). */
typedef struct {
  int64_t elems, step, exchange;
} PlanMuonWork;

/* MUON_WORK of choice ch with the owners of placement pl (NULL or too_large: every owner 0):
 * over the parameter groups laid out as emit_layout.c lays them, the most of: the dense groups
 * together (the program exchanges them in one rt_muon_groups call a step) and each expert group
 * alone, Σ S + (the most one rank owns of the matrices that move) + 4 n + 2 r² of the largest
 * matrix (runtime/optim/muon.c's rt_muon_groups_work); each group's S + the cuda backend's
 * largest Newton-Schulz batch b (2 n + 2 r² + 1) (runtime/cuda/muon_cuda.c); S a group's
 * shard, n = rows × cols, r the short side. Scratch in m. The emitter sizes MUON_WORK with it
 * and the plan's workspace.newton_schulz is 4 B × elems, so that plan and program agree. */
PlanMuonWork plan_muon_work(Mem *m, const Model *md, const Choice *ch, const Placement *pl);
/* What the search needs of ch's own placement (plan_placement), computed once per (model,
 * fsdp, ep) in a small memo for the memory items (plan.c) and the cost model (cost.c): work,
 * plan_muon_work's figures; listed, whether the placement lists every owner (Muon, not
 * too_large), and then its ns_flops_max_rank and moving_expert_params. Zero without Muon. */
typedef struct {
  PlanMuonWork work;
  bool listed;
  double ns_flops_max_rank, moving_expert_params;
} PlanMuonSummary;
PlanMuonSummary plan_muon_summary(const Model *md, const Choice *ch);

/* ---- state_layout.c: the optimizer tier's state block, as the program's state arena ---- */
/* Elements of the state arena's parts for choice ch, summed over the parameter groups laid out
 * as emit_layout.c lays them, each part rounded up to 16 values (64 B) per group: shards, one
 * group's shard S (its master, its gradient and its first moment: AdamW's, or Muon's momentum,
 * each S values); second, AdamW's second moment: per group the most values of AdamW tensors
 * (under Muon, the tensors Muon does not optimize; under AdamW, all) that one rank's shard
 * holds, compacted (runtime's rt_adamw_shard). plan.c's state items are 4 B times these. */
typedef struct {
  int64_t shards, second;
} PlanState;
PlanState plan_state(const Model *md, const Choice *ch);
/* The most values of the n ranges [r[2i], r[2i+1]) (element offsets in a group, disjoint) that
 * one of ranks shards of shard values each holds (rank k: [k shard, (k + 1) shard)). O(n log n),
 * not O(ranks): plan_state asks for every group of every layout the search tries, at up to
 * 65,536 ranks. Scratch in m. */
int64_t plan_shard_values_max(Mem *m, const int64_t *r, int n, int64_t shard, int64_t ranks);

/* The search's result: the fastest candidate that fits, or the one closest to fitting. */
typedef struct {
  const Model *md;
  int64_t world;
  bool feasible;
  Candidate best;
  Candidate *alts;   /* other candidates, best first: fitting by step time, then rejected */
  int nalts;
  int ncandidates;
  double search_seconds;
  int npacked;           /* candidates whose memory the search packed (the others were priced and could not matter) */
  Candidate in_node; /* the fastest fitting plan with ep <= gpus_per_node (its EP group in a node) */
  Candidate across;  /* the fastest fitting plan with ep > gpus_per_node (EP groups span nodes) */
  bool has_in_node, has_across;
  Candidate *by_cp;  /* per context-parallel degree tried, ascending: the fastest fitting, else the
                        closest to fitting (mtc explain sets them side by side) */
  int nby_cp;
  const char *advice;/* when infeasible: what would make it fit, computed */
  const char *hint;  /* when feasible but communication-bound: a faster setting, computed */
  const char *batch_note; /* when feasible with a batch the GPUs read only by splitting sequences:
                             the nearest batch sizes that run far faster, computed */
  Placement *placement;
} Plan;

/* The checkpoint policies, one definition that the planner, the cost model and the emitter read
 * (plan.c): none keeps everything; selective keeps the layer's input and the attention core
 * (q, k, v, its output and log-sum-exp) and re-runs the rest of the layer in the backward (norms,
 * output projection, MLP or router and experts), never the attention; full keeps the layer's
 * input only and re-runs the whole layer. plan_keeps: whether saves of class cls stay from the
 * forward to the backward; plan_recomputes: whether the backward's recomputation runs op k. */
bool plan_keeps(CheckpointPolicy ac, SaveClass cls);
bool plan_recomputes(CheckpointPolicy ac, OpKind k);
/* The busiest EP rank's received rows over the mean, as memory and cost are sized by it: the
 * spec's plan.moe_imbalance capped at its physical maximum ep · min(top_k, experts / ep) / top_k
 * (every token of all ep ranks sends min(top_k, experts / ep) copies to one rank; the mean is
 * top_k copies per token), and 1 when ep is 1 or the model has no experts (plan.c). */
double plan_moe_imbalance(const Spec *s, int64_t ep);
/* Whether choice ch's MoE all-to-all is the hierarchical one (its dispatch, over an EP group that
 * spans whole nodes). */
bool plan_hier(const Spec *s, const Choice *ch);
/* The hierarchical exchange's staging, rows of hidden values per rank (the program's MOE_HIER_*,
 * runtime/mtrt_hier.h): us, the origin's unique rows (tokens x min(top_k, nodes)); ur, the relay's
 * (tokens x nodes); st, the relay's staging of copies (a message's most: ceil(cap / g)). */
typedef struct {
  int64_t g, nodes, us, ur, st;
} PlanHierRows;
PlanHierRows plan_hier_rows(const Spec *s, int64_t ep, int64_t tokens, int64_t cap);
/* That maximum alone: ep · min(top_k, experts / ep) / top_k (1 for ep 1 or a dense model). */
double plan_moe_imbalance_max(const Spec *s, int64_t ep);
/* Builds the memory items of choice ch and packs them (plan.c). */
void plan_memory(Mem *m, const Model *md, Candidate *c);
/* plan_memory's first half: c's items, not packed (plan.c). */
void plan_items(Mem *m, const Model *md, Candidate *c);
/* A lower bound of the overage plan_pack finds for c's items, or for any superset of them with
 * the same or larger bytes (> 0: c cannot fit, and its over_bytes is at least this). Per tier:
 * pack() puts the state block at 0 (alive all step) and the layers' stacked activations right
 * above it; an item of 256 B or more alive together with them lies above both, items alive at the
 * same phase do not overlap, and the items outside the program's arena go on top: so the arena
 * holds at least state + max(block + the most such bytes alive at one phase of the block's life,
 * the most alive at another phase) + outside (plan.c). m: scratch. */
int64_t plan_over_bound(Mem *m, const Model *md, const Candidate *c);
/* Packs c's items (as built, their bytes maybe changed since) into each tier's arena: offsets,
 * arena sizes, live peaks and whether it fits (plan.c). */
void plan_pack(Mem *m, const Model *md, Candidate *c);
/* Seconds per step to move the gradient shard (shard parameters) to host memory over A
 * micro-batches, when on_host; c2c and host_bw in bytes/s, efficiencies applied (cost.c). */
double cost_host_grad(double shard, double A, bool on_host, double c2c, double host_bw);
/* Newton-Schulz FLOPs of the busiest owner rank, as plan.json's placement reports it
 * (plan_placement): the optimizer step waits for it. For groups too large to list, the mean or
 * the largest matrix, whichever is more (cost.c). moving_experts (may be NULL): elements of one
 * EP rank's expert matrices split over ranks (Placement.moving_expert_params). */
double cost_ns_flops_busiest(const Model *md, const Choice *ch, double *moving_experts);
/* Predicts the step time of candidate c (cost.c). */
void cost_step(const Model *md, Candidate *c);
/* The same, also appending the predicted step's events to trace (a json_t array of Chrome
 * trace events; times in µs): one micro-batch in detail (a track per stream, each collective
 * with its layer, a layer's compute as slices by category: attention, experts or mlp,
 * recompute, other; each offloaded boundary out after its layer's forward and back before its
 * backward), the others as one event per track, then all-reduce and optimizer. The compute
 * track sums to Cost.compute. */
void cost_step_trace(const Model *md, Candidate *c, void *trace);
/* The trace's tracks (Chrome trace tids), one per stream, and their names. */
enum { TR_COMPUTE, TR_COMM, TR_A2A, TR_D2H, TR_H2D, TR_OPT, TR_CP, TR__COUNT };
extern const char *const cost_track_names[TR__COUNT];

/* One layer's predicted times for one micro-batch, seconds (cost.c). */
typedef struct {
  double fwd, bwd, recompute; /* kernels on the compute stream */
  double a2a_fwd, a2a_bwd;    /* MoE all-to-all, on the compute stream */
  double ag, rs;              /* FSDP all-gather and reduce-scatter, on the comm stream */
  double ag_experts;          /* the routed experts' part of ag */
  double kv_ag, kv_rs;        /* cp > 1: the K/V all-gather and the dK/dV reduce-scatter over the cp
                                 group (forward gathers once, backward again) */
  double kv_fwd, kv_bwd;      /* their exposed parts, on the compute stream */
  double attn_fwd, attn_bwd;  /* the attention block's part of fwd and bwd (q/k/v through the output
                                 projection) */
  double ffn_fwd, ffn_bwd;    /* the MLP's or the MoE's (router, experts, shared experts) part */
} LayerTime;
void cost_layer(const Model *md, const Choice *ch, int layer, LayerTime *t);
/* The two-stream simulation of a step's passes for one reshard pair and prefetch depth
 * (CostMemo.passes), seconds: the first micro-batch's forward and forward + backward, a later
 * micro-batch's passes, the kept groups' once-per-step gathers, and all FSDP collective time of
 * one micro-batch's layers. */
typedef struct {
  bool keep_d, keep_e;
  int depth;
  double pass_f, pass, pass_rest, ag_once, comm_total;
} CostPasses;
enum { COST_PASSES = 8 };
/* What pricing may reuse between the candidates of one search over one md: which layers are
 * priced alike, and for the last key (micro_batch, cp, fsdp, ep, checkpoint policy, dispatch;
 * what the layer times depend on) the layer times, edge ops (embedding, head, loss), the passes'
 * per-layer inputs with their sums, the offload's exposed time per offload policy and the passes
 * simulated so far. Every figure is computed as cost_step computes it, in the same order: the
 * same doubles. Zero-initialized; cost_memo_free releases it. */
typedef struct {
  Mem mem, scratch;
  int *rep;          /* (nlayers) the first layer priced like each; NULL until first use */
  LayerTime *times;  /* (nlayers) of key's choices; times[l] valid where rep[l] == l */
  double *lanes;     /* (COST_LANES x nlayers) the passes' inputs in execution order (cost.c) */
  double edge;       /* seconds of the edge ops' forward + backward at key's micro_batch */
  double compute, recompute, a2a, kvx, comm_total; /* one micro-batch's layers, summed in layer order */
  double offload[4]; /* (OffloadPolicy) exposed offload seconds of one micro-batch, once known */
  bool has_offload[4];
  CostPasses passes[COST_PASSES];
  int npasses;
  bool bound;        /* Newton-Schulz and the experts' moving pieces priced at 0 (no Muon placement): a
                        lower bound of the step */
  bool valid;
  Choice key;
} CostMemo;
/* cost_step with memo (may be NULL): the same figures, computed once per layer kind and key. */
void cost_step_memo(const Model *md, Candidate *c, CostMemo *memo);
void cost_memo_free(CostMemo *memo);

/* The kernels of op o for one micro-batch of T tokens in sequences of seq, on one GPU of the
 * spec's cluster, as its stack runs them (cost_kernel.c): forward and backward seconds. ep
 * and imbalance place the routed experts' rows (the busiest EP rank's). */
typedef struct { double fwd, bwd; } OpTime;
OpTime cost_op(const Spec *s, const Model *md, const Op *o, double T, double seq, int64_t ep, double imbalance);
/* Seconds of one GEMM (M × K) · (K × N), `groups` of them in one call, with efficiency eff of
 * bf16_flops: tile and wave quantization, bounded below by its bytes at HBM speed and by
 * kernel_launch (cost_kernel.c). */
double cost_gemm(const Spec *s, double M, double N, double K, double groups, double eff);
/* The generated program's routed-expert GEMMs (runtime/cuda/ops_moe.c): `local` experts of rows × N
 * × K each, as a loop of one cuBLAS GEMM per expert over 4 streams (loop: expert_gemm_loop, each
 * GEMM at least kernel_launch) or as one cublasGemmGroupedBatchedEx (grouped_gemm_cublas); seconds. */
double cost_expert_gemm(const Spec *s, double rows, double N, double K, double local, bool loop);
/* The least mean rows per expert (a multiple of 8, at most 65,536) at which cost_expert_gemm prices the
 * loop no slower than the grouped call, for the forward up projection of the E / ep local experts of
 * the spec's model (hidden × expert_intermediate); 0 when it never is (or no MoE). The program runs
 * the loop for a pass whose experts with rows average at least this many (step.h EXPERT_LOOP_ROWS). */
int64_t cost_expert_loop_rows(const Spec *s, int64_t ep);
/* The mean rows each of a MoE layer's experts gets per micro-batch of T tokens (per GPU) with ep ranks:
 * T × top_k × ep / experts (0: no MoE). */
double cost_expert_rows(const Spec *s, double T, int64_t ep);
/* Enumerates every layout × policy × micro-batch size allowed by the spec's pins that the
 * generated program implements, keeps the fastest that fits: the one plan that plan, explain,
 * sweep, diff and compile show. The plan's md is a copy whose spec carries the chosen
 * micro_batch. */
Plan *plan_search(Mem *m, const Model *md);
/* plan_search without the searches behind Plan.advice and Plan.hint (both NULL): for callers that
 * print neither (mtc sweep). */
Plan *plan_search_bare(Mem *m, const Model *md);
/* Whether `mtc compile` emits the MoE all-to-all d on both backends (search.c): only those are
 * searched, and a spec that pins another is refused (check.c). */
bool plan_dispatch_emitted(DispatchPolicy d);
/* ---- plan_exact.c: the chosen plan's items at the program's own bytes ---- */
/* Makes the items of p's chosen candidate (plan_search calls it on its result) that the
 * generated program holds in its arenas exactly the program's bytes (the emitter's layout of
 * it, em_init; MemItem.exact) and packs the tiers again (plan_pack); nothing when the program
 * does not implement the spec's model. Items the program does not hold keep their formulas. */
void plan_exact(Mem *m, Plan *p);
/* The name of a reshard policy: "auto", "every_micro_batch", "after_step". */
const char *plan_reshard_name(ReshardPolicy r);
/* Seconds of one MoE all-to-all (dispatch or combine) in which each rank sends `bytes` spread
 * evenly over the ep ranks of its EP group (ep consecutive ranks): the share for peers in the
 * node goes over NVLink, the share for other nodes over the GPU's InfiniBand share, both at
 * once (cost.c). */
double cost_all_to_all(const Spec *s, double bytes, int64_t ep);
/* The same exchange dispatched hierarchically (DispatchPolicy): over InfiniBand one copy per
 * token and destination node, then NVLink inside the node; `bytes` holds top_k copies of each
 * token. Equals cost_all_to_all inside a node. */
double cost_all_to_all_hier(const Spec *s, double bytes, int64_t ep, int64_t top_k);
/* The other nodes a token's top_k expert copies reach, on average, in an EP group of ep ranks
 * over ep / gpus_per_node whole nodes (0 inside one node). Routing uniform over the ranks: a node
 * holds none of the k with probability (1 − 1/N)^k, so (N − 1)(1 − (1 − 1/N)^k). With group-
 * limited routing (model.moe.n_group, topk_group: DeepSeek-V3's node-limited routing, at most
 * M nodes per token, arXiv:2412.19437 §2.1.2) and the groups aligned with the nodes (n_group a
 * multiple or a divisor of the node count; experts laid out in order) only the chosen groups'
 * nodes can be reached: the smaller of the two. */
double cost_remote_nodes(const Spec *s, int64_t ep, int64_t top_k);
/* "auto", "flat", "hierarchical". */
const char *plan_dispatch_name(DispatchPolicy d);
const char *plan_tier_name(Tier t);
const char *plan_cat_name(ItemCategory c);
const char *plan_ac_name(CheckpointPolicy p);
/* The policy before the word "checkpointing" in prose: "no", "selective", "full". */
const char *plan_ac_words(CheckpointPolicy p);
const char *plan_offload_name(OffloadPolicy p); /* "none", "host", "nvme" */

/* ------------------------------------------------------------------ sweep.c */

/* `mtc sweep`: for every combination of the overs ("KEY=V1,V2,..."), applied after sets,
 * the best plan as one row of a table (or CSV). Returns the exit status (2 on bad input). */
int sweep_run(const char *path, const char *const *sets, int nsets, const char *const *overs,
              int nover, bool csv);

/* ------------------------------------------------------------------ emit_svg.c */

/* Writes memory.svg for plan p: per tier, the items alive at the fullest phase as a stacked
 * bar by category against capacity (segments carry data-bytes), and memory over the step. */
bool emit_memory_svg(Diag *d, const Plan *p, const char *path);

/* Writes n bytes of s to f with <, >, & and " escaped for XML and HTML. */
void emit_escape(FILE *f, const char *s, size_t n);
/* The tiers a memory picture shows and the bytes at the top of each tier's axes. */
typedef struct {
  int64_t top[TIER__COUNT];
  bool shown[TIER__COUNT];
} MemScale;
/* p's own: the tiers with live bytes, each up to the larger of its capacity and live peak. */
MemScale emit_memory_scale(const Plan *p);
/* The same picture written to f (report.html inlines it), on scale (NULL: p's own, and the SVG's
 * id is "memory"; `mtc diff --html` draws two plans on one). */
void emit_memory_svg_to(FILE *f, const Plan *p, const MemScale *scale);
/* An axis step: the smallest 1, 2 or 5 x 10^k (k >= -9) with at most `most` steps over span. */
double emit_axis_step(double span, double most);
/* Layers between two layer marks on an axis of L layers (1, 2, 5, 10, 20, ...: at most 8 steps). */
int emit_layer_stride(int L);
/* Writes report.html: a self-contained page with the headline, the predicted step as a
 * timeline, the memory picture, the layout drawn and the plan text. */
bool emit_report_html(Diag *d, const Plan *p, const char *path);
/* report.html's pieces, shared with `mtc diff --html`: its CSS; the headline and time table;
 * the pixels per second of the layer-by-layer view of a first micro-batch of span seconds. */
extern const char *emit_html_style;
void emit_html_headline(FILE *f, const Plan *p);
double emit_html_layer_scale(const Plan *p, double span, double width);
/* The predicted step's Chrome trace events of p (a new json_t array; empty when infeasible). */
struct json_t *emit_step_events(const Plan *p);
/* Seconds the events span: all of them, or (first_micro) the first micro-batch's layers. */
double emit_step_span(struct json_t *events, bool first_micro);
/* Writes the events as an SVG timeline with id, one lane per stream, span seconds at px_per_s;
 * first_micro: only the first micro-batch's layers (emit_steps_svg.c). */
void emit_steps_svg_to(FILE *f, const Plan *p, struct json_t *events, const char *id, bool first_micro,
                       double span, double px_per_s);
/* Writes the layout as SVG with id: nodes, GPUs, EP, FSDP and CP groups (emit_ranks_svg.c). */
void emit_ranks_svg_to(FILE *f, const Plan *p, const char *id);
/* Writes timeline.json: the predicted step of p as a Chrome trace (see cost_step_trace). */
bool emit_timeline(Diag *d, const Plan *p, const char *path);

/* ------------------------------------------------------------------ diff.c */

/* `mtc diff A B`: A and B are plan.json files or specs (sets apply to B); prints the rows that
 * differ (all rows with all); html (non-NULL, A and B specs): also writes that page with the two
 * plans side by side. Returns the exit status. */
int diff_run(const char *a, const char *b, const char *const *sets, int nsets, bool all, const char *html);

/* ------------------------------------------------------------------ calibrate.c */

/* `mtc calibrate`: fits preset's efficiency factors to the profiles (`train --profile`) and
 * writes the calibrated preset to out. Returns the exit status. */
int calibrate_run(const char *const *profiles, int nprofiles, const char *preset, const char *out);

/* ------------------------------------------------------------------ import_hf.c */

/* A spec (YAML text, arena-owned) from a Hugging Face config.json of a llama, mixtral,
 * qwen2_moe, qwen3_moe or deepseek_v3 model; NULL with a diagnostic naming the field that is
 * missing, malformed or unsupported. */
char *import_hf(Mem *m, Diag *d, const char *path);

/* ------------------------------------------------------------------ output.c */

/* A file mtc writes (every compile output, import-hf -o): written to PATH.tmp and renamed over
 * PATH by out_close, so a failure (a full disk) leaves PATH as it was. Only a regular file or a
 * missing path is replaced (rt_replace_begin in runtime/mtrt_ckpt.h): never a device or FIFO. */
typedef struct {
  FILE *f;
  const char *path;
  char *tmp; /* PATH.tmp, allocated; freed by out_close */
} OutFile;
/* Starts writing path: the stream (o->f), or NULL after a diagnostic naming the path. */
FILE *out_open(Diag *d, OutFile *o, const char *path);
/* Checks, flushes, syncs and closes o, then renames it into place; false after a diagnostic
 * (the temporary file removed, the old file unchanged). */
bool out_close(Diag *d, OutFile *o);
/* A batch of outputs (one compile): between out_batch_begin and out_batch_end, out_close
 * leaves each complete PATH.tmp in place; out_batch_end(commit) renames them all over their
 * paths (true when all were), or (commit false) removes them, leaving every old file as it
 * was. out_batch_failed: whether an out_open or out_close of the batch failed (a full disk, a
 * path that may not be replaced). */
void out_batch_begin(void);
bool out_batch_failed(void);
bool out_batch_end(Diag *d, bool commit);
/* Accepts dir for compile output when it is missing, empty, or holds a plan.json of mtc's (an
 * earlier compile); any other non-empty directory is refused (false, a diagnostic naming a
 * file in it) unless force. */
bool out_dir_prepare(Diag *d, const char *dir, bool force);
/* The directory build tree bdir's CMakeCache.txt was made for (its CMAKE_CACHEFILE_DIR): true
 * with it in out (n bytes), false when there is no readable cache. */
char *out_build_tree_of(const char *bdir);
/* Writes dir/program.sum (in the current batch): the FNV-1a hash of each program file's
 * dir/NAME.tmp, written by this compile. False after a diagnostic. */
bool out_write_program_sum(Diag *d, const char *dir);
/* Whether every file dir/program.sum lists still has the hash compile wrote; false with err
 * naming the first changed (or missing) file and what to do. */
bool out_program_unedited(const char *dir, char *err, size_t n);
/* The files of a generated program (NULL-terminated): step.h, step.c, train.c, ..., program.sum last */
extern const char *const out_program_files[];
/* Removes the program files (regular files only) an earlier compile left in dir, and the
 * programs mtc build made of them (dir/build.../train), for a compile that writes no program;
 * returns how many it removed. */
int out_remove_program(const char *dir);
/* Removes the programs mtc build made in dir (dir/build.../train, each in a build tree configured
 * for that directory), for a compile that writes another program there; returns how many. */
int out_remove_built(const char *dir);
/* The FNV-1a 64-bit hash of a file's bytes as 16 hex digits (plan.json's identity in step.h);
 * false when it cannot be read. */
bool out_hash_file(const char *path, char buf[17]);
/* The integer of `#define NAME 123` in the header at path: false when absent. */
bool out_define_int(const char *path, const char *name, long long *v);
/* Whether DIR/step.h's PLAN_HASH is the hash of DIR/plan.json (the program is that plan's);
 * false with the reason in err (both model names and hashes, and what to run). */
bool out_program_matches(const char *dir, char *err, size_t n);
/* s as the inside of a C string literal: quotes, backslashes, control bytes and "?" escaped. */
char *out_c_string(Mem *m, const char *s);
/* s as text inside one comment line of C, CUDA, CMake or shell: control bytes (a newline),
 * backslashes and "??" as \ooo escapes, and a "*" before "/" as "*\", so it can neither end the
 * line nor the comment. */
char *out_comment(Mem *m, const char *s);
/* User text (a file name) for a terminal, plan.txt or a JSON string: control bytes as \ooo and
 * '\' as \\, so no escape sequence or line break gets through; with ascii, bytes >= 0x80 too
 * (for text that is not valid UTF-8). Into dst (n bytes, cut when longer). */
void out_text(char *dst, size_t n, const char *s, bool ascii);
/* dir as printed (out_text), allocated in m: the whole name, never cut. */
char *out_shown(Mem *m, const char *dir);
/* Whether CMake can take directory dir (as given, and its absolute path) as one path: no ';'
 * (CMake's list separator: "a;b" would be two paths, and build files would land in a), no '\\' or
 * '"' and no control byte. False with a diagnostic naming dir, the character and what to do; what
 * says where dir came from ("-o DIR" for compile, "DIR" for build). Nothing is written. */
bool out_cmake_path_ok(Diag *d, const char *what, const char *dir);

/* ------------------------------------------------------------------ emit_step.c / emit_prog.c */

/* Writes DIR/step.h and DIR/step.c: the plan's step code (see emit.h). Refuses, with an error
 * at the spec key, model features the generated program does not implement yet. spec_base (the
 * spec's file name) is escaped where it appears; plan_hash (out_hash_file of plan.json) becomes
 * step.h's PLAN_HASH, which mtc build checks against DIR/plan.json. */
bool emit_step(Mem *m, Diag *d, const Plan *p, const char *dir, const char *spec_base, const char *plan_hash);
/* What the generated program does not implement with context parallelism (cp > 1) for spec s, as a
 * phrase; NULL when it does (compile's search tries cp > 1 only then). */
const char *em_cp_unsupported(const Spec *s);
/* Writes DIR/train.c (templates/train/NN-*.c, embedded in mtc), DIR/kernels.cu (the plan's shapes
 * as #defines, then templates/kernels.cu), DIR/CMakeLists.txt and DIR/launch.sbatch. */
bool emit_program(Mem *m, Diag *d, const Plan *p, const char *dir, const char *spec_base);
/* What compile says about launch.sbatch (its --time capped below the run's need), or NULL. */
const char *emit_program_note(Mem *m, const Plan *p);
/* `mtc build DIR`: checks that DIR's program is the one of DIR/plan.json (step.h's PLAN_HASH)
 * and, unless allow_edits, that no program file changed since compile wrote it (program.sum),
 * then configures and builds DIR/build (DIR/build-double for real "double") against the
 * runtime in $MTC_ROOT or this mtc's source tree. Returns the exit status. */
int build_run(const char *dir, const char *backend, const char *real, bool allow_edits);

/* `mtc export CKPT OUT`: the master weights of checkpoint CKPT (a step directory, or the
 * directory holding them: the newest complete one) as a safetensors file OUT with the program's
 * tensor names (export.c). With spec (the spec the program was compiled from, with its --set
 * overrides), OUT is a directory: OUT/model.safetensors in the Hugging Face family's names and
 * OUT/config.json, both or neither (a model no family expresses, or a checkpoint whose tensors
 * are not the spec's, writes nothing). Returns the exit status. */
int export_run(const char *ckpt, const char *out, const char *spec, const char *const *sets, int nsets);

/* ------------------------------------------------------------------ export_hf.c */

/* The program's name for parameter p of model.c (layer < 0: outside the layers), as step.c's
 * tensor table and the checkpoint manifest spell it: "attn.q_proj.weight" of layer 2 ->
 * "model.layers.2.self_attn.q_proj.weight"; routed experts keep one "%d" for the expert. */
const char *export_raw_name(Mem *m, int layer, const char *p);
/* The transformers model_type that expresses s's model exactly (every tensor and every
 * convention): llama, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3 or gpt2; NULL
 * with a diagnostic at the spec key that no family can say (and why) otherwise. */
const char *export_family(Diag *d, const Spec *s);
/* family's config.json for s (transformers' configuration_<family>.py field names); dtype is
 * torch_dtype ("float32"). A new jansson object (json_t *, as void * like report_json). */
void *export_config(const Spec *s, const char *family, const char *dtype);

/* One source tensor of an exported tensor: the program's name (routed: its "%d" pattern) and
 * expert (-1: not routed), shape rows x cols (cols 0: a vector). */
typedef struct {
  const char *raw;
  int expert;
  int64_t rows, cols;
} ExportPart;
/* One tensor of model.safetensors: name in the family's naming, shape rows x cols (cols 0: a
 * vector), made of 1 to 3 parts: concatenated along the rows (vectors and row blocks), or with
 * transposed (GPT-2's Conv1D, weights stored [in, out]) each part transposed and the parts
 * concatenated along the columns (c_attn = [q | k | v]). */
typedef struct {
  const char *name;
  int64_t rows, cols;
  bool transposed;
  int nparts;
  ExportPart parts[3];
  /* DeepSeek's interleaved RoPE rows (HF rope_interleave, deepseek_v3): rope_dim > 0 permutes the
   * rows of every block of rope_block rows: the family's row rope_off + 2j is the program's
   * rope_off + j, its row rope_off + 2j + 1 the program's rope_off + rope_dim / 2 + j (j <
   * rope_dim / 2): the pairs transformers' apply_rotary_pos_emb_interleave de-interleaves into
   * mtc's half-split RoPE (rt_rope_strided_forward). One part, not transposed. */
  int64_t rope_block, rope_off, rope_dim;
} ExportTensor;
/* Every tensor family's model class loads for model md, in the model's order; *count of them. */
ExportTensor *export_tensors(Mem *m, const Model *md, const char *family, int *count);

extern const char template_train_c[], template_kernels_cu[];
extern const size_t template_train_c_len, template_kernels_cu_len;

/* ------------------------------------------------------------------ report.c */

/* `mtc plan` text: the model accounting. */
void report_text(FILE *out, const Model *md);
/* plan.json as a jansson object (json_t *), returned as void * to keep jansson out of
 * this header; the caller json_decref's it. */
void *report_json(const Model *md);
/* The plan's sections of `mtc plan` text; timing adds the search's wall time (not written
 * to files, which must be deterministic). */
void report_plan_text(FILE *out, const Plan *p, bool timing);
/* When nothing fits: "NO FEASIBLE PLAN", the closest candidate and the advice, for the top of
 * `mtc plan` text and plan.txt (nothing when a plan fits). */
void report_plan_headline(FILE *out, const Plan *p);
/* The widest line of report text (plan.txt, mtc plan/explain/sweep): longer lines are wrapped. */
enum { REPORT_WIDTH = 120 };
/* Writes text (lines ending in '\n') to out with every line over REPORT_WIDTH broken at spaces,
 * continuation lines indented under the line's label or text. */
void report_wrap(FILE *out, const char *text);
/* "hbm over by 3.2 GiB (92.6 of 89.4 GiB), host over by ..." for a candidate that does not fit:
 * every tier its packed peak overflows, in m. */
const char *report_overs(Mem *m, const Candidate *c);
/* Where the predictions of spec s come from (cluster.evidence): brief, one line ("rates: 5 measured,
 * 1 fitted, 11 assumed; ..."), else the lines of plan.txt's section. In m. */
const char *report_provenance(Mem *m, const Spec *s, bool brief);
/* How many times its predicted time launch.sbatch allows a run of spec s, by cluster.evidence: the
 * largest of 1.2, band_high and, for cluster.stack mtc, 1 / program_ratio; *why (unless why is
 * NULL) says which, in words. */
double report_time_factor(const Spec *s, const char **why);
/* One line: the chosen layout, HBM peak and predicted step (mtc compile prints it). */
void report_summary(FILE *out, const Plan *p);
/* `mtc explain`: the chosen plan in one line, then the alternatives with why each lost. */
void report_explain(FILE *out, const Plan *p);
/* Adds feasible, layout, checkpoint, memory, predicted and search keys to root (a json_t *). */
void report_plan_json(void *root, const Plan *p, bool timing);
/* Writes obj to path (or stdout if path is NULL: a failed write there is reported once, by main's
 * check of stdout at exit), indented, keys in insertion order. */
bool report_write_json(Diag *d, void *obj, const char *path);

#endif
