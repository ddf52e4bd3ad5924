#!/usr/bin/env bash
# selftest.sh — the emulator's detectors, each shown on a deliberately broken copy of tiny-moe's
# generated program (1 rank, 1 step, MTC_GEMM=fp32): every mutation must be caught, the intact
# program must pass clean. WORK (default /tmp/cuda-emu-selftest) holds the copies.
#   stale-offload   step.c without rt_offload_wait: the D2H copy reads a reused slot (EMU_STREAMS=lazy
#                   shows it as another gradient norm; sync mode cannot)
#   gemm-overflow   the fused q, k, v projection written with 384 columns into a 256-column buffer (EMU_ARENA_MAP)
#   host-deref      host code reading the arena (EMU_PROTECT=1)
#   host-pointer    a kernel given a pageable host pointer (always checked)
#   kernel-race     block_sum without its first __syncthreads (wrong sums, any schedule)
#   nccl-fail       2 ranks (FSDP 2): the 3rd NCCL operation never completes and its communicator
#                   reports an error (EMU_NCCL_FAIL, a dead peer): the host wait names it
#   nccl-hang       the same without the error (EMU_NCCL_HANG): named after MTC_NCCL_TIMEOUT=1
#   cudnn-scale     the runtime's cuDNN attention forward with 1/d for its softmax scale, not 1/sqrt(d) (a
#                   copy of runtime/ as EMU_RUNTIME): test_kernels_bf16's attention checks fail
#   cudnn-stride    its Kᵀ and Vᵀ views with the head stride for the token stride: the same
#   cudnn-heads     the K view's head stride 0 (every query head reads KV head 0): the same
#   cudnn-workspace an engine whose workspace exceeds the runtime's (EMU_CUDNN_WORKSPACE): stops at start-up
#                   naming the shape, the bytes and cluster.reserve.cublas_workspace
#   cudnn-version   cuDNN 9.10.1 (EMU_CUDNN_VERSION=91001): refused at start-up by its name
#   nccl-late       the hang, the host busy 3 s before its next wait (EMU_NCCL_LATE=3), MTC_NCCL_TIMEOUT=2:
#                   the timeout counts from the collective's issue, so the wait ends at its first poll
#                   (found 0.x s into it) naming the collective's age (3 s or more), not after 2 s more
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${WORK:-/tmp/cuda-emu-selftest}
data=${DATA:-/usr/share/games/fortunes/cookie}
[ -f "$data" ] || data=$root/README.md
mtc=$root/build/mtc
export MTC_GEMM=fp32 MTC_KERNEL_CACHE=$work/kernel-cache
mkdir -p "$work"
fail=0

# prog NAME [MTC_SETS...]: a fresh tiny-moe program in $work/NAME
prog() {
  local name=$1; shift
  rm -rf "$work/$name"
  "$mtc" compile "$root/specs/tiny-moe.yaml" -o "$work/$name" --set cluster.nodes=1 --set cluster.gpus_per_node=1 "$@" \
    >/dev/null 2>&1 || { echo "selftest: mtc compile failed" >&2; exit 2; }
}
# run NAME [VAR=VALUE...]: one step on the emulation; output in $work/NAME.out
run() {
  local name=$1; shift
  env "$@" "$here/run.sh" "$work/$name" --data "$data" --steps 1 --seed 7 --metrics /dev/null >"$work/$name.out" 2>&1
}
norm() { sed -n 's/.*grad norm \([0-9.na]*\).*/\1/p' "$work/$1.out"; }
expect() { # expect NAME WHAT GREP-PATTERN
  if grep -q "$3" "$work/$1.out"; then echo "ok    $1: $2"; else echo "FAIL  $1: $2 not seen ($work/$1.out)"; fail=1; fi
}

prog intact
run intact EMU_STREAMS=lazy EMU_PROTECT=1
ref=$(norm intact)
if grep -q "cuda-emu.*\(ERROR\|WARNING\)" "$work/intact.out" || [ -z "$ref" ]; then
  echo "FAIL  intact: $(grep -m1 "cuda-emu\|rror" "$work/intact.out")"; fail=1
else
  echo "ok    intact: clean, grad norm $ref"
fi

prog stale-offload --set plan.activation_checkpoint=full --set plan.offload_activations=host
sed -i 's|^  rt_offload_wait(c, 0); /\* X0 is on the host|  /* mutation */ (void)0; /* X0 is on the host|' "$work/stale-offload/step.c"
run stale-offload EMU_STREAMS=lazy
got=$(norm stale-offload)
if [ -n "$got" ] && [ "$got" != "$ref" ]; then echo "ok    stale-offload: grad norm $got, not $ref (lazy streams)"
else echo "FAIL  stale-offload: grad norm '$got' (expected a difference from $ref)"; fail=1; fi

prog gemm-overflow
sed -i 's|rt_matmul_forward(A(L0_QKV), A(L0_LN1), W(128), NULL, 512, 128, 256)|rt_matmul_forward(A(L0_QKV), A(L0_LN1), W(128), NULL, 512, 128, 384)|' \
  "$work/gemm-overflow/step.c"
run gemm-overflow
expect gemm-overflow "a GEMM writing past its arena buffer" "run from L0_QKV .* into L0_ATT"

prog host-deref
sed -i 's|^real step_forward(RtCtx \*c) {|real step_forward(RtCtx *c) {\n  { volatile real peek = c->arena[INPUTS + 1]; (void)peek; } /* mutation */|' "$work/host-deref/step.c"
run host-deref EMU_PROTECT=1
expect host-deref "a host read of device memory" "host code dereferenced device memory"

prog host-pointer
sed -i 's|^  rt_add(A(X1), A(L0_RES), A(WS_Y), 65536); /\* residual \*/|  { static act host_buf[65536]; rt_add(A(X1), A(L0_RES), host_buf, 65536); } /* mutation */|' \
  "$work/host-pointer/step.c"
run host-pointer
expect host-pointer "a pageable host pointer given to a kernel" "kernel residual_add, parameter 2: .* pageable host memory"

prog kernel-race
perl -0pi -e 's/(if \(lane == 0\) shared\[warp\] = v;\n)  __syncthreads\(\);\n/$1/' "$work/kernel-race/kernels.cu"
run kernel-race
got=$(norm kernel-race)
if [ "$got" != "$ref" ]; then echo "ok    kernel-race: grad norm '$got', not $ref"
else echo "FAIL  kernel-race: no difference"; fail=1; fi

# mutant NAME FILE SED-EXPR: a copy of runtime/ with FILE (under it) edited (EMU_RUNTIME), and
# test_kernels_bf16 against it: its cuDNN pass must fail the attention's checks (a training run's
# loss and gradient norm over a few tiny-moe steps are not sensitive enough to the q/k gradients)
mutant() {
  local rt=$work/rt-$1
  rm -rf "$rt" && cp -r "$root/runtime" "$rt" && sed -i "$3" "$rt/$2"
  if cmp -s "$root/runtime/$2" "$rt/$2"; then echo "FAIL  $1: the mutation did not apply"; fail=1; return; fi
  { cmake -S "$here" -B "$rt-build" -DEMU_RUNTIME="$rt" && cmake --build "$rt-build" -j2 --target test_kernels_bf16; } \
    >"$work/$1.out" 2>&1 && "$rt-build/test_kernels_bf16" "$root"/templates/kernels/*.cu >>"$work/$1.out" 2>&1
  expect "$1" "the attention checks failing" "FAIL attention .*(bf16act/cudnn)"
}
mutant cudnn-scale cuda/attn_cudnn.c \
  's|float scale = (float)(1.0 / sqrt((double)a->dqk)), ninf = -INFINITY;|float scale = (float)(1.0 / (double)a->dqk), ninf = -INFINITY;|'
mutant cudnn-stride cuda/attn_cudnn.c 's|str\[2\] = 1, str\[3\] = v->token;|str[2] = 1, str[3] = v->head;|'
mutant cudnn-heads cuda/ops.c 's|a.k = (CuAttnView){(int64_t)T \* nkv \* hd, hd, |a.k = (CuAttnView){(int64_t)T * nkv * hd, 0, |'

prog cudnn-workspace
run cudnn-workspace EMU_CUDNN_WORKSPACE=$((1 << 30))
expect cudnn-workspace "an attention engine whose workspace does not fit" \
  "needs a 1073741824-byte workspace, and the runtime's (shared with cuBLAS) is [0-9]* bytes; raise cluster.reserve.cublas_workspace"
run cudnn-workspace EMU_CUDNN_VERSION=91001
mv "$work/cudnn-workspace.out" "$work/cudnn-version.out"
expect cudnn-version "cuDNN 9.10.1 refused by name" "cuDNN 9.10.1 is known-bad for attention"

prog nccl --set cluster.gpus_per_node=2 --set plan.fsdp=2
run2() { # run2 NAME [VAR=VALUE...]: the 2-rank program nccl, one step
  local name=$1; shift
  env "$@" "$here/run.sh" -np 2 "$work/nccl" --data "$data" --steps 1 --seed 7 --metrics /dev/null >"$work/$name.out" 2>&1
}
run2 nccl-fail EMU_NCCL_FAIL=3
expect nccl-fail "a failed collective, its group and layer named" \
  "of [0-9]* values in group [a-z-]* (2 ranks) issued at [a-z0-9 ]* failed: remote process exited"
run2 nccl-hang EMU_NCCL_HANG=3 MTC_NCCL_TIMEOUT=1
expect nccl-hang "a hung collective named after MTC_NCCL_TIMEOUT" \
  "of [0-9]* values in group [a-z-]* (2 ranks) issued at [a-z0-9 ]* did not finish in 1 s (MTC_NCCL_TIMEOUT"
run2 nccl-late EMU_NCCL_HANG=3 EMU_NCCL_LATE=3 MTC_NCCL_TIMEOUT=2
expect nccl-late "a hung collective timed from its issue, not from the host's wait" \
  "issued at [a-z0-9 ]* did not finish in 2 s (MTC_NCCL_TIMEOUT: pending [3-9]\.[0-9] s since it was issued; found 0\.[0-9] s into"

exit $fail
