/* cost_kernel.c — the seconds of one op's kernels on one GPU, as a stack runs them.
 *
 * GEMMs: FLOPs at efficiency × bf16_flops (the preset's dense_gemm is the measured best-shape
 * fraction, its grouped_gemm the grouped kernel's; the generated program's experts run as a loop of
 * cuBLAS GEMMs at expert_gemm_loop or one cuBLAS grouped call at grouped_gemm_cublas, by their rows:
 * cost_expert_gemm), with the shape effects NVIDIA's
 * "Matrix Multiplication Background User's Guide" (DU-09799-001, ch. 3) describes: each
 * output tile of gemm_tile_rows × gemm_tile_cols is computed whole (tile quantization: rows
 * and each expert's rows are padded to the tile) and the tiles run in waves of one per SM
 * (wave quantization: a partial last wave costs a whole one). A GEMM is never faster than
 * its operands at HBM speed (small GEMMs are memory-bound) nor than kernel_launch. These
 * shape effects need gpu.sms; without it (the cpu preset) a GEMM is its FLOPs alone.
 * Attention: the flash kernel's FLOPs at attention (forward) and attention_bwd (backward:
 * 2.5× the forward FLOPs, Dao, FlashAttention-2, 2023, §3.1.2); the generated program's (stack
 * mtc, where plan_attention_cudnn) at attention_cudnn and attention_cudnn_bwd, cuDNN's rates. Both GEMMs and attention run
 * at `sustained` × their best-shape rate: what a whole step holds of the clock.
 * Everything else (norms, RoPE, residual adds, the activation, the MoE permute and pad, the
 * cross-entropy) is memory-bound: the bytes its kernels move / (hbm_bandwidth × elementwise),
 * each kernel at least kernel_launch. The stack decides how many bytes and kernels: the
 * generated program and torch.compile fuse each op into one pass; PyTorch eager runs the
 * composite ops one kernel per torch op through fp32 intermediates (table below). */
#include <math.h>

#include "mtc.h"

/* Eager PyTorch's cost of an op relative to one fused pass: bytes × and kernels. Derived by
 * counting the torch ops of the reference implementations and the bytes each reads and
 * writes (assumption: no published per-op measurement was found):
 *   RMSNorm (TorchTitan's, Llama's): x.float(), pow(2), mean, + eps, rsqrt, x * r,
 *     type_as, * weight — fp32 intermediates: 32 B per element vs 4 fused, 7 kernels;
 *   LayerNorm: F.layer_norm is one fused kernel;
 *   RoPE (view_as_complex): float(), complex multiply, type_as — 20 B vs 4, 3 kernels;
 *   SwiGLU: silu(a), then * b — 10 B per output element vs 6, 2 kernels. */
typedef struct { double bytes, kernels; } Eager;
static const Eager eager_rmsnorm = {8.0, 7}, eager_rope = {5.0, 3}, eager_swiglu = {10.0 / 6.0, 2};

/* Cross-entropy over V logits per token, bytes per token. Fused (the generated program: the
 * loss over vocabulary chunks as the LM head writes them; torch.compile): read the bf16
 * logits forward, read and write them backward. Eager and TorchTitan's compile (the loss runs
 * outside the compiled blocks): the fp32 upcast (2 + 4), log_softmax (4 + 4) forward;
 * softmax gradient (4 + 4 + 4) and the cast back (4 + 2) backward, 4 kernels each way. */
static void loss_bytes(Stack st, double V, double *fwd, double *bwd, double *kernels) {
  if (st == STACK_MTC) *fwd = 2 * V, *bwd = 4 * V, *kernels = 1;
  else *fwd = 14 * V, *bwd = 18 * V, *kernels = 4;
}

static double launch_floor(const Spec *s, double t, double kernels) {
  double l = s->cluster.efficiency.kernel_launch * kernels;
  return t > l ? t : l;
}

double cost_gemm(const Spec *s, double M, double N, double K, double groups, double eff) {
  const GpuSpec *g = &s->cluster.gpu;
  const EfficiencySpec *e = &s->cluster.efficiency;
  if (M <= 0 || N <= 0 || K <= 0 || groups <= 0) return 0;
  eff *= e->sustained;
  double math = 2 * M * N * K * groups / (g->bf16_flops * eff);
  if (g->sms <= 0) return launch_floor(s, math, 1); /* no GPU named (the cpu preset): FLOPs alone */
  double tm = e->gemm_tile_rows, tn = e->gemm_tile_cols; /* tile and wave quantization */
  double tiles = groups * ceil(M / tm) * ceil(N / tn);
  double waves = ceil(tiles / (double)g->sms);
  math = 2 * waves * (double)g->sms * tm * tn * K / (g->bf16_flops * eff);
  double mem = groups * 2 * (M * K + N * K + M * N) / (g->hbm_bandwidth * e->elementwise);
  return launch_floor(s, math > mem ? math : mem, 1);
}

static double loop_eff(const EfficiencySpec *e) { return e->expert_gemm_loop > 0 ? e->expert_gemm_loop : e->dense_gemm; }
static double grouped_cublas_eff(const EfficiencySpec *e) {
  return e->grouped_gemm_cublas > 0 ? e->grouped_gemm_cublas : e->grouped_gemm;
}

double cost_expert_gemm(const Spec *s, double rows, double N, double K, double local, bool loop) {
  const EfficiencySpec *e = &s->cluster.efficiency;
  if (!loop) return cost_gemm(s, rows, N, K, local, grouped_cublas_eff(e));
  /* the streams run the experts' tiles side by side (one wave count for all); the host issues one
   * launch per expert */
  double t = cost_gemm(s, rows, N, K, local, loop_eff(e)), l = local * e->kernel_launch;
  return t > l ? t : l;
}

int64_t cost_expert_loop_rows(const Spec *s, int64_t ep) {
  const MoeSpec *m = &s->model.moe;
  if (!m->present || m->experts <= 0 || ep < 1) return 0;
  const EfficiencySpec *e = &s->cluster.efficiency;
  double local = (double)(m->experts / ep), N = (double)m->expert_intermediate, K = (double)s->model.hidden;
  if (loop_eff(e) <= grouped_cublas_eff(e)) return 0;
  /* with the loop's rate above the grouped call's, the loop is no slower exactly when the grouped
   * call takes at least the loop's launches, and the grouped call's time does not fall as rows
   * grow: a bisection over multiples of 8 finds the least such rows */
#define LOOP_WINS(r) (cost_expert_gemm(s, 8.0 * (r), N, K, local, true) <= cost_expert_gemm(s, 8.0 * (r), N, K, local, false))
  int64_t lo = 1, hi = 8192;
  if (!LOOP_WINS(hi)) return 0;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    if (LOOP_WINS(mid)) hi = mid;
    else lo = mid + 1;
  }
#undef LOOP_WINS
  return 8 * lo;
}

double cost_expert_rows(const Spec *s, double T, int64_t ep) {
  const MoeSpec *m = &s->model.moe;
  return m->present && m->experts > 0 ? T * (double)m->top_k * (double)ep / (double)m->experts : 0;
}

/* Forward and backward of one weight: Y (M×N) = X (M×K) · Wᵀ; backward dX = dY · W
 * (M×K, reducing N) and dW = dYᵀ · X (N×K, reducing M). */
static OpTime gemm_fwd_bwd(const Spec *s, double M, double N, double K, double groups, double eff) {
  OpTime t;
  t.fwd = cost_gemm(s, M, N, K, groups, eff);
  t.bwd = cost_gemm(s, M, K, N, groups, eff) + cost_gemm(s, N, K, M, groups, eff);
  return t;
}

/* Memory-bound work of `bytes` per token forward (backward moves twice that: the gradient in
 * and out and the saved input), in `kernels` kernels each way. */
static OpTime streamed(const Spec *s, double T, double bytes, double kernels) {
  double bw = s->cluster.gpu.hbm_bandwidth * s->cluster.efficiency.elementwise;
  return (OpTime){launch_floor(s, T * bytes / bw, kernels), launch_floor(s, 2 * T * bytes / bw, kernels)};
}

static void add(OpTime *a, OpTime b) { a->fwd += b.fwd, a->bwd += b.bwd; }

/* The activation between the up and down projections of an FFN of `width` hidden units per
 * token: SwiGLU reads gate and up, writes their product (6 B per unit, bf16); GELU 4 B. */
static OpTime activation(const Spec *s, double T, double width, Activation a) {
  bool eager = s->cluster.stack == STACK_PYTORCH_EAGER;
  double bytes = (a == ACT_SWIGLU ? 6 : 4) * width;
  if (eager && a == ACT_SWIGLU) return streamed(s, T, bytes * eager_swiglu.bytes, eager_swiglu.kernels);
  return streamed(s, T, bytes, 1);
}

OpTime cost_op(const Spec *s, const Model *md, const Op *o, double T, double seq, int64_t ep, double imbalance) {
  const EfficiencySpec *e = &s->cluster.efficiency;
  const GpuSpec *g = &s->cluster.gpu;
  Stack st = s->cluster.stack;
  bool eager = st == STACK_PYTORCH_EAGER;
  OpTime t = {0, 0};
  if (o->kind == OP_ATTN_CORE) {
    double f = T * seq * o->attn_flops_per_seq;
    double fwd_eff = e->attention, bwd_eff = e->attention_bwd > 0 ? e->attention_bwd : e->attention;
    if (st == STACK_MTC && plan_attention_cudnn(md)) { /* the generated program's: cuDNN's */
      if (e->attention_cudnn > 0) fwd_eff = e->attention_cudnn;
      if (e->attention_cudnn_bwd > 0) bwd_eff = e->attention_cudnn_bwd;
    }
    double peak = g->bf16_flops * e->sustained;
    t.fwd = launch_floor(s, f / (peak * fwd_eff), 1);
    t.bwd = launch_floor(s, 2.5 * f / (peak * bwd_eff), 1);
    return t;
  }
  if (o->kind == OP_LOSS) {
    double fb, bb, k;
    loss_bytes(st, (double)s->model.vocab, &fb, &bb, &k);
    double bw = g->hbm_bandwidth * e->elementwise;
    return (OpTime){launch_floor(s, T * fb / bw, k), launch_floor(s, T * bb / bw, k)};
  }
  if (o->gemm_flops > 0) {
    bool any = false;
    for (int i = 0; i < o->nparams; i++) {
      const Param *p = &o->params[i];
      if (!p->matmul) continue;
      any = true;
      if (p->ndim == 3) { /* routed experts: E/ep local experts, each with its rows padded */
        double E = (double)p->shape[0], local = E / (double)ep;
        double rows = T * (double)s->model.moe.top_k * imbalance * (double)ep / E; /* per expert */
        double N = (double)p->shape[1], K = (double)p->shape[2];
        if (st == STACK_MTC) { /* the generated program's path (ops_moe.c) at the plan's rows */
          int64_t lr = cost_expert_loop_rows(s, ep);
          bool loop = lr > 0 && cost_expert_rows(s, T, ep) >= (double)lr;
          t.fwd += cost_expert_gemm(s, rows, N, K, local, loop);
          t.bwd += cost_expert_gemm(s, rows, K, N, local, loop) + cost_expert_gemm(s, N, K, rows, local, loop);
        } else {
          add(&t, gemm_fwd_bwd(s, rows, N, K, local, e->grouped_gemm));
        }
      } else {
        add(&t, gemm_fwd_bwd(s, T, (double)p->shape[0], (double)p->shape[1], 1, e->dense_gemm));
      }
    }
    if (!any) /* a tied LM head multiplies by the embedding: V × hidden */
      add(&t, gemm_fwd_bwd(s, T, (double)s->model.vocab, (double)s->model.hidden, 1, e->dense_gemm));
    /* the generated program keeps only each token's log-sum-exp from the forward and
     * recomputes every vocabulary chunk's logits in the backward (rt_lm_head_ce_backward):
     * a fourth V × hidden GEMM. PyTorch keeps the logits: three. */
    if (o->kind == OP_LM_HEAD && st == STACK_MTC)
      t.bwd += cost_gemm(s, T, (double)s->model.vocab, (double)s->model.hidden, 1, e->dense_gemm);
    const Layer *ly = o->layer >= 0 ? &md->layers[o->layer] : NULL;
    if (ly && (o->kind == OP_MLP || o->kind == OP_SHARED))
      add(&t, activation(s, T, (double)ly->ffn_width, o->kind == OP_MLP ? s->model.mlp.activation : s->model.moe.activation));
    if (ly && o->kind == OP_EXPERTS)
      add(&t, activation(s, T * imbalance, (double)ly->routed_width, s->model.moe.activation));
    return t;
  }
  double bytes = (double)(o->in_bytes + o->out_bytes);
  if (eager && (o->kind == OP_NORM || o->kind == OP_FINAL_NORM || o->kind == OP_QK_NORM) &&
      s->model.norm == NORM_RMSNORM)
    return streamed(s, T, bytes * eager_rmsnorm.bytes, eager_rmsnorm.kernels);
  if (eager && o->kind == OP_ROPE) return streamed(s, T, bytes * eager_rope.bytes, eager_rope.kernels);
  return streamed(s, T, bytes, 1);
}
