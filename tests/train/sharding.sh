#!/usr/bin/env bash
# tests/train/sharding.sh — the generated training program end to end (lib.sh), check sharding:
# 10 steps of one model and global batch on 1 rank and on 4 MPI ranks (fsdp 4 with ep 2, with ep
# 4, and with ep 4 laid out as 2 nodes x 2 ranks: an EP group spanning nodes), gradients reduced
# in fp32: the same loss at every step within 1e-4 relative; the same with parameters kept
# gathered across 4 micro-batches (reshard after_step: every group with ep 4 across 2 nodes, the
# dense groups or the experts alone with ep 2), each kept buffer the plan's item; also with Muon
# and 6 experts in uneven whole-expert shards (2, 2, 2, 0 on 4 ranks); with bf16 on the wire
# (the default), within 1e-2
#   usage: sharding.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

small+=(--set training.grad_reduce_dtype=fp32)
build w1 "$tiny" float "${small[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 || exit 1
(cd "$work" && ./w1/build/train --data "$text" --metrics w1.jsonl --progress-every 4 >w1.log) || die "1 rank run"
run_output "$work/w1.log" "$work/w1.jsonl" "$work/w1" 4 || die "w1: the run's output"
# the end-of-run line: MFU = tokens/s x plan.json's flops_per_token / its peak per GPU, and
# the ratio to the plan's prediction
python3 - "$work/w1.log" "$work/w1/plan.json" <<'PY' || die "w1: the throughput line's MFU"
import json, re, sys
line = [l for l in open(sys.argv[1]) if l.startswith("throughput: ")][-1]
print(line.strip())
plan = json.load(open(sys.argv[2]))
m = re.match(r"throughput: (\d+) tokens/s per rank over (\d+) steps \([0-9.]+ s per step\), MFU ([0-9.]+)% of "
           r"([0-9.e+]+) TFLOP/s; the plan predicted (\d+) per GPU of its cluster, MFU ([0-9.]+)%: "
           r"measured / predicted ([0-9.]+)$", line.strip())
assert m, "unexpected form"
tps, mfu, peak, pred, pmfu, ratio = (float(m.group(i)) for i in (1, 3, 4, 5, 6, 7))
fpt, want_peak = plan["model"]["flops_per_token"], plan["cluster"]["peak_bf16_flops_per_gpu"]
assert abs(peak * 1e12 - want_peak) <= 1e-3 * want_peak, (peak, want_peak)
# printed to 0.01%, from tokens/s printed to the unit
assert abs(mfu - 100 * tps * fpt / want_peak) <= 0.005 + 100 * 0.5 * fpt / want_peak, (mfu, tps)
assert abs(pmfu - 100 * plan["predicted"]["mfu"]) <= 0.01, (pmfu, plan["predicted"]["mfu"])
assert abs(ratio - tps / pred) <= 0.001 + 0.5 / pred + 0.5 / tps, (ratio, tps, pred)
PY
# ep 2 and 4 inside one 4-rank node, and ep 4 across 2 nodes x 2 ranks (an EP group of whole nodes),
# re-gathering for every pass (the search would keep everything gathered: kept below)
for ep in 2 4 4x; do
  layout=(--set cluster.gpus_per_node=4 --set plan.reshard=every_micro_batch)
  [ "$ep" = 4x ] && layout=(--set cluster.nodes=2 --set cluster.gpus_per_node=2 --set plan.reshard=every_micro_batch)
  build "w4ep$ep" "$tiny" float "${small[@]}" "${layout[@]}" --set plan.fsdp=4 --set plan.ep=${ep%x} || continue
  grep -q "^#define PLAN_EP ${ep%x}$" "$work/w4ep$ep/step.h" || die "w4ep$ep: the plan did not take ep ${ep%x}"
  grep -q "^#define GATHERED0 " "$work/w4ep$ep/step.c" && ! grep -q "_KEPT\|^#define KEPT " "$work/w4ep$ep/step.c" ||
    die "w4ep$ep: not a program that re-gathers every pass"
  [ "$ep" = 4x ] && { grep -q "EP 4 across 2 nodes" "$work/w4ep$ep/plan.txt" || die "w4ep4x: plan.txt does not lay EP across 2 nodes"; }
  (cd "$work" && "${mpirun[@]}" -np 4 "./w4ep$ep/build/train" --data "$text" --metrics "w4ep$ep.jsonl" >/dev/null) ||
    { die "4 rank run (ep $ep)"; continue; }
  paste <(losses "$work/w1.jsonl") <(losses "$work/w4ep$ep.jsonl") | awk -v ep=$ep '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r
      if (r > 1e-4) { printf "step %d: 1 rank %s, 4 ranks (ep %s) %s\n", n, $1, ep, $2; bad = 1 } }
    END { printf "1 vs 4 ranks (fsdp 4, ep %s): %d steps, worst relative difference %.2e\n", ep, n, worst
          exit (bad || n != 10) }' || die "losses differ between 1 and 4 ranks (ep $ep)"
done
# parameters kept gathered across micro-batches (reshard after_step): global batch 16 in micro-batches
# of 1, so 4 micro-batches per step on 4 ranks (16 on the 1-rank reference, which re-gathers):
# ep 4 across 2 nodes x 2 ranks with every group kept (KEPT), and ep 2 (experts sharded over 2
# ranks, prefetch 2) with only the dense groups kept (DENSE_KEPT, a pool for the experts) and with
# only the experts kept (EXPERTS_KEPT, a pool for the rest). Each kept buffer is the plan's item
# (bf16 bytes of step.c's map against plan.json, within the groups' padding), and the kept groups'
# all-gathers run only in the forward of a step's first micro-batch (c->gather_kept)
accum4=("${small[@]}" --set training.global_batch=16 --set training.micro_batch=1)
build w1k "$tiny" float "${accum4[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 --set plan.reshard=every_micro_batch &&
  (cd "$work" && ./w1k/build/train --data "$text" --metrics w1k.jsonl >/dev/null) || die "1 rank run, 16 micro-batches"
for v in "keep4x:KEPT:4:after_step:after_step" "keepd:DENSE_KEPT:2:after_step:every_micro_batch" \
         "keepx:EXPERTS_KEPT:2:every_micro_batch:after_step"; do
  IFS=: read -r n buf ep r re <<<"$v"
  layout=(--set cluster.gpus_per_node=4 --set plan.prefetch=2)
  [ "$n" = keep4x ] && layout=(--set cluster.nodes=2 --set cluster.gpus_per_node=2)
  build "$n" "$tiny" float "${accum4[@]}" "${layout[@]}" --set plan.fsdp=4 --set plan.ep=$ep --set plan.reshard=$r \
    --set plan.reshard_experts=$re || continue
  grep -q "^#define ACCUM 4$" "$work/$n/step.h" || die "$n: not 4 micro-batches per step"
  grep -q "^#define $buf " "$work/$n/step.c" || die "$n: no $buf in step.c's map"
  # every gather into the kept buffer is conditional, and the backward gathers none of them
  grep "all_gather_start(.*A($buf)" "$work/$n/step.c" | grep -qv "if (c->gather_kept)" && die "$n: an unconditional gather into $buf"
  sed -n '/^void step_backward/,/^}/p' "$work/$n/step.c" | grep -q "gather_kept\|A($buf)[^;]*, A([A-Z0-9_]*_PARAM)" &&
    die "$n: the backward gathers into $buf"
  python3 - "$work/$n/plan.json" "$work/$n/step.c" "$buf" <<'PY' || die "$n: $buf is not the plan's item"
import json, re, sys
plan, step, buf = json.load(open(sys.argv[1])), open(sys.argv[2]).read(), sys.argv[3]
item = {"KEPT": "gathered.params_kept", "DENSE_KEPT": "gathered.dense_kept", "EXPERTS_KEPT": "gathered.experts_kept"}[buf]
want = [i["bytes"] for i in plan["memory"]["hbm"]["items"] if i["name"] == item]
have = int(re.search(r"^#define %s +\d+ /\* +(\d+)(?: \[\S*\])?:" % buf, step, re.M).group(1)) * 2  # bf16 on the cuda backend
assert len(want) == 1 and 0 <= have - want[0] <= 0.01 * want[0], (item, want, have)
print(f"{buf}: {have} B, the plan's {item}: {want[0]} B")
PY
  (cd "$work" && "${mpirun[@]}" -np 4 "./$n/build/train" --data "$text" --metrics "$n.jsonl" >/dev/null) ||
    { die "4 rank run ($n)"; continue; }
  paste <(losses "$work/w1k.jsonl") <(losses "$work/$n.jsonl") | awk -v n=$n -v ep=$ep '
    { k++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r
      if (r > 1e-4) { printf "step %d: 1 rank %s, 4 ranks (%s) %s\n", k, $1, n, $2; bad = 1 } }
    END { printf "1 vs 4 ranks (fsdp 4, ep %s, %s), 4 micro-batches: %d steps, worst relative difference %.2e\n", ep, n, k, worst
          exit (bad || k != 10) }' || die "losses differ between 1 and 4 ranks ($n)"
done
# experts that do not divide over their shard group, with Muon: 6 experts over 4 ranks (ep 1) are
# sharded flat (plan_expert_per: no whole-expert shards padded to the largest), and the expert
# matrices split over ranks go to their owners like dense ones (the whole case: w4ep2, 4 over 2)
uneven=(--set model.moe.experts=6 --set training.optimizer=muon)
build w1u "$tiny" float "${small[@]}" "${uneven[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 &&
  build w4u "$tiny" float "${small[@]}" "${uneven[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=1 &&
  ! grep -q "^#define SHARD_EXPERTS " "$work/w4u/step.h" && grep -q "sharded over the 4 ranks flat" "$work/w4u/plan.txt" &&
  tr -s " \n" " " <"$work/w4u/plan.txt" | grep -q "experts: [0-9]* of them, split" &&
  (cd "$work" && ./w1u/build/train --data "$text" --metrics w1u.jsonl >/dev/null &&
  "${mpirun[@]}" -np 4 ./w4u/build/train --data "$text" --metrics w4u.jsonl >/dev/null) || die "uneven whole-expert runs"
paste <(losses "$work/w1u.jsonl") <(losses "$work/w4u.jsonl") | awk '
  { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
  END { printf "1 vs 4 ranks, Muon, 6 experts sharded flat over 4 ranks (split matrices at their owners): %d steps, worst relative difference %.2e\n", n, worst
        exit (worst > 1e-4 || n != 10) }' || die "losses differ between 1 and 4 ranks (6 experts flat over 4)"
grep -q "^#define SHARD_EXPERTS 2 " "$work/w4ep2/step.h" || die "w4ep2: 4 experts per EP rank over 2 ranks are not whole-expert shards of 2"
build w4bf16 "$tiny" float "${small[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=2 \
  --set training.grad_reduce_dtype=bf16 || exit 1
grep -q "rt_comm_reduce_scatter_start(.*, true, NULL" "$work/w4bf16/step.c" || die "bf16: no bf16 reduce-scatter in step.c"
(cd "$work" && "${mpirun[@]}" -np 4 ./w4bf16/build/train --data "$text" --metrics w4bf16.jsonl >/dev/null) ||
  die "4 rank run (bf16 wire)"
paste <(losses "$work/w1.jsonl") <(losses "$work/w4bf16.jsonl") | awk '
  { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r; if (n > 1 && d > 0) rounded = 1 }
  END { printf "1 rank fp32 vs 4 ranks bf16 wire: worst relative difference %.2e\n", worst
        exit (worst > 1e-2 || !rounded || n != 10) }' || die "bf16 wire: losses too far from fp32, or identical"
exit $fail
