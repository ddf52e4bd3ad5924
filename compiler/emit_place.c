/* emit_place.c — where the program's buffers are: every buffer but the state's at its plan item's
 * offset in its tier (em_place), the host tier's state block, offloaded boundaries and Muon's
 * scratch likewise (place_host). emit_layout.c registers the buffers; plan_exact.c gives their
 * items the program's bytes first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"

/* The host item named name of the best plan (NULL: none; at maps names to index + 1), checked
 * to hold bytes at an offset of whole 256 B (else an internal error: abort). */
static const MemItem *host_item(const Em *e, MemMap *at, const char *name, int64_t bytes) {
  uintptr_t k = (uintptr_t)mem_map_get(at, NULL, name);
  const MemItem *it = k ? &e->p->best.items[k - 1] : NULL;
  if (!it || it->tier != TIER_HOST) return NULL;
  if (it->outside || it->bytes < bytes || it->offset % 256) {
    fprintf(stderr, "mtc: internal error: host item %s (%lld B at %lld) cannot hold the program's %lld B\n", name,
            (long long)it->bytes, (long long)it->offset, (long long)bytes);
    abort();
  }
  return it;
}

/* em_place's host tier: Em.host_span, hx, muon_host_at and muon_step_at from the plan's host
 * items (at: their names); the state block, when on the host, is the tier's first bytes. */
static void place_host(Em *e, MemMap *at) {
  const Candidate *c = &e->p->best;
  int64_t top = 0, state = 0;
  for (int j = 0; j < c->nitems; j++) {
    const MemItem *it = &c->items[j];
    if (it->tier != TIER_HOST || it->outside) continue;
    if (it->offset + it->bytes > top) top = it->offset + it->bytes;
    if (it->state) state += it->bytes;
  }
  int64_t groups = 0; /* the program's state arena: what em_layout registered in EM_STATE */
  for (int i = 0; i < e->nbufs; i++)
    if (e->bufs[i].arena == EM_STATE) groups += em_buf_bytes(&e->bufs[i]);
  if (e->state_host && state != groups) {
    fprintf(stderr, "mtc: internal error: the plan's host state block is %lld B, the program's %lld B\n",
            (long long)state, (long long)groups);
    abort();
  }
  const int64_t nb = e->offload && e->L >= 3 ? e->L - 2 : 0, bytes = 2 * e->N * e->C;
  e->hx = mem_array(e->m, (size_t)nb + 1, sizeof *e->hx);
  for (int64_t l = 0; l < nb; l++) {
    const MemItem *it = host_item(e, at, mem_printf(e->m, "activations.boundary[%lld]", (long long)l), bytes);
    int64_t byte = it ? it->offset : (top + 255) / 256 * 256; /* (NVMe: in host memory past the plan's items) */
    if (!it) top = byte + bytes;
    e->hx[l] = byte / 2;
  }
  const MemItem *x = host_item(e, at, "workspace.muon_exchange_host", 4 * e->muon_host);
  const MemItem *w = host_item(e, at, "workspace.newton_schulz", 4 * e->muon_step);
  e->muon_host_at = x ? x->offset / 2 : 0, e->muon_step_at = w ? w->offset / 2 : 0;
  e->host_span = (top + 1) / 2;
}

void em_place(Em *e) {
  const Candidate *c = &e->p->best;
  MemMap at = {0};
  int64_t base = 0, top = 0;
  for (int j = 0; j < c->nitems; j++) {
    const MemItem *it = &c->items[j];
    mem_map_put(e->m, &at, NULL, it->name, (void *)(uintptr_t)(j + 1));
    if (it->tier != TIER_HBM) continue;
    if (it->state && it->offset + it->bytes > base) base = it->offset + it->bytes;
    if (!it->state && !it->outside && it->offset + it->bytes > top) top = it->offset + it->bytes;
  }
  int64_t *inner = mem_array(e->m, (size_t)c->nitems + 1, sizeof *inner);
  for (int i = 0; i < e->nbufs; i++) {
    EmBuf *b = &e->bufs[i];
    if (b->arena == EM_STATE) continue;
    if (b->alias) { /* (its target is registered, so placed, before it) */
      const EmBuf *t = em_find_buf(e, b->alias);
      b->alias_at *= t->arena == EM_REAL ? 2 : 1;
      b->offset = t->offset + b->alias_at;
      continue;
    }
    uintptr_t k = b->item ? (uintptr_t)mem_map_get(&at, NULL, b->item) : 0;
    const MemItem *it = k ? &c->items[k - 1] : NULL;
    if (!it || it->tier != TIER_HBM || !it->exact) { /* (a plan without plan_exact's bytes, or a bug) */
      fprintf(stderr, "mtc: internal error: buffer %s has no HBM item of the plan's (%s)\n", b->name,
              b->item ? b->item : "none");
      abort();
    }
    int64_t byte = it->offset + inner[k - 1];
    inner[k - 1] += em_buf_bytes(b);
    if (byte < base || inner[k - 1] > it->bytes || (byte - base) % 4) {
      fprintf(stderr, "mtc: internal error: buffer %s at byte %lld outside its item %s\n", b->name, (long long)byte,
              it->name);
      abort();
    }
    b->offset = (byte - base) / 2;
  }
  e->base = base;
  place_host(e, &at);
  e->top[EM_REAL] = e->scratch[EM_REAL] = 0;
  e->top[EM_ACT] = top > base ? (top - base) / 2 : 0;
  e->scratch[EM_ACT] = e->top[EM_ACT];
}
