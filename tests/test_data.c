/* test_data.c — the data loader: formats, windows, distinct samples per rank, and the error
 * for each kind of bad file.   usage: test_data TMPDIR */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mtrt_data.h"

static const char *dir;

static const char *write_file(const char *name, const void *bytes, size_t n) {
  static char path[8][512];
  static int k;
  char *p = path[k++ % 8];
  snprintf(p, 512, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  if (!f) return p;
  fwrite(bytes, 1, n, f);
  fclose(f);
  return p;
}

/* Writes an llm.c shard of n tokens t[i] = (7 i) mod m; declared says what the header claims. */
static const char *write_shard(const char *name, int n, int m, int declared) {
  size_t bytes = 1024 + 2 * (size_t)n;
  unsigned char *buf = calloc(1, bytes);
  int32_t head[3] = {20240520, 1, declared};
  memcpy(buf, head, sizeof head);
  uint16_t *t = (uint16_t *)(buf + 1024);
  for (int i = 0; i < n; i++) t[i] = (uint16_t)(7 * i % m);
  const char *p = write_file(name, buf, bytes);
  free(buf);
  return p;
}

/* Writes a Megatron indexed dataset NAME.idx + NAME.bin of `docs` documents, document k holding
 * len[k] tokens t = (1000 k + i) (int32, dtype code 4; or uint16, code 8), each document one
 * sequence. The layout is written here from Megatron-LM's description (indexed_dataset.py):
 * magic "MMIDIDX\0\0", u64 version 1, u8 dtype, u64 sequences, u64 documents + 1, i32 lengths,
 * i64 byte pointers, i64 document index [0, 1, ..., docs]. */
static const char *write_megatron(const char *name, const int *len, int docs, int code, int corrupt) {
  static char prefix[512];
  snprintf(prefix, sizeof prefix, "%s/%s", dir, name);
  char path[600];
  int w = code == 4 ? 4 : 2;
  snprintf(path, sizeof path, "%s.bin", prefix);
  FILE *f = fopen(path, "wb");
  for (int k = 0; k < docs; k++)
    for (int i = 0; i < len[k]; i++) {
      int32_t v = 1000 * k + i;
      uint16_t h = (uint16_t)v;
      fwrite(w == 4 ? (void *)&v : (void *)&h, (size_t)w, 1, f);
    }
  fclose(f);
  snprintf(path, sizeof path, "%s.idx", prefix);
  f = fopen(path, "wb");
  uint64_t version = 1, nseq = (uint64_t)docs, ndoc = (uint64_t)docs + 1;
  uint8_t dt = (uint8_t)code;
  fwrite("MMIDIDX\0\0", 1, 9, f);
  fwrite(&version, 8, 1, f), fwrite(&dt, 1, 1, f), fwrite(&nseq, 8, 1, f), fwrite(&ndoc, 8, 1, f);
  for (int k = 0; k < docs; k++) fwrite(&len[k], 4, 1, f);
  int64_t ptr = 0;
  for (int k = 0; k < docs; k++) {
    int64_t p = ptr + (corrupt && k == docs - 1 ? 2 : 0);
    fwrite(&p, 8, 1, f);
    ptr += (int64_t)len[k] * w;
  }
  for (int64_t k = 0; k <= docs; k++) fwrite(&k, 8, 1, f);
  fclose(f);
  return prefix;
}

static bool open_fails(const char *path, int vocab, int T, const char *needle) {
  RtData d;
  char err[512] = "";
  int rc = rt_data_open(&d, path, vocab, T, err, sizeof err);
  if (rc == 0) rt_data_close(&d);
  if (rc == 0 || !strstr(err, needle)) fprintf(stderr, "  got: rc %d, '%s'\n", rc, err);
  return rc != 0 && strstr(err, needle) && strstr(err, path);
}

int main(int argc, char **argv) {
  if (argc != 2) return fprintf(stderr, "usage: test_data TMPDIR\n"), 2;
  dir = argv[1];
  enum { T = 8, B = 2, RANKS = 4, ACCUM = 2 };
  char text[1001];
  uint32_t lcg = 12345; /* letters from an LCG: no window of 9 repeats */
  for (int i = 0; i < 1000; i++) lcg = lcg * 1664525u + 1013904223u, text[i] = (char)('a' + (lcg >> 16) % 26);
  const char *raw = write_file("raw.txt", text, 1000);
  RtData d;
  char err[512];
  CHECK_EQ(rt_data_open(&d, raw, 256, T, err, sizeof err), 0);
  CHECK(d.format == RT_DATA_BYTES && d.ntokens == 1000);
  CHECK(strcmp(rt_data_format_name(&d), "raw bytes, one token per byte") == 0);
  int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];
  int64_t starts[RANKS * ACCUM * B];
  int ns = 0, bad = 0;
  for (int r = 0; r < RANKS; r++)
    for (int m = 0; m < ACCUM; m++) {
      rt_data_batch(&d, in, tg, B, T, 3, ACCUM, m, r, RANKS, 42, NULL, 0);
      rt_data_batch(&d, in2, tg2, B, T, 3, ACCUM, m, r, RANKS, 42, NULL, 0);
      bad += memcmp(in, in2, sizeof in) != 0 || memcmp(tg, tg2, sizeof tg) != 0; /* deterministic */
      for (int b = 0; b < B; b++) {
        /* a window of the file at a multiple of T, targets shifted by one */
        int64_t s = -1;
        for (int64_t w = 0; w + T < 1000; w += T)
          if (text[w] == in[b * T]) {
            bool same = true;
            for (int t = 0; t < T; t++) same &= text[w + t] == (char)in[b * T + t] && text[w + t + 1] == (char)tg[b * T + t];
            if (same) { s = w; break; }
          }
        bad += s < 0;
        starts[ns++] = s;
      }
    }
  CHECK_EQ(bad, 0);
  int dup = 0; /* 16 samples of one step: 16 distinct windows (124 in the file) */
  for (int i = 0; i < ns; i++)
    for (int j = i + 1; j < ns; j++) dup += starts[i] == starts[j];
  CHECK_EQ(dup, 0);
  rt_data_batch(&d, in2, tg2, B, T, 3, ACCUM, 0, 0, RANKS, 43, NULL, 0); /* another seed, other samples */
  rt_data_batch(&d, in, tg, B, T, 3, ACCUM, 0, 0, RANKS, 42, NULL, 0);
  CHECK(memcmp(in, in2, sizeof in) != 0);
  rt_data_close(&d);

  const char *shard = write_shard("ok.bin", 500, 300, 500);
  CHECK_EQ(rt_data_open(&d, shard, 300, T, err, sizeof err), 0);
  CHECK(d.format == RT_DATA_LLMC && d.ntokens == 500);
  CHECK(strcmp(rt_data_format_name(&d), "llm.c shard, uint16 tokens") == 0);
  rt_data_batch(&d, in, tg, B, T, 0, 1, 0, 0, 1, 7, NULL, 0);
  bad = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t + 1 < T; t++) bad += tg[b * T + t] != in[b * T + t + 1];
  for (int i = 0; i < B * T; i++) bad += in[i] < 0 || in[i] >= 300;
  CHECK_EQ(bad, 0);
  rt_data_close(&d);

  /* Megatron: three documents of 5, 13 and 30 tokens; windows of T + 1 = 9 tokens at multiples
   * of 8 cross the document boundaries (at 5 and 18) */
  int lens[3] = {5, 13, 30};
  const char *mg = write_megatron("mega", lens, 3, 4, 0);
  int64_t all[48];
  for (int k = 0, n = 0; k < 3; k++)
    for (int i = 0; i < lens[k]; i++) all[n++] = 1000 * k + i;
  char path[600];
  for (int form = 0; form < 3; form++) { /* PREFIX, PREFIX.idx, PREFIX.bin */
    snprintf(path, sizeof path, "%s%s", mg, form == 0 ? "" : form == 1 ? ".idx" : ".bin");
    CHECK_EQ(rt_data_open(&d, path, 3000, T, err, sizeof err), 0);
    CHECK(d.format == RT_DATA_MEGATRON && d.ntokens == 48 && d.ndocs == 3 && d.width == 4);
    rt_data_close(&d);
  }
  CHECK_EQ(rt_data_open(&d, mg, 3000, T, err, sizeof err), 0);
  bad = 0;
  int crossed = 0, seen[5] = {0};
  for (int r = 0; r < 5; r++) { /* 5 windows in 48 tokens: 5 samples of one rank each */
    rt_data_batch(&d, in, tg, 1, T, 0, 1, 0, r, 5, 9, NULL, 0);
    int64_t w = -1;
    for (int64_t s = 0; s + T < 48; s += T)
      if (all[s] == in[0]) w = s;
    bad += w < 0;
    if (w < 0) continue;
    seen[w / T]++;
    for (int t = 0; t < T; t++) bad += in[t] != all[w + t] || tg[t] != all[w + t + 1];
    crossed += (w < 5 && w + T >= 5) || (w < 18 && w + T >= 18);
  }
  CHECK_EQ(bad, 0);
  CHECK(crossed >= 2); /* windows that hold the end of one document and the start of the next */
  for (int i = 0; i < 5; i++) CHECK_EQ(seen[i], 1); /* each rank its own window */
  rt_data_close(&d);
  CHECK_EQ(rt_data_open(&d, write_megatron("mega16", lens, 3, 8, 0), 3000, T, err, sizeof err), 0);
  CHECK(d.width == 2 && d.ntokens == 48);
  CHECK(strcmp(rt_data_format_name(&d), "Megatron dataset, uint16 tokens") == 0);
  rt_data_close(&d);
  /* a .bin without its .idx, or an .idx that is not Megatron's, is never read as raw bytes */
  CHECK(open_fails(write_file("lone.bin", text, 1000), 256, T, "neither an llm.c shard nor a Megatron .bin"));
  CHECK(open_fails(write_file("lone.idx", text, 1000), 256, T, "not a Megatron index (no MMIDIDX header)"));
  snprintf(path, sizeof path, "%s.idx", write_megatron("gap", lens, 3, 4, 1));
  CHECK(open_fails(path, 3000, T, "not stored back to back"));
  snprintf(path, sizeof path, "%s.idx", write_megatron("bigtok", lens, 3, 4, 0));
  CHECK(open_fails(path, 2000, T, "outside the model's vocabulary of 2000"));

  CHECK(open_fails(shard, 256, T, "outside the model's vocabulary of 256"));
  CHECK(open_fails(write_shard("short.bin", 10, 300, 1000), 300, T, "shorter than its header"));
  CHECK(open_fails(write_file("empty.txt", "", 0), 256, T, "the file is empty"));
  CHECK(open_fails(write_file("tiny.txt", "abcd", 4), 256, T, "fewer than one sequence of 8"));
  CHECK(open_fails(raw, 100, T, "raw bytes need a vocabulary of at least 256"));
  char missing[512];
  snprintf(missing, sizeof missing, "%s/no-such-file.bin", dir);
  CHECK(open_fails(missing, 256, T, "cannot open"));
  CHECK(open_fails(dir, 256, T, "not a regular file"));
  return CHECK_DONE("test_data");
}
