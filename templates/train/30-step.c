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

