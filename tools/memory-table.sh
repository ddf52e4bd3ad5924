#!/usr/bin/env bash
# What each example program allocates (train --memory of its cuda build; no GPU needed) next to
# its plan (plan.json's packed peak per tier, less the reserve items the driver, NCCL and the
# system hold), as the markdown table of BENCHMARKS.md.   usage: tools/memory-table.sh [MTC [SPEC...]]
# (default: the examples below)
# Issue 12's acceptance: --memory within -5% ... +2% of the plan, per tier.
set -u
cd "$(dirname "$0")/.."
mtc=$(realpath "${1:-build/mtc}")
work=$(mktemp -d "${TMPDIR:-/tmp}/mtc-memory.XXXXXX"); trap 'rm -rf "$work"' EXIT
echo "| spec | plan HBM | cuda --memory hbm | ratio | plan host | cuda --memory host | ratio | cpu build's arena + host |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
[ $# -gt 0 ] && shift
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(specs/europa-1t.yaml specs/mixtral-8x7b.yaml specs/llama-3.1-8b.yaml specs/tiny-moe.yaml
                             specs/deepseek-v3.yaml specs/qwen3-30b-a3b.yaml specs/bench/moe-1b.yaml)
for spec in "${specs[@]}"; do
  name=$(basename "$spec" .yaml)
  "$mtc" compile "$spec" -o "$work/$name" >/dev/null 2>&1 || { echo "| $name | no program | | | | | | |"; continue; }
  "$mtc" build "$work/$name" --backend cuda >"$work/$name.cuda.log" 2>&1 || { tail -5 "$work/$name.cuda.log"; continue; }
  cuda=$("$work/$name/build-cuda/train" --memory)
  "$mtc" build "$work/$name" >"$work/$name.cpu.log" 2>&1 || { tail -5 "$work/$name.cpu.log"; continue; }
  cpu=$("$work/$name/build/train" --memory)
  python3 - "$work/$name/plan.json" "$cuda" "$cpu" "$name" <<'PY'
import json, sys
plan, cuda, cpu, name = json.load(open(sys.argv[1])), json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
mem = plan["memory"]
def reserve(tier, skip=()):
    return sum(i["bytes"] for i in mem[tier].get("items", []) if i["category"] == "reserve" and i["name"] not in skip)
hbm = mem["hbm"]["peak"] - reserve("hbm", ("reserve.cublas_workspace",))  # the program allocates cuBLAS's workspace
host = mem["host"]["peak"] - reserve("host") if "host" in mem else 0
g = lambda b: f"{b / 2**30:.2f} GiB"
r = lambda a, b: f"{a / b:.2f}x" if b else "n/a"
print(f"| {name} | {g(hbm)} | {g(cuda['hbm'])} | {r(cuda['hbm'], hbm)} | {g(host)} | {g(cuda['host'])} | "
      f"{r(cuda['host'], host)} | {g(cpu['hbm'] + cpu['host'])} |")
PY
done
