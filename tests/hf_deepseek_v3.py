#!/usr/bin/env python3
"""A reference forward of DeepSeek-V3 (model_type deepseek_v3) on `mtc export --spec`'s directory,
for transformers versions without the class (4.46.3 predates it). Written from transformers'
modeling_deepseek_v3.py (DeepseekV3RMSNorm, DeepseekV3Attention with rope_interleave,
DeepseekV3TopkRouter, DeepseekV3MoE, DeepseekV3MLP) and DeepSeek-V3's report, not from mtc's ops:
torch in float64 on model.safetensors and config.json. Prints the mean cross-entropy of predicting
WINDOW's bytes 1..T from bytes 0..T-1 (one sequence, a byte vocabulary), as hf_parity.py does.
YaRN (rope_scaling type yarn) follows transformers' _compute_yarn_parameters with DeepSeek's
mscale / mscale_all_dim and the softmax scale's mscale² (DeepseekV3Attention.__init__).
usage: hf_deepseek_v3.py OUTDIR WINDOW; exits 77 when torch or safetensors is missing"""
import json
import math
import sys

try:
    import torch
    from safetensors.torch import load_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

d, win = sys.argv[1], sys.argv[2]
cfg = json.load(open(f"{d}/config.json"))
assert cfg["model_type"] == "deepseek_v3", cfg["model_type"]
W = {k: v.to(torch.float64) for k, v in load_file(f"{d}/model.safetensors").items()}
used = set()


def w(name):
    used.add(name)
    return W[name]


H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
nope, rd, vd, kvr = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
qr, eps = cfg.get("q_lora_rank"), cfg["rms_norm_eps"]
E, K, ng, tg = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"]


def rms(x, g):  # DeepseekV3RMSNorm
    return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def linear(x, name):
    return x @ w(name).T


def mlp(x, p):  # DeepseekV3MLP: down(silu(gate(x)) * up(x))
    return linear(torch.nn.functional.silu(linear(x, p + "gate_proj.weight")) * linear(x, p + "up_proj.weight"),
                  p + "down_proj.weight")


def yarn_mscale(scale, m):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def rope_tables(T):
    """cos, sin (T, rd) of DeepseekV3RotaryEmbedding: default or YaRN frequencies, times the attention factor."""
    base, rs = cfg.get("rope_theta", 10000.0), cfg.get("rope_scaling")
    pos_freqs = base ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    inv, attn = 1.0 / pos_freqs, 1.0
    if rs and rs.get("rope_type", rs.get("type")) == "yarn":
        f, orig = rs["factor"], rs["original_max_position_embeddings"]
        bf, bs = rs.get("beta_fast", 32), rs.get("beta_slow", 1)
        m, mad = rs.get("mscale"), rs.get("mscale_all_dim")
        attn = yarn_mscale(f, m) / yarn_mscale(f, mad) if m and mad else yarn_mscale(f, 1)

        def corr(n):  # find_correction_dim
            return (rd * math.log(orig / (n * 2 * math.pi))) / (2 * math.log(base))
        lo, hi = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), rd - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(rd // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        extra = 1 - ramp  # inv_freq_extrapolation_factor
        inv = (1.0 / (f * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    fr = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat((fr, fr), -1)
    return emb.cos() * attn, emb.sin() * attn


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), -1)


def rope_interleave(x, cos, sin):  # apply_rotary_pos_emb_interleave: pairs (2i, 2i+1) de-interleaved
    s = x.shape
    x = x.view(*s[:-1], s[-1] // 2, 2).transpose(-1, -2).reshape(s)
    return x * cos + rotate_half(x) * sin


def attention(x, p, cos, sin):
    T = x.shape[0]
    if qr:
        q = linear(rms(linear(x, p + "q_a_proj.weight"), w(p + "q_a_layernorm.weight")), p + "q_b_proj.weight")
    else:
        q = linear(x, p + "q_proj.weight")
    q = q.view(T, nh, nope + rd).transpose(0, 1)  # (nh, T, nope + rope)
    q_pass, q_rot = q[..., :nope], q[..., nope:]
    ckv = linear(x, p + "kv_a_proj_with_mqa.weight")
    k_pass, k_rot = ckv[:, :kvr], ckv[:, kvr:]
    kv = linear(rms(k_pass, w(p + "kv_a_layernorm.weight")), p + "kv_b_proj.weight").view(T, nh, nope + vd).transpose(0, 1)
    k_pass, v = kv[..., :nope], kv[..., nope:]
    k_rot = k_rot.reshape(1, T, rd)
    if cfg.get("rope_interleave", True):
        q_rot, k_rot = rope_interleave(q_rot, cos, sin), rope_interleave(k_rot, cos, sin)
    else:  # apply_rotary_pos_emb
        q_rot, k_rot = q_rot * cos + rotate_half(q_rot) * sin, k_rot * cos + rotate_half(k_rot) * sin
    qs = torch.cat((q_pass, q_rot), -1)
    ks = torch.cat((k_pass, k_rot.expand(nh, T, rd)), -1)
    scale = (nope + rd) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        m = yarn_mscale(rs["factor"], rs["mscale_all_dim"])
        scale = scale * m * m
    s = qs @ ks.transpose(-1, -2) * scale
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(0, 1).reshape(T, nh * vd)
    return linear(o, p + "o_proj.weight")


def moe(x, p):  # DeepseekV3MoE with DeepseekV3TopkRouter (noaux_tc)
    scores = linear(x, p + "gate.weight").sigmoid()
    choice = scores + w(p + "gate.e_score_correction_bias")
    gs = choice.view(-1, ng, E // ng).topk(2, dim=-1)[0].sum(-1)
    gidx = gs.topk(tg, dim=-1, sorted=False)[1]
    gmask = torch.zeros_like(gs).scatter_(1, gidx, 1)
    smask = gmask.unsqueeze(-1).expand(-1, ng, E // ng).reshape(-1, E)
    idx = choice.masked_fill(~smask.bool(), 0.0).topk(K, dim=-1, sorted=False)[1]
    wt = scores.gather(1, idx)
    if cfg.get("norm_topk_prob", True):
        wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
    wt = wt * cfg.get("routed_scaling_factor", 1.0)
    out = torch.zeros_like(x)
    for e in range(E):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if len(rows):
            out[rows] += wt[rows, slot].unsqueeze(-1) * mlp(x[rows], f"{p}experts.{e}.")
        else:
            for t in ("gate_proj", "up_proj", "down_proj"):
                used.add(f"{p}experts.{e}.{t}.weight")
    return out + mlp(x, p + "shared_experts.")


tokens = torch.tensor(list(open(win, "rb").read()))
x = w("model.embed_tokens.weight")[tokens[:-1]]
cos, sin = rope_tables(x.shape[0])
for l in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{l}."
    x = x + attention(rms(x, w(p + "input_layernorm.weight")), p + "self_attn.", cos, sin)
    h = rms(x, w(p + "post_attention_layernorm.weight"))
    x = x + (mlp(h, p + "mlp.") if l < cfg["first_k_dense_replace"] else moe(h, p + "mlp."))
logits = linear(rms(x, w("model.norm.weight")), "lm_head.weight")
unused = set(W) - used
assert not unused, f"tensors the model does not read: {sorted(unused)}"
print(f"{float(torch.nn.functional.cross_entropy(logits, tokens[1:])):.9g}")
