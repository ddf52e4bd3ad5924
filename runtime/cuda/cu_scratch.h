/*
 * cu_scratch.h — the sizes of the cuda runtime's own host scratch, in plain C (no CUDA header),
 * so that the planner's test (tests/test_runtime_scratch.c) computes them from the same constants
 * and functions the runtime allocates with (runtime/cuda/ops.c scratch_of): the plan's
 * workspace.runtime_host item (compiler/placement.c plan_runtime_host_scratch) must equal
 * cu_host_scratch byte for byte. Included by cu_internal.h.
 */
#ifndef CU_SCRATCH_H
#define CU_SCRATCH_H

#include <stddef.h>

enum { CU_OFF_CACHE = 64 }; /* offsets arrays whose host copies cu_offsets keeps */
enum { CU_SCALARS = 256 };  /* deferred scalars the readback buffer holds (of each kind) */
enum { CU_RING_SLOTS = 64, CU_RING_SLOT = 16 << 10 }; /* the pinned copy ring: slots of bytes */

/* The MoE scratch (device cu.moe, host cu.moe_host, the same layout) for E experts: the balancing
 * loss's statistics (2E floats) and the assignments per expert (E ints) next to each other, so that
 * one copy brings both to the host; an all-to-all round's regroup table (2 × E long long, stride E)
 * and its per-expert first rows (E + 1 ints). Returns the bytes; sets the byte offsets. */
static inline size_t cu_moe_layout(size_t E, size_t *cnt, size_t *tab, size_t *eoff) {
  *cnt = sizeof(float) * 2 * E;
  *tab = (*cnt + sizeof(int) * E + 7) / 8 * 8;
  *eoff = *tab + sizeof(long long) * 2 * E;
  return *eoff + sizeof(int) * (E + 1);
}

/* The copy ring's offset in the readback buffer: CU_RING_SLOTS slots of CU_RING_SLOT bytes after
 * the scalars, 256-byte aligned, that every other copy between pageable host memory and the
 * device passes through (ops.c cu_ring_upload, cu_ring_download). */
static inline size_t cu_ring_at(void) {
  return (sizeof(double) * CU_SCALARS + sizeof(float) * CU_SCALARS + 255) / 256 * 256;
}

/* The pinned readback buffer for E experts: CU_SCALARS doubles (the groups' Σ g²), CU_SCALARS
 * floats (the micro-batches' losses) at *loss, the copy ring (cu_ring_at), then a staging area for
 * a small copy down at *stage (the MoE scratch's size: cu_moe_layout). Returns the bytes. */
static inline size_t cu_rb_layout(size_t E, size_t *loss, size_t *stage) {
  size_t a, b, c;
  *loss = sizeof(double) * CU_SCALARS;
  *stage = cu_ring_at() + (size_t)CU_RING_SLOTS * CU_RING_SLOT;
  return *stage + cu_moe_layout(E, &a, &b, &c);
}

/* The runtime's host scratch for `experts` experts (0, dense, counts as 1), bytes: pageable, the
 * MoE scratch's mirror (*moe, cu_moe_layout) and CU_OFF_CACHE offsets arrays of experts + 1 ints
 * (*off); pinned, the readback buffer with the copy ring (*rb, cu_rb_layout). Returns their sum, what rt_cuda_setup
 * allocates on the host. */
static inline size_t cu_host_scratch(size_t experts, size_t *moe, size_t *off, size_t *rb) {
  size_t E = experts > 0 ? experts : 1, a, b, c;
  *moe = cu_moe_layout(E, &a, &b, &c);
  *off = sizeof(int) * CU_OFF_CACHE * (E + 1);
  *rb = cu_rb_layout(E, &a, &b);
  return *moe + *off + *rb;
}

#endif
