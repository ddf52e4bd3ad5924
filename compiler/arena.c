/* arena.c — one bump allocator per compile; every allocation freed at once by mem_free. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

struct MemChunk {
  MemChunk *next;
  size_t used, cap;
  max_align_t data[]; /* cap bytes */
};

enum { CHUNK_MIN = 64 * 1024 };

static void oom(size_t n) {
  fprintf(stderr, "mtc: error: out of memory allocating %zu bytes\n", n);
  exit(EXIT_BAD_INPUT);
}

void *mem_alloc(Mem *m, size_t size) {
  size_t align = sizeof(max_align_t);
  if (size > SIZE_MAX - align) oom(size);
  size = (size + align - 1) / align * align;
  MemChunk *c = m->head;
  if (!c || c->cap - c->used < size) {
    size_t cap = size > CHUNK_MIN ? size : CHUNK_MIN;
    if (cap > SIZE_MAX - sizeof(MemChunk)) oom(size);
    c = malloc(sizeof(MemChunk) + cap);
    if (!c) oom(size);
    c->next = m->head;
    c->used = 0;
    c->cap = cap;
    m->head = c;
  }
  void *p = (char *)c->data + c->used;
  c->used += size;
  memset(p, 0, size);
  return p;
}

void *mem_array(Mem *m, size_t count, size_t size) {
  size_t n;
  if (__builtin_mul_overflow(count, size, &n)) oom(SIZE_MAX);
  return mem_alloc(m, n);
}

char *mem_strndup(Mem *m, const char *s, size_t n) {
  if (n == SIZE_MAX) oom(n);
  char *p = mem_alloc(m, n + 1);
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

char *mem_strdup(Mem *m, const char *s) { return mem_strndup(m, s, strlen(s)); }

char *mem_printf(Mem *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  char *p = mem_alloc(m, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(p, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return p;
}

void mem_reset(Mem *m) {
  if (m->head && !m->head->next) {
    m->head->used = 0;
    return;
  }
  size_t total = 0;
  for (MemChunk *c = m->head; c; c = c->next) total += c->cap;
  mem_free(m);
  if (!total) return;
  MemChunk *c = malloc(sizeof(MemChunk) + total);
  if (!c) oom(total);
  c->next = NULL, c->used = 0, c->cap = total;
  m->head = c;
}

void mem_free(Mem *m) {
  for (MemChunk *c = m->head, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  m->head = NULL;
}
