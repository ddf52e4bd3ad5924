#!/usr/bin/env bash
# The README's spec reference must be what `mtc keys` prints from the schema table, so the
# defaults live in one place (compiler/spec.c) and the README cannot drift from it.
#   usage: keys.sh MTC README [--update]   (--update rewrites the README's reference)
set -u
want=$("$1" keys) || exit 1
if [ "${3:-}" = --update ]; then
  { sed '/<!-- keys:begin -->/q' "$2"; printf '%s\n' "$want"; sed -n '/<!-- keys:end -->/,$p' "$2"; } > "$2.tmp" && mv "$2.tmp" "$2"
fi
have=$(sed -n '/<!-- keys:begin -->/,/<!-- keys:end -->/p' "$2" | sed '1d;$d')
if [ "$want" != "$have" ]; then
  diff -u <(printf '%s\n' "$have") <(printf '%s\n' "$want")
  echo "FAIL: README spec reference differs from 'mtc keys' (paste its output between the markers)"
  exit 1
fi
# the indexes a newcomer reads first name every compiler file: mtc.h's and the README's
src=$(dirname "$2")
for f in "$src"/compiler/*.c; do
  b=$(basename "$f")
  sed -n '1,/^#ifndef MTC_H/p' "$src/compiler/mtc.h" | grep -q " $b " ||
    { echo "FAIL: compiler/mtc.h's file index does not name $b"; exit 1; }
  sed -n '/^## Repository/,$p' "$2" | grep -q "$b" || { echo "FAIL: the README's repository section does not name $b"; exit 1; }
done
echo "ok: README spec reference matches mtc keys ($(printf '%s\n' "$want" | wc -l) lines)"
