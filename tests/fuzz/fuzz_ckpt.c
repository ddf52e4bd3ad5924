/* fuzz_ckpt.c — libFuzzer target for what mtc reads from files it did not write itself: a
 * checkpoint's manifest.json and shard files (rt_ckpt_open, rt_ckpt_read, mtc export), and a
 * Hugging Face config.json (mtc import-hf). mtc reads no safetensors file (it only writes them, in
 * mtc export), so the safetensors side is checked the other way: every file export writes from an
 * accepted checkpoint must be a valid safetensors file, or the target aborts.
 *
 * Input: its first byte chooses the reader, the rest is that reader's file(s).
 *   'H'    the rest is config.json, given to import_hf (and its spec, if any, to spec_load);
 *   other  the rest is a checkpoint: manifest.json, then optionally "\n@SHARD@\n" and the bytes
 *          of rank-00000.bin, then "\n@SHARD@\n" and rank-00001.bin, and so on. In the manifest,
 *          "@SUM0@".."@SUM7@" become shard i's FNV-1a 64 checksum and "@BYTES0@".."@BYTES7@" its
 *          size, so the fuzzer gets past the checksum. The checkpoint is opened, every tensor
 *          (every expert) is read in all three parts (master, moments), then exported.
 * Any input must end in a clear error or in a success; never a crash, a leak or a hang. */
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtc.h"
#include "mtrt_ckpt.h"

enum { MAX_SHARDS = 8 };
static const char SEP[] = "\n@SHARD@\n";

static char root[256];  /* the scratch directory, made once: ROOT/ck/step-00000001 */
static char stepdir[300];

/* Removes the scratch directory and what the last input left there (at exit). */
static void cleanup(void) {
  char path[400];
  const char *files[] = {"manifest.json", "../../config.json", "../../out.safetensors"};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    snprintf(path, sizeof path, "%s/%s", stepdir, files[i]);
    unlink(path);
  }
  for (int i = 0; i < MAX_SHARDS; i++) {
    snprintf(path, sizeof path, "%s/rank-%05d.bin", stepdir, i);
    unlink(path);
  }
  rmdir(stepdir);
  snprintf(path, sizeof path, "%s/ck", root);
  rmdir(path);
  rmdir(root);
}

/* Makes the scratch directory once (libFuzzer's init hook). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  const char *t = getenv("TMPDIR");
  snprintf(root, sizeof root, "%s/mtc-fuzz-ckpt-XXXXXX", t && *t ? t : "/tmp");
  if (!mkdtemp(root)) abort();
  char ck[300];
  snprintf(ck, sizeof ck, "%s/ck", root);
  snprintf(stepdir, sizeof stepdir, "%s/step-00000001", ck);
  if (mkdir(ck, 0755) != 0 || mkdir(stepdir, 0755) != 0) abort();
  atexit(cleanup);
  return 0;
}

/* Writes n bytes to path (created or truncated); aborts on an I/O error (the sandbox's, not mtc's). */
static void put(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) abort();
}

/* Finds the first of needle (k bytes) in hay (n bytes): its offset, or n when absent. */
static size_t find(const uint8_t *hay, size_t n, const char *needle, size_t k) {
  for (size_t i = 0; i + k <= n; i++)
    if (memcmp(hay + i, needle, k) == 0) return i;
  return n;
}

/* The manifest text with the @SUMi@ and @BYTESi@ placeholders of shards sh[0..ns) filled in
 * (malloc'd, NUL-terminated; absent shards' placeholders stay as written). */
static char *fill(const uint8_t *man, size_t n, const uint8_t *const *sh, const size_t *len, int ns) {
  char *out = malloc(n * 3 + 64), *o = out; /* a 6-byte @SUMi@ becomes 16 hex digits, at most 3 x */
  if (!out) abort();
  for (size_t i = 0; i < n;) {
    int r;
    if (n - i >= 6 && memcmp(man + i, "@SUM", 4) == 0 && (r = man[i + 4] - '0') >= 0 && r < ns && man[i + 5] == '@') {
      o += sprintf(o, "%016llx", (unsigned long long)rt_fnv1a(RT_FNV_SEED, sh[r], len[r]));
      i += 6;
    } else if (n - i >= 8 && memcmp(man + i, "@BYTES", 6) == 0 && (r = man[i + 6] - '0') >= 0 && r < ns &&
               man[i + 7] == '@') {
      o += sprintf(o, "%zu", len[r]);
      i += 8;
    } else {
      *o++ = (char)man[i++];
    }
  }
  *o = 0;
  return out;
}

/* Reads every tensor of an open checkpoint k (each expert of a routed one, at most 64 reads)
 * through rt_ckpt_read: master values and both moments, at most 4096 elements each, plus one
 * read past the end that must fail. */
static void read_all(RtCkpt *k) {
  char err[600], name[256];
  double *buf = malloc(sizeof(double) * 4096);
  if (!buf) abort();
  int reads = 0;
  for (int i = 0; i < k->ntensors && reads < 64; i++) {
    const RtCkptTensor *t = &k->tensors[i];
    int ne = t->experts ? t->experts * k->ep : 1;
    for (int e = 0; e < ne && reads < 64; e++, reads++) {
      int64_t n = t->count < 4096 ? t->count : 4096;
      (void)rt_ckpt_name(name, sizeof name, t, e);
      for (int which = 0; which < 3; which++)
        if (rt_ckpt_read(k, t->name, t->experts ? e : -1, t->count - n, n, which, buf, err, sizeof err) != 0) break;
      if (rt_ckpt_read(k, t->name, t->experts ? e : -1, t->count, 1, 0, buf, err, sizeof err) == 0) abort();
    }
  }
  free(buf);
}

/* Reads a little-endian u64 at p. */
static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Checks that path is a valid safetensors file as mtc export promises: an 8-byte header length,
 * a JSON object header, every tensor F32/F64 with data_offsets [b, e) where e - b = the shape's
 * product x the dtype's size, the tensors back to back, and the data ending at the file's end.
 * Aborts otherwise (the fuzzer reports it). */
static void check_safetensors(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) abort();
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  rewind(f);
  uint8_t *b = malloc((size_t)size + 1);
  if (!b || size < 8 || fread(b, 1, (size_t)size, f) != (size_t)size) abort();
  fclose(f);
  uint64_t hl = le64(b);
  if (hl > (uint64_t)size - 8) abort();
  json_error_t je;
  json_t *h = json_loadb((const char *)b + 8, (size_t)hl, 0, &je);
  if (!json_is_object(h)) abort();
  uint64_t data = (uint64_t)size - 8 - hl, at = 0;
  const char *key;
  json_t *v;
  json_object_foreach(h, key, v) {
    if (!strcmp(key, "__metadata__")) continue;
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
    uint64_t es = json_is_string(dt) && !strcmp(json_string_value(dt), "F32") ? 4 : 8, elems = 1;
    if (!json_is_array(sh) || json_array_size(off) != 2) abort();
    for (size_t i = 0; i < json_array_size(sh); i++) elems *= (uint64_t)json_integer_value(json_array_get(sh, i));
    uint64_t b0 = (uint64_t)json_integer_value(json_array_get(off, 0)), e0 = (uint64_t)json_integer_value(json_array_get(off, 1));
    if (b0 != at || e0 < b0 || e0 - b0 != elems * es || e0 > data) abort();
    at = e0;
  }
  if (at != data) abort();
  json_decref(h);
  free(b);
}

/* The checkpoint reader: splits the input into a manifest and shards, writes them to the step
 * directory, opens, reads and exports the checkpoint, then removes the files. */
static void fuzz_checkpoint(const uint8_t *data, size_t size) {
  const uint8_t *sh[MAX_SHARDS];
  size_t len[MAX_SHARDS];
  int ns = 0;
  size_t mlen = find(data, size, SEP, sizeof SEP - 1);
  for (size_t at = mlen; at < size && ns < MAX_SHARDS;) {
    at += sizeof SEP - 1;
    size_t n = find(data + at, size - at, SEP, sizeof SEP - 1);
    sh[ns] = data + at, len[ns++] = n;
    at += n;
  }
  char path[400], out[400], err[600];
  char *man = fill(data, mlen, sh, len, ns);
  snprintf(path, sizeof path, "%s/manifest.json", stepdir);
  put(path, man, strlen(man));
  free(man);
  for (int i = 0; i < ns; i++) {
    snprintf(path, sizeof path, "%s/rank-%05d.bin", stepdir, i);
    put(path, sh[i], len[i]);
  }
  RtCkpt k;
  if (rt_ckpt_open(&k, stepdir, err, sizeof err) == 0) {
    read_all(&k);
    rt_ckpt_close(&k);
    /* export through the directory of step-N directories (rt_ckpt_latest), as a user may */
    snprintf(path, sizeof path, "%s/ck", root);
    snprintf(out, sizeof out, "%s/out.safetensors", root);
    if (export_run(path, out, NULL, NULL, 0) == 0) check_safetensors(out);
    unlink(out);
  }
  for (int i = 0; i < MAX_SHARDS; i++) {
    snprintf(path, sizeof path, "%s/rank-%05d.bin", stepdir, i);
    unlink(path);
  }
}

/* The import-hf reader: the input as config.json, then the spec it writes (if any) loaded. */
static void fuzz_config(const uint8_t *data, size_t size) {
  char path[400];
  snprintf(path, sizeof path, "%s/config.json", root);
  put(path, data, size);
  Mem m = {0};
  Diag d = {.mem = &m};
  char *spec = import_hf(&m, &d, path);
  if (spec) {
    Diag d2 = {.mem = &m};
    (void)spec_load(&m, &d2, "imported.yaml", spec, strlen(spec), NULL, 0);
  }
  mem_free(&m);
}

/* libFuzzer's entry: the first byte chooses the reader (see the top of this file). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  if (data[0] == 'H') fuzz_config(data + 1, size - 1);
  else fuzz_checkpoint(data + 1, size - 1);
  return 0;
}
