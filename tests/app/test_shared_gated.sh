#!/usr/bin/env bash
# Qwen2-MoE's gated shared expert end to end: `relaymoe run --shared-ffn FS
# --shared-gated --load --dump` against the independent NumPy block
# (moe_numpy.py: y += sigmoid(x w_shared_expert_gate) shared(x)) at 1 and 3
# ranks, every dispatcher, outputs and every gradient (dw_shared_expert_gate
# included) within 1e-5; the ungated (DeepSeek-style) form beside it, and
# --check against the C reference.
#   test_shared_gated.sh RELAYMOE MPIEXEC SOURCE_DIR WORK_DIR
set -uo pipefail
app=$1 mpiexec=$2 src=$3 work=$4
RUN_TIMEOUT=180
# shellcheck source=tests/app/lib.sh
. "$(dirname "$0")/lib.sh"

T=40 H=32 F=16 E=6 K=2 FS=24
small=(--hidden $H --ffn $F --experts $E --topk $K --tokens $T --shared-ffn $FS --repeat 1 --quiet)
for n in 1 3; do
  for form in gated ungated; do
    in="$work/in-$n-$form"
    gate=(); [ $form = gated ] && gate=(--shared-gated)
    mkdir -p "$in" && $py "$src/tests/app/moe_numpy.py" make "$in" --ranks $n --tokens $T --hidden $H --ffn $F \
      --experts $E --seed $((7 + n)) --shared-ffn $FS "${gate[@]}"
    dispatchers="ring token a2a a2a-megatron a2a-deepep"
    [ $form = ungated ] && dispatchers="ring a2a"
    for d in $dispatchers; do
      out="$work/out-$n-$form-$d"
      log=$(run $n "${small[@]}" "${gate[@]}" --dispatch $d --load "$in" --dump "$out" 2>&1); rc=$?
      chk=$($py "$src/tests/app/moe_numpy.py" check "$in" "$out" --topk $K --tol 1e-5 2>&1); crc=$?
      if [ $form = gated ] && ! grep -q "dw_shared_expert_gate" <<<"$chk"; then crc=9; fi
      if [ $rc -eq 0 ] && [ $crc -eq 0 ]; then ok "$form np$n $d: $(tail -1 <<<"$chk")"
      else bad "$form np$n $d (run $rc, check $crc)"; echo "$log"; echo "$chk"; fi
    done
  done
  # the C reference (double) agrees too, renormalised or not
  for norm in --norm-topk --no-norm-topk; do
    log=$(run $n "${small[@]}" --shared-gated $norm --dispatch baselines --check 2>&1); rc=$?
    if [ $rc -eq 0 ] && grep -q "check ring vs reference.*PASS" <<<"$log" && grep -q "routing: .*gated (Qwen2-MoE)" <<<"$log"
    then ok "np$n --check $norm"; else bad "np$n --check $norm (rc=$rc)"; echo "$log"; fi
  done
done

# The gate's file is checked as the others are.
mkdir -p "$work/bad" && cp "$work/in-1-gated/"*.npy "$work/bad/"
$py -c "import numpy as np; np.save('$work/bad/w_shared_expert_gate.npy', np.ones((5,), np.float32))"
log=$(run 1 "${small[@]}" --shared-gated --load "$work/bad" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "w_shared_expert_gate.npy" <<<"$log"; then ok "wrong gate shape: exit $rc"
else bad "wrong gate shape (rc=$rc)"; echo "$log"; fi
log=$(run 1 --hidden $H --ffn $F --experts $E --topk $K --tokens $T --shared-gated 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q -- "--shared-gated needs a shared expert" <<<"$log"; then ok "gated without FS: exit $rc"
else bad "gated without a shared expert (rc=$rc)"; echo "$log"; fi

echo "test_shared_gated: $fails failure(s)"
[ $fails -eq 0 ]
