/* hier_init.c — the hierarchical MoE exchange's communicators and host arrays (mtrt_hier.h),
 * shared by both backends; the tables are hier_plan.c's, the rows move in comm/moe_hier.c (MPI, the
 * cpu backend) or cuda/moe_hier.c (NCCL). */
#include <stdlib.h>
#include <string.h>

#include "mtrt_hier.h"

#define MPI_CHECK(call) RT_MPI_CHECK(call)

/* The arrays' sizes in bytes, one table for rt_hier_init and rt_hier_bytes. */
enum { H_SLOT, H_MARK, H_UTOK, H_CU, H_CSLOT, H_CW, H_HS, H_HR, H_M8, H_URD, H_CRD, H_RDESC, H_RW, H_SW, H_HRD,
       H_FROMD, H_OW, H_REQ, H_N };
static void sizes(int ep, int g, int N, int K, int64_t cap, int64_t st, size_t z[H_N]) {
  size_t nodes = (size_t)(ep / g), nk = (size_t)N * (size_t)K, per = (size_t)K < nodes ? (size_t)K : nodes;
  z[H_SLOT] = nk * sizeof(int32_t), z[H_MARK] = (size_t)N * sizeof(int32_t);
  z[H_UTOK] = (size_t)N * per * sizeof(int32_t), z[H_CU] = nk * sizeof(int32_t), z[H_CSLOT] = nk * sizeof(int32_t);
  z[H_CW] = nk * sizeof(real);
  z[H_HS] = z[H_HR] = nodes * (size_t)(g + 1) * sizeof(int), z[H_M8] = 8 * nodes * sizeof(int);
  z[H_URD] = z[H_CRD] = (nodes + 1) * sizeof(int64_t);
  z[H_RDESC] = (size_t)g * (size_t)cap * sizeof(int32_t), z[H_RW] = (size_t)g * (size_t)cap * sizeof(real);
  z[H_SW] = (size_t)cap * sizeof(real), z[H_HRD] = (size_t)ep * sizeof(int64_t);
  z[H_FROMD] = (size_t)(g + 1) * sizeof(int64_t), z[H_OW] = (size_t)cap * sizeof(real);
  z[H_REQ] = (size_t)(cap / st + 2) * sizeof(MPI_Request);
}

size_t rt_hier_bytes(int ep, int g, int N, int K, int64_t cap, int64_t st) {
  size_t z[H_N], n = 0;
  sizes(ep, g, N, K, cap, st, z);
  for (int i = 0; i < H_N; i++) n += z[i];
  return n;
}

int rt_hier_init(RtHier *h, MPI_Comm ep_comm, int ep, int me, int g, int N, int K, int64_t cap, int64_t st) {
  memset(h, 0, sizeof *h);
  if (g < 1 || ep < g || ep % g || N < 1 || K < 1 || cap < 1 || st < 1 || me < 0 || me >= ep) return -1;
  h->ep = ep, h->g = g, h->nodes = ep / g, h->node = me / g, h->li = me % g, h->N = N, h->K = K, h->cap = cap;
  h->st = st;
  size_t z[H_N];
  sizes(ep, g, N, K, cap, st, z);
  void **p[H_N] = {(void **)&h->slot, (void **)&h->mark, (void **)&h->utok, (void **)&h->cu, (void **)&h->cslot,
                   (void **)&h->cw, (void **)&h->hs, (void **)&h->hr, (void **)&h->m8, (void **)&h->urd,
                   (void **)&h->crd, (void **)&h->rdesc, (void **)&h->rw, (void **)&h->sw, (void **)&h->hrd,
                   (void **)&h->fromd, (void **)&h->ow, (void **)&h->req}; /* ORDER H_ */
  for (int i = 0; i < H_N; i++)
    if (!(*p[i] = calloc(1, z[i] ? z[i] : 1))) {
      rt_hier_free(h);
      return -1;
    }
  for (int t = 0; t < N; t++) h->mark[t] = -1;
  MPI_CHECK(MPI_Comm_split(ep_comm, h->node, h->li, &h->node_comm));
  MPI_CHECK(MPI_Comm_split(ep_comm, h->li, h->node, &h->cross_comm));
  return 0;
}

void rt_hier_free(RtHier *h) {
  void *p[] = {h->slot, h->mark, h->utok, h->cu, h->cslot, h->cw, h->hs, h->hr, h->m8, h->urd, h->crd, h->rdesc,
               h->rw, h->sw, h->hrd, h->fromd, h->ow, h->req};
  for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
  if (h->node_comm) MPI_Comm_free(&h->node_comm);
  if (h->cross_comm) MPI_Comm_free(&h->cross_comm);
  memset(h, 0, sizeof *h);
}


size_t rt_hier_cuda_bytes(int ep, int g, int N, int K, int64_t cap, int64_t st, size_t *host) {
  size_t nodes = (size_t)(ep / g), nk = (size_t)N * (size_t)K, per = (size_t)K < nodes ? (size_t)K : nodes,
         relay = 5 * (size_t)g * (size_t)cap + 1, chunks = (size_t)g * (size_t)(cap / st + 1) + 1,
         wide = nodes > (size_t)g ? nodes : (size_t)g;
  *host = 4 * (relay + (size_t)N * nodes + nk + (size_t)cap + chunks) + 8 * (4 * wide + 2 * ((size_t)g + 1));
  return 4 * ((size_t)N * per + relay + 2 * nk);
}
