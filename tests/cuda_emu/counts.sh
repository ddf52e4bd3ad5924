#!/usr/bin/env bash
# counts.sh [CASE...] — what one training step issues on the CPU emulation (EMU_COUNTS): kernel
# launches, cuBLAS and cuDNN calls, memsets, copies (pageable ones apart), host synchronizations,
# NCCL operations, per rank, from step 2 of a 3-step run (step 1 warms the caches; the last line
# also holds the run's end). Cases (default: all):
#   tiny-moe     specs/tiny-moe.yaml on 1 rank
#   tiny-moe-ep2 specs/tiny-moe.yaml on 2 ranks, EP 2
#   europa4      specs/europa-1t.yaml's structure (GQA 3:1, 1 shared + top-8 routed experts, Muon
#                on the GPU, full checkpointing with host offload, the optimizer state on the host,
#                FSDP 4 x EP 4 in one node, re-gathered every micro-batch, prefetch 1) shrunk to 2
#                layers of hidden 192, 16 experts, 128 tokens, on 4 ranks
# A tool, like memory.sh (minutes on 2 cores). WORK (default /tmp/cuda-emu-counts) keeps the
# programs, logs and the counts (CASE.jsonl, with EMU_COUNTS_BY's "by": where each launch, cuBLAS
# call and memset came from). Prints one JSON line per case and rank (without "by"); BY=1 adds,
# after each, that rank's sums by kernel name and by memset and cuBLAS site, largest first.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${WORK:-/tmp/cuda-emu-counts}
mkdir -p "$work"
mtc=$root/build/mtc
data=/usr/share/games/fortunes/cookie
[ -f "$data" ] || data=$root/README.md
fail=0
count() {
  local name=$1 np=$2 spec=$3; shift 3
  local dir=$work/$name
  rm -rf "$dir" "$work/$name.jsonl"
  "$mtc" compile "$spec" -o "$dir" "$@" >"$work/$name.compile.log" 2>&1 || { echo "FAIL $name: compile"; fail=1; return; }
  MTC_KERNEL_CACHE=$work/kernel-cache EMU_COUNTS=$work/$name.jsonl EMU_COUNTS_BY=1 "$here/run.sh" -np "$np" "$dir" --data "$data" \
    --steps 3 --seed 7 >"$work/$name.log" 2>&1 || { tail -20 "$work/$name.log"; echo "FAIL $name: run"; fail=1; return; }
  grep '"step":2,' "$work/$name.jsonl" | sort | while IFS= read -r line; do
    echo "$name ${line%%,\"by\":*}}"
    [ "${BY:-0}" = 1 ] && by "$line"
  done
}
# The "by" sums of one line: kernels by name, memsets and cuBLAS calls by site.
by() {
  local b=${1#*\"by\":\{}
  b=${b%\}\}}
  tr ',' '\n' <<<"$b" | sed 's/^"//; s/":\([0-9]*\)$/\t\1/' | awk -F'\t' '
    { key = $1; if (key ~ /^kernel /) sub(/ @ .*/, "", key); n[key] += $2 }
    END { for (k in n) printf "  %6d  %s\n", n[k], k }' | sort -k1,1nr
}
europa=(--set model.layers=2 --set model.hidden=192 --set model.vocab=256 --set model.attention.heads=6
  --set model.attention.kv_heads=2 --set model.attention.head_dim=32 --set model.moe.experts=16
  --set model.moe.expert_intermediate=64 --set cluster.nodes=1 --set cluster.gpus_per_node=4
  --set training.seq_len=128 --set training.global_batch=8 --set training.warmup_steps=1 --set training.steps=3
  --set plan.fsdp=4 --set plan.ep=4 --set plan.activation_checkpoint=full --set plan.offload_activations=host
  --set plan.optimizer_tier=host --set plan.optimizer_step=gpu --set plan.reshard=every_micro_batch --set plan.prefetch=1)
for c in ${*:-tiny-moe tiny-moe-ep2 europa4}; do
  case $c in
  tiny-moe) count "$c" 1 "$root/specs/tiny-moe.yaml" --set cluster.nodes=1 --set cluster.gpus_per_node=1 ;;
  tiny-moe-ep2) count "$c" 2 "$root/specs/tiny-moe.yaml" --set plan.ep=2 ;;
  europa4) count "$c" 4 "$root/specs/europa-1t.yaml" "${europa[@]}" ;;
  *) echo "counts.sh: unknown case $c" >&2; fail=2 ;;
  esac
done
exit $fail
