/* test_layout.c — one description of a layer: what the plan keeps of every layer from its
 * forward to its backward (the model graph's saves under plan_keeps) against what the program
 * keeps (the per-layer buffers L<l>_* of the generated arena, plus the boundary X<l>), in
 * elements, under none, selective and full checkpointing, for dense and MoE layers, with and
 * without expert parallelism. The routed rows are the plan's moe_imbalance x the mean on both
 * sides (the program's rounded up to a row). Then name for name (names()): each save of the
 * model graph (compiler/model.c, named as the program's buffers) against the program's buffer of
 * that name, its elements, its arena (bf16 saves in the activation arena, fp32 and int32 ones in
 * R) and whether the policy keeps it, both ways, for every example spec and the variants below.
 *   usage: test_layout SOURCE_DIR */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "emit.h"

static const char *src_dir;

/* Per-layer buffers that are not per-token activations: offsets of the permutation (experts + 1
 * and experts per rank + 1 int32) and aux-free load counts (experts); their sizes do not grow with
 * the tokens, and the model graph counts per token. */
static bool constant(const char *name) {
  const char *u = strchr(name, '_');
  return u && (strcmp(u, "_OFFSETS") == 0 || strcmp(u, "_EOFF") == 0 || strcmp(u, "_LOAD") == 0);
}

/* Elements of layer l's per-layer buffers in the program's arena (not its parameter groups). */
static int64_t program_kept(const Em *e, int l) {
  char pre[32];
  snprintf(pre, sizeof pre, "L%d_", l);
  int64_t n = e->N * e->C; /* the boundary X<l> (a slot of its own with offload: the same bytes) */
  for (int i = 0; i < e->nbufs; i++) {
    const char *b = e->bufs[i].name;
    if (strncmp(b, pre, strlen(pre)) != 0 || constant(b)) continue;
    if (strstr(b, "_DENSE_") || strstr(b, "_EXPERTS_")) continue; /* parameter groups */
    n += e->bufs[i].elems;
  }
  return n;
}

/* Elements the plan keeps of layer l: the model graph's saves of classes plan_keeps keeps, per
 * token, times the tokens; routed saves times the rows one rank's experts take (R / (N·K)). */
static double plan_kept(const Em *e, int l) {
  const Model *md = e->md;
  const Layer *ly = &md->layers[l];
  double routed = e->K ? (double)e->R / (double)(e->N * e->K) : 1, n = 0;
  for (int i = ly->first_op; i < ly->first_op + ly->nops; i++)
    for (int j = 0; j < md->ops[i].nsaved; j++) {
      const Saved *sv = &md->ops[i].saved[j];
      if (plan_keeps(e->ac, sv->cls)) n += (double)sv->elems * (double)e->N * (sv->routed ? routed : 1);
    }
  return n;
}

static const char *const policies[] = {"none", "selective", "full"};

/* The program of spec with the --set options extra (at most 7) under policy a (0 none, 1
 * selective, 2 full) in e, allocations in m; false (a failed CHECK) when it does not plan. */
static bool program(Mem *m, Em *e, const char *spec, const char *const *extra, int nextra, int a) {
  Diag d = {.mem = m};
  const char *sets[8];
  int n = 0;
  for (int i = 0; i < nextra; i++) sets[n++] = extra[i];
  sets[n++] = mem_printf(m, "plan.activation_checkpoint=%s", policies[a]);
  Spec *s = spec_load(m, &d, mem_printf(m, "%s/%s", src_dir, spec), NULL, 0, sets, n);
  Model *md = s ? model_build(m, &d, s) : NULL;
  Plan *p = md ? plan_search(m, md) : NULL;
  CHECK(p != NULL);
  if (!p) {
    fprintf(stderr, "%s: %s", spec, d.msg ? d.msg : "no plan\n");
    return false;
  }
  em_init(e, m, p);
  CHECK_EQ((int)e->ac, a + 1); /* the pinned policy: AC_NONE = 1 */
  return true;
}

static const EmBuf *find(const Em *e, const char *name) {
  for (int i = 0; i < e->nbufs; i++)
    if (strcmp(e->bufs[i].name, name) == 0) return &e->bufs[i];
  return NULL;
}

/* The program's name of save sv of a layer (its L<l>_ or WS_ suffix): the save's own, but with
 * one EP rank the experts' input rows XE are the permuted copies XP (no all-to-all). */
static const char *buf_name(const Em *e, const Saved *sv) {
  if (e->qkv_fused && (!strcmp(sv->name, "Q") || !strcmp(sv->name, "K") || !strcmp(sv->name, "V")))
    return "QKV"; /* the fused projection's rows q | k | v (plan_qkv_fused) */
  if (e->gu_fused[0] && (!strcmp(sv->name, "G") || !strcmp(sv->name, "U"))) return "GU"; /* rows g | u */
  if (e->gu_fused[1] && (!strcmp(sv->name, "SG") || !strcmp(sv->name, "SU"))) return "SGU";
  return e->ep == 1 && strcmp(sv->name, "XE") == 0 ? "XP" : sv->name;
}

/* Name for name: under e's policy, every save of layer l that the policy keeps (plan_keeps) is
 * the program's buffer L<l>_NAME (the boundary X: X<l>, or the offload slots) of the same
 * elements (per token x tokens; routed: per token / top_k x the rows R one rank's experts take)
 * in the arena of its type (bf16: activations; fp32, int32: R), not an alias; every save the
 * policy drops is a workspace WS_NAME (maybe an alias) of at least those elements and no L<l>_
 * buffer; and every per-layer buffer L<l>_* of the program but the tables (constant()) and the
 * parameter groups' is exactly one save of the layer, kept. The class is checked by what each
 * policy keeps: the boundary by all three, the attention's by none and selective, expert and
 * other by none only. And one list of a layer: each kept buffer named as its save is described
 * by the save's `what` and laid out in the model's order of saves (op by op). Returns the
 * mismatches (printed). */
static int names(const Em *e, const char *what) {
  const Model *md = e->md;
  int bad = 0;
  for (int l = 0; l < e->L; l++) {
    const Layer *ly = &md->layers[l];
    char pre[32];
    snprintf(pre, sizeof pre, "L%d_", l);
    int last = -1; /* index in e->bufs of the last kept save's buffer */
    for (int i = ly->first_op; i < ly->first_op + ly->nops; i++)
      for (int j = 0; j < md->ops[i].nsaved; j++) {
        const Saved *sv = &md->ops[i].saved[j];
        int64_t want = sv->routed ? sv->elems / e->K * e->R : sv->elems * e->N;
        bool kept = plan_keeps(e->ac, sv->cls);
        const char *n = buf_name(e, sv);
        if (strcmp(n, "QKV") == 0) /* three saves (Q, K, V) in one buffer: their elements together */
          want = (int64_t)(e->Q + 2 * e->KV) * e->N;
        if (strcmp(n, "GU") == 0 || strcmp(n, "SGU") == 0) want *= 2; /* gate and up saves of one width */
        const EmBuf *b;
        if (strcmp(n, "X") == 0)
          b = find(e, e->offload ? "XSLOT0" : mem_printf(e->m, "X%d", l));
        else
          b = find(e, mem_printf(e->m, "%s%s", kept ? pre : "WS_", n));
        const EmBuf *other = kept ? NULL : find(e, mem_printf(e->m, "%s%s", pre, n));
        int twice = 0;
        for (int i2 = ly->first_op; i2 < ly->first_op + ly->nops; i2++)
          for (int j2 = 0; j2 < md->ops[i2].nsaved; j2++)
            twice += strcmp(md->ops[i2].saved[j2].name, sv->name) == 0;
        bool ok = b && !other && twice == 1 && (sv->dtype == DT_BF16) == (b->arena == EM_ACT && !b->real) &&
                  (kept ? b->elems == want && !b->alias : b->elems >= want);
        /* one list: a kept buffer the program names as the model does is described by the save
         * and registered (so placed in its arena) after the layer's earlier saves' */
        if (ok && kept && strcmp(n, "X") != 0 && strcmp(n, sv->name) == 0) {
          int at = (int)(b - e->bufs);
          if (strcmp(b->what, sv->what) != 0 || at < last) {
            if (bad++ < 5)
              fprintf(stderr, "%s: layer %d buffer %s %s\n", what, l, b->name,
                      at < last ? "comes before an earlier save's buffer" : "is not described as its save");
          }
          last = at;
        }
        if (!ok && bad++ < 5)
          fprintf(stderr, "%s: layer %d save %s (%s, %lld elements, %s) %s\n", what, l, sv->name,
                  policies[e->ac - 1], (long long)want, kept ? "kept" : "recomputed",
                  !b ? "has no program buffer" : other ? "has a per-layer buffer though recomputed"
                  : twice > 1 ? "is not the layer's only save of that name" : "differs from the program's buffer");
      }
    for (int i = 0; i < e->nbufs; i++) {
      const char *b = e->bufs[i].name;
      if (strncmp(b, pre, strlen(pre)) != 0 || constant(b) || strstr(b, "_DENSE_") || strstr(b, "_EXPERTS_")) continue;
      const char *n = b + strlen(pre);
      int hits = 0;
      for (int k = ly->first_op; k < ly->first_op + ly->nops; k++)
        for (int j = 0; j < md->ops[k].nsaved; j++) {
          const Saved *sv = &md->ops[k].saved[j];
          hits += strcmp(buf_name(e, sv), n) == 0 && plan_keeps(e->ac, sv->cls);
        }
      int expect = strcmp(n, "QKV") == 0 ? 3 : strcmp(n, "GU") == 0 || strcmp(n, "SGU") == 0 ? 2 : 1; /* Q, K, V; G, U */
      if (hits != expect && bad++ < 5)
        fprintf(stderr, "%s: layer %d buffer %s is %d kept saves of the model graph, expected %d\n", what, l, b, hits,
                expect);
    }
  }
  return bad;
}

/* names() for spec (with --set options extra) under each policy. */
static void same_names(const char *spec, const char *const *extra, int nextra) {
  for (int a = 0; a < 3; a++) {
    Mem m = {0};
    Em e;
    if (program(&m, &e, spec, extra, nextra, a))
      CHECK_EQ(names(&e, mem_printf(&m, "%s %s", spec, nextra ? extra[nextra - 1] : "")), 0);
    mem_free(&m);
  }
}

static void agree(const char *spec, const char *const *extra, int nextra) {
  for (int a = 0; a < 3; a++) {
    Mem m = {0};
    Em e;
    if (!program(&m, &e, spec, extra, nextra, a)) {
      mem_free(&m);
      continue;
    }
    int bad = 0;
    for (int l = 0; l < e.L; l++) {
      double want = plan_kept(&e, l), got = (double)program_kept(&e, l);
      /* the program rounds the routed rows up to a whole row of its widest routed buffer */
      double slack = e.K ? 4.0 * (double)(e.C > e.Fe ? e.C : e.Fe) : 0;
      if (got < want - 0.5 || got > want + slack + 0.5) {
        if (!bad++)
          fprintf(stderr, "%s %s (%s): layer %d keeps %.0f elements in the program, %.0f in the plan\n", spec,
                  nextra ? extra[nextra - 1] : "", policies[a], l, got, want);
      }
    }
    CHECK_EQ(bad, 0);
    mem_free(&m);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_layout SOURCE_DIR\n");
    return 2;
  }
  src_dir = argv[1];
  const char *ep1[] = {"plan.ep=1"}, *ep2[] = {"plan.ep=2"}, *dense_first[] = {"plan.ep=2", "model.mlp.intermediate=256", "model.moe.first_dense_layers=1"};
  const char *aux_free[] = {"plan.ep=2", "model.moe.router_bias=true", "model.moe.load_balance=aux_free",
                            "model.moe.router=sigmoid"};
  agree("specs/tiny-moe.yaml", ep1, 1);
  agree("specs/tiny-moe.yaml", ep2, 1);
  agree("specs/tiny-moe.yaml", dense_first, 3);
  agree("specs/tiny-moe.yaml", aux_free, 4);
  agree("specs/llama-3.1-8b.yaml", NULL, 0);
  agree("specs/mixtral-8x7b.yaml", NULL, 0);
  agree("specs/europa-1t.yaml", NULL, 0);
  /* name for name: every example spec, MLA with and without q-LoRA, qk-norm per head and full,
   * a dense first layer, GELU experts, LayerNorm, a gated shared expert, one and two EP ranks */
  static const char *const specs[] = {"specs/europa-1t.yaml",   "specs/mixtral-8x7b.yaml", "specs/llama-3.1-8b.yaml",
                                      "specs/tiny-moe.yaml",    "specs/deepseek-v3.yaml",  "specs/qwen3-30b-a3b.yaml",
                                      "specs/bench/moe-1b.yaml", "tests/specs/mla.yaml",  "tests/specs/gelu-experts.yaml",
                                      "tests/specs/layernorm.yaml", "tests/specs/gpt2-style.yaml"};
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) same_names(specs[i], NULL, 0);
  const char *mla[] = {"model.attention.q_lora_rank=12", "cluster.gpus_per_node=2", "plan.ep=2"};
  const char *qkn[] = {"model.attention.qk_norm=full"};
  const char *gate[] = {"plan.ep=2", "model.moe.shared_expert_gate=true"};
  same_names("tests/specs/mla.yaml", mla, 3);
  same_names("specs/qwen3-30b-a3b.yaml", qkn, 1);
  same_names("specs/tiny-moe.yaml", ep1, 1);
  same_names("specs/tiny-moe.yaml", ep2, 1);
  same_names("specs/tiny-moe.yaml", dense_first, 3);
  same_names("specs/tiny-moe.yaml", gate, 2);
  return CHECK_DONE("test_layout");
}
