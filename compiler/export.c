/* export.c — `mtc export CKPT OUT`: a checkpoint's master weights as one safetensors file with
 * Hugging Face tensor names (format: huggingface/safetensors, "safetensors" README: an 8-byte
 * little-endian header length, a JSON header mapping each name to dtype, shape and
 * [begin, end) byte offsets into the data that follows, padded to 8 bytes). The checkpoint may
 * have been saved under any layout: every tensor is read whole through the runtime's reader. */
#include <errno.h>
#include <limits.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtc.h"
#include "mtrt_ckpt.h"

/* One exported tensor: a dense tensor, or one expert of a routed one. */
typedef struct {
  int t, e;
  char name[256];
} Item;

int export_run(const char *ckpt, const char *out) {
  char path[1100], err[600];
  struct stat st;
  snprintf(path, sizeof path, "%s/manifest.json", ckpt);
  if (stat(path, &st) == 0) snprintf(path, sizeof path, "%s", ckpt);
  else if (!rt_ckpt_latest(ckpt, path, sizeof path)) {
    fprintf(stderr, "error: %s: no complete checkpoint here; expected a directory with manifest.json, or one "
                    "holding step-N checkpoints (train --checkpoint-dir)\n", ckpt);
    return 2;
  }
  RtCkpt k;
  if (rt_ckpt_open(&k, path, err, sizeof err) != 0) {
    fprintf(stderr, "error: %s\n", err);
    return 2;
  }
  /* the manifest is validated (rt_ckpt_open): each tensor inside a shard file, experts x ep <= 2^20 */
  int64_t n64 = 0;
  for (int i = 0; i < k.ntensors; i++) n64 += k.tensors[i].experts ? (int64_t)k.tensors[i].experts * k.ep : 1;
  int n = n64 < INT_MAX ? (int)n64 : -1;
  Item *items = n >= 0 ? calloc((size_t)n + 1, sizeof *items) : NULL;
  if (!items) {
    fprintf(stderr, "error: %s: %lld tensors to export: out of memory\n", path, (long long)n64);
    rt_ckpt_close(&k);
    return 2;
  }
  const char *dtype = k.real_bytes == 4 ? "F32" : "F64";
  json_t *head = json_object(), *meta = json_object();
  char step[32];
  snprintf(step, sizeof step, "%lld", (long long)k.step);
  json_object_set_new(meta, "format", json_string("pt"));
  json_object_set_new(meta, "model", json_string(k.model));
  json_object_set_new(meta, "step", json_string(step));
  json_object_set_new(head, "__metadata__", meta);
  int64_t at = 0;
  int status = 0;
  for (int i = 0, m = 0; i < k.ntensors && !status; i++) {
    const RtCkptTensor *t = &k.tensors[i];
    int ne = t->experts ? t->experts * k.ep : 1;
    for (int e = 0; e < ne && !status; e++, m++) {
      items[m].t = i, items[m].e = t->experts ? e : -1;
      if (rt_ckpt_name(items[m].name, sizeof items[m].name, t, e) != 0 || json_object_get(head, items[m].name)) {
        fprintf(stderr, "error: %s/manifest.json: tensor %s gives the name %s twice (or one too long); expected each "
                "exported name once\n", path, t->name, items[m].name);
        status = 2;
      }
      json_t *shape = t->cols > 1 ? json_pack("[I, I]", (json_int_t)t->rows, (json_int_t)t->cols)
                                  : json_pack("[I]", (json_int_t)t->rows);
      int64_t bytes = t->count * k.real_bytes;
      json_object_set_new(head, items[m].name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype, "shape", shape,
                                                         "data_offsets", (json_int_t)at, (json_int_t)(at + bytes)));
      at += bytes;
    }
  }
  char *text = json_dumps(head, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(head);
  size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
  /* written to OUT.tmp and renamed when complete: a failure leaves any existing OUT alone */
  char tmp[4200], outdir[4200], real_out[PATH_MAX], real_ck[PATH_MAX];
  snprintf(outdir, sizeof outdir, "%s", out);
  char *slash = strrchr(outdir, '/');
  if (slash) *slash = 0;
  else snprintf(outdir, sizeof outdir, ".");
  /* never into a checkpoint directory: the one read, or any other (one holding a manifest.json) */
  char man_there[4300];
  struct stat mst;
  snprintf(man_there, sizeof man_there, "%s/manifest.json", outdir);
  bool inside = (realpath(outdir, real_out) && realpath(path, real_ck) && strcmp(real_out, real_ck) == 0) ||
                lstat(man_there, &mst) == 0;
  FILE *f = NULL;
  if (!status && !inside) { /* OUT may be replaced only if it is a regular file or missing */
    int fd = rt_replace_begin(out, tmp, sizeof tmp, err, sizeof err);
    if (fd >= 0 && !(f = fdopen(fd, "wb"))) snprintf(err, sizeof err, "%.500s: %s", tmp, strerror(errno)), close(fd), remove(tmp);
  }
  if (!status && inside) {
    fprintf(stderr, "error: %s is inside a checkpoint directory (%s holds a manifest.json); expected an output path "
            "outside every checkpoint, such as model.safetensors\n", out, outdir);
    status = 2;
  } else if (!status && !f) {
    fprintf(stderr, "error: %s\n", err); /* it names the path refused */
    status = 2;
  } else if (!status) {
    uint64_t len = padded; /* little-endian on every host mtc supports */
    fwrite(&len, 8, 1, f);
    fwrite(text, 1, hl, f);
    for (size_t i = hl; i < padded; i++) fputc(' ', f);
    double *buf = NULL;
    size_t cap = 0;
    for (int m = 0; m < n && !status; m++) {
      const RtCkptTensor *t = &k.tensors[items[m].t];
      if ((size_t)t->count > cap) free(buf), cap = (size_t)t->count, buf = malloc(sizeof(double) * cap);
      if (!buf || rt_ckpt_read(&k, t->name, items[m].e, 0, t->count, 0, buf, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n", buf ? err : "out of memory");
        status = 2;
        break;
      }
      for (int64_t i = 0; i < t->count; i++) {
        if (k.real_bytes == 4) {
          float v = (float)buf[i];
          fwrite(&v, 4, 1, f);
        } else {
          fwrite(&buf[i], 8, 1, f);
        }
      }
    }
    free(buf);
    if (fclose(f) != 0 && !status) {
      fprintf(stderr, "error: writing %s: %s\n", out, strerror(errno));
      status = 2;
    }
    if (status) remove(tmp);
    else if (rt_replace_commit(tmp, out, err, sizeof err) != 0) {
      fprintf(stderr, "error: %s\n", err);
      status = 2;
    }
  }
  if (!status) printf("wrote %s: %d tensors of %s step %lld (%s)\n", out, n, k.model, (long long)k.step, dtype);
  free(text), free(items);
  rt_ckpt_close(&k);
  return status;
}
