#!/usr/bin/env bash
# relaymoe run --tokens-per-rank at 3 ranks: one rank without tokens and
# the others uneven pass --check for every dispatcher (f32 and bf16); equal
# counts give the inputs and outputs of --tokens; uneven counts split the
# same seeded global tensors, and --load/--dump keep that layout (against
# NumPy where it is installed); bad lists are refused with a message, a
# non-zero exit, no hang and nothing written.
#   test_tokens_per_rank.sh RELAYMOE MPIEXEC SOURCE_DIR WORK_DIR
set -uo pipefail
app=$1 mpiexec=$2 src=$3 work=$4
# shellcheck source=tests/app/checks.sh
. "$(dirname "$0")/checks.sh"
run() { timeout "${RUN_TIMEOUT:-120}" "$mpiexec" -n "$1" --oversubscribe "$app" run "${@:2}"; }
py=/usr/bin/python3

small=(--hidden 32 --ffn 16 --experts 6 --topk 2 --repeat 1 --quiet)
uneven=(--tokens-per-rank 0,40,300)

# 1. Every dispatcher against the reference, f32 and bf16.
for dtype in f32 bf16; do
  out=$(run 3 "${small[@]}" "${uneven[@]}" --dtype "$dtype" --check --dispatch all 2>&1); rc=$?
  passes=$(grep -c "vs reference.*PASS" <<<"$out")
  if [ $rc -eq 0 ] && [ "$passes" -eq 5 ] && grep -q "tokens per rank 0,40,300," <<<"$out"; then
    ok "$dtype --tokens-per-rank 0,40,300 --check --dispatch all: 5 PASS"
  else bad "$dtype --tokens-per-rank 0,40,300 --check (rc=$rc, $passes PASS)"; echo "$out"; fi
done

# 2. Equal counts are --tokens: the same inputs, routing and outputs, bit
# for bit (--deterministic), and the same CSV columns but the measured.
same=(--dispatch ring --deterministic)
run 3 "${small[@]}" "${same[@]}" --tokens 40 --dump "$work/tokens" --csv "$work/tokens.csv" >/dev/null 2>&1; rc1=$?
run 3 "${small[@]}" "${same[@]}" --tokens-per-rank 40,40,40 --dump "$work/equal" --csv "$work/equal.csv" >/dev/null 2>&1
rc2=$?
differ=""
for f in x dy topk_idx y dx dw_router dw_gate dw_up dw_down; do
  cmp -s "$work/tokens/$f.npy" "$work/equal/$f.npy" || differ="$differ $f"
done
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ -z "$differ" ] \
   && diff <(cut -d, -f1-8,17,20,21 "$work/tokens.csv") <(cut -d, -f1-8,17,20,21 "$work/equal.csv") >/dev/null; then
  ok "--tokens-per-rank 40,40,40 gives --tokens 40's files"
else bad "--tokens-per-rank 40,40,40 against --tokens 40 (rc $rc1/$rc2, differ:${differ:- none})"; fi

# 3. Uneven counts split the global tensors one rank draws whole; the CSV
# names the capacity; --routing counts each rank's own pairs (T x K).
run 1 "${small[@]}" --dispatch ring --tokens 340 --dump "$work/one" >/dev/null 2>&1; rc1=$?
run 3 "${small[@]}" "${uneven[@]}" --dispatch ring --dump "$work/split" --csv "$work/split.csv" \
  --routing "$work/routing.csv" >/dev/null 2>&1; rc2=$?
pairs=$(awk -F, 'NR > 1 { s[$1] += $3 } END { printf "%d,%d,%d", s[0], s[1], s[2] }' "$work/routing.csv" 2>/dev/null)
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && cmp -s "$work/one/x.npy" "$work/split/x.npy" \
   && cmp -s "$work/one/dy.npy" "$work/split/dy.npy" && [ "$(cut -d, -f7 "$work/split.csv" | tail -1)" = 300 ] \
   && [ "$pairs" = 0,80,600 ]; then
  ok "0,40,300 draws the rows of one rank's 340, the CSV's tokens 300, routed pairs $pairs"
else bad "uneven draws against one rank's (rc $rc1/$rc2, routed pairs '$pairs')"; cat "$work/split.csv"; fi

# 4. --load takes every rank's rows; another row count is refused, naming it.
if $py -c "import numpy" 2>/dev/null; then
  mkdir -p "$work/in"
  $py "$src/tests/app/moe_numpy.py" make "$work/in" --ranks 1 --tokens 340 --hidden 32 --ffn 16 --experts 6 --seed 5
  for d in ring token a2a-deepep; do
    out=$(run 3 "${small[@]}" "${uneven[@]}" --dispatch $d --load "$work/in" --dump "$work/out-$d" 2>&1); rc=$?
    chk=$($py "$src/tests/app/moe_numpy.py" check "$work/in" "$work/out-$d" --topk 2 2>&1); crc=$?
    if [ $rc -eq 0 ] && [ $crc -eq 0 ]; then ok "npy interop $d at 0,40,300: $(tail -1 <<<"$chk")"
    else bad "npy interop $d at 0,40,300 (run $rc, check $crc)"; echo "$out"; echo "$chk"; fi
  done
else
  echo "python3-numpy missing: --load against NumPy left out"
  run 1 "${small[@]}" --tokens 340 --dispatch ring --dump "$work/in" >/dev/null 2>&1 || bad "one rank's --dump for --load"
fi
out=$(run 3 "${small[@]}" --tokens-per-rank 0,40,200 --dispatch ring --load "$work/in" --dump "$work/never" 2>&1); rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "x.npy: shape (340, 32) but expected (240, 32)" <<<"$out" \
   && [ "$(grep -c "x.npy holds every rank's tokens as rows: expected 240" <<<"$out")" -eq 3 ]; then
  ok "--load with another row count: exit $rc, every rank says why"
else bad "--load with another row count (rc=$rc)"; echo "$out"; fi
[ -e "$work/never" ] && bad "a refused --load left $work/never behind"

# 5. Bad lists: message, non-zero exit, no hang (timeout 124), no file.
expect_fail() { # expect_fail NAME PATTERN ARGS...
  local name=$1 pat=$2 out rc; shift 2
  out=$(run 3 "${small[@]}" "$@" --dump "$work/never" --csv "$work/never.csv" 2>&1); rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$pat" <<<"$out" && [ ! -e "$work/never" ] \
     && [ ! -e "$work/never.csv" ]; then ok "$name: exit $rc"
  else bad "$name (rc=$rc, wanted a non-zero exit, '$pat' and no file)"; echo "$out"; fi
}
expect_fail "too few counts" "--tokens-per-rank '0,40': 2 count(s) for 3 rank(s)" --tokens-per-rank 0,40
expect_fail "too many counts" "'0,40,300,5': 4 count(s) for 3 rank(s)" --tokens-per-rank 0,40,300,5
expect_fail "negative count" "'-4' is not a token count" --tokens-per-rank 0,-4,300
expect_fail "not a number" "'x' is not a token count" --tokens-per-rank 0,x,300
expect_fail "empty count" "'' is not a token count" --tokens-per-rank 0,,300
expect_fail "above the bound" "'5000000000000' is not a token count" --tokens-per-rank 1,2,5000000000000
expect_fail "no tokens anywhere" "every count is 0" --tokens-per-rank 0,0,0
expect_fail "with --tokens" "--tokens and --tokens-per-rank both given" --tokens 40 --tokens-per-rank 0,40,300

[ $fails -eq 0 ] && echo "all tokens-per-rank checks passed" || echo "$fails check(s) FAILED"
exit $((fails > 0))
