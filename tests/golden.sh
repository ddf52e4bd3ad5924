#!/usr/bin/env bash
# Golden output: `mtc compile` of every example spec must reproduce the checked-in
# generated/NAME/ byte for byte, and twice in a row the same bytes (determinism).
#   usage: golden.sh MTC SOURCE_DIR [--update]   (--update rewrites generated/)
set -u
mtc=$(realpath "$1"); src=$2; update=${3:-}
cd "$src" || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0; n=0
# compile SPEC DIR: mtc compile, where a model the training program does not implement yet
# (MLA with biases, say) must still write the plan's files and say why no program was written
compile() {
  local err; err=$("$mtc" compile "$1" -o "$2" 2>&1 >/dev/null) && return 0
  echo "$err" | grep -q "does not implement" && [ -f "$2/plan.json" ] && [ ! -f "$2/step.c" ] && return 0
  echo "$err"; return 1
}
for spec in specs/*.yaml; do
  name=$(basename "$spec" .yaml); n=$((n + 1))
  if [ "$update" = --update ]; then rm -rf "generated/$name"; compile "$spec" "generated/$name" || fail=1; continue; fi
  compile "$spec" "$tmp/a/$name" || { echo "FAIL $name: compile failed"; fail=1; continue; }
  compile "$spec" "$tmp/b/$name" || { echo "FAIL $name: compile failed"; fail=1; continue; }
  diff -r "$tmp/a/$name" "$tmp/b/$name" >/dev/null || { echo "FAIL $name: two runs differ"; fail=1; }
  # a build of the checked-in program (the README's first command builds generated/tiny-moe/build)
  # is not compile output
  diff -ru --exclude=build --exclude='build-*' "generated/$name" "$tmp/a/$name" || { echo "FAIL $name: differs from generated/$name (regenerate with tests/golden.sh build/mtc . --update and review the diff)"; fail=1; }
done
[ $fail -eq 0 ] && echo "ok: $n specs reproduce generated/ byte for byte"
exit $fail
