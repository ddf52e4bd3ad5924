#!/usr/bin/env bash
# The calibration check of issue 14 on the cpu backend (docs/fidelity.md, "Calibrating on your own
# cluster"): profile tiny-moe on 1 rank (and, with FIT2=1, the default, also on 2 ranks with
# fsdp 2 and ep 2, so that mtc calibrate fits the collectives' efficiency.network and
# efficiency.all_to_all too), calibrate the cpu preset from the profiles, and set the
# calibrated prediction of specs the fit did not see (tests/specs/calib-dense.yaml,
# tests/specs/calib-moe.yaml, on 1 and 2 ranks) next to what their programs measure.
# The programs are compiled with the plain cpu preset and a pinned layout (no checkpointing,
# state in "HBM", prefetch 1; ep 1, but 2 for the MoE on 2 ranks), so that `mtc plan` with the calibrated preset prices the
# very layout that ran. ROUNDS rounds (default 2) each profile tiny-moe and then run every
# held-out program, so that on a shared machine the fit and the runs see the same load; the fit
# uses every round's profile (least squares over them) and each measured figure is the mean
# over the rounds (min-max shown). "core share": the CPU seconds per wall second of each round's
# run, per rank (the profile's cpu_seconds_per_step / step_seconds): 1 is a core of its own; the
# last column scales each ratio by the fit's mean core share over the run's (what the run would
# have done with the CPU the fit had: the load of a shared machine taken out).
#   usage: tools/calibrate-check.sh [BUILD_DIR] [WORK_DIR]     (STEPS=8, ROUNDS=2, FIT2=1)
set -eu
mtc=$(realpath "${1:-build}")/mtc
work=${2:-$(mktemp -d)}
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-8} rounds=${ROUNDS:-2} fit2=${FIT2:-1}
data=/usr/share/games/fortunes/cookie
export OPENBLAS_NUM_THREADS=1
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1)
mkdir -p "$work/presets"
cd "$work"
pin=(--set plan.activation_checkpoint=none --set plan.offload_activations=none --set plan.optimizer_tier=hbm
     --set plan.prefetch=1)
one=(--set cluster.gpus_per_node=1 --set plan.fsdp=1 --set plan.ep=1)
two=(--set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=1)
declare -A spec sets
spec[fit]=$root/specs/tiny-moe.yaml sets[fit]="${one[*]}"
spec[fit2]=$root/specs/tiny-moe.yaml sets[fit2]="${two[*]} --set plan.ep=2" # np 2: the collectives' fit
fits=(fit); [ "$fit2" = 1 ] && fits+=(fit2)
for s in dense moe; do
  spec[$s-1]=$root/tests/specs/calib-$s.yaml sets[$s-1]="${one[*]}"
  spec[$s-2]=$root/tests/specs/calib-$s.yaml sets[$s-2]="${two[*]}"
done
sets[moe-2]="${two[*]} --set plan.ep=2" # the MoE on 2 ranks with expert parallelism (all-to-all)
runs=(dense-1 dense-2 moe-1 moe-2)
for r in "${fits[@]}" "${runs[@]}"; do
  "$mtc" compile "${spec[$r]}" -o "$r" "${pin[@]}" ${sets[$r]} >/dev/null
  "$mtc" build "$r" >"$r.build.log" 2>&1
done
tps() { # NAME NP [ARGS]: the throughput line's tokens/s per rank
  local name=$1 np=$2 cmd=("./$1/build/train")
  [ "$np" = 1 ] || cmd=("${mpirun[@]}" -np "$np" "./$1/build/train")
  "${cmd[@]}" --data "$data" --steps "$steps" --metrics "$name.jsonl" "${@:3}" |
    sed -n 's/^throughput: \([0-9]*\) tokens\/s per rank.*/\1/p'
}
share() { python3 -c "import json, sys; p = json.load(open(sys.argv[1])); print('%.2f' % (p['cpu_seconds_per_step'] / p['step_seconds']))" "$1"; }
profiles=()
for ((i = 1; i <= rounds; i++)); do
  echo "round $i: $(uptime | sed 's/.*load/load/')"
  echo "fit $(tps fit 1 --profile "fit-$i.json") $(share "fit-$i.json")" >>measured.txt
  profiles+=("fit-$i.json")
  if [ "$fit2" = 1 ]; then
    echo "fit2 $(tps fit2 2 --profile "fit2-$i.json") $(share "fit2-$i.json")" >>measured.txt
    profiles+=("fit2-$i.json")
  fi
  for r in "${runs[@]}"; do echo "$r $(tps "$r" "${r#*-}" --profile "$r-$i.json") $(share "$r-$i.json")" >>measured.txt; done
done
# the fit's base: the cpu preset with peak rates no core reaches (a quiet core beats its 50 GFLOP/s
# and mtc calibrate refuses an efficiency above 1); the calibrated factors carry the measured rates
sed -e 's/^\(  bf16_flops:\) *50 GFLOP\/s/\1 400 GFLOP\/s/' -e 's/^\(  fp32_flops:\) *50 GFLOP\/s/\1 400 GFLOP\/s/' \
    -e 's/^\(  nvlink:\) *5 GB\/s/\1 50 GB\/s/' "$root/specs/clusters/cpu.yaml" >presets/cpu-peak.yaml
MTC_PRESET_DIR=$work/presets "$mtc" calibrate "${profiles[@]}" --preset cpu-peak -o presets/cpu-calibrated.yaml
fitshare=$(awk '$1 == "fit" { s += $3; n++ } END { print s / n }' measured.txt)
printf '%-10s %-18s %9s %9s %11s %9s %-16s %s\n' run "measured (min-max)" measured default calibrated "meas/cal" "core share" \
  "meas/cal at the fit's core share"
for r in "${fits[@]}" "${runs[@]}"; do
  pred() { MTC_PRESET_DIR=$work/presets "$mtc" plan "${spec[$r]}" "${pin[@]}" ${sets[$r]} "$@" --json |
           python3 -c "import json, sys; print(round(json.load(sys.stdin)['predicted']['tokens_per_second_per_gpu']))"; }
  def=$(pred) cal=$(pred --set cluster.preset=cpu-calibrated)
  awk -v r="$r" -v d="$def" -v c="$cal" '$1 == r { s += $2; n++; if (!lo || $2 < lo) lo = $2; if ($2 > hi) hi = $2
      sh = sh (sh ? "/" : "") $3; share += $3 }
    END { m = s / n; printf "%-10s %-18s %9.0f %9d %11d %9.3f %-16s %.3f\n", r, sprintf("%d-%d", lo, hi), m, d, c, m / c, sh,
          m / c * f / (share / n) }' f="$fitshare" measured.txt
done
