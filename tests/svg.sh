#!/usr/bin/env bash
# memory.svg from `mtc compile` of every example spec parses as XML, each tier's bar
# segments add up to the tier's live peak in plan.json, and each tier's curve has an axis
# with at least 3 values and layer marks (layer 0 forward and backward at least).   usage: svg.sh MTC SOURCE_DIR
set -u
mtc=$(realpath "$1"); cd "$2" || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
for spec in specs/*.yaml; do
  name=$(basename "$spec" .yaml)
  "$mtc" compile "$spec" -o "$tmp/$name" >/dev/null
  svg="$tmp/$name/memory.svg"
  if command -v xmllint >/dev/null; then xmllint --noout "$svg" || { echo "FAIL $name: not XML"; fail=1; }; fi
  # per tier: the sum of data-bytes, the data-live-peak, and plan.json's live_peak
  awk '/<g class="tier"/ { match($0, /data-tier="[a-z]+"/); t = substr($0, RSTART + 11, RLENGTH - 12);
                           match($0, /data-live-peak="[0-9]+"/); peak[t] = substr($0, RSTART + 16, RLENGTH - 17); cur = t }
       /data-bytes=/ { match($0, /data-bytes="[0-9]+"/); sum[cur] += substr($0, RSTART + 12, RLENGTH - 13) }
       END { for (t in peak) printf "%s %s %.0f\n", t, peak[t], sum[t] }' "$svg" > "$tmp/$name.tiers"
  [ -s "$tmp/$name.tiers" ] || { echo "FAIL $name: no tiers in memory.svg"; fail=1; }
  while read -r tier peak sum; do
    [ "$peak" = "$sum" ] || { echo "FAIL $name: $tier bar sums to $sum, live peak $peak"; fail=1; }
    json=$(tr -d ' \n' < "$tmp/$name/plan.json" | grep -o "\"$tier\":{\"capacity\":[0-9]*,\"peak\":[0-9]*,\"live_peak\":[0-9]*" | grep -o '[0-9]*$')
    [ "$json" = "$peak" ] || { echo "FAIL $name: $tier live peak $peak in the SVG, $json in plan.json"; fail=1; }
  done < "$tmp/$name.tiers"
  # per tier: tick labels and layer marks under its curve
  awk '/<g class="axes"/ { t = $0; sub(/.*data-tier="/, "", t); sub(/".*/, "", t); tiers[t] = 1 }
       /class="s tick"/ { ticks[t]++ }
       /class="s layer"/ { marks[t]++; if ($0 ~ />0<\/text>/) zero[t]++ }
       END { for (t in tiers) printf "%s %d %d %d\n", t, ticks[t], marks[t], zero[t] }' "$svg" > "$tmp/$name.axes"
  [ "$(wc -l < "$tmp/$name.axes")" = "$(wc -l < "$tmp/$name.tiers")" ] || { echo "FAIL $name: a tier without axes"; fail=1; }
  while read -r tier ticks marks zero; do
    [ "$ticks" -ge 3 ] && [ "$marks" -ge 2 ] && [ "$zero" = 2 ] ||
      { echo "FAIL $name: $tier axis has $ticks values, $marks layer marks ($zero at layer 0)"; fail=1; }
  done < "$tmp/$name.axes"
done
[ $fail -eq 0 ] && echo "ok: memory.svg parses, has axis values and layer marks, and its bars add up to plan.json's peaks for every spec"
exit $fail
