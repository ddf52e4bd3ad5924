/* ops.c — the cuda backend's device runtime: set-up (GPU, stream, cuBLAS, the plan's kernels
 * through NVRTC), and the dense ops of mtrt_ops.h over device pointers (activations in `act`:
 * bf16, or fp32 in mtrt_cuda_f32act, as are the unsharded weight gradients; statistics fp32). The MoE
 * ops are in ops_moe.c. Semantics are the cpu ops': forward overwrites, backward adds. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn_graph.h>

#include "cu_internal.h"
#include "mtrt_ops.h"

CuState cu;

static const char *const kernel_names[K_COUNT] = {
    "embedding_forward", "embedding_backward", "rmsnorm_forward", "rmsnorm_backward", "rope",
    "swiglu_forward", "swiglu_backward", "gelu_forward", "gelu_backward", "accumulate", "fill",
    "residual_add", "attention_forward", "attention_backward_dq", "attention_backward_dkv", "adamw",
    "cast_bf16", "sum_squares", "cross_entropy_chunk",
    "cross_entropy_backward", "router_topk", "router_backward", "aux_loss_stats", "aux_loss_backward",
    "moe_gather", "moe_combine", "moe_combine_backward", "moe_gather_backward", "flash_attention_forward",
    "flash_attention_backward_prep", "flash_attention_backward_dq", "flash_attention_backward_dkv",
    "router_weights", "router_weights_backward", "qk_norm_forward", "qk_norm_backward", "rope_llama3",
    "sigmoid_gate_forward", "sigmoid_gate_backward", "router_topk_grouped",
    "rope_yarn", "position_forward", "colsum_add", "layernorm_forward", "layernorm_backward",
    "bias_forward", "accumulate_act_f32", "accumulate_f32", "muon_momentum", "muon_apply", "ns_inv_norm", "ns_prep",
    "ns_finish", "cast_act_f32", "round_bf16", "moe_count", "moe_positions", "moe_regroup",
    "rope_strided", "mla_kv_forward", "mla_kv_backward", "moe_load_add", "router_bias_update",
    "seq_aux_stats", "seq_aux_backward", "seq_aux_loss_sum", "moe_group_ptrs", "rope_span", "attention_span_forward",
    "attention_span_backward_dq", "attention_span_backward_dkv", "cp_reverse", "scale_f32", "swiglu_rows_forward",
    "swiglu_rows_backward", "add_rmsnorm_forward", "hier_rows", "hier_scalars_add", "moe_gate_rows"};

void rt_cuda_fail(const char *what, const char *msg) {
  int inited = 0, rank = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fprintf(stderr, "error: rank %d: cuda: %s: %s\n", rank, what, msg);
  fflush(stderr);
  if (inited) MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

void cu_check(cudaError_t e, const char *op) {
  if (e != cudaSuccess) rt_cuda_fail(op, cudaGetErrorString(e));
}

void cu_blas_check(cublasStatus_t s, const char *op) {
  if (s != CUBLAS_STATUS_SUCCESS) rt_cuda_fail(op, cublasGetStatusString(s));
}

void cu_launch(int k, unsigned grid, unsigned block, void **args) { cu_launch3(k, grid, 1, 1, block, args); }

void cu_launch3(int k, unsigned gx, unsigned gy, unsigned gz, unsigned block, void **args) {
  if (!gx || !gy || !gz) return;
  if (!cu.k[k]) { /* looked up on first use: a dense model's kernels.cu has no MoE kernels */
    char msg[160];
    snprintf(msg, sizeof msg, "kernel %s is not in the plan's kernels.cu (%s)", kernel_names[k],
             cudaGetErrorString(cudaLibraryGetKernel(&cu.k[k], cu.lib, kernel_names[k])));
    if (!cu.k[k]) rt_cuda_fail(kernel_names[k], msg);
  }
  dim3 g = {gx, gy, gz}, b = {block, 1, 1};
  CU_PROF_BEGIN();
  cu_check(cudaLaunchKernel((const void *)cu.k[k], g, b, args, 0, cu.stream), kernel_names[k]);
  if (cu.sync_each) cu_check(cudaStreamSynchronize(cu.stream), kernel_names[k]);
  CU_PROF_END(kernel_names[k]);
}

void cu_gemm(const char *op, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A,
             cudaDataType_t at, int lda, const void *B, cudaDataType_t bt, int ldb, float beta, void *C,
             cudaDataType_t ct, int ldc) {
  const float one = 1;
  if (!m || !n) return;
  cublasComputeType_t math = at == CUDA_R_16BF ? CUBLAS_COMPUTE_32F : cu.compute;
  CU_PROF_BEGIN();
  cu_prof_flops = 2.0 * m * n * k;
  cu_blas_check(cublasGemmEx(cu.blas, ta, tb, m, n, k, &one, A, at, lda, B, bt, ldb, &beta, C, ct, ldc, math,
                             CUBLAS_GEMM_DEFAULT),
                op);
  if (cu.sync_each) cu_check(cudaStreamSynchronize(cu.stream), op);
  CU_PROF_END(op);
}

/* The runtime's own buffers for cfg, bytes: on the device cuBLAS's workspace (cfg's, as the plan sizes
 * it; 64 MiB when 0; cuDNN's attention plans run in it too), attention's
 * delta (tokens × heads fp32) and, bf16 build, cuDNN's dQ accumulator (tokens × heads × head_dim fp32), cross-entropy's sums (2 × tokens + 1 fp32), one double, the grouped GEMMs'
 * pointer arrays (CU_GROUPED_SLOTS × 3 × experts), the MoE scratch (cu_moe_layout); on the host
 * (cu_host_scratch) the MoE scratch's mirror and CU_OFF_CACHE offsets arrays (experts + 1 ints
 * each), and pinned the readback buffer with the copy ring (cu_rb_layout). rt_cuda_setup allocates exactly these;
 * rt_cuda_scratch_bytes reports them. The plan's workspace.runtime item is the device part less
 * cuBLAS's workspace, bf16 build (compiler/placement.c plan_runtime_scratch): change both
 * together; its workspace.runtime_host item is the host part (plan_runtime_host_scratch, equal to
 * cu_host_scratch: tests/test_runtime_scratch.c). */
typedef struct {
  size_t delta, dqacc, ce, red, gptr, rl, moe, off, rb;
} Scratch;

static size_t workspace_bytes(const RtCudaConfig *cfg) {
  return cfg->cublas_workspace ? cfg->cublas_workspace : (size_t)64 << 20;
}

static Scratch scratch_of(const RtCudaConfig *cfg) {
  size_t T = (size_t)cfg->tokens, E = (size_t)(cfg->experts > 0 ? cfg->experts : 1);
  Scratch s = {sizeof(float) * T * (size_t)cfg->heads,
               MTRT_ACT_IS_BF16 ? sizeof(float) * T * (size_t)cfg->heads * (size_t)cfg->head_dim : 0,
               sizeof(float) * (2 * T + 1), sizeof(double),
               sizeof(void *) * CU_GROUPED_SLOTS * 3 * E, MTRT_ACT_IS_BF16 ? sizeof(act) * T * E : 0, 0, 0, 0};
  cu_host_scratch(E, &s.moe, &s.off, &s.rb); /* (s.moe: the device scratch's size too) */
  return s;
  return s;
}

size_t rt_cuda_scratch_bytes(const RtCudaConfig *cfg, size_t *host_bytes, size_t *pinned_bytes) {
  Scratch s = scratch_of(cfg);
  *host_bytes = s.moe + s.off, *pinned_bytes = s.rb;
  return workspace_bytes(cfg) + s.delta + s.dqacc + s.ce + s.red + s.gptr + s.rl + s.moe;
}

static int use_cudnn(void);
static CuAttnShape attn_shape_of(int B, int T, int nh, int nkv, int hd, int vd, int fused);

void *cu_attn_workspace(void) { return cu.workspace; }
size_t cu_attn_workspace_bytes(void) { return workspace_bytes(&cu.cfg); }

/* The expert GEMM loop's lanes (cu_internal.h): lane 0 the compute stream, the others non-blocking
 * streams; each lane a cuBLAS handle on its slice of cuBLAS's workspace (256-byte aligned), so no
 * device memory beyond the plan's. Returns nonzero on a failure. */
static int lanes_setup(const RtCudaConfig *cfg) {
  size_t part = workspace_bytes(cfg) / CU_LANES / 256 * 256;
  if (cudaEventCreateWithFlags(&cu.fork, cudaEventDisableTiming) != cudaSuccess) return 1;
  for (int l = 0; l < CU_LANES; l++) {
    if (l == 0) cu.lane[l] = cu.stream;
    else if (cudaStreamCreateWithFlags(&cu.lane[l], cudaStreamNonBlocking) != cudaSuccess) return 1;
    if (cudaEventCreateWithFlags(&cu.join[l], cudaEventDisableTiming) != cudaSuccess ||
        cublasCreate(&cu.lane_blas[l]) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(cu.lane_blas[l], cu.lane[l]) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(cu.lane_blas[l], (char *)cu.workspace + (size_t)l * part, part) != CUBLAS_STATUS_SUCCESS)
      return 1;
  }
  return 0;
}

static void lanes_teardown(void) {
  for (int l = 0; l < CU_LANES; l++) {
    if (cu.lane_blas[l]) cublasDestroy(cu.lane_blas[l]);
    if (l && cu.lane[l]) cudaStreamDestroy(cu.lane[l]);
    if (cu.join[l]) cudaEventDestroy(cu.join[l]);
  }
  if (cu.fork) cudaEventDestroy(cu.fork);
}

int rt_cuda_setup(const RtCudaConfig *cfg, int local_rank, char *err, size_t errlen) {
  memset(&cu, 0, sizeof cu);
  cu.cfg = *cfg;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0)
    return snprintf(err, errlen, "no usable GPU (%s); expected a machine with an NVIDIA GPU and its driver",
                    e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none"), -1;
  cu.device = local_rank % n;
  if ((e = cudaSetDevice(cu.device)) != cudaSuccess || (e = cudaStreamCreate(&cu.stream)) != cudaSuccess)
    return snprintf(err, errlen, "GPU %d: %s", cu.device, cudaGetErrorString(e)), -1;
  const char *gemm = getenv("MTC_GEMM") ? getenv("MTC_GEMM") : "bf16";
  if (strcmp(gemm, "bf16") == 0) cu.compute = CUBLAS_COMPUTE_32F_FAST_16BF;
  else if (strcmp(gemm, "tf32") == 0) cu.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  else if (strcmp(gemm, "fp32") == 0) cu.compute = CUBLAS_COMPUTE_32F;
  else return snprintf(err, errlen, "MTC_GEMM=%s; expected bf16, tf32 or fp32", gemm), -1;
  snprintf(cu.gemm_name, sizeof cu.gemm_name, "%s", gemm);
  cu.grouped_compute = cu.compute;
  cu.sync_each = getenv("MTC_CUDA_SYNC") && strcmp(getenv("MTC_CUDA_SYNC"), "1") == 0;
  cu_prof_init();
  /* cuBLAS's workspace from here, so that nothing allocates device memory after start-up */
  if (cublasCreate(&cu.blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(cu.blas, cu.stream) != CUBLAS_STATUS_SUCCESS ||
      cudaMalloc(&cu.workspace, workspace_bytes(cfg)) != cudaSuccess ||
      cublasSetWorkspace(cu.blas, cu.workspace, workspace_bytes(cfg)) != CUBLAS_STATUS_SUCCESS)
    return snprintf(err, errlen, "cuBLAS set-up failed on GPU %d", cu.device), -1;
  const char *ex = getenv("MTC_EXPERTS");
  if (ex && strcmp(ex, "loop") && strcmp(ex, "grouped") && strcmp(ex, "plan"))
    return snprintf(err, errlen, "MTC_EXPERTS=%s; expected loop, grouped or plan", ex), -1;
  cu.expert_path = !ex || !strcmp(ex, "plan") ? 0 : !strcmp(ex, "loop") ? 1 : 2;
  if (cfg->experts > 0 && lanes_setup(cfg))
    return snprintf(err, errlen, "cannot set up the expert GEMM streams on GPU %d", cu.device), -1;
  if (rt_cuda_arch(cu.arch, sizeof cu.arch) != 0) return snprintf(err, errlen, "cannot read GPU %d's architecture", cu.device), -1;
  void *cubin = NULL;
  size_t bytes = 0;
  int kernels = 0, cached = 0;
  static char log[1 << 16];
  /* the kernels' storage type is the runtime's act: bf16 (kernels.cu's default), or fp32 */
  static const char act_float[] = "#define ACT_FLOAT // mtrt_cuda_f32act: fp32 activations\n";
  size_t pre = MTRT_ACT_IS_BF16 ? 0 : sizeof act_float - 1, len = pre + cfg->kernels_len;
  char *src = malloc(len + 1);
  if (!src) return snprintf(err, errlen, "out of host memory"), -1;
  memcpy(src, act_float, pre), memcpy(src + pre, cfg->kernels_src, cfg->kernels_len), src[len] = 0;
  int bad = rt_cuda_compile(src, len, "kernels.cu", cu.arch, cfg->include_dir, NULL, &cubin, &bytes, &kernels, &cached,
                            log, sizeof log);
  free(src);
  if (bad) return snprintf(err, errlen, "kernels.cu does not compile for %s:\n%s", cu.arch, log), -1;
  e = cudaLibraryLoadData(&cu.lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
  free(cubin);
  if (e != cudaSuccess) return snprintf(err, errlen, "loading kernels.cu's CUBIN: %s", cudaGetErrorString(e)), -1;
  Scratch sc = scratch_of(cfg);
  if (cudaMalloc((void **)&cu.delta, sc.delta) != cudaSuccess || cudaMalloc((void **)&cu.ce, sc.ce) != cudaSuccess ||
      cudaMalloc((void **)&cu.red, sc.red) != cudaSuccess || cudaMalloc((void **)&cu.gptr, sc.gptr) != cudaSuccess ||
      (sc.rl && cudaMalloc(&cu.rl, sc.rl) != cudaSuccess) || cudaMalloc(&cu.moe, sc.moe) != cudaSuccess ||
      (sc.dqacc && cudaMalloc((void **)&cu.dqacc, sc.dqacc) != cudaSuccess))
    return snprintf(err, errlen, "cannot allocate the runtime's scratch on GPU %d", cu.device), -1;
  cu.moe_host = malloc(sc.moe), cu.off_host = malloc(sc.off);
  if (!cu.moe_host || !cu.off_host) return snprintf(err, errlen, "out of host memory"), -1;
  if (cudaMallocHost(&cu.rb, sc.rb) != cudaSuccess)
    return snprintf(err, errlen, "cannot allocate the runtime's pinned readback buffer"), -1;
  for (int k = 0; k < CU_RING_SLOTS; k++)
    if (cudaEventCreateWithFlags(&cu.ring_ev[k], cudaEventDisableTiming) != cudaSuccess)
      return snprintf(err, errlen, "cannot create the copy ring's events"), -1;
  cu.ready = 1;
  if (use_cudnn()) {
    if (cu_attn_cudnn_init(err, errlen)) return -1;
    if (cfg->head_dim > 0 && cfg->cp > 1) {
      cu_attn_span_prepare();
    } else if (cfg->head_dim > 0) {
      CuAttnShape a = attn_shape_of(cfg->batch, cfg->seq, cfg->heads, cfg->kv_heads, cfg->head_dim, cfg->v_head_dim,
                                    cfg->qkv_fused);
      cu_attn_cudnn_prepare(&a);
    }
  }
  return 0;
}

void rt_cuda_teardown(void) {
  if (!cu.ready) return;
  cudaStreamSynchronize(cu.stream);
  if (cu.flash == 2) cu_attn_cudnn_teardown();
  lanes_teardown(); /* before the workspace they run in is freed */
  cudaFree(cu.dqacc);
  cudaFree(cu.delta), cudaFree(cu.ce), cudaFree(cu.red), cudaFree(cu.gptr), cudaFree(cu.rl), cudaFree(cu.workspace);
  cudaFree(cu.moe), free(cu.moe_host), free(cu.off_host), cudaFreeHost(cu.rb);
  for (int k = 0; k < CU_RING_SLOTS; k++) cudaEventDestroy(cu.ring_ev[k]);
  cudaLibraryUnload(cu.lib);
  cublasDestroy(cu.blas);
  cudaStreamDestroy(cu.stream);
  memset(&cu, 0, sizeof cu);
}

void rt_cuda_describe(char *buf, size_t n) {
  struct cudaDeviceProp p;
  char v[400];
  rt_cuda_versions(v, sizeof v);
  if (cudaGetDeviceProperties(&p, cu.device) != cudaSuccess) snprintf(p.name, sizeof p.name, "?");
  snprintf(buf, n, "GPU %d: %s (%s, %.0f GiB), GEMM math %s with fp32 accumulation, %s activations, attention %s%s; %s",
           cu.device, p.name, cu.arch, (double)p.totalGlobalMem / (1u << 30), MTRT_ACT_IS_BF16 ? "bf16" : cu.gemm_name,
           MTRT_ACT_IS_BF16 ? "bf16" : "fp32", cu_attention_name(),
           cu.sync_each ? ", MTC_CUDA_SYNC" : "", v);
}

void rt_cuda_device_name(char *buf, size_t n) {
  struct cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, cu.device) != cudaSuccess) snprintf(p.name, sizeof p.name, "?");
  snprintf(buf, n, "%s", p.name);
}

void rt_cuda_sync(const char *where) { rt_cu_host_wait(where); }

void *rt_cuda_alloc(size_t bytes, char *err, size_t errlen) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    snprintf(err, errlen, "cannot allocate %.2f GiB on GPU %d (%.2f GiB free of %.2f): %s", (double)bytes / (1u << 30),
             cu.device, (double)fr / (1u << 30), (double)tot / (1u << 30), cudaGetErrorString(e));
    return NULL;
  }
  cu_check(cudaMemsetAsync(p, 0, bytes, cu.stream), "zeroing the arena");
  return p;
}

void rt_cuda_free(void *p) { cudaFree(p); }
/* Slot k of the copy ring. */
static char *ring_at(int k) { return (char *)cu.rb + cu_ring_at() + (size_t)k * CU_RING_SLOT; }

/* The next slot of the copy ring, once the copy that used it last is done: known from a host wait
 * of the whole stream since (ring_waited), else waited for on its event. */
static int ring_take(const char *why) {
  int k = cu.ring_next;
  cu.ring_next = (k + 1) % CU_RING_SLOTS;
  if (cu.ring_seq[k] > cu.ring_waited) cu_host_wait_event(cu.ring_ev[k], why);
  cu.ring_seq[k] = 0;
  return k;
}

/* Marks slot k in use by the copy just issued on the stream. */
static void ring_issued(int k, const char *why) {
  cu_check(cudaEventRecord(cu.ring_ev[k], cu.stream), why);
  cu.ring_seq[k] = ++cu.ring_issued;
}

void cu_ring_upload(void *dst, const void *src, size_t bytes) {
  for (size_t o = 0; o < bytes; o += CU_RING_SLOT) {
    size_t n = bytes - o < CU_RING_SLOT ? bytes - o : CU_RING_SLOT;
    int k = ring_take("upload");
    memcpy(ring_at(k), (const char *)src + o, n);
    cu_check(cudaMemcpyAsync((char *)dst + o, ring_at(k), n, cudaMemcpyHostToDevice, cu.stream), "upload");
    ring_issued(k, "upload");
  }
}

void cu_ring_download(void *dst, const void *src, size_t bytes) {
  size_t chunks = (bytes + CU_RING_SLOT - 1) / CU_RING_SLOT;
  int slot[CU_RING_SLOTS];
  for (size_t c = 0; c < chunks + CU_RING_SLOTS; c++) {
    if (c >= CU_RING_SLOTS && c - CU_RING_SLOTS < chunks) { /* chunk r is out of its slot once done */
      size_t r = c - CU_RING_SLOTS, o = r * CU_RING_SLOT, n = bytes - o < CU_RING_SLOT ? bytes - o : CU_RING_SLOT;
      int k = slot[r % CU_RING_SLOTS];
      cu_host_wait_event(cu.ring_ev[k], "download");
      memcpy((char *)dst + o, ring_at(k), n);
      cu.ring_seq[k] = 0;
    }
    if (c < chunks) {
      size_t o = c * CU_RING_SLOT, n = bytes - o < CU_RING_SLOT ? bytes - o : CU_RING_SLOT;
      int k = ring_take("download");
      cu_check(cudaMemcpyAsync(ring_at(k), (const char *)src + o, n, cudaMemcpyDeviceToHost, cu.stream), "download");
      ring_issued(k, "download");
      slot[c % CU_RING_SLOTS] = k;
    }
  }
}

void rt_cuda_upload(void *dst, const void *src, size_t bytes) { cu_ring_upload(dst, src, bytes); }
void rt_cuda_download(void *dst, const void *src, size_t bytes) {
  size_t loss, stage, room = cu_rb_layout((size_t)(cu.cfg.experts > 0 ? cu.cfg.experts : 1), &loss, &stage) - stage;
  if (bytes <= room) cu_download(dst, src, bytes);
  else cu_ring_download(dst, src, bytes);
}
void rt_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
  cu_check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

/* ---- dense ops (mtrt_ops.h) ---- */

static void need(int ok, const char *op, const char *what) {
  if (!ok) rt_cuda_fail(op, what);
}

/* Vector kernels: n / 4 threads of 16 bytes, plus one for a tail of n % 4 values. */
static unsigned vec_blocks(long n) { return cu_blocks(n / 4 + 1, 256); }

void rt_add(act *out, const act *a, const act *b, size_t n) {
  long ln = (long)n;
  if (ln) cu_launch(K_RESIDUAL_ADD, vec_blocks(ln), 256, (void *[]){&out, &a, &b, &ln});
}

void rt_accumulate(act *acc, const act *x, size_t n) {
  long ln = (long)n;
  if (ln) cu_launch(K_ACCUMULATE, vec_blocks(ln), 256, (void *[]){&acc, &x, &ln});
}

void rt_zero(act *x, size_t n) { cu_check(cudaMemsetAsync(x, 0, n * sizeof(act), cu.stream), "rt_zero"); }

void rt_copy(act *dst, const act *src, size_t n) {
  cu_check(cudaMemcpyAsync(dst, src, n * sizeof(act), cudaMemcpyDeviceToDevice, cu.stream), "rt_copy");
}

void rt_zero_real(real *x, size_t n) { cu_check(cudaMemsetAsync(x, 0, n * sizeof(real), cu.stream), "rt_zero_real"); }

void rt_copy_real(real *dst, const real *src, size_t n) {
  cu_check(cudaMemcpyAsync(dst, src, n * sizeof(real), cudaMemcpyDefault, cu.stream), "rt_copy_real");
}

/* The router's logits stay fp32: a GEMM of act operands with an fp32 result. Its backward casts
 * the logits' gradient to the activation type first (cuBLAS multiplies operands of one type):
 * the runtime's scratch cu.rl of tokens × experts; dw is added into the act gradient (fp32
 * accumulation, beta 1). */
void rt_router_logits_forward(real *logits, const act *x, const act *w, int N, int IC, int E) {
  cu_gemm("router forward", CUBLAS_OP_T, CUBLAS_OP_N, E, N, IC, w, CU_ACT, IC, x, CU_ACT, IC, 0, logits, CUDA_R_32F, E);
}

void rt_router_logits_backward(act *dx, act *dw, const real *dlogits, const act *x, const act *w, int N, int IC,
                               int E) {
  const void *d = dlogits;
  if (MTRT_ACT_IS_BF16) {
    if ((size_t)N * (size_t)E > (size_t)cu.cfg.tokens * (size_t)(cu.cfg.experts > 0 ? cu.cfg.experts : 1))
      rt_cuda_fail("router backward", "more tokens x experts than the runtime's scratch");
    void *out = cu.rl;
    long n = (long)N * E;
    cu_launch(K_CAST_BF16, cu_blocks(n, 256), 256, (void *[]){&out, &dlogits, &n});
    d = cu.rl;
  }
  if (dx) cu_gemm("router backward dx", CUBLAS_OP_N, CUBLAS_OP_N, IC, N, E, w, CU_ACT, IC, d, CU_ACT, E, 1, dx, CU_ACT, IC);
  if (dw) cu_gemm("router backward dw", CUBLAS_OP_N, CUBLAS_OP_T, IC, E, N, x, CU_ACT, IC, d, CU_ACT, E, 1, dw, CU_ACT, IC);
}

/* bf16: round to nearest even (cast_bf16); src may be pinned host memory the kernel reads */
void rt_cast_to_act(act *dst, const real *src, size_t n) {
  long ln = (long)n;
  if (MTRT_ACT_IS_BF16) {
    if (ln) cu_launch(K_CAST_BF16, cu_blocks(ln, 256), 256, (void *[]){&dst, &src, &ln});
  } else {
    cu_check(cudaMemcpyAsync(dst, src, n * sizeof(real), cudaMemcpyDefault, cu.stream), "rt_cast_to_act");
  }
}

/* The weight gradients of the norms, biases and positions: dw (cols) += Σ over rows of a term
 * (kernels.cu's colsum_add: mode 0 a, 1 a b s, 2 a (b − m) s), summed in fp32 over every row and
 * added once into the act gradient; a, b (rows, cols) act, s, m (rows) fp32. */
static void colsum_add(act *dw, const act *a, const act *b, const float *s, const float *m, long long rows, int cols,
                       int mode) {
  if (rows > 0 && cols > 0)
    cu_launch(K_COLSUM_ADD, cu_blocks(cols, 32), 256, (void *[]){&dw, &a, &b, &s, &m, &rows, &cols, &mode});
}

void rt_embedding_forward(act *out, const int32_t *tok, const act *wte, int N, int C) {
  cu_launch(K_EMBEDDING_FORWARD, (unsigned)N, 128, (void *[]){&out, &tok, &wte});
}

void rt_embedding_backward(act *dwte, const act *dout, const int32_t *tok, int N, int C) {
  cu_launch(K_EMBEDDING_BACKWARD, (unsigned)N, 128, (void *[]){&dwte, &dout, &tok});
}

/* T: kernels.cu's SEQ_LEN (a row's position is its index modulo SEQ_LEN). */
void rt_position_forward(act *x, const act *wpe, int B, int T, int C) {
  cu_launch(K_POSITION_FORWARD, (unsigned)(B * T), 128, (void *[]){&x, &wpe});
}

/* dwpe's first T rows += Σ over the B sequences of dx (B, T × C): a column sum in fp32. */
void rt_position_backward(act *dwpe, const act *dx, int B, int T, int C) {
  colsum_add(dwpe, dx, NULL, NULL, NULL, B, T * C, 0);
}

/* eps: kernels.cu's RMS_EPS (1e-5, as step.c's EPS) */
/* eps: kernels.cu's RMS_EPS, as rt_rmsnorm_forward's */
void rt_add_rmsnorm_forward(act *res, act *out, real *rstd, const act *x, const act *y, const act *w, int N, int C,
                            real eps) {
  cu_launch(K_ADD_RMSNORM_FORWARD, (unsigned)N, 128, (void *[]){&res, &out, &rstd, &x, &y, &w});
}

void rt_rmsnorm_forward(act *out, real *rstd, const act *x, const act *w, int N, int C, real eps) {
  cu_launch(K_RMSNORM_FORWARD, (unsigned)N, 128, (void *[]){&out, &rstd, &x, &w});
}

void rt_rmsnorm_backward(act *dx, act *dw, const act *dout, const act *x, const act *w, const real *rstd, int N,
                         int C) {
  need(dx && dw, "rt_rmsnorm_backward", "dx and dw are required on the cuda backend");
  cu_launch(K_RMSNORM_BACKWARD, cu_blocks(N, CU_RMS_BWD_ROWS), 128, (void *[]){&dx, &dout, &x, &w, &rstd});
  colsum_add(dw, dout, x, rstd, NULL, N, C, 1);
}

void rt_qk_norm_forward(act *out, real *rstd, const act *x, const act *w, int64_t rows, int width, real eps) {
  need(rows <= 0x7fffffff, "rt_qk_norm_forward", "more than 2^31 - 1 rows (one block each)");
  float e = eps;
  cu_launch(K_QK_NORM_FORWARD, (unsigned)rows, 128, (void *[]){&out, &rstd, &x, &w, &width, &e});
}

void rt_qk_norm_backward(act *dx, act *dw, const act *dout, const act *x, const act *w, const real *rstd,
                         int64_t rows, int width) {
  need(dx && dw, "rt_qk_norm_backward", "dx and dw are required on the cuda backend");
  long long n = rows;
  cu_launch(K_QK_NORM_BACKWARD, (unsigned)((rows + CU_QK_BWD_ROWS - 1) / CU_QK_BWD_ROWS), 128,
            (void *[]){&dx, &dout, &x, &w, &rstd, &n, &width});
  colsum_add(dw, dout, x, rstd, NULL, n, width, 1);
}

/* eps: kernels.cu's RMS_EPS; C: its HIDDEN. */
void rt_layernorm_forward(act *out, real *mean, real *rstd, const act *x, const act *w, const act *b, int N, int C,
                          real eps) {
  cu_launch(K_LAYERNORM_FORWARD, (unsigned)N, 128, (void *[]){&out, &mean, &rstd, &x, &w, &b});
}

void rt_layernorm_backward(act *dx, act *dw, act *db, const act *dout, const act *x, const act *w, const real *mean,
                           const real *rstd, int N, int C) {
  need(dx && dw, "rt_layernorm_backward", "dx and dw are required on the cuda backend");
  cu_launch(K_LAYERNORM_BACKWARD, cu_blocks(N, CU_RMS_BWD_ROWS), 128,
            (void *[]){&dx, &dout, &x, &w, &mean, &rstd});
  colsum_add(dw, dout, x, rstd, mean, N, C, 2);
  if (db) colsum_add(db, dout, NULL, NULL, NULL, N, C, 0);
}

void rt_bias_forward(act *out, const act *b, int N, int C) {
  long n = (long)N * C;
  if (n) cu_launch(K_BIAS_FORWARD, cu_blocks(n, 256), 256, (void *[]){&out, &b, &n, &C});
}

void rt_bias_backward(act *db, const act *dout, int N, int C) { colsum_add(db, dout, NULL, NULL, NULL, N, C, 0); }

/* Row-major out (N, OC) = x (N, IC) · wᵀ is column-major outᵀ = w · xᵀ, w read transposed; the
 * bias, if any, is added by bias_forward. */
void rt_matmul_forward(act *out, const act *x, const act *w, const act *bias, int N, int IC, int OC) {
  cu_gemm("matmul forward", CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, CU_ACT, IC, x, CU_ACT, IC, 0, out, CU_ACT, OC);
  if (bias) rt_bias_forward(out, bias, N, OC);
}

/* dx = dout · w + dx_beta dx (beta 0: written, its old bytes unread); dw, dbias added. */
static void matmul_backward(act *dx, act *dw, act *dbias, const act *dout, const act *x, const act *w, int N, int IC,
                            int OC, float dx_beta) {
  if (dbias) rt_bias_backward(dbias, dout, N, OC);
  if (dx)
    cu_gemm("matmul backward dx", CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, CU_ACT, IC, dout, CU_ACT, OC, dx_beta, dx,
            CU_ACT, IC);
  if (dw) cu_gemm("matmul backward dw", CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, x, CU_ACT, IC, dout, CU_ACT, OC, 1, dw, CU_ACT, IC);
}

void rt_matmul_backward(act *dx, act *dw, act *dbias, const act *dout, const act *x, const act *w, int N, int IC,
                        int OC) {
  matmul_backward(dx, dw, dbias, dout, x, w, N, IC, OC, 1);
}

void rt_matmul_backward_set(act *dx, act *dw, act *dbias, const act *dout, const act *x, const act *w, int N, int IC,
                            int OC) {
  matmul_backward(dx, dw, dbias, dout, x, w, N, IC, OC, 0);
}

/* ld: elements between tokens (H x HEAD_DIM when contiguous). */
static void rope(act *x, int B, int T, int H, int ld, float sign) {
  cu_launch(K_ROPE, (unsigned)(B * T), 128, (void *[]){&x, &H, &ld, &sign});
}
void rt_rope_forward(act *x, int B, int T, int H, int hd, real theta) { rope(x, B, T, H, H * hd, 1.f); }
void rt_rope_backward(act *dx, int B, int T, int H, int hd, real theta) { rope(dx, B, T, H, H * hd, -1.f); }
void rt_rope_qkv_forward(act *qkv, int B, int T, int nh, int nkv, int hd, real theta) {
  rope(qkv, B, T, nh + nkv, (nh + 2 * nkv) * hd, 1.f);
}
void rt_rope_qkv_backward(act *dqkv, int B, int T, int nh, int nkv, int hd, real theta) {
  rope(dqkv, B, T, nh + nkv, (nh + 2 * nkv) * hd, -1.f);
}

/* RoPE on rd channels of each head (MLA's rope part): kernels.cu's rope_strided (θ the plan's);
 * YaRN (factor > 1) with the ramp's ends as rope_yarn computes them, over rd. */
static void rope_strided(act *x, int B, int T, int H, int stride, int rd, real theta, real factor, real orig,
                         real beta_fast, real beta_slow, real attn, float sign) {
  double lo = 0, hi = 1;
  if (factor > 1) {
    lo = floor(rd * log(orig / (beta_fast * 6.283185307179586)) / (2 * log(theta)));
    hi = ceil(rd * log(orig / (beta_slow * 6.283185307179586)) / (2 * log(theta)));
    if (lo < 0) lo = 0;
    if (hi > rd - 1) hi = rd - 1;
    if (lo == hi) hi += 0.001;
  } else {
    factor = 1, attn = 1;
  }
  float f = factor, l = (float)lo, h = (float)hi, a = attn;
  cu_launch(K_ROPE_STRIDED, (unsigned)(B * T), 128, (void *[]){&x, &H, &stride, &rd, &sign, &f, &l, &h, &a});
}
void rt_rope_strided_forward(act *x, int B, int T, int H, int stride, int rd, real theta, real factor, real orig,
                             real beta_fast, real beta_slow, real attn) {
  rope_strided(x, B, T, H, stride, rd, theta, factor, orig, beta_fast, beta_slow, attn, 1.f);
}
void rt_rope_strided_backward(act *dx, int B, int T, int H, int stride, int rd, real theta, real factor, real orig,
                              real beta_fast, real beta_slow, real attn) {
  rope_strided(dx, B, T, H, stride, rd, theta, factor, orig, beta_fast, beta_slow, attn, -1.f);
}

/* MLA's keys and values: one thread per value of k, then of v. */
void rt_mla_kv_forward(act *k, act *v, const act *kvb, const act *kr, int64_t N, int nh, int nope, int rope, int vd,
                       real kscale) {
  long long n = N;
  float ks = kscale;
  cu_launch(K_MLA_KV_FORWARD, cu_blocks(n * nh * (nope + rope + vd), 128), 128,
            (void *[]){&k, &v, &kvb, &kr, &n, &nh, &nope, &rope, &vd, &ks});
}
/* The backward: one thread per value of dkvb, then per (token, rope channel) of dkr (summing the
 * heads). */
void rt_mla_kv_backward(act *dkvb, act *dkr, const act *dk, const act *dv, int64_t N, int nh, int nope, int rope,
                        int vd, real kscale) {
  long long n = N;
  float ks = kscale;
  cu_launch(K_MLA_KV_BACKWARD, cu_blocks(n * nh * (nope + vd) + n * rope, 128), 128,
            (void *[]){&dkvb, &dkr, &dk, &dv, &n, &nh, &nope, &rope, &vd, &ks});
}

/* RoPE with YaRN: the ramp's ends (pairs) as the cpu's yarn_inv_freq computes them, then
 * kernels.cu's rope_yarn (θ and head_dim are the plan's). */
static void rope_yarn(act *x, int B, int T, int H, int hd, real theta, real factor, real orig, real beta_fast,
                      real beta_slow, real attn, float sign) {
  double lo = floor(hd * log(orig / (beta_fast * 6.283185307179586)) / (2 * log(theta)));
  double hi = ceil(hd * log(orig / (beta_slow * 6.283185307179586)) / (2 * log(theta)));
  if (lo < 0) lo = 0;
  if (hi > hd - 1) hi = hd - 1;
  if (lo == hi) hi += 0.001;
  float f = factor, l = (float)lo, h = (float)hi, a = attn;
  cu_launch(K_ROPE_YARN, (unsigned)(B * T), 128, (void *[]){&x, &H, &sign, &f, &l, &h, &a});
}
void rt_rope_yarn_forward(act *x, int B, int T, int H, int hd, real theta, real factor, real orig, real beta_fast,
                          real beta_slow, real attn) {
  rope_yarn(x, B, T, H, hd, theta, factor, orig, beta_fast, beta_slow, attn, 1.f);
}
void rt_rope_yarn_backward(act *dx, int B, int T, int H, int hd, real theta, real factor, real orig, real beta_fast,
                           real beta_slow, real attn) {
  rope_yarn(dx, B, T, H, hd, theta, factor, orig, beta_fast, beta_slow, attn, -1.f);
}

/* RoPE with Llama 3.1's scaling: kernels.cu's rope_llama3 (θ and head_dim are the plan's). */
static void rope_llama3(act *x, int B, int T, int H, int hd, float sign, float factor, float low, float high,
                        float orig) {
  int ld = H * hd; /* contiguous heads */
  cu_launch(K_ROPE_LLAMA3, (unsigned)(B * T), 128, (void *[]){&x, &H, &ld, &sign, &factor, &low, &high, &orig});
}
void rt_rope_llama3_forward(act *x, int B, int T, int H, int hd, real theta, real factor, real low, real high,
                            real orig) {
  (void)theta;
  rope_llama3(x, B, T, H, hd, 1.f, factor, low, high, orig);
}
void rt_rope_llama3_backward(act *dx, int B, int T, int H, int hd, real theta, real factor, real low, real high,
                             real orig) {
  (void)theta;
  rope_llama3(dx, B, T, H, hd, -1.f, factor, low, high, orig);
}

/* Attention: cuDNN's fused flash attention (attn_cudnn.c) in the bf16 build where the plan says
 * (RtCudaConfig's attention_cudnn: the head dims cuDNN serves); else, or with
 * $MTC_ATTENTION=flash|simple, the tiled tensor-core kernels of kernels.cu (FlashAttention-2's
 * structure: 64 queries or keys per block of 4 warps, wmma bf16 with fp32 accumulation) where the
 * plan's shapes allow them (head_dim a multiple of 16 up to 128, seq_len a multiple of 64:
 * kernels.cu then defines them), else one warp per (token, head). */
static int attention_choice(void) {
  if (cu.flash == 0) {
    const char *env = getenv("MTC_ATTENTION");
    cudaKernel_t k = NULL;
    if (MTRT_ACT_IS_BF16 && cu.cfg.attention_cudnn && !(env && (strcmp(env, "flash") == 0 || strcmp(env, "simple") == 0)))
      return cu.flash = 2;
    int ok = !(env && strcmp(env, "simple") == 0) &&
             cudaLibraryGetKernel(&k, cu.lib, "flash_attention_forward") == cudaSuccess && k;
    cudaGetLastError(); /* a failed lookup is an answer, not an error */
    cu.flash = ok ? 1 : -1;
  }
  return cu.flash;
}
static int use_cudnn(void) { return attention_choice() == 2; }
int cu_attention_cudnn(void) { return use_cudnn(); }
static int use_flash(void) { return attention_choice() == 1; }
int cu_attention_flash(void) { return use_flash(); }

const char *cu_attention_name(void) {
  static char buf[1200];
  size_t v = cudnnGetVersion();
  if (use_cudnn())
    return snprintf(buf, sizeof buf, "cuDNN %zu.%zu.%zu (%s)", v / 10000, v / 100 % 100, v % 100, cu_attn_cudnn_report()), buf;
  if (cu.cfg.cp > 1)
    return use_flash() ? "span flash (tiled, tensor cores: context parallelism's chunks, ops_cp.c)"
                       : "span (warp per row: context parallelism's chunks, ops_cp.c)";
  return use_flash() ? "flash (tiled, tensor cores)" : "simple (warp per row)";
}

/* The program's contiguous q (B,T,nh,hd), k (B,T,nkv,hd), v (B,T,nkv,vd), out (B,T,nh,vd) as views. */
/* q, k, v at token strides qld, kld, vld (elements); out contiguous. */
static CuAttnShape attn_shape_ld(int B, int T, int nh, int nkv, int hd, int vd, int64_t qld, int64_t kld, int64_t vld) {
  CuAttnShape a;
  memset(&a, 0, sizeof a);
  a.b = B, a.hq = nh, a.hkv = nkv, a.sq = a.skv = T, a.dqk = hd, a.dv = vd;
  a.q = (CuAttnView){(int64_t)T * qld, hd, qld};
  a.k = (CuAttnView){(int64_t)T * kld, hd, kld};
  a.v = (CuAttnView){(int64_t)T * vld, vd, vld};
  a.o = (CuAttnView){(int64_t)T * nh * vd, vd, (int64_t)nh * vd};
  return a;
}

/* The attention's shape as the plan runs it: q, k, v contiguous, or views of one fused row
 * q | k | v (qkv_fused: rt_attention_qkv_*). */
static CuAttnShape attn_shape_of(int B, int T, int nh, int nkv, int hd, int vd, int fused) {
  int64_t w = (int64_t)nh * hd + (int64_t)nkv * (hd + vd);
  return fused ? attn_shape_ld(B, T, nh, nkv, hd, vd, w, w, w)
               : attn_shape_ld(B, T, nh, nkv, hd, vd, (int64_t)nh * hd, (int64_t)nkv * hd, (int64_t)nkv * vd);
}

static CuAttnShape attn_shape(int B, int T, int nh, int nkv, int hd, int vd) {
  return attn_shape_of(B, T, nh, nkv, hd, vd, 0);
}

/* hd, vd: kernels.cu's HEAD_DIM and V_DIM (the flash kernels exist only where they are equal);
 * q, k, v (and dq, dk, dv) at the token strides of shape a. */
static void attention_forward(const CuAttnShape *a, act *out, real *lse, const act *q, const act *k, const act *v) {
  int B = (int)a->b, T = (int)a->sq, nh = (int)a->hq;
  int qld = (int)a->q.token, kld = (int)a->k.token, vld = (int)a->v.token;
  if (use_cudnn()) {
    cu_attn_cudnn_forward(a, out, lse, q, k, v);
  } else if (use_flash()) {
    long long lo = 0, hi = T / 2; /* the plain causal layout of the span kernels (80-flash.cu) */
    cu_launch3(K_FLASH_FORWARD, (unsigned)(T / 64), (unsigned)nh, (unsigned)B, 128,
               (void *[]){&out, &lse, &q, &k, &v, &qld, &kld, &vld, &lo, &hi});
  } else {
    cu_launch(K_ATTENTION_FORWARD, cu_blocks((long long)B * T * nh * 32, 128), 128,
              (void *[]){&out, &lse, &q, &k, &v, &qld, &kld, &vld});
  }
}

static void attention_backward(const CuAttnShape *a, act *dq, act *dk, act *dv, const act *dout, const act *q,
                               const act *k, const act *v, const act *out, const real *lse) {
  int B = (int)a->b, T = (int)a->sq, nh = (int)a->hq, nkv = (int)a->hkv;
  int qld = (int)a->q.token, kld = (int)a->k.token, vld = (int)a->v.token;
  need(dq && dk && dv, "rt_attention_backward", "dq, dk and dv are required on the cuda backend");
  float *delta = cu.delta;
  if (use_cudnn()) {
    need((size_t)B * T * nh * a->dqk <= (size_t)cu.cfg.tokens * cu.cfg.heads * cu.cfg.head_dim, "rt_attention_backward",
         "the shape fits the runtime's dQ accumulator (RtCudaConfig's tokens, heads, head_dim)");
    cu_attn_cudnn_backward(a, dq, dk, dv, dout, q, k, v, out, lse, delta, cu.dqacc);
    return;
  }
  if (use_flash()) {
    long long lo = 0, hi = T / 2; /* the plain causal layout; dq, dk, dv written (add 0) */
    int add = 0;
    cu_launch(K_FLASH_BACKWARD_PREP, cu_blocks((long long)B * T * nh, 4), 128, (void *[]){&delta, &dout, &out});
    cu_launch3(K_FLASH_BACKWARD_DQ, (unsigned)(T / 64), (unsigned)nh, (unsigned)B, 128,
               (void *[]){&dq, &dout, &q, &k, &v, &lse, &delta, &qld, &kld, &vld, &lo, &hi, &add});
    cu_launch3(K_FLASH_BACKWARD_DKV, (unsigned)(T / 64), (unsigned)nkv, (unsigned)B, 128,
               (void *[]){&dk, &dv, &dout, &q, &k, &v, &lse, &delta, &qld, &kld, &vld, &lo, &hi, &add});
    return;
  }
  cu_launch(K_ATTENTION_BACKWARD_DQ, cu_blocks((long long)B * T * nh * 32, 128), 128,
            (void *[]){&dq, &delta, &dout, &q, &k, &v, &out, &lse, &qld, &kld, &vld});
  cu_launch(K_ATTENTION_BACKWARD_DKV, cu_blocks((long long)B * T * nkv * 32, 128), 128,
            (void *[]){&dk, &dv, &dout, &q, &k, &v, &lse, &delta, &qld, &kld, &vld});
}

void rt_attention_forward(act *out, real *lse, const act *q, const act *k, const act *v, int B, int T, int nh,
                          int nkv, int hd, int vd) {
  CuAttnShape a = attn_shape(B, T, nh, nkv, hd, vd);
  attention_forward(&a, out, lse, q, k, v);
}

void rt_attention_backward(act *dq, act *dk, act *dv, const act *dout, const act *q, const act *k, const act *v,
                           const act *out, const real *lse, int B, int T, int nh, int nkv, int hd, int vd) {
  CuAttnShape a = attn_shape(B, T, nh, nkv, hd, vd);
  attention_backward(&a, dq, dk, dv, dout, q, k, v, out, lse);
}

void rt_attention_qkv_forward(act *out, real *lse, const act *qkv, int B, int T, int nh, int nkv, int hd) {
  CuAttnShape a = attn_shape_of(B, T, nh, nkv, hd, hd, 1);
  const act *k = qkv + (size_t)nh * hd;
  attention_forward(&a, out, lse, qkv, k, k + (size_t)nkv * hd);
}

void rt_attention_qkv_backward(act *dqkv, const act *dout, const act *qkv, const act *out, const real *lse, int B,
                               int T, int nh, int nkv, int hd) {
  CuAttnShape a = attn_shape_of(B, T, nh, nkv, hd, hd, 1);
  size_t kq = (size_t)nh * hd, vq = kq + (size_t)nkv * hd;
  attention_backward(&a, dqkv, dqkv + kq, dqkv + vq, dout, qkv, qkv + kq, qkv + vq, out, lse);
}

/* The kernels take long n: ln is that type exactly (launch arguments go by pointer). */
_Static_assert(sizeof(long) == sizeof(int64_t), "the elementwise kernels' long n is 64-bit (LP64)");
void rt_swiglu_forward(act *h, const act *g, const act *u, int64_t n) {
  long ln = (long)n;
  if (ln) cu_launch(K_SWIGLU_FORWARD, vec_blocks(ln), 256, (void *[]){&h, &g, &u, &ln});
}

void rt_swiglu_backward(act *dg, act *du, const act *dh, const act *g, const act *u, int64_t n) {
  need(dg && du, "rt_swiglu_backward", "dg and du are required on the cuda backend");
  long ln = (long)n;
  if (ln) cu_launch(K_SWIGLU_BACKWARD, vec_blocks(ln), 256, (void *[]){&dg, &du, &dh, &g, &u, &ln});
}

void rt_swiglu_rows_forward(act *h, const act *gu, int64_t rows, int F) {
  long n = (long)(rows * F);
  if (n) cu_launch(K_SWIGLU_ROWS_FORWARD, cu_blocks(n, 256), 256, (void *[]){&h, &gu, &n, &F});
}

void rt_swiglu_rows_backward(act *dgu, const act *dh, const act *gu, int64_t rows, int F) {
  long n = (long)(rows * F);
  if (n) cu_launch(K_SWIGLU_ROWS_BACKWARD, cu_blocks(n, 256), 256, (void *[]){&dgu, &dh, &gu, &n, &F});
}

void rt_gelu_forward(act *h, const act *x, int64_t n) {
  long ln = (long)n;
  if (ln) cu_launch(K_GELU_FORWARD, cu_blocks(ln, 256), 256, (void *[]){&h, &x, &ln}); /* an expert round may be empty */
}

void rt_gelu_backward(act *dx, const act *dh, const act *x, int64_t n) {
  long ln = (long)n;
  if (ln) cu_launch(K_GELU_BACKWARD, cu_blocks(ln, 256), 256, (void *[]){&dx, &dh, &x, &ln});
}

/* Per chunk: cuBLAS logits, then the online log-sum-exp kernel; the loss is summed on the GPU
 * and read once: at once (one synchronization per micro-batch), or with the step's other scalars
 * at its end when the program defers them (rt_cu_defer_scalars). */
/* One vocabulary chunk's logits (N, cv) in fp32 = x (N, C) · w_chunkᵀ (act operands). */
static void logits_chunk(real *logits, const act *x, const act *w, int N, int C, int cv) {
  cu_gemm("lm head logits", CUBLAS_OP_T, CUBLAS_OP_N, cv, N, C, w, CU_ACT, C, x, CU_ACT, C, 0, logits, CUDA_R_32F, cv);
}

real rt_lm_head_ce_forward(real *lse, const act *x, const act *w, const int32_t *targets, int N, int C, int V,
                           int chunk, real *scratch) {
  float *sum = cu.ce, *tl = cu.ce + N, *loss = cu.ce + 2 * N;
  cu_check(cudaMemsetAsync(cu.ce, 0, sizeof(float) * (2 * (size_t)N + 1), cu.stream), "cross-entropy");
  for (int v0 = 0; v0 < V; v0 += chunk) { /* the first chunk starts lse and the sums, the last ends them */
    int cv = V - v0 < chunk ? V - v0 : chunk;
    logits_chunk(scratch, x, w + (size_t)v0 * C, N, C, cv);
    cu_launch(K_CROSS_ENTROPY_CHUNK, (unsigned)N, 256, (void *[]){&lse, &sum, &tl, &loss, &scratch, &targets, &v0, &cv});
  }
  if (cu.defer) { /* read at the step's end (rt_cu_step_scalars) */
    cu_defer_loss(loss, N);
    return 0;
  }
  float total = 0;
  rt_cuda_download(&total, loss, sizeof total);
  return total / (real)N;
}

void rt_lm_head_ce_backward(act *dx, act *dw, const act *x, const act *w, const int32_t *targets, const real *lse,
                            int N, int C, int V, int chunk, real *scratch, real dloss) {
  float scale = dloss / (float)N;
  /* the chunk's logit gradient, in the activation type, beside its logits (not in place) */
  act *dlogits = (act *)(scratch + (size_t)N * (size_t)chunk);
  for (int v0 = 0; v0 < V; v0 += chunk) {
    int cv = V - v0 < chunk ? V - v0 : chunk;
    logits_chunk(scratch, x, w + (size_t)v0 * C, N, C, cv);
    cu_launch(K_CROSS_ENTROPY_BACKWARD, (unsigned)N, 256, (void *[]){&dlogits, &scratch, &lse, &targets, &v0, &cv, &scale});
    rt_matmul_backward(dx, dw ? dw + (size_t)v0 * C : NULL, NULL, dlogits, x, w + (size_t)v0 * C, N, C, cv);
  }
}
