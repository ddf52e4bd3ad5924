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
order.   usage: safetensors_check.py CKPT_STEP_DIR FILE.safetensors"""
import json
import struct
import sys

ckpt, path = sys.argv[1], sys.argv[2]
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

blob = open(path, "rb").read()
(hlen,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + hlen])
body = blob[8 + hlen:]
want = {}
for t in man["tensors"]:
    g = gathered[t["group"]]
    for k in range(max(t["experts"], 1)):
        name = t["name"] % k if t["experts"] else t["name"]
        per = t.get("per", 0)
        at = t["offset"] + (k // per * t["block"] + k % per * t["count"] if per else k * t["count"])
        off = at * rb
        want[name] = (g[off:off + t["count"] * rb], [t["rows"], t["cols"]] if t["cols"] > 1 else [t["rows"]])
names = [n for n in header if n != "__metadata__"]
assert sorted(names) == sorted(want), f"names differ: {set(names) ^ set(want)}"
checked = 0
for n in names:
    h = header[n]
    b, e = h["data_offsets"]
    assert h["dtype"] == ("F32" if rb == 4 else "F64") and h["shape"] == want[n][1], n
    assert body[b:e] == want[n][0], f"{n}: exported values differ from the checkpoint's master weights"
    checked += 1
vals = struct.unpack(f"<{len(body) // rb}{fmt}", body)
assert any(v != 0 for v in vals)
print(f"ok: {checked} tensors in {path} equal the master weights of {ckpt} "
      f"(step {man['step']}, {man['layout']['fsdp']} shards)")
