/* test_kcache.c — the kernel cache (runtime/cuda/kcache.c) against planted files and other users:
 * a cache directory is created 0700; an entry is used only with its key and checksum (a planted
 * 15-byte file, a wrong key, a flipped byte are not); a link planted at the temporary name is
 * never written through; a group-writable directory, a link as the directory and a cache in a
 * world-writable directory (like /tmp) are refused, nothing created there; the default directory
 * is never under /tmp. Usage: test_kcache (in a scratch directory under $TMPDIR). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtrt_ckpt.h"
#include "mtrt_kcache.h"

static int fails;
#define ASSERT(x) ((x) ? (void)0 : (void)(fails++, fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #x)))

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) perror(path), exit(1);
}

int main(void) {
  const char *t = getenv("TMPDIR");
  char *base = rt_pathf("%s/mtc-kcache.XXXXXX", t && *t ? t : "/tmp");
  if (!mkdtemp(base)) return perror(base), 1;
  char *dir = rt_pathf("%s/a/kernels", base), why[2048] = "";
  RtKcache c;
  struct stat st;

  /* created 0700 (and its missing parent too); an entry comes back only for its key */
  ASSERT(rt_kcache_open(&c, dir, why, sizeof why) == 0);
  ASSERT(stat(dir, &st) == 0 && (st.st_mode & 0777) == 0700);
  const char cubin[] = "\x7f" "ELF a pretend CUBIN of forty bytes......";
  size_t n = 0;
  ASSERT(rt_kcache_put(&c, "k.cubin", 42, cubin, sizeof cubin) == 0);
  char *got = rt_kcache_get(&c, "k.cubin", 42, &n);
  ASSERT(got && n == sizeof cubin && memcmp(got, cubin, n) == 0);
  free(got);
  ASSERT(!rt_kcache_get(&c, "k.cubin", 43, &n)); /* another source or options: not this entry */

  /* planted: 15 bytes, and a real entry with one byte of its content changed */
  char *p = rt_pathf("%s/p.cubin", dir);
  write_file(p, "planted kernels", 15);
  ASSERT(!rt_kcache_get(&c, "p.cubin", 42, &n));
  free(p);
  p = rt_pathf("%s/k.cubin", dir);
  int fd = open(p, O_RDWR);
  ASSERT(fd >= 0 && pwrite(fd, "X", 1, 40) == 1);
  close(fd);
  ASSERT(!rt_kcache_get(&c, "k.cubin", 42, &n));
  free(p);

  /* a link at the temporary name: the file it names stays as it was */
  char *victim = rt_pathf("%s/victim", base), *tmp = rt_pathf("%s/v.cubin.%ld.tmp", dir, (long)getpid());
  write_file(victim, "keep", 4);
  ASSERT(symlink(victim, tmp) == 0);
  rt_kcache_put(&c, "v.cubin", 7, cubin, sizeof cubin);
  char keep[8] = "";
  FILE *f = fopen(victim, "rb");
  ASSERT(f && fread(keep, 1, sizeof keep, f) == 4 && memcmp(keep, "keep", 4) == 0);
  if (f) fclose(f);
  rt_kcache_close(&c);

  /* another user could write it: group-writable; a link as the directory */
  ASSERT(chmod(dir, 0770) == 0);
  ASSERT(rt_kcache_open(&c, dir, why, sizeof why) == -1 && strstr(why, "other users can write it") &&
         strstr(why, "chmod 700"));
  ASSERT(!rt_kcache_get(&c, "k.cubin", 42, &n) && rt_kcache_put(&c, "k.cubin", 42, cubin, sizeof cubin) == -1);
  rt_kcache_close(&c);
  char *link = rt_pathf("%s/a/link", base);
  ASSERT(chmod(dir, 0700) == 0 && symlink(dir, link) == 0);
  ASSERT(rt_kcache_open(&c, link, why, sizeof why) == -1 && strstr(why, "symbolic link is not followed"));
  rt_kcache_close(&c);

  /* in a world-writable directory (as /tmp): refused before anything is created there */
  char *pub = rt_pathf("%s/public", base), *in_pub = rt_pathf("%s/public/mtc-kernels", base);
  ASSERT(mkdir(pub, 0777) == 0 && chmod(pub, 01777) == 0);
  ASSERT(rt_kcache_open(&c, in_pub, why, sizeof why) == -1 && strstr(why, "which every user can write"));
  ASSERT(stat(in_pub, &st) != 0);
  rt_kcache_close(&c);

  /* the default: $MTC_KERNEL_CACHE, else under the home directory (never /tmp without HOME) */
  setenv("MTC_KERNEL_CACHE", dir, 1);
  char *d = rt_kcache_dir(NULL);
  ASSERT(d && strcmp(d, dir) == 0);
  free(d);
  unsetenv("MTC_KERNEL_CACHE"), unsetenv("HOME");
  d = rt_kcache_dir(NULL);
  ASSERT(!d || strncmp(d, "/tmp/", 5) != 0);
  free(d);

  char *rm = rt_pathf("rm -rf '%s'", base);
  if (system(rm) != 0) fprintf(stderr, "warning: could not remove %s\n", base);
  free(rm), free(base), free(dir), free(victim), free(tmp), free(link), free(pub), free(in_pub);
  if (!fails) printf("ok: kernel cache: 0700, key and checksum checked, no write through a planted link, "
                     "shared directories refused\n");
  return fails ? 1 : 0;
}
