#!/usr/bin/env bash
# compare.sh [CASE...] — the cuda backend on the CPU emulation against the cpu backend: the same
# generated program (tiny-moe) built both ways, STEPS (3) steps with the same --seed and --data,
# loss and gradient norm per step side by side, the worst relative difference and a verdict
# against the case's tolerance. Cases (default: all):
#   fp32-simple  1 rank, MTC_GEMM=fp32, MTC_ATTENTION=simple: fp32 everywhere     (tol 1e-4)
#   fp32-flash   1 rank, MTC_GEMM=fp32, flash attention (bf16 Q, K, V, P, dS)    (tol 1e-3)
#   fp32-exact   as fp32-flash with the emulation's bf16 keeping whole floats (EMU_BF16_EXACT):
#                what remains is not bf16 rounding                               (tol 1e-5)
#   bf16         1 rank, the default: bf16 activations (mtrt_cuda), flash      (tol 2e-2)
#   bf16-ep2     2 ranks, EP 2, bf16 activations, EMU_STREAMS=lazy             (tol 2e-2)
#   bf16-offload 2 ranks, EP 2, full checkpointing + activation offload, bf16  (tol 2e-2)
#   muon         2 ranks (FSDP 2), training.optimizer=muon with its step on the GPU: the experts'
#                Newton-Schulz in batches, the dense matrices through the owners' exchange, bf16 (tol 2e-2)
#   keep2        2 ranks, EP 2, parameters kept gathered (reshard after_step) over 4 micro-batches,
#                EMU_STREAMS=lazy, EMU_POISON_ARENA=1 (what lives past a micro-batch must be outside
#                the scratch), fp32                                                        (tol 1e-3)
#   keep4x       4 ranks as 2 nodes x 2, EP 4 (an EP group across nodes), every group kept over 4
#                micro-batches, as keep2 (not in the default list: 4 emulated ranks)     (tol 1e-3)
#   keepd2       2 ranks, EP 1, only the dense groups kept (DENSE_KEPT; the experts through a pool
#                of prefetch 2), 4 micro-batches, bf16, lazy streams, poisoned scratch   (tol 2e-2)
# (the fp32 cases build the fp32-activation runtime, mtrt_cuda_f32act: -DEMU_ACT_FLOAT=ON)
#   2rank        2 ranks (FSDP 2, NCCL over MPI, bf16 reduce-scatter), fp32, flash (tol 1e-3)
#   offload      1 rank, full checkpointing + activation offload, EMU_STREAMS=lazy, fp32, flash (tol 1e-3)
#   lazy2        2 ranks as 2rank, EMU_STREAMS=lazy (prefetching all-gathers deferred), re-gathering
#                every pass (reshard every_micro_batch)                                    (tol 1e-3)
#   statehost    1 rank, HBM too small for the optimizer state: the state arena in pinned host
#                memory, the step on the GPU (a slow host), EMU_STREAMS=lazy, fp32        (tol 1e-4)
#   prefetch3    2 ranks, the plan's prefetch depth 3 (a pool of 4 gathered units), EP 2,
#                EMU_STREAMS=lazy, fp32                                                     (tol 1e-3)
#   statehost2   2 replicas (dp_replicate 2), the state and the step on the host: the gradient
#                all-reduce through a device staging buffer, EMU_STREAMS=lazy, fp32        (tol 1e-3)
#   cp2          2 ranks, context parallelism 2 (each sequence in 4 chunks over both ranks: K/V
#                all-gathered and dK/dV reduce-scattered over NCCL, RoPE at the true positions,
#                the balancing loss's statistics averaged), bf16 with cuDNN's span attention
#                (bottom-right causal per query chunk), EMU_STREAMS=lazy                    (tol 2e-2)
#   cp2-own      as cp2 with fp32 activations: the own tiled span kernels (80-flash.cu: bf16
#                Q, K, V, P, dS on the tensor cores, fp32 accumulation)                      (tol 1e-3)
#   cp2-mla      as cp2 on tests/specs/mla.yaml (MLA, q/k heads of 12, values of 6: the own
#                warp-per-row span kernels in bf16, RoPE on the rope part)                  (tol 2e-2)
#   cp2-ep2      4 ranks, cp 2 x ep 2, bf16, cuDNN (not in the default list: 4 emulated ranks) (tol 2e-2)
#   hier4x       4 ranks as 2 nodes x 2, EP 4, the hierarchical all-to-all (plan.moe_dispatch: hierarchical:
#                NCCL node and cross groups, the relays' messages of at most a g-th of a round; the default
#                moe_imbalance takes extra rounds), bf16, EMU_STREAMS=lazy (not in the default list)  (tol 2e-2)
#   hier4x-grp   as hier4x with node-limited routing (n_group 2, topk_group 1), full checkpointing and
#                buffers of the dropless worst case (one round), fp32 activations (not in the default list) (tol 1e-3)
# A case may also be given as NAME:NP:TOL:ARG,ARG,... where an ARG is a spec key=value (--set)
# or an environment VAR=value or a cmake -DVAR=value, or SPEC=PATH (the case's spec), e.g.
# ep2:2:1e-3:plan.ep=2,MTC_GEMM=fp32
# Environment: SPEC (another spec than specs/tiny-moe.yaml), STEPS, DATA (default /usr/share/games/fortunes/cookie), WORK (default
# /tmp/cuda-emu-compare). Exit status 1 when a case is past its tolerance or fails to run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
steps=${STEPS:-3} seed=7
data=${DATA:-/usr/share/games/fortunes/cookie}
[ -f "$data" ] || data=$root/README.md
work=${WORK:-/tmp/cuda-emu-compare}
mkdir -p "$work"
mtc=$root/build/mtc
[ -x "$mtc" ] || cmake --build "$root/build" --target mtc >/dev/null || { echo "compare.sh: no $mtc" >&2; exit 2; }

# program NAME MTC_SETS...: compile tiny-moe into $work/NAME and build both variants ($cmake_args)
program() {
  local name=$1; shift
  local dir=$work/$name
  rm -rf "$dir"
  "$mtc" compile "${case_spec:-${SPEC:-$root/specs/tiny-moe.yaml}}" -o "$dir" "$@" >"$work/$name.compile.log" 2>&1 &&
    cmake -S "$here" -B "$dir/build-emu" -DEMU_PROGRAM="$dir" "${cmake_args[@]}" >"$work/$name.build.log" 2>&1 &&
    cmake --build "$dir/build-emu" -j"$(nproc)" --target train train_cpu >>"$work/$name.build.log" 2>&1 ||
    { echo "compare.sh: building $name failed (see $work/$name.*.log)" >&2; return 1; }
}

# run NAME NP BINARY OUT [VAR=VALUE...]: STEPS steps, metrics into OUT
run() {
  local name=$1 np=$2 bin=$3 out=$4; shift 4
  local dir=$work/$name
  rm -f "$out"
  local threads=$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))
  local cmd=(env OPENBLAS_NUM_THREADS=$threads MTC_KERNEL_CACHE="$work/kernel-cache" EMU_ARENA_MAP="$dir/step.c" "$@")
  if [ "$np" = 1 ]; then
    "${cmd[@]}" "$dir/build-emu/$bin" --data "$data" --steps "$steps" --seed $seed --metrics "$out" >"$out.log" 2>&1
  else
    local xs=()
    for kv in "$@" OPENBLAS_NUM_THREADS=$threads MTC_KERNEL_CACHE="$work/kernel-cache" EMU_ARENA_MAP="$dir/step.c"; do xs+=(-x "$kv"); done
    mpirun --allow-run-as-root --oversubscribe -np "$np" "${xs[@]}" "$dir/build-emu/$bin" --data "$data" \
      --steps "$steps" --seed $seed --metrics "$out" >"$out.log" 2>&1
  fi
}

# field FILE KEY: the KEY of every metrics line, one per line
field() { sed -n "s/.*\"$2\":\([-0-9.eE+naif]*\).*/\1/p" "$1"; }

# check NAME TOL: both series and the worst relative difference
status=0
check() {
  local name=$1 tol=$2 c=$work/$name/cpu.jsonl e=$work/$name/emu.jsonl
  if [ ! -s "$c" ] || [ ! -s "$e" ] || [ "$(wc -l <"$e")" -ne "$steps" ]; then
    echo "$name: FAILED to run (logs: $c.log, $e.log)"; tail -5 "$e.log" | sed 's/^/    /'; status=1; return
  fi
  paste <(field "$c" loss) <(field "$e" loss) <(field "$c" grad_norm) <(field "$e" grad_norm) |
    awk -v name="$name" -v tol="$tol" '
      function rel(a, b) { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; return m > 0 ? d / m : d }
      BEGIN { printf "%s\n  step  loss cpu        loss cuda-emu   grad norm cpu  grad norm cuda-emu\n", name }
      { printf "  %4d  %-14.8g  %-14.8g  %-13.7g  %-13.7g\n", NR, $1, $2, $3, $4
        if ($2 != $2 + 0 || $4 != $4 + 0) bad = 1
        l = rel($2, $1); g = rel($4, $3); if (l > wl) wl = l; if (g > wg) wg = g }
      END { v = (bad || wl > tol || wg > tol) ? "FAIL" : "ok"
            printf "  worst relative difference: loss %.2e, grad norm %.2e (tolerance %g): %s\n", wl, wg, tol, v
            exit v == "FAIL" }' || status=1
  grep -h "cuda-emu.*\(ERROR\|WARNING\|error(s)\)" "$e.log" | sort -u | sed 's/^/  /'
}

case_run() {
  local name=$1 np=$2 tol=$3; shift 3
  local -a sets=() envs=()
  cmake_args=() case_spec=
  for a in "$@"; do
    case $a in
    -D*) cmake_args+=("$a") ;;
    SPEC=*) case_spec=${a#SPEC=} ;;
    *=*) if [[ $a == [A-Z]* ]]; then envs+=("$a"); else sets+=(--set "$a"); fi ;;
    esac
  done
  [ "$np" = 1 ] && sets+=(--set cluster.nodes=1 --set cluster.gpus_per_node=1)
  program "$name" "${sets[@]}" || { status=1; return; }
  run "$name" "$np" train_cpu "$work/$name/cpu.jsonl"
  run "$name" "$np" train "$work/$name/emu.jsonl" "${envs[@]}"
  check "$name" "$tol"
}

cases=${*:-fp32-simple fp32-flash fp32-exact bf16 bf16-ep2 bf16-offload 2rank offload lazy2 statehost prefetch3 statehost2 muon
keep2 keepd2 cp2 cp2-own cp2-mla}
for c in $cases; do
  case $c in
  fp32-simple) case_run "$c" 1 1e-4 MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON MTC_ATTENTION=simple ;;
  fp32-flash) case_run "$c" 1 1e-3 MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON ;;
  fp32-exact) case_run "$c" 1 1e-5 MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON -DEMU_BF16_EXACT=ON ;;
  bf16) case_run "$c" 1 2e-2 ;;
  bf16-ep2) case_run "$c" 2 2e-2 plan.ep=2 EMU_STREAMS=lazy MTC_EXPERTS=loop ;;
  bf16-offload) case_run "$c" 2 2e-2 plan.ep=2 plan.activation_checkpoint=full plan.offload_activations=host \
    EMU_STREAMS=lazy ;;
  2rank) case_run "$c" 2 1e-3 MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON ;;
  offload) case_run "$c" 1 1e-3 plan.activation_checkpoint=full plan.offload_activations=host MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON EMU_STREAMS=lazy ;;
  lazy2) case_run "$c" 2 1e-3 plan.reshard=every_micro_batch MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON EMU_STREAMS=lazy ;;
  statehost) case_run "$c" 1 1e-4 cluster.gpu.hbm=150MB cluster.host.fp32_flops=1e9 cluster.host.bandwidth=1e9 \
    MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON MTC_ATTENTION=simple EMU_STREAMS=lazy ;;
  prefetch3) case_run "$c" 2 1e-3 plan.prefetch=3 plan.ep=2 MTC_EXPERTS=loop MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON EMU_STREAMS=lazy ;;
  statehost2) case_run "$c" 2 1e-3 cluster.gpu.hbm=150MB cluster.gpus_per_node=2 plan.fsdp=1 plan.dp_replicate=2 \
    MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON EMU_STREAMS=lazy ;;
  muon) case_run "$c" 2 2e-2 training.optimizer=muon ;;
  keep2) case_run "$c" 2 1e-3 plan.ep=2 plan.reshard=after_step training.global_batch=8 training.micro_batch=1 \
    MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON EMU_STREAMS=lazy EMU_POISON_ARENA=1 ;;
  keep4x) case_run "$c" 4 1e-3 cluster.nodes=2 cluster.gpus_per_node=2 plan.fsdp=4 plan.ep=4 plan.reshard=after_step \
    training.global_batch=16 training.micro_batch=1 MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON EMU_STREAMS=lazy EMU_POISON_ARENA=1 ;;
  keepd2) case_run "$c" 2 2e-2 plan.ep=1 plan.reshard=after_step plan.reshard_experts=every_micro_batch plan.prefetch=2 \
    training.global_batch=8 training.micro_batch=1 EMU_STREAMS=lazy EMU_POISON_ARENA=1 ;;
  cp2) case_run "$c" 2 2e-2 plan.cp=2 EMU_STREAMS=lazy ;;
  cp2-own) case_run "$c" 2 1e-3 plan.cp=2 MTC_GEMM=fp32 -DEMU_ACT_FLOAT=ON EMU_STREAMS=lazy ;;
  cp2-mla) case_run "$c" 2 2e-2 SPEC="$root/tests/specs/mla.yaml" cluster.gpus_per_node=2 plan.fsdp=2 plan.cp=2 \
    training.seq_len=16 EMU_STREAMS=lazy ;;
  cp2-ep2) case_run "$c" 4 2e-2 cluster.gpus_per_node=4 plan.fsdp=4 plan.cp=2 plan.ep=2 EMU_STREAMS=lazy ;;
  hier4x) case_run "$c" 4 2e-2 cluster.nodes=2 cluster.gpus_per_node=2 plan.fsdp=4 plan.ep=4 plan.moe_dispatch=hierarchical \
    plan.activation_checkpoint=none EMU_STREAMS=lazy ;;
  hier4x-grp) case_run "$c" 4 1e-3 cluster.nodes=2 cluster.gpus_per_node=2 plan.fsdp=4 plan.ep=4 plan.moe_dispatch=hierarchical \
    model.moe.n_group=2 model.moe.topk_group=1 plan.activation_checkpoint=full plan.moe_imbalance=4 MTC_GEMM=fp32 \
    -DEMU_ACT_FLOAT=ON EMU_STREAMS=lazy ;;
  *:*:*:*)
    IFS=: read -r n np tol args <<<"$c"
    IFS=, read -r -a list <<<"$args"
    case_run "$n" "$np" "$tol" "${list[@]}" ;;
  *) echo "compare.sh: unknown case $c" >&2; status=2 ;;
  esac
done
exit $status
