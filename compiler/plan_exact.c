/* plan_exact.c — the chosen plan's memory items made the program's own bytes. The search sizes
 * items by formulas (plan.c build_items: fast, every candidate); the winner's program is then
 * laid out by the emitter (em_init), each item the program holds in its arenas takes exactly
 * the bytes of its buffers there (em_buf_bytes: aliases inside their target; the host arena's
 * offloaded boundaries and Muon's host scratch likewise), and the tiers are
 * packed again: plan.json, plan.txt and memory.svg report what the program allocates. Items the
 * program does not allocate (reserves, the cuda runtime's scratch, host copies) keep their
 * formulas. */
#include <stdint.h>

#include "emit.h"

void plan_exact(Mem *m, Plan *p) {
  if (!p->ncandidates || !p->placement || !em_implements(p->md->spec)) return;
  Mem scratch = {0};
  Em e;
  em_init(&e, &scratch, p);
  Candidate *c = &p->best;
  MemMap at = {0};
  for (int j = 0; j < c->nitems; j++) mem_map_put(&scratch, &at, NULL, c->items[j].name, (void *)(uintptr_t)(j + 1));
  int64_t *bytes = mem_array(&scratch, (size_t)c->nitems + 1, sizeof *bytes);
  bool *held = mem_array(&scratch, (size_t)c->nitems + 1, sizeof *held);
  for (int i = 0; i < e.nbufs; i++) {
    const EmBuf *b = &e.bufs[i];
    uintptr_t k = b->item ? (uintptr_t)mem_map_get(&at, NULL, b->item) : 0;
    if (!k || b->alias) continue; /* (no item: test_plan_items fails it; an alias: its target's bytes) */
    bytes[k - 1] += em_buf_bytes(b);
    held[k - 1] = true;
  }
  /* the host arena's buffers that are not EmBufs (em_place places them): the boundaries waiting
   * for the backward (2 B x tokens x hidden each), Muon's host scratch (fp32) */
  int64_t nb = e.offload && e.L >= 3 ? e.L - 2 : 0;
  for (int64_t l = 0; l <= nb + 1; l++) {
    const char *name = l < nb ? mem_printf(&scratch, "activations.boundary[%lld]", (long long)l)
                       : l == nb ? "workspace.muon_exchange_host" : "workspace.newton_schulz";
    int64_t b = l < nb ? 2 * e.N * e.C : l == nb ? 4 * e.muon_host : 4 * e.muon_step;
    uintptr_t k = (uintptr_t)mem_map_get(&at, NULL, name);
    if (k && c->items[k - 1].tier == TIER_HOST) bytes[k - 1] = b, held[k - 1] = true;
  }
  for (int j = 0; j < c->nitems; j++)
    if (held[j]) c->items[j].bytes = bytes[j], c->items[j].exact = true;
  mem_free(&scratch);
  plan_pack(m, p->md, c);
}
