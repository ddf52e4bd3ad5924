/* ckpt_read.c — finding, verifying and reading checkpoints (see mtrt_ckpt.h), and the atomic
 * file replace that checkpoints and mtc export share. No MPI. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtrt_ckpt.h"

uint64_t rt_fnv1a(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

long long rt_ckpt_step_of(const char *name) {
  if (strncmp(name, "step-", 5) != 0) return -1;
  const char *p = name + 5;
  size_t n = strspn(p, "0123456789");
  if (n < 8 || n > 18 || p[n] || (n > 8 && p[0] == '0')) return -1;
  return strtoll(p, NULL, 10);
}

/* The step in the name of directory dir (its last component, step-NNNNNNNN), or -1. */
static long long named_step(const char *dir) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  size_t b = n;
  while (b > 0 && dir[b - 1] != '/') b--;
  char *name = rt_pathf("%.*s", (int)(n - b), dir + b);
  long long s = rt_ckpt_step_of(name);
  free(name);
  return s;
}

int rt_write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w == 0) errno = ENOSPC;
    if (w <= 0) return -1;
    b += w, n -= (size_t)w;
  }
  return 0;
}

char *rt_pathf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (!p) fprintf(stderr, "error: out of memory building a path\n"), exit(1);
  va_start(ap, fmt);
  vsnprintf(p, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return p;
}

int rt_ckpt_is_step_dir(const char *dir) {
  char *man = rt_pathf("%s/manifest.json", dir);
  struct stat st;
  int is = named_step(dir) >= 0 || lstat(man, &st) == 0;
  free(man);
  return is;
}

char *rt_ckpt_step_dir_parent(const char *dir) {
  if (!rt_ckpt_is_step_dir(dir)) return NULL;
  char *p = rt_pathf("%s", dir);
  size_t n = strlen(p);
  while (n > 1 && p[n - 1] == '/') p[--n] = 0;
  char *slash = strrchr(p, '/');
  if (!slash) return free(p), rt_pathf(".");
  slash[slash == p] = 0;
  return p;
}

int64_t rt_ckpt_latest(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int64_t best = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    long long s = rt_ckpt_step_of(de->d_name); /* only the names the trainer writes */
    if (s < 0 || s <= best) continue;
    char *man = rt_pathf("%s/%s/manifest.json", dir, de->d_name);
    struct stat st; /* incomplete (killed mid-save), or not a file: never opened (a FIFO would block) */
    if (stat(man, &st) == 0 && S_ISREG(st.st_mode) && access(man, R_OK) == 0) best = s;
    free(man);
  }
  closedir(d);
  return best;
}

static const char *file_kind(mode_t mode);

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

enum { MAX_RANKS = 1 << 24, MAX_EXPERTS = 1 << 20, MAX_NAME = 200 };
#define MAX_ELEMS ((int64_t)1 << 50) /* any one count, shard or offset: far above any model */

/* A manifest field that fails its check: "MANIFEST: FIELD: WHY; expected ..." in err. */
static int bad(char *err, size_t n, const char *man, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int bad(char *err, size_t n, const char *man, const char *field, const char *fmt, ...) {
  int k = snprintf(err, n, "%s: %s ", man, field);
  va_list ap;
  va_start(ap, fmt);
  if (k >= 0 && (size_t)k < n) vsnprintf(err + k, n - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

uint64_t rt_ckpt_manifest_sum(const void *root) {
  json_t *copy = json_deep_copy(root);
  json_object_del(copy, "manifest_fnv1a64");
  char *text = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS);
  if (!text) fprintf(stderr, "error: out of memory checksumming a manifest\n"), exit(1);
  uint64_t h = rt_fnv1a(RT_FNV_SEED, text, strlen(text));
  free(text);
  json_decref(copy);
  return h;
}

/* Whether s is exactly 16 hex digits (a seed or checksum as the writer prints it). */
static bool hex16(const char *s) {
  size_t n = strspn(s, "0123456789abcdefABCDEF");
  return n == 16 && s[16] == '\0';
}

/* Whether a routed tensor's name pattern has exactly one '%', in "%d" (see rt_ckpt_name). */
static bool one_expert_slot(const char *name) {
  const char *p = strchr(name, '%');
  return p && p[1] == 'd' && !strchr(p + 1, '%');
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const RtCkptTensor *const *)a)->name, (*(const RtCkptTensor *const *)b)->name);
}

/* A tensor's elements in its group: [lo, hi) of the group (flat), or of each shard's block
 * (whole-expert shards: per experts of it in every block). */
typedef struct {
  int group, i;
  int64_t lo, hi;
} Span;

static int by_place(const void *a, const void *b) {
  const Span *x = a, *y = b;
  if (x->group != y->group) return x->group < y->group ? -1 : 1;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* No two tensors share an element, and a group's tensors share one layout (all flat or all in
 * whole-expert blocks). Each tensor is already inside its group (validate). */
static int disjoint(const RtCkpt *k, const char *man, char *err, size_t n) {
  if (k->ntensors < 1) return 0;
  Span *s = malloc(sizeof *s * (size_t)k->ntensors);
  if (!s) return bad(err, n, man, "tensors", "%s", "out of memory");
  for (int i = 0; i < k->ntensors; i++) {
    const RtCkptTensor *t = &k->tensors[i];
    int64_t ne = t->per ? t->per : t->experts ? t->experts : 1;
    s[i] = (Span){t->group, i, t->offset, t->offset + ne * t->count};
  }
  qsort(s, (size_t)k->ntensors, sizeof *s, by_place);
  int status = 0;
  for (int j = 1; j < k->ntensors && !status; j++) {
    const Span *a = &s[j - 1], *b = &s[j];
    if (a->group != b->group) continue;
    const RtCkptTensor *ta = &k->tensors[a->i], *tb = &k->tensors[b->i];
    char f[64];
    snprintf(f, sizeof f, "tensors[%d]", b->i);
    if ((ta->per > 0) != (tb->per > 0))
      status = bad(err, n, man, f, "(%s) is %s, but tensors[%d] (%s) of the same group %d is %s; expected one layout "
                   "per group", tb->name, tb->per ? "in whole-expert blocks (per)" : "flat", a->i, ta->name, a->group,
                   ta->per ? "in whole-expert blocks (per)" : "flat");
    else if (a->hi > b->lo)
      status = bad(err, n, man, f, "(%s) has elements [%lld, %lld) of group %d, which overlap tensors[%d] (%s) at "
                   "[%lld, %lld); expected each tensor its own elements (a corrupt or hand-edited manifest)", tb->name,
                   (long long)b->lo, (long long)b->hi, b->group, a->i, ta->name, (long long)a->lo, (long long)a->hi);
  }
  free(s);
  return status;
}

/* Checks every field of the parsed manifest k against the others and against the shard file
 * layout the writer uses (ckpt.c): the layout's ranks, each group's full = shard x its ranks,
 * each tensor inside its group with rows x cols = count, unique names, every shard's size the
 * header plus the groups' sections. Sizes are bounded first, so no product overflows. */
static int validate(const RtCkpt *k, const char *man, char *err, size_t n) {
  const int64_t per = k->real_bytes + 8; /* bytes per element in a shard: master, m, v */
  int64_t bytes = RT_CKPT_HEADER;
  for (int i = 0; i < k->ngroups; i++) {
    const RtCkptGroup *g = &k->groups[i];
    char f[64];
    snprintf(f, sizeof f, "groups[%d]", i);
    if (g->comm != 0 && g->comm != 1) return bad(err, n, man, f, "comm is %d; expected 0 (FSDP) or 1 (expert shard)", g->comm);
    int64_t ranks = g->comm ? k->fsdp / k->ep : k->fsdp;
    if (g->shard < 1 || g->shard > MAX_ELEMS)
      return bad(err, n, man, f, "shard is %lld; expected elements per rank from 1 to 2^50", (long long)g->shard);
    int64_t full;
    if (__builtin_mul_overflow(g->shard, ranks, &full) || g->full != full)
      return bad(err, n, man, f, "full is %lld; expected shard %lld x %lld ranks", (long long)g->full,
                 (long long)g->shard, (long long)ranks);
    if (g->shard > (MAX_ELEMS * 16 - bytes) / per) return bad(err, n, man, f, "makes the shard files too large");
    bytes += g->shard * per;
  }
  if (k->ngroups < 1 || k->ntensors < 1)
    return bad(err, n, man, k->ngroups < 1 ? "groups" : "tensors", "%s", "is empty; expected the model's parameters "
               "(a corrupt or hand-edited manifest)");
  RtCkptTensor **sorted = malloc(sizeof *sorted * ((size_t)k->ntensors + 1));
  if (!sorted) return bad(err, n, man, "tensors", "%s", "out of memory");
  int status = 0;
  for (int i = 0; i < k->ntensors && !status; i++) {
    const RtCkptTensor *t = &k->tensors[i];
    const RtCkptGroup *g = &k->groups[t->group];
    char f[64];
    snprintf(f, sizeof f, "tensors[%d]", i);
    sorted[i] = &k->tensors[i];
    int64_t ne = t->experts ? t->experts : 1;
    if (!t->name[0] || strlen(t->name) > MAX_NAME)
      status = bad(err, n, man, f, "name has %zu bytes; expected 1 to %d", strlen(t->name), MAX_NAME);
    else if (t->experts < 0 || t->experts > MAX_EXPERTS || (t->experts && t->experts != k->experts_per_rank))
      status = bad(err, n, man, f, "experts is %d; expected 0 (not routed) or experts_per_rank %d", t->experts,
                   k->experts_per_rank);
    else if ((t->experts > 0) != (g->comm == 1))
      status = bad(err, n, man, f, "experts is %d in group %d (comm %d); expected routed tensors in expert-shard "
                   "groups (comm 1) and only there", t->experts, t->group, g->comm);
    else if (t->experts ? !one_expert_slot(t->name) : strchr(t->name, '%') != NULL)
      status = bad(err, n, man, f, "name is '%s'; expected %s", t->name,
                   t->experts ? "one %d where the expert's number goes, and no other %" : "no % in a tensor name");
    else if (t->rows < 1 || t->rows > MAX_ELEMS || t->cols < 1 || t->cols > MAX_ELEMS / t->rows ||
             t->count != t->rows * t->cols)
      status = bad(err, n, man, f, "(%s) has count %lld, rows %lld, cols %lld; expected count = rows x cols >= 1",
                   t->name, (long long)t->count, (long long)t->rows, (long long)t->cols);
    else if (t->per && (t->block != g->shard || t->offset < 0 || t->count > (t->block - t->offset) / t->per ||
                        (ne + t->per - 1) / t->per > g->full / g->shard))
      status = bad(err, n, man, f, "(%s) has offset %lld, %d x %lld elements per shard of %lld; expected them inside "
                   "its group's shards (%lld)", t->name, (long long)t->offset, t->per, (long long)t->count,
                   (long long)t->block, (long long)g->shard);
    else if (!t->per && (t->offset < 0 || t->offset > g->full || t->count > (g->full - t->offset) / ne))
      status = bad(err, n, man, f, "(%s) has offset %lld and %lld x %lld elements; expected them inside its group's "
                   "%lld", t->name, (long long)t->offset, (long long)ne, (long long)t->count, (long long)g->full);
  }
  if (!status && k->ntensors > 1) {
    qsort(sorted, (size_t)k->ntensors, sizeof *sorted, by_name);
    for (int i = 1; i < k->ntensors && !status; i++)
      if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
        status = bad(err, n, man, "tensors", "name '%s' twice; expected each tensor once", sorted[i]->name);
  }
  free(sorted);
  if (!status) status = disjoint(k, man, err, n);
  for (int i = 0; i < k->nshards && !status; i++) {
    char f[64], *path = rt_pathf("%s/rank-%05d.bin", k->dir, i);
    struct stat st;
    snprintf(f, sizeof f, "shards[%d]", i);
    if (k->shard_bytes[i] != bytes)
      status = bad(err, n, man, f, "bytes is %lld; expected %lld, the header and the groups' shards",
                   (long long)k->shard_bytes[i], (long long)bytes);
    else if (stat(path, &st) != 0)
      status = fail(err, n, "%s: %s; expected the checkpoint's shard", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
      status = fail(err, n, "%s: %s; expected the checkpoint's shard", path, "not a regular file");
    else if (st.st_size != bytes) /* every offset the manifest gives is now inside a file */
      status = fail(err, n, "%s: wrong size; expected the %s (a corrupt or truncated shard: resume from an older "
                    "checkpoint by removing this step's directory)", path, "size the manifest gives");
    free(path);
  }
  return status;
}

static int opened(RtCkpt *k, const char *man, char *err, size_t errlen);


int rt_ckpt_open(RtCkpt *k, const char *path, char *err, size_t errlen) {
  memset(k, 0, sizeof *k);
  k->dir = rt_pathf("%s", path);
  char *man = rt_pathf("%s/manifest.json", path);
  int st = opened(k, man, err, errlen);
  free(man);
  if (st) rt_ckpt_close(k);
  return st;
}

/* rt_ckpt_open's work, with man the manifest's path: 0, or -1 with err set (k closed by the caller). */
static int opened(RtCkpt *k, const char *man, char *err, size_t errlen) {
  json_error_t je;
  struct stat mst; /* a FIFO would block the load, a directory or device gives a parse error */
  if (stat(man, &mst) != 0)
    return fail(err, errlen, "%s: %s; expected a checkpoint's manifest.json", man, strerror(errno));
  if (!S_ISREG(mst.st_mode))
    return fail(err, errlen, "%s: %s; expected a checkpoint's manifest.json (a regular file)", man, file_kind(mst.st_mode));
  json_t *root = json_load_file(man, 0, &je);
  if (!root) return fail(err, errlen, "%s: %s; expected a checkpoint's manifest.json", man, je.text);
  const char *model = NULL, *format = NULL, *opt = NULL;
  json_t *groups = NULL, *tensors = NULL, *shards = NULL;
  json_int_t step = 0, world = 0, fsdp = 0, ep = 0, dpr = 0, epr = 0, rb = 0;
  const char *seed = NULL;
  if (json_unpack_ex(root, &je, 0, "{s:s, s:s, s:s, s:I, s:s, s:{s:I, s:I, s:I, s:I, s:I}, s:I, s:o, s:o, s:o}",
                     "format", &format, "model", &model, "optimizer", &opt, "step", &step, "seed", &seed, "layout",
                     "world", &world, "fsdp", &fsdp, "ep", &ep, "dp_replicate", &dpr, "experts_per_rank", &epr,
                     "real_bytes", &rb, "groups", &groups, "tensors", &tensors, "shards", &shards) != 0) {
    json_decref(root);
    return fail(err, errlen, "%s: malformed manifest (%s); expected one written by an mtc training program", man, je.text);
  }
  int st = 0;
  if (strcmp(format, "mtc-checkpoint-1") != 0) st = bad(err, errlen, man, "format", "is '%s'; expected mtc-checkpoint-1", format);
  else if (strcmp(opt, "adamw") != 0 && strcmp(opt, "muon") != 0)
    st = bad(err, errlen, man, "optimizer", "is '%s'; expected adamw or muon", opt);
  else if (step < 0) st = bad(err, errlen, man, "step", "is %lld; expected a step >= 0", (long long)step);
  else if (named_step(k->dir) >= 0 && named_step(k->dir) != step)
    st = bad(err, errlen, man, "step", "is %lld, but its directory is named for step %lld; expected the two equal (a "
             "renamed or copied checkpoint: rename the directory step-%08lld, or remove it)", (long long)step,
             named_step(k->dir), (long long)step);
  else if (!hex16(seed)) st = bad(err, errlen, man, "seed", "is '%s'; expected 16 hex digits", seed);
  else if (rb != 4 && rb != 8) st = bad(err, errlen, man, "real_bytes", "is %lld; expected 4 or 8", (long long)rb);
  else if (fsdp < 1 || fsdp > MAX_RANKS) st = bad(err, errlen, man, "layout.fsdp", "is %lld; expected 1 to 2^24", (long long)fsdp);
  else if (ep < 1 || ep > fsdp || fsdp % ep != 0)
    st = bad(err, errlen, man, "layout.ep", "is %lld; expected a divisor of fsdp %lld", (long long)ep, (long long)fsdp);
  else if (dpr < 1 || dpr > MAX_RANKS || world != fsdp * dpr)
    st = bad(err, errlen, man, "layout", "has world %lld, dp_replicate %lld; expected world = fsdp %lld x dp_replicate "
             ">= 1", (long long)world, (long long)dpr, (long long)fsdp);
  else if (epr < 0 || epr * ep > MAX_EXPERTS)
    st = bad(err, errlen, man, "layout.experts_per_rank", "is %lld; expected 0 to 2^20 experts in all", (long long)epr);
  else if (!json_is_array(groups) || !json_is_array(tensors) || !json_is_array(shards))
    st = bad(err, errlen, man, "groups, tensors and shards", "%s", "are not all arrays; expected three arrays");
  else if (json_array_size(groups) > MAX_RANKS || json_array_size(tensors) > MAX_RANKS)
    st = bad(err, errlen, man, "groups or tensors", "%s", "have over 2^24 entries; expected fewer");
  else if (json_array_size(shards) != (size_t)fsdp)
    st = bad(err, errlen, man, "shards", "has %zu entries; expected one per FSDP rank, %lld", json_array_size(shards),
             (long long)fsdp);
  if (st) {
    json_decref(root);
    return -1;
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
  if (!k->groups || !k->tensors || !k->shard_bytes || !k->shard_sum || !k->fds || !k->verified)
    st = bad(err, errlen, man, "", "%s", "out of memory");
  for (int i = 0; k->fds && i < k->nshards; i++) k->fds[i] = -1;
  char f[64];
  for (int i = 0; !st && i < k->ngroups; i++) {
    const char *nm;
    json_int_t comm, full, shard;
    snprintf(f, sizeof f, "groups[%d]", i);
    if (json_unpack_ex(json_array_get(groups, (size_t)i), &je, 0, "{s:s, s:I, s:I, s:I}", "name", &nm, "comm", &comm,
                       "full", &full, "shard", &shard) != 0)
      st = bad(err, errlen, man, f, "is malformed (%s); expected {name, comm, full, shard}", je.text);
    else if (comm < INT_MIN || comm > INT_MAX) st = bad(err, errlen, man, f, "comm is %lld; expected 0 or 1", (long long)comm);
    else k->groups[i] = (RtCkptGroup){dupstr(nm), (int)comm, full, shard};
  }
  for (int i = 0; !st && i < k->ntensors; i++) {
    const char *nm;
    json_int_t g, ex, off, cnt, r, c;
    snprintf(f, sizeof f, "tensors[%d]", i);
    if (json_unpack_ex(json_array_get(tensors, (size_t)i), &je, 0, "{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "name", &nm,
                       "group", &g, "experts", &ex, "offset", &off, "count", &cnt, "rows", &r, "cols", &c) != 0)
      st = bad(err, errlen, man, f, "is malformed (%s); expected {name, group, experts, offset, count, rows, cols}",
               je.text);
    else if (g < 0 || g >= k->ngroups)
      st = bad(err, errlen, man, f, "group is %lld; expected 0 to %d", (long long)g, k->ngroups - 1);
    else if (ex < 0 || ex > MAX_EXPERTS)
      st = bad(err, errlen, man, f, "experts is %lld; expected 0 to 2^20", (long long)ex);
    else k->tensors[i] = (RtCkptTensor){dupstr(nm), (int)g, (int)ex, off, cnt, r, c, 0, 0};
    json_int_t per = 0, block = 0; /* whole-expert shards (absent in flat layouts and older checkpoints) */
    json_t *tj = json_array_get(tensors, (size_t)i), *pj = json_object_get(tj, "per"), *bj = json_object_get(tj, "block");
    if (!st && (pj || bj)) {
      if (!json_is_integer(pj) || !json_is_integer(bj) || (per = json_integer_value(pj)) < 1 || per > ex ||
          (block = json_integer_value(bj)) < 1 || block > MAX_ELEMS)
        st = bad(err, errlen, man, f, "%s", "per / block are malformed; expected both: experts per shard 1 to experts, "
                 "the shard's elements");
      else k->tensors[i].per = (int)per, k->tensors[i].block = block;
    }
    if (!st && !k->tensors[i].name) st = bad(err, errlen, man, f, "%s", "out of memory");
  }
  for (int i = 0; !st && i < k->ngroups; i++)
    if (!k->groups[i].name) st = bad(err, errlen, man, "groups", "%s", "out of memory");
  for (int i = 0; !st && i < k->nshards; i++) {
    const char *sum, *file;
    json_int_t bytes;
    char want[32];
    snprintf(f, sizeof f, "shards[%d]", i);
    snprintf(want, sizeof want, "rank-%05d.bin", i);
    if (json_unpack_ex(json_array_get(shards, (size_t)i), &je, 0, "{s:s, s:I, s:s}", "file", &file, "bytes", &bytes,
                       "fnv1a64", &sum) != 0)
      st = bad(err, errlen, man, f, "is malformed (%s); expected {file, bytes, fnv1a64}", je.text);
    else if (strcmp(file, want) != 0) st = bad(err, errlen, man, f, "file is '%s'; expected %s", file, want);
    else if (!hex16(sum)) st = bad(err, errlen, man, f, "fnv1a64 is '%s'; expected 16 hex digits", sum);
    else k->shard_bytes[i] = bytes, k->shard_sum[i] = strtoull(sum, NULL, 16);
  }
  json_t *runj = json_object_get(root, "run"); /* (absent in checkpoints of mtc before it) */
  if (!st && runj && !json_is_string(runj)) st = bad(err, errlen, man, "run", "%s", "is not a string; expected the run's settings");
  else if (!st && runj && !(k->run = dupstr(json_string_value(runj)))) st = bad(err, errlen, man, "run", "%s", "out of memory");
  json_t *mkj = json_object_get(root, "model_keys"); /* (absent in checkpoints of mtc before it) */
  if (!st && mkj && !json_is_string(mkj))
    st = bad(err, errlen, man, "model_keys", "%s", "is not a string; expected the model's keys");
  else if (!st && mkj && !(k->model_keys = dupstr(json_string_value(mkj))))
    st = bad(err, errlen, man, "model_keys", "%s", "out of memory");
  if (!st) st = validate(k, man, err, errlen);
  /* the manifest's own checksum (absent in checkpoints of mtc before it had one): a field edited
   * by hand (the seed, the names of two tensors of one shape) would resume as another run */
  json_t *mj = json_object_get(root, "manifest_fnv1a64");
  const char *msum = json_string_value(mj);
  if (!st && mj && (!msum || !hex16(msum)))
    st = bad(err, errlen, man, "manifest_fnv1a64", "%s", "is not 16 hex digits; expected the checksum the trainer wrote");
  else if (!st && mj && strtoull(msum, NULL, 16) != rt_ckpt_manifest_sum(root))
    st = bad(err, errlen, man, "manifest_fnv1a64", "is %s, but the manifest's fields sum to %016llx; expected the "
             "manifest as the trainer wrote it (edited by hand or corrupt: resume from an older checkpoint by removing "
             "this step's directory)", msum, (unsigned long long)rt_ckpt_manifest_sum(root));
  json_decref(root);
  return st;
}

/* The value of key in a run string ("key value, ..."): its length in *len, or NULL. */
static const char *run_value(const char *run, const char *key, size_t klen, size_t *len);

bool rt_run_id_valid(const char *s, size_t n) {
  if (n != RT_RUN_ID_LEN) return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

void rt_ckpt_run_id(const char *run, char id[RT_RUN_ID_LEN + 1]) {
  size_t n = 0;
  const char *v = run ? run_value(run, "run_id", 6, &n) : NULL;
  if (v && rt_run_id_valid(v, n)) memcpy(id, v, n), id[n] = 0;
}

static const char *run_value(const char *run, const char *key, size_t klen, size_t *len) {
  for (const char *p = run; p && *p;) {
    const char *end = strstr(p, ", ");
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n > klen && strncmp(p, key, klen) == 0 && p[klen] == ' ') return *len = n - klen - 1, p + klen + 1;
    p = end ? end + 2 : NULL;
  }
  return NULL;
}

void rt_ckpt_run_diff(char *out, size_t n, const char *saved, const char *run) {
  size_t at = 0;
  if (n) out[0] = 0;
  if (!saved) { /* a checkpoint of an mtc before manifests had "run": nothing to compare */
    snprintf(out, n, "the checkpoint does not record them (an older mtc's); this run's: %s", run);
    return;
  }
  for (const char *p = run; p && *p && at < n;) {
    const char *end = strstr(p, ", "), *sp = strchr(p, ' ');
    size_t len = end ? (size_t)(end - p) : strlen(p), klen = sp && sp < p + len ? (size_t)(sp - p) : len, vlen = 0;
    if (klen == 6 && strncmp(p, "run_id", 6) == 0) { /* which run, not how it trains: a resume keeps the checkpoint's */
      p = end ? end + 2 : NULL;
      continue;
    }
    const char *mine = p + klen + (klen < len), *theirs = saved ? run_value(saved, p, klen, &vlen) : NULL;
    size_t mlen = len - (size_t)(mine - p);
    if (!theirs || vlen != mlen || strncmp(theirs, mine, mlen) != 0) {
      int k = snprintf(out + at, n - at, "%s%.*s: %s%.*s%s, %.*s now", at ? "; " : "", (int)klen, p,
                       theirs ? "" : "not recorded", theirs ? (int)vlen : 0, theirs ? theirs : "",
                       theirs ? " in the checkpoint" : " in the checkpoint", (int)mlen, mine);
      if (k < 0 || (size_t)k >= n - at) break;
      at += (size_t)k;
    }
    p = end ? end + 2 : NULL;
  }
}

int rt_ckpt_name(char *dst, size_t n, const RtCkptTensor *t, int e) {
  const char *slot = t->experts ? strstr(t->name, "%d") : NULL;
  int k = slot ? snprintf(dst, n, "%.*s%d%s", (int)(slot - t->name), t->name, e, slot + 2)
               : snprintf(dst, n, "%s", t->name);
  return k >= 0 && (size_t)k < n ? 0 : -1;
}

void rt_ckpt_close(RtCkpt *k) {
  for (int i = 0; k->groups && i < k->ngroups; i++) free(k->groups[i].name);
  for (int i = 0; k->tensors && i < k->ntensors; i++) free(k->tensors[i].name);
  for (int i = 0; k->fds && i < k->nshards; i++)
    if (k->fds[i] >= 0) close(k->fds[i]);
  free(k->groups), free(k->tensors), free(k->shard_bytes), free(k->shard_sum), free(k->fds), free(k->verified);
  free(k->dir), free(k->run), free(k->model_keys);
  memset(k, 0, sizeof *k);
}

static int shard_at(RtCkpt *k, int r, const char *path, char *err, size_t errlen);

/* Opens shard r and checks its size and checksum against the manifest (once). */
static int shard(RtCkpt *k, int r, char *err, size_t errlen) {
  if (k->verified[r]) return k->fds[r];
  char *path = rt_pathf("%s/rank-%05d.bin", k->dir, r);
  int fd = shard_at(k, r, path, err, errlen);
  free(path);
  return fd;
}

/* shard's work, with path the shard's file. */
static int shard_at(RtCkpt *k, int r, const char *path, char *err, size_t errlen) {
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
  /* the header repeats the layout: a shard of another checkpoint with a matching manifest entry */
  unsigned char head[RT_CKPT_HEADER];
  int64_t v[8], want[8] = {1, k->step, r, k->fsdp, k->ep, k->dp_replicate, k->real_bytes, k->ngroups};
  if (pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head || memcmp(head, "MTCCKPT1", 8) != 0 ||
      (memcpy(v, head + 8, sizeof v), memcmp(v, want, sizeof v) != 0)) {
    close(fd);
    return fail(err, errlen, "%s: its header does not match %s; expected a shard of this checkpoint", path,
                "the manifest (version, step, rank, layout, bytes per value, groups)");
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
  int ke = t->experts ? e % t->experts : 0; /* the expert among its EP rank's */
  int64_t off = (t->per ? t->offset + (int64_t)(ke / t->per) * t->block + (int64_t)(ke % t->per) * t->count
                        : t->offset + (int64_t)ke * t->count) + first;
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

/* What the file type in mode is, for messages. */
static const char *file_kind(mode_t mode) {
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/* 0 when path is missing or a regular file, else -1 with err set. A symbolic link is refused,
 * whatever it points to: mtc writes only the path it is given, never a file a link there names
 * (a link into a checkpoint would otherwise have a shard replaced). */
static int replaceable(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return 0;
    return snprintf(err, errlen, "%s: %s; expected a regular file or a path that does not exist", path,
                    strerror(errno)), -1;
  }
  if (S_ISREG(st.st_mode)) return 0;
  if (S_ISLNK(st.st_mode)) {
    char *target = rt_link_target(path);
    snprintf(err, errlen, "%s -> %s: a symbolic link; expected a regular file or a path that does not exist "
             "(mtc does not write through links: remove the link, or name the file itself)", path, target);
    return free(target), -1;
  }
  return snprintf(err, errlen, "%s: %s; expected a regular file or a path that does not exist (mtc replaces "
                  "only those)", path, file_kind(st.st_mode)), -1;
}

char *rt_link_target(const char *path) {
  for (size_t cap = 256;; cap *= 2) {
    char *t = malloc(cap);
    if (!t) fprintf(stderr, "error: out of memory reading a link\n"), exit(1);
    ssize_t n = readlink(path, t, cap);
    if (n < 0) return free(t), rt_pathf("%s", "?");
    if ((size_t)n < cap) return t[n] = 0, t;
    free(t);
  }
}

int rt_replace_begin(const char *path, char **tmpp, char *err, size_t errlen) {
  *tmpp = NULL;
  if (replaceable(path, err, errlen) != 0) return -1;
  char *tmp = rt_pathf("%s.tmp", path);
  struct stat st; /* the temporary itself: a leftover file or link goes, anything else stays */
  if (lstat(tmp, &st) == 0) {
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
      return snprintf(err, errlen, "%s: %s; expected a regular file or a path that does not exist (mtc writes "
                      "its temporary file there)", tmp, file_kind(st.st_mode)), free(tmp), -1;
    if (unlink(tmp) != 0) return snprintf(err, errlen, "%s: %s", tmp, strerror(errno)), free(tmp), -1;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return snprintf(err, errlen, "%s: %s; expected a writable path", tmp, strerror(errno)), free(tmp), -1;
  *tmpp = tmp;
  return fd;
}

int rt_replace_commit(const char *tmp, const char *path, char *err, size_t errlen) {
  if (replaceable(path, err, errlen) != 0) return unlink(tmp), -1;
  if (rename(tmp, path) != 0) {
    snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}
