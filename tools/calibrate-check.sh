#!/usr/bin/env bash
# The calibration check of issue 14 on the cpu backend (README, "Calibrating on your own
# cluster"): profile tiny-moe on 1 rank, calibrate the cpu preset from it, then compile specs
# the fit did not see (tests/specs/calib-dense.yaml, tests/specs/calib-moe.yaml) with the
# calibrated preset on 1 and 2 ranks, run them, and print predicted vs measured tokens/s per
# rank. Wall-clock figures: on a shared machine run it when nothing else runs, or read the
# tiny-moe repeat at the end (the same run as the profile) as the drift of the machine's load.
#   usage: tools/calibrate-check.sh [BUILD_DIR] [WORK_DIR]     (STEPS=8 by default)
set -eu
mtc=$(realpath "${1:-build}")/mtc
work=${2:-$(mktemp -d)}
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-8}
data=/usr/share/games/fortunes/cookie
export OPENBLAS_NUM_THREADS=1
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1)
mkdir -p "$work/presets"
cd "$work"
one=(--set cluster.gpus_per_node=1 --set plan.fsdp=1)
two=(--set cluster.gpus_per_node=2 --set plan.fsdp=2)
run() { # NAME NP: prints the throughput line's tokens/s and the prediction
  local name=$1 np=$2 out
  if [ "$np" = 1 ]; then out=$("./$name/build/train" --data "$data" --steps "$steps" --metrics "$name.jsonl" "${@:3}")
  else out=$("${mpirun[@]}" -np "$np" "./$name/build/train" --data "$data" --steps "$steps" --metrics "$name.jsonl" "${@:3}"); fi
  echo "$out" | sed -n 's/^throughput: \([0-9]*\) tokens.*predicted \([0-9]*\) per GPU.*measured \/ predicted \([0-9.]*\)$/\1 \2 \3/p'
}
"$mtc" compile "$root/specs/tiny-moe.yaml" -o fit "${one[@]}" >/dev/null
"$mtc" build fit >fit.log 2>&1
run fit 1 --profile tiny-moe.profile.json >/dev/null
"$mtc" calibrate tiny-moe.profile.json --preset cpu -o presets/cpu-calibrated.yaml
export MTC_PRESET_DIR=$work/presets
cal=(--set cluster.preset=cpu-calibrated)
for s in dense moe; do
  "$mtc" compile "$root/tests/specs/calib-$s.yaml" -o "$s-1" "${cal[@]}" "${one[@]}" >/dev/null
  "$mtc" compile "$root/tests/specs/calib-$s.yaml" -o "$s-2" "${cal[@]}" "${two[@]}" >/dev/null
  "$mtc" build "$s-1" >"$s-1.log" 2>&1
  "$mtc" build "$s-2" >"$s-2.log" 2>&1
done
"$mtc" compile "$root/specs/tiny-moe.yaml" -o fit-cal "${cal[@]}" "${one[@]}" >/dev/null
"$mtc" build fit-cal >fit-cal.log 2>&1
printf '%-28s %10s %10s %9s\n' run measured predicted "meas/pred"
for r in "fit-cal 1 tiny-moe-1rank(fitted)" "dense-1 1 calib-dense-1rank" "dense-2 2 calib-dense-2ranks" \
         "moe-1 1 calib-moe-1rank" "moe-2 2 calib-moe-2ranks" "fit-cal 1 tiny-moe-1rank(repeat)"; do
  set -- $r
  read -r meas pred ratio < <(run "$1" "$2")
  printf '%-28s %10s %10s %9s\n' "$3" "$meas" "$pred" "$ratio"
done
