/* test_plan_items.c — the plan is the only contract (design.md, principle 1): every buffer of
 * the generated program names the plan's memory item whose bytes hold it (EmBuf.item), that item
 * exists in the plan, and per item the plan's bytes are exactly the program's (plan_exact:
 * em_buf_bytes, cuda sizes, each buffer rounded up to 64 B, an alias counted in its target
 * only). The search's formulas (plan_memory, which sized every candidate) stay within the
 * differences each rule below states and bounds of those bytes. In each tier the items the
 * program holds lie below the items outside its arena (reserves, the runtime's scratch). Over
 * every example spec with a program, and MLA with q-LoRA and a MoE model with a dense first
 * layer under each checkpoint policy.
 *   usage: test_plan_items SOURCE_DIR [-v]   (-v: the table of every item) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "emit.h"

static const char *src_dir;
static bool verbose;

static bool prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* The bytes by which the program may exceed (over) or fall short of (under) the search's
 * formula for item it, given the program's nb buffers in it, and why:
 *   - each buffer is rounded up to 64 B: up to 64 B a buffer over;
 *   - parameter shards: each group padded to whole 16-byte vectors per rank (plan_flat_shard)
 *     and to 16 elements, while the plan divides the parameter count by fsdp: up to 64 B a
 *     buffer over;
 *   - params.bf16_cast: the program's (prefetch + 1) buffers hold the largest unit's shard,
 *     dense and experts (each group padded to its ranks), the plan the largest unit / fsdp:
 *     1% over;
 *   - a gathered unit (gathered.*, grads.bf16_unsharded, grads.fp32_wire): its two groups,
 *     dense and experts, each padded to whole 16-byte vectors of bf16 per rank (plan_flat_shard):
 *     up to 2 x fsdp x 16 B over (x 2 in fp32);
 *   - the state block (master.fp32_shard, grads.fp32_shard, optimizer.*: plan_state lays the
 *     groups out as the program does): no difference at all, and each state buffer at its item's
 *     offset from the block's start (state_offsets);
 *   - the stacked per-layer items (activations.saved[l]) count per token: the program adds the
 *     per-layer tables (OFFSETS: experts + 1, EOFF, int32) and rounds the routed rows up to
 *     whole rows (4 x max(hidden, expert width) elements, as test_layout);
 *   - activations.forward_layer: the program's workspace serves the forward and the recompute
 *     and holds the widest layer's saves but its
 *     boundary, as the item (the bytes the policy does not keep, of the widest layer); the
 *     rounding and the per-layer tables as above; with dense and MoE layers each FFN pair is as
 *     wide as its wider (emit_layout.c ffn_union), so the program may exceed the widest layer by
 *     what a dense FFN's gate, up and activation need beyond the experts': up to 3 x 2 B x
 *     max(0, tokens x intermediate - rows x expert width) over. */
static bool state_item(const MemItem *it) { return it->state; }

static void bounds(const Em *e, const MemItem *it, int nb, double *over, double *under) {
  *over = state_item(it) ? 0 : 64.0 * nb, *under = 0;
  const char *n = it->name;
  double tables = 4.0 * (double)(e->E + 1) + 4.0 * (double)(e->El + 1);
  if (prefix(n, "params.bf16_cast")) *over += 0.01 * (double)it->bytes;
  if (prefix(n, "gathered.") || prefix(n, "grads.bf16_unsharded")) *over += 2.0 * (double)e->fsdp * 16;
  if (prefix(n, "grads.fp32_wire")) *over += 4.0 * (double)e->fsdp * 16;
  if (prefix(n, "activations.saved[")) {
    double row = 4.0 * (double)(e->C > e->Fe ? e->C : e->Fe) * 2;
    *over += tables + (e->K ? row : 0);
  }
  if (strcmp(n, "activations.forward_layer") == 0) {
    bool both = e->md->n_moe_layers && e->md->n_moe_layers < e->L;
    double dense = (double)e->N * (double)e->s->model.mlp.intermediate, routed = (double)e->R * (double)e->Fe;
    *over += tables + (both && dense > routed ? 3 * 2 * (dense - routed) : 0);
    *under += 64.0 * nb;
  }
}

/* The program's state arena is the plan's state block: the block's items (MemItem.state) lie one
 * after another from the block's start (its first item's offset) in their tier's arena, and each
 * state buffer starts at its item's offset from that start plus the bytes of the item's buffers
 * before it (the program lays them out item by item, in group order); the arena ends where the
 * block does. */
static void state_offsets(const char *spec, const Em *e, const Candidate *c) {
  int64_t base = -1, end = 0;
  Tier tier = TIER_HBM;
  for (int j = 0; j < c->nitems; j++)
    if (c->items[j].state) {
      if (base < 0) base = c->items[j].offset, tier = c->items[j].tier;
      CHECK_EQ(c->items[j].offset, base + end); /* contiguous, in build order */
      end += c->items[j].bytes;
    }
  CHECK(base >= 0);
  int64_t *at = calloc((size_t)c->nitems + 1, sizeof *at), top = 0;
  for (int i = 0; i < e->nbufs; i++) {
    const EmBuf *b = &e->bufs[i];
    if (b->arena != EM_STATE) continue;
    int k = -1;
    for (int j = 0; j < c->nitems; j++)
      if (strcmp(c->items[j].name, b->item) == 0) k = j;
    CHECK(k >= 0 && c->items[k].state);
    if (k < 0) continue;
    int64_t want = c->items[k].offset - base + at[k], have = 4 * b->offset;
    if (have != want)
      fprintf(stderr, "%s: state buffer %s at byte %lld of the state arena, its item %s's bytes from %lld\n", spec,
              b->name, (long long)have, b->item, (long long)want);
    CHECK_EQ(have, want);
    at[k] += em_buf_bytes(b);
    if (have + em_buf_bytes(b) > top) top = have + em_buf_bytes(b);
  }
  for (int j = 0; j < c->nitems; j++)
    if (c->items[j].state) CHECK_EQ(at[j], c->items[j].bytes);
  CHECK_EQ(top, end);
  CHECK_EQ(4 * e->top[EM_STATE], end);
  if (verbose) printf("  state block: %lld B at %lld of the %s arena = the program's state arena\n", (long long)end,
                      (long long)base, plan_tier_name(tier));
  free(at);
}

/* The program's HBM buffers at the plan's offsets (em_place): each buffer but the state's lies
 * inside its item's bytes in the HBM tier (unit o at byte base + 2 o; its cuda bytes), the
 * buffers of one item do not overlap, and the span ends at the top of the program's items. */
static void placed(const char *spec, const Plan *p) {
  Mem m = {0};
  Em e;
  em_init(&e, &m, p);
  em_place(&e);
  const Candidate *c = &p->best;
  int64_t top = 0;
  for (int j = 0; j < c->nitems; j++)
    if (c->items[j].tier == TIER_HBM && !c->items[j].state && !c->items[j].outside &&
        c->items[j].offset + c->items[j].bytes > top)
      top = c->items[j].offset + c->items[j].bytes;
  CHECK_EQ(e.base + 2 * e.top[EM_ACT], top > e.base ? top : e.base);
  for (int i = 0; i < e.nbufs; i++) {
    const EmBuf *b = &e.bufs[i];
    if (b->arena == EM_STATE) continue;
    int k = -1;
    for (int j = 0; j < c->nitems; j++)
      if (strcmp(c->items[j].name, b->item) == 0) k = j;
    CHECK(k >= 0);
    if (k < 0) continue;
    const MemItem *it = &c->items[k];
    int64_t lo = e.base + 2 * b->offset, hi = lo + b->elems * (b->arena == EM_ACT ? 2 : 4);
    bool in = it->tier == TIER_HBM && lo >= it->offset && hi <= it->offset + it->bytes;
    if (!in)
      fprintf(stderr, "%s: buffer %s at bytes [%lld, %lld) of the HBM tier, outside its item %s [%lld, %lld)\n", spec,
              b->name, (long long)lo, (long long)hi, it->name, (long long)it->offset,
              (long long)(it->offset + it->bytes));
    CHECK(in);
    for (int j = 0; j < i && !b->alias; j++) { /* one item's own buffers: disjoint */
      const EmBuf *o = &e.bufs[j];
      if (o->arena == EM_STATE || o->alias || strcmp(o->item, b->item) != 0) continue;
      int64_t olo = e.base + 2 * o->offset, ohi = olo + o->elems * (o->arena == EM_ACT ? 2 : 4);
      CHECK(ohi <= lo || hi <= olo);
    }
  }
  mem_free(&m);
}

/* The index of c's item named name, or -1. */
static int item_at(const Candidate *c, const char *name) {
  for (int j = 0; j < c->nitems; j++)
    if (strcmp(c->items[j].name, name) == 0) return j;
  return -1;
}

/* Whether [lo, hi) of host item k is inside it; said on stderr when not. */
static bool host_in(const char *spec, const Candidate *c, int k, const char *what, int64_t lo, int64_t hi) {
  const MemItem *it = k >= 0 ? &c->items[k] : NULL;
  bool in = it && it->tier == TIER_HOST && it->exact && lo >= it->offset && hi <= it->offset + it->bytes;
  if (!in)
    fprintf(stderr, "%s: %s at bytes [%lld, %lld) of the host tier, outside its item %s\n", spec, what, (long long)lo,
            (long long)hi, it ? it->name : "(none)");
  return in;
}

/* The program's host arena at the plan's host offsets (em_place's host tier): one allocation of
 * Em.host_span units of 2 B from the tier's byte 0 to the top of the program's host items; the
 * state block, when on the host, at byte 0; each offloaded boundary HX<l> and Muon's host
 * scratch inside its exact item (the program's bytes: 2 B x tokens x hidden, 4 B x
 * MUON_HOST_ELEMS or MUON_STEP_ELEMS), and those items (*held, per item index) the only exact
 * host items besides the state's. */
static void placed_host(const char *spec, const Plan *p, bool *held) {
  Mem m = {0};
  Em e;
  em_init(&e, &m, p);
  em_place(&e);
  const Candidate *c = &p->best;
  int64_t top = 0, state_lo = INT64_MAX;
  for (int j = 0; j < c->nitems; j++) {
    const MemItem *it = &c->items[j];
    if (it->tier != TIER_HOST || it->outside) continue;
    if (it->offset + it->bytes > top) top = it->offset + it->bytes;
    if (it->state && it->offset < state_lo) state_lo = it->offset;
  }
  if (c->ch.offload != OFF_NVME) CHECK_EQ(2 * e.host_span, (top + 1) / 2 * 2);
  if (e.state_host) CHECK_EQ(state_lo, 0);
  int64_t nb = e.offload && e.L >= 3 ? e.L - 2 : 0;
  for (int64_t l = 0; l < nb && c->ch.offload != OFF_NVME; l++) {
    char name[64];
    snprintf(name, sizeof name, "activations.boundary[%lld]", (long long)l);
    int k = item_at(c, name);
    CHECK(host_in(spec, c, k, name, 2 * e.hx[l], 2 * e.hx[l] + 2 * e.N * e.C));
    if (k < 0) continue;
    CHECK_EQ(c->items[k].bytes, 2 * e.N * e.C);
    held[k] = true;
  }
  static const char *const muon[2] = {"workspace.muon_exchange_host", "workspace.newton_schulz"};
  for (int i = 0; i < 2; i++) {
    int k = item_at(c, muon[i]);
    if (k < 0 || c->items[k].tier != TIER_HOST) continue;
    int64_t at = i ? e.muon_step_at : e.muon_host_at, bytes = 4 * (i ? e.muon_step : e.muon_host);
    CHECK(host_in(spec, c, k, muon[i], 2 * at, 2 * at + bytes));
    CHECK_EQ(c->items[k].bytes, bytes);
    CHECK(2 * at + bytes <= 2 * e.host_span);
    held[k] = true;
  }
  if (verbose) printf("  host arena: %lld B (%lld offloaded boundaries)\n", (long long)(2 * e.host_span), (long long)nb);
  mem_free(&m);
}

/* spec with the --set options sets (nsets of them; at most 6) */
static void check_spec(const char *spec, const char *const *sets, int nsets) {
  Mem m = {0};
  Diag d = {.mem = &m};
  const char *v[6];
  for (int i = 0; i < nsets; i++) v[i] = sets[i];
  Spec *s = spec_load(&m, &d, mem_printf(&m, "%s/%s", src_dir, spec), NULL, 0, v, nsets);
  Model *md = s ? model_build(&m, &d, s) : NULL;
  Plan *p = md ? plan_search(&m, md) : NULL;
  CHECK(p != NULL);
  if (!p) {
    fprintf(stderr, "%s: %s", spec, d.msg ? d.msg : "no plan\n");
    mem_free(&m);
    return;
  }
  Em e;
  em_init(&e, &m, p);
  const Candidate *c = &p->best;
  int64_t *got = mem_array(&m, (size_t)c->nitems + 1, sizeof *got);
  int *nb = mem_array(&m, (size_t)c->nitems + 1, sizeof *nb);
  for (int i = 0; i < e.nbufs; i++) {
    const EmBuf *b = &e.bufs[i];
    int k = -1;
    for (int j = 0; b->item && j < c->nitems; j++)
      if (strcmp(c->items[j].name, b->item) == 0) k = j;
    if (k < 0) { /* a buffer the plan does not hold: the plan needs an item for it */
      fprintf(stderr, "%s: buffer %s (%lld elements) names %s, which the plan has no item for\n", spec, b->name,
              (long long)b->elems, b->item ? b->item : "no item");
      CHECK(k >= 0);
      continue;
    }
    if (c->items[k].tier != (e.state_host && b->arena == EM_STATE ? TIER_HOST : TIER_HBM)) {
      fprintf(stderr, "%s: buffer %s is in %s's tier %s\n", spec, b->name, b->item, plan_tier_name(c->items[k].tier));
      CHECK(false);
    }
    if (b->alias) continue; /* its bytes are its target's */
    got[k] += em_buf_bytes(b);
    nb[k]++;
  }
  if (verbose) printf("%s%s%s\n", spec, nsets ? " --set " : "", nsets ? sets[nsets - 1] : "");
  state_offsets(spec, &e, c);
  placed(spec, p);
  bool *host_held = mem_array(&m, (size_t)c->nitems + 1, sizeof *host_held);
  placed_host(spec, p, host_held);
  Candidate f = *c; /* the search's formulas for the same choice */
  f.items = NULL, f.nitems = 0;
  plan_memory(&m, p->md, &f);
  CHECK_EQ(f.nitems, c->nitems);
  for (int j = 0; j < c->nitems; j++) {
    const MemItem *it = &c->items[j];
    if (host_held[j]) continue; /* (placed_host) */
    if (!nb[j]) { /* held outside the arenas: the runtime, the host copies, reserves: the formula */
      CHECK(!it->exact);
      if (j < f.nitems) CHECK_EQ(it->bytes, f.items[j].bytes);
      continue;
    }
    if (got[j] != it->bytes)
      fprintf(stderr, "%s: item %s: plan %lld B, program %lld B\n", spec, it->name, (long long)it->bytes,
              (long long)got[j]);
    CHECK_EQ(got[j], it->bytes);
    CHECK(it->exact);
    if (j >= f.nitems || strcmp(f.items[j].name, it->name) != 0) {
      CHECK(false);
      continue;
    }
    double over, under, diff = (double)got[j] - (double)f.items[j].bytes;
    bounds(&e, &f.items[j], nb[j], &over, &under);
    bool ok = diff <= over + 0.5 && -diff <= under + 0.5;
    if (verbose || !ok)
      fprintf(verbose ? stdout : stderr, "  %-36s formula %15lld  program %15lld  (%d buffers) %+.4f%%%s\n",
              it->name, (long long)f.items[j].bytes, (long long)got[j], nb[j],
              100.0 * diff / (double)(f.items[j].bytes ? f.items[j].bytes : 1), ok ? "" : "  <- past its bound");
    CHECK(ok);
  }
  /* each tier: the program's items, then those outside its arena from the top of the rest on */
  for (int t = 0; t < TIER__COUNT; t++) {
    int64_t in_top = 0, out_lo = INT64_MAX;
    for (int j = 0; j < c->nitems; j++) {
      const MemItem *it = &c->items[j];
      if ((int)it->tier != t) continue;
      if (it->outside) out_lo = it->offset < out_lo ? it->offset : out_lo;
      else if (it->offset + it->bytes > in_top) in_top = it->offset + it->bytes;
    }
    CHECK(in_top <= out_lo);
  }
  mem_free(&m);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_plan_items SOURCE_DIR [-v]\n");
    return 2;
  }
  src_dir = argv[1];
  verbose = argc > 2 && strcmp(argv[2], "-v") == 0;
  static const char *const specs[] = {"specs/europa-1t.yaml",   "specs/mixtral-8x7b.yaml", "specs/llama-3.1-8b.yaml",
                                      "specs/tiny-moe.yaml",    "specs/deepseek-v3.yaml",  "specs/qwen3-30b-a3b.yaml",
                                      "specs/bench/moe-1b.yaml"};
  static const char *const opts[] = {"training.optimizer=adamw", "training.optimizer=muon"};
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
    check_spec(specs[i], NULL, 0);
    for (int o = 0; o < 2; o++) check_spec(specs[i], &opts[o], 1);
  }
  /* MLA with q-LoRA and a dense first layer (its workspace groups, the dense FFN in the experts'
   * bytes) under each checkpoint policy, with expert parallelism */
  static const char *const policies[] = {"plan.activation_checkpoint=none", "plan.activation_checkpoint=selective",
                                         "plan.activation_checkpoint=full"};
  for (int a = 0; a < 3; a++) {
    const char *mla[] = {"model.attention.q_lora_rank=12", "cluster.gpus_per_node=2", "plan.ep=2", policies[a]};
    check_spec("tests/specs/mla.yaml", mla, 4);
    const char *dense[] = {"model.moe.first_dense_layers=1", "model.mlp.intermediate=256", "plan.ep=2", policies[a]};
    check_spec("specs/tiny-moe.yaml", dense, 4);
    /* the hierarchical all-to-all: its staging (moe.hier_staging, moe.hier_scalars), no grad_expert_out */
    const char *hier[] = {"cluster.gpus_per_node=2", "cluster.nodes=2", "plan.ep=4", "plan.moe_dispatch=hierarchical",
                          policies[a]};
    check_spec("specs/tiny-moe.yaml", hier, 5);
  }
  const char *hier_ds[] = {"cluster.nodes=64", "plan.ep=8", "plan.moe_dispatch=hierarchical"};
  check_spec("specs/deepseek-v3.yaml", hier_ds, 3);
  /* the host arena: offloaded boundaries with the state on the host and Muon's step on the GPU
   * (its exchange's pinned scratch) or on the host (its step's scratch), and with the state in HBM */
  const char *off_gpu[] = {"plan.activation_checkpoint=full", "plan.offload_activations=host",
                           "training.optimizer=muon", "plan.optimizer_tier=host"};
  check_spec("specs/tiny-moe.yaml", off_gpu, 4);
  const char *off_host[] = {"plan.offload_activations=host", "training.optimizer=muon", "plan.optimizer_tier=host",
                            "plan.optimizer_step=host"};
  check_spec("specs/tiny-moe.yaml", off_host, 4);
  const char *off_hbm[] = {"plan.activation_checkpoint=full", "plan.offload_activations=host",
                           "training.optimizer=muon", "plan.optimizer_tier=hbm"};
  check_spec("specs/tiny-moe.yaml", off_hbm, 4);
  /* context parallelism: every buffer at T / cp tokens, the K/V all-gather buffers (KVG, DKVG) the
   * plan's attention.kv_gathered and dkv_gathered; with expert parallelism, host offload, MLA */
  const char *cp_ep[] = {"cluster.gpus_per_node=4", "plan.cp=2", "plan.ep=2", "plan.activation_checkpoint=none"};
  check_spec("specs/tiny-moe.yaml", cp_ep, 4);
  const char *cp_off[] = {"cluster.gpus_per_node=2", "plan.cp=2", "plan.activation_checkpoint=full",
                          "plan.offload_activations=host"};
  check_spec("specs/tiny-moe.yaml", cp_off, 4);
  const char *cp_mla[] = {"cluster.gpus_per_node=2", "plan.cp=2", "model.attention.q_lora_rank=12", "plan.ep=2"};
  check_spec("tests/specs/mla.yaml", cp_mla, 4);
  return CHECK_DONE("test_plan_items");
}
