#!/usr/bin/env bash
# `mtc import-hf` on a config.json of each supported family (tests/hf/, written from the
# models' published configs) gives a spec that passes `mtc check` with the parameter counts of
# the matching example spec (or, for Qwen3-30B-A3B, the published 30.5B total / 3.3B active;
# for GPT-2 small, its 124,439,808 with dropout set to 0);
# bad configs get a clear error naming the field.   usage: import_hf.sh MTC SOURCE_DIR
set -u
mtc=$(realpath "$1"); cd "$2" || exit 2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
counts() { "$mtc" check "$1" | sed 's/.*layers, //'; }
for cfg in tests/hf/*.json; do
  name=$(basename "$cfg" .json)
  "$mtc" import-hf "$cfg" -o "$tmp/$name.yaml" || { echo "FAIL $name: import"; fail=1; continue; }
  got=$(counts "$tmp/$name.yaml") || { echo "FAIL $name: the imported spec does not check"; fail=1; continue; }
  if [ -f "specs/$name.yaml" ]; then want=$(counts "specs/$name.yaml")
  elif [ "$name" = gpt2 ]; then want="124.44 M parameters, 124.44 M active)" # GPT-2 small: 124,439,808
  else want="30.53 B parameters, 3.35 B active)"; fi
  [ "$got" = "$want" ] || { echo "FAIL $name: $got, expected $want"; fail=1; }
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
expect_err '{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "vocab_size": 100, "n_head": 4, "n_positions": 64, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0, "layer_norm_epsilon": 1e-6}' '"layer_norm_epsilon" is 1e-06, which mtc cannot represent'
expect_err '{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "vocab_size": 100, "n_head": 4, "n_positions": 64, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0, "scale_attn_by_inverse_layer_idx": true}' '"scale_attn_by_inverse_layer_idx" is true'
expect_err '{"model_type": "llama", "hidden_size": 64}' 'missing "num_hidden_layers", required for model_type .llama.'
expect_err '{"model_type": "llama", "hidden_size": "64"}' '"hidden_size" is not an integer'
expect_err '{"model_type": "llama",' 'bad.json:1:.*error: not JSON'
expect_err '{"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 8, "intermediate_size": 8, "mlp_only_layers": [0]}' '"mlp_only_layers" lists dense layers'
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
expect_err "{$llama, \"hidden_size\": -64}" '"hidden_size" is -64; expected an integer >= 1'
expect_err '{"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4, "intermediate_size": 8, "num_local_experts": 4, "num_experts_per_tok": 2, "hidden_act": "relu"}' "\"hidden_act\" is 'relu', but model_type 'mixtral' has gated MLPs"
expect_err '[1]' 'not a JSON object'
# the config's file name is data in the spec (a YAML comment), whatever it holds
odd=$(printf '%s/a\nname: evil\n#.json' "$tmp"); cp tests/hf/llama-3.1-8b.json "$odd"
"$mtc" import-hf "$odd" -o "$tmp/odd.yaml" && "$mtc" check "$tmp/odd.yaml" >/dev/null && ! grep -q '^name: evil' "$tmp/odd.yaml" ||
  { echo "FAIL: a config file name with a line break changed the spec"; fail=1; }
printf '{%s, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}' "$llama" >"$tmp/scaled.json"
"$mtc" import-hf "$tmp/scaled.json" | grep -q "# rope_scaling is not represented" ||
  { echo "FAIL: rope_scaling is dropped without a note"; fail=1; }
[ $fail -eq 0 ] && echo "ok: import-hf reproduces the example specs' counts; bad configs refused"
exit $fail
