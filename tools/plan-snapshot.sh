#!/bin/sh
# plan-snapshot.sh MTC OUTDIR — the chosen plan (plan.json less the search's own count and time)
# of every example spec and of every point of europa-1t's 16-point sweep, one file each, plus
# the sweep's table: run before and after a planner change, then `diff -r BEFORE AFTER`.
set -eu
mtc=$1 out=$2
mkdir -p "$out"
strip() { sed '/^  "search": {$/,/^  }$/d'; }
for f in specs/*.yaml specs/bench/*.yaml; do
  n=$(basename "$f" .yaml)
  "$mtc" plan --json "$f" | strip >"$out/$n.json" || true
done
for d in 32 64; do "$mtc" plan --json specs/deepseek-v3.yaml --set cluster.nodes=$d | strip >"$out/deepseek-v3-n$d.json" || true; done
for nodes in 24 48 96 192; do
  for seq in 16384 32768 65536 131072; do
    "$mtc" plan --json specs/europa-1t.yaml --set cluster.nodes=$nodes --set training.seq_len=$seq |
      strip >"$out/europa-1t-n$nodes-s$seq.json" || true
  done
done
"$mtc" sweep specs/europa-1t.yaml --over cluster.nodes=24,48,96,192 \
  --over training.seq_len=16384,32768,65536,131072 >"$out/sweep.txt"
