/*
 * mtrt_ops.h — libmtrt's ops: forward and backward of every op of mtc's model graph, the
 * contract both backends implement. runtime/cpu/ implements it over host pointers with OpenBLAS
 * (the numerical reference); runtime/cuda/ the same calls over device pointers (mtrt_cuda.h),
 * checked against the cpu ones.
 *
 * Compute type `real`: float, or double when built with MTRT_REAL_DOUBLE (gradient checks).
 * Storage type `act` (mtrt_real.h) for activations, their gradients, gathered parameters and
 * the unsharded weight gradients (dw, db: a unit's gradient before its reduce-scatter, the plan's
 * grads.bf16_unsharded); `real` for statistics (rstd, lse), routing values and loss scratch.
 * Weight gradients are summed in real (fp32) and added into the act gradient: on the cuda backend
 * a GEMM's dw is cuBLAS's fp32 accumulation added into bf16 (beta 1), a norm's or bias's dw one
 * fp32 sum over all rows added once, an embedding row's dw one add per token.
 * Row-major tensors; shape comments use N tokens (= B sequences × T positions), C hidden,
 * V vocabulary, nh query heads, nkv KV heads, hd head size, E experts, K top_k, F an FFN
 * width (not I: <complex.h>, which cblas.h includes, defines I). GEMMs go through CBLAS (OpenBLAS).
 *
 * Conventions (as llm.c): forward functions overwrite their outputs; backward functions
 * ADD into every gradient they are given (parameter gradients accumulate over micro-batches,
 * input gradients over branches), and skip any gradient pointer that is NULL. The exceptions
 * WRITE an input gradient, so that its first writer needs no zeroed buffer (and the cuda backend
 * no memset pass): rt_matmul_backward_set's dx, rt_attention_backward's dq, dk, dv (and
 * rt_attention_qkv_backward's dqkv),
 * rt_swiglu_backward's dg, du (rt_swiglu_rows_backward's dgu), rt_gelu_backward's dx,
 * rt_moe_combine_backward's dyp and dwts, rt_experts_backward's dxp, and the routers' dlogits
 * (rt_router_backward, rt_router_weights_backward: the whole (N,E) rows, zeros where no expert
 * was selected; the balancing losses' backward then add).
 * Ops never allocate: callers pass every buffer (the plan sizes them).
 */
#ifndef MTRT_OPS_H
#define MTRT_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mtrt_real.h"

/* Elementwise, n values: out = a + b (the residual connection); acc += x; x = 0. */
void rt_add(act *out, const act *a, const act *b, size_t n);
void rt_accumulate(act *acc, const act *x, size_t n);
void rt_zero(act *x, size_t n);
/* dst = src, n values (not overlapping). */
void rt_copy(act *dst, const act *src, size_t n);
/* The same over real values (fp32 gradients, expert loads; either side may be the state arena
 * in pinned host memory). */
void rt_zero_real(real *x, size_t n);
void rt_copy_real(real *dst, const real *src, size_t n);
/* dst = src rounded to the activation type, n values: a master shard (src: the state arena, in
 * device or pinned host memory) into the shard the all-gathers read. */
void rt_cast_to_act(act *dst, const real *src, size_t n);

/* out (N,C) = wte[tok[n]] with wte (V,C). Token ids must be in [0, V) (the data loader checks). */
void rt_embedding_forward(act *out, const int32_t *tok, const act *wte, int N, int C);
void rt_embedding_backward(act *dwte, const act *dout, const int32_t *tok, int N, int C);

/* Learned absolute positions (GPT-2, Radford et al. 2019; HF modeling_gpt2.py: inputs_embeds +
 * wpe(position_ids)): x (B,T,C) += wpe[t] for position t = 0..T-1 of each sequence, with wpe
 * (max_position, C), T <= max_position. Backward: dwpe[t] += Σ_b dx[b,t]. */
void rt_position_forward(act *x, const act *wpe, int B, int T, int C);
void rt_position_backward(act *dwpe, const act *dx, int B, int T, int C);

/* RMSNorm (Zhang & Sennrich 2019): out = x / sqrt(mean(x²) + eps) ⊙ w. x, out (N,C); w (C);
 * rstd (N) saved for backward. */
void rt_rmsnorm_forward(act *out, real *rstd, const act *x, const act *w, int N, int C, real eps);
void rt_rmsnorm_backward(act *dx, act *dw, const act *dout, const act *x, const act *w,
                         const real *rstd, int N, int C);
/* The residual add and the RMSNorm after it in one pass: res = x + y (rt_add's values), then
 * out, rstd = rt_rmsnorm_forward of res. */
void rt_add_rmsnorm_forward(act *res, act *out, real *rstd, const act *x, const act *y, const act *w, int N, int C,
                            real eps);
/* qk-norm (Qwen3: per head, modeling_qwen3.py's q_norm/k_norm over head_dim; OLMoE: full, over
 * all heads' channels of a token): RMSNorm of `rows` rows of `width` values with weight w
 * (width), before RoPE. per_head: rows = N · heads, width = hd; full: rows = N, width =
 * heads · hd. x, out (rows, width); rstd (rows). The same arithmetic as rt_rmsnorm_*; its own
 * entry point because a backend may specialize rt_rmsnorm_* to (N, C) at compile time. */
void rt_qk_norm_forward(act *out, real *rstd, const act *x, const act *w, int64_t rows, int width, real eps);
void rt_qk_norm_backward(act *dx, act *dw, const act *dout, const act *x, const act *w, const real *rstd,
                         int64_t rows, int width);

/* LayerNorm (Ba et al. 2016; torch.nn.LayerNorm as HF's GPT-2 uses it): with μ the row mean and
 * σ² the biased variance, out = (x − μ) / sqrt(σ² + eps) ⊙ w + b. x, out (N,C); w (C); b (C) or
 * NULL (no bias); mean, rstd (N) saved for backward. Backward: with x̂ = (x − μ) rstd and
 * g = dout ⊙ w, dx += rstd (g − mean(g) − x̂ mean(g x̂)); dw += dout x̂; db += dout (db may be
 * NULL, and must be when there is no bias). */
void rt_layernorm_forward(act *out, real *mean, real *rstd, const act *x, const act *w, const act *b, int N, int C,
                          real eps);
void rt_layernorm_backward(act *dx, act *dw, act *db, const act *dout, const act *x, const act *w,
                           const real *mean, const real *rstd, int N, int C);

/* A bias over the columns of a matrix: out (N,C) += b (C); backward db (C) += Σ_n dout[n]. The
 * bias of a norm under model.bias with rmsnorm (the planner's "biases on every linear and norm"). */
void rt_bias_forward(act *out, const act *b, int N, int C);
void rt_bias_backward(act *db, const act *dout, int N, int C);

/* A linear layer, nn.Linear layout: out (N,OC) = x (N,IC) · wᵀ + bias, w (OC,IC), bias (OC) or
 * NULL. */
void rt_matmul_forward(act *out, const act *x, const act *w, const act *bias, int N, int IC, int OC);
void rt_matmul_backward(act *dx, act *dw, act *dbias, const act *dout, const act *x,
                        const act *w, int N, int IC, int OC);
/* The same with dx written, not added (cuBLAS beta 0): the first writer of an input gradient;
 * dw and dbias still add (they accumulate over micro-batches). */
void rt_matmul_backward_set(act *dx, act *dw, act *dbias, const act *dout, const act *x,
                            const act *w, int N, int IC, int OC);
/* The router's linear layer, its logits (N,E) and their gradient in real (routing is decided in
 * fp32): logits = x (N,IC) · wᵀ, w (E,IC); backward dx += dlogits · w, dw += dlogitsᵀ · x. */
void rt_router_logits_forward(real *logits, const act *x, const act *w, int N, int IC, int E);
void rt_router_logits_backward(act *dx, act *dw, const real *dlogits, const act *x, const act *w, int N, int IC,
                               int E);

/* RoPE (Su et al. 2021) in the half-split layout of Llama/GPT-NeoX: channel i pairs with
 * i + hd/2, angle = position × theta^(−2i/hd). x (B,T,H,hd), rotated in place; backward
 * rotates the gradient back in place. hd must be even. */
void rt_rope_forward(act *x, int B, int T, int H, int hd, real theta);
void rt_rope_backward(act *dx, int B, int T, int H, int hd, real theta);
/* RoPE with Llama 3.1's frequency scaling (transformers' _compute_llama3_parameters): each
 * inverse frequency f_i = theta^(-2i/hd), of wavelength λ = 2π / f_i, becomes f_i / factor where
 * λ > orig / low, stays f_i where λ < orig / high, and between is (1 − s) f_i / factor + s f_i
 * with s = (orig / λ − low) / (high − low). Angles in double. x as rt_rope_forward's. */
void rt_rope_llama3_forward(act *x, int B, int T, int H, int hd, real theta, real factor, real low, real high,
                            real orig);
void rt_rope_llama3_backward(act *dx, int B, int T, int H, int hd, real theta, real factor, real low, real high,
                             real orig);
/* RoPE with YaRN (Peng et al. 2023; transformers' _compute_yarn_parameters): pair i's inverse
 * frequency blends f_i = theta^(-2i/hd) (extrapolation) and f_i / factor (interpolation) by a
 * ramp over the pairs between floor(d(beta_fast)) and ceil(d(beta_slow)), d(r) = hd ln(orig /
 * (2π r)) / (2 ln theta); the rotation is scaled by attn (the attention factor: with cos and
 * sin, q and k each get it). Backward: the transposed rotation, scaled by attn. */
void rt_rope_yarn_forward(act *x, int B, int T, int H, int hd, real theta, real factor, real orig, real beta_fast,
                          real beta_slow, real attn);
void rt_rope_yarn_backward(act *dx, int B, int T, int H, int hd, real theta, real factor, real orig, real beta_fast,
                           real beta_slow, real attn);

/* Causal grouped-query attention, softmax(q kᵀ / sqrt(hd)) v with query head h reading KV head
 * h / (nh / nkv). q (B,T,nh,hd); k (B,T,nkv,hd); v (B,T,nkv,vd); out (B,T,nh,vd) (vd: the value
 * head size, hd for mha/gqa, MLA's v_head_dim); lse the log-sum-exp of each score row, saved for
 * backward (O(T) memory: scores are recomputed, never stored): (B,nh,T) on the cpu backend and
 * from cuDNN, (B·T,nh) from the cuda backend's own kernels; only its own backend reads it. The
 * backward WRITES dq, dk, dv (as cuDNN does; the own cuda kernels and the cpu backend alike): no
 * caller zeroes them. */
void rt_attention_forward(act *out, real *lse, const act *q, const act *k, const act *v,
                          int B, int T, int nh, int nkv, int hd, int vd);
void rt_attention_backward(act *dq, act *dk, act *dv, const act *dout, const act *q,
                           const act *k, const act *v, const act *out, const real *lse,
                           int B, int T, int nh, int nkv, int hd, int vd);

/* The same over one fused projection's output (mha/gqa, vd = hd): qkv (B,T, (nh + 2 nkv) hd), each
 * token's row q (nh hd) | k (nkv hd) | v (nkv hd): one GEMM over the q, k, v weights that the
 * layout keeps adjacent (compiler/plan_qkv_fused). The attention reads strided views of it; the
 * backward WRITES the whole dqkv (same layout). out, lse as rt_attention_forward's. */
void rt_attention_qkv_forward(act *out, real *lse, const act *qkv, int B, int T, int nh, int nkv, int hd);
void rt_attention_qkv_backward(act *dqkv, const act *dout, const act *qkv, const act *out, const real *lse, int B,
                               int T, int nh, int nkv, int hd);
/* rt_rope_forward / backward on q's and k's heads of such rows, in place (v untouched). */
void rt_rope_qkv_forward(act *qkv, int B, int T, int nh, int nkv, int hd, real theta);
void rt_rope_qkv_backward(act *dqkv, int B, int T, int nh, int nkv, int hd, real theta);

/* Context parallelism (both backends; cuda: runtime/cuda/ops_cp.c): a rank holds T
 * tokens of each of B sequences of S tokens, in two chunks of T/2: its tokens t < T/2 are at
 * positions lo + t of their sequence, the others at hi + t − T/2 (rank r of cp: lo = r T/2, hi =
 * (2 cp − 1 − r) T/2, S = cp T). lo 0, hi T/2, S T is the plain causal layout (what
 * rt_attention_forward and rt_rope_forward do).
 * Attention: q (B,T,nh,hd), out (B,T,nh,vd), lse (B,nh,T) as rt_attention_forward's; k (B,S,nkv,hd)
 * and v (B,S,nkv,vd) the keys and values of the whole sequences (all-gathered over the cp group,
 * in position order); the query at position p attends to keys 0..p (each chunk's queries are the
 * last of their key range: a bottom-right aligned causal mask). Backward: dk, dv (B,S,...) of the
 * whole range, added into (reduce-scattered by the caller); work: S/2 × nkv × (hd + vd) values of
 * scratch where the cuda backend's attention is cuDNN's (the plan's DKV1), else NULL (unused). */
void rt_attention_span_forward(act *out, real *lse, const act *q, const act *k, const act *v, int B, int T, int S,
                               int64_t lo, int64_t hi, int nh, int nkv, int hd, int vd);
void rt_attention_span_backward(act *dq, act *dk, act *dv, const act *dout, const act *q, const act *k,
                                const act *v, const act *out, const real *lse, act *work, int B, int T, int S,
                                int64_t lo, int64_t hi, int nh, int nkv, int hd, int vd);
/* Plain RoPE (rt_rope_strided_forward's with factor <= 1: rd channels of H heads `stride` apart)
 * at the tokens' positions lo + t / hi + t − T/2, as above. */
void rt_rope_span_forward(act *x, int B, int T, int H, int stride, int rd, real theta, int64_t lo, int64_t hi);
void rt_rope_span_backward(act *dx, int B, int T, int H, int stride, int rd, real theta, int64_t lo, int64_t hi);

/* RoPE on a part of each head (MLA's qk_rope_head_dim channels; DeepSeek-V2 §2.1.3): the first
 * rd channels of each of H heads, heads `stride` values apart (x points at the first rotated
 * channel of token 0, head 0; token (b, t) at x + ((b T + t) H + h) stride), in the half-split
 * layout of rt_rope_forward with angle t · theta^(−2i/rd). In place; backward rotates back.
 * factor > 1: YaRN's frequencies and attention factor attn over rd (as rt_rope_yarn_*: DeepSeek-V3's
 * rotary embedding of qk_rope_head_dim); factor <= 1: plain RoPE (orig, beta_*, attn unused).
 * (HF DeepseekV3 with rope_interleave false; its default true pairs (2i, 2i+1) instead, the same
 * model up to a fixed permutation of the rope rows of q_b_proj/q_proj and kv_a_proj_with_mqa.) */
void rt_rope_strided_forward(act *x, int B, int T, int H, int stride, int rd, real theta, real factor, real orig,
                             real beta_fast, real beta_slow, real attn);
void rt_rope_strided_backward(act *dx, int B, int T, int H, int stride, int rd, real theta, real factor, real orig,
                              real beta_fast, real beta_slow, real attn);

/* MLA's per-head keys and values (HF modeling_deepseek_v3.py, DeepseekV3Attention.forward):
 * kvb (N, nh, nope + vd) is kv_b_proj's output, each head's k_nope then its value; kr (N, rope)
 * the RoPE key shared by every head. k (N, nh, nope + rope) = [k_nope, kr], v (N, nh, vd).
 * k is scaled by kscale: the softmax scale's factor beyond 1/sqrt(nope + rope) (DeepSeek-V3 with
 * YaRN: mscale(factor, mscale_all_dim)², as HF's self.scaling), 1 otherwise.
 * Backward: dkvb += kscale [dk's nope part], dv; dkr += kscale Σ over heads of dk's rope part. */
void rt_mla_kv_forward(act *k, act *v, const act *kvb, const act *kr, int64_t N, int nh, int nope, int rope, int vd,
                       real kscale);
void rt_mla_kv_backward(act *dkvb, act *dkr, const act *dk, const act *dv, int64_t N, int nh, int nope, int rope,
                        int vd, real kscale);

/* SwiGLU (Shazeer 2020): h = silu(g) ⊙ u; g, u, h (n elements). n is 64-bit: the experts' rows × F
 * pass 2^31 (europa-1t: 65536 · 8 rows × 1792 × 2.3 when the load is 2.3× the mean). The backward
 * WRITES dg and du (the first writers of those gradients). */
void rt_swiglu_forward(act *h, const act *g, const act *u, int64_t n);
void rt_swiglu_backward(act *dg, act *du, const act *dh, const act *g, const act *u, int64_t n);
/* The same over one fused gate|up projection's output: gu (rows, 2F), each row g (F) | u (F) (one
 * GEMM over gate_proj's and up_proj's adjacent weights); h (rows, F). The backward WRITES dgu
 * (rows, 2F, the same layout). */
void rt_swiglu_rows_forward(act *h, const act *gu, int64_t rows, int F);
void rt_swiglu_rows_backward(act *dgu, const act *dh, const act *gu, int64_t rows, int F);
/* GELU, tanh approximation (Hendrycks & Gimpel 2016): h = gelu(x); n elements (64-bit). The
 * backward WRITES dx. */
void rt_gelu_forward(act *h, const act *x, int64_t n);
void rt_gelu_backward(act *dx, const act *dh, const act *x, int64_t n);

/* cpu backend: FNV-1a 64 of every routing decision (the idx of rt_router_forward and
 * rt_router_group_forward, folded in call order) since the caller last set it: --grad-check
 * compares it between forwards to see a finite-difference step flip a token's experts. */
extern uint64_t rt_route_hash;
/* Router over E experts from logits (N,E): picks K experts per token and their weights.
 *   softmax: scores are the logits; weights = softmax over the K selected (Mixtral).
 *   sigmoid: scores s = sigmoid(logits); weights = s / Σ selected s (DeepSeek-V3).
 * The K largest score + bias are selected; bias (E), or NULL, only selects (DeepSeek-V3's
 * auxiliary-loss-free balancing). idx, wts (N,K); ties go to the lower expert index. */
void rt_router_forward(int32_t *idx, real *wts, const real *logits, const act *bias, int N, int E,
                       int K, bool sigmoid);
/* dlogits (N,E) = the gradient through the weights (selection is not differentiable; written,
 * 0 for the experts not selected). */
void rt_router_backward(real *dlogits, const real *dwts, const real *logits, const int32_t *idx,
                        const real *wts, int N, int E, int K, bool sigmoid);
/* Group-limited routing. Sigmoid (DeepSeek-V3: transformers' modeling_deepseek_v3.py,
 * DeepseekV3MoE.route_tokens_to_experts, "noaux_tc"): scores s = σ(l), selection keys s + bias
 * (bias (E) or NULL), the E experts in n_group equal groups, each group scored by the sum of its
 * two best keys. Softmax (DeepSeek-V2's modeling_deepseek.py MoEGate, "group_limited_greedy"):
 * keys the softmax's order exp(l − max l) (+ bias), each group scored by its best key. Then the
 * topk_group best groups are kept, the other experts' keys set to 0, and the K largest keys are
 * selected. Weights as rt_router_forward's (s / Σ selected s, or the softmax renormalized over
 * the selected). Ties go to the lower index. n_group <= RT_MAX_GROUPS, E / n_group >= 2. */
#ifndef RT_MAX_GROUPS /* (this header is read twice by tests/cuda's ref_ops.h) */
#define RT_MAX_GROUPS 64
#endif
void rt_router_group_forward(int32_t *idx, real *wts, const real *logits, const act *bias, int N, int E, int K,
                             int n_group, int topk_group, bool sigmoid);
/* The routing weights of the selected experts idx (N,K), recomputed from logits (N,E) under the
 * conventions real models need, overwriting wts (N,K):
 *   a_j = exp(l_j − m) (softmax) or σ(l_j) (sigmoid);
 *   norm true:  w_j = scale · a_j / Σ_selected a          (Mixtral, Qwen3-MoE, DeepSeek-V3);
 *   norm false: w_j = scale · softmax(l)_j over all E      (Qwen2-MoE's norm_topk_prob: false),
 *               or scale · σ(l_j) for sigmoid (DeepSeek-V2/V3 with norm_topk_prob false).
 * scale is DeepSeek-V3's routed_scaling_factor (1: none). Sources: Hugging Face
 * modeling_qwen2_moe.py and modeling_deepseek_v3.py (Qwen2MoeSparseMoeBlock, DeepseekV3TopkRouter).
 * Called after rt_router_forward (which selects) when norm is false or scale is not 1. */
void rt_router_weights(real *wts, const real *logits, const int32_t *idx, int N, int E, int K, bool sigmoid,
                       bool norm, real scale);
/* dlogits (N,E) = the gradient of rt_router_weights' weights (wts, its output) given dwts (N,K)
 * (written, 0 where none flows):
 * norm: a_j dA_j = u_j (s dw_j − Σ_i u_i s dw_i) with u = w / s, times (1 − σ) for sigmoid;
 * softmax, not norm: dl_e = p_e (s dw_e [e selected] − Σ_j w_j dw_j) for every e;
 * sigmoid, not norm: dl_j = s dw_j σ_j (1 − σ_j). */
void rt_router_weights_backward(real *dlogits, const real *dwts, const real *logits, const int32_t *idx,
                                const real *wts, int N, int E, int K, bool sigmoid, bool norm, real scale);
/* Qwen2-MoE's gated shared expert (modeling_qwen2_moe.py, Qwen2MoeSparseMoeBlock:
 * sigmoid(shared_expert_gate(x)) * shared_expert(x)): y (N,C) += σ(logit_n) · x (N,C), logit (N).
 * Backward: dx += σ dy; dlogit += σ (1 − σ) Σ_c dy x. */
void rt_sigmoid_gate_forward(act *y, const act *x, const real *logit, int N, int C);
void rt_sigmoid_gate_backward(act *dx, real *dlogit, const act *dy, const act *x, const real *logit, int N, int C);
/* Switch-Transformer load-balancing loss (Fedus et al. 2021): alpha · E · Σ_e f_e · P_e,
 * f_e = fraction of the N·K assignments to expert e (no gradient), P_e = mean over tokens of
 * softmax(logits)_e. Returns the loss; backward adds its gradient (times dloss) to dlogits. */
real rt_aux_loss_forward(const real *logits, const int32_t *idx, int N, int E, int K, real alpha,
                         real *scratch /* 3E */);
void rt_aux_loss_backward(real *dlogits, const real *logits, const int32_t *idx, int N, int E,
                          int K, real alpha, real dloss, real *scratch /* 2E */);
/* The same loss over a micro-batch split over a cp group (context parallelism): stats writes this
 * rank's f (its share of the assignments, / (N K)) and P (mean affinity over its N tokens) into the
 * 2E values at scratch + E (cpu: f then P; cuda: P then f); the caller averages those 2E values over
 * the cp group (rt_comm_cp_mean);
 * value returns alpha E Σ f P of the averaged ones; backward_stats adds this rank's tokens'
 * gradient with f the averaged one, dloss α E / N p (f − Σ p f) per token (every
 * rank of the group counts the group's loss once: cp × 1 / (cp N)). */
void rt_aux_loss_stats(const real *logits, const int32_t *idx, int N, int E, int K, real *scratch /* 3E */);
real rt_aux_loss_value(const real *scratch, int E, real alpha);
void rt_aux_loss_backward_stats(real *dlogits, const real *logits, int N, int E, real alpha, real dloss,
                                real *scratch /* 3E: the averaged statistics at + E */);

/* Sequence-wise balance loss (DeepSeek-V2 §2.2.4 with HF `seq_aux: true`; DeepSeek-V3 §2.3.3's
 * complementary loss, eqs. 17-20): alpha · (1/B) Σ_b Σ_e f_{b,e} P_{b,e} over the N / T sequences b
 * of T tokens each, f_{b,e} = E / (K T) · the assignments of sequence b to expert e (no gradient),
 * P_{b,e} = mean over b's tokens of the affinity s_{t,e}: softmax(logits) (sigmoid = false), or the
 * sigmoid scores normalized over all experts, σ_e / Σ_j σ_j (sigmoid = true: V3's s'). A sequence
 * lies whole in one rank's micro-batch, so the loss needs no communication. Returns the loss;
 * backward adds its gradient (times dloss) to dlogits (N, E). scratch: 2E values. */
real rt_seq_aux_loss_forward(const real *logits, const int32_t *idx, int N, int E, int K, int T, bool sigmoid,
                             real alpha, real *scratch);
void rt_seq_aux_loss_backward(real *dlogits, const real *logits, const int32_t *idx, int N, int E, int K, int T,
                              bool sigmoid, real alpha, real dloss, real *scratch);

/* load (E) += the number of assignments to each expert among idx (n entries): the counts
 * behind auxiliary-loss-free balancing. */
void rt_moe_count(real *load, const int32_t *idx, int64_t n);
/* load (E) summed over every rank of MPI_COMM_WORLD, in place (the step's loads). */
void rt_moe_load_all_reduce(real *load, int E);
/* Auxiliary-loss-free balancing (DeepSeek-V3, sec. 2.1.2): bias_e += rate × sign(mean load −
 * load_e) for the E bias values at gathered offset off of a group whose shard [lo, lo + n) this
 * rank holds in shard (only the elements inside it change). load (E) summed over all ranks.
 * shard may be device memory or the cuda backend's pinned host state arena. */
void rt_router_bias_update(real *shard, int64_t lo, int64_t n, int64_t off, const real *load, int E,
                           real rate);

/* Token permutation for the experts: pos (N,K) is the row of assignment (n, j) in the permuted
 * order (by expert, then token); offsets (E+1) the first row of each expert. */
void rt_moe_permute(int32_t *pos, int *offsets, const int32_t *idx, int N, int E, int K);
/* xp (N·K, C): xp[pos[n,j]] = x[n]; backward adds the K copies' gradients into dx. */
void rt_moe_gather(act *xp, const act *x, const int32_t *pos, int N, int K, int C);
void rt_moe_gather_backward(act *dx, const act *dxp, const int32_t *pos, int N, int K, int C);
/* y (N,C) += Σ_j wts[n,j] · yp[pos[n,j]]; backward: dyp (set, N·K rows) and dwts (set). */
void rt_moe_combine(act *y, const act *yp, const real *wts, const int32_t *pos, int N, int K, int C);
void rt_moe_combine_backward(act *dyp, real *dwts, const act *dy, const act *yp, const real *wts,
                             const int32_t *pos, int N, int K, int C);

/* The routed experts, SwiGLU FFNs on the permuted rows: rows [offsets[e], offsets[e+1]) of xp
 * (N·K, C) go through expert e: yp = (silu(xp wgₑᵀ) ⊙ xp wuₑᵀ) wdₑᵀ with wg, wu (E,F,C) and
 * wd (E,C,F). g, u, h (N·K, F) are saved for backward.
 * GELU experts (model.moe.activation gelu; GPT-style FFN, Hendrycks & Gimpel 2016, tanh form):
 * wg NULL, then yp = gelu(xp wuₑᵀ) wdₑᵀ, g is not used (may be NULL) and h = gelu(u).
 * Weight layout (the gradients' too): expert e's matrix of OC × IC elements starts at
 * w + (e / per) · stride + (e % per) · OC · IC — whole-expert shards of `per` experts each,
 * `stride` elements apart (step.h's SHARD_EXPERTS_ELEMS); flat, contiguous experts: per = E
 * (stride unused). One call covers all E experts (cuda: one cuBLAS GEMM per expert over a few
 * streams, or one grouped GEMM per projection, by the rows per expert: ops_moe.c). */
void rt_experts_forward(act *yp, act *g, act *u, act *h, const act *xp, const act *wg,
                        const act *wu, const act *wd, const int *offsets, int E, int per,
                        int64_t stride, int C, int F);
/* dxp (the rows of offsets[0..E]) is written, the weights' gradients added. dh, dg, du: scratch
 * of (N·K, F) each, written before read. With wg NULL (GELU experts) g, dg and dwg are not used
 * (may be NULL). */
void rt_experts_backward(act *dxp, act *dwg, act *dwu, act *dwd, const act *dyp, const act *xp,
                         const act *g, const act *u, const act *h, const act *wg, const act *wu,
                         const act *wd, const int *offsets, int E, int per, int64_t stride, int C,
                         int F, act *dh, act *dg, act *du);

/* LM head and cross-entropy over vocabulary chunks of `chunk` columns, never (N,V) logits:
 * logits = x (N,C) · wᵀ with w (V,C). Returns the mean loss over the N tokens and saves
 * lse (N). scratch holds (N, chunk). */
real rt_lm_head_ce_forward(real *lse, const act *x, const act *w, const int32_t *targets, int N,
                           int C, int V, int chunk, real *scratch);
/* Gradients of dloss × mean loss: recomputes each chunk's logits. scratch holds (2, N, chunk):
 * a chunk's logits and their gradient (the cpu ops use the first half in place). */
void rt_lm_head_ce_backward(act *dx, act *dw, const act *x, const act *w, const int32_t *targets,
                            const real *lse, int N, int C, int V, int chunk, real *scratch, real dloss);

#endif
