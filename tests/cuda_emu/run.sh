#!/usr/bin/env bash
# run.sh [-np N] DIR [train args...] — builds the generated program DIR (an mtc compile output)
# against the CPU emulation of the CUDA runtime, cuBLAS and NCCL (tests/cuda_emu) into
# DIR/build-emu, then runs its cuda training program there: one process, or N ranks under mpirun.
#   tests/cuda_emu/run.sh /tmp/t1 --data /usr/share/games/fortunes/cookie --steps 3 --seed 7
# Environment: see fake_cuda.cpp (EMU_STREAMS, EMU_STRICT, EMU_TRACE, EMU_POISON, EMU_GEMM_ROUND,
# EMU_GROUPED_REFUSE), fake_cudnn.cpp (EMU_CUDNN_VERSION, EMU_CUDNN_WORKSPACE) and emu_sched.cpp
# (EMU_THREADS, EMU_SCHED); MTC_* as the program reads them; EMU_CMAKE_ARGS: more -D arguments for
# the emulated build (e.g. -DEMU_RUNTIME=DIR, another copy of runtime/).
# The kernel cache is DIR/build-emu/kernel-cache unless MTC_KERNEL_CACHE says otherwise.
set -euo pipefail
np=1
if [ "${1:-}" = "-np" ]; then np=$2; shift 2; fi
[ $# -ge 1 ] || { echo "usage: run.sh [-np N] DIR [train args...]" >&2; exit 2; }
dir=$(realpath "$1"); shift
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$dir/kernels.cu" ] || { echo "run.sh: $dir holds no kernels.cu; expected an mtc compile output" >&2; exit 2; }
# shellcheck disable=SC2086 # EMU_CMAKE_ARGS: more -D arguments, split at spaces
cmake -S "$here" -B "$dir/build-emu" -DEMU_PROGRAM="$dir" ${EMU_CMAKE_ARGS:-} >"$dir/build-emu.log" 2>&1 &&
  cmake --build "$dir/build-emu" -j"$(nproc)" --target train >>"$dir/build-emu.log" 2>&1 ||
  { tail -30 "$dir/build-emu.log"; echo "run.sh: the emulated build of $dir failed ($dir/build-emu.log)" >&2; exit 2; }
export MTC_KERNEL_CACHE=${MTC_KERNEL_CACHE:-$dir/build-emu/kernel-cache}
export EMU_ARENA_MAP=${EMU_ARENA_MAP-$dir/step.c} # device ranges must stay inside one arena buffer
# the BLAS's threads and the emulator's workers share the cores with the other ranks
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))}
if [ "$np" = 1 ]; then
  exec "$dir/build-emu/train" "$@"
else
  exec mpirun --allow-run-as-root --oversubscribe -np "$np" -x OPENBLAS_NUM_THREADS -x MTC_KERNEL_CACHE \
    $(env | grep -oE '^(EMU|MTC)_[A-Z_]+' | sed 's/^/-x /') "$dir/build-emu/train" "$@"
fi
