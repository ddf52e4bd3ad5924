#!/usr/bin/env bash
# tests/train/export.sh — the generated training program end to end (lib.sh), check export:
# mtc export of a 2-rank checkpoint, read back by tests/safetensors_check.py (its own
# safetensors and checkpoint readers): every tensor equals the master weights; with --spec,
# gpt2-style (gpt2: fused, transposed c_attn), calib-moe (mixtral) and tiny-moe with a gated
# shared expert (qwen2_moe, also from an EP 2 checkpoint), mla with and without q-LoRA
# (deepseek_v3: the RoPE rows interleaved, as rope_interleave true reads them) as Hugging Face
# directories: the family's names, the same values, a config.json that import-hf reads; a model
# no family expresses, another spec's checkpoint and a spec of other conventions (rope_theta,
# norm_eps, ...: the manifest's model_keys) are refused, writing nothing
#   usage: export.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

build x2 "$tiny" float "${small[@]}" --set training.steps=3 --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=1 || exit 1
(cd "$work" && "${mpirun[@]}" -np 2 ./x2/build/train --data "$text" --metrics x.jsonl --checkpoint-dir ckX >/dev/null) ||
  die "training run"
"$mtc" export "$work/ckX" "$work/model.safetensors" || die "mtc export"
python3 "$src/tests/safetensors_check.py" "$work/ckX/step-00000003" "$work/model.safetensors" || die "exported tensors"
out=$("$mtc" export "$work/ckX" "$work/ckX/step-00000003/rank-00000.bin" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "inside a checkpoint directory" || die "export into the checkpoint: $out"
out=$("$mtc" export "$work/no-such-dir" "$work/y.safetensors" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "no complete checkpoint here" || die "export of a missing checkpoint: $out"
# --spec: a Hugging Face model directory per family, read back in the family's names (mapped by
# safetensors_check.py's own tables); a model no family expresses, or another spec's, writes nothing
hf_spec() { # NAME SPEC FAMILY SETS...: 1 rank, 3 steps, export --spec, check names and values
  local name=$1 spec=$2 family=$3; shift 3
  build "$name" "$spec" float "${small[@]}" --set training.steps=3 --set cluster.gpus_per_node=1 --set plan.fsdp=1 \
    "$@" || return 1
  (cd "$work" && "./$name/build/train" --data "$text" --metrics "$name.jsonl" --checkpoint-dir "ck-$name" >/dev/null) ||
    { die "$name: training run"; return 1; }
  "$mtc" export "$work/ck-$name" "$work/hf-$name" --spec "$spec" "${small[@]}" --set training.steps=3 \
    --set cluster.gpus_per_node=1 --set plan.fsdp=1 "$@" >/dev/null || { die "$name: mtc export --spec"; return 1; }
  python3 "$src/tests/safetensors_check.py" "$work/ck-$name/step-00000003" "$work/hf-$name/model.safetensors" "$family" ||
    die "$name: exported $family tensors differ from the checkpoint"
  grep -q "\"model_type\": \"$family\"" "$work/hf-$name/config.json" || die "$name: config.json is not $family's"
  "$mtc" import-hf "$work/hf-$name/config.json" -o "$work/hf-$name.yaml" && "$mtc" check "$work/hf-$name.yaml" >/dev/null ||
    die "$name: the exported config.json does not import"
}
hf_spec hf-gpt2 "$src/tests/specs/gpt2-style.yaml" gpt2 --set training.seq_len=32
hf_spec hf-mixtral "$src/tests/specs/calib-moe.yaml" mixtral --set model.layers=2 --set model.moe.experts=4
hf_spec hf-qwen2 "$tiny" qwen2_moe --set model.moe.shared_expert_gate=true --set model.layers=2
# a spec that differs from the trained model beyond shapes (black-box row 3): refused, naming each
# key, nothing written; a checkpoint of an mtc before model_keys: a note, and the export
q2=("${small[@]}" --set training.steps=3 --set cluster.gpus_per_node=1 --set plan.fsdp=1
    --set model.moe.shared_expert_gate=true --set model.layers=2)
out=$("$mtc" export "$work/ck-hf-qwen2" "$work/hf-conv" --spec "$tiny" "${q2[@]}" --set model.attention.rope_theta=500000 \
  --set model.moe.norm_topk_prob=false --set model.norm_eps=0.01 2>&1); rc=$?
[ $rc -eq 2 ] && [ ! -e "$work/hf-conv" ] &&
  echo "$out" | grep -qF "the model was trained with other keys than $tiny gives: model.norm_eps: 1e-05 in the checkpoint, 0.01 in the spec; model.attention.rope_theta: 10000 in the checkpoint, 500000 in the spec; model.moe.norm_topk_prob: true in the checkpoint, false in the spec;" &&
  echo "$out" | grep -qF "or add --set model.norm_eps=1e-05 --set model.attention.rope_theta=10000 --set model.moe.norm_topk_prob=true" ||
  die "export --spec with other conventions than the trained model's: exit $rc, $out"
cp -r "$work/ck-hf-qwen2/step-00000003" "$work/ck-old"
python3 - "$work/ck-old/manifest.json" <<'PY' || die "editing the manifest"
import json, sys
m = json.load(open(sys.argv[1])); del m["model_keys"], m["manifest_fnv1a64"]; json.dump(m, open(sys.argv[1], "w"))
PY
out=$("$mtc" export "$work/ck-old" "$work/hf-old" --spec "$tiny" "${q2[@]}" 2>&1); rc=$?
[ $rc -eq 0 ] && [ -s "$work/hf-old/config.json" ] &&
  echo "$out" | grep -q "^note: .*ck-old/manifest.json does not record the model's keys" ||
  die "export of a checkpoint without model_keys: exit $rc, $out"
# DeepSeek-V3 (MLA with and without q-LoRA): the RoPE rows written interleaved (rope_interleave true)
dsx=(--set model.moe.router=sigmoid --set model.moe.router_bias=true --set model.moe.load_balance=aux_free)
hf_spec hf-dsv3 "$src/tests/specs/mla.yaml" deepseek_v3 "${dsx[@]}" --set model.attention.q_lora_rank=12
hf_spec hf-dsv3q "$src/tests/specs/mla.yaml" deepseek_v3 "${dsx[@]}"
# from a 2-rank checkpoint with its experts in EP 2: against mtc export's own-name file of it
ep2=("${small[@]}" --set training.steps=3 --set model.moe.shared_expert_gate=true --set model.layers=2
     --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=2)
if build hf-ep2 "$tiny" float "${ep2[@]}"; then
  (cd "$work" && "${mpirun[@]}" -np 2 ./hf-ep2/build/train --data "$text" --metrics ep2.jsonl --checkpoint-dir ck-ep2 \
    >/dev/null) || die "hf-ep2: training run"
  "$mtc" export "$work/ck-ep2" "$work/ep2.safetensors" >/dev/null &&
    "$mtc" export "$work/ck-ep2" "$work/hf-ep2" --spec "$tiny" "${ep2[@]}" >/dev/null &&
    python3 "$src/tests/safetensors_check.py" "$work/ep2.safetensors" "$work/hf-ep2/model.safetensors" qwen2_moe ||
    die "hf-ep2: the qwen2_moe export of an EP 2 checkpoint differs from its own-name export"
fi
out=$("$mtc" export "$work/ckX" "$work/hf-none" --spec "$tiny" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "tiny-moe.yaml:15:.*no Hugging Face family expresses this model: shared experts without a gate" &&
  [ ! -e "$work/hf-none" ] || die "export --spec of an unexpressible model: exit $rc, $out"
out=$("$mtc" export "$work/ck-hf-mixtral" "$work/hf-other" --spec "$src/tests/specs/gpt2-style.yaml" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "manifest.json: tensor model.embed_tokens.weight .*; expected the checkpoint of a program compiled from" &&
  [ ! -e "$work/hf-other" ] ||
  die "export --spec of another model's checkpoint: exit $rc, $out"
printf '\x42' | dd of="$work/ckX/step-00000003/rank-00000.bin" bs=1 seek=400 conv=notrunc status=none
echo precious >"$work/y.safetensors"
out=$("$mtc" export "$work/ckX" "$work/y.safetensors" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "rank-00000.bin: checksum mismatch" && grep -qx precious "$work/y.safetensors" &&
  [ ! -e "$work/y.safetensors.tmp" ] || die "export of a corrupt checkpoint: exit $rc, $out"
exit $fail
