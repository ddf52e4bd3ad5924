/* test_runtime_scratch.c — the plan's workspace.runtime_host item is the cuda runtime's host
 * scratch byte for byte: compiler/placement.c's plan_runtime_host_scratch against
 * runtime/cuda/cu_scratch.h's cu_host_scratch (the constants and layouts runtime/cuda/ops.c's
 * scratch_of allocates with, included here, not copied) for 0 (dense), 1, 8, 384 and 65,536
 * experts; the parts by hand at 8 experts; and the item in the plans of a dense and MoE specs
 * (tiny-moe, llama-3.1-8b, europa-1t, europa-1t at 65,536 experts), in the host tier, alive the
 * whole step. Likewise the program's small host tables (data.host_tables: plan_host_tables against
 * rt_muon_counts_bytes and rt_a2a_bytes), and the hierarchical all-to-all's (moe.hier_tables against
 * rt_hier_bytes; moe.hier_index and moe.hier_index_host against rt_hier_cuda_bytes).
 *   usage: test_runtime_scratch SOURCE_DIR */
#include "../runtime/cuda/cu_scratch.h"
#include "check.h"
#include "mtc.h"
#include "mtrt_a2a.h"
#include "mtrt_hier.h"
#include "mtrt_train.h"
#include "plan_test.h"

/* The runtime's figure for E experts and the plan's agree; returns the runtime's. */
static int64_t both(int64_t E) {
  size_t moe, off, rb, total = cu_host_scratch((size_t)E, &moe, &off, &rb);
  CHECK_EQ(moe + off + rb, total);
  CHECK_EQ(plan_runtime_host_scratch(E), total);
  return (int64_t)total;
}

static void formula(void) {
  /* the constants the plan's formula is written with (plan.c's description, placement.c) */
  CHECK_EQ(CU_OFF_CACHE, 64);
  CHECK_EQ(CU_SCALARS, 256);
  CHECK_EQ(CU_RING_SLOTS, 64);
  CHECK_EQ(CU_RING_SLOT, 16 << 10);
  CHECK_EQ(sizeof(int), 4);
  CHECK_EQ(sizeof(long long), 8);
  static const int64_t experts[] = {0, 1, 2, 7, 8, 384, 4096, 65536};
  for (size_t i = 0; i < sizeof experts / sizeof *experts; i++) both(experts[i]);
  CHECK_EQ(both(0), both(1)); /* dense counts as one expert */
  /* 8 experts by hand: the MoE scratch 64 (loss statistics) + 32 (counts) -> 96, + 128 (regroup
   * table) + 36 (first rows) = 260 B; the offsets cache 64 x 9 x 4 = 2,304 B; the readback buffer
   * 2,048 + 1,024 + 1 MiB (the copy ring) + 260 = 1,051,908 B */
  size_t moe, off, rb;
  cu_host_scratch(8, &moe, &off, &rb);
  CHECK_EQ(moe, 260);
  CHECK_EQ(off, 2304);
  CHECK_EQ(rb, 1051908);
  CHECK_EQ(plan_runtime_host_scratch(8), 260 + 2304 + 1051908);
  /* europa-1t's 384 experts: about 0.1 MB */
  CHECK_EQ(both(384), 2 * (4 * 2 * 384 + 4 * 384 + 8 * 2 * 384 + 4 * 385) + 4 * 64 * 385 + 3072 + (1 << 20));
}

/* The program's small host tables: the plan's figure against the runtime's functions. */
static void tables(void) {
  static const int64_t cases[][4] = {{512, 1, 1, 8}, {512, 2, 2, 4}, {8192, 64, 1, 0}, {65536, 4096, 64, 6},
                                     {131072, 8, 8, 1}, {4096, 16384, 16384, 4}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    int64_t T = cases[i][0], f = cases[i][1], ep = cases[i][2], El = cases[i][3];
    CHECK_EQ(plan_host_tables(T, f, ep, El),
             2 * 4 * T + (int64_t)rt_muon_counts_bytes((int)f) + (ep > 1 ? (int64_t)rt_a2a_bytes((int)ep, (int)El) : 0));
  }
}

/* The hierarchical all-to-all's host tables: the plan's figure against rt_hier_bytes, and the item
 * of a pinned hierarchical plan (tiny-moe on 2 nodes x 2, ep 4). */
static void hier_tables(void) {
  static const int64_t cases[][6] = {{4, 2, 128, 2, 320, 160}, {8, 4, 49152, 8, 800000, 200000},
                                     {32, 4, 4096, 8, 65536, 16384}, {4, 1, 7, 3, 5, 1}, {4, 2, 7, 3, 5, 3}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const int64_t *c = cases[i];
    CHECK_EQ(plan_hier_host_tables(c[0], c[1], c[2], c[3], c[4], c[5]),
             (int64_t)rt_hier_bytes((int)c[0], (int)c[1], (int)c[2], (int)c[3], c[4], c[5]));
    int64_t host = 0;
    size_t rt_host = 0, dev = rt_hier_cuda_bytes((int)c[0], (int)c[1], (int)c[2], (int)c[3], c[4], c[5], &rt_host);
    CHECK_EQ(plan_hier_cuda_tables(c[0], c[1], c[2], c[3], c[4], c[5], &host), (int64_t)dev);
    CHECK_EQ(host, (int64_t)rt_host);
  }
  Mem m = {0};
  const char *sets[] = {"cluster.gpus_per_node=2", "cluster.nodes=2", "plan.ep=4", "plan.moe_dispatch=hierarchical"};
  Plan *p = plan(&m, "specs/tiny-moe.yaml", sets, 4);
  CHECK(p != NULL);
  if (p) {
    const Choice *ch = &p->best.ch;
    int64_t T = ch->micro_batch * p->md->spec->training.seq_len / plan_cp(ch), K = p->md->spec->model.moe.top_k;
    int64_t cap = (int64_t)ceil(plan_moe_imbalance(p->md->spec, ch->ep) * (double)(T * K) - 1e-9);
    CHECK_EQ(bytes(&p->best, "moe.hier_tables"), (int64_t)rt_hier_bytes((int)ch->ep, 2, (int)T, (int)K, cap, (cap + 1) / 2));
    size_t host = 0, dev = rt_hier_cuda_bytes((int)ch->ep, 2, (int)T, (int)K, cap, (cap + 1) / 2, &host);
    CHECK_EQ(bytes(&p->best, "moe.hier_index"), (int64_t)dev);
    CHECK_EQ(bytes(&p->best, "moe.hier_index_host"), (int64_t)host);
  }
  mem_free(&m);
}

/* spec (with sets) plans workspace.runtime_host for its experts, on the host, the whole step. */
static void item(const char *spec, const char *const *sets, int n, int64_t experts) {
  Mem m = {0};
  Plan *p = plan(&m, spec, sets, n);
  CHECK(p != NULL);
  if (p) {
    const MemItem *x = find(&p->best, "workspace.runtime_host");
    CHECK(x != NULL);
    if (x) {
      CHECK_EQ(x->bytes, plan_runtime_host_scratch(experts));
      CHECK_EQ(x->tier, TIER_HOST);
      CHECK_EQ(x->start, 0);
      CHECK_EQ(x->end, PHASE_END(p->md->nlayers));
      CHECK(x->formula && strstr(x->formula, "readback"));
    }
    const Choice *ch = &p->best.ch;
    CHECK_EQ(bytes(&p->best, "data.host_tables"),
             plan_host_tables(ch->micro_batch * p->md->spec->training.seq_len / plan_cp(ch), ch->fsdp, ch->ep,
                              experts / ch->ep));
  }
  mem_free(&m);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_runtime_scratch SOURCE_DIR\n");
    return 2;
  }
  src_dir = argv[1];
  formula();
  tables();
  hier_tables();
  item("specs/tiny-moe.yaml", NULL, 0, 8);
  item("specs/llama-3.1-8b.yaml", NULL, 0, 0);
  item("specs/europa-1t.yaml", NULL, 0, 384);
  static const char *const many[] = {"model.moe.experts=65536"};
  item("specs/europa-1t.yaml", many, 1, 65536);
  return CHECK_DONE("test_runtime_scratch");
}
