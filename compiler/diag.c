/* diag.c — sources and diagnostics: "FILE:LINE:COL: error: ...", the line and a caret. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

const Source *diag_source(Mem *m, const char *name, const char *text, size_t len) {
  Source *s = mem_alloc(m, sizeof *s);
  s->name = mem_strdup(m, name);
  s->text = mem_strndup(m, text, len);
  s->len = len;
  return s;
}

const Source *diag_read_source(Mem *m, Diag *d, const char *path, size_t limit) {
  Loc none = {0};
  FILE *f = fopen(path, "rb");
  if (!f) {
    diag_error(d, none, "cannot open '%s': %s; expected a readable spec file", path,
               strerror(errno));
    return NULL;
  }
  char *buf = mem_alloc(m, limit + 1);
  size_t n = fread(buf, 1, limit + 1, f);
  bool bad = ferror(f);
  fclose(f);
  if (bad) {
    diag_error(d, none, "cannot read '%s'; expected a readable regular file", path);
    return NULL;
  }
  if (n > limit) {
    diag_error(d, none, "'%s' is larger than %zu bytes; a spec is a small YAML file", path,
               limit);
    return NULL;
  }
  Source *s = mem_alloc(m, sizeof *s);
  s->name = mem_strdup(m, path);
  s->text = buf;
  s->len = n;
  return s;
}

/* Appends line `line` of src and a caret under column col (columns count characters, as
 * libyaml's marks do; tabs are kept so the caret lines up in a terminal). */
static char *excerpt(Mem *m, const Source *src, int line, int col) {
  const char *p = src->text, *end = src->text + src->len;
  for (int i = 0; i < line && p < end; i++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    p = nl ? nl + 1 : end;
  }
  const char *eol = p;
  while (eol < end && *eol != '\n' && *eol != '\r') eol++;
  if (eol - p > 200) eol = p + 200;
  /* caret padding: copy tabs, spaces for everything else; UTF-8 continuation bytes skipped */
  char *pad = mem_alloc(m, (size_t)col + 1);
  int k = 0;
  const char *q = p;
  for (int c = 0; c < col && q < eol; q++) {
    if (((unsigned char)*q & 0xC0) == 0x80) continue;
    pad[k++] = *q == '\t' ? '\t' : ' ';
    c++;
  }
  /* control bytes (binary input) print as '?' so the terminal stays sane */
  char *shown = mem_strndup(m, p, (size_t)(eol - p));
  for (char *c = shown; *c; c++)
    if ((unsigned char)*c < 0x20 && *c != '\t') *c = '?';
  return mem_printf(m, "  %s\n  %.*s^\n", shown, k, pad);
}

bool diag_error(Diag *d, Loc loc, const char *fmt, ...) {
  if (d->msg) return false;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *what = mem_alloc(d->mem, (size_t)(n > 0 ? n : 0) + 1);
  va_start(ap, fmt);
  vsnprintf(what, (size_t)(n > 0 ? n : 0) + 1, fmt, ap);
  va_end(ap);
  if (!loc.src) {
    d->msg = mem_printf(d->mem, "mtc: error: %s\n", what);
    return false;
  }
  d->msg = mem_printf(d->mem, "%s:%d:%d: error: %s\n%s", loc.src->name, loc.line + 1,
                      loc.col + 1, what, excerpt(d->mem, loc.src, loc.line, loc.col));
  return false;
}
