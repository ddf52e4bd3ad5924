#!/usr/bin/env bash
# tests/train/policies.sh — the generated training program end to end (lib.sh), check policies:
# none, selective and full activation checkpointing, and full with the boundaries offloaded to
# host memory: bitwise identical losses
#   usage: policies.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

# full-pf3: the plan's prefetch depth 3 (4 gathered units in flight or computing), not the search's
for ac in none selective full full-host full-pf3; do
  off=none; [ $ac = full-host ] && off=host
  pf=auto; [ $ac = full-pf3 ] && pf=3
  build "ac-$ac" "$tiny" float "${small[@]}" --set training.steps=4 --set cluster.gpus_per_node=4 --set plan.fsdp=4 \
    --set plan.ep=2 --set plan.activation_checkpoint=${ac%-*} --set plan.offload_activations=$off --set plan.prefetch=$pf ||
    continue
  grep -q "^#define CHECKPOINT_POLICY \"${ac%-*}\"" "$work/ac-$ac/step.h" || die "ac-$ac: policy not in step.h"
  (cd "$work" && "${mpirun[@]}" -np 4 "./ac-$ac/build/train" --data "$text" --metrics "ac-$ac.jsonl" >/dev/null) ||
    die "run with $ac checkpointing"
done
[ "$(losses "$work/ac-none.jsonl" | wc -l)" -eq 4 ] || die "expected 4 steps of losses"
cmp -s <(losses "$work/ac-none.jsonl") <(losses "$work/ac-selective.jsonl") || die "selective differs from none"
cmp -s <(losses "$work/ac-none.jsonl") <(losses "$work/ac-full.jsonl") || die "full differs from none"
cmp -s <(losses "$work/ac-none.jsonl") <(losses "$work/ac-full-host.jsonl") || die "full with host offload differs from none"
cmp -s <(losses "$work/ac-none.jsonl") <(losses "$work/ac-full-pf3.jsonl") || die "full with prefetch 3 differs from none"
grep -q "A(GATHERED3)" "$work/ac-full-pf3/step.c" && ! grep -q "GATHERED4" "$work/ac-full-pf3/step.c" ||
  die "full-pf3: expected a pool of 4 gathered units (GATHERED0-3)"
# each unit's gathers start 3 units ahead: layer 2's (unit 3) while the embedding computes
sed -n '/^real step_forward/,/rt_embedding_forward/p' "$work/ac-full-pf3/step.c" | grep -q "L2_DENSE_\(MASTER\|PARAM\)" ||
  die "full-pf3: unit 3 is not prefetched before layer 0 runs"
grep -q "rt_offload_load" "$work/ac-full-host/step.c" || die "full-host: no offload in step.c"
grep -c "layer[0-9]*_forward(c, true)" "$work/ac-full/step.c" | grep -qx 4 || die "full: expected 4 recomputed layers"
grep -q "layer[0-9]*_forward(c, true)" "$work/ac-none/step.c" && die "none: recomputes"
echo "none, selective, full checkpointing, full with host offload, full with prefetch 3: $(losses "$work/ac-none.jsonl" | tr '\n' ' ')identical"
exit $fail
