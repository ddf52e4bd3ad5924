#!/usr/bin/env bash
# Prepares the device check on this machine, for a GPU machine that cannot install packages (the
# device tool's H200: CUDA and PyTorch but no libyaml, jansson, OpenBLAS or Open MPI, no network).
# Everything is built here; the GPU machine only runs it (tools/device-run.sh):
#   .devkit/bin      test_kernels, test_kernels_bf16, bench_attention, bench_experts and the cuda train programs (tiny-moe and tiny-moe with Muon, each
#                    with bf16 activations and with fp32 ones (NAME-f32), moe-1b,
#                    tiny-moe 8 layers with and without activation offload; mid: moe-1b with
#                    2 layers and one 4096-token sequence per step, small enough for a cpu reference)
#   .devkit/lib      the shared libraries they need that a bare CUDA image lacks (ldd's closure,
#                    CUDA's own libraries excluded: the GPU machine has its toolkit; cuDNN too, whose
#                    engines alone outgrow the carry limit: there it is PyTorch's nvidia-cudnn-cu13)
#   .devkit/ompi     Open MPI's and PMIx's plugin folders (singleton MPI_Init loads them)
#   .devkit/cache    NVRTC's CUBINs for sm_90a, compiled here (train --check-kernels)
#   .devkit/ref      the cpu backend's losses for the same runs, same seed and data
#   .devkit/plans    the plans, for tools/torch_moe_bench.py and the MFU
# usage: [KEEP_REF=1] tools/device-pack.sh [BUILD_DIR]   then the device tool: carry [".devkit"], run
#        bash tools/device-run.sh            (.devkit is ignored via .git/info/exclude)
set -eu
cd "$(dirname "$0")/.."
build=${1:-build-device}
kit=.devkit
grep -qx '/.devkit/' .git/info/exclude 2>/dev/null || echo '/.devkit/' >>.git/info/exclude
# KEEP_REF=1 keeps the previous pack's text and cpu references (mid's take ten minutes here):
# only when the cpu programs compute the same as then
keep=${KEEP_REF:-0}
if [ "$keep" = 1 ] && [ -f $kit/text.txt ] && [ -d $kit/ref ]; then
  rm -rf /tmp/devkit-ref.$$ && mkdir /tmp/devkit-ref.$$ && mv $kit/ref $kit/text.txt /tmp/devkit-ref.$$/
else keep=0; fi
rm -rf "$kit"; mkdir -p $kit/bin $kit/lib $kit/ompi $kit/cache $kit/ref $kit/plans
[ "$keep" = 1 ] && rm -rf $kit/ref && mv /tmp/devkit-ref.$$/ref /tmp/devkit-ref.$$/text.txt $kit/ && rmdir /tmp/devkit-ref.$$
cmake -B "$build" -S . -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
mtc=$PWD/$build/mtc
cp "$build/tests/test_kernels" "$build/tests/test_kernels_bf16" "$build/tests/bench_attention" "$build/tests/bench_experts" $kit/bin/
MTC_KERNEL_CACHE=$PWD/$kit/cache "$build/tests/bench_attention" --check-kernels sm_90a templates/kernels/*.cu | tail -1
MTC_KERNEL_CACHE=$PWD/$kit/cache "$build/tests/bench_experts" --check-kernels sm_90a templates/kernels/*.cu | tail -1
[ "$keep" = 1 ] || cat README.md docs/*.md BENCHMARKS.md templates/train/*.c runtime/*/*.c compiler/*.c >$kit/text.txt
one="--set cluster.nodes=1 --set cluster.gpus_per_node=1"
gen() { # NAME SPEC [--set ...]: compile and build both backends, copy the cuda program
  local name=$1 spec=$2; shift 2
  local d=$build/gen/$name
  "$mtc" compile "$spec" -o "$d" "$@" >/dev/null
  "$mtc" build "$d" >/dev/null 2>&1
  "$mtc" build "$d" --backend cuda >/dev/null 2>&1
  cp "$d/build-cuda/train" "$kit/bin/$name"
  cp "$d/plan.json" "$kit/plans/$name.json"
  MTC_KERNEL_CACHE=$PWD/$kit/cache "$d/build-cuda/train" --check-kernels --arch sm_90a | head -1
  case $name in tiny|tiny-muon|mid|feat) # also with fp32 activations (MTC_ACT=fp32): the tight check against the cpu
    cmake -S "$d" -B "$d/build-cuda-f32" -DMTC_ROOT="$PWD" -DMTC_BACKEND=cuda -DMTC_ACT=fp32 -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$d/build-cuda-f32" -j"$(nproc)" >/dev/null
    cp "$d/build-cuda-f32/train" "$kit/bin/$name-f32";;
  esac
}
gen tiny specs/tiny-moe.yaml $one
gen tiny-muon specs/tiny-moe.yaml $one --set training.optimizer=muon
gen bench specs/bench/moe-1b.yaml
# the features first emulated on 2026-12-01: aux-free balancing (moe_load_add, router_bias_update),
# attention biases with qk-norm (bias on q/k/v/o, colsum_add)
gen feat specs/tiny-moe.yaml $one --set model.moe.router=sigmoid --set model.moe.router_bias=true \
  --set model.moe.load_balance=aux_free --set model.attention.bias=qkvo --set model.attention.qk_norm=per_head
gen mid specs/bench/moe-1b.yaml --set model.layers=2 --set training.global_batch=1 # moe-1b's shapes, cpu-checkable
gen off-none specs/tiny-moe.yaml $one --set model.layers=8 --set plan.activation_checkpoint=full --set plan.offload_activations=none
gen off-host specs/tiny-moe.yaml $one --set model.layers=8 --set plan.activation_checkpoint=full --set plan.offload_activations=host
[ "$keep" = 1 ] || for r in tiny tiny-muon mid feat; do # the cpu reference, here (mid: 3 steps of 3 minutes each on 2 cores)
  steps=20; [ $r = mid ] && steps=3
  OMP_NUM_THREADS=$(nproc) "$build/gen/$r/build/train" --data $kit/text.txt --steps $steps --seed 7 --metrics $kit/ref/$r.jsonl >$kit/ref/$r.log 2>&1
done
# the libraries: ldd's closure minus libc's and CUDA's own
for b in $kit/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so|/usr/local/cuda' | while read -r l; do cp -L "$l" $kit/lib/; done
cp -a /usr/lib/x86_64-linux-gnu/openmpi $kit/ompi/openmpi
cp -a /usr/lib/x86_64-linux-gnu/pmix2 $kit/ompi/pmix2
for l in /usr/lib/x86_64-linux-gnu/libpmix.so.2 /usr/lib/x86_64-linux-gnu/libevent-2.1.so.7; do [ -e "$l" ] && cp -L "$l" $kit/lib/; done
du -sh $kit
