# tests/train/lib.sh — what every end-to-end check of the generated training program shares:
# sourced by tests/train/CHECK.sh (one file per check, each a ctest train_CHECK) with the check's
# arguments MTC SOURCE_DIR [sanitize]: compile, mtc build and run on the cpu backend in a scratch
# directory removed at exit. Provides $mtc, $src, $work, $text, $tiny, small=(...), mpirun=(...),
# build NAME SPEC REAL [--set ...], losses FILE, run_output LOG JSONL DIR [EVERY], die MESSAGE
# and $fail.
# With "sanitize", the programs are built with AddressSanitizer and UBSan.
set -u
mtc=$(realpath "$1"); src=$(realpath "$2"); san=; [ "${3:-}" = sanitize ] && san=sanitize
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

# same_losses REF RUN WHAT N: RUN's N steps of losses ($work/RUN.jsonl) against REF's within 1e-5
# relative, printing the worst difference under WHAT
same_losses() {
  paste <(losses "$work/$1.jsonl") <(losses "$work/$2.jsonl") | awk -v what="$3" -v want="$4" '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r
      if (r > 1e-5) { printf "step %d: %s, %s against %s\n", n, what, $2, $1; bad = 1 } }
    END { printf "%s: %d steps, worst relative loss difference %.2e\n", what, n, worst; exit (bad || n != want) }'
}

# cp2_against REF RUN NP: RUN, a cp 2 program, on NP ranks against REF's 6 steps on 1 rank
# ($work/REF.jsonl), within 1e-5
cp2_against() {
  local ref=$1 d=$2 np=$3
  grep -q '^#define PLAN_CP 2$' "$work/$d/step.h" || die "$d: the plan did not take cp 2"
  (cd "$work" && "${mpirun[@]}" -np "$np" "./$d/build/train" --data "$text" --metrics "$d.jsonl" >/dev/null) ||
    { die "$d: $np rank run"; return; }
  same_losses "$ref" "$d" "1 rank against $np ($(sed -n 's/^policy     //p' "$work/$d/plan.txt"))" 6 ||
    die "$d: losses differ from 1 rank"
}

# run_output LOG JSONL DIR [EVERY]: what a run of DIR's program printed (LOG)
# and wrote (JSONL), as a trainer reads them. Every metrics line has "time" (seconds since the
# epoch, never decreasing), "step_seconds", "tokens_per_second" (plan.json's tokens per step over
# step_seconds) and "run", one run id on every line, the one the start-up line names; every step
# line shows the step's seconds and, only on the cpu preset (a peak of the core that runs it), MFU =
# tokens/s per rank x plan.json's flops_per_token / its peak; a progress line (elapsed, ETA) every
# EVERY steps (default 10) but the last, and the elapsed line at the end.
run_output() {
  python3 - "$@" <<'PY'
import json, re, sys
log, jsonl, d = sys.argv[1], sys.argv[2], sys.argv[3]
every = int(sys.argv[4]) if len(sys.argv) > 4 else 10
plan = json.load(open(d + "/plan.json"))
tokens, fpt = plan["training"]["tokens_per_step"], plan["model"]["flops_per_token"]
peak = plan["cluster"]["peak_bf16_flops_per_gpu"]
lines = [json.loads(l) for l in open(jsonl)]
text = open(log).read().splitlines()
assert lines, "no metrics lines"
runs = {l.get("run") for l in lines}
assert len(runs) == 1 and re.fullmatch(r"[0-9a-f]{16}", lines[0]["run"]), runs
start = [t for t in text if re.search(r"; run [0-9a-f]{16}$", t)]
assert start and start[0].endswith("; run " + lines[0]["run"]), start
prev = 0
for l in lines:
    for k in ("time", "step_seconds", "tokens_per_second"):
        assert isinstance(l.get(k), (int, float)), (k, l)
    assert l["time"] > 1.6e9 and l["time"] >= prev and l["step_seconds"] > 0, l
    prev = l["time"]
    want = tokens / l["step_seconds"]
    assert abs(l["tokens_per_second"] - want) <= 0.05 + 1e-5 * want, (l, want)
steps = {int(m.group(1)): t for t in text for m in [re.match(r"step +(\d+)/\d+ \|", t)] if m}
assert sorted(steps) == [l["step"] for l in lines], (sorted(steps), [l["step"] for l in lines])
cpu_preset = re.search(r'^#define SPEC_GPU_NAME "cpu', open(d + "/step.h").read(), re.M) is not None
for l in lines:
    t = steps[l["step"]]
    m = re.search(r"\| ([0-9.]+) s \| (\d+) tokens/s \((\d+) per rank\)( \| MFU ([0-9.e+-]+)%)?", t)
    assert m and abs(float(m.group(1)) - l["step_seconds"]) <= 0.0005 + 1e-6, (t, l)
    assert bool(m.group(5)) == cpu_preset, ("MFU shown on the cpu backend only where the spec's ranks are cores", t)
    if not cpu_preset:
        continue
    tps = float(m.group(3))
    mfu = 100 * tps * fpt / peak
    assert abs(float(m.group(5)) - mfu) <= 0.006 * mfu + 100 * 0.5 * fpt / peak, (t, mfu)
first, last = lines[0]["step"], lines[-1]["step"]
total = int(re.match(r"step +\d+/(\d+)", steps[first]).group(1))
prog = [t for t in text if t.startswith("progress: ")]
want = [s for s in range(first, last) if (s - first + 1) % every == 0]
assert [int(re.match(r"progress: step (\d+)/", t).group(1)) for t in prog] == want, (prog, want)
for t in prog:
    assert re.fullmatch(r"progress: step \d+/%d \(\d+%%\), elapsed \d+:\d\d:\d\d, ETA \d+:\d\d:\d\d at [0-9.]+ s per "
                        r"step \(mean of .*\)" % total, t), t
end = [t for t in text if t.startswith("elapsed: ")]
assert len(end) == 1 and re.fullmatch(r"elapsed: \d+:\d\d:\d\d for steps %d-%d of %d .*" % (first, last, total), end[0]), end
print("%d metrics lines with time, step_seconds, tokens_per_second and run %s; step lines with seconds and MFU; %d "
      "progress lines" % (len(lines), lines[0]["run"], len(prog)))
PY
}
