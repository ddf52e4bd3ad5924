#!/usr/bin/env bash
# tests/train/muon-traffic.sh — the generated training program end to end (lib.sh), check muon-traffic:
# a PMPI interposer (tests/pmpi/pmpi_count.c) counts what each rank hands to MPI: on 2 ranks (ep
# 1, 24 experts) Muon adds less than 3/4 of the dense Muon matrices' bytes per rank and step
# over AdamW (experts move nothing), and at most 2 collectives a step (every dense group's
# matrices in one all-to-all and one back)
#   usage: muon-traffic.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

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
exit $fail
