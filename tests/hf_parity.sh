#!/usr/bin/env bash
# `mtc export --spec` against transformers itself: for a model of each family the program trains
# (gpt2, llama with llama3 RoPE scaling and norm_eps 1e-6, mixtral, olmoe, qwen2_moe with a
# first dense layer; llama with attention_bias, qwen2, qwen2_moe with q/k/v biases; qwen3,
# qwen3_moe; deepseek_v3 with and without q-LoRA, YaRN), 19 steps on one window of text (a
# file of seq_len + 1 bytes: every sample is that window), a checkpoint, export --spec, then the
# 20th step resumed from it: its loss (the checkpoint's weights on the window) equals the loss of
# transformers' class for the family loaded from the export (tests/hf_parity.py, float64;
# deepseek_v3 with a transformers that has no DeepseekV3 class, as 4.46.3: tests/hf_deepseek_v3.py,
# a forward written from that class) within 1e-5 relative (issue 15 asks 1e-4; the program's loss
# is fp32, and after 20 steps on one window the worst case is 1.3e-6 at a loss of 0.87, while
# DeepSeek-V3's RoPE rows in the wrong order move it by 7.1e-4 at the cases' lr), and the class
# found every tensor. Skipped (exit 77) where torch or transformers cannot be imported by
# $MTC_HF_PYTHON (default python3); CI's machines have neither. transformers 4.46 and 5.x both
# work; qwen3 and qwen3_moe need one that has them (skipped before).
#   usage: hf_parity.sh MTC SOURCE_DIR [CASE...]   (CASE: run only those, e.g. qwen3 mixtral)
set -u
mtc=$(realpath "$1"); src=$(realpath "$2"); shift 2
only=" $* "
py=${MTC_HF_PYTHON:-python3}
"$py" -c "import torch, transformers" 2>/dev/null || { echo "skipped: $py cannot import torch and transformers"; exit 77; }
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/mtc-hf.XXXXXX"); trap 'rm -rf "$work"' EXIT
text=/usr/share/games/fortunes/cookie
[ -r "$text" ] || { echo "FAIL: $text is missing (apt-get install fortunes)"; exit 1; }
head -c 2000 "$text" | tail -c 65 >"$work/win65" && head -c 33 "$work/win65" >"$work/win33"
fail=0
case_() { # NAME SPEC WINDOW SETS...
  local name=$1 spec=$2 win=$work/$3; shift 3
  [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || return 0
  local fam=${name%%-*}
  if [[ " qwen3 qwen3_moe " == *" $fam "* ]] &&
     ! "$py" -c "import transformers.models.$fam" 2>/dev/null; then
    echo "skipped $name: this transformers has no $fam"; return
  fi
  local s=(--set training.steps=20 --set training.warmup_steps=2 --set cluster.gpus_per_node=1 --set plan.fsdp=1 "$@")
  "$mtc" compile "$spec" -o "$work/$name" "${s[@]}" >/dev/null && "$mtc" build "$work/$name" >"$work/$name.log" 2>&1 ||
    { echo "FAIL $name: compile or build"; fail=1; return; }
  (cd "$work" && "./$name/build/train" --data "$win" --metrics "$name.jsonl" --checkpoint-dir "ck-$name" --steps 19 >/dev/null &&
    "$mtc" export "ck-$name" "hf-$name" --spec "$spec" "${s[@]}" >/dev/null &&
    "./$name/build/train" --data "$win" --metrics "$name.jsonl" --checkpoint-dir "ck-$name" --steps 20 >/dev/null) ||
    { echo "FAIL $name: training, export or resume"; fail=1; return; }
  local ours hf
  ours=$(sed -n 's/^{"step":20,"loss":\([^,]*\),.*/\1/p' "$work/$name.jsonl")
  local ref=$src/tests/hf_parity.py # deepseek_v3 without the class (4.46.3): the reference forward
  local who=transformers
  grep -q '"model_type": "deepseek_v3"' "$work/hf-$name/config.json" && ! "$py" -c "import transformers.models.deepseek_v3" 2>/dev/null &&
    ref=$src/tests/hf_deepseek_v3.py who=hf_deepseek_v3.py
  hf=$("$py" "$ref" "$work/hf-$name" "$win" 2>"$work/$name.py.log" | tail -1) ||
    { echo "FAIL $name: transformers did not load the export"; tail -3 "$work/$name.py.log"; fail=1; return; }
  awk -v n="$name" -v a="$ours" -v b="$hf" -v w="$who" -v f="$(sed -n 's/.*"model_type": "\(.*\)".*/\1/p' "$work/hf-$name/config.json")" \
    'BEGIN { r = (a - b) / b; if (r < 0) r = -r; printf "%s (%s): mtc %s, %s %s, relative %.2e\n", n, f, a, w, b, r
             exit !(a != "" && r <= 1e-5) }' || fail=1
}
s64=(--set training.seq_len=64)
case_ gpt2 "$src/tests/specs/gpt2-style.yaml" win33 --set training.seq_len=32
case_ llama "$src/tests/specs/calib-dense.yaml" win65 "${s64[@]}" --set model.layers=2 --set model.norm_eps=1e-6 \
  --set model.rope_scaling.type=llama3 --set model.rope_scaling.factor=8 --set model.rope_scaling.original_max_position=16
case_ mixtral "$src/tests/specs/calib-moe.yaml" win65 "${s64[@]}" --set model.layers=2 --set model.moe.experts=4
case_ olmoe "$src/tests/specs/calib-moe.yaml" win65 "${s64[@]}" --set model.layers=2 --set model.moe.experts=4 \
  --set model.attention.qk_norm=full --set model.moe.norm_topk_prob=false
case_ qwen2_moe "$src/tests/specs/conventions.yaml" win65 "${s64[@]}" --set model.moe.shared_expert_gate=true \
  --set model.moe.routed_scaling_factor=1
# model.attention.bias: Llama's attention_bias (qkvo), Qwen2's q/k/v biases, Qwen2-MoE's qkv_bias
case_ llama-qkvo "$src/tests/specs/calib-dense.yaml" win65 "${s64[@]}" --set model.layers=2 --set model.attention.bias=qkvo
case_ qwen2 "$src/tests/specs/calib-dense.yaml" win65 "${s64[@]}" --set model.layers=2 --set model.attention.bias=qkv
case_ qwen2_moe-qkv "$src/specs/tiny-moe.yaml" win65 "${s64[@]}" --set model.layers=2 --set model.moe.shared_expert_gate=true \
  --set model.attention.bias=qkv
# the families transformers 4.46 predates: Qwen3 (qk-norm per head), Qwen3-MoE
case_ qwen3 "$src/tests/specs/calib-dense.yaml" win65 "${s64[@]}" --set model.layers=2 --set model.attention.qk_norm=per_head
case_ qwen3_moe "$src/tests/specs/calib-moe.yaml" win65 "${s64[@]}" --set model.layers=2 --set model.moe.experts=4 \
  --set model.attention.qk_norm=per_head --set model.norm_eps=1e-6
# deepseek_v3 (MLA with q-LoRA, groups, routed_scaling_factor; without q-LoRA with YaRN): the RoPE
# rows exported interleaved (rope_interleave true), against transformers' DeepseekV3 class or, without
# it, tests/hf_deepseek_v3.py's forward. lr 0.03: after 3 steps (this test's earlier length) at 1e-3 the scores
# are so flat that rope rows left in mtc's order move the loss by only 1.5e-6; at 0.03 by 7.1e-4,
# while the export as written agrees to 5.4e-8
ds=(--set model.moe.router=sigmoid --set model.moe.router_bias=true --set model.moe.load_balance=aux_free --set training.lr=0.03)
case_ deepseek_v3 "$src/tests/specs/mla.yaml" win65 "${s64[@]}" "${ds[@]}" --set model.attention.q_lora_rank=12 \
  --set model.moe.n_group=2 --set model.moe.topk_group=1 --set model.moe.routed_scaling_factor=2.5
case_ deepseek_v3-yarn "$src/tests/specs/mla.yaml" win65 "${s64[@]}" "${ds[@]}" --set model.rope_scaling.type=yarn \
  --set model.rope_scaling.factor=4 --set model.rope_scaling.original_max_position=16 --set model.rope_scaling.mscale=0.8 \
  --set model.rope_scaling.mscale_all_dim=1
exit $fail
