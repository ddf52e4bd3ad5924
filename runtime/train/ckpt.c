/* ckpt.c — saving and loading the training state over MPI (see mtrt_ckpt.h for the format). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtrt_ckpt.h"
#include "mtrt_train.h"

/* Every rank learns whether any rank failed, and gets the message of the lowest failing rank
 * (err holds errlen bytes on every rank). */
static int agree(int failed, char *err, size_t errlen) {
  int me, first;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  int mine = failed ? me : INT_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == INT_MAX) return 0;
  MPI_Bcast(err, (int)errlen, MPI_CHAR, first, MPI_COMM_WORLD);
  return -1;
}

/* rt_write_all, the bytes also hashed into *h (FNV-1a 64: the shard's checksum). */
static int write_all(int fd, const void *p, size_t n, uint64_t *h) {
  *h = rt_fnv1a(*h, p, n);
  return rt_write_all(fd, p, n);
}

/* fsync a directory so that the renames in it are durable. */
static void sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY);
  if (fd >= 0) fsync(fd), close(fd);
}

/* Writes group gi's second moment at the positions of its shard (lo: the shard's first element in
 * the group): the arena holds only its AdamW pieces' values, compacted (RtGroup.adam_v); Muon's
 * matrices and padding are written as 0, so the file has one value per element of the shard. */
static int write_second(int fd, const real *arena, const RtGroup *G, int gi, const RtTensor *t, int nt, int64_t lo,
                        uint64_t *h) {
  size_t n = (size_t)G->shard;
  float *buf = calloc(n ? n : 1, sizeof *buf);
  if (!buf) return errno = ENOMEM, 1;
  if (G->adam_v >= 0) {
    const float *v = (const float *)(arena + G->adam_v);
    int64_t vat = 0;
    RT_FOR_PIECES(t, nt, gi, lo, lo + G->shard, {
      (void)first;
      if (T->muon) continue;
      memcpy(buf + at, v + vat, (size_t)len * sizeof *buf);
      vat += len;
    })
  }
  int bad = write_all(fd, buf, n * sizeof *buf, h);
  free(buf);
  return bad;
}

static int write_shard(const char *stepdir, const RtComm *c, const real *arena, const RtGroup *g, int ng,
                       const RtTensor *t, int nt, int64_t step, int64_t *bytes, uint64_t *sum, char *err,
                       size_t errlen) {
  char *path = rt_pathf("%s/rank-%05d.bin", stepdir, c->fsdp_rank), *tmp;
  int fd = rt_replace_begin(path, &tmp, err, errlen); /* path: a regular file or nothing */
  if (fd < 0) return free(path), -1;
  unsigned char head[RT_CKPT_HEADER] = {0};
  memcpy(head, "MTCCKPT1", 8);
  int64_t fields[8] = {1, step, c->fsdp_rank, c->fsdp, c->ep, c->dp_replicate, (int64_t)sizeof(real), ng};
  memcpy(head + 8, fields, sizeof fields); /* little-endian hosts (x86-64, aarch64) */
  uint64_t h = RT_FNV_SEED;
  int bad = write_all(fd, head, sizeof head, &h);
  for (int i = 0; !bad && i < ng; i++) {
    size_t n = (size_t)g[i].shard;
    bad = write_all(fd, arena + g[i].master, n * sizeof(real), &h) ||
          write_all(fd, arena + g[i].adam_m, n * sizeof(float), &h) ||
          write_second(fd, arena, &g[i], i, t, nt, (g[i].comm == RT_GROUP_FSDP ? c->fsdp_rank : c->shard_rank) * g[i].shard,
                       &h);
  }
  *bytes = RT_CKPT_HEADER;
  for (int i = 0; i < ng; i++) *bytes += g[i].shard * (int64_t)(sizeof(real) + 8);
  *sum = h;
  if (!bad) bad = fsync(fd) != 0;
  int e = errno;
  if (close(fd) != 0 && !bad) bad = 1, e = errno;
  if (bad) {
    unlink(tmp);
    snprintf(err, errlen, "%s: %s; expected room for the checkpoint", path, strerror(e));
  } else bad = rt_replace_commit(tmp, path, err, errlen) != 0;
  free(path), free(tmp);
  return bad ? -1 : 0;
}

static int write_manifest(const char *stepdir, int64_t step, uint64_t seed, const RtComm *c, const RtGroup *g, int ng,
                          const RtTensor *t, int nt, int El, const char *model, const char *model_keys,
                          const char *optimizer, const char *run, const int64_t *bytes, const uint64_t *sums, char *err, size_t errlen) {
  char s[32];
  snprintf(s, sizeof s, "%016llx", (unsigned long long)seed);
  json_t *root = json_pack("{s:s, s:s, s:s, s:I, s:s, s:{s:i, s:i, s:i, s:i, s:i}, s:i}", "format",
                           "mtc-checkpoint-1", "model", model, "optimizer", optimizer, "step", (json_int_t)step, "seed", s, "layout", "world", c->world, "fsdp",
                           c->fsdp, "ep", c->ep, "dp_replicate", c->dp_replicate, "experts_per_rank", El,
                           "real_bytes", (int)sizeof(real));
  json_t *groups = json_array(), *tensors = json_array(), *shards = json_array();
  for (int i = 0; i < ng; i++)
    json_array_append_new(groups, json_pack("{s:s, s:i, s:I, s:I}", "name", g[i].name, "comm", g[i].comm, "full",
                                            (json_int_t)g[i].full, "shard", (json_int_t)g[i].shard));
  for (int i = 0; i < nt; i++) {
    json_t *tj = json_pack("{s:s, s:i, s:i, s:I, s:I, s:I, s:I}", "name", t[i].name, "group", t[i].group, "experts",
                           t[i].experts, "offset", (json_int_t)t[i].offset, "count", (json_int_t)t[i].count, "rows",
                           (json_int_t)t[i].rows, "cols", (json_int_t)t[i].cols);
    if (t[i].per) { /* the shard layout: whole experts per shard */
      json_object_set_new(tj, "per", json_integer(t[i].per));
      json_object_set_new(tj, "block", json_integer((json_int_t)t[i].block));
    }
    json_array_append_new(tensors, tj);
  }
  for (int r = 0; r < c->fsdp; r++) {
    char f[32], h[32];
    snprintf(f, sizeof f, "rank-%05d.bin", r);
    snprintf(h, sizeof h, "%016llx", (unsigned long long)sums[r]);
    json_array_append_new(shards, json_pack("{s:s, s:I, s:s}", "file", f, "bytes", (json_int_t)bytes[r], "fnv1a64", h));
  }
  json_object_set_new(root, "groups", groups);
  json_object_set_new(root, "tensors", tensors);
  json_object_set_new(root, "shards", shards);
  json_object_set_new(root, "run", json_string(run));
  json_object_set_new(root, "model_keys", json_string(model_keys));
  char sum[32];
  snprintf(sum, sizeof sum, "%016llx", (unsigned long long)rt_ckpt_manifest_sum(root));
  json_object_set_new(root, "manifest_fnv1a64", json_string(sum)); /* every field above, edits refused */
  char *path = rt_pathf("%s/manifest.json", stepdir), *tmp = NULL;
  int fd = rt_replace_begin(path, &tmp, err, errlen); /* path: a regular file or nothing */
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (fd >= 0 && !f) close(fd);
  int bad = !f || json_dumpf(root, f, JSON_INDENT(1)) != 0 || fflush(f) != 0 || fsync(fileno(f)) != 0;
  int e = errno;
  if (f && fclose(f) != 0) bad = 1, e = errno;
  json_decref(root);
  if (fd >= 0 && bad) {
    unlink(tmp);
    snprintf(err, errlen, "%s: %s; expected room for the checkpoint", path, strerror(e));
  } else if (fd >= 0) bad = rt_replace_commit(tmp, path, err, errlen) != 0;
  free(path), free(tmp);
  if (fd < 0 || bad) return -1;
  sync_dir(stepdir);
  return 0;
}

/* After a failed save (collective): each rank removes the shard it wrote, then rank 0 the step
 * directory if nothing else is in it, so that no incomplete checkpoint stays. Returns -1. */
static int discard(const char *stepdir, const RtComm *c, bool wrote) {
  if (wrote) {
    char *path = rt_pathf("%s/rank-%05d.bin", stepdir, c->fsdp_rank);
    unlink(path);
    free(path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (c->rank == 0) rmdir(stepdir); /* fails, harmlessly, where other files are */
  return -1;
}

static int save(const char *dir, const char *stepdir, int64_t step, uint64_t seed, const RtComm *c, const real *arena,
                const RtGroup *g, int ng, const RtTensor *t, int nt, int El, const char *model, const char *model_keys,
                const char *optimizer, const char *run, bool kill_halfway, char *err, size_t errlen);

int rt_ckpt_save(const char *dir, int64_t step, uint64_t seed, const RtComm *c, const real *arena, const RtGroup *g,
                 int ng, const RtTensor *t, int nt, int El, const char *model, const char *model_keys,
                 const char *optimizer, const char *run, bool kill_halfway, char *err, size_t errlen) {
  char *stepdir = rt_pathf("%s/step-%08lld", dir, (long long)step);
  int st = save(dir, stepdir, step, seed, c, arena, g, ng, t, nt, El, model, model_keys, optimizer, run, kill_halfway,
                err, errlen);
  free(stepdir);
  return st;
}

long rt_ckpt_path_room(const char *dir) {
  long max = pathconf(dir, _PC_PATH_MAX);
  if (max <= 0) max = PATH_MAX;
  /* the longest name a save writes under dir: step-NNNNNNNN (up to 18 digits)/manifest.json.tmp */
  long longest = (long)strlen(dir) + (long)strlen("/step-000000000000000000/manifest.json.tmp");
  return max - 1 - longest;
}

/* rt_ckpt_save's work, with stepdir its step's directory. */
static int save(const char *dir, const char *stepdir, int64_t step, uint64_t seed, const RtComm *c, const real *arena,
                const RtGroup *g, int ng, const RtTensor *t, int nt, int El, const char *model, const char *model_keys,
                const char *optimizer, const char *run, bool kill_halfway, char *err, size_t errlen) {
  int bad = 0, complete = 0;
  if (c->rank == 0) {
    if ((mkdir(dir, 0777) != 0 && errno != EEXIST) || (mkdir(stepdir, 0777) != 0 && errno != EEXIST))
      bad = 1, snprintf(err, errlen, "%s: %s; expected a writable checkpoint directory", stepdir, strerror(errno));
    struct stat ds; /* a step-N that is a link, or not a directory, is not written through */
    if (!bad && lstat(stepdir, &ds) != 0)
      bad = 1, snprintf(err, errlen, "%s: %s; expected a writable checkpoint directory", stepdir, strerror(errno));
    else if (!bad && !S_ISDIR(ds.st_mode))
      bad = 1, snprintf(err, errlen, "%s: %s; expected a directory mtc creates (remove or rename it)", stepdir,
                        S_ISLNK(ds.st_mode) ? "a symbolic link" : "not a directory");
    sync_dir(dir);
    char *man = rt_pathf("%s/manifest.json", stepdir);
    struct stat st;
    complete = !bad && stat(man, &st) == 0 && S_ISREG(st.st_mode);
    free(man);
  }
  if (agree(bad, err, errlen)) return -1;
  /* a complete checkpoint of this step is there: the state it was resumed from, saved again after
   * steps that were all skipped; it stays as it is */
  MPI_Bcast(&complete, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (complete) return 0;
  int64_t bytes = 0;
  uint64_t sum = 0;
  if (c->replica == 0) bad = write_shard(stepdir, c, arena, g, ng, t, nt, step, &bytes, &sum, err, errlen) != 0;
  bool wrote = c->replica == 0 && !bad;
  if (agree(bad, err, errlen)) return discard(stepdir, c, wrote);
  if (kill_halfway && c->rank == 0) raise(SIGKILL); /* tests: the shards are there, the manifest is not */
  uint64_t mine[2] = {(uint64_t)bytes, sum}, *all = c->rank == 0 ? malloc(sizeof mine * (size_t)c->world) : NULL;
  MPI_Gather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (c->rank == 0) {
    int64_t *b = malloc(sizeof(int64_t) * (size_t)c->fsdp);
    uint64_t *s = malloc(sizeof(uint64_t) * (size_t)c->fsdp);
    for (int r = 0; r < c->fsdp; r++) b[r] = (int64_t)all[2 * r], s[r] = all[2 * r + 1]; /* replica 0 = ranks 0..fsdp-1 */
    bad = write_manifest(stepdir, step, seed, c, g, ng, t, nt, El, model, model_keys, optimizer, run, b, s, err,
                         errlen) != 0;
    free(b), free(s), free(all);
  }
  return agree(bad, err, errlen) ? discard(stepdir, c, wrote) : 0;
}

/* name for a message: a routed tensor's pattern with "*" where the expert's number goes. */
static void shown(char *dst, size_t n, const char *name) {
  const char *slot = strstr(name, "%d");
  if (slot) snprintf(dst, n, "%.*s*%s", (int)(slot - name), name, slot + 2);
  else snprintf(dst, n, "%s", name);
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const RtCkptTensor *const *)a)->name, (*(const RtCkptTensor *const *)b)->name);
}

/* What a checkpoint of another model is told to do. */
#define OTHER_MODEL "; expected a checkpoint of this program's model: resume with the spec it was trained with, " \
                    "or point --checkpoint-dir at another directory"

/* The checkpoint is of this program's model (by name) and holds exactly the tensors of this program (none missing, none more), each with
 * the same shape and number of experts, and moments of the same optimizer. k's tensors are looked
 * up by name in a sorted index: n log n for a model of thousands of layers. */
static int compatible(const RtCkpt *k, const RtTensor *t, int nt, int ep, const char *model, const char *optimizer,
                      char *err, size_t errlen) {
  if (strcmp(k->model, model) != 0)
    return snprintf(err, errlen, "the checkpoint is of model '%s' (its manifest.json), this program of model '%s'"
                    OTHER_MODEL, k->model, model), -1;
  if (strcmp(k->optimizer, optimizer) != 0)
    return snprintf(err, errlen, "trained with %s, but this program uses %s; expected a checkpoint of the same "
                    "optimizer (its state would be misread): to go on with this run, compile the program with "
                    "--set training.optimizer=%s; to train with %s, start a new run with another --checkpoint-dir "
                    "(train does not start from a checkpoint's weights with a fresh optimizer state)",
                    k->optimizer, optimizer, k->optimizer, optimizer), -1;
  const RtCkptTensor **idx = malloc(sizeof *idx * ((size_t)k->ntensors + 1));
  bool *used = calloc((size_t)k->ntensors + 1, sizeof *used);
  int st = !idx || !used ? snprintf(err, errlen, "out of memory"), -1 : 0;
  for (int j = 0; !st && j < k->ntensors; j++) idx[j] = &k->tensors[j];
  if (!st) qsort(idx, (size_t)k->ntensors, sizeof *idx, by_name);
  char name[256];
  for (int i = 0; !st && i < nt; i++) {
    RtCkptTensor key = {.name = (char *)t[i].name};
    const RtCkptTensor *pk = &key, **hit = bsearch(&pk, idx, (size_t)k->ntensors, sizeof *idx, by_name);
    const RtCkptTensor *c = hit ? *hit : NULL;
    int mine = t[i].experts * ep, theirs = c ? c->experts * k->ep : 0;
    shown(name, sizeof name, t[i].name);
    if (!c)
      st = -1, snprintf(err, errlen, "this program has tensor %s (%lldx%lld%s), which the checkpoint lacks" OTHER_MODEL,
                        name, (long long)t[i].rows, (long long)t[i].cols, mine ? ", one per expert" : "");
    else if (c->rows != t[i].rows || c->cols != t[i].cols)
      st = -1, snprintf(err, errlen, "tensor %s is %lldx%lld in the checkpoint and %lldx%lld in this program"
                        OTHER_MODEL, name, (long long)c->rows, (long long)c->cols, (long long)t[i].rows,
                        (long long)t[i].cols);
    else if (mine != theirs)
      st = -1, snprintf(err, errlen, "tensor %s has %d experts in the checkpoint and %d in this program" OTHER_MODEL,
                        name, theirs, mine);
    else used[hit - idx] = true;
  }
  for (int j = 0; !st && j < k->ntensors; j++)
    if (!used[j]) {
      shown(name, sizeof name, idx[j]->name);
      st = -1, snprintf(err, errlen, "the checkpoint has tensor %s (%lldx%lld), which this program lacks (resuming would "
                        "drop it)" OTHER_MODEL, name, (long long)idx[j]->rows, (long long)idx[j]->cols);
    }
  free(idx), free(used);
  return st;
}

int rt_ckpt_load(const char *path, int64_t *step, uint64_t *seed, const RtComm *c, real *arena, const RtGroup *g,
                 int ng, const RtTensor *t, int nt, const char *model, const char *model_keys, const char *optimizer,
                 const char *run, char run_id[RT_RUN_ID_LEN + 1], char *note, size_t notelen, char *err,
                 size_t errlen) {
  RtCkpt k;
  /* (the tensors name their groups; ng sizes the second moments' running offsets) */
  int bad = rt_ckpt_open(&k, path, err, errlen) != 0;
  if (!bad) bad = compatible(&k, t, nt, c->ep, model, optimizer, err, errlen) != 0;
  double *buf = NULL;
  size_t cap = 0;
  int64_t *vat = calloc((size_t)ng + 1, sizeof *vat); /* per group: its second moment's compacted values so far */
  if (!vat) bad = 1, snprintf(err, errlen, "out of memory loading %s", path);
  for (int ti = 0; !bad && ti < nt; ti++) {
    const RtTensor *T = &t[ti];
    const RtGroup *G = &g[T->group];
    int64_t lo = (G->comm == RT_GROUP_FSDP ? c->fsdp_rank : c->shard_rank) * G->shard, hi = lo + G->shard;
    int ne = T->experts ? T->experts : 1;
    for (int kx = 0; !bad && kx < ne; kx++) {
      int64_t a0 = rt_expert_at(T, kx), a = a0, b = a + T->count;
      if (a < lo) a = lo;
      if (b > hi) b = hi;
      if (a >= b) continue;
      int64_t first = a - a0, n = b - a, at = a - lo;
      int e = T->experts ? c->ep_rank * T->experts + kx : -1;
      if ((size_t)n > cap) {
        free(buf);
        cap = (size_t)n, buf = malloc(sizeof(double) * cap);
        if (!buf) {
          snprintf(err, errlen, "out of memory loading %s", path);
          bad = 1;
          break;
        }
      }
      /* (the second moment: AdamW tensors only, compacted in RT_FOR_PIECES's order, which is this
       * loop's: tensors in order, experts in order) */
      for (int which = 0; !bad && which < (G->adam_v < 0 || T->muon ? 2 : 3); which++) {
        bad = rt_ckpt_read(&k, T->name, e, first, n, which, buf, err, errlen) != 0;
        for (int64_t i = 0; !bad && i < n; i++) {
          if (which == 0) arena[G->master + at + i] = (real)buf[i];
          else if (which == 1) ((float *)(arena + G->adam_m))[at + i] = (float)buf[i];
          else ((float *)(arena + G->adam_v))[vat[T->group] + i] = (float)buf[i];
        }
      }
      if (G->adam_v >= 0 && !T->muon) vat[T->group] += n;
    }
  }
  free(buf), free(vat);
  if (!bad) *step = k.step, *seed = k.seed;
  if (!bad) rt_ckpt_run_diff(note, notelen, k.run, run), rt_ckpt_run_id(k.run, run_id);
  size_t at = strlen(note); /* the model's conventions (shapes are equal here): a change is said, not refused */
  if (!bad && k.model_keys && strcmp(k.model_keys, model_keys) != 0 && at + 16 < notelen) {
    snprintf(note + at, notelen - at, "%s", at ? "; " : "");
    at = strlen(note);
    rt_ckpt_run_diff(note + at, notelen - at, k.model_keys, model_keys);
  }
  rt_ckpt_close(&k);
  return agree(bad, err, errlen);
}

int rt_ckpt_lock(const char *dir, int *created, char *err, size_t errlen) {
  char *path = rt_pathf("%s/lock", dir);
  int fd = -1;
  *created = 0;
  if (errlen) err[0] = 0;
  for (int tries = 0; fd < 0 && tries < 100; tries++) {
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    int made = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) continue; /* removed between the two opens: again */
    if (fd < 0) {
      snprintf(err, errlen, "%s: %s; expected a writable checkpoint directory", path, strerror(errno));
      break;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int e = errno;
      close(fd), fd = -1;
      if (e == EWOULDBLOCK)
        snprintf(err, errlen, "--checkpoint-dir %s is in use by another training run (it holds %s locked): two "
                 "runs saving into one directory would overwrite each other's shards; expected one run per "
                 "checkpoint directory (wait for the other to end, or use another directory)", dir, path);
      else snprintf(err, errlen, "%s: cannot lock it: %s", path, strerror(e));
      break;
    }
    /* the file locked is still the one at path (a refused run removes the lock file it made:
     * one opened just before that is locked in vain, and tried again) */
    struct stat a, b;
    if (fstat(fd, &a) != 0 || stat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
      close(fd), fd = -1;
      continue;
    }
    *created = made;
  }
  if (fd < 0 && !err[0]) snprintf(err, errlen, "%s: it keeps being replaced; expected one lock file", path);
  free(path);
  return fd; /* stays open: the lock is held until the process ends (a kill releases it) */
}

void rt_ckpt_unlock_refused(const char *dir, int fd, int remove_lock, int remove_dir) {
  if (fd >= 0 && remove_lock) {
    char *path = rt_pathf("%s/lock", dir);
    unlink(path); /* while still locked: a run that opened it meanwhile is refused, or retries */
    free(path);
  }
  if (fd >= 0) close(fd);
  if (remove_dir) rmdir(dir); /* only when empty */
}
