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

#include "mtrt_cuda.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static void mkdirs(const char *path) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') *p = 0, mkdir(buf, 0777), *p = '/';
  mkdir(buf, 0777);
}

/* Kernels in the source: occurrences of `extern "C" __global__`. */
static int count_kernels(const char *src, size_t n) {
  const char *key = "extern \"C\" __global__";
  int k = 0;
  size_t kl = strlen(key);
  for (size_t i = 0; i + kl <= n; i++) k += memcmp(src + i, key, kl) == 0;
  return k;
}

/* The cached CUBIN at path, read whole (malloc'ed), or NULL. */
static void *read_cache(const char *path, size_t bytes) {
  FILE *f = fopen(path, "rb");
  void *b = f ? malloc(bytes) : NULL;
  if (b && fread(b, 1, bytes, f) != bytes) free(b), b = NULL;
  if (f) fclose(f);
  return b;
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

int rt_cuda_compile(const char *src, size_t n, const char *name, const char *arch, const char *include_dir,
                    const char *cache_dir, void **cubin_out, size_t *cubin_bytes, int *kernels, int *cached, char *log,
                    size_t loglen) {
  char archopt[64], incopt[1100];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
  snprintf(incopt, sizeof incopt, "-I%s", include_dir);
  const char *opts[] = {archopt, incopt, "-std=c++17", "--use_fast_math", "-default-device"};
  int nopts = (int)(sizeof opts / sizeof opts[0]);
  int ver[2] = {0, 0}; /* a new NVRTC may compile differently: it gets its own cache entries */
  nvrtcVersion(&ver[0], &ver[1]);
  uint64_t h = fnv(fnv(0xcbf29ce484222325ull, ver, sizeof ver), src, n);
  for (int i = 0; i < nopts; i++) h = fnv(h, opts[i], strlen(opts[i]) + 1);
  char dir[1024], path[1200];
  const char *home = getenv("HOME");
  if (cache_dir) snprintf(dir, sizeof dir, "%s", cache_dir);
  else if (getenv("MTC_KERNEL_CACHE")) snprintf(dir, sizeof dir, "%s", getenv("MTC_KERNEL_CACHE"));
  else snprintf(dir, sizeof dir, "%s/.cache/mtc-kernels", home ? home : "/tmp");
  snprintf(path, sizeof path, "%s/%016llx-%s.cubin", dir, (unsigned long long)h, arch);
  *kernels = count_kernels(src, n), *cached = 0;
  struct stat st;
  if (stat(path, &st) == 0 && st.st_size > 0) {
    void *b = cubin_out ? read_cache(path, (size_t)st.st_size) : NULL;
    if (!cubin_out || b) {
      if (cubin_out) *cubin_out = b;
      *cubin_bytes = (size_t)st.st_size, *cached = 1;
      return 0;
    } /* unreadable: compile again */
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
  mkdirs(dir);
  char tmp[1300];
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  FILE *f = fopen(tmp, "wb"); /* a cache: failing to write it only costs time next start */
  if (f) {
    int ok = fwrite(cubin, 1, cb, f) == cb;
    ok = (fclose(f) == 0) && ok;
    if (ok) rename(tmp, path);
    else remove(tmp);
  }
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
