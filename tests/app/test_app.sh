#!/usr/bin/env bash
# The relaymoe program end to end under mpiexec: --check, .npy interop
# against an independent NumPy implementation, and bad input (a clear error,
# a non-zero exit on every rank, no hang, no partial output).
#   test_app.sh RELAYMOE MPIEXEC SOURCE_DIR WORK_DIR
set -uo pipefail
app=$1 mpiexec=$2 src=$3 work=$4
# shellcheck source=tests/app/lib.sh
. "$(dirname "$0")/lib.sh"

small=(--hidden 32 --ffn 16 --experts 8 --topk 2 --tokens 40 --repeat 1 --quiet)

# 1. --check passes, and reports the ring and every all-to-all (the default).
out=$(run 2 "${small[@]}" --check 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "check ring vs reference.*PASS" <<<"$out" && grep -q "check a2a vs reference.*PASS" <<<"$out" \
   && grep -q "check a2a-megatron vs reference.*PASS" <<<"$out" && grep -q "check a2a-deepep vs reference.*PASS" <<<"$out"; then
  ok "run --check"; else bad "run --check (rc=$rc)"; echo "$out"; fi

# 2. --load/--dump against NumPy, for the ring and for all-to-all.
# A comma list runs those dispatchers, each once, ring first.
out=$(run 2 "${small[@]}" --dispatch token,a2a-megatron,ring,token --check 2>&1); rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c "vs reference.*PASS" <<<"$out")" -eq 3 ] && grep -q "check ring vs reference.*PASS" <<<"$out" \
   && grep -q "check token vs reference.*PASS" <<<"$out" && grep -q "check a2a-megatron vs reference.*PASS" <<<"$out"; then
  ok "run --dispatch token,a2a-megatron,ring,token --check: three dispatchers"
else bad "run --dispatch with a comma list (rc=$rc)"; echo "$out"; fi

mkdir -p "$work/in" && $py "$src/tests/app/moe_numpy.py" make "$work/in" --ranks 2 --tokens 40 --hidden 32 --ffn 16 --experts 8 --seed 5
for d in ring a2a a2a-megatron a2a-deepep token; do
  out=$(run 2 "${small[@]}" --dispatch $d --load "$work/in" --dump "$work/out-$d" 2>&1); rc=$?
  chk=$($py "$src/tests/app/moe_numpy.py" check "$work/in" "$work/out-$d" --topk 2 2>&1); crc=$?
  if [ $rc -eq 0 ] && [ $crc -eq 0 ]; then ok "npy interop $d: $(tail -1 <<<"$chk")"; else bad "npy interop $d (run $rc, check $crc)"; echo "$out"; echo "$chk"; fi
done

# The pipelined all-to-all in chunks (chunk boundaries inside a peer's
# block and inside an expert's rows) against NumPy too.
out=$(run 2 "${small[@]}" --dispatch a2a --chunk-rows 7 --load "$work/in" --dump "$work/out-a2a-chunked" 2>&1); rc=$?
chk=$($py "$src/tests/app/moe_numpy.py" check "$work/in" "$work/out-a2a-chunked" --topk 2 2>&1); crc=$?
if [ $rc -eq 0 ] && [ $crc -eq 0 ]; then ok "npy interop a2a in 7-row chunks: $(tail -1 <<<"$chk")"
else bad "npy interop a2a in 7-row chunks (run $rc, check $crc)"; echo "$out"; echo "$chk"; fi

# Every all-to-all against the reference at 1, 3 and 4 ranks (2 above).
for np in 1 3 4; do
  out=$(run $np "${small[@]}" --experts 12 --dispatch baselines --check 2>&1); rc=$?
  if [ $rc -eq 0 ] && grep -q "check a2a vs reference.*PASS" <<<"$out" \
     && grep -q "check a2a-megatron vs reference.*PASS" <<<"$out" \
     && grep -q "check a2a-deepep vs reference.*PASS" <<<"$out"; then ok "run --check baselines at $np rank(s)"
  else bad "run --check baselines at $np rank(s) (rc=$rc)"; echo "$out"; fi
done

# a2a under a memory cap: chunked by the model, its measured total peak
# (TOTAL: the larger of StarPU's figure and the heap's) under the cap, still
# right. Uncapped it holds 10.2 MiB here.
out=$(run 2 --hidden 64 --ffn 32 --experts 8 --topk 4 --tokens 2048 --repeat 1 --dispatch a2a --mem-cap 7M --check 2>&1)
rc=$?
line=$(grep "^a2a: memory cap" <<<"$out")
if [ $rc -eq 0 ] && [ -n "$line" ] && awk '{ for (i = 1; i <= NF; i++) { if ($i == "cap") c = $(i + 1); if ($i == "peak") p = $(i + 1) } }
     END { exit !(p + 0 > 0 && p + 0 <= c + 0) }' <<<"$line" && grep -q "check a2a vs reference.*PASS" <<<"$out"; then
  ok "a2a --mem-cap 7M: $line"
else bad "a2a --mem-cap 7M (rc=$rc)"; echo "$out"; fi

# The task log (RMOE_TASK_LOG): a CSV per rank with every task of both
# passes, each on its own rank, submitted before it started, started before
# it ended.
rm -f "$work/tasks".*.csv
out=$(RMOE_TASK_LOG="$work/tasks" run 2 "${small[@]}" --dispatch ring 2>&1); rc=$?
chk=$($py - "$work/tasks" <<'PY' 2>&1
import csv, sys
counts, bad = [], []
for r in (0, 1):
    rows = list(csv.DictReader(open("%s.%d.csv" % (sys.argv[1], r))))
    counts.append(len(rows))
    bad += ["%s: rank %s, times %s %s %s" % (x["task"], x["rank"], x["submit_us"], x["start_us"], x["end_us"])
            for x in rows if int(x["rank"]) != r
            or not float(x["submit_us"]) <= float(x["start_us"]) <= float(x["end_us"])]
    names = {x["task"].split()[0] for x in rows}
    if not {"router-fwd", "gather", "expert-ffn", "expert-bwd", "router-bwd"} <= names:
        bad.append("rank %d's tasks: %s" % (r, sorted(names)))
print("%d and %d tasks; %s" % (counts[0], counts[1], "; ".join(bad[:3]) or "times in order"))
sys.exit(1 if bad else 0)
PY
); crc=$?
if [ $rc -eq 0 ] && [ $crc -eq 0 ]; then ok "RMOE_TASK_LOG: $chk"; else bad "RMOE_TASK_LOG (run $rc, check $crc): $chk"; echo "$out"; fi

# 3. Bad input: message, exit code, nothing written, no hang (timeout 124).
expect_fail() { # expect_fail NAME PATTERN NP ARGS...
  local name=$1 pat=$2 np=$3; shift 3
  local out rc
  out=$(run "$np" "$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$pat" <<<"$out"; then ok "$name: exit $rc"
  else bad "$name (rc=$rc, wanted a non-zero exit and '$pat')"; echo "$out"; fi
}
expect_fail "unknown option" "did you mean --tokens" 2 --tokns 5
expect_fail "missing value" "needs a value" 2 --tokens
expect_fail "bad number" "expected an integer" 2 --topk x
expect_fail "unknown preset" "not a known shape" 2 --preset Qwen9
expect_fail "experts not divisible" "not divisible by the 3 ranks" 3 "${small[@]}" --experts 8
expect_fail "topk above experts" "larger than experts" 2 "${small[@]}" --topk 9
expect_fail "a2a-deepep in chunks" "--chunk-rows: a2a-deepep sends whole per-rank blocks" 2 "${small[@]}" --dispatch a2a-deepep --chunk-rows 7
expect_fail "a2a-deepep under a cap" "--mem-cap: a2a-deepep sends whole per-rank blocks" 2 "${small[@]}" --dispatch a2a-deepep --mem-cap 3M
expect_fail "bad dispatch" "expected ring, token, a2a, a2a-megatron, a2a-deepep, auto, both, baselines or all" 2 --dispatch rings
expect_fail "bad word in a dispatch list" "('rings' is none)" 2 --dispatch ring,rings
expect_fail "auto in a dispatch list" "auto chooses one dispatcher and stands alone" 2 --dispatch auto,ring
expect_fail "empty word in a dispatch list" "('' is none)" 2 --dispatch ring,,a2a
RMOE_FLOW_CREDITS=maybe expect_fail "malformed RMOE_FLOW_CREDITS" "RMOE_FLOW_CREDITS='maybe': expected on or off" 2 "${small[@]}" --dispatch ring
expect_fail "bad dtype" "--dtype 'bf32': expected f32 or bf16" 2 --dtype bf32
RMOE_TASK_LOG=/nonexistent/dir/tasks expect_fail "task log not writable" "cannot write /nonexistent/dir/tasks.1.csv" 2 "${small[@]}"

mkdir -p "$work/badnpy"
cp "$work/in/"*.npy "$work/badnpy/"
printf 'not a numpy file' > "$work/badnpy/w_router.npy"
expect_fail "corrupt .npy" "w_router.npy" 2 "${small[@]}" --load "$work/badnpy" --dump "$work/never"
[ -e "$work/never" ] && bad "a failed run left $work/never behind" || ok "no output after a failed run"
out=$(run 2 "${small[@]}" --load "$work/badnpy" 2>&1)
[ "$(grep -c 'w_router.npy' <<<"$out")" -ge 2 ] && ok "every rank names the bad file" || { bad "not every rank reported the bad file"; echo "$out"; }
$py -c "import numpy as np; np.save('$work/badnpy/w_router.npy', np.zeros((32, 9), np.float32))"
expect_fail "wrong shape .npy" "shape (32, 9) but expected (32, 8)" 2 "${small[@]}" --load "$work/badnpy"
$py -c "import numpy as np; np.save('$work/badnpy/w_router.npy', np.zeros((32, 8), np.float64))"
expect_fail "wrong dtype .npy" "<f8" 2 "${small[@]}" --load "$work/badnpy"
expect_fail "load dir missing" "not a readable directory" 2 "${small[@]}" --load "$work/nowhere"
touch "$work/afile"
expect_fail "dump into a file" "cannot create" 2 "${small[@]}" --dump "$work/afile/sub"

echo "test_app: $fails failure(s)"
[ $fails -eq 0 ]
