#!/usr/bin/env bash
# tests/train/imbalance.sh — the generated training program end to end (lib.sh), check imbalance:
# the MoE all-to-all in bounded rounds: moe_imbalance 1 (buffers of exactly the mean rows, so
# any imbalance needs extra rounds) against its physical maximum (buffers of the dropless worst
# case, never a second round), 2 ranks (ep 2, no checkpointing) and 4 (ep 4, selective), fp32
# wire: the same losses within 1e-5, extra rounds counted in metrics.jsonl
#   usage: imbalance.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

im=("${small[@]}" --set training.grad_reduce_dtype=fp32)
for ep in 2 4; do
  max=$((ep * (2 < 8 / ep ? 2 : 8 / ep) / 2)) # ep x min(top_k, experts / ep) / top_k (tiny-moe: 8 experts, top-2)
  ac=none; [ $ep = 4 ] && ac=selective # the backward rebuilds a round from saved rows, or after recomputing
  for imb in 1 $max; do
    build "i$ep-$imb" "$tiny" float "${im[@]}" --set cluster.gpus_per_node=$ep --set plan.fsdp=$ep --set plan.ep=$ep \
      --set plan.moe_imbalance=$imb --set plan.activation_checkpoint=$ac || continue
    (cd "$work" && "${mpirun[@]}" -np $ep "./i$ep-$imb/build/train" --data "$text" --metrics "i$ep-$imb.jsonl" >/dev/null) ||
      die "ep $ep, moe_imbalance $imb: run"
  done
  cap1=$(sed -n 's/^#define MOE_CAP_ROWS \([0-9]*\) .*/\1/p' "$work/i$ep-1/step.h")
  capm=$(sed -n 's/^#define MOE_CAP_ROWS \([0-9]*\) .*/\1/p' "$work/i$ep-$max/step.h")
  mean=$(sed -n 's/^#define MOE_MEAN_ROWS \([0-9]*\) .*/\1/p' "$work/i$ep-1/step.h")
  [ "$cap1" = "$mean" ] && [ "$capm" = $((max * mean)) ] || die "ep $ep: buffers of $cap1 and $capm rows, mean $mean"
  python3 - "$work/i$ep-1.jsonl" "$work/i$ep-$max.jsonl" "$ep" <<'PY' || die "ep $ep: bounded rounds differ from unbounded buffers"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 10, (len(a), len(b))
worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))
extra = sum(x["moe_extra_rounds"] for x in a)
print(f"ep {sys.argv[3]}: buffers of the mean vs the worst case: {extra} extra rounds over 10 steps, busiest rank "
    f"{max(x['moe_load'] for x in a):.2f} x the mean; worst relative loss difference {worst:.1e}")
assert worst <= 1e-5, worst
assert extra > 0 and all(y["moe_extra_rounds"] == 0 for y in b)
assert all(x["moe_load"] >= 1 for x in a) and a[0]["moe_load"] == b[0]["moe_load"]  # the same routing at step 1
PY
done
exit $fail
