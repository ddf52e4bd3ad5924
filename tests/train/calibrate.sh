#!/usr/bin/env bash
# tests/train/calibrate.sh — the generated training program end to end (lib.sh), check calibrate:
# tiny-moe on 1 rank with --profile (3 steps: 2 profiled), then mtc calibrate of the cpu preset
# from that profile (which names its device, "cpu", and calibrate prints it): every op class the
# cost model prices is in the profile with its seconds and FLOPs or bytes (the GEMM and attention
# FLOPs those of the shapes, computed here by hand), the calibrated preset loads by its file name
# (MTC_PRESET_DIR), each fitted factor is FLOPs / (50 GFLOP/s x seconds) of the profile, and the
# plan's prediction moves with the factors (a preset fitted to the profile with every second
# doubled predicts a longer step). No wall-clock bound.
#   usage: calibrate.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

cal=(--set training.seq_len=64 --set training.warmup_steps=2 --set cluster.gpus_per_node=1 --set plan.fsdp=1)
build cal "$tiny" float "${cal[@]}" || exit 1
(cd "$work" && ./cal/build/train --data "$text" --steps 3 --metrics cal.jsonl --profile cal.json >cal.log) ||
  { cat "$work/cal.log"; die "the profiled run"; exit 1; }
grep -q "^throughput: [0-9]* tokens/s per rank over 2 steps" "$work/cal.log" || die "the throughput line changed"
# tiny-moe at seq 64: 4 layers, hidden 128, 4 heads of 32 (2 KV heads), 8 experts of 256
# (top 2) and a shared one, vocabulary 256; 8 sequences of 64 tokens per step (1 rank)
python3 - "$work/cal.json" <<'PY' || die "the profile's classes and FLOPs"
import json, sys
p = json.load(open(sys.argv[1]))
c = p["classes"]
N, C, L, V, hd, nh, nkv, F, K = 8 * 64, 128, 4, 256, 32, 4, 2, 256, 2
for k in ["gemm", "grouped_gemm", "attention_fwd", "attention_bwd", "norm", "rope", "activation", "loss", "optimizer"]:
  assert k in c and c[k]["seconds"] > 0, k
assert p["steps"] == 2 and p["world"] == 1 and p["backend"] == "cpu" and p["device"] == "cpu" and p["tokens_per_step"] == N, p
# attention: causal 2 B T^2 nh hd forward, 2.5x backward, per layer
fwd = L * 2 * 8 * 64 * 64 * nh * hd
assert abs(c["attention_fwd"]["flops"] - fwd) < 1, (c["attention_fwd"], fwd)
assert abs(c["attention_bwd"]["flops"] - 2.5 * fwd) < 1, c["attention_bwd"]
# routed experts: every row goes through gate, up (C->F) and down (F->C): 3 GEMMs of 2 rows C F
# forward, twice that backward (dx and dW)
grouped = L * 3 * (2 * N * K * C * F) * 3
assert abs(c["grouped_gemm"]["flops"] - grouped) < 1, (c["grouped_gemm"]["flops"], grouped)
# dense GEMMs: q (C->nh hd), k, v (C->nkv hd), o (nh hd->C), the shared expert (3 of C F), the
# router (C->8) per layer, forward and 2x backward, and the LM head (C->V) 4 times: forward, and
# backward the logits again (never stored), dx and dW
per_tok = L * (C * nh * hd * 2 + 2 * C * nkv * hd + 3 * C * F + C * 8)
want = 3 * 2 * N * per_tok + 4 * 2 * N * C * V
assert abs(c["gemm"]["flops"] - want) < 1, (c["gemm"]["flops"], want)
# the loss: 2 B per logit forward, 4 backward
assert abs(c["loss"]["bytes"] - 6 * N * V) < 1, c["loss"]
# the optimizer: AdamW's 30 B per parameter as the cost model counts them, every one of the
# 3,806,336 parameters on the one rank (`mtc plan`'s total), the step on the device
assert abs(c["optimizer"]["bytes"] - 30 * 3806336) < 1 and p["optimizer_on_host"] is False, c["optimizer"]
print("profile: " + ", ".join("%s %.3f ms" % (k, 1e3 * v["seconds"]) for k, v in c.items()))
slow = json.loads(json.dumps(p))
for v in slow["classes"].values(): v["seconds"] *= 2
json.dump(slow, open(sys.argv[1].replace(".json", "-slow.json"), "w"))
PY
# the base preset: the cpu one with peak rates no machine reaches (100x), so that every fitted
# factor is below 1 however fast the machine running the test is (a factor above 1 is refused)
mkdir -p "$work/presets"
sed -e 's/^  bf16_flops: 50 GFLOP\/s .*/  bf16_flops: 5 TFLOP\/s/' -e 's/^  hbm_bandwidth: 10 GB\/s .*/  hbm_bandwidth: 1 TB\/s/' \
  "$src/specs/clusters/cpu.yaml" >"$work/presets/cpu-big.yaml"
grep -q "bf16_flops: 5 TFLOP/s" "$work/presets/cpu-big.yaml" && grep -q "hbm_bandwidth: 1 TB/s" "$work/presets/cpu-big.yaml" ||
  die "the test's base preset (specs/clusters/cpu.yaml changed?)"
export MTC_PRESET_DIR="$work/presets"
"$mtc" calibrate "$work/cal.json" --preset cpu-big -o "$work/presets/cpu-fit.yaml" >"$work/calibrate.log" ||
  { cat "$work/calibrate.log"; die "mtc calibrate"; }
grep -q "^  profile .*/cal.json: tiny-moe, cpu backend on cpu, 1 rank(s), 2 steps$" "$work/calibrate.log" &&
  grep -q "^# Calibrated by .* from .*/cal.json (tiny-moe, cpu backend on cpu, 1 rank(s), 2 steps)" "$work/presets/cpu-fit.yaml" ||
  die "calibrate does not name the profile's device: $(cat "$work/calibrate.log")"
"$mtc" calibrate "$work/cal-slow.json" --preset cpu-big -o "$work/presets/cpu-slow.yaml" >/dev/null || die "mtc calibrate (slow)"
python3 - "$work/cal.json" "$work/presets/cpu-fit.yaml" <<'PY' || die "the fitted factors"
import json, re, sys
c = json.load(open(sys.argv[1]))["classes"]
text = open(sys.argv[2]).read()
def factor(k):
  m = re.search(r"^  %s: ([0-9.e+-]+) +# fitted from .*cal\.json: " % k, text, re.M)
  assert m, "no fitted %s citing the profile in:\n%s" % (k, text)
  return float(m.group(1))
for k, cls in [("dense_gemm", "gemm"), ("grouped_gemm", "grouped_gemm"), ("attention", "attention_fwd"),
             ("attention_bwd", "attention_bwd")]:
  want = c[cls]["flops"] / (5e12 * c[cls]["seconds"])
  assert abs(factor(k) / want - 1) < 1e-3, (k, factor(k), want)
# elementwise: the bytes the model prices over the seconds of every memory-bound class and of the
# 1-rank collectives (local copies)
b = sum(c[k]["bytes"] for k in ["norm", "rope", "activation", "loss"])
s = sum(c[k]["seconds"] for k in ["norm", "rope", "activation", "loss", "permute", "elementwise", "all_gather",
                                 "reduce_scatter", "all_reduce"] if k in c)
assert abs(factor("elementwise") / (b / (1e12 * s)) - 1) < 1e-3, (factor("elementwise"), b / (1e12 * s))
print("fitted: " + ", ".join("%s %.4g" % (k, factor(k)) for k in ["dense_gemm", "grouped_gemm", "attention",
                                                                "attention_bwd", "elementwise"]))
PY
step() { MTC_PRESET_DIR="$work/presets" "$mtc" plan "$tiny" "${cal[@]}" --json "$@" |
         python3 -c "import json, sys; print(json.load(sys.stdin)['predicted']['step_seconds'])"; }
fit=$(step --set cluster.preset=cpu-fit) || die "the calibrated preset does not load"
slow=$(step --set cluster.preset=cpu-slow) || die "the slow preset does not load"
echo "predicted step: calibrated $fit s, with every measured second doubled $slow s"
# every measured second doubled halves every fitted factor exactly (what calibrate computes), and
# the prediction grows (by how much depends on the terms no profile fits: launches, optimizer)
python3 - "$work/presets/cpu-fit.yaml" "$work/presets/cpu-slow.yaml" <<'PY' || die "the slow profile's factors"
import re, sys
def factors(path):
  return {m.group(1): float(m.group(2)) for m in re.finditer(r"^  (\w+): ([0-9.e+-]+) +# fitted from", open(path).read(), re.M)}
f, s = factors(sys.argv[1]), factors(sys.argv[2])
assert f and f.keys() == s.keys(), (f, s)
for k in f: assert abs(s[k] / f[k] - 0.5) < 1e-3, (k, f[k], s[k])
PY
# the fitted factors count as measured where reports say where predictions come from
grep -q '^  measured: .*dense_gemm.* # with the factors fitted by mtc calibrate$' "$work/presets/cpu-fit.yaml" ||
  die "the calibrated preset's cluster.evidence.measured does not name the fitted dense_gemm"
MTC_PRESET_DIR=$work/presets "$mtc" plan "$tiny" "${cal[@]}" --set cluster.preset=cpu-fit |
  grep -q '^  efficiencies measured .*: .*dense_gemm' || die "mtc plan does not count the fitted factors as measured"
# calibrating a calibrated preset rewrites its one measured line, each key once
"$mtc" calibrate "$work/cal.json" --preset cpu-fit -o "$work/presets/cpu-fit2.yaml" >/dev/null || die "mtc calibrate (again)"
[ "$(grep -c '^  measured:' "$work/presets/cpu-fit2.yaml")" = 1 ] && [ "$(grep '^  measured:' "$work/presets/cpu-fit2.yaml" |
  grep -o dense_gemm | wc -l)" = 1 ] || die "a second calibration repeats cluster.evidence.measured or its keys"
awk -v f="$fit" -v s="$slow" 'BEGIN { exit !(s > f) }' ||
  die "doubling the measured seconds should make the prediction slower ($fit s -> $slow s)"
exit $fail
