#!/usr/bin/env bash
# The command line: exit statuses, help, version, options, outputs.
#   usage: cli.sh MTC SOURCE_DIR
set -u
mtc=$(realpath "$1"); cd "$2" || exit 2
fail=0
# plan text wraps lines at 120 characters (report_wrap): a line over 90 followed by an indented one
# is joined with it again, so that a pattern can span the break
unwrap() {
  awk '{ if (n && plen > 90 && $0 ~ /^ +[^ ]/) { plen = length($0); sub(/^ +/, ""); buf = buf " " $0 }
         else { if (n) print buf; buf = $0; plen = length($0) } n = 1 } END { if (n) print buf }'
}
expect() { # expect STATUS PATTERN CMD... : exit status and a line of stdout+stderr matching PATTERN
  local want=$1 pat=$2; shift 2
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne "$want" ]; then echo "FAIL: $* exited $rc, expected $want"; echo "$out" | head -5; fail=1; return; fi
  if ! printf '%s\n' "$out" | grep -Eq -- "$pat" && ! printf '%s\n' "$out" | unwrap | grep -Eq -- "$pat"; then
    echo "FAIL: $*: no line matching '$pat'"; echo "$out" | head -5; fail=1
  fi
}
expect 0 '^usage: mtc COMMAND' "$mtc" --help
expect 0 '^usage: mtc COMMAND' "$mtc" help
expect 0 '^usage: mtc plan SPEC' "$mtc" plan --help
expect 0 '^usage: mtc check SPEC' "$mtc" help check
expect 0 '^usage: mtc compile SPEC' "$mtc" compile -h
expect 0 '^mtc [0-9]+\.[0-9]+\.[0-9]+$' "$mtc" --version
expect 2 '^usage: mtc COMMAND' "$mtc"
expect 2 "unknown command 'frobnicate'" "$mtc" frobnicate
expect 2 "unknown option '--frob'" "$mtc" plan --frob specs/tiny-moe.yaml
expect 2 "option '--set' needs a value" "$mtc" plan specs/tiny-moe.yaml --set
expect 2 'missing SPEC file' "$mtc" check
# import-hf writes a spec from its CONFIG alone: a --set (even an unknown key) was accepted and ignored
expect 2 "import-hf: takes no --set" "$mtc" import-hf tests/hf/gpt2.json --set cluster.nodes=2
expect 2 "import-hf: missing CONFIG" "$mtc" import-hf
expect 2 'expected one SPEC file' "$mtc" check specs/tiny-moe.yaml specs/europa-1t.yaml
# KEY VALUE as two words: the error says KEY=VALUE
expect 2 "^mtc plan: --set cluster.nodes 2: expected KEY=VALUE, one word with '=' \(--set cluster.nodes=2\)$" "$mtc" plan specs/tiny-moe.yaml --set cluster.nodes 2
expect 2 "^mtc sweep: --over cluster.nodes 1,2: expected KEY=V1,V2,..., one word with '=' \(--over cluster.nodes=1,2\)$" "$mtc" sweep --over cluster.nodes 1,2 specs/tiny-moe.yaml
expect 2 '\-\-json applies to .plan. only' "$mtc" check --json specs/tiny-moe.yaml
expect 2 "cannot open 'nonexistent.yaml'" "$mtc" check nonexistent.yaml
expect 2 "cannot read 'specs'" "$mtc" check specs
expect 0 'specs/europa-1t.yaml: ok \(europa-1t: 74 layers, 951.80 B parameters, 32.77 B active\)' "$mtc" check specs/europa-1t.yaml
expect 0 '= 951.80 B total, 32.77 B active per token' "$mtc" plan specs/europa-1t.yaml
expect 0 'layer-boundary activations of one 65536-token sequence over 74 layers: 55.5 GiB' "$mtc" plan specs/europa-1t.yaml
expect 0 '= 671.03 B total' "$mtc" plan specs/deepseek-v3.yaml
expect 0 '= 46.70 B total, 12.88 B active' "$mtc" plan specs/mixtral-8x7b.yaml
expect 0 '= 8.03 B total' "$mtc" plan specs/llama-3.1-8b.yaml
expect 0 '"params_total": 951799117824' "$mtc" plan --json specs/europa-1t.yaml
# --set before or after the spec; units; the shorter sequence halves attention FLOPs
expect 0 '1 x|x 32768 seq' "$mtc" plan --set training.seq_len=32768 specs/europa-1t.yaml
expect 0 '^  \+ 6 x 74 layers x 32768 seq' "$mtc" plan specs/europa-1t.yaml -s training.seq_len=32768
expect 2 "^--set:1:1: error: unknown key 'clusterr'" "$mtc" check specs/europa-1t.yaml --set clusterr.nodes=4
expect 2 "unknown option '-x'" "$mtc" plan specs/tiny-moe.yaml -xj
expect 2 "option '--json' takes no value" "$mtc" plan specs/tiny-moe.yaml --json=3
expect 2 "no help for 'bogus'" "$mtc" help bogus
expect 2 'takes no SPEC and no --set' "$mtc" keys --set a=b
# output that cannot be written is an error
if [ -w /dev/full ]; then
  "$mtc" plan specs/tiny-moe.yaml >/dev/full 2>/dev/null; rc=$?
  [ $rc -eq 2 ] || { echo "FAIL: plan > /dev/full exited $rc, expected 2"; fail=1; }
fi
if [ -w /dev/full ]; then # one error, not two
  n=$("$mtc" plan --json specs/tiny-moe.yaml 2>&1 >/dev/full | grep -c error); [ "$n" -eq 1 ] ||
    { echo "FAIL: plan --json > /dev/full printed $n errors, expected 1"; fail=1; }
fi
# import-hf names what it expected: a config.json, not a spec
expect 2 "cannot read '/dev/zero': it is not a regular file; expected a Hugging Face config.json" "$mtc" import-hf /dev/zero
tmpb=$(mktemp -d); head -c 2000000 /dev/zero | tr '\0' ' ' >"$tmpb/big.json"
expect 2 "big.json' is larger than 1048576 bytes; expected a Hugging Face config.json" "$mtc" import-hf "$tmpb/big.json"
rm -rf "$tmpb"
# a FIFO is refused, not waited on
tmpf=$(mktemp -d); mkfifo "$tmpf/f.yaml"
expect 2 'not a regular file' timeout 5 "$mtc" check "$tmpf/f.yaml"
# a broken preset is named as a preset
: > "$tmpf/empty.yaml"
expect 2 'empty.yaml:1:1: error: the file is empty; expected a cluster preset' env MTC_PRESET_DIR="$tmpf" "$mtc" check specs/tiny-moe.yaml --set cluster.preset=empty
rm -rf "$tmpf"
# the plan: the reference run's layout; exit 1 with the tier and computed advice when nothing fits
expect 0 '^policy     fsdp 384 x dp 1, ep 4, micro_batch 1, full checkpointing \+ boundaries on host' "$mtc" plan specs/europa-1t.yaml
expect 0 '"feasible": true' "$mtc" plan --json specs/europa-1t.yaml
expect 1 '^closest candidate \(the least overage, all tiers together\): (hbm|host) over by' "$mtc" plan specs/europa-1t.yaml --set cluster.nodes=48 --set plan.cp=1
# nothing fits: said first, with the closest candidate (the least overage of all tiers together: here hbm 44.6 GiB
# beside the host's 563.8 GiB that every candidate shares) and the advice
out=$("$mtc" plan specs/europa-1t.yaml --set cluster.nodes=4 --set training.global_batch=16 | unwrap | head -2)
printf '%s\n' "$out" | head -1 | grep -Eq '^NO FEASIBLE PLAN: nothing fits on 16 GPUs; closest candidate .*: fsdp 16 x dp 1, ep 16, cp 16, .*; hbm over by 44.6 GiB' &&
  printf '%s\n' "$out" | grep -q '^advice: it fits on 32 nodes' || { echo "FAIL: infeasible plan's first lines: $out"; fail=1; }
expect 1 '^advice: it fits on 96 nodes.*unpinned, the search finds fsdp 192, ep 4, cp 2 \(each sequence split over 2 ranks: --set plan.cp=2\)' "$mtc" plan specs/europa-1t.yaml --set cluster.nodes=48 --set plan.cp=1
# context parallelism: 48 nodes, and sequences of 128K and 256K tokens on 96, fit by splitting each sequence
expect 0 '^policy     fsdp 192 x dp 1, ep 8 \(hierarchical all-to-all\), cp 2, micro_batch 1' "$mtc" plan specs/europa-1t.yaml --set cluster.nodes=48
expect 0 '^policy     fsdp 384 x dp 1, ep 4, cp 2, micro_batch 1, full checkpointing \+ boundaries on host' "$mtc" plan specs/europa-1t.yaml --set training.seq_len=131072
expect 0 '^policy     fsdp 384 x dp 1, ep 4, cp 4, micro_batch 1, full checkpointing \+ boundaries on host' "$mtc" plan specs/europa-1t.yaml --set training.seq_len=262144
expect 0 '^  why: cp 1 wins by .* over cp 2 ' "$mtc" explain specs/europa-1t.yaml
expect 0 '^  why: cp 2 wins by .* over cp 4 ' "$mtc" explain specs/europa-1t.yaml --set training.seq_len=131072
expect 0 '^     1  rejected: (hbm|host) over by' "$mtc" explain specs/europa-1t.yaml --set training.seq_len=131072
expect 2 'error: cp 3 does not divide the FSDP group of 2 ranks' "$mtc" plan specs/tiny-moe.yaml --set plan.cp=3
expect 1 '"feasible": false' "$mtc" plan --json specs/europa-1t.yaml --set plan.activation_checkpoint=none --set plan.cp=1
expect 1 'not a multiple of micro_batch x GPUs' "$mtc" plan specs/europa-1t.yaml --set training.global_batch=100
# the advice names what it tried, and the --set that lets a larger node count be tried
expect 1 '^advice: no tried change fits \(tried 24 nodes: hbm over by .*192 nodes and more were not tried: global_batch 384 is not a multiple of micro_batch x GPUs / cp = 768 / cp for any cp that splits the sequences \(--set training.global_batch=768 would allow 192 nodes\)' "$mtc" plan specs/europa-1t.yaml --set cluster.nodes=12 --set cluster.gpu.hbm=4GB --set plan.cp=1
# explain and sweep
expect 0 '^chosen     fsdp 384 x dp 1, ep 4, micro_batch 1, full checkpointing' "$mtc" explain specs/europa-1t.yaml
expect 0 'rejected: (hbm|host) over by' "$mtc" explain specs/europa-1t.yaml --set plan.ep=4 --set plan.cp=1
# EP inside a node against across nodes: europa-1t keeps it in the node; deepseek-v3 on 64 nodes goes across,
# with the hierarchical all-to-all
expect 0 '^  why: EP inside a node wins by .*most of it in MoE all-to-all' "$mtc" explain specs/europa-1t.yaml
expect 0 '^  why: EP across nodes wins by .*the all-to-all is hierarchical' "$mtc" explain specs/deepseek-v3.yaml --set cluster.nodes=64
expect 0 'across nodes: an EP group is 64 consecutive ranks on 16 nodes' "$mtc" plan specs/deepseek-v3.yaml --set plan.ep=64
# a pinned micro_batch is honoured; the hint names the pinned keys the search would change, where
# their values were written, and both figures (only keys whose searched value differs)
expect 0 '^hint: pinned training.micro_batch 1 \(--set:1:22; the search picks 15\), plan.ep 4 \(--set:1:9; the search picks 8\): with the pinned keys auto \(--set KEY=auto\) the search finds 992 tokens/s per GPU against the pinned 84 \(\+1087%; step 247.7 s against 2941.4 s\)$' "$mtc" plan specs/deepseek-v3.yaml --set training.micro_batch=1 --set plan.ep=4 --set plan.reshard=every_micro_batch
expect 0 '^hint: pinned training.micro_batch 1 \(specs/europa-1t.yaml:31:16; the search picks 4\): .* finds 985 tokens/s per GPU against the pinned 693 ' "$mtc" plan specs/europa-1t.yaml --set training.global_batch=1536 --set training.seq_len=16384
# auto is every searched key's "searched", on the command line as in a spec
expect 0 '^specs/europa-1t.yaml: ok' "$mtc" check specs/europa-1t.yaml --set training.micro_batch=auto
expect 0 '^layout .* 1 micro-batch\(es\) of 4 sequence\(s\) per GPU' "$mtc" plan specs/europa-1t.yaml --set training.global_batch=1536 --set training.seq_len=16384 --set training.micro_batch=auto
for k in fsdp ep dp_replicate activation_checkpoint offload_activations reshard reshard_experts moe_dispatch optimizer_tier optimizer_step prefetch; do
  expect 0 '^specs/europa-1t.yaml: ok' "$mtc" check specs/europa-1t.yaml --set plan.$k=auto
done
if "$mtc" plan specs/europa-1t.yaml --set training.global_batch=1536 --set training.seq_len=16384 --set training.micro_batch=auto | grep -q '^hint:'; then
  echo "FAIL: a hint with nothing pinned"; fail=1
fi
expect 0 '^policy     fsdp 256 x dp 1, ep 8 \(hierarchical all-to-all\), micro_batch 15, ' "$mtc" plan specs/deepseek-v3.yaml
# reshard after_step is emitted: the kept groups in the plan's buffers, gathered once per step
tmpk=$(mktemp -d)
expect 0 '^plan: .*parameters kept gathered until the optimizer step' "$mtc" compile specs/tiny-moe.yaml -o "$tmpk/k" --set plan.reshard=after_step
"$mtc" compile specs/tiny-moe.yaml -o "$tmpk/k" --set plan.reshard=after_step | grep -q 'nothing fits' &&
  { echo "FAIL: a feasible compile's summary says nothing fits"; fail=1; }
grep -q '^#define KEPT ' "$tmpk/k/step.c" && grep -q 'if (c->gather_kept) rt_comm_all_gather_start' "$tmpk/k/step.c" ||
  { echo "FAIL: reshard after_step: no KEPT buffer or conditional gathers in step.c"; fail=1; }
expect 0 '^plan: .*routed experts kept gathered until the optimizer step' "$mtc" compile specs/tiny-moe.yaml -o "$tmpk/x" --set plan.reshard=every_micro_batch --set plan.reshard_experts=after_step
grep -q '^#define EXPERTS_KEPT ' "$tmpk/x/step.c" && grep -q '^#define GATHERED1 ' "$tmpk/x/step.c" ||
  { echo "FAIL: reshard_experts after_step: no EXPERTS_KEPT and pool in step.c"; fail=1; }
rm -rf "$tmpk"
# global_batch_tokens: the step's tokens kept when seq_len is regenerated; plan.txt prints them
tmpg=$(mktemp -d)
sed 's/^  global_batch: 384.*/  global_batch_tokens: 24Mi/' specs/europa-1t.yaml >"$tmpg/e.yaml"
expect 0 '^batch      25,165,824 tokens per step = 384 sequences x 65536 tokens$' "$mtc" plan specs/europa-1t.yaml
expect 0 '^batch      25,165,824 tokens per step = 1536 sequences x 16384 tokens \(training.global_batch_tokens\)$' "$mtc" plan "$tmpg/e.yaml" --set training.seq_len=16384
expect 0 '^16384 +yes .* 693 .* 25,165,824  ' "$mtc" sweep "$tmpg/e.yaml" --over training.seq_len=16384,65536
# global_batch in sequences: the tokens of a step grow with seq_len, and the sweep shows them
expect 0 '^256 +yes .* 2,048  compute$' "$mtc" sweep specs/tiny-moe.yaml --over training.seq_len=128,256
expect 0 '"tokens_per_step": 25165824' "$mtc" plan --json "$tmpg/e.yaml" --set training.seq_len=32768
# a token batch that the GPUs read only by splitting sequences: the error names the nearest sizes that divide
# over the GPUs; the plan of 3906 sequences (cp 64) notes the far faster nearest sizes; 4096 names the key written
q3=(specs/qwen3-30b-a3b.yaml --set cluster.nodes=96 --set training.global_batch=null)
expect 2 'error: global_batch_tokens 16000000 is not a whole number of sequences of seq_len 4096; .* micro_batch x GPUs = 1 x 384 sequences are 15728640 \(3840 x 4096\) or 17301504 \(4224 x 4096\)$' "$mtc" check "${q3[@]}" --set training.global_batch_tokens=16000000
expect 0 '^note: global_batch 3906 divides over the 384 GPUs only with cp 64 \(32-token chunks\), at MFU [0-9.]+%; .* reach MFU [0-9.]+% at 3840 sequences \(--set training.global_batch_tokens=15728640\) and MFU [0-9.]+% at 4224 sequences' "$mtc" compile "${q3[@]}" --set training.global_batch_tokens=15998976 -o "$tmpg/q3"
expect 1 'global_batch 4096 \(training.global_batch_tokens 16777216\) is not a multiple of .* expected training.global_batch_tokens 15728640 \(3840 x 4096\) or 17301504 \(4224 x 4096\)' "$mtc" plan "${q3[@]}" --set training.global_batch_tokens=16777216
expect 2 'both global_batch \(384 sequences\) and global_batch_tokens are written' "$mtc" check "$tmpg/e.yaml" --set training.global_batch=384
rm -rf "$tmpg"
# --set KEY=null removes KEY (the other of two exclusive keys, without editing the file); a typo is an unknown key
expect 0 'ok \(tiny-moe' "$mtc" check specs/tiny-moe.yaml --set training.global_batch_tokens=2048 --set training.global_batch=null
expect 2 "unknown key 'training.global_batc'; did you mean 'training.global_batch'" "$mtc" check specs/tiny-moe.yaml --set training.global_batc=null
expect 2 "both global_batch \(8 sequences\) and global_batch_tokens are written; .* --set training.global_batch=null" \
  "$mtc" check specs/tiny-moe.yaml --set training.global_batch_tokens=2048
# integers as YAML 1.2 reads them: 010 is ten (no octal); 4_0 is a string (bad_specs: underscore_int)
expect 0 'ok \(tiny-moe: 10 layers' "$mtc" check specs/tiny-moe.yaml --set model.layers=010
# a bad --over value is named in its --over argument, at the value
expect 2 "^--over:1:26: error: 'training.seq_len' is 0, out of range" "$mtc" sweep specs/tiny-moe.yaml --over training.seq_len=128,256,0
# one set of plans: the search tries both all-to-alls where an EP group spans nodes (both backends run both);
# plan.moe_dispatch=flat keeps it flat; a pin plans it, and compile writes it (MOE_HIER_G: EP ranks per node)
expect 0 '^  across      fsdp 256 x dp 1, ep 8 \(hierarchical all-to-all\), micro_batch' "$mtc" explain specs/deepseek-v3.yaml --set cluster.nodes=64
expect 0 '^  across      fsdp 256 x dp 1, ep 8, micro_batch' "$mtc" explain specs/deepseek-v3.yaml --set plan.moe_dispatch=flat
expect 0 '^chosen     fsdp 256 x dp 1, ep 32 \(hierarchical all-to-all\), micro_batch 1, .*all but the routed experts kept gathered until the optimizer step' "$mtc" explain specs/deepseek-v3.yaml --set training.micro_batch=1
expect 0 '^  why: EP across nodes wins by' "$mtc" explain specs/deepseek-v3.yaml --set training.micro_batch=1
expect 0 '^  why: EP across nodes wins by .*a MoE layer is 3.28 GB per rank with ep 8 against 6.10 GB with ep 4' "$mtc" explain specs/deepseek-v3.yaml --set cluster.nodes=32
for c in plan explain; do
  expect 0 "ep 8 \\(hierarchical all-to-all\\)" "$mtc" $c specs/deepseek-v3.yaml --set cluster.nodes=64 --set plan.ep=8 --set plan.moe_dispatch=hierarchical
done
# the pin with ep auto: the search keeps to EP groups across nodes (it was ignored: ep 1, flat)
expect 0 '^policy     fsdp 4 x dp 1, ep 4 \(hierarchical all-to-all\)' "$mtc" plan specs/tiny-moe.yaml --set cluster.nodes=2 \
  --set plan.moe_dispatch=hierarchical
tmph=$(mktemp -d)
expect 0 '^wrote ' "$mtc" compile specs/deepseek-v3.yaml -o "$tmph/d" --set cluster.nodes=64 --set plan.ep=8 --set plan.moe_dispatch=hierarchical
grep -q '^#define MOE_HIER_G 4$' "$tmph/d/step.h" || { echo "FAIL: compile of a pinned hierarchical all-to-all: no MOE_HIER_G 4"; fail=1; }
rm -rf "$tmph"
# plan --json and compile's plan.json are the same plan (all but the search's own time)
tmpj=$(mktemp -d)
same() { sed '/^    "seconds": /d; s/^\(    "candidates": [0-9]*\),$/\1/' "$1"; }
for a in "specs/europa-1t.yaml --set training.seq_len=16384" "specs/europa-1t.yaml --set training.seq_len=32768" \
         "specs/europa-1t.yaml --set training.seq_len=65536" "specs/deepseek-v3.yaml --set cluster.nodes=32" \
         "specs/deepseek-v3.yaml --set cluster.nodes=64"; do
  # shellcheck disable=SC2086
  "$mtc" plan --json $a >"$tmpj/p.json"
  # shellcheck disable=SC2086
  "$mtc" compile $a -o "$tmpj/c" --force >/dev/null
  same "$tmpj/p.json" >"$tmpj/p1.json"; same "$tmpj/c/plan.json" >"$tmpj/c1.json"
  cmp -s "$tmpj/p1.json" "$tmpj/c1.json" || { echo "FAIL: plan --json and compile choose differently for $a"; diff "$tmpj/p1.json" "$tmpj/c1.json" | head; fail=1; }
done
# (among them the hierarchical all-to-all: europa-1t at 32,768 tokens chooses it)
expect 0 '"moe_dispatch": "hierarchical"' "$mtc" plan --json specs/europa-1t.yaml --set training.seq_len=32768
rm -rf "$tmpj"

expect 1 '^nothing fits; closest' "$mtc" explain specs/europa-1t.yaml --set cluster.nodes=48 --set plan.cp=1
# plan text a person can read: every example's plan at most 120 characters a line (issue 32); an
# infeasible plan names every tier it overflows; explain says an overage once for all its layouts
for f in specs/*.yaml generated/*/plan.txt; do
  case $f in *.yaml) w=$("$mtc" plan "$f" | awk 'length > 120' | head -1) ;; *) w=$(awk 'length > 120' "$f" | head -1) ;; esac
  [ -z "$w" ] || { echo "FAIL: $f: a plan line over 120 characters: $w"; fail=1; }
done
expect 1 '^closest candidate \(the least overage, all tiers together\): hbm over by .* \(.* of 89.4 GiB\), host over by .* of 111.8 GiB\)$' "$mtc" plan specs/europa-1t.yaml --set cluster.nodes=4 --set training.global_batch=16
expect 1 '^ +[0-9]+\.-[0-9]+\. [0-9]+ layouts rejected: host over by ' "$mtc" explain specs/europa-1t.yaml --set cluster.nodes=48 --set plan.cp=1
dup=$("$mtc" explain specs/europa-1t.yaml --set cluster.nodes=48 --set plan.cp=1 | grep 'rejected' | sort | uniq -d)
[ -z "$dup" ] || { echo "FAIL: explain repeats a rejection: $dup"; fail=1; }
expect 0 '^columns: fits: .*offl: where' "$mtc" sweep specs/tiny-moe.yaml --over training.seq_len=256
# every prediction says where its rates come from (issue 29): plan.txt, report.html's headline,
# launch.sbatch's time limit, the compile summary and the sweep's footnote
for d in generated/*/; do
  grep -q '^where the predictions come from (cluster.evidence' "$d/plan.txt" || { echo "FAIL: $d/plan.txt has no provenance"; fail=1; }
  grep -q '<p class="prov">Where this prediction comes from: rates' "$d/report.html" || { echo "FAIL: $d/report.html's headline has no provenance"; fail=1; }
  grep -q '^# --time: the predicted run x [0-9.]* (the most that account allows)' "$d/launch.sbatch" &&
    grep -q '^#   rates' "$d/launch.sbatch" || { echo "FAIL: $d/launch.sbatch's time limit has no provenance"; fail=1; }
done
expect 0 '^  cluster.stack mtc: mtc.s program measured at 0.29x its prediction \(moe-1b on one H200, not a GH200' "$mtc" plan specs/europa-1t.yaml
expect 0 '^  fidelity: predicted / published tokens/s 0.90..1.23 over 12 fidelity rows' "$mtc" plan specs/europa-1t.yaml --set cluster.preset=h100-sxm-80gb
ptmp=$(mktemp -d)
expect 0 '^  \(rates of jupiter-booster: 3 measured, 0 fitted, 16 assumed' "$mtc" compile specs/tiny-moe.yaml -o "$ptmp/prov" --set cluster.preset=jupiter-booster
rm -rf "$ptmp"
expect 0 '^  fidelity: no fidelity row on this machine$' "$mtc" plan specs/tiny-moe.yaml
expect 0 '^  fidelity: no fidelity row on this GPU$' "$mtc" plan specs/llama-3.1-8b.yaml
expect 0 '^  - rates of b200-180gb: .* over 3 fidelity rows' "$mtc" sweep specs/tiny-moe.yaml --over cluster.preset=b200-180gb
expect 2 "'dense_gem' in cluster.evidence.measured is not a cluster.efficiency key" "$mtc" check specs/tiny-moe.yaml --set cluster.evidence.measured=dense_gem
expect 0 '^96 +65536 +yes +384 x 1 +4 +1 +full +host +host +1 ' "$mtc" sweep specs/europa-1t.yaml --over cluster.nodes=48,96 --over training.seq_len=65536
expect 0 '^48 +65536 +no .*(hbm|host) over by' "$mtc" sweep specs/europa-1t.yaml --over cluster.nodes=48,96 --over training.seq_len=65536 --set plan.cp=1
expect 0 '^262144 +yes +384 x 1 +4 +4 +full' "$mtc" sweep specs/europa-1t.yaml --over training.seq_len=262144
expect 0 'no layout: global_batch 384 is not a multiple of 768 GPUs' "$mtc" sweep specs/europa-1t.yaml --over cluster.nodes=192 --set plan.cp=1
expect 0 '^96,yes,384,1,4,1,full,host,host,1,' "$mtc" sweep specs/europa-1t.yaml --over cluster.nodes=96 --csv
expect 2 'needs at least one --over' "$mtc" sweep specs/europa-1t.yaml
expect 2 "needs KEY=V1,V2" "$mtc" sweep specs/europa-1t.yaml --over cluster.nodes
expect 2 "^--over:1:18: error: 'cluster.nodes' is 'many'" "$mtc" sweep specs/europa-1t.yaml --over cluster.nodes=96,many
# ... before any row: a bad value anywhere in the grid writes nothing to stdout
out=$("$mtc" sweep specs/tiny-moe.yaml --over cluster.nodes=1,2,many 2>/dev/null); rc=$?
[ $rc -eq 2 ] && [ -z "$out" ] || { echo "FAIL: sweep with a bad last value: exit $rc, stdout: $out"; fail=1; }
expect 2 '\-\-over applies to .sweep. only' "$mtc" plan specs/europa-1t.yaml --over cluster.nodes=1
# diff: the shorter sequence halves the activation items; plan.json files compare too
expect 0 '^memory.host.items.activations.boundary\[\] +58.0 GB +29.0 GB +-50.0%' "$mtc" diff specs/europa-1t.yaml specs/europa-1t.yaml --set training.seq_len=32768
expect 0 '^checkpoint.boundary_bytes_per_gpu +59.6 GB +29.8 GB' "$mtc" diff specs/europa-1t.yaml specs/europa-1t.yaml --set training.seq_len=32768
# the tokens of a step differ (global_batch counts sequences): said under the table; --html says what it wrote
tmpd=$(mktemp -d)
expect 0 '^note: A trains on 25165824 tokens per step and B on 12582912: ' "$mtc" diff specs/europa-1t.yaml specs/europa-1t.yaml --set training.seq_len=32768
expect 0 "^wrote $tmpd/d.html\$" "$mtc" diff specs/tiny-moe.yaml specs/tiny-moe.yaml --set training.seq_len=128 --html "$tmpd/d.html"
rm -rf "$tmpd"
if "$mtc" diff specs/tiny-moe.yaml specs/tiny-moe.yaml --set training.micro_batch=1 | grep -q '^note: A trains'; then
  echo "FAIL: diff notes different tokens per step where they are the same"; fail=1
fi
expect 0 '^\(no differences\)' "$mtc" diff generated/europa-1t/plan.json specs/europa-1t.yaml
expect 0 '^model.params_total' "$mtc" diff generated/tiny-moe/plan.json generated/llama-3.1-8b/plan.json
expect 2 'expected two plans or specs' "$mtc" diff specs/europa-1t.yaml
expect 2 "is a plan.json, which holds no schedule to draw; expected A and B to be specs" \
  "$mtc" diff generated/tiny-moe/plan.json specs/tiny-moe.yaml --html "${TMPDIR:-/tmp}/mtc-cli-diff.html"
expect 2 "--html applies to 'diff' only" "$mtc" plan specs/tiny-moe.yaml --html "${TMPDIR:-/tmp}/mtc-cli-diff.html"
[ ! -e "${TMPDIR:-/tmp}/mtc-cli-diff.html" ] || { echo "FAIL: a refused diff --html wrote its page"; fail=1; }
expect 2 'not a plan.json' "$mtc" diff README.md.json specs/europa-1t.yaml
# a JSON file that is not a plan (an empty object, a checkpoint manifest) is refused, naming what it lacks
echo '{}' >"${TMPDIR:-/tmp}/mtc-cli-empty.json"
expect 2 "mtc-cli-empty.json: not a plan.json of mtc's: it has no 'name'" "$mtc" diff "${TMPDIR:-/tmp}/mtc-cli-empty.json" specs/tiny-moe.yaml
rm -f "${TMPDIR:-/tmp}/mtc-cli-empty.json"
expect 2 "--over training.seq_len is given twice" "$mtc" sweep specs/tiny-moe.yaml --over training.seq_len=128,256 --over training.seq_len=64
# peak FLOPs are a rate, not bytes
expect 0 '^cluster.peak_bf16_flops_per_gpu +5e\+10 +5e\+10' "$mtc" diff generated/tiny-moe/plan.json generated/tiny-moe/plan.json --all
# --set changes B's spec; with a plan.json as B it is refused, naming the option and the file (issue 16 item 13)
expect 2 '^mtc: error: --set training.seq_len=32768: B \(generated/europa-1t/plan.json\) is a plan.json, which --set cannot change' \
  "$mtc" diff specs/europa-1t.yaml generated/europa-1t/plan.json --set training.seq_len=32768
# compile writes plan.json and plan.txt to -o DIR
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
expect 0 "wrote $tmp/out/x/plan.json" "$mtc" compile specs/tiny-moe.yaml -o "$tmp/out/x"
[ -s "$tmp/out/x/plan.json" ] && [ -s "$tmp/out/x/plan.txt" ] || { echo "FAIL: compile outputs missing"; fail=1; }
# the same compile again into its own directory (README: "an earlier compile's directory"), so every
# program file must carry the "regenerate with `mtc compile`" line output.c knows mtc's files by
expect 0 "wrote $tmp/out/x/step.h" "$mtc" compile specs/tiny-moe.yaml -o "$tmp/out/x"
(cd "$tmp" && "$mtc" compile "$OLDPWD/specs/tiny-moe.yaml" >/dev/null) || { echo "FAIL: compile to default dir"; fail=1; }
[ -s "$tmp/generated/tiny-moe/plan.json" ] || { echo "FAIL: default output dir generated/tiny-moe/"; fail=1; }
grep -q "$tmp\|$PWD" "$tmp/generated/tiny-moe/plan.json" && { echo "FAIL: absolute path in plan.json"; fail=1; }
# an unwritable output directory is an error, not a crash
expect 2 'cannot (create directory|write)' "$mtc" compile specs/tiny-moe.yaml -o /proc/mtc-no
# documented zeros are accepted (0 turns clipping, weight decay, the aux loss off; the LR decays to 0)
for kv in training.grad_clip=0 training.weight_decay=0 training.min_lr_ratio=0 model.moe.aux_loss_coef=0 \
          model.moe.bias_update_rate=0; do
  expect 0 'specs/tiny-moe.yaml: ok' "$mtc" check specs/tiny-moe.yaml --set "$kv"
done
"$mtc" compile specs/tiny-moe.yaml -o "$tmp/zeros" --set training.grad_clip=0 --set training.weight_decay=0 >/dev/null &&
  grep -qx '#define GRAD_CLIP 0' "$tmp/zeros/step.h" && grep -qx '#define WEIGHT_DECAY 0' "$tmp/zeros/step.h" ||
  { echo "FAIL: grad_clip=0 and weight_decay=0 do not reach step.h"; fail=1; }
# launch.sbatch (issue 16 item 8): europa-1t needs more than 24 h, so --time is capped and both
# the script and compile say so; the GPU job's build command names the cuda backend; srun
# checkpoints, keeps the newest few, and Slurm signals the job before its limit
# (4 jobs: 82.7 s x 1,000 steps x 3.45, jupiter-booster's cluster.evidence: the program measured at 0.29x)
expect 0 "note: launch.sbatch asks for --time=24:00:00.*needs about [0-9]*:[0-9]*:00 \\(3.45x the prediction.*4 jobs" \
  "$mtc" compile specs/europa-1t.yaml -o "$tmp/europa"
sb=$tmp/europa/launch.sbatch
grep -q '^# --time is capped at 24:00:00' "$sb" && grep -q '^#SBATCH --time=24:00:00$' "$sb" &&
  grep -q 'after `mtc build . --backend cuda`' "$sb" && grep -Eq '^#SBATCH --signal=USR1@[0-9]+$' "$sb" &&
  grep -q -- '--checkpoint-dir "${CHECKPOINT_DIR:-checkpoints}" --checkpoint-every [0-9]' "$sb" &&
  grep -q -- '--keep-checkpoints "${KEEP_CHECKPOINTS:-2}"' "$sb" && bash -n "$sb" ||
  { echo "FAIL: europa-1t's launch.sbatch"; fail=1; }
"$mtc" compile specs/tiny-moe.yaml -o "$tmp/tinysb" | grep -q "note: launch.sbatch" &&
  { echo "FAIL: tiny-moe's 14-minute job is said to be capped"; fail=1; }
grep -q 'after `mtc build .`)' "$tmp/tinysb/launch.sbatch" && ! grep -q 'time is capped' "$tmp/tinysb/launch.sbatch" ||
  { echo "FAIL: tiny-moe's launch.sbatch (cpu preset: mtc build ., no cap)"; fail=1; }
# help and labels a newcomer reads (issue 16 item 14)
"$mtc" --help | grep -q 'now: the model accounting' && { echo "FAIL: mtc --help: plan prints only the accounting"; fail=1; }
"$mtc" plan --help | grep -q 'This version prints the model accounting' && { echo "FAIL: mtc plan --help is stale"; fail=1; }
expect 0 'mpirun -np WORLD DIR/build/train --data FILE' "$mtc" compile --help
expect 0 'Megatron' "$mtc" compile --help
expect 0 '^usage: mtc COMMAND \[OPTIONS\] ARGUMENTS' "$mtc" --help
expect 0 '^  export CKPT OUT.safetensors' "$mtc" --help
expect 0 '^  export CKPT OUTDIR --spec SPEC' "$mtc" --help
expect 2 'set applies with --spec only' "$mtc" export ck out --set model.layers=2
expect 2 "spec applies to 'export' only" "$mtc" plan specs/tiny-moe.yaml --spec specs/tiny-moe.yaml
expect 0 'memory per rank .* tokens/s per rank, MFU .* of the preset.s assumed rate per rank' \
  "$mtc" compile specs/tiny-moe.yaml -o "$tmp/tinylabels"
grep -q 'a GPU is one MPI rank' "$tmp/tinylabels/plan.txt" || { echo "FAIL: the cpu preset's plan.txt says GPU unexplained"; fail=1; }
grep -q 'none checkpointing\|none activation checkpointing' "$tmp/tinylabels/report.html" "$tmp/tinylabels/step.c" &&
  { echo "FAIL: 'none checkpointing'"; fail=1; }
grep -q -- '--inject-nan FIRST:COUNT' "$tmp/tinylabels/train.c" || { echo "FAIL: train's usage omits --inject-nan"; fail=1; }
# hidden 132 is not a multiple of 8: compile says the program is cpu-only, build --backend cuda refuses
expect 0 'note: hidden 132 is not a multiple of 8' "$mtc" compile specs/tiny-moe.yaml -o "$tmp/h132" \
  --set model.hidden=132 --set model.attention.heads=2
expect 2 'step.h: HIDDEN is 132, not a multiple of 8.*expected model.hidden a multiple of 8 for --backend cuda' \
  "$mtc" build "$tmp/h132" --backend cuda
# near-linear on large valid input (issue 16 item 9). The bounds are generous on purpose: they
# catch a quadratic regression (31 s and 34 s before the fix, under 1 s after), not slowness.
python3 -c '
import sys
sys.stdout.write(open("specs/tiny-moe.yaml").read() + "x:\n")
for i in range(99000): sys.stdout.write(" k%x: 0\n" % i)' >"$tmp/many-keys.yaml"
expect 2 "unknown key 'x'" timeout 20 "$mtc" check "$tmp/many-keys.yaml"
expect 0 'wrote .*step.c' timeout 20 "$mtc" compile specs/tiny-moe.yaml -o "$tmp/deep" --set model.layers=4096 \
  --set cluster.gpu.hbm=400GiB --set cluster.host.memory=400GiB
# a plan that puts the layer boundaries on NVMe: the program keeps them in host memory, and
# compile says so (and step.h, for the program's start-up warning) (issue 16 item 13)
expect 0 'warning: the plan puts the layer boundaries on NVMe, but the program keeps them in host memory: [0-9.]* MiB per GPU' \
  "$mtc" compile specs/tiny-moe.yaml -o "$tmp/nvme" --set plan.offload_activations=nvme \
  --set plan.activation_checkpoint=full --set "cluster.nvme.capacity=1 TB" --set "cluster.nvme.bandwidth=5 GB/s"
grep -q '^#define PLAN_OFFLOAD_NVME 1' "$tmp/nvme/step.h" || { echo "FAIL: no PLAN_OFFLOAD_NVME in step.h"; fail=1; }
"$mtc" compile specs/tiny-moe.yaml -o "$tmp/host" --set plan.offload_activations=host \
  --set plan.activation_checkpoint=full 2>&1 | grep -q "warning:" && { echo "FAIL: a warning for host offload"; fail=1; }
# each backend builds in its own directory: the cuda build is DIR/build-cuda, never DIR/build
# (a runtime that is not there stops the build at its configuration, after the directory is made)
expect 2 'building .*/host/build-cuda failed' env MTC_ROOT="$tmp/no-runtime" "$mtc" build "$tmp/host" --backend cuda
[ -d "$tmp/host/build-cuda" ] && [ ! -e "$tmp/host/build" ] || { echo "FAIL: mtc build --backend cuda did not use DIR/build-cuda"; fail=1; }
grep -q '^  ./build-cuda/train --data' generated/europa-1t/launch.sbatch &&
  grep -q '^  ./build/train --data' generated/tiny-moe/launch.sbatch || { echo "FAIL: launch.sbatch runs the wrong build"; fail=1; }
# a compile that writes another program over a built one removes what mtc build made of the old one
# (DIR/build/train would still train the earlier model or plan), saying to rebuild; a compile that
# writes the same program keeps it (the build tree here a stand-in: a CMakeCache.txt made for it)
"$mtc" compile specs/tiny-moe.yaml -o "$tmp/stale" >/dev/null && mkdir -p "$tmp/stale/build" &&
  printf 'CMAKE_CACHEFILE_DIR:INTERNAL=%s\n' "$(cd "$tmp/stale/build" && pwd -P)" >"$tmp/stale/build/CMakeCache.txt" &&
  echo old >"$tmp/stale/build/train" || { echo "FAIL: the stale-build setup"; fail=1; }
"$mtc" compile specs/tiny-moe.yaml -o "$tmp/stale" | grep -q 'note: removed' && { echo "FAIL: an unchanged compile removed build/train"; fail=1; }
[ -f "$tmp/stale/build/train" ] || { echo "FAIL: an unchanged compile removed build/train"; fail=1; }
expect 0 "note: removed 1 program\(s\) mtc build made in .*/stale \(build.../train\): built from the earlier program there, not this one; rebuild with: mtc build .*/stale$" \
  "$mtc" compile specs/tiny-moe.yaml -o "$tmp/stale" --set training.steps=70
[ ! -e "$tmp/stale/build/train" ] && [ -f "$tmp/stale/build/CMakeCache.txt" ] || { echo "FAIL: the earlier program's build/train stayed"; fail=1; }
# mtc calibrate: usage, and each bad profile named with its file, field and what was expected
# (the round trip from a real profile: tests/train/calibrate.sh)
tmpc=$(mktemp -d)
cat >"$tmpc/p.json" <<'JSON'
{"format": "mtc-profile-1", "model": "hand", "backend": "cpu", "world": 1, "steps": 2,
 "classes": {"gemm": {"seconds": 0.5, "calls": 10, "flops": 1e10},
             "attention_fwd": {"seconds": 0.25, "calls": 4, "flops": 1e9},
             "norm": {"seconds": 0.1, "calls": 8, "bytes": 1e8},
             "elementwise": {"seconds": 0.1, "calls": 8, "bytes": 5e8},
             "all_gather": {"seconds": 0.05, "calls": 8, "bytes": 0}}}
JSON
expect 2 'needs --preset NAME' "$mtc" calibrate "$tmpc/p.json" -o "$tmpc/out.yaml"
expect 2 'needs -o PRESET.yaml' "$mtc" calibrate "$tmpc/p.json" --preset cpu
expect 2 'expected one or more PROFILE files' "$mtc" calibrate --preset cpu -o "$tmpc/out.yaml"
expect 2 '\-\-preset applies to .calibrate. only' "$mtc" plan specs/tiny-moe.yaml --preset cpu
expect 2 "nope.json: unable to open .*; expected a profile that .train --profile FILE. wrote" \
  "$mtc" calibrate "$tmpc/nope.json" --preset cpu -o "$tmpc/out.yaml"
printf '{"format": "mtc-profile-1",\n "classes": {"gemm": {"seconds": }}}\n' >"$tmpc/syntax.json"
expect 2 'syntax.json:2:.*expected the JSON that .train --profile FILE. writes' \
  "$mtc" calibrate "$tmpc/syntax.json" --preset cpu -o "$tmpc/out.yaml"
sed 's/"flops": 1e10/"flops": "many"/' "$tmpc/p.json" >"$tmpc/field.json"
expect 2 'field.json: classes.gemm.flops: missing or not a number >= 0; expected seconds and the class' \
  "$mtc" calibrate "$tmpc/field.json" --preset cpu -o "$tmpc/out.yaml"
sed 's/mtc-profile-1/other/' "$tmpc/p.json" >"$tmpc/format.json"
expect 2 'format.json: format: missing or not "mtc-profile-1"' "$mtc" calibrate "$tmpc/format.json" --preset cpu -o "$tmpc/out.yaml"
# GEMMs at 100 GFLOP/s on the cpu preset's 50 (a real core beats its guess): gpu.bf16_flops is raised to
# 100 GFLOP/s, saying so, and the compute factors are fractions of it: dense_gemm 1, attention 1e9 /
# (100e9 x 0.25) = 0.04; a memory-bound rate above its peak is still refused
sed 's/"seconds": 0.5,/"seconds": 0.1,/' "$tmpc/p.json" >"$tmpc/fast.json"
expect 0 'note: gpu.bf16_flops raised from 50 to 100 GFLOP/s: efficiency.dense_gemm measured faster' \
  "$mtc" calibrate "$tmpc/fast.json" --preset cpu -o "$tmpc/fast.yaml"
grep -q '^  bf16_flops: 100 GFLOP/s   # raised by mtc calibrate from cpu.s 50 GFLOP/s: efficiency.dense_gemm measured 2 times' "$tmpc/fast.yaml" &&
  grep -q '^  dense_gemm: 1   # fitted from' "$tmpc/fast.yaml" && grep -q '^  attention: 0.04   # fitted from' "$tmpc/fast.yaml" &&
  env MTC_PRESET_DIR="$tmpc" "$mtc" plan specs/tiny-moe.yaml --set cluster.preset=fast >/dev/null ||
  { echo "FAIL: calibrate's raised peak"; grep -E 'bf16_flops|dense_gemm|attention' "$tmpc/fast.yaml"; fail=1; }
sed 's/"bytes": 1e8}/"bytes": 1e11}/' "$tmpc/p.json" >"$tmpc/fastmem.json" # 1e11 B in 0.25 s on a 10 GB/s preset
expect 2 'efficiency.elementwise would be 40, above 1.*raise gpu.hbm_bandwidth in cpu' \
  "$mtc" calibrate "$tmpc/fastmem.json" --preset cpu -o "$tmpc/out.yaml"
expect 2 "unknown cluster preset 'nosuch'" "$mtc" calibrate "$tmpc/p.json" --preset nosuch -o "$tmpc/out.yaml"
# a profile fits only the kind of hardware that measured it: the cpu backend's against a GPU preset
# (GH200 efficiencies of 1e-6) and the cuda backend's against the cpu preset are refused, nothing written
expect 2 "p.json: measured by the cpu backend, but preset jupiter-booster is a GPU cluster's \(gpu.name 'GH200.*--preset cpu" \
  "$mtc" calibrate "$tmpc/p.json" --preset jupiter-booster -o "$tmpc/gpu.yaml"
sed 's/"backend": "cpu"/"backend": "cuda"/' "$tmpc/p.json" >"$tmpc/cuda.json"
expect 2 "cuda.json: measured by the cuda backend, but preset cpu is the cpu backend's ranks" \
  "$mtc" calibrate "$tmpc/cuda.json" --preset cpu -o "$tmpc/gpu.yaml"
[ -e "$tmpc/gpu.yaml" ] && { echo "FAIL: calibrate wrote a preset from a profile of other hardware"; fail=1; }
expect 2 'cannot write .*no/dir/out.yaml' "$mtc" calibrate "$tmpc/p.json" --preset cpu -o "$tmpc/no/dir/out.yaml"
# a FIFO is refused, never waited on, as a profile and as -o; -o is never written through a link
mkfifo "$tmpc/fifo"
expect 2 'fifo: not a regular file' timeout 10 "$mtc" calibrate "$tmpc/fifo" --preset cpu -o "$tmpc/out.yaml"
expect 2 'fifo: a FIFO' timeout 10 "$mtc" calibrate "$tmpc/p.json" --preset cpu -o "$tmpc/fifo"
ln -s linked.yaml "$tmpc/link.yaml"
expect 2 'a symbolic link' "$mtc" calibrate "$tmpc/p.json" --preset cpu -o "$tmpc/link.yaml"
[ -e "$tmpc/linked.yaml" ] && { echo "FAIL: calibrate -o wrote through a link"; fail=1; }
# by hand: dense_gemm = 1e10 / (50e9 x 0.5) = 0.4, attention = 1e9 / (50e9 x 0.25) = 0.08; elementwise:
# the norm's 1e8 B (the model does not price the elementwise class's bytes) over the seconds of
# both and of the 1-rank all-gather, 0.25 s, at 10 GB/s = 0.04; the rest stays the cpu preset's
expect 0 'wrote .*out.yaml: preset cpu calibrated from 1 profile' "$mtc" calibrate "$tmpc/p.json" --preset cpu -o "$tmpc/out.yaml"
grep -q '^  dense_gemm: 0.4   # fitted from .*p.json: 10 GFLOP in 0.5 s' "$tmpc/out.yaml" &&
  grep -q '^  attention: 0.08   # fitted from' "$tmpc/out.yaml" && grep -q '^  elementwise: 0.04   # fitted from' "$tmpc/out.yaml" &&
  grep -q '^  grouped_gemm: 0.5 *$' "$tmpc/out.yaml" && grep -q '^# Calibrated by .mtc calibrate. on .* from .*p.json' "$tmpc/out.yaml" ||
  { echo "FAIL: mtc calibrate's factors (expected dense_gemm 0.4, attention 0.08, elementwise 0.04)"; cat "$tmpc/out.yaml"; fail=1; }
# two profiles: least squares in 1/factor, Σ w² / (rate Σ w m) = (1e20 + 4e20) / (50e9 (1e10 x 0.5 + 2e10 x 0.5))
sed 's/"flops": 1e10/"flops": 2e10/' "$tmpc/p.json" >"$tmpc/p2.json"
expect 0 'efficiency.dense_gemm +0.6667 ' "$mtc" calibrate "$tmpc/p.json" "$tmpc/p2.json" --preset cpu -o "$tmpc/out2.yaml"
expect 0 'predicted step' env MTC_PRESET_DIR="$tmpc" "$mtc" plan specs/tiny-moe.yaml --set cluster.preset=out
# a 2-rank profile: its collectives fit the link factors (cost.c's prices inverted). By hand, the
# cpu preset's links: 2 ranks per node, a mesh, nvlink 5 GB/s. network: the all-gather's and
# reduce-scatter's 5e8 B each (ring bytes a rank sends) over the fsdp group of 2 at 1 x 5 GB/s
# = 0.2 s at the full rate, measured 0.2 + 0.2 s: 0.2^2 / (0.2 x 0.4) = 0.5; all_to_all: 2.5e8 B
# to the one other EP rank over 1 pair link, 0.05 s at the full rate in 0.125 s: 0.4;
# elementwise: the collectives are real transfers now, not local copies: the norm's 1e8 B in the
# norm's and elementwise class's 0.2 s at 10 GB/s = 0.05
cat >"$tmpc/p2r.json" <<'JSON'
{"format": "mtc-profile-1", "model": "hand", "backend": "cpu", "world": 2, "fsdp": 2, "ep": 2, "steps": 2,
 "classes": {"gemm": {"seconds": 0.5, "calls": 10, "flops": 1e10},
             "norm": {"seconds": 0.1, "calls": 8, "bytes": 1e8},
             "elementwise": {"seconds": 0.1, "calls": 8, "bytes": 5e8},
             "all_gather": {"seconds": 0.2, "calls": 8, "bytes": 5e8},
             "reduce_scatter": {"seconds": 0.2, "calls": 8, "bytes": 5e8},
             "all_to_all": {"seconds": 0.125, "calls": 4, "bytes": 2.5e8}}}
JSON
expect 0 'efficiency.network +0.5 ' "$mtc" calibrate "$tmpc/p2r.json" --preset cpu -o "$tmpc/links.yaml"
grep -q '^  network: 0.5   # fitted from .*p2r.json: 1000 MB in 0.4 s per step and rank = 2.5 GB/s, / the group.s link' "$tmpc/links.yaml" &&
  grep -q '^  all_to_all: 0.4   # fitted from .*p2r.json: 250 MB in 0.125 s' "$tmpc/links.yaml" &&
  grep -q '^  elementwise: 0.05   # fitted from' "$tmpc/links.yaml" ||
  { echo "FAIL: mtc calibrate's link factors (expected network 0.5, all_to_all 0.4, elementwise 0.05)"; cat "$tmpc/links.yaml"; fail=1; }
# and the plan prices the exchange with it: tiny-moe's all-to-all at 0.4 of 5 GB/s is 2x the base
# preset's (all_to_all unset: network's 0.8)
a2a() { env MTC_PRESET_DIR="$tmpc" "$mtc" plan specs/tiny-moe.yaml --set cluster.preset="$1" --set plan.ep=2 --json |
  sed -n 's/.*"moe_all_to_all": \([0-9.e+-]*\).*/\1/p'; }
awk -v a="$(a2a links)" -v b="$(a2a cpu)" 'BEGIN { exit !(b > 0 && a / b > 1.999 && a / b < 2.001) }' ||
  { echo "FAIL: the calibrated all_to_all does not price tiny-moe's exchange at 2x ($(a2a links) vs $(a2a cpu) s)"; fail=1; }
# the optimizer step: 1.2e8 B (30 B per AdamW parameter of the rank's shard) in 0.04 s at the cpu
# preset's 10 GB/s: efficiency.optimizer_update 0.3; the plan then prices tiny-moe's step at 0.7 / 0.3 of
# the base preset's (elementwise 0.7 when optimizer_update is unset); a step on the host is not fitted
sed 's/"classes": {/"classes": {"optimizer": {"seconds": 0.04, "calls": 1, "bytes": 1.2e8},/' "$tmpc/p.json" >"$tmpc/opt.json"
expect 0 'efficiency.optimizer_update +0.3 ' "$mtc" calibrate "$tmpc/opt.json" --preset cpu -o "$tmpc/opt.yaml"
opt() { env MTC_PRESET_DIR="$tmpc" "$mtc" plan specs/tiny-moe.yaml --set cluster.preset="$1" --set plan.optimizer_tier=hbm \
  --set plan.optimizer_step=gpu --json | sed -n 's/.*"optimizer": \([0-9][0-9.e+-]*\).*/\1/p' | head -1; }
awk -v a="$(opt opt)" -v b="$(opt cpu)" 'BEGIN { exit !(b > 0 && a / b > 0.7 / 0.3 - 1e-3 && a / b < 0.7 / 0.3 + 1e-3) }' ||
  { echo "FAIL: the calibrated optimizer does not price tiny-moe's step at 0.7 / 0.3 ($(opt opt) vs $(opt cpu) s)"; fail=1; }
sed 's/"world": 1,/"world": 1, "optimizer_on_host": true,/' "$tmpc/opt.json" >"$tmpc/opthost.json"
"$mtc" calibrate "$tmpc/opthost.json" --preset cpu -o "$tmpc/opthost.yaml" | grep -q 'efficiency.optimizer_update' &&
  { echo "FAIL: mtc calibrate fitted efficiency.optimizer_update from a step on the host"; fail=1; }
sed 's/"seconds": 0.125/"seconds": 0.01/' "$tmpc/p2r.json" >"$tmpc/fastlink.json" # 25 GB/s on a 5 GB/s link
expect 2 'efficiency.all_to_all would be 5, above 1.*raise links.nvlink / links.internode in cpu' \
  "$mtc" calibrate "$tmpc/fastlink.json" --preset cpu -o "$tmpc/out.yaml"
rm -rf "$tmpc"

[ $fail -eq 0 ] && echo "ok: command line"
exit $fail
