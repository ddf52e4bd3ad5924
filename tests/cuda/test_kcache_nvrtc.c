/* test_kcache_nvrtc.c — rt_cuda_compile's kernel cache through real NVRTC (no GPU needed): a
 * planted file at a cache entry's name is not loaded as the kernels (compiled again, the entry
 * rewritten), and a link planted at the entry's temporary name is not written through.
 * Usage: test_kcache_nvrtc CUDA_INCLUDE_DIR. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtrt_cuda.h"

static int fails;
#define ASSERT(x) ((x) ? (void)0 : (void)(fails++, fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #x)))

static const char SRC[] = "extern \"C\" __global__ void one(float *x) { x[0] = 1.0f; }\n";

/* Compiles SRC with cache dir: 0 or -1; the CUBIN's size and whether it came from the cache. */
static int compile(const char *inc, const char *dir, size_t *bytes, int *cached) {
  char log[4096];
  void *cubin = NULL;
  int kernels = 0;
  int st = rt_cuda_compile(SRC, strlen(SRC), "one.cu", "sm_90a", inc, dir, &cubin, bytes, &kernels, cached, log,
                           sizeof log);
  if (st) fprintf(stderr, "NVRTC: %s\n", log);
  free(cubin);
  return st;
}

/* The one entry's file name in dir (static storage), or "". */
static const char *entry(const char *dir) {
  static char name[256];
  name[0] = 0;
  DIR *d = opendir(dir);
  for (struct dirent *de; d && (de = readdir(d));)
    if (strstr(de->d_name, ".cubin") && !strstr(de->d_name, ".tmp")) snprintf(name, sizeof name, "%s", de->d_name);
  if (d) closedir(d);
  return name;
}

int main(int argc, char **argv) {
  if (argc != 2) return fprintf(stderr, "usage: test_kcache_nvrtc CUDA_INCLUDE_DIR\n"), 2;
  char base[] = "/tmp/mtc-kcache-nvrtc.XXXXXX";
  if (!mkdtemp(base)) return perror(base), 1;
  char dir[sizeof base + 16], path[sizeof dir + 300], victim[sizeof base + 16], tmp[sizeof path + 32];
  snprintf(dir, sizeof dir, "%s/cache", base);
  size_t bytes = 0;
  int cached = -1;
  if (compile(argv[1], dir, &bytes, &cached) != 0) return 1;
  size_t good = bytes;
  ASSERT(cached == 0 && good > 15 && entry(dir)[0]);
  ASSERT(compile(argv[1], dir, &bytes, &cached) == 0 && cached == 1 && bytes == good);

  /* a planted file at the entry's name: compiled again, never loaded */
  snprintf(path, sizeof path, "%s/%s", dir, entry(dir));
  FILE *f = fopen(path, "wb");
  ASSERT(f && fwrite("planted kernels", 1, 15, f) == 15 && fclose(f) == 0);
  ASSERT(compile(argv[1], dir, &bytes, &cached) == 0 && cached == 0 && bytes == good);
  ASSERT(compile(argv[1], dir, &bytes, &cached) == 0 && cached == 1 && bytes == good); /* rewritten */

  /* a link at the temporary name (this process's pid): the file it names is not written */
  snprintf(victim, sizeof victim, "%s/victim", base);
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  f = fopen(victim, "wb");
  ASSERT(f && fputs("keep", f) >= 0 && fclose(f) == 0);
  ASSERT(unlink(path) == 0 && symlink(victim, tmp) == 0);
  ASSERT(compile(argv[1], dir, &bytes, &cached) == 0 && cached == 0 && bytes == good);
  struct stat st;
  ASSERT(stat(victim, &st) == 0 && st.st_size == 4);

  char rm[sizeof base + 16];
  snprintf(rm, sizeof rm, "rm -rf %s", base);
  if (system(rm) != 0) fprintf(stderr, "warning: could not remove %s\n", base);
  if (!fails) printf("ok: rt_cuda_compile: a planted cache entry is compiled again, a planted link not followed\n");
  return fails ? 1 : 0;
}
