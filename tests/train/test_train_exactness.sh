#!/usr/bin/env bash
# `relaymoe train` with the ring, with a2a and with a2a-deepep from the same seed, 4
# ranks, 30 steps of a small model: the loss curves agree within the fp32
# rounding bound s * 2^-24 at every step, and the loss falls
# (bench/train_compare.py states the bound and why). A control run, the ring
# with the learning rate changed by 1e-4 relatively, must leave the bound:
# the check sees a difference far smaller than any dispatcher error.
#   test_train_exactness.sh RELAYMOE MPIEXEC SOURCE_DIR WORK_DIR
set -uo pipefail
app=$1 mpiexec=$2 src=$3 work=$4
py=/usr/bin/python3
[ -x $py ] || { echo "$py missing"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
# One rank first: StarPU calibrates a fresh STARPU_HOME, which ranks starting
# together would race on.
"$mpiexec" -n 1 "$app" train --steps 0 --quiet > /dev/null 2>&1
args=(--layers 2 --hidden 32 --ffn 16 --experts 8 --topk 2 --vocab 32 --tokens 128 --shared-ffn 16
      --steps 30 --lr 1e-2 --seed 3 --quiet)
for d in ring a2a a2a-deepep; do
  timeout 150 "$mpiexec" -n 4 --oversubscribe "$app" train "${args[@]}" --dispatch $d --csv "$work/$d.csv"
  rc=$?
  [ $rc -eq 0 ] || { echo "FAIL: train --dispatch $d exited with $rc"; exit 1; }
done
timeout 150 "$mpiexec" -n 4 --oversubscribe "$app" train "${args[@]}" --dispatch ring --lr 0.010001 --steps 10 \
  --csv "$work/control.csv" || { echo "FAIL: control run exited with $?"; exit 1; }
$py "$src/bench/train_compare.py" "$work/ring.csv" "$work/a2a.csv" --min-progress 0.5 --table-every 5 \
  --control "$work/control.csv" --control-what "--lr 0.010001 instead of 0.01" --control-must-exceed || exit 1
# DeepEP's per-rank dispatch reduces a token's expert outputs on the
# experts' rank first: another order of the same sums, within the same bound.
$py "$src/bench/train_compare.py" "$work/ring.csv" "$work/a2a-deepep.csv" --min-progress 0.5 --table-every 10
