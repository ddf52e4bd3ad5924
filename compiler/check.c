/* check.c — loading a spec (file, --set, preset, schema) and its semantic checks.
 *
 * Each check names the key that is wrong and points at where it was written (or, for a key
 * left to its default, at its section). */
#include <string.h>

#include "mtc.h"

Loc spec_loc(const Spec *s, const char *path) {
  Loc best = {s->root->loc.src, 0, 0};
  char seg[64];
  const YNode *n = s->root;
  for (const char *p = path; n && n->kind == Y_MAP;) {
    const char *dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    if (len >= sizeof seg) break;
    memcpy(seg, p, len);
    seg[len] = '\0';
    YPair *pair = yaml_pair(n, seg);
    if (!pair) break;
    best = dot || pair->val->kind == Y_MAP ? pair->key->loc : pair->val->loc;
    n = pair->val;
    if (!dot) break;
    p = dot + 1;
  }
  return best;
}

static bool given(const Spec *s, const char *path) { return yaml_path(s->root, path) != NULL; }

#define FAIL(path, ...) return diag_error(d, spec_loc(s, path), __VA_ARGS__)

static bool check_name(Diag *d, Spec *s) {
  const char *n = s->name;
  size_t len = strlen(n);
  bool ok = len > 0 && len <= 64 && n[0] != '.' && n[0] != '-';
  for (const char *c = n; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
          *c == '.' || *c == '_' || *c == '-'))
      ok = false;
  if (!ok)
    FAIL("name", "name '%s' cannot name a directory; expected 1 to 64 letters, digits, '.', "
                 "'_' or '-', not starting with '.' or '-'", n);
  return true;
}

static bool check_attention(Diag *d, Spec *s) {
  ModelSpec *md = &s->model;
  AttentionSpec *a = &md->attention;
  static const char *const mla_keys[] = {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                         "qk_rope_head_dim", "v_head_dim"};
  char path[96];
  if (a->kind != ATTN_MLA) {
    for (int i = 0; i < 5; i++) {
      snprintf(path, sizeof path, "model.attention.%s", mla_keys[i]);
      if (given(s, path))
        FAIL(path, "'%s' applies only to attention.kind: mla; expected it removed (or kind: mla)", path);
    }
    if (!given(s, "model.attention.kv_heads")) a->kv_heads = a->heads;
    if (a->kind == ATTN_MHA && a->kv_heads != a->heads)
      FAIL("model.attention.kv_heads", "mha has one KV head per query head, but kv_heads is %lld "
           "and heads %lld; expected kv_heads = heads, or kind: gqa", (long long)a->kv_heads,
           (long long)a->heads);
    if (a->kv_heads > a->heads || a->heads % a->kv_heads != 0)
      FAIL("model.attention.kv_heads", "kv_heads %lld does not divide heads %lld; expected a "
           "divisor of heads (each KV head serves heads / kv_heads query heads)",
           (long long)a->kv_heads, (long long)a->heads);
    if (!given(s, "model.attention.head_dim")) {
      if (md->hidden % a->heads != 0)
        FAIL("model.attention.heads", "hidden %lld is not divisible by heads %lld; expected "
             "heads dividing hidden, or attention.head_dim given", (long long)md->hidden,
             (long long)a->heads);
      a->head_dim = md->hidden / a->heads;
    }
    if (md->position == POS_ROPE && a->head_dim % 2 != 0)
      FAIL(given(s, "model.attention.head_dim") ? "model.attention.head_dim" : "model.attention.heads",
           "head_dim %lld is odd; expected an even head size (RoPE rotates pairs of channels)",
           (long long)a->head_dim);
    return true;
  }
  /* mla */
  for (int i = 1; i < 5; i++) {
    snprintf(path, sizeof path, "model.attention.%s", mla_keys[i]);
    if (!given(s, path))
      FAIL("model.attention.kind", "attention.kind: mla needs '%s'; expected kv_lora_rank, "
           "qk_nope_head_dim, qk_rope_head_dim and v_head_dim (and optionally q_lora_rank)", path);
  }
  if (given(s, "model.attention.head_dim"))
    FAIL("model.attention.head_dim", "mla sizes its heads with qk_nope_head_dim, "
         "qk_rope_head_dim and v_head_dim; expected head_dim removed");
  if (given(s, "model.attention.kv_heads") && a->kv_heads != a->heads)
    FAIL("model.attention.kv_heads", "mla keys and values have one head per query head; "
         "expected kv_heads = heads or kv_heads removed");
  a->kv_heads = a->heads;
  if (a->qk_norm != QKN_NONE)
    FAIL("model.attention.qk_norm", "mla normalizes its latents itself; expected qk_norm: none");
  if (a->bias != ABIAS_NONE)
    FAIL("model.attention.bias", "mla has no q_proj/k_proj/v_proj; expected attention.bias: none (model.bias puts a "
         "bias on every linear, mla's too)");
  if (md->position == POS_LEARNED)
    FAIL("model.position", "mla carries its positions in qk_rope_head_dim; expected position: rope");
  if (a->qk_rope_head_dim % 2 != 0)
    FAIL("model.attention.qk_rope_head_dim", "qk_rope_head_dim %lld is odd; expected an even "
         "size (RoPE rotates pairs of channels)", (long long)a->qk_rope_head_dim);
  return true;
}

/* model.rope_scaling: factor and original_max_position for llama3 and yarn, each type's keys
 * only with it, and llama3's two wavelength bounds in order. */
static bool check_rope_scaling(Diag *d, Spec *s) {
  const RopeScalingSpec *r = &s->model.rope_scaling;
  static const char *const llama3_keys[] = {"low_freq_factor", "high_freq_factor"};
  static const char *const yarn_keys[] = {"beta_fast", "beta_slow", "mscale", "mscale_all_dim"};
  char path[96];
  if (!r->present) return true;
  if (r->type != ROPE_SCALING_NONE && s->model.position != POS_ROPE)
    FAIL("model.rope_scaling.type", "rope_scaling scales RoPE, but model.position is learned; expected type: none");
  if (r->type == ROPE_SCALING_NONE) {
    static const char *const all[] = {"factor", "original_max_position", "low_freq_factor", "high_freq_factor",
                                      "beta_fast", "beta_slow", "mscale", "mscale_all_dim"};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
      snprintf(path, sizeof path, "model.rope_scaling.%s", all[i]);
      if (given(s, path)) FAIL(path, "'%s' without a rope_scaling type; expected type: llama3 or yarn, or the key removed", all[i]);
    }
    return true;
  }
  const char *type = r->type == ROPE_SCALING_LLAMA3 ? "llama3" : "yarn";
  if (!given(s, "model.rope_scaling.factor") || !given(s, "model.rope_scaling.original_max_position"))
    FAIL("model.rope_scaling.type", "rope_scaling type %s needs factor and original_max_position; expected both "
         "(Llama 3.1: factor 8, original_max_position 8192)", type);
  const char *const *other = r->type == ROPE_SCALING_LLAMA3 ? yarn_keys : llama3_keys;
  size_t nother = r->type == ROPE_SCALING_LLAMA3 ? 4 : 2;
  for (size_t i = 0; i < nother; i++) {
    snprintf(path, sizeof path, "model.rope_scaling.%s", other[i]);
    if (given(s, path)) FAIL(path, "'%s' is not a key of rope_scaling type %s; expected it removed", other[i], type);
  }
  if (r->type == ROPE_SCALING_LLAMA3 && r->high_freq_factor <= r->low_freq_factor)
    FAIL("model.rope_scaling.high_freq_factor", "high_freq_factor %g is not above low_freq_factor %g; expected "
         "high > low (Llama 3.1: 4 and 1)", r->high_freq_factor, r->low_freq_factor);
  return true;
}

static bool check_model(Diag *d, Spec *s) {
  ModelSpec *md = &s->model;
  MoeSpec *moe = &md->moe;
  if (md->position == POS_LEARNED && !md->max_position)
    FAIL("model.position", "position: learned needs model.max_position; expected the longest "
         "sequence the position table covers");
  if (md->max_position && s->training.seq_len > md->max_position)
    FAIL("training.seq_len", "seq_len %lld exceeds model.max_position %lld; expected at most "
         "%lld", (long long)s->training.seq_len, (long long)md->max_position, (long long)md->max_position);
  if (!check_attention(d, s)) return false;
  if (!check_rope_scaling(d, s)) return false;
  bool dense_layers = !moe->present;
  if (moe->present) {
    if (moe->top_k > moe->experts)
      FAIL("model.moe.top_k", "top_k %lld is more than the %lld experts; expected top_k <= experts",
           (long long)moe->top_k, (long long)moe->experts);
    if (!moe->shared_intermediate) moe->shared_intermediate = moe->expert_intermediate;
    if (moe->first_dense_layers >= md->layers)
      FAIL("model.moe.first_dense_layers", "first_dense_layers %lld leaves no MoE layer of %lld; "
           "expected fewer than model.layers (or no moe section for a dense model)",
           (long long)moe->first_dense_layers, (long long)md->layers);
    if (moe->interleave > md->layers - moe->first_dense_layers)
      FAIL("model.moe.interleave", "interleave %lld leaves no MoE layer among the %lld after the "
           "dense ones; expected at most %lld", (long long)moe->interleave,
           (long long)(md->layers - moe->first_dense_layers),
           (long long)(md->layers - moe->first_dense_layers));
    if (moe->load_balance == LB_AUX_FREE && !moe->router_bias)
      FAIL("model.moe.load_balance", "aux_free load balancing adjusts a per-expert router bias; "
           "expected moe.router_bias: true");
    if (moe->experts % moe->n_group != 0)
      FAIL("model.moe.n_group", "n_group %lld does not divide the %lld experts; expected a divisor (groups of "
           "equal size)", (long long)moe->n_group, (long long)moe->experts);
    if (!given(s, "model.moe.topk_group")) moe->topk_group = moe->n_group;
    if (moe->topk_group > moe->n_group)
      FAIL("model.moe.topk_group", "topk_group %lld is more than n_group %lld; expected at most n_group",
           (long long)moe->topk_group, (long long)moe->n_group);
    if (moe->topk_group < moe->n_group && moe->experts / moe->n_group < 2)
      FAIL("model.moe.n_group", "n_group %lld leaves groups of one expert, but a group is scored by its two best "
           "experts; expected at most %lld groups", (long long)moe->n_group, (long long)(moe->experts / 2));
    if (moe->top_k > moe->topk_group * (moe->experts / moe->n_group))
      FAIL("model.moe.topk_group", "top_k %lld is more than the %lld experts of topk_group %lld groups; expected "
           "more groups", (long long)moe->top_k, (long long)(moe->topk_group * (moe->experts / moe->n_group)),
           (long long)moe->topk_group);
    if (!moe->shared_experts && moe->shared_expert_gate)
      FAIL("model.moe.shared_expert_gate", "shared_expert_gate scales the shared experts' output, but there are "
           "none; expected moe.shared_experts >= 1 or the key removed");
    if (!moe->shared_experts && given(s, "model.moe.shared_intermediate"))
      FAIL("model.moe.shared_intermediate", "shared_intermediate without shared experts; "
           "expected moe.shared_experts >= 1 or the key removed");
    dense_layers = moe->first_dense_layers > 0 || moe->interleave > 1;
  }
  if (!dense_layers && md->mlp.present)
    FAIL("model.mlp", "every layer is an MoE layer, so model.mlp is unused; expected it removed, "
         "or moe.first_dense_layers / moe.interleave giving dense layers");
  if (md->position == POS_LEARNED && given(s, "model.attention.rope_theta"))
    FAIL("model.attention.rope_theta", "rope_theta applies to position: rope; expected it "
         "removed with position: learned");
  if (dense_layers && !md->mlp.present)
    FAIL("model", "the model has dense layers (%s) but no model.mlp; expected an mlp section "
         "with intermediate", moe->present ? "first_dense_layers or interleave" : "no moe section");
  return true;
}

const char *spec_batch_key(const Spec *s) {
  return s->training.global_batch_tokens ? "training.global_batch_tokens" : "training.global_batch";
}

const char *spec_batch_nearest(Mem *m, const Spec *s, int64_t q) {
  const TrainingSpec *t = &s->training;
  int64_t L = t->seq_len, T = t->global_batch_tokens ? t->global_batch_tokens : t->global_batch * L;
  int64_t lo = T / (q * L) * q, hi = lo + q;
  if (lo * L == T) hi = lo + q, lo -= q; /* (T on the grid: its neighbours) */
  if (!t->global_batch_tokens)
    return lo > 0 ? mem_printf(m, "%lld or %lld", (long long)lo, (long long)hi) : mem_printf(m, "%lld", (long long)hi);
  const char *up = mem_printf(m, "%lld (%lld x %lld)", (long long)(hi * L), (long long)hi, (long long)L);
  return lo > 0 ? mem_printf(m, "%lld (%lld x %lld) or %s", (long long)(lo * L), (long long)lo, (long long)L, up) : up;
}

static bool check_training(Diag *d, Spec *s) {
  TrainingSpec *t = &s->training;
  if (t->global_batch && t->global_batch_tokens)
    FAIL("training.global_batch_tokens", "both global_batch (%lld sequences) and global_batch_tokens are written; "
         "expected one of them: remove the other from the spec, or drop it for this command with --set "
         "training.global_batch=null (or training.global_batch_tokens=null)", (long long)t->global_batch);
  if (!t->global_batch && !t->global_batch_tokens)
    FAIL("training", "missing key 'training.global_batch' (sequences per optimizer step) or "
         "'training.global_batch_tokens' (tokens per optimizer step); expected one of them");
  if (t->global_batch_tokens) {
    int64_t q = t->global_batch_tokens / t->seq_len;
    int64_t W = s->cluster.nodes * s->cluster.gpus_per_node, mb = t->micro_batch ? t->micro_batch : 1;
    if (t->global_batch_tokens % t->seq_len != 0) /* the nearest that the GPUs read without splitting sequences */
      FAIL("training.global_batch_tokens", "global_batch_tokens %lld is not a whole number of sequences of seq_len %lld; "
           "expected a multiple of seq_len; the nearest that also divide over micro_batch x GPUs = %lld x %lld "
           "sequences are %s", (long long)t->global_batch_tokens, (long long)t->seq_len, (long long)mb, (long long)W,
           spec_batch_nearest(d->mem, s, mb * W));
    if (q > (int64_t)1 << 30)
      FAIL("training.global_batch_tokens", "global_batch_tokens %lld is %lld sequences of seq_len %lld; expected at "
           "most 2^30 sequences", (long long)t->global_batch_tokens, (long long)q, (long long)t->seq_len);
    t->global_batch = q;
  }
  t->micro_batch_searched = t->micro_batch == 0; /* auto */
  if (t->micro_batch_searched) t->micro_batch = 1;
  if (t->micro_batch > t->global_batch || t->global_batch % t->micro_batch != 0)
    FAIL("training.micro_batch", "micro_batch %lld does not divide global_batch %lld; expected "
         "global_batch = micro_batch x data-parallel ranks x accumulation steps",
         (long long)t->micro_batch, (long long)t->global_batch);
  return true;
}

static bool check_cluster(Diag *d, Spec *s) {
  /* each number's own range (lr, min_lr_ratio, grad_clip, efficiencies ...) is spec.c's table */
  const TrainingSpec *tr = &s->training;
  if (tr->warmup_steps >= tr->steps)
    FAIL("training.warmup_steps", "warmup_steps %lld leaves none of the %lld steps to decay; "
         "expected fewer warmup steps than steps", (long long)tr->warmup_steps, (long long)tr->steps);
  const EvidenceSpec *ev = &s->cluster.evidence;
  const char *lists[2] = {ev->measured, ev->fitted}, *names[2] = {"measured", "fitted"};
  for (int k = 0; k < 2; k++) /* each word of the lists a cluster.efficiency key */
    for (const char *w = lists[k] ? lists[k] : ""; *w;) {
      size_t n = strcspn(w, " ,");
      bool known = n == 0;
      for (int i = 0; spec_efficiency_key(i) && !known; i++)
        known = strlen(spec_efficiency_key(i)) == n && strncmp(spec_efficiency_key(i), w, n) == 0;
      if (!known)
        FAIL(mem_printf(d->mem, "cluster.evidence.%s", names[k]), "'%.*s' in cluster.evidence.%s is not a "
             "cluster.efficiency key; expected the names of efficiency keys, separated by spaces (see `mtc keys`)",
             (int)n, w, names[k]);
      w += n + strspn(w + n, " ,");
    }
  if (ev->band_low > ev->band_high || (ev->band_rows > 0) != (ev->band_high > 0))
    FAIL("cluster.evidence", "cluster.evidence's band is %g..%g over %lld rows; expected band_low <= band_high, both "
         "given with band_rows > 0, or none of them", ev->band_low, ev->band_high, (long long)ev->band_rows);
  return true;
}

static bool check_plan(Diag *d, Spec *s) {
  PlanSpec *p = &s->plan;
  const ClusterSpec *c = &s->cluster;
  static const char *const unsupported[] = {"plan.tp", "plan.pp"};
  const int64_t vals[] = {p->tp, p->pp};
  for (int i = 0; i < 2; i++)
    if (vals[i] != 1)
      FAIL(unsupported[i], "%s = %lld is not supported yet; expected 1 (mtc lays runs out "
           "with FSDP, EP and data parallelism)", unsupported[i], (long long)vals[i]);
  if (p->offload_activations == OFF_NVME && !c->nvme.present)
    FAIL("plan.offload_activations", "offload to nvme, but the cluster has no NVMe tier; expected "
         "a cluster.nvme section (capacity, bandwidth) or offload_activations: host");
  /* offload moves the layer boundaries that full checkpointing keeps (search.c searches it with full only) */
  if (p->offload_activations != OFF_AUTO && p->offload_activations != OFF_NONE && p->activation_checkpoint != AC_AUTO &&
      p->activation_checkpoint != AC_FULL)
    FAIL("plan.offload_activations", "offload_activations %s moves the layer boundaries that full checkpointing keeps, "
         "but activation_checkpoint is %s; expected activation_checkpoint: full (or auto), or offload_activations: none",
         p->offload_activations == OFF_HOST ? "host" : "nvme",
         p->activation_checkpoint == AC_NONE ? "none" : "selective");
  if (p->optimizer_step == PIN_STEP_HOST && p->optimizer_tier == PIN_TIER_HBM)
    FAIL("plan.optimizer_step", "optimizer_step host runs the step on the host cores, but optimizer_tier "
         "hbm keeps the master weights and optimizer state in HBM; expected optimizer_tier: host (or auto) "
         "or optimizer_step: gpu");
  if (p->prefetch > 1 && p->prefetch >= s->model.layers)
    FAIL("plan.prefetch", "prefetch %lld gathers at least as many layers ahead as the model's %lld; "
         "expected at most %lld, or auto", (long long)p->prefetch, (long long)s->model.layers,
         (long long)(s->model.layers > 1 ? s->model.layers - 1 : 1));
  int64_t world = c->nodes * c->gpus_per_node;
  if (p->fsdp && world % p->fsdp != 0)
    FAIL("plan.fsdp", "fsdp %lld does not divide the %lld GPUs; expected a divisor of "
         "nodes x gpus_per_node", (long long)p->fsdp, (long long)world);
  if (p->dp_replicate && world % p->dp_replicate != 0)
    FAIL("plan.dp_replicate", "dp_replicate %lld does not divide the %lld GPUs; expected a "
         "divisor of nodes x gpus_per_node", (long long)p->dp_replicate, (long long)world);
  if (p->fsdp && p->dp_replicate && p->fsdp * p->dp_replicate != world)
    FAIL("plan.dp_replicate", "fsdp %lld x dp_replicate %lld is not the %lld GPUs; expected "
         "world = dp_replicate x fsdp", (long long)p->fsdp, (long long)p->dp_replicate, (long long)world);
  /* context parallelism: cp consecutive ranks of an FSDP group, each sequence in 2 cp chunks */
  if (p->cp > 1) {
    int64_t fsdp = p->fsdp ? p->fsdp : p->dp_replicate ? world / p->dp_replicate : world;
    if (fsdp % p->cp != 0)
      FAIL("plan.cp", "cp %lld does not divide the FSDP group of %lld ranks; expected a divisor of fsdp (the cp "
           "ranks of a sequence are consecutive ranks of one FSDP group)", (long long)p->cp, (long long)fsdp);
    if (s->training.seq_len % (2 * p->cp) != 0)
      FAIL("plan.cp", "cp %lld splits each sequence in %lld chunks, but seq_len %lld is not a multiple of %lld; "
           "expected a cp with seq_len a multiple of 2 x cp", (long long)p->cp, (long long)(2 * p->cp),
           (long long)s->training.seq_len, (long long)(2 * p->cp));
    if (s->training.global_batch % (world / p->cp) != 0)
      FAIL("plan.cp", "with cp %lld the %lld GPUs read %lld sequences at a time, which does not divide global_batch "
           "%lld; expected a global_batch that is a multiple of GPUs / cp", (long long)p->cp, (long long)world,
           (long long)(world / p->cp), (long long)s->training.global_batch);
  }
  if (p->reshard_experts != RESHARD_AUTO && !s->model.moe.present)
    FAIL("plan.reshard_experts", "reshard_experts is %s but the model has no routed experts; expected auto, or "
         "plan.reshard for every parameter", p->reshard_experts == RESHARD_AFTER_STEP ? "after_step" : "every_micro_batch");
  /* a hierarchical all-to-all needs an EP group over several nodes */
  if (p->moe_dispatch == DISPATCH_HIERARCHICAL && !s->model.moe.present)
    FAIL("plan.moe_dispatch", "moe_dispatch is hierarchical but the model has no experts; expected flat or auto");
  if (p->moe_dispatch == DISPATCH_HIERARCHICAL && p->ep && p->ep <= c->gpus_per_node)
    FAIL("plan.moe_dispatch", "moe_dispatch is hierarchical but ep %lld keeps each EP group inside one node of "
         "%lld GPUs: nothing crosses nodes; expected flat or auto, or an ep that is a multiple of gpus_per_node",
         (long long)p->ep, (long long)c->gpus_per_node);
  if (p->moe_dispatch == DISPATCH_HIERARCHICAL && !p->ep && s->model.moe.present) {
    /* ep auto: the search takes only EP groups of whole nodes (ep a multiple of gpus_per_node
     * above it, dividing the experts and the FSDP group); some must exist */
    int64_t gpn = c->gpus_per_node, group = p->fsdp ? p->fsdp : p->dp_replicate ? world / p->dp_replicate : world;
    bool any = false;
    for (int64_t ep = 2 * gpn; ep <= group && ep <= s->model.moe.experts && !any; ep += gpn)
      any = s->model.moe.experts % ep == 0 && group % ep == 0;
    if (!any)
      FAIL("plan.moe_dispatch", "moe_dispatch is hierarchical, but no EP group can span nodes: ep would be a multiple of "
           "gpus_per_node %lld above it, dividing the %lld experts and the %lld ranks of an FSDP group; expected flat or "
           "auto, or a cluster and model where one can (more nodes, fewer GPUs per node)", (long long)gpn,
           (long long)s->model.moe.experts, (long long)group);
  }
  if (p->moe_dispatch != DISPATCH_AUTO && !plan_dispatch_emitted(p->moe_dispatch))
    FAIL("plan.moe_dispatch", "moe_dispatch is %s: that all-to-all is priced but `mtc compile` does not emit it "
         "yet (the program sends every token copy straight to its expert's rank); expected flat or auto",
         plan_dispatch_name(p->moe_dispatch));
  if (p->ep) {
    if (!s->model.moe.present && p->ep > 1)
      FAIL("plan.ep", "ep %lld but the model has no experts; expected ep: 1 or auto", (long long)p->ep);
    /* an EP group is ep consecutive ranks: inside one node, or whole nodes side by side */
    if (c->gpus_per_node % p->ep != 0 && p->ep % c->gpus_per_node != 0)
      FAIL("plan.ep", "ep %lld neither divides nor is a multiple of gpus_per_node %lld; expected a "
           "divisor (the all-to-all inside a node) or a multiple (whole nodes per EP group)",
           (long long)p->ep, (long long)c->gpus_per_node);
    if (world % p->ep != 0 || (p->fsdp && p->fsdp % p->ep != 0))
      FAIL("plan.ep", "ep %lld does not divide fsdp (%lld) of the %lld GPUs; expected a divisor of the "
           "FSDP group, which holds every expert", (long long)p->ep, (long long)(p->fsdp ? p->fsdp : world),
           (long long)world);
    if (s->model.moe.present && s->model.moe.experts % p->ep != 0)
      FAIL("plan.ep", "ep %lld does not divide the %lld experts; expected whole experts per "
           "rank", (long long)p->ep, (long long)s->model.moe.experts);
    /* an imbalance written in the spec that no routing can reach is a mistake; the default is
     * capped at the maximum silently (plan_moe_imbalance) */
    if (s->model.moe.present && yaml_path(s->root, "plan.moe_imbalance")) {
      const MoeSpec *moe = &s->model.moe;
      int64_t per_rank = moe->experts / p->ep, k = moe->top_k < per_rank ? moe->top_k : per_rank;
      double max = plan_moe_imbalance_max(s, p->ep);
      if (p->moe_imbalance > max)
        FAIL("plan.moe_imbalance", "moe_imbalance %.9g exceeds its physical maximum %.9g for ep %lld: an EP rank "
             "receives at most min(top_k, experts / ep) = %lld copies of each of the ep x tokens, against a "
             "mean of top_k = %lld per token; expected at most %.9g", p->moe_imbalance, max, (long long)p->ep,
             (long long)k, (long long)moe->top_k, max);
    }
  }
  /* with ep chosen by the search, an imbalance above the maximum of every ep it may choose (the
   * EP groups search.c's ep_allowed admits: dividing the experts and the FSDP group, inside a
   * node or whole nodes) is as unreachable */
  if (!p->ep && s->model.moe.present && yaml_path(s->root, "plan.moe_imbalance")) {
    int64_t gpn = c->gpus_per_node, fsdp = p->fsdp ? p->fsdp : p->dp_replicate ? world / p->dp_replicate : world;
    double max = 1.0;
    int64_t at = 1;
    for (int64_t ep = 2; ep <= fsdp && ep <= s->model.moe.experts; ep++)
      if (s->model.moe.experts % ep == 0 && fsdp % ep == 0 && (gpn % ep == 0 || ep % gpn == 0) &&
          plan_moe_imbalance_max(s, ep) > max)
        max = plan_moe_imbalance_max(s, ep), at = ep;
    if (p->moe_imbalance > max)
      FAIL("plan.moe_imbalance", "moe_imbalance %.9g exceeds its physical maximum %.9g for every ep this cluster "
           "allows (the largest at ep %lld: ep x min(top_k, experts / ep) / top_k); expected at most %.9g",
           p->moe_imbalance, max, (long long)at, max);
  }
  return true;
}

bool spec_validate(Diag *d, Spec *s) {
  return check_name(d, s) && check_model(d, s) && check_training(d, s) && check_cluster(d, s) &&
         check_plan(d, s);
}

/* Lays the preset named by cluster.preset under the spec's cluster section. */
static bool merge_preset(Mem *m, Diag *d, Spec *s) {
  YNode *cluster = yaml_get(s->root, "cluster");
  YNode *name = yaml_get(cluster, "preset");
  if (!name) return true;
  if (name->kind != Y_SCALAR || !name->str[0])
    return diag_error(d, name->loc, "'cluster.preset' is not a name; expected a preset such as "
                                    "jupiter-booster or cpu");
  YNode *preset = preset_load(m, d, name->str, s->path, name->loc);
  if (!preset) return false;
  YPair *nested = yaml_pair(preset, "preset");
  if (nested)
    return diag_error(d, nested->key->loc, "a preset cannot name another preset; expected the "
                                           "cluster's keys only");
  yaml_merge_under(m, cluster, preset);
  return true;
}

/* spec_load's work, with the --over values of one sweep point (overs[i]'s value idx[i]) set
 * after the --set overrides. */
static Spec *load(Mem *m, Diag *d, const char *path, const char *text, size_t len, const char *const *sets, int nsets,
                  const char *const *overs, const int *idx, int nover) {
  const Source *src = text ? diag_source(m, path, text, len)
                           : diag_read_source(m, d, path, YAML_MAX_FILE, "a spec file");
  if (!src) return NULL;
  Spec *s = mem_alloc(m, sizeof *s);
  s->path = path;
  s->root = yaml_parse(m, d, src, "a mapping with name, model, cluster and training");
  if (!s->root) return NULL;
  for (int i = 0; i < nsets; i++) { /* KEY=null removes KEY, one of the schema's (a typo would remove nothing) */
    const char *eq = strchr(sets[i], '='), *v = eq ? eq + 1 + strspn(eq + 1, " ") : NULL;
    if (v && (strcmp(v, "null") == 0 || strcmp(v, "~") == 0) && eq > sets[i] &&
        !spec_key_check(d, diag_source(m, "--set", sets[i], strlen(sets[i])), (size_t)(eq - sets[i])))
      return NULL;
    if (!yaml_set(m, d, s->root, sets[i])) return NULL;
  }
  for (int i = 0; i < nover; i++)
    if (!yaml_set_over(m, d, s->root, overs[i], idx[i])) return NULL;
  if (!merge_preset(m, d, s)) return NULL;
  if (!spec_convert(d, s) || !spec_validate(d, s)) return NULL;
  return s;
}

Spec *spec_load(Mem *m, Diag *d, const char *path, const char *text, size_t len,
                const char *const *sets, int nsets) {
  return load(m, d, path, text, len, sets, nsets, NULL, NULL, 0);
}

Spec *spec_load_point(Mem *m, Diag *d, const char *path, const char *const *sets, int nsets,
                      const char *const *overs, const int *idx, int nover) {
  return load(m, d, path, NULL, 0, sets, nsets, overs, idx, nover);
}
