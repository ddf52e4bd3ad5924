/* identity.c — which run and which program (mtrt_train.h): a run's id, kept in the checkpoints'
 * run record and on every metrics line; the start-up check that the plan.json beside the program
 * is the one it was compiled from. No MPI: rank 0 calls these. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "mtrt_ckpt.h"
#include "mtrt_train.h"

void rt_run_id_new(char id[RT_RUN_ID_LEN + 1]) {
  uint64_t x = 0;
  if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) { /* no entropy yet: the clock and the pid */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t parts[3] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, (uint64_t)getpid()};
    x = rt_fnv1a(RT_FNV_SEED, parts, sizeof parts);
  }
  snprintf(id, RT_RUN_ID_LEN + 1, "%016llx", (unsigned long long)x);
}

/* The directory above the one holding this executable (/proc/self/exe: DIR/build/train gives
 * DIR), allocated; NULL when the link cannot be read. */
static char *program_dir(void) {
  size_t cap = 256;
  for (;;) {
    char *buf = malloc(cap);
    if (!buf) return NULL;
    ssize_t n = readlink("/proc/self/exe", buf, cap);
    if (n < 0) return free(buf), NULL;
    if ((size_t)n < cap) {
      buf[n] = 0;
      for (int up = 0; up < 2; up++) { /* the executable's name, then its build directory */
        char *slash = strrchr(buf, '/');
        if (!slash) return free(buf), NULL;
        slash[slash == buf] = 0; /* (a program at /x: "/") */
      }
      return buf;
    }
    free(buf);
    cap *= 2;
  }
}

int rt_program_plan_check(const char *plan_hash, char *err, size_t errlen) {
  char *dir = program_dir();
  if (!dir) return 0; /* nowhere to look: nothing to disagree with */
  char *path = rt_pathf("%s%splan.json", dir, strcmp(dir, "/") == 0 ? "" : "/");
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  int st = 0;
  if (fd >= 0) {
    uint64_t h = RT_FNV_SEED;
    char buf[65536];
    ssize_t got;
    while ((got = read(fd, buf, sizeof buf)) > 0) h = rt_fnv1a(h, buf, (size_t)got);
    if (got < 0) { /* a directory named plan.json, or a read error: it is not the program's plan */
      snprintf(err, errlen, "%s: %s; expected the plan.json mtc compile wrote with this program (plan %s): mtc "
               "compile SPEC -o %s again, then mtc build %s", path, strerror(errno), plan_hash, dir, dir);
      st = -1;
    } else {
      char have[17];
      snprintf(have, sizeof have, "%016llx", (unsigned long long)h);
      if (strcmp(have, plan_hash) != 0) {
        snprintf(err, errlen, "this program was compiled from plan %s, but %s is plan %s: the program is stale (%s "
                 "was compiled again: rebuild it with `mtc build %s`) or plan.json was edited (mtc build then "
                 "refuses it: `mtc compile SPEC -o %s` writes both again); expected the plan.json of this program",
                 plan_hash, path, have, dir, dir, dir);
        st = -1;
      }
    }
    close(fd);
  }
  free(path), free(dir);
  return st;
}
