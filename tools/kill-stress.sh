#!/usr/bin/env bash
# kill -9 at random points of a training run with a checkpoint after every step, TRIES times: after
# each kill every step directory that holds a manifest must be a whole checkpoint (mtc export reads
# and checksums all of it), the run resumed to the end must exit 0, and its metrics must equal an
# unkilled run's bit for bit (every field before "time"). Odd tries kill at a time uniform over
# the unkilled run's wall time (x 1.1, so that some land after the end); even tries aim at a save:
# 0-400 ms after the line of a random step appears (its checkpoint is written right after it).
# Both from a seeded generator.
# With NP > 1 the program runs under mpirun and the kill hits one rank chosen at random.
# Prints one line per try (when the kill landed: before any checkpoint, inside a save, between
# saves, after the end) and a summary; exit 1 on any failure.
#   usage: tools/kill-stress.sh MTC TRAIN DATA TRIES [STEPS]   (NP=1, SEED=1, WORK=a new temp dir)
set -u
mtc=$(realpath "$1"); train=$(realpath "$2"); data=$(realpath "$3"); tries=$4; steps=${5:-4}
np=${NP:-1} seed=${SEED:-1}
work=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/mtc-kill.XXXXXX")}
mkdir -p "$work" && cd "$work" || exit 1
export OPENBLAS_NUM_THREADS=1
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np "$np")
run() { if [ "$np" -gt 1 ]; then "${mpirun[@]}" "$train" "$@"; else "$train" "$@"; fi; }
spawn() { if [ "$np" -gt 1 ]; then exec "${mpirun[@]}" "$train" "$@"; else exec "$train" "$@"; fi; } # (in a subshell)
strip() { sed 's/,"time".*//' "$1"; } # (time, step_seconds, tokens_per_second and the run id: the fields after it)
fail=0
die() { echo "FAIL: $*"; fail=1; }

t0=$(date +%s.%N)
run --data "$data" --steps "$steps" --metrics ref.jsonl --checkpoint-dir ck-ref --checkpoint-every 1 >ref.log 2>&1 ||
  { cat ref.log; echo "FAIL: the unkilled run"; exit 1; }
dur=$(echo "$(date +%s.%N) $t0" | awk '{ print $1 - $2 }')
echo "unkilled run: $steps steps, a checkpoint after each, $dur s"
declare -A landed
for i in $(seq "$tries"); do
  ck=ck-$i m=m-$i.jsonl
  delay=$(awk -v s=$((seed * 7919 + i)) -v d="$dur" 'BEGIN { srand(s); printf "%.3f", rand() * d * 1.1 }')
  (spawn --data "$data" --steps "$steps" --metrics "$m" --checkpoint-dir "$ck" --checkpoint-every 1 >"kill-$i.log" 2>&1) &
  pid=$! # the program itself (the subshell execs it), or mpirun
  if [ $((i % 2)) -eq 0 ]; then # aim at the save after step k
    k=$(awk -v s=$((seed * 7919 + i)) -v n="$steps" 'BEGIN { srand(s); printf "%d", 1 + int(rand() * n) }')
    delay=$(awk -v s=$((seed * 104729 + i)) 'BEGIN { srand(s); printf "%.3f", rand() * 0.4 }')
    for _ in $(seq 3000); do grep -Eqs "^step +$k/" "kill-$i.log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.01; done
    when="$delay s after step $k's line"
  else
    when="$delay s"
  fi
  sleep "$delay"
  victim=$pid
  if [ "$np" -gt 1 ]; then # one rank at random (mpirun's children, or their children under orted)
    ranks=($(pgrep -f "^$train " || true))
    [ ${#ranks[@]} -gt 0 ] && victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
  fi
  kill -9 "$victim" 2>/dev/null
  wait $pid 2>/dev/null; rc=$?
  # what the kill left: every step directory with a manifest is whole; the others are a save cut short
  where="after the end"; [ $rc -ne 0 ] && where="between saves"
  [ -d "$ck" ] && [ -n "$(ls "$ck" | grep '^step-')" ] || where="before any checkpoint"
  for d in "$ck"/step-*; do
    [ -d "$d" ] || continue
    if [ -f "$d/manifest.json" ]; then
      "$mtc" export "$d" "x-$i.safetensors" >"export-$i.log" 2>&1 ||
        die "try $i: $d has a manifest but is not a whole checkpoint: $(cat "export-$i.log")"
      rm -f "x-$i.safetensors"
    else
      where="inside a save"
    fi
  done
  [ $rc -ne 0 ] && [ "$where" = "after the end" ] && where="between saves"
  out=$(run --data "$data" --steps "$steps" --metrics "$m" --checkpoint-dir "$ck" 2>&1); rc2=$?
  [ $rc2 -eq 0 ] || die "try $i: the resume exited $rc2: $out"
  if cmp -s <(strip ref.jsonl) <(strip "$m"); then s=same; else s=DIFFERENT; die "try $i: metrics differ from the unkilled run's"; diff <(strip ref.jsonl) <(strip "$m") | head -6; fi
  resumed=$(echo "$out" | sed -n 's/^resumed from .*\/\(step-[0-9]*\) .*/\1/p')
  printf 'try %2d: kill -9 at %s (%s), exit %d; resumed from %s; metrics %s\n' "$i" "$when" "$where" "$rc" \
    "${resumed:-nothing}" "$s"
  landed[$where]=$((${landed[$where]:-0} + 1))
done
summary=""
for w in "before any checkpoint" "inside a save" "between saves" "after the end"; do summary+="${landed[$w]:-0} $w, "; done
echo "kill-stress: $tries tries on $np rank(s) (${summary%, }): $([ $fail -eq 0 ] && echo "every resume equal to the unkilled run bit for bit, every manifest's checkpoint whole" || echo FAILED)"
[ -z "${WORK:-}" ] && rm -rf "$work"
exit $fail
