#!/usr/bin/env bash
# report.html from `mtc compile` of every example spec: self-contained (no URL but the SVG
# namespace), with the summary, the memory picture and the plan; where Chromium is installed
# (CI installs it), it renders headless to a non-empty screenshot.   usage: report.sh MTC SOURCE_DIR
set -u
mtc=$(realpath "$1"); cd "$2" || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
chrome=$(command -v chromium || command -v chromium-browser || true)
for spec in specs/*.yaml; do
  name=$(basename "$spec" .yaml)
  "$mtc" compile "$spec" -o "$tmp/$name" >/dev/null
  html="$tmp/$name/report.html"
  urls=$(grep -o 'https\?://[^" )]*' "$html" | grep -v '^http://www.w3.org/2000/svg$')
  [ -z "$urls" ] || { echo "FAIL $name: external URL in report.html: $urls"; fail=1; }
  for want in '<h2>Memory per GPU</h2>' '<svg ' 'tokens/s per GPU' '^parameters ' '^alternatives' '^memory per GPU: hbm'; do
    grep -q -- "$want" "$html" || { echo "FAIL $name: report.html lacks '$want'"; fail=1; }
  done
  if [ -n "$chrome" ]; then
    timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --window-size=1200,1600 \
      --screenshot="$tmp/$name.png" "file://$html" >/dev/null 2>&1
    size=$(stat -c %s "$tmp/$name.png" 2>/dev/null || echo 0)
    head -c 8 "$tmp/$name.png" 2>/dev/null | grep -q PNG && [ "$size" -gt 20000 ] ||
      { echo "FAIL $name: no screenshot from $chrome (size $size)"; fail=1; }
  fi
done
[ $fail -eq 0 ] && echo "ok: report.html self-contained for every spec${chrome:+, rendered by $(basename "$chrome")}"
exit $fail
