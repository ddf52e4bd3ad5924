#!/usr/bin/env bash
# The cuda backend's kernels of every example spec compile through NVRTC for sm_90a, and the
# cuda build of each generated program links (CUDA runtime, cuBLAS, NVRTC, NCCL; no libcuda,
# no GPU needed).   usage: kernels.sh MTC SOURCE_DIR
set -u
mtc=$(realpath "$1"); src=$(realpath "$2")
work=$(mktemp -d "${TMPDIR:-/tmp}/mtc-kernels.XXXXXX"); trap 'rm -rf "$work"' EXIT
export MTC_KERNEL_CACHE=$work/cache # a fresh cache: every kernel really compiles
fail=0; n=0
for spec in "$src"/specs/*.yaml; do
  name=$(basename "$spec" .yaml)
  "$mtc" compile "$spec" -o "$work/$name" >/dev/null 2>"$work/$name.err"
  if [ ! -f "$work/$name/kernels.cu" ]; then
    grep -q "does not implement" "$work/$name.err" && { echo "skip $name: $(grep -o 'does not implement [a-z ]*' "$work/$name.err")"; continue; }
    cat "$work/$name.err"; echo "FAIL $name: compile"; fail=1; continue
  fi
  "$mtc" build "$work/$name" --backend cuda >"$work/$name.log" 2>&1 || { tail -20 "$work/$name.log"; echo "FAIL $name: cuda build"; fail=1; continue; }
  ldd "$work/$name/build/train" | grep -q "libcuda\.so" && { echo "FAIL $name: links libcuda"; fail=1; }
  for lib in libcudart libcublas libnvrtc libnccl; do
    ldd "$work/$name/build/train" | grep -q "$lib" || { echo "FAIL $name: does not link $lib"; fail=1; }
  done
  "$work/$name/build/train" --check-kernels --arch sm_90a || { echo "FAIL $name: NVRTC"; fail=1; continue; }
  n=$((n + 1))
done
[ $fail -eq 0 ] && [ $n -ge 3 ] && echo "ok: the kernels of $n example specs compile for sm_90a"
exit $fail
