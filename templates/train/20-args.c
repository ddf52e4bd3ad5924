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

