/* ckpt_read.c — finding, verifying and reading checkpoints (see mtrt_ckpt.h). No MPI. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mtrt_ckpt.h"

uint64_t rt_fnv1a(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

int64_t rt_ckpt_latest(const char *dir, char *out, size_t outlen) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int64_t best = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    char *end;
    if (strncmp(de->d_name, "step-", 5) != 0) continue;
    long long s = strtoll(de->d_name + 5, &end, 10);
    if (*end || s <= best) continue;
    char man[2048];
    snprintf(man, sizeof man, "%s/%s/manifest.json", dir, de->d_name);
    if (access(man, R_OK) != 0) continue; /* incomplete: killed mid-save */
    best = s;
    snprintf(out, outlen, "%s/%s", dir, de->d_name);
  }
  closedir(d);
  return best;
}

static int fail(char *err, size_t n, const char *fmt, const char *a, const char *b) {
  snprintf(err, n, fmt, a, b);
  return -1;
}

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

int rt_ckpt_open(RtCkpt *k, const char *path, char *err, size_t errlen) {
  memset(k, 0, sizeof *k);
  snprintf(k->dir, sizeof k->dir, "%s", path);
  char man[1200];
  snprintf(man, sizeof man, "%s/manifest.json", path);
  json_error_t je;
  json_t *root = json_load_file(man, 0, &je);
  if (!root) return fail(err, errlen, "%s: %s; expected a checkpoint's manifest.json", man, je.text);
  const char *model = NULL, *format = NULL, *opt = NULL;
  json_t *groups = NULL, *tensors = NULL, *shards = NULL;
  json_int_t step = 0, world = 0, fsdp = 0, ep = 0, dpr = 0, epr = 0, rb = 0;
  const char *seed = NULL;
  if (json_unpack_ex(root, &je, 0, "{s:s, s:s, s:s, s:I, s:s, s:{s:I, s:I, s:I, s:I, s:I}, s:I, s:o, s:o, s:o}",
                     "format", &format, "model", &model, "optimizer", &opt, "step", &step, "seed", &seed, "layout",
                     "world", &world, "fsdp", &fsdp, "ep", &ep, "dp_replicate", &dpr, "experts_per_rank", &epr,
                     "real_bytes", &rb, "groups", &groups, "tensors", &tensors, "shards", &shards) != 0 ||
      strcmp(format, "mtc-checkpoint-1") != 0 || !json_is_array(groups) || !json_is_array(tensors) ||
      !json_is_array(shards) || (rb != 4 && rb != 8) || fsdp < 1 || ep < 1 || dpr < 1 || fsdp % ep != 0 ||
      world != fsdp * dpr || step < 0 || epr < 0) {
    json_decref(root);
    return fail(err, errlen, "%s: malformed manifest (%s); expected one written by an mtc training program", man, je.text);
  }
  snprintf(k->model, sizeof k->model, "%s", model);
  snprintf(k->optimizer, sizeof k->optimizer, "%s", opt);
  k->step = step, k->seed = strtoull(seed, NULL, 16), k->fsdp = (int)fsdp, k->ep = (int)ep, k->dp_replicate = (int)dpr;
  k->experts_per_rank = (int)epr, k->real_bytes = (int)rb;
  k->ngroups = (int)json_array_size(groups), k->ntensors = (int)json_array_size(tensors);
  k->nshards = (int)json_array_size(shards);
  k->groups = calloc((size_t)k->ngroups + 1, sizeof *k->groups);
  k->tensors = calloc((size_t)k->ntensors + 1, sizeof *k->tensors);
  k->shard_bytes = calloc((size_t)k->nshards + 1, sizeof(int64_t));
  k->shard_sum = calloc((size_t)k->nshards + 1, sizeof(uint64_t));
  k->fds = malloc(sizeof(int) * ((size_t)k->nshards + 1));
  k->verified = calloc((size_t)k->nshards + 1, sizeof(bool));
  int bad = !k->groups || !k->tensors || !k->shard_bytes || !k->shard_sum || !k->fds || !k->verified ||
            k->nshards != k->fsdp;
  for (int i = 0; !bad && i < k->ngroups; i++) {
    const char *n;
    json_int_t comm, full, shard;
    bad = json_unpack(json_array_get(groups, (size_t)i), "{s:s, s:I, s:I, s:I}", "name", &n, "comm", &comm, "full",
                      &full, "shard", &shard) != 0;
    if (!bad) k->groups[i] = (RtCkptGroup){dupstr(n), (int)comm, full, shard};
  }
  for (int i = 0; !bad && i < k->ntensors; i++) {
    const char *n;
    json_int_t g, ex, off, cnt, r, c;
    bad = json_unpack(json_array_get(tensors, (size_t)i), "{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "name", &n,
                      "group", &g, "experts", &ex, "offset", &off, "count", &cnt, "rows", &r, "cols", &c) != 0 ||
          g < 0 || g >= k->ngroups;
    if (!bad) k->tensors[i] = (RtCkptTensor){dupstr(n), (int)g, (int)ex, off, cnt, r, c};
  }
  for (int i = 0; !bad && i < k->nshards; i++) {
    const char *sum;
    json_int_t bytes;
    bad = json_unpack(json_array_get(shards, (size_t)i), "{s:I, s:s}", "bytes", &bytes, "fnv1a64", &sum) != 0;
    if (!bad) k->shard_bytes[i] = bytes, k->shard_sum[i] = strtoull(sum, NULL, 16);
    k->fds[i] = -1;
  }
  json_decref(root);
  if (bad) {
    rt_ckpt_close(k);
    return fail(err, errlen, "%s: malformed manifest%s; expected one written by an mtc training program", man, "");
  }
  return 0;
}

void rt_ckpt_close(RtCkpt *k) {
  for (int i = 0; k->groups && i < k->ngroups; i++) free(k->groups[i].name);
  for (int i = 0; k->tensors && i < k->ntensors; i++) free(k->tensors[i].name);
  for (int i = 0; k->fds && i < k->nshards; i++)
    if (k->fds[i] >= 0) close(k->fds[i]);
  free(k->groups), free(k->tensors), free(k->shard_bytes), free(k->shard_sum), free(k->fds), free(k->verified);
  memset(k, 0, sizeof *k);
}

/* Opens shard r and checks its size and checksum against the manifest (once). */
static int shard(RtCkpt *k, int r, char *err, size_t errlen) {
  if (k->verified[r]) return k->fds[r];
  char path[1200];
  snprintf(path, sizeof path, "%s/rank-%05d.bin", k->dir, r);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return fail(err, errlen, "%s: %s; expected the checkpoint's shard", path, strerror(errno));
  uint64_t h = RT_FNV_SEED;
  int64_t total = 0;
  char buf[1 << 16];
  ssize_t got;
  while ((got = read(fd, buf, sizeof buf)) > 0) h = rt_fnv1a(h, buf, (size_t)got), total += got;
  if (got < 0 || total != k->shard_bytes[r] || h != k->shard_sum[r]) {
    close(fd);
    return fail(err, errlen, "%s: %s; expected the bytes the manifest's checksum names (a corrupt or truncated "
                "shard: resume from an older checkpoint by removing this step's directory)",
                path, total != k->shard_bytes[r] ? "wrong size" : "checksum mismatch");
  }
  k->fds[r] = fd, k->verified[r] = true;
  return fd;
}

int rt_ckpt_read(RtCkpt *k, const char *name, int e, int64_t first, int64_t n, int which, double *dst, char *err,
                 size_t errlen) {
  const RtCkptTensor *t = NULL;
  for (int i = 0; i < k->ntensors && !t; i++)
    if (strcmp(k->tensors[i].name, name) == 0) t = &k->tensors[i];
  if (!t || (t->experts && (e < 0 || e >= t->experts * k->ep)) || first < 0 || first + n > t->count)
    return fail(err, errlen, "%s: no tensor %s in this checkpoint; expected a checkpoint of the same model", k->dir, name);
  const RtCkptGroup *G = &k->groups[t->group];
  int j = t->experts ? e / t->experts : 0; /* EP rank that held expert e */
  int64_t off = t->offset + (t->experts ? (int64_t)(e % t->experts) * t->count : 0) + first;
  int64_t section = 0; /* the group's byte offset in every shard file */
  for (int g = 0; g < t->group; g++) section += k->groups[g].shard * (k->real_bytes + 8);
  while (n > 0) {
    int64_t s = off / G->shard, within = off - s * G->shard, take = G->shard - within < n ? G->shard - within : n;
    int r = G->comm ? (int)(j + k->ep * s) : (int)s;
    int fd = shard(k, r, err, errlen);
    if (fd < 0) return -1;
    int bytes = which ? 4 : k->real_bytes;
    int64_t at = RT_CKPT_HEADER + section + (which == 0 ? 0 : G->shard * k->real_bytes + (which - 1) * G->shard * 4) +
                 within * bytes;
    unsigned char *v = malloc((size_t)(take * bytes));
    if (!v || pread(fd, v, (size_t)(take * bytes), (off_t)at) != (ssize_t)(take * bytes)) {
      free(v);
      return fail(err, errlen, "%s: short read of a shard; expected a complete checkpoint%s", k->dir, "");
    }
    for (int64_t i = 0; i < take; i++) {
      if (bytes == 4) {
        float f;
        memcpy(&f, v + i * 4, 4);
        dst[i] = f;
      } else {
        memcpy(&dst[i], v + i * 8, 8);
      }
    }
    free(v);
    dst += take, off += take, n -= take, first += take;
  }
  return 0;
}
