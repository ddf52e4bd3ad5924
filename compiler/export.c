/* export.c — `mtc export CKPT OUT`: a checkpoint's master weights as one safetensors file with
 * the program's (Llama/DeepSeek-style) tensor names; `mtc export CKPT OUTDIR --spec SPEC`:
 * OUTDIR/model.safetensors in the names of the Hugging Face family that expresses SPEC's model
 * and OUTDIR/config.json (export_hf.c), both or neither. Format: huggingface/safetensors,
 * "safetensors" README: an 8-byte little-endian header length, a JSON header mapping each name
 * to dtype, shape and [begin, end) byte offsets into the data that follows, padded to 8 bytes.
 * The checkpoint may have been saved under any layout: every tensor is read whole through the
 * runtime's reader. */
#include <dirent.h>
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

/* Writes v as the file's dtype (4 bytes: F32, 8: F64). */
static void put(FILE *f, double v, int bytes) {
  if (bytes == 4) {
    float x = (float)v;
    fwrite(&x, 4, 1, f);
  } else {
    fwrite(&v, 8, 1, f);
  }
}

/* Finds the manifest tensor of each part (tix[3 i + p]) and checks that the parts cover every
 * tensor and expert of the checkpoint once, with the spec's shapes. 0, or 2 after an error
 * naming the tensor. */
static int match_spec(const RtCkpt *k, const char *path, const char *spec, const ExportTensor *ts, int n, int *tix) {
  int64_t want = 0, have = 0;
  for (int i = 0; i < k->ntensors; i++) want += k->tensors[i].experts ? (int64_t)k->tensors[i].experts * k->ep : 1;
  for (int i = 0; i < n; i++)
    for (int p = 0; p < ts[i].nparts; p++) {
      const ExportPart *pt = &ts[i].parts[p];
      int t = 0;
      while (t < k->ntensors && strcmp(k->tensors[t].name, pt->raw) != 0) t++;
      const RtCkptTensor *ct = t < k->ntensors ? &k->tensors[t] : NULL;
      int64_t cols = pt->cols ? pt->cols : 1;
      if (!ct || ct->rows != pt->rows || ct->cols != cols || (pt->expert >= 0) != (ct->experts > 0) ||
          (ct->experts && pt->expert >= (int64_t)ct->experts * k->ep)) {
        fprintf(stderr, "error: %s/manifest.json: tensor %s (%lld x %lld in the model of %s) is %s; expected the "
                "checkpoint of a program compiled from %s, with the same --set overrides\n", path, pt->raw,
                (long long)pt->rows, (long long)cols, spec, !ct ? "not in the checkpoint" : "of another shape or "
                "expert count there", spec);
        return 2;
      }
      tix[3 * i + p] = t;
      have++;
    }
  if (have != want) {
    fprintf(stderr, "error: %s/manifest.json: the checkpoint holds %lld tensors (each expert counted), the model of %s "
            "%lld; expected the checkpoint of a program compiled from %s\n", path, (long long)want, spec,
            (long long)have, spec);
    return 2;
  }
  return 0;
}

/* The tensors of the checkpoint under its own names: one per tensor and expert (tix as above). */
static ExportTensor *raw_tensors(Mem *m, const RtCkpt *k, const char *path, int *count, int **tix) {
  int64_t n64 = 0;
  for (int i = 0; i < k->ntensors; i++) n64 += k->tensors[i].experts ? (int64_t)k->tensors[i].experts * k->ep : 1;
  if (n64 >= INT_MAX / 3) {
    fprintf(stderr, "error: %s/manifest.json: %lld tensors to export; expected fewer than %d\n", path, (long long)n64,
            INT_MAX / 3);
    return NULL;
  }
  int n = (int)n64;
  ExportTensor *ts = mem_array(m, (size_t)n + 1, sizeof *ts);
  *tix = mem_array(m, 3 * (size_t)n + 3, sizeof **tix);
  for (int i = 0, j = 0; i < k->ntensors; i++) {
    const RtCkptTensor *t = &k->tensors[i];
    int ne = t->experts ? t->experts * k->ep : 1;
    for (int e = 0; e < ne; e++, j++) {
      char name[256];
      if (rt_ckpt_name(name, sizeof name, t, e) != 0) {
        fprintf(stderr, "error: %s/manifest.json: tensor %s gives a name longer than %zu bytes; expected shorter "
                "names\n", path, t->name, sizeof name - 1);
        return NULL;
      }
      ts[j].name = mem_strdup(m, name);
      ts[j].rows = t->rows, ts[j].cols = t->cols > 1 ? t->cols : 0;
      ts[j].nparts = 1;
      ts[j].parts[0] = (ExportPart){t->name, t->experts ? e : -1, t->rows, t->cols > 1 ? t->cols : 0};
      (*tix)[3 * j] = i;
    }
  }
  *count = n;
  return ts;
}

/* Writes the safetensors data of tensors ts (parts in tix) to f. 0, or 2 after an error. */
static int write_data(FILE *f, RtCkpt *k, const ExportTensor *ts, int n, const int *tix) {
  char err[600];
  double *buf[3] = {NULL, NULL, NULL};
  size_t cap[3] = {0, 0, 0};
  int status = 0;
  for (int i = 0; i < n && !status; i++) {
    const ExportTensor *t = &ts[i];
    for (int p = 0; p < t->nparts && !status; p++) {
      const RtCkptTensor *ct = &k->tensors[tix[3 * i + p]];
      if ((size_t)ct->count > cap[p]) free(buf[p]), cap[p] = (size_t)ct->count, buf[p] = malloc(sizeof(double) * cap[p]);
      if (!buf[p] || rt_ckpt_read(k, ct->name, t->parts[p].expert, 0, ct->count, 0, buf[p], err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n", buf[p] ? err : "out of memory");
        status = 2;
      }
      if (!status && !t->transposed && !t->rope_dim)
        for (int64_t j = 0; j < ct->count; j++) put(f, buf[p][j], k->real_bytes);
      if (!status && t->rope_dim) /* DeepSeek's interleaved RoPE rows (ExportTensor.rope_*) */
        for (int64_t r = 0, cols = t->cols ? t->cols : 1; r < t->rows; r++) {
          int64_t in = r % t->rope_block - t->rope_off, src = r;
          if (in >= 0 && in < t->rope_dim) src = r - in + (in % 2 ? t->rope_dim / 2 : 0) + in / 2;
          for (int64_t c = 0; c < cols; c++) put(f, buf[p][src * cols + c], k->real_bytes);
        }
    }
    if (!status && t->transposed) /* [in, out]: row r holds column r of each part, parts side by side */
      for (int64_t r = 0; r < t->rows; r++)
        for (int p = 0; p < t->nparts; p++)
          for (int64_t c = 0; c < t->parts[p].rows; c++) put(f, buf[p][c * t->rows + r], k->real_bytes);
  }
  for (int p = 0; p < 3; p++) free(buf[p]);
  return status;
}

/* Writes text to path through path.tmp (its name in *tmp, allocated, for the caller's commit): 0,
 * or 2 after an error (nothing left behind). */
static int write_tmp(const char *path, char **tmp, const char *text, size_t len) {
  char err[600];
  int fd = rt_replace_begin(path, tmp, err, sizeof err);
  FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
  if (fd >= 0 && !f) snprintf(err, sizeof err, "%.500s: %s", *tmp, strerror(errno)), close(fd), remove(*tmp);
  if (!f) return fprintf(stderr, "error: %s\n", err), 2;
  if (fwrite(text, 1, len, f) != len || fclose(f) != 0) {
    fprintf(stderr, "error: writing %s: %s\n", *tmp, strerror(errno));
    remove(*tmp);
    return 2;
  }
  return 0;
}

static int export_from(const char *path, const char *out, const char *spec, const char *const *sets, int nsets);

/* The value of key (klen bytes) in keys ("key value, key value, ...", spec_model_keys' form):
 * its length in *len, or NULL when keys lacks it. */
static const char *key_value(const char *keys, const char *key, size_t klen, size_t *len) {
  for (const char *p = keys; p && *p;) {
    const char *end = strstr(p, ", ");
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n > klen && strncmp(p, key, klen) == 0 && p[klen] == ' ') return *len = n - klen - 1, p + klen + 1;
    p = end ? end + 2 : NULL;
  }
  return NULL;
}

/* Keys (spec_model_keys' form) a against b. With a_is_ckpt (a the checkpoint's, b the spec's),
 * appends to *out ("; "-separated) each key whose values differ, as "KEY: V1 in the checkpoint,
 * V2 in the spec", and to *sets its " --set KEY=V1". Either way, keys of a that b lacks go to
 * *only (", "-separated: a key of another mtc's schema, not compared). */
static void keys_diff(Mem *m, char **out, char **sets, char **only, const char *a, const char *b, bool a_is_ckpt) {
  for (const char *p = a; p && *p;) {
    const char *end = strstr(p, ", "), *sp = strchr(p, ' ');
    size_t len = end ? (size_t)(end - p) : strlen(p), klen = sp && sp < p + len ? (size_t)(sp - p) : len, vlen = 0;
    const char *va = p + klen + (klen < len), *vb = key_value(b, p, klen, &vlen);
    int alen = (int)(len - (size_t)(va - p));
    if (!vb)
      *only = mem_printf(m, "%s%s%.*s", *only, **only ? ", " : "", (int)klen, p);
    else if (a_is_ckpt && ((size_t)alen != vlen || strncmp(va, vb, vlen) != 0)) {
      *out = mem_printf(m, "%s%s%.*s: %.*s in the checkpoint, %.*s in the spec", *out, **out ? "; " : "", (int)klen, p,
                        alen, va, (int)vlen, vb);
      *sets = mem_printf(m, "%s --set %.*s=%.*s", *sets, (int)klen, p, alen, va);
    }
    p = end ? end + 2 : NULL;
  }
}

/* Whether the model that spec (with its --set overrides) describes, keys (spec_model_keys), is
 * the one the checkpoint at path was trained as (k->model_keys): every key both record is equal.
 * Otherwise prints an error naming each key that differs and returns 2; a checkpoint that does
 * not record them (an older mtc's) gets a note and 0. config.json is written from the spec, so
 * a key that differs (rope_theta, norm_eps, norm_topk_prob, ...) would describe a model other
 * than the weights. */
static int match_keys(Mem *m, const RtCkpt *k, const char *path, const char *spec, const char *keys) {
  if (!k->model_keys) {
    fprintf(stderr, "note: %s/manifest.json does not record the model's keys (a checkpoint of an mtc before them): "
            "config.json follows %s, whose tensor shapes alone are checked against the checkpoint; export with the spec "
            "and --set overrides the program was compiled from\n", path, spec);
    return 0;
  }
  char *diff = "", *sets = "", *only_ckpt = "", *only_spec = "";
  keys_diff(m, &diff, &sets, &only_ckpt, k->model_keys, keys, true);
  keys_diff(m, &diff, &sets, &only_spec, keys, k->model_keys, false);
  if (diff[0]) {
    fprintf(stderr, "error: %s/manifest.json: the model was trained with other keys than %s gives: %s; config.json "
            "would describe another model than the weights; expected the spec and --set overrides the program was "
            "compiled from, or add%s\n", path, spec, diff, sets);
    return 2;
  }
  if (only_ckpt[0] || only_spec[0])
    fprintf(stderr, "note: keys recorded on one side only were not compared (another mtc's schema): %s%s%s%s%s\n",
            only_ckpt[0] ? "in the checkpoint: " : "", only_ckpt, only_ckpt[0] && only_spec[0] ? "; " : "",
            only_spec[0] ? "in the spec: " : "", only_spec);
  return 0;
}

/* What makes dir a checkpoint directory: "a manifest.json" (a step directory), "step-N
 * checkpoints" or "a training run's lock" (a --checkpoint-dir); NULL when it is none. */
static const char *checkpoint_dir(const char *dir) {
  char *man = rt_pathf("%s/manifest.json", dir);
  struct stat st;
  int has = lstat(man, &st) == 0;
  free(man);
  if (has) return "a manifest.json";
  if (rt_ckpt_is_step_dir(dir)) return "a step-N name";
  DIR *d = opendir(dir);
  const char *what = NULL;
  for (struct dirent *de; d && !what && (de = readdir(d));)
    if (rt_ckpt_step_of(de->d_name) >= 0) what = "step-N checkpoints";
    else if (strcmp(de->d_name, "lock") == 0) what = "a training run's lock";
  if (d) closedir(d);
  return what;
}

int export_run(const char *ckpt, const char *out, const char *spec, const char *const *sets, int nsets) {
  struct stat st;
  char *man = rt_pathf("%s/manifest.json", ckpt), *path = NULL;
  int64_t latest;
  if (stat(man, &st) == 0) path = rt_pathf("%s", ckpt);
  else if ((latest = rt_ckpt_latest(ckpt))) path = rt_pathf("%s/step-%08lld", ckpt, (long long)latest);
  free(man);
  if (!path) {
    fprintf(stderr, "error: %s: no complete checkpoint here; expected a directory with manifest.json, or one "
                    "holding step-N checkpoints (train --checkpoint-dir)\n", ckpt);
    return 2;
  }
  int status = export_from(path, out, spec, sets, nsets);
  free(path);
  return status;
}

/* export_run's work, with path the checkpoint's step directory. */
static int export_from(const char *path, const char *out, const char *spec, const char *const *sets, int nsets) {
  char err[600];
  struct stat st;
  RtCkpt k;
  if (rt_ckpt_open(&k, path, err, sizeof err) != 0) {
    fprintf(stderr, "error: %s\n", err);
    return 2;
  }
  /* the manifest is validated (rt_ckpt_open): each tensor inside a shard file, experts x ep <= 2^20 */
  Mem mem = {0};
  Diag d = {.mem = &mem};
  const char *dtype = k.real_bytes == 4 ? "F32" : "F64", *family = NULL;
  ExportTensor *ts = NULL;
  int n = 0, *tix = NULL, status = 0;
  char *config = NULL;
  if (spec) {
    Spec *s = spec_load(&mem, &d, spec, NULL, 0, sets, nsets);
    Model *md = s ? model_build(&mem, &d, s) : NULL;
    family = md ? export_family(&d, s) : NULL;
    if (!family) {
      fputs(d.msg ? d.msg : "error: the spec's model could not be built\n", stderr);
      status = 2;
    } else {
      ts = export_tensors(&mem, md, family, &n);
      tix = mem_array(&mem, 3 * (size_t)n + 3, sizeof *tix);
      status = match_spec(&k, path, spec, ts, n, tix); /* shapes first: another model is named by a tensor */
      if (!status) status = match_keys(&mem, &k, path, spec, spec_model_keys(&mem, s));
      json_t *cj = export_config(s, family, k.real_bytes == 4 ? "float32" : "float64");
      char *text = json_dumps(cj, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
      config = mem_printf(&mem, "%s\n", text);
      free(text), json_decref(cj);
    }
  } else if (!(ts = raw_tensors(&mem, &k, path, &n, &tix))) {
    status = 2;
  }
  /* where: OUT itself, or OUT/model.safetensors and OUT/config.json (OUT made if missing) */
  const char *st_path = out, *cfg_path = NULL;
  bool made = false; /* OUT made here: removed again when nothing is written into it */
  if (!status && spec) {
    if (lstat(out, &st) != 0 && !(made = mkdir(out, 0777) == 0) && errno != EEXIST) {
      fprintf(stderr, "error: %s: cannot make the directory: %s; expected a directory path to write model.safetensors "
              "and config.json into\n", out, strerror(errno));
      status = 2;
    } else if (lstat(out, &st) != 0 || !S_ISDIR(st.st_mode)) {
      fprintf(stderr, "error: %s: not a directory (%s); with --spec, expected OUT to be a directory (new, or a real "
              "one: never a link) for model.safetensors and config.json\n", out,
              S_ISLNK(st.st_mode) ? "a symbolic link" : "a file or another kind");
      status = 2;
    }
    st_path = mem_printf(&mem, "%s/model.safetensors", out);
    cfg_path = mem_printf(&mem, "%s/config.json", out);
  }
  json_t *head = json_object(), *meta = json_object();
  char step[32];
  snprintf(step, sizeof step, "%lld", (long long)k.step);
  json_object_set_new(meta, "format", json_string("pt"));
  json_object_set_new(meta, "model", json_string(k.model));
  json_object_set_new(meta, "step", json_string(step));
  if (family) json_object_set_new(meta, "model_type", json_string(family));
  json_object_set_new(head, "__metadata__", meta);
  int64_t at = 0;
  for (int i = 0; i < n && !status; i++) {
    const ExportTensor *t = &ts[i];
    if (json_object_get(head, t->name)) {
      fprintf(stderr, "error: %s/manifest.json: the name %s comes twice; expected each exported name once\n", path,
              t->name);
      status = 2;
    }
    json_t *shape = t->cols ? json_pack("[I, I]", (json_int_t)t->rows, (json_int_t)t->cols)
                            : json_pack("[I]", (json_int_t)t->rows);
    int64_t bytes = t->rows * (t->cols ? t->cols : 1) * k.real_bytes;
    json_object_set_new(head, t->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype, "shape", shape,
                                                 "data_offsets", (json_int_t)at, (json_int_t)(at + bytes)));
    at += bytes;
  }
  char *text = json_dumps(head, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(head);
  size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
  /* written to PATH.tmp and renamed when complete: a failure leaves any existing file alone */
  char *tmp = NULL, *ctmp = NULL, *outdir = mem_printf(&mem, "%s", st_path);
  char *slash = strrchr(outdir, '/');
  if (slash) *slash = 0;
  else outdir = ".";
  /* never into a checkpoint directory: the one read, or any other, a step directory (a manifest.json)
   * or the --checkpoint-dir holding them (step-N directories, the trainer's lock) */
  char *real_out = realpath(outdir, NULL), *real_ck = realpath(path, NULL);
  const char *holds = !status ? checkpoint_dir(outdir) : NULL;
  if (!holds && !status && real_out && real_ck && strcmp(real_out, real_ck) == 0) holds = "the checkpoint read";
  free(real_out), free(real_ck);
  if (holds) {
    fprintf(stderr, "error: %s is inside a checkpoint directory (%s holds %s); expected an output path outside "
            "every checkpoint directory, such as %s\n", st_path, outdir, holds, spec ? "hf-model/" : "model.safetensors");
    status = 2;
  }
  if (!status && cfg_path) status = write_tmp(cfg_path, &ctmp, config, strlen(config));
  FILE *f = NULL;
  if (!status) { /* PATH may be replaced only if it is a regular file or missing */
    int fd = rt_replace_begin(st_path, &tmp, err, sizeof err);
    if (fd >= 0 && !(f = fdopen(fd, "wb"))) snprintf(err, sizeof err, "%.500s: %s", tmp, strerror(errno)), close(fd), remove(tmp);
    struct stat ost;
    if (!f && !spec && stat(out, &ost) == 0 && S_ISDIR(ost.st_mode)) /* it names the path refused */
      fprintf(stderr, "error: %s; or, with --spec SPEC, a directory for a Hugging Face model (config.json and "
              "model.safetensors)\n", err);
    else if (!f)
      fprintf(stderr, "error: %s\n", err);
    if (!f) {
      status = 2;
      if (cfg_path) remove(ctmp);
    }
  }
  if (f) {
    uint64_t len = padded; /* little-endian on every host mtc supports */
    fwrite(&len, 8, 1, f);
    fwrite(text, 1, hl, f);
    for (size_t i = hl; i < padded; i++) fputc(' ', f);
    status = write_data(f, &k, ts, n, tix);
    if (fclose(f) != 0 && !status) {
      fprintf(stderr, "error: writing %s: %s\n", st_path, strerror(errno));
      status = 2;
    }
    if (status) {
      remove(tmp);
      if (cfg_path) remove(ctmp);
    } else if (rt_replace_commit(tmp, st_path, err, sizeof err) != 0 ||
               (cfg_path && rt_replace_commit(ctmp, cfg_path, err, sizeof err) != 0)) {
      fprintf(stderr, "error: %s\n", err);
      if (cfg_path) remove(ctmp);
      status = 2;
    }
  }
  if (status && made) rmdir(out);
  if (!status && family)
    printf("wrote %s and %s: %d tensors of %s step %lld (%s), model_type %s\n", st_path, cfg_path, n, k.model,
           (long long)k.step, dtype, family);
  else if (!status)
    printf("wrote %s: %d tensors of %s step %lld (%s)\n", out, n, k.model, (long long)k.step, dtype);
  free(text), free(tmp), free(ctmp);
  mem_free(&mem);
  rt_ckpt_close(&k);
  return status;
}
