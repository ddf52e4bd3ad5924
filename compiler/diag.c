/* diag.c — sources and diagnostics: "FILE:LINE:COL: error: ...", the line and a caret. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mtc.h"

const Source *diag_source(Mem *m, const char *name, const char *text, size_t len) {
  Source *s = mem_alloc(m, sizeof *s);
  s->name = mem_strdup(m, name);
  s->text = mem_strndup(m, text, len);
  s->len = len;
  return s;
}

const Source *diag_read_source(Mem *m, Diag *d, const char *path, size_t limit, const char *what) {
  Loc none = {0};
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    diag_error(d, none, "cannot read '%s': it is not a regular file; expected %s", path, what);
    return NULL;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    diag_error(d, none, "cannot open '%s': %s; expected %s (a readable file)", path,
               strerror(errno), what);
    return NULL;
  }
  char *buf = mem_alloc(m, limit + 1);
  size_t n = fread(buf, 1, limit + 1, f);
  bool bad = ferror(f);
  int e = errno;
  fclose(f);
  if (bad) {
    diag_error(d, none, "cannot read '%s': %s; expected %s (a readable regular file)", path, strerror(e), what);
    return NULL;
  }
  if (n > limit) {
    diag_error(d, none, "'%s' is larger than %zu bytes; expected %s, a small file", path, limit, what);
    return NULL;
  }
  Source *s = mem_alloc(m, sizeof *s);
  s->name = mem_strdup(m, path);
  s->text = buf;
  s->len = n;
  return s;
}

int diag_line_break(const char *p, const char *end) {
  unsigned char c = (unsigned char)*p;
  if (c == '\n') return 1;
  if (c == '\r') return p + 1 < end && p[1] == '\n' ? 2 : 1;
  if (c == 0xC2 && p + 1 < end && (unsigned char)p[1] == 0x85) return 2; /* U+0085 */
  if (c == 0xE2 && p + 2 < end && (unsigned char)p[1] == 0x80 &&
      ((unsigned char)p[2] == 0xA8 || (unsigned char)p[2] == 0xA9)) return 3; /* U+2028/9 */
  return 0;
}

/* Appends line `line` of src and a caret under column col (columns count characters, as
 * libyaml's marks do; line breaks are libyaml's: LF, CR, CRLF, NEL, LS, PS). A long line is
 * shown as a window around the column. Control bytes print as '?'. */
static char *excerpt(Mem *m, const Source *src, int line, int col) {
  const char *p = src->text, *end = src->text + src->len;
  for (int i = 0; i < line && p < end;) {
    int br = diag_line_break(p, end);
    if (br) p += br, i++;
    else p++;
  }
  const char *eol = p;
  while (eol < end && !diag_line_break(eol, end)) eol++;
  int skip = col > 150 ? col - 100 : 0; /* characters left out before the window */
  const char *q = p;
  for (int c = 0; c < skip && q < eol; q++)
    if (((unsigned char)q[1] & 0xC0) != 0x80) c++;
  char *buf = mem_alloc(m, 2 * 200 + 8), *caret = mem_alloc(m, 220);
  int k = 0, kc = 0, c = skip;
  if (skip) memcpy(buf, "...", 3), k = 3, memcpy(caret, "   ", 3), kc = 3;
  for (; q < eol && k < 2 * 200; q++) {
    unsigned char ch = (unsigned char)*q;
    bool cont = (ch & 0xC0) == 0x80;
    buf[k++] = ch < 0x20 && ch != '\t' ? '?' : ch == 0x7f ? '?' : (char)ch;
    if (!cont && c < col && kc < 210) caret[kc++] = ch == '\t' ? '\t' : ' ', c++;
    if (!cont && c - skip > 180) break;
  }
  buf[k] = '\0';
  caret[kc] = '\0';
  return mem_printf(m, "  %s%s\n  %s^\n", buf, q < eol ? "..." : "", caret);
}

/* Control bytes in a message (from values the user wrote) print as '?'; long messages are
 * cut, so one error is one bounded line. */
static void sanitize(char *s) {
  size_t n = 0;
  for (char *c = s; *c; c++, n++) {
    if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    if (n == 600) {
      strcpy(c, "...");
      break;
    }
  }
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
  sanitize(what);
  if (!loc.src) {
    d->msg = mem_printf(d->mem, "mtc: error: %s\n", what);
    return false;
  }
  d->msg = mem_printf(d->mem, "%s:%d:%d: error: %s\n%s", loc.src->name, loc.line + 1,
                      loc.col + 1, what, excerpt(d->mem, loc.src, loc.line, loc.col));
  return false;
}
