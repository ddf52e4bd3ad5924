#!/usr/bin/env bash
# gen_kernel_list.sh KERNELS_CU OUT CXX: the extern "C" __global__ kernels that exist after
# preprocessing kernels.cu with the emulation's headers, as EMU_KERNEL(name, launch bounds) lines
# (the bounds expression as written in the source, 0 when there is none), and OUT.src: the
# source's bytes as a C initializer list.
set -euo pipefail
src=$1 out=$2 cxx=${3:-c++}
here=$(cd "$(dirname "$0")" && pwd)
names=$("$cxx" -std=c++17 -E -P -include "$here/emu_device.h" -I"$here/fakeinc" -x c++ "$src" |
  perl -0777 -ne 'while (/extern\s+"C"\s+void\s+(\w+)\s*\(/g) { print "$1\n" }')
tmp=$out.tmp
: >"$tmp"
for n in $names; do
  lb=$(perl -0777 -ne 'if (/__launch_bounds__\(([^()]*)\)\s*'"$n"'\s*\(/) { print $1 }' "$src")
  echo "EMU_KERNEL($n, ${lb:-0})" >>"$tmp"
done
cmp -s "$tmp" "$out" 2>/dev/null && rm "$tmp" || mv "$tmp" "$out"
od -An -v -tx1 "$src" | sed 's/ \([0-9a-f][0-9a-f]\)/0x\1,/g' >"$out.src"
