#!/usr/bin/env bash
# tests/train/cp.sh — the generated training program end to end (lib.sh), check cp:
# context parallelism (plan.cp): each sequence split over 2 ranks in 4 chunks, K/V all-gathered,
# against 1 rank with fp32 on the wire, 6 steps within 1e-5. tiny-moe on 4 ranks (cp 2 x ep 2, no
# checkpointing) and on 2 (cp 2, full checkpointing with host offload), and a cp 2 checkpoint
# resumed on 1 rank (tests/train/cp-mla.sh: MLA; the cuda build of a cp plan: tests/kernels.sh, and its
# steps against these: tests/cuda_emu/compare.sh cp2*)
#   usage: cp.sh MTC SOURCE_DIR [sanitize]
. "$(dirname "$0")/lib.sh"

cps=(--set training.seq_len=64 --set training.steps=6 --set training.warmup_steps=2 --set training.grad_reduce_dtype=fp32)
build w1 "$tiny" float "${cps[@]}" --set cluster.gpus_per_node=1 --set plan.fsdp=1 || exit 1
build c2e2 "$tiny" float "${cps[@]}" --set cluster.gpus_per_node=4 --set plan.fsdp=4 --set plan.ep=2 --set plan.cp=2 \
  --set plan.reshard=every_micro_batch --set plan.activation_checkpoint=none
build c2f "$tiny" float "${cps[@]}" --set cluster.gpus_per_node=2 --set plan.fsdp=2 --set plan.cp=2 \
  --set plan.activation_checkpoint=full --set plan.offload_activations=host
grep -q 'rt_offload_store' "$work/c2f/step.c" || die "c2f: no host offload in the program"
(cd "$work" && ./w1/build/train --data "$text" --metrics w1.jsonl >/dev/null) || die "1 rank run"
cp2_against w1 c2e2 4
cp2_against w1 c2f 2
# cp is not in a checkpoint's identity: 3 steps with cp 2 on 2 ranks, resumed with cp 1 on 1 rank
(cd "$work" && "${mpirun[@]}" -np 2 ./c2f/build/train --data "$text" --metrics r21.jsonl --steps 3 \
   --checkpoint-dir ckcp >/dev/null && ./w1/build/train --data "$text" --metrics r21.jsonl --checkpoint-dir ckcp >r21.log) ||
  die "cp 2 save, cp 1 resume"
grep -q "resumed from .*step-00000003" "$work/r21.log" || die "the cp 1 run did not resume from step 3"
same_losses w1 r21 "saved with cp 2 on 2 ranks, resumed with cp 1 on 1" 6 || die "the resumed losses differ"
exit $fail
