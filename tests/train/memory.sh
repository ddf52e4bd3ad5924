#!/usr/bin/env bash
# tests/train/memory.sh — the generated training program end to end (lib.sh), check memory:
# train --memory (no mpirun) prints {"hbm","host","host_pinned"} whose arena part is step.h's;
# the start-up resident growth (VmHWM) of a real run matches it within 5%, on 1 rank (Muon, full
# checkpointing with host offload) and on 2 (ep 2)
#   usage: memory.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

# a plan big enough that the start-up allocations dominate the process's other memory
mem=(--set training.seq_len=2048 --set training.global_batch=4 --set model.layers=6 --set training.steps=2
     --set training.warmup_steps=1)
build m1 "$tiny" float "${mem[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 --set training.optimizer=muon \
  --set plan.activation_checkpoint=full --set plan.offload_activations=host || exit 1
build m2 "$tiny" float "${mem[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=2 || exit 1
for m in m1 m2; do
  js=$("$work/$m/build/train" --memory) || { die "$m: train --memory failed"; continue; }
  def() { sed -n "s/^#define $1 \\([0-9]*\\).*/\\1/p" "$work/$m/step.h"; }
  arena=$(def ARENA_ELEMS) host=$(def HOST_ELEMS) state=$(def STATE_ELEMS) on_host=$(def STATE_ON_HOST)
  acts=$(def ACT_ELEMS)
  python3 -c "
import json, sys
j = json.loads(sys.argv[1]); arena, host, state, on_host, acts = (int(x) for x in sys.argv[2:7])
arena, host, state = (arena + acts) * 4, host * 4, state * 4   # the cpu build's act is its real
hbm = arena + (0 if on_host else state)                    # the cpu build: its memory stands in for HBM
pinned = host                                              # and for pinned host memory (the host arena: the state in it when on the host)
assert set(j) == {'hbm', 'host', 'host_pinned'}, j
assert j['hbm'] == hbm, (j, hbm)
assert j['host_pinned'] == pinned and j['host'] >= pinned, (j, pinned)
assert j['host'] - pinned < 1 << 20, j                     # besides those: tokens and count arrays only
" "$js" "$arena" "$host" "$state" "$on_host" "$acts" ||
    die "$m: --memory $js does not match step.h (ARENA_ELEMS $arena, ACT_ELEMS $acts, HOST_ELEMS $host, STATE_ELEMS $state)"
  np=1; [ $m = m2 ] && np=2
  out=$(cd "$work" && "${mpirun[@]}" -np $np "./$m/build/train" --data "$text" --steps 1 --metrics "$m.jsonl" 2>&1) ||
    { echo "$out" | tail -5; die "$m: run"; continue; }
  line=$(echo "$out" | grep "^memory: start-up resident growth")
  echo "$m: $line"
  echo "$line" | awk '{ g = $5; a = $11; d = g - a; if (d < 0) d = -d
    exit !(g > 0 && a > 50e6 && d <= 0.05 * a) }' || die "$m: resident growth differs from --memory by more than 5%"
done
[ "$("$work/m1/build/train" --memory --data x 2>&1 >/dev/null)" != "" ] || die "--memory with other arguments accepted"
exit $fail
