#!/usr/bin/env bash
# The bad-spec corpus: every tests/bad/NAME.yaml (with the extra arguments in NAME.args, one
# per line) must make `mtc check` exit 2, print nothing on stdout and print exactly
# NAME.err on stderr.
#   usage: bad_specs.sh MTC BAD_DIR [--update]   (--update rewrites the .err files)
set -u
mtc=$(realpath "$1"); dir=$2; update=${3:-}
cd "$dir" || exit 2
fail=0; n=0
for spec in *.yaml; do
  name=${spec%.yaml}; n=$((n + 1))
  args=()
  [ -f "$name.args" ] && mapfile -t args < "$name.args"
  out=$("$mtc" check "$spec" "${args[@]}" 2>"/tmp/mtc-bad.$$" ); rc=$?
  if [ "$update" = --update ]; then cp "/tmp/mtc-bad.$$" "$name.err"; continue; fi
  if [ $rc -ne 2 ]; then echo "FAIL $name: exit $rc, expected 2"; fail=1; fi
  if [ -n "$out" ]; then echo "FAIL $name: printed on stdout: $out"; fail=1; fi
  if [ ! -f "$name.err" ]; then echo "FAIL $name: no $name.err"; fail=1; continue; fi
  if ! diff -u "$name.err" "/tmp/mtc-bad.$$"; then echo "FAIL $name: diagnostic differs"; fail=1; fi
  if ! head -1 "/tmp/mtc-bad.$$" | grep -Eq '^[^:]+:[0-9]+:[0-9]+: error: '; then
    echo "FAIL $name: first line is not FILE:LINE:COL: error:"; fail=1
  fi
done
rm -f "/tmp/mtc-bad.$$"
[ $fail -eq 0 ] && echo "ok: $n bad specs, each exit 2 with its exact diagnostic"
exit $fail
