/* test_plan.c — the planner's memory: the reference run's plan, properties across sequence
 * lengths and node counts, a pinned plan that cannot fit, NVMe, arena invariants, every memory
 * item of a small spec against a hand computation, the imbalance cap, parameters kept gathered.
 * (The cost model: test_cost.c; the search: test_search.c.)   usage: test_plan SOURCE_DIR */
#include "plan_test.h"

static void reference_run(void) {
  Mem m = {0};
  Plan *p = plan(&m, "specs/europa-1t.yaml", NULL, 0);
  CHECK(p && p->feasible);
  if (!p || !p->feasible) return;
  const Candidate *c = &p->best;
  /* docs/reference-run.md: 384-way FSDP, 4-way EP, full checkpointing with boundaries on Grace memory */
  CHECK_EQ(p->world, 384);
  CHECK_EQ(c->ch.fsdp, 384);
  CHECK_EQ(c->ch.ep, 4);
  CHECK(c->ch.ac == AC_FULL && c->ch.offload == OFF_HOST);
  int64_t boundary = 0;
  for (int i = 0; i < c->nitems; i++)
    if (strncmp(c->items[i].name, "activations.boundary[", 21) == 0) {
      CHECK(c->items[i].tier == TIER_HOST);
      boundary += c->items[i].bytes;
    }
  CHECK_EQ(boundary, 65536LL * 6144 * 2 * 72); /* 54 GiB per GPU: the last two boundaries stay in HBM */
  CHECK(c->arena[TIER_HBM] < (int64_t)96e9);
  CHECK(c->arena[TIER_HOST] < (int64_t)120e9);
  CHECK(c->cost.tokens_per_s_per_gpu > 0 && c->cost.mfu > 0 && c->cost.mfu < 1);
  CHECK(c->cost.step > c->cost.compute);
  CHECK(c->cost.bottleneck != NULL);
  check_arena(c);
  mem_free(&m);
}

/* Pinned layout and policy, so only the quantity under test changes. */
static Candidate pinned(Mem *m, const char *seq, const char *nodes) {
  const char *sets[] = {seq, nodes, "plan.activation_checkpoint=full", "plan.offload_activations=host",
                        "plan.ep=4", "training.global_batch=3072", "plan.dp_replicate=1"};
  Plan *p = plan(m, "specs/europa-1t.yaml", sets, 7);
  Candidate none = {0};
  return p && p->ncandidates ? p->best : none;
}

/* Every Muon matrix has one owner, experts' owners inside their EP rank's shard group, and
 * the Newton-Schulz work balanced. */
static void placement(void) {
  Mem m = {0};
  Plan *p = plan(&m, "specs/europa-1t.yaml", NULL, 0);
  CHECK(p && p->placement && p->placement->muon);
  if (!p || !p->placement) return;
  const Placement *pl = p->placement;
  const Choice *ch = &p->best.ch;
  CHECK_EQ(pl->matrices, p->md->muon_matrices);
  CHECK_EQ(pl->experts_per_rank, 384 / 4);
  int64_t expert_matrices = 0, bad = 0;
  for (int i = 0; i < pl->nruns; i++) { /* EP rank 0's runs; EP rank e's start at e x experts_per_rank */
    const ExpertRun *r = &pl->runs[i];
    for (int64_t e = 0; e < ch->ep; e++) {
      expert_matrices += r->count;
      for (int64_t k = 0; k < r->count; k++) {
        int64_t owner = e + ch->ep * (k / r->per); /* the holder: whole-expert shards */
        if (owner < 0 || owner >= ch->fsdp || owner % ch->ep != e) bad++;
      }
    }
    if (r->first != 0 || r->count != pl->experts_per_rank) bad++;
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(expert_matrices, 74LL * 384 * 3); /* gate, up, down of every routed expert */
  CHECK_EQ(pl->ndense, 74 * (4 + 3));          /* q k v o and the shared expert's three */
  CHECK_EQ(plan_expert_per(pl->experts_per_rank, ch->efsdp), 1); /* 96 experts over 96 ranks: whole */
  CHECK_EQ(pl->moving_matrices, pl->ndense);   /* experts never move */
  CHECK_EQ(pl->moving_expert_matrices, 0);
  double F = (double)ch->fsdp;
  CHECK_NEAR(pl->moving_bytes_rank, 8.0 * (double)pl->dense_params * (F - 1) / (F * F), 1e-12);
  for (int i = 0; i < pl->ndense; i++) CHECK(pl->dense[i].owner >= 0 && pl->dense[i].owner < ch->fsdp);
  CHECK_NEAR(pl->ns_flops_total, p->md->ns_flops, 1e-9);
  double mean = pl->ns_flops_total / (double)ch->fsdp;
  CHECK(pl->ns_flops_max_rank >= mean && pl->ns_flops_max_rank <= 1.10 * mean);
  /* mixtral-8x7b with Muon: 8 experts over 32 ranks (ep 1) do not divide, so the experts are
   * sharded flat (no padding) and every expert matrix (4/3 of a shard) moves to an owner placed
   * like the dense ones: the shard group's ranks evenly loaded */
  const char *mx[] = {"training.optimizer=muon", "plan.fsdp=32", "plan.ep=1"};
  p = plan(&m, "specs/mixtral-8x7b.yaml", mx, 3);
  CHECK(p && p->placement && p->placement->muon);
  if (p && p->placement) {
    pl = p->placement, ch = &p->best.ch;
    CHECK_EQ(ch->efsdp, 32);
    CHECK_EQ(plan_expert_per(8, 32), 0);
    CHECK_EQ(plan_expert_per(8, 4), 2);
    CHECK_EQ(plan_expert_per(6, 4), 0);
    CHECK_EQ(plan_expert_per(8, 1), 0);
    bad = 0;
    for (int i = 0; i < pl->nruns; i++) {
      const ExpertRun *r = &pl->runs[i];
      if (r->per != 0 || r->moving != 8 || r->owner < 0 || r->owner >= 32) bad++;
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(pl->moving_expert_matrices, 32LL * 8 * 3);
    CHECK_EQ(pl->moving_matrices, pl->ndense + 32LL * 8 * 3);
    CHECK_EQ(pl->moving_expert_params, p->md->muon_params - p->md->muon_dense_params);
    mean = pl->ns_flops_total / 32.0;
    CHECK(pl->ns_flops_max_rank >= mean && pl->ns_flops_max_rank <= 1.05 * mean);
    /* no padding: the master shard is 4 B x params / fsdp */
    const MemItem *master = find(&p->best, "master.fp32_shard");
    CHECK(master && llabs(master->bytes - 4 * p->md->params_total / 32) <= 256);
    CHECK(master && strstr(master->formula, "padding") == NULL);
  }
  /* AdamW: no owners */
  p = plan(&m, "specs/tiny-moe.yaml", NULL, 0);
  CHECK(p && p->placement && !p->placement->muon && p->placement->ndense == 0);
  mem_free(&m);
}

static void properties(void) {
  Mem m = {0};
  /* activation memory grows with the sequence length */
  int64_t prev = 0;
  const char *seqs[] = {"training.seq_len=8192", "training.seq_len=16384", "training.seq_len=32768"};
  for (int i = 0; i < 3; i++) {
    Candidate c = pinned(&m, seqs[i], "cluster.nodes=96");
    int64_t act = sum_cat(&c, CAT_ACTIVATIONS);
    CHECK(act > prev);
    prev = act;
  }
  /* more nodes never raise per-GPU parameter, gradient and optimizer memory (fully sharded:
   * unpinned, the search may replicate when that is faster, which costs memory) */
  int64_t last = INT64_MAX;
  const char *nodes[] = {"cluster.nodes=24", "cluster.nodes=48", "cluster.nodes=96", "cluster.nodes=192"};
  for (int i = 0; i < 4; i++) {
    Candidate c = pinned(&m, "training.seq_len=8192", nodes[i]);
    int64_t state = sum_cat(&c, CAT_PARAMS) + bytes(&c, "master.fp32_shard") + bytes(&c, "grads.fp32_shard");
    CHECK(state <= last);
    last = state;
  }
  mem_free(&m);
}

static void impossible(void) {
  Mem m = {0};
  /* no checkpointing at 65,536 tokens cannot fit in 96 GB: infeasible, the tier named */
  const char *sets[] = {"plan.activation_checkpoint=none", "plan.fsdp=384", "plan.cp=1"};
  Plan *p = plan(&m, "specs/europa-1t.yaml", sets, 3);
  CHECK(p && !p->feasible);
  if (p && !p->feasible) {
    CHECK(p->best.over_tier == TIER_HBM);
    CHECK(p->best.over_bytes > 0);
    CHECK(p->advice && strstr(p->advice, "unpinned, the search finds fsdp 384, ep 4, full checkpointing"));
  }
  /* half the nodes without context parallelism: the advice is computed by searching again */
  const char *half[] = {"cluster.nodes=48", "plan.cp=1"};
  p = plan(&m, "specs/europa-1t.yaml", half, 2);
  CHECK(p && !p->feasible && p->advice && strstr(p->advice, "it fits on 96 nodes"));
  mem_free(&m);
}

/* With host memory too small for the boundaries and an NVMe tier, they go to NVMe (through two
 * host bounce buffers). */
static void nvme(void) {
  Mem m = {0};
  const char *sets[] = {"cluster.host.memory=40GB", "cluster.nvme.capacity=1TB", "cluster.nvme.bandwidth=6GB/s"};
  Plan *p = plan(&m, "specs/europa-1t.yaml", sets, 3);
  CHECK(p && p->feasible && p->best.ch.offload == OFF_NVME);
  if (p && p->feasible) {
    const Candidate *c = &p->best;
    CHECK(find(c, "activations.boundary[0]") && find(c, "activations.boundary[0]")->tier == TIER_NVME);
    CHECK(find(c, "activations.nvme_bounce[1]") && find(c, "activations.nvme_bounce[1]")->tier == TIER_HOST);
    CHECK_EQ(c->arena[TIER_NVME], 65536LL * 6144 * 2 * 72); /* the last two stay in HBM */
    check_arena(c);
  }
  /* without the NVMe tier the same host does not fit */
  const char *no[] = {"cluster.host.memory=40GB", "plan.cp=1"};
  p = plan(&m, "specs/europa-1t.yaml", no, 2);
  CHECK(p && !p->feasible);
  mem_free(&m);
}

/* tiny-moe, pinned: T = 2 x 256 = 512 tokens, P = 3,806,336, fsdp 2, ep 1, full, no offload */
static void tiny_items_by_hand(void) {
  Mem m = {0};
  const char *sets[] = {"plan.fsdp=2", "plan.ep=1", "plan.activation_checkpoint=full",
                        "plan.offload_activations=none", "plan.reshard=every_micro_batch"};
  Plan *p = plan(&m, "specs/tiny-moe.yaml", sets, 5);
  CHECK(p && p->feasible);
  if (!p || !p->feasible) return;
  const Candidate *c = &p->best;
  const int64_t P = 3806336, T = 512, H = 128;
  CHECK_EQ(p->md->params_total, P);
  /* largest layer: attention 49,152 + norms 256 + router 1,024 + 9 experts of 98,304 */
  const int64_t layer = 49152 + 256 + 1024 + 9 * 98304;
  if (c->ch.opt_tier == TIER_HOST) CHECK_EQ(bytes(c, "params.bf16_shard"), 2 * P / 2);
  else CHECK_EQ(bytes(c, "params.bf16_cast"), (c->ch.prefetch + 1) * 2 * layer / 2); /* a layer's shard per pool buffer */
  CHECK_EQ(bytes(c, "master.fp32_shard"), 4 * P / 2);
  CHECK_EQ(bytes(c, "optimizer.adamw_moments"), 8 * P / 2);
  CHECK_EQ(bytes(c, "grads.fp32_shard"), 4 * P / 2);
  CHECK_EQ(bytes(c, "gathered.params[0]"), 2 * layer);
  CHECK_EQ(bytes(c, "grads.bf16_unsharded[0]"), 2 * layer);
  CHECK_EQ(bytes(c, "grads.bf16_unsharded[1]"), 2 * layer);
  for (int l = 0; l < 4; l++)
    CHECK_EQ(bytes(c, mem_printf(&m, "activations.boundary[%d]", l)), 2 * H * T);
  /* saved per token: boundary 256; attention core 2 (128+64+64+128) + 4x4 lse = 784; experts
   * 2 (2 (128 + 3x256 + 128) + 3x256) = 5,632; other 832 (norm rstds, xn copies, router with
   * its permutation: top-2 int32 rows); the forward's layer without its input boundary (the
   * boundary's own item holds it); the plan's bytes are the program's (plan_exact), its buffers
   * each rounded up to 64 B: at most 64 B a buffer (about 20) more */
  CHECK(bytes(c, "activations.forward_layer") >= (784 + 5632 + 832) * T);
  CHECK(bytes(c, "activations.forward_layer") <= (784 + 5632 + 832) * T + 64 * 20);
  CHECK(!find_quiet(c, "activations.recompute_layer")); /* (the forward's workspace serves the recompute) */
  CHECK_EQ(bytes(c, "activations.grad_residual[0]"), 2 * H * T);
  /* the shared workspace, its largest group: the gradients of gate, up and act of the widest FFN,
   * top-2 x 256 routed (no imbalance at ep 1), above the attention's gradients (2 T (2 x 128 +
   * 2 x 64)) and the loss's (final norm output 2 H T + two fp32 logits of the whole vocabulary) */
  CHECK_EQ(bytes(c, "workspace.shared"), 3 * 2 * T * (2 * 256));
  CHECK(3 * 2 * T * (2 * 256) > 2 * H * T + 2 * 4 * T * 256);
  CHECK_EQ(bytes(c, "activations.grad_norm"), 2 * H * T);
  CHECK_EQ(bytes(c, "moe.grad_routing_weights"), 4 * T * 2);
  /* the program's small buffers: the last layer's output, the final norm's 1/rms and the loss's
   * log-sum-exp, the tokens and targets, the load-balancing loss's scratch (ep 1: no backward
   * row offsets of its own) */
  CHECK_EQ(bytes(c, "activations.final_boundary"), 2 * H * T);
  CHECK_EQ(bytes(c, "activations.loss_stats"), 4 * T * 2);
  CHECK_EQ(bytes(c, "data.tokens"), 2 * 4 * T);
  CHECK_EQ(bytes(c, "moe.tables"), (4 * 3 * 8 + 63) / 64 * 64); /* (the program's AUX, rounded up to 64 B) */
  /* ep 1: no all-to-all; the gradient of the experts' outputs (top-2 copies per token); that of
   * their inputs lies in y_combined's bytes (dead once combined) */
  CHECK_EQ(bytes(c, "moe.grad_expert_out"), T * 2 * H * 2);
  CHECK(!find_quiet(c, "moe.grad_expert_in"));
  CHECK(!find_quiet(c, "workspace.attention_dq_fp32")); /* cuDNN's fp32 dQ and delta are the runtime's */
  CHECK(!find_quiet(c, "workspace.logits_chunk"));        /* in workspace.shared */
  CHECK_EQ(bytes(c, "workspace.runtime"), plan_runtime_scratch(T, 4, 32, 8)); /* heads 4 of 32 */
  CHECK_EQ(plan_logits_chunk(T, 256), 256);
  CHECK_EQ(plan_logits_chunk(65536, 256000), 4096);  /* europa-1t: 1 GiB of fp32 logits */
  CHECK_EQ(plan_logits_chunk(131072, 32000), 2048);  /* mixtral-8x7b: 1 GiB, not 4096 columns' 2 */
  CHECK_EQ(plan_logits_chunk(8192, 128256), 4096);   /* llama-3.1-8b: at most 4096 columns */
  CHECK_EQ(bytes(c, "reserve.nccl_buffers"), 64 << 20); /* the cpu preset */
  CHECK_EQ(bytes(c, "reserve.host"), 64 << 20);
  /* static 4, gathered, unsharded grads 2, boundaries 4, the layer workspace, grad residual 2,
   * shared workspace, grad norm, grad_expert_out, grad routing weights, runtime (device and
   * host), the host tables, reserves 4, final boundary, loss statistics, tokens, MoE tables */
  CHECK_EQ(bytes(c, "workspace.runtime_host"), plan_runtime_host_scratch(8));
  CHECK_EQ(bytes(c, "data.host_tables"), 2 * 4 * T + 72 * 2); /* token ids and targets, Muon's counts (fsdp 2) */
  int items = 4 + (c->ch.prefetch + 1) + 2 + 4 + 1 + 2 + 1 + 1 + 1 + 1 + 3 + 4 + 4;
  /* the state in HBM: the cuda program's host copy of it (master, gradient, two moments) */
  if (c->ch.opt_tier == TIER_HBM) {
    CHECK_EQ(bytes(c, "state.host_mirror"), (4 + 4 + 8) * P / 2);
    items++;
  } else {
    CHECK(!find_quiet(c, "state.host_mirror"));
  }
  CHECK_EQ(c->nitems, items);
  check_arena(c);
  mem_free(&m);
}

/* moe_imbalance sizes the experts' side of the all-to-all, capped at its physical maximum
 * ep · min(top_k, experts / ep) / top_k; without expert parallelism it is 1. */
static void imbalance_cap(void) {
  Mem m = {0};
  Diag d = {.mem = &m};
  /* on 8 GPUs, where ep 4 and 8 reach 4 (on tiny-moe's 2, 3 is refused: test bad_specs) */
  const char *sets[] = {"plan.moe_imbalance=3", "cluster.gpus_per_node=8"};
  Spec *s = spec_load(&m, &d, mem_printf(&m, "%s/specs/tiny-moe.yaml", src_dir), NULL, 0, sets, 2);
  CHECK(s != NULL);
  if (!s) return;
  /* tiny-moe: 8 experts, top-2 */
  CHECK(plan_moe_imbalance(s, 1) == 1.0);
  CHECK(plan_moe_imbalance(s, 2) == 2.0);       /* 2 · min(2, 4) / 2 */
  CHECK(plan_moe_imbalance(s, 8) == 3.0);       /* max 8 · min(2, 1) / 2 = 4: the spec's 3 */
  s->plan.moe_imbalance = 1.25;
  CHECK(plan_moe_imbalance(s, 2) == 1.25);
  s->model.moe.experts = 2;                     /* one expert per rank, top-2: always balanced */
  CHECK(plan_moe_imbalance(s, 2) == 1.0);
  /* the europa-1t shapes: 384 experts, top-8, ep 4 → at most 4 */
  s->model.moe.experts = 384, s->model.moe.top_k = 8, s->plan.moe_imbalance = 9;
  CHECK(plan_moe_imbalance(s, 4) == 4.0);
  mem_free(&m);
}


/* reshard after_step on tiny-moe (P = 3,806,336; routed experts 4 layers x 8 x 98,304 =
 * 3,145,728): one item holds every parameter gathered, 2 B x (P - routed + routed / ep), in
 * place of the pool of gathered layers; the rest is as every_micro_batch. */
static void kept_gathered_by_hand(void) {
  Mem m = {0};
  const int64_t P = 3806336, routed = 4 * 8 * 98304;
  const char *sets[] = {"plan.fsdp=2", "plan.ep=2", "plan.activation_checkpoint=full",
                        "plan.offload_activations=none", "plan.reshard=after_step"};
  Plan *p = plan(&m, "specs/tiny-moe.yaml", sets, 5);
  CHECK(p && p->feasible);
  if (!p || !p->feasible) return;
  const Candidate *c = &p->best;
  CHECK(c->ch.reshard == RESHARD_AFTER_STEP && c->ch.ep == 2);
  CHECK_EQ(bytes(c, "gathered.params_kept"), 2 * (P - routed + routed / 2)); /* 4,466,944 */
  CHECK(find(c, "gathered.params_kept")->tier == TIER_HBM);
  CHECK_EQ(find(c, "gathered.params_kept")->end, PHASE_OPT(4));
  for (int i = 0; i < c->nitems; i++) CHECK(strncmp(c->items[i].name, "gathered.params[", 16) != 0);
  check_arena(c);
  /* the same pins but every_micro_batch: the pool instead, and a smaller peak */
  const char *every[] = {"plan.fsdp=2", "plan.ep=2", "plan.activation_checkpoint=full",
                         "plan.offload_activations=none", "plan.reshard=every_micro_batch"};
  Plan *q = plan(&m, "specs/tiny-moe.yaml", every, 5);
  CHECK(q && q->feasible && !find_quiet(&q->best, "gathered.params_kept"));
  mem_free(&m);
}

/* Context parallelism: europa-1t at 128K and 256K tokens fits on its 96 nodes only by splitting
 * each sequence (cp >= 2), within both tiers; every per-token item holds seq_len / cp tokens of
 * a sequence, the K/V all-gather buffers the whole sequence's keys and values. */
static void context_parallel(void) {
  Mem m = {0};
  const int64_t seqs[] = {131072, 262144};
  for (int i = 0; i < 2; i++) {
    const char *sets[] = {mem_printf(&m, "training.seq_len=%lld", (long long)seqs[i])};
    Plan *p = plan(&m, "specs/europa-1t.yaml", sets, 1);
    CHECK(p && p->feasible && p->best.ch.cp >= 2);
    if (!p || !p->feasible) continue;
    const Candidate *c = &p->best;
    int64_t cp = c->ch.cp, tokens = seqs[i] / cp; /* micro_batch 1 */
    CHECK(c->arena[TIER_HBM] <= c->capacity[TIER_HBM] && c->arena[TIER_HOST] <= c->capacity[TIER_HOST]);
    CHECK_EQ(c->ch.accum, 384 * cp / 384); /* 384 sequences over 384 / cp data ranks */
    CHECK_EQ(bytes(c, "activations.boundary[0]"), 2 * 6144 * tokens);
    CHECK_EQ(bytes(c, "data.tokens"), 2 * 4 * tokens);
    CHECK_EQ(bytes(c, "attention.kv_gathered"), 2 * seqs[i] * 16 * (128 + 128)); /* kv_heads x (k + v) */
    CHECK_EQ(bytes(c, "attention.dkv_gathered"), 2 * seqs[i] * 16 * (128 + 128));
    check_arena(c);
    /* the cp the search did not pick was tried, and explain has it */
    CHECK(p->nby_cp >= 2 && plan_cp(&p->by_cp[0].ch) == 1 && !p->by_cp[0].fits);
    /* the K/V exchange priced on the cp group's NVLink (a GH200 node: cp - 1 pair links) */
    LayerTime t;
    cost_layer(p->md, &c->ch, 0, &t);
    const ClusterSpec *cl = &p->md->spec->cluster;
    double kv = 2.0 * (double)tokens * 16 * 256 * (double)cp;
    CHECK(fabs(t.kv_ag - kv * (double)(cp - 1) / (double)cp /
                             ((double)(cp - 1) * cl->links.nvlink * cl->efficiency.network)) < 1e-12);
  }
  /* pinned: cp 2 halves every activation of the same plan otherwise */
  const char *one[] = {"plan.cp=1", "plan.ep=4", "plan.activation_checkpoint=full", "plan.offload_activations=host"};
  const char *two[] = {"plan.cp=2", "plan.ep=4", "plan.activation_checkpoint=full", "plan.offload_activations=host"};
  Plan *a = plan(&m, "specs/europa-1t.yaml", one, 4), *b = plan(&m, "specs/europa-1t.yaml", two, 4);
  CHECK(a && b && a->best.ch.cp <= 1 && b->best.ch.cp == 2);
  if (a && b) {
    CHECK_EQ(bytes(&b->best, "activations.boundary[0]") * 2, bytes(&a->best, "activations.boundary[0]"));
    CHECK_EQ(bytes(&b->best, "activations.grad_residual[0]") * 2, bytes(&a->best, "activations.grad_residual[0]"));
    CHECK(!find_quiet(&a->best, "attention.kv_gathered"));
  }
  mem_free(&m);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_plan SOURCE_DIR\n");
    return 2;
  }
  src_dir = argv[1];
  reference_run();
  placement();
  properties();
  impossible();
  nvme();
  tiny_items_by_hand();
  imbalance_cap();
  kept_gathered_by_hand();
  context_parallel();
  return CHECK_DONE("test_plan");
}
