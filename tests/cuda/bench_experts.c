/* bench_experts.c — the routed experts' speed on one GPU through the runtime the programs link
 * (mtrt_cuda, bf16): rt_experts_forward and rt_experts_backward (three projections of a SwiGLU
 * FFN per expert and the SwiGLU between them) on each path of ops_moe.c, the loop of cuBLAS GEMMs
 * over streams and the one grouped call, against the same FFN as dense GEMMs over all the rows
 * (rt_matmul_forward/backward, the program's dense path): the same FLOPs, 6·rows·hidden·width
 * forward and twice that backward. Shapes, at the rows per expert of their plan.json's experts
 * object: europa-1t's (96 local experts of 6,144 × 1,792 at EP 4, 5,461 rows each per pass: about
 * 50 GB of buffers), moe-1b's (16 experts of 2,048 × 1,024, 1,024 rows each) and moe-1b with 64
 * fine-grained experts of 256 (256 rows each). Uniform rows per expert. Times from
 * CUDA events around ITERS calls after a warm-up; a GPU measurement, never a test.
 * tools/device-run.sh runs it (its `experts` check); one EXPERTS_BENCH row per shape and path.
 *   usage: bench_experts KERNEL.cu...   (templates/kernels' files)
 *          bench_experts --check-kernels ARCH KERNEL.cu...   compiles each shape's kernels.cu into
 *          $MTC_KERNEL_CACHE and exits (no GPU: tools/device-pack.sh) */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_cuda.h"
#include "mtrt_ops.h"

enum { WARMUP = 1, ITERS = 5, TOKENS_ = 4096, TOPK_ = 4 };

typedef struct {
  const char *name;
  int experts, rows, hidden, width; /* local experts, rows per expert, C, F */
} Shape;

static const Shape shapes[] = {
    {"europa-1t", 96, 5461, 6144, 1792},
    {"moe-1b", 16, 1024, 2048, 1024},
    {"moe-1b-64e", 64, 256, 2048, 256},
};

/* kernels.cu for shape s: the templates after the defines they need (bench_attention.c's prelude;
 * the experts' shapes: HIDDEN and EXPERTS). */
static char *kernels(char **paths, int n, const Shape *s, size_t *len) {
  char pre[600];
  int pl = snprintf(pre, sizeof pre,
                    "#define TOKENS %d\n#define SEQ_LEN %d\n#define HIDDEN %d\n#define HEADS 1\n#define KV_HEADS 1\n"
                    "#define HEAD_DIM 64\n#define V_DIM 64\n#define ROPE_THETA 10000.0f\n#define RMS_EPS 1e-5f\n"
                    "#define VOCAB 256\n#define VOCAB_CHUNK 256\n#define EXPERTS %d\n#define TOP_K %d\n\n",
                    TOKENS_, TOKENS_, s->hidden, s->experts, TOPK_);
  char *src = malloc((size_t)pl + 1);
  memcpy(src, pre, (size_t)pl), *len = (size_t)pl;
  for (int i = 0; i < n; i++) {
    FILE *f = fopen(paths[i], "rb");
    if (!f) return fprintf(stderr, "bench_experts: cannot open %s\n", paths[i]), free(src), NULL;
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

static void *dev(size_t bytes) {
  char err[256];
  void *p = rt_cuda_alloc(bytes, err, sizeof err);
  if (!p) fprintf(stderr, "bench_experts: %s\n", err), exit(1);
  return p;
}

/* n bf16 values of about ±scale/2: a 32 Mi-value block from a fixed seed, uploaded over and over
 * (random data: zeros run faster than real data). */
static void fill(void *d, size_t n, float scale) {
  enum { BLOCK = 1 << 25 };
  static unsigned short *h;
  static float made;
  if (!h) h = malloc((size_t)BLOCK * 2);
  if (made != scale) {
    unsigned s = 12345;
    for (size_t i = 0; i < BLOCK; i++) {
      s = s * 1664525u + 1013904223u;
      float f = scale * ((float)(s >> 8) / 16777216.0f - 0.5f);
      unsigned u;
      memcpy(&u, &f, 4);
      h[i] = (unsigned short)(u >> 16);
    }
    made = scale;
  }
  for (size_t at = 0; at < n; at += BLOCK)
    rt_cuda_upload((unsigned short *)d + at, h, 2 * (n - at < BLOCK ? n - at : BLOCK));
}

typedef struct {
  act *x, *y, *dy, *dx, *g, *u, *h, *dg, *du, *dh, *wg, *wu, *wd, *dwg, *dwu, *dwd;
  int *off;
} Bufs;

/* ms per call of f(b, s, dense) forward (bwd 0) or backward, from events on the legacy stream
 * (a blocking stream: it waits for the runtime's, whose lanes join back into it). */
static double timed(const Shape *s, Bufs *b, int dense, int bwd) {
  int E = s->experts, C = s->hidden, F = s->width, R = E * s->rows;
  size_t rf = (size_t)R * F;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  for (int i = 0; i < WARMUP + ITERS; i++) {
    if (i == WARMUP) rt_cuda_sync("bench_experts warm-up"), cudaEventRecord(e0, NULL);
    if (dense && !bwd) { /* the same FFN over all rows: one expert's weights */
      rt_matmul_forward(b->g, b->x, b->wg, NULL, R, C, F);
      rt_matmul_forward(b->u, b->x, b->wu, NULL, R, C, F);
      rt_swiglu_forward(b->h, b->g, b->u, (int64_t)rf);
      rt_matmul_forward(b->y, b->h, b->wd, NULL, R, F, C);
    } else if (dense) { /* zeroed as rt_experts_backward zeroes its scratch */
      rt_zero(b->dh, rf), rt_zero(b->dg, rf), rt_zero(b->du, rf);
      rt_matmul_backward(b->dh, b->dwd, NULL, b->dy, b->h, b->wd, R, F, C);
      rt_swiglu_backward(b->dg, b->du, b->dh, b->g, b->u, (int64_t)rf);
      rt_matmul_backward(b->dx, b->dwg, NULL, b->dg, b->x, b->wg, R, C, F);
      rt_matmul_backward(b->dx, b->dwu, NULL, b->du, b->x, b->wu, R, C, F);
    } else if (!bwd) {
      rt_experts_forward(b->y, b->g, b->u, b->h, b->x, b->wg, b->wu, b->wd, b->off, E, E, 0, C, F);
    } else {
      rt_experts_backward(b->dx, b->dwg, b->dwu, b->dwd, b->dy, b->x, b->g, b->u, b->h, b->wg, b->wu, b->wd, b->off, E,
                          E, 0, C, F, b->dh, b->dg, b->du);
    }
  }
  cudaEventRecord(e1, NULL);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  rt_cuda_sync("bench_experts");
  return ms / ITERS;
}

/* One shape on the path loop says (1 the GEMM loop, 0 the grouped call), with the dense FFN too
 * when dense: ms per call into ms[0..1] (experts fwd, bwd) and ms[2..3] (dense); -1 on a failed
 * set-up (message printed). */
static int run(const Shape *s, int loop, int dense, char **paths, int n, double *ms) {
  unsetenv("MTC_EXPERTS");
  size_t len;
  char *src = kernels(paths, n, s, &len);
  if (!src) return -1;
  RtCudaConfig cfg = {src, len, MTRT_CUDA_INCLUDE, TOKENS_, 1, s->experts, TOPK_, (size_t)256 << 20, 1, TOKENS_,
                      0, 0, 0, 0, loop};
  static char err[1 << 16];
  if (rt_cuda_setup(&cfg, 0, err, sizeof err)) return fprintf(stderr, "bench_experts: %s\n", err), free(src), -1;
  char line[1400];
  rt_cuda_describe(line, sizeof line);
  printf("bench_experts: %s %s: %s\n", s->name, loop ? "loop" : "grouped", line);
  size_t E = (size_t)s->experts, C = (size_t)s->hidden, F = (size_t)s->width, R = E * (size_t)s->rows;
  Bufs b;
  act **rc[] = {&b.x, &b.y, &b.dy, &b.dx}, **rf[] = {&b.g, &b.u, &b.h, &b.dg, &b.du, &b.dh},
      **w[] = {&b.wg, &b.wu, &b.wd, &b.dwg, &b.dwu, &b.dwd};
  for (int i = 0; i < 4; i++) *rc[i] = dev(2 * R * C);
  for (int i = 0; i < 6; i++) *rf[i] = dev(2 * R * F);
  for (int i = 0; i < 6; i++) *w[i] = dev(2 * E * F * C);
  fill(b.x, R * C, 2), fill(b.dy, R * C, 1), fill(b.dx, R * C, 1);
  for (int i = 0; i < 6; i++) fill(*w[i], E * F * C, 0.05f); /* the gradients are added to: not zeros either */
  int *off = malloc(sizeof(int) * (E + 1));
  for (size_t e = 0; e <= E; e++) off[e] = (int)(e * (size_t)s->rows);
  b.off = dev(sizeof(int) * (E + 1));
  rt_cuda_upload(b.off, off, sizeof(int) * (E + 1));
  free(off);
  ms[0] = timed(s, &b, 0, 0), ms[1] = timed(s, &b, 0, 1);
  if (dense) ms[2] = timed(s, &b, 1, 0), ms[3] = timed(s, &b, 1, 1);
  void *all[] = {b.x, b.y, b.dy, b.dx, b.g, b.u, b.h, b.dg, b.du, b.dh, b.wg, b.wu, b.wd, b.dwg, b.dwu, b.dwd, b.off};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) rt_cuda_free(all[i]);
  rt_cuda_teardown();
  free(src);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 3 && strcmp(argv[1], "--check-kernels") == 0) { /* each shape's kernels.cu into the cache */
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
      size_t len;
      char *src = kernels(argv + 3, argc - 3, &shapes[i], &len), log[1 << 14];
      int nk = 0, cached = 0;
      size_t bytes = 0;
      if (!src || rt_cuda_compile(src, len, "kernels.cu", argv[2], MTRT_CUDA_INCLUDE, NULL, NULL, &bytes, &nk, &cached, log,
                                  sizeof log))
        return fprintf(stderr, "bench_experts: %s: %s\n", shapes[i].name, src ? log : "no source"), 1;
      printf("bench_experts: %s: %d kernels for %s%s\n", shapes[i].name, nk, argv[2], cached ? " (cached)" : "");
      free(src);
    }
    return 0;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) return printf("bench_experts: skipped: no GPU\n"), 77;
  if (argc < 2) return fprintf(stderr, "usage: bench_experts KERNEL.cu... (templates/kernels' files)\n"), 2;
  printf("EXPERTS_BENCH %-11s %7s %5s %6s %5s %-7s %9s %9s %8s %8s %7s %7s\n", "shape", "experts", "rows", "hidden",
         "width", "path", "fwd ms", "bwd ms", "fwd TF/s", "bwd TF/s", "fwd/dense", "bwd/dense");
  int bad = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    const Shape *s = &shapes[i];
    double flops = 6.0 * s->experts * s->rows * (double)s->hidden * s->width, loop[4], grouped[4];
    if (run(s, 1, 1, argv + 1, argc - 1, loop) || run(s, 0, 0, argv + 1, argc - 1, grouped)) {
      bad = 1;
      continue;
    }
    const char *names[] = {"loop", "grouped", "dense"};
    double *f[] = {loop, grouped, loop + 2};
    for (int p = 0; p < 3; p++)
      printf("EXPERTS_BENCH %-11s %7d %5d %6d %5d %-7s %9.3f %9.3f %8.1f %8.1f %9.2f %9.2f\n", s->name, s->experts,
             s->rows, s->hidden, s->width, names[p], f[p][0], f[p][1], flops / (f[p][0] * 1e-3) / 1e12,
             2 * flops / (f[p][1] * 1e-3) / 1e12, loop[2] / f[p][0], loop[3] / f[p][1]);
  }
  return bad;
}
