#!/usr/bin/env bash
# memory.sh — what the cuda program allocates, measured on the CPU emulation, against what it
# says it allocates (train --memory): the emulation counts every cudaMalloc and cudaMallocHost
# (EMU_MEM_REPORT=1 prints their peaks at exit) of one training step. Cases: tiny-moe on 1 rank
# with Muon (its scratch on the host), full checkpointing and host offload (pinned arena); and
# on 2 ranks with ep 2 (all-to-all, NCCL over MPI). It also reports the host synchronizations of one
# training step (the emulation counts them; a 2-step run less a 1-step run). A tool, like
# compare.sh (minutes on 2 cores).
#   tests/cuda_emu/memory.sh            (WORK=/tmp/cuda-emu-memory by default)
# Exit status 1 when a measured peak differs from --memory.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${WORK:-/tmp/cuda-emu-memory}
mkdir -p "$work"
mtc=$root/build/mtc
data=/usr/share/games/fortunes/cookie
[ -f "$data" ] || data=$root/README.md
small=(--set training.seq_len=128 --set training.steps=2 --set training.warmup_steps=1 --set model.layers=4)
fail=0
check() {
  local name=$1 np=$2; shift 2
  local dir=$work/$name
  rm -rf "$dir"
  "$mtc" compile "$root/specs/tiny-moe.yaml" -o "$dir" "${small[@]}" "$@" >/dev/null || { echo "FAIL $name: compile"; fail=1; return; }
  MTC_KERNEL_CACHE=$work/kernel-cache EMU_MEM_REPORT=1 "$here/run.sh" -np "$np" "$dir" --data "$data" --steps 1 \
    --metrics "$work/$name.jsonl" >"$work/$name.log" 2>&1 || { tail -20 "$work/$name.log"; echo "FAIL $name: run"; fail=1; return; }
  local js; js=$("$dir/build-emu/train" --memory)
  MTC_KERNEL_CACHE=$work/kernel-cache EMU_MEM_REPORT=1 "$here/run.sh" -np "$np" "$dir" --data "$data" --steps 2 \
    --metrics "$work/$name-2.jsonl" >"$work/$name-2.log" 2>&1 || { tail -20 "$work/$name-2.log"; echo "FAIL $name: 2 steps"; fail=1; return; }
  local s1 s2
  s1=$(sed -n 's/^emu-memory: rank 0 .* host_syncs \([0-9]*\)$/\1/p' "$work/$name.log")
  s2=$(sed -n 's/^emu-memory: rank 0 .* host_syncs \([0-9]*\)$/\1/p' "$work/$name-2.log")
  local moe; moe=$(grep -c "rt_moe_route" "$dir/step.c")
  echo "$name: $((s2 - s1)) host synchronizations per training step on rank 0 ($(grep -c 'layer[0-9]*_forward(c, true)' "$dir/step.c") recomputed layers; $moe MoE layer passes with routing in step.c)"
  python3 - "$name" "$js" "$work/$name.log" <<'PY' || fail=1
import json, re, sys
name, js, log = sys.argv[1], json.loads(sys.argv[2]), open(sys.argv[3]).read()
got = re.findall(r"emu-memory: rank (\d+) device_peak (\d+) pinned_peak (\d+)", log)
r0 = [g for g in got if g[0] == "0"]
if not r0:
    print(f"FAIL {name}: no emu-memory line"); sys.exit(1)
dev, pin = int(r0[0][1]), int(r0[0][2])
ok = dev == js["hbm"] and pin == js["host_pinned"]
print(f"{'ok' if ok else 'FAIL'} {name}: cudaMalloc'd {dev} bytes (--memory hbm {js['hbm']}), "
      f"cudaMallocHost'd {pin} (--memory host_pinned {js['host_pinned']}); host in all {js['host']}")
sys.exit(0 if ok else 1)
PY
}
check muon-offload 1 --set cluster.gpus_per_node=1 --set plan.fsdp=1 --set training.optimizer=muon \
  --set plan.activation_checkpoint=full --set plan.offload_activations=host
check ep2 2 --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=2
exit $fail
