/* arena.c — one bump allocator per compile; every allocation freed at once by mem_free. And
 * MemMap, a hash map whose slots live in the arena. */
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

static void *alloc_raw(Mem *m, size_t size) {
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
  return p;
}

void *mem_alloc(Mem *m, size_t size) {
  void *p = alloc_raw(m, size);
  memset(p, 0, size);
  return p;
}

void *mem_array(Mem *m, size_t count, size_t size) {
  size_t n;
  if (__builtin_mul_overflow(count, size, &n)) oom(SIZE_MAX);
  return mem_alloc(m, n);
}

void *mem_array_raw(Mem *m, size_t count, size_t size) {
  size_t n;
  if (__builtin_mul_overflow(count, size, &n)) oom(SIZE_MAX);
  return alloc_raw(m, n);
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

/* ---- MemMap: open addressing with linear probing, grown at half full */

struct MemMapSlot {
  const void *owner;
  const char *key; /* NULL: empty */
  void *val;
};

static size_t map_hash(const void *owner, const char *key) {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)(uintptr_t)owner; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
  return (size_t)(h ^ (h >> 29));
}

static struct MemMapSlot *map_find(const MemMap *h, const void *owner, const char *key) {
  size_t i = map_hash(owner, key) & (h->cap - 1);
  while (h->slots[i].key && (h->slots[i].owner != owner || strcmp(h->slots[i].key, key) != 0))
    i = (i + 1) & (h->cap - 1);
  return &h->slots[i];
}

void *mem_map_get(const MemMap *h, const void *owner, const char *key) {
  return h->cap ? map_find(h, owner, key)->val : NULL;
}

void mem_map_put(Mem *m, MemMap *h, const void *owner, const char *key, void *val) {
  if (2 * (h->n + 1) > h->cap) { /* the old slots stay in the arena until mem_free */
    MemMap old = *h;
    h->cap = old.cap ? 2 * old.cap : 64;
    h->slots = mem_array(m, h->cap, sizeof *h->slots);
    h->n = 0;
    for (size_t i = 0; i < old.cap; i++)
      if (old.slots[i].key) *map_find(h, old.slots[i].owner, old.slots[i].key) = old.slots[i], h->n++;
  }
  struct MemMapSlot *s = map_find(h, owner, key);
  if (!s->key) h->n++;
  *s = (struct MemMapSlot){owner, key, val};
}
