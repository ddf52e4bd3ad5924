#!/usr/bin/env bash
# `mtc import-hf` on a config.json of each supported family (tests/hf/, written from the
# models' published configs) gives a spec that passes `mtc check` with the parameter counts of
# the matching example spec (or the model card's, in tests/hf/NAME.counts; for GPT-2 small, its
# 124,439,808 with dropout set to 0), keeps the fields that change the math; a config whose math
# mtc cannot represent (tests/hf/NAME.err) is refused naming the field;
# bad configs get a clear error naming the field.   usage: import_hf.sh MTC SOURCE_DIR
set -u
mtc=$(realpath "$1"); cd "$2" || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
counts() { "$mtc" check "$1" | sed 's/.*layers, //'; }
for cfg in tests/hf/*.json; do
  name=$(basename "$cfg" .json)
  if [ -f "tests/hf/$name.err" ]; then # a config with math mtc cannot represent yet: refused, naming the field
    out=$("$mtc" import-hf "$cfg" -o "$tmp/$name.yaml" 2>&1); rc=$?
    [ $rc -eq 2 ] && printf '%s' "$out" | grep -qF -- "$(cat "tests/hf/$name.err")" ||
      { echo "FAIL $name: expected exit 2 with '$(cat "tests/hf/$name.err")', got $rc: $out"; fail=1; }
    continue
  fi
  "$mtc" import-hf "$cfg" -o "$tmp/$name.yaml" || { echo "FAIL $name: import"; fail=1; continue; }
  got=$(counts "$tmp/$name.yaml") || { echo "FAIL $name: the imported spec does not check"; fail=1; continue; }
  # the counts of the example spec of the same name, or the model card's (tests/hf/NAME.counts:
  # Qwen1.5-MoE-A2.7B 14.3 B / 2.7 B activated; Qwen2.5-7B 7.61 B with 6.53 B non-embedding: by hand
  # 7,615,616,512 = 6,525,621,760 + 2 x 152,064 x 3,584, which mtc rounds to 7.62;
  # DeepSeek-V2-Lite 15.7 B total, 2.4 B activated: by hand, embedding and LM head 2 x 102,400 x 2,048
  # = 419,430,400; per layer MLA without q-LoRA q_proj 2,048 x 16 x 192 + kv_a_proj_with_mqa 2,048 x 576
  # + kv_a_layernorm 512 + kv_b_proj 512 x 16 x 256 + o_proj 2,048 x 2,048 = 13,763,072 and two norms
  # 4,096; layer 0's dense MLP 3 x 2,048 x 10,944 = 67,239,936; 26 MoE layers of 64 + 2 shared experts
  # of 3 x 2,048 x 1,408 = 8,650,752 and the gate 64 x 2,048: 571,080,704; the final norm 2,048. Total
  # 419,430,400 + 27 x 13,767,168 + 67,239,936 + 26 x 571,080,704 + 2,048 = 15,706,484,224 (15.71).
  # Active: 6 of the 64 routed experts, 26 x (8 x 8,650,752 + 131,072) = 1,802,764,288, with the rest:
  # 2,661,150,208 (2.66), of which the embedding table is a lookup: 2,661,150,208 - 209,715,200 =
  # 2.45 B, the card's 2.4 B)
  if [ -f "specs/$name.yaml" ]; then want=$(counts "specs/$name.yaml")
  elif [ "$name" = gpt2 ]; then want="124.44 M parameters, 124.44 M active)" # GPT-2 small: 124,439,808
  else want=$(cat "tests/hf/$name.counts"); fi
  [ "$got" = "$want" ] || { echo "FAIL $name: $got, expected $want"; fail=1; }
  # the fields that change the math, where the config has them
  grep -q '"rms_norm_eps": 1e-06' "$cfg" && { grep -q "norm_eps: 1e-06" "$tmp/$name.yaml" || { echo "FAIL $name: rms_norm_eps dropped"; fail=1; }; }
  grep -q '"norm_topk_prob": false' "$cfg" && { grep -q "norm_topk_prob: false" "$tmp/$name.yaml" || { echo "FAIL $name: norm_topk_prob dropped"; fail=1; }; }
  grep -q '"router_aux_loss_coef"' "$cfg" && { grep -q "aux_loss_coef: " "$tmp/$name.yaml" || { echo "FAIL $name: router_aux_loss_coef dropped"; fail=1; }; }
  grep -q '"seq_aux": true' "$cfg" && { grep -q "seq_aux_loss_coef: 0.001" "$tmp/$name.yaml" || { echo "FAIL $name: aux_loss_alpha with seq_aux dropped"; fail=1; }; }
  grep -q '"rope_type": "llama3"' "$cfg" && { grep -q "type: llama3" "$tmp/$name.yaml" || { echo "FAIL $name: rope_scaling dropped"; fail=1; }; }
  case $name in
  qwen3-*) grep -q "qk_norm: per_head" "$tmp/$name.yaml" || { echo "FAIL $name: no per-head qk-norm"; fail=1; } ;;
  olmoe-*) grep -q "qk_norm: full" "$tmp/$name.yaml" || { echo "FAIL $name: no full qk-norm"; fail=1; } ;;
  qwen1.5-*|qwen2.5-*) grep -q "^    bias: qkv$" "$tmp/$name.yaml" || { echo "FAIL $name: q/k/v biases dropped"; fail=1; } ;;
  esac
done
expect_err() { # config text, expected message
  printf '%s' "$1" > "$tmp/bad.json"
  out=$("$mtc" import-hf "$tmp/bad.json" 2>&1); rc=$?
  [ $rc -eq 2 ] && printf '%s' "$out" | grep -q -- "$2" || { echo "FAIL: expected exit 2 with '$2', got $rc: $out"; fail=1; }
}
expect_err '{"model_type": "gpt9", "n_embd": 768}' "\"model_type\" is 'gpt9', which mtc cannot import yet"
# gpt2: what the program cannot compute is refused by field (stock GPT-2 configs have dropout 0.1)
expect_err '{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "vocab_size": 100, "n_head": 4, "n_positions": 64}' '"resid_pdrop" is 0.1, which mtc cannot represent (the program has no dropout)'
expect_err '{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "vocab_size": 100, "n_head": 4, "n_positions": 64, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0, "activation_function": "gelu"}' '"activation_function" is .gelu., which mtc cannot represent'
# gpt2's layer_norm_epsilon is model.norm_eps (the program's LayerNorm takes it)
printf '%s' '{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "vocab_size": 100, "n_head": 4, "n_positions": 64, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0, "layer_norm_epsilon": 1e-6}' >"$tmp/g.json"
"$mtc" import-hf "$tmp/g.json" -o "$tmp/g.yaml" && "$mtc" check "$tmp/g.yaml" >/dev/null && grep -q "norm_eps: 1e-06" "$tmp/g.yaml" ||
  { echo "FAIL: gpt2's layer_norm_epsilon 1e-6 not kept as norm_eps"; fail=1; }
expect_err '{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "vocab_size": 100, "n_head": 4, "n_positions": 64, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0, "scale_attn_by_inverse_layer_idx": true}' '"scale_attn_by_inverse_layer_idx" is true'
expect_err '{"model_type": "llama", "hidden_size": 64}' 'missing "num_hidden_layers", required for model_type .llama.'
expect_err '{"model_type": "llama", "hidden_size": "64"}' '"hidden_size" is not an integer'
expect_err '{"model_type": "llama",' 'bad.json:1:.*error: not JSON'
# Qwen's dense layers become first_dense_layers and interleave where they follow that pattern
printf '%s' '{"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 10, "num_attention_heads": 4, "num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 8, "intermediate_size": 8, "mlp_only_layers": [0], "decoder_sparse_step": 1}' >"$tmp/q3.json"
"$mtc" import-hf "$tmp/q3.json" -o "$tmp/q3.yaml" && "$mtc" check "$tmp/q3.yaml" >/dev/null && grep -q "first_dense_layers: 1" "$tmp/q3.yaml" &&
  ! grep -q "interleave" "$tmp/q3.yaml" || { echo "FAIL: qwen3_moe's mlp_only_layers [0] is not first_dense_layers 1"; fail=1; }
expect_err '{"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 3, "vocab_size": 10, "num_attention_heads": 4, "num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 8, "intermediate_size": 8, "mlp_only_layers": [1]}' 'bad.json:1:.*the dense layers .mlp_only_layers, decoder_sparse_step. follow no pattern a spec can say'
expect_err '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "rope_scaling": {"rope_type": "dynamic", "factor": 8.0}}' '"rope_scaling" has rope_type dynamic, which mtc cannot represent yet'
expect_err '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}' 'lacks a numeric factor or an integer original_max_position_embeddings'
expect_err '{"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "use_sliding_window": true}' '"use_sliding_window" is true'
expect_err '{"model_type": "olmoe", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "clip_qkv": 8.0}' '"clip_qkv" is set'
# a value mtc check refuses is refused by import-hf, with check's message (not a spec that fails later)
expect_err '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "rms_norm_eps": 0}' 'a value of this config is outside what mtc accepts'
# rms_norm_eps: a wrong type is refused; a missing one is the family's default (LlamaConfig 1e-6, MixtralConfig 1e-5)
expect_err '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "rms_norm_eps": "1e-6"}' '"rms_norm_eps" is not a number; expected one such as 1e-06'
printf '%s' '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4}' >"$tmp/e.json"
"$mtc" import-hf "$tmp/e.json" -o "$tmp/e.yaml" && grep -q "norm_eps: 1e-06" "$tmp/e.yaml" || { echo "FAIL: llama without rms_norm_eps: not LlamaConfig's 1e-6"; fail=1; }
printf '%s' '{"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "num_local_experts": 4, "num_experts_per_tok": 2}' >"$tmp/m.json"
"$mtc" import-hf "$tmp/m.json" -o "$tmp/m.yaml" && ! grep -q "norm_eps" "$tmp/m.yaml" || { echo "FAIL: mixtral without rms_norm_eps: not MixtralConfig's 1e-5"; fail=1; }
# a key given twice (which value is meant?) is refused
expect_err '{"model_type": "llama", "num_hidden_layers": 2, "num_hidden_layers": 4}' 'duplicate'
# deepseek_v3's group-limited routing, routed_scaling_factor and yarn RoPE scaling are kept
printf '%s' '{"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "intermediate_size": 8, "n_group": 4, "topk_group": 2, "scoring_func": "sigmoid", "routed_scaling_factor": 2.5, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}' >"$tmp/ds.json"
"$mtc" import-hf "$tmp/ds.json" -o "$tmp/ds.yaml" && "$mtc" check "$tmp/ds.yaml" >/dev/null && grep -q "n_group: 4" "$tmp/ds.yaml" &&
  grep -q "topk_group: 2" "$tmp/ds.yaml" && grep -q "routed_scaling_factor: 2.5" "$tmp/ds.yaml" && grep -q "type: yarn" "$tmp/ds.yaml" ||
  { echo "FAIL: deepseek_v3's n_group, topk_group, routed_scaling_factor or rope_scaling dropped"; fail=1; }
# qwen2_moe's shared expert is gated (shared_expert_gate), kept when the config's q/k/v have no biases
printf '%s' '{"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "intermediate_size": 8, "shared_expert_intermediate_size": 16, "qkv_bias": false}' >"$tmp/q2.json"
"$mtc" import-hf "$tmp/q2.json" -o "$tmp/q2.yaml" && grep -q "shared_expert_gate: true" "$tmp/q2.yaml" &&
  grep -q "norm_topk_prob: false" "$tmp/q2.yaml" || { echo "FAIL: qwen2_moe's shared_expert_gate or norm_topk_prob default dropped"; fail=1; }
# a field with no spec form, or an invalid value, is an error at the field, never a silent default
llama='"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "intermediate_size": 128'
expect_err "{$llama,
 \"hidden_act\": \"gelu_new\"}" "bad.json:2:2: error: \"hidden_act\" is 'gelu_new', but model_type 'llama' has gated MLPs"
expect_err "{$llama, \"num_key_value_heads\": 0}" '"num_key_value_heads" is 0; expected an integer >= 1'
expect_err "{$llama, \"num_key_value_heads\": 3}" '"num_key_value_heads" is 3, which does not divide num_attention_heads 4'
expect_err "{$llama, \"rope_theta\": \"abc\"}" '"rope_theta" is not a positive number'
expect_err "{$llama, \"rope_theta\": -1}" '"rope_theta" is not a positive number'
expect_err "{$llama, \"head_dim\": 0}" '"head_dim" is 0; expected an integer >= 1'
expect_err "{$llama, \"tie_word_embeddings\": \"yes\"}" '"tie_word_embeddings" is not true or false'
expect_err '{"model_type": "llama", "hidden_size": -64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "intermediate_size": 128}' '"hidden_size" is -64; expected an integer >= 1'
expect_err '{"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "intermediate_size": 8, "num_local_experts": 4, "num_experts_per_tok": 2, "hidden_act": "relu"}' "\"hidden_act\" is 'relu', but model_type 'mixtral' has gated MLPs"
expect_err '[1]' 'not a JSON object'
# biases on the attention projections are model.attention.bias (attention_bias: q, k, v and o_proj;
# Qwen2-MoE's qkv_bias: q, k, v_proj); on the MLP's only, not mtc's model.bias (every linear and norm): refused
printf '%s' "{$llama, \"attention_bias\": true}" >"$tmp/ab.json"
"$mtc" import-hf "$tmp/ab.json" -o "$tmp/ab.yaml" && "$mtc" check "$tmp/ab.yaml" >/dev/null && grep -q "^    bias: qkvo$" "$tmp/ab.yaml" ||
  { echo "FAIL: llama's attention_bias is not attention.bias qkvo"; fail=1; }
printf '%s' '{"model_type": "olmoe", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 8, "attention_bias": true}' >"$tmp/ob.json"
"$mtc" import-hf "$tmp/ob.json" -o "$tmp/ob.yaml" && grep -q "^    bias: qkvo$" "$tmp/ob.yaml" || { echo "FAIL: olmoe's attention_bias dropped"; fail=1; }
grep -q "bias:" "$tmp/q2.yaml" && { echo "FAIL: qwen2_moe with qkv_bias false has attention biases"; fail=1; }
expect_err "{$llama, \"mlp_bias\": true}" '"mlp_bias" is true (biases on gate_proj, up_proj and down_proj only'
# sliding windows are never dropped: Mixtral's sliding_window, layer_types
mixtral='"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "intermediate_size": 8, "num_local_experts": 4'
expect_err "{$mixtral, \"num_experts_per_tok\": 2, \"sliding_window\": 4096}" '"sliding_window" is 4096 (model_type mixtral applies a sliding-window attention'
printf '%s' "{$mixtral, \"num_experts_per_tok\": 2, \"sliding_window\": null}" >"$tmp/mx.json"
"$mtc" import-hf "$tmp/mx.json" >/dev/null || { echo "FAIL: mixtral with sliding_window null"; fail=1; }
expect_err "{$llama, \"layer_types\": [\"full_attention\", \"sliding_attention\"]}" '"layer_types" has .sliding_attention. at layer 1'
# more experts per token than experts, or groups than n_group: refused at the field, with the file's line
expect_err "{$mixtral,
 \"num_experts_per_tok\": 5}" 'bad.json:2:2: error: "num_experts_per_tok" is 5, more than num_local_experts 4; expected 1 to 4'
expect_err '{"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "num_experts": 4, "num_experts_per_tok": 8, "moe_intermediate_size": 8, "intermediate_size": 8}' '"num_experts_per_tok" is 8, more than num_experts 4'
expect_err '{"model_type": "olmoe", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "num_experts": 2, "num_experts_per_tok": 3, "intermediate_size": 8}' '"num_experts_per_tok" is 3, more than num_experts 2'
ds='"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 8, "moe_intermediate_size": 8, "intermediate_size": 8'
expect_err "{$ds, \"num_experts_per_tok\": 9}" '"num_experts_per_tok" is 9, more than n_routed_experts 8'
expect_err "{$ds, \"num_experts_per_tok\": 2, \"n_group\": 4, \"topk_group\": 5}" '"topk_group" is 5, more than n_group 4'
expect_err "{$ds, \"num_experts_per_tok\": 2, \"n_group\": 3}" '"n_group" is 3, which does not divide n_routed_experts 8'
# DeepSeek's balancing loss: seq_aux is model.moe.seq_aux_loss_coef (beside aux_free for V3), the
# batch-wise form aux_loss_coef; a batch-wise loss beside aux_free is refused at seq_aux
dsv3="$ds, \"num_experts_per_tok\": 2, \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\""
printf '%s' "{$dsv3, \"aux_loss_alpha\": 0.0001, \"seq_aux\": true}" >"$tmp/d3.json"
"$mtc" import-hf "$tmp/d3.json" -o "$tmp/d3.yaml" && "$mtc" check "$tmp/d3.yaml" >/dev/null && grep -q "seq_aux_loss_coef: 0.0001" "$tmp/d3.yaml" &&
  grep -q "load_balance: aux_free" "$tmp/d3.yaml" && ! grep -q "  aux_loss_coef" "$tmp/d3.yaml" ||
  { echo "FAIL: deepseek_v3's aux_loss_alpha with seq_aux is not seq_aux_loss_coef beside aux_free"; fail=1; }
expect_err "{$dsv3, \"aux_loss_alpha\": 0.001, \"seq_aux\": false}" '"seq_aux" is false with aux_loss_alpha 0.001 and topk_method noaux_tc'
expect_err "{$ds, \"num_experts_per_tok\": 2, \"attention_bias\": true}" '"attention_bias" is true (biases on MLA'
# without scoring_func and topk_method, deepseek_v3 is transformers' DeepseekV3TopkRouter (sigmoid, noaux_tc)
# and deepseek_v2 its config's defaults (softmax, greedy)
printf '%s' "{$ds, \"num_experts_per_tok\": 2}" >"$tmp/d3m.json"
"$mtc" import-hf "$tmp/d3m.json" -o "$tmp/d3m.yaml" && grep -q "router: sigmoid" "$tmp/d3m.yaml" && grep -q "load_balance: aux_free" "$tmp/d3m.yaml" ||
  { echo "FAIL: deepseek_v3 without scoring_func/topk_method is not sigmoid with aux-free bias"; fail=1; }
printf '%s' "{$ds, \"num_experts_per_tok\": 2}" | sed 's/deepseek_v3/deepseek_v2/' >"$tmp/d2m.json"
"$mtc" import-hf "$tmp/d2m.json" -o "$tmp/d2m.yaml" && ! grep -q "router: sigmoid\|router_bias\|n_group" "$tmp/d2m.yaml" ||
  { echo "FAIL: deepseek_v2 without scoring_func/topk_method is not softmax greedy"; fail=1; }
# num_nextn_predict_layers (DeepSeek-V3's multi-token prediction) is not modeled, and the spec says so
printf '%s' "{$dsv3, \"num_nextn_predict_layers\": 1}" >"$tmp/d3mtp.json"
"$mtc" import-hf "$tmp/d3mtp.json" -o "$tmp/d3mtp.yaml" && grep -q "# num_nextn_predict_layers 1 is not modeled" "$tmp/d3mtp.yaml" &&
  "$mtc" plan "$tmp/d3mtp.yaml" >/dev/null || { echo "FAIL: num_nextn_predict_layers is not noted in the imported spec"; fail=1; }
# rope_interleave (either value: the same model up to the rope rows' order, which export writes
# interleaved) imports as the same spec (but for its name, the file's); a value that is not a boolean is refused
printf '%s' "{$dsv3, \"rope_interleave\": false}" >"$tmp/d3f.json"; printf '%s' "{$dsv3, \"rope_interleave\": true}" >"$tmp/d3t.json"
"$mtc" import-hf "$tmp/d3f.json" -o "$tmp/d3f.yaml" && "$mtc" import-hf "$tmp/d3t.json" -o "$tmp/d3t.yaml" &&
  diff <(sed "1,2d;/^name: /d" "$tmp/d3f.yaml") <(sed "1,2d;/^name: /d" "$tmp/d3t.yaml") >/dev/null || { echo "FAIL: rope_interleave changed the imported spec"; fail=1; }
expect_err "{$dsv3, \"rope_interleave\": 1}" '"rope_interleave" is not true or false'
# deepseek_v2: softmax scores; group_limited_greedy keeps n_group/topk_group, greedy ignores them (V2's
# MoEGate); seq_aux false is the batch-wise aux_loss_coef; routed_scaling_factor beside renormalized
# weights (which V2 leaves unscaled) is refused
dsv2=$(printf '%s' "$ds" | sed 's/deepseek_v3/deepseek_v2/')
printf '%s' "{$dsv2, \"num_experts_per_tok\": 2, \"topk_method\": \"group_limited_greedy\", \"n_group\": 4, \"topk_group\": 2, \"routed_scaling_factor\": 16.0, \"aux_loss_alpha\": 0.003, \"seq_aux\": false}" >"$tmp/d2.json"
"$mtc" import-hf "$tmp/d2.json" -o "$tmp/d2.yaml" && "$mtc" check "$tmp/d2.yaml" >/dev/null && grep -q "n_group: 4" "$tmp/d2.yaml" &&
  grep -q "topk_group: 2" "$tmp/d2.yaml" && grep -q "norm_topk_prob: false" "$tmp/d2.yaml" && grep -q "routed_scaling_factor: 16" "$tmp/d2.yaml" &&
  grep -q "aux_loss_coef: 0.003" "$tmp/d2.yaml" && ! grep -q "seq_aux_loss_coef\|router: sigmoid\|aux_free" "$tmp/d2.yaml" ||
  { echo "FAIL: deepseek_v2's group_limited_greedy, routed_scaling_factor or batch-wise aux_loss_alpha not kept"; fail=1; }
printf '%s' "{$dsv2, \"num_experts_per_tok\": 2, \"topk_method\": \"greedy\", \"n_group\": 4, \"topk_group\": 2}" >"$tmp/d2g.json"
"$mtc" import-hf "$tmp/d2g.json" -o "$tmp/d2g.yaml" && ! grep -q "n_group" "$tmp/d2g.yaml" && grep -q "aux_loss_coef: 0" "$tmp/d2g.yaml" ||
  { echo "FAIL: deepseek_v2's greedy routing took the groups, or a config without aux_loss_alpha kept mtc's default loss"; fail=1; }
expect_err "{$dsv2, \"num_experts_per_tok\": 2, \"norm_topk_prob\": true, \"routed_scaling_factor\": 2.0}" '"routed_scaling_factor" is 2 with norm_topk_prob true'
expect_err "{$dsv2, \"num_experts_per_tok\": 2, \"scoring_func\": \"sigmoid\"}" 'model_type deepseek_v2 scores experts by softmax only'
expect_err "{$dsv2, \"num_experts_per_tok\": 2, \"topk_method\": \"noaux_tc\"}" '"topk_method" is .noaux_tc.; expected greedy or group_limited_greedy'
# the config's file name is data in the spec (a YAML comment), whatever it holds
odd=$(printf '%s/a\nname: evil\n#.json' "$tmp"); cp tests/hf/llama-3.1-8b.json "$odd"
"$mtc" import-hf "$odd" -o "$tmp/odd.yaml" && "$mtc" check "$tmp/odd.yaml" >/dev/null && ! grep -q '^name: evil' "$tmp/odd.yaml" ||
  { echo "FAIL: a config file name with a line break changed the spec"; fail=1; }
# -o over a spec edited since it was imported: kept without --force (black-box row 12); the same
# import again, or --force, writes it
"$mtc" import-hf tests/hf/mixtral-8x7b.json -o "$tmp/ed.yaml" && "$mtc" import-hf tests/hf/mixtral-8x7b.json -o "$tmp/ed.yaml" ||
  { echo "FAIL: import-hf -o twice onto its own output"; fail=1; }
sed -i 's/^  steps: .*/  steps: 7/' "$tmp/ed.yaml"
out=$("$mtc" import-hf tests/hf/mixtral-8x7b.json -o "$tmp/ed.yaml" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q '^  steps: 7$' "$tmp/ed.yaml" && echo "$out" | grep -q "ed.yaml exists and is not the spec this import writes.*--force to replace it" ||
  { echo "FAIL: import-hf -o replaced an edited spec: exit $rc, $out"; fail=1; }
"$mtc" import-hf tests/hf/mixtral-8x7b.json -o "$tmp/ed.yaml" --force && ! grep -q '^  steps: 7$' "$tmp/ed.yaml" ||
  { echo "FAIL: import-hf -o --force kept the edited spec"; fail=1; }
# a config without _name_or_path: the name is its directory's (DIR/config.json) or its file's
mkdir -p "$tmp/Qwen3-30B-A3B"; grep -v '"_name_or_path"' tests/hf/qwen3-8b.json >"$tmp/Qwen3-30B-A3B/config.json"
cp "$tmp/Qwen3-30B-A3B/config.json" "$tmp/my-model.json"
"$mtc" import-hf "$tmp/Qwen3-30B-A3B/config.json" -o "$tmp/n1.yaml" && grep -q '^name: Qwen3-30B-A3B$' "$tmp/n1.yaml" &&
  "$mtc" import-hf "$tmp/my-model.json" -o "$tmp/n2.yaml" && grep -q '^name: my-model$' "$tmp/n2.yaml" ||
  { echo "FAIL: import-hf without _name_or_path: names $(grep -h '^name' "$tmp"/n?.yaml)"; fail=1; }
[ $fail -eq 0 ] && echo "ok: import-hf reproduces the example specs' counts; bad configs refused"
exit $fail
