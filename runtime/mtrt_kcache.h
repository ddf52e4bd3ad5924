/* mtrt_kcache.h — the on-disk cache of compiled kernels (cuda/kcache.c): no CUDA, only POSIX.
 *
 * A cache is a directory only this user can write (created 0700; refused when it is a link, is
 * another user's, is group- or world-writable, or lies in a world-writable directory such as
 * /tmp). An entry is one file NAME: a 32-byte header (magic "MTCKC1", the key, the content's
 * length and its FNV-1a 64) and the content. The key is the caller's hash of everything that made
 * the content (for kernels: the NVRTC version, the source and the options); an entry whose key,
 * length or checksum does not match is not used. Files are written to NAME.PID.tmp, created with
 * O_EXCL|O_NOFOLLOW relative to the open directory, and renamed over NAME. */
#ifndef MTRT_KCACHE_H
#define MTRT_KCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int dfd;   /* the cache directory, open (-1: no cache) */
  char *dir; /* its path, allocated, for messages */
} RtKcache;

/* The cache directory to use: given when not NULL, else $MTC_KERNEL_CACHE, else
 * $HOME/.cache/mtc-kernels (HOME from the password database when unset); allocated, or NULL
 * when there is no home. */
char *rt_kcache_dir(const char *given);
/* Opens (creating it 0700 when missing) cache directory dir: 0, or -1 with why (whylen bytes)
 * saying why it is not used; c->dfd is then -1 and get/put do nothing. */
int rt_kcache_open(RtKcache *c, const char *dir, char *why, size_t whylen);
/* The content of entry name when its header carries key and its checksum matches: allocated
 * (*bytes its length), or NULL (missing, or not a valid entry for key: the caller rebuilds it). */
void *rt_kcache_get(const RtKcache *c, const char *name, uint64_t key, size_t *bytes);
/* Writes entry name (key, n bytes of p): 0, or -1 (a cache: failing costs only time). */
int rt_kcache_put(const RtKcache *c, const char *name, uint64_t key, const void *p, size_t n);
void rt_kcache_close(RtKcache *c);

#endif
