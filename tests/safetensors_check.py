#!/usr/bin/env python3
"""Checks `mtc export` against the checkpoint it came from, with readers written here, from the
formats' descriptions, sharing no code with the writer:
  safetensors: u64 little-endian header length, JSON header {name: {dtype, shape,
               data_offsets}}, data (huggingface/safetensors README);
  checkpoint:  manifest.json + rank-NNNNN.bin = 256-byte header, then per group the master
               shard, then two fp32 moment shards (runtime/mtrt_ckpt.h); a routed tensor with
               "per" and "block" is in whole-expert shards: expert k at offset +
               (k // per) * block + (k % per) * count.
The checkpoint must have ep = 1, so that every group's gathered vector is its shards in rank
order. With FAMILY (`mtc export CKPT OUTDIR --spec SPEC`'s model_type), the names are that
Hugging Face family's, mapped here from the program's (Llama-style) names by tables written from
the modeling files: mixtral's block_sparse_moe.{gate, experts.E.w1 (gate_proj), w2 (down_proj),
w3 (up_proj)}; qwen2_moe's mlp.shared_expert; gpt2's transformer.{wte, wpe, h.N.{ln_1, attn,
ln_2, mlp}, ln_f} with Conv1D weights stored [in, out] (transposed) and attn.c_attn the q, k, v
projections side by side (weights) or end to end (biases); the others keep the program's names.
deepseek_v3 (config.json beside FILE with rope_interleave true): the RoPE rows of q_b_proj/q_proj
(the last qk_rope_head_dim rows of each head) and kv_a_proj_with_mqa (its rows past kv_lora_rank)
are de-interleaved here as transformers' apply_rotary_pos_emb_interleave does (x.view(d/2, 2)
.transpose: the even rows, then the odd ones) before they are compared with the program's
half-split rows.
CKPT_STEP_DIR may instead be `mtc export`'s own-name file of the same checkpoint (any ep).
usage: safetensors_check.py CKPT_STEP_DIR|REF.safetensors FILE.safetensors [FAMILY]"""
import json
import struct
import sys

ckpt, path = sys.argv[1], sys.argv[2]
family = sys.argv[3] if len(sys.argv) > 3 else None


def read_safetensors(p):
    blob = open(p, "rb").read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + hlen]), blob[8 + hlen:]


want = {}
if ckpt.endswith(".safetensors"):  # the reference is mtc's own-name export (of any layout)
    ref, rbody = read_safetensors(ckpt)
    rb = 4 if ref[next(n for n in ref if n != "__metadata__")]["dtype"] == "F32" else 8
    fmt = "f" if rb == 4 else "d"
    for n, h in ref.items():
        if n != "__metadata__":
            want[n] = (rbody[h["data_offsets"][0]:h["data_offsets"][1]], h["shape"])
    man = {"step": ref["__metadata__"]["step"], "layout": {"fsdp": "?"}}
else:
    man = json.load(open(f"{ckpt}/manifest.json"))
    assert man["layout"]["ep"] == 1, "this reader handles ep = 1 checkpoints"
    rb = man["real_bytes"]
    fmt = "f" if rb == 4 else "d"
    groups = man["groups"]
    gathered = [b"" for _ in groups]
    for r in range(man["layout"]["fsdp"]):
        data = open(f"{ckpt}/rank-{r:05d}.bin", "rb").read()
        assert data[:8] == b"MTCCKPT1"
        at = 256
        for i, g in enumerate(groups):
            gathered[i] += data[at:at + g["shard"] * rb]
            at += g["shard"] * (rb + 8)
    for t in man["tensors"]:
        g = gathered[t["group"]]
        for k in range(max(t["experts"], 1)):
            name = t["name"] % k if t["experts"] else t["name"]
            per = t.get("per", 0)
            at = t["offset"] + (k // per * t["block"] + k % per * t["count"] if per else k * t["count"])
            off = at * rb
            want[name] = (g[off:off + t["count"] * rb], [t["rows"], t["cols"]] if t["cols"] > 1 else [t["rows"]])
header, body = read_safetensors(path)


def hf(name):
    """The family's name of a program name, and whether it is a transposed Conv1D weight."""
    subs = []
    if family == "mixtral":
        subs = [(".mlp.gate.", ".block_sparse_moe.gate."), (".mlp.experts.", ".block_sparse_moe.experts."),
                (".gate_proj.", ".w1."), (".down_proj.", ".w2."), (".up_proj.", ".w3.")]
    elif family == "qwen2_moe":
        subs = [(".mlp.shared_experts.", ".mlp.shared_expert.")]
    elif family == "gpt2":
        subs = [("model.embed_tokens.", "transformer.wte."), ("model.embed_positions.", "transformer.wpe."),
                ("model.norm.", "transformer.ln_f."), ("model.layers.", "transformer.h."),
                (".input_layernorm.", ".ln_1."), (".post_attention_layernorm.", ".ln_2."),
                (".self_attn.q_proj.", ".attn.c_attn."), (".self_attn.k_proj.", ".attn.c_attn."),
                (".self_attn.v_proj.", ".attn.c_attn."), (".self_attn.o_proj.", ".attn.c_proj."),
                (".mlp.up_proj.", ".mlp.c_fc."), (".mlp.down_proj.", ".mlp.c_proj.")]
    for a, b in subs:
        name = name.replace(a, b, 1)
    return name, family == "gpt2" and name.endswith(".weight") and (".attn.c_" in name or ".mlp.c_" in name)


if family:  # rename, transpose Conv1D weights, and join c_attn's parts in q, k, v order
    parts = {}
    for n, (b, shape) in want.items():
        parts.setdefault(hf(n)[0], []).append((n, b, shape))
    mapped = {}
    for name, ps in parts.items():
        if not hf(ps[0][0])[1]:
            mapped[name] = (b"".join(b for _, b, _ in ps), [sum(s[0] for _, _, s in ps)] + ps[0][2][1:])
            continue
        cols = ps[0][2][1]  # every part is [out_p, in]; the result is [in, sum out_p]
        rows = [b""] * cols
        for _, b, (out_p, _) in ps:
            for c in range(cols):
                rows[c] += b"".join(b[(r * cols + c) * rb:(r * cols + c + 1) * rb] for r in range(out_p))
        mapped[name] = (b"".join(rows), [cols, sum(s[0] for _, _, s in ps)])
    want = mapped
    assert header["__metadata__"].get("model_type") == family, header["__metadata__"]
if family == "deepseek_v3":
    import os
    cfg = json.load(open(os.path.join(os.path.dirname(path), "config.json")))
    assert cfg.get("rope_interleave") is True, "deepseek_v3 export without rope_interleave true"
    nope, rd, kvr = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["kv_lora_rank"]

    def deinterleave(name, data, rows):
        """data's rows with each rope block's rows in HF's de-interleaved order (even, then odd)."""
        if name.endswith(".q_b_proj.weight") or name.endswith(".q_proj.weight"):
            block, off = nope + rd, nope
        elif name.endswith(".kv_a_proj_with_mqa.weight"):
            block, off = kvr + rd, kvr
        else:
            return data
        rb_row = len(data) // rows
        row = [data[r * rb_row:(r + 1) * rb_row] for r in range(rows)]
        out = []
        for b0 in range(0, rows, block):
            part = row[b0 + off:b0 + off + rd]
            out += row[b0:b0 + off] + part[0::2] + part[1::2]
        return b"".join(out)
else:
    def deinterleave(name, data, rows):
        return data
names = [n for n in header if n != "__metadata__"]
assert sorted(names) == sorted(want), f"names differ: {set(names) ^ set(want)}"
checked = 0
for n in names:
    h = header[n]
    b, e = h["data_offsets"]
    assert h["dtype"] == ("F32" if rb == 4 else "F64") and h["shape"] == want[n][1], n
    assert deinterleave(n, body[b:e], h["shape"][0]) == want[n][0], \
        f"{n}: exported values differ from the checkpoint's master weights"
    checked += 1
vals = struct.unpack(f"<{len(body) // rb}{fmt}", body)
assert any(v != 0 for v in vals)
print(f"ok: {checked} tensors in {path} equal the master weights of {ckpt} "
      f"(step {man['step']}, {man['layout']['fsdp']} shards)")
