/* megatron.c — Megatron-LM's indexed dataset (.idx + .bin), memory-mapped (see mtrt_data.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtrt_ckpt.h" /* rt_pathf */
#include "mtrt_data.h"

static const char MAGIC[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

static int fail(char *err, size_t n, const char *path, const char *what) {
  snprintf(err, n, "%s: %s", path, what);
  return -1;
}

static const uint8_t *map_file(const char *path, size_t *bytes) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO: refused below, not waited on */
  if (fd < 0) return NULL;
  struct stat st;
  void *m = MAP_FAILED;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
    m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return NULL;
  *bytes = (size_t)st.st_size;
  return m;
}

/* PREFIX from path (PREFIX, PREFIX.idx or PREFIX.bin), allocated, if PREFIX.idx starts with the
 * magic; else NULL. */
char *rt_data_megatron_prefix(const char *path) {
  char *prefix = rt_pathf("%s", path);
  size_t len = strlen(path);
  if (len > 4 && (strcmp(path + len - 4, ".idx") == 0 || strcmp(path + len - 4, ".bin") == 0)) prefix[len - 4] = 0;
  char *idx = rt_pathf("%s.idx", prefix);
  char head[9];
  struct stat st; /* only a regular file is read: a FIFO would block */
  int fd = open(idx, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  int ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && pread(fd, head, 9, 0) == 9 &&
           memcmp(head, MAGIC, 9) == 0;
  if (fd >= 0) close(fd);
  free(idx);
  if (!ok) free(prefix);
  return ok ? prefix : NULL;
}

static int open_at(RtData *d, const char *ip, const char *bp, char *err, size_t errlen);

int rt_data_open_megatron(RtData *d, const char *prefix, char *err, size_t errlen) {
  char *ip = rt_pathf("%s.idx", prefix), *bp = rt_pathf("%s.bin", prefix);
  int st = open_at(d, ip, bp, err, errlen);
  free(ip), free(bp);
  return st;
}

/* rt_data_open_megatron's work, with ip and bp the .idx and .bin paths. */
static int open_at(RtData *d, const char *ip, const char *bp, char *err, size_t errlen) {
  d->idx = map_file(ip, &d->idx_bytes);
  if (!d->idx) return fail(err, errlen, ip, "cannot map the index; expected a Megatron .idx file");
  const uint8_t *p = d->idx;
  uint64_t version, nseq, ndoc;
  uint8_t code;
  if (d->idx_bytes < 34) return fail(err, errlen, ip, "index shorter than its header; expected a Megatron .idx file");
  memcpy(&version, p + 9, 8), memcpy(&code, p + 17, 1), memcpy(&nseq, p + 18, 8), memcpy(&ndoc, p + 26, 8);
  if (version != 1) return fail(err, errlen, ip, "index version is not 1; expected Megatron's MMIDIDX version 1");
  d->width = code == 1 ? 1 : code == 8 ? 2 : code == 4 ? 4 : 0;
  if (!d->width) return fail(err, errlen, ip, "token dtype is not uint8, uint16 or int32; expected one of them");
  if (nseq > ((uint64_t)1 << 40) || ndoc > ((uint64_t)1 << 40) || 34 + nseq * 12 + ndoc * 8 > d->idx_bytes)
    return fail(err, errlen, ip, "index shorter than its sequence and document counts (truncated?)");
  const uint8_t *lens = p + 34, *ptrs = lens + nseq * 4;
  d->map = map_file(bp, &d->map_bytes);
  if (!d->map) return fail(err, errlen, bp, "cannot map the token file; expected the .bin next to the .idx");
  int64_t expect = 0;
  for (uint64_t i = 0; i < nseq; i++) {
    int32_t len;
    int64_t ptr;
    memcpy(&len, lens + i * 4, 4), memcpy(&ptr, ptrs + i * 8, 8);
    if (len < 0 || ptr != expect)
      return fail(err, errlen, ip, "sequences are not stored back to back; expected an index written by Megatron's builder");
    expect += (int64_t)len * d->width;
  }
  if ((uint64_t)expect > d->map_bytes)
    return fail(err, errlen, bp, "shorter than the index says (truncated?)");
  d->format = RT_DATA_MEGATRON;
  d->tokens = d->map;
  d->ntokens = expect / d->width;
  d->ndocs = ndoc ? (int64_t)ndoc - 1 : 0; /* the document index starts with 0 */
  return 0;
}
