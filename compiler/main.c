/* main.c — the mtc command line: check, plan, compile, build, export, explain, sweep, diff,
 * import-hf, calibrate and keys (the options, the help texts, the exit statuses; each command's work is in
 * its own file). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtc.h"

static const char usage_main[] =
    "usage: mtc COMMAND [OPTIONS] ARGUMENTS (a SPEC, or as each command below says)\n"
    "\n"
    "mtc plans a Mixture-of-Experts (or dense) transformer training run on a GPU cluster from\n"
    "one YAML spec, and writes the training program that does what the plan says.\n"
    "\n"
    "commands:\n"
    "  check SPEC            parse and validate the spec\n"
    "  plan SPEC [--json]    print the plan (model accounting, layout, memory per tier,\n"
    "                        predicted step) as text, or as plan.json\n"
    "  compile SPEC [-o DIR] [--force]\n"
    "                        write plan.json, plan.txt, memory.svg, timeline.json, report.html\n"
    "                        and the training program (step.h, step.c, train.c, kernels.cu,\n"
    "                        CMakeLists.txt, launch.sbatch)\n"
    "  build DIR [--backend cpu|cuda] [--real float|double] [--allow-edits]\n"
    "                        build DIR/build/train, or DIR/build-cuda/train for cuda (CMake)\n"
    "  export CKPT OUT.safetensors\n"
    "                        a checkpoint's weights as one safetensors file (mtc's names)\n"
    "  export CKPT OUTDIR --spec SPEC\n"
    "                        ... as a Hugging Face model: config.json, model.safetensors in the\n"
    "                        names of the family that expresses SPEC's model\n"
    "  explain SPEC          the chosen plan and the best alternatives, with why each lost\n"
    "  sweep SPEC --over KEY=V1,V2,... [--over ...] [--csv]\n"
    "                        the best plan for every point of a grid, one row each\n"
    "  diff A B [--all] [--html OUT]\n"
    "                        what changes between two plans (plan.json files or specs; --set\n"
    "                        applies to B): layout, memory items, predicted times; --html: the\n"
    "                        two specs' plans side by side as a page\n"
    "  import-hf CONFIG [-o SPEC] [--force]\n"
    "                        a spec from a Hugging Face config.json (llama, qwen2, qwen3, mixtral,\n"
    "                        qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3, gpt2)\n"
    "  calibrate PROFILE... --preset NAME -o PRESET.yaml\n"
    "                        fit a cluster preset's efficiencies to `train --profile` files\n"
    "  keys                  print the spec reference (every key, type, default) as markdown\n"
    "\n"
    "options of every command:\n"
    "  -s, --set KEY=VALUE   override a spec key before validation (repeatable; not for build,\n"
    "                        export without --spec, import-hf, calibrate or keys), e.g.\n"
    "                        --set training.seq_len=32768 --set cluster.nodes=48\n"
    "  -h, --help            help for the command\n"
    "      --version         print the version\n"
    "\n"
    "exit status: 0 done, 1 no feasible plan, 2 bad input or usage\n";

static const char *const usage_cmd[][2] = {
    {"check", "usage: mtc check SPEC [--set KEY=VALUE]...\n\n"
              "Parses and validates SPEC (with its cluster preset and the --set overrides) and\n"
              "prints one line; errors name FILE:LINE:COL and exit 2.\n"},
    {"plan", "usage: mtc plan SPEC [--json] [--set KEY=VALUE]...\n\n"
             "Prints the plan for SPEC: the model accounting (parameters by kind, total and\n"
             "active, FLOPs per token, saved activations), the chosen layout and checkpoint\n"
             "policy, every memory item per tier, the schedule and the predicted step (tokens/s,\n"
             "MFU, bottleneck). --json prints plan.json instead. Exit 1 when nothing fits.\n"},
    {"compile", "usage: mtc compile SPEC [-o DIR] [--force] [--set KEY=VALUE]...\n\n"
                "Writes DIR/plan.json, plan.txt, memory.svg, timeline.json (a Chrome trace of the\n"
                "predicted step) and report.html (one page), and the training program: step.h and\n"
                "step.c (every layer's forward and backward as the plan schedules them), train.c,\n"
                "kernels.cu (the cuda backend's kernels), CMakeLists.txt and launch.sbatch. DIR\n"
                "defaults to generated/NAME/; it must be new, empty or an earlier compile's (it\n"
                "holds mtc's plan.json): --force writes into another. Every file is written whole\n"
                "(FILE.tmp, renamed); a compile that writes no program removes an earlier one,\n"
                "one that writes another program the earlier one's DIR/build.../train (rebuild).\n"
                "Build the program with `mtc build DIR` (or --backend cuda), run it on the plan's\n"
                "ranks with `mpirun -np WORLD DIR/build/train --data FILE` (WORLD: plan.txt's\n"
                "layout; FILE raw text, an llm.c shard or a Megatron PREFIX), or sbatch\n"
                "DIR/launch.sbatch on a Slurm cluster.\n"},
    {"build", "usage: mtc build DIR [--backend cpu|cuda] [--real float|double] [--allow-edits]\n\n"
              "Configures and builds the program `mtc compile` wrote in DIR (refused when\n"
              "step.h is not the program of DIR/plan.json, or a program file was edited after\n"
              "compile wrote it, as DIR/program.sum tells; --allow-edits builds it anyway): DIR/build/train\n"
              "(DIR/build-double/train with --real double, for gradient checks), against the\n"
              "runtime in $MTC_ROOT or in the source tree this mtc was built from: its cpu\n"
              "backend (OpenBLAS, MPI), or with --backend cuda the GPU one (NVRTC, cuBLAS,\n"
              "NCCL; `train --check-kernels` compiles the kernels without a GPU) in\n"
              "DIR/build-cuda/train: each backend builds in its own directory. A thin wrapper\n"
              "over cmake -S DIR -B DIR/build -DMTC_ROOT=... && cmake --build.\n"},
    {"export", "usage: mtc export CKPT OUT.safetensors\n"
               "       mtc export CKPT OUTDIR --spec SPEC [--set KEY=VALUE]...\n\n"
               "Writes the fp32 master weights of checkpoint CKPT (a step-N directory, or the\n"
               "--checkpoint-dir holding them: the newest complete one) as one safetensors file\n"
               "with the program's Llama-style tensor names, one tensor per expert. Any saved\n"
               "layout works. With --spec (the spec the program was compiled from, and the same\n"
               "--set overrides), writes OUTDIR/model.safetensors and OUTDIR/config.json for the\n"
               "Hugging Face family that expresses the model (llama, qwen2, qwen3, mixtral,\n"
               "qwen2_moe, qwen3_moe, olmoe, deepseek_v3, gpt2) in that family's tensor names, so that its\n"
               "from_pretrained(OUTDIR) loads every tensor; a model no family expresses is\n"
               "refused, naming the spec key and why, and nothing is written.\n"},
    {"explain", "usage: mtc explain SPEC [--set KEY=VALUE]...\n\n"
                "Prints the chosen plan in one line and the best alternatives: fitting ones with\n"
                "their predicted step, rejected ones with the tier that overflowed and by how much.\n"},
    {"sweep", "usage: mtc sweep SPEC --over KEY=V1,V2,... [--over ...] [--csv] [--set KEY=VALUE]...\n\n"
              "Plans every point of the grid (each --over is one axis) and prints one row per\n"
              "point: fits, layout, tokens/s per GPU, MFU, HBM and host peaks, step, bottleneck\n"
              "or why nothing fits. Example:\n"
              "  mtc sweep specs/europa-1t.yaml --over cluster.nodes=24,48,96,192 \\\n"
              "            --over training.seq_len=16384,32768,65536,131072\n"},
    {"diff", "usage: mtc diff A B [--all] [--html OUT] [--set KEY=VALUE]...\n\n"
             "A and B are plan.json files or specs; the --set overrides apply to B, so\n"
             "  mtc diff s.yaml s.yaml --set training.seq_len=32768\n"
             "shows what the shorter sequence changes. Prints the rows that differ (--all: every\n"
             "row): layout, checkpointing, memory per tier and per item (per-layer items summed),\n"
             "predicted times. --html OUT also writes a self-contained page (A and B specs) with the\n"
             "two plans side by side: headlines, timelines and memory on one scale, layouts and the\n"
             "table.\n"},
    {"import-hf", "usage: mtc import-hf CONFIG [-o SPEC] [--force]\n\n"
                  "Writes a spec whose model section comes from a Hugging Face config.json (to stdout,\n"
                  "or to SPEC), with cluster and training sections to edit. An existing SPEC is\n"
                  "replaced only when it holds what this import writes, or with --force (a spec\n"
                  "edited since it was imported is kept).\n"},
    {"calibrate", "usage: mtc calibrate PROFILE... --preset NAME -o PRESET.yaml\n\n"
                  "Fits preset NAME's cost-model factors to the files `DIR/build/train --profile FILE`\n"
                  "wrote: efficiency.dense_gemm, grouped_gemm, attention and attention_bwd from the\n"
                  "FLOPs and seconds of each class, elementwise from the bytes and seconds of the\n"
                  "memory-bound ones, optimizer_update from the optimizer step's bytes (a step on the device),\n"
                  "network and all_to_all from the collectives of a profile of 2 or more ranks (least\n"
                  "squares over the profiles), and writes PRESET.yaml: the\n"
                  "base preset with those keys replaced, each citing the profiles. The preset is named\n"
                  "by its file: with MTC_PRESET_DIR=DIR (PRESET.yaml in DIR), --set\n"
                  "cluster.preset=PRESET prices a spec with it. See docs/fidelity.md,\n"
                  "\"Calibrating on your own cluster\".\n"},
    {"keys", "usage: mtc keys\n\nPrints every spec key with its type, default and meaning.\n"},
};

/* Output that did not reach stdout (a full disk, a closed pipe) is an error, not success. */
static int finish(int status) {
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "mtc: error: cannot write the output: %s; expected a writable stdout\n",
            strerror(errno));
    return EXIT_BAD_INPUT;
  }
  return status;
}

static int usage_error(const char *cmd, const char *msg) {
  fprintf(stderr, "mtc%s%s: %s\nTry 'mtc%s%s --help'.\n", cmd ? " " : "", cmd ? cmd : "", msg,
          cmd ? " " : "", cmd ? cmd : "");
  return EXIT_BAD_INPUT;
}

/* -1, or a usage error when option opt (--set, --over) was given "KEY VALUE" as two words: its
 * value key has no '=' and next (the word after it, NULL at the end) is neither an option nor a
 * file name ending in .yaml, .yml or .json. */
static int spaced_value(const char *cmd, const char *opt, const char *form, const char *key, const char *next) {
  if (strchr(key, '=') || !next || next[0] == '-') return -1;
  const char *dot = strrchr(next, '.');
  if (dot && (!strcmp(dot, ".yaml") || !strcmp(dot, ".yml") || !strcmp(dot, ".json"))) return -1;
  char msg[512];
  snprintf(msg, sizeof msg, "%s %.100s %.100s: expected %s, one word with '=' (%s %.100s=%.100s)", opt, key, next, form,
           opt, key, next);
  return usage_error(cmd, msg);
}

/* s as one shell word: as it is when it holds only characters no shell treats specially, else in
 * single quotes (a quote inside as '\''), so the hint can be pasted. */
static const char *shell_word(Mem *m, const char *s) {
  if (*s && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+,:=@%") == strlen(s)) return s;
  char *q = mem_alloc(m, 4 * strlen(s) + 3), *p = q;
  *p++ = '\'';
  for (; *s; s++)
    if (*s == '\'') memcpy(p, "'\\''", 4), p += 4;
    else *p++ = *s;
  *p++ = '\'', *p = 0;
  return q;
}

/* mkdir -p */
static bool make_dirs(Diag *d, const char *path) {
  char *buf = mem_strdup(d->mem, path);
  for (char *p = buf + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char c = *p;
      *p = '\0';
      if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return diag_error(d, (Loc){0}, "cannot create directory '%s': %s; expected a writable "
                                       "path for -o", buf, strerror(errno));
      *p = c;
      if (!c) break;
    }
  }
  return true;
}

/* One compile per output directory at a time: dir is flock'd (exclusively, held until mtc exits),
 * so that two compiles into it at once cannot leave one's plan.json beside the other's step.h (they
 * would also remove each other's .tmp files). shown: dir as messages print it. False with the error
 * when another holds it. */
static bool lock_dir(Diag *d, const char *dir, const char *shown) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return diag_error(d, (Loc){0}, "cannot open directory '%s': %s; expected a writable path for -o", shown,
                                strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return true; /* fd stays open: the lock lasts until exit */
  int e = errno;
  close(fd);
  return diag_error(d, (Loc){0}, "-o %s: %s; expected one mtc compile at a time per directory (wait for the other, "
                    "or give another -o)", shown, e == EWOULDBLOCK ? "another mtc compile is writing it now" : strerror(e));
}

static bool write_text(Diag *d, const char *path, const Plan *p) {
  OutFile o;
  FILE *f = out_open(d, &o, path);
  if (!f) return false;
  report_plan_headline(f, p);
  report_text(f, p->md);
  report_plan_text(f, p, false);
  return out_close(d, &o);
}

/* Whether path is missing, or a regular file holding exactly text: what import-hf may write
 * over without --force (a spec edited since it was imported is kept). */
static bool same_or_missing(const char *path, const char *text) {
  struct stat st;
  if (lstat(path, &st) != 0) return true; /* missing (or unreadable: out_open says why) */
  if (!S_ISREG(st.st_mode)) return true; /* out_open refuses it, with its own message */
  size_t len = strlen(text);
  if ((size_t)st.st_size != len) return false;
  FILE *f = fopen(path, "rb");
  char *buf = f ? malloc(len + 1) : NULL;
  bool same = buf && fread(buf, 1, len + 1, f) == len && memcmp(buf, text, len) == 0;
  free(buf);
  if (f) fclose(f);
  return same;
}

static int import_cmd(const char *config, const char *out, bool force) {
  Mem mem = {0};
  Diag d = {.mem = &mem};
  char *spec = import_hf(&mem, &d, config);
  int status = EXIT_DONE;
  if (spec) { /* what it wrote must pass mtc check: a value the checks refuse is the config's error, said now */
    Diag v = {.mem = &mem};
    const char *base = strrchr(config, '/') ? strrchr(config, '/') + 1 : config;
    Spec *s = spec_load(&mem, &v, mem_printf(&mem, "(the spec imported from %s)", base), spec, strlen(spec), NULL, 0);
    if (!s || !model_build(&mem, &v, s)) {
      fprintf(stderr, "mtc: error: %s: a value of this config is outside what mtc accepts; the spec it imports to "
              "fails mtc check:\n%s", config, v.msg ? v.msg : "");
      spec = NULL, status = EXIT_BAD_INPUT;
    }
  }
  if (spec && out && !force && !same_or_missing(out, spec)) {
    diag_error(&d, (Loc){0}, "%s exists and is not the spec this import writes (edited since it was imported, or "
               "another file); expected a new path, or --force to replace it", out);
  } else if (spec && out) {
    OutFile o;
    if (out_open(&d, &o, out)) fputs(spec, o.f), out_close(&d, &o);
  } else if (spec) {
    fputs(spec, stdout);
  }
  if (d.msg) fputs(d.msg, stderr), status = EXIT_BAD_INPUT;
  mem_free(&mem);
  return status;
}

typedef struct {
  const char *cmd, *spec, *out;
  const char *backend, *real; /* mtc build */
  const char *preset;         /* mtc calibrate */
  const char *html;           /* mtc diff --html */
  const char **sets, **overs;
  int nsets, nover;
  bool json, csv, all;
  bool force;       /* compile: write into a non-empty directory that is not mtc's */
  bool allow_edits; /* build: build program files edited after compile wrote them */
} Args;

static int run(Args *a) {
  Mem mem = {0};
  Diag d = {.mem = &mem};
  int status = EXIT_DONE;
  Spec *s = spec_load(&mem, &d, a->spec, NULL, 0, a->sets, a->nsets);
  Model *md = s ? model_build(&mem, &d, s) : NULL;
  if (!md) {
    status = EXIT_BAD_INPUT;
  } else if (strcmp(a->cmd, "check") == 0) {
    char t[32], ac[32];
    units_fmt_count(t, sizeof t, (double)md->params_total);
    units_fmt_count(ac, sizeof ac, (double)md->params_active);
    const char *shown = out_shown(&mem, a->spec);
    printf("%s: ok (%s: %d layers, %s parameters, %s active)\n", shown, s->name, md->nlayers, t, ac);
  } else if (strcmp(a->cmd, "explain") == 0) {
    Plan *p = plan_search(&mem, md);
    report_explain(stdout, p);
    if (!p->feasible) status = EXIT_NO_PLAN;
  } else if (strcmp(a->cmd, "plan") == 0) {
    Plan *p = plan_search(&mem, md);
    if (a->json) {
      json_t *j = report_json(md);
      report_plan_json(j, p, true);
      if (!report_write_json(&d, j, NULL)) status = EXIT_BAD_INPUT;
      json_decref(j);
    } else {
      report_plan_headline(stdout, p);
      report_text(stdout, md);
      report_plan_text(stdout, p, true);
    }
    if (!p->feasible && status == EXIT_DONE) status = EXIT_NO_PLAN;
  } else { /* compile */
    Plan *p = plan_search(&mem, md);
    char *dir = a->out ? mem_strdup(&mem, a->out) : mem_printf(&mem, "generated/%s", s->name);
    json_t *j = report_json(md);
    report_plan_json(j, p, false);
    char *shown = out_shown(&mem, dir); /* dir as printed: no control bytes reach the terminal */
    bool ours = out_cmake_path_ok(&d, mem_printf(&mem, "-o %s", shown), dir) && out_dir_prepare(&d, dir, a->force) &&
                make_dirs(&d, dir) && lock_dir(&d, dir, shown); /* mtc may write here, alone */
    /* every output to FILE.tmp first, renamed all together once all are written: a failure to
     * write any (a full disk) leaves every file of an earlier compile as it was */
    /* the program's identity before this compile (its program.sum), to tell whether the programs
     * mtc build made here are still of the program this compile writes */
    char old_sum[17] = "", new_sum[17] = "";
    char why[8800]; /* an edited program (--force over it): what mtc build made of it is not this one */
    if (ours && out_program_unedited(dir, why, sizeof why)) out_hash_file(mem_printf(&mem, "%s/program.sum", dir), old_sum);
    out_batch_begin();
    char *plan_tmp = mem_printf(&mem, "%s/plan.json.tmp", dir);
    bool ok = ours && report_write_json(&d, j, mem_printf(&mem, "%s/plan.json", dir)) &&
              write_text(&d, mem_printf(&mem, "%s/plan.txt", dir), p) &&
              emit_memory_svg(&d, p, mem_printf(&mem, "%s/memory.svg", dir)) &&
              emit_timeline(&d, p, mem_printf(&mem, "%s/timeline.json", dir)) &&
              emit_report_html(&d, p, mem_printf(&mem, "%s/report.html", dir));
    json_decref(j);
    bool program = false;
    char hash[17];
    if (ok && p->feasible) {
      const char *base = strrchr(a->spec, '/') ? strrchr(a->spec, '/') + 1 : a->spec;
      if (!out_hash_file(plan_tmp, hash)) /* the new plan.json, not yet renamed */
        ok = diag_error(&d, (Loc){0}, "cannot read back %s: %s", plan_tmp, strerror(errno));
      program = ok && emit_step(&mem, &d, p, dir, base, hash) && emit_program(&mem, &d, p, dir, base) &&
                out_write_program_sum(&d, dir);
      ok = ok && program;
    }
    bool failed = !ours || out_batch_failed();
    if (!out_batch_end(&d, !failed)) {
      ok = program = false;
      if (ours && d.msg) /* after the error: what it means for DIR */
        d.msg = mem_printf(&mem, "%s  nothing in %s was changed: its files are those of the earlier compile, if any; "
                           "expected room to write them (free disk space) and run the compile again\n", d.msg, dir);
    } else {
      report_summary(stdout, p);
      printf("wrote %s/plan.json, plan.txt, memory.svg, timeline.json and report.html%s\n", shown,
             p->feasible ? "" : " (no feasible plan: see plan.txt)");
      const char *note = program ? emit_program_note(&mem, p) : NULL;
      if (program) printf("wrote %s/step.h, step.c, train.c, kernels.cu, CMakeLists.txt and launch.sbatch; build with: "
                          "mtc build %s\n%s", shown,
                          shell_word(&mem, shown[0] == '-' ? mem_printf(&mem, "./%s", shown) : shown), /* not an option */
                          note ? note : "");
      /* another program written over an earlier one: what mtc build made of the earlier one would
       * still run it (another model, another plan), so it goes, and the note says to rebuild */
      int stale = program && (!out_hash_file(mem_printf(&mem, "%s/program.sum", dir), new_sum) ||
                              strcmp(old_sum, new_sum) != 0) ? out_remove_built(dir) : 0;
      if (stale)
        printf("note: removed %d program(s) mtc build made in %s (build.../train): built from the earlier program "
               "there, not this one; rebuild with: mtc build %s\n", stale, shown,
               shell_word(&mem, shown[0] == '-' ? mem_printf(&mem, "./%s", shown) : shown));
      /* no program written (infeasible, a model with no program yet): none of an earlier compile stays */
      if (!program && out_remove_program(dir) > 0)
        printf("removed the program an earlier compile wrote in %s (step.h, step.c, train.c, ..., build/train): "
               "this plan has none\n", shown);
    }
    if (!ok) status = EXIT_BAD_INPUT;
    else if (!p->feasible) status = EXIT_NO_PLAN;
  }
  if (d.msg) fputs(d.msg, stderr);
  mem_free(&mem);
  return status;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage_main, stderr);
    return EXIT_BAD_INPUT;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    if (argc > 2 && strcmp(cmd, "help") == 0) {
      for (size_t i = 0; i < sizeof usage_cmd / sizeof usage_cmd[0]; i++)
        if (strcmp(argv[2], usage_cmd[i][0]) == 0) return fputs(usage_cmd[i][1], stdout), finish(EXIT_DONE);
      char msg[256];
      snprintf(msg, sizeof msg, "no help for '%.100s'; expected check, plan, compile, build, export, explain, sweep, diff, import-hf, calibrate or keys", argv[2]);
      return usage_error(NULL, msg);
    }
    fputs(usage_main, stdout);
    return finish(EXIT_DONE);
  }
  if (!strcmp(cmd, "--version")) {
    printf("mtc %s\n", MTC_VERSION);
    return finish(EXIT_DONE);
  }
  const char *help = NULL;
  for (size_t i = 0; i < sizeof usage_cmd / sizeof usage_cmd[0]; i++)
    if (strcmp(cmd, usage_cmd[i][0]) == 0) help = usage_cmd[i][1];
  if (!help) {
    char msg[256];
    snprintf(msg, sizeof msg, "unknown command '%.100s'; expected check, plan, compile, build, export, explain, sweep, diff, import-hf, calibrate or keys", cmd);
    return usage_error(NULL, msg);
  }

  /* long options get their own values (LONG + short letter) so that an error can name the
   * spelling that was used: getopt reports the value in optopt */
  enum { LONG = 1000 };
  static const struct option opts[] = {
      {"set", required_argument, NULL, LONG + 's'}, {"json", no_argument, NULL, LONG + 'j'},
      {"output", required_argument, NULL, LONG + 'o'}, {"help", no_argument, NULL, LONG + 'h'},
      {"version", no_argument, NULL, LONG + 'V'}, {"over", required_argument, NULL, LONG + 'O'},
      {"csv", no_argument, NULL, LONG + 'c'}, {"all", no_argument, NULL, LONG + 'a'},
      {"backend", required_argument, NULL, LONG + 'b'}, {"real", required_argument, NULL, LONG + 'r'},
      {"force", no_argument, NULL, LONG + 'f'}, {"allow-edits", no_argument, NULL, LONG + 'e'},
      {"preset", required_argument, NULL, LONG + 'p'}, {"spec", required_argument, NULL, LONG + 'S'},
      {"html", required_argument, NULL, LONG + 'H'}, {NULL, 0, NULL, 0}};
  Args a = {.cmd = cmd};
  a.sets = calloc((size_t)argc, sizeof *a.sets);
  a.overs = calloc((size_t)argc, sizeof *a.overs);
  if (!a.sets || !a.overs) return EXIT_BAD_INPUT;
  int status = -1, c;
  opterr = 0;
  optind = 1;
  while (status < 0 && (c = getopt_long(argc - 1, argv + 1, ":s:o:hj", opts, NULL)) != -1) {
    char msg[256];
    const char *lname = NULL; /* the long option an error is about, if it was one */
    for (const struct option *o = opts; o->name; o++)
      if (o->val == optopt) lname = o->name;
    if (c > LONG) c -= LONG;
    switch (c) {
    case 's':
      a.sets[a.nsets++] = optarg;
      status = spaced_value(cmd, "--set", "KEY=VALUE", optarg, optind + 1 < argc ? argv[optind + 1] : NULL);
      break;
    case 'j':
      if (strcmp(cmd, "plan") != 0) status = usage_error(cmd, "--json applies to 'plan' only");
      a.json = true;
      break;
    case 'o':
      if (strcmp(cmd, "compile") != 0 && strcmp(cmd, "import-hf") != 0 && strcmp(cmd, "calibrate") != 0)
        status = usage_error(cmd, "-o applies to 'compile', 'import-hf' and 'calibrate' only");
      a.out = optarg;
      break;
    case 'O':
      if (strcmp(cmd, "sweep") != 0) status = usage_error(cmd, "--over applies to 'sweep' only");
      a.overs[a.nover++] = optarg;
      if (status < 0) status = spaced_value(cmd, "--over", "KEY=V1,V2,...", optarg, optind + 1 < argc ? argv[optind + 1] : NULL);
      break;
    case 'c':
      if (strcmp(cmd, "sweep") != 0) status = usage_error(cmd, "--csv applies to 'sweep' only");
      a.csv = true;
      break;
    case 'f':
      if (strcmp(cmd, "compile") != 0 && strcmp(cmd, "import-hf") != 0)
        status = usage_error(cmd, "--force applies to 'compile' and 'import-hf' only");
      a.force = true;
      break;
    case 'e':
      if (strcmp(cmd, "build") != 0) status = usage_error(cmd, "--allow-edits applies to 'build' only");
      a.allow_edits = true;
      break;
    case 'a':
      if (strcmp(cmd, "diff") != 0) status = usage_error(cmd, "--all applies to 'diff' only");
      a.all = true;
      break;
    case 'H':
      if (strcmp(cmd, "diff") != 0) status = usage_error(cmd, "--html applies to 'diff' only");
      a.html = optarg;
      break;
    case 'b':
    case 'r':
      if (strcmp(cmd, "build") != 0) status = usage_error(cmd, c == 'b' ? "--backend applies to 'build' only" : "--real applies to 'build' only");
      *(c == 'b' ? &a.backend : &a.real) = optarg;
      break;
    case 'p':
      if (strcmp(cmd, "calibrate") != 0) status = usage_error(cmd, "--preset applies to 'calibrate' only");
      a.preset = optarg;
      break;
    case 'S':
      if (strcmp(cmd, "export") != 0) status = usage_error(cmd, "--spec applies to 'export' only");
      a.spec = optarg;
      break;
    case 'h': fputs(help, stdout); status = EXIT_DONE; break;
    case 'V': printf("mtc %s\n", MTC_VERSION); status = EXIT_DONE; break;
    case ':':
      if (lname) snprintf(msg, sizeof msg, "option '--%s' needs a value", lname);
      else snprintf(msg, sizeof msg, "option '-%c' needs a value", optopt);
      status = usage_error(cmd, msg);
      break;
    default: /* '?': unknown, or a value given to a long option that takes none */
      if (lname) snprintf(msg, sizeof msg, "option '--%s' takes no value", lname);
      else if (optopt) snprintf(msg, sizeof msg, "unknown option '-%c'", optopt);
      else snprintf(msg, sizeof msg, "unknown option '%.100s'", argv[optind]); /* argv+1 [optind-1] */
      status = usage_error(cmd, msg);
      break;
    }
  }
  if (status < 0) {
    int nargs = argc - 1 - optind;
    if (strcmp(cmd, "keys") == 0) {
      if (nargs != 0 || a.nsets) status = usage_error(cmd, "takes no SPEC and no --set");
      else spec_print_keys(stdout), status = EXIT_DONE;
    } else if (strcmp(cmd, "export") == 0) {
      if (nargs != 2 || (a.nsets && !a.spec))
        status = usage_error(cmd, nargs != 2 ? "expected CKPT and OUT.safetensors, or CKPT and OUTDIR with --spec SPEC"
                                             : "--set applies with --spec only (the spec's overrides)");
      else status = export_run(argv[1 + optind], argv[2 + optind], a.spec, a.sets, a.nsets);
    } else if (strcmp(cmd, "calibrate") == 0) {
      if (!nargs || a.nsets || !a.preset || !a.out)
        status = usage_error(cmd, !nargs ? "expected one or more PROFILE files (train --profile FILE)"
                                  : a.nsets ? "takes no --set"
                                  : !a.preset ? "needs --preset NAME (the preset to calibrate, e.g. cpu)"
                                              : "needs -o PRESET.yaml (the calibrated preset to write)");
      else status = calibrate_run((const char *const *)argv + 1 + optind, nargs, a.preset, a.out);
    } else if (strcmp(cmd, "diff") == 0) {
      if (nargs != 2) status = usage_error(cmd, "expected two plans or specs, A and B");
      else status = diff_run(argv[1 + optind], argv[2 + optind], a.sets, a.nsets, a.all, a.html);
    } else if (nargs != 1) {
      bool dir = strcmp(cmd, "build") == 0, hf = strcmp(cmd, "import-hf") == 0;
      status = usage_error(cmd, nargs ? (dir ? "expected one DIR" : hf ? "expected one CONFIG file" : "expected one SPEC file")
                                      : (dir  ? "missing DIR (the directory mtc compile wrote)"
                                         : hf ? "missing CONFIG (a Hugging Face config.json)"
                                              : "missing SPEC file"));
    } else if (strcmp(cmd, "build") == 0) {
      status = a.nsets ? usage_error(cmd, "takes no --set: compile again instead")
                       : build_run(argv[1 + optind], a.backend ? a.backend : "cpu", a.real ? a.real : "float",
                                   a.allow_edits);
    } else if (strcmp(cmd, "import-hf") == 0) {
      status = a.nsets ? usage_error(cmd, "takes no --set: it writes a spec from CONFIG alone; pass --set to the "
                                          "commands that read that spec")
                       : import_cmd(argv[1 + optind], a.out, a.force);
    } else if (strcmp(cmd, "sweep") == 0) {
      if (!a.nover) status = usage_error(cmd, "needs at least one --over KEY=V1,V2,...");
      else status = sweep_run(argv[1 + optind], a.sets, a.nsets, a.overs, a.nover, a.csv);
    } else {
      a.spec = argv[1 + optind];
      status = run(&a);
    }
  }
  free(a.sets);
  free(a.overs);
  return finish(status);
}
