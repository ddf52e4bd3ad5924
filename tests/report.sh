#!/usr/bin/env bash
# report.html from `mtc compile` of every example spec: self-contained (no URL but the SVG
# namespace, no script), with the headline, the timelines, the memory picture, the layout and
# the plan, their slices, axes and GPUs. Where Chromium is installed (CI installs it), headless
# Chromium renders europa-1t's and tiny-moe's pages and the DOM must hold the same (--dump-dom),
# europa-1t's renders to a screenshot, and `mtc diff --html` of two tiny-moe plans renders with both
# timelines on one time scale and both memory pictures on one scale.
#   usage: report.sh MTC SOURCE_DIR
set -u
mtc=$(realpath "$1"); cd "$2" || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
chrome=$(command -v chromium || command -v chromium-browser || true)
headless() { timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage "$@" 2>/dev/null; }
# elements PAGE NAME PLAN_TXT: the page has the headline, time table, both timelines, memory,
# layout and plan; an attention slice per layer and pass in the layer-by-layer view; memory axis
# values; every GPU of the layout drawn
elements() {
  local page=$1 name=$2 layers attn gpus drawn
  for id in headline times timeline-step timeline-layers memory layout plan; do
    grep -q "id=\"$id\"" "$page" || { echo "FAIL $name: the page has no #$id"; fail=1; }
  done
  layers=$(grep -o '^model  *[0-9]* layers' "$3" | grep -o '[0-9]*')
  attn=$(sed -n '/id="timeline-layers"/,/<\/svg>/p' "$page" | grep -c 'class="k0"')
  [ "$attn" = $((2 * layers)) ] || { echo "FAIL $name: $attn attention slices in the layer view, expected 2 x $layers"; fail=1; }
  [ "$(grep -c 'class="s tick"' "$page")" -ge 3 ] || { echo "FAIL $name: no memory axis values"; fail=1; }
  gpus=$(grep -o 'id="layout"[^>]*data-gpus="[0-9]*' "$page" | grep -o '[0-9]*$')
  drawn=$(grep -c 'class="gpu"' "$page")
  [ -n "$gpus" ] && [ "$drawn" = "$gpus" ] || { echo "FAIL $name: $gpus GPUs, $drawn drawn"; fail=1; }
}
for spec in specs/*.yaml; do
  name=$(basename "$spec" .yaml)
  "$mtc" compile "$spec" -o "$tmp/$name" >/dev/null
  html="$tmp/$name/report.html"
  urls=$(grep -o 'https\?://[^" )]*' "$html" | grep -v '^http://www.w3.org/2000/svg$')
  [ -z "$urls" ] || { echo "FAIL $name: external URL in report.html: $urls"; fail=1; }
  ! grep -qi '<script' "$html" || { echo "FAIL $name: a script in report.html"; fail=1; }
  for want in '<h2>Memory per GPU</h2>' '<svg ' 'tokens/s per GPU' '^parameters ' '^alternatives' '^memory per GPU: hbm'; do
    grep -q -- "$want" "$html" || { echo "FAIL $name: report.html lacks '$want'"; fail=1; }
  done
  elements "$html" "$name" "$tmp/$name/plan.txt"
  # rendered: the largest and the smallest example (a Chromium start costs seconds)
  if [ -n "$chrome" ] && { [ "$name" = europa-1t ] || [ "$name" = tiny-moe ]; }; then
    headless --dump-dom "file://$html" > "$tmp/$name.dom"
    elements "$tmp/$name.dom" "$name (rendered)" "$tmp/$name/plan.txt"
  fi
done
if [ -z "$chrome" ]; then
  echo "SKIP: chromium is not installed, so report.html was not rendered (CI installs it: .ci/run's apt line)"
else
  headless --window-size=1200,2400 --screenshot="$tmp/europa-1t.png" "file://$tmp/europa-1t/report.html" >/dev/null
  size=$(stat -c %s "$tmp/europa-1t.png" 2>/dev/null || echo 0)
  head -c 8 "$tmp/europa-1t.png" 2>/dev/null | grep -q PNG && [ "$size" -gt 50000 ] ||
    { echo "FAIL europa-1t: no screenshot from $chrome (size $size)"; fail=1; }
  # two plans side by side: one time scale (the longer step) and one memory scale per tier
  "$mtc" diff specs/tiny-moe.yaml specs/tiny-moe.yaml --set training.seq_len=128 --html "$tmp/diff.html" >/dev/null ||
    { echo "FAIL diff --html exited non-zero"; fail=1; }
  headless --dump-dom "file://$tmp/diff.html" > "$tmp/diff.dom"
  for id in headlines timeline-a timeline-b memories layouts differences; do
    grep -q "id=\"$id\"" "$tmp/diff.dom" || { echo "FAIL diff --html: the rendered page has no #$id"; fail=1; }
  done
  secs=$(grep -o 'class="timeline"[^>]*data-seconds="[0-9.]*"' "$tmp/diff.dom" | grep -o '[0-9.]*"$' | sort -u | wc -l)
  [ "$secs" = 1 ] || { echo "FAIL diff --html: the two timelines are on different time scales"; fail=1; }
  ticks=$(sed -n '/id="memories"/,/id="layouts"/p' "$tmp/diff.dom" | grep 'class="s tick"' | grep -o '>[^<]*</text>' |
          sort | uniq -c | awk '$1 % 2 { odd = 1 } END { print odd + 0 }')
  [ "$ticks" = 0 ] || { echo "FAIL diff --html: the memory pictures' axes differ"; fail=1; }
  grep -q '<td>training.seq_len</td>' "$tmp/diff.dom" || { echo "FAIL diff --html: no training.seq_len row"; fail=1; }
fi
[ $fail -eq 0 ] && echo "ok: report.html self-contained for every spec${chrome:+, rendered by $(basename "$chrome") with its timelines, memory axes and layout; diff --html on one scale}"
exit $fail
