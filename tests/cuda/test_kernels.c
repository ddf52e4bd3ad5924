/* test_kernels.c — the cuda backend's ops against the cpu backend's, as a generated program
 * calls them: the mtrt_ops.h API over device pointers (runtime/cuda/ops.c, ops_moe.c: cuBLAS
 * GEMMs (the router's logits too), the experts' grouped GEMMs, the kernels of
 * templates/kernels/NN-*.cu) and the device optimizer (train_cuda.c, muon_cuda.c's
 * Newton-Schulz), forward and backward on random inputs.
 *
 * The cuda runtime is set up as train.c does it: rt_cuda_setup with kernels.cu after a prelude
 * of the test's shapes, fp32 storage (ACT_FLOAT), as compiler/emit_prog.c writes it. Three
 * passes, each a fresh set-up, then, with the same settings, one set-up per rank of a cp plan
 * (kernels.cu of a rank's shapes and CP_SEQ_LEN) for the span attention's checks:
 *   fp32 GEMMs (MTC_GEMM=fp32), flash attention            tight, but bf16 tensor-core attention
 *   fp32 GEMMs, simple attention (MTC_ATTENTION=simple)    tight everywhere; the experts as the GEMM loop
 *   bf16 GEMMs (the default, CUBLAS_COMPUTE_32F_FAST_16BF) loose where a GEMM is involved
 * The reference is the cpu backend's ops, linked under ref_ names (tests/cuda/ref_ops.cmake):
 * ref_matmul_forward is runtime/cpu's rt_matmul_forward, rt_matmul_forward the cuda one.
 * An error is max |cuda − cpu| / max |cpu| over a tensor; the last lines are the table of
 * errors per op and pass.
 *   usage: test_kernels TEMPLATES/kernels/NN-*.cu... (in name order: the generated kernels.cu's body)
 * Without a GPU it prints why and exits 77 (ctest: skipped); tests/cuda_emu runs it on the CPU.
 *
 * The checks are by op family in test_kernels_*.c, the shapes, tolerances and the helpers they
 * share in test_kernels.h (defined here, with main and the passes).
 *
 * Built twice from these files (tests/CMakeLists.txt): test_kernels against mtrt_cuda_f32act
 * (act = float, kernels.cu with ACT_FLOAT: the tight checks above), and test_kernels_bf16 against
 * mtrt_cuda, the runtime the generated programs link (MTRT_ACT_BF16: act is bf16, kernels.cu
 * without ACT_FLOAT, cuBLAS with bf16 operands and CUBLAS_COMPUTE_32F, the bf16-only casts). In the
 * bf16 build every act buffer is uploaded as bf16 (deva: the host's float rounded to nearest
 * even) and read back as float (check_dev on an act pointer); the random inputs are drawn
 * bf16-exact (rnd), so the cpu reference sees the very values the device holds and only the
 * rounding of the device's own results and intermediates counts. Its passes are flash and simple
 * attention (MTC_GEMM does not apply to bf16 operands); its tolerances are at ACT_TOL (test_kernels.h). */
#include <cuda_runtime_api.h>

#include "test_kernels.h"

int check_failures, check_count; /* check.h's counts (CHECK_SHARED), for every file */

/* The passes, each a fresh set-up of the runtime; the tolerances at TOL and ACT_TOL (test_kernels.h). */
#ifndef MTRT_ACT_BF16
static const Pass passes[] = {
    {"fp32/flash", "fp32", NULL, TOL, 2e-2},
    {"fp32/simple", "fp32", "simple", TOL, TOL, 0, 1},
    {"bf16/flash", "bf16", NULL, 2e-2, 2e-2},
};
#else
static const Pass passes[] = {
    {"bf16act/cudnn", "bf16", NULL, ACT_TOL, 2 * ACT_TOL, 1},
    {"bf16act/flash", "bf16", "flash", ACT_TOL, 2 * ACT_TOL, 0, 1},
    {"bf16act/simple", "bf16", "simple", ACT_TOL, ACT_TOL, 0},
};
#endif
enum { NPASS = sizeof passes / sizeof passes[0] };

/* ---- results: the error of every check, per pass ---- */
enum { MAXRES = 256 };
static struct {
  const char *name;
  double err[NPASS], tol[NPASS];
} res[MAXRES];
static int nres, pass;

/* Records check `name`'s error in this pass; a failure when above tol (or NaN). */
static void record(const char *name, double err, double tol) {
  int i = 0;
  while (i < nres && strcmp(res[i].name, name) != 0) i++;
  if (i == nres) {
    if (nres == MAXRES) fprintf(stderr, "test_kernels: too many checks\n"), exit(1);
    res[nres++].name = strdup(name); /* (names may be built in a buffer) */
    for (int p = 0; p < NPASS; p++) res[i].err[p] = NAN, res[i].tol[p] = -1;
  }
  res[i].err[pass] = err, res[i].tol[pass] = tol;
  if (!(err <= tol)) fprintf(stderr, "  FAIL %s (%s): error %.3e above %.0e\n", name, passes[pass].name, err, tol);
  CHECK(err <= tol);
}

/* max |got − ref| / max |ref| over n values; NaN when got holds a NaN */
static double err_of(const float *got, const float *ref, size_t n) {
  double d = 0, s = 1e-30;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - ref[i]);
    if (isnan(e)) return NAN;
    d = fmax(d, e), s = fmax(s, fabs(ref[i]));
  }
  return d / s;
}

/* ---- memory: host and device buffers of one pass, freed at its end ---- */
enum { MAXBUF = 1024 };
static void *hbufs[MAXBUF], *dbufs[MAXBUF];
static int nh, nd;
static unsigned seed = 1;

/* act <-> float on the host. bf16: the upper 16 bits of the float, rounded to nearest even (as
 * kernels.cu's cast_bf16 and __float2bfloat16_rn; the inputs are finite); float: itself. */
#ifdef MTRT_ACT_BF16
static act to_act(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (act){(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
#else
static act to_act(float f) { return f; }
#endif
/* f as act holds it: bf16-exact in the bf16 build */
float act_exact(float f) { return mtrt_act_float(to_act(f)); }

/* n zeroed floats (or ints) on the host */
float *host(size_t n) {
  if (nh == MAXBUF) fprintf(stderr, "test_kernels: too many buffers\n"), exit(1);
  return hbufs[nh++] = calloc(n, sizeof(float));
}
/* n values uniform in [−scale/2, scale/2) */
float *rnd(size_t n, float scale) {
  float *x = host(n);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = act_exact(scale * ((float)(seed >> 8) / 16777216.0f - 0.5f)); /* bf16-exact in the bf16 build */
  }
  return x;
}
/* an index uniform in [0, n) */
int32_t rnd_index(int n) {
  seed = seed * 1664525u + 1013904223u;
  return (int32_t)(seed >> 8) % n;
}
/* bytes on the device (rt_cuda_alloc: zeroed), a copy of src unless NULL */
static void *dev(const void *src, size_t bytes) {
  char err[256];
  void *d = rt_cuda_alloc(bytes, err, sizeof err);
  if (!d || nd == MAXBUF) fprintf(stderr, "test_kernels: %s\n", d ? "too many buffers" : err), exit(1);
  if (src) rt_cuda_upload(d, src, bytes);
  return dbufs[nd++] = d;
}
/* n floats (ints) on the device, as dev */
float *devf(const float *x, size_t n) { return dev(x, n * sizeof(float)); }
int32_t *devi(const int32_t *x, size_t n) { return dev(x, n * sizeof(int32_t)); }
/* n act values on the device (zeroed when x is NULL, else x converted by to_act) */
act *deva(const float *x, size_t n) {
  act *h = x ? malloc(n * sizeof(act)) : NULL;
  for (size_t i = 0; x && i < n; i++) h[i] = to_act(x[i]);
  act *d = dev(h, n * sizeof(act));
  free(h);
  return d;
}
/* Frees every buffer of the pass. */
static void free_pass(void) {
  while (nd) rt_cuda_free(dbufs[--nd]);
  while (nh) free(hbufs[--nh]);
}

/* Check `name`: n floats of device buffer d against the reference. */
void check_real(const char *name, const float *d, const float *ref, size_t n, double tol) {
#ifdef MTRT_ACT_BF16
  /* an fp32 result (rstd, lse, logits, router weights, losses, the optimizer's state) of
   * bf16-exact inputs is fp32 arithmetic as in the fp32 build: 1e-4, not ACT_TOL (the flash
   * attention's lse keeps its pass's 2 ACT_TOL: its tensor-core products are bf16) */
  if (tol == ACT_TOL) tol = 1e-4;
#endif
  float *got = host(n);
  rt_cuda_download(got, d, n * sizeof *got);
  record(name, err_of(got, ref, n), tol);
}
#ifdef MTRT_ACT_BF16
/* Check `name`: n act values of device buffer d, read back as float, against the reference. */
void check_act(const char *name, const act *d, const float *ref, size_t n, double tol) {
  act *raw = malloc(n * sizeof *raw);
  float *got = host(n);
  rt_cuda_download(raw, d, n * sizeof *raw);
  for (size_t i = 0; i < n; i++) got[i] = mtrt_act_float(raw[i]);
  free(raw);
  record(name, err_of(got, ref, n), tol);
}
#endif
/* Check `name`: n ints of device buffer d equal the reference (the error is the mismatch count). */
void check_ints(const char *name, const int32_t *d, const int32_t *ref, size_t n) {
  int32_t *got = (int32_t *)host(n);
  rt_cuda_download(got, d, n * sizeof *got);
  int bad = 0;
  for (size_t i = 0; i < n; i++) bad += got[i] != ref[i];
  record(name, bad, 0);
}
/* Check `name`: a scalar, relative to the reference. */
void check_scalar(const char *name, double got, double ref, double tol) {
#ifdef MTRT_ACT_BF16
  if (tol == ACT_TOL) tol = 1e-4; /* an fp32 loss of bf16-exact inputs: as check_real */
#endif
  record(name, fabs(got - ref) / fmax(fabs(ref), 1e-30), tol);
}

/* ---- the passes ---- */

/* kernels.cu: the files at paths[0..n) (templates/kernels/NN-*.cu in name order) after the prelude
 * of the test's shapes, as emit_prog.c writes it (malloc'ed; NULL when a file cannot be read);
 * cp > 1: the context-parallel pass's (a rank's CP_T tokens of B sequences of CP_S, CP_SEQ_LEN). */
static char *kernels_source(char **paths, int n, int cp, size_t *len) {
  char pre[640], cps[64] = "";
  if (cp > 1) snprintf(cps, sizeof cps, "#define CP_SEQ_LEN %d\n", CP_S);
  int pl = snprintf(pre, sizeof pre,
                    "%s#define TOKENS %d\n#define SEQ_LEN %d\n%s#define HIDDEN %d\n#define HEADS %d\n"
                    "#define KV_HEADS %d\n#define HEAD_DIM %d\n#define ROPE_THETA ((float)%.17g)\n#define RMS_EPS 1e-5f\n"
                    "#define VOCAB %d\n#define VOCAB_CHUNK %d\n#define EXPERTS %d\n#define TOP_K %d\n\n",
                    MTRT_ACT_IS_BF16 ? "" : "#define ACT_FLOAT\n", cp > 1 ? B * CP_T : N, cp > 1 ? CP_T : T, cps, C,
                    NH, NKV, HD, (double)THETA, V, CH, E, K);
  char *src = malloc((size_t)pl + 1);
  memcpy(src, pre, (size_t)pl);
  *len = (size_t)pl;
  for (int i = 0; i < n; i++) {
    FILE *f = fopen(paths[i], "rb");
    if (!f) return fprintf(stderr, "test_kernels: cannot open %s\n", paths[i]), free(src), NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    src = realloc(src, *len + (size_t)size + 1);
    *len += fread(src + *len, 1, (size_t)size, f);
    fclose(f);
  }
  src[*len] = 0;
  return src;
}

/* MTC_GEMM, MTC_ATTENTION as pass p says */
static void pass_env(const Pass *p) {
  setenv("MTC_GEMM", p->gemm, 1);
  if (p->attention) setenv("MTC_ATTENTION", p->attention, 1);
  else unsetenv("MTC_ATTENTION");
}

/* The context-parallel part of pass p: for each rank r of CP, the runtime set up for a cp plan's
 * rank r (kernels.cu of cp_src: a rank's shapes and CP_SEQ_LEN), the span attention's checks,
 * teardown. Returns -1 when a set-up fails. */
static int run_span_pass(const Pass *p, const char *cp_src, size_t len) {
  pass_env(p);
  for (int r = 0; r < CP; r++) {
    RtCudaConfig cfg = {cp_src, len, MTRT_CUDA_INCLUDE, B * CP_T, NH, E, K, 4 << 20, B, CP_S, NKV, HD, HD, 1,
                        p->loop_rows, CP, r};
    static char err[1 << 16];
    if (rt_cuda_setup(&cfg, 0, err, sizeof err) != 0) return fprintf(stderr, "test_kernels: cp rank %d: %s\n", r, err), -1;
    char line[1024];
    rt_cuda_describe(line, sizeof line);
    printf("test_kernels: pass %s, cp %d rank %d: %s\n", p->name, CP, r, line);
    CHECK(strstr(line, p->cudnn ? "attention cuDNN" : p->attention && strcmp(p->attention, "simple") == 0 ? "attention span (warp"
                                                                                                   : "attention span flash") != NULL);
    test_attention_span(p, r);
    rt_cuda_sync("test_kernels");
    free_pass();
    rt_cuda_teardown();
  }
  return 0;
}

/* One pass: the cuda runtime set up as train.c does (MTC_GEMM, MTC_ATTENTION as the pass says),
 * every check, teardown. Returns -1 when the set-up fails. */
static int run_pass(const Pass *p, const char *src, size_t len) {
  pass_env(p);
  /* the attention plans built at start-up: MLA's shape (the dQ accumulator sized for its q/k dim) */
  RtCudaConfig cfg = {src, len, MTRT_CUDA_INCLUDE, N, NH, E, K, 4 << 20, B, T, NKV, MLA_HD, MLA_VD, 1, p->loop_rows};
  static char err[1 << 16];
  if (rt_cuda_setup(&cfg, 0, err, sizeof err) != 0) return fprintf(stderr, "test_kernels: %s\n", err), -1;
  char line[1024];
  rt_cuda_describe(line, sizeof line);
  printf("test_kernels: pass %s: %s\n", p->name, line);
  CHECK(strstr(line, p->cudnn ? "attention cuDNN" : p->attention && strcmp(p->attention, "simple") == 0 ? "attention simple"
                                                                                                 : "attention flash") != NULL);
  seed = 1; /* every pass draws the same inputs */
  test_elementwise();
  test_norms();
  test_rope();
  test_matmul(p);
  test_attention(p);
  test_moe();
  test_experts(p);
  test_experts_gelu(p);
  test_lm_head(p);
  test_optimizer();
  test_newton_schulz();
  rt_cuda_sync("test_kernels");
  free_pass();
  rt_cuda_teardown();
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* in order with the runtime's notes on stderr */
  int gpus = 0;
  cudaError_t e = cudaGetDeviceCount(&gpus);
  if (e != cudaSuccess || gpus == 0) {
    printf("test_kernels: skipped: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 77;
  }
  if (argc < 2) return fprintf(stderr, "usage: test_kernels TEMPLATES/kernels/*.cu\n"), 2;
  size_t len, cp_len;
  char *src = kernels_source(argv + 1, argc - 1, 1, &len), *cp_src = kernels_source(argv + 1, argc - 1, CP, &cp_len);
  if (!src || !cp_src) return 1;
  for (pass = 0; pass < NPASS; pass++)
    if (run_pass(&passes[pass], src, len) != 0 || run_span_pass(&passes[pass], cp_src, cp_len) != 0)
      return free(src), free(cp_src), 1;
  free(src), free(cp_src);
  printf("test_kernels: max |cuda - cpu| / max |cpu| per op / limit\n  %-30s", "op");
  for (int p = 0; p < NPASS; p++) printf("  %-17s", passes[p].name);
  for (int i = 0; i < nres; i++) {
    printf("\n  %-30s", res[i].name);
    for (int p = 0; p < NPASS; p++)
      printf("  %8.2e/%-6.0e%s", res[i].err[p], res[i].tol[p], res[i].err[p] <= res[i].tol[p] ? " " : "!");
  }
  printf("\n");
  return CHECK_DONE("test_kernels");
}
