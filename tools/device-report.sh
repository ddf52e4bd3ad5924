#!/usr/bin/env bash
# Reads back what tools/device-run.sh left on the GPU machine and compares it here with the cpu
# references of tools/device-pack.sh (.devkit/ref): per run, the worst relative loss difference
# over its steps and where it occurred, against the tolerance of its storage type (fp32
# activations 1e-5; bf16 5e-4 over the first 10 steps, BENCHMARKS.md says why), then the
# attention's TFLOP/s table (bench_attention), the experts' per path against dense GEMMs (bench_experts)
# and the benchmark's and PyTorch's tokens/s.
# usage: tools/device-report.sh OUT_TAR_GZ     (the device tool's files_at/out.tar.gz)
set -eu
cd "$(dirname "$0")/.."
[ $# = 1 ] && [ -f "$1" ] || { echo "usage: tools/device-report.sh OUT_TAR_GZ (from tools/device-run.sh)" >&2; exit 2; }
d=$(mktemp -d)
tar -xzf "$1" -C "$d"
python3 - "$d/logs" .devkit/ref <<'EOF'
import glob, json, os, re, sys
logs, ref = sys.argv[1], sys.argv[2]
def losses(f):
    return [json.loads(l)["loss"] for l in open(f) if l.strip()]
bad = 0
for f in sorted(glob.glob(os.path.join(logs, "*.jsonl"))):
    name = os.path.basename(f)[:-6]                  # PROGRAM.MODE, e.g. tiny-f32.fp32
    prog = name.split(".")[0]
    base = prog[:-4] if prog.endswith("-f32") else prog
    r = os.path.join(ref, base + ".jsonl")
    if not os.path.exists(r):
        continue
    a, b = losses(r), losses(f)
    n = min(len(a), len(b))
    fp32 = prog.endswith("-f32")
    first = n if fp32 else min(n, 10)
    d = [abs(x - y) / abs(x) for x, y in zip(a[:n], b[:n])]
    worst = max(d[:first]) if first else float("inf")
    tol = 1e-5 if fp32 else 5e-4
    ok = n == len(a) and worst <= tol
    bad += not ok
    at = d.index(worst) + 1 if first else 0
    print(f"{'PASS' if ok else 'FAIL'} {name}: {n}/{len(a)} steps, loss {a[0]:.4f}->{a[n-1]:.4f} (cpu) vs "
          f"{b[n-1]:.4f}; worst relative difference {worst:.1e} at step {at} of the first {first} "
          f"(tolerance {tol:g}); over all steps {max(d):.1e}")
for f in ("attn.log", "experts.log", "bench.log", "torch.log"):
    p = os.path.join(logs, f)
    if os.path.exists(p):
        for l in open(p):
            if re.match(r"(throughput|TORCH_BENCH|ATTN_BENCH|EXPERTS_BENCH|memory: this program)", l):
                print(f"{f}: {l.strip()}")
# issue 30's floor: the experts' GEMMs at >= 60% of the dense cuBLAS rate of the same FLOPs, on the
# path the plan's rule picks at europa-1t's and moe-1b's rows (the loop: EXPERT_LOOP_ROWS 8 there)
p = os.path.join(logs, "experts.log")
if os.path.exists(p):
    for l in open(p):
        f = l.split()
        if len(f) == 13 and f[0] == "EXPERTS_BENCH" and f[6] != "dense" and f[1] != "shape":
            fwd, bwd = float(f[11]), float(f[12])
            print(f"experts {f[1]} {f[6]}: {fwd:.2f} forward, {bwd:.2f} backward of the dense rate "
                  f"({'at or above' if min(fwd, bwd) >= 0.6 else 'BELOW'} the 0.60 floor)")
sys.exit(1 if bad else 0)
EOF
