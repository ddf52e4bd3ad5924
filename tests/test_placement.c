/* test_placement.c — the placement and Muon's scratch with many experts. compiler/placement.c
 * and muon_work.c count experts per shard and split experts per shard boundary; they must give
 * what the per-expert loops they replaced gave (placement_oracle.h), field by field and bit for
 * bit: on small models over every layout (whole-expert and flat shards, experts split over
 * ranks), on a few large layouts, and where a rank's Newton-Schulz load passes 2^53 and the
 * one-at-a-time sums round. The placement lists EP rank 0's expert runs only: on every one of
 * those layouts, every EP rank r's run of the per-expert loops must be EP rank 0's with first +
 * r x experts per EP rank and every other field equal (the rule plan.json states). And a
 * 65,536-expert europa-1t plans, 128 experts on each of 512 EP ranks.
 * usage: test_placement SOURCE_DIR */
#include "placement_oracle.h"
#include "plan_test.h"

static Model *model(Mem *m, const char *spec, const char *const *sets, int n) {
  Diag d = {.mem = m};
  Spec *s = spec_load(m, &d, mem_printf(m, "%s/%s", src_dir, spec), NULL, 0, sets, n);
  Model *md = s ? model_build(m, &d, s) : NULL;
  if (!md) fprintf(stderr, "unexpected error:\n%s", d.msg ? d.msg : "(none)\n");
  return md;
}

static int failures_before;

/* The first mismatch of each comparison is printed; the count goes to CHECK. */
static bool differ(bool bad, const char *what, const char *field, int64_t fsdp, int64_t ep) {
  if (bad && check_failures == failures_before)
    fprintf(stderr, "%s fsdp %lld ep %lld: %s differs from the per-expert loop\n", what, (long long)fsdp,
            (long long)ep, field);
  return bad;
}

static int same_run(const ExpertRun *a, const ExpertRun *b) {
  return a->layer == b->layer && strcmp(a->matrix, b->matrix) == 0 && a->first == b->first && a->count == b->count && a->per == b->per && a->owner == b->owner &&
         a->moving == b->moving;
}

/* Placement a against the oracle's b (both list EP rank 0's runs). */
static int placement_diffs(const Placement *a, const Placement *b, const char *what, const Choice *ch) {
  int n = 0;
#define D(cond, field) n += differ(!(cond), what, field, ch->fsdp, ch->ep)
  D(a->ep == b->ep && a->experts_per_rank == b->experts_per_rank, "ep, experts_per_rank");
  D(a->muon == b->muon && a->too_large == b->too_large, "muon, too_large");
  D(a->matrices == b->matrices, "matrices");
  D(a->ns_flops_total == b->ns_flops_total, "ns_flops_total");
  D(a->ns_flops_max_rank == b->ns_flops_max_rank, "ns_flops_max_rank");
  D(a->dense_params == b->dense_params, "dense_params");
  D(a->moving_matrices == b->moving_matrices, "moving_matrices");
  D(a->moving_expert_matrices == b->moving_expert_matrices, "moving_expert_matrices");
  D(a->moving_expert_params == b->moving_expert_params, "moving_expert_params");
  D(a->moving_bytes_rank == b->moving_bytes_rank, "moving_bytes_rank");
  D(a->ndense == b->ndense, "ndense");
  for (int i = 0; i < a->ndense && i < b->ndense; i++)
    D(a->dense[i].layer == b->dense[i].layer && strcmp(a->dense[i].matrix, b->dense[i].matrix) == 0 &&
      a->dense[i].owner == b->dense[i].owner, "a dense owner");
  D(a->nruns == b->nruns, "nruns");
  for (int i = 0; i < a->nruns && i < b->nruns; i++) D(same_run(&a->runs[i], &b->runs[i]), "an expert run");
#undef D
  return n;
}

/* Every EP rank's runs of the per-expert loops (all, n of them: ep consecutive runs per layer and
 * matrix kind, EP rank 0's first) against the rule from EP rank 0's runs ep0 (nruns): EP rank r's
 * is EP rank 0's with first + r x El, everything else equal. Returns the mismatches. */
static int rule_diffs(const o_Run *all, int n, const ExpertRun *ep0, int nruns, int64_t El, const char *what,
                      const Choice *ch) {
  int bad = differ(n != nruns * ch->ep, what, "runs of all EP ranks", ch->fsdp, ch->ep);
  for (int i = 0; !bad && i < n; i++) {
    ExpertRun want = ep0[i / ch->ep];
    want.first += all[i].ep_rank * El;
    bad += differ(all[i].ep_rank != i % ch->ep || !same_run(&all[i].r, &want), what,
                  "an EP rank's run against EP rank 0's shifted", ch->fsdp, ch->ep);
  }
  return bad;
}

static int64_t rule_runs_checked; /* EP ranks' runs other than EP rank 0's checked by the rule */

/* One layout of md: plan_placement, plan_placement_ep0 and plan_muon_work (with the placement's
 * owners and with none) against the oracle. */
static void compare(const Model *md, int64_t fsdp, int64_t ep, const char *what) {
  Mem m = {0};
  Choice ch = {.fsdp = fsdp, .ep = ep, .efsdp = fsdp / ep, .dp_replicate = 1, .micro_batch = 1, .accum = 1};
  failures_before = check_failures;
  o_Run *all;
  int nall;
  const Placement *a = plan_placement(&m, md, &ch), *b = oracle_placement(&m, md, &ch, &all, &nall);
  CHECK_EQ(placement_diffs(a, b, what, &ch), 0);
  if (b->muon && !b->too_large) {
    CHECK_EQ(rule_diffs(all, nall, a->runs, a->nruns, a->experts_per_rank, what, &ch), 0);
    rule_runs_checked += nall - a->nruns;
  }
  PlanMuonWork wa = plan_muon_work(&m, md, &ch, a), wb = oracle_muon_work(&m, md, &ch, b);
  CHECK(!differ(wa.elems != wb.elems || wa.step != wb.step || wa.exchange != wb.exchange, what, "plan_muon_work", fsdp, ep));
  wa = plan_muon_work(&m, md, &ch, NULL), wb = oracle_muon_work(&m, md, &ch, NULL);
  CHECK(!differ(wa.elems != wb.elems || wa.step != wb.step || wa.exchange != wb.exchange, what, "plan_muon_work without owners", fsdp, ep));
  mem_free(&m);
}

/* Every layout of fsdp <= max_fsdp ranks: ep divides the experts and fsdp. */
static int every_layout(const Model *md, int64_t max_fsdp, const char *what) {
  int64_t E = md->spec->model.moe.present ? md->spec->model.moe.experts : 1;
  int n = 0;
  for (int64_t f = 1; f <= max_fsdp; f++)
    for (int64_t ep = 1; ep <= f; ep++)
      if (f % ep == 0 && E % ep == 0) compare(md, f, ep, what), n++;
  return n;
}

/* tiny-moe with Muon, two layers, over every layout up to 24 ranks: expert counts that the
 * shard groups divide and do not, expert sizes below and above a shard. */
static void small_models(void) {
  static const char *experts[] = {"1", "2", "3", "4", "6", "8", "12"}, *inter[] = {"24", "100", "256"},
                    *hidden[] = {"128", "40"};
  int layouts = 0;
  for (int h = 0; h < 2; h++)
    for (int e = 0; e < 7; e++)
      for (int i = 0; i < 3; i++) {
        Mem m = {0};
        const char *sets[] = {"training.optimizer=muon", "model.layers=2", "model.moe.top_k=1",
                              mem_printf(&m, "model.moe.experts=%s", experts[e]),
                              mem_printf(&m, "model.moe.expert_intermediate=%s", inter[i]),
                              mem_printf(&m, "model.hidden=%s", hidden[h])};
        const Model *md = model(&m, "specs/tiny-moe.yaml", sets, 6);
        CHECK(md != NULL);
        if (md)
          layouts += every_layout(md, 24, mem_printf(&m, "tiny-moe experts %s intermediate %s hidden %s",
                                                     experts[e], inter[i], hidden[h]));
        mem_free(&m);
      }
  CHECK(layouts > 1000);
  /* the example specs with Muon, on the layouts their search tries most */
  static const char *specs[] = {"specs/mixtral-8x7b.yaml", "specs/qwen3-30b-a3b.yaml", "specs/deepseek-v3.yaml"};
  for (int k = 0; k < 3; k++) {
    Mem m = {0};
    const char *sets[] = {"training.optimizer=muon"};
    const Model *md = model(&m, specs[k], sets, 1);
    CHECK(md != NULL);
    if (md) every_layout(md, k == 0 ? 64 : 16, specs[k]);
    mem_free(&m);
  }
}

/* europa-1t at 1,000 and 4,096 experts on whole-expert and flat layouts (128 experts of an EP
 * rank over 48 ranks: split experts that move; 250 over 96), the example's own layout. */
static void large_layouts(void) {
  static const struct { const char *experts; int64_t fsdp, ep; } cases[] = {
      {"384", 384, 4}, {"384", 48, 4}, {"1000", 384, 4}, {"1000", 1000, 1000}, {"4096", 1536, 32},
      {"4096", 4096, 64}, {"4096", 24576, 4096}, {"4096", 96, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    Mem m = {0};
    const char *sets[] = {mem_printf(&m, "model.moe.experts=%s", cases[i].experts)};
    const Model *md = model(&m, "specs/europa-1t.yaml", sets, 1);
    CHECK(md != NULL);
    if (md) compare(md, cases[i].fsdp, cases[i].ep, mem_printf(&m, "europa-1t experts %s", cases[i].experts));
    mem_free(&m);
  }
}

/* One layer of 65,536 experts of 6,144 x 1,791: each costs 10 x 1791^2 x 14,079 (2 mod 4) and a
 * rank of 3 or 4 holds about 2.2e16 > 2^54 of them, so the loop's sums round: the placement
 * must round as it did (whole experts over 4 ranks, flat over 3). */
static void rounding(void) {
  Mem m = {0};
  const char *sets[] = {"training.optimizer=muon", "model.layers=1", "model.hidden=6144", "model.moe.top_k=1",
                        "model.moe.experts=65536", "model.moe.expert_intermediate=1791"};
  const Model *md = model(&m, "specs/tiny-moe.yaml", sets, 6);
  CHECK(md != NULL);
  if (md) {
    static const int64_t layouts[][2] = {{4, 1}, {3, 1}, {6, 2}, {8, 2}, {1, 1}};
    for (int i = 0; i < 5; i++) compare(md, layouts[i][0], layouts[i][1], "65,536 experts of 6144 x 1791");
    Choice ch = {.fsdp = 4, .ep = 1, .efsdp = 4};
    const Placement *pl = plan_placement(&m, md, &ch);
    CHECK(pl->ns_flops_max_rank > 0x1p54); /* the case under test: sums past 2^54 */
  }
  mem_free(&m);
}

/* europa-1t with 65,536 experts on 16,384 nodes (sequences of 32,768 tokens, one per GPU):
 * a plan fits; EP 512 ranks of 128 experts each, one whole expert per rank of a shard group. */
static void many_experts(void) {
  Mem m = {0};
  const char *sets[] = {"model.moe.experts=65536", "cluster.nodes=16384", "training.global_batch=65536",
                        "training.seq_len=32768", "plan.ep=512"};
  Plan *p = plan(&m, "specs/europa-1t.yaml", sets, 5);
  CHECK(p && p->feasible && p->placement && p->placement->muon);
  if (p && p->feasible && p->placement) {
    const Placement *pl = p->placement;
    const Choice *ch = &p->best.ch;
    CHECK_EQ(ch->fsdp, 65536);
    CHECK_EQ(ch->ep, 512);
    CHECK_EQ(pl->experts_per_rank, 128);
    CHECK_EQ(plan_expert_per(pl->experts_per_rank, ch->efsdp), 1);
    CHECK_EQ(pl->nruns, 74 * 3); /* EP rank 0's; the other 511 follow by the rule */
    int64_t bad = 0, matrices = 0;
    for (int i = 0; i < pl->nruns; i++) {
      const ExpertRun *r = &pl->runs[i];
      matrices += r->count * ch->ep;
      if (r->count != 128 || r->per != 1 || r->first != 0 || r->moving != 0) bad++;
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(matrices, 74LL * 65536 * 3);
    CHECK_EQ(pl->matrices, p->md->muon_matrices);
    CHECK_EQ(pl->moving_expert_matrices, 0);
    CHECK_NEAR(pl->ns_flops_total, p->md->ns_flops, 1e-9);
    double mean = pl->ns_flops_total / (double)ch->fsdp;
    CHECK(pl->ns_flops_max_rank >= mean && pl->ns_flops_max_rank <= 1.10 * mean);
  }
  mem_free(&m);
}

/* plan_shard_values_max as it was, O(n + ranks): a dense count per rank and a difference array
 * of the ranks a range covers whole (the reference for the sparse sweep). */
static int64_t dense_shard_values_max(const int64_t *r, int n, int64_t shard, int64_t ranks) {
  if (n == 0 || shard <= 0) return 0;
  int64_t *cnt = calloc((size_t)ranks + 1, sizeof *cnt), *full = calloc((size_t)ranks + 2, sizeof *full);
  for (int i = 0; i < n; i++) {
    int64_t a = r[2 * i], b = r[2 * i + 1];
    if (b <= a) continue;
    int64_t r0 = a / shard, r1 = (b - 1) / shard;
    if (r1 >= ranks) r1 = ranks - 1, b = ranks * shard;
    if (r0 == r1) {
      cnt[r0] += b - a;
      continue;
    }
    cnt[r0] += (r0 + 1) * shard - a;
    cnt[r1] += b - r1 * shard;
    full[r0 + 1]++, full[r1]--;
  }
  int64_t most = 0, cover = 0;
  for (int64_t k = 0; k < ranks; k++) {
    cover += full[k];
    int64_t v = cnt[k] + cover * shard;
    if (v > most) most = v;
  }
  free(cnt), free(full);
  return most;
}

/* The sparse sweep against it: random disjoint ranges (short ones inside a shard, long ones over
 * many shards, empty ones, in order and shuffled) over 1 to 40 ranks, shards of 1 to 50 values. */
static void shard_values(void) {
  uint64_t x = 88172645463325252ull;
#define RND(n) (x ^= x << 13, x ^= x >> 7, x ^= x << 17, (int64_t)(x % (uint64_t)(n)))
  int bad = 0, cases = 0;
  for (int t = 0; t < 20000; t++) {
    Mem m = {0};
    int64_t ranks = 1 + RND(40), shard = 1 + RND(50), total = ranks * shard, r[2 * 32];
    int n = 0;
    for (int64_t at = RND(shard + 1); n < 32 && at < total; n++) {
      int64_t len = RND(4) == 0 ? RND(4 * shard + 1) : RND(shard / 2 + 2);
      if (at + len > total) len = total - at;
      r[2 * n] = at, r[2 * n + 1] = at + len;
      at += len + (RND(3) ? RND(2 * shard + 1) : 0);
    }
    for (int i = n - 1; RND(2) && i > 0; i--) { /* sometimes out of order */
      int j = (int)RND(i + 1);
      int64_t a = r[2 * i], b = r[2 * i + 1];
      r[2 * i] = r[2 * j], r[2 * i + 1] = r[2 * j + 1], r[2 * j] = a, r[2 * j + 1] = b;
    }
    int64_t want = dense_shard_values_max(r, n, shard, ranks), got = plan_shard_values_max(&m, r, n, shard, ranks);
    if (got != want && !bad++)
      fprintf(stderr, "plan_shard_values_max: %lld, the dense count %lld (ranks %lld shard %lld, %d ranges)\n",
              (long long)got, (long long)want, (long long)ranks, (long long)shard, n);
    cases += n > 0;
    mem_free(&m);
  }
#undef RND
  CHECK_EQ(bad, 0);
  CHECK(cases > 15000);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_placement SOURCE_DIR\n");
    return 2;
  }
  src_dir = argv[1];
  small_models();
  large_layouts();
  CHECK(rule_runs_checked > 100000); /* the rule checked on many EP ranks' runs, not vacuously */
  printf("test_placement: the EP-rank rule held for %lld runs of EP ranks > 0\n", (long long)rule_runs_checked);
  rounding();
  many_experts();
  shard_values();
  return CHECK_DONE("test_placement");
}
