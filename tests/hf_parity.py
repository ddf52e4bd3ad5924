#!/usr/bin/env python3
"""The loss of transformers' own model class on `mtc export --spec`'s directory: loads OUTDIR with
AutoModelForCausalLM.from_pretrained (float64), requires that it found every tensor it has and
no other (missing keys allowed only where that transformers version's class has a tensor that
the exported config turns off and that it initializes to zero: Qwen2-MoE's q/k/v biases in
versions whose attention ignores qkv_bias), and prints the mean cross-entropy of predicting
WINDOW's bytes 1..T from bytes 0..T-1 (one sequence, a byte vocabulary).
usage: hf_parity.py OUTDIR WINDOW; exits 77 when torch or transformers is missing"""
import json
import sys

try:
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedModel
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

d, win = sys.argv[1], sys.argv[2]
kw = {"output_loading_info": True, "torch_dtype": torch.float64}
if hasattr(PreTrainedModel, "set_experts_implementation"):  # transformers 5: the per-expert loop (grouped_mm has no float64)
    kw["experts_implementation"] = "eager"
model, info = AutoModelForCausalLM.from_pretrained(d, **kw)
family = json.load(open(f"{d}/config.json"))["model_type"]
missing = [k for k in info["missing_keys"] if not (family == "qwen2_moe" and k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")))]
for k in info["missing_keys"]:
    if k not in missing:  # initialized by the class: zero, as the exported model's
        assert float(model.get_parameter(k).abs().max()) == 0, k
assert not missing and not info["unexpected_keys"] and not info["mismatched_keys"], info
tokens = torch.tensor([list(open(win, "rb").read())])
with torch.no_grad():
    logits = model(tokens[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits[0], tokens[0, 1:])
print(f"{float(loss):.9g}")
