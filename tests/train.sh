#!/usr/bin/env bash
# The generated training program, end to end on the cpu backend: compile, build, run.
#   usage: train.sh MTC SOURCE_DIR CHECK [sanitize]
# CHECK is one of
#   gradients  every parameter tensor's gradient against finite differences (double build),
#              for a dense + MoE(shared expert) + GQA model, a sigmoid/aux-free router variant,
#              and GELU with full recomputation
#   sharding   10 steps of one model and global batch on 1 rank and on 4 MPI ranks (fsdp 4 with
#              ep 2, with ep 4, and with ep 4 laid out as 2 nodes x 2 ranks: an EP group spanning
#              nodes), gradients reduced in fp32: the same loss at every step
#              within 1e-4 relative; the same with parameters kept gathered across 4 micro-batches
#              (reshard after_step: every group with ep 4 across 2 nodes, the dense groups or the
#              experts alone with ep 2), each kept buffer the plan's item; also with Muon and 6 experts in uneven whole-expert shards
#              (2, 2, 2, 0 on 4 ranks); with bf16 on the wire (the default), within 1e-2
#   policies   none, selective and full activation checkpointing, and full with the boundaries
#              offloaded to host memory: bitwise identical losses
#   checkpoints  10 steps straight = 5 steps, checkpoint, resume for 5 (bitwise); a save killed
#              by SIGKILL before its manifest resumes from the checkpoint before (bitwise); a
#              checkpoint saved on 4 ranks (fsdp 4, ep 2) resumes on 2 (fsdp 2, ep 1) within
#              1e-5, and so do flat expert shards (ep 4) resumed in whole experts and back; a
#              corrupt shard is refused with its name; non-finite steps are skipped, and K in a
#              row stop the run with the last good state saved; SIGUSR1 mid-run saves and stops,
#              and the resumed run equals the straight one (bitwise); --keep-checkpoints 2 keeps two
#   export     mtc export of a 2-rank checkpoint, read back by tests/safetensors_check.py (its own
#              safetensors and checkpoint readers): every tensor equals the master weights; with
#              --spec, gpt2-style (gpt2: fused, transposed c_attn), calib-moe (mixtral) and tiny-moe
#              with a gated shared expert (qwen2_moe, also from an EP 2 checkpoint), mla with and without
#              q-LoRA (deepseek_v3: the RoPE rows interleaved, as rope_interleave true reads them) as Hugging Face
#              directories: the family's names, the same values, a config.json that import-hf
#              reads; a model no family expresses and another spec's checkpoint are refused,
#              writing nothing
#   errors     a launch with the wrong world size, a missing data file, bad arguments; a run of
#              2^32 + 40 steps (its learning rate at step 2 is the peak, not the minimum) planned
#              with its boundaries on NVMe (the program warns that it keeps them in host memory)
#   imbalance  the MoE all-to-all in bounded rounds: moe_imbalance 1 (buffers of exactly the mean
#              rows, so any imbalance needs extra rounds) against its physical maximum (buffers
#              of the dropless worst case, never a second round), 2 ranks (ep 2, no
#              checkpointing) and 4 (ep 4, selective), fp32 wire: the same losses within 1e-5,
#              extra rounds counted in metrics.jsonl
#   memory     train --memory (no mpirun) prints {"hbm","host","host_pinned"} whose arena part is
#              step.h's; the start-up resident growth (VmHWM) of a real run matches it within 5%,
#              on 1 rank (Muon, full checkpointing with host offload) and on 2 (ep 2)
#   mla        tests/specs/mla.yaml (DeepSeek's multi-head latent attention) without and with
#              q-LoRA and under each checkpoint policy: every tensor's gradient against finite
#              differences (double), 1 vs 2 ranks (fsdp 2, ep 2) with fp32 on the wire, export
#              names; with q-LoRA 1 vs 4 ranks (fsdp 4, ep 4); and with YaRN (its softmax mscale²)
#   conventions  tests/specs/conventions.yaml (norm_eps, norm_topk_prob false, routed_scaling_factor)
#              and its variants (attention.bias qkv, qkvo; sigmoid router; qk-norm per head with selective checkpointing, and
#              full with full checkpointing; llama3 and YaRN RoPE scaling; Qwen2-MoE's gated shared
#              expert; DeepSeek-V3's group-limited routing; the sequence-wise balance loss with softmax and with
#              sigmoid + aux_free, 2 sequences a micro-batch): the double gradient check, and 1 vs 2 ranks (ep 2,
#              fp32 wire) within 1e-4
#   gpt        each GPT-style feature's spec in tests/specs (gelu-experts, learned-positions,
#              tied-embeddings, layernorm, biases, and gpt2-style with all of them): every tensor's
#              gradient against finite differences (double), and 10 steps on 1 rank against 2
#              (fsdp 2, ep 2 where it has experts), fp32 on the wire: the same loss within 1e-4; the
#              2-rank checkpoint through mtc export has the feature's tensors (and with ep 1 equals
#              its master weights)
#   text       tiny-moe on real English text (fortunes' cookie file) for its 300 steps on 2
#              ranks: the loss starts near ln 256 = 5.55 and ends below 2.5
#   text-muon  the same with training.optimizer=muon, ending within 0.05 of 1.934 (issue 13)
#   text-deepseek  tests/specs/deepseek-style.yaml (MLA, first dense layer, shared expert, sigmoid
#              router, aux-free with the sequence-wise balance loss) the same way: below 2.5
#   calibrate  tiny-moe on 1 rank with --profile (3 steps: 2 profiled), then mtc calibrate of the
#              cpu preset from that profile: every op class the cost model prices is in the
#              profile with its seconds and FLOPs or bytes (the GEMM and attention FLOPs those
#              of the shapes, computed here by hand), the calibrated preset loads by its file
#              name (MTC_PRESET_DIR), each fitted factor is FLOPs / (50 GFLOP/s x seconds) of the
#              profile, and the plan's prediction moves with the factors (a preset fitted to
#              the profile with every second doubled predicts a longer step). No wall-clock bound.
#   muon-traffic  a PMPI interposer (tests/pmpi/pmpi_count.c) counts what each rank hands to MPI:
#              on 2 ranks (ep 1, 24 experts) Muon adds less than 3/4 of the dense Muon matrices'
#              bytes per rank and step over AdamW (experts move nothing), and at most 2
#              collectives a step (every dense group's matrices in one all-to-all and one back)
# With "sanitize", the programs are built with AddressSanitizer and UBSan.
set -u
mtc=$(realpath "$1"); src=$(realpath "$2"); check=$3; san=${4:-}
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1)
export OPENBLAS_NUM_THREADS=1 # one thread per rank: ranks share the cores
# OpenBLAS falls back to its generic (Prescott) kernels on CPUs it cannot name, as on virtual
# machines; name the newest kernel set this CPU's flags allow (a third less time on CI's VM)
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=Haswell; fi
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/mtc-train.XXXXXX"); trap 'rm -rf "$work"' EXIT
if [ "$san" = sanitize ]; then
  export CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  export LDFLAGS="-fsanitize=address,undefined" ASAN_OPTIONS=detect_leaks=0
fi
text=/usr/share/games/fortunes/cookie
if [ ! -r "$text" ]; then
  echo "FAIL: $text is missing; install Debian's fortunes package (apt-get install fortunes)"; exit 1
fi
fail=0
die() { echo "FAIL: $*"; fail=1; }

# build NAME SPEC REAL [--set ...]: compile SPEC into $work/NAME and build it
build() {
  local name=$1 spec=$2 real=$3; shift 3
  "$mtc" compile "$spec" -o "$work/$name" "$@" >/dev/null || { die "mtc compile $spec $*"; return 1; }
  "$mtc" build "$work/$name" --real "$real" >"$work/$name.build.log" 2>&1 ||
    { cat "$work/$name.build.log"; die "mtc build $name"; return 1; }
  grep -q "warning:" "$work/$name.build.log" && { grep "warning:" "$work/$name.build.log"; die "$name: compiler warnings"; }
  return 0
}

# losses FILE: the "loss" of every metrics line, one per line
losses() { sed -n 's/.*"loss":\([^,]*\),.*/\1/p' "$1"; }

tiny=$src/specs/tiny-moe.yaml
small=(--set training.seq_len=64 --set training.steps=10 --set training.warmup_steps=2)

case $check in
gradients)
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
  done ;;
gpt)
  # NAME[:SEED]: the data seed of the gradient check where the default one puts a token's top-k
  # router scores within the finite-difference step of a tie (layernorm: a selection flips at the
  # default seed 1, so its router gradient is not that of a smooth function there)
  for fs in gelu-experts learned-positions tied-embeddings layernorm:3 biases gpt2-style; do
    f=${fs%%:*} seed=1; [ "$f" != "$fs" ] && seed=${fs#*:}
    spec=$src/tests/specs/$f.yaml
    if build "gc-$f" "$spec" double; then
      out=$("$work/gc-$f/build-double/train" --data "$text" --grad-check --seed "$seed" 2>&1); rc=$?
      echo "$f: $(echo "$out" | tail -1)"
      [ $rc -eq 0 ] || { echo "$out" | grep MISMATCH; die "$f: gradients differ from finite differences"; }
      n=$(echo "$out" | grep -c "^grad-check model\|^grad-check lm_head")
      want=$(sed -n '/^const RtTensor/,/^};/p' "$work/gc-$f/step.c" | grep -c '^    {"')
      [ "$n" -eq "$want" ] && [ "$n" -gt 10 ] || die "$f: checked $n tensors, the program has $want"
    fi
    ep=1; grep -q "^  moe:" "$spec" && ep=2
    fp32=(--set training.grad_reduce_dtype=fp32)
    build "$f-1" "$spec" float "${fp32[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 || continue
    build "$f-2" "$spec" float "${fp32[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=$ep || continue
    grep -q "^#define PLAN_EP $ep$" "$work/$f-2/step.h" || die "$f-2: the plan did not take ep $ep"
    (cd "$work" && "./$f-1/build/train" --data "$text" --metrics "$f-1.jsonl" >/dev/null) || { die "$f: 1 rank run"; continue; }
    (cd "$work" && "${mpirun[@]}" -np 2 "./$f-2/build/train" --data "$text" --metrics "$f-2.jsonl" --checkpoint-dir "ck-$f" \
      >/dev/null) || { die "$f: 2 rank run"; continue; }
    # mtc export round-trips every tensor of the feature (HF names: embed_positions, the biases;
    # no lm_head.weight when tied)
    "$mtc" export "$work/ck-$f" "$work/$f.safetensors" >/dev/null || die "$f: mtc export"
    # (safetensors_check.py reads checkpoints of ep 1: with ep 2 the names are checked below)
    [ $ep -eq 2 ] || python3 "$src/tests/safetensors_check.py" "$work/ck-$f/step-00000010" "$work/$f.safetensors" >/dev/null ||
      die "$f: exported tensors differ from the checkpoint"
    names=$(head -c 100000 "$work/$f.safetensors" | tr ',{' '\n\n' | sed -n 's/^"\([^"]*\)":.*/\1/p')
    case $f in
      learned-positions) echo "$names" | grep -qx "model.embed_positions.weight" || die "$f: no embed_positions in the export" ;;
      tied-embeddings|gpt2-style) echo "$names" | grep -qx "lm_head.weight" && die "$f: a tied model exported lm_head.weight"
        echo "$names" | grep -qx "model.embed_tokens.weight" || die "$f: no embed_tokens in the export" ;;
      gelu-experts) echo "$names" | grep -qx "model.layers.1.mlp.experts.3.up_proj.weight" || die "$f: no expert 3 in the export"
        echo "$names" | grep -q "gate_proj" && die "$f: GELU experts exported a gate_proj" ;;
      biases) echo "$names" | grep -qx "model.layers.1.self_attn.q_proj.bias" || die "$f: no q_proj.bias in the export" ;;
    esac
    paste <(losses "$work/$f-1.jsonl") <(losses "$work/$f-2.jsonl") | awk -v f=$f -v ep=$ep '
      { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r
        if (r > 1e-4) { printf "step %d: 1 rank %s, 2 ranks %s\n", n, $1, $2; bad = 1 } }
      END { printf "%s: 1 vs 2 ranks (fsdp 2, ep %s), fp32 wire: %d steps, worst relative difference %.2e\n", f, ep, n, worst
            exit (bad || n != 10) }' || die "$f: losses differ between 1 and 2 ranks"
  done ;;
sharding)
  small+=(--set training.grad_reduce_dtype=fp32)
  build w1 "$tiny" float "${small[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 || exit 1
  (cd "$work" && ./w1/build/train --data "$text" --metrics w1.jsonl >w1.log) || die "1 rank run"
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
    grep -q "experts: [0-9]* of them, split" "$work/w4u/plan.txt" &&
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
          exit (worst > 1e-2 || !rounded || n != 10) }' || die "bf16 wire: losses too far from fp32, or identical" ;;
policies)
  # full-pf3: the plan's prefetch depth 3 (4 gathered units in flight or computing), not the search's
  for ac in none selective full full-host full-pf3; do
    off=none; [ $ac = full-host ] && off=host
    pf=auto; [ $ac = full-pf3 ] && pf=3
    build "ac-$ac" "$tiny" float "${small[@]}" --set training.steps=4 --set cluster.gpus_per_node=4 --set plan.fsdp=4 \
      --set plan.ep=2 --set plan.activation_checkpoint=${ac%-*} --set plan.offload_activations=$off --set plan.prefetch=$pf ||
      continue
    grep -q "^#define CHECKPOINT_POLICY \"${ac%-*}\"" "$work/ac-$ac/step.h" || die "ac-$ac: policy not in step.h"
    (cd "$work" && "${mpirun[@]}" -np 4 "./ac-$ac/build/train" --data "$text" --metrics "ac-$ac.jsonl" >/dev/null) ||
      die "run with $ac checkpointing"
  done
  [ "$(losses "$work/ac-none.jsonl" | wc -l)" -eq 4 ] || die "expected 4 steps of losses"
  cmp -s <(losses "$work/ac-none.jsonl") <(losses "$work/ac-selective.jsonl") || die "selective differs from none"
  cmp -s <(losses "$work/ac-none.jsonl") <(losses "$work/ac-full.jsonl") || die "full differs from none"
  cmp -s <(losses "$work/ac-none.jsonl") <(losses "$work/ac-full-host.jsonl") || die "full with host offload differs from none"
  cmp -s <(losses "$work/ac-none.jsonl") <(losses "$work/ac-full-pf3.jsonl") || die "full with prefetch 3 differs from none"
  grep -q "A(GATHERED3)" "$work/ac-full-pf3/step.c" && ! grep -q "GATHERED4" "$work/ac-full-pf3/step.c" ||
    die "full-pf3: expected a pool of 4 gathered units (GATHERED0-3)"
  # each unit's gathers start 3 units ahead: layer 2's (unit 3) while the embedding computes
  sed -n '/^real step_forward/,/rt_embedding_forward/p' "$work/ac-full-pf3/step.c" | grep -q "L2_DENSE_\(MASTER\|PARAM\)" ||
    die "full-pf3: unit 3 is not prefetched before layer 0 runs"
  grep -q "rt_offload_load" "$work/ac-full-host/step.c" || die "full-host: no offload in step.c"
  grep -c "layer[0-9]*_forward(c, true)" "$work/ac-full/step.c" | grep -qx 4 || die "full: expected 4 recomputed layers"
  grep -q "layer[0-9]*_forward(c, true)" "$work/ac-none/step.c" && die "none: recomputes"
  echo "none, selective, full checkpointing, full with host offload, full with prefetch 3: $(losses "$work/ac-none.jsonl" | tr '\n' ' ')identical" ;;
checkpoints)
  ck=(--set training.steps=10 --set training.warmup_steps=2 --set training.seq_len=64 --set training.grad_reduce_dtype=fp32)
  build c2 "$tiny" float "${ck[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 || exit 1
  run2() { (cd "$work" && "${mpirun[@]}" -np 2 ./c2/build/train --data "$text" "$@" >/dev/null 2>&1); }
  strip() { sed 's/,"tokens_per_s".*//' "$1"; }
  run2 --metrics straight.jsonl || die "straight run"
  run2 --metrics resumed.jsonl --steps 5 --checkpoint-dir "$work/ckA" || die "first half"
  [ -f "$work/ckA/step-00000005/manifest.json" ] || die "no checkpoint at step 5"
  run2 --metrics resumed.jsonl --checkpoint-dir "$work/ckA" || die "resumed half"
  cmp -s <(strip "$work/straight.jsonl") <(strip "$work/resumed.jsonl") && echo "10 steps = 5 + checkpoint + 5, bit for bit" ||
    die "a resumed run differs from the straight one"
  # killed mid-save: step 6's shards exist, its manifest does not; resume takes step 3
  run2 --metrics killed.jsonl --checkpoint-dir "$work/ckB" --checkpoint-every 3 --inject-kill-at-save 6 && die "the kill did not happen"
  [ -f "$work/ckB/step-00000003/manifest.json" ] && [ ! -f "$work/ckB/step-00000006/manifest.json" ] &&
    ls "$work/ckB/step-00000006/"rank-*.bin >/dev/null 2>&1 || die "expected step 3 complete and step 6 without manifest"
  printf '{"step":7,"loss":4.9' >>"$work/killed.jsonl" # a line cut by a kill
  out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2/build/train --data "$text" --metrics killed.jsonl --checkpoint-dir "$work/ckB" 2>&1)
  echo "$out" | grep -q "resumed from .*step-00000003" || die "after the kill: $out"
  # the resume dropped the lines of steps 4-6 and the cut line: the file is the straight run's
  cmp -s <(strip "$work/straight.jsonl") <(strip "$work/killed.jsonl") &&
    echo "a save killed by SIGKILL resumes from the checkpoint before it, bit for bit, and metrics.jsonl reads as one run" ||
    die "after the kill, the metrics differ from the straight run's"
  # resharding: saved on 4 ranks, resumed on 2
  build c4 "$tiny" float "${ck[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=2 || exit 1
  build c2e1 "$tiny" float "${ck[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=1 || exit 1
  (cd "$work" && "${mpirun[@]}" -np 4 ./c4/build/train --data "$text" --metrics r4.jsonl >/dev/null &&
    "${mpirun[@]}" -np 4 ./c4/build/train --data "$text" --metrics r42.jsonl --steps 5 --checkpoint-dir ckC >/dev/null &&
    "${mpirun[@]}" -np 2 ./c2e1/build/train --data "$text" --metrics r42.jsonl --checkpoint-dir ckC >/dev/null) ||
    die "reshard runs"
  paste <(losses "$work/r4.jsonl") <(losses "$work/r42.jsonl") | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
    END { printf "saved on 4 ranks (ep 2), resumed on 2 (ep 1): worst relative difference %.2e over %d steps\n", worst, n
          exit (worst > 1e-5 || n != 10) }' || die "resharded run differs by more than 1e-5"
  # flat and whole-expert shards (the manifest's per / block): saved flat on 4 ranks (ep 4: one rank per
  # shard group) resumed in whole experts on 2 (ep 1: 4 experts each), and the other way
  build c4e4 "$tiny" float "${ck[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=4 || exit 1
  grep -q '"per"' "$work/ckC/step-00000005/manifest.json" || die "ckC: the manifest does not record whole-expert shards"
  (cd "$work" && "${mpirun[@]}" -np 4 ./c4e4/build/train --data "$text" --metrics rfw.jsonl --steps 5 --checkpoint-dir ckE >/dev/null &&
    "${mpirun[@]}" -np 2 ./c2e1/build/train --data "$text" --metrics rfw.jsonl --checkpoint-dir ckE >/dev/null &&
    "${mpirun[@]}" -np 2 ./c2e1/build/train --data "$text" --metrics rwf.jsonl --steps 5 --checkpoint-dir ckF >/dev/null &&
    "${mpirun[@]}" -np 4 ./c4e4/build/train --data "$text" --metrics rwf.jsonl --checkpoint-dir ckF >/dev/null) ||
    die "flat <-> whole-expert reshard runs"
  for r in rfw rwf; do
    what="saved flat (4 ranks, ep 4), resumed in whole experts (2, ep 1)"
    [ $r = rwf ] && what="saved in whole experts (2 ranks, ep 1), resumed flat (4, ep 4)"
    paste <(losses "$work/r4.jsonl") <(losses "$work/$r.jsonl") | awk -v what="$what" '
      { n++; d = $1 - $2; if (d < 0) d = -d; q = d / $1; if (q > worst) worst = q }
      END { printf "%s: worst relative difference %.2e over %d steps\n", what, worst, n
            exit (worst > 1e-5 || n != 10) }' || die "$r: resharded run differs by more than 1e-5"
  done
  # flat over several ranks (plan_expert_per: 6 experts do not divide over 4 ranks, ep 1) and whole
  # (3 experts each over 2 ranks), both ways, against the straight 4-rank run
  six=(--set model.moe.experts=6)
  build c4x6 "$tiny" float "${ck[@]}" "${six[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=1 || exit 1
  build c2x6 "$tiny" float "${ck[@]}" "${six[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=1 || exit 1
  (cd "$work" && "${mpirun[@]}" -np 4 ./c4x6/build/train --data "$text" --metrics r6.jsonl >/dev/null &&
    "${mpirun[@]}" -np 4 ./c4x6/build/train --data "$text" --metrics r6fw.jsonl --steps 5 --checkpoint-dir ckG >/dev/null &&
    "${mpirun[@]}" -np 2 ./c2x6/build/train --data "$text" --metrics r6fw.jsonl --checkpoint-dir ckG >/dev/null &&
    "${mpirun[@]}" -np 2 ./c2x6/build/train --data "$text" --metrics r6wf.jsonl --steps 5 --checkpoint-dir ckH >/dev/null &&
    "${mpirun[@]}" -np 4 ./c4x6/build/train --data "$text" --metrics r6wf.jsonl --checkpoint-dir ckH >/dev/null) ||
    die "6 experts: flat (4 ranks) <-> whole-expert (2 ranks) reshard runs"
  ! grep -q '"per"' "$work/ckG/step-00000005/manifest.json" && grep -q '"per": *3' "$work/ckH/step-00000005/manifest.json" ||
    die "6 experts: the manifests do not record flat (4 ranks) and whole-expert shards of 3 (2 ranks)"
  for r in r6fw r6wf; do
    what="6 experts, saved flat over 4 ranks, resumed in whole experts (3 on each of 2)"
    [ $r = r6wf ] && what="6 experts, saved in whole experts (3 on each of 2 ranks), resumed flat over 4"
    paste <(losses "$work/r6.jsonl") <(losses "$work/$r.jsonl") | awk -v what="$what" '
      { n++; d = $1 - $2; if (d < 0) d = -d; q = d / $1; if (q > worst) worst = q }
      END { printf "%s: worst relative difference %.2e over %d steps\n", what, worst, n
            exit (worst > 1e-5 || n != 10) }' || die "$r: resharded run differs by more than 1e-5"
  done
  # a checkpoint of another model or optimizer is refused
  build c2h64 "$tiny" float "${ck[@]}" --set model.hidden=64 --set cluster.gpus_per_node=2 --set plan.fsdp=2 || exit 1
  out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2h64/build/train --data "$text" --metrics y.jsonl --checkpoint-dir ckA 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "error: resuming from .*: tensor model[a-z_.0-9]* is [0-9]*x128 in the checkpoint and [0-9]*x64 in this program; expected a checkpoint of this program's model" || die "other model resumed: exit $rc, $out"
  build c2mu "$tiny" float "${ck[@]}" --set training.optimizer=muon --set cluster.gpus_per_node=2 --set plan.fsdp=2 || exit 1
  out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2mu/build/train --data "$text" --metrics y.jsonl --checkpoint-dir ckA 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "trained with adamw, but this program uses muon" || die "other optimizer resumed: exit $rc, $out"
  # a corrupt shard is refused with its name
  f=$work/ckA/step-00000010/rank-00001.bin
  printf '\x42' | dd of="$f" bs=1 seek=300 conv=notrunc status=none
  out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2/build/train --data "$text" --metrics x.jsonl --checkpoint-dir ckA 2>&1); rc=$?
  [ $rc -ne 0 ] && echo "$out" | grep -q "rank-00001.bin: checksum mismatch" && echo "a corrupt shard is refused by name" ||
    die "corrupt shard: exit $rc, $out"
  # guard rails
  run2 --metrics nan1.jsonl --inject-nan 3:1 || die "one non-finite step should be skipped, not fatal"
  grep -c '"skipped":true' "$work/nan1.jsonl" | grep -qx 1 && grep -q '"step":3,.*"skipped":true' "$work/nan1.jsonl" ||
    die "step 3 not marked skipped"
  out=$(cd "$work" && "${mpirun[@]}" -np 2 ./c2/build/train --data "$text" --metrics nan2.jsonl --inject-nan 4:100 --max-skips 3 \
    --checkpoint-dir ckD 2>&1); rc=$?
  [ $rc -eq 1 ] && echo "$out" | grep -q "3 consecutive steps had a non-finite" && [ -f "$work/ckD/step-00000003/manifest.json" ] &&
    echo "non-finite steps: one is skipped; 3 in a row stop the run with step 3's state saved" ||
    die "guard rail: exit $rc, $out"
  # SIGUSR1 mid-run (what launch.sbatch has Slurm send before the time limit; mpirun forwards
  # it): the run saves at the end of the step and stops with status 0; --keep-checkpoints 2
  # leaves the newest two; resuming from it gives the straight run's losses bit for bit
  build c2l "$tiny" float "${ck[@]}" --set training.steps=400 --set cluster.gpus_per_node=2 --set plan.fsdp=2 || exit 1
  (cd "$work" && exec "${mpirun[@]}" -np 2 ./c2l/build/train --data "$text" --metrics sig.jsonl --checkpoint-dir ckS \
    --checkpoint-every 2 --keep-checkpoints 2 >sig.log 2>&1) & pid=$!
  for _ in $(seq 1200); do grep -Eq '^step +5/' "$work/sig.log" 2>/dev/null && break; sleep 0.1; done
  kill -USR1 $pid; wait $pid; rc=$?
  at=$(ls "$work/ckS" | grep '^step-' | tail -1 | sed 's/^step-0*//')
  [ $rc -eq 0 ] && grep -q "stopped after step $at on SIGUSR1; run the same command again" "$work/sig.log" &&
    [ "$at" -lt 400 ] && [ -f "$work/ckS/step-$(printf %08d "$at")/manifest.json" ] && [ "$(ls "$work/ckS" | grep -c '^step-')" -eq 2 ] ||
    die "SIGUSR1: exit $rc, checkpoints $(ls "$work/ckS" | tr '\n' ' '), $(tail -3 "$work/sig.log")"
  (cd "$work" && "${mpirun[@]}" -np 2 ./c2l/build/train --data "$text" --metrics sig.jsonl --checkpoint-dir ckS \
    --steps $((at + 3)) >/dev/null && "${mpirun[@]}" -np 2 ./c2l/build/train --data "$text" --metrics sig0.jsonl \
    --steps $((at + 3)) >/dev/null) || die "resume after SIGUSR1"
  cmp -s <(strip "$work/sig0.jsonl") <(strip "$work/sig.jsonl") &&
    echo "SIGUSR1 at step $at: saved, stopped, resumed bit for bit; --keep-checkpoints 2 kept two" ||
    die "the run resumed after SIGUSR1 differs from the straight one" ;;
export)
  build x2 "$tiny" float "${small[@]}" --set training.steps=3 --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=1 || exit 1
  (cd "$work" && "${mpirun[@]}" -np 2 ./x2/build/train --data "$text" --metrics x.jsonl --checkpoint-dir ckX >/dev/null) ||
    die "training run"
  "$mtc" export "$work/ckX" "$work/model.safetensors" || die "mtc export"
  python3 "$src/tests/safetensors_check.py" "$work/ckX/step-00000003" "$work/model.safetensors" || die "exported tensors"
  out=$("$mtc" export "$work/ckX" "$work/ckX/step-00000003/rank-00000.bin" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "inside a checkpoint directory" || die "export into the checkpoint: $out"
  out=$("$mtc" export "$work/no-such-dir" "$work/y.safetensors" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "no complete checkpoint here" || die "export of a missing checkpoint: $out"
  # --spec: a Hugging Face model directory per family, read back in the family's names (mapped by
  # safetensors_check.py's own tables); a model no family expresses, or another spec's, writes nothing
  hf_spec() { # NAME SPEC FAMILY SETS...: 1 rank, 3 steps, export --spec, check names and values
    local name=$1 spec=$2 family=$3; shift 3
    build "$name" "$spec" float "${small[@]}" --set training.steps=3 --set cluster.gpus_per_node=1 --set plan.fsdp=1 \
      "$@" || return 1
    (cd "$work" && "./$name/build/train" --data "$text" --metrics "$name.jsonl" --checkpoint-dir "ck-$name" >/dev/null) ||
      { die "$name: training run"; return 1; }
    "$mtc" export "$work/ck-$name" "$work/hf-$name" --spec "$spec" "${small[@]}" --set training.steps=3 \
      --set cluster.gpus_per_node=1 --set plan.fsdp=1 "$@" >/dev/null || { die "$name: mtc export --spec"; return 1; }
    python3 "$src/tests/safetensors_check.py" "$work/ck-$name/step-00000003" "$work/hf-$name/model.safetensors" "$family" ||
      die "$name: exported $family tensors differ from the checkpoint"
    grep -q "\"model_type\": \"$family\"" "$work/hf-$name/config.json" || die "$name: config.json is not $family's"
    "$mtc" import-hf "$work/hf-$name/config.json" -o "$work/hf-$name.yaml" && "$mtc" check "$work/hf-$name.yaml" >/dev/null ||
      die "$name: the exported config.json does not import"
  }
  hf_spec hf-gpt2 "$src/tests/specs/gpt2-style.yaml" gpt2 --set training.seq_len=32
  hf_spec hf-mixtral "$src/tests/specs/calib-moe.yaml" mixtral --set model.layers=2 --set model.moe.experts=4
  hf_spec hf-qwen2 "$tiny" qwen2_moe --set model.moe.shared_expert_gate=true --set model.layers=2
  # DeepSeek-V3 (MLA with and without q-LoRA): the RoPE rows written interleaved (rope_interleave true)
  dsx=(--set model.moe.router=sigmoid --set model.moe.router_bias=true --set model.moe.load_balance=aux_free)
  hf_spec hf-dsv3 "$src/tests/specs/mla.yaml" deepseek_v3 "${dsx[@]}" --set model.attention.q_lora_rank=12
  hf_spec hf-dsv3q "$src/tests/specs/mla.yaml" deepseek_v3 "${dsx[@]}"
  # from a 2-rank checkpoint with its experts in EP 2: against mtc export's own-name file of it
  ep2=("${small[@]}" --set training.steps=3 --set model.moe.shared_expert_gate=true --set model.layers=2
       --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=2)
  if build hf-ep2 "$tiny" float "${ep2[@]}"; then
    (cd "$work" && "${mpirun[@]}" -np 2 ./hf-ep2/build/train --data "$text" --metrics ep2.jsonl --checkpoint-dir ck-ep2 \
      >/dev/null) || die "hf-ep2: training run"
    "$mtc" export "$work/ck-ep2" "$work/ep2.safetensors" >/dev/null &&
      "$mtc" export "$work/ck-ep2" "$work/hf-ep2" --spec "$tiny" "${ep2[@]}" >/dev/null &&
      python3 "$src/tests/safetensors_check.py" "$work/ep2.safetensors" "$work/hf-ep2/model.safetensors" qwen2_moe ||
      die "hf-ep2: the qwen2_moe export of an EP 2 checkpoint differs from its own-name export"
  fi
  out=$("$mtc" export "$work/ckX" "$work/hf-none" --spec "$tiny" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "tiny-moe.yaml:15:.*no Hugging Face family expresses this model: shared experts without a gate" &&
    [ ! -e "$work/hf-none" ] || die "export --spec of an unexpressible model: exit $rc, $out"
  out=$("$mtc" export "$work/ck-hf-mixtral" "$work/hf-other" --spec "$src/tests/specs/gpt2-style.yaml" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "manifest.json: tensor model.embed_tokens.weight .*; expected the checkpoint of a program compiled from" &&
    [ ! -e "$work/hf-other" ] ||
    die "export --spec of another model's checkpoint: exit $rc, $out"
  printf '\x42' | dd of="$work/ckX/step-00000003/rank-00000.bin" bs=1 seek=400 conv=notrunc status=none
  echo precious >"$work/y.safetensors"
  out=$("$mtc" export "$work/ckX" "$work/y.safetensors" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "rank-00000.bin: checksum mismatch" && grep -qx precious "$work/y.safetensors" &&
    [ ! -e "$work/y.safetensors.tmp" ] || die "export of a corrupt checkpoint: exit $rc, $out" ;;
errors)
  build e4 "$tiny" float "${small[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 || exit 1
  out=$(cd "$work" && "${mpirun[@]}" -np 2 ./e4/build/train --data "$text" 2>&1); rc=$?
  [ $rc -ne 0 ] || die "a 2-rank launch of a 4-rank plan succeeded"
  echo "$out" | grep -q "planned for 4 ranks.*launched with 2.*mtc compile tiny-moe.yaml --set" ||
    die "world-size message: $out"
  build e1 "$tiny" float "${small[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 || exit 1
  out=$("$work/e1/build/train" --data "$work/no-such-file" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "no-such-file" || die "missing data: exit $rc, $out"
  out=$("$work/e1/build/train" --data "$text" --steps zero 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -- "--steps expects a positive integer" || die "bad --steps: exit $rc, $out"
  out=$("$work/e1/build/train" --data "$text" --steps 11 --metrics "$work/past.jsonl" 2>&1); rc=$?
  steps=$(sed -n 's/^#define TRAIN_STEPS \([0-9]*\).*/\1/p' "$work/e1/step.h")
  if [ "$steps" -lt 11 ]; then
    [ $rc -eq 0 ] && echo "$out" | grep -q "note: --steps 11 is past the spec's training.steps $steps" || die "--steps past training.steps: exit $rc, $out"
  else die "expected e1's training.steps below 11, not $steps"
  fi
  out=$("$work/e1/build/train" --data "$text" --steps 99999999999999999999 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -- "--steps is too large" || die "huge --steps (clamped?): exit $rc, $out"
  out=$("$work/e1/build/train" --data "$text" --seed 99999999999999999999999 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -- "--seed is too large" || die "huge --seed (clamped?): exit $rc, $out"
  out=$("$work/e1/build/train" --data "$text" --checkpoint-every 99999999999999999999 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -- "--checkpoint-every expects a positive integer" || die "huge --checkpoint-every: exit $rc, $out"
  out=$("$work/e1/build/train" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -- "--data PATH is required" || die "no --data: exit $rc, $out"
  out=$("$work/e1/build/train" --data "$text" --grad-check 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "needs the double build" || die "--grad-check in float: exit $rc, $out"
  out=$("$mtc" build "$work/no-such-dir" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "expected the directory .mtc compile. wrote" || die "mtc build of a missing dir: $out"
  out=$("$work/e1/build/train" --data "$text" --checkpoint-dir "$text/x" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "expected a writable directory" || die "bad --checkpoint-dir at start: $out"
  out=$("$work/e1/build/train" --data "$text" --metrics "$work/no/such/dir/m.jsonl" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "expected a writable file path" || die "bad --metrics: $out"
  out=$("$work/e1/build/train" --bogus 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "unknown option '--bogus'" || die "unknown option: $out"
  # --profile: checked at start (not after the run), never written over data or through a link,
  # and a run that measured no step says so instead of exiting 0 without the file
  cp "$text" "$work/prof-data.txt"; before=$(cksum < "$work/prof-data.txt")
  out=$("$work/e1/build/train" --data "$text" --steps 3 --metrics /dev/null --profile "$work/prof-data.txt" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "not a profile of mtc's" && [ "$(cksum < "$work/prof-data.txt")" = "$before" ] &&
    ! echo "$out" | grep -q "^step" || die "--profile over a data file: exit $rc, $out"
  out=$("$work/e1/build/train" --data "$text" --steps 3 --metrics /dev/null --profile "$work/no/such/dir/p.json" 2>&1); rc=$?
  [ $rc -eq 2 ] && ! echo "$out" | grep -q "^step" || die "an unwritable --profile not refused at start: exit $rc, $out"
  ln -sf prof.json "$work/prof-link.json"
  out=$("$work/e1/build/train" --data "$text" --steps 3 --metrics /dev/null --profile "$work/prof-link.json" 2>&1); rc=$?
  [ $rc -eq 2 ] && [ ! -e "$work/prof.json" ] || die "--profile through a link: exit $rc, $out"
  out=$("$work/e1/build/train" --data "$text" --steps 1 --metrics /dev/null --profile "$work/prof.json" 2>&1); rc=$?
  [ $rc -eq 1 ] && echo "$out" | grep -q "measured no step" && [ ! -e "$work/prof.json" ] ||
    die "--profile with no timed step: exit $rc, $out"
  # training.steps past 2^31 (the key allows 2^40): a 64-bit schedule (issue 16 items 10 and 13)
  build long "$tiny" float "${small[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 --set training.steps=4294967336 \
    --set training.warmup_steps=0 --set plan.activation_checkpoint=full --set plan.offload_activations=nvme \
    --set "cluster.nvme.capacity=1 TB" --set "cluster.nvme.bandwidth=5 GB/s" || exit 1
  out=$(cd "$work" && ./long/build/train --data "$text" --steps 2 --metrics long.jsonl 2>&1); rc=$?
  [ $rc -eq 0 ] && echo "$out" | grep -q "warning: the plan puts the layer boundaries on NVMe, but this program keeps them in host memory" ||
    die "NVMe plan: exit $rc, $out"
  grep -q '^{"step":2,.*"lr":0.003,' "$work/long.jsonl" && echo "$out" | grep -q "step     2/2 " ||
    die "2^32 + 40 steps: expected the peak learning rate 0.003 at step 2: $(cat "$work/long.jsonl")"
  [ $fail -eq 0 ] && echo "ok: world-size, data and argument errors are refused with their reasons" ;;
imbalance)
  im=("${small[@]}" --set training.grad_reduce_dtype=fp32)
  for ep in 2 4; do
    max=$((ep * (2 < 8 / ep ? 2 : 8 / ep) / 2)) # ep x min(top_k, experts / ep) / top_k (tiny-moe: 8 experts, top-2)
    ac=none; [ $ep = 4 ] && ac=selective # the backward rebuilds a round from saved rows, or after recomputing
    for imb in 1 $max; do
      build "i$ep-$imb" "$tiny" float "${im[@]}" --set cluster.gpus_per_node=$ep --set plan.fsdp=$ep --set plan.ep=$ep \
        --set plan.moe_imbalance=$imb --set plan.activation_checkpoint=$ac || continue
      (cd "$work" && "${mpirun[@]}" -np $ep "./i$ep-$imb/build/train" --data "$text" --metrics "i$ep-$imb.jsonl" >/dev/null) ||
        die "ep $ep, moe_imbalance $imb: run"
    done
    cap1=$(sed -n 's/^#define MOE_CAP_ROWS \([0-9]*\) .*/\1/p' "$work/i$ep-1/step.h")
    capm=$(sed -n 's/^#define MOE_CAP_ROWS \([0-9]*\) .*/\1/p' "$work/i$ep-$max/step.h")
    mean=$(sed -n 's/^#define MOE_MEAN_ROWS \([0-9]*\) .*/\1/p' "$work/i$ep-1/step.h")
    [ "$cap1" = "$mean" ] && [ "$capm" = $((max * mean)) ] || die "ep $ep: buffers of $cap1 and $capm rows, mean $mean"
    python3 - "$work/i$ep-1.jsonl" "$work/i$ep-$max.jsonl" "$ep" <<'PY' || die "ep $ep: bounded rounds differ from unbounded buffers"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 10, (len(a), len(b))
worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))
extra = sum(x["moe_extra_rounds"] for x in a)
print(f"ep {sys.argv[3]}: buffers of the mean vs the worst case: {extra} extra rounds over 10 steps, busiest rank "
      f"{max(x['moe_load'] for x in a):.2f} x the mean; worst relative loss difference {worst:.1e}")
assert worst <= 1e-5, worst
assert extra > 0 and all(y["moe_extra_rounds"] == 0 for y in b)
assert all(x["moe_load"] >= 1 for x in a) and a[0]["moe_load"] == b[0]["moe_load"]  # the same routing at step 1
PY
  done ;;
memory)
  # a plan big enough that the start-up allocations dominate the process's other memory
  mem=(--set training.seq_len=2048 --set training.global_batch=4 --set model.layers=6 --set training.steps=2
       --set training.warmup_steps=1)
  build m1 "$tiny" float "${mem[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 --set training.optimizer=muon \
    --set plan.activation_checkpoint=full --set plan.offload_activations=host || exit 1
  build m2 "$tiny" float "${mem[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=2 || exit 1
  for m in m1 m2; do
    js=$("$work/$m/build/train" --memory) || { die "$m: train --memory failed"; continue; }
    def() { sed -n "s/^#define $1 \\([0-9]*\\).*/\\1/p" "$work/$m/step.h"; }
    arena=$(def ARENA_ELEMS) host=$(def HOST_ELEMS) state=$(def STATE_ELEMS) on_host=$(def STATE_ON_HOST)
    acts=$(def ACT_ELEMS)
    python3 -c "
import json, sys
j = json.loads(sys.argv[1]); arena, host, state, on_host, acts = (int(x) for x in sys.argv[2:7])
arena, host, state = (arena + acts) * 4, host * 4, state * 4   # the cpu build's act is its real
hbm = arena + (0 if on_host else state)                    # the cpu build: its memory stands in for HBM
pinned = host                                              # and for pinned host memory (the host arena: the state in it when on the host)
assert set(j) == {'hbm', 'host', 'host_pinned'}, j
assert j['hbm'] == hbm, (j, hbm)
assert j['host_pinned'] == pinned and j['host'] >= pinned, (j, pinned)
assert j['host'] - pinned < 1 << 20, j                     # besides those: tokens and count arrays only
" "$js" "$arena" "$host" "$state" "$on_host" "$acts" ||
      die "$m: --memory $js does not match step.h (ARENA_ELEMS $arena, ACT_ELEMS $acts, HOST_ELEMS $host, STATE_ELEMS $state)"
    np=1; [ $m = m2 ] && np=2
    out=$(cd "$work" && "${mpirun[@]}" -np $np "./$m/build/train" --data "$text" --steps 1 --metrics "$m.jsonl" 2>&1) ||
      { echo "$out" | tail -5; die "$m: run"; continue; }
    line=$(echo "$out" | grep "^memory: start-up resident growth")
    echo "$m: $line"
    echo "$line" | awk '{ g = $5; a = $11; d = g - a; if (d < 0) d = -d
      exit !(g > 0 && a > 50e6 && d <= 0.05 * a) }' || die "$m: resident growth differs from --memory by more than 5%"
  done
  [ "$("$work/m1/build/train" --memory --data x 2>&1 >/dev/null)" != "" ] || die "--memory with other arguments accepted" ;;
text | text-muon)
  opt=adamw; [ "$check" = text-muon ] && opt=muon
  build tiny "$tiny" float --set training.optimizer=$opt || exit 1
  (cd "$work" && "${mpirun[@]}" -np 2 ./tiny/build/train --data "$text" --metrics tiny.jsonl | tail -3) || die "training run"
  first=$(losses "$work/tiny.jsonl" | head -1); last=$(losses "$work/tiny.jsonl" | tail -1)
  n=$(losses "$work/tiny.jsonl" | wc -l)
  echo "tiny-moe ($opt) on $text: $n steps, loss $first -> $last"
  awk -v a="$first" -v b="$last" -v n="$n" 'BEGIN { exit !(n == 300 && a > 5.0 && a < 6.0 && b < 2.5) }' ||
    die "expected 300 steps with the loss from ~5.55 to below 2.5"
  # issue 13's acceptance: Muon still trains, ending within 0.05 of 1.934 (1.9213 on the
  # 2-core sandbox, 2026-12-01)
  if [ "$opt" = muon ]; then
    awk -v b="$last" 'BEGIN { exit !(b > 1.934 - 0.05 && b < 1.934 + 0.05) }' ||
      die "expected Muon's last loss within 0.05 of 1.934"
  fi ;;
text-deepseek)
  # issue 15's loss acceptance: tests/specs/deepseek-style.yaml (MLA with q-LoRA, a first dense
  # layer, shared expert, sigmoid router with aux-free bias balancing and the sequence-wise
  # balance loss) on the same text, 300 steps on 2 ranks: from ~ln 256 to below 2.5
  build ds "$src/tests/specs/deepseek-style.yaml" float || exit 1
  grep -q "rt_mla_kv_backward" "$work/ds/step.c" && grep -q "rt_router_bias_update" "$work/ds/step.c" &&
    grep -q "rt_seq_aux_loss_backward" "$work/ds/step.c" || die "ds: step.c lacks MLA, the bias update or the sequence-wise loss"
  (cd "$work" && "${mpirun[@]}" -np 2 ./ds/build/train --data "$text" --metrics ds.jsonl | tail -3) || die "training run"
  losses "$work/ds.jsonl" | awk 'NR == 1 || NR % 25 == 0 { printf "step %d loss %s\n", NR, $1 }'
  first=$(losses "$work/ds.jsonl" | head -1); last=$(losses "$work/ds.jsonl" | tail -1)
  n=$(losses "$work/ds.jsonl" | wc -l)
  echo "deepseek-style on $text: $n steps, loss $first -> $last"
  awk -v a="$first" -v b="$last" -v n="$n" 'BEGIN { exit !(n == 300 && a > 5.0 && a < 6.0 && b < 2.5) }' ||
    die "expected 300 steps with the loss from ~5.55 to below 2.5" ;;
muon-traffic)
  # a PMPI interposer (tests/pmpi/pmpi_count.c, built here) counts the bytes each rank hands to MPI;
  # 2 ranks, ep 1, 24 experts: Muon's extra bytes per rank and step over AdamW stay below 3/4 of the
  # dense Muon matrices' bytes (experts are orthogonalized where they are held: they add nothing)
  mpicc -shared -fPIC -O1 -o "$work/libpmpi_count.so" "$src/tests/pmpi/pmpi_count.c" || { die "build the interposer"; exit 1; }
  steps=3
  for opt in adamw muon; do
    build "tr-$opt" "$tiny" float "${small[@]}" --set model.moe.experts=24 --set plan.fsdp=2 --set plan.ep=1 \
      --set training.optimizer=$opt || exit 1
    # (sanitize builds: the interposer is preloaded before ASan's runtime, which it does not
    # interpose — it only counts MPI calls — so ASan's link-order check is turned off)
    (cd "$work" && "${mpirun[@]}" -np 2 -x LD_PRELOAD="$work/libpmpi_count.so" -x PMPI_COUNT_OUT="$work/tr-$opt.count" \
      -x ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
      "./tr-$opt/build/train" --data "$text" --steps $steps >/dev/null) || die "$opt: run under the interposer"
  done
  # the dense Muon matrices: step.c's tensor table, Muon set and not routed (experts 0), 4 bytes a value
  dense=$(sed -n '/^const RtTensor/,/^};/p' "$work/tr-muon/step.c" |
    awk -F', ' '/^    \{"/ && $5 == 0 && $11 == "true" { n += $4 } END { print 4 * n }')
  python3 - "$work/tr-adamw.count" "$work/tr-muon.count" "$dense" $steps <<'PY' || die "Muon moves more than 3/4 of the dense matrices' bytes, or in more than 2 collectives a step"
import sys
def per_rank(p):
    return {int(r): (int(b), int(c)) for r, b, c in (l.split() for l in open(p))}
a, m, dense, steps = per_rank(sys.argv[1]), per_rank(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
assert sorted(a) == sorted(m) == [0, 1], (a, m)
for r in sorted(a):
    extra, calls = (m[r][0] - a[r][0]) / steps, (m[r][1] - a[r][1]) / steps
    print(f"rank {r}: Muon adds {extra / 1e3:.1f} kB and {calls:g} collectives per step over AdamW; dense Muon "
          f"matrices {dense / 1e3:.1f} kB ({extra / dense:.2f} of them; limit 0.75)")
    assert dense > 0 and extra < 0.75 * dense
    # the dense groups' matrices in one gather and one return a step; the experts' in none
    assert calls <= 2, "expected at most 2 more collectives a step (one all-to-all there, one back)"
PY
  ;;
conventions)
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
  done ;;
mla)
  # tests/specs/mla.yaml (no q-LoRA; values of 6 against q/k heads of 8 + 4) and its variants:
  # every gradient against finite differences (double, data seed 3: at seed 1 a router top-k
  # choice lies within the finite-difference step of a tie), then 10 steps on 1 rank and on 2
  # (fsdp 2, ep 2), fp32 on the wire, within 1e-4, and the 2-rank checkpoint exported in HF names
  ml=$src/tests/specs/mla.yaml
  variants=("plain" "qlora --set model.attention.q_lora_rank=12"
            "qlora-sel --set model.attention.q_lora_rank=12 --set plan.activation_checkpoint=selective"
            "qlora-full --set model.attention.q_lora_rank=12 --set plan.activation_checkpoint=full"
            "yarn --set model.rope_scaling.type=yarn --set model.rope_scaling.factor=4 --set model.rope_scaling.original_max_position=8 --set model.rope_scaling.mscale=0.8 --set model.rope_scaling.mscale_all_dim=1")
  for v in "${variants[@]}"; do
    read -r -a args <<<"$v"; name=mla-${args[0]}
    build "$name" "$ml" double "${args[@]:1}" || continue
    grep -q "rt_mla_kv_backward" "$work/$name/step.c" && grep -q "rt_rope_strided_backward" "$work/$name/step.c" ||
      die "$name: no MLA in step.c"
    [ $name = mla-yarn ] && { grep -q "rt_mla_kv_backward(.*, 1\.[0-9]*);" "$work/$name/step.c" ||
      die "$name: no YaRN softmax factor on k in step.c"; }
    out=$("$work/$name/build-double/train" --data "$text" --grad-check --seed 3 2>&1); rc=$?
    echo "$name: $(echo "$out" | tail -1)"
    [ $rc -eq 0 ] || { echo "$out" | grep MISMATCH; die "$name: gradients differ from finite differences"; }
    n=$(echo "$out" | grep -c "^grad-check model\|^grad-check lm_head")
    want=$(sed -n '/^const RtTensor/,/^};/p' "$work/$name/step.c" | grep -c '^    {"')
    [ "$n" -eq "$want" ] && [ "$n" -gt 10 ] || die "$name: checked $n tensors, the program has $want"
  done
  for v in "${variants[@]}"; do
    read -r -a args <<<"$v"; name=mla-${args[0]}
    sh=("${small[@]}" --set training.grad_reduce_dtype=fp32 "${args[@]:1}")
    build "$name-1" "$ml" float "${sh[@]}" || continue
    build "$name-2" "$ml" float "${sh[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.ep=2 || continue
    grep -q "^#define PLAN_EP 2$" "$work/$name-2/step.h" || die "$name-2: the plan did not take ep 2"
    (cd "$work" && ./$name-1/build/train --data "$text" --metrics "$name-1.jsonl" >/dev/null &&
      "${mpirun[@]}" -np 2 "./$name-2/build/train" --data "$text" --metrics "$name-2.jsonl" --checkpoint-dir "ck-$name" \
      >/dev/null) || { die "$name: runs"; continue; }
    paste <(losses "$work/$name-1.jsonl") <(losses "$work/$name-2.jsonl") | awk -v v=$name '
      { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
      END { printf "%s: 1 vs 2 ranks (fsdp 2, ep 2, fp32 wire): %d steps, worst relative difference %.2e\n", v, n, worst
            exit (worst > 1e-4 || n != 10) }' || die "$name: losses differ between 1 and 2 ranks"
    "$mtc" export "$work/ck-$name" "$work/$name.safetensors" >/dev/null || { die "$name: mtc export"; continue; }
    names=$(head -c 100000 "$work/$name.safetensors" | tr ',{' '\n\n' | sed -n 's/^"\([^"]*\)":.*/\1/p')
    want="kv_a_proj_with_mqa.weight kv_a_layernorm.weight kv_b_proj.weight o_proj.weight"
    case $name in mla-plain|mla-yarn) want="$want q_proj.weight" ;; *) want="$want q_a_proj.weight q_a_layernorm.weight q_b_proj.weight" ;; esac
    for t in $want; do
      echo "$names" | grep -qx "model.layers.1.self_attn.$t" || die "$name: no model.layers.1.self_attn.$t in the export"
    done
  done
  # q-LoRA on 4 ranks (fsdp 4, ep 4) against 1, 4 sequences per step
  sh=("${small[@]}" --set training.grad_reduce_dtype=fp32 --set model.attention.q_lora_rank=16 --set training.global_batch=4)
  if build mla-4r-1 "$ml" float "${sh[@]}" &&
     build mla-4r-4 "$ml" float "${sh[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=4; then
    grep -q "^#define PLAN_EP 4$" "$work/mla-4r-4/step.h" || die "mla-4r-4: the plan did not take ep 4"
    (cd "$work" && ./mla-4r-1/build/train --data "$text" --metrics mla-4r-1.jsonl >/dev/null &&
      "${mpirun[@]}" -np 4 ./mla-4r-4/build/train --data "$text" --metrics mla-4r-4.jsonl >/dev/null) || die "mla-4r: runs"
    paste <(losses "$work/mla-4r-1.jsonl") <(losses "$work/mla-4r-4.jsonl") | awk '
      { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
      END { printf "mla-4r: 1 vs 4 ranks (fsdp 4, ep 4, fp32 wire): %d steps, worst relative difference %.2e\n", n, worst
            exit (worst > 1e-4 || n != 10) }' || die "mla-4r: losses differ between 1 and 4 ranks"
  fi ;;
calibrate)
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
assert p["steps"] == 2 and p["world"] == 1 and p["backend"] == "cpu" and p["tokens_per_step"] == N, p
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
  awk -v f="$fit" -v s="$slow" 'BEGIN { exit !(s > f) }' ||
    die "doubling the measured seconds should make the prediction slower ($fit s -> $slow s)" ;;
cp | cp-mla)
  # context parallelism (plan.cp): each sequence split over 2 ranks in 4 chunks, K/V all-gathered,
  # against 1 rank with fp32 on the wire, 6 steps within 1e-5. cp: tiny-moe on 4 ranks (cp 2 x ep
  # 2, no checkpointing) and on 2 (cp 2, full checkpointing with host offload), and a cp 2
  # checkpoint resumed on 1 rank; cp-mla: MLA on 2 ranks (cp 2). (Two tests: each program's build
  # compiles the runtime, about 20 s on CI's 2 cores.)
  cps=(--set training.seq_len=64 --set training.steps=6 --set training.warmup_steps=2 --set training.grad_reduce_dtype=fp32)
  # same: 6 steps of $2 against $1 within 1e-5 relative
  same() {
    paste <(losses "$work/$1.jsonl") <(losses "$work/$2.jsonl") | awk -v what="$3" '
      { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r
        if (r > 1e-5) { printf "step %d: %s, %s against %s\n", n, what, $2, $1; bad = 1 } }
      END { printf "%s: %d steps, worst relative loss difference %.2e\n", what, n, worst; exit (bad || n != 6) }'
  }
  if [ "$check" = cp ]; then
    build w1 "$tiny" float "${cps[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 || exit 1
    build c2e2 "$tiny" float "${cps[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=2 --set plan.cp=2 \
      --set plan.reshard=every_micro_batch --set plan.activation_checkpoint=none
    build c2f "$tiny" float "${cps[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.cp=2 \
      --set plan.activation_checkpoint=full --set plan.offload_activations=host
    grep -q 'rt_offload_store' "$work/c2f/step.c" || die "c2f: no host offload in the program"
    runs=("c2e2 4 w1" "c2f 2 w1") ref=w1
  else
    build m1 "$src/tests/specs/mla.yaml" float "${cps[@]}" --set training.seq_len=16 || exit 1
    build m2 "$src/tests/specs/mla.yaml" float "${cps[@]}" --set training.seq_len=16 --set cluster.gpus_per_node=2 \
      --set plan.fsdp=2 --set plan.cp=2
    runs=("m2 2 m1") ref=m1
  fi
  (cd "$work" && "./$ref/build/train" --data "$text" --metrics "$ref.jsonl" >/dev/null) || die "1 rank run"
  for run in "${runs[@]}"; do
    read -r d np ref <<<"$run"
    grep -q '^#define PLAN_CP 2$' "$work/$d/step.h" || die "$d: the plan did not take cp 2"
    (cd "$work" && "${mpirun[@]}" -np "$np" "./$d/build/train" --data "$text" --metrics "$d.jsonl" >/dev/null) ||
      { die "$d: $np rank run"; continue; }
    same "$ref" "$d" "1 rank against $np ($(sed -n 's/^policy     //p' "$work/$d/plan.txt"))" ||
      die "$d: losses differ from 1 rank"
  done
  if [ "$check" = cp ]; then
    # cp is not in a checkpoint's identity: 3 steps with cp 2 on 2 ranks, resumed with cp 1 on 1 rank
    (cd "$work" && "${mpirun[@]}" -np 2 ./c2f/build/train --data "$text" --metrics r21.jsonl --steps 3 \
       --checkpoint-dir ckcp >/dev/null && ./w1/build/train --data "$text" --metrics r21.jsonl --checkpoint-dir ckcp >r21.log) ||
      die "cp 2 save, cp 1 resume"
    grep -q "resumed from .*step-00000003" "$work/r21.log" || die "the cp 1 run did not resume from step 3"
    same w1 r21 "saved with cp 2 on 2 ranks, resumed with cp 1 on 1" || die "the resumed losses differ"
    # the cuda backend does not run context parallelism yet: its build refuses, naming PLAN_CP
    out=$("$mtc" build "$work/c2f" --backend cuda 2>&1) && die "mtc build --backend cuda of a cp 2 plan succeeded"
    echo "$out" | grep -q "PLAN_CP is 2: the cuda backend does not run context parallelism yet" || die "cuda refusal: $out"
  fi ;;
*) echo "unknown check $check"; exit 2 ;;
esac
exit $fail
