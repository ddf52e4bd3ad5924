#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_ckpt (tests/fuzz/ckpt/) from a real checkpoint directory (a
one-step tiny training run) and tests/hf/*.json. The checkpoint in the corpus came from:
  S="--set training.steps=1 --set training.warmup_steps=0 --set training.seq_len=8
     --set training.global_batch=2 --set training.micro_batch=1 --set model.layers=1
     --set model.hidden=8 --set model.attention.heads=2 --set model.attention.kv_heads=1
     --set model.moe.experts=4 --set model.moe.expert_intermediate=8
     --set cluster.gpus_per_node=1 --set plan.fsdp=1"
  mtc compile specs/tiny-moe.yaml -o t1 $S && mtc build t1 &&
    t1/build/train --data /usr/share/games/fortunes/cookie --checkpoint-dir ck
Usage: make_ckpt_seeds.py ck/step-00000001 tests/fuzz/ckpt tests/hf"""
import glob, json, os, struct, sys

SEP = b"\n@SHARD@\n"

def write(out, name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)

def header(step, rank, fsdp, ep, dpr, rb, ngroups):
    h = b"MTCCKPT1" + struct.pack("<8q", 1, step, rank, fsdp, ep, dpr, rb, ngroups)
    return h + b"\0" * (256 - len(h))

def synthetic():
    """A two-rank checkpoint (fsdp 2, ep 2): one FSDP group, one expert-shard group."""
    groups = [{"name": "dense", "comm": 0, "full": 8, "shard": 4},
              {"name": "experts", "comm": 1, "full": 2, "shard": 2}]
    tensors = [{"name": "model.norm.weight", "group": 0, "experts": 0, "offset": 0, "count": 8, "rows": 2, "cols": 4},
               {"name": "model.layers.0.mlp.experts.%d.w1.weight", "group": 1, "experts": 1, "offset": 0,
                "count": 2, "rows": 2, "cols": 1}]
    shards = []
    for r in range(2):
        body = b"".join(struct.pack("<f", r + i / 8) for i in range(6)) + b"\1" * (6 * 8)
        shards.append(header(3, r, 2, 2, 1, 4, 2) + body)
    man = {"format": "mtc-checkpoint-1", "model": "syn", "optimizer": "muon", "step": 3,
           "seed": "00000000000000ff", "layout": {"world": 2, "fsdp": 2, "ep": 2, "dp_replicate": 1,
                                                  "experts_per_rank": 1},
           "real_bytes": 4, "groups": groups, "tensors": tensors,
           "shards": [{"file": "rank-%05d.bin" % r, "bytes": len(s), "fnv1a64": "@SUM%d@" % r}
                      for r, s in enumerate(shards)]}
    text = json.dumps(man, separators=(",", ":")).encode()
    return text, shards

def main():
    ck, out, hf = sys.argv[1:4]
    man = json.load(open(os.path.join(ck, "manifest.json")))
    shard = open(os.path.join(ck, "rank-00000.bin"), "rb").read()
    real = json.dumps(man, separators=(",", ":")).encode()
    write(out, "real-literal-sum", b"C" + real + SEP + shard)          # the checksum as written
    man["shards"][0]["fnv1a64"] = "@SUM0@"
    man["shards"][0]["bytes"] = "@BYTES0@"
    placeholders = json.dumps(man, separators=(",", ":")).encode().replace(b'"@BYTES0@"', b"@BYTES0@")
    write(out, "real", b"C" + placeholders + SEP + shard)
    write(out, "real-no-shard", b"C" + real)
    text, shards = synthetic()
    write(out, "two-ranks", b"C" + text + b"".join(SEP + s for s in shards))
    for p in sorted(glob.glob(os.path.join(hf, "*.json"))):
        write(out, "hf-" + os.path.basename(p)[:-5], b"H" + open(p, "rb").read())

main()
