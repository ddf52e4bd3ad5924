/* profile.c — `train --profile FILE` (mtrt_profile.h): per op class and collective, the seconds,
 * calls and FLOPs or bytes of the measured steps, averaged over the ranks, as JSON. */
#include <errno.h>
#include <jansson.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mtrt_ckpt.h"
#include "mtrt_profile.h"
#include "mtrt_real.h"

/* ORDER RtProfClass; "what": the measure calibrate divides by the time */
static const struct {
  const char *name, *what;
} prof_names[RT_PROF_CLASSES] = {
    {"gemm", "flops"},           {"grouped_gemm", "flops"},   {"attention_fwd", "flops"},
    {"attention_bwd", "flops"},  {"norm", "bytes"},           {"rope", "bytes"},
    {"activation", "bytes"},     {"loss", "bytes"},           {"permute", "bytes"},
    {"elementwise", "bytes"},    {"optimizer", "bytes"},    {"all_gather", "bytes"},
    {"reduce_scatter", "bytes"}, {"all_reduce", "bytes"},     {"all_to_all", "bytes"},
};

bool rt_prof_on;
/* per class: seconds, calls, flops, bytes */
static double acc[RT_PROF_CLASSES][4];
enum { DEPTH = 8 };
static double nested[DEPTH]; /* seconds of timed calls inside the open call at each depth */
static int depth;
static double cpu0; /* the process's CPU seconds (user + system) at the last reset */

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
         1e-6 * (double)ru.ru_stime.tv_usec;
}

__attribute__((weak)) void rt_prof_fence(void) {}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void rt_prof_start(void) { rt_prof_on = true; }
void rt_prof_reset(void) { memset(acc, 0, sizeof acc), cpu0 = cpu_seconds(); }

double rt_prof_begin(void) {
  rt_prof_fence();
  if (depth < DEPTH) nested[depth] = 0;
  depth++;
  return now();
}

void rt_prof_end(RtProfClass c, double t0, double flops, double bytes) {
  rt_prof_fence();
  double s = now() - t0;
  depth--;
  double own = depth < DEPTH ? s - nested[depth] : s;
  if (depth > 0 && depth - 1 < DEPTH) nested[depth - 1] += s;
  acc[c][0] += own, acc[c][1] += 1, acc[c][2] += flops, acc[c][3] += bytes;
}

void rt_prof_add(RtProfClass c, double seconds, double flops, double bytes) {
  if (depth > 0 && depth - 1 < DEPTH) nested[depth - 1] += seconds; /* inside a timed op: not its own */
  acc[c][0] += seconds, acc[c][1] += 1, acc[c][2] += flops, acc[c][3] += bytes;
}

int rt_prof_write(const char *path, const RtProfRun *run, char *err, int errlen) {
  double sum[RT_PROF_CLASSES][4], cpu = cpu_seconds() - cpu0;
  MPI_Allreduce(acc, sum, RT_PROF_CLASSES * 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &cpu, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;
  double w = run->world > 0 ? run->world : 1, steps = run->steps > 0 ? (double)run->steps : 1;
  json_t *root = json_object(), *cls = json_object();
  json_object_set_new(root, "format", json_string("mtc-profile-1"));
  json_object_set_new(root, "spec", json_string(run->spec ? run->spec : ""));
  json_object_set_new(root, "model", json_string(run->model ? run->model : ""));
  json_object_set_new(root, "backend", json_string(run->backend ? run->backend : ""));
  json_object_set_new(root, "device", json_string(run->device ? run->device : ""));
  json_object_set_new(root, "world", json_integer(run->world));
  json_object_set_new(root, "fsdp", json_integer(run->fsdp));
  json_object_set_new(root, "ep", json_integer(run->ep));
  json_object_set_new(root, "act_bytes", json_integer((json_int_t)sizeof(act)));
  json_object_set_new(root, "steps", json_integer(run->steps));
  json_object_set_new(root, "step_seconds", json_real(run->step_seconds));
  /* how much of a core each rank had: below 1 where ranks share cores or the machine is loaded
   * (MPI's waits count where its progress engine polls) */
  json_object_set_new(root, "cpu_seconds_per_step", json_real(cpu / w / steps));
  json_object_set_new(root, "predicted_step_seconds", json_real(run->predicted_step_seconds));
  json_object_set_new(root, "tokens_per_step", json_real(run->tokens_per_step));
  json_object_set_new(root, "optimizer_on_host", json_boolean(run->optimizer_on_host));
  json_object_set_new(root, "per", json_string("rank and step, mean over the ranks"));
  for (int c = 0; c < RT_PROF_CLASSES; c++) {
    if (sum[c][1] == 0) continue;
    json_t *o = json_object();
    json_object_set_new(o, "seconds", json_real(sum[c][0] / w / steps));
    json_object_set_new(o, "calls", json_real(sum[c][1] / w / steps));
    if (strcmp(prof_names[c].what, "flops") == 0) json_object_set_new(o, "flops", json_real(sum[c][2] / w / steps));
    if (strcmp(prof_names[c].what, "bytes") == 0) json_object_set_new(o, "bytes", json_real(sum[c][3] / w / steps));
    json_object_set_new(cls, prof_names[c].name, o);
  }
  json_object_set_new(root, "classes", cls);
  char *tmp = NULL, why[4400];
  errno = 0;
  int fd = rt_replace_begin(path, &tmp, why, sizeof why), rc = -1;
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (fd >= 0 && !f) close(fd);
  if (f) {
    rc = json_dumpf(root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    rc = (fputc('\n', f) == EOF || fflush(f) != 0 || fsync(fileno(f)) != 0) ? -1 : rc;
    rc = fclose(f) != 0 ? -1 : rc;
    if (rc != 0) {
      int e = errno ? errno : EIO;
      unlink(tmp);
      snprintf(why, sizeof why, "cannot write %s: %s", tmp, strerror(e));
    }
    else if (rt_replace_commit(tmp, path, why, sizeof why) != 0) rc = -1;
  }
  json_decref(root);
  free(tmp);
  if (rc != 0) snprintf(err, (size_t)errlen, "%s", why);
  return rc == 0 ? 0 : -1;
}

int rt_prof_check(const char *path, char *err, int errlen) {
  char *tmp, why[4400], head[257] = "";
  struct stat st;
  if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(head, 1, sizeof head - 1, f) : 0;
    if (f) fclose(f);
    head[n] = 0;
    if (!strstr(head, "\"mtc-profile-1\""))
      return snprintf(err, (size_t)errlen, "%s holds %lld bytes that are not a profile of mtc's (no \"format\": "
                      "\"mtc-profile-1\"); expected a new path, or the profile of an earlier run (the only files "
                      "--profile replaces)", path, (long long)st.st_size), -1;
  }
  int fd = rt_replace_begin(path, &tmp, why, sizeof why);
  if (fd < 0) return snprintf(err, (size_t)errlen, "%s", why), -1;
  close(fd);
  unlink(tmp);
  free(tmp);
  return 0;
}
