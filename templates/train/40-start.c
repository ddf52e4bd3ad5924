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

