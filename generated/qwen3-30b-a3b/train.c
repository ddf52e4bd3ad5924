/* train.c — the training program mtc writes next to its step code; do not edit here: regenerate with `mtc compile`.
 * (mtc's templates/train/NN-*.c in name order, each part after the first opening with a ==== line;
 * output.c knows a program file of mtc's by the "regenerate with" phrase above, on one line.)
 *
 *   train --data PATH [--steps N] [--metrics PATH] [--seed S]     (N: stop after step N; the
 *         learning-rate schedule always spans the spec's training.steps)
 *         [--checkpoint-dir DIR [--checkpoint-every K] [--keep-checkpoints N]] [--max-skips K]
 *         [--progress-every N] [--profile FILE]
 *         [--inject-nan FIRST:COUNT] [--inject-kill-at-save STEP]       (fault injection, for tests)
 *   train --data PATH --grad-check          (one rank, built with -DMTC_REAL=double)
 *   train --check-kernels [--arch sm_90a]   (cuda build: compile kernels.cu with NVRTC, exit)
 *   train --memory                          (bytes this build allocates per GPU at start-up, JSON)
 * The cuda build runs the same step.c with its arena on the GPU (one cudaMalloc at start-up) and
 * its state arena (master shards, gradients, moments) where the plan keeps the optimizer state:
 * in pinned host memory that the GPU reads and writes over C2C (the host reads it directly for
 * initialization and checkpoints), or on the GPU with a host mirror for those. The optimizer
 * step runs where the plan says (Muon too: its Newton-Schulz on the GPU, cuBLAS batched GEMMs).
 * With --checkpoint-dir, a run resumes from the newest complete checkpoint there and saves
 * every K steps and at the end; --steps counts from the start of training. A step whose loss
 * or gradient norm is not finite is skipped (no update); K consecutive skips (default 5) save
 * the last good state and stop. SIGUSR1 (what launch.sbatch has Slurm send before the job's
 * time limit), SIGTERM or SIGINT (Ctrl-C) stops the run at the end of the step, with a checkpoint saved;
 * one before the first step stops it there, the checkpoint directory as it was. At start-up the
 * program checks that the plan.json of its directory (DIR of DIR/build/train) is the plan it was
 * compiled from (step.h's PLAN_HASH).
 *
 * It runs the plan in step.h: two arenas allocated at start-up, parameters initialized shard by
 * shard, then per optimizer step ACCUM micro-batches of forward and backward (step.c), the
 * gradients' global norm and clipping, AdamW on this rank's shards, and one line of metrics
 * (rank 0 prints it with the step's time and MFU, and appends it to the metrics file as JSON with
 * the time, step seconds, tokens per second and run id, written whole at once; a write error stops
 * the run with exit 1, and a resumed run first drops the lines past its checkpoint). Every
 * --progress-every steps and at the end, rank 0 prints the elapsed time and the ETA. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mtrt_ckpt.h"
#include "mtrt_data.h"
#include "mtrt_ops.h"
#include "mtrt_profile.h"
#include "step.h"

#ifndef MOE_HIER_G /* step.h defines them with the hierarchical all-to-all: EP ranks per node, staging rows */
#define MOE_HIER_G 0
#define MOE_HIER_ST 1
#endif

/* Where the host reads and writes the training state (HOST): the state arena itself when the
 * host can read it (the cpu backend; the cuda backend when the plan keeps the state in host
 * memory), else a host mirror of it, copied to (to_device) and from (to_host) the GPU. to_host
 * also waits for the GPU's writes to a state arena in host memory. The optimizer and the gradient
 * norm run where the state is, unless OPT_ON_HOST. */
#ifdef MTC_BACKEND_CUDA
#include "mtrt_cuda.h"
static real *state_mirror;   /* STATE_ELEMS, when the state arena is on the GPU */
static int32_t *host_tokens; /* a micro-batch's inputs and targets (2 x TOKENS), uploaded */
#define HOST(c) (STATE_ON_HOST ? (c)->state : state_mirror)
static void to_device(RtCtx *c, int64_t off, int64_t n) {
  if (!STATE_ON_HOST) rt_cuda_upload(c->state + off, state_mirror + off, (size_t)n * sizeof(real));
}
static void to_host(RtCtx *c, int64_t off, int64_t n) {
  if (STATE_ON_HOST) rt_cuda_sync("reading the state arena on the host");
  else rt_cuda_download(state_mirror + off, c->state + off, (size_t)n * sizeof(real));
}
#define TOKENS_HOST(c) host_tokens
static void tokens_to_device(RtCtx *c) {
  rt_cuda_upload(c->acts + INPUTS, host_tokens, TOKENS * sizeof(int32_t));
  rt_cuda_upload(c->acts + TARGETS, host_tokens + TOKENS, TOKENS * sizeof(int32_t));
}
#define ADAMW_SHARD rt_cu_adamw_shard
#define GRAD_ALL_REDUCE rt_cu_all_reduce
/* The optimizer step on the host (Grace, on GH200) only where the plan puts it there: with the
 * state on the GPU, gradients come down and master weights go up. Muon's Newton-Schulz runs
 * where the step runs (rt_cu_muon_groups on the GPU). */
#define OPT_ON_HOST OPT_STEP_ON_HOST
#else
#define OPT_ON_HOST 0
#define HOST(c) ((c)->state)
static void to_device(RtCtx *c, int64_t off, int64_t n) { (void)c, (void)off, (void)n; }
static void to_host(RtCtx *c, int64_t off, int64_t n) { (void)c, (void)off, (void)n; }
#define TOKENS_HOST(c) host_tokens
static int32_t host_tokens[2 * TOKENS]; /* the loader's batch, copied into INPUTS and TARGETS */
static void tokens_to_device(RtCtx *c) {
  memcpy(c->acts + INPUTS, host_tokens, TOKENS * sizeof(int32_t));
  memcpy(c->acts + TARGETS, host_tokens + TOKENS, TOKENS * sizeof(int32_t));
}
#define ADAMW_SHARD rt_adamw_shard
#define SUM_SQUARES rt_sum_squares
#define GRAD_ALL_REDUCE rt_comm_all_reduce
#endif

/* The groups from g on whose gradient shards lie one after another in the state arena (the
 * layout places them so): their count, and their values in *len. One launch or call covers them. */
static int grad_run(int g, size_t *len) {
  int n = 1;
  *len = (size_t)step_groups[g].shard;
  while (g + n < N_GROUPS && step_groups[g + n].grad == step_groups[g].grad + (int64_t)*len)
    *len += (size_t)step_groups[g + n++].shard;
  return n;
}

/* Zeroes every group's gradient shard (a new step), a run of adjacent shards at a time. On the
 * cuda backend a kernel on the stream (the state arena on the GPU, or in pinned host memory
 * written over C2C): the host does not wait. */
static void zero_grads(RtCtx *c) {
  for (int g = 0, n; g < N_GROUPS; g += n) {
    size_t len;
    n = grad_run(g, &len);
#ifdef MTC_BACKEND_CUDA
    rt_cu_zero_state(c->state + step_groups[g].grad, len);
#else
    rt_zero_real(c->state + step_groups[g].grad, len);
#endif
  }
}

/* The all-gathers read each group's master shard cast to the activation type (RtGroup.param):
 * refreshed after every change of the master (initialization, resume, optimizer step), one cast
 * per run of groups whose masters and casts both lie one after another. A group with param -1
 * (the master in HBM) is cast by step.c before each of its gathers. */
static void refresh_params(RtCtx *c) {
  for (int g = 0, n; g < N_GROUPS; g += n) {
    size_t len = (size_t)step_groups[g].shard;
    for (n = 1; step_groups[g].param >= 0 && g + n < N_GROUPS &&
                step_groups[g + n].param == step_groups[g].param + (int64_t)len &&
                step_groups[g + n].master == step_groups[g].master + (int64_t)len;
         n++)
      len += (size_t)step_groups[g + n].shard;
    if (step_groups[g].param >= 0) rt_cast_to_act(c->acts + step_groups[g].param, c->state + step_groups[g].master, len);
  }
}

/* The gradient shards summed over the data-parallel replicas. NCCL reads device memory: a state
 * arena in host memory goes through STATE_STAGING (GRAD0, free between steps), in pieces of as
 * many real values as its bytes hold. */
static void grads_all_reduce(RtCtx *c) {
  for (int g = 0; g < N_GROUPS; g++) {
    real *grad = c->state + step_groups[g].grad;
    size_t n = (size_t)step_groups[g].shard;
#ifdef MTC_BACKEND_CUDA
    if (STATE_ON_HOST) {
      real *st = (real *)(void *)(c->acts + STATE_STAGING);
      size_t cap = (size_t)STATE_STAGING_ELEMS * sizeof(act) / sizeof(real);
      for (size_t o = 0; o < n; o += cap) {
        size_t k = n - o < cap ? n - o : cap;
        rt_copy_real(st, grad + o, k), GRAD_ALL_REDUCE(c->comm.replicate_comm, st, k), rt_copy_real(grad + o, st, k);
      }
      continue;
    }
#endif
    GRAD_ALL_REDUCE(c->comm.replicate_comm, grad, n);
  }
}

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

/* ==== templates/train/20-args.c: the command line ==== */

typedef struct {
  const char *data, *metrics, *ckpt_dir, *profile;
  long steps, ckpt_every, max_skips, keep_ckpts; /* keep_ckpts: 0 keeps every checkpoint */
  long progress_every;                           /* the elapsed/ETA line every this many steps */
  unsigned long long seed;
  int seed_given, grad_check;
  long nan_first, nan_count, kill_at_save; /* fault injection for tests: --inject-nan, --inject-kill-at-save */
} Args;

/* Every option of parse_args and main is here (tests/train/errors.sh checks both ways). */
static const char usage_text[] =
    "usage: train --data PATH [--steps N] [--metrics PATH] [--seed S] [--checkpoint-dir DIR]\n"
    "             [--checkpoint-every K] [--keep-checkpoints N] [--max-skips K] [--progress-every N]\n"
    "             [--profile FILE] [--grad-check]\n"
    "       train --memory | --check-kernels [--arch ARCH] | --help\n"
    "  --data PATH            raw text (one token per byte), an llm.c token shard, or a Megatron\n"
    "                         indexed dataset (PREFIX, PREFIX.idx or PREFIX.bin)\n"
    "  --steps N              stop after optimizer step N (default: the spec's training.steps,\n"
    "                         which the learning-rate schedule always spans)\n"
    "  --metrics PATH         JSON lines appended per step (default metrics.jsonl): step, loss,\n"
    "                         aux_loss, lr, grad_norm, [moe_load, moe_extra_rounds, skipped], time\n"
    "                         (seconds since the epoch), step_seconds, tokens_per_second and run (the\n"
    "                         run id, which a resume keeps); a new run empties the file, a resume\n"
    "                         first drops the lines past its checkpoint's step (and empties a file\n"
    "                         that then does not end at that step of this run: another run's)\n"
    "  --seed S               initialization and data order (default 1; a resume keeps the\n"
    "                         checkpoint's)\n"
    "  --checkpoint-dir DIR   resume from the newest complete checkpoint there; save at the end\n"
    "  --checkpoint-every K   and every K steps\n"
    "  --keep-checkpoints N   remove all but the newest N complete checkpoints after each save\n"
    "                         (default: keep all)\n"
    "  --max-skips K          stop after K consecutive non-finite steps (default 5)\n"
    "  --progress-every N     the elapsed time and ETA every N steps and at the end (default 10)\n"
    "  --profile FILE         measured seconds and FLOPs or bytes per op class and collective\n"
    "                         over the steps after the first, as JSON (mtc calibrate reads it)\n"
    "  --grad-check           gradients against finite differences (double build, one rank)\n"
    "  --inject-nan FIRST:COUNT      for tests: steps FIRST.. FIRST+COUNT-1 get a NaN gradient\n"
    "  --inject-kill-at-save STEP    for tests: SIGKILL itself in the save of STEP, before its manifest\n"
    "  --memory               what this build allocates per GPU at start-up, as JSON\n"
    "                         {\"hbm\": B, \"host\": B, \"host_pinned\": B}; no GPU or mpirun needed\n"
    "  --check-kernels        cuda build: compile kernels.cu with NVRTC and exit (no GPU needed)\n"
    "  --arch ARCH            with --check-kernels: the target (default sm_90a)\n"
    "  --help, -h             this text\n"
    "  SIGUSR1, SIGTERM, SIGINT, SIGHUP  save a checkpoint at the end of the step (with DIR)\n"
    "                         and stop; before the first step, stop with DIR as it was; SIGPIPE\n"
    "                         is ignored (a closed stdout pipe stops nothing)\n"
    "  Each step prints its loss, time, tokens/s and MFU (the plan's FLOPs per token over the\n"
    "  peak of the spec's GPU; on the cpu backend only where the spec's ranks are cpu cores).\n";

static int quiet; /* not rank 0 */

static int usage(const char *msg) {
  if (!quiet) fprintf(stderr, "error: %s\n%s", msg, usage_text);
  return 2;
}

static int parse_args(Args *a, int argc, char **argv) {
  static const struct option opts[] = {{"data", required_argument, 0, 'd'},    {"steps", required_argument, 0, 's'},
                                       {"metrics", required_argument, 0, 'm'}, {"seed", required_argument, 0, 'r'},
                                       {"grad-check", no_argument, 0, 'g'},
                                       {"checkpoint-dir", required_argument, 0, 'c'},
                                       {"checkpoint-every", required_argument, 0, 'e'},
                                       {"max-skips", required_argument, 0, 'k'},
                                       {"keep-checkpoints", required_argument, 0, 'N'},
                                       {"inject-nan", required_argument, 0, 'n'},
                                       {"inject-kill-at-save", required_argument, 0, 'K'},
                                       {"profile", required_argument, 0, 'P'},
                                       {"progress-every", required_argument, 0, 'p'},
                                       {0, 0, 0, 0}};
  *a = (Args){.metrics = "metrics.jsonl", .steps = TRAIN_STEPS, .seed = 1, .max_skips = 5, .progress_every = 10};
  int o;
  char *end;
  char msg[300];
  opterr = 0;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      if (!quiet) fputs(usage_text, stdout);
      return -1;
    }
  while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    switch (o) {
    case 'd': a->data = optarg; break;
    case 'm': a->metrics = optarg; break;
    case 'P': a->profile = optarg; break;
    case 'g': a->grad_check = 1; break;
    case 's':
      errno = 0;
      a->steps = strtol(optarg, &end, 10);
      if (*end || !*optarg || a->steps < 1) return usage("--steps expects a positive integer");
      if (errno == ERANGE) return usage("--steps is too large (it must fit a signed 64-bit integer)");
      break;
    case 'r':
      errno = 0;
      a->seed = strtoull(optarg, &end, 10);
      if (*end || !*optarg || *optarg == '-') return usage("--seed expects a non-negative integer");
      if (errno == ERANGE) return usage("--seed is too large (at most 18446744073709551615)");
      a->seed_given = 1;
      break;
    case 'c': a->ckpt_dir = optarg; break;
    case 'e':
    case 'k':
    case 'N':
    case 'p':
    case 'K': {
      errno = 0;
      long v = strtol(optarg, &end, 10);
      const char *name = o == 'e' ? "--checkpoint-every" : o == 'k' ? "--max-skips" : o == 'N' ? "--keep-checkpoints"
                         : o == 'p' ? "--progress-every" : "--inject-kill-at-save";
      snprintf(msg, sizeof msg, "%s expects a positive integer, not '%s'", name, optarg);
      if (*end || !*optarg || v < 1 || errno == ERANGE || (o == 'N' && v > 1000000)) return usage(msg);
      *(o == 'e' ? &a->ckpt_every : o == 'k' ? &a->max_skips : o == 'N' ? &a->keep_ckpts
        : o == 'p' ? &a->progress_every : &a->kill_at_save) = v;
      break;
    }
    case 'n':
      if (sscanf(optarg, "%ld:%ld", &a->nan_first, &a->nan_count) != 2 || a->nan_first < 1 || a->nan_count < 1)
        return usage("--inject-nan expects FIRST:COUNT (steps whose gradients become NaN, for tests)");
      break;
    case ':':
      snprintf(msg, sizeof msg, "option '%s' needs a value", argv[optind - 1]);
      return usage(msg);
    default:
      snprintf(msg, sizeof msg, "unknown option '%s'", argv[optind - 1]);
      return usage(msg);
    }
  }
  if (optind < argc) {
    snprintf(msg, sizeof msg, "unexpected argument '%s'", argv[optind]);
    return usage(msg);
  }
  if (!a->data) return usage("--data PATH is required (raw text bytes, an llm.c token shard or a Megatron PREFIX)");
  if (a->ckpt_every && !a->ckpt_dir) return usage("--checkpoint-every needs --checkpoint-dir DIR");
  if (a->keep_ckpts && !a->ckpt_dir) return usage("--keep-checkpoints needs --checkpoint-dir DIR");
  return 0;
}

/* ==== templates/train/30-step.c: micro-batches, the gradient check, the GPU's start ==== */

/* First gathered index of this rank's shard of group g. */
static int64_t shard_lo(const RtCtx *c, int g) {
  int r = step_groups[g].comm == RT_GROUP_FSDP ? c->comm.fsdp_rank : c->comm.shard_rank;
  return (int64_t)r * step_groups[g].shard;
}

/* Set when this rank could not read its tokens (the data file was cut during the run): the step
 * is skipped on every rank (its loss NaN), saved and the run stops (after_step). */
static int data_cut;
static char data_error[1024];

/* Forward and backward of every micro-batch of step `step`; returns the summed mean losses (NaN
 * when the data could not be read: data_cut). */
static double run_micro_batches(RtCtx *c, const RtData *d, long step, uint64_t seed, double *aux) {
  double loss = 0;
  *aux = 0;
  zero_grads(c);
  c->moe_load = 0, c->moe_extra_rounds = 0;
  for (int micro = 0; micro < ACCUM; micro++) {
    /* the cp ranks of a group read the same sequences, each its two chunks of them */
    if (rt_data_batch_cp(d, TOKENS_HOST(c), TOKENS_HOST(c) + TOKENS, MICRO_BATCH, SEQ_LEN, PLAN_CP, c->comm.cp_rank,
                         step, ACCUM, micro, c->comm.rank / PLAN_CP, c->comm.world / PLAN_CP, seed, data_error,
                         sizeof data_error) != 0)
      data_cut = 1;
    tokens_to_device(c);
    c->dloss = (real)(1.0 / ((double)ACCUM * c->comm.world));
    c->aux_loss = 0;
    c->gather_kept = micro == 0; /* parameters kept gathered (reshard after_step): once per step */
    loss += (double)step_forward(c);
    *aux += c->aux_loss;
    step_backward(c);
  }
  return data_cut ? NAN : loss;
}

#ifdef MTRT_REAL_DOUBLE
/* The objective the gradients are of: Σ over micro-batches of dloss × (cross-entropy + aux). */
static double objective(RtCtx *c, const RtData *d, uint64_t seed) {
  double j = 0;
  for (int micro = 0; micro < ACCUM; micro++) {
    rt_data_batch(d, (int32_t *)(void *)(c->acts + INPUTS), (int32_t *)(void *)(c->acts + TARGETS), MICRO_BATCH, SEQ_LEN, 0, ACCUM,
                  micro, 0, 1, seed, NULL, 0);
    c->aux_loss = 0;
    c->gather_kept = micro == 0; /* the parameters may have moved since the last call */
    double ce = (double)step_forward(c);
    j += (ce + c->aux_loss) / ACCUM;
  }
  return j;
}
#endif

/* Finite differences against the analytic gradient, for a few elements of every tensor (its
 * largest gradient and three spread ones); one rank, double precision. The five-point stencil
 * (f(-2h) - 8 f(-h) + 8 f(h) - f(2h)) / 12h has error O(h^4), so h can be large enough that
 * rounding in the objective (~1e-16 x loss / h) stays far below the tolerance. Top-k routing is
 * not differentiable where a step of h flips a token's experts (the objective jumps there):
 * an element whose stencil flips any routing decision (rt_route_hash differs from the
 * unperturbed forward's) is replaced by the next one, up to 8 times, else skipped and counted.
 * The aux-free router bias has no gradient (it moves by its own rule, not the loss's): not checked. */
static int grad_check(RtCtx *c, const RtData *d, uint64_t seed) {
#ifndef MTRT_REAL_DOUBLE
  (void)c, (void)d, (void)seed;
  fprintf(stderr, "error: --grad-check needs the double build; expected mtc build DIR --real double\n");
  return 2;
#else
  if (c->comm.world != 1) {
    fprintf(stderr, "error: --grad-check runs on one rank; expected a plan and launch with 1 rank\n");
    return 2;
  }
  double aux;
  run_micro_batches(c, d, 0, seed, &aux);
  rt_route_hash = RT_FNV_SEED;
  objective(c, d, seed);
  const uint64_t routes = rt_route_hash; /* the unperturbed forwards' routing */
  const double h = 3e-4, rtol = 1e-6, atol = 1e-10; /* atol: the stencil's rounding floor, ~1e-15 x loss / h */
  double worst = 0;
  int bad = 0, checked = 0, skipped = 0, redrawn = 0, unchecked = 0;
  for (int t = 0; t < N_TENSORS; t++) {
    const RtTensor *T = &step_tensors[t];
    const RtGroup *G = &step_groups[T->group];
    if (AUX_FREE && strstr(T->name, "e_score_correction_bias")) {
      printf("grad-check %-52s not checked: no gradient (the aux-free rule moves it)\n", T->name);
      unchecked++;
      continue;
    }
    int64_t n = T->count * (T->experts ? T->experts : 1), pick[4] = {0, n / 3, 2 * n / 3, 0};
    real *w = c->state + G->master + T->offset, *gr = c->state + G->grad + T->offset;
    for (int64_t i = 1; i < n; i++)
      if (fabs(gr[i]) > fabs(gr[pick[3]])) pick[3] = i;
    double tmax = 0;
    for (int k = 0; k < 4; k++) {
      double f[4];
      int64_t i = pick[k];
      int flipped = 1;
      for (int draw = 0; draw < 9 && flipped; draw++, i = (i + 1) % n) { /* the next element after a flip */
        real keep = w[i];
        static const double steps[4] = {-2, -1, 1, 2};
        flipped = 0;
        for (int s = 0; s < 4; s++) {
          w[i] = keep + steps[s] * h;
          refresh_params(c); /* the all-gathers read the cast shards */
          rt_route_hash = RT_FNV_SEED;
          f[s] = objective(c, d, seed);
          flipped |= rt_route_hash != routes;
        }
        w[i] = keep;
        refresh_params(c);
        if (!flipped) break;
        redrawn++;
      }
      if (flipped) { /* nine neighbours in a row flip a routing decision: none checked here */
        skipped++;
        continue;
      }
      double fd = (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * h), an = gr[i], err = fabs(fd - an);
      double scale = fmax(fabs(fd), fabs(an)), rel = scale > 100 * atol ? err / scale : 0;
      if (err > rtol * scale + atol) {
        bad++;
        printf("  MISMATCH %s[%lld]: analytic %.12g finite-difference %.12g\n", T->name, (long long)i, an, fd);
      }
      tmax = fmax(tmax, rel), worst = fmax(worst, rel);
      checked++;
    }
    printf("grad-check %-52s max relative error %.2e\n", T->name, tmax);
  }
  if (redrawn || skipped || unchecked)
    printf("grad-check: %d element(s) redrawn and %d skipped where a step of h flips a routing decision; %d "
           "tensor(s) without a gradient not checked\n", redrawn, skipped, unchecked);
  printf("grad-check: %d elements of %d tensors, worst relative error %.2e (tolerance %.0e relative), %s\n",
         checked, N_TENSORS - unchecked, worst, rtol, bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
#endif
}

#ifdef MTC_BACKEND_CUDA
/* --check-kernels [--arch A]: compiles every kernel of the plan with NVRTC and exits; needs no
 * GPU, no driver and no MPI launch. */
static int check_kernels(int argc, char **argv) {
  const char *arch = "sm_90a";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc) arch = argv[++i];
    else if (strcmp(argv[i], "--check-kernels") != 0)
      return usage("--check-kernels takes only --arch ARCH (e.g. sm_90a)");
  }
  size_t bytes = 0;
  int kernels = 0, cached = 0;
  static char log[1 << 16];
  if (rt_cuda_compile(kernels_cu, kernels_cu_len, "kernels.cu", arch, MTRT_CUDA_INCLUDE, NULL, NULL, &bytes,
                      &kernels, &cached, log, sizeof log) != 0) {
    fprintf(stderr, "%s\nerror: kernels.cu of %s does not compile for %s (NVRTC's log above)\n", log, MODEL_NAME, arch);
    return 1;
  }
  char versions[512];
  rt_cuda_versions(versions, sizeof versions);
  printf("%s: kernels.cu (%d kernel definitions) compiled by NVRTC for %s: %zu bytes of CUBIN%s\n%s\n", MODEL_NAME,
         kernels, arch, bytes,
         cached ? " (from the cache)" : "", versions);
  return 0;
}
#endif

#ifdef MTC_BACKEND_CUDA
/* The GPU of this rank (local rank modulo the visible GPUs), the plan's kernels, NCCL. Features
 * the cuda runtime does not have yet are refused here, by name. Returns 0 or 2. */
static int cuda_start(RtCtx *c, const Args *a) {
  const char *missing = a->grad_check ? "--grad-check (the double build of the cpu backend)" : NULL;
  if (missing) {
    if (c->comm.rank == 0)
      fprintf(stderr, "error: the cuda backend does not run %s yet; expected a cpu build for it (mtc build DIR "
                      "--backend cpu)\n", missing);
    return 2;
  }
  MPI_Comm local;
  int local_rank = 0;
  RT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->comm.rank, MPI_INFO_NULL, &local));
  RT_MPI_CHECK(MPI_Comm_rank(local, &local_rank));
  MPI_Comm_free(&local);
  RtCudaConfig cfg = cuda_config();
  cfg.cp_rank = c->comm.cp_rank; /* (its attention shapes: this rank's chunks) */
  char err[1 << 12];
  int bad = rt_cuda_setup(&cfg, local_rank, err, sizeof err) != 0;
  if (bad) fprintf(stderr, "error: rank %d: %s\n", c->comm.rank, err);
  int any = bad;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!any && rt_comm_nccl_init(&c->comm, err, sizeof err) != 0) {
    fprintf(stderr, "error: rank %d: NCCL: %s\n", c->comm.rank, err);
    any = 1; /* NCCL's init is collective: a failure stops every rank there */
  }
  if (any) return 2;
  rt_cu_defer_scalars(1); /* the losses are read with the gradient norm at the step's end */
  char line[1024];
  rt_cuda_describe(line, sizeof line);
  if (c->comm.rank == 0) printf("cuda: %s\n", line);
  return 0;
}
#endif

/* The signal that asked the run to stop (SIGUSR1 from Slurm's --signal before the time limit,
 * SIGTERM or SIGINT), or 0. The handler only records it; the loop saves and stops at the step's end. */
static volatile sig_atomic_t stop_signal;
static void on_stop_signal(int sig) { stop_signal = sig; }

/* ==== templates/train/40-start.c: start-up: arenas, Muon's buffers, resume, the start-up report ==== */

/* What main's phases share: the context, the arguments, the data, Muon's buffers and the
 * metrics file. One per process. */
typedef struct {
  RtCtx c;
  Args a;
  RtData data;
  int rank0;
  RtMetrics mf;
  long start, resumed; /* the first step this run trains; the step it resumed from, or -1 */
  int stepped;         /* the training loop began: what it saved stays */
  int lock_fd, lock_made, dir_made; /* rank 0: --checkpoint-dir's lock; whether this run made it, the directory */
  void *muon_counts;   /* Muon's all-to-all counts and displacements */
  real *muon_work;     /* Muon's scratch: in the activation arena (step.h) or on the host */
  real *muon_host;     /* the cuda Muon exchange's host scratch */
  int muon_list[N_GROUPS], muon_n; /* the dense Muon groups: one exchange for all of them */
  RtMuonShard muon_gs[N_GROUPS];
  char run_id[RT_RUN_ID_LEN + 1]; /* this run's id (a resume takes its checkpoint's): manifests, metrics */
  double t_start;                 /* rt_now() when main began: the elapsed time */
} Run;

/* The name of a stop signal, as the run's messages say it. */
static const char *signal_name(int sig) {
  return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM";
}

/* Seconds as h:mm:ss into b (n bytes; past 10^15 s as seconds); b. */
static const char *hms(char *b, size_t n, double s) {
  long long t = s > 0 && s < 1e15 ? (long long)(s + 0.5) : 0;
  if (!(s < 1e15)) snprintf(b, n, "%.3g s", s);
  else snprintf(b, n, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  return b;
}

/* Whether the per-step MFU means something: the cuda backend runs on the spec's GPU, whose peak
 * PEAK_FLOPS_PER_GPU is; the cpu backend's ranks are cores, so only a spec whose "GPU" is a cpu
 * rank (the cpu preset: gpu.name "cpu ...", its bf16_flops a core's peak) has a peak of the
 * hardware that runs it. A core's share of a GH200's 989 TFLOP/s would read as 0.00%. */
static int mfu_known(void) {
#ifdef MTC_BACKEND_CUDA
  return 1;
#else
  return strncmp(SPEC_GPU_NAME, "cpu", 3) == 0;
#endif
}

/* The plan check at start-up (rt_program_plan_check), on every rank, said by world rank 0:
 * 0, or 2 on every rank when any rank's plan.json is not this program's. */
static int check_program(int world_rank) {
  char err[2048];
  int mine = rt_program_plan_check(PLAN_HASH, err, sizeof err) != 0, bad = mine;
  if (mine && world_rank == 0) fprintf(stderr, "error: %s\n", err);
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (bad && !mine && world_rank == 0)
    fprintf(stderr, "error: another rank's plan.json (beside its copy of this program) is not the plan this program "
            "was compiled from (%s); expected the same program directory on every node\n", PLAN_HASH);
  return bad ? 2 : 0;
}

/* A run refused at start-up (before its first step) leaves no trace in --checkpoint-dir: the lock
 * file and the directory go when this run made them. Rank 0; nothing on the other ranks. */
static void release_ckpt_dir(Run *r) {
  if (r->rank0 && r->a.ckpt_dir) rt_ckpt_unlock_refused(r->a.ckpt_dir, r->lock_fd, r->lock_made, r->dir_made);
  r->lock_fd = -1, r->lock_made = r->dir_made = 0;
}

/* --checkpoint-dir: a directory that cannot be written fails now, not at the first save; rank 0
 * creates it and takes its lock (held until exit; a run refused at start-up removes what it
 * made: release_ckpt_dir). Returns 0 or 2 on every rank. */
static int check_ckpt_dir(Run *r) {
  int bad = 0;
  const char *dir = r->a.ckpt_dir;
  if (r->rank0) {
    char err[1400];
    struct stat st;
    int made = 0; /* EROFS, EACCES: said, not ENOENT */
    if (rt_ckpt_path_room(dir) >= 0 && !rt_ckpt_is_step_dir(dir)) {
      if (mkdir(dir, 0777) == 0) r->dir_made = 1;
      else if (errno != EEXIST) made = errno;
    }
    long room = rt_ckpt_path_room(dir);
    char *parent = rt_ckpt_step_dir_parent(dir);
    if (parent) { /* a step directory: a run there would start from step 0 inside the old checkpoint */
      fprintf(stderr, "error: --checkpoint-dir %s is a checkpoint's step directory (a step-N name, or a "
              "manifest.json in it); expected the directory that holds the step-N checkpoints: --checkpoint-dir %s\n",
              dir, parent);
      free(parent);
      bad = 1;
    } else if (room < 0) { /* before anything is created: a save there could not name its files */
      fprintf(stderr, "error: --checkpoint-dir %s: %zu bytes long; expected at most %zu (the system's limit on a path "
              "is %zu bytes, and a checkpoint's files are named under it, as DIR/step-NNNNNNNN/manifest.json.tmp): "
              "give a shorter directory\n", dir, strlen(dir), (size_t)((long)strlen(dir) + room),
              (size_t)((long)strlen(dir) + room + (long)strlen("/step-000000000000000000/manifest.json.tmp") + 1));
      bad = 1;
    } else if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK | X_OK) != 0) {
      fprintf(stderr, "error: --checkpoint-dir %s: %s; expected a writable directory (it is created if missing)\n",
              dir, stat(dir, &st) != 0 ? strerror(made ? made : errno)
                   : !S_ISDIR(st.st_mode) ? "not a directory" : "not writable");
      bad = 1;
    } else if ((r->lock_fd = rt_ckpt_lock(dir, &r->lock_made, err, sizeof err)) < 0) {
      fprintf(stderr, "error: %s\n", err);
      bad = 1;
    }
    if (bad) release_ckpt_dir(r);
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return bad ? 2 : 0;
}

/* The arenas of step.h (the HBM span: ACT_ELEMS act, STATE_ELEMS real; the host arena: HOST_ELEMS
 * act, with the state at its start when the plan keeps it on the host), the
 * MoE all-to-all's counts and, on the cuda backend, the GPU, its kernels and NCCL first.
 * Returns 0 or 2 (this rank's failure, said on stderr). */
static int alloc_arenas(Run *r) {
  RtCtx *c = &r->c;
  char err[512];
#ifdef MTC_BACKEND_CUDA
  if (cuda_start(c, &r->a) != 0) return 2;
  const size_t state = (size_t)STATE_ELEMS * sizeof(real);
  c->acts = rt_cuda_alloc((size_t)ACT_ELEMS * sizeof(act), err, sizeof err);
  /* the host arena: one pinned allocation, each buffer at its plan item's offset (step.h) */
  if (c->acts && HOST_ELEMS > 0 && !(c->host = rt_cuda_alloc_host((size_t)HOST_ELEMS * sizeof(act), err, sizeof err))) {
    fprintf(stderr, "error: rank %d: the host arena: %s\n", c->comm.rank, err);
    return 2;
  }
  if (c->acts) c->state = STATE_ON_HOST ? (real *)c->host : rt_cuda_alloc(state, err, sizeof err);
  if (c->state && STATE_ON_HOST) memset(c->state, 0, state); /* (pinned memory comes uninitialized) */
  if (c->state && !STATE_ON_HOST && (state_mirror = calloc(1, state))) rt_prefault(state_mirror, state);
  host_tokens = calloc(2 * TOKENS, sizeof(int32_t));
  if (!c->acts || !c->state || (!STATE_ON_HOST && !state_mirror) || !host_tokens) {
    fprintf(stderr, "error: rank %d: %s; expected a plan that fits this GPU and host (mtc compile ... --set ...)\n",
            c->comm.rank, c->acts && c->state ? "no host memory for the state's mirror or the tokens" : err);
    return 2;
  }
  if (PLAN_EP > 1 && rt_a2a_init(&c->a2a, PLAN_EP, EXPERTS_PER_RANK, c->comm.ep_rank, MOE_CAP_ROWS, MOE_MEAN_ROWS) != 0) {
    fprintf(stderr, "error: rank %d: no host memory for the MoE all-to-all's counts\n", c->comm.rank);
    return 2;
  }
  if (MOE_HIER_G > 0 &&
      rt_hier_init(&c->hier, c->comm.ep_comm, PLAN_EP, c->comm.ep_rank, MOE_HIER_G, TOKENS, TOP_K, MOE_CAP_ROWS,
                                      MOE_HIER_ST) != 0) {
    fprintf(stderr, "error: rank %d: no host memory for the hierarchical all-to-all's tables\n", c->comm.rank);
    return 2;
  }
  if (MOE_HIER_G > 0 && rt_cu_hier_init(&c->hier, err, sizeof err) != 0) {
    fprintf(stderr, "error: rank %d: the hierarchical all-to-all: %s\n", c->comm.rank, err);
    return 2;
  }
#else
  (void)err;
  /* the host arena as the cuda build lays it out, in units of one act (real) each: the plan's
   * bytes x sizeof(act) / 2, so that every buffer, fp32 state included, fits at its offset */
  if (HOST_ELEMS > 0 && !(c->host = calloc((size_t)HOST_ELEMS, sizeof(act)))) {
    fprintf(stderr, "error: rank %d: cannot allocate the %.1f MiB host arena\n", c->comm.rank,
            (double)HOST_ELEMS * sizeof(act) / 1048576.0);
    return 2;
  }
  c->acts = calloc((size_t)ACT_ELEMS, sizeof(act));
  c->state = STATE_ON_HOST ? (real *)c->host : calloc((size_t)STATE_ELEMS, sizeof(real));
  if (!c->acts || !c->state) {
    fprintf(stderr, "error: rank %d: cannot allocate the arenas (%.1f MiB of activations and workspace, %.1f MiB of "
            "state); expected that much free memory\n", c->comm.rank, (double)ACT_ELEMS * sizeof(act) / 1048576.0, (double)STATE_ELEMS * sizeof(real) / 1048576.0);
    return 2;
  }
  if (PLAN_EP > 1 && rt_a2a_init(&c->a2a, PLAN_EP, EXPERTS_PER_RANK, c->comm.ep_rank, MOE_CAP_ROWS, MOE_MEAN_ROWS) != 0) {
    fprintf(stderr, "error: rank %d: no host memory for the MoE all-to-all's counts\n", c->comm.rank);
    return 2;
  }
  if (MOE_HIER_G > 0 &&
      rt_hier_init(&c->hier, c->comm.ep_comm, PLAN_EP, c->comm.ep_rank, MOE_HIER_G, TOKENS, TOP_K, MOE_CAP_ROWS,
                                      MOE_HIER_ST) != 0) {
    fprintf(stderr, "error: rank %d: no host memory for the hierarchical all-to-all's tables\n", c->comm.rank);
    return 2;
  }
  /* touched now, as the cuda backend zeroes its arena: memory that is not there fails at start-up,
   * not in the middle of a step, and the resident growth measures what was allocated */
  rt_prefault(c->acts, (size_t)ACT_ELEMS * sizeof(act));
  if (!STATE_ON_HOST) rt_prefault(c->state, (size_t)STATE_ELEMS * sizeof(real));
  if (c->host) rt_prefault(c->host, (size_t)HOST_ELEMS * sizeof(act));
#endif
  if (rt_offload_init(OFFLOAD_IDS) != 0) {
    fprintf(stderr, "error: rank %d: cannot create the streams and events of activation offload\n", c->comm.rank);
    return 2;
  }
  return 0;
}

/* Muon's buffers (counts; scratch in the activation arena, or on the host with the step there:
 * MUON_STEP_ELEMS of it) and its dense groups, checked against the MUON_STEP_ELEMS (and on the
 * cuda backend's step on the GPU the MUON_HOST_ELEMS) the compiler sized. Returns 0 or 2. */
static int muon_setup(Run *r) {
  r->muon_counts = calloc(1, rt_muon_counts_bytes(PLAN_FSDP));
#ifdef MUON_WORK
  /* with the step on the host: its scratch (workspace.newton_schulz) in the host arena */
  r->muon_work = OPT_ON_HOST ? (r->c.host ? (real *)(r->c.host + MUON_STEP_AT) : NULL) : (real *)(r->c.acts + MUON_WORK);
#ifdef MTC_BACKEND_CUDA
  /* the exchange's scratch of the step on the GPU (workspace.muon_exchange_host) there too:
   * pinned, as its copies to and from the device are asynchronous, so that the step waits for
   * all of them once (rt_cu_muon_groups) */
  r->muon_host = muon_host_elems() && r->c.host ? (real *)(r->c.host + MUON_HOST_AT) : NULL;
  if (muon_host_elems() && !r->muon_host) r->muon_work = NULL;
#endif
  if (!r->muon_work || !r->muon_counts) {
    fprintf(stderr, "error: rank %d: no host memory for Muon's scratch\n", r->c.comm.rank);
    return 2;
  }
  muon_dense(r->muon_list, &r->muon_n);
  for (int i = 0; i < r->muon_n; i++)
    r->muon_gs[i] = (RtMuonShard){.g = r->muon_list[i], .S = step_groups[r->muon_list[i]].shard};
  size_t dense = rt_muon_groups_work(step_tensors, N_TENSORS, r->muon_gs, r->muon_n, PLAN_FSDP);
  for (int g = 0; g < N_GROUPS; g++) { /* the compiler sized MUON_WORK for the dense groups and each expert group */
    size_t need = step_groups[g].comm == RT_GROUP_FSDP || !muon_in(g)
                      ? 0 : rt_muon_group_work(step_tensors, N_TENSORS, g, step_groups[g].shard, PLAN_FSDP / PLAN_EP);
    if (need > (size_t)MUON_STEP_ELEMS || dense > (size_t)MUON_STEP_ELEMS) {
      fprintf(stderr, "error: %s needs %zu values of Muon scratch; MUON_WORK has %lld (regenerate with this mtc)\n",
              need > dense ? step_groups[g].name : "the dense groups", need > dense ? need : dense,
              (long long)MUON_STEP_ELEMS);
      return 2;
    }
  }
#ifdef MTC_BACKEND_CUDA
  /* the exchange's host scratch of the step on the GPU, likewise */
  size_t hdense = rt_cu_muon_host_work(step_tensors, N_TENSORS, r->muon_gs, r->muon_n, PLAN_FSDP);
  for (int g = 0; !OPT_ON_HOST && g < N_GROUPS; g++) {
    RtMuonShard one = {.g = g, .S = step_groups[g].shard};
    size_t need = step_groups[g].comm == RT_GROUP_FSDP || !muon_in(g)
                      ? 0 : rt_cu_muon_host_work(step_tensors, N_TENSORS, &one, 1, PLAN_FSDP / PLAN_EP);
    if (need > (size_t)MUON_HOST_ELEMS || hdense > (size_t)MUON_HOST_ELEMS) {
      fprintf(stderr, "error: %s needs %zu values of Muon's host exchange scratch; MUON_HOST_ELEMS is %lld (regenerate "
              "with this mtc)\n", need > hdense ? step_groups[g].name : "the dense groups", need > hdense ? need : hdense,
              (long long)MUON_HOST_ELEMS);
      return 2;
    }
  }
#endif
#endif
  return 0;
}

/* Rank 0's memory line: what this build allocated (train --memory's figures) next to the plan's
 * (cuda), or the measured start-up resident growth rss1 - rss0 (cpu; -1 unknown). */
static void report_memory(const Run *r, int64_t rss0, int64_t rss1) {
  Footprint fp = footprint();
  if (!r->rank0 || r->a.grad_check) return;
#ifdef MTC_BACKEND_CUDA
  (void)rss0, (void)rss1;
  printf("memory: this program allocates %.3f GiB on the GPU and %.3f GiB of host memory (%.3f GiB pinned) per GPU "
         "(train --memory); the plan: HBM %.3f GiB and host %.3f GiB, besides %.3f GiB and %.3f GiB reserved for "
         "the CUDA context, NCCL and the system\n", fp.hbm / 1073741824.0, fp.host / 1073741824.0,
         fp.pinned / 1073741824.0, (PLAN_HBM_BYTES - PLAN_HBM_RESERVE_BYTES) / 1073741824.0,
         (PLAN_HOST_BYTES - PLAN_HOST_RESERVE_BYTES) / 1073741824.0, PLAN_HBM_RESERVE_BYTES / 1073741824.0,
         PLAN_HOST_RESERVE_BYTES / 1073741824.0);
#else
  printf("memory: start-up resident growth %lld bytes (VmHWM); this program allocates %lld bytes per rank (train "
         "--memory: arena %lld + host %lld)\n", rss0 < 0 || rss1 < 0 ? -1LL : (long long)(rss1 - rss0),
         (long long)(fp.hbm + fp.host), (long long)fp.hbm, (long long)fp.host);
#endif
}

/* The run's id and its settings besides the model that shape what is trained and in which order
 * (the checkpoint keeps them; a resume says which settings differ): "run_id ID, key value, ..." in
 * out. */
static void run_settings(const Run *r, char *out, size_t n) {
  snprintf(out, n, "run_id %s, seq_len %d, global_batch %lld, lr %.9g, min_lr_ratio %.9g, warmup_steps %lld, "
           "training.steps %lld, weight_decay %.9g, grad_clip %.9g, grad_reduce %s, state %d-byte, data %s %lld tokens",
           r->run_id, SEQ_LEN,
           (long long)GLOBAL_BATCH, (double)LR, (double)MIN_LR_RATIO, (long long)WARMUP_STEPS, (long long)TRAIN_STEPS,
           (double)WEIGHT_DECAY, (double)GRAD_CLIP, GRAD_REDUCE_DTYPE, (int)sizeof(real),
           r->data.format == RT_DATA_LLMC ? "llm.c-shard" : r->data.format == RT_DATA_MEGATRON ? "megatron" : "raw-bytes",
           (long long)r->data.ntokens);
}

/* With --checkpoint-dir: resume from the newest complete checkpoint there (found by rank 0;
 * incomplete ones of an interrupted save removed), setting r->start, r->resumed and the seed.
 * Returns 0, 2 when the checkpoint cannot be read, or -1 when it is already at --steps. */
static int resume_from(Run *r, const char *path, char *err, size_t errlen);

static int resume(Run *r) {
  Args *a = &r->a;
  char gone[512], err[512];
  int cleaned = r->rank0 ? rt_ckpt_clean_incomplete(a->ckpt_dir, gone, sizeof gone, err, sizeof err) : 0;
  if (cleaned > 0) printf("removed %d incomplete checkpoint(s) of an interrupted save in %s: %s\n", cleaned, a->ckpt_dir, gone);
  if (cleaned < 0) fprintf(stderr, "warning: %s\n", err);
  int64_t saved = r->rank0 ? rt_ckpt_latest(a->ckpt_dir) : 0;
  MPI_Bcast(&saved, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  if (!saved) return 0;
  char *path = rt_pathf("%s/step-%08lld", a->ckpt_dir, (long long)saved);
  int st = resume_from(r, path, err, sizeof err);
  free(path);
  return st;
}

/* resume's load of checkpoint directory path. */
static int resume_from(Run *r, const char *path, char *err, size_t errlen) {
  Args *a = &r->a;
  int64_t at = 0;
  uint64_t seed = a->seed;
  char run[512], note[1024];
  run_settings(r, run, sizeof run);
  if (rt_ckpt_load(path, &at, &seed, &r->c.comm, HOST(&r->c), step_groups, N_GROUPS, step_tensors, N_TENSORS,
                   MODEL_NAME, MODEL_KEYS, OPTIMIZER, run, r->run_id, note, sizeof note, err, errlen) != 0) {
    if (r->rank0) fprintf(stderr, "error: resuming from %s: %s\n", path, err);
    return 2;
  }
  MPI_Bcast(r->run_id, sizeof r->run_id, MPI_CHAR, 0, MPI_COMM_WORLD); /* the checkpoint's run goes on */
  if (r->rank0) {
    printf("resumed from %s (step %lld, seed %llu)\n", path, (long long)at, (unsigned long long)seed);
    if (note[0]) /* a continuation, but not of the same run: said, not refused (a new learning rate is a choice) */
      printf("note: this run's settings differ from the checkpoint's: %s\n", note);
    if (a->seed_given && seed != a->seed)
      printf("note: --seed %llu ignored: a resumed run keeps the checkpoint's seed %llu\n", a->seed,
             (unsigned long long)seed);
  }
  r->start = r->resumed = (long)at, a->seed = seed;
  to_device(&r->c, 0, STATE_ELEMS), refresh_params(&r->c);
  if (r->start >= a->steps) {
    if (r->rank0) printf("nothing to train: the checkpoint is at step %ld, --steps is %ld\n", r->start, a->steps);
    return -1;
  }
  return 0;
}

/* Rank 0's start-up lines: the layout, batch and arenas; activation offload; the GPU's memory. */
static void report_start(const Run *r) {
  const Args *a = &r->a;
  if (r->rank0 && a->steps > TRAIN_STEPS)
    printf("note: --steps %ld is past the spec's training.steps %lld: the learning-rate schedule ends there, so "
           "steps %lld..%ld run at its minimum (min_lr_ratio x lr = %.3e)\n", a->steps, (long long)TRAIN_STEPS,
           (long long)TRAIN_STEPS + 1, a->steps, LR * MIN_LR_RATIO);
  if (r->rank0)
    printf("%s: %d rank(s) = %d x fsdp %d, ep %d, activation checkpointing %s; %d micro-batch(es) of %d x %d tokens per rank; "
           "%s, gradients reduced in %s; arenas %.1f MiB (activations and workspace) + %.1f MiB (state) per "
           "rank; data %s (%s, %lld tokens); run %s\n",
           MODEL_NAME, r->c.comm.world, PLAN_DP_REPLICATE, PLAN_FSDP, PLAN_EP, CHECKPOINT_POLICY, ACCUM, MICRO_BATCH,
           SEQ_LEN, OPTIMIZER, GRAD_REDUCE_DTYPE, (double)ACT_ELEMS * sizeof(act) / 1048576.0, (double)STATE_ELEMS * sizeof(real) / 1048576.0, a->data,
           rt_data_format_name(&r->data), (long long)r->data.ntokens, r->run_id);
#ifndef MTC_BACKEND_CUDA
  if (r->rank0 && !mfu_known())
    printf("note: no MFU per step: these ranks are cpu cores standing in for the spec's %s, whose peak (%.4g TFLOP/s) "
           "is not theirs\n", SPEC_GPU_NAME, PEAK_FLOPS_PER_GPU / 1e12);
  else if (r->rank0)
    printf("note: MFU is of the spec's %s peak per rank, %.4g GFLOP/s (its gpu.bf16_flops)\n", SPEC_GPU_NAME,
           PEAK_FLOPS_PER_GPU / 1e9);
#endif
  if (r->rank0 && HOST_ELEMS > 0 && OFFLOAD_IDS > 0)
    printf("host arena: %.1f MiB per rank (%d layer boundaries waiting for the backward%s; the plan's host tier: "
           "%.1f MiB)\n", (double)HOST_ELEMS * sizeof(act) / 1048576.0, OFFLOAD_IDS,
           STATE_ON_HOST ? ", the optimizer state" : "", PLAN_HOST_BYTES / 1048576.0);
#ifdef PLAN_OFFLOAD_NVME
  if (r->rank0)
    fprintf(stderr, "warning: the plan puts the layer boundaries on NVMe, but this program keeps them in host memory: "
                    "%.1f MiB per rank that the plan's host memory does not count; expected that much free host memory "
                    "(or mtc compile ... --set plan.offload_activations=host for a plan that counts it)\n",
            (double)OFFLOAD_IDS * TOKENS * HIDDEN * sizeof(act) / 1048576.0);
#endif
#ifdef MTC_BACKEND_CUDA
  size_t free_b = 0, total_b = 0;
  rt_cuda_mem_info(&free_b, &total_b);
  if (r->rank0)
    printf("memory: %.2f GiB of the GPU's %.2f GiB in use after start-up (this program, the CUDA context and NCCL)\n",
           (double)(total_b - free_b) / 1073741824.0, (double)total_b / 1073741824.0);
#endif
}

/* Rank 0's metrics file; a resumed run first drops the lines past its checkpoint's step.
 * Returns 0, or 2 on every rank when rank 0 cannot open it. */
static int open_metrics(Run *r) {
  char err[512];
  int bad = r->rank0 && rt_metrics_open(&r->mf, r->a.metrics, r->resumed, r->run_id, err, sizeof err) != 0;
  if (bad) fprintf(stderr, "error: --metrics %s\n", err);
  if (!bad && r->mf.replaced && r->resumed < 0)
    printf("note: --metrics %s held %lld bytes of an earlier run; emptied, as this run starts at step 0 (a resumed "
           "run keeps the lines up to its checkpoint)\n", r->a.metrics, (long long)r->mf.replaced);
  else if (!bad && r->mf.replaced && r->mf.last_run[0])
    printf("note: --metrics %s ended at step %lld of run %s, not of this run (%s, the checkpoint's): another run's "
           "lines; emptied, so that it reads as one run from step %lld\n", r->a.metrics, (long long)r->mf.last_step,
           r->mf.last_run, r->run_id, (long long)r->resumed + 1);
  else if (!bad && r->mf.replaced)
    printf("note: --metrics %s ended at step %lld, not at the checkpoint's step %lld: its lines are another run's or "
           "miss steps; emptied, so that it reads as one run from step %lld\n", r->a.metrics,
           (long long)r->mf.last_step, (long long)r->resumed, (long long)r->resumed + 1);
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return bad ? 2 : 0;
}

/* --profile FILE checked before the run rather than when it is written at the end (rank 0 writes
 * it): 2 when it cannot be (mtrt_profile.h's rt_prof_check), else 0. */
static int check_profile(const Run *r) {
  char err[768];
  int bad = r->a.profile && r->rank0 && rt_prof_check(r->a.profile, err, sizeof err) != 0;
  if (bad) fprintf(stderr, "error: --profile %s\n", err);
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return bad ? 2 : 0;
}

/* ==== templates/train/50-loop.c: the training loop, checkpoints, the end-of-run report, main ==== */

/* The optimizer step over every group where the plan runs it (skip: a non-finite step, which
 * changes nothing), gradients scaled by the clipping factor scale; then step_end and fresh
 * bf16 copies of the parameters. */
static void optimizer_step(Run *r, int skip, float scale, const RtAdamW *adam) {
  RtCtx *c = &r->c;
  real *opt = OPT_ON_HOST ? HOST(c) : c->state; /* where the optimizer state is updated */
  for (int g = 0; g < N_GROUPS && !skip; g++) {
    const RtGroup *G = &step_groups[g];
    if (OPT_ON_HOST) to_host(c, G->grad, G->shard);
    float *v = G->adam_v < 0 ? NULL : (float *)(opt + G->adam_v); /* (none: Muon matrices only) */
    (OPT_ON_HOST ? rt_adamw_shard : ADAMW_SHARD)(opt + G->master, (float *)(opt + G->adam_m), v, opt + G->grad,
                                                 step_tensors, N_TENSORS, g, shard_lo(c, g), shard_lo(c, g) + G->shard,
                                                 scale, adam);
#ifdef MUON_WORK
    /* Muon: matrices whole in one shard (experts in whole-expert shards) orthogonalized where
     * they are held, the others (dense, and experts split over a flat expert group) at their
     * owners: an expert group's in one all-to-all there and one back now, the dense groups'
     * all together after this loop */
    RtMuonShard q = {g, G->shard, opt + G->master, (float *)(opt + G->adam_m), opt + G->grad, NULL};
    if (G->comm == RT_GROUP_FSDP) {
      for (int i = 0; i < r->muon_n; i++)
        if (r->muon_list[i] == g) r->muon_gs[i] = q;
    } else if (muon_in(g)) {
      muon_step(c->comm.shard_comm, PLAN_FSDP / PLAN_EP, &q, 1, scale, adam->lr, r->muon_work, r->muon_host,
                r->muon_counts);
    }
#endif
    if (OPT_ON_HOST && G->comm != RT_GROUP_FSDP) to_device(c, G->master, G->shard);
  }
#ifdef MUON_WORK
  if (!skip && r->muon_n)
    muon_step(c->comm.fsdp_comm, PLAN_FSDP, r->muon_gs, r->muon_n, scale, adam->lr, r->muon_work, r->muon_host,
              r->muon_counts);
#endif
  for (int g = 0; OPT_ON_HOST && g < N_GROUPS && !skip; g++)
    if (step_groups[g].comm == RT_GROUP_FSDP) to_device(c, step_groups[g].master, step_groups[g].shard);
  step_end(c, !skip);
}

/* After step `step` (skip: it was not finite; skips: consecutive such steps; metrics_bad: rank 0
 * could not write its line): saves a checkpoint when one is due, or when the run stops on too
 * many skips, a lost metrics line or a signal. Returns -1 to go on, else the exit status. */
static int after_step(Run *r, long step, int skip, long skips, int metrics_bad) {
  const Args *a = &r->a;
  char err[512];
  long done_steps = step + 1 - skips; /* the state holds the updates of this many steps */
  /* a signal to any rank, or a data file cut under any rank, stops every rank, at this step */
  int flags[2] = {stop_signal, data_cut};
  RT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  int sig = flags[0], cut = flags[1];
  int stop = (skip && skips >= a->max_skips) || metrics_bad || cut;
  int save = a->ckpt_dir && (stop || sig ||
                             (!skip && (step + 1 == a->steps || (a->ckpt_every && (step + 1) % a->ckpt_every == 0))));
  if (save && (STATE_ON_HOST || !OPT_ON_HOST)) /* (a host step keeps the mirror current) */
    to_host(&r->c, 0, STATE_ELEMS);
  char run[512];
  if (save) run_settings(r, run, sizeof run);
  if (save && rt_ckpt_save(a->ckpt_dir, done_steps, a->seed, &r->c.comm, HOST(&r->c), step_groups, N_GROUPS,
                           step_tensors, N_TENSORS, EXPERTS_PER_RANK, MODEL_NAME, MODEL_KEYS, OPTIMIZER, run,
                           a->kill_at_save == done_steps, err, sizeof err) != 0) {
    if (r->rank0)
      fprintf(stderr, "error: saving the checkpoint of step %ld: %s; the run stops, and its partial files are "
                      "removed (a resume takes the checkpoint before)\n", done_steps, err);
    return 1;
  }
  if (save && r->rank0) printf("saved checkpoint %s/step-%08ld\n", a->ckpt_dir, done_steps);
  if (save && r->rank0 && a->keep_ckpts && rt_ckpt_prune(a->ckpt_dir, (int)a->keep_ckpts, err, sizeof err) < 0)
    fprintf(stderr, "warning: --keep-checkpoints %ld: %s\n", a->keep_ckpts, err);
  if (cut) { /* the step was skipped (NaN loss): the state saved is the one before it */
    if (data_cut) fprintf(stderr, "error: rank %d: --data %s\n", r->c.comm.rank, data_error);
    if (r->rank0)
      fprintf(stderr, "error: stopped at step %ld: the data file could not be read%s%s%s; expected --data unchanged "
                      "during the run: restore it and run the same command again\n", step + 1,
              a->ckpt_dir ? "; the state before it is saved in " : " (nothing saved: no --checkpoint-dir)",
              a->ckpt_dir ? a->ckpt_dir : "", a->ckpt_dir ? ", to resume from" : "");
    return 1;
  }
  if (stop && metrics_bad) {
    if (r->rank0)
      fprintf(stderr, "error: stopped after step %ld: its metrics line could not be written%s%s; expected room "
                      "for --metrics %s\n", step + 1, a->ckpt_dir ? "; the state is saved in " : "",
              a->ckpt_dir ? a->ckpt_dir : "", a->metrics);
    return 1;
  }
  if (sig && !stop) {
    if (r->rank0)
      printf("stopped after step %ld on %s%s%s\n", step + 1, signal_name(sig),
             a->ckpt_dir ? "; run the same command again to resume from " : " with nothing saved (no --checkpoint-dir)",
             a->ckpt_dir ? a->ckpt_dir : "");
    return a->ckpt_dir ? 0 : 1;
  }
  if (stop) {
    if (r->rank0)
      fprintf(stderr, "error: %ld consecutive steps had a non-finite loss or gradient norm (steps %ld-%ld); "
                      "stopped%s%s; expected a lower training.lr or a look at the data\n",
              skips, step + 2 - skips, step + 1, a->ckpt_dir ? " with the last good state saved in " : "",
              a->ckpt_dir ? a->ckpt_dir : "");
    return 1;
  }
  return -1;
}

/* Rank 0's line for step `step` (0-based; dt its seconds, tps its tokens per second over all
 * ranks, skip: not finite): loss, aux, lr, grad norm, the step's time, tokens/s and, where the
 * peak is the hardware's (mfu_known), MFU = FLOPS_PER_TOKEN x tokens/s per rank / the peak per
 * GPU (plan.json's predicted.mfu's formula); with expert parallelism the MoE load. */
static void print_step(const Run *r, long step, double mean, double aux_mean, float lr, double norm, double dt,
                       double tps, double moe_load, long moe_rounds, int skip) {
  char moe[64] = "", mfu[32] = "";
  if (PLAN_EP > 1) snprintf(moe, sizeof moe, " | moe load %.2f, +%ld rounds", moe_load, moe_rounds);
  if (mfu_known()) snprintf(mfu, sizeof mfu, " | MFU %.3g%%", 100 * tps / r->c.comm.world * FLOPS_PER_TOKEN / PEAK_FLOPS_PER_GPU);
  printf("step %5ld/%ld | loss %.4f | aux %.4f | lr %.3e | grad norm %.4f | %.3f s | %.0f tokens/s (%.0f per rank)%s%s%s\n",
         step + 1, r->a.steps, mean, aux_mean, lr, norm, dt, tps, tps / r->c.comm.world, mfu, moe,
         skip ? " | SKIPPED: not finite" : "");
}

/* Rank 0's progress line after step `step` (0-based): the elapsed time since start-up began and
 * the ETA of the steps left at the mean time of the steps timed (the first step a run takes
 * holds the warm-up and counts only when it is the one measured: first_dt). */
static void print_progress(const Run *r, long step, long timed, double seconds, double first_dt) {
  char e[32], eta[32];
  double per = timed ? seconds / timed : first_dt;
  long left = r->a.steps - step - 1;
  printf("progress: step %ld/%ld (%.0f%%), elapsed %s, ETA %s at %.3f s per step (mean of %s)\n", step + 1,
         r->a.steps, 100.0 * (double)(step + 1) / (double)r->a.steps, hms(e, sizeof e, rt_now() - r->t_start),
         hms(eta, sizeof eta, per * (double)left), per, timed ? "the steps after this run's first" : "this run's first step");
  fflush(stdout);
}

/* Before the first step: a stop signal that came during start-up (any rank's) stops the run
 * now, before the metrics file is opened, with --checkpoint-dir as it was (the lock, and the
 * directory when this run made it, removed). Returns -1 to go on, else the exit status. */
static int stopped_at_start(Run *r) {
  int sig = stop_signal;
  RT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sig, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (!sig) return -1;
  if (r->rank0)
    printf("stopped on %s before step %ld: nothing trained%s%s%s\n", signal_name(sig), r->start + 1,
           r->a.ckpt_dir ? "; --checkpoint-dir " : "", r->a.ckpt_dir ? r->a.ckpt_dir : "",
           !r->a.ckpt_dir ? "" : r->resumed >= 0 ? " is as it was: run the same command again to resume from it"
                                                 : " is as it was: run the same command again to start there");
  release_ckpt_dir(r);
  return r->a.ckpt_dir ? 0 : 1;
}

/* The training loop from r->start to --steps: per step the micro-batches, the gradient norm and
 * clipping, the optimizer step, rank 0's metrics line, checkpoints. Returns the exit status;
 * timed, seconds, opt_seconds: the steps after the first, their time and their optimizer's;
 * last: the last step taken (1-based; r->start when none). */
static int train_loop(Run *r, long *timed, double *seconds, double *opt_seconds, long *last) {
  RtCtx *c = &r->c;
  const Args *a = &r->a;
  char err[512];
  uint64_t data_seed = a->seed + 1;
  RtAdamW adam = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = (float)WEIGHT_DECAY};
  long skips = 0, skipped = 0;
  int metrics_bad = 0, status = 0; /* metrics_bad: rank 0 could not write a metrics line */
  *timed = 0, *seconds = 0, *opt_seconds = 0, *last = r->start;
  double first_dt = 0;
  if (a->profile) rt_prof_start();
  r->stepped = 1;
  for (long step = r->start; step < a->steps; step++) {
    double t0 = rt_now(), aux;
    double loss = run_micro_batches(c, &r->data, step, data_seed, &aux);
    if (r->rank0 && step + 1 >= a->nan_first && step + 1 < a->nan_first + a->nan_count) {
      to_host(c, step_groups[0].grad, 1);
      HOST(c)[step_groups[0].grad] = NAN; /* --inject-nan */
      to_device(c, step_groups[0].grad, 1);
    }
    if (PLAN_DP_REPLICATE > 1) grads_all_reduce(c);
    /* global gradient norm: the shards of one replica partition every parameter */
#ifdef MTC_BACKEND_CUDA
    /* the micro-batches' losses and Σ g² of every run of adjacent gradient shards in one copy
     * down (one host wait) */
    for (int g = 0, n; g < N_GROUPS; g += n) {
      size_t len;
      n = grad_run(g, &len);
      rt_cu_sum_squares_defer(c->state + step_groups[g].grad, len);
    }
    real sq = rt_cu_step_scalars(&loss);
#else
    real sq = 0;
    for (int g = 0, n; g < N_GROUPS; g += n) {
      size_t len;
      n = grad_run(g, &len);
      sq += (real)SUM_SQUARES(c->state + step_groups[g].grad, len);
    }
#endif
    rt_comm_all_reduce(c->comm.fsdp_comm, &sq, 1);
    rt_comm_all_reduce(c->comm.replicate_comm, &sq, 1); /* a NaN on any replica reaches every rank */
    double norm = sqrt((double)sq / PLAN_DP_REPLICATE);
    real sums[2] = {(real)loss, (real)aux};
    rt_comm_all_reduce(MPI_COMM_WORLD, sums, 2);
    /* the MoE all-to-all figures of the step: the worst EP group's load, and the extra rounds summed
     * over micro-batches, MoE layers and EP groups (each rank of a group counts its group's: / ep) */
    double moe_load = c->moe_load;
    long moe_rounds = c->moe_extra_rounds;
    RT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &moe_load, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    RT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &moe_rounds, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    moe_rounds /= PLAN_EP;
    double mean = (double)sums[0] / ((double)ACCUM * c->comm.world);
    double aux_mean = (double)sums[1] / ((double)ACCUM * c->comm.world);
    /* the schedule spans the spec's training.steps whatever --steps says: a run stopped early and
     * resumed follows the same learning rates as one that was not */
    float lr = rt_lr_at(step, TRAIN_STEPS, WARMUP_STEPS, (float)LR, (float)MIN_LR_RATIO);
    int skip = !isfinite(mean) || !isfinite(norm); /* the same decision on every rank */
    adam.lr = lr, adam.step = step + 1;
    double t_opt = rt_prof_on ? rt_prof_begin() : rt_now();
    optimizer_step(r, skip, rt_clip_scale(norm, (float)GRAD_CLIP), &adam);
    if (rt_prof_on) { /* the bytes the cost model counts for this rank's update (none when skipped) */
      double ob = 0;
      for (int g = 0; g < N_GROUPS && !skip; g++)
        ob += rt_opt_bytes(step_tensors, N_TENSORS, g, shard_lo(c, g), shard_lo(c, g) + step_groups[g].shard);
      rt_prof_end(RT_PROF_OPTIMIZER, t_opt, 0, ob);
    }
    if (step > r->start) *opt_seconds += rt_now() - t_opt; /* the optimizer step: every group's update */
    if (!skip) refresh_params(c);
    skips = skip ? skips + 1 : 0, skipped += skip;
    double dt = rt_now() - t0, tps = (double)GLOBAL_BATCH * SEQ_LEN / dt;
    if (step > r->start) *seconds += dt, (*timed)++;
    else first_dt = dt;
    if (step == r->start) rt_prof_reset(); /* the profile covers the timed steps */
    *last = step + 1;
    if (r->rank0) {
      print_step(r, step, mean, aux_mean, lr, norm, dt, tps, moe_load, moe_rounds, skip);
      if ((step + 1 - r->start) % a->progress_every == 0 && step + 1 < a->steps)
        print_progress(r, step, *timed, *seconds, first_dt);
      fflush(stdout);
      struct timespec now;
      clock_gettime(CLOCK_REALTIME, &now);
      RtStepMetrics sm = {.step = step + 1, .loss = mean, .aux_loss = aux_mean, .lr = lr, .grad_norm = norm,
                          .skipped = skip, .moe_load = PLAN_EP > 1 ? moe_load : -1, .moe_extra_rounds = moe_rounds,
                          .time = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec, .step_seconds = dt,
                          .tokens_per_second = tps, .run = r->run_id};
      if (!metrics_bad && rt_metrics_write(&r->mf, &sm, err, sizeof err) != 0) {
        fprintf(stderr, "error: --metrics %s\n", err);
        metrics_bad = 1;
      }
    }
    MPI_Bcast(&metrics_bad, 1, MPI_INT, 0, MPI_COMM_WORLD); /* a lost metrics line stops every rank */
    int end = after_step(r, step, skip, skips, metrics_bad);
    if (end >= 0) {
      status = end;
      break;
    }
  }
  if (r->rank0 && skipped) printf("%ld step(s) skipped for non-finite values\n", skipped);
  return status;
}

/* The end of a run: the --profile file, rank 0's elapsed line (last: the last step taken),
 * throughput, MFU and optimizer lines over the timed steps, the GPU's memory. Returns 0, or 1
 * when the profile cannot be written. */
static int report_end(const Run *r, long timed, double seconds, double opt_seconds, long last) {
  int status = 0;
  char e[32];
  if (r->rank0 && last > r->start)
    printf("elapsed: %s for steps %ld-%ld of %ld (start-up, steps, checkpoints)\n", hms(e, sizeof e, rt_now() - r->t_start),
           r->start + 1, last, r->a.steps);
  if (r->a.profile && !timed) { /* the first step a run takes is not timed: nothing was measured */
    if (r->rank0)
      fprintf(stderr, "error: --profile %s not written: this run measured no step (its first step is not timed); "
              "expected --steps at least 2 past the step it starts from\n", r->a.profile);
    status = 1;
  }
  if (r->a.profile && timed) {
    char err[512];
    double tokens = (double)GLOBAL_BATCH * SEQ_LEN / r->c.comm.world;
#ifdef MTC_BACKEND_CUDA
    const char *backend = "cuda";
#else
    const char *backend = "cpu";
#endif
    char device[256] = "cpu"; /* the cpu backend's ranks are cores */
#ifdef MTC_BACKEND_CUDA
    rt_cuda_device_name(device, sizeof device);
#endif
    RtProfRun pr = {SPEC_FILE, MODEL_NAME, backend, device, r->c.comm.world, PLAN_FSDP, PLAN_EP, timed, seconds / timed,
                    tokens, tokens / (double)PREDICTED_TOKENS_PER_S_PER_GPU, OPT_ON_HOST};
    if (rt_prof_write(r->a.profile, &pr, err, sizeof err) != 0) {
      if (r->rank0) fprintf(stderr, "error: --profile %s: %s; expected a writable path\n", r->a.profile, err);
      status = 1;
    } else if (r->rank0)
      printf("profile: %s (%ld steps)\n", r->a.profile, timed);
  }
  if (r->rank0 && timed) {
    /* MFU = FLOPS_PER_TOKEN x tokens/s / the plan's peak per GPU, as plan.json's predicted.mfu */
    double tps = (double)GLOBAL_BATCH * SEQ_LEN * timed / seconds / r->c.comm.world;
    double mfu = tps * FLOPS_PER_TOKEN / PEAK_FLOPS_PER_GPU;
    double predicted_mfu = PREDICTED_TOKENS_PER_S_PER_GPU * FLOPS_PER_TOKEN / PEAK_FLOPS_PER_GPU;
    char measured[96] = ""; /* (not where the peak is not the hardware's: mfu_known) */
    if (mfu_known()) snprintf(measured, sizeof measured, ", MFU %.2f%% of %.4g TFLOP/s", 100 * mfu, PEAK_FLOPS_PER_GPU / 1e12);
    printf("throughput: %.0f tokens/s per rank over %ld steps (%.3f s per step)%s; the plan predicted %.0f per GPU of "
           "its cluster, MFU %.2f%%: measured / predicted %.3f\n", tps, timed, seconds / timed, measured,
           (double)PREDICTED_TOKENS_PER_S_PER_GPU, 100 * predicted_mfu, tps / (double)PREDICTED_TOKENS_PER_S_PER_GPU);
    printf("optimizer: %.2f ms per step on rank 0 (%s, mean over %ld steps)\n", 1e3 * opt_seconds / timed, OPTIMIZER,
           timed);
  }
#ifdef MTC_BACKEND_CUDA
  rt_cuda_sync("the last step");
  size_t free_b = 0, total_b = 0;
  rt_cuda_mem_info(&free_b, &total_b);
  if (r->rank0)
    printf("memory: %.2f GiB of the GPU's %.2f GiB in use after the last step (arena, runtime scratch, cuBLAS and "
           "NCCL buffers)\n", (double)(total_b - free_b) / 1073741824.0, (double)total_b / 1073741824.0);
#endif
  return status;
}

/* A run after start-up: resume (--checkpoint-dir), the start-up lines, the metrics file, the
 * training loop and the end-of-run report. Returns the exit status. */
static int train(Run *r) {
  int status = r->a.ckpt_dir ? resume(r) : 0;
  if (status) return status < 0 ? 0 : status; /* -1: the checkpoint is already at --steps */
  report_start(r);
  if ((status = stopped_at_start(r)) >= 0) return status;
  if (check_profile(r) != 0 || open_metrics(r) != 0) return 2;
  long timed, last;
  double seconds, opt_seconds;
  status = train_loop(r, &timed, &seconds, &opt_seconds, &last);
  if (report_end(r, timed, seconds, opt_seconds, last) != 0) status = 1;
  char err[512];
  if (rt_metrics_close(&r->mf, err, sizeof err) != 0) {
    fprintf(stderr, "error: --metrics %s\n", err);
    status = 1;
  }
  return status;
}

/* Frees what alloc_arenas and muon_setup allocated (NULL-safe) and leaves MPI. */
static void release(Run *r) {
  RtCtx *c = &r->c;
  if (PLAN_EP > 1) rt_a2a_free(&c->a2a);
#ifdef MTC_BACKEND_CUDA
  if (MOE_HIER_G > 0) rt_cu_hier_free(&c->hier);
#endif
  if (MOE_HIER_G > 0) rt_hier_free(&c->hier);
  free(r->muon_counts);
#ifdef MTC_BACKEND_CUDA
  rt_cuda_free(c->acts);
  rt_cuda_free_host(c->host); /* (the state, when on the host, and Muon's host scratch are in it) */
  if (!STATE_ON_HOST) rt_cuda_free(c->state);
  free(state_mirror);
  free(host_tokens);
  rt_comm_nccl_free();
  rt_cuda_teardown();
#else
  free(c->acts);
  if (!STATE_ON_HOST) free(c->state);
  free(c->host);
#endif
  rt_comm_finalize(&c->comm);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--memory") == 0) return print_memory(argc);
#ifdef MTC_BACKEND_CUDA
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--check-kernels") == 0) return check_kernels(argc, argv);
#endif
  static Run run; /* zeroed */
  Run *r = &run;
  r->mf.fd = -1, r->resumed = -1, r->lock_fd = -1, r->t_start = rt_now();
  /* the stop signals recorded from the start, MPI_Init included: one during start-up stops the
   * run before its first step (stopped_at_start), on every rank, not one rank killed mid-start */
  struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL), sigaction(SIGTERM, &sa, NULL), sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL); /* a closed terminal or session: save and stop, as for SIGTERM */
  signal(SIGPIPE, SIG_IGN);     /* stdout into a pipe that closed (| head): the run goes on, unprinted */
  sigset_t stops; /* unblocked, should the launcher have blocked them: one pending arrives now */
  sigemptyset(&stops);
  sigaddset(&stops, SIGUSR1), sigaddset(&stops, SIGTERM), sigaddset(&stops, SIGINT), sigaddset(&stops, SIGHUP);
  sigprocmask(SIG_UNBLOCK, &stops, NULL);
  MPI_Init(&argc, &argv); /* arguments first: a usage error is reported even on a wrong launch */
  int world_rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  quiet = world_rank != 0; /* usage errors: one report, from rank 0 */
  int status = parse_args(&r->a, argc, argv);
  if (!status) status = check_program(world_rank); /* (the same answer on every rank) */
  if (status || rt_comm_init(&r->c.comm, &argc, &argv, PLAN_FSDP, PLAN_EP, PLAN_DP_REPLICATE, SPEC_FILE,
                             SPEC_GPUS_PER_NODE) != 0) {
    MPI_Finalize();
    return status < 0 ? 0 : 2; /* --help: 0 */
  }
  rt_comm_cp_init(&r->c.comm, PLAN_CP); /* context parallelism: the cp group of a sequence's ranks */
  r->rank0 = r->c.comm.rank == 0;
  if (r->rank0) rt_run_id_new(r->run_id);
  MPI_Bcast(r->run_id, sizeof r->run_id, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (r->a.ckpt_dir) status = check_ckpt_dir(r);
  char err[512];
  if (!status && rt_data_open(&r->data, r->a.data, VOCAB, SEQ_LEN, err, sizeof err) != 0) {
    if (r->rank0) fprintf(stderr, "error: %s\n", err);
    status = 2;
  }
  int64_t rss0 = rt_peak_rss_bytes(); /* before the start-up allocations */
  if (!status) status = alloc_arenas(r);
  MPI_Allreduce(MPI_IN_PLACE, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD); /* one rank's failure stops all */
  if (status) {
    release_ckpt_dir(r);
    rt_comm_finalize(&r->c.comm);
    return status;
  }
  for (int g = 0; g < N_GROUPS; g++)
    rt_init_shard(HOST(&r->c) + step_groups[g].master, step_tensors, N_TENSORS, g, shard_lo(&r->c, g),
                  shard_lo(&r->c, g) + step_groups[g].shard, r->c.comm.ep_rank, r->a.seed);
  to_device(&r->c, 0, STATE_ELEMS);
  refresh_params(&r->c);
  status = muon_setup(r);
  if (!status) report_memory(r, rss0, rt_peak_rss_bytes());
  if (!status) status = r->a.grad_check ? grad_check(&r->c, &r->data, r->a.seed + 1) : train(r);
  if (status == 2 && !r->stepped) release_ckpt_dir(r); /* refused before its first step */
  rt_data_close(&r->data);
  release(r);
  return status;
}
