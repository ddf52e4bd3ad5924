/* spec.c — the spec schema: one table per section naming every key, its type, its default
 * and its range; the tree from yaml.c is converted to the typed structs of mtc.h by it.
 * spec_print_keys renders the same tables as docs/spec.md's spec reference. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

/* A key's type. F_SIZE (bytes), F_RATE (bytes/s) and F_FLOPS are the keys that carry a unit:
 * their values must be written with it (units_parse refuses a bare number); F_COUNT is a count
 * that may be plain (4096) or carry a k/M/Ki/Mi multiplier; every other number is plain. */
typedef enum { F_INT, F_AUTO, F_REAL, F_BOOL, F_STR, F_ENUM, F_SIZE, F_RATE, F_FLOPS, F_COUNT, F_SECTION } FType;

typedef struct Section Section;

/* One key. def: NULL = required; text = the default, parsed like a value in a spec;
 * "(...)" = optional, left 0 here and derived or checked in check.c (shown as written). */
typedef struct {
  const char *key;
  FType type;
  size_t off;
  const char *def;
  int64_t min, max;          /* F_INT, F_AUTO */
  const char *const *names;  /* F_ENUM, in the order of its C enum */
  const Section *sub;        /* F_SECTION */
  const char *doc;
  double lo, hi;             /* F_REAL: the range, each end excluded where open (hi INFINITY: none) */
  bool lo_open, hi_open;
} Field;

struct Section {
  const char *path; /* "model.attention"; "" for the top level */
  const Field *fields;
};

#define MAXDIM ((int64_t)1 << 30) /* any one dimension; products are checked in model.c */
#define MAXLAYERS 4096 /* deepest published models have ~130 layers */

static const char *const norm_names[] = {"rmsnorm", "layernorm", NULL};
static const char *const pos_names[] = {"rope", "learned", NULL};
static const char *const attn_names[] = {"mha", "gqa", "mla", NULL};
static const char *const qkn_names[] = {"none", "per_head", "full", NULL};
static const char *const abias_names[] = {"none", "qkv", "qkvo", NULL};
static const char *const rope_scaling_names[] = {"none", "llama3", "yarn", NULL};
static const char *const act_names[] = {"swiglu", "gelu", NULL};
static const char *const router_names[] = {"softmax", "sigmoid", NULL};
static const char *const lb_names[] = {"aux_loss", "aux_free", NULL};
static const char *const opt_names[] = {"muon", "adamw", NULL};
static const char *const wire_names[] = {"bf16", "fp32", NULL};
static const char *const ac_names[] = {"auto", "none", "selective", "full", NULL};
static const char *const off_names[] = {"auto", "none", "host", "nvme", NULL};
static const char *const opt_tier_names[] = {"auto", "hbm", "host", NULL};
static const char *const opt_step_names[] = {"auto", "gpu", "host", NULL};
static const char *const topo_names[] = {"mesh", "nvswitch", NULL};
static const char *const stack_names[] = {"mtc", "pytorch-eager", "pytorch-compile", NULL};
static const char *const reshard_names[] = {"auto", "every_micro_batch", "after_step", NULL};
static const char *const dispatch_names[] = {"auto", "flat", "hierarchical", NULL};

const char *spec_attn_name(AttnKind k) { return attn_names[k]; }
const char *spec_act_name(Activation a) { return act_names[a]; }
const char *spec_router_name(RouterKind r) { return router_names[r]; }
const char *spec_norm_name(NormKind n) { return norm_names[n]; }
const char *spec_stack_name(Stack st) { return stack_names[st]; }

#define O(T, f) offsetof(T, f)
/* F_REAL ranges: lo, hi, lo_open, hi_open */
#define ABOVE_0 0, INFINITY, true, true       /* > 0 */
#define FROM_0 0, INFINITY, false, true       /* >= 0: 0 is meaningful (turns something off) */
#define FRACTION 0, 1, true, false           /* (0, 1]: a share of a peak rate */
#define END {NULL, 0, 0, NULL, 0, 0, NULL, NULL, NULL}

static const Field attention_fields[] = {
    {"kind", F_ENUM, O(AttentionSpec, kind), "gqa", 0, 0, attn_names, NULL, "mha, gqa (grouped KV heads) or mla (multi-head latent, DeepSeek-V2/V3)"},
    {"heads", F_INT, O(AttentionSpec, heads), NULL, 1, MAXDIM, NULL, NULL, "query heads"},
    {"kv_heads", F_INT, O(AttentionSpec, kv_heads), "(heads)", 1, MAXDIM, NULL, NULL, "key/value heads (gqa: divides heads)"},
    {"head_dim", F_INT, O(AttentionSpec, head_dim), "(hidden / heads)", 1, MAXDIM, NULL, NULL, "size of one head (mha, gqa)"},
    {"rope_theta", F_REAL, O(AttentionSpec, rope_theta), "10000", 0, 0, NULL, NULL, "RoPE base frequency", ABOVE_0},
    {"qk_norm", F_ENUM, O(AttentionSpec, qk_norm), "none", 0, 0, qkn_names, NULL, "norm on q and k: none, per_head (weight of head_dim) or full (over all heads)"},
    {"bias", F_ENUM, O(AttentionSpec, bias), "none", 0, 0, abias_names, NULL, "biases on the attention projections only: none, qkv (q/k/v_proj: Qwen2, Qwen2-MoE) or qkvo (and o_proj: Llama's attention_bias); model.bias puts them everywhere"},
    {"q_lora_rank", F_INT, O(AttentionSpec, q_lora_rank), "(none)", 1, MAXDIM, NULL, NULL, "mla: rank of the query down-projection; absent = q projected from hidden"},
    {"kv_lora_rank", F_INT, O(AttentionSpec, kv_lora_rank), "(mla: required)", 1, MAXDIM, NULL, NULL, "mla: rank of the compressed KV latent"},
    {"qk_nope_head_dim", F_INT, O(AttentionSpec, qk_nope_head_dim), "(mla: required)", 1, MAXDIM, NULL, NULL, "mla: per-head q/k size without RoPE"},
    {"qk_rope_head_dim", F_INT, O(AttentionSpec, qk_rope_head_dim), "(mla: required)", 1, MAXDIM, NULL, NULL, "mla: per-head q/k size with RoPE (k part shared by heads)"},
    {"v_head_dim", F_INT, O(AttentionSpec, v_head_dim), "(mla: required)", 1, MAXDIM, NULL, NULL, "mla: per-head value size"},
    END};

static const Field mlp_fields[] = {
    {"intermediate", F_INT, O(MlpSpec, intermediate), NULL, 1, MAXDIM, NULL, NULL, "hidden size of the dense feed-forward"},
    {"activation", F_ENUM, O(MlpSpec, activation), "swiglu", 0, 0, act_names, NULL, "swiglu (gated, three matrices) or gelu (two matrices)"},
    END};

static const Field moe_fields[] = {
    {"experts", F_INT, O(MoeSpec, experts), NULL, 1, 1 << 20, NULL, NULL, "routed experts per MoE layer"},
    {"top_k", F_INT, O(MoeSpec, top_k), NULL, 1, 1 << 20, NULL, NULL, "routed experts per token"},
    {"shared_experts", F_INT, O(MoeSpec, shared_experts), "0", 0, 1 << 20, NULL, NULL, "experts every token goes through"},
    {"expert_intermediate", F_INT, O(MoeSpec, expert_intermediate), NULL, 1, MAXDIM, NULL, NULL, "hidden size of one routed expert"},
    {"shared_intermediate", F_INT, O(MoeSpec, shared_intermediate), "(expert_intermediate)", 1, MAXDIM, NULL, NULL, "hidden size of one shared expert"},
    {"activation", F_ENUM, O(MoeSpec, activation), "swiglu", 0, 0, act_names, NULL, "experts' activation: swiglu or gelu"},
    {"first_dense_layers", F_INT, O(MoeSpec, first_dense_layers), "0", 0, MAXLAYERS, NULL, NULL, "leading layers with a dense mlp"},
    {"interleave", F_INT, O(MoeSpec, interleave), "1", 1, MAXLAYERS, NULL, NULL, "every N-th layer after the dense ones is MoE; the others use mlp"},
    {"router_bias", F_BOOL, O(MoeSpec, router_bias), "false", 0, 0, NULL, NULL, "per-expert score-correction bias (DeepSeek-V3)"},
    {"router", F_ENUM, O(MoeSpec, router), "softmax", 0, 0, router_names, NULL, "softmax or sigmoid expert scores"},
    {"load_balance", F_ENUM, O(MoeSpec, load_balance), "aux_loss", 0, 0, lb_names, NULL, "aux_loss or aux_free (bias adjustment; needs router_bias)"},
    {"aux_loss_coef", F_REAL, O(MoeSpec, aux_loss_coef), "0.01", 0, 0, NULL, NULL, "weight of the load-balancing loss (aux_loss; Switch Transformer's alpha; 0: off)", 0, 1000, false, true},
    {"bias_update_rate", F_REAL, O(MoeSpec, bias_update_rate), "0.001", 0, 0, NULL, NULL, "router-bias step per optimizer step (aux_free; DeepSeek-V3's gamma)", 0, 1, false, true},
    {"seq_aux_loss_coef", F_REAL, O(MoeSpec, seq_aux_loss_coef), "0", 0, 0, NULL, NULL, "weight of the sequence-wise balance loss: alpha (1/B) sum over sequences of sum_e f_e P_e per sequence, P of softmax scores or of sigmoid scores normalized over experts (DeepSeek-V2's aux_loss_alpha with seq_aux; DeepSeek-V3's complementary loss beside aux_free: 0.0001); 0: off", 0, 1000, false, true},
    {"norm_topk_prob", F_BOOL, O(MoeSpec, norm_topk_prob), "true", 0, 0, NULL, NULL, "top-k weights renormalized to sum 1 (Mixtral, Qwen3-MoE); false: the raw softmax or sigmoid scores (Qwen2-MoE)"},
    {"shared_expert_gate", F_BOOL, O(MoeSpec, shared_expert_gate), "false", 0, 0, NULL, NULL, "the shared experts' output scaled by sigmoid(x . w), w of hidden (Qwen2-MoE's shared_expert_gate)"},
    {"n_group", F_INT, O(MoeSpec, n_group), "1", 1, 64, NULL, NULL, "group-limited routing: experts in this many equal groups (DeepSeek-V2, V3: 8)"},
    {"topk_group", F_INT, O(MoeSpec, topk_group), "(n_group)", 1, 1 << 20, NULL, NULL, "group-limited routing: the top_k experts come from this many best groups, a group scored by its two best sigmoid scores + bias (DeepSeek-V3: 4) or its best softmax probability (DeepSeek-V2: 3)"},
    {"routed_scaling_factor", F_REAL, O(MoeSpec, routed_scaling_factor), "1", 0, 0, NULL, NULL, "routed experts' weights are multiplied by this (DeepSeek-V3: 2.5)", 0, 1000, true, true},
    END};

static const Field rope_scaling_fields[] = {
    {"type", F_ENUM, O(RopeScalingSpec, type), "none", 0, 0, rope_scaling_names, NULL, "none, llama3 (Llama 3.1's per-frequency scaling) or yarn (YaRN: Qwen2.5's long context, DeepSeek-V3)"},
    {"factor", F_REAL, O(RopeScalingSpec, factor), "(llama3, yarn: required)", 0, 0, NULL, NULL, "context extension factor (Llama 3.1: 8; DeepSeek-V3: 40)", 1, 1e6, false, true},
    {"original_max_position", F_INT, O(RopeScalingSpec, original_max_position), "(llama3, yarn: required)", 1, MAXDIM, NULL, NULL, "pre-training context length (Llama 3.1: 8192)"},
    {"low_freq_factor", F_REAL, O(RopeScalingSpec, low_freq_factor), "1", 0, 0, NULL, NULL, "llama3: wavelengths above original_max_position / this are divided by factor", ABOVE_0},
    {"high_freq_factor", F_REAL, O(RopeScalingSpec, high_freq_factor), "4", 0, 0, NULL, NULL, "llama3: wavelengths below original_max_position / this are kept; between, smoothed", ABOVE_0},
    {"beta_fast", F_REAL, O(RopeScalingSpec, beta_fast), "32", 0, 0, NULL, NULL, "yarn: rotations above which frequencies are kept", ABOVE_0},
    {"beta_slow", F_REAL, O(RopeScalingSpec, beta_slow), "1", 0, 0, NULL, NULL, "yarn: rotations below which frequencies are divided by factor", ABOVE_0},
    {"mscale", F_REAL, O(RopeScalingSpec, mscale), "1", 0, 0, NULL, NULL, "yarn: attention temperature coefficient", FROM_0},
    {"mscale_all_dim", F_REAL, O(RopeScalingSpec, mscale_all_dim), "0", 0, 0, NULL, NULL, "yarn: DeepSeek's mscale_all_dim (0: none)", FROM_0},
    END};

static const Section attention_sec = {"model.attention", attention_fields};
static const Section rope_scaling_sec = {"model.rope_scaling", rope_scaling_fields};
static const Section mlp_sec = {"model.mlp", mlp_fields};
static const Section moe_sec = {"model.moe", moe_fields};

static const Field model_fields[] = {
    {"layers", F_INT, O(ModelSpec, layers), NULL, 1, MAXLAYERS, NULL, NULL, "transformer blocks"},
    {"hidden", F_INT, O(ModelSpec, hidden), NULL, 1, MAXDIM, NULL, NULL, "model (residual) width"},
    {"vocab", F_INT, O(ModelSpec, vocab), NULL, 1, MAXDIM, NULL, NULL, "vocabulary size"},
    {"tie_embeddings", F_BOOL, O(ModelSpec, tie_embeddings), "false", 0, 0, NULL, NULL, "LM head shares the input embedding"},
    {"norm", F_ENUM, O(ModelSpec, norm), "rmsnorm", 0, 0, norm_names, NULL, "rmsnorm or layernorm"},
    {"position", F_ENUM, O(ModelSpec, position), "rope", 0, 0, pos_names, NULL, "rope or learned (absolute position embedding)"},
    {"max_position", F_INT, O(ModelSpec, max_position), "(none)", 1, MAXDIM, NULL, NULL, "longest sequence; required by position: learned"},
    {"bias", F_BOOL, O(ModelSpec, bias), "false", 0, 0, NULL, NULL, "biases on every linear and norm (GPT-3 style)"},
    {"norm_eps", F_REAL, O(ModelSpec, norm_eps), "1e-5", 0, 0, NULL, NULL, "epsilon of every norm, added to the mean square (Qwen2/3-MoE, DeepSeek-V3: 1e-6)", 0, 0.1, true, true},
    {"rope_scaling", F_SECTION, O(ModelSpec, rope_scaling), "(none)", 0, 0, NULL, &rope_scaling_sec, "RoPE frequency scaling for long contexts"},
    {"attention", F_SECTION, O(ModelSpec, attention), NULL, 0, 0, NULL, &attention_sec, "attention block"},
    {"mlp", F_SECTION, O(ModelSpec, mlp), "(needed by dense layers)", 0, 0, NULL, &mlp_sec, "dense feed-forward"},
    {"moe", F_SECTION, O(ModelSpec, moe), "(none: dense model)", 0, 0, NULL, &moe_sec, "mixture of experts"},
    END};

static const Field gpu_fields[] = {
    {"name", F_STR, O(GpuSpec, name), "(none)", 0, 0, NULL, NULL, "accelerator name, for reports"},
    {"hbm", F_SIZE, O(GpuSpec, hbm), NULL, 0, 0, NULL, NULL, "HBM capacity per GPU"},
    {"hbm_bandwidth", F_RATE, O(GpuSpec, hbm_bandwidth), NULL, 0, 0, NULL, NULL, "HBM bandwidth per GPU"},
    {"bf16_flops", F_FLOPS, O(GpuSpec, bf16_flops), NULL, 0, 0, NULL, NULL, "dense bf16 tensor-core peak per GPU"},
    {"sms", F_INT, O(GpuSpec, sms), "(none)", 1, 100000, NULL, NULL, "streaming multiprocessors"},
    END};

static const Field host_fields[] = {
    {"memory", F_SIZE, O(HostSpec, memory), NULL, 0, 0, NULL, NULL, "host (Grace) memory per GPU"},
    {"bandwidth", F_RATE, O(HostSpec, bandwidth), NULL, 0, 0, NULL, NULL, "host memory bandwidth per GPU"},
    {"cores", F_INT, O(HostSpec, cores), NULL, 1, 100000, NULL, NULL, "CPU cores per GPU"},
    {"fp32_flops", F_FLOPS, O(HostSpec, fp32_flops), NULL, 0, 0, NULL, NULL, "fp32 peak of those cores (optimizer step on the host)"},
    END};

static const Field efficiency_fields[] = {
    {"dense_gemm", F_REAL, O(EfficiencySpec, dense_gemm), "0.6", 0, 0, NULL, NULL, "fraction of bf16_flops a dense GEMM reaches (assumption)", FRACTION},
    {"grouped_gemm", F_REAL, O(EfficiencySpec, grouped_gemm), "0.45", 0, 0, NULL, NULL, "fraction of bf16_flops the routed experts' grouped GEMM reaches (assumption)", FRACTION},
    {"attention", F_REAL, O(EfficiencySpec, attention), "0.5", 0, 0, NULL, NULL, "fraction of bf16_flops flash attention reaches, forward and backward (assumption)", FRACTION},
    {"elementwise", F_REAL, O(EfficiencySpec, elementwise), "0.7", 0, 0, NULL, NULL, "fraction of hbm_bandwidth memory-bound kernels reach (assumption)", FRACTION},
    {"host_gemm", F_REAL, O(EfficiencySpec, host_gemm), "0.5", 0, 0, NULL, NULL, "fraction of host.fp32_flops a CPU GEMM reaches (assumption)", FRACTION},
    {"network", F_REAL, O(EfficiencySpec, network), "0.8", 0, 0, NULL, NULL, "fraction of a link's rate NCCL collectives reach (assumption)", FRACTION},
    {"c2c", F_REAL, O(EfficiencySpec, c2c), "0.8", 0, 0, NULL, NULL, "fraction of links.c2c host copies reach (assumption)", FRACTION},
    {"host_memory", F_REAL, O(EfficiencySpec, host_memory), "0.8", 0, 0, NULL, NULL, "fraction of host.bandwidth the host cores' streaming (gradient accumulation, optimizer step) reaches (assumption)", FRACTION},
    {"attention_bwd", F_REAL, O(EfficiencySpec, attention_bwd), "(attention)", 0, 0, NULL, NULL, "fraction of bf16_flops flash attention's backward (2.5x the forward FLOPs) reaches", FRACTION},
    {"attention_cudnn", F_REAL, O(EfficiencySpec, attention_cudnn), "(attention)", 0, 0, NULL, NULL, "fraction of bf16_flops cuDNN's fused flash attention (the generated program's, cluster.stack mtc) reaches forward", FRACTION},
    {"attention_cudnn_bwd", F_REAL, O(EfficiencySpec, attention_cudnn_bwd), "(attention_bwd)", 0, 0, NULL, NULL, "fraction of bf16_flops cuDNN's fused flash attention reaches backward (2.5x the forward FLOPs)", FRACTION},
    {"expert_gemm_loop", F_REAL, O(EfficiencySpec, expert_gemm_loop), "(dense_gemm)", 0, 0, NULL, NULL, "fraction of bf16_flops each routed expert's own cuBLAS GEMM reaches in the generated program's loop over 4 streams (its path for experts of many rows)", FRACTION},
    {"grouped_gemm_cublas", F_REAL, O(EfficiencySpec, grouped_gemm_cublas), "(grouped_gemm)", 0, 0, NULL, NULL, "fraction of bf16_flops cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx) reaches: the generated program's path for experts of few rows", FRACTION},
    {"gemm_tile_rows", F_REAL, O(EfficiencySpec, gemm_tile_rows), "128", 0, 0, NULL, NULL, "rows of a GEMM kernel's output tile: rows (and each expert's rows) are padded to it; with gpu.sms, whole waves of tiles are priced", 1, 4096, false, false},
    {"gemm_tile_cols", F_REAL, O(EfficiencySpec, gemm_tile_cols), "128", 0, 0, NULL, NULL, "columns of a GEMM kernel's output tile", 1, 4096, false, false},
    {"all_to_all", F_REAL, O(EfficiencySpec, all_to_all), "(network)", 0, 0, NULL, NULL, "fraction of a link's rate the MoE all-to-all (NCCL send/recv to every peer) reaches", FRACTION},
    {"sustained", F_REAL, O(EfficiencySpec, sustained), "1", 0, 0, NULL, NULL, "fraction of the best-shape GEMM and attention rates a whole training step sustains (clocks under power and thermal limits)", FRACTION},
    {"kernel_launch", F_REAL, O(EfficiencySpec, kernel_launch), "0", 0, 0, NULL, NULL, "seconds: the least time one kernel takes (launch and host dispatch; 0: none)", FROM_0},
    {"optimizer_update", F_REAL, O(EfficiencySpec, optimizer_update), "(elementwise)", 0, 0, NULL, NULL, "fraction of hbm_bandwidth the optimizer step's elementwise update reaches on the GPU (AdamW 30 B, Muon 22 B per parameter of the shard; with the step on the host, host.bandwidth x host_memory prices it)", FRACTION},
    END};

static const Field reserve_fields[] = {
    {"cuda_context", F_SIZE, O(ReserveSpec, cuda_context), "1 GiB", 0, 0, NULL, NULL, "CUDA context and module images per GPU (assumption)"},
    {"nccl_buffers", F_SIZE, O(ReserveSpec, nccl_buffers), "1 GiB", 0, 0, NULL, NULL, "NCCL channel buffers for the plan's communicators (assumption)"},
    {"cublas_workspace", F_SIZE, O(ReserveSpec, cublas_workspace), "32 MiB", 0, 0, NULL, NULL, "cuBLAS workspace (cuBLAS docs: 32 MiB recommended on Hopper)"},
    {"host", F_SIZE, O(ReserveSpec, host), "4 GiB", 0, 0, NULL, NULL, "host memory per GPU kept for the OS, the process and pinned staging (assumption)"},
    END};

static const Field evidence_fields[] = {
    {"measured", F_STR, O(EvidenceSpec, measured), "(none)", 0, 0, NULL, NULL, "the efficiency keys whose values come from a measurement or a published microbenchmark (space-separated; the preset cites each); the others are assumptions"},
    {"fitted", F_STR, O(EvidenceSpec, fitted), "(none)", 0, 0, NULL, NULL, "the efficiency keys fitted to whole published runs (the fidelity rows), space-separated"},
    {"band_low", F_REAL, O(EvidenceSpec, band_low), "0", 0, 0, NULL, NULL, "the lowest predicted / published tokens/s of the fidelity rows (tests/specs/fidelity) on this GPU (0: no rows)", FROM_0},
    {"band_high", F_REAL, O(EvidenceSpec, band_high), "0", 0, 0, NULL, NULL, "the highest; launch.sbatch's time limit allows the run band_high x its predicted time", FROM_0},
    {"band_rows", F_INT, O(EvidenceSpec, band_rows), "0", 0, 100000, NULL, NULL, "fidelity rows the band spans"},
    {"band_source", F_STR, O(EvidenceSpec, band_source), "(none)", 0, 0, NULL, NULL, "which rows, in words"},
    {"program_ratio", F_REAL, O(EvidenceSpec, program_ratio), "0", 0, 0, NULL, NULL, "measured / predicted tokens/s of mtc's generated program (cluster.stack mtc; 0: never measured): launch.sbatch's time limit allows the run 1 / program_ratio x its predicted time", FROM_0},
    {"program_source", F_STR, O(EvidenceSpec, program_source), "(none)", 0, 0, NULL, NULL, "the measured run: model, GPU, commit"},
    END};

static const Field nvme_fields[] = {
    {"capacity", F_SIZE, O(NvmeSpec, capacity), NULL, 0, 0, NULL, NULL, "NVMe capacity per GPU"},
    {"bandwidth", F_RATE, O(NvmeSpec, bandwidth), NULL, 0, 0, NULL, NULL, "NVMe bandwidth per GPU"},
    END};

static const Field links_fields[] = {
    {"topology", F_ENUM, O(LinksSpec, topology), "mesh", 0, 0, topo_names, NULL, "how a node's GPUs connect: mesh (nvlink is one pair link; a GPU drives g - 1 of them in a group of g) or nvswitch (nvlink is a GPU's bandwidth into the switch, whatever the group)"},
    {"c2c", F_RATE, O(LinksSpec, c2c), NULL, 0, 0, NULL, NULL, "GPU to its host memory, per direction"},
    {"nvlink", F_RATE, O(LinksSpec, nvlink), NULL, 0, 0, NULL, NULL, "GPU to GPU inside a node, per direction (per pair link or into the switch: see topology)"},
    {"internode", F_RATE, O(LinksSpec, internode), NULL, 0, 0, NULL, NULL, "per GPU between nodes, per direction"},
    END};

static const Section gpu_sec = {"cluster.gpu", gpu_fields};
static const Section host_sec = {"cluster.host", host_fields};
static const Section nvme_sec = {"cluster.nvme", nvme_fields};
static const Section links_sec = {"cluster.links", links_fields};
static const Section efficiency_sec = {"cluster.efficiency", efficiency_fields};
static const Section reserve_sec = {"cluster.reserve", reserve_fields};
static const Section evidence_sec = {"cluster.evidence", evidence_fields};

static const Field cluster_fields[] = {
    {"preset", F_STR, O(ClusterSpec, preset), "(none)", 0, 0, NULL, NULL, "loads specs/clusters/NAME.yaml; keys given here override it"},
    {"stack", F_ENUM, O(ClusterSpec, stack), "mtc", 0, 0, stack_names, NULL, "whose kernels the cost model prices: mtc (the generated program), pytorch-eager or pytorch-compile (TorchTitan-style FSDP2 on the same layout)"},
    {"nodes", F_INT, O(ClusterSpec, nodes), NULL, 1, 100000, NULL, NULL, "nodes of the job"},
    {"gpus_per_node", F_INT, O(ClusterSpec, gpus_per_node), NULL, 1, 128, NULL, NULL, "GPUs (ranks) per node (an NVLink domain)"},
    {"gpu", F_SECTION, O(ClusterSpec, gpu), NULL, 0, 0, NULL, &gpu_sec, "one GPU"},
    {"host", F_SECTION, O(ClusterSpec, host), NULL, 0, 0, NULL, &host_sec, "host memory and cores, per GPU"},
    {"nvme", F_SECTION, O(ClusterSpec, nvme), "(none: no NVMe tier)", 0, 0, NULL, &nvme_sec, "node-local NVMe, per GPU"},
    {"links", F_SECTION, O(ClusterSpec, links), NULL, 0, 0, NULL, &links_sec, "interconnect"},
    {"efficiency", F_SECTION, O(ClusterSpec, efficiency), "(defaults below)", 0, 0, NULL, &efficiency_sec, "cost-model efficiency factors"},
    {"reserve", F_SECTION, O(ClusterSpec, reserve), "(defaults below)", 0, 0, NULL, &reserve_sec, "fixed per-GPU memory reserves"},
    {"evidence", F_SECTION, O(ClusterSpec, evidence), "(none: every rate assumed)", 0, 0, NULL, &evidence_sec, "where the efficiencies come from and how predictions compared with measured runs (reports print it)"},
    END};

static const Field training_fields[] = {
    {"seq_len", F_INT, O(TrainingSpec, seq_len), NULL, 1, MAXDIM, NULL, NULL, "tokens per sequence"},
    {"global_batch", F_INT, O(TrainingSpec, global_batch), "(or global_batch_tokens)", 1, MAXDIM, NULL, NULL, "sequences per optimizer step; exactly one of global_batch and global_batch_tokens"},
    {"global_batch_tokens", F_COUNT, O(TrainingSpec, global_batch_tokens), "(or global_batch)", 0, 0, NULL, NULL, "tokens per optimizer step, a multiple of seq_len (global_batch = it / seq_len): a --set training.seq_len regeneration keeps the step's tokens"},
    {"micro_batch", F_AUTO, O(TrainingSpec, micro_batch), "auto", 1, MAXDIM, NULL, NULL, "sequences per rank per forward/backward; auto (or not written): searched (every divisor of global_batch / GPUs that fits)"},
    {"optimizer", F_ENUM, O(TrainingSpec, optimizer), "adamw", 0, 0, opt_names, NULL, "muon (AdamW for embeddings, router, norms) or adamw"},
    {"grad_reduce_dtype", F_ENUM, O(TrainingSpec, grad_reduce_dtype), "bf16", 0, 0, wire_names, NULL, "gradients on the wire: bf16 (fp32 accumulation) or fp32"},
    {"lr", F_REAL, O(TrainingSpec, lr), NULL, 0, 0, NULL, NULL, "peak learning rate", 0, 1, true, true},
    {"steps", F_INT, O(TrainingSpec, steps), NULL, 1, (int64_t)1 << 40, NULL, NULL, "optimizer steps"},
    {"warmup_steps", F_INT, O(TrainingSpec, warmup_steps), "0", 0, (int64_t)1 << 40, NULL, NULL, "steps of linear learning-rate warmup, then cosine decay"},
    {"min_lr_ratio", F_REAL, O(TrainingSpec, min_lr_ratio), "0.1", 0, 0, NULL, NULL, "learning rate at the last step / lr (0: decays to 0)", 0, 1, false, false},
    {"weight_decay", F_REAL, O(TrainingSpec, weight_decay), "0.1", 0, 0, NULL, NULL, "decoupled weight decay of matrices (not norms, biases; 0: off)", 0, 1, false, true},
    {"grad_clip", F_REAL, O(TrainingSpec, grad_clip), "1.0", 0, 0, NULL, NULL, "clip the global gradient norm to this (0: off)", FROM_0},
    END};

static const Field plan_fields[] = {
    {"fsdp", F_AUTO, O(PlanSpec, fsdp), "auto", 1, 1 << 24, NULL, NULL, "ranks a parameter is sharded over"},
    {"ep", F_AUTO, O(PlanSpec, ep), "auto", 1, 1024, NULL, NULL, "expert-parallel ranks: a divisor of gpus_per_node (inside a node) or a multiple of it (across nodes); divides the experts and fsdp"},
    {"dp_replicate", F_AUTO, O(PlanSpec, dp_replicate), "auto", 1, 1 << 24, NULL, NULL, "replicas of the FSDP group"},
    {"tp", F_INT, O(PlanSpec, tp), "1", 1, 1024, NULL, NULL, "tensor parallelism (only 1 is supported yet)"},
    {"pp", F_INT, O(PlanSpec, pp), "1", 1, 1024, NULL, NULL, "pipeline parallelism (only 1 is supported yet)"},
    {"cp", F_AUTO, O(PlanSpec, cp), "auto", 1, 1024, NULL, NULL, "context-parallel ranks each sequence is split over (2 cp chunks, rank r holding chunks r and 2 cp - 1 - r; K/V all-gathered per layer): a divisor of fsdp with seq_len a multiple of 2 cp, or auto"},
    {"activation_checkpoint", F_ENUM, O(PlanSpec, activation_checkpoint), "auto", 0, 0, ac_names, NULL, "none, selective, full or auto"},
    {"offload_activations", F_ENUM, O(PlanSpec, offload_activations), "auto", 0, 0, off_names, NULL, "where layer-boundary activations wait for backward: none (HBM), host, nvme (needs cluster.nvme) or auto"},
    {"reshard", F_ENUM, O(PlanSpec, reshard), "auto", 0, 0, reshard_names, NULL, "when gathered parameters are freed: every_micro_batch (re-gathered per micro-batch), after_step (kept from the first forward to the optimizer step) or auto"},
    {"reshard_experts", F_ENUM, O(PlanSpec, reshard_experts), "auto", 0, 0, reshard_names, NULL, "the same for the routed experts alone (plan.reshard then sets the rest: attention, dense MLPs, shared experts, router, embedding, head); auto: as plan.reshard, searched when that is auto too"},
    {"moe_dispatch", F_ENUM, O(PlanSpec, moe_dispatch), "auto", 0, 0, dispatch_names, NULL, "the MoE all-to-all of an EP group that spans nodes: flat, hierarchical (one copy per destination node over InfiniBand, then NVLink; both backends run it) or auto (searched where an EP group spans nodes); pinned hierarchical with ep auto, only EP groups across nodes are searched"},
    {"moe_imbalance", F_REAL, O(PlanSpec, moe_imbalance), "1.25", 0, 0, NULL, NULL, "tokens the busiest EP rank receives / the mean: sizes MoE buffers and prices the busiest rank's expert GEMMs", 1, INFINITY, false, true},
    {"optimizer_tier", F_ENUM, O(PlanSpec, optimizer_tier), "auto", 0, 0, opt_tier_names, NULL, "where fp32 master weights, the gradient shard and optimizer state live: hbm, host or auto"},
    {"optimizer_step", F_ENUM, O(PlanSpec, optimizer_step), "auto", 0, 0, opt_step_names, NULL, "where the optimizer step runs: gpu, host (needs optimizer_tier host or auto) or auto"},
    {"prefetch", F_AUTO, O(PlanSpec, prefetch), "auto", 1, 64, NULL, NULL, "all-gathers in flight ahead of the computing layer (1, 2, ... below the layer count) or auto (the search tries 1 and 2)"},
    END};

static const Section model_sec = {"model", model_fields};
static const Section cluster_sec = {"cluster", cluster_fields};
static const Section training_sec = {"training", training_fields};
static const Section plan_sec = {"plan", plan_fields};

static const Field top_fields[] = {
    {"name", F_STR, O(Spec, name), NULL, 0, 0, NULL, NULL, "run name: letters, digits, '.', '_', '-'; output goes to generated/NAME/"},
    {"model", F_SECTION, O(Spec, model), NULL, 0, 0, NULL, &model_sec, "the transformer"},
    {"cluster", F_SECTION, O(Spec, cluster), NULL, 0, 0, NULL, &cluster_sec, "the machines"},
    {"training", F_SECTION, O(Spec, training), NULL, 0, 0, NULL, &training_sec, "the run"},
    {"plan", F_SECTION, O(Spec, plan), "(all auto)", 0, 0, NULL, &plan_sec, "pins instead of search"},
    END};

static const Section top_sec = {"", top_fields};

/* ---- conversion */

static const char *type_name(const Field *f) {
  switch (f->type) {
  case F_INT: return "an integer";
  case F_AUTO: return "a positive integer or auto";
  case F_REAL: return "a number";
  case F_BOOL: return "true or false";
  case F_STR: return "a string";
  case F_ENUM: return "one of the names listed";
  case F_SIZE: return "a size with its unit (e.g. 96 GB)";
  case F_RATE: return "a rate with its unit (e.g. 25 GB/s)";
  case F_FLOPS: return "a compute rate with its unit (e.g. 989 TFLOP/s)";
  case F_COUNT: return "a whole count (e.g. 4096 or 25M)";
  case F_SECTION: return "a mapping of keys";
  }
  return "";
}

/* What a value of f must be, for messages: type_name, with an F_REAL's range and an example
 * in it ("a number >= 0 such as 1.0"). */
static const char *expected(Mem *m, const Field *f) {
  if (f->type != F_REAL) return type_name(f);
  /* the default is in range (it is converted like a value); lr is the one required number */
  const char *example = f->def && f->def[0] != '(' ? f->def : "3.0e-4";
  if (isinf(f->hi)) return mem_printf(m, "a number %s %g such as %s", f->lo_open ? ">" : ">=", f->lo, example);
  return mem_printf(m, "a number in %c%g, %g%c such as %s", f->lo_open ? '(' : '[', f->lo, f->hi,
                    f->hi_open ? ')' : ']', example);
}

static char *full_key(Mem *m, const Section *sec, const char *key) {
  return sec->path[0] ? mem_printf(m, "%s.%s", sec->path, key) : mem_strdup(m, key);
}

/* Levenshtein distance, for "did you mean". */
static int edit_distance(const char *a, const char *b) {
  int la = (int)strlen(a), lb = (int)strlen(b);
  if (la > 63 || lb > 63) return 99;
  int row[64];
  for (int j = 0; j <= lb; j++) row[j] = j;
  for (int i = 1; i <= la; i++) {
    int prev = row[0];
    row[0] = i;
    for (int j = 1; j <= lb; j++) {
      int cur = row[j];
      int sub = prev + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
      int best = row[j] + 1 < row[j - 1] + 1 ? row[j] + 1 : row[j - 1] + 1;
      row[j] = sub < best ? sub : best;
      prev = cur;
    }
  }
  return row[lb];
}

/* Best candidate in names within a distance that a typo would make. */
static const char *closest(const char *word, const char *const *names, size_t stride) {
  const char *best = NULL;
  int bestd = 99;
  for (const char *const *n = names; *n; n = (const char *const *)((const char *)n + stride)) {
    int dist = edit_distance(word, *n);
    int limit = (int)strlen(*n) / 3 + 1;
    if (dist <= limit && dist < bestd) best = *n, bestd = dist;
  }
  return best;
}

static const Section *const all_sections[] = {&top_sec, &model_sec, &attention_sec, &mlp_sec,
                                              &moe_sec, &cluster_sec, &gpu_sec, &host_sec,
                                              &nvme_sec, &links_sec, &efficiency_sec,
                                              &reserve_sec, &evidence_sec, &training_sec, &plan_sec, NULL};

const char *spec_efficiency_key(int i) {
  int n = 0;
  while (efficiency_fields[n].key) n++;
  return i >= 0 && i < n ? efficiency_fields[i].key : NULL;
}

static bool unknown_key(Diag *d, const Section *sec, const YNode *key) {
  Mem *m = d->mem;
  for (const Section *const *s = all_sections; *s; s++)
    for (const Field *f = (*s)->fields; f->key; f++)
      if (*s != sec && strcmp(f->key, key->str) == 0)
        return diag_error(d, key->loc, "unknown key '%s'; '%s' belongs in another section: %s",
                          full_key(m, sec, key->str), key->str, full_key(m, *s, f->key));
  const char *near = closest(key->str, &sec->fields[0].key, sizeof(Field));
  if (near)
    return diag_error(d, key->loc, "unknown key '%s'; did you mean '%s'?", full_key(m, sec, key->str),
                      full_key(m, sec, near));
  for (const Section *const *s = all_sections; *s; s++) {
    const char *other = *s != sec ? closest(key->str, &(*s)->fields[0].key, sizeof(Field)) : NULL;
    if (other)
      return diag_error(d, key->loc, "unknown key '%s'; did you mean '%s' (in another section)?",
                        full_key(m, sec, key->str), full_key(m, *s, other));
  }
  char *list = "";
  for (const Field *f = sec->fields; f->key; f++)
    list = mem_printf(m, "%s%s%s", list, f == sec->fields ? "" : ", ", f->key);
  return diag_error(d, key->loc, "unknown key '%s'; expected one of: %s",
                    full_key(m, sec, key->str), list);
}

bool spec_key_check(Diag *d, const Source *src, size_t klen) {
  const Section *sec = &top_sec;
  for (size_t at = 0; at < klen;) {
    const char *dot = memchr(src->text + at, '.', klen - at);
    size_t end = dot ? (size_t)(dot - src->text) : klen;
    YNode key = {.kind = Y_SCALAR, .loc = {src, 0, (int)at}, .str = mem_strndup(d->mem, src->text + at, end - at)};
    const Field *f = sec->fields;
    while (f->key && strcmp(f->key, key.str) != 0) f++;
    if (!f->key) return end > at ? unknown_key(d, sec, &key) : true; /* (an empty segment: yaml_set's message) */
    if (!dot) return true;
    if (f->type != F_SECTION)
      return diag_error(d, key.loc, "'%s' is not a section; expected a dotted key through sections",
                        full_key(d->mem, sec, f->key));
    sec = f->sub, at = end + 1;
  }
  return true;
}

static bool is_null(const YNode *v) {
  return v->kind == Y_SCALAR && !v->quoted &&
         (v->str[0] == '\0' || strcmp(v->str, "~") == 0 || strcmp(v->str, "null") == 0);
}

/* Whether s is written as a decimal number (strtod also reads hex, inf and nan). */
static bool decimal(const char *s) { return s[strspn(s, "0123456789.eE+-")] == '\0'; }

/* Parses a decimal integer into out as YAML 1.2's core schema reads one ([-+]?[0-9]+: a leading
 * 0 is not octal, so 010 is 10; no '_' between digits, which was YAML 1.1's); false if not one. */
static bool parse_int(const char *s, int64_t *out, bool *overflow) {
  const char *p = s;
  int64_t v = 0;
  *overflow = false;
  if (*p == '+') p++;
  bool neg = *p == '-';
  if (neg) p++;
  if (!isdigit((unsigned char)*p)) return false;
  for (; *p; p++) {
    if (!isdigit((unsigned char)*p)) return false;
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *p - '0', &v))
      *overflow = true;
  }
  *out = neg ? -v : v;
  return true;
}

/* The significant digits of the decimal number s (as decimal() accepts; at most 63 digits
 * kept) without leading and trailing zeros into digits, and the power of ten of its first one
 * into *exp: "0.0500e1" -> "5", 0 ... -1 + 1. False if s is no such number. */
static bool canon_decimal(const char *s, char digits[64], long *exp) {
  const char *p = s;
  if (*p == '+' || *p == '-') p++;
  size_t n = 0;
  long point = 0, first = LONG_MIN; /* digits before the point; the position of the first nonzero */
  bool seen_point = false, any = false;
  for (long i = 0; *p && *p != 'e' && *p != 'E'; p++) {
    if (*p == '.') {
      if (seen_point) return false;
      seen_point = true;
      continue;
    }
    if (!isdigit((unsigned char)*p)) return false;
    any = true;
    if (!seen_point) point++;
    if (*p != '0' && first == LONG_MIN) first = i;
    if (first != LONG_MIN && n < 63) digits[n++] = *p;
    i++;
  }
  if (!any) return false;
  long e = 0;
  if (*p == 'e' || *p == 'E') {
    char *end;
    e = strtol(p + 1, &end, 10);
    if (end == p + 1 || *end) return false;
  }
  while (n > 0 && digits[n - 1] == '0') n--;
  digits[n] = '\0';
  *exp = first == LONG_MIN ? 0 : point - 1 - first + e;
  return true;
}

/* Whether the decimal text s is exactly the number b (a range's end: 0, 1, 0.1, 1000), digit
 * for digit, rather than another number that strtod rounds to b. */
static bool same_decimal(const char *s, double b) {
  char a[64], c[64], text[40] = "";
  long ea, ec;
  if (!canon_decimal(s, a, &ea)) return true;
  /* b as the shortest decimal that reads back as it (%.17g of 0.1 is 0.10000000000000001) */
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(text, sizeof text, "%.*g", prec, b);
    if (strtod(text, NULL) == b) break;
  }
  if (!canon_decimal(text, c, &ec)) return true;
  return strcmp(a, c) == 0 && (a[0] == '\0' || ea == ec);
}

static bool convert_section(Diag *d, const Section *sec, const YNode *map, Loc at, char *base);

/* Converts one value v (never NULL) of field f into base + f->off. */
/* at: where the key was written (missing keys of a section are reported there). */
static bool convert_value(Diag *d, const Section *sec, const Field *f, const YNode *v, Loc at,
                          char *base) {
  Mem *m = d->mem;
  const char *key = full_key(m, sec, f->key);
  void *dst = base + f->off;
  if (f->type == F_SECTION) {
    if (v->kind != Y_MAP && !is_null(v))
      return diag_error(d, v->loc, "'%s' is a %s; expected a section (a mapping of keys)", key,
                        v->kind == Y_SEQ ? "sequence" : "scalar");
    *(bool *)dst = true; /* every section struct starts with `bool present` */
    return convert_section(d, f->sub, v->kind == Y_MAP ? v : NULL, at, dst);
  }
  if (v->kind != Y_SCALAR)
    return diag_error(d, v->loc, "'%s' is a %s; expected %s", key,
                      v->kind == Y_MAP ? "mapping" : "sequence", expected(m, f));
  if (is_null(v)) return diag_error(d, v->loc, "'%s' has no value; expected %s", key, expected(m, f));
  const char *s = v->str;
  /* a quoted scalar is a string in YAML (as a !!str tag makes it, refused by yaml.c): where a
   * number or a boolean is expected it is refused, not read as one */
  if (v->quoted && (f->type == F_INT || f->type == F_REAL || f->type == F_BOOL ||
                    (f->type == F_AUTO && strcmp(s, "auto") != 0)))
    return diag_error(d, v->loc, "'%s' is the quoted string '%s'; expected %s, written without quotes", key, s,
                      expected(m, f));
  char err[400];
  switch (f->type) {
  case F_AUTO:
    if (strcmp(s, "auto") == 0) {
      *(int64_t *)dst = 0;
      return true;
    }
    /* fall through */
  case F_INT: {
    int64_t x;
    bool ovf;
    if (!parse_int(s, &x, &ovf)) {
      char *endp;
      double r = strtod(s, &endp);
      if (decimal(s) && endp != s && *endp == '\0' && isfinite(r) && r == floor(r)) {
        if (fabs(r) >= 1e18)
          return diag_error(d, v->loc, "'%s' is %s, out of range; expected an integer from %lld to %lld", key, s,
                            (long long)f->min, (long long)f->max);
        return diag_error(d, v->loc, "'%s' is %s, a real number; expected %s: write %.0f", key, s,
                          type_name(f), r == 0 ? 0.0 : r);
      }
      if (decimal(s) && endp != s && *endp == '\0' && isfinite(r))
        return diag_error(d, v->loc, "'%s' is %s, not a whole number; expected %s", key, s, type_name(f));
      if (strchr(s, '_') && s[strspn(s, "0123456789_+-")] == '\0') { /* YAML 1.1's 1_000 */
        char *digits = mem_strdup(m, s), *o = digits;
        for (const char *c = s; *c; c++)
          if (*c != '_') *o++ = *c;
        *o = '\0';
        return diag_error(d, v->loc, "'%s' is '%s': YAML 1.2 reads no '_' between digits (a string, not a number); "
                          "expected %s: write %s", key, s, type_name(f), digits);
      }
      return diag_error(d, v->loc, "'%s' is '%s'; expected %s", key, s, type_name(f));
    }
    if (ovf || x < f->min || x > f->max)
      return diag_error(d, v->loc, "'%s' is %s, out of range; expected an integer from %lld to %lld",
                        key, s, (long long)f->min, (long long)f->max);
    *(int64_t *)dst = x;
    return true;
  }
  case F_REAL: {
    char *endp;
    errno = 0;
    double x = strtod(s, &endp);
    bool in = (f->lo_open ? x > f->lo : x >= f->lo) && (f->hi_open ? x < f->hi : x <= f->hi);
    double bound = x == f->lo ? f->lo : f->hi;
    if (decimal(s) && endp != s && *endp == '\0' && !in && (x == f->lo || x == f->hi) && !same_decimal(s, bound))
      return diag_error(d, v->loc, "'%s' is '%s', which rounds to %g in double precision, an end of the range it "
                        "excludes; expected %s, %s %g by more than a double's rounding", key, s, bound, expected(m, f),
                        x == f->lo ? "above" : "below", bound);
    if (!decimal(s) || endp == s || *endp != '\0' || !isfinite(x) || errno == ERANGE || !in)
      return diag_error(d, v->loc, "'%s' is '%s'; expected %s", key, s, expected(m, f));
    *(double *)dst = x;
    return true;
  }
  case F_BOOL:
    if (strcmp(s, "true") == 0 || strcmp(s, "false") == 0) {
      *(bool *)dst = s[0] == 't';
      return true;
    }
    return diag_error(d, v->loc, "'%s' is '%s'; expected true or false", key, s);
  case F_STR:
    *(const char **)dst = s;
    return true;
  case F_ENUM: {
    for (int i = 0; f->names[i]; i++)
      if (strcmp(s, f->names[i]) == 0) {
        *(int *)dst = i;
        return true;
      }
    char *list = "";
    for (int i = 0; f->names[i]; i++) list = mem_printf(m, "%s%s%s", list, i ? ", " : "", f->names[i]);
    const char *near = closest(s, f->names, sizeof(char *));
    if (near)
      return diag_error(d, v->loc, "'%s' is '%s'; did you mean '%s'? expected one of: %s", key, s, near, list);
    return diag_error(d, v->loc, "'%s' is '%s'; expected one of: %s", key, s, list);
  }
  case F_SIZE:
  case F_RATE:
  case F_FLOPS: {
    Quantity q = f->type == F_SIZE ? Q_SIZE : f->type == F_RATE ? Q_RATE : Q_FLOPS;
    if (!units_parse(s, q, (double *)dst, err, sizeof err))
      return diag_error(d, v->loc, "%s: %s", key, err);
    return true;
  }
  case F_COUNT: {
    double x;
    if (!units_parse(s, Q_COUNT, &x, err, sizeof err)) return diag_error(d, v->loc, "%s: %s", key, err);
    *(int64_t *)dst = (int64_t)x;
    return true;
  }
  case F_SECTION:
    break;
  }
  return true;
}

/* Converts the mapping map (NULL: the section is empty) of section sec into base. at is where
 * the section was written (missing keys are reported there). Keys are checked in document
 * order, then the required ones that are missing, in table order. */
static bool convert_section(Diag *d, const Section *sec, const YNode *map, Loc at, char *base) {
  Mem *m = d->mem;
  for (YPair *p = map ? map->first : NULL; p; p = p->next) {
    const Field *f = sec->fields;
    while (f->key && strcmp(f->key, p->key->str) != 0) f++;
    if (!f->key) return unknown_key(d, sec, p->key);
    if (!convert_value(d, sec, f, p->val, p->key->loc, base)) return false;
  }
  for (const Field *f = sec->fields; f->key; f++) {
    if (map && yaml_pair(map, f->key)) continue;
    if (!f->def) {
      const char *what = f->type == F_SECTION ? "a section" : expected(m, f);
      return diag_error(d, at, "missing key '%s'; expected %s (%s)", full_key(m, sec, f->key), what, f->doc);
    }
    if (f->type == F_SECTION) { /* absent: defaults if it has no required key; present stays false */
      bool all_default = true;
      for (const Field *g = f->sub->fields; g->key; g++) all_default &= g->def != NULL;
      if (all_default && !convert_section(d, f->sub, NULL, at, base + f->off)) return false;
      continue;
    }
    if (f->def[0] == '(') continue;
    YNode dv = {.kind = Y_SCALAR, .loc = at, .str = f->def};
    if (!convert_value(d, sec, f, &dv, at, base)) return false;
  }
  return true;
}

bool spec_convert(Diag *d, Spec *s) { /* missing top-level keys: at the first key */
  return convert_section(d, &top_sec, s->root, s->root->first ? s->root->first->key->loc : s->root->loc,
                         (char *)s);
}

/* ---- the model's keys, resolved (checkpoint manifests; mtc export compares them) */

/* The value of field f (not a section) at base, as text: integers and counts in decimal, reals
 * and quantities with 15 significant digits (%.15g), booleans and enum names as written. */
static const char *value_text(Mem *m, const Field *f, const char *base) {
  const void *v = base + f->off;
  switch (f->type) {
  case F_INT:
  case F_AUTO:
  case F_COUNT: return mem_printf(m, "%lld", (long long)*(const int64_t *)v);
  case F_REAL:
  case F_SIZE:
  case F_RATE:
  case F_FLOPS: return mem_printf(m, "%.15g", *(const double *)v);
  case F_BOOL: return *(const bool *)v ? "true" : "false";
  case F_ENUM: return f->names[*(const int *)v];
  case F_STR: return *(const char *const *)v ? *(const char *const *)v : "";
  case F_SECTION: break;
  }
  return "";
}

/* Appends "KEY VALUE, " for every key of section sec (values at base) to *out, in table order;
 * a subsection with a required key adds "KEY written" or "KEY absent", then its keys when
 * written; one whose keys all have defaults (model.rope_scaling) always adds its keys. */
static void keys_of(Mem *m, char **out, const Section *sec, const char *base) {
  for (const Field *f = sec->fields; f->key; f++) {
    const char *key = full_key(m, sec, f->key);
    if (f->type != F_SECTION) {
      *out = mem_printf(m, "%s%s%s %s", *out, **out ? ", " : "", key, value_text(m, f, base));
      continue;
    }
    bool all_default = true, written = *(const bool *)(base + f->off);
    for (const Field *g = f->sub->fields; g->key; g++) all_default &= g->def != NULL;
    if (!all_default) *out = mem_printf(m, "%s%s%s %s", *out, **out ? ", " : "", key, written ? "written" : "absent");
    if (written || all_default) keys_of(m, out, f->sub, base + f->off);
  }
}

char *spec_model_keys(Mem *m, const Spec *s) {
  char *out = "";
  keys_of(m, &out, &model_sec, (const char *)&s->model);
  return out;
}

/* ---- the spec reference (docs/spec.md) */

static void print_section(FILE *out, const Section *sec) {
  for (const Field *f = sec->fields; f->key; f++) {
    if (f->type == F_SECTION) continue;
    const char *type = "";
    char names[200] = "";
    switch (f->type) {
    case F_INT: type = "integer"; break;
    case F_AUTO: type = "integer \\| auto"; break;
    case F_REAL:
      if (isinf(f->hi)) snprintf(names, sizeof names, "number %s %g", f->lo_open ? ">" : ">=", f->lo);
      else snprintf(names, sizeof names, "number in %c%g, %g%c", f->lo_open ? '(' : '[', f->lo, f->hi, f->hi_open ? ')' : ']');
      type = names;
      break;
    case F_BOOL: type = "bool"; break;
    case F_STR: type = "string"; break;
    case F_SIZE: type = "size, unit required (96 GB, 120 GiB)"; break;
    case F_RATE: type = "rate, unit required (25 GB/s)"; break;
    case F_FLOPS: type = "FLOP/s, unit required (989 TFLOP/s)"; break;
    case F_COUNT: type = "count (4096, 25M, 24Mi)"; break;
    case F_ENUM:
      for (int i = 0; f->names[i]; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? " \\| " : "", f->names[i]);
      type = names;
      break;
    case F_SECTION: break;
    }
    const char *def = f->def ? f->def : "**required**";
    fprintf(out, "| `%s%s%s` | %s | %s | %s |\n", sec->path, sec->path[0] ? "." : "", f->key, type, def, f->doc);
  }
  for (const Field *f = sec->fields; f->key; f++)
    if (f->type == F_SECTION) {
      fprintf(out, "| `%s%s%s` | section | %s | %s |\n", sec->path, sec->path[0] ? "." : "", f->key,
              f->def ? f->def : "**required**", f->doc);
      print_section(out, f->sub);
    }
}

void spec_print_keys(FILE *out) {
  fprintf(out, "| key | type | default | meaning |\n|---|---|---|---|\n");
  print_section(out, &top_sec);
}
