/* output.c — how mtc writes files: every compile output atomically (PATH.tmp renamed over a
 * regular file or a missing path, never a device), into a directory that is empty or mtc's
 * own; the program's identity with its plan.json; and one escaper per language that user text
 * (the spec's file name) enters: C string literals, comment lines (C, CUDA, CMake, shell). HTML
 * and SVG text goes through emit_escape (emit_svg.c), JSON through jansson. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mtc.h"
#include "mtrt_ckpt.h"

const char *const out_program_files[] = {"step.h", "step.c", "train.c", "kernels.cu", "CMakeLists.txt",
                                         "launch.sbatch", "program.sum", NULL};

/* A batch (out_batch_begin .. out_batch_end): the files closed, each PATH.tmp complete and
 * synced, waiting to be renamed over PATH all together. */
static struct {
  bool on, failed;
  int n, cap;
  char **tmp, **path;
} batch;

void out_batch_begin(void) {
  batch.on = true, batch.failed = false, batch.n = 0;
}

bool out_batch_failed(void) {
  return batch.failed;
}

bool out_batch_end(Diag *d, bool commit) {
  char err[4400];
  bool ok = true;
  for (int i = 0; i < batch.n; i++) {
    if (commit && ok && rt_replace_commit(batch.tmp[i], batch.path[i], err, sizeof err) != 0)
      ok = diag_error(d, (Loc){0}, "cannot write %s", err);
    else if (!commit || !ok)
      unlink(batch.tmp[i]);
    free(batch.tmp[i]), free(batch.path[i]);
  }
  free(batch.tmp), free(batch.path);
  batch.tmp = batch.path = NULL;
  batch.on = false, batch.n = batch.cap = 0;
  return commit && ok;
}

FILE *out_open(Diag *d, OutFile *o, const char *path) {
  char err[4400];
  o->path = path;
  o->f = NULL;
  int fd = rt_replace_begin(path, &o->tmp, err, sizeof err);
  if (fd < 0) return batch.failed = true, diag_error(d, (Loc){0}, "cannot write %s", err), NULL;
  if (!(o->f = fdopen(fd, "w"))) {
    batch.failed = true;
    diag_error(d, (Loc){0}, "cannot write %s: %s", o->tmp, strerror(errno));
    close(fd), unlink(o->tmp);
    free(o->tmp), o->tmp = NULL;
  }
  return o->f;
}

static bool closed(Diag *d, OutFile *o);

bool out_close(Diag *d, OutFile *o) {
  bool ok = closed(d, o);
  free(o->tmp), o->tmp = NULL;
  return ok;
}

/* out_close's work (o->tmp freed by the caller). */
static bool closed(Diag *d, OutFile *o) {
  char err[4400];
  bool ok = !ferror(o->f) && fflush(o->f) == 0 && fsync(fileno(o->f)) == 0;
  int e = errno;
  ok = fclose(o->f) == 0 && ok;
  o->f = NULL;
  if (!ok) {
    unlink(o->tmp);
    batch.failed = true;
    return diag_error(d, (Loc){0}, "error writing '%s': %s; %s is unchanged", o->path, strerror(e ? e : EIO), o->path);
  }
  if (batch.on) { /* renamed by out_batch_end, with the others */
    if (batch.n == batch.cap) {
      int cap = batch.cap ? 2 * batch.cap : 16;
      char **t = realloc(batch.tmp, sizeof *t * (size_t)cap), **p = t ? realloc(batch.path, sizeof *p * (size_t)cap) : NULL;
      if (t) batch.tmp = t;
      if (p) batch.path = p;
      if (!t || !p) return unlink(o->tmp), batch.failed = true, diag_error(d, (Loc){0}, "out of memory");
      batch.cap = cap;
    }
    batch.tmp[batch.n] = strdup(o->tmp), batch.path[batch.n] = strdup(o->path);
    if (!batch.tmp[batch.n] || !batch.path[batch.n]) {
      free(batch.tmp[batch.n]), free(batch.path[batch.n]), unlink(o->tmp), batch.failed = true;
      return diag_error(d, (Loc){0}, "out of memory");
    }
    batch.n++;
    return true;
  }
  if (rt_replace_commit(o->tmp, o->path, err, sizeof err) != 0) return diag_error(d, (Loc){0}, "cannot write %s", err);
  return true;
}

/* Whether path is a plan.json mtc compile wrote: a JSON object with model and feasible, and no
 * search.seconds (which `mtc plan --json` adds and compile leaves out, so that a plan.json a user
 * saved from mtc plan does not make a directory of theirs look like compile's). */
static bool mtc_plan_json(const char *path) {
  json_t *j = json_load_file(path, 0, NULL);
  bool ours = json_is_object(json_object_get(j, "model")) && json_is_boolean(json_object_get(j, "feasible")) &&
              !json_object_get(json_object_get(j, "search"), "seconds");
  json_decref(j);
  return ours;
}

/* Whether dir/name, when present, is a file mtc wrote: its first 512 bytes carry the
 * "regenerate with `mtc compile`" line every generated program file starts with. */
static bool mtc_program_file(const char *dir, const char *name) {
  char *path = rt_pathf("%s/%s", dir, name), head[513] = "";
  struct stat st;
  int got = lstat(path, &st);
  FILE *f = got == 0 && S_ISREG(st.st_mode) ? fopen(path, "rb") : NULL;
  free(path);
  if (got != 0) return errno == ENOENT;
  if (!S_ISREG(st.st_mode)) return true; /* not opened: the atomic replace refuses a FIFO, device or link by name */
  if (!f) return false;
  size_t n = fread(head, 1, sizeof head - 1, f);
  fclose(f);
  head[n] = 0;
  return strstr(head, "regenerate with `mtc compile`") != NULL;
}

/* Whether name is NAME.tmp of a compile output: what a compile killed before its renames leaves. */
static bool compile_leftover(const char *name) {
  static const char *const outputs[] = {"plan.json", "plan.txt", "memory.svg", "timeline.json", "report.html"};
  size_t n = strlen(name);
  if (n < 5 || strcmp(name + n - 4, ".tmp") != 0) return false;
  for (size_t i = 0; i < sizeof outputs / sizeof *outputs; i++)
    if (strlen(outputs[i]) == n - 4 && strncmp(name, outputs[i], n - 4) == 0) return true;
  for (int i = 0; out_program_files[i]; i++)
    if (strlen(out_program_files[i]) == n - 4 && strncmp(name, out_program_files[i], n - 4) == 0) return true;
  return false;
}

bool out_dir_prepare(Diag *d, const char *dir, bool force) {
  char first[256] = "";
  struct stat ds;
  if (stat(dir, &ds) == 0 && !S_ISDIR(ds.st_mode))
    return diag_error(d, (Loc){0}, "-o %s: %s, not a directory; expected a directory for the compile's files (new, "
                      "empty, or an earlier compile's): give another -o", out_shown(d->mem, dir),
                      S_ISREG(ds.st_mode) ? "a regular file" : S_ISCHR(ds.st_mode) ? "a character device" : "a file");
  DIR *dd = opendir(dir);
  if (!dd) return true; /* missing: make_dirs creates it; anything else fails there */
  for (struct dirent *de; (de = readdir(dd));)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && !compile_leftover(de->d_name)) {
      snprintf(first, sizeof first, "%s", de->d_name);
      break;
    }
  closedir(dd);
  char *path = rt_pathf("%s/plan.json", dir);
  static const char *const program[] = {"CMakeLists.txt", "train.c", "step.c", "step.h", "kernels.cu", "launch.sbatch"};
  bool ours = mtc_plan_json(path);
  free(path);
  for (size_t i = 0; ours && i < sizeof program / sizeof *program; i++)
    if (!mtc_program_file(dir, program[i])) ours = false, snprintf(first, sizeof first, "%s", program[i]);
  char why[8800];
  path = rt_pathf("%s/program.sum", dir);
  struct stat ps;
  bool has_sum = lstat(path, &ps) == 0;
  free(path);
  if (ours && !force && has_sum && !out_program_unedited(dir, why, sizeof why))
    return diag_error(d, (Loc){0}, "%s; compiling would replace the edited file: expected --force to replace it "
                      "(keep a copy of your edits first), or another -o directory", why);
  if (!first[0] || force || ours) return true;
  return diag_error(d, (Loc){0}, "%s is not empty (it holds %s, which mtc compile did not write): it is not a "
                    "directory mtc compile wrote, and compiling would replace its files; expected an empty or "
                    "new directory for -o (or --force to write there anyway)", dir, first);
}

/* Removes dir/name when it is a regular file (never a link) that mtc compile wrote (its header
 * line): 1 when removed. */
static int remove_file(const char *dir, const char *name) {
  char *path = rt_pathf("%s/%s", dir, name);
  struct stat st;
  int removed = lstat(path, &st) == 0 && S_ISREG(st.st_mode) && mtc_program_file(dir, name) && unlink(path) == 0;
  free(path);
  return removed;
}

char *out_build_tree_of(const char *bdir) {
  char *path = rt_pathf("%s/CMakeCache.txt", bdir), *line = NULL, *found = NULL;
  FILE *f = fopen(path, "r");
  free(path);
  if (!f) return NULL;
  static const char key[] = "CMAKE_CACHEFILE_DIR:INTERNAL=";
  size_t cap = 0;
  while (!found && getline(&line, &cap, f) >= 0)
    if (strncmp(line, key, sizeof key - 1) == 0) {
      line[strcspn(line, "\r\n")] = 0;
      found = rt_pathf("%s", line + sizeof key - 1);
    }
  free(line);
  fclose(f);
  return found;
}

/* Removes dir/b/train, the program mtc build made, when dir/b is a real directory (never a link)
 * holding a CMakeCache.txt made for dir/b itself and train is a regular file: 1 when removed. */
static int remove_built(const char *dir, const char *b) {
  char *bdir = rt_pathf("%s/%s", dir, b), *real_b = NULL, *cached = NULL, *real_c = NULL, *path = NULL;
  struct stat st;
  int removed = 0;
  if (lstat(bdir, &st) == 0 && S_ISDIR(st.st_mode) && (real_b = realpath(bdir, NULL))) {
    path = rt_pathf("%s/CMakeCache.txt", bdir);
    bool made_here = lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (cached = out_build_tree_of(bdir)) &&
                     (real_c = realpath(cached, NULL)) && strcmp(real_b, real_c) == 0;
    free(path);
    path = rt_pathf("%s/train", bdir);
    removed = made_here && lstat(path, &st) == 0 && S_ISREG(st.st_mode) && unlink(path) == 0;
  }
  free(bdir), free(real_b), free(cached), free(real_c), free(path);
  return removed;
}

int out_remove_built(const char *dir) {
  int n = 0;
  DIR *dd = opendir(dir);
  for (struct dirent *de; dd && (de = readdir(dd));)
    if (strncmp(de->d_name, "build", 5) == 0) n += remove_built(dir, de->d_name);
  if (dd) closedir(dd);
  return n;
}

int out_remove_program(const char *dir) {
  int n = 0;
  for (int i = 0; out_program_files[i]; i++) n += remove_file(dir, out_program_files[i]);
  return n + out_remove_built(dir); /* and the programs mtc build made of them */
}

bool out_hash_file(const char *path, char buf[17]) {
  struct stat st; /* never opened unless a regular file: a FIFO would block */
  if (stat(path, &st) != 0) return false;
  if (!S_ISREG(st.st_mode)) return errno = EINVAL, false;
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  uint64_t h = 14695981039346656037ull; /* FNV-1a's offset basis; the runtime's rt_fnv1a */
  char chunk[65536];
  for (size_t n; (n = fread(chunk, 1, sizeof chunk, f)) > 0;) h = rt_fnv1a(h, chunk, n);
  bool ok = !ferror(f);
  fclose(f);
  snprintf(buf, 17, "%016llx", (unsigned long long)h);
  return ok;
}

char *out_c_string(Mem *m, const char *s) {
  size_t n = strlen(s);
  char *o = mem_array(m, 4 * n + 1, 1), *p = o;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') *p++ = '\\', *p++ = (char)c;
    else if (c == '?') *p++ = '\\', *p++ = '?'; /* no trigraphs */
    else if (c < 0x20 || c == 0x7f) p += sprintf(p, "\\%03o", c);
    else *p++ = (char)c;
  }
  *p = 0;
  return o;
}

char *out_shown(Mem *m, const char *dir) {
  size_t n = 4 * strlen(dir) + 8;
  char *s = mem_alloc(m, n);
  out_text(s, n, dir, false);
  return s;
}

bool out_cmake_path_ok(Diag *d, const char *what, const char *dir) {
  char *cwd = dir[0] == '/' ? NULL : getcwd(NULL, 0);
  const char *abs = cwd ? mem_printf(d->mem, "%s/%s", cwd, dir) : dir;
  free(cwd);
  const char *bad = strpbrk(abs, ";\\\""), *ctl = abs;
  while (*ctl && (unsigned char)*ctl >= 0x20 && *ctl != 0x7f) ctl++;
  if (!bad && *ctl) bad = ctl;
  if (!bad) return true;
  char c[8];
  out_text(c, sizeof c, (char[]){*bad, 0}, false);
  const char *why = *bad == ';' ? "which CMake reads as a list separator (the build would treat the name as two "
                                  "paths and write outside the directory)"
                                : "which CMake cannot take in a path";
  return diag_error(d, (Loc){0}, "%s: the path holds '%s', %s%s%s%s; expected a directory name without ';', '\\', "
                    "'\"' or control characters: %s", what, c, why, abs != dir ? " (its absolute path is " : "",
                    abs != dir ? out_shown(d->mem, abs) : "", abs != dir ? ")" : "",
                    strchr(what, ' ') ? "give another -o directory (nothing was written)"
                                      : "compile into a directory with a plain name (nothing was written)");
}

void out_text(char *dst, size_t n, const char *s, bool ascii) {
  size_t k = 0;
  for (; *s && k + 5 < n; s++) {
    unsigned char c = (unsigned char)*s;
    if (c < 0x20 || c == 0x7f || (ascii && c >= 0x80)) k += (size_t)snprintf(dst + k, n - k, "\\%03o", c);
    else if (c == '\\') dst[k++] = '\\', dst[k++] = '\\';
    else dst[k++] = (char)c;
  }
  if (n) dst[k < n ? k : n - 1] = 0;
}

char *out_comment(Mem *m, const char *s) {
  size_t n = strlen(s);
  char *o = mem_array(m, 4 * n + 1, 1), *p = o;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c < 0x20 || c == 0x7f || c == '\\' || (c == '?' && s[1] == '?')) /* no line break, splice or trigraph */
      p += sprintf(p, "\\%03o", c);
    else if (c == '*' && s[1] == '/') *p++ = '*', *p++ = '\\';            /* no end of a C comment */
    else *p++ = (char)c;
  }
  *p = 0;
  return o;
}

/* The value of `#define NAME "VALUE"` in a header (at most n - 1 bytes), or "" when absent. */
static void define_value(const char *path, const char *name, char *out, size_t n) {
  char line[512], key[128];
  snprintf(key, sizeof key, "#define %s \"", name);
  out[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, strlen(key)) == 0) {
      const char *v = line + strlen(key), *q = strchr(v, '"');
      if (q && (size_t)(q - v) < n) memcpy(out, v, (size_t)(q - v)), out[q - v] = 0;
      break;
    }
  fclose(f);
}

bool out_define_int(const char *path, const char *name, long long *v) {
  char line[512], key[128];
  int n = snprintf(key, sizeof key, "#define %s ", name);
  bool found = false;
  FILE *f = fopen(path, "r");
  if (!f) return false;
  while (!found && fgets(line, sizeof line, f))
    found = strncmp(line, key, (size_t)n) == 0 && sscanf(line + n, "%lld", v) == 1;
  fclose(f);
  return found;
}

static bool matches(const char *dir, const char *step_h, const char *plan, char *err, size_t n);

bool out_program_matches(const char *dir, char *err, size_t n) {
  char *step_h = rt_pathf("%s/step.h", dir), *plan = rt_pathf("%s/plan.json", dir);
  bool ok = matches(dir, step_h, plan, err, n);
  free(step_h), free(plan);
  return ok;
}

/* out_program_matches's work, with the paths of step.h and plan.json. */
static bool matches(const char *dir, const char *step_h, const char *plan, char *err, size_t n) {
  char want[17], have[64], model[128];
  if (!out_hash_file(plan, want))
    return snprintf(err, n, "%s: %s; expected the plan.json mtc compile wrote with the program", plan,
                    strerror(errno)), false;
  define_value(step_h, "PLAN_HASH", have, sizeof have);
  if (strcmp(have, want) == 0) return true;
  define_value(step_h, "MODEL_NAME", model, sizeof model);
  json_t *j = json_load_file(plan, 0, NULL);
  const char *pname = json_string_value(json_object_get(j, "name"));
  snprintf(err, n, "%s is not the program of %s (step.h: model '%s', plan %s; plan.json: model '%s', plan %s): the "
           "files come from different compiles, or one was edited; expected the files of one `mtc compile`: run "
           "mtc compile SPEC -o %s again", step_h, plan, model[0] ? model : "?", have[0] ? have : "none",
           pname ? pname : "?", want, dir);
  json_decref(j);
  return false;
}

bool out_write_program_sum(Diag *d, const char *dir) {
  OutFile o;
  char *path = mem_printf(d->mem, "%s/program.sum", dir), hash[17];
  FILE *f = out_open(d, &o, path);
  if (!f) return false;
  fputs("# program.sum - written by mtc compile; regenerate with `mtc compile`: the FNV-1a hash of each program\n"
        "# file as compile wrote it, which mtc build checks (an edited file is refused: --allow-edits)\n", f);
  for (int i = 0; out_program_files[i + 1]; i++) { /* all but program.sum itself, from their .tmp of this batch */
    char *tmp = mem_printf(d->mem, "%s/%s.tmp", dir, out_program_files[i]);
    if (!out_hash_file(tmp, hash)) {
      fclose(o.f), unlink(o.tmp), free(o.tmp);
      return diag_error(d, (Loc){0}, "cannot read back %s: %s", tmp, strerror(errno));
    }
    fprintf(f, "%s  %s\n", hash, out_program_files[i]);
  }
  return out_close(d, &o);
}

static bool unedited(const char *dir, const char *path, char *err, size_t n);

bool out_program_unedited(const char *dir, char *err, size_t n) {
  char *path = rt_pathf("%s/program.sum", dir);
  bool ok = unedited(dir, path, err, n);
  free(path);
  return ok;
}

/* out_program_unedited's work, with path its program.sum. */
static bool unedited(const char *dir, const char *path, char *err, size_t n) {
  char line[512];
  FILE *f = fopen(path, "r");
  if (!f) return snprintf(err, n, "%s: %s; expected the program.sum mtc compile writes with the program (a program "
                          "from an older mtc: run mtc compile again)", path, strerror(errno)), false;
  bool ok = true, listed[16] = {false};
  int seen = 0;
  while (ok && fgets(line, sizeof line, f)) {
    char want[17], name[256], have[17];
    if (line[0] == '#') continue;
    if (sscanf(line, "%16s %255s", want, name) != 2) continue;
    seen++;
    for (int i = 0; out_program_files[i + 1]; i++)
      if (strcmp(name, out_program_files[i]) == 0) listed[i] = true;
    char *file = rt_pathf("%s/%s", dir, name);
    struct stat st;
    if (lstat(file, &st) == 0 && !S_ISREG(st.st_mode)) { /* a FIFO, link, ...: refused by name where written */
      free(file);
      continue;
    }
    if (!strchr(name, '/') && (!out_hash_file(file, have) || strcmp(have, want) != 0))
      ok = false, snprintf(err, n, "%s was changed after mtc compile wrote it (program.sum: %s, now %s): the program "
                           "may no longer be its plan's; expected the files of one `mtc compile`: run it again, or "
                           "mtc build %s --allow-edits to build the edited program anyway", file, want,
                           access(file, F_OK) == 0 ? have : "missing", dir);
    free(file);
  }
  fclose(f);
  if (ok && seen == 0) ok = false, snprintf(err, n, "%s lists no file; expected the one mtc compile writes", path);
  for (int i = 0; ok && out_program_files[i + 1]; i++) /* each program file listed (program.sum last) */
    if (!listed[i])
      ok = false, snprintf(err, n, "%s does not list %s: it was edited; expected the program.sum mtc compile wrote "
                           "(run mtc compile again, or mtc build %s --allow-edits)", path, out_program_files[i], dir);
  return ok;
}
