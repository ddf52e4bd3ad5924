/* kcache.c — the on-disk cache of compiled kernels (see mtrt_kcache.h). */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtrt_ckpt.h" /* rt_pathf, rt_fnv1a, rt_write_all */
#include "mtrt_kcache.h"

enum { HEAD = 32 };
static const char MAGIC[8] = "MTCKC1\n";

char *rt_kcache_dir(const char *given) {
  if (given) return rt_pathf("%s", given);
  const char *env = getenv("MTC_KERNEL_CACHE"), *home = getenv("HOME");
  if (env && *env) return rt_pathf("%s", env);
  if (!home || !*home) {
    struct passwd *pw = getpwuid(geteuid());
    home = pw && pw->pw_dir && *pw->pw_dir ? pw->pw_dir : NULL;
  }
  return home ? rt_pathf("%s/.cache/mtc-kernels", home) : NULL;
}

/* mkdir -p, each missing directory 0700. */
static void mkdirs(const char *dir) {
  char *buf = rt_pathf("%s", dir);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') *p = 0, mkdir(buf, 0700), *p = '/';
  mkdir(buf, 0700);
  free(buf);
}

int rt_kcache_open(RtKcache *c, const char *dir, char *why, size_t whylen) {
  c->dfd = -1, c->dir = rt_pathf("%s", dir);
  size_t n = strlen(c->dir);
  while (n > 1 && c->dir[n - 1] == '/') c->dir[--n] = 0;
  char *parent = rt_pathf("%s", c->dir), *slash = strrchr(parent, '/');
  if (slash) slash[slash == parent] = 0;
  else strcpy(parent, ".");
  struct stat ps, st;
  int bad = 0;
  if (stat(parent, &ps) == 0 && (ps.st_mode & S_IWOTH))
    bad = 1, snprintf(why, whylen, "kernel cache %s: it lies in %s, which every user can write (another user could "
                      "plant kernels there); not used: expected MTC_KERNEL_CACHE in a directory of yours, such as "
                      "$HOME/.cache/mtc-kernels", c->dir, parent);
  free(parent);
  if (bad) return -1;
  mkdirs(c->dir);
  int fd = open(c->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return snprintf(why, whylen, "kernel cache %s: %s; not used: expected a directory of yours (it is created 0700 "
                    "when missing; a symbolic link is not followed)", c->dir, strerror(errno)), -1;
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
    snprintf(why, whylen, "kernel cache %s: %s (mode %04o); not used: expected a directory only you can write "
             "(chmod 700 %s, or set MTC_KERNEL_CACHE to another)", c->dir,
             st.st_uid != geteuid() ? "another user's directory" : "other users can write it",
             (unsigned)(st.st_mode & 07777), c->dir);
    close(fd);
    return -1;
  }
  c->dfd = fd;
  return 0;
}

/* Reads n bytes at off of fd: 0, or -1. */
static int read_at(int fd, void *p, size_t n, off_t off) {
  char *b = p;
  while (n) {
    ssize_t r = pread(fd, b, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r, n -= (size_t)r, off += r;
  }
  return 0;
}

void *rt_kcache_get(const RtKcache *c, const char *name, uint64_t key, size_t *bytes) {
  if (c->dfd < 0) return NULL;
  int fd = openat(c->dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  unsigned char head[HEAD];
  uint64_t f[3]; /* key, length, checksum */
  void *b = NULL;
  int valid = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > HEAD && read_at(fd, head, HEAD, 0) == 0 &&
              memcmp(head, MAGIC, 8) == 0;
  if (valid) memcpy(f, head + 8, sizeof f);
  valid = valid && f[0] == key && f[1] == (uint64_t)st.st_size - HEAD && (b = malloc(f[1])) &&
          read_at(fd, b, f[1], HEAD) == 0 && rt_fnv1a(RT_FNV_SEED, b, f[1]) == f[2];
  close(fd);
  if (!valid) return free(b), NULL;
  *bytes = f[1];
  return b;
}

int rt_kcache_put(const RtKcache *c, const char *name, uint64_t key, const void *p, size_t n) {
  if (c->dfd < 0) return -1;
  char *tmp = rt_pathf("%s.%ld.tmp", name, (long)getpid());
  int fd = openat(c->dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  unsigned char head[HEAD] = {0};
  uint64_t f[3] = {key, n, rt_fnv1a(RT_FNV_SEED, p, n)};
  memcpy(head, MAGIC, 8), memcpy(head + 8, f, sizeof f);
  int ok = fd >= 0 && rt_write_all(fd, head, HEAD) == 0 && rt_write_all(fd, p, n) == 0;
  if (fd >= 0) ok = close(fd) == 0 && ok;
  if (ok) ok = renameat(c->dfd, tmp, c->dfd, name) == 0;
  if (!ok && fd >= 0) unlinkat(c->dfd, tmp, 0); /* ours (O_EXCL): never a file planted there */
  free(tmp);
  return ok ? 0 : -1;
}

void rt_kcache_close(RtKcache *c) {
  if (c->dfd >= 0) close(c->dfd);
  free(c->dir);
  c->dfd = -1, c->dir = NULL;
}
