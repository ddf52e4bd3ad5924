#!/usr/bin/env bash
# The fidelity table: every tests/specs/fidelity/*.yaml is a published training run pinned to
# its layout and stack, with a line
#   # published: SOURCE | N tokens/s per GPU | HARDWARE
# Prints predicted / published tokens/s per GPU for every row, then the geometric mean, the
# share of rows within ±15% and the worst row, and fails unless each meets its threshold.
#   usage: fidelity.sh MTC DIR [GEOMEAN_LO GEOMEAN_HI MIN_SHARE_15 MAX_DEV] [--set K=V ...]
# (MAX_DEV: the largest |ratio - 1| allowed.) Without --set, each row must read the same in
# docs/fidelity.md's table (three levels above DIR), so the documentation cannot go stale.
# Each row's ratio must lie in its preset's cluster.evidence band (band_low..band_high), which
# reports print beside predictions. Tokens/s, not MFU: the sources count FLOPs
# differently (TorchTitan with attention, llm-foundry's MFU without its recomputation).
set -u
mtc=$1; dir=$2; shift 2
glo=${1:-0.9}; ghi=${2:-1.1}; share=${3:-0.75}; maxdev=${4:-0.35}
[ $# -ge 4 ] && shift 4 || set --
rows=""; n=0; stale=0
doc=$dir/../../../docs/fidelity.md
[ $# -eq 0 ] && [ -f "$doc" ] || doc=""
printf '%-34s %12s %12s %7s  %s\n' row predicted published ratio hardware
for f in "$dir"/*.yaml; do
  pub=$(sed -n 's/^# published: .*| *\([0-9][0-9]*\) tokens\/s per GPU *|.*/\1/p' "$f")
  hw=$(sed -n 's/^# published: .*tokens\/s per GPU *| *\(.*\)$/\1/p' "$f")
  [ -n "$pub" ] || { echo "FAIL $f: no '# published: SOURCE | N tokens/s per GPU | HARDWARE' line"; exit 1; }
  json=$("$mtc" plan "$f" --json "$@") || { echo "FAIL $f: mtc plan failed"; exit 1; }
  echo "$json" | grep -q '"feasible": true' || { echo "FAIL $f: the pinned layout is infeasible"; exit 1; }
  pred=$(echo "$json" | sed -n 's/.*"tokens_per_second_per_gpu": \([0-9.e+-]*\).*/\1/p' | head -1)
  r=$(awk -v p="$pred" -v q="$pub" 'BEGIN { printf "%.9f", p / q }') # unrounded for the counts
  # the preset's cluster.evidence band (printed beside every prediction) must hold the row
  lo=$(echo "$json" | sed -n 's/.*"band_low": \([0-9.e+-]*\).*/\1/p' | head -1)
  hi=$(echo "$json" | sed -n 's/.*"band_high": \([0-9.e+-]*\).*/\1/p' | head -1)
  awk -v r="$r" -v lo="${lo:-0}" -v hi="${hi:-0}" 'BEGIN { exit !(hi > 0 && r >= lo && r <= hi) }' ||
    { echo "FAIL $f: ratio $r outside its preset's cluster.evidence band ${lo:-none}..${hi:-none}: update the band"; exit 1; }
  printf '%-34s %12.0f %12d %7.3f  %s\n' "$(basename "$f" .yaml)" "$pred" "$pub" "$r" "$hw"
  rows="$rows $r"; n=$((n + 1))
  want=$(printf '| %.0f | %d | %.3f | %s |' "$pred" "$pub" "$r" "$hw")
  if [ -n "$doc" ] && ! grep "^| \`$(basename "$f" .yaml)\`" "$doc" | grep -qF -- "$want"; then
    echo "FAIL: docs/fidelity.md's row $(basename "$f" .yaml) does not end '$want'"; stale=1
  fi
done
[ $stale -eq 0 ] || { echo "FAIL: docs/fidelity.md's table is stale: paste the rows above into it"; exit 1; }
echo "$rows" | awk -v glo="$glo" -v ghi="$ghi" -v share="$share" -v maxdev="$maxdev" -v n="$n" '{
  s = 0; w = 0; worst = 0
  for (i = 1; i <= NF; i++) { s += log($i); if ($i >= 0.85 && $i <= 1.15) w++; d = $i > 1 ? $i - 1 : 1 - $i; if (d > worst) worst = d }
  g = exp(s / NF); rms = 0; for (i = 1; i <= NF; i++) rms += (log($i)) ^ 2; rms = sqrt(rms / NF)
  printf "rows %d: geomean %.3f (need %g..%g), within ±15%%: %d = %.0f%% (need %.0f%%), worst |ratio - 1| %.3f (need <= %g), rms ln(ratio) %.3f\n", n, g, glo, ghi, w, 100 * w / NF, 100 * share, worst, maxdev, rms
  ok = g >= glo && g <= ghi && w / NF >= share && worst <= maxdev
  if (n < 12) { print "FAIL: fewer than 12 rows"; ok = 0 }
  print ok ? "ok: fidelity thresholds hold" : "FAIL: a fidelity threshold does not hold"
  exit !ok
}'
