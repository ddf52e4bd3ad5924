#!/usr/bin/env bash
# tests/train/gradients.sh — the generated training program end to end (lib.sh), check gradients:
# every parameter tensor's gradient against finite differences (double build), for a dense +
# MoE(shared expert) + GQA model, a sigmoid/aux-free router variant, and GELU with full
# recomputation
#   usage: gradients.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

gc=$src/tests/specs/gradcheck.yaml
variants=("plain" "sigmoid --set model.moe.router=sigmoid --set model.moe.load_balance=aux_free --set model.moe.router_bias=true"
          "gelu --set model.mlp.activation=gelu --set plan.activation_checkpoint=full")
for v in "${variants[@]}"; do
  read -r -a args <<<"$v"; name=gc-${args[0]}
  build "$name" "$gc" double "${args[@]:1}" || continue
  out=$("$work/$name/build-double/train" --data "$text" --grad-check 2>&1); rc=$?
  echo "$out" | tail -1
  [ $rc -eq 0 ] || { echo "$out" | grep MISMATCH; die "$name: gradients differ from finite differences"; }
  n=$(echo "$out" | grep -c "^grad-check model\|^grad-check lm_head")
  want=$(sed -n '/^const RtTensor/,/^};/p' "$work/$name/step.c" | grep -c '^    {"')
  [ "$n" -eq "$want" ] && [ "$n" -gt 20 ] || die "$name: checked $n tensors, the program has $want"
done
exit $fail
