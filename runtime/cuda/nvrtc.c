/* nvrtc.c — compiling the plan's kernels with NVRTC, with an on-disk CUBIN cache. */
#include <errno.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nvrtc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtrt_ckpt.h" /* rt_pathf */
#include "mtrt_cuda.h"
#include "mtrt_kcache.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/* Kernels in the source: occurrences of `extern "C" __global__`. */
static int count_kernels(const char *src, size_t n) {
  const char *key = "extern \"C\" __global__";
  int k = 0;
  size_t kl = strlen(key);
  for (size_t i = 0; i + kl <= n; i++) k += memcmp(src + i, key, kl) == 0;
  return k;
}

int rt_cuda_arch(char *arch, size_t n) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return -1;
  snprintf(arch, n, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
  return 0;
}

static int compile(const char *src, size_t n, const char *name, const char *arch, const char *const *opts, int nopts,
                   const char *cache_dir, void **cubin_out, size_t *cubin_bytes, int *kernels, int *cached, char *log,
                   size_t loglen);
static int compile_cached(const RtKcache *kc, const char *entry, uint64_t h, const char *src, size_t n,
                          const char *name, const char *arch, const char *const *opts, int nopts, void **cubin_out,
                          size_t *cubin_bytes, int *cached, char *log, size_t loglen);

int rt_cuda_compile(const char *src, size_t n, const char *name, const char *arch, const char *include_dir,
                    const char *cache_dir, void **cubin_out, size_t *cubin_bytes, int *kernels, int *cached, char *log,
                    size_t loglen) {
  char *archopt = rt_pathf("--gpu-architecture=%s", arch), *incopt = rt_pathf("-I%s", include_dir);
  const char *opts[] = {archopt, incopt, "-std=c++17", "--use_fast_math", "-default-device"};
  int st = compile(src, n, name, arch, opts, (int)(sizeof opts / sizeof opts[0]), cache_dir, cubin_out, cubin_bytes,
                   kernels, cached, log, loglen);
  free(archopt), free(incopt);
  return st;
}

/* rt_cuda_compile's work, with NVRTC's options. */
static int compile(const char *src, size_t n, const char *name, const char *arch, const char *const *opts, int nopts,
                   const char *cache_dir, void **cubin_out, size_t *cubin_bytes, int *kernels, int *cached, char *log,
                   size_t loglen) {
  int ver[2] = {0, 0}; /* a new NVRTC may compile differently: it gets its own cache entries */
  nvrtcVersion(&ver[0], &ver[1]);
  uint64_t h = fnv(fnv(0xcbf29ce484222325ull, ver, sizeof ver), src, n);
  for (int i = 0; i < nopts; i++) h = fnv(h, opts[i], strlen(opts[i]) + 1);
  *kernels = count_kernels(src, n), *cached = 0;
  RtKcache kc = {.dfd = -1};
  char *dir = rt_kcache_dir(cache_dir), why[1024];
  if (dir && rt_kcache_open(&kc, dir, why, sizeof why) != 0) fprintf(stderr, "warning: %s\n", why);
  free(dir);
  char *entry = rt_pathf("%016llx-%s.cubin", (unsigned long long)h, arch);
  int st = compile_cached(&kc, entry, h, src, n, name, arch, opts, nopts, cubin_out, cubin_bytes, cached, log, loglen);
  free(entry);
  rt_kcache_close(&kc);
  return st;
}

/* compile's work with the cache open (kc, entry its file name, h the entry's key). */
static int compile_cached(const RtKcache *kc, const char *entry, uint64_t h, const char *src, size_t n,
                          const char *name, const char *arch, const char *const *opts, int nopts, void **cubin_out,
                          size_t *cubin_bytes, int *cached, char *log, size_t loglen) {
  void *b = rt_kcache_get(kc, entry, h, cubin_bytes);
  if (b) { /* an entry of this source, these options and this NVRTC, its checksum verified */
    if (cubin_out) *cubin_out = b;
    else free(b);
    *cached = 1;
    return 0;
  }
  nvrtcProgram prog;
  char *text = malloc(n + 1);
  if (!text) return snprintf(log, loglen, "out of memory"), -1;
  memcpy(text, src, n), text[n] = 0;
  nvrtcResult r = nvrtcCreateProgram(&prog, text, name, 0, NULL, NULL);
  free(text);
  if (r != NVRTC_SUCCESS) return snprintf(log, loglen, "nvrtcCreateProgram: %s", nvrtcGetErrorString(r)), -1;
  r = nvrtcCompileProgram(prog, nopts, opts);
  size_t ls = 0;
  nvrtcGetProgramLogSize(prog, &ls);
  char *l = malloc(ls + 1);
  if (l && nvrtcGetProgramLog(prog, l) == NVRTC_SUCCESS) snprintf(log, loglen, "%s", l);
  else snprintf(log, loglen, "(no log)");
  free(l);
  if (r != NVRTC_SUCCESS) {
    nvrtcDestroyProgram(&prog);
    return -1;
  }
  size_t cb = 0;
  char *cubin = NULL;
  if (nvrtcGetCUBINSize(prog, &cb) != NVRTC_SUCCESS || !(cubin = malloc(cb)) || nvrtcGetCUBIN(prog, cubin) != NVRTC_SUCCESS) {
    free(cubin);
    nvrtcDestroyProgram(&prog);
    return snprintf(log, loglen, "NVRTC gave no CUBIN for %s (a virtual architecture? expected sm_XX)", arch), -1;
  }
  nvrtcDestroyProgram(&prog);
  *cubin_bytes = cb;
  rt_kcache_put(kc, entry, h, cubin, cb); /* a cache: failing to write it only costs time next start */
  if (cubin_out) *cubin_out = cubin;
  else free(cubin);
  return 0;
}

void rt_cuda_versions(char *buf, size_t n) {
  int rt = 0, nccl = 0, major = 0, minor = 0, gpus = 0, cub[3] = {0, 0, 0};
  cudaRuntimeGetVersion(&rt);
  cublasGetProperty(MAJOR_VERSION, &cub[0]);
  cublasGetProperty(MINOR_VERSION, &cub[1]);
  cublasGetProperty(PATCH_LEVEL, &cub[2]);
  nvrtcVersion(&major, &minor);
  ncclGetVersion(&nccl);
  cudaError_t e = cudaGetDeviceCount(&gpus);
  snprintf(buf, n, "CUDA runtime %d.%d, cuBLAS %d.%d.%d, NVRTC %d.%d, NCCL %d.%d.%d; %s%d GPU(s)%s%s", rt / 1000,
           rt % 1000 / 10, cub[0], cub[1], cub[2], major, minor, nccl / 10000, nccl / 100 % 100, nccl % 100,
           e == cudaSuccess ? "" : "", e == cudaSuccess ? gpus : 0, e == cudaSuccess ? "" : " (",
           e == cudaSuccess ? "" : cudaGetErrorString(e));
  if (e != cudaSuccess && strlen(buf) + 2 < n) strcat(buf, ")");
}
