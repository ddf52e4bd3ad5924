/* test_layout.c — one description of a layer: what the plan keeps of every layer from its
 * forward to its backward (the model graph's saves under plan_keeps) against what the program
 * keeps (the per-layer buffers L<l>_* of the generated arena, plus the boundary X<l>), in
 * elements, under none, selective and full checkpointing, for dense and MoE layers, with and
 * without expert parallelism. The routed rows are the plan's moe_imbalance x the mean on both
 * sides (the program's rounded up to a row). Storage types are not compared here: the program
 * keeps fp32 where the plan counts bf16 (issue 12's typed storage).
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

static void agree(const char *spec, const char *const *extra, int nextra) {
  static const char *const policies[] = {"none", "selective", "full"};
  for (int a = 0; a < 3; a++) {
    Mem m = {0};
    Diag d = {.mem = &m};
    const char *sets[8];
    int n = 0;
    for (int i = 0; i < nextra; i++) sets[n++] = extra[i];
    sets[n++] = mem_printf(&m, "plan.activation_checkpoint=%s", policies[a]);
    Spec *s = spec_load(&m, &d, mem_printf(&m, "%s/%s", src_dir, spec), NULL, 0, sets, n);
    Model *md = s ? model_build(&m, &d, s) : NULL;
    Plan *p = md ? plan_search(&m, md) : NULL;
    CHECK(p != NULL);
    if (!p) {
      fprintf(stderr, "%s", d.msg ? d.msg : "no plan\n");
      mem_free(&m);
      continue;
    }
    Em e;
    em_init(&e, &m, p);
    CHECK_EQ((int)e.ac, a + 1); /* the pinned policy: AC_NONE = 1 */
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
  return CHECK_DONE("test_layout");
}
