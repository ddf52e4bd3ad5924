#!/usr/bin/env bash
# tests/train/checkpoints.sh — the generated training program end to end (lib.sh), check checkpoints:
# 10 steps straight = 5 steps, checkpoint, resume for 5 (bitwise); a save killed by SIGKILL
# before its manifest resumes from the checkpoint before (bitwise); a checkpoint saved on 4
# ranks (fsdp 4, ep 2) resumes on 2 (fsdp 2, ep 1) within 1e-5, and so do flat expert shards (ep
# 4) resumed in whole experts and back; another model's or optimizer's checkpoint is refused (with
# what to do); a corrupt shard is refused with its name; non-finite
# steps are skipped, and K in a row stop the run with the last good state saved; SIGUSR1 mid-run
# saves and stops, and the resumed run equals the straight one (bitwise); --keep-checkpoints 2
# keeps two; a checkpoint of other model conventions (model_keys) resumes with a note
#   usage: checkpoints.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

ck=(--set training.steps=10 --set training.warmup_steps=2 --set training.seq_len=64 --set training.grad_reduce_dtype=fp32)
build c2 "$tiny" float "${ck[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 || exit 1
run2() { (cd "$work" && "${mpirun[@]}" -np 2 ./c2/build/train --data "$text" "$@" >/dev/null 2>&1); }
strip() { sed 's/,"time".*//' "$1"; } # (time, step_seconds, tokens_per_second, run: not the same in two runs)
run2 --metrics straight.jsonl || die "straight run"
run2 --metrics resumed.jsonl --steps 5 --checkpoint-dir "$work/ckA" || die "first half"
[ -f "$work/ckA/step-00000005/manifest.json" ] || die "no checkpoint at step 5"
run2 --metrics resumed.jsonl --checkpoint-dir "$work/ckA" || die "resumed half"
cmp -s <(strip "$work/straight.jsonl") <(strip "$work/resumed.jsonl") && echo "10 steps = 5 + checkpoint + 5, bit for bit" ||
  die "a resumed run differs from the straight one"
# killed mid-save: step 6's shards exist, its manifest does not; resume takes step 3
run2 --metrics killed.jsonl --checkpoint-dir "$work/ckB" --checkpoint-every 3 --inject-kill-at-save 6 && die "the kill did not happen"
[ -f "$work/ckB/step-00000003/manifest.json" ] && [ ! -f "$work/ckB/step-00000006/manifest.json" ] &&
  ls "$work/ckB/step-00000006/"rank-*.bin >/dev/null 2>&1 || die "expected step 3 complete and step 6 without manifest"
printf '{"step":7,"loss":4.9' >>"$work/killed.jsonl" # a line cut by a kill
out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2/build/train --data "$text" --metrics killed.jsonl --checkpoint-dir "$work/ckB" 2>&1)
echo "$out" | grep -q "resumed from .*step-00000003" || die "after the kill: $out"
# the resume dropped the lines of steps 4-6 and the cut line: the file is the straight run's
cmp -s <(strip "$work/straight.jsonl") <(strip "$work/killed.jsonl") &&
  echo "a save killed by SIGKILL resumes from the checkpoint before it, bit for bit, and metrics.jsonl reads as one run" ||
  die "after the kill, the metrics differ from the straight run's"
# the manifest records the model's keys (model_keys): a checkpoint of other conventions (here
# rope_theta, edited, with the manifest's checksum removed as an older mtc's) resumes with a note
mkdir -p "$work/ckM" && cp -r "$work/ckA/step-00000005" "$work/ckM/" && python3 - "$work/ckM/step-00000005/manifest.json" <<'PY' ||
import json, sys
m = json.load(open(sys.argv[1])); assert "model.attention.rope_theta 10000, " in m["model_keys"]
m["model_keys"] = m["model_keys"].replace("model.attention.rope_theta 10000, ", "model.attention.rope_theta 20000, ")
del m["manifest_fnv1a64"]; json.dump(m, open(sys.argv[1], "w"))
PY
  die "the manifest has no model_keys with rope_theta 10000"
out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2/build/train --data "$text" --metrics ckM.jsonl --steps 6 --checkpoint-dir "$work/ckM" 2>&1)
echo "$out" | grep -q "^note: this run's settings differ from the checkpoint's: .*model.attention.rope_theta: 20000 in the checkpoint, 10000 now$" ||
  die "a resume under another rope_theta: $out"
# resharding: saved on 4 ranks, resumed on 2
build c4 "$tiny" float "${ck[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=2 || exit 1
build c2e1 "$tiny" float "${ck[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=1 || exit 1
(cd "$work" && "${mpirun[@]}" -np 4 ./c4/build/train --data "$text" --metrics r4.jsonl >/dev/null &&
  "${mpirun[@]}" -np 4 ./c4/build/train --data "$text" --metrics r42.jsonl --steps 5 --checkpoint-dir ckC >/dev/null &&
  "${mpirun[@]}" -np 2 ./c2e1/build/train --data "$text" --metrics r42.jsonl --checkpoint-dir ckC >/dev/null) ||
  die "reshard runs"
paste <(losses "$work/r4.jsonl") <(losses "$work/r42.jsonl") | awk '
  { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
  END { printf "saved on 4 ranks (ep 2), resumed on 2 (ep 1): worst relative difference %.2e over %d steps\n", worst, n
        exit (worst > 1e-5 || n != 10) }' || die "resharded run differs by more than 1e-5"
# flat and whole-expert shards (the manifest's per / block): saved flat on 4 ranks (ep 4: one rank per
# shard group) resumed in whole experts on 2 (ep 1: 4 experts each), and the other way
build c4e4 "$tiny" float "${ck[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=4 || exit 1
grep -q '"per"' "$work/ckC/step-00000005/manifest.json" || die "ckC: the manifest does not record whole-expert shards"
(cd "$work" && "${mpirun[@]}" -np 4 ./c4e4/build/train --data "$text" --metrics rfw.jsonl --steps 5 --checkpoint-dir ckE >/dev/null &&
  "${mpirun[@]}" -np 2 ./c2e1/build/train --data "$text" --metrics rfw.jsonl --checkpoint-dir ckE >/dev/null &&
  "${mpirun[@]}" -np 2 ./c2e1/build/train --data "$text" --metrics rwf.jsonl --steps 5 --checkpoint-dir ckF >/dev/null &&
  "${mpirun[@]}" -np 4 ./c4e4/build/train --data "$text" --metrics rwf.jsonl --checkpoint-dir ckF >/dev/null) ||
  die "flat <-> whole-expert reshard runs"
for r in rfw rwf; do
  what="saved flat (4 ranks, ep 4), resumed in whole experts (2, ep 1)"
  [ $r = rwf ] && what="saved in whole experts (2 ranks, ep 1), resumed flat (4, ep 4)"
  paste <(losses "$work/r4.jsonl") <(losses "$work/$r.jsonl") | awk -v what="$what" '
    { n++; d = $1 - $2; if (d < 0) d = -d; q = d / $1; if (q > worst) worst = q }
    END { printf "%s: worst relative difference %.2e over %d steps\n", what, worst, n
          exit (worst > 1e-5 || n != 10) }' || die "$r: resharded run differs by more than 1e-5"
done
# flat over several ranks (plan_expert_per: 6 experts do not divide over 4 ranks, ep 1) and whole
# (3 experts each over 2 ranks), both ways, against the straight 4-rank run
six=(--set model.moe.experts=6)
build c4x6 "$tiny" float "${ck[@]}" "${six[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=1 || exit 1
build c2x6 "$tiny" float "${ck[@]}" "${six[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=1 || exit 1
(cd "$work" && "${mpirun[@]}" -np 4 ./c4x6/build/train --data "$text" --metrics r6.jsonl >/dev/null &&
  "${mpirun[@]}" -np 4 ./c4x6/build/train --data "$text" --metrics r6fw.jsonl --steps 5 --checkpoint-dir ckG >/dev/null &&
  "${mpirun[@]}" -np 2 ./c2x6/build/train --data "$text" --metrics r6fw.jsonl --checkpoint-dir ckG >/dev/null &&
  "${mpirun[@]}" -np 2 ./c2x6/build/train --data "$text" --metrics r6wf.jsonl --steps 5 --checkpoint-dir ckH >/dev/null &&
  "${mpirun[@]}" -np 4 ./c4x6/build/train --data "$text" --metrics r6wf.jsonl --checkpoint-dir ckH >/dev/null) ||
  die "6 experts: flat (4 ranks) <-> whole-expert (2 ranks) reshard runs"
! grep -q '"per"' "$work/ckG/step-00000005/manifest.json" && grep -q '"per": *3' "$work/ckH/step-00000005/manifest.json" ||
  die "6 experts: the manifests do not record flat (4 ranks) and whole-expert shards of 3 (2 ranks)"
for r in r6fw r6wf; do
  what="6 experts, saved flat over 4 ranks, resumed in whole experts (3 on each of 2)"
  [ $r = r6wf ] && what="6 experts, saved in whole experts (3 on each of 2 ranks), resumed flat over 4"
  paste <(losses "$work/r6.jsonl") <(losses "$work/$r.jsonl") | awk -v what="$what" '
    { n++; d = $1 - $2; if (d < 0) d = -d; q = d / $1; if (q > worst) worst = q }
    END { printf "%s: worst relative difference %.2e over %d steps\n", what, worst, n
          exit (worst > 1e-5 || n != 10) }' || die "$r: resharded run differs by more than 1e-5"
done
# a checkpoint of another model or optimizer is refused
build c2h64 "$tiny" float "${ck[@]}" --set model.hidden=64 --set cluster.gpus_per_node=2 --set plan.fsdp=2 || exit 1
out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2h64/build/train --data "$text" --metrics y.jsonl --checkpoint-dir ckA 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "error: resuming from .*: tensor model[a-z_.0-9]* is [0-9]*x128 in the checkpoint and [0-9]*x64 in this program; expected a checkpoint of this program's model" || die "other model resumed: exit $rc, $out"
build c2mu "$tiny" float "${ck[@]}" --set training.optimizer=muon --set cluster.gpus_per_node=2 --set plan.fsdp=2 || exit 1
out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2mu/build/train --data "$text" --metrics y.jsonl --checkpoint-dir ckA 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "trained with adamw, but this program uses muon; .*: to go on with this run, compile the program with --set training.optimizer=adamw; to train with muon, start a new run with another --checkpoint-dir" ||
  die "other optimizer resumed, or no hint of what to do: exit $rc, $out"
# a corrupt shard is refused with its name
f=$work/ckA/step-00000010/rank-00001.bin
printf '\x42' | dd of="$f" bs=1 seek=300 conv=notrunc status=none
out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2/build/train --data "$text" --metrics x.jsonl --checkpoint-dir ckA 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "rank-00001.bin: checksum mismatch" && echo "a corrupt shard is refused by name" ||
  die "corrupt shard: exit $rc, $out"
# guard rails
run2 --metrics nan1.jsonl --inject-nan 3:1 || die "one non-finite step should be skipped, not fatal"
grep -c '"skipped":true' "$work/nan1.jsonl" | grep -qx 1 && grep -q '"step":3,.*"skipped":true' "$work/nan1.jsonl" ||
  die "step 3 not marked skipped"
out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2/build/train --data "$text" --metrics nan2.jsonl --inject-nan 4:100 --max-skips 3 \
  --checkpoint-dir ckD 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "3 consecutive steps had a non-finite" && [ -f "$work/ckD/step-00000003/manifest.json" ] &&
  echo "non-finite steps: one is skipped; 3 in a row stop the run with step 3's state saved" ||
  die "guard rail: exit $rc, $out"
# SIGUSR1 mid-run (what launch.sbatch has Slurm send before the time limit; mpirun forwards
# it): the run saves at the end of the step and stops with status 0; --keep-checkpoints 2
# leaves the newest two; resuming from it gives the straight run's losses bit for bit
build c2l "$tiny" float "${ck[@]}" --set training.steps=400 --set cluster.gpus_per_node=2 --set plan.fsdp=2 || exit 1
(cd "$work" && exec "${mpirun[@]}" -np 2 ./c2l/build/train --data "$text" --metrics sig.jsonl --checkpoint-dir ckS \
  --checkpoint-every 2 --keep-checkpoints 2 >sig.log 2>&1) & pid=$!
for _ in $(seq 1200); do grep -Eq '^step +5/' "$work/sig.log" 2>/dev/null && break; sleep 0.1; done
kill -USR1 $pid; wait $pid; rc=$?
at=$(ls "$work/ckS" | grep '^step-' | tail -1 | sed 's/^step-0*//')
[ $rc -eq 0 ] && grep -q "stopped after step $at on SIGUSR1; run the same command again" "$work/sig.log" &&
  [ "$at" -lt 400 ] && [ -f "$work/ckS/step-$(printf %08d "$at")/manifest.json" ] && [ "$(ls "$work/ckS" | grep -c '^step-')" -eq 2 ] ||
  die "SIGUSR1: exit $rc, checkpoints $(ls "$work/ckS" | tr '\n' ' '), $(tail -3 "$work/sig.log")"
(cd "$work" && "${mpirun[@]}" -np 2 ./c2l/build/train --data "$text" --metrics sig.jsonl --checkpoint-dir ckS \
  --steps $((at + 3)) >/dev/null && "${mpirun[@]}" -np 2 ./c2l/build/train --data "$text" --metrics sig0.jsonl \
  --steps $((at + 3)) >/dev/null) || die "resume after SIGUSR1"
cmp -s <(strip "$work/sig0.jsonl") <(strip "$work/sig.jsonl") &&
  echo "SIGUSR1 at step $at: saved, stopped, resumed bit for bit; --keep-checkpoints 2 kept two" ||
  die "the run resumed after SIGUSR1 differs from the straight one"
exit $fail
