/*
 * mtrt_data.h — training data for the generated program: a file of tokens, memory-mapped,
 * read in deterministic windows so that every data-parallel rank sees distinct samples.
 *
 * Formats (detected from the first bytes):
 *   llm.c / nanoGPT shard: a header of 256 int32 (magic 20240520, version 1, token count)
 *     followed by uint16 tokens (karpathy/llm.c, dev/data/data_common.py);
 *   Megatron indexed dataset: PREFIX.idx + PREFIX.bin (give PREFIX, or either file); the .idx
 *     header "MMIDIDX\0\0", version 1, a dtype code (uint8 1, int32 4, uint16 8), the sequence
 *     and document counts, then per sequence its length (int32) and byte offset (int64), and
 *     the document index (Megatron-LM, megatron/core/datasets/indexed_dataset.py). Documents
 *     are concatenated in order; a sample may cross a document boundary, as in Megatron's
 *     GPT dataset;
 *   anything else: raw bytes, one token per byte (a byte vocabulary of 256), except a name
 *     ending in .bin or .idx, which is refused (a dataset read as bytes would train on noise).
 */
#ifndef MTRT_DATA_H
#define MTRT_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef enum { RT_DATA_BYTES, RT_DATA_LLMC, RT_DATA_MEGATRON } RtDataFormat;

typedef struct {
  RtDataFormat format;
  const uint8_t *map; /* the whole file, read-only */
  size_t map_bytes;
  const void *tokens; /* width bytes each: uint8, uint16 or int32 */
  int width;
  int64_t ntokens;
  const uint8_t *idx; /* Megatron: the .idx file, mapped */
  size_t idx_bytes;
  int64_t ndocs;      /* Megatron: documents */
  int fd1;            /* the token file's descriptor + 1 (0: none): batches pread it, so a file cut
                         during a run is an error naming it, never a SIGBUS in the mapping */
  int64_t tokens_off; /* byte offset of token 0 in that file */
  char *path;         /* the token file (allocated), for messages */
} RtData;

/* Opens path for a model with `vocab` tokens and sequences of seq_len. Fails (returns -1 and
 * writes "path: what; expected ..." into err) on a missing, unreadable or empty file, a shard
 * whose header disagrees with its size, a path that is not a regular file (a FIFO is refused at
 * once, never waited on), a Megatron index that is malformed, of another dtype
 * or whose sequences are not stored back to back, fewer than seq_len + 1 tokens, raw bytes
 * with a vocabulary under 256, or a token outside [0, vocab). Returns 0 on success. */
int rt_data_open(RtData *d, const char *path, int vocab, int seq_len, char *err, size_t errlen);
void rt_data_close(RtData *d);
/* The format of an open file, for the start-up line: "raw bytes, one token per byte", "llm.c
 * shard, uint16 tokens" or "Megatron dataset, uint16 tokens" (its token width). */
const char *rt_data_format_name(const RtData *d);

/* The B sequences of one micro-batch: inputs and targets (B, T), targets shifted by one.
 * Returns 0, or -1 with "PATH: ...; expected ..." in err (errlen bytes) when the file no longer
 * holds the tokens it held at open (cut or replaced during the run): tokens not read are 0.
 * Sample number ((step × accum + micro) × dp_size + dp_rank) × B + b reads a window of T + 1
 * tokens chosen by a permutation of the file's windows fixed by seed: the same on every run,
 * and distinct for distinct samples (ranks, micro-batches, steps) within an epoch. Files of
 * up to 2^32 windows. */
int rt_data_batch(const RtData *d, int32_t *inputs, int32_t *targets, int B, int T, int64_t step,
                  int accum, int micro, int dp_rank, int dp_size, uint64_t seed, char *err, size_t errlen);
/* The same samples with each sequence split over a cp group (context parallelism; cp 1 is
 * rt_data_batch): inputs and targets (B, T / cp) hold this rank's chunks cp_rank and 2 cp - 1 -
 * cp_rank of T / (2 cp) tokens of each sequence (T a multiple of 2 cp); dp_rank and dp_size count
 * cp groups, whose ranks read the same sequences. Returns 0, or -1 with err as rt_data_batch. */
int rt_data_batch_cp(const RtData *d, int32_t *inputs, int32_t *targets, int B, int T, int cp, int cp_rank,
                     int64_t step, int accum, int micro, int dp_rank, int dp_size, uint64_t seed, char *err,
                     size_t errlen);

#endif
