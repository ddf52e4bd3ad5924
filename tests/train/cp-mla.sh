#!/usr/bin/env bash
# tests/train/cp-mla.sh — the generated training program end to end (lib.sh), check cp-mla:
# context parallelism (plan.cp): each sequence split over 2 ranks in 4 chunks, K/V all-gathered,
# against 1 rank with fp32 on the wire, 6 steps within 1e-5. tests/specs/mla.yaml (multi-head latent
# attention) on 2 ranks (cp 2)
#   usage: cp-mla.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

cps=(--set training.seq_len=64 --set training.steps=6 --set training.warmup_steps=2 --set training.grad_reduce_dtype=fp32)
build m1 "$src/tests/specs/mla.yaml" float "${cps[@]}" --set training.seq_len=16 || exit 1
build m2 "$src/tests/specs/mla.yaml" float "${cps[@]}" --set training.seq_len=16 --set cluster.gpus_per_node=2 \
  --set plan.fsdp=2 --set plan.cp=2
(cd "$work" && ./m1/build/train --data "$text" --metrics m1.jsonl >/dev/null) || die "1 rank run"
cp2_against m1 m2 2
exit $fail
