# tests/train/lib.sh — what every end-to-end check of the generated training program shares:
# sourced by tests/train/CHECK.sh (one file per check, each a ctest train_CHECK) with the check's
# arguments MTC SOURCE_DIR [sanitize]: compile, mtc build and run on the cpu backend in a scratch
# directory removed at exit. Provides $mtc, $src, $work, $text, $tiny, small=(...), mpirun=(...),
# build NAME SPEC REAL [--set ...], losses FILE, die MESSAGE and $fail.
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
