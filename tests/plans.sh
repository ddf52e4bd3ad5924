#!/usr/bin/env bash
# The plans the search chooses, as `mtc sweep --csv` summarizes them (layout, policy, predicted
# step, peaks, or why nothing fits), for every example spec and the sweeps of tests/plans.txt:
# a change to the planner that is meant to keep its choices (a faster search) must reproduce
# tests/plans.expected exactly.   usage: plans.sh MTC SOURCE_DIR [--update]
set -u
mtc=$(realpath "$1"); cd "$2" || exit 2
out=$(mktemp)
while IFS= read -r line; do
  case $line in ''|'#'*) continue ;; esac
  echo "## $line" >>"$out"
  # shellcheck disable=SC2086
  "$mtc" sweep $line --csv >>"$out" 2>&1 || echo "exit $?" >>"$out"
done <tests/plans.txt
if [ "${3:-}" = --update ]; then mv "$out" tests/plans.expected; echo "wrote tests/plans.expected"; exit 0; fi
if ! diff -u tests/plans.expected "$out"; then
  echo "FAIL: the chosen plans differ from tests/plans.expected (plans.sh MTC . --update after reviewing)"
  rm -f "$out"; exit 1
fi
rm -f "$out"
echo "ok: $(grep -c '^[^#]' tests/plans.txt) sweeps choose the plans of tests/plans.expected"
