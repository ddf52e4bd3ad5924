/* ckpt_prune.c — checkpoint retention (train --keep-checkpoints N): after a save, the
 * checkpoints older than the newest N complete ones are removed (see mtrt_ckpt.h). No MPI. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtrt_ckpt.h"

/* The step of a checkpoint directory's name "step-N", or -1 for any other name. */
static long long step_of(const char *name) {
  char *end;
  if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9') return -1;
  long long s = strtoll(name + 5, &end, 10);
  return *end ? -1 : s;
}

/* Whether dir/name holds a manifest.json that is a regular file (a complete checkpoint). */
static int complete(const char *dir, const char *name) {
  char man[4200];
  struct stat st;
  snprintf(man, sizeof man, "%s/%s/manifest.json", dir, name);
  return stat(man, &st) == 0 && S_ISREG(st.st_mode);
}

/* Removes the files (regular files and links) of one checkpoint directory, then it. */
static int remove_ckpt(const char *path, char *err, size_t errlen) {
  DIR *d = opendir(path);
  if (!d) return snprintf(err, errlen, "%s: %s", path, strerror(errno)), -1;
  char file[4600];
  int rc = 0;
  for (struct dirent *de; (de = readdir(d));) {
    struct stat st;
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    snprintf(file, sizeof file, "%s/%s", path, de->d_name);
    errno = 0;
    if (lstat(file, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) || unlink(file) != 0) {
      snprintf(err, errlen, "%s: not removed (%s); expected only a checkpoint's files there", file,
               errno ? strerror(errno) : "not a regular file");
      rc = -1;
    }
  }
  closedir(d);
  if (rc == 0 && rmdir(path) != 0) return snprintf(err, errlen, "%s: %s", path, strerror(errno)), -1;
  return rc;
}

int rt_ckpt_prune(const char *dir, int keep, char *err, size_t errlen) {
  DIR *d = opendir(dir);
  if (!d) return snprintf(err, errlen, "%s: %s", dir, strerror(errno)), -1;
  long long *steps = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *de; (de = readdir(d));) { /* the complete checkpoints' steps */
    long long s = step_of(de->d_name);
    if (s < 0 || !complete(dir, de->d_name)) continue;
    if (n == cap) {
      long long *grown = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
      if (!grown) return free(steps), closedir(d), snprintf(err, errlen, "out of memory"), -1;
      steps = grown;
    }
    steps[n++] = s;
  }
  long long oldest_kept = -1; /* the keep-th newest complete step */
  for (int k = 0; k < keep && (size_t)k < n; k++) {
    long long best = -1;
    for (size_t i = 0; i < n; i++)
      if (steps[i] > best && (oldest_kept < 0 || steps[i] < oldest_kept)) best = steps[i];
    oldest_kept = best;
  }
  free(steps);
  int removed = 0, rc = 0;
  if (n > (size_t)keep) {
    rewinddir(d);
    for (struct dirent *de; (de = readdir(d));) {
      long long s = step_of(de->d_name);
      if (s < 0 || s >= oldest_kept) continue; /* older ones go, complete or left by a killed save */
      char path[4200];
      snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
      if (remove_ckpt(path, err, errlen) == 0) removed++;
      else rc = -1;
    }
  }
  closedir(d);
  return rc < 0 ? -1 : removed;
}
