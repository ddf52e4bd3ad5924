/* ckpt_prune.c — checkpoint retention (train --keep-checkpoints N): after a save, the
 * checkpoints older than the newest N complete ones are removed (see mtrt_ckpt.h). No MPI.
 *
 * Only what mtc wrote is removed: a directory named as the trainer names it (step-%08lld),
 * that is a directory itself (never a symbolic link, which is not followed), holding a
 * manifest.json of format mtc-checkpoint-1 (a regular file). Of it, only the manifest, the
 * shard files the manifest names (rank-NNNNN.bin, regular files) and their .tmp leftovers are
 * unlinked; the directory is removed when nothing else is in it. Anything else (a link, a
 * file of the user's, a subdirectory) stays, and is named in err. All through a descriptor
 * of the directory opened with O_NOFOLLOW (unlinkat, fstatat without following links), so a
 * link swapped in by someone else is not followed either. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtrt_ckpt.h"

#define step_of rt_ckpt_step_of

/* Whether name is "rank-NNNNN.bin" (5 or more digits), a shard file name the trainer writes. */
static int shard_name(const char *name) {
  if (strncmp(name, "rank-", 5) != 0) return 0;
  size_t n = strspn(name + 5, "0123456789");
  return n >= 5 && n <= 9 && strcmp(name + 5 + n, ".bin") == 0;
}

/* A directory descriptor of dir/name when it is a real directory (not a link): else -1. */
static int open_step_dir(int dirfd, const char *name) {
  struct stat st;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) return -1;
  return openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* Whether fd/name is a regular file (not followed when a link). */
static int regular_at(int fd, const char *name) {
  struct stat st;
  return fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

/* The manifest of a step directory (fd) when it is mtc's: a regular manifest.json, a JSON
 * object with format "mtc-checkpoint-1" and an array of shards. NULL otherwise. */
static json_t *mtc_manifest(int fd) {
  if (!regular_at(fd, "manifest.json")) return NULL;
  int mfd = openat(fd, "manifest.json", O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (mfd < 0) return NULL;
  FILE *f = fdopen(mfd, "r"); /* buffered: json_loadfd reads one byte per read() (minutes for a huge file) */
  if (!f) return close(mfd), NULL;
  json_t *j = json_loadf(f, 0, NULL);
  fclose(f);
  const char *format = json_string_value(json_object_get(j, "format"));
  if (!format || strcmp(format, "mtc-checkpoint-1") != 0 || !json_is_array(json_object_get(j, "shards")))
    return json_decref(j), NULL;
  return j;
}

/* Unlinks fd/name when it is a regular file; a missing one is fine. 0, or -1 (err set). */
static int unlink_ours(int fd, const char *path, const char *name, char *err, size_t errlen) {
  struct stat st;
  if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -1;
  if (!S_ISREG(st.st_mode))
    return snprintf(err, errlen, "%s/%s: not removed (not a regular file); mtc removes only the files it wrote",
                    path, name), -1;
  if (unlinkat(fd, name, 0) != 0 && errno != ENOENT)
    return snprintf(err, errlen, "%s/%s: not removed (%s)", path, name, strerror(errno)), -1;
  return 0;
}

/* Removes one checkpoint: the shards its manifest names (and their .tmp leftovers), the
 * manifest last, then the directory when it is empty. 0, or -1 with err set. */
static int remove_ckpt(int fd, json_t *man, const char *path, char *err, size_t errlen) {
  int rc = 0;
  char tmp[64];
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(man, "shards"), i, s) {
    const char *file = json_string_value(json_object_get(s, "file"));
    if (!file || !shard_name(file)) {
      snprintf(err, errlen, "%s/manifest.json: shards[%zu] file is not a shard name of mtc's (rank-NNNNN.bin); "
               "nothing of that checkpoint removed", path, i);
      return -1;
    }
  }
  json_array_foreach(json_object_get(man, "shards"), i, s) {
    const char *file = json_string_value(json_object_get(s, "file"));
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    if (unlink_ours(fd, path, file, err, errlen) != 0 || unlink_ours(fd, path, tmp, err, errlen) != 0) rc = -1;
  }
  if (unlink_ours(fd, path, "manifest.json.tmp", err, errlen) != 0) rc = -1;
  if (rc == 0 && unlink_ours(fd, path, "manifest.json", err, errlen) != 0) rc = -1;
  if (rc != 0) return -1;
  /* what else is there stays: the directory is removed only when empty */
  int dfd = dup(fd);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0) close(dfd);
    return snprintf(err, errlen, "%s: %s", path, strerror(errno)), -1;
  }
  char other[256] = "";
  for (struct dirent *de; (de = readdir(d));)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
      snprintf(other, sizeof other, "%s", de->d_name);
      break;
    }
  closedir(d);
  if (other[0])
    return snprintf(err, errlen, "%s: removed the checkpoint's files, kept the directory: it also holds %s, which "
                    "mtc did not write (remove it yourself if it is not needed)", path, other), -1;
  return 0;
}

int rt_ckpt_prune(const char *dir, int keep, char *err, size_t errlen) {
  int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return snprintf(err, errlen, "%s: %s", dir, strerror(errno)), -1;
  int dfd = dup(dirfd);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0) close(dfd);
    close(dirfd);
    return snprintf(err, errlen, "%s: %s", dir, strerror(errno)), -1;
  }
  long long *steps = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *de; (de = readdir(d));) { /* the complete checkpoints of mtc's: their steps */
    long long s = step_of(de->d_name);
    int fd = s < 0 ? -1 : open_step_dir(dirfd, de->d_name);
    if (fd < 0) continue;
    json_t *man = mtc_manifest(fd);
    close(fd);
    if (!man) continue;
    json_decref(man);
    if (n == cap) {
      long long *grown = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
      if (!grown) return free(steps), closedir(d), close(dirfd), snprintf(err, errlen, "out of memory"), -1;
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
      if (s < 0 || s >= oldest_kept) continue;
      int fd = open_step_dir(dirfd, de->d_name); /* a link named step-N is not followed, nor removed */
      json_t *man = fd < 0 ? NULL : mtc_manifest(fd);
      if (!man) { /* not a complete checkpoint of mtc's: left alone */
        if (fd >= 0) close(fd);
        continue;
      }
      char *path = rt_pathf("%s/%s", dir, de->d_name);
      int r = remove_ckpt(fd, man, path, err, errlen);
      json_decref(man);
      close(fd);
      if (r == 0 && unlinkat(dirfd, de->d_name, AT_REMOVEDIR) != 0)
        r = -1, snprintf(err, errlen, "%s: %s", path, strerror(errno));
      if (r == 0) removed++;
      else rc = -1;
      free(path);
    }
  }
  closedir(d);
  close(dirfd);
  return rc < 0 ? -1 : removed;
}

/* Whether name is a file an interrupted save leaves: a shard, a shard's or the manifest's .tmp. */
static int save_leftover(const char *name) {
  char base[256];
  size_t n = strlen(name);
  if (strcmp(name, "manifest.json.tmp") == 0) return 1;
  if (n >= sizeof base) return 0;
  memcpy(base, name, n + 1);
  if (n > 4 && strcmp(base + n - 4, ".tmp") == 0) base[n - 4] = 0;
  return shard_name(base);
}

int rt_ckpt_clean_incomplete(const char *dir, char *removed, size_t removedlen, char *err, size_t errlen) {
  int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return errno == ENOENT ? 0 : (snprintf(err, errlen, "%s: %s", dir, strerror(errno)), -1);
  int dfd = dup(dirfd);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0) close(dfd);
    close(dirfd);
    return snprintf(err, errlen, "%s: %s", dir, strerror(errno)), -1;
  }
  int count = 0, rc = 0;
  if (removedlen) removed[0] = 0;
  for (struct dirent *de; (de = readdir(d));) {
    if (rt_ckpt_step_of(de->d_name) < 0) continue;
    int fd = open_step_dir(dirfd, de->d_name); /* a link named step-N is not followed, nor removed */
    if (fd < 0) continue;
    json_t *man = regular_at(fd, "manifest.json") ? mtc_manifest(fd) : NULL;
    if (man || regular_at(fd, "manifest.json")) { /* complete (or a manifest not mtc's): not a leftover */
      json_decref(man);
      close(fd);
      continue;
    }
    /* incomplete: only the files a save writes may be there, else the directory is not touched */
    int sfd = dup(fd);
    DIR *s = sfd >= 0 ? fdopendir(sfd) : NULL;
    char other[256] = "";
    for (struct dirent *f; s && (f = readdir(s));)
      if (strcmp(f->d_name, ".") && strcmp(f->d_name, "..") && (!save_leftover(f->d_name) || !regular_at(fd, f->d_name))) {
        snprintf(other, sizeof other, "%s", f->d_name);
        break;
      }
    if (!s) snprintf(other, sizeof other, "(unreadable)");
    char *path = rt_pathf("%s/%s", dir, de->d_name);
    if (other[0]) {
      snprintf(err, errlen, "%s: an incomplete checkpoint (no manifest.json) kept: it also holds %s, which mtc "
               "did not write", path, other);
      rc = -1;
    } else {
      rewinddir(s);
      for (struct dirent *f; (f = readdir(s));)
        if (strcmp(f->d_name, ".") && strcmp(f->d_name, "..") && unlink_ours(fd, path, f->d_name, err, errlen) != 0)
          rc = -1;
      if (unlinkat(dirfd, de->d_name, AT_REMOVEDIR) != 0) rc = -1, snprintf(err, errlen, "%s: %s", path, strerror(errno));
      else {
        size_t used = strlen(removed);
        if (used + 1 < removedlen) snprintf(removed + used, removedlen - used, "%s%s", count ? ", " : "", de->d_name);
        count++;
      }
    }
    if (s) closedir(s);
    close(fd);
    free(path);
  }
  closedir(d);
  close(dirfd);
  return rc < 0 ? -1 : count;
}
