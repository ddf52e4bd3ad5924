/* test_cost.c — the cost model against hand computations: the issue 14 fixes on
 * tests/specs/cost_hand.yaml, the compute model's kernels, the all-to-all on mixed links and
 * hierarchical.   usage: test_cost SOURCE_DIR */
#include "plan_test.h"

/* The cost model's fixes of issue 14 against hand computations on tests/specs/cost_hand.yaml:
 * 3 MoE layers, hidden 64, GQA 4 heads of 16 (2 KV heads), 8 experts of 32 top-2, 4 GPUs of
 * 100 TFLOP/s on one node, 100 GB/s links and host memory; default efficiencies. */
static Model *hand_model(Mem *m, const char *const *sets, int n) {
  Diag d = {.mem = m};
  Spec *s = spec_load(m, &d, mem_printf(m, "%s/tests/specs/cost_hand.yaml", src_dir), NULL, 0, sets, n);
  Model *md = s ? model_build(m, &d, s) : NULL;
  if (!md) fprintf(stderr, "unexpected error:\n%s", d.msg ? d.msg : "(none)\n");
  return md;
}

/* 4-way FSDP, ep, accum micro-batches of 1 sequence, full checkpointing, the state in tier */
static Choice hand_choice(int64_t ep, int64_t accum, Tier tier) {
  return (Choice){.fsdp = 4, .ep = ep, .dp_replicate = 1, .efsdp = 4 / ep, .micro_batch = 1, .accum = accum,
                  .reshard = RESHARD_EVERY_MICRO_BATCH, .ac = AC_FULL, .offload = OFF_NONE, .opt_tier = tier,
                  .opt_on_host = false, .prefetch = 1};
}

static void cost_by_hand(void) {
  Mem m = {0};
  Model *md = hand_model(&m, NULL, 0);
  CHECK(md != NULL);
  if (!md) return;
  Spec *s = (Spec *)md->spec;
  /* one layer: q, o 64x64, k, v 32x64 = 12288; norms 2 x 64; router 8 x 64; experts
   * 8 x 3 x 64 x 32 = 49152 */
  CHECK_EQ(md->layers[0].params, 12288 + 128 + 512 + 49152);
  CHECK_EQ(md->layers[0].routed_params, 49152);

  /* 1. the busiest EP rank's expert GEMMs: moe_imbalance x the mean. Forward FLOPs of the
   * experts per token: 2 x top_k x 3 x 64 x 32 = 24576; 128 tokens at 100 TFLOP/s x 0.6 (the
   * program's loop of cuBLAS GEMMs, expert_gemm_loop = dense_gemm: with kernel_launch 0 it is
   * priced faster than the grouped call at any rows); and its SwiGLU: 6 B x top_k x 32 units per
   * token at 1 TB/s x 0.7 */
  Choice ch = hand_choice(2, 1, TIER_HBM);
  LayerTime a, b;
  s->plan.moe_imbalance = 1;
  cost_layer(md, &ch, 0, &a);
  s->plan.moe_imbalance = 2; /* the maximum for ep 2: 2 x min(2, 4) / 2 */
  cost_layer(md, &ch, 0, &b);
  CHECK_EQ(cost_expert_loop_rows(s, 2), 8);
  double mean = 128.0 * 24576 / (100e12 * 0.6) + 128.0 * 6 * 64 / 0.7e12; /* 5.24e-8 + 7.02e-8 s */
  CHECK_NEAR(b.fwd - a.fwd, mean, 1e-9);
  CHECK_NEAR(b.bwd - a.bwd, 2 * mean, 1e-9);
  CHECK_NEAR(b.recompute - a.recompute, mean, 1e-9); /* full checkpointing re-runs them */
  s->plan.moe_imbalance = 1.25;

  /* 5. the link model: an all-gather of a layer over the 4 GPUs of the node moves 3/4 of its
   * 2 B x 62080 bytes; a mesh GPU drives 3 pair links (3 x 100 GB/s x 0.8), an NVSwitch GPU its
   * 100 GB/s x 0.8 into the switch */
  ch = hand_choice(1, 1, TIER_HBM);
  cost_layer(md, &ch, 0, &a);
  CHECK_NEAR(a.ag, 2.0 * 62080 * 0.75 / 240e9, 1e-9); /* 3.88e-7 s */
  s->cluster.links.topology = TOPO_NVSWITCH;
  cost_layer(md, &ch, 0, &b);
  CHECK_NEAR(b.ag, 2.0 * 62080 * 0.75 / 80e9, 1e-9);
  s->cluster.links.topology = TOPO_MESH;

  /* 2 and 4. gradient shard on host with one micro-batch: 2 B per parameter over C2C
   * (100 GB/s x 0.8), converted into fp32 in host memory (read 2, write 4 B at 100 GB/s x 0.8):
   * shard x 8 B / 80 GB/s; its own line, not activation offload */
  double shard = (double)md->params_total / 4;
  Candidate c = {.ch = hand_choice(1, 1, TIER_HOST)};
  cost_step(md, &c);
  CHECK_NEAR(c.cost.host_grad, shard * 8 / 80e9, 1e-9);
  CHECK(c.cost.exposed_offload == 0);
  /* two micro-batches: 2 x 2 B over C2C, then 6 + 10 B in host memory */
  c = (Candidate){.ch = hand_choice(1, 2, TIER_HOST)};
  cost_step(md, &c);
  CHECK_NEAR(c.cost.host_grad, shard * (4 + 16) / 80e9, 1e-9);
  c = (Candidate){.ch = hand_choice(1, 1, TIER_HBM)};
  cost_step(md, &c);
  CHECK(c.cost.host_grad == 0);

  /* 3. Newton-Schulz on the busiest rank: per matrix 5 (4 r^2 c + 2 r^3), r <= c: q, o
   * 7,864,320; k, v and every expert matrix 1,638,400. Each rank owns 2 of each layer's 8
   * experts per matrix kind: 18 x 1,638,400 = 29,491,200; the 6 large and 6 small dense
   * matrices go largest first to the least loaded: ranks 0 and 1 get 2 large ones. Busiest
   * 29,491,200 + 2 x 7,864,320 = 45,219,840; the mean 29,491,200 + 14,254,080 = 43,745,280 */
  ch = hand_choice(1, 1, TIER_HBM);
  CHECK_NEAR(cost_ns_flops_busiest(md, &ch, NULL), 45219840.0, 1e-12);
  CHECK_NEAR(md->ns_flops / 4, 43745280.0, 1e-12);
  Placement *pl = plan_placement(&m, md, &ch);
  CHECK_NEAR(pl->ns_flops_max_rank, 45219840.0, 1e-12);
  mem_free(&m);
}


static const Op *find_op(const Model *md, OpKind k) {
  for (int i = 0; i < md->nops; i++)
    if (md->ops[i].kind == k) return &md->ops[i];
  return NULL;
}

/* The compute model (cost_kernel.c) on cost_hand.yaml's round figures: 100 TFLOP/s, 1 TB/s
 * HBM at 0.7, hidden 64, vocab 256, 128 tokens per micro-batch. */
static void kernels_by_hand(void) {
  Mem m = {0};
  const char *sets[] = {"cluster.gpu.sms=4"};
  Model *md = hand_model(&m, sets, 1);
  CHECK(md != NULL);
  if (!md) return;
  Spec *s = (Spec *)md->spec;
  /* tile and wave quantization: 200 x 64 rows x columns in 128 x 128 tiles = 2 tiles, one
   * wave of 4 SMs: 4 x 128 x 128 x 64 x 2 FLOPs at 100 TFLOP/s x 0.5 (its operands, 59,392 B,
   * take 8.5e-8 s at 0.7 TB/s: less) */
  CHECK_NEAR(cost_gemm(s, 200, 64, 64, 1, 0.5), 2.0 * 4 * 128 * 128 * 64 / 50e12, 1e-9); /* 1.678e-7 */
  /* sustained: the step holds half the clock, the math takes twice as long */
  s->cluster.efficiency.sustained = 0.5;
  CHECK_NEAR(cost_gemm(s, 200, 64, 64, 1, 0.5), 2.0 * 4 * 128 * 128 * 64 / 25e12, 1e-9);
  s->cluster.efficiency.sustained = 1;
  /* 5 tiles: two waves */
  CHECK_NEAR(cost_gemm(s, 640, 64, 64, 1, 0.5), 2.0 * 8 * 128 * 128 * 64 / 50e12, 1e-9);
  /* memory-bound: 1 SM, 128 x 128 x 64 is 4.2e-8 s of math but 2 x 32768 B at 0.7 TB/s */
  s->cluster.gpu.sms = 1;
  CHECK_NEAR(cost_gemm(s, 128, 128, 64, 1, 0.5), 2.0 * 32768 / 0.7e12, 1e-9); /* 9.36e-8 */
  /* per-call overhead: no kernel is faster than kernel_launch */
  s->cluster.efficiency.kernel_launch = 1e-6;
  CHECK_NEAR(cost_gemm(s, 128, 128, 64, 1, 0.5), 1e-6, 1e-9);
  s->cluster.efficiency.kernel_launch = 0;
  s->cluster.gpu.sms = 0; /* no GPU named: FLOPs alone, as before */
  CHECK_NEAR(cost_gemm(s, 200, 64, 64, 1, 0.5), 2.0 * 200 * 64 * 64 / 50e12, 1e-9);

  /* expert rows padded to the tile: 8 experts, top_k 2, ep 2 -> 4 local experts of
   * 128 x 2 x 1.25 x 2 / 8 = 80 rows each, padded to 128; 3 matrices per expert */
  s->cluster.gpu.sms = 4;
  const Op *ex = find_op(md, OP_EXPERTS);
  OpTime t = cost_op(s, md, ex, 128, 128, 2, 1.25);
  double gate = cost_gemm(s, 80, 32, 64, 4, 0.6), down = cost_gemm(s, 80, 64, 32, 4, 0.6);
  double swiglu = 128 * 1.25 * 6 * 64 / 0.7e12;
  CHECK_NEAR(gate, 2.0 * 1 * 4 * 128 * 128 * 64 / 60e12, 1e-9); /* 4 tiles: 1 wave, the loop's rate */
  CHECK_NEAR(t.fwd, 2 * gate + down + swiglu, 1e-9);
  /* the program's two expert paths (cost_expert_gemm): with kernel_launch 1e-7 the loop costs at
   * least its 4 launches (4e-7 s), the grouped call its tiles at 0.45 (1.86e-7 s a wave of 4 SMs);
   * the loop wins from the least rows at which the grouped call takes the launches' time */
  s->cluster.efficiency.kernel_launch = 1e-7;
  int64_t lr = cost_expert_loop_rows(s, 2);
  CHECK(lr > 8);
  CHECK(cost_expert_gemm(s, (double)lr, 32, 64, 4, true) <= cost_expert_gemm(s, (double)lr, 32, 64, 4, false));
  CHECK(cost_expert_gemm(s, (double)lr - 8, 32, 64, 4, true) > cost_expert_gemm(s, (double)lr - 8, 32, 64, 4, false));
  CHECK_NEAR(cost_expert_gemm(s, 80, 32, 64, 4, true), 4e-7, 1e-12); /* the launches */
  CHECK_NEAR(cost_expert_gemm(s, 80, 32, 64, 4, false), cost_gemm(s, 80, 32, 64, 4, 0.45), 1e-15);
  /* a grouped call priced at least as fast as the loop's GEMMs: never the loop */
  s->cluster.efficiency.grouped_gemm_cublas = 0.6;
  CHECK_EQ(cost_expert_loop_rows(s, 2), 0);
  s->cluster.efficiency.grouped_gemm_cublas = 0;
  s->cluster.efficiency.kernel_launch = 0;

  /* memory-bound ops by the stack: an RMSNorm reads and writes 2 B x 64 per token */
  const Op *norm = find_op(md, OP_NORM);
  double fused = 128.0 * 256 / 0.7e12; /* 4.68e-8 s */
  t = cost_op(s, md, norm, 128, 128, 1, 1);
  CHECK_NEAR(t.fwd, fused, 1e-9);
  CHECK_NEAR(t.bwd, 2 * fused, 1e-9);
  s->cluster.stack = STACK_PYTORCH_EAGER; /* fp32 intermediates: 8x the bytes, 7 kernels */
  t = cost_op(s, md, norm, 128, 128, 1, 1);
  CHECK_NEAR(t.fwd, 8 * fused, 1e-9);
  s->cluster.efficiency.kernel_launch = 1e-6;
  t = cost_op(s, md, norm, 128, 128, 1, 1);
  CHECK_NEAR(t.fwd, 7e-6, 1e-9);
  s->cluster.efficiency.kernel_launch = 0;

  /* the loss over 256 logits: eager upcasts to fp32 (14 B per logit forward, 18 backward);
   * the generated program reads the bf16 logits once (2 B; 4 backward) */
  const Op *loss = find_op(md, OP_LOSS);
  t = cost_op(s, md, loss, 128, 128, 1, 1);
  CHECK_NEAR(t.fwd, 128.0 * 14 * 256 / 0.7e12, 1e-9);
  CHECK_NEAR(t.bwd, 128.0 * 18 * 256 / 0.7e12, 1e-9);
  s->cluster.stack = STACK_PYTORCH_COMPILE; /* TorchTitan compiles the blocks, not the loss */
  t = cost_op(s, md, loss, 128, 128, 1, 1);
  CHECK_NEAR(t.fwd, 128.0 * 14 * 256 / 0.7e12, 1e-9);
  t = cost_op(s, md, norm, 128, 128, 1, 1); /* but the norm is one fused pass */
  CHECK_NEAR(t.fwd, fused, 1e-9);
  s->cluster.stack = STACK_MTC;
  t = cost_op(s, md, loss, 128, 128, 1, 1);
  CHECK_NEAR(t.fwd, 128.0 * 2 * 256 / 0.7e12, 1e-9);

  /* the LM head (256 x 64, 128 tokens): the generated program recomputes the logits in the
   * backward (4 GEMMs: forward, recompute, dX, dW); PyTorch keeps them (3) */
  const Op *head = find_op(md, OP_LM_HEAD);
  double de = s->cluster.efficiency.dense_gemm, hf = cost_gemm(s, 128, 256, 64, 1, de),
         hx = cost_gemm(s, 128, 64, 256, 1, de),
         hw = cost_gemm(s, 256, 64, 128, 1, de);
  t = cost_op(s, md, head, 128, 128, 1, 1);
  CHECK_NEAR(t.fwd, hf, 1e-12);
  CHECK_NEAR(t.bwd, hf + hx + hw, 1e-12);
  s->cluster.stack = STACK_PYTORCH_COMPILE;
  t = cost_op(s, md, head, 128, 128, 1, 1);
  CHECK_NEAR(t.bwd, hx + hw, 1e-12);
  s->cluster.stack = STACK_MTC;

  /* attention: forward at attention, backward 2.5x the FLOPs at attention_bwd. Causal FLOPs
   * per token: 128 positions x 4 heads x (16 + 16) (head_dim 64 / 4) = 16384; x 128 tokens */
  const Op *at = find_op(md, OP_ATTN_CORE);
  s->cluster.efficiency.attention_bwd = 0.25;
  t = cost_op(s, md, at, 128, 128, 1, 1);
  CHECK_NEAR(t.fwd, 128.0 * 16384 / 50e12, 1e-9);
  CHECK_NEAR(t.bwd, 2.5 * 128.0 * 16384 / 25e12, 1e-9);

  /* the all-to-all at its own efficiency: 4 GPUs, 1 MB each, 3/4 of it to 3 peers over their
   * pair links (mesh, 100 GB/s): 0.75e6 / (3 x 100e9 x eff); default eff = network (0.8) */
  CHECK_NEAR(cost_all_to_all(s, 1e6, 4), 0.75e6 / (3 * 100e9 * 0.8), 1e-9);
  s->cluster.efficiency.all_to_all = 0.5;
  CHECK_NEAR(cost_all_to_all(s, 1e6, 4), 0.75e6 / (3 * 100e9 * 0.5), 1e-9);
  mem_free(&m);
}


/* The all-to-all on mixed links (jupiter-booster: 4 GPUs per node, NVLink 150 GB/s per pair,
 * InfiniBand 25 GB/s per GPU, network efficiency 0.8), by hand:
 *   t = max(b·l/ep / (l·150e9·0.8), b·r/ep / (25e9·0.8)), l = min(ep, 4) − 1, r = ep − min(ep, 4). */
static void all_to_all_mixed_links(void) {
  Mem m = {0};
  Diag d = {.mem = &m};
  Spec *s = spec_load(&m, &d, mem_printf(&m, "%s/specs/deepseek-v3.yaml", src_dir), NULL, 0, NULL, 0);
  CHECK(s != NULL);
  if (!s) return;
  const double b = 1e9, nv = 150e9 * 0.8, ib = 25e9 * 0.8;
  CHECK(cost_all_to_all(s, b, 1) == 0);
  CHECK_NEAR(cost_all_to_all(s, b, 2), b / 2 / nv, 1e-12);            /* one peer, in the node */
  CHECK_NEAR(cost_all_to_all(s, b, 4), b * 3 / 4 / (3 * nv), 1e-12);  /* three peers on NVLink */
  CHECK_NEAR(cost_all_to_all(s, b, 8), b * 4 / 8 / ib, 1e-12);        /* 4 of 8 on IB: IB bounds */
  CHECK_NEAR(cost_all_to_all(s, b, 64), b * 60 / 64 / ib, 1e-12);
  /* a link so fast between nodes that NVLink bounds it: 3/16 of b on 3 pair links */
  s->cluster.links.internode = 1e15;
  CHECK_NEAR(cost_all_to_all(s, b, 16), b * 3 / 16 / (3 * nv), 1e-12);
  s->cluster.links.internode = 25e9;
  /* a layer's dispatch + combine in the forward: 2 all-to-alls of tokens x top_k x hidden x 2 B x
   * imbalance (1.25, under its cap 64 · min(8, 4) / 8 = 32 at ep 64) */
  Model *md = model_build(&m, &d, s);
  CHECK(md != NULL);
  if (!md) return;
  Choice ch = {.fsdp = 256, .ep = 64, .dp_replicate = 1, .efsdp = 4, .micro_batch = 2, .accum = 30,
               .reshard = RESHARD_EVERY_MICRO_BATCH, .ac = AC_FULL, .offload = OFF_NONE,
               .opt_tier = TIER_HBM, .prefetch = 1};
  LayerTime t;
  cost_layer(md, &ch, 3, &t); /* layer 3: the first MoE layer */
  double bytes = 2.0 * 4096 * 8 * 7168 * 2 * 1.25;
  CHECK_NEAR(t.a2a_fwd, 2 * bytes * 60 / 64 / ib, 1e-9);
  CHECK_NEAR(t.a2a_bwd, 4 * bytes * 60 / 64 / ib, 1e-9); /* full checkpointing re-dispatches */
  mem_free(&m);
}

/* The hierarchical all-to-all on jupiter-booster (4 GPUs per node), top_k 8, by hand: over
 * InfiniBand one copy per token and other node holding one of its experts,
 *   ib = b/8 · (N − 1) · (1 − (1 − 1/N)^8),  N = ep / 4 nodes,
 * over NVLink the 3/4 of the copies not for the receiving GPU, on 3 pair links, b·3/4 / (3·nv);
 * t = the larger. Inside a node it is the flat exchange. */
static void all_to_all_hierarchical(void) {
  Mem m = {0};
  Diag d = {.mem = &m};
  Spec *s = spec_load(&m, &d, mem_printf(&m, "%s/specs/deepseek-v3.yaml", src_dir), NULL, 0, NULL, 0);
  CHECK(s != NULL);
  if (!s) return;
  const double b = 1e9, nv = 150e9 * 0.8, ib = 25e9 * 0.8;
  /* node-limited routing (the spec's n_group 8, topk_group 4): 2 nodes of 4 groups each, the
   * other node holds none of the 4 chosen groups with probability C(4,4)/C(8,4) = 1/70 (uniform:
   * 1/256); 16 nodes, each group on 2: the 8 experts fall on M = 8 nodes, 15/16 · 8 · (1 − (7/8)^8)
   * = 4.923 other nodes (uniform: 6.049) */
  CHECK_NEAR(cost_remote_nodes(s, 8, 8), 69.0 / 70, 1e-12);
  CHECK_NEAR(cost_remote_nodes(s, 64, 8), 7.5 * (1 - pow(7.0 / 8, 8)), 1e-12);
  CHECK_NEAR(cost_all_to_all_hier(s, b, 64, 8), b / 8 * 7.5 * (1 - pow(7.0 / 8, 8)) / ib, 1e-12);
  CHECK_NEAR(cost_remote_nodes(s, 12, 8), 2 * (1 - pow(2.0 / 3, 8)), 1e-12); /* 3 nodes: no alignment, uniform */
  CHECK_NEAR(cost_remote_nodes(s, 4, 8), 0, 0); /* one node */
  s->model.moe.n_group = s->model.moe.topk_group = 1; /* uniform routing below */
  CHECK_NEAR(cost_all_to_all_hier(s, b, 4, 8), cost_all_to_all(s, b, 4), 1e-15);
  CHECK_NEAR(cost_all_to_all_hier(s, b, 2, 8), cost_all_to_all(s, b, 2), 1e-15);
  /* 2 nodes: the other node holds none of 8 experts with probability 1/256: 255/256 of a copy */
  CHECK_NEAR(cost_all_to_all_hier(s, b, 8, 8), b / 8 * (255.0 / 256) / ib, 1e-12); /* 6.2256 ms/GB */
  /* 16 nodes: 15 · (1 − (15/16)^8) = 6.0491 copies of 8 (flat: 7.5) */
  CHECK_NEAR(cost_all_to_all_hier(s, b, 64, 8), b / 8 * 15 * (1 - pow(15.0 / 16, 8)) / ib, 1e-12);
  CHECK(cost_all_to_all_hier(s, b, 64, 8) < cost_all_to_all(s, b, 64));
  /* top-1: one copy, always on one node — the flat exchange's IB share (N − 1)/N */
  CHECK_NEAR(cost_all_to_all_hier(s, b, 8, 1), b * 4 / 8 / ib, 1e-12);
  /* fast InfiniBand: NVLink forwarding bounds it, b·3/4 / (3·nv) */
  s->cluster.links.internode = 1e15;
  CHECK_NEAR(cost_all_to_all_hier(s, b, 8, 8), b * 3 / 4 / (3 * nv), 1e-12);
  s->cluster.links.internode = 25e9;
  /* in a layer: dispatch + combine in the forward, with the choice's dispatch */
  Model *md = model_build(&m, &d, s);
  CHECK(md != NULL);
  if (!md) return;
  Choice ch = {.fsdp = 256, .ep = 8, .dp_replicate = 1, .efsdp = 32, .micro_batch = 2, .accum = 30,
               .reshard = RESHARD_EVERY_MICRO_BATCH, .dispatch = DISPATCH_HIERARCHICAL, .ac = AC_NONE,
               .offload = OFF_NONE, .opt_tier = TIER_HBM, .prefetch = 1};
  LayerTime t;
  cost_layer(md, &ch, 3, &t);
  double bytes = 2.0 * 4096 * 8 * 7168 * 2 * 1.25;
  CHECK_NEAR(t.a2a_fwd, 2 * bytes / 8 * (255.0 / 256) / ib, 1e-9);
  ch.dispatch = DISPATCH_FLAT;
  cost_layer(md, &ch, 3, &t);
  CHECK_NEAR(t.a2a_fwd, 2 * bytes * 4 / 8 / ib, 1e-9);
  mem_free(&m);
}


int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_cost SOURCE_DIR\n");
    return 2;
  }
  src_dir = argv[1];
  cost_by_hand();
  kernels_by_hand();
  all_to_all_mixed_links();
  all_to_all_hierarchical();
  return CHECK_DONE("test_cost");
}
