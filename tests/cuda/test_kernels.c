/* test_kernels.c — the cuda backend's kernels (templates/kernels.cu) against the cpu backend's
 * ops, on a GPU: compiled by NVRTC for the device, loaded with cudaLibraryLoadData, run on
 * random bf16 inputs, compared within bf16 rounding. The flash attention kernels need other
 * shapes (head_dim a multiple of 16, seq_len of 64): kernels.cu is compiled twice more for them,
 * with bf16 and with fp32 (ACT_FLOAT) storage.
 *   usage: test_kernels TEMPLATES/kernels.cu
 * Without a GPU it prints why and exits 77 (ctest: skipped), so CI builds and links it and a
 * GPU session (tools/device-check.sh) runs it. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mtrt_comm.h"
#include "mtrt_cuda.h"
#include "mtrt_ops.h"
#include "mtrt_optim.h"

enum { B = 2, T = 32, N = B * T, C = 64, NH = 4, NKV = 2, HD = 16, V = 256, E = 8, K = 2 };
static const char prelude[] = "#define TOKENS 64\n#define SEQ_LEN 32\n#define HIDDEN 64\n#define HEADS 4\n"
                              "#define KV_HEADS 2\n#define HEAD_DIM 16\n#define ROPE_THETA 10000.0f\n"
                              "#define RMS_EPS 1e-5f\n#define VOCAB 256\n#define VOCAB_CHUNK 256\n"
                              "#define EXPERTS 8\n#define TOP_K 2\n";
static cudaLibrary_t lib;
/* the flash attention test's shapes: 3 query tiles of 64 per sequence, 2 query heads per KV head */
enum { FB = 2, FT = 192, FN = FB * FT, FH = 4, FKV = 2, FD = 64 };
static const char flash_prelude[] = "#define TOKENS 384\n#define SEQ_LEN 192\n#define HIDDEN 256\n#define HEADS 4\n"
                                    "#define KV_HEADS 2\n#define HEAD_DIM 64\n#define ROPE_THETA 10000.0f\n"
                                    "#define RMS_EPS 1e-5f\n#define VOCAB 256\n#define VOCAB_CHUNK 256\n"
                                    "#define EXPERTS 0\n#define TOP_K 2\n";

#define CU(call)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

static dim3 dim3_of(int x) {
  dim3 d = {(unsigned)x, 1, 1};
  return d;
}

static void launch(const char *name, int grid, int block, void **args) {
  cudaKernel_t k;
  CU(cudaLibraryGetKernel(&k, lib, name));
  CU(cudaLaunchKernel((const void *)k, dim3_of(grid), dim3_of(block), args, 0, 0));
  CU(cudaDeviceSynchronize());
}

/* kernels.cu (path) after the prelude pre, compiled by NVRTC for arch and loaded into *l; 0 or -1 */
static int load_kernels(cudaLibrary_t *l, const char *pre, const char *path, const char *arch) {
  FILE *f = fopen(path, "rb");
  if (!f) return fprintf(stderr, "cannot open %s\n", path), -1;
  static char src[1 << 17];
  static char nvlog[1 << 15];
  size_t pl = strlen(pre), n = fread(src + pl, 1, sizeof src - pl - 1, f);
  fclose(f);
  memcpy(src, pre, pl);
  void *cubin = NULL;
  size_t bytes;
  int nk, cached;
  if (rt_cuda_compile(src, pl + n, "kernels.cu", arch, MTRT_CUDA_INCLUDE, NULL, &cubin, &bytes, &nk, &cached, nvlog,
                      sizeof nvlog) != 0)
    return fprintf(stderr, "%s\nNVRTC failed\n", nvlog), -1;
  CU(cudaLibraryLoadData(l, cubin, NULL, NULL, 0, NULL, NULL, 0));
  printf("test_kernels: %d kernels for %s loaded\n", nk, arch);
  free(cubin);
  return 0;
}

static void launch3(cudaLibrary_t l, const char *name, dim3 grid, int block, void **args) {
  cudaKernel_t k;
  CU(cudaLibraryGetKernel(&k, l, name));
  CU(cudaLaunchKernel((const void *)k, grid, dim3_of(block), args, 0, 0));
  CU(cudaDeviceSynchronize());
}

static float rnd(unsigned *s) { return (float)((*s = *s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f; }
/* n random values, rounded to bf16 (what the GPU stores) */
static void fill(float *x, int n, unsigned seed, float scale) {
  for (int i = 0; i < n; i++) x[i] = rt_float_from_bf16(rt_bf16_from_float(scale * rnd(&seed)));
}
static void *to_dev_bf16(const float *x, int n) {
  uint16_t *h = malloc(2 * (size_t)n);
  for (int i = 0; i < n; i++) h[i] = rt_bf16_from_float(x[i]);
  void *d;
  CU(cudaMalloc(&d, 2 * (size_t)n));
  CU(cudaMemcpy(d, h, 2 * (size_t)n, cudaMemcpyHostToDevice));
  free(h);
  return d;
}
static void *to_dev(const void *x, size_t bytes) {
  void *d;
  CU(cudaMalloc(&d, bytes));
  CU(cudaMemcpy(d, x, bytes, cudaMemcpyHostToDevice));
  return d;
}
static void from_dev_bf16(float *x, const void *d, int n) {
  uint16_t *h = malloc(2 * (size_t)n);
  CU(cudaMemcpy(h, d, 2 * (size_t)n, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) x[i] = rt_float_from_bf16(h[i]);
  free(h);
}
/* max |a - b| / (|b| + floor) over n values; bf16 keeps 8 significant bits (2^-8 relative) */
static double rel_err(const float *a, const float *b, int n, double floor) {
  double m = 0;
  for (int i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + floor));
  return m;
}

/* n values of x to the device as `act` (fp32 with ACT_FLOAT, else bf16), and back */
static void *to_dev_act(const float *x, int n, int act_float) {
  return act_float ? to_dev(x, sizeof(float) * (size_t)n) : to_dev_bf16(x, n);
}
static void from_dev_act(float *x, const void *d, int n, int act_float) {
  if (act_float) CU(cudaMemcpy(x, d, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost));
  else from_dev_bf16(x, d, n);
}

/* The flash attention kernels (FB, FT, FH / FKV heads of FD) against the cpu reference, with the
 * launch configurations of kernels.cu (FLASH_*_GRID, FLASH_THREADS = 128, static shared memory):
 * forward (FT / 64, heads, FB); prep one warp per (token, head); dq (FT / 64, FH, FB); dkv
 * (FT / 64, FKV, FB). Backward adds into dq, dk, dv: they start at zero. */
static void flash_check(const char *path, const char *arch, int act_float) {
  static char pre[1024];
  snprintf(pre, sizeof pre, "%s%s", act_float ? "#define ACT_FLOAT\n" : "", flash_prelude);
  cudaLibrary_t fl;
  int loaded = load_kernels(&fl, pre, path, arch) == 0;
  CHECK(loaded);
  if (!loaded) return;
  enum { NQ = FN * FH * FD, NK = FN * FKV * FD };
  static float q[NQ], k[NK], v[NK], dout[NQ], out[NQ], outr[NQ], lse[FN * FH], lser[FN * FH];
  static float dq[NQ], dk[NK], dv[NK], dqr[NQ], dkr[NK], dvr[NK];
  fill(q, NQ, 23, 2), fill(k, NK, 24, 2), fill(v, NK, 25, 2), fill(dout, NQ, 26, 1);
  rt_attention_forward(outr, lser, q, k, v, FB, FT, FH, FKV, FD); /* lser (FB, FH, FT) */
  void *gq = to_dev_act(q, NQ, act_float), *gk = to_dev_act(k, NK, act_float), *gv = to_dev_act(v, NK, act_float);
  void *gdo = to_dev_act(dout, NQ, act_float), *gout, *glse, *gdelta, *gdq, *gdk, *gdv;
  size_t es = act_float ? 4 : 2;
  CU(cudaMalloc(&gout, es * NQ));
  CU(cudaMalloc(&glse, sizeof lse));
  CU(cudaMalloc(&gdelta, sizeof lse));
  CU(cudaMalloc(&gdq, es * NQ));
  CU(cudaMalloc(&gdk, es * NK));
  CU(cudaMalloc(&gdv, es * NK));
  CU(cudaMemset(gdq, 0, es * NQ)); CU(cudaMemset(gdk, 0, es * NK)); CU(cudaMemset(gdv, 0, es * NK));
  dim3 gq3 = {FT / 64, FH, FB}, gkv3 = {FT / 64, FKV, FB};
  launch3(fl, "flash_attention_forward", gq3, 128, (void *[]){&gout, &glse, &gq, &gk, &gv});
  from_dev_act(out, gout, NQ, act_float);
  CU(cudaMemcpy(lse, glse, sizeof lse, cudaMemcpyDeviceToHost));
  double e1 = rel_err(out, outr, NQ, 1e-1), el = 0;
  for (int b = 0; b < FB; b++)
    for (int h = 0; h < FH; h++)
      for (int t = 0; t < FT; t++) el = fmax(el, fabs(lse[(b * FT + t) * FH + h] - lser[(b * FH + h) * FT + t]));
  printf("  flash_attention_forward (%s): out %.2e, log-sum-exp within %.2e\n", act_float ? "fp32" : "bf16", e1, el);
  CHECK(e1 < 0x1p-6 && el < 1e-4);
  /* the cpu backward from the GPU's output, as the GPU does */
  memset(dqr, 0, sizeof dqr), memset(dkr, 0, sizeof dkr), memset(dvr, 0, sizeof dvr);
  rt_attention_backward(dqr, dkr, dvr, dout, q, k, v, out, lser, FB, FT, FH, FKV, FD);
  launch3(fl, "flash_attention_backward_prep", dim3_of(FN * FH / 4), 128, (void *[]){&gdelta, &gdo, &gout});
  launch3(fl, "flash_attention_backward_dq", gq3, 128, (void *[]){&gdq, &gdo, &gq, &gk, &gv, &glse, &gdelta});
  launch3(fl, "flash_attention_backward_dkv", gkv3, 128, (void *[]){&gdk, &gdv, &gdo, &gq, &gk, &gv, &glse, &gdelta});
  from_dev_act(dq, gdq, NQ, act_float), from_dev_act(dk, gdk, NK, act_float), from_dev_act(dv, gdv, NK, act_float);
  double eq = rel_err(dq, dqr, NQ, 1e-1), ek = rel_err(dk, dkr, NK, 1e-1), ev = rel_err(dv, dvr, NK, 1e-1);
  printf("  flash_attention_backward (%s): dq %.2e, dk %.2e, dv %.2e\n", act_float ? "fp32" : "bf16", eq, ek, ev);
  CHECK(eq < 0x1p-5 && ek < 0x1p-5 && ev < 0x1p-5);
  void *bufs[] = {gq, gk, gv, gdo, gout, glse, gdelta, gdq, gdk, gdv};
  for (int i = 0; i < 10; i++) CU(cudaFree(bufs[i]));
  CU(cudaLibraryUnload(fl));
}

int main(int argc, char **argv) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    printf("test_kernels: skipped: no GPU (%s)\n", gpus ? "" : cudaGetErrorString(cudaGetDeviceCount(&gpus)));
    return 77;
  }
  if (argc != 2) return fprintf(stderr, "usage: test_kernels TEMPLATES/kernels.cu\n"), 2;
  char arch[16];
  CHECK_EQ(rt_cuda_arch(arch, sizeof arch), 0);
  if (load_kernels(&lib, prelude, argv[1], arch) != 0) return 1;
  cudaKernel_t none; /* seq_len 32 is no multiple of 64: no flash kernels (the host falls back) */
  CHECK(cudaLibraryGetKernel(&none, lib, "flash_attention_forward") != cudaSuccess);
  (void)cudaGetLastError();

  /* RMSNorm forward */
  static float x[N * C], w[C], out[N * C], ref[N * C], rstd[N], rstd_ref[N];
  fill(x, N * C, 1, 4), fill(w, C, 2, 2);
  rt_rmsnorm_forward(ref, rstd_ref, x, w, N, C, 1e-5f);
  void *dx = to_dev_bf16(x, N * C), *dw = to_dev_bf16(w, C), *dout = to_dev_bf16(out, N * C), *drstd;
  CU(cudaMalloc(&drstd, sizeof rstd));
  launch("rmsnorm_forward", N, 128, (void *[]){&dout, &drstd, &dx, &dw});
  from_dev_bf16(out, dout, N * C);
  CU(cudaMemcpy(rstd, drstd, sizeof rstd, cudaMemcpyDeviceToHost));
  double e1 = rel_err(out, ref, N * C, 1e-2), e2 = rel_err(rstd, rstd_ref, N, 0);
  printf("  rmsnorm_forward: out %.2e, rstd %.2e relative\n", e1, e2);
  CHECK(e1 < 0x1p-7 && e2 < 1e-4);

  /* RMSNorm backward: dx added to (bf16), dw added to (fp32), 16 rows per block */
  static float nbo[N * C], nbx[N * C], nbxr[N * C], nbw[C], nbwr[C];
  fill(nbo, N * C, 21, 1);
  memset(nbxr, 0, sizeof nbxr), memset(nbwr, 0, sizeof nbwr);
  rt_rmsnorm_backward(nbxr, nbwr, nbo, x, w, rstd_ref, N, C);
  void *dnbo = to_dev_bf16(nbo, N * C), *dnbx = to_dev_bf16(nbx, N * C) /* zeros */, *dnbw, *drr = to_dev(rstd_ref, sizeof rstd_ref);
  CU(cudaMalloc(&dnbw, sizeof nbw));
  CU(cudaMemset(dnbw, 0, sizeof nbw));
  launch("rmsnorm_backward", (N + 15) / 16, 128, (void *[]){&dnbx, &dnbw, &dnbo, &dx, &dw, &drr});
  from_dev_bf16(nbx, dnbx, N * C);
  CU(cudaMemcpy(nbw, dnbw, sizeof nbw, cudaMemcpyDeviceToHost));
  e1 = rel_err(nbx, nbxr, N * C, 1e-1), e2 = rel_err(nbw, nbwr, C, 1e-1);
  printf("  rmsnorm_backward: dx %.2e, dw %.2e\n", e1, e2);
  CHECK(e1 < 0x1p-6 && e2 < 1e-3);

  /* RoPE on queries (B, T, NH, HD) */
  static float q[N * NH * HD], qr[N * NH * HD];
  fill(q, N * NH * HD, 3, 2);
  memcpy(qr, q, sizeof q);
  rt_rope_forward(qr, B, T, NH, HD, 10000.0f);
  void *dq = to_dev_bf16(q, N * NH * HD);
  int heads = NH;
  float sign = 1;
  launch("rope", N, NH * HD / 2, (void *[]){&dq, &heads, &sign});
  from_dev_bf16(q, dq, N * NH * HD);
  e1 = rel_err(q, qr, N * NH * HD, 1e-1);
  printf("  rope: %.2e\n", e1);
  CHECK(e1 < 0x1p-6);

  /* SwiGLU forward and backward, residual add */
  static float g[N * C], u[N * C], h[N * C], dh[N * C], dg[N * C], du[N * C], hr[N * C], dgr[N * C], dur[N * C];
  fill(g, N * C, 4, 6), fill(u, N * C, 5, 2), fill(dh, N * C, 6, 1);
  rt_swiglu_forward(hr, g, u, N * C);
  memset(dgr, 0, sizeof dgr), memset(dur, 0, sizeof dur);
  rt_swiglu_backward(dgr, dur, dh, g, u, N * C);
  void *dg_ = to_dev_bf16(g, N * C), *du_ = to_dev_bf16(u, N * C), *dh_ = to_dev_bf16(dh, N * C);
  void *ho = to_dev_bf16(h, N * C), *go = to_dev_bf16(dg, N * C), *uo = to_dev_bf16(du, N * C);
  long cnt = N * C;
  launch("swiglu_forward", (int)(cnt / 8 + 127) / 128, 128, (void *[]){&ho, &dg_, &du_, &cnt});
  launch("swiglu_backward", (int)(cnt / 8 + 127) / 128, 128, (void *[]){&go, &uo, &dh_, &dg_, &du_, &cnt});
  from_dev_bf16(h, ho, N * C), from_dev_bf16(dg, go, N * C), from_dev_bf16(du, uo, N * C);
  double eh = rel_err(h, hr, N * C, 1e-2), eg = rel_err(dg, dgr, N * C, 1e-2), eu = rel_err(du, dur, N * C, 1e-2);
  printf("  swiglu: forward %.2e, backward %.2e / %.2e\n", eh, eg, eu);
  CHECK(eh < 0x1p-6 && eg < 0x1p-6 && eu < 0x1p-6);
  launch("residual_add", (int)(cnt / 8 + 127) / 128, 128, (void *[]){&ho, &dg_, &du_, &cnt});
  from_dev_bf16(h, ho, N * C);
  for (int i = 0; i < N * C; i++) hr[i] = g[i] + u[i];
  e1 = rel_err(h, hr, N * C, 1e-2);
  printf("  residual_add: %.2e\n", e1);
  CHECK(e1 < 0x1p-7);

  /* router top-k (softmax) and the MoE permute / gather / combine path */
  static float logits[N * E], wts[N * K], wref[N * K];
  static int32_t idx[N * K], iref[N * K];
  fill(logits, N * E, 7, 8);
  rt_router_forward(iref, wref, logits, NULL, N, E, K, false);
  void *dl = to_dev(logits, sizeof logits), *di, *dwt, *dnull = NULL;
  CU(cudaMalloc(&di, sizeof idx));
  CU(cudaMalloc(&dwt, sizeof wts));
  int sig = 0;
  launch("router_topk", 1, 128, (void *[]){&di, &dwt, &dl, &dnull, &sig});
  CU(cudaMemcpy(idx, di, sizeof idx, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(wts, dwt, sizeof wts, cudaMemcpyDeviceToHost));
  CHECK(memcmp(idx, iref, sizeof idx) == 0);
  e1 = rel_err(wts, wref, N * K, 0);
  printf("  router_topk: same experts, weights %.2e\n", e1);
  CHECK(e1 < 1e-5);
  static int counts[E], offsets[E + 1], zero[E];
  void *dcnt = to_dev(zero, sizeof zero), *dcur = to_dev(zero, sizeof zero), *dpos, *doff;
  CU(cudaMalloc(&dpos, sizeof idx));
  launch("moe_count", 1, 128, (void *[]){&dcnt, &di});
  CU(cudaMemcpy(counts, dcnt, sizeof counts, cudaMemcpyDeviceToHost));
  for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
  CHECK_EQ(offsets[E], N * K);
  doff = to_dev(offsets, sizeof offsets);
  launch("moe_permute", 1, 128, (void *[]){&dpos, &dcur, &di, &doff});
  void *dxp, *dy = to_dev_bf16(hr, N * C); /* y starts at some values: combine adds */
  CU(cudaMalloc(&dxp, 2 * (size_t)N * K * C));
  launch("moe_gather", N * K, 64, (void *[]){&dxp, &dx, &dpos});
  launch("moe_combine", N, 64, (void *[]){&dy, &dxp, &dwt, &dpos}); /* experts = identity */
  from_dev_bf16(out, dy, N * C);
  for (int t = 0; t < N; t++)
    for (int c = 0; c < C; c++) /* y started from hr rounded to bf16 */
      ref[t * C + c] = rt_float_from_bf16(rt_bf16_from_float(hr[t * C + c])) + (wts[t * K] + wts[t * K + 1]) * x[t * C + c];
  e1 = rel_err(out, ref, N * C, 1e-1);
  printf("  moe permute/gather/combine: %.2e\n", e1);
  CHECK(e1 < 0x1p-6);

  /* cross-entropy over one chunk of the vocabulary: log-sum-exp and the target's logit */
  static float lg[N * V], mx[N], sm[N], tl[N];
  static int32_t tgt[N];
  fill(lg, N * V, 9, 10);
  for (int t = 0; t < N; t++) tgt[t] = (t * 37) % V, mx[t] = -INFINITY, sm[t] = 0;
  void *dlg = to_dev(lg, sizeof lg), *dmx = to_dev(mx, sizeof mx), *dsm = to_dev(sm, sizeof sm), *dtl, *dtg = to_dev(tgt, sizeof tgt);
  CU(cudaMalloc(&dtl, sizeof tl));
  int first = 0, cols = V;
  launch("cross_entropy_chunk", N, 128, (void *[]){&dmx, &dsm, &dtl, &dlg, &dtg, &first, &cols});
  CU(cudaMemcpy(mx, dmx, sizeof mx, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(sm, dsm, sizeof sm, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(tl, dtl, sizeof tl, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int t = 0; t < N; t++) {
    double m = -INFINITY, s = 0;
    for (int v = 0; v < V; v++) m = fmax(m, lg[t * V + v]);
    for (int v = 0; v < V; v++) s += exp(lg[t * V + v] - m);
    worst = fmax(worst, fabs((mx[t] + log(sm[t])) - (m + log(s))));
    CHECK(tl[t] == lg[t * V + tgt[t]]);
  }
  printf("  cross_entropy_chunk: log-sum-exp within %.2e\n", worst);
  CHECK(worst < 1e-4);
  /* cross-entropy backward: (softmax - one-hot) x scale */
  static float hdl[N * V], hdlr[N * V];
  void *ddl;
  CU(cudaMalloc(&ddl, 2 * (size_t)N * V));
  float scale = 0.5f / N;
  static float lse_ce[N];
  for (int t = 0; t < N; t++) lse_ce[t] = mx[t] + logf(sm[t]);
  void *dlse_ce = to_dev(lse_ce, sizeof lse_ce);
  launch("cross_entropy_backward", N, 128, (void *[]){&ddl, &dlg, &dlse_ce, &dtg, &first, &cols, &scale});
  from_dev_bf16(hdl, ddl, N * V);
  for (int t = 0; t < N; t++) {
    double m = -INFINITY, sum = 0;
    for (int v = 0; v < V; v++) m = fmax(m, lg[t * V + v]);
    for (int v = 0; v < V; v++) sum += exp(lg[t * V + v] - m);
    for (int v = 0; v < V; v++) hdlr[t * V + v] = (float)(scale * (exp(lg[t * V + v] - m) / sum - (v == tgt[t])));
  }
  e1 = rel_err(hdl, hdlr, N * V, 1e-4);
  printf("  cross_entropy_backward: %.2e\n", e1);
  CHECK(e1 < 0x1p-6);

  /* router backward, balancing loss, combine and gather backward */
  static float dwts[N * K], dlog[N * E], dlogr[N * E], stats[2 * E], aux_scratch[3 * E];
  fill(dwts, N * K, 10, 1);
  memset(dlogr, 0, sizeof dlogr);
  rt_router_backward(dlogr, dwts, logits, iref, wref, N, E, K, false);
  float auxr = rt_aux_loss_forward(logits, iref, N, E, K, 0.01f, aux_scratch);
  rt_aux_loss_backward(dlogr, logits, iref, N, E, K, 0.01f, 0.5f, aux_scratch);
  void *ddw = to_dev(dwts, sizeof dwts), *ddlog = to_dev(dlog, sizeof dlog), *dstats = to_dev(stats, sizeof stats);
  launch("router_backward", 1, 128, (void *[]){&ddlog, &ddw, &dl, &di, &dwt, &sig});
  launch("aux_loss_stats", 1, 128, (void *[]){&dstats, &dl, &di});
  float coef = 0.5f * 0.01f * E / N;
  launch("aux_loss_backward", 1, 128, (void *[]){&ddlog, &dl, &dstats, &coef});
  CU(cudaMemcpy(dlog, ddlog, sizeof dlog, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(stats, dstats, sizeof stats, cudaMemcpyDeviceToHost));
  float aux = 0;
  for (int e = 0; e < E; e++) aux += 0.01f * E * stats[e] * stats[E + e];
  double ed = 0;
  for (int i = 0; i < N * E; i++) ed = fmax(ed, fabs(dlog[i] - dlogr[i]));
  printf("  router_backward + aux loss: loss %.6f vs %.6f, gradient within %.2e\n", aux, auxr, ed);
  CHECK(fabs(aux - auxr) < 1e-5 && ed < 1e-5);
  static float dyv[N * C], ypv[N * K * C], dyp[N * K * C], dwc[N * K], dypr[N * K * C], dwcr[N * K];
  static int32_t posr[N * K];
  static int offr[E + 1];
  fill(dyv, N * C, 11, 1), fill(ypv, N * K * C, 12, 1);
  rt_moe_permute(posr, offr, iref, N, E, K);
  memset(dwcr, 0, sizeof dwcr);
  rt_moe_combine_backward(dypr, dwcr, dyv, ypv, wref, posr, N, K, C);
  void *dpr = to_dev(posr, sizeof posr), *ddy = to_dev_bf16(dyv, N * C), *dyp_ = to_dev_bf16(ypv, N * K * C), *ddyp, *ddwc;
  CU(cudaMalloc(&ddyp, 2 * (size_t)N * K * C));
  CU(cudaMalloc(&ddwc, sizeof dwc));
  CU(cudaMemset(ddwc, 0, sizeof dwc)); /* dwts is added to */
  void *dwref = to_dev(wref, sizeof wref);
  launch("moe_combine_backward", N, 64, (void *[]){&ddyp, &ddwc, &ddy, &dyp_, &dwref, &dpr});
  from_dev_bf16(dyp, ddyp, N * K * C);
  CU(cudaMemcpy(dwc, ddwc, sizeof dwc, cudaMemcpyDeviceToHost));
  e1 = rel_err(dyp, dypr, N * K * C, 1e-2), e2 = rel_err(dwc, dwcr, N * K, 1e-1);
  printf("  moe_combine_backward: dyp %.2e, dwts %.2e\n", e1, e2);
  CHECK(e1 < 0x1p-7 && e2 < 0x1p-6);
  static float dxg[N * C], dxgr[N * C];
  memset(dxgr, 0, sizeof dxgr);
  rt_moe_gather_backward(dxgr, dypr, posr, N, K, C);
  void *ddx = to_dev_bf16(dxg, N * C); /* zeros */
  launch("moe_gather_backward", N, 64, (void *[]){&ddx, &ddyp, &dpr});
  from_dev_bf16(dxg, ddx, N * C);
  e1 = rel_err(dxg, dxgr, N * C, 1e-2);
  printf("  moe_gather_backward: %.2e\n", e1);
  CHECK(e1 < 0x1p-6);

  /* attention forward and backward (B, T, NH / NKV heads of HD) */
  static float aq[N * NH * HD], ak[N * NKV * HD], av[N * NKV * HD], ao[N * NH * HD], aor[N * NH * HD];
  static float alse[N * NH], alser[B * NH * T], ado[N * NH * HD];
  static float adq[N * NH * HD], adk[N * NKV * HD], adv[N * NKV * HD], adqr[N * NH * HD], adkr[N * NKV * HD],
      advr[N * NKV * HD];
  fill(aq, N * NH * HD, 13, 2), fill(ak, N * NKV * HD, 14, 2), fill(av, N * NKV * HD, 15, 2), fill(ado, N * NH * HD, 16, 1);
  rt_attention_forward(aor, alser, aq, ak, av, B, T, NH, NKV, HD);
  memset(adqr, 0, sizeof adqr), memset(adkr, 0, sizeof adkr), memset(advr, 0, sizeof advr);
  /* the cpu backward from the GPU's (bf16) output, as the GPU does */
  void *daq = to_dev_bf16(aq, N * NH * HD), *dak = to_dev_bf16(ak, N * NKV * HD), *dav = to_dev_bf16(av, N * NKV * HD);
  void *dao, *dlse, *ddo = to_dev_bf16(ado, N * NH * HD), *ddq, *ddk, *ddv, *ddelta;
  CU(cudaMalloc(&dao, sizeof ao / 2));
  CU(cudaMalloc(&dlse, sizeof alse));
  CU(cudaMalloc(&ddelta, sizeof alse));
  CU(cudaMalloc(&ddq, sizeof adq / 2));
  CU(cudaMalloc(&ddk, sizeof adk / 2));
  CU(cudaMalloc(&ddv, sizeof adv / 2));
  CU(cudaMemset(ddq, 0, sizeof adq / 2)); CU(cudaMemset(ddk, 0, sizeof adk / 2)); CU(cudaMemset(ddv, 0, sizeof adv / 2));
  launch("attention_forward", N * NH * 32 / 128, 128, (void *[]){&dao, &dlse, &daq, &dak, &dav});
  from_dev_bf16(ao, dao, N * NH * HD);
  CU(cudaMemcpy(alse, dlse, sizeof alse, cudaMemcpyDeviceToHost));
  e1 = rel_err(ao, aor, N * NH * HD, 1e-1);
  double el = 0;
  for (int b = 0; b < B; b++)
    for (int hh = 0; hh < NH; hh++)
      for (int t = 0; t < T; t++) el = fmax(el, fabs(alse[(b * T + t) * NH + hh] - alser[(b * NH + hh) * T + t]));
  printf("  attention_forward: out %.2e, log-sum-exp within %.2e\n", e1, el);
  CHECK(e1 < 0x1p-6 && el < 1e-4);
  rt_attention_backward(adqr, adkr, advr, ado, aq, ak, av, ao, alser, B, T, NH, NKV, HD);
  launch("attention_backward_dq", N * NH * 32 / 128, 128, (void *[]){&ddq, &ddelta, &ddo, &daq, &dak, &dav, &dao, &dlse});
  launch("attention_backward_dkv", N * NKV * 32 / 128, 128, (void *[]){&ddk, &ddv, &ddo, &daq, &dak, &dav, &dlse, &ddelta});
  from_dev_bf16(adq, ddq, N * NH * HD), from_dev_bf16(adk, ddk, N * NKV * HD), from_dev_bf16(adv, ddv, N * NKV * HD);
  double eq = rel_err(adq, adqr, N * NH * HD, 1e-1), ek = rel_err(adk, adkr, N * NKV * HD, 1e-1),
         ev = rel_err(adv, advr, N * NKV * HD, 1e-1);
  printf("  attention_backward: dq %.2e, dk %.2e, dv %.2e\n", eq, ek, ev);
  CHECK(eq < 0x1p-5 && ek < 0x1p-5 && ev < 0x1p-5);

  /* AdamW and the squared gradient norm */
  enum { P = 1000 };
  static float par[P], mom[P], vel[P], grd[P], parr[P], momr[P], velr[P];
  fill(par, P, 17, 1), fill(grd, P, 18, 1);
  memcpy(parr, par, sizeof par);
  RtAdamW hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 1};
  rt_adamw_update(parr, momr, velr, grd, P, 0.5f, &hp);
  void *dp = to_dev(par, sizeof par), *dm = to_dev(mom, sizeof mom), *dv2 = to_dev(vel, sizeof vel), *dgd = to_dev(grd, sizeof grd);
  long np = P;
  float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, c1 = 1 - 0.9f, c2 = 1 - 0.95f, gs = 0.5f;
  launch("adamw", (P + 127) / 128, 128, (void *[]){&dp, &dm, &dv2, &dgd, &np, &lr, &b1, &b2, &eps, &wd, &c1, &c2, &gs});
  CU(cudaMemcpy(par, dp, sizeof par, cudaMemcpyDeviceToHost));
  e1 = rel_err(par, parr, P, 1e-3);
  double ss = 0, zero1 = 0; /* the kernel sums in double across blocks */
  void *dss = to_dev(&zero1, sizeof zero1);
  launch("sum_squares", 4, 128, (void *[]){&dss, &dgd, &np});
  CU(cudaMemcpy(&ss, dss, sizeof ss, cudaMemcpyDeviceToHost));
  double ssr = rt_sum_squares(grd, P);
  printf("  adamw: %.2e; sum_squares %.6f vs %.6f\n", e1, ss, ssr);
  CHECK(e1 < 1e-5 && fabs(ss - ssr) < 1e-4 * ssr);
  /* cuBLAS: a linear layer forward and backward, and the experts' grouped GEMM */
  enum { IC = 64, OC = 48 };
  RtCublas cb;
  CHECK_EQ(rt_cublas_init(&cb, E), 0);
  static float mx_[N * IC], mw[OC * IC], mo[N * OC], mor[N * OC], mdo[N * OC], mdx[N * IC], mdxr[N * IC], mdw[OC * IC],
      mdwr[OC * IC];
  fill(mx_, N * IC, 19, 1), fill(mw, OC * IC, 20, 1), fill(mdo, N * OC, 21, 1);
  rt_matmul_forward(mor, mx_, mw, NULL, N, IC, OC);
  memset(mdxr, 0, sizeof mdxr), memset(mdwr, 0, sizeof mdwr);
  rt_matmul_backward(mdxr, mdwr, NULL, mdo, mx_, mw, N, IC, OC);
  void *gx = to_dev_bf16(mx_, N * IC), *gw = to_dev_bf16(mw, OC * IC), *go_ = to_dev_bf16(mo, N * OC);
  void *gdo = to_dev_bf16(mdo, N * OC), *gdx = to_dev_bf16(mdx, N * IC), *gdw = to_dev(mdw, sizeof mdw); /* zeros */
  CHECK_EQ(rt_cu_matmul_forward(&cb, go_, gx, gw, N, IC, OC), 0);
  CHECK_EQ(rt_cu_matmul_backward(&cb, gdx, (float *)gdw, gdo, gx, gw, N, IC, OC), 0);
  CU(cudaDeviceSynchronize());
  from_dev_bf16(mo, go_, N * OC), from_dev_bf16(mdx, gdx, N * IC);
  CU(cudaMemcpy(mdw, gdw, sizeof mdw, cudaMemcpyDeviceToHost));
  double m1 = rel_err(mo, mor, N * OC, 1e-1), m2 = rel_err(mdx, mdxr, N * IC, 1e-1), m3 = rel_err(mdw, mdwr, OC * IC, 1e-1);
  printf("  cuBLAS linear: forward %.2e, dx %.2e, dw %.2e\n", m1, m2, m3);
  CHECK(m1 < 0x1p-6 && m2 < 0x1p-6 && m3 < 1e-3);
  /* grouped: 8 experts, uneven rows (one empty), against one cpu GEMM per expert */
  static int goff[E + 1] = {0, 10, 10, 25, 40, 41, 60, 62, 64};
  static float gew[E * OC * IC], gout[N * OC], goutr[N * OC];
  fill(gew, E * OC * IC, 22, 1);
  for (int e = 0; e < E; e++)
    if (goff[e + 1] > goff[e])
      rt_matmul_forward(goutr + (size_t)goff[e] * OC, mx_ + (size_t)goff[e] * IC, gew + (size_t)e * OC * IC, NULL,
                        goff[e + 1] - goff[e], IC, OC);
  void *gge = to_dev_bf16(gew, E * OC * IC), *ggo = to_dev_bf16(gout, N * OC);
  CHECK_EQ(rt_cu_grouped_forward(&cb, ggo, gx, gge, goff, E, IC, OC), 0);
  CU(cudaDeviceSynchronize());
  from_dev_bf16(gout, ggo, N * OC);
  m1 = rel_err(gout, goutr, N * OC, 1e-1);
  printf("  cuBLAS grouped experts GEMM: %.2e\n", m1);
  CHECK(m1 < 0x1p-6);
  rt_cublas_free(&cb);
  flash_check(argv[1], arch, 0);
  flash_check(argv[1], arch, 1);
  return CHECK_DONE("test_kernels");
}
