/* bench_attention.c — causal attention's speed on one GPU through the runtime the programs link
 * (mtrt_cuda, bf16): cuDNN's fused flash attention (attn_cudnn.c) and, where the own flash kernel
 * compiles (equal head dims up to 128), MTC_ATTENTION=flash, forward and backward, one table row
 * per shape. FLOPs as the plan counts them (causal: B·heads·S²·(d_qk + d_v) forward, 2.5 × that
 * backward), times from CUDA events around ITERS calls after a warm-up; a GPU measurement, never
 * a test. tools/device-run.sh runs it (its `attn` check).
 *   usage: bench_attention KERNEL.cu...   (templates/kernels' files: the own kernels' sources)
 *          bench_attention --check-kernels ARCH KERNEL.cu...   compiles the flash runs' kernels.cu
 *          into $MTC_KERNEL_CACHE and exits (no GPU: tools/device-pack.sh, so the GPU's run
 *          compiles nothing) */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_cuda.h"
#include "mtrt_ops.h"

enum { WARMUP = 2, ITERS = 5 };

typedef struct {
  const char *name;
  int seq, heads, kv_heads, hd, vd;
} Shape;

static const Shape shapes[] = {
    {"gqa 48/16 x 128", 4096, 48, 16, 128, 128},
    {"gqa 48/16 x 128", 65536, 48, 16, 128, 128},
    {"mla 128 x 192/128", 4096, 128, 128, 192, 128},
    {"mla 128 x 192/128", 65536, 128, 128, 192, 128},
};

/* kernels.cu for shape s: the templates after the defines they need (test_kernels.c's prelude). */
static char *kernels(char **paths, int n, const Shape *s, size_t *len) {
  char pre[600];
  int pl = snprintf(pre, sizeof pre,
                    "#define TOKENS %d\n#define SEQ_LEN %d\n#define HIDDEN %d\n#define HEADS %d\n#define KV_HEADS %d\n"
                    "#define HEAD_DIM %d\n#define V_DIM %d\n#define ROPE_THETA 10000.0f\n#define RMS_EPS 1e-5f\n"
                    "#define VOCAB 256\n#define VOCAB_CHUNK 256\n#define EXPERTS 8\n#define TOP_K 2\n\n",
                    s->seq, s->seq, s->heads * s->hd, s->heads, s->kv_heads, s->hd, s->vd);
  char *src = malloc((size_t)pl + 1);
  memcpy(src, pre, (size_t)pl), *len = (size_t)pl;
  for (int i = 0; i < n; i++) {
    FILE *f = fopen(paths[i], "rb");
    if (!f) return fprintf(stderr, "bench_attention: cannot open %s\n", paths[i]), free(src), NULL;
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
  if (!p) fprintf(stderr, "bench_attention: %s\n", err), exit(1);
  return p;
}
/* n bf16 values of about ±scale/2, from a fixed seed. */
static void fill(void *d, size_t n, float scale) {
  unsigned short *h = malloc(n * 2);
  unsigned s = 12345;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    float f = scale * ((float)(s >> 8) / 16777216.0f - 0.5f);
    unsigned u;
    memcpy(&u, &f, 4);
    h[i] = (unsigned short)(u >> 16);
  }
  rt_cuda_upload(d, h, n * 2);
  free(h);
}

/* One shape with the attention MTC_ATTENTION says (NULL: the plan's, cuDNN's): ms per call,
 * forward and backward; -1 when the set-up fails (message printed). */
static int run(const Shape *s, const char *attention, char **paths, int n, double *fwd_ms, double *bwd_ms) {
  if (attention) setenv("MTC_ATTENTION", attention, 1);
  else unsetenv("MTC_ATTENTION");
  size_t len;
  /* cuDNN's runs need none of the own kernels: an empty kernels.cu, nothing for NVRTC to do */
  static const char none[] = "extern \"C\" __global__ void bench_none(void) {}\n";
  char *src = attention ? kernels(paths, n, s, &len) : strdup(none);
  if (!attention) len = sizeof none - 1;
  if (!src) return -1;
  RtCudaConfig cfg = {src, len, MTRT_CUDA_INCLUDE, s->seq, s->heads, 0, 1, (size_t)256 << 20, 1, s->seq,
                      s->kv_heads, s->hd, s->vd, 1};
  static char err[1 << 16];
  if (rt_cuda_setup(&cfg, 0, err, sizeof err)) return fprintf(stderr, "bench_attention: %s\n", err), free(src), -1;
  char line[1400];
  rt_cuda_describe(line, sizeof line);
  printf("bench_attention: %s S %d: %s\n", s->name, s->seq, line);
  size_t T = (size_t)s->seq, nq = T * s->heads * s->hd, nk = T * s->kv_heads * s->hd, nv = T * s->kv_heads * s->vd,
         no = T * s->heads * s->vd;
  act *q = dev(nq * 2), *k = dev(nk * 2), *v = dev(nv * 2), *o = dev(no * 2), *dout = dev(no * 2);
  act *dq = dev(nq * 2), *dk = dev(nk * 2), *dv = dev(nv * 2);
  real *lse = dev(T * s->heads * sizeof(real));
  fill(q, nq, 2), fill(k, nk, 2), fill(v, nv, 2), fill(dout, no, 1);
  cudaEvent_t e0, e1, e2;
  cudaEventCreate(&e0), cudaEventCreate(&e1), cudaEventCreate(&e2);
  for (int i = 0; i < WARMUP; i++) {
    rt_attention_forward(o, lse, q, k, v, 1, s->seq, s->heads, s->kv_heads, s->hd, s->vd);
    rt_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, 1, s->seq, s->heads, s->kv_heads, s->hd, s->vd);
  }
  rt_cuda_sync("bench_attention warm-up");
  cudaEventRecord(e0, NULL); /* the legacy stream waits for the runtime's (a blocking one) */
  for (int i = 0; i < ITERS; i++) rt_attention_forward(o, lse, q, k, v, 1, s->seq, s->heads, s->kv_heads, s->hd, s->vd);
  cudaEventRecord(e1, NULL);
  for (int i = 0; i < ITERS; i++)
    rt_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, 1, s->seq, s->heads, s->kv_heads, s->hd, s->vd);
  cudaEventRecord(e2, NULL);
  cudaEventSynchronize(e2);
  float a = 0, b = 0;
  cudaEventElapsedTime(&a, e0, e1), cudaEventElapsedTime(&b, e1, e2);
  *fwd_ms = a / ITERS, *bwd_ms = b / ITERS;
  rt_cuda_sync("bench_attention");
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(e2);
  void *bufs[] = {q, k, v, o, dout, dq, dk, dv, lse};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) rt_cuda_free(bufs[i]);
  rt_cuda_teardown();
  free(src);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 3 && strcmp(argv[1], "--check-kernels") == 0) { /* the flash runs' kernels into the cache */
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
      const Shape *s = &shapes[i];
      if (s->hd != s->vd || s->hd > 128) continue;
      size_t len;
      char *src = kernels(argv + 3, argc - 3, s, &len), log[1 << 14];
      int nk = 0, cached = 0;
      size_t bytes = 0;
      if (!src || rt_cuda_compile(src, len, "kernels.cu", argv[2], MTRT_CUDA_INCLUDE, NULL, NULL, &bytes, &nk, &cached, log,
                                  sizeof log))
        return fprintf(stderr, "bench_attention: %s S %d: %s\n", s->name, s->seq, src ? log : "no source"), 1;
      printf("bench_attention: %s S %d: %d kernels for %s%s\n", s->name, s->seq, nk, argv[2], cached ? " (cached)" : "");
      free(src);
    }
    return 0;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) return printf("bench_attention: skipped: no GPU\n"), 77;
  if (argc < 2) return fprintf(stderr, "usage: bench_attention KERNEL.cu... (templates/kernels' files)\n"), 2;
  printf("ATTN_BENCH %-20s %6s %-6s %9s %9s %10s %10s\n", "shape", "tokens", "kernel", "fwd ms", "bwd ms",
         "fwd TF/s", "bwd TF/s");
  int bad = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    const Shape *s = &shapes[i];
    double flops = (double)s->seq * s->seq * s->heads * (s->hd + s->vd); /* causal forward */
    for (int j = 0; j < 2; j++) {
      const char *att = j ? "flash" : NULL;
      if (j && (s->hd != s->vd || s->hd > 128)) continue; /* the own flash kernel's shapes */
      double f = 0, b = 0;
      if (run(s, att, argv + 1, argc - 1, &f, &b)) {
        bad = 1;
        continue;
      }
      printf("ATTN_BENCH %-20s %6d %-6s %9.3f %9.3f %10.1f %10.1f\n", s->name, s->seq, j ? "flash" : "cudnn", f, b,
             flops / (f * 1e-3) / 1e12, 2.5 * flops / (b * 1e-3) / 1e12);
    }
  }
  return bad;
}
