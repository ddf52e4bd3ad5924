/* ==== templates/train/10-memory.c: what this build allocates (train --memory), Muon's groups ==== */

/* ---- memory: what this build allocates per GPU (rank 0) at start-up ----
 * hbm: the device arena and the state arena when the plan keeps the state in HBM (on the cpu
 * backend, the memory that stands in for them) and the runtime's device buffers (cuBLAS's
 * workspace, the ops' scratch); host: everything else the program allocates at start-up, pinned
 * (the host arena: the activation-offload boundaries, the state arena when the plan keeps it on
 * the host and Muon's host scratch, each at its plan item's offset; the cuda runtime's readback
 * buffer) and pageable
 * (the cuda build's mirror of a state arena on the GPU, its token buffer, the runtime's host
 * scratch, count arrays). Not in
 * it: the CUDA context, NCCL's buffers, MPI's and the libraries' own memory, and the data file
 * (mapped read-only, never copied) — the plan's reserve items stand for the first two. */
typedef struct {
  int64_t hbm, host, pinned;
} Footprint;

#ifdef MTC_BACKEND_CUDA
extern const char kernels_cu[];
extern const unsigned long kernels_cu_len;
static RtCudaConfig cuda_config(void) {
  return (RtCudaConfig){kernels_cu, kernels_cu_len, MTRT_CUDA_INCLUDE, TOKENS, HEADS, EXPERTS, TOP_K,
                        PLAN_CUBLAS_WORKSPACE_BYTES, MICRO_BATCH, SEQ_LEN, KV_HEADS, HEAD_DIM, V_HEAD_DIM,
                        ATTENTION_CUDNN, EXPERT_LOOP_ROWS, PLAN_CP, 0, QKV_FUSED};
}
#endif

#ifdef MUON_WORK
/* Whether group g has a Muon matrix. */
static int muon_in(int g) {
  for (int i = 0; i < N_TENSORS; i++)
    if (step_tensors[i].group == g && step_tensors[i].muon) return 1;
  return 0;
}

/* The Muon groups of the FSDP communicator (dense: one exchange for all of them per step) in
 * list (group ids, *n of them), and their shards' sum; with gs, their shards of this step. */
static int64_t muon_dense(int *list, int *n) {
  int64_t sum = 0;
  *n = 0;
  for (int g = 0; g < N_GROUPS; g++)
    if (step_groups[g].comm == RT_GROUP_FSDP && muon_in(g)) list[(*n)++] = g, sum += step_groups[g].shard;
  return sum;
}
#endif

#ifdef MUON_WORK
/* One Muon step of the n groups gs of comm (ranks ranks) at learning rate lr: on the GPU
 * (Newton-Schulz in cuBLAS batches, the device scratch MUON_WORK, host the exchange's scratch)
 * or, when the plan puts the step there or on the cpu backend, on the host (work). */
static void muon_step(MPI_Comm comm, int ranks, RtMuonShard *gs, int n, float scale, float lr, real *work, real *host,
                      void *counts) {
  RtMuon muon = {lr, (float)WEIGHT_DECAY, 0.95f};
#ifdef MTC_BACKEND_CUDA
  if (!OPT_ON_HOST) {
    rt_cu_muon_groups(comm, ranks, gs, n, step_tensors, N_TENSORS, scale, &muon, work, (size_t)MUON_WORK_ELEMS, host,
                      counts, NULL);
    return;
  }
#endif
  (void)host;
  rt_muon_groups(comm, ranks, gs, n, step_tensors, N_TENSORS, scale, &muon, work, counts, NULL);
}
#endif

#if defined(MTC_BACKEND_CUDA) && defined(MUON_WORK)
/* Muon on the GPU: the host scratch of rt_cu_muon_groups' exchange (the Nesterov gradients of
 * the moving groups of one call, the dense groups' together or one expert group's, then the
 * pieces sent and received: rt_cu_muon_host_work, as compiler/muon_work.c's exchange sizes it;
 * no assembled matrix, Newton-Schulz runs on the device) */
static int64_t muon_host_elems(void) { return OPT_ON_HOST ? 0 : (int64_t)MUON_HOST_ELEMS; }
#endif

static Footprint footprint(void) {
  const int64_t R = (int64_t)sizeof(real), state = (int64_t)STATE_ELEMS * R;
  const int64_t acts = (int64_t)ACT_ELEMS * (int64_t)sizeof(act);
  Footprint f = {acts + (STATE_ON_HOST ? 0 : state), 0, (int64_t)HOST_ELEMS * (int64_t)sizeof(act)}; /* (the host
                 arena holds the state when on the host, and Muon's host scratch) */
  f.host = f.pinned + (int64_t)rt_muon_counts_bytes(PLAN_FSDP) /* Muon's counts */
           + 2 * TOKENS * (int64_t)sizeof(int32_t) /* the loader's tokens */
           + (PLAN_EP > 1 ? (int64_t)rt_a2a_bytes(PLAN_EP, EXPERTS_PER_RANK) : 0)
           + (MOE_HIER_G > 0 ? (int64_t)rt_hier_bytes(PLAN_EP, MOE_HIER_G, TOKENS, TOP_K, MOE_CAP_ROWS,
                                                            MOE_HIER_ST) : 0);
#ifdef MTC_BACKEND_CUDA
  RtCudaConfig cfg = cuda_config();
  size_t scratch_host = 0, scratch_pinned = 0;
  f.hbm += (int64_t)rt_cuda_scratch_bytes(&cfg, &scratch_host, &scratch_pinned);
  if (MOE_HIER_G > 0) { /* the hierarchical all-to-all's device tables and their host side */
    size_t hier_host = 0;
    f.hbm += (int64_t)rt_hier_cuda_bytes(PLAN_EP, MOE_HIER_G, TOKENS, TOP_K, MOE_CAP_ROWS, MOE_HIER_ST, &hier_host);
    f.host += (int64_t)hier_host;
  }
  f.pinned += (int64_t)scratch_pinned;
  f.host += (int64_t)(scratch_host + scratch_pinned) + (STATE_ON_HOST ? 0 : state);
#endif
  return f;
}

/* train --memory: the footprint as one JSON object; no GPU, no MPI launch needed. */
static int print_memory(int argc) {
  if (argc != 2) {
    fprintf(stderr, "error: --memory takes no other argument\n");
    return 2;
  }
  Footprint f = footprint();
  printf("{\"hbm\": %lld, \"host\": %lld, \"host_pinned\": %lld}\n", (long long)f.hbm, (long long)f.host,
         (long long)f.pinned);
  return 0;
}

