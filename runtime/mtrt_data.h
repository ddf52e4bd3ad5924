/*
 * mtrt_data.h — training data for the generated program: a file of tokens, memory-mapped,
 * read in deterministic windows so that every data-parallel rank sees distinct samples.
 *
 * Formats (detected from the first bytes):
 *   llm.c / nanoGPT shard: a header of 256 int32 (magic 20240520, version 1, token count)
 *     followed by uint16 tokens (karpathy/llm.c, dev/data/data_common.py);
 *   anything else: raw bytes, one token per byte (a byte vocabulary of 256).
 */
#ifndef MTRT_DATA_H
#define MTRT_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef enum { RT_DATA_BYTES, RT_DATA_LLMC } RtDataFormat;

typedef struct {
  RtDataFormat format;
  const uint8_t *map; /* the whole file, read-only */
  size_t map_bytes;
  const void *tokens; /* uint8 or uint16 */
  int64_t ntokens;
} RtData;

/* Opens path for a model with `vocab` tokens and sequences of seq_len. Fails (returns -1 and
 * writes "path: what; expected ..." into err) on a missing, unreadable or empty file, a shard
 * whose header disagrees with its size, fewer than seq_len + 1 tokens, raw bytes with a
 * vocabulary under 256, or a shard token >= vocab. Returns 0 on success. */
int rt_data_open(RtData *d, const char *path, int vocab, int seq_len, char *err, size_t errlen);
void rt_data_close(RtData *d);

/* The B sequences of one micro-batch: inputs and targets (B, T), targets shifted by one.
 * Sample number ((step × accum + micro) × dp_size + dp_rank) × B + b reads a window of T + 1
 * tokens chosen by a permutation of the file's windows fixed by seed: the same on every run,
 * and distinct for distinct samples (ranks, micro-batches, steps) within an epoch. Files of
 * up to 2^32 windows. */
void rt_data_batch(const RtData *d, int32_t *inputs, int32_t *targets, int B, int T, int64_t step,
                   int accum, int micro, int dp_rank, int dp_size, uint64_t seed);

#endif
