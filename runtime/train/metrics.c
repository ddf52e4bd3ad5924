/* metrics.c — the metrics file of a training run (see mtrt_train.h): one JSON line per step,
 * each formatted whole and written with one write() on an O_APPEND descriptor, so a killed run
 * leaves whole lines (at most one cut last line, which the next open drops); a resumed run drops
 * the lines past its checkpoint's step first (and empties a file that does not end at that step
 * of its run: the last line's "run" is another run id), a new run empties the file. No MPI: rank
 * 0 calls these. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "mtrt_ckpt.h"
#include "mtrt_train.h"

/* The offset just past the last '\n' in bytes [0, end) of fd: the start of the line that ends at
 * end; 0 when there is none. -1 on a read error. */
static off_t line_start(int fd, off_t end) {
  char buf[4096];
  while (end > 0) {
    off_t lo = end > (off_t)sizeof buf ? end - (off_t)sizeof buf : 0;
    ssize_t got = pread(fd, buf, (size_t)(end - lo), lo);
    if (got != (ssize_t)(end - lo)) return -1;
    for (off_t i = end - lo - 1; i >= 0; i--)
      if (buf[i] == '\n') return lo + i + 1;
    end = lo;
  }
  return 0;
}

/* The step of the line at offset at ({"step":N,...}): 0, or -1 when it has none. */
static int line_step(int fd, off_t at, int64_t *step) {
  char buf[48] = {0};
  long long s;
  if (pread(fd, buf, sizeof buf - 1, at) <= 0 || sscanf(buf, "{\"step\":%lld", &s) != 1) return -1;
  *step = s;
  return 0;
}

/* The run id of the line at offset at that ends before end ("run":"<id>"), into id; "" when it
 * has none (a line of an mtc before run ids). */
static void line_run(int fd, off_t at, off_t end, char id[RT_RUN_ID_LEN + 1]) {
  char buf[1024] = {0};
  size_t n = end - at < (off_t)sizeof buf ? (size_t)(end - at) : sizeof buf - 1;
  id[0] = 0;
  if (pread(fd, buf, n, at) != (ssize_t)n) return;
  buf[n] = 0;
  const char *p = strstr(buf, ",\"run\":\"");
  if (p && rt_run_id_valid(p + 8, strcspn(p + 8, "\""))) memcpy(id, p + 8, RT_RUN_ID_LEN), id[RT_RUN_ID_LEN] = 0;
}

/* Drops a cut last line, and with resume_step >= 0 the last lines whose step is past it (up to
 * the first line that is not). Sets m->bytes. */
static int trim(RtMetrics *m, int64_t resume_step, const char *run_id, char *err, size_t errlen) {
  struct stat st;
  if (fstat(m->fd, &st) != 0) return snprintf(err, errlen, "%s: %s", m->path, strerror(errno)), -1;
  m->bytes = st.st_size;
  if (!S_ISREG(st.st_mode)) return 0; /* a character device (/dev/null): nothing to trim */
  char head[9] = {0}; /* only a metrics file of mtc's is emptied or trimmed: never a user's data, a manifest, code */
  if (st.st_size > 0 && (pread(m->fd, head, 8, 0) != 8 || memcmp(head, "{\"step\":", 8) != 0))
    return snprintf(err, errlen, "%s holds %lld bytes that are not a metrics file of mtc's (its first line is not "
                    "{\"step\":...}); expected a new path, or the metrics file of an earlier run (the only files "
                    "train empties or trims)", m->path, (long long)st.st_size), -1;
  if (resume_step < 0) { /* a new run: the lines there are an earlier run's */
    if (st.st_size > 0 && ftruncate(m->fd, 0) != 0)
      return snprintf(err, errlen, "%s: cannot empty it for a new run: %s", m->path, strerror(errno)), -1;
    m->replaced = st.st_size, m->bytes = 0;
    return 0;
  }
  off_t keep = line_start(m->fd, st.st_size); /* a last line without its '\n' was cut */
  while (keep > 0 && resume_step >= 0) {
    off_t at = line_start(m->fd, keep - 1);
    int64_t s;
    if (at < 0 || line_step(m->fd, at, &s) != 0 || s <= resume_step) break;
    keep = at;
  }
  if (keep < 0) return snprintf(err, errlen, "%s: %s; expected a readable metrics file", m->path, strerror(errno)), -1;
  /* lines that stop short of the checkpoint's step are not this run's record up to it: another
   * run's file (the default metrics.jsonl of the directory), or one that missed steps. Emptied
   * rather than refused, as a new run empties an earlier run's file: the file then reads as one
   * run from the checkpoint on, never two runs spliced with a gap, and a resume in a directory
   * that another run wrote metrics.jsonl in needs no --metrics */
  int64_t last = -1;
  off_t at = keep > 0 ? line_start(m->fd, keep - 1) : 0;
  char run[RT_RUN_ID_LEN + 1] = "";
  if (keep > 0 && at >= 0) line_run(m->fd, at, keep, run); /* a line of this run's, or another's */
  int other = run[0] && run_id && strcmp(run, run_id) != 0;
  if (keep > 0 && (at < 0 || line_step(m->fd, at, &last) != 0 || last != resume_step || other)) {
    if (ftruncate(m->fd, 0) != 0)
      return snprintf(err, errlen, "%s: cannot empty it: %s", m->path, strerror(errno)), -1;
    m->replaced = keep, m->last_step = last, m->bytes = 0;
    if (other) memcpy(m->last_run, run, sizeof run);
    return 0;
  }
  if (keep < st.st_size && ftruncate(m->fd, keep) != 0)
    return snprintf(err, errlen, "%s: cannot drop its last lines: %s", m->path, strerror(errno)), -1;
  m->bytes = keep;
  return 0;
}

/* The kernel's pseudo file system that path lies on (proc, sysfs, cgroup, ...: files that look
 * regular but take no appended lines), or NULL. Magic numbers from linux/magic.h. */
static const char *pseudo_fs(const char *path) {
  static const struct {
    unsigned long magic;
    const char *name;
  } fs[] = {{0x9fa0, "proc"},           {0x62656572, "sysfs"},   {0x27e0eb, "cgroup"},
            {0x63677270, "cgroup2"},    {0x64626720, "debugfs"}, {0x74726163, "tracefs"},
            {0x73636673, "securityfs"}, {0x62656570, "configfs"}, {0xcafe4a11, "bpf"},
            {0xde5e81e4, "efivarfs"}};
  struct statfs sf;
  if (statfs(path, &sf) != 0) return NULL;
  for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
    if ((unsigned long)sf.f_type == fs[i].magic) return fs[i].name;
  return NULL;
}

int rt_metrics_open(RtMetrics *m, const char *path, int64_t resume_step, const char *run_id, char *err,
                    size_t errlen) {
  *m = (RtMetrics){.fd = -1, .path = path, .last_step = -1};
  struct stat st, lst; /* a FIFO would block the open (and a reader would get cut lines) */
  int flags = O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC;
  if (lstat(path, &lst) != 0) flags |= O_EXCL | O_NOFOLLOW; /* missing: created here, never through a link */
  else if (S_ISLNK(lst.st_mode) && stat(path, &st) != 0) {
    char *target = rt_link_target(path);
    snprintf(err, errlen, "%s -> %s: a symbolic link to nothing; expected a regular file, a path that does not "
             "exist, or a link to an existing file (mtc does not create files through links)", path, target);
    return free(target), -1;
  }
  int exists = stat(path, &st) == 0;
  if (exists && !S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode))
    return snprintf(err, errlen, "%s: %s; expected a regular file, a path that does not exist, or a character "
                    "device such as /dev/null", path, S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                    : "not a regular file"), -1;
  const char *pseudo = exists && S_ISREG(st.st_mode) ? pseudo_fs(path) : NULL;
  if (pseudo)
    return snprintf(err, errlen, "%s: a file of the kernel's %s file system, not a file on disk; expected a regular "
                    "file, a path that does not exist, or a character device such as /dev/null", path, pseudo), -1;
  m->fd = open(path, flags, 0644);
  if (m->fd < 0) return snprintf(err, errlen, "%s: %s; expected a writable file path", path, strerror(errno)), -1;
  /* one run per metrics file (held until the process ends): a second run on the same file (two runs
   * started in one directory, both with the default metrics.jsonl) would empty it under the first */
  if (fstat(m->fd, &st) == 0 && S_ISREG(st.st_mode) && flock(m->fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    close(m->fd);
    m->fd = -1;
    return snprintf(err, errlen, "%s: %s; expected a metrics file no other training run writes (give this run its "
                    "own --metrics PATH)", path, e == EWOULDBLOCK ? "in use by another training run (it holds the "
                    "file locked)" : strerror(e)), -1;
  }
  if (trim(m, resume_step, run_id, err, errlen) != 0) {
    close(m->fd);
    m->fd = -1;
    return -1;
  }
  return 0;
}

static int num(char *b, size_t n, const char *key, double x, const char *fmt) {
  int k = snprintf(b, n, ",\"%s\":", key);
  if (k < 0 || (size_t)k >= n) return k;
  return k + (isfinite(x) ? snprintf(b + k, n - (size_t)k, fmt, x) : snprintf(b + k, n - (size_t)k, "null"));
}

int rt_metrics_line(char *b, size_t n, const RtStepMetrics *s) {
  size_t k = 0;
#define ADD(expr)                                              \
  do {                                                         \
    int w_ = (expr);                                           \
    if (w_ < 0 || (size_t)w_ >= n - k) return -1;              \
    k += (size_t)w_;                                           \
  } while (0)
  ADD(snprintf(b, n, "{\"step\":%lld", (long long)s->step));
  ADD(num(b + k, n - k, "loss", s->loss, "%.17g")); /* every digit: runs are compared bit for bit */
  ADD(num(b + k, n - k, "aux_loss", s->aux_loss, "%.6g"));
  ADD(num(b + k, n - k, "lr", s->lr, "%.6g"));
  ADD(num(b + k, n - k, "grad_norm", s->grad_norm, "%.6g"));
  if (s->moe_load >= 0) {
    ADD(num(b + k, n - k, "moe_load", s->moe_load, "%.4f"));
    ADD(snprintf(b + k, n - k, ",\"moe_extra_rounds\":%lld", (long long)s->moe_extra_rounds));
  }
  if (s->skipped) ADD(snprintf(b + k, n - k, ",\"skipped\":true"));
  /* what differs between two runs of one program, last (mtrt_train.h) */
  ADD(num(b + k, n - k, "time", s->time, "%.3f"));
  ADD(num(b + k, n - k, "step_seconds", s->step_seconds, "%.6g"));
  ADD(num(b + k, n - k, "tokens_per_second", s->tokens_per_second, "%.1f"));
  ADD(snprintf(b + k, n - k, ",\"run\":\"%s\"}\n", s->run && rt_run_id_valid(s->run, strlen(s->run)) ? s->run : ""));
#undef ADD
  return (int)k;
}

int rt_metrics_write(RtMetrics *m, const RtStepMetrics *s, char *err, size_t errlen) {
  char line[1024];
  int n = rt_metrics_line(line, sizeof line, s);
  if (n < 0) return snprintf(err, errlen, "%s: a metrics line too long", m->path), -1;
  size_t done = 0; /* one write() unless the file system is full or the call is interrupted */
  ssize_t w = 0;
  while (done < (size_t)n) {
    w = write(m->fd, line + done, (size_t)n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  if (done == (size_t)n) {
    m->bytes += n;
    return 0;
  }
  int e = w == 0 ? ENOSPC : errno;
  if (done) (void)!ftruncate(m->fd, m->bytes); /* no cut line stays behind */
  snprintf(err, errlen, "%s: %s (writing step %lld); expected room for the metrics file", m->path, strerror(e),
           (long long)s->step);
  return -1;
}

int rt_metrics_close(RtMetrics *m, char *err, size_t errlen) {
  if (m->fd < 0) return 0;
  int bad = close(m->fd) != 0;
  m->fd = -1;
  if (bad) return snprintf(err, errlen, "%s: %s; expected room for the metrics file", m->path, strerror(errno)), -1;
  return 0;
}
