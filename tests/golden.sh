#!/usr/bin/env bash
# Golden output: `mtc compile` of every example spec must reproduce the checked-in
# generated/NAME/ byte for byte, and twice in a row the same bytes (determinism).
#   usage: golden.sh MTC SOURCE_DIR [--update]   (--update rewrites generated/)
set -u
mtc=$(realpath "$1"); src=$2; update=${3:-}
cd "$src" || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0; n=0
for spec in specs/*.yaml; do
  name=$(basename "$spec" .yaml); n=$((n + 1))
  if [ "$update" = --update ]; then "$mtc" compile "$spec" -o "generated/$name" >/dev/null || fail=1; continue; fi
  "$mtc" compile "$spec" -o "$tmp/a/$name" >/dev/null || { echo "FAIL $name: compile failed"; fail=1; continue; }
  "$mtc" compile "$spec" -o "$tmp/b/$name" >/dev/null || { echo "FAIL $name: compile failed"; fail=1; continue; }
  diff -r "$tmp/a/$name" "$tmp/b/$name" >/dev/null || { echo "FAIL $name: two runs differ"; fail=1; }
  diff -ru "generated/$name" "$tmp/a/$name" || { echo "FAIL $name: differs from generated/$name (regenerate with tests/golden.sh build/mtc . --update and review the diff)"; fail=1; }
done
[ $fail -eq 0 ] && echo "ok: $n specs reproduce generated/ byte for byte"
exit $fail
