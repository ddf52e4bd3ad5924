/*
 * cu_internal.h — what the cuda runtime's files share (not for generated programs): the one
 * stream, the cuBLAS handle, the loaded kernels of the plan's kernels.cu, the scratch, and the
 * launch and check helpers. Every failure aborts the job through rt_cuda_fail, naming the op.
 */
#ifndef CU_INTERNAL_H
#define CU_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <stdint.h>

#include "attn_cudnn.h"
#include "cu_scratch.h"
#include "mtrt_cuda.h"
#include "mtrt_profile.h"

/* Whether act is bf16 (MTRT_ACT_BF16), and its cuBLAS type. */
#ifdef MTRT_ACT_BF16
#define MTRT_ACT_IS_BF16 1
#define CU_ACT CUDA_R_16BF
#else
#define MTRT_ACT_IS_BF16 0
#define CU_ACT CUDA_R_32F
#endif

/* The kernels of templates/kernels.cu, by index; names in ops.c's table. */
enum {
  K_EMBEDDING_FORWARD, K_EMBEDDING_BACKWARD, K_RMSNORM_FORWARD, K_RMSNORM_BACKWARD, K_ROPE,
  K_SWIGLU_FORWARD, K_SWIGLU_BACKWARD, K_GELU_FORWARD, K_GELU_BACKWARD, K_ACCUMULATE, K_FILL,
  K_RESIDUAL_ADD, K_ATTENTION_FORWARD, K_ATTENTION_BACKWARD_DQ, K_ATTENTION_BACKWARD_DKV, K_ADAMW,
  K_CAST_BF16, K_SUM_SQUARES, K_CROSS_ENTROPY_CHUNK,
  K_CROSS_ENTROPY_BACKWARD, K_ROUTER_TOPK, K_ROUTER_BACKWARD, K_AUX_LOSS_STATS, K_AUX_LOSS_BACKWARD,
  K_MOE_GATHER, K_MOE_COMBINE, K_MOE_COMBINE_BACKWARD, K_MOE_GATHER_BACKWARD, K_FLASH_FORWARD,
  K_FLASH_BACKWARD_PREP, K_FLASH_BACKWARD_DQ, K_FLASH_BACKWARD_DKV,
  K_ROUTER_WEIGHTS, K_ROUTER_WEIGHTS_BACKWARD, K_QK_NORM_FORWARD, K_QK_NORM_BACKWARD,
  K_ROPE_LLAMA3, K_SIGMOID_GATE_FORWARD, K_SIGMOID_GATE_BACKWARD,
  K_ROUTER_TOPK_GROUPED, K_ROPE_YARN,
  K_POSITION_FORWARD, K_COLSUM_ADD, K_LAYERNORM_FORWARD, K_LAYERNORM_BACKWARD, K_BIAS_FORWARD,
  K_ACCUMULATE_ACT_F32, K_ACCUMULATE_F32, K_MUON_MOMENTUM, K_MUON_APPLY, K_NS_INV_NORM, K_NS_PREP, K_NS_FINISH,
  K_CAST_ACT_F32, K_ROUND_BF16, K_MOE_COUNT, K_MOE_POSITIONS, K_MOE_REGROUP, K_ROPE_STRIDED, K_MLA_KV_FORWARD,
  K_MLA_KV_BACKWARD, K_MOE_LOAD_ADD, K_ROUTER_BIAS_UPDATE, K_SEQ_AUX_STATS, K_SEQ_AUX_BACKWARD,
  K_SEQ_AUX_LOSS_SUM, K_MOE_GROUP_PTRS, K_ROPE_SPAN, K_ATTENTION_SPAN_FORWARD, K_ATTENTION_SPAN_BACKWARD_DQ,
  K_ATTENTION_SPAN_BACKWARD_DKV, K_CP_REVERSE, K_SCALE_F32, K_SWIGLU_ROWS_FORWARD, K_SWIGLU_ROWS_BACKWARD,
  K_ADD_RMSNORM_FORWARD, K_HIER_ROWS, K_HIER_SCALARS_ADD, K_MOE_GATE_ROWS, K_COUNT
};

enum { CU_GROUPED_SLOTS = 8 };   /* pointer-array slots: one per grouped GEMM of one experts call */
/* Streams the per-expert GEMM loop spreads its GEMMs over: the compute stream and 3 more, as
 * TransformerEngine's multi-stream cuBLAS grouped GEMM (num_compute_streams 4,
 * transformer_engine/common/util/multi_stream.h) that Megatron's grouped MLP calls. */
enum { CU_LANES = 4 };
enum { CU_RMS_BWD_ROWS = 16 };   /* rows per block of rmsnorm_backward: kernels.cu's RMS_BWD_ROWS */
enum { CU_QK_BWD_ROWS = 16 };    /* rows per block of qk_norm_backward: kernels.cu's QK_BWD_ROWS */

typedef struct {
  int ready, device, sync_each; /* sync_each: $MTC_CUDA_SYNC=1 */
  int profile;                  /* $MTC_PROFILE=1: each op timed (profile.c) */
  int flash;                    /* attention: 2 cuDNN, 1 the flash kernels, -1 the simple ones, 0 not chosen yet */
  char arch[16], gemm_name[8];
  cudaStream_t stream;
  cublasHandle_t blas;
  cublasComputeType_t compute, grouped_compute;
  cudaLibrary_t lib;
  cudaKernel_t k[K_COUNT];
  RtCudaConfig cfg;
  float *delta;   /* attention: dout · out per (token, head) */
  float *dqacc;   /* attention through cuDNN: dQ's fp32 accumulator (tokens × heads × qk head dim; bf16 build) */
  float *ce;      /* cross-entropy: sum (tokens), target logit (tokens), loss (1) */
  double *red;    /* one reduction result (the gradient norm's sum of squares) */
  void **gptr;    /* device: CU_GROUPED_SLOTS × 3 × experts pointers */
  /* the expert GEMM loop's lanes (MoE models): lane 0 is the compute stream; each lane has its own
   * cuBLAS handle on a 1/CU_LANES slice of cuBLAS's workspace (the lanes run only between a fork
   * from the compute stream and the join back into it, when nothing else uses the workspace) */
  cudaStream_t lane[CU_LANES];
  cublasHandle_t lane_blas[CU_LANES];
  cudaEvent_t fork, join[CU_LANES];
  int expert_path; /* $MTC_EXPERTS: 0 the plan's rule (cfg.expert_loop_rows), 1 always the loop, 2 always grouped */
  void *workspace; /* cuBLAS's (cublasSetWorkspace) */
  /* MoE (ops_moe.c, comm_nccl.c): device scratch moe and its host mirror moe_host, laid out by
   * cu_moe_layout; off_host: the host copies of offsets arrays the device holds (cu_offsets) */
  void *moe, *moe_host;
  int *off_host;
  const int *cnt_of; /* moe_host's counts are those of this router choice array (NULL: none) */
  const float *stats_of; /* moe's balancing statistics are those of these logits and stats_idx's choices */
  const int *stats_idx;  /* (rt_aux_loss_forward's; rt_aux_loss_backward reads them: NULL none) */
  struct {
    const int *dev; /* NULL: a free slot */
    size_t n;
  } oc[CU_OFF_CACHE]; /* oc[i]: off_host's i-th slot (experts + 1 ints) holds n ints of dev */
  int oc_next;
  void *rl;       /* the router's logit gradient in the activation type (tokens × experts) */
  /* the pinned readback buffer (cu_rb_layout): small copies down land here, so that the host
   * waits for them by polling (rt_cu_host_wait) instead of blocking in a copy */
  void *rb;
  /* deferred scalars (rt_cu_defer_scalars): the micro-batches' losses (sums over loss_n[i]
   * tokens) and the groups' Σ g² copied into rb as they are computed, n_loss and n_sq of them,
   * and what was folded already (when rb was full) */
  int defer, n_loss, n_sq, loss_n[CU_SCALARS];
  double loss_acc;
  float sq_acc;
  /* the copy ring in rb (cu_ring_at): each slot's event and the number of the copy that used it
   * last (0: known done), copies issued, the last one a host wait of the whole stream covered */
  cudaEvent_t ring_ev[CU_RING_SLOTS];
  unsigned long long ring_seq[CU_RING_SLOTS], ring_issued, ring_waited;
  int ring_next;
} CuState;

extern CuState cu;

/* CU_OFF_CACHE, CU_SCALARS, cu_moe_layout, cu_rb_layout, cu_host_scratch: cu_scratch.h */
/* The loss of a micro-batch (its sum over N tokens, device float at sum) copied into the readback
 * buffer, read at the step's end (train_cuda.c). */
void cu_defer_loss(const float *sum, int N);

/* MTC_PROFILE (profile.c): cu_prof_init reads it (rt_cuda_setup); CU_PROF_BEGIN/END time one
 * op between device synchronizations into a per-name table printed at exit. The same timings
 * feed `train --profile FILE` (mtrt_profile.h) while rt_prof_on: each op's class from its name,
 * with cu_prof_flops, the FLOPs the GEMM about to end did (set by cu_gemm and the grouped GEMM). */
void cu_prof_init(void);
double cu_prof_begin(void);
void cu_prof_end(const char *name, double t0);
extern double cu_prof_flops;
#define CU_PROF_ON (cu.profile || rt_prof_on)
#define CU_PROF_BEGIN() double cu_prof_t0 = CU_PROF_ON ? cu_prof_begin() : 0
#define CU_PROF_END(name) (CU_PROF_ON ? cu_prof_end((name), cu_prof_t0) : (void)0)

/* Launches kernel k with grid × block threads (1-D) on the stream; a launch error (or, with
 * MTC_CUDA_SYNC, an execution error) aborts naming the kernel. A grid of 0 launches nothing. */
void cu_launch(int k, unsigned grid, unsigned block, void **args);
/* The same with a 3-D grid (gx, gy, gz). */
void cu_launch3(int k, unsigned gx, unsigned gy, unsigned gz, unsigned block, void **args);
/* n ints of device offsets array dev (written only by the runtime: the permutation's offsets, a
 * round's eoff) on the host: from the copy cu_offsets_known recorded, whole or a part of one, or
 * else copied down (a host synchronization; CU_OFF_CACHE arrays are kept, the oldest dropped). */
const int *cu_offsets(const int *dev, size_t n);
/* The device's offsets array dev now holds the n ints host (recorded; copies of arrays it overlaps
 * are dropped). */
void cu_offsets_known(const int *dev, const int *host, size_t n);
/* bytes from device src into host dst, on the stream: returns when the copy is done (a copy into
 * the pinned readback buffer's staging area and a poll, rt_cu_host_wait, per staging area's
 * worth of bytes; never a pageable async copy). */
void cu_download(void *dst, const void *src, size_t bytes);
/* bytes from pageable host src to device dst, on the stream, through the pinned copy ring (a
 * slot is written again once the copy that read it is done): src may be reused at once. */
void cu_ring_upload(void *dst, const void *src, size_t bytes);
/* bytes from device src into pageable host dst through the copy ring, up to CU_RING_SLOTS slots
 * in flight; returns when dst holds them (host waits on the slots' events). */
void cu_ring_download(void *dst, const void *src, size_t bytes);
/* Waits on the host until ev is done, watching the communicators as rt_cu_host_wait does
 * (comm_nccl.c). */
void cu_host_wait_event(cudaEvent_t ev, const char *why);
/* A group of NCCL over the ranks of comm (a split of the world communicator, watched and timed as the
 * plan's groups are), named name, on the EP stream: the hierarchical all-to-all's node and cross
 * groups (moe_hier.c). Collective over the world. Returns 0, or -1 with err. */
int cu_comm_split(MPI_Comm comm, const char *name, char *err, size_t errlen);
/* Rows of C act between the ranks of comm's group (cu_comm_split's or the plan's): to each rank p
 * sc[p] rows from send + sd[p] rows, from it rc[p] rows into recv + rd[p]; one NCCL group on the
 * group's stream, which waits for the compute stream's work so far and which the compute stream
 * waits for (on the device). */
void cu_comm_rows(MPI_Comm comm, const act *send, const int64_t *sc, const int64_t *sd, act *recv, const int64_t *rc,
                  const int64_t *rd, int C, const char *op);
/* Whether the stream was made to wait for a collective since the last host wait (comm_nccl.c):
 * a blocking copy then polls first (rt_cu_host_wait), so that a hung collective is named. */
int cu_comm_waited(void);
/* The attention kernels in use, for the start-up line; whether they are cuDNN's; whether they are
 * the own tiled flash kernels (80-flash.cu: kernels.cu has them and neither the plan nor
 * $MTC_ATTENTION picks cuDNN or the warp-per-row ones). */
const char *cu_attention_name(void);
int cu_attention_cudnn(void);
int cu_attention_flash(void);
/* Context parallelism (ops_cp.c): builds the cuDNN plans of this rank's two query chunks (cu.cfg's
 * cp, cp_rank) at start-up. */
void cu_attn_span_prepare(void);
/* attention through cuDNN: attn_cudnn.h */
/* The workspace cuDNN's plans run in: cuBLAS's (the same stream), and its bytes (ops.c). */
void *cu_attn_workspace(void);
size_t cu_attn_workspace_bytes(void);
/* Checks a CUDA runtime or cuBLAS status of op. */
void cu_check(cudaError_t e, const char *op);
void cu_blas_check(cublasStatus_t s, const char *op);
/* Blocks of `block` threads covering n. */
static inline unsigned cu_blocks(long long n, unsigned block) { return (unsigned)((n + block - 1) / block); }
/* C (column-major m × n) = A·B (+ beta C); A, B and C of cuBLAS types at, bt, ct (CU_ACT or
 * CUDA_R_32F). bf16 operands multiply with fp32 accumulation (CUBLAS_COMPUTE_32F); fp32 ones
 * with the chosen GEMM math ($MTC_GEMM). */
void cu_gemm(const char *op, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A,
             cudaDataType_t at, int lda, const void *B, cudaDataType_t bt, int ldb, float beta, void *C,
             cudaDataType_t ct, int ldc);

#endif
