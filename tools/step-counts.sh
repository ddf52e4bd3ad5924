#!/usr/bin/env bash
# step-counts.sh STEP.C [LAYER]: the GEMM calls on dense weights (rt_matmul_*: forward, and the
# backward's input and weight gradients as one call) and the memset-type calls (rt_zero, rt_zero_real)
# in layer LAYER's (default 0) forward and backward functions of a generated step.c; one line:
#   gemm fwd F bwd B  zero fwd F bwd B
# (issue 30's acceptance counts layer 0 of europa-1t: BENCHMARKS.md, "Fused projections").
set -eu
f=$1 l=${2:-0}
body() { awk -v fn="static void layer${l}_$1(" 'index($0, fn) == 1 { on = 1 } on { print } on && /^}/ { exit }' "$f"; }
count() { grep -c "$1" <<<"$2" || true; }
fw=$(body forward) bw=$(body backward)
[ -n "$fw" ] && [ -n "$bw" ] || { echo "step-counts.sh: no layer${l}_forward/backward in $f" >&2; exit 2; }
echo "gemm fwd $(count '^ *rt_matmul_' "$fw") bwd $(count '^ *rt_matmul_' "$bw")  zero fwd $(count '^ *rt_zero' "$fw") bwd $(count '^ *rt_zero' "$bw")"
