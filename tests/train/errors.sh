#!/usr/bin/env bash
# tests/train/errors.sh — the generated training program end to end (lib.sh), check errors:
# a launch with the wrong world size, a missing data file, bad arguments; --help against the
# options the program takes; a program its directory's plan.json is not of; a run of 2^32 + 40
# steps (its learning rate at step 2 is the peak, not the minimum) planned with its boundaries
# on NVMe (the program warns that it keeps them in host memory)
#   usage: errors.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

build e4 "$tiny" float "${small[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 || exit 1
out=$(cd "$work" && "${mpirun[@]}" -np 2 ./e4/build/train --data "$text" 2>&1); rc=$?
[ $rc -ne 0 ] || die "a 2-rank launch of a 4-rank plan succeeded"
echo "$out" | grep -q "planned for 4 ranks.*launched with 2; expected mpirun -np 4, or a plan for 2 ranks: mtc compile SPEC --set .*(SPEC: the path of the tiny-moe.yaml" ||
  die "world-size message: $out"
build e1 "$tiny" float "${small[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 || exit 1
out=$("$work/e1/build/train" --data "$work/no-such-file" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "no-such-file.*or a Megatron indexed dataset" || die "missing data: exit $rc, $out"
out=$("$work/e1/build/train" --data "$text" --steps zero 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--steps expects a positive integer" || die "bad --steps: exit $rc, $out"
out=$("$work/e1/build/train" --data "$text" --steps 11 --metrics "$work/past.jsonl" 2>&1); rc=$?
steps=$(sed -n 's/^#define TRAIN_STEPS \([0-9]*\).*/\1/p' "$work/e1/step.h")
if [ "$steps" -lt 11 ]; then
  [ $rc -eq 0 ] && echo "$out" | grep -q "note: --steps 11 is past the spec's training.steps $steps" || die "--steps past training.steps: exit $rc, $out"
else die "expected e1's training.steps below 11, not $steps"
fi
out=$("$work/e1/build/train" --data "$text" --steps 99999999999999999999 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--steps is too large" || die "huge --steps (clamped?): exit $rc, $out"
out=$("$work/e1/build/train" --data "$text" --seed 99999999999999999999999 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--seed is too large" || die "huge --seed (clamped?): exit $rc, $out"
out=$("$work/e1/build/train" --data "$text" --checkpoint-every 99999999999999999999 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--checkpoint-every expects a positive integer" || die "huge --checkpoint-every: exit $rc, $out"
out=$("$work/e1/build/train" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--data PATH is required" || die "no --data: exit $rc, $out"
out=$("$work/e1/build/train" --data "$text" --grad-check 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "needs the double build" || die "--grad-check in float: exit $rc, $out"
out=$("$mtc" build "$work/no-such-dir" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "expected the directory .mtc compile. wrote" || die "mtc build of a missing dir: $out"
out=$("$work/e1/build/train" --data "$text" --checkpoint-dir "$text/x" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "expected a writable directory" || die "bad --checkpoint-dir at start: $out"
out=$("$work/e1/build/train" --data "$text" --metrics "$work/no/such/dir/m.jsonl" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "expected a writable file path" || die "bad --metrics: $out"
out=$("$work/e1/build/train" --bogus 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "unknown option '--bogus'" || die "unknown option: $out"
# train --help lists every option the program takes (parse_args' table and main's own), and takes
# every option it lists: the text and the code cannot drift apart
help=$("$work/e1/build/train" --help 2>&1); rc=$?
[ $rc -eq 0 ] || die "train --help: exit $rc"
takes=$( (grep -o '{"[a-z-]*", \(required\|no\)_argument' "$src/templates/train/20-args.c" | sed 's/{"\([a-z-]*\)".*/--\1/'
  grep -oh 'strcmp(argv\[i\], "--*[a-z-]*")' "$src/templates/train/"*.c | grep -o '"-.*"' | tr -d '"') | sort -u)
listed=$(echo "$help" | grep -oE '(^|[][ |,])--?[a-z][a-z-]*' | sed 's/^[][ |,]*//' | sort -u)
[ "$(echo "$takes" | wc -l)" -ge 15 ] || die "train's options not found in templates/train: $takes"
for o in $takes; do echo "$listed" | grep -qx -- "$o" || die "train --help does not list $o"; done
for o in $listed; do echo "$takes" | grep -qx -- "$o" || die "train --help lists $o, which train does not take"; done
# a program whose directory's plan.json is not the plan it was compiled from (compiled again,
# or edited) is refused at start-up, naming both plans and what to run; nothing is created
cp -r "$work/e1" "$work/e1stale" && echo " " >>"$work/e1stale/plan.json"
out=$(cd "$work" && ./e1stale/build/train --data "$text" --steps 1 --checkpoint-dir ck-stale --metrics stale.jsonl 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "error: this program was compiled from plan [0-9a-f]\{16\}, but .*/e1stale/plan.json is plan [0-9a-f]\{16\}: .*rebuild it with .mtc build .*e1stale" &&
  [ ! -e "$work/ck-stale" ] && [ ! -e "$work/stale.jsonl" ] || die "a stale program ran: exit $rc, $out"
# --profile: checked at start (not after the run), never written over data or through a link,
# and a run that measured no step says so instead of exiting 0 without the file
cp "$text" "$work/prof-data.txt"; before=$(cksum < "$work/prof-data.txt")
out=$("$work/e1/build/train" --data "$text" --steps 3 --metrics /dev/null --profile "$work/prof-data.txt" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "not a profile of mtc's" && [ "$(cksum < "$work/prof-data.txt")" = "$before" ] &&
  ! echo "$out" | grep -q "^step" || die "--profile over a data file: exit $rc, $out"
out=$("$work/e1/build/train" --data "$text" --steps 3 --metrics /dev/null --profile "$work/no/such/dir/p.json" 2>&1); rc=$?
[ $rc -eq 2 ] && ! echo "$out" | grep -q "^step" || die "an unwritable --profile not refused at start: exit $rc, $out"
ln -sf prof.json "$work/prof-link.json"
out=$("$work/e1/build/train" --data "$text" --steps 3 --metrics /dev/null --profile "$work/prof-link.json" 2>&1); rc=$?
[ $rc -eq 2 ] && [ ! -e "$work/prof.json" ] || die "--profile through a link: exit $rc, $out"
out=$("$work/e1/build/train" --data "$text" --steps 1 --metrics /dev/null --profile "$work/prof.json" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "measured no step" && [ ! -e "$work/prof.json" ] ||
  die "--profile with no timed step: exit $rc, $out"
# training.steps past 2^31 (the key allows 2^40): a 64-bit schedule (issue 16 items 10 and 13)
build long "$tiny" float "${small[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 --set training.steps=4294967336 \
  --set training.warmup_steps=0 --set plan.activation_checkpoint=full --set plan.offload_activations=nvme \
  --set "cluster.nvme.capacity=1 TB" --set "cluster.nvme.bandwidth=5 GB/s" || exit 1
out=$(cd "$work" && ./long/build/train --data "$text" --steps 2 --metrics long.jsonl 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "warning: the plan puts the layer boundaries on NVMe, but this program keeps them in host memory" ||
  die "NVMe plan: exit $rc, $out"
grep -q '^{"step":2,.*"lr":0.003,' "$work/long.jsonl" && echo "$out" | grep -q "step     2/2 " ||
  die "2^32 + 40 steps: expected the peak learning rate 0.003 at step 2: $(cat "$work/long.jsonl")"
[ $fail -eq 0 ] && echo "ok: world-size, data and argument errors are refused with their reasons"
exit $fail
