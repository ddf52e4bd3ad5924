#!/usr/bin/env bash
# kernels.sh SOURCE_DIR WORK [TEST...] — tests/cuda/test_kernels.c on the CPU emulation, for ctest
# (cuda_kernels_emu) on machines with the CUDA toolkit but no GPU: builds this directory's
# CMake project into WORK (no EMU_PROGRAM: the emulated runtime and the test_kernels targets
# only) and runs each TEST (default test_kernels_bf16: the runtime with the programs' bf16
# activations, which cuda_kernels_on_gpu's fp32 build does not reach) over templates/kernels/*.cu.
# Exit status: 0 every check passed, 1 a check failed or the build failed.
set -u
src=$(realpath "$1"); work=$2; shift 2
tests=${*:-test_kernels_bf16}
mkdir -p "$work"
cmake -S "$src/tests/cuda_emu" -B "$work/build" >"$work/build.log" 2>&1 &&
  cmake --build "$work/build" -j2 --target $tests >>"$work/build.log" 2>&1 ||
  { tail -30 "$work/build.log"; echo "FAIL: the emulation's build ($work/build.log)"; exit 1; }
export MTC_KERNEL_CACHE=$work/kernel-cache
fail=0
for t in $tests; do
  "$work/build/$t" "$src"/templates/kernels/*.cu >"$work/$t.log" 2>&1 || { cat "$work/$t.log"; fail=1; }
  tail -1 "$work/$t.log"
done
exit $fail
