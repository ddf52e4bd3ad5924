#!/usr/bin/env bash
# tests/train/gradients.sh — the generated training program end to end (lib.sh), check gradients:
# every parameter tensor's gradient against finite differences (double build), for a dense +
# MoE(shared expert) + GQA model, a sigmoid/aux-free router variant with qk-norm (elements whose
# step flips a routing decision redrawn, the bias without a gradient unchecked), and GELU with
# full recomputation
#   usage: gradients.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

gc=$src/tests/specs/gradcheck.yaml
# sigmoid: with qk-norm, steps of h flip routing decisions (of the bias and of a weight): the
# harness redraws those elements, and leaves the aux-free bias (no gradient) unchecked
variants=("plain" "sigmoid --set model.moe.router=sigmoid --set model.moe.load_balance=aux_free --set model.moe.router_bias=true --set model.attention.qk_norm=per_head"
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
  if [ "${args[0]}" = sigmoid ]; then
    echo "$out" | grep -q "^grad-check model.layers.1.mlp.gate.e_score_correction_bias *not checked: no gradient" &&
      echo "$out" | grep -q "^grad-check: [0-9]* element(s) redrawn and [0-9]* skipped where a step of h flips a routing decision; 1 tensor(s) without a gradient not checked" ||
      die "$name: the aux-free bias checked, or no count of flips: $(echo "$out" | grep -i 'bias\|flip')"
  fi
done
exit $fail
