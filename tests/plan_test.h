/* plan_test.h — what test_plan.c, test_cost.c and test_search.c share: a spec's plan, a
 * candidate's memory items by name, and the arena invariants. Set src_dir (the source tree) in
 * main first. */
#ifndef MTC_PLAN_TEST_H
#define MTC_PLAN_TEST_H
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "mtc.h"

static const char *src_dir; /* the source tree: specs are read from it */

static inline Plan *plan(Mem *m, const char *spec, const char *const *sets, int n) {
  Diag d = {.mem = m};
  Spec *s = spec_load(m, &d, mem_printf(m, "%s/%s", src_dir, spec), NULL, 0, sets, n);
  Model *md = s ? model_build(m, &d, s) : NULL;
  if (!md) {
    fprintf(stderr, "unexpected error:\n%s", d.msg ? d.msg : "(none)\n");
    return NULL;
  }
  return plan_search(m, md);
}

static inline const MemItem *find(const Candidate *c, const char *name) {
  for (int i = 0; i < c->nitems; i++)
    if (strcmp(c->items[i].name, name) == 0) return &c->items[i];
  fprintf(stderr, "no memory item %s\n", name);
  return NULL;
}

static inline const MemItem *find_quiet(const Candidate *c, const char *name) {
  for (int i = 0; i < c->nitems; i++)
    if (strcmp(c->items[i].name, name) == 0) return &c->items[i];
  return NULL;
}

static inline int64_t bytes(const Candidate *c, const char *name) {
  const MemItem *x = find(c, name);
  return x ? x->bytes : -1;
}

static inline int64_t sum_cat(const Candidate *c, ItemCategory cat) {
  int64_t s = 0;
  for (int i = 0; i < c->nitems; i++)
    if (c->items[i].cat == cat) s += c->items[i].bytes;
  return s;
}

/* No two items of a tier share bytes while both are alive; all fit in the arena. */
static inline void check_arena(const Candidate *c) {
  int bad = 0;
  for (int i = 0; i < c->nitems; i++) {
    const MemItem *x = &c->items[i];
    if (x->offset < 0 || x->offset + x->bytes > c->arena[x->tier]) bad++;
    for (int j = i + 1; j < c->nitems; j++) {
      const MemItem *y = &c->items[j];
      bool time = x->start < y->end && y->start < x->end;
      bool space = x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes;
      if (x->tier == y->tier && time && space && x->bytes && y->bytes) bad++;
    }
  }
  CHECK_EQ(bad, 0);
  for (int t = 0; t < TIER__COUNT; t++) CHECK(c->arena[t] >= c->live_peak[t]);
}

#endif
