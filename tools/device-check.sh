#!/usr/bin/env bash
# The checks that need a GPU, as one command for a session that has one (e.g. the device tool's
# H200; under 8 minutes there), printing a SUMMARY line per check at the end:
#   kernels  the cuda ops (cuBLAS, grouped GEMMs, kernels.cu) against the cpu ops on the GPU
#            (tests/cuda/test_kernels.c: fp32 and bf16 GEMMs, flash and simple attention), and
#            every example spec's kernels.cu through NVRTC for this GPU's architecture
#   (a)      tiny-moe on one GPU vs the cpu backend, 20 steps of loss, same seed and data:
#            fp32 GEMM math within 1e-3 relative, bf16 GEMM math (the default) within 2e-2
#   (b)      memory: the arena and cudaMemGetInfo's use vs the plan's HBM arena
#   (c)      specs/bench/moe-1b.yaml: tokens/s and MFU of mtc's program next to PyTorch eager
#            (tools/torch_moe_bench.py) on the same GPU, model, batch and precision
#   (d)      activation offload on and off (tiny-moe with 8 layers, full checkpointing): the same
#            losses within 1e-4 (fp32 GEMMs; atomics differ run to run), step times of both
#   usage: tools/device-check.sh [BUILD_DIR]     (OUT=dir keeps logs; the device tool sets $OUT)
# This builds on the GPU machine, so it needs mtc's Debian packages there (a JUPITER node, say).
# The device tool's H200 has none of them and cannot install any: there, build here with
# tools/device-pack.sh and run tools/device-run.sh (BENCHMARKS.md, "First runs on a GPU").
# The fp32 comparisons use the fp32-activation runtime (MTC_ACT=fp32): with the default bf16
# activations MTC_GEMM=fp32 still multiplies bf16 operands.
set -u
cd "$(dirname "$0")/.."
build=${1:-build-device}
out=${OUT:-$build/out}
mkdir -p "$out"
t0=$(date +%s)
declare -a summary
say() { summary+=("$1"); echo "== $1"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
cmake -B "$build" -S . -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; echo "SUMMARY: build failed"; exit 1; }
export MTC_KERNEL_CACHE=$PWD/$build/kernel-cache
mtc=$PWD/$build/mtc

# ---- kernels
"$build/tests/test_kernels" templates/kernels/*.cu >"$out/test_kernels.log" 2>&1; k=$?
tail -70 "$out/test_kernels.log" # the per-op table
"$build/tests/test_kernels_bf16" templates/kernels/*.cu >"$out/test_kernels_bf16.log" 2>&1; kb=$?
tail -3 "$out/test_kernels_bf16.log"
arch=sm_90a
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
[ -n "$cc" ] && { arch=sm_$cc; [ "$cc" = 90 ] && arch=sm_90a; }
n=0; bad=0
for spec in specs/*.yaml; do
  name=$(basename "$spec" .yaml)
  "$mtc" compile "$spec" -o "$build/gen/$name" >/dev/null 2>&1 || continue # a spec with no program
  "$mtc" build "$build/gen/$name" --backend cuda >/dev/null 2>&1 &&
    "$build/gen/$name/build-cuda/train" --check-kernels --arch "$arch" | head -1 || bad=$((bad + 1))
  n=$((n + 1))
done
say "kernels: test_kernels exit $k, test_kernels_bf16 exit $kb (0 pass, 77 no GPU); kernels.cu of $n specs for $arch, $bad failed"

# ---- (a) tiny-moe: cuda vs cpu, one rank each
data=$out/text.txt
cat README.md docs/*.md BENCHMARKS.md templates/train/*.c runtime/*/*.c compiler/*.c >"$data"
one=$build/tiny1
"$mtc" compile specs/tiny-moe.yaml -o "$one" --set cluster.nodes=1 --set cluster.gpus_per_node=1 >/dev/null &&
  "$mtc" build "$one" >/dev/null 2>&1 &&
  "$mtc" build "$one" --backend cuda >"$out/tiny-cuda-build.log" 2>&1 || { tail "$out/tiny-cuda-build.log"; echo "tiny-moe builds failed"; }
f32() { # DIR: its cuda program with fp32 activations, in DIR/build-cuda-f32
  cmake -S "$1" -B "$1/build-cuda-f32" -DMTC_ROOT="$PWD" -DMTC_BACKEND=cuda -DMTC_ACT=fp32 -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build "$1/build-cuda-f32" -j"$(nproc)" >>"$out/f32-build.log" 2>&1 || echo "$1: fp32-activation build failed"
}
f32 "$one"
run_tiny() { # NAME TRAIN [ENV...]: 20 steps of the program TRAIN, metrics in $out/NAME.jsonl
  local name=$1 train=$2; shift 2
  rm -f "$out/$name.jsonl"
  env "$@" timeout 300 "$train" --data "$data" --steps 20 --seed 7 --metrics "$out/$name.jsonl" >"$out/$name.log" 2>&1
  local rc=$?; tail -3 "$out/$name.log"; return $rc
}
run_tiny cpu "$one/build/train" OMP_NUM_THREADS=8
run_tiny cuda-fp32 "$one/build-cuda-f32/train" MTC_GEMM=fp32 MTC_ATTENTION=simple # flash rounds P to bf16: 8e-3 by step 20 (emulated)
run_tiny cuda-bf16 "$one/build-cuda/train" MTC_GEMM=bf16
compare() { # A B TOL: per-step relative loss difference
  python3 - "$out/$1.jsonl" "$out/$2.jsonl" "$3" <<'EOF'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
tol = float(sys.argv[3])
if len(a) != 20 or len(b) != 20:
    print(f"steps: {len(a)} vs {len(b)}, expected 20"); sys.exit(1)
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"losses {a[0]:.4f}->{a[-1]:.4f} vs {b[0]:.4f}->{b[-1]:.4f}; worst relative difference {worst:.2e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
EOF
}
muon=$build/tiny1-muon
"$mtc" compile specs/tiny-moe.yaml -o "$muon" --set cluster.nodes=1 --set cluster.gpus_per_node=1 \
  --set training.optimizer=muon >/dev/null && "$mtc" build "$muon" >/dev/null 2>&1 &&
  "$mtc" build "$muon" --backend cuda >/dev/null 2>&1 || echo "muon builds failed"
f32 "$muon"
run_tiny cpu-muon "$muon/build/train" OMP_NUM_THREADS=8
run_tiny cuda-muon "$muon/build-cuda-f32/train" MTC_GEMM=fp32 MTC_ATTENTION=simple
ra=$(compare cpu cuda-fp32 1e-3 2>&1); a1=$?
rb=$(compare cpu cuda-bf16 2e-2 2>&1); a2=$? # over 20 steps bf16 runs can drift past this (BENCHMARKS.md)
say "(a) tiny-moe cuda vs cpu, fp32 GEMMs: $([ $a1 = 0 ] && echo PASS || echo FAIL) $ra"
say "(a) tiny-moe cuda vs cpu, bf16 GEMMs: $([ $a2 = 0 ] && echo PASS || echo FAIL) $rb"
rm_=$(compare cpu-muon cuda-muon 1e-3 2>&1); a3=$?
say "(a) tiny-moe with Muon (on the host) cuda vs cpu, fp32 GEMMs: $([ $a3 = 0 ] && echo PASS || echo FAIL) $rm_"

# ---- (b) memory of the tiny run and of the benchmark run below
mem_line() { grep -h "^memory:" "$out/$1.log" | head -2 | tr "\n" " "; }
say "(b) tiny-moe $(mem_line cuda-bf16)"

# ---- (c) the benchmark spec: mtc's program and PyTorch eager on the same GPU
bench=$build/bench
if "$mtc" compile specs/bench/moe-1b.yaml -o "$bench" >"$out/bench-compile.log" 2>&1 &&
  "$mtc" build "$bench" --backend cuda >"$out/bench-build.log" 2>&1; then
  timeout 240 "$bench/build-cuda/train" --data "$data" --steps 6 --metrics "$out/bench.jsonl" >"$out/bench.log" 2>&1
  echo "mtc exit $?"; tail -4 "$out/bench.log"
  mt=$(grep -o "throughput: [0-9.]* tokens/s" "$out/bench.log" | grep -o "[0-9.]*" | head -1)
  flops=$(python3 -c "import json;print(json.load(open('$bench/plan.json'))['model']['flops_per_token'])")
  peak=$(python3 -c "import json;print(json.load(open('$bench/plan.json'))['cluster']['peak_bf16_flops_per_gpu'])")
  mfu=$(python3 -c "print(f'{${mt:-0} * $flops / $peak:.3f}')")
  say "(b) bench $(mem_line bench)"
  timeout 120 python3 tools/torch_moe_bench.py --selftest >"$out/torch-selftest.log" 2>&1 || { tail -5 "$out/torch-selftest.log"; echo "torch selftest FAILED"; }
  timeout 240 python3 tools/torch_moe_bench.py --plan "$bench/plan.json" --steps 6 --warmup 2 >"$out/torch.log" 2>&1
  echo "torch exit $?"; tail -3 "$out/torch.log"
  tl=$(grep "^TORCH_BENCH" "$out/torch.log" | tail -1)
  tt=$(echo "$tl" | grep -o "tokens_per_s=[0-9.]*" | cut -d= -f2)
  ratio=$(python3 -c "print(f'{${mt:-0} / ${tt:-0}:.2f}' if ${tt:-0} else 'n/a')")
  say "(c) moe-1b: mtc ${mt:-?} tokens/s, MFU ${mfu} (of the plan's peak $(python3 -c "print(f'{$peak / 1e12:.0f}')") TFLOP/s); PyTorch eager: ${tl:-no result}; mtc/torch ${ratio}"
else
  tail -5 "$out/bench-compile.log" "$out/bench-build.log"
  say "(c) moe-1b: FAIL (compile or build; logs in $out)"
fi

# ---- (d) activation offload on and off: full checkpointing, boundaries in HBM or on the host
for off in none host; do
  d=$build/tiny-off-$off
  "$mtc" compile specs/tiny-moe.yaml -o "$d" --set cluster.nodes=1 --set cluster.gpus_per_node=1 --set model.layers=8 \
    --set plan.activation_checkpoint=full --set plan.offload_activations=$off >/dev/null &&
    "$mtc" build "$d" --backend cuda >"$out/off-$off-build.log" 2>&1 || tail -5 "$out/off-$off-build.log"
  run_tiny "off-$off" "$d/build-cuda/train" MTC_GEMM=fp32 MTC_ATTENTION=simple
done
rd=$(compare off-none off-host 1e-4 2>&1); d1=$? # atomics (RMSNorm and embedding weight gradients) make GPU runs differ in the last bits
sn=$(grep -o "(.*s per step)" "$out/off-none.log" | head -1); sh=$(grep -o "(.*s per step)" "$out/off-host.log" | head -1)
say "(d) offload host vs none (tiny-moe, 8 layers, full checkpointing): $([ $d1 = 0 ] && echo PASS || echo FAIL) $rd; step time none ${sn:-?}, host ${sh:-?}"

echo
for s in "${summary[@]}"; do echo "SUMMARY: $s"; done
echo "SUMMARY: $(( $(date +%s) - t0 )) s"
