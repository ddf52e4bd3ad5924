#!/usr/bin/env bash
# tests/train/text-deepseek.sh — the generated training program end to end (lib.sh), check text-deepseek:
# tests/specs/deepseek-style.yaml (MLA, first dense layer, shared expert, sigmoid router, aux-
# free with the sequence-wise balance loss) the same way: below 2.5
#   usage: text-deepseek.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

# issue 15's loss acceptance: tests/specs/deepseek-style.yaml (MLA with q-LoRA, a first dense
# layer, shared expert, sigmoid router with aux-free bias balancing and the sequence-wise
# balance loss) on the same text, 300 steps on 2 ranks: from ~ln 256 to below 2.5
build ds "$src/tests/specs/deepseek-style.yaml" float || exit 1
grep -q "rt_mla_kv_backward" "$work/ds/step.c" && grep -q "rt_router_bias_update" "$work/ds/step.c" &&
  grep -q "rt_seq_aux_loss_backward" "$work/ds/step.c" || die "ds: step.c lacks MLA, the bias update or the sequence-wise loss"
(cd "$work" && "${mpirun[@]}" -np 2 ./ds/build/train --data "$text" --metrics ds.jsonl | tail -3) || die "training run"
losses "$work/ds.jsonl" | awk 'NR == 1 || NR % 25 == 0 { printf "step %d loss %s\n", NR, $1 }'
first=$(losses "$work/ds.jsonl" | head -1); last=$(losses "$work/ds.jsonl" | tail -1)
n=$(losses "$work/ds.jsonl" | wc -l)
echo "deepseek-style on $text: $n steps, loss $first -> $last"
awk -v a="$first" -v b="$last" -v n="$n" 'BEGIN { exit !(n == 300 && a > 5.0 && a < 6.0 && b < 2.5) }' ||
  die "expected 300 steps with the loss from ~5.55 to below 2.5"
exit $fail
