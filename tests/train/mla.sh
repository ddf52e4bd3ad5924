#!/usr/bin/env bash
# tests/train/mla.sh — the generated training program end to end (lib.sh), check mla:
# tests/specs/mla.yaml (DeepSeek's multi-head latent attention) without and with q-LoRA and
# under each checkpoint policy: every tensor's gradient against finite differences (double), 1
# vs 2 ranks (fsdp 2, ep 2) with fp32 on the wire, export names; with q-LoRA 1 vs 4 ranks (fsdp
# 4, ep 4); and with YaRN (its softmax mscale²)
#   usage: mla.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

# tests/specs/mla.yaml (no q-LoRA; values of 6 against q/k heads of 8 + 4) and its variants:
# every gradient against finite differences (double, data seed 3: at seed 1 a router top-k
# choice lies within the finite-difference step of a tie), then 10 steps on 1 rank and on 2
# (fsdp 2, ep 2), fp32 on the wire, within 1e-4, and the 2-rank checkpoint exported in HF names
ml=$src/tests/specs/mla.yaml
variants=("plain" "qlora --set model.attention.q_lora_rank=12"
          "qlora-sel --set model.attention.q_lora_rank=12 --set plan.activation_checkpoint=selective"
          "qlora-full --set model.attention.q_lora_rank=12 --set plan.activation_checkpoint=full"
          "yarn --set model.rope_scaling.type=yarn --set model.rope_scaling.factor=4 --set model.rope_scaling.original_max_position=8 --set model.rope_scaling.mscale=0.8 --set model.rope_scaling.mscale_all_dim=1")
for v in "${variants[@]}"; do
  read -r -a args <<<"$v"; name=mla-${args[0]}
  build "$name" "$ml" double "${args[@]:1}" || continue
  grep -q "rt_mla_kv_backward" "$work/$name/step.c" && grep -q "rt_rope_strided_backward" "$work/$name/step.c" ||
    die "$name: no MLA in step.c"
  [ $name = mla-yarn ] && { grep -q "rt_mla_kv_backward(.*, 1\.[0-9]*);" "$work/$name/step.c" ||
    die "$name: no YaRN softmax factor on k in step.c"; }
  out=$("$work/$name/build-double/train" --data "$text" --grad-check --seed 3 2>&1); rc=$?
  echo "$name: $(echo "$out" | tail -1)"
  [ $rc -eq 0 ] || { echo "$out" | grep MISMATCH; die "$name: gradients differ from finite differences"; }
  n=$(echo "$out" | grep -c "^grad-check model\|^grad-check lm_head")
  want=$(sed -n '/^const RtTensor/,/^};/p' "$work/$name/step.c" | grep -c '^    {"')
  [ "$n" -eq "$want" ] && [ "$n" -gt 10 ] || die "$name: checked $n tensors, the program has $want"
done
for v in "${variants[@]}"; do
  read -r -a args <<<"$v"; name=mla-${args[0]}
  sh=("${small[@]}" --set training.grad_reduce_dtype=fp32 "${args[@]:1}")
  build "$name-1" "$ml" float "${sh[@]}" || continue
  build "$name-2" "$ml" float "${sh[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=2 || continue
  grep -q "^#define PLAN_EP 2$" "$work/$name-2/step.h" || die "$name-2: the plan did not take ep 2"
  (cd "$work" && ./$name-1/build/train --data "$text" --metrics "$name-1.jsonl" >/dev/null &&
    "${mpirun[@]}" -np 2 "./$name-2/build/train" --data "$text" --metrics "$name-2.jsonl" --checkpoint-dir "ck-$name" \
    >/dev/null) || { die "$name: runs"; continue; }
  paste <(losses "$work/$name-1.jsonl") <(losses "$work/$name-2.jsonl") | awk -v v=$name '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
    END { printf "%s: 1 vs 2 ranks (fsdp 2, ep 2, fp32 wire): %d steps, worst relative difference %.2e\n", v, n, worst
          exit (worst > 1e-4 || n != 10) }' || die "$name: losses differ between 1 and 2 ranks"
  "$mtc" export "$work/ck-$name" "$work/$name.safetensors" >/dev/null || { die "$name: mtc export"; continue; }
  names=$(head -c 100000 "$work/$name.safetensors" | tr ',{' '\n\n' | sed -n 's/^"\([^"]*\)":.*/\1/p')
  want="kv_a_proj_with_mqa.weight kv_a_layernorm.weight kv_b_proj.weight o_proj.weight"
  case $name in mla-plain|mla-yarn) want="$want q_proj.weight" ;; *) want="$want q_a_proj.weight q_a_layernorm.weight q_b_proj.weight" ;; esac
  for t in $want; do
    echo "$names" | grep -qx "model.layers.1.self_attn.$t" || die "$name: no model.layers.1.self_attn.$t in the export"
  done
done
# q-LoRA on 4 ranks (fsdp 4, ep 4) against 1, 4 sequences per step
sh=("${small[@]}" --set training.grad_reduce_dtype=fp32 --set model.attention.q_lora_rank=16 --set training.global_batch=4)
if build mla-4r-1 "$ml" float "${sh[@]}" &&
   build mla-4r-4 "$ml" float "${sh[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=4; then
  grep -q "^#define PLAN_EP 4$" "$work/mla-4r-4/step.h" || die "mla-4r-4: the plan did not take ep 4"
  (cd "$work" && ./mla-4r-1/build/train --data "$text" --metrics mla-4r-1.jsonl >/dev/null &&
    "${mpirun[@]}" -np 4 ./mla-4r-4/build/train --data "$text" --metrics mla-4r-4.jsonl >/dev/null) || die "mla-4r: runs"
  paste <(losses "$work/mla-4r-1.jsonl") <(losses "$work/mla-4r-4.jsonl") | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
    END { printf "mla-4r: 1 vs 4 ranks (fsdp 4, ep 4, fp32 wire): %d steps, worst relative difference %.2e\n", n, worst
          exit (worst > 1e-4 || n != 10) }' || die "mla-4r: losses differ between 1 and 4 ranks"
fi
exit $fail
