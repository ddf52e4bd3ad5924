#!/usr/bin/env bash
# The documentation a newcomer reads (README.md, docs/*.md) in step with the code:
#   - docs/spec.md's spec reference is what `mtc keys` prints from the schema table (compiler/spec.c);
#   - compiler/mtc.h's file index and the README's repository map name every compiler/*.c, and
#     the README links every docs/*.md;
#   - every `mtc COMMAND` named is a command of `mtc --help`, and every option after it one of
#     `mtc COMMAND --help`; every option after `train` is one the training program parses
#     (templates/train/); a code span that is an option alone is one of either; docs/commands.md
#     documents every command and every option of the training program;
#   - every repository path named (compiler/, runtime/, templates/, specs/, tests/, tools/, docs/,
#     cmake/, .ci/, and generated/NAME of an example spec) exists; every relative link resolves;
#   - every spec key named (model.*, cluster.*, training.*, plan.*) is a key of `mtc keys`, or a
#     plan.json key of a generated plan; docs/plan-json.md names every key of europa-1t's plan.json;
#   - every MTC_* environment variable the code reads is named in docs/;
#   - README.md has at most 250 lines and its first code block within its first 40;
#   - the README's apt-get lines install what .ci/run installs.
#   usage: docs.sh MTC SOURCE_DIR [--update]   (--update rewrites docs/spec.md's reference)
set -u
mtc=$(realpath "$1"); cd "$2" || exit 2
fail=0
bad() { echo "FAIL: $*"; fail=1; }
docs=(README.md docs/*.md)

# ---- the README fits two screens and starts with a command
n=$(wc -l <README.md); [ "$n" -le 250 ] || bad "README.md has $n lines; it fits two screens in 250 (move the rest to docs/)"
first=$(grep -n '^```' README.md | head -1 | cut -d: -f1)
[ -n "$first" ] && [ "$first" -le 40 ] || bad "README.md's first code block is on line ${first:-none}; expected within the first 40 lines"

# ---- the spec reference
want=$("$mtc" keys) || exit 1
ref=docs/spec.md
if [ "${3:-}" = --update ]; then
  { sed '/<!-- keys:begin -->/q' $ref; printf '%s\n' "$want"; sed -n '/<!-- keys:end -->/,$p' $ref; } >$ref.tmp && mv $ref.tmp $ref
fi
have=$(sed -n '/<!-- keys:begin -->/,/<!-- keys:end -->/p' $ref | sed '1d;$d')
if [ "$want" != "$have" ]; then
  diff -u <(printf '%s\n' "$have") <(printf '%s\n' "$want")
  bad "$ref's spec reference differs from 'mtc keys' (run tests/docs.sh build/mtc . --update)"
fi

# ---- every environment variable mtc or its programs read is documented
for v in $(grep -rohE 'getenv\("MTC_[A-Z0-9_]*"\)' compiler runtime templates | grep -oE 'MTC_[A-Z0-9_]*' | sort -u); do
  grep -qw "$v" README.md docs/*.md || bad "no file of docs/ documents the environment variable $v"
done

# ---- the README links every file of docs/
for f in docs/*.md; do grep -qF "]($f)" README.md || bad "README.md's documentation table does not link $f"; done

# ---- the indexes a newcomer reads first name every compiler file
for f in compiler/*.c; do
  b=$(basename "$f")
  sed -n '1,/^#ifndef MTC_H/p' compiler/mtc.h | grep -q " $b " || bad "compiler/mtc.h's file index does not name $b"
  sed -n '/^## Repository/,$p' README.md | grep -q "$b" || bad "README.md's repository map does not name $b"
done

# ---- code: each code span and each code-block line (continuations joined), as FILE:LINE:TEXT
code=$(awk '
  FNR == 1 { inblock = 0; held = "" }
  /^```/ { inblock = !inblock; next }
  inblock { line = held $0; if (line ~ /\\$/) { held = substr(line, 1, length(line) - 1); next }
            held = ""; print FILENAME ":" FNR ":" line; next }
  { n = split($0, part, "`"); for (i = 2; i <= n; i += 2) print FILENAME ":" FNR ":" part[i] }
' "${docs[@]}")

help=$("$mtc" --help)
global=$(printf '%s\n' "$help" | sed -n '/^options of every command:/,$p')
declare -A chelp=() trainopt=()
for c in $(printf '%s\n' "$help" | sed -n '/^commands:/,/^$/p' | sed -n 's/^  \([a-z][a-z-]*\) .*/\1/p'); do
  chelp[$c]="$("$mtc" "$c" --help 2>&1) $global"
done
all_help="${chelp[*]}"
for o in $(grep -ohE -- '"--?[a-z][a-z-]*"|\{"[a-z][a-z-]*", (no|required)_argument' templates/train/*.c |
           sed -E 's/^\{?"-{0,2}([a-z][a-z-]*)".*/\1/' | sort -u); do
  trainopt[--$o]=1
done
# docs/commands.md documents every command and every option of the training program
for c in "${!chelp[@]}"; do grep -qF "\`mtc $c" docs/commands.md || bad "docs/commands.md does not document 'mtc $c'"; done
for o in "${!trainopt[@]}"; do
  case $o in --h | --help) continue ;; esac
  grep -qE -- "$o([^a-z-]|$)" docs/commands.md || bad "docs/commands.md does not document the training program's option '$o'"
done
has() { [[ "$1" =~ $2([^a-z-]|$) ]]; } # help text $1 names option $2
# mtc COMMAND [options] (up to a pipe, ;, && or a comment), train [options], and an option alone
while IFS=$'\t' read -r where kind word opts; do
  case $kind in
  mtc)
    if [ "${word#-}" != "$word" ]; then has "$global" "$word" || bad "$where: 'mtc $word' is not an option of mtc --help"; continue; fi
    [ -n "${chelp[$word]+x}" ] || { bad "$where: 'mtc $word' is not a command of mtc --help"; continue; }
    for o in $opts; do has "${chelp[$word]}" "$o" || bad "$where: 'mtc $word $o': no such option in 'mtc $word --help'"; done ;;
  train)
    for o in $opts; do [ -n "${trainopt[$o]+x}" ] || bad "$where: 'train $o': the training program has no such option (templates/train/)"; done ;;
  opt)
    has "$all_help" "$word" || [ -n "${trainopt[$word]+x}" ] || bad "$where: option '$word' is neither mtc's nor the training program's" ;;
  esac
done < <(printf '%s\n' "$code" | perl -ne '
  chomp; my ($f, $l, $t) = split /:/, $_, 3; my $w = "$f:$l";
  my $opts = sub { join " ", ($_[0] =~ /(?:^|[\[ ])(--[a-z][a-z-]*)/g) };
  while ($t =~ /(?<![\w.-])mtc ((?:--)?[a-z][a-z-]*)(?=$|[\s),:])([^|;#&]*)/g) { print "$w\tmtc\t$1\t", $opts->($2), "\n" }
  if ($t =~ /(?<![\w.-])train( [^|;#&]*)$/) { print "$w\ttrain\t-\t", $opts->($1), "\n" }
  if ($t =~ /^(--[a-z][a-z-]*)/) { print "$w\topt\t$1\t\n" }')

# ---- repository paths and links
for f in "${docs[@]}"; do
  dir=$(dirname "$f")
  grep -noP '(?<![\w./~-])(compiler|runtime|templates|specs|tests|tools|docs|cmake|\.ci)/[\w./*-]*' "$f" |
    while IFS=: read -r line p; do
      p=${p%.}; p=${p%/}
      case $p in *NAME* | *CHECK* | *'*'*) compgen -G "${p//NAME/*}" >/dev/null || compgen -G "${p//CHECK/*}" >/dev/null ||
        echo "FAIL: $f:$line: no file matches '$p'" ;; *) [ -e "$p" ] || echo "FAIL: $f:$line: '$p' does not exist" ;; esac
    done
  grep -noP '(?<![\w./-])generated/[a-z0-9][\w.-]*' "$f" | while IFS=: read -r line p; do
    [ ! -f "specs/${p#generated/}.yaml" ] || [ -d "$p" ] || echo "FAIL: $f:$line: '$p' (the example's output) does not exist"
  done
  grep -noP '\]\(\K[^)#]+(?=[)#])' "$f" | while IFS=: read -r line p; do
    case $p in http*) continue ;; esac
    [ -e "$dir/$p" ] || echo "FAIL: $f:$line: the link '$p' does not resolve"
  done
done >"${TMPDIR:-/tmp}/docs.$$" 2>&1
if [ -s "${TMPDIR:-/tmp}/docs.$$" ]; then cat "${TMPDIR:-/tmp}/docs.$$"; fail=1; fi
rm -f "${TMPDIR:-/tmp}/docs.$$"

# ---- spec keys
declare -A key=()
for k in $(printf '%s\n' "$want" | sed -n 's/^| `\([a-z0-9_.]*\)` .*/\1/p'); do key[$k]=1; done
for k in $(cat generated/*/plan.json | grep -oE '"[a-z_0-9]+":' | tr -d '":' | sort -u); do key[plan.json:$k]=1; done
while IFS=: read -r f line k; do
  case $k in *.c | *.h | *.md | *.txt | *.json | *.yaml | *.sh | *.svg | *.html | *.safetensors) continue ;; esac
  [ -n "${key[$k]+x}" ] || [ -n "${key[plan.json:${k##*.}]+x}" ] ||
    bad "$f:$line: '$k' is neither a spec key (mtc keys) nor a plan.json key"
done < <(grep -noP '(?<![\w./-])(model|cluster|training|plan)\.[a-z_][a-z0-9_.]*[a-z0-9_]' "${docs[@]}")

# ---- docs/plan-json.md names every key of a plan.json (as mtc diff --all flattens them; a row
# `a.b`, `.c` names a.b and a.c, and a key names every key below it)
documented=$(sed -n 's/^| \(`[^|]*\)|.*/\1/p' docs/plan-json.md | awk -F', ' '{
  n = split($0, part, ", "); first = part[1]; gsub(/[` ]/, "", first); sub(/\[\]$/, "", first); sub(/\.\*$/, "", first); print first
  parent = first; if (index(first, ".")) sub(/\.[^.]*$/, "", parent); else parent = ""
  for (i = 2; i <= n; i++) { k = part[i]; gsub(/[` ]/, "", k); print parent k } }')
while read -r k _; do
  case $k in key | *.items.*) continue ;; esac
  covered=0
  for d in $documented; do case $k in "$d" | "$d".*) covered=1; break ;; esac; done
  [ $covered -eq 1 ] || bad "docs/plan-json.md does not name plan.json's key '$k'"
done < <("$mtc" diff generated/europa-1t/plan.json generated/europa-1t/plan.json --all)

# ---- the README's packages are CI's
pk() { tr -d '\\' | tr ' ' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vxE 'apt-get|install|sudo|SUDO|-y|-qq' | sort -u; }
readme_pk=$(awk '/apt-get install/ { on = 1 } on { print; if ($0 !~ /\\$/) on = 0 }' README.md | pk)
ci_pk=$(awk '/apt-get install/ { on = 1 } on { print; if ($0 !~ /\\$/) on = 0 }' .ci/run | sed 's/>.*//' | pk)
[ "$readme_pk" = "$ci_pk" ] || bad "README.md's apt-get lines and .ci/run's install different packages: $(diff <(echo "$readme_pk") <(echo "$ci_pk") | grep '^[<>]' | tr '\n' ' ')"

[ $fail -eq 0 ] && echo "ok: docs/spec.md's reference is mtc keys ($(printf '%s\n' "$want" | wc -l) lines); the commands, options, paths and keys of README.md and docs/ exist"
exit $fail
