#!/usr/bin/env bash
# tests/train/conventions.sh — the generated training program end to end (lib.sh), check conventions:
# tests/specs/conventions.yaml (norm_eps, norm_topk_prob false, routed_scaling_factor) and its
# variants (attention.bias qkv, qkvo; sigmoid router; qk-norm per head with selective
# checkpointing, and full with full checkpointing; llama3 and YaRN RoPE scaling; Qwen2-MoE's
# gated shared expert; DeepSeek-V3's group-limited routing; the sequence-wise balance loss with
# softmax and with sigmoid + aux_free, 2 sequences a micro-batch): the double gradient check,
# and 1 vs 2 ranks (ep 2, fp32 wire) within 1e-4
#   usage: conventions.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

# tests/specs/conventions.yaml (norm_eps 1e-6, norm_topk_prob false, routed_scaling_factor 2.5)
# and its variants: every gradient against finite differences (double), then 10 steps on 1
# rank and on 2 (fsdp 2, ep 2), fp32 on the wire, within 1e-4
cv=$src/tests/specs/conventions.yaml
variants=("raw" "sigmoid --set model.moe.router=sigmoid --set model.moe.load_balance=aux_free --set model.moe.router_bias=true --set model.moe.norm_topk_prob=true"
          "sigraw --set model.moe.router=sigmoid --set model.moe.routed_scaling_factor=1"
          "qkhead --set model.attention.qk_norm=per_head --set plan.activation_checkpoint=selective"
          "qkfull --set model.attention.qk_norm=full --set plan.activation_checkpoint=full"
          "rope --set model.rope_scaling.type=llama3 --set model.rope_scaling.factor=8 --set model.rope_scaling.original_max_position=1024"
          "gate --set model.moe.shared_expert_gate=true"
          "yarn --set model.rope_scaling.type=yarn --set model.rope_scaling.factor=4 --set model.rope_scaling.original_max_position=64"
          "group --set model.moe.router=sigmoid --set model.moe.load_balance=aux_free --set model.moe.router_bias=true --set model.moe.n_group=2 --set model.moe.topk_group=1"
          "groupsm --set model.moe.n_group=2 --set model.moe.topk_group=1"
          "abqkv --set model.attention.bias=qkv"
          "abqkvo --set model.attention.bias=qkvo --set model.attention.qk_norm=per_head"
          "seqaux --set model.moe.seq_aux_loss_coef=0.5 --set model.moe.aux_loss_coef=0 --set training.micro_batch=2 --set training.global_batch=4"
          "seqauxsig --set model.moe.router=sigmoid --set model.moe.load_balance=aux_free --set model.moe.router_bias=true --set model.moe.seq_aux_loss_coef=0.5 --set training.micro_batch=2 --set training.global_batch=4")
for v in "${variants[@]}"; do
  read -r -a args <<<"$v"; name=cv-${args[0]}
  build "$name" "$cv" double "${args[@]:1}" || continue
  grep -q "rt_router_weights_backward" "$work/$name/step.c" || die "$name: step.c does not reweight the router"
  grep -q "^#define EPS ((real)1e-06)" "$work/$name/step.c" || die "$name: step.c's EPS is not model.norm_eps"
  case $name in cv-qk*) grep -q "rt_qk_norm_backward" "$work/$name/step.c" || die "$name: no qk-norm in step.c" ;;
  cv-rope) grep -q "rt_rope_llama3_backward" "$work/$name/step.c" || die "$name: no llama3 RoPE in step.c" ;;
  cv-yarn) grep -q "rt_rope_yarn_backward" "$work/$name/step.c" || die "$name: no YaRN RoPE in step.c" ;;
  cv-gate) grep -q "rt_sigmoid_gate_backward" "$work/$name/step.c" && grep -q '"model.layers.1.mlp.shared_expert_gate.weight"' \
    "$work/$name/step.c" || die "$name: no shared_expert_gate in step.c" ;;
  cv-seqaux*) grep -q "rt_seq_aux_loss_backward" "$work/$name/step.c" || die "$name: no sequence-wise balance loss in step.c" ;;
  cv-group*) grep -q "rt_router_group_forward" "$work/$name/step.c" || die "$name: no group-limited routing in step.c" ;;
  cv-abqkv*) grep -q '"model.layers.0.self_attn.v_proj.bias"' "$work/$name/step.c" || die "$name: no v_proj bias in step.c"
    grep -q '"model.layers.0.mlp.down_proj.bias"\|input_layernorm.bias' "$work/$name/step.c" && die "$name: biases beyond attention"
    [ "$name" = cv-abqkvo ] && { grep -q '"model.layers.0.self_attn.o_proj.bias"' "$work/$name/step.c" || die "$name: no o_proj bias"; }
    [ "$name" = cv-abqkv ] && grep -q '"model.layers.0.self_attn.o_proj.bias"' "$work/$name/step.c" && die "$name: an o_proj bias" ;; esac
  out=$("$work/$name/build-double/train" --data "$text" --grad-check 2>&1); rc=$?
  echo "$name: $(echo "$out" | tail -1)"
  [ $rc -eq 0 ] || { echo "$out" | grep MISMATCH; die "$name: gradients differ from finite differences"; }
done
for v in "${variants[@]}"; do
  read -r -a args <<<"$v"; name=cv-${args[0]}
  sh=("${small[@]}" --set training.grad_reduce_dtype=fp32 "${args[@]:1}")
  build "$name-1" "$cv" float "${sh[@]}" || continue
  build "$name-2" "$cv" float "${sh[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=2 || continue
  grep -q "^#define PLAN_EP 2$" "$work/$name-2/step.h" || die "$name-2: the plan did not take ep 2"
  (cd "$work" && ./$name-1/build/train --data "$text" --metrics "$name-1.jsonl" >/dev/null &&
    "${mpirun[@]}" -np 2 "./$name-2/build/train" --data "$text" --metrics "$name-2.jsonl" >/dev/null) ||
    { die "$name: runs"; continue; }
  paste <(losses "$work/$name-1.jsonl") <(losses "$work/$name-2.jsonl") | awk -v v=$name '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
    END { printf "%s: 1 vs 2 ranks (fsdp 2, ep 2, fp32 wire): %d steps, worst relative difference %.2e\n", v, n, worst
          exit (worst > 1e-4 || n != 10) }' || die "$name: losses differ between 1 and 2 ranks"
done
exit $fail
