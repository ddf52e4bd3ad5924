/*
 * mtrt_cuda.h — the cuda backend's kernel loader: the plan's kernels.cu compiled at start-up by
 * NVRTC for the device's architecture, cached on disk by a hash of source and options. It needs
 * no GPU and no driver (NVRTC is a library), so `train --check-kernels` runs on CI.
 *
 * The training step on the GPU (ops.c, comm_nccl.c, train_cuda.c) implements the same API as the
 * cpu backend (mtrt_ops.h, the collectives of mtrt_comm.h) over device pointers, so one
 * generated step.c drives either backend: each device arena is one cudaMalloc, its `real` is
 * float and its activation type `act` bf16 (mtrt_cuda; fp32 in mtrt_cuda_f32act, for exact
 * checks), elementwise kernels come from the plan's kernels.cu, GEMMs from cuBLAS with bf16
 * operands and fp32 accumulation (fp32 operands in mtrt_cuda_f32act: $MTC_GEMM's math), the routed
 * experts from grouped GEMMs, collectives from NCCL. Not yet run on a GPU.
 */
#ifndef MTRT_CUDA_H
#define MTRT_CUDA_H

#include <stddef.h>

#include "mtrt_train.h"

/* Compiles src (n bytes, named name in messages) for arch ("sm_90a") with the CUDA headers in
 * include_dir. A cached CUBIN under cache_dir (NULL: $MTC_KERNEL_CACHE, else
 * $HOME/.cache/mtc-kernels; mtrt_kcache.h: a directory only this user can write) whose key, the
 * FNV-1a hash of NVRTC's version, the source and the options, and content checksum match is used
 * (*cached = 1); otherwise the result is written there (a cache not used is warned on stderr). On success returns 0 with the
 * CUBIN's size, the number of kernels (extern "C" __global__ functions) in *kernels and, when
 * cubin is not NULL, the CUBIN itself (malloc'ed; the caller frees it); on failure -1 with
 * NVRTC's log (file:line: error ...) in log. */
int rt_cuda_compile(const char *src, size_t n, const char *name, const char *arch, const char *include_dir,
                    const char *cache_dir, void **cubin, size_t *cubin_bytes, int *kernels, int *cached, char *log,
                    size_t loglen);

/* The architecture of GPU 0 as NVRTC names it ("sm_90a" for compute capability 9.0, which
 * needs the a-suffix for wgmma; "sm_XY" otherwise); -1 when there is no usable GPU. */
int rt_cuda_arch(char *arch, size_t n);

/* The CUDA runtime, cuBLAS, NVRTC and NCCL versions this program runs with, and the GPUs the
 * runtime sees (none, with the reason, on a machine without a driver), as one line in buf. */
void rt_cuda_versions(char *buf, size_t n);

/* ---- the training step's device runtime (ops.c) ---- */

/* What rt_cuda_setup needs: the plan's kernels.cu, the shapes that size the runtime's own
 * scratch (attention's delta and dQ accumulator, cross-entropy's sums, the grouped GEMMs' pointer
 * arrays) and the attention's shape, whose cuDNN plans it builds at start-up. */
typedef struct {
  const char *kernels_src;
  size_t kernels_len;
  const char *include_dir; /* the CUDA headers NVRTC compiles against */
  int tokens;              /* rows per micro-batch and rank (B × T) */
  int heads;               /* query heads */
  int experts;             /* experts in one grouped GEMM at most (0: dense) */
  int top_k;
  size_t cublas_workspace; /* bytes: the plan's reserve.cublas_workspace (0: 64 MiB), cuDNN's too */
  int batch, seq;          /* the attention's: sequences per micro-batch (batch × seq = cp × tokens), tokens each */
  int kv_heads, head_dim, v_head_dim; /* KV heads, q/k and v head dims (0: no attention plans at start-up) */
  int attention_cudnn;     /* the plan's attention: 1 cuDNN's (bf16 build), 0 the own kernels */
  int expert_loop_rows;    /* the plan's expert path: a pass whose experts with rows average at least this many
                            * runs one cuBLAS GEMM per expert over CU_LANES streams, else one grouped call (0: always grouped) */
  int cp, cp_rank;         /* context parallelism: each sequence split over cp ranks, this one cp_rank (0: 1) */
  int qkv_fused;           /* 1: q, k, v are views of one fused row q | k | v (rt_attention_qkv_*) */
} RtCudaConfig;

/* Picks this rank's GPU (local rank modulo the visible devices), creates the stream and the
 * cuBLAS handle, compiles kernels.cu for the GPU's architecture (disk cache as rt_cuda_compile)
 * and loads it with cudaLibraryLoadData, allocates the runtime's scratch, and (bf16 build, unless
 * $MTC_ATTENTION=flash|simple) checks cuDNN and builds the attention's cuDNN plans. The GEMM math is
 * bf16 (CUBLAS_COMPUTE_32F_FAST_16BF), or as $MTC_GEMM says: fp32, tf32 or bf16.
 * $MTC_CUDA_SYNC=1 synchronizes after every op, so an error names the op that caused it.
 * Returns 0, or -1 with the reason in err (no GPU, no driver, a compile error). */
int rt_cuda_setup(const RtCudaConfig *cfg, int local_rank, char *err, size_t errlen);
void rt_cuda_teardown(void);
/* Bytes rt_cuda_setup allocates for cfg besides the CUDA context and the loaded kernels: returns
 * the device part (cuBLAS's workspace and the ops' scratch) and sets *host_bytes to the
 * pageable host part and *pinned_bytes to the pinned one (the readback buffer). Needs no GPU
 * (train --memory). */
size_t rt_cuda_scratch_bytes(const RtCudaConfig *cfg, size_t *host_bytes, size_t *pinned_bytes);
/* One line: device, architecture, GEMM math, kernel cache, versions. */
void rt_cuda_describe(char *buf, size_t n);
/* The name of this rank's GPU (cudaGetDeviceProperties' name, e.g. "NVIDIA GH200 480GB"), or "?"
 * when it cannot be read, into buf (n bytes): train --profile's "device". */
void rt_cuda_device_name(char *buf, size_t n);
/* Waits for the stream; an asynchronous error aborts the job naming `where`. */
void rt_cuda_sync(const char *where);
/* Prints "error: rank R: cuda: WHAT: MSG" and aborts the job (MPI_Abort when MPI is up). */
void rt_cuda_fail(const char *what, const char *msg);

/* Device memory: one allocation at start-up (NULL with err set when it does not fit), and
 * copies in stream order; bytes. */
void *rt_cuda_alloc(size_t bytes, char *err, size_t errlen);
void rt_cuda_free(void *p);
/* The host arena of activation offload: pinned (cudaMallocHost), once at start-up. */
void *rt_cuda_alloc_host(size_t bytes, char *err, size_t errlen);
void rt_cuda_free_host(void *p);
void rt_cuda_upload(void *dst, const void *src, size_t bytes);
void rt_cuda_download(void *dst, const void *src, size_t bytes);
/* Free and total device memory now (cudaMemGetInfo), bytes. */
void rt_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* The optimizer on the device (train_cuda.c): AdamW on the shard [lo, hi) of group g for every
 * tensor (decay where the tensor has it), as rt_adamw_shard; and Σ g² of n fp32 values. */
void rt_cu_adamw_shard(float *param, float *m, float *v, const float *grad, const RtTensor *t, int nt, int g, int64_t lo,
                       int64_t hi, float grad_scale, const RtAdamW *h);
double rt_cu_sum_squares(const float *g, size_t n);
/* n fp32 values of the state arena set to 0 by a kernel on the stream, in device memory or in the
 * pinned host memory of a state arena on the host (written over C2C): no host wait (train_cuda.c). */
void rt_cu_zero_state(float *x, size_t n);
/* The step's scalars in one copy down at its end instead of one each (train_cuda.c). With
 * rt_cu_defer_scalars(1), rt_lm_head_ce_forward returns 0 and keeps its loss on the side;
 * rt_cu_sum_squares_defer computes Σ g² of n fp32 values without reading it; rt_cu_step_scalars
 * waits once, adds the losses kept since the last call to *loss (each as rt_lm_head_ce_forward
 * would have returned it, summed in double in order) and returns the sums of squares (each
 * rounded to real, summed in real in order): the figures of reading each at once, bit for bit. */
void rt_cu_defer_scalars(int on);
void rt_cu_sum_squares_defer(const float *g, size_t n);
real rt_cu_step_scalars(double *loss);
/* Blocks the host until the stream's work so far is done (the one way the runtime waits for the
 * device: rt_cuda_sync, downloads): polls an event, and while it is not done every NCCL group's
 * asynchronous error and the age of the oldest collective still pending. An error, or a
 * collective pending more than $MTC_NCCL_TIMEOUT seconds (default 600) after the host issued it
 * (whenever the wait began: a collective issued long before, overlapped with compute, counts
 * from its issue, which includes the time the device took to reach it), aborts the job naming
 * that collective (op, values, group, ranks, where it was issued, its age), where the host waited
 * and why; with no collective pending, $MTC_NCCL_TIMEOUT seconds of the wait itself do (a kernel
 * that never ends). Checked only while the host waits (comm_nccl.c). */
void rt_cu_host_wait(const char *why);
/* rt_cu_host_wait in two halves: mark records where the stream is now (one mark at a time: a
 * new one replaces it); wait_mark blocks the host until the stream has done the work queued
 * before the mark (not what came after), watching the communicators as rt_cu_host_wait does. */
void rt_cu_host_mark(void);
void rt_cu_host_wait_mark(const char *why);
/* Muon on the device (muon_cuda.c). Newton-Schulz of a batch of same-shaped matrices, fp32
 * iterates with bf16 GEMM operands and fp32 accumulation (strided-batched GEMMs): out (batch ×
 * rows × cols, device, matrix i at i·rows·cols) = scale × the quintic iteration of
 * rt_newton_schulz (mtrt_optim.h) on each of g (the same layout; out may be g). Singular values
 * come out in about [0.7, 1.2] × scale. work: device, rt_cu_newton_schulz_work(batch, rows, cols)
 * values (X in fp32; its bf16 copy, A = X Xᵀ and B in bf16; the norms).
 * Asynchronous on the stream; a cuBLAS error aborts the job. */
void rt_cu_newton_schulz(float *out, const float *g, int batch, int rows, int cols, float scale, float *work);
size_t rt_cu_newton_schulz_work(int batch, int rows, int cols);
/* One Muon step of the ng groups gs of one communicator as rt_muon_groups (mtrt_train.h), with
 * the momentum, Newton-Schulz and update on the device: each group's param, mom, grad are this
 * rank's shard (S values; device memory, or a state arena in pinned host memory). Matrices
 * whole in this shard (a layer's experts under whole-expert shards) are orthogonalized in
 * batches of same-shaped neighbours, no communication; the others of all the groups go through
 * one rt_muon_exchange_start/finish (host MPI all-to-alls: the gather is started while the
 * last group's batches run), each owner orthogonalizing its matrices on its GPU. dwork: device
 * scratch of dwork_elems values (the arena's MUON_WORK): the largest S for a group's Nesterov
 * gradients, the rest for Newton-Schulz, whose batches are cut to fit it (at least one matrix
 * and, for a gathered one, the matrix besides; else the job aborts). The host waits twice when
 * a matrix moves: once for every moving group's Nesterov gradients (copied down as each is
 * computed), once for every owned matrix's update (their Newton-Schulz queued back to back).
 * hwork: host (pinned, so that those copies are asynchronous; pageable works) of
 * rt_cu_muon_host_work values; counts: rt_muon_counts_bytes(ranks) bytes. Collective over comm
 * when a matrix of the groups moves. */
void rt_cu_muon_groups(MPI_Comm comm, int ranks, RtMuonShard *gs, int ng, const RtTensor *t, int nt,
                       float grad_scale, const RtMuon *h, float *dwork, size_t dwork_elems, float *hwork, void *counts,
                       RtMuonStats *st);
/* The host scratch rt_cu_muon_groups uses for the ng groups gs over ranks ranks: the sum of the
 * S of the groups whose matrices move (their nests; gs[i].nest is set there) +
 * rt_muon_exchange_work values; 0 when no matrix moves (compiler/muon_work.c's exchange, the
 * program's MUON_HOST_ELEMS). */
size_t rt_cu_muon_host_work(const RtTensor *t, int nt, const RtMuonShard *gs, int ng, int ranks);
/* buf (count fp32 values on the device) = Σ over the group's ranks, in place (NCCL). */
void rt_cu_all_reduce(MPI_Comm comm, float *buf, size_t count);

/* NCCL communicators for the plan's groups (comm_nccl.c): a world communicator bootstrapped
 * over MPI (ncclUniqueId broadcast), then ncclCommSplit per group. After rt_cuda_setup.
 * Collectives are waited for on the device; the host's waits (rt_cu_host_wait) poll
 * ncclCommGetAsyncError, and an error or a collective pending $MTC_NCCL_TIMEOUT seconds (default
 * 600) after its issue aborts the job naming the rank, the pending collective, its group and
 * layer. Returns 0 or -1 (err). */
int rt_comm_nccl_init(const RtComm *c, char *err, size_t errlen);
void rt_comm_nccl_free(void);

/* The hierarchical all-to-all's cuda side (moe_hier.c), after rt_comm_nccl_init and rt_hier_init:
 * NCCL groups of h's node and cross communicators (collective over the world), and the device and
 * host tables of rt_hier_cuda_bytes. Returns 0 or -1 (err). rt_cu_hier_free: the tables, before
 * rt_hier_free (rt_comm_nccl_free frees the groups). */
int rt_cu_hier_init(RtHier *h, char *err, size_t errlen);
void rt_cu_hier_free(RtHier *h);

#endif
