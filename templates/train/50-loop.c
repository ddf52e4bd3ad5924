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
