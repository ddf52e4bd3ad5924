#!/usr/bin/env bash
# tests/train/hier.sh — the generated training program end to end (lib.sh), check hier: the
# hierarchical MoE all-to-all (plan.moe_dispatch: hierarchical; runtime/mtrt_hier.h). tiny-moe on
# 4 ranks laid out as 2 nodes x 2 (cluster.gpus_per_node 2), ep 4 across the nodes, against 1 rank
# with fp32 on the wire, 6 steps within 1e-5: without checkpointing (the default moe_imbalance
# takes extra rounds: the backward rebuilds them, the experts' forward runs again), and with
# node-limited routing (n_group 2 = one group per node, topk_group 1: a token's experts on one
# node) under full checkpointing with buffers of the dropless worst case (moe_imbalance 4: one
# round; the backward uses the recomputed forward's outputs) (the cuda build of such a plan:
# tests/kernels.sh, deepseek-v3; the emulated cuda program: tests/cuda_emu/compare.sh hier4x)
#   usage: hier.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

hs=(--set training.seq_len=64 --set training.steps=6 --set training.warmup_steps=2 --set training.grad_reduce_dtype=fp32)
one=(--set cluster.gpus_per_node=1 --set plan.fsdp=1)
four=(--set cluster.gpus_per_node=2 --set cluster.nodes=2 --set plan.fsdp=4 --set plan.ep=4 --set plan.moe_dispatch=hierarchical)
grp=(--set model.moe.n_group=2 --set model.moe.topk_group=1)
build w1 "$tiny" float "${hs[@]}" "${one[@]}" || exit 1
build h4 "$tiny" float "${hs[@]}" "${four[@]}" --set plan.activation_checkpoint=none || exit 1
build g1 "$tiny" float "${hs[@]}" "${grp[@]}" "${one[@]}" || exit 1
build g4 "$tiny" float "${hs[@]}" "${grp[@]}" "${four[@]}" --set plan.activation_checkpoint=full \
  --set plan.moe_imbalance=4 || exit 1
for d in h4 g4; do
  grep -q '^#define MOE_HIER_G 2$' "$work/$d/step.h" || die "$d: the program is not the hierarchical all-to-all"
  grep -q '"moe_dispatch": "hierarchical"' "$work/$d/plan.json" || die "$d: plan.json does not say hierarchical"
done
(cd "$work" && ./w1/build/train --data "$text" --metrics w1.jsonl >/dev/null && ./g1/build/train --data "$text" \
  --metrics g1.jsonl >/dev/null) || die "1 rank runs"
for d in h4 g4; do
  (cd "$work" && "${mpirun[@]}" -np 4 "./$d/build/train" --data "$text" --metrics "$d.jsonl" >/dev/null) || die "$d: 4 rank run"
done
same_losses w1 h4 "1 rank against 2 nodes x 2, hierarchical" 6 || die "h4: losses differ from 1 rank"
same_losses g1 g4 "node-limited routing: 1 rank against 2 nodes x 2, hierarchical, full checkpointing" 6 ||
  die "g4: losses differ from 1 rank"
python3 - "$work/h4.jsonl" "$work/g4.jsonl" <<'PY' || die "h4 without extra rounds, or g4 with them"
import json, sys
rounds = [sum(json.loads(l)["moe_extra_rounds"] for l in open(f)) for f in sys.argv[1:]]
assert rounds[0] > 0 and rounds[1] == 0, rounds
PY
exit $fail
