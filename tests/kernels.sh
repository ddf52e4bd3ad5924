#!/usr/bin/env bash
# The cuda backend's kernels of every example spec compile through NVRTC for sm_90a, and the
# cuda build of each generated program links (CUDA runtime, cuBLAS, cuDNN, NVRTC, NCCL; no libcuda,
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
  ldd "$work/$name/build-cuda/train" | grep -q "libcuda\.so" && { echo "FAIL $name: links libcuda"; fail=1; }
  for lib in libcudart libcublas libcudnn libnvrtc libnccl; do
    ldd "$work/$name/build-cuda/train" | grep -q "$lib" || { echo "FAIL $name: does not link $lib"; fail=1; }
  done
  "$work/$name/build-cuda/train" --check-kernels --arch sm_90a || { echo "FAIL $name: NVRTC"; fail=1; continue; }
  n=$((n + 1))
done
# the hierarchical MoE all-to-all among them (deepseek-v3's plan: runtime/cuda/moe_hier.c linked, its kernels compiled)
grep -q '^#define MOE_HIER_G [1-9]' "$work"/*/step.h || { echo "FAIL: no example spec's cuda build has the hierarchical all-to-all"; fail=1; }
# the cuda program itself: without a GPU it stops at start with the reason (exit 2), and what
# the cuda runtime does not run yet is refused by name before any GPU is touched
if ! nvidia-smi >/dev/null 2>&1; then
  "$mtc" compile "$src/specs/tiny-moe.yaml" -o "$work/one" --set cluster.nodes=1 --set cluster.gpus_per_node=1 >/dev/null &&
    "$mtc" build "$work/one" --backend cuda >"$work/one.log" 2>&1 || { tail -20 "$work/one.log"; echo "FAIL: cuda build of tiny-moe on 1 GPU"; fail=1; }
  "$work/one/build-cuda/train" --data "$src/README.md" --steps 1 >"$work/one.out" 2>&1; rc=$?
  { [ $rc -eq 2 ] && grep -q "no usable GPU" "$work/one.out"; } || { cat "$work/one.out"; echo "FAIL: train without a GPU: exit $rc"; fail=1; }
  "$mtc" compile "$src/specs/tiny-moe.yaml" -o "$work/af" --set cluster.nodes=1 --set cluster.gpus_per_node=1 \
    --set model.moe.router_bias=true --set model.moe.load_balance=aux_free >/dev/null &&
    "$mtc" build "$work/af" --backend cuda >/dev/null 2>&1 || { echo "FAIL: cuda build with aux_free"; fail=1; }
  grep -q "rt_moe_load_all_reduce" "$work/af/step.c" || { echo "FAIL: aux_free's loads are not summed by rt_moe_load_all_reduce"; fail=1; }
  "$work/af/build-cuda/train" --data "$src/README.md" --steps 1 >"$work/af.out" 2>&1; rc=$?
  { [ $rc -eq 2 ] && grep -q "no usable GPU" "$work/af.out"; } || { cat "$work/af.out"; echo "FAIL: aux_free on cuda without a GPU: exit $rc"; fail=1; }
  [ $fail -eq 0 ] && echo "ok: without a GPU the cuda program stops at start with the reason (aux_free too: it runs on cuda)"
fi
# context parallelism: a cp 2 plan's cuda program links and its kernels (the span kernels at a rank's
# shapes: TOKENS, SEQ_LEN and CP_SEQ_LEN) compile for sm_90a
"$mtc" compile "$src/specs/tiny-moe.yaml" -o "$work/cp2" --set cluster.nodes=1 --set cluster.gpus_per_node=2 \
  --set plan.cp=2 >/dev/null && grep -q "^#define CP_SEQ_LEN" "$work/cp2/kernels.cu" &&
  "$mtc" build "$work/cp2" --backend cuda >"$work/cp2.log" 2>&1 && "$work/cp2/build-cuda/train" --check-kernels --arch sm_90a ||
  { tail -20 "$work/cp2.log"; echo "FAIL: the cuda program of a cp 2 plan"; fail=1; }
[ $fail -eq 0 ] && [ $n -ge 3 ] && echo "ok: the kernels of $n example specs and of a cp 2 plan compile for sm_90a"
exit $fail
