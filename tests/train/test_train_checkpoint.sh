#!/usr/bin/env bash
# Checkpoints of `relaymoe train` under mpiexec:
#  1. 100 steps in one run, and 50 steps then --resume to 100, give the same
#     losses and the same final checkpoint files, byte for byte (parameters,
#     AdamW state, data stream, history);
#  2. a truncated, corrupted, missing or mismatched (configuration, rank
#     count) checkpoint: a message naming the file and the problem on every
#     rank, a non-zero exit, no hang, and the files left as they were;
#  3. a checkpoint directory that cannot be created: an error on every rank.
#   test_train_checkpoint.sh RELAYMOE MPIEXEC WORK_DIR
set -uo pipefail
app=$1 mpiexec=$2 work=$3
# shellcheck source=tests/app/checks.sh
. "$(dirname "$0")/../app/checks.sh"
run() { timeout 120 "$mpiexec" -n "$1" --oversubscribe "$app" train "${@:2}"; }

# One rank first: StarPU calibrates a fresh STARPU_HOME, which ranks starting
# together would race on.
"$mpiexec" -n 1 "$app" train --steps 0 --quiet > /dev/null 2>&1
np=2
model=(--layers 2 --hidden 32 --ffn 16 --experts 4 --topk 2 --vocab 32 --tokens 64 --shared-ffn 8
       --lr 5e-3 --seed 9 --quiet)

# 1. Uninterrupted against interrupted and resumed.
run $np "${model[@]}" --steps 100 --checkpoint-dir "$work/full" --checkpoint-every 50 --csv "$work/full.csv" \
  > "$work/full.log" 2>&1 || { bad "100-step run (exit $?)"; cat "$work/full.log"; }
run $np "${model[@]}" --steps 50 --checkpoint-dir "$work/half" --checkpoint-every 25 --csv "$work/half.csv" \
  > "$work/half.log" 2>&1 || { bad "50-step run (exit $?)"; cat "$work/half.log"; }
cp -r "$work/half" "$work/at50"
run $np "${model[@]}" --steps 100 --checkpoint-dir "$work/half" --checkpoint-every 50 --resume \
  --csv "$work/resumed.csv" > "$work/resumed.log" 2>&1 || { bad "resumed run (exit $?)"; cat "$work/resumed.log"; }
grep -q "resumed from $work/half at step 50" "$work/resumed.log" && ok "resumed at step 50" \
  || { bad "the resumed run did not report step 50"; cat "$work/resumed.log"; }
if cmp -s <(cut -d, -f1-5 "$work/full.csv") <(cut -d, -f1-5 "$work/resumed.csv") \
   && [ "$(wc -l < "$work/full.csv")" -eq 101 ]; then
  ok "losses, aux losses, gradient norms of steps 1-100 identical to the bit"
else
  bad "loss curves differ"; diff <(cut -d, -f1-5 "$work/full.csv") <(cut -d, -f1-5 "$work/resumed.csv") | head
fi
same=1
for r in 0 1; do
  f=$(printf 'rank-%05d.ckpt' $r)
  cmp "$work/full/$f" "$work/half/$f" || same=0
done
[ $same -eq 1 ] && ok "final checkpoints (parameters, AdamW state, data state) identical byte for byte" \
  || bad "final checkpoints differ"
ls -A "$work/full" "$work/half" | grep -q '\.tmp\.' && bad "temporary files left behind" || ok "no temporary files"

# 2. Bad checkpoints: each case on a fresh copy of the step-50 checkpoint.
snapshot() { (cd "$1" && ls -A | sort && find . -type f -exec md5sum {} + | sort); }
expect_refused() { # expect_refused NAME NP PATTERN FILE DIR [ARGS...]
  local name=$1 n=$2 pat=$3 file=$4 dir=$5; shift 5
  local before out rc lines
  before=$(snapshot "$dir")
  out=$(run "$n" "${model[@]}" --steps 60 --checkpoint-dir "$dir" --resume --csv "$work/never.csv" "$@" 2>&1)
  rc=$?
  lines=$(grep -E "relaymoe: rank [0-9]+: cannot resume: .*$file" <<<"$out" | grep -c -- "$pat")
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$lines" -eq "$n" ]; then
    ok "$name: exit $rc, all $n ranks say: $(grep -m1 -- "$pat" <<<"$out" | sed 's/^relaymoe: rank [0-9]*: //')"
  else
    bad "$name (exit $rc, $lines of $n ranks named $file with '$pat')"; echo "$out"
  fi
  [ "$(snapshot "$dir")" == "$before" ] && ok "$name: files untouched" || bad "$name: files changed"
  [ -e "$work/never.csv" ] && { bad "$name: wrote the --csv file"; rm -f "$work/never.csv"; }
}
fresh() { rm -rf "$work/$1" && cp -r "$work/at50" "$work/$1"; }

fresh trunc
size=$(stat -c %s "$work/trunc/rank-00001.ckpt")
truncate -s $((size / 2)) "$work/trunc/rank-00001.ckpt"
expect_refused "truncated" $np "truncated: $((size / 2)) bytes, expected $size" rank-00001.ckpt "$work/trunc"

fresh corrupt
/usr/bin/python3 - "$work/corrupt/rank-00000.ckpt" <<'PY' || bad "could not corrupt the file"
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x5A
open(p, "wb").write(b)
PY
expect_refused "corrupted" $np "corrupted: checksum" rank-00000.ckpt "$work/corrupt"

fresh config
expect_refused "other configuration" $np "another configuration: --hidden 32 in the checkpoint, 48 in this run" \
  rank-00000.ckpt "$work/config" --hidden 48

fresh ranks
expect_refused "other rank count" 4 "written by rank 0 of a run of 2 ranks; this is rank 0 of 4" \
  rank-00000.ckpt "$work/ranks"

fresh onemissing
rm "$work/onemissing/rank-00001.ckpt"
expect_refused "one rank's file missing" $np "missing: no checkpoint of rank 1" rank-00001.ckpt "$work/onemissing"

mkdir -p "$work/empty"
expect_refused "no checkpoint" $np "missing: no checkpoint of rank 0" rank-00000.ckpt "$work/empty"

# 3. A checkpoint directory that cannot be created.
touch "$work/afile"
out=$(run $np "${model[@]}" --steps 2 --checkpoint-dir "$work/afile/sub" 2>&1); rc=$?
n=$(grep -c "cannot save the checkpoint: .*afile/sub" <<<"$out")
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq $np ] && ok "unwritable directory: exit $rc on every rank" \
  || { bad "unwritable directory (exit $rc, $n lines)"; echo "$out"; }

echo "test_train_checkpoint: $fails failure(s)"
[ $fails -eq 0 ]
