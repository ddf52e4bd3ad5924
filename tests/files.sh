#!/usr/bin/env bash
# What mtc does to files it is handed (issue 16, items 1 and 5), on one small checkpoint:
#   replace   mtc export and a checkpoint save replace only a regular file or a missing path:
#             a character device (mknod, in a temporary directory: never the real /dev), a FIFO,
#             a directory and a symlink (to a device, to a file, into a checkpoint) are refused
#             (exit 2, naming the path) and stay what they were; export never writes into a
#             checkpoint directory
#   manifest  copies of the checkpoint, each with one manifest field corrupted (overlapping
#             tensors and an empty tensor list among them), are refused by mtc export (exit 2,
#             naming manifest.json, the field and the tensor) and by a resume (exit 2), never a
#             crash; an edited seed and two tensors' names swapped fail the manifest's checksum;
#             a resume with another data file says that the run's settings differ, and which;
#             a resume refuses another model's checkpoint, naming both models
#   model     the 4-layer checkpoint resumed by a 3-layer and by a 5-layer program: refused
#             (exit 2), naming the tensor, what the checkpoint has and what the program expects
#   crash     (items 4 and 13) a run killed mid-save and resumed leaves a metrics file equal to
#             an uninterrupted run's (the lines past the checkpoint and a cut last line dropped);
#             a save that fails (RLIMIT_FSIZE: "File too large") exits 1 naming the shard and
#             leaves no step directory, shard or .tmp file; a metrics write that fails exits 1
#             at once; a FIFO as --data or --metrics is refused, not waited on; a new run empties
#             an earlier run's metrics file, a resume one that stops short of its checkpoint's
#             step or at another run's line (each saying so); a --metrics link to nothing is
#             refused and nothing is created where it points
#   prune     --keep-checkpoints removes only complete checkpoints of mtc's (step-%08d, a real
#             directory, a manifest): never through a link named step-N, nor a directory without
#             a manifest, nor a name of another form, nor a file of the user's in one (warned);
#             a save never writes through a link named step-N
#   names     a spec file name holding a newline + a CMake command, a quote, $(...), backticks,
#             "*", "??" and <script> is escaped in every generated file: the program builds,
#             nothing it names runs, step.h's SPEC_FILE is the name, report.html has no tag;
#             plan.txt, mtc check and compile's output show control bytes as \ooo, on one line
#   dirs      compile refuses a non-empty directory it did not write (--force overrides); a
#             recompile that writes no program removes the old one; mtc build refuses a program
#             that is not its plan.json's; a compile output that cannot be replaced (a FIFO) is
#             refused and stays; a recompile on a full disk (RLIMIT_FSIZE) leaves every file of
#             the earlier compile as it was, and no .tmp
#   paths     a --checkpoint-dir of 1090, 1120 and 3000 bytes: the step's manifest and shard land
#             inside it, "saved checkpoint D/step-N" names them and a resume finds them; one too
#             long for a step's file names (4080 bytes) is refused at start-up, nothing created
#   cmake     compile -o 'notes.txt;x', a compile run in a directory 'cwd;z' and mtc build of
#             'notes.txt;y' are refused (exit 2, naming the ';'): nothing written, notes.txt intact
#   roots     export refuses a --checkpoint-dir's lock and root; a step directory as --checkpoint-dir
#             and a step-00000005 holding step 1's checkpoint are refused, nothing written
#   cut       the data file emptied during a run: no SIGBUS; named, the state saved, exit 1, resumed
#   messages  compile -o FILE refused as not a directory; the build hint shell-quoted; SIGINT saves
#             and stops as SIGTERM does, and so does SIGHUP; one before the first step stops the run
#             there, --checkpoint-dir and --metrics as they were; a closed stdout pipe does not kill a
#             run; --metrics /proc/self/status refused at start-up; a run refused at start-up
#             creates no --checkpoint-dir and leaves no lock; a second run on one --metrics file and
#             a second compile into one -o directory at once are refused; -o -dash's build hint is
#             ./-dash
#   kill      kill -9 at two random points of a run saving after every step: every checkpoint
#             with a manifest is whole, every resume equals the unkilled run bit for bit
#   usage: files.sh MTC SOURCE_DIR
set -u
mtc=$(realpath "$1"); src=$(realpath "$2")
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/mtc-files.XXXXXX"); trap 'rm -rf "$work"' EXIT
text=/usr/share/games/fortunes/cookie
[ -r "$text" ] || { echo "FAIL: $text is missing; install Debian's fortunes package"; exit 1; }
fail=0
die() { echo "FAIL: $*"; fail=1; }
cd "$work" || exit 1

# a one-step, one-rank tiny-moe and its checkpoint
"$mtc" compile "$src/specs/tiny-moe.yaml" -o t1 --set training.steps=1 --set training.warmup_steps=0 \
  --set training.seq_len=64 --set cluster.gpus_per_node=1 --set plan.fsdp=1 >/dev/null || { echo "FAIL: compile"; exit 1; }
"$mtc" build t1 >build.log 2>&1 || { cat build.log; echo "FAIL: mtc build"; exit 1; }
t1/build/train --data "$text" --checkpoint-dir ck >/dev/null || { echo "FAIL: training run"; exit 1; }
ck=ck/step-00000001
"$mtc" export ck model.safetensors >/dev/null || die "export of a good checkpoint"

# ---- replace: only a regular file or a missing path
# refused TEST PATH: export to PATH exits 2 naming it, and `test TEST PATH` still holds after
refused() {
  local t=$1 p=$2 out rc
  out=$(timeout 60 "$mtc" export ck "$p" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -qE "$p(: | -> )" && echo "$out" | grep -q "expected a regular file or a path that does not exist" ||
    die "export to $p: exit $rc, $out"
  test "$t" "$p" || die "export changed $p (no longer test $t)"
  [ ! -e "$p.tmp" ] || die "export left $p.tmp"
}
mkfifo fifo && refused -p fifo
mkdir adir && refused -d adir
if mknod fakenull c 1 3 2>/dev/null; then
  refused -c fakenull
  ln -s fakenull link-to-dev && refused -c link-to-dev
else
  echo "skipped: mknod (not root): the character-device cases"
fi
echo old >regular && "$mtc" export ck regular >/dev/null && [ "$(head -c 8 regular | od -An -tu8 | tr -d ' ')" -gt 0 ] ||
  die "export over a regular file"
# a symlink is never written through: not to a file of the user's, not into a checkpoint (a shard)
echo mine >mine && ln -s mine link-to-file && refused -L link-to-file && [ "$(cat mine)" = mine ] || die "export wrote through a link"
cp ck/step-00000001/rank-00000.bin shard.orig && ln -s ck/step-00000001/rank-00000.bin link-to-shard &&
  refused -L link-to-shard && cmp -s shard.orig ck/step-00000001/rank-00000.bin || die "export replaced a shard through a link"
cp -r ck ckcopy && out=$("$mtc" export ck ckcopy/step-00000001/rank-00000.bin 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "is inside a checkpoint directory (ckcopy/step-00000001 holds a manifest.json)" &&
  cmp -s shard.orig ckcopy/step-00000001/rank-00000.bin || die "export over another checkpoint's shard: exit $rc, $out"
ln -s no-such-file dangling && refused -L dangling
mkdir -p fifock/step-00000001 && mkfifo fifock/step-00000001/manifest.json
out=$(timeout 10 "$mtc" export fifock/step-00000001 x.safetensors 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "a FIFO" || die "a FIFO as manifest.json: exit $rc, $out"
mkfifo new.safetensors.tmp && timeout 60 "$mtc" export ck new.safetensors >/dev/null 2>&1
[ $? -eq 2 ] && [ -p new.safetensors.tmp ] && [ ! -e new.safetensors ] || die "export over a FIFO at OUT.tmp"
# a checkpoint save: a FIFO where a shard goes is refused, and stays a FIFO
mkdir -p ck2/step-00000001 && mkfifo ck2/step-00000001/rank-00000.bin
out=$(timeout 60 t1/build/train --data "$text" --checkpoint-dir ck2 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -lt 124 ] && echo "$out" | grep -q "rank-00000.bin: a FIFO; expected a regular file" &&
  [ -p ck2/step-00000001/rank-00000.bin ] || die "checkpoint save over a FIFO: exit $rc, $out"
[ $fail -eq 0 ] && echo "ok: export and checkpoints replace only regular files"

# ---- prune: --keep-checkpoints removes only checkpoints mtc wrote, never through a link
prev=$fail; fail=0
mkdir -p ckP/step-00000000 ckP/step-00000002 && echo mine >ckP/step-00000000/keep.txt && echo mine >ckP/step-00000002/notes.txt
cp -r "$ck" victim && ln -s "$work/victim" ckP/step-00000001        # a link named as a checkpoint, to a copy of one
mkdir -p ckP/step-1 && cp "$ck/manifest.json" ckP/step-1/ && echo mine >ckP/step-1/rank-00000.bin # not mtc's name
out=$(timeout 120 t1/build/train --data "$text" --steps 4 --checkpoint-dir ckP --checkpoint-every 1 --keep-checkpoints 1 2>&1); rc=$?
[ $rc -eq 0 ] || die "training with --keep-checkpoints 1: exit $rc, $out"
[ -L ckP/step-00000001 ] && cmp -s victim/rank-00000.bin "$ck/rank-00000.bin" && cmp -s victim/manifest.json "$ck/manifest.json" ||
  die "pruning followed the link step-00000001: $(ls -la victim)"
[ "$(cat ckP/step-00000000/keep.txt)" = mine ] || die "pruning removed a directory without a manifest"
[ "$(cat ckP/step-1/rank-00000.bin)" = mine ] && [ -f ckP/step-1/manifest.json ] || die "pruning removed step-1 (not mtc's name)"
[ "$(ls ckP/step-00000002)" = notes.txt ] || die "pruning step 2: expected only the user's notes.txt to stay: $(ls ckP/step-00000002)"
echo "$out" | grep -q "warning: --keep-checkpoints 1: ckP/step-00000002: removed the checkpoint's files, kept the directory: it also holds notes.txt" ||
  die "no warning naming notes.txt: $out"
[ ! -e ckP/step-00000003 ] && [ -f ckP/step-00000004/manifest.json ] || die "pruning: $(ls ckP)"
# a checkpoint save never writes through a link named step-N
rm -rf ckQ victim2 && mkdir ckQ victim2 && ln -s "$work/victim2" ckQ/step-00000001
out=$(timeout 60 t1/build/train --data "$text" --steps 1 --checkpoint-dir ckQ 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "ckQ/step-00000001: a symbolic link; expected a directory mtc creates" &&
  [ -z "$(ls victim2)" ] || die "a save through a link step-00000001: exit $rc, $out, $(ls victim2)"
[ $fail -eq 0 ] && echo "ok: --keep-checkpoints removes only mtc's checkpoint files, never through a link"
fail=$((fail | prev))

# ---- names: a spec file name is data in every generated file (issue 16 item 2)
prev=$fail; fail=0
mkdir names && cd names || exit 1
weird=$(printf 'q"uote\nadd_custom_target(pwn ALL COMMAND touch pwned-cmake)\n$(touch pwned-sh)`touch pwned-tick`*<script>??.yaml')
cp "$src/specs/tiny-moe.yaml" "$weird"
"$mtc" compile "$weird" -o p --set training.steps=1 --set training.warmup_steps=0 --set training.seq_len=64 --set cluster.gpus_per_node=1 \
  --set plan.fsdp=1 >/dev/null || die "compile of a spec with an odd file name"
"$mtc" build p >build.log 2>&1 || { cat build.log; die "mtc build of a spec with an odd file name"; }
bash -n p/launch.sbatch || die "launch.sbatch is not valid shell"
DATA=/dev/null bash -c 'sed -n "1,/^set -euo/p" p/launch.sbatch | bash' || die "launch.sbatch's header ran something"
p/build/train --help >/dev/null || die "train --help"
ls pwned* 2>/dev/null && die "a name in a generated file ran as code"
grep -c 'touch pwned-cmake' p/CMakeLists.txt p/launch.sbatch p/kernels.cu p/step.c | grep -v ':1$' && die "the name is not one line"
grep '^#define SPEC_FILE ' p/step.h >spec_file.h
printf '#include <stdio.h>\n#include "spec_file.h"\nint main(void) { fputs(SPEC_FILE, stdout); return 0; }\n' >spec_file.c
cc -std=c11 spec_file.c -o spec_file && [ "$(./spec_file)" = "$weird" ] || die "SPEC_FILE is not the file name"
grep -q '<script' p/report.html p/memory.svg && die "report.html or memory.svg holds the name's <script> unescaped"
# control bytes of a name never reach a terminal or plan.txt raw: \ooo, one line
head -1 p/plan.txt | grep -qF 'q"uote\012add_custom_target' || die "plan.txt's first line: $(head -2 p/plan.txt)"
[ "$("$mtc" check "$weird" | wc -l)" -eq 1 ] && "$mtc" check "$weird" | grep -qF 'q"uote\012add' || die "mtc check prints the name raw"
[ "$("$mtc" compile "$src/specs/tiny-moe.yaml" -o "$(printf 'o\033[31mut')" --set training.steps=1 | grep -c $'\033')" -eq 0 ] ||
  die "compile printed an -o directory's escape byte raw"
cd .. && [ $fail -eq 0 ] && echo "ok: a spec file name is escaped in C, CMake, shell, CUDA and HTML"
fail=$((fail | prev))

# ---- dirs: compile writes only where it may; the program is its plan's (issue 16 item 7)
prev=$fail; fail=0
small="--set training.steps=1 --set training.warmup_steps=0 --set training.seq_len=64 --set cluster.gpus_per_node=1 --set plan.fsdp=1"
mkdir own && echo 'my own' >own/train.c && echo 'cmake_minimum_required(VERSION 3.0)' >own/CMakeLists.txt
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o own $small 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "own is not empty.*--force" && [ "$(cat own/train.c)" = "my own" ] &&
  [ ! -e own/plan.json ] || die "compile into a directory of the user's: exit $rc, $out"
"$mtc" compile "$src/specs/tiny-moe.yaml" -o own $small --force >/dev/null && grep -q rt_ckpt own/train.c ||
  die "compile --force"
"$mtc" build own >build.log 2>&1 && [ -x own/build/train ] || { cat build.log; die "mtc build own"; }
# a program file edited after compile wrote it is refused by mtc build (program.sum), unless --allow-edits
cp -r own edits && echo '/* my tweak */' >>edits/step.c
out=$("$mtc" build edits 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "edits/step.c was changed after mtc compile wrote it (program.sum: [0-9a-f]*, now [0-9a-f]*).*--allow-edits" ||
  die "mtc build of an edited step.c: exit $rc, $out"
out=$("$mtc" build edits --allow-edits 2>&1) && echo "$out" | grep -q "note: building an edited program" && [ -x edits/build/train ] ||
  die "mtc build --allow-edits: $out"
# a recompile does not silently replace an edited program file (program.sum), nor does a compile that writes
# no program remove files that are not mtc's, or follow a link out of the directory
cp -r own edit2 && echo '/* mine */' >>edit2/train.c
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o edit2 $small 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "edit2/train.c was changed after mtc compile wrote it.*--force" && tail -1 edit2/train.c | grep -q mine ||
  die "a recompile over an edited train.c: exit $rc, $out"
mkdir -p outside && echo 'not mtc' >outside/train && ln -s ../outside edit2/build-link && echo 'my own' >edit2/step.c
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o edit2 --force --set cluster.gpu.hbm=1MiB --set cluster.nodes=1 2>&1); rc=$?
[ $rc -eq 1 ] && [ -f outside/train ] && [ "$(cat edit2/step.c)" = "my own" ] && [ ! -e edit2/train.c ] ||
  die "an infeasible recompile removed files that are not mtc's: exit $rc, $(ls edit2 outside), $out"
# a compile killed before its renames leaves only .tmp files: the next compile into the new directory proceeds
mkdir killedc && echo partial >killedc/report.html.tmp && echo partial >killedc/plan.json.tmp
"$mtc" compile "$src/specs/tiny-moe.yaml" -o killedc $small >/dev/null 2>&1 && [ -f killedc/plan.json ] ||
  die "a compile after a killed one"
# a copied program directory with its build tree: mtc build configures the copy afresh, saying so
cp -r own copied && out=$("$mtc" build copied 2>&1) && echo "$out" | grep -q "copied/build was configured for .*own/build (a copied build tree): configuring it afresh" &&
  grep -q "CMAKE_CACHEFILE_DIR:INTERNAL=.*copied/build" copied/build/CMakeCache.txt || die "mtc build of a copied directory: $out"
"$mtc" compile "$src/specs/tiny-moe.yaml" -o own $small >/dev/null || die "a recompile into mtc's own directory"
# a plan.json saved from `mtc plan --json` does not make a directory compile's, nor does a hand-edited program file
mkdir planned && "$mtc" plan "$src/specs/tiny-moe.yaml" $small --json >planned/plan.json && echo 'my own' >planned/train.c
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o planned $small 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "planned is not empty.*--force" && [ "$(cat planned/train.c)" = "my own" ] ||
  die "compile into a directory holding mtc plan --json's plan.json: exit $rc, $out"
"$mtc" compile "$src/specs/tiny-moe.yaml" -o edited $small >/dev/null && echo '/* mine */' >edited/step.h
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o edited $small 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "holds step.h, which mtc compile did not write" && grep -qx '/\* mine \*/' edited/step.h ||
  die "compile over a hand-written step.h: exit $rc, $out"
mkdir empty && "$mtc" compile "$src/specs/tiny-moe.yaml" -o empty $small >/dev/null || die "compile into an empty directory"
# a recompile with no program (MLA with biases; an infeasible plan) removes the old program
out=$("$mtc" compile "$src/specs/deepseek-v3.yaml" -o own --set model.bias=true 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "removed the program" && [ ! -e own/step.c ] && [ ! -e own/train.c ] &&
  [ ! -e own/CMakeLists.txt ] && [ ! -e own/build/train ] || die "an MLA recompile left the old program: exit $rc, $out"
out=$("$mtc" build own 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "no generated program here" || die "mtc build of a plan without a program: $rc, $out"
"$mtc" compile "$src/specs/tiny-moe.yaml" -o own $small >/dev/null || die "compile"
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o own --set cluster.nodes=1 --set cluster.gpu.hbm=1MiB 2>&1); rc=$?
[ $rc -eq 1 ] && [ ! -e own/step.c ] || die "an infeasible recompile left the old program: exit $rc, $out"
# mtc build refuses a program that is not its plan.json's
"$mtc" compile "$src/specs/tiny-moe.yaml" -o own $small >/dev/null &&
  "$mtc" compile "$src/specs/deepseek-v3.yaml" -o ds >/dev/null 2>&1; cp ds/plan.json own/plan.json
out=$("$mtc" build own 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "own/step.h is not the program of own/plan.json (step.h: model 'tiny-moe'.*plan.json: model 'deepseek-v3'" ||
  die "mtc build of a program with another plan.json: exit $rc, $out"
sed -i '/PLAN_HASH/d' names/p/step.h && out=$("$mtc" build names/p 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "plan none" || die "mtc build of a step.h without PLAN_HASH: exit $rc, $out"
# a compile output that is not a regular file is refused, not replaced; no .tmp stays
rm -rf fifo-out && mkdir fifo-out && "$mtc" compile "$src/specs/tiny-moe.yaml" -o fifo-out $small >/dev/null &&
  rm fifo-out/step.c && mkfifo fifo-out/step.c
out=$(timeout 20 "$mtc" compile "$src/specs/tiny-moe.yaml" -o fifo-out $small 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "fifo-out/step.c: a FIFO" && [ -p fifo-out/step.c ] &&
  [ -z "$(ls fifo-out | grep '\.tmp$')" ] || die "compile over a FIFO: exit $rc, $out"
# a recompile on a full disk (files over 20 KiB refused: plan.json fits, step.c and report.html do not)
# changes nothing
rm -rf full-out && "$mtc" compile "$src/specs/tiny-moe.yaml" -o full-out $small >/dev/null && cp -r full-out full-out.orig ||
  die "compile full-out"
out=$( (trap '' XFSZ; ulimit -f 20; "$mtc" compile "$src/specs/tiny-moe.yaml" -o full-out $small --set training.steps=2) 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "full-out/[a-z.]*.*File too large" && echo "$out" | grep -q "nothing in full-out was changed" &&
  diff -r full-out.orig full-out >/dev/null || die "a recompile on a full disk: exit $rc, $out, $(diff -r full-out.orig full-out)"
[ $fail -eq 0 ] && echo "ok: compile writes only empty or its own directories, atomically; build checks the plan"
fail=$((fail | prev))

# ---- manifest: every field checked
# corrupt NAME FIELD PYTHON: a copy of the checkpoint in bad/NAME whose manifest m is edited by
# PYTHON; export and resume must refuse it with exit 2, export's message naming FIELD
corrupt() {
  local name=$1 field=$2 edit=$3 out rc
  mkdir -p "bad/$name" && cp -r "$ck" "bad/$name/" || return
  python3 -c "
import json, sys
p = sys.argv[1]; m = json.load(open(p))
routed = next(t for t in m['tensors'] if t['experts'])
dense = m['tensors'][1]
$edit
json.dump(m, open(p, 'w'), indent=1)" "bad/$name/step-00000001/manifest.json" || { die "$name: edit"; return; }
  out=$(timeout 60 "$mtc" export "bad/$name" "bad/$name.safetensors" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "manifest.json: $field\|$field" && [ ! -e "bad/$name.safetensors" ] ||
    die "$name: export exit $rc (expected 2, a message naming $field): $out"
  out=$(timeout 60 t1/build/train --data "$text" --checkpoint-dir "bad/$name" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "error: resuming from" || die "$name: resume exit $rc (expected 2): $out"
}
corrupt group_shard_0    'groups\[0\] shard is 0'        "m['groups'][0]['shard'] = 0"
corrupt group_full       'groups\[1\] full is'           "m['groups'][1]['full'] += 4"
corrupt group_comm       'groups\[0\] comm is 7'         "m['groups'][0]['comm'] = 7"
corrupt offset_outside   'offset 1000000000000'          "dense['offset'] = 10**12"
corrupt offset_negative  'offset -4'                     "dense['offset'] = -4"
corrupt name_percent     "expected no % in a tensor name" "dense['name'] = 'model.%s%n%s.weight'"
corrupt name_pattern     'expected one %d'               "routed['name'] = routed['name'].replace('%d', '%s%d')"
corrupt name_twice       "twice"                         "m['tensors'][2]['name'] = m['tensors'][1]['name']"
corrupt experts_neg      'experts is -3'                 "routed['experts'] = -3"
corrupt experts_huge     'experts is 1073741824'         "routed['experts'] = 1 << 30"
corrupt experts_dense    'experts is 8 in group'         "dense['experts'] = 8"
corrupt rows_count       'count 32768, rows 257'         "m['tensors'][0]['rows'] += 1"
corrupt group_index      'group is 99'                   "dense['group'] = 99"
corrupt layout_ep        'layout.ep is 3'                "m['layout']['ep'] = 3"
corrupt layout_world     'layout has world 2'            "m['layout']['world'] = 2"
corrupt experts_per_rank 'experts_per_rank is'           "m['layout']['experts_per_rank'] = 1 << 40"
corrupt real_bytes       'real_bytes is 2'               "m['real_bytes'] = 2"
corrupt step_negative    'step is -1'                    "m['step'] = -1"
corrupt seed_text        "seed is 'zz'"                  "m['seed'] = 'zz'"
corrupt optimizer        "optimizer is 'sgd'"            "m['optimizer'] = 'sgd'"
corrupt model_keys       'model_keys is not a string'    "m['model_keys'] = 5"
corrupt shards_missing   'shards has 0 entries'          "m['shards'] = []"
corrupt shard_bytes      'shards\[0\] bytes is'          "m['shards'][0]['bytes'] += 8"
corrupt shard_file       "shards\[0\] file is '../x'"    "m['shards'][0]['file'] = '../x'"
corrupt header_step      'step is 2, but its directory is named for step 1' "m['step'] = 2"
corrupt not_a_number     'groups\[0\] is malformed'      "m['groups'][0]['shard'] = 'many'"
corrupt tensors_empty    'tensors is empty'              "m['tensors'] = []"
corrupt overlap_dense    'q_proj.weight) has elements \[128, 16512) of group 1, which overlap tensors\[1\]' "dense['offset'] = 64"
corrupt overlap_routed   'up_proj.weight) has elements \[262144, 524288) of group 2, which overlap' "routed['offset'] += 1"
# resign MANIFEST: its manifest_fnv1a64 recomputed, as the trainer computes it (FNV-1a 64 of the
# compact JSON with sorted keys, less that field): a hand edit that passes the checksum
resign() {
  python3 -c "
import json, sys
p = sys.argv[1]; m = json.load(open(p)); m.pop('manifest_fnv1a64', None)
h = 0xcbf29ce484222325
for b in json.dumps(m, sort_keys=True, separators=(',', ':'), ensure_ascii=False).encode():
    h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
m['manifest_fnv1a64'] = '%016x' % h
json.dump(m, open(p, 'w'), indent=1)" "$1"
}
# the manifest's own checksum: an edited seed (the data order) or two tensors of one shape with
# their names swapped resume as another run: refused by resume and export, naming the field
for edit in seed names; do
  mkdir -p "sum-$edit" && cp -r "$ck" "sum-$edit/" && m=sum-$edit/step-00000001/manifest.json
  if [ $edit = seed ]; then sed -i 's/"seed": "0000000000000001"/"seed": "0000000000000002"/' "$m"
  else sed -i 's/self_attn\.k_proj/SWAP/; s/self_attn\.v_proj/self_attn.k_proj/; s/SWAP/self_attn.v_proj/' "$m"; fi
  cmp -s "$m" "$ck/manifest.json" && die "sum-$edit: the edit changed nothing"
  out=$(timeout 60 t1/build/train --data "$text" --steps 2 --metrics sum.jsonl --checkpoint-dir "sum-$edit" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "error: resuming from sum-$edit/step-00000001: $m: manifest_fnv1a64 is [0-9a-f]*, but the manifest's fields sum to [0-9a-f]*; expected the manifest as the trainer wrote it" ||
    die "a manifest with its $edit edited: resume exit $rc, $out"
  out=$(timeout 60 "$mtc" export "sum-$edit" "sum-$edit.safetensors" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "manifest_fnv1a64 is" || die "a manifest with its $edit edited: export exit $rc, $out"
done
# a resume under other settings than the checkpoint's (here another data file) says which differ
head -c 100000 "$text" >small.txt && mkdir -p runnote && cp -r "$ck" runnote/
out=$(timeout 60 t1/build/train --data small.txt --steps 2 --metrics rn.jsonl --checkpoint-dir runnote 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q '"run": "run_id [0-9a-f]\{16\}, seq_len 64, global_batch' "$ck/manifest.json" &&
  echo "$out" | grep -q "^note: this run's settings differ from the checkpoint's: data: raw-bytes $(wc -c <"$text") tokens in the checkpoint, raw-bytes 100000 tokens now$" ||
  die "a resume with another data file: exit $rc, $out"
# a checkpoint of another model (its tensors the same) is refused by a resume, naming both models
mkdir -p other && cp -r "$ck" other/ && sed -i 's/"model": "tiny-moe"/"model": "other-moe"/' other/step-00000001/manifest.json &&
  resign other/step-00000001/manifest.json
out=$(timeout 60 t1/build/train --data "$text" --checkpoint-dir other 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "^error: resuming from other/step-00000001: the checkpoint is of model 'other-moe' (its manifest.json), this program of model 'tiny-moe'; expected a checkpoint of this program's model" ||
  die "a resume from another model's checkpoint: exit $rc, $out"
[ $fail -eq 0 ] && echo "ok: corrupt manifests are refused by export and by resume, by file and field"

# ---- model: a checkpoint of another number of layers is refused, plainly
for L in 3 5; do
  "$mtc" compile "$src/specs/tiny-moe.yaml" -o "t1-$L" --set training.steps=1 --set training.warmup_steps=0 \
    --set training.seq_len=64 --set cluster.gpus_per_node=1 --set plan.fsdp=1 --set model.layers=$L >/dev/null &&
    "$mtc" build "t1-$L" >"build-$L.log" 2>&1 || { cat "build-$L.log"; die "build of $L layers"; continue; }
  out=$(timeout 60 "t1-$L/build/train" --data "$text" --checkpoint-dir ck --metrics m$L.jsonl 2>&1); rc=$?
  if [ $L = 3 ]; then want="the checkpoint has tensor model\.layers\.3\.[a-z_.]* ([0-9]*x[0-9]*), which this program lacks (resuming would drop it)"
  else want="this program has tensor model\.layers\.4\.[a-z_.*]* ([0-9]*x[0-9]*[^)]*), which the checkpoint lacks"; fi
  [ $rc -eq 2 ] && echo "$out" | grep -q "^error: resuming from ck/step-00000001: $want; expected a checkpoint of this program's model: resume" ||
    die "a $L-layer program resumed the 4-layer checkpoint: exit $rc, $out"
done
[ $fail -eq 0 ] && echo "ok: a 4-layer checkpoint is refused by 3- and 5-layer programs, naming the tensor"

# ---- crash: metrics and checkpoints after a kill, a failed save, a failed metrics write
strip() { sed 's/,"time".*//' "$1"; } # (time, step_seconds, tokens_per_second, run: not the same in two runs)
t1/build/train --data "$text" --steps 4 --metrics straight.jsonl >/dev/null || die "straight run"
(t1/build/train --data "$text" --steps 4 --metrics killed.jsonl --checkpoint-dir ckk --checkpoint-every 1 \
  --inject-kill-at-save 3; exit $?) >/dev/null 2>&1 && die "the kill did not happen"
[ "$(wc -l <killed.jsonl)" -eq 3 ] && [ -e ckk/step-00000003/rank-00000.bin ] && [ ! -e ckk/step-00000003/manifest.json ] ||
  die "expected the killed run's 3 lines and an incomplete step-00000003"
printf '{"step":4,"loss":5.1' >>killed.jsonl # and a line cut by the kill
out=$(t1/build/train --data "$text" --steps 4 --metrics killed.jsonl --checkpoint-dir ckk 2>&1) || die "resume: $out"
echo "$out" | grep -q "resumed from ckk/step-00000002" || die "expected a resume from step 2: $out"
echo "$out" | grep -q "removed 1 incomplete checkpoint(s) of an interrupted save in ckk: step-00000003" &&
  [ ! -e ckk/step-00000003 ] || die "the killed save's step-00000003 stayed: $out"
cmp -s <(strip straight.jsonl) <(strip killed.jsonl) ||
  { diff <(strip straight.jsonl) <(strip killed.jsonl); die "metrics after a kill and a resume differ from a straight run's"; }
# a resume whose metrics file is another run's (it ends at step 1, short of the checkpoint's step):
# emptied, saying so, so that it reads as one run from the checkpoint on (no steps 1 and 5 spliced)
cp -r ckk ckm && last=$(ls ckm | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1)
printf '{"step":1,"loss":9}\n' >other.jsonl
out=$(timeout 60 t1/build/train --data "$text" --steps $((last + 1)) --metrics other.jsonl --checkpoint-dir ckm 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "note: --metrics other.jsonl ended at step 1, not at the checkpoint's step $last: .*emptied" &&
  [ "$(wc -l <other.jsonl)" -eq 1 ] && grep -q "^{\"step\":$((last + 1)),\"loss\":" other.jsonl ||
  die "a resume onto another run's metrics file: exit $rc, $out, $(cat other.jsonl)"
# one that ends at the checkpoint's step, but of another run (its run id is not the checkpoint's): emptied,
# naming both runs; the lines then carry the checkpoint's run id, which its manifest's run record holds
run=$(sed -n 's/.*"run": "run_id \([0-9a-f]\{16\}\), .*/\1/p' "ckm/step-$(printf %08d $((last + 1)))/manifest.json")
printf '{"step":%d,"loss":9,"time":1,"step_seconds":1,"tokens_per_second":1,"run":"0123456789abcdef"}\n' $((last + 1)) >other.jsonl
out=$(timeout 60 t1/build/train --data "$text" --steps $((last + 2)) --metrics other.jsonl --checkpoint-dir ckm 2>&1); rc=$?
[ $rc -eq 0 ] && [ -n "$run" ] && echo "$out" | grep -q "note: --metrics other.jsonl ended at step $((last + 1)) of run 0123456789abcdef, not of this run ($run, the checkpoint's): another run's lines; emptied" &&
  [ "$(wc -l <other.jsonl)" -eq 1 ] && grep -q "^{\"step\":$((last + 2)),\"loss\":.*,\"run\":\"$run\"}$" other.jsonl ||
  die "a resume onto another run's metrics file ending at the checkpoint's step: exit $rc, run '$run', $out, $(cat other.jsonl)"
# a failing save (files over 20 MB refused; the shard is larger): exit 1, nothing of it stays
cp -r ck ckf
out=$( (trap '' XFSZ; ulimit -f 20000; timeout 60 t1/build/train --data "$text" --steps 2 --metrics f.jsonl \
  --checkpoint-dir ckf) 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "error: saving the checkpoint of step 2: ckf/step-00000002/rank-00000.bin: File too large" &&
  [ ! -e ckf/step-00000002 ] && [ -z "$(find ckf -name '*.tmp')" ] && cmp -s ck/step-00000001/manifest.json ckf/step-00000001/manifest.json ||
  die "a failed save: exit $rc, $(ls -R ckf), $out"
# a failing metrics write (a full disk: a character device like /dev/full, made here with mknod):
# exit 1 at once, at step 1
if mknod fakefull c 1 7 2>/dev/null; then
  out=$(timeout 60 t1/build/train --data "$text" --steps 3 --metrics fakefull 2>&1); rc=$?
  [ $rc -eq 1 ] && echo "$out" | grep -q "error: --metrics fakefull: No space left on device (writing step 1)" &&
    ! echo "$out" | grep -q "step     2/" && [ -c fakefull ] || die "a failed metrics write: exit $rc, $out"
else
  echo "skipped: mknod (not root): a metrics write to a full device"
fi
# a new run empties a metrics file of an earlier run's lines (saying so); a link to nothing is refused
printf '{"step":1,"loss":9}\n{"step":2,"loss":9}\n{"step":3,"loss":9}\n' >old.jsonl
out=$(t1/build/train --data "$text" --steps 2 --metrics old.jsonl 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "note: --metrics old.jsonl held 60 bytes of an earlier run; emptied" &&
  [ "$(wc -l <old.jsonl)" -eq 2 ] && ! grep -q '"loss":9}' old.jsonl || die "a new run on an old metrics file: exit $rc, $out, $(cat old.jsonl)"
# a file that is not a metrics file (the data itself, a manifest, code) is never emptied nor appended to
cp "$text" data-copy.txt && before=$(md5sum <data-copy.txt)
out=$(t1/build/train --data data-copy.txt --steps 1 --metrics data-copy.txt 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "data-copy.txt holds [0-9]* bytes that are not a metrics file of mtc's" &&
  [ "$(md5sum <data-copy.txt)" = "$before" ] || die "--metrics naming the data file: exit $rc, $out"
ln -s "$work/made-by-link.jsonl" dangling.jsonl
out=$(t1/build/train --data "$text" --steps 1 --metrics dangling.jsonl 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "dangling.jsonl -> $work/made-by-link.jsonl: a symbolic link to nothing" &&
  [ ! -e made-by-link.jsonl ] && [ -L dangling.jsonl ] || die "--metrics a link to nothing: exit $rc, $out"
# FIFOs: refused at once
mkfifo data.fifo metrics.fifo
out=$(timeout 20 t1/build/train --data data.fifo --steps 1 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "data.fifo: a FIFO, not a regular file" || die "--data FIFO: exit $rc, $out"
out=$(timeout 20 t1/build/train --data "$text" --steps 1 --metrics metrics.fifo 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "metrics.fifo: a FIFO; expected a regular file" || die "--metrics FIFO: exit $rc, $out"
[ $fail -eq 0 ] && echo "ok: metrics and checkpoints after a kill, a failed save and a failed write; FIFOs refused"
# ---- paths: a --checkpoint-dir of any length the system takes; a longer one refused up front
# pathof N: an absolute directory name of exactly N bytes under $work (components of <= 200)
pathof() {
  local p=$work/p n
  while [ $(( $1 - ${#p} )) -gt 201 ]; do p=$p/$(printf '%0200d' 0); done
  n=$(( $1 - ${#p} - 1 )); printf '%s/%s' "$p" "$(printf '%0*d' "$n" 0)"
}
for len in 1090 1120 3000; do
  d=$(pathof $len); mkdir -p "$(dirname "$d")"
  out=$(t1/build/train --data "$text" --steps 1 --checkpoint-dir "$d" 2>&1); rc=$?
  [ $rc -eq 0 ] && echo "$out" | grep -qF "saved checkpoint $d/step-00000001" && [ -f "$d/step-00000001/manifest.json" ] &&
    [ -f "$d/step-00000001/rank-00000.bin" ] && [ "$(ls "$(dirname "$d")")" = "$(basename "$d")" ] ||
    die "a --checkpoint-dir of $len bytes: exit $rc, $(cd "$(dirname "$d")" && ls -R | cut -c1-100 | head -5), $(echo "$out" | cut -c1-300)"
  out=$(t1/build/train --data "$text" --steps 2 --checkpoint-dir "$d" 2>&1); rc=$?
  [ $rc -eq 0 ] && echo "$out" | grep -qF "resumed from $d/step-00000001" && [ -f "$d/step-00000002/manifest.json" ] ||
    die "resuming from a --checkpoint-dir of $len bytes: exit $rc, $(echo "$out" | cut -c1-300)"
  rm -rf "$work/p"
done
d=$(pathof 4080); mkdir -p "$(dirname "$d")"
out=$(t1/build/train --data "$text" --steps 1 --checkpoint-dir "$d" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "error: --checkpoint-dir .*: 4080 bytes long; expected at most [0-9]* (the system's limit on a path is 4096 bytes" &&
  [ ! -e "$d" ] || die "a --checkpoint-dir too long for a step's files: exit $rc, $out"
rm -rf "$work/p"
[ $fail -eq 0 ] && echo "ok: checkpoints in --checkpoint-dirs of 1090, 1120 and 3000 bytes; one of 4080 refused up front"

# ---- cmake: a -o directory whose name CMake would split (a ';') is refused before anything is written
echo "my notes" >notes.txt
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o 'notes.txt;x' 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -qF "error: -o notes.txt;x: the path holds ';', which CMake reads as a list separator" &&
  [ ! -e 'notes.txt;x' ] && [ "$(cat notes.txt)" = "my notes" ] || die "compile -o 'notes.txt;x': exit $rc, $out"
mkdir 'notes.txt;y'
out=$("$mtc" build 'notes.txt;y' 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -qF "error: notes.txt;y: the path holds ';', which CMake reads as a list separator" &&
  [ -z "$(ls -A 'notes.txt;y')" ] && [ "$(cat notes.txt)" = "my notes" ] || die "build 'notes.txt;y': exit $rc, $out"
mkdir -p 'cwd;z' && out=$(cd 'cwd;z' && "$mtc" compile "$src/specs/tiny-moe.yaml" -o out 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -qF "the path holds ';'" && [ ! -e 'cwd;z/out' ] || die "compile -o out in 'cwd;z': exit $rc, $out"
[ $fail -eq 0 ] && echo "ok: names CMake would split refused by compile and build, nothing written"

# ---- roots: a checkpoint directory's root is the checkpoint's, a step directory is not a --checkpoint-dir,
# a step directory's name and its manifest agree
cp ck/lock lock.orig
out=$("$mtc" export ck ck/lock 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "error: ck/lock is inside a checkpoint directory (ck holds " &&
  cmp -s lock.orig ck/lock && [ ! -e ck/lock.tmp ] || die "export over a --checkpoint-dir's lock: exit $rc, $out"
out=$("$mtc" export ck ck/model.safetensors 2>&1); rc=$?
[ $rc -eq 2 ] && [ ! -e ck/model.safetensors ] || die "export into a --checkpoint-dir: exit $rc, $out"
before=$(ls -A ck/step-00000001)
out=$(t1/build/train --data "$text" --steps 1 --metrics deep.jsonl --checkpoint-dir ck/step-00000001 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "error: --checkpoint-dir ck/step-00000001 is a checkpoint's step directory .*: --checkpoint-dir ck$" &&
  [ "$(ls -A ck/step-00000001)" = "$before" ] && [ ! -e deep.jsonl ] || die "--checkpoint-dir a step directory: exit $rc, $out"
mkdir -p renamed && cp -r ck/step-00000001 renamed/step-00000005
out=$(t1/build/train --data "$text" --steps 6 --checkpoint-dir renamed 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "error: resuming from renamed/step-00000005: renamed/step-00000005/manifest.json: step is 1, but its directory is named for step 5" &&
  ! echo "$out" | grep -q "resumed from" || die "a step-00000005 holding step 1's checkpoint: exit $rc, $out"
out=$("$mtc" export renamed x5.safetensors 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "step is 1, but its directory is named for step 5" || die "export of a renamed step: exit $rc, $out"
[ $fail -eq 0 ] && echo "ok: export refuses a --checkpoint-dir's root, a step directory is no --checkpoint-dir, a renamed step is refused"

# ---- cut: the data file emptied during a run (after step 2 is reported): no SIGBUS; the rank names
# the file, the state before the step is saved, exit 1, and the checkpoint resumes once the file is back
cp "$text" cut.txt
t1/build/train --data cut.txt --steps 400 --checkpoint-dir ckcut >cut.out 2>cut.err &
pid=$!
for _ in $(seq 600); do grep -q "^step     2/" cut.out && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
: >cut.txt
wait $pid; rc=$?
saved=$(sed -n 's/^saved checkpoint ckcut\/\(step-[0-9]*\)$/\1/p' cut.out | tail -1)
[ $rc -eq 1 ] && grep -q "error: rank 0: --data cut.txt: cannot read tokens .*the file was cut or replaced during the run" cut.err &&
  grep -q "error: stopped at step [0-9]*: the data file could not be read; the state before it is saved in ckcut" cut.err &&
  [ -n "$saved" ] && [ -f "ckcut/$saved/manifest.json" ] || die "a data file cut during a run: exit $rc, $(cat cut.err), $(tail -3 cut.out)"
cp "$text" cut.txt
out=$(t1/build/train --data cut.txt --steps $((10#${saved#step-} + 1)) --checkpoint-dir ckcut 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "resumed from ckcut/$saved" || die "resuming after a cut data file: exit $rc, $out"
[ $fail -eq 0 ] && echo "ok: a data file cut during a run: named, the state saved, exit 1, resumed"
# ---- messages: compile -o a file is refused as not a directory (no "free disk space"), the build
# hint is shell-quoted, SIGINT saves and stops as SIGTERM does
echo "keep" >afile
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o afile 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "error: -o afile: a regular file, not a directory" && ! echo "$out" | grep -q "free disk space" &&
  [ "$(cat afile)" = keep ] || die "compile -o a regular file: exit $rc, $out"
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o "my prog's dir" 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -qF "build with: mtc build 'my prog'\\''s dir'" || die "the build hint for a name with a space and a quote: exit $rc, $out"
env --default-signal=INT t1/build/train --data "$text" --steps 400 --checkpoint-dir ckint >int.out 2>int.err &
pid=$!
for _ in $(seq 600); do grep -q "^step     1/" int.out && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -INT $pid; wait $pid; rc=$?
[ $rc -eq 0 ] && grep -q "^stopped after step [0-9]* on SIGINT; run the same command again to resume from ckint" int.out &&
  grep -q "^saved checkpoint ckint/step-" int.out || die "SIGINT: exit $rc, $(cat int.err), $(tail -3 int.out)"
# --metrics on a kernel pseudo file system (/proc: a "regular" file that takes no lines) is refused at
# start-up, not at step 1
out=$(t1/build/train --data "$text" --steps 2 --metrics /proc/self/status 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "error: --metrics /proc/self/status: a file of the kernel's proc file system" &&
  ! echo "$out" | grep -q "^step " || die "--metrics /proc/self/status: exit $rc, $out"
# a stop signal before the first step (here pending when train starts: blocked by the launcher, which
# train unblocks) stops the run there: exit 0, nothing trained, no --checkpoint-dir created, an existing
# one and the metrics file as they were
pending() { python3 -c 'import os, signal, sys
s = getattr(signal, sys.argv[1]); signal.pthread_sigmask(signal.SIG_BLOCK, {s}); os.kill(os.getpid(), s)
os.execv(sys.argv[2], sys.argv[2:])' "$@"; }
cp straight.jsonl early.jsonl
out=$(pending SIGINT t1/build/train --data "$text" --steps 4 --checkpoint-dir ckearly --metrics early.jsonl 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^stopped on SIGINT before step 1: nothing trained; --checkpoint-dir ckearly is as it was" &&
  ! echo "$out" | grep -q "^step" && [ ! -e ckearly ] && cmp -s straight.jsonl early.jsonl ||
  die "SIGINT before step 1: exit $rc, $(ls -A ckearly 2>&1), $out"
before=$(ls -lR ckm | md5sum)
out=$(pending SIGTERM t1/build/train --data "$text" --steps 40 --checkpoint-dir ckm --metrics early.jsonl 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^stopped on SIGTERM before step $((last + 3)): nothing trained; --checkpoint-dir ckm is as it was: run the same command again to resume" &&
  [ "$(ls -lR ckm | md5sum)" = "$before" ] && cmp -s straight.jsonl early.jsonl || die "SIGTERM before a resumed run's first step: exit $rc, $out"
# a run refused at start-up (its data missing) leaves no --checkpoint-dir and no lock behind
out=$(t1/build/train --data no-such-data --steps 1 --checkpoint-dir refused-ck 2>&1); rc=$?
[ $rc -eq 2 ] && [ ! -e refused-ck ] || die "a refused run created its --checkpoint-dir: exit $rc, $(ls -A refused-ck), $out"
mkdir -p refused-ck2 && echo mine >refused-ck2/notes.txt
out=$(t1/build/train --data no-such-data --steps 1 --checkpoint-dir refused-ck2 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$(ls -A refused-ck2)" = notes.txt ] || die "a refused run left a lock: exit $rc, $(ls -A refused-ck2), $out"
# SIGHUP (a closed terminal) saves and stops as SIGTERM does; a closed stdout pipe (| head) is no signal to die
env --default-signal=HUP t1/build/train --data "$text" --steps 400 --checkpoint-dir ckhup >hup.out 2>hup.err &
pid=$!
for _ in $(seq 600); do grep -q "^step     1/" hup.out && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -HUP $pid; wait $pid; rc=$?
[ $rc -eq 0 ] && grep -q "^stopped after step [0-9]* on SIGHUP; run the same command again to resume from ckhup" hup.out &&
  grep -q "^saved checkpoint ckhup/step-" hup.out || die "SIGHUP: exit $rc, $(cat hup.err), $(tail -3 hup.out)"
t1/build/train --data "$text" --steps 2 --checkpoint-dir ckpipe --metrics pipe.jsonl 2>/dev/null | head -1 >/dev/null
rc=${PIPESTATUS[0]}
[ $rc -eq 0 ] && [ -f ckpipe/step-00000002/manifest.json ] && [ "$(wc -l <pipe.jsonl)" -eq 2 ] ||
  die "a run whose stdout pipe closed: exit $rc (141: killed by SIGPIPE), $(ls ckpipe)"
# one run per metrics file: a run on a file another run holds (flock'd, as train holds its --metrics
# file; here flock(1) holds it, so that no run's speed decides the test) is refused, the lines stay
printf '{"step":1}\n{"step":2}\n{"step":3}\n' >shared.jsonl
flock shared.jsonl sleep 30 >/dev/null 2>&1 &
lockpid=$!
for _ in $(seq 100); do flock -n shared.jsonl true 2>/dev/null || break; sleep 0.1; done
out=$(t1/build/train --data "$text" --steps 3 --metrics shared.jsonl 2>&1); rc=$?
kill $lockpid 2>/dev/null; wait $lockpid 2>/dev/null
[ $rc -eq 2 ] && echo "$out" | grep -q "error: --metrics shared.jsonl: in use by another training run" &&
  [ "$(wc -l <shared.jsonl)" -eq 3 ] || die "two runs on one --metrics: exit $rc, $out, $(wc -l <shared.jsonl) lines"
# one compile per -o directory at a time (a compile holds it flock'd); a name starting with '-' gets a
# build hint that is not an option
mkdir -p busy && flock busy sleep 30 &
lockpid=$!
for _ in $(seq 100); do flock -n busy true 2>/dev/null || break; sleep 0.1; done
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o busy 2>&1); rc=$?
kill $lockpid 2>/dev/null; wait $lockpid 2>/dev/null
[ $rc -eq 2 ] && echo "$out" | grep -q "error: -o busy: another mtc compile is writing it now" && [ -z "$(ls -A busy)" ] ||
  die "compile into a directory another compile holds: exit $rc, $out, $(ls -A busy)"
out=$("$mtc" compile "$src/specs/tiny-moe.yaml" -o -dash 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -qF "build with: mtc build ./-dash" || die "the build hint for -o -dash: exit $rc, $out"
[ $fail -eq 0 ] && echo "ok: compile -o a file refused as such, the build hint quoted, SIGINT saves and stops; a refused run leaves nothing"
[ $fail -eq 0 ] && echo "ok: SIGHUP saves and stops, SIGPIPE is ignored; one run per metrics file, one compile per directory"
# ---- kill: kill -9 at random points of a 3-step run that saves after every step, twice (the
# 20-try run: tools/kill-stress.sh, BENCHMARKS.md): every checkpoint with a manifest whole, every
# resume equal to the unkilled run bit for bit
out=$(WORK="$work/kill" SEED=3 bash "$src/tools/kill-stress.sh" "$mtc" t1/build/train "$text" 2 3 2>&1) ||
  die "kill -9 during a run: $out"
echo "$out" | tail -1
exit $fail
