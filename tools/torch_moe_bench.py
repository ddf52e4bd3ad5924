#!/usr/bin/env python3
"""torch_moe_bench.py: a PyTorch reference of the model in an mtc plan.json, for benchmarks.

Builds the model mtc planned (the math of runtime/cpu/ops_dense.c and ops_moe.c): embedding;
per layer RMSNorm (eps 1e-5) -> q/k/v (no bias) -> RoPE (half-split) -> causal GQA attention
-> o_proj -> residual; RMSNorm -> softmax router, top-k of the logits, weights = softmax of
the k chosen logits, SwiGLU experts (+ shared experts), Switch load-balancing loss
alpha * E * sum_e f_e P_e with f_e = assignments to e / (N k); or a dense MLP; final RMSNorm,
untied LM head, cross-entropy. Trains it with fp32 parameters, bf16 autocast, AdamW (0.9,
0.95, 1e-8; decay on matrices only), gradient clipping and gradient accumulation over random
tokens, and reports throughput and MFU against plan.json's flops_per_token.

The shape comes from plan.json alone (heads from flops_per_token_attention, kv_heads from the
attention parameters, experts/top_k/widths from the router and expert parameters), so a plan
compiled with --set is read right; the spec named in plan.json (looked up next to the plan,
then in specs/) gives rope_theta, aux_loss_coef, lr, weight_decay, grad_clip.

  python3 tools/torch_moe_bench.py --plan /tmp/bench/plan.json [--steps 10] [--warmup 3]
      [--compile] [--device cuda] [--peak-tflops T] [--spec SPEC.yaml]
  python3 tools/torch_moe_bench.py --selftest [--plan generated/tiny-moe/plan.json] [--compile]
Exit: 0 ok, 1 selftest failed, 2 bad/unsupported plan, 3 out of memory, 4 parameter mismatch.
"""
import argparse, glob, json, math, os, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def die(msg, code=2):
    kind = "param_mismatch" if code == 4 else "bad_plan"
    print(f"TORCH_BENCH error={kind} msg={msg!r}")
    sys.exit(code)


def read_yaml(path):  # PyYAML if present, else enough of YAML for mtc specs (nested maps, scalars)
    try:
        import yaml
        with open(path) as f:
            return yaml.safe_load(f) or {}
    except ImportError:
        pass
    root = {}
    stack = [(-1, root)]  # (indent, map) of the open sections
    for raw in open(path):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        ind = len(line) - len(line.lstrip())
        key, _, val = line.strip().partition(":")
        while stack[-1][0] >= ind:
            stack.pop()
        val = val.strip().strip("'\"")
        if val == "":
            stack[-1][1][key] = {}
            stack.append((ind, stack[-1][1][key]))
        else:
            stack[-1][1][key] = {"true": True, "false": False}.get(val, val)
    return root


def spec_get(spec, dotted, default):
    v = spec
    for k in dotted.split("."):
        if not isinstance(v, dict) or k not in v:
            return default
        v = v[k]
    return v


def exact(num, den, what):
    if den <= 0 or num % den:
        die(f"cannot derive {what} from plan.json ({num} / {den} is not an integer)")
    return num // den


def config(plan, plan_path, spec_path):
    m, t = plan["model"], plan["training"]
    if not spec_path:
        base = os.path.basename(plan.get("spec", ""))
        cands = [os.path.join(os.path.dirname(os.path.abspath(plan_path)), base), os.path.join(ROOT, "specs", base)]
        cands += sorted(glob.glob(os.path.join(ROOT, "specs", "**", base), recursive=True))
        spec_path = next((c for c in cands if base and os.path.isfile(c)), None)
    spec = read_yaml(spec_path) if spec_path else {}
    print(f"spec: {spec_path or 'not found (defaults: rope_theta 10000, aux_loss_coef 0.01, lr 3e-4)'}")
    for key, ok, what in [("model.attention.kind", ("gqa", "mha"), "mla attention"), ("model.norm", ("rmsnorm",), "layernorm"),
                          ("model.position", ("rope",), "learned positions"), ("model.bias", (False,), "biases"),
                          ("model.tie_embeddings", (False,), "tied embeddings"), ("model.attention.qk_norm", ("none",), "qk-norm"),
                          ("model.moe.activation", ("swiglu",), "gelu experts"), ("model.moe.router", ("softmax",), "a sigmoid router"),
                          ("model.moe.load_balance", ("aux_loss",), "aux-free balancing"), ("model.moe.router_bias", (False,), "a router bias")]:
        if spec_get(spec, key, ok[0]) not in ok:
            die(f"{key}: this reference does not implement {what}")
    c = argparse.Namespace(hidden=m["hidden"], layers=m["layers"], vocab=m["vocab"], seq=t["seq_len"], hd=m["qk_head_dim"])
    C, L = c.hidden, c.layers
    if m["v_head_dim"] != c.hd:
        die("qk_head_dim != v_head_dim (mla?)")
    pk = {k: v["total"] for k, v in m["params_by_kind"].items()}
    pa = {k: v["active"] for k, v in m["params_by_kind"].items()}
    if pk["lm_head"] != c.vocab * C or pk["embedding"] != c.vocab * C or pk["norms"] != (2 * L + 1) * C:
        die("embedding/lm_head/norm parameters are not those of untied embeddings and RMSNorm without bias")
    c.nh = exact(m["flops_per_token_attention"], 6 * L * c.seq * c.hd, "heads")
    c.nkv = exact(pk["attention"] // L - 2 * C * c.nh * c.hd, 2 * C * c.hd, "kv_heads")
    c.kinds = [ly["kind"] for ly in m["layer_list"]]
    n_moe, n_dense = c.kinds.count("moe"), c.kinds.count("dense")
    c.experts = c.top_k = c.ffn = c.shared = c.dense_ffn = 0
    if n_moe:
        c.experts = exact(pk["router"], n_moe * C, "experts")
        c.ffn = exact(pk["routed_experts"], n_moe * c.experts * 3 * C, "expert_intermediate")
        c.top_k = exact(pa["routed_experts"], n_moe * 3 * C * c.ffn, "top_k")
        c.shared = exact(pk["shared_experts"], n_moe * 3 * C, "shared expert width")
    c.dense_act = spec_get(spec, "model.mlp.activation", "swiglu")
    if n_dense:
        c.dense_ffn = exact(pk["dense_mlp"], n_dense * (3 if c.dense_act == "swiglu" else 2) * C, "mlp.intermediate")
    for key, val in [("model.attention.heads", c.nh), ("model.attention.kv_heads", c.nkv), ("model.moe.experts", c.experts),
                     ("model.moe.top_k", c.top_k), ("model.moe.expert_intermediate", c.ffn)]:
        s = spec_get(spec, key, None)
        if s is not None and int(s) != val:
            print(f"note: spec {key} = {s}, plan.json implies {val} (compiled with --set?): using {val}")
    c.theta = float(spec_get(spec, "model.attention.rope_theta", 10000))
    c.aux_coef = float(spec_get(spec, "model.moe.aux_loss_coef", 0.01))
    c.lr = float(spec_get(spec, "training.lr", 3e-4))
    c.wd = float(spec_get(spec, "training.weight_decay", 0.1))
    c.clip = float(spec_get(spec, "training.grad_clip", 1.0))
    c.micro = t["micro_batch"]
    c.accum = plan["layout"].get("grad_accum") or t["global_batch"] // (t["micro_batch"] * plan["layout"]["world"])
    c.act = torch.float32
    return c


# ---- the model's pieces as functions of tensors (each one torch.compile-able on its own) ----

def rms_norm(x, w, eps=1e-5):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, cos, sin):  # x (B, T, H, hd); pairs (i, i + hd/2) rotated by t * theta^(-2i/hd)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), -1).to(x.dtype)


def attention_block(x, wn, wq, wk, wv, wo, cos, sin, nh, nkv, hd, dt):  # x + o_proj(attn(norm(x)))
    B, T, C = x.shape
    h = rms_norm(x, wn).to(dt)
    q = rope(F.linear(h, wq).view(B, T, nh, hd), cos, sin).transpose(1, 2)
    k = rope(F.linear(h, wk).view(B, T, nkv, hd), cos, sin).transpose(1, 2)
    v = F.linear(h, wv).view(B, T, nkv, hd).transpose(1, 2)
    if nkv != nh:  # query head j reads kv head j // (nh / nkv), as mtc's attention
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return x + F.linear(o.transpose(1, 2).reshape(B, T, nh * hd), wo)


def norm_cast(x, w, dt):
    return rms_norm(x, w).to(dt)


def route(h, wr, k, coef):  # top-k of the logits, softmax over those k; Switch aux loss
    logits = F.linear(h, wr).float()
    top, idx = logits.topk(k, dim=-1)
    n, e = logits.shape
    f = torch.zeros(e, device=h.device).index_add_(0, idx.flatten(), torch.ones(idx.numel(), device=h.device)) / (n * k)
    return top.softmax(-1), idx, coef * e * (f * logits.softmax(-1).mean(0)).sum()


def swiglu(x, wg, wu, wd):
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def expert_swiglu(x, wg, wu, wd):  # its own code object: compiled apart from the static-shape swiglu
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def gelu_mlp(x, wu, wd):
    return F.linear(F.gelu(F.linear(x, wu), approximate="tanh"), wd)


def head_loss(x, wn, wh, targets):
    logits = F.linear(rms_norm(x, wn), wh)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


OPS = dict(attn=attention_block, norm=norm_cast, route=route, ffn=swiglu, expert=expert_swiglu, gelu=gelu_mlp, head=head_loss)


def param(dev, *shape, std=0.02):
    return nn.Parameter(torch.empty(*shape, device=dev).normal_(0, std) if std else torch.ones(*shape, device=dev))


class Block(nn.Module):
    def __init__(s, c, moe, dev):
        super().__init__()
        C, so = c.hidden, 0.02 / math.sqrt(2 * c.layers)  # output projections: GPT-2 scaled init, as mtc
        s.c, s.moe = c, moe
        s.attn_norm, s.mlp_norm = param(dev, C, std=0), param(dev, C, std=0)
        s.wq, s.wk, s.wv = param(dev, c.nh * c.hd, C), param(dev, c.nkv * c.hd, C), param(dev, c.nkv * c.hd, C)
        s.wo = param(dev, C, c.nh * c.hd, std=so)
        if moe:
            s.router = param(dev, c.experts, C)
            s.gate, s.up = param(dev, c.experts, c.ffn, C), param(dev, c.experts, c.ffn, C)
            s.down = param(dev, c.experts, C, c.ffn, std=so)
            if c.shared:
                s.sgate, s.sup, s.sdown = param(dev, c.shared, C), param(dev, c.shared, C), param(dev, C, c.shared, std=so)
        else:
            s.gate = param(dev, c.dense_ffn, C) if c.dense_act == "swiglu" else None
            s.up, s.down = param(dev, c.dense_ffn, C), param(dev, C, c.dense_ffn, std=so)

    def moe_forward(s, h):  # h (N, C): HF-Mixtral-style loop over experts, index_select / index_add
        c = s.c
        w, idx, aux = OPS["route"](h, s.router, c.top_k, c.aux_coef)
        flat = idx.flatten()
        order = torch.argsort(flat, stable=True)  # assignments in expert order, token order inside (rt_moe_permute)
        counts = torch.bincount(flat, minlength=c.experts).tolist()  # the layer's one host sync
        tok = order // c.top_k
        xs = h.index_select(0, tok)
        # one cast per layer; unbind (not w[e]) so that the backward stacks E slices, not E full-size zeros
        wg, wu, wd = (p.to(h.dtype).unbind(0) for p in (s.gate, s.up, s.down))
        ys, start = [], 0
        for e, n in enumerate(counts):
            if n:
                ys.append(OPS["expert"](xs[start:start + n], wg[e], wu[e], wd[e]))
            start += n
        ys = torch.cat(ys).float() * w.flatten()[order, None]
        out = torch.zeros(h.shape, dtype=torch.float32, device=h.device).index_add_(0, tok, ys)
        if c.shared:
            out = out + OPS["ffn"](h, s.sgate, s.sup, s.sdown)
        return out, aux

    def forward(s, x, cos, sin):
        c = s.c
        x = OPS["attn"](x, s.attn_norm, s.wq, s.wk, s.wv, s.wo, cos, sin, c.nh, c.nkv, c.hd, c.act)
        B, T, C = x.shape
        h = OPS["norm"](x, s.mlp_norm, c.act).view(B * T, C)
        if s.moe:
            y, aux = s.moe_forward(h)
        else:
            y = OPS["ffn"](h, s.gate, s.up, s.down) if s.gate is not None else OPS["gelu"](h, s.up, s.down)
            aux = None
        return x + y.view(B, T, C), aux


class Model(nn.Module):
    def __init__(s, c, dev):
        super().__init__()
        s.embed = param(dev, c.vocab, c.hidden)
        s.blocks = nn.ModuleList(Block(c, kind == "moe", dev) for kind in c.kinds)
        s.norm, s.head = param(dev, c.hidden, std=0), param(dev, c.vocab, c.hidden)
        ang = torch.arange(c.seq, dtype=torch.float64)[:, None] * c.theta ** (-2 * torch.arange(c.hd // 2, dtype=torch.float64) / c.hd)
        s.register_buffer("cos", ang.cos().float().to(dev), persistent=False)
        s.register_buffer("sin", ang.sin().float().to(dev), persistent=False)

    def forward(s, tokens, targets):
        x = F.embedding(tokens, s.embed)  # the residual stream stays fp32; GEMMs run in bf16 under autocast
        aux = torch.zeros((), device=x.device)
        for blk in s.blocks:
            x, a = blk(x, s.cos, s.sin)
            if a is not None:
                aux = aux + a
        return OPS["head"](x, s.norm, s.head, targets), aux


def build(plan, c, dev):
    model = Model(c, dev)
    n = sum(p.numel() for p in model.parameters())
    print(f"model: {c.layers} layers ({c.kinds.count('moe')} MoE), hidden {c.hidden}, vocab {c.vocab}, heads {c.nh}/{c.nkv} kv x {c.hd}, "
          f"experts {c.experts} top-{c.top_k} x {c.ffn}, shared {c.shared}, dense mlp {c.dense_ffn}; params {n:,} (plan {plan['model']['params_total']:,})")
    for i, (blk, ly) in enumerate(zip(model.blocks, plan["model"]["layer_list"])):
        got = sum(p.numel() for p in blk.parameters())
        if got != ly["params"]:
            die(f"layer {i}: {got} parameters here, {ly['params']} in plan.json", 4)
    if n != plan["model"]["params_total"]:
        die(f"{n} parameters here, {plan['model']['params_total']} in plan.json: not the same model", 4)
    return model, n


def train_step(model, opt, c, dev, amp):
    opt.zero_grad(set_to_none=True)
    ce_sum = aux_sum = 0
    for _ in range(c.accum):
        tok = torch.randint(0, c.vocab, (c.micro, c.seq + 1), device=dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            ce, aux = model(tok[:, :-1], tok[:, 1:])
            loss = (ce + aux) / c.accum  # mtc: sum over micro-batches of (ce + aux) / accum
        loss.backward()
        ce_sum, aux_sum = ce_sum + ce.detach(), aux_sum + aux.detach()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip) if c.clip > 0 else torch.zeros(())
    opt.step()
    return (ce_sum / c.accum).item(), (aux_sum / c.accum).item(), float(norm)


def make_opt(model, c, dev):
    decay = [p for p in model.parameters() if p.ndim >= 2]  # matrices (embedding, router, head too), not norms
    other = [p for p in model.parameters() if p.ndim < 2]
    kw = dict(lr=c.lr, betas=(0.9, 0.95), eps=1e-8)
    if dev.type == "cuda":
        kw["fused"] = True
    return torch.optim.AdamW([{"params": decay, "weight_decay": c.wd}, {"params": other, "weight_decay": 0.0}], **kw)


def use_compile():
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    for k in ("attn", "norm", "route", "ffn", "gelu", "head"):
        OPS[k] = torch.compile(OPS[k])
    OPS["expert"] = torch.compile(expert_swiglu, dynamic=True)  # one graph for every expert's token count


def selftest(args):
    torch.manual_seed(0)
    plan_path = args.plan or os.path.join(ROOT, "generated", "tiny-moe", "plan.json")
    plan = json.load(open(plan_path))
    c, dev = config(plan, plan_path, args.spec), torch.device("cpu")
    model, _ = build(plan, c, dev)
    fails = []
    with torch.no_grad():  # RoPE as a complex rotation of (x_i, x_{i+hd/2}) by t * theta^(-2i/hd)
        blk, T = model.blocks[0], min(c.seq, 16)
        x = torch.randn(1, T, 1, c.hd, dtype=torch.float64)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * c.theta ** (-2 * torch.arange(c.hd // 2, dtype=torch.float64) / c.hd)
        z = torch.complex(x[..., :c.hd // 2], x[..., c.hd // 2:]) * torch.polar(torch.ones_like(ang), ang)[None, :, None]
        if not torch.allclose(rope(x, model.cos[:T], model.sin[:T]), torch.cat((z.real, z.imag), -1).to(x.dtype), atol=1e-5):
            fails.append("rope")
        # attention block against a per-head loop with explicit causal softmax
        x = torch.randn(2, T, c.hidden)
        got = attention_block(x, blk.attn_norm, blk.wq, blk.wk, blk.wv, blk.wo, model.cos[:T], model.sin[:T], c.nh, c.nkv, c.hd, torch.float32)
        h = rms_norm(x, blk.attn_norm)
        q = rope((h @ blk.wq.T).view(2, T, c.nh, c.hd), model.cos[:T], model.sin[:T])
        k = rope((h @ blk.wk.T).view(2, T, c.nkv, c.hd), model.cos[:T], model.sin[:T])
        v = (h @ blk.wv.T).view(2, T, c.nkv, c.hd)
        mask = torch.ones(T, T).tril().bool()
        heads = []
        for j in range(c.nh):
            kv = j // (c.nh // c.nkv)
            s = (q[:, :, j] @ k[:, :, kv].transpose(1, 2)) / math.sqrt(c.hd)
            heads.append(s.masked_fill(~mask, float("-inf")).softmax(-1) @ v[:, :, kv])
        want = x + torch.stack(heads, 2).reshape(2, T, -1) @ blk.wo.T
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            fails.append(f"attention: max diff {(got - want).abs().max():.3g}")
        moe = next((b for b in model.blocks if b.moe), None)
        if moe is not None:  # the MoE dispatch against a per-token loop over its k experts
            h = torch.randn(64, c.hidden)
            got, aux = moe.moe_forward(h)
            logits = h @ moe.router.T
            top, idx = logits.topk(c.top_k, -1)
            w = top.softmax(-1)
            want = torch.stack([sum(w[n, j] * swiglu(h[n], moe.gate[e], moe.up[e], moe.down[e]) for j, e in enumerate(idx[n].tolist()))
                                for n in range(64)])
            if c.shared:
                want = want + swiglu(h, moe.sgate, moe.sup, moe.sdown)
            if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
                fails.append(f"moe: max diff {(got - want).abs().max():.3g}")
            f = torch.bincount(idx.flatten(), minlength=c.experts).float() / idx.numel()
            if abs(aux.item() - c.aux_coef * c.experts * float((f * logits.softmax(-1).mean(0)).sum())) > 1e-6:
                fails.append("aux loss")
    if args.compile:
        use_compile()
    c.act, opt = torch.bfloat16, make_opt(model, c, dev)
    for i in range(2):
        ce, aux, norm = train_step(model, opt, c, dev, amp=True)
        print(f"selftest step {i + 1}: loss {ce:.4f} (ln V = {math.log(c.vocab):.4f}) aux {aux:.5f} grad norm {norm:.3f}")
        if not (math.isfinite(ce) and math.isfinite(aux) and math.isfinite(norm)) or (i == 0 and abs(ce - math.log(c.vocab)) > 1.0):
            fails.append(f"step {i + 1}: loss {ce} aux {aux} norm {norm}")
    print("TORCH_SELFTEST " + ("ok" if not fails else "FAILED " + "; ".join(fails)))
    return 1 if fails else 0


def bench(args):
    plan = json.load(open(args.plan))
    c, dev = config(plan, args.plan, args.spec), torch.device(args.device)
    if plan["layout"]["world"] != 1:
        print(f"note: the plan is for {plan['layout']['world']} GPUs; this runs one GPU's share ({c.accum} micro-batches)")
    torch.manual_seed(args.seed)
    amp, mode = dev.type in ("cuda", "cpu") and not args.fp32, "compile" if args.compile else "eager"
    c.act = torch.bfloat16 if amp else torch.float32
    if dev.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    n = plan["model"]["params_total"]
    try:
        model, n = build(plan, c, dev)
        opt = make_opt(model, c, dev)
        if args.compile:
            use_compile()
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        tokens, times = c.accum * c.micro * c.seq, []
        for i in range(args.warmup + args.steps):
            sync()
            t0 = time.perf_counter()
            ce, aux, norm = train_step(model, opt, c, dev, amp)
            sync()
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                times.append(dt)
            print(f"step {i + 1}/{args.warmup + args.steps}: loss {ce:.4f} aux {aux:.5f} grad norm {norm:.3f} "
                  f"{dt:.3f} s {tokens / dt:,.0f} tokens/s{' (warmup)' if i < args.warmup else ''}", flush=True)
    except Exception as e:  # noqa: BLE001 (out of memory is a result, not a crash)
        if not (isinstance(e, getattr(torch.cuda, "OutOfMemoryError", ())) or "out of memory" in str(e).lower()):
            raise
        peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0
        print(f"TORCH_BENCH error=oom mode={mode} params={n} peak_mem_gib={peak:.2f} msg={(str(e).splitlines() or [''])[0]!r}")
        return 3
    step_s = sum(times) / len(times)
    tps = tokens / step_s
    mfu = tps * plan["model"]["flops_per_token"] / peak_flops(plan, args.peak_tflops)
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0
    pred = plan.get("predicted", {})
    print(f"timed {len(times)} steps of {tokens} tokens; mtc predicts {pred.get('step_seconds', 0):.4f} s, "
          f"{pred.get('tokens_per_second_per_gpu', 0):.0f} tokens/s, MFU {pred.get('mfu', 0):.3f}")
    print(f"TORCH_BENCH tokens_per_s={tps:.1f} mfu={mfu:.4f} step_s={step_s:.4f} peak_mem_gib={peak:.2f} mode={mode} params={n}")
    return 0


def peak_flops(plan, tflops):
    """The MFU denominator in FLOP/s: --peak-tflops if given, else the plan's peak per GPU."""
    if tflops is not None:
        return tflops * 1e12
    peak = plan.get("cluster", {}).get("peak_bf16_flops_per_gpu")
    if not peak:
        die("plan.json has no cluster.peak_bf16_flops_per_gpu (written by an older mtc): pass --peak-tflops")
    return float(peak)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", help="plan.json written by mtc compile")
    ap.add_argument("--spec", help="the spec (default: plan.json's 'spec' next to it or under specs/)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--compile", action="store_true", help="torch.compile the attention, norms, router, experts and head")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="bf16 dense peak for MFU (default: plan.json cluster.peak_bf16_flops_per_gpu)")
    ap.add_argument("--fp32", action="store_true", help="no autocast (debugging)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--selftest", action="store_true", help="CPU checks and 2 steps of the tiny plan (generated/tiny-moe)")
    args = ap.parse_args()
    if args.selftest:
        return selftest(args)
    if not args.plan:
        ap.error("--plan is required (or --selftest)")
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
