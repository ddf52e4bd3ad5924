/* data.c — token files memory-mapped, and deterministic per-rank windows over them. */
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

enum { LLMC_MAGIC = 20240520, LLMC_VERSION = 1, LLMC_HEADER_BYTES = 256 * 4 };

static int fail(char *err, size_t n, const char *path, const char *what) {
  snprintf(err, n, "%s: %s", path, what);
  return -1;
}

/* megatron.c */
char *rt_data_megatron_prefix(const char *path);
int rt_data_open_megatron(RtData *d, const char *prefix, char *err, size_t errlen);

static int64_t token(const RtData *d, int64_t i) {
  if (d->width == 1) return ((const uint8_t *)d->tokens)[i];
  if (d->width == 2) return ((const uint16_t *)d->tokens)[i];
  return ((const int32_t *)d->tokens)[i];
}

/* Every token in [0, vocab), and enough of them for one sequence. */
static int check_tokens(RtData *d, const char *path, int vocab, int seq_len, char *err, size_t errlen) {
  char msg[200];
  for (int64_t i = 0; d->width > 1 && i < d->ntokens; i++) {
    int64_t t = token(d, i);
    if (t < 0 || t >= vocab) {
      snprintf(msg, sizeof msg, "token %lld at position %lld is outside the model's vocabulary of %d",
               (long long)t, (long long)i, vocab);
      rt_data_close(d);
      return fail(err, errlen, path, msg);
    }
  }
  if (d->ntokens < (int64_t)seq_len + 1) {
    snprintf(msg, sizeof msg, "%lld tokens, fewer than one sequence of %d + 1; expected more data",
             (long long)d->ntokens, seq_len);
    rt_data_close(d);
    return fail(err, errlen, path, msg);
  }
  return 0;
}

int rt_data_open(RtData *d, const char *path, int vocab, int seq_len, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  char *prefix = rt_data_megatron_prefix(path);
  d->path = rt_pathf("%s", path);
  if (prefix) {
    int st = rt_data_open_megatron(d, prefix, err, errlen);
    char *bin = rt_pathf("%s.bin", prefix);
    int bfd = st == 0 ? open(bin, O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
    if (st == 0 && bfd < 0) st = fail(err, errlen, bin, "cannot open the token file; expected the .bin next to the .idx");
    d->fd1 = bfd + 1;
    free(d->path), d->path = bin;
    free(prefix);
    if (st != 0) {
      rt_data_close(d);
      return -1;
    }
    if (d->width == 1 && vocab < 256) {
      rt_data_close(d);
      return fail(err, errlen, path, "uint8 tokens need a vocabulary of at least 256");
    }
    return check_tokens(d, path, vocab, seq_len, err, errlen);
  }
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* O_NONBLOCK: a FIFO is refused below, not waited on */
  if (fd < 0) {
    char msg[320];
    snprintf(msg, sizeof msg, "cannot open: %s; expected a token file: raw text, an llm.c .bin shard, or a Megatron "
             "indexed dataset (PREFIX, PREFIX.idx or PREFIX.bin)", strerror(errno));
    rt_data_close(d); /* (d->path) */
    return fail(err, errlen, path, msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    rt_data_close(d);
    return fail(err, errlen, path, S_ISFIFO(st.st_mode) ? "a FIFO, not a regular file; expected a token file (mtc maps "
                                   "it into memory: a file on disk)" : "not a regular file; expected a token file");
  }
  if (st.st_size == 0) {
    close(fd);
    rt_data_close(d);
    return fail(err, errlen, path, "the file is empty; expected tokens to train on");
  }
  void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  d->fd1 = fd + 1;
  if (map == MAP_FAILED) return rt_data_close(d), fail(err, errlen, path, "cannot map the file into memory");
  d->map = map, d->map_bytes = (size_t)st.st_size;
  int32_t head[3] = {0};
  if (d->map_bytes >= sizeof head) memcpy(head, d->map, sizeof head);
  if (head[0] == LLMC_MAGIC) {
    if (head[1] != LLMC_VERSION) {
      rt_data_close(d);
      return fail(err, errlen, path, "llm.c shard of an unsupported version; expected version 1 (uint16 tokens)");
    }
    if (d->map_bytes < LLMC_HEADER_BYTES || head[2] < 0 ||
        (d->map_bytes - LLMC_HEADER_BYTES) / 2 < (size_t)head[2]) {
      rt_data_close(d);
      return fail(err, errlen, path, "llm.c shard shorter than its header's token count (truncated?)");
    }
    d->format = RT_DATA_LLMC;
    d->tokens = d->map + LLMC_HEADER_BYTES, d->tokens_off = LLMC_HEADER_BYTES;
    d->ntokens = head[2];
    d->width = 2;
  } else {
    size_t len = strlen(path);
    const char *ext = len > 4 ? path + len - 4 : "";
    if (strcmp(ext, ".bin") == 0 || strcmp(ext, ".idx") == 0) { /* read as bytes, a dataset's tokens would be noise */
      char msg[400];
      snprintf(msg, sizeof msg, "%s; expected a Megatron dataset (PREFIX.idx, starting MMIDIDX, beside PREFIX.bin) or "
               "an llm.c shard (header magic 20240520); raw text to read one token per byte needs a name that does "
               "not end in %s", strcmp(ext, ".idx") == 0 ? "not a Megatron index (no MMIDIDX header)"
               : "neither an llm.c shard nor a Megatron .bin (no .idx with the MMIDIDX header beside it)", ext);
      rt_data_close(d);
      return fail(err, errlen, path, msg);
    }
    if (vocab < 256) {
      rt_data_close(d);
      return fail(err, errlen, path, "raw bytes need a vocabulary of at least 256; expected an llm.c shard for this model");
    }
    d->format = RT_DATA_BYTES;
    d->tokens = d->map;
    d->ntokens = (int64_t)d->map_bytes;
    d->width = 1;
  }
  return check_tokens(d, path, vocab, seq_len, err, errlen);
}

const char *rt_data_format_name(const RtData *d) {
  if (d->format == RT_DATA_LLMC) return "llm.c shard, uint16 tokens";
  if (d->format == RT_DATA_MEGATRON) return d->width == 1 ? "Megatron dataset, uint8 tokens"
                                            : d->width == 2 ? "Megatron dataset, uint16 tokens"
                                                            : "Megatron dataset, int32 tokens";
  return "raw bytes, one token per byte";
}

void rt_data_close(RtData *d) {
  if (d->map) munmap((void *)d->map, d->map_bytes);
  if (d->idx) munmap((void *)d->idx, d->idx_bytes);
  if (d->fd1 > 0) close(d->fd1 - 1);
  free(d->path);
  memset(d, 0, sizeof *d);
}

/* splitmix64 (Steele et al. 2014). */
static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static uint64_t gcd(uint64_t a, uint64_t b) { return b ? gcd(b, a % b) : a; }

/* The file is cut into windows of T + 1 tokens at multiples of T (the last token of one is
 * the first of the next). Sample s of an epoch reads window (a·s + c) mod n, with a coprime to
 * n: a permutation, so distinct samples read distinct windows until the epoch wraps. */
/* The token at p, width bytes (little-endian hosts, as token()). */
static int32_t decode(const uint8_t *p, int width) {
  uint16_t h;
  int32_t w;
  if (width == 1) return p[0];
  if (width == 2) return memcpy(&h, p, 2), h;
  return memcpy(&w, p, 4), w;
}

/* Reads tokens [start, start + n) into buf (n × width bytes) with pread: 0, or -1 (short: the
 * file was cut). */
static int read_window(const RtData *d, uint8_t *buf, int64_t start, int64_t n) {
  size_t want = (size_t)n * (size_t)d->width, got = 0;
  off_t off = (off_t)(d->tokens_off + start * d->width);
  while (got < want) {
    ssize_t r = pread(d->fd1 - 1, buf + got, want - got, off + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

int rt_data_batch(const RtData *d, int32_t *inputs, int32_t *targets, int B, int T, int64_t step,
                  int accum, int micro, int dp_rank, int dp_size, uint64_t seed, char *err, size_t errlen) {
  return rt_data_batch_cp(d, inputs, targets, B, T, 1, 0, step, accum, micro, dp_rank, dp_size, seed, err, errlen);
}

int rt_data_batch_cp(const RtData *d, int32_t *inputs, int32_t *targets, int B, int T, int cp, int cp_rank,
                     int64_t step, int accum, int micro, int dp_rank, int dp_size, uint64_t seed, char *err,
                     size_t errlen) {
  uint64_t n = (uint64_t)(d->ntokens - 1) / (uint64_t)T; /* >= 1: open() checked T + 1 tokens */
  uint64_t a = mix(seed) % n | 1, c = mix(seed + 1) % n;
  while (gcd(a, n) != 1) a++;
  const int Tl = T / cp, half = Tl / 2;
  /* this rank's positions: all T (cp 1), or chunks cp_rank and 2 cp - 1 - cp_rank of T / (2 cp) */
  const int64_t lo = cp > 1 ? (int64_t)cp_rank * half : 0, hi = cp > 1 ? (int64_t)(2 * cp - 1 - cp_rank) * half : half;
  uint8_t *buf = d->fd1 > 0 ? malloc((size_t)(T + 1) * 4) : NULL;
  int st = 0;
  for (int b = 0; b < B; b++) {
    uint64_t sample = (((uint64_t)step * (uint64_t)accum + (uint64_t)micro) * (uint64_t)dp_size +
                       (uint64_t)dp_rank) * (uint64_t)B + (uint64_t)b;
    uint64_t w = (a % n * (sample % n) % n + c) % n; /* n < 2^32 windows keeps this exact */
    int64_t start = (int64_t)(w * (uint64_t)T);
    int cut = !buf || read_window(d, buf, start, T + 1) != 0;
    if (cut && !st) {
      struct stat now;
      long long bytes = d->fd1 > 0 && fstat(d->fd1 - 1, &now) == 0 ? (long long)now.st_size : -1;
      snprintf(err, errlen, "%s: cannot read tokens %lld..%lld (bytes %lld.. of the file, which now has %lld): the "
               "file was cut or replaced during the run; expected the data file unchanged while training",
               d->path ? d->path : "the data file", (long long)start, (long long)(start + T),
               (long long)(d->tokens_off + start * d->width), bytes);
      st = -1;
    }
    for (int t = 0; t < Tl; t++) {
      int64_t i = t < half ? lo + t : hi + (t - half); /* the token's position in the window */
      inputs[(size_t)b * Tl + t] = cut ? 0 : decode(buf + (size_t)i * (size_t)d->width, d->width);
      targets[(size_t)b * Tl + t] = cut ? 0 : decode(buf + (size_t)(i + 1) * (size_t)d->width, d->width);
    }
  }
  free(buf);
  return st;
}
