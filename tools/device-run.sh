#!/usr/bin/env bash
# The GPU half of tools/device-pack.sh: runs the prebuilt programs of .devpack/kit.tar.xz on a GPU
# machine that has CUDA (cuBLAS, NVRTC, NCCL from its toolkit or its PyTorch wheels) but none of
# mtc's other libraries, and leaves every log in $OUT/out.tar.gz for tools/device-report.sh here.
#   correctness runs side by side on the GPU: test_kernels, test_kernels_bf16 (bf16 activations); tiny-moe 20 steps (fp32 GEMMs and
#   simple attention, bf16 GEMMs, Muon); mid (moe-1b's shapes, 2 layers) 3 steps; tiny-moe 8 layers with activation offload none/host;
#   then alone: attention forward and backward TFLOP/s (bench_attention: cuDNN's and the own flash kernel at
#   head_dim 128, 48/16 heads, and MLA's 192/128, at 4,096 and 65,536 tokens), the routed experts' TFLOP/s per path
#   (bench_experts: the GEMM loop over streams and the grouped call against the same FFN as dense GEMMs, at europa-1t's,
#   moe-1b's and 64-expert moe-1b's shapes), moe-1b 6 steps (tokens/s) and PyTorch eager on the same plan
#   (tools/torch_moe_bench.py)
# usage (device tool): carry [".devpack"], command "bash tools/device-run.sh [CHECK...]"
#   CHECK: kernels tiny mid feat offload attn experts bench benchdbg torch (default: every one; feat: tiny-moe
#   with aux-free balancing, attention biases and qk-norm)
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
out=${OUT:-/tmp/devout}/logs
mkdir -p "$out"
tar -xJf .devpack/kit.tar.xz
K=$PWD/.devkit
nccl=$(find /usr/local/cuda*/lib* /opt /usr/lib -name libnccl.so.2 2>/dev/null | head -1)
pyl=$(python3 -c "import nvidia,os;p=os.path.dirname(nvidia.__path__[0]);print(':'.join(os.path.join(nvidia.__path__[0],d,'lib') for d in os.listdir(nvidia.__path__[0])))" 2>/dev/null)
# cuDNN: PyTorch's nvidia-cudnn-cu13 wheel (the programs check its version at start-up: >= 9.13)
cudnn=$(python3 -c "import glob,nvidia,os;print(*glob.glob(os.path.join(nvidia.__path__[0],'**','libcudnn.so.9'),recursive=True)[:1])" 2>/dev/null)
export LD_LIBRARY_PATH=$K/lib:${cudnn:+$(dirname "$cudnn"):}${nccl:+$(dirname "$nccl"):}/usr/local/cuda/lib64:${pyl:+$pyl:}${LD_LIBRARY_PATH:-}
export OMPI_MCA_mca_base_component_path=$K/ompi/openmpi/lib/openmpi3
export PMIX_MCA_mca_base_component_path=$K/ompi/pmix2/lib/pmix
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self OMPI_MCA_btl_base_warn_component_unused=0
export MTC_KERNEL_CACHE=$K/cache
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
  echo "nccl: ${nccl:-none found}"; echo "cudnn: ${cudnn:-none found in the nvidia wheels}"; ls -d /usr/local/cuda*/include 2>&1
  for b in $K/bin/*; do ldd "$b" | grep "not found" | sed "s|^|$(basename "$b"): |"; done
} 2>&1 | tee "$out/env.log"
run() { # NAME SECONDS ENV... : one program's run, log in $out/NAME.log
  local name=$1 secs=$2; shift 2
  local steps=20; [[ $name == mid* ]] && steps=3
  env "$@" timeout "$secs" "$K/bin/${name%%.*}" --data "$K/text.txt" --steps $steps --seed 7 --metrics "$out/$name.jsonl" >"$out/$name.log" 2>&1
  echo "$name exit $?" >>"$out/exits.log"
}
want() { [ -z "$checks" ] || [[ " $checks " == *" $1 "* ]]; }
checks=${*:-}
# side by side on the GPU: correctness only
want kernels && { for t in test_kernels test_kernels_bf16; do
  timeout 150 "$K/bin/$t" templates/kernels/*.cu >"$out/$t.log" 2>&1; echo "$t exit $?" >>"$out/exits.log"; done; } &
want tiny && { run tiny.bf16 120 MTC_GEMM=bf16 & run tiny-f32.fp32 120 MTC_GEMM=fp32 MTC_ATTENTION=simple &
  run tiny-muon-f32.fp32 120 MTC_GEMM=fp32 MTC_ATTENTION=simple & run tiny-muon.bf16 120 MTC_GEMM=bf16 & }
want mid && { run mid-f32.fp32 150 MTC_GEMM=fp32 MTC_ATTENTION=simple & run mid.bf16 150 MTC_GEMM=bf16 & }
want feat && { run feat-f32.fp32 120 MTC_GEMM=fp32 MTC_ATTENTION=simple & run feat.bf16 120 MTC_GEMM=bf16 & }
want offload && { run off-none.fp32 120 MTC_GEMM=fp32 MTC_ATTENTION=simple & run off-host.fp32 120 MTC_GEMM=fp32 MTC_ATTENTION=simple & }
wait
cat "$out/exits.log" 2>/dev/null; tail -3 "$out/test_kernels.log" "$out/test_kernels_bf16.log" 2>/dev/null
for f in "$out"/*.log; do case $f in *test_kernels*|*exits*|*env*) ;; *) echo "--- $f"; tail -4 "$f";; esac; done
# alone on the GPU: attention's speed (cuDNN's and the own flash kernel), the benchmark, PyTorch eager
if want attn; then
  timeout 240 "$K/bin/bench_attention" templates/kernels/*.cu >"$out/attn.log" 2>&1
  echo "attn exit $?"; grep -E "^ATTN_BENCH|error" "$out/attn.log"
fi
if want experts; then # about 50 GB of device memory at europa-1t's shape; a few seconds a shape
  timeout 180 "$K/bin/bench_experts" templates/kernels/*.cu >"$out/experts.log" 2>&1
  echo "experts exit $?"; grep -E "^EXPERTS_BENCH|error" "$out/experts.log"
fi
if want bench; then
  b0=$(date +%s.%N)
  timeout 200 "$K/bin/bench" --data "$K/text.txt" --steps 6 --metrics "$out/bench.jsonl" >"$out/bench.log" 2>&1
  echo "bench exit $? after $(python3 -c "import time;print(f'{time.time()-$b0:.1f}')") s"; tail -6 "$out/bench.log"
fi
if want benchdbg; then # where a slow or stuck step waits: each op synchronized, the host's stacks after 40 s
  MTC_CUDA_SYNC=1 "$K/bin/bench" --data "$K/text.txt" --steps 4 --metrics "$out/benchdbg.jsonl" >"$out/benchdbg.log" 2>&1 &
  p=$!; sleep 40
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >>"$out/benchdbg.log"
  gdb=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
  timeout 60 "$gdb" -p $p -batch -ex "info threads" -ex "thread apply all bt 25" >"$out/benchdbg-gdb.log" 2>&1
  kill -TERM $p; sleep 2; kill -9 $p 2>/dev/null; cat "$out/benchdbg.log"; grep -E "^#|^Thread" "$out/benchdbg-gdb.log" | head -60
fi
if want torch; then
  PYTHONUNBUFFERED=1 timeout 150 python3 tools/torch_moe_bench.py --plan "$K/plans/bench.json" --steps 6 --warmup 2 >"$out/torch.log" 2>&1
  echo "torch exit $?"; tail -3 "$out/torch.log"
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem --format=csv,noheader >>"$out/env.log" 2>&1
tar -czf "${OUT:-/tmp/devout}/out.tar.gz" -C "$out/.." logs
echo "device-run: $(( $(date +%s) - t0 )) s"
