#!/usr/bin/env bash
# relaymoe run --dispatch auto end to end, 4 ranks in 2 emulated nodes
# (--ranks-per-node 2, so the planner stripes the rings' crossing hops):
#  1. under --mem-cap, the dispatcher it names is one the cap admits (not
#     marked over it in its reason), its --check passes, and its measured
#     TOTAL stays under the cap;
#  2. with chunk rows asked for, a2a-deepep (whole blocks) is left out, and
#     the choice passes --check;
#  3. under a cap nothing meets, every rank refuses with the cap's message.
#   test_auto.sh RELAYMOE MPIEXEC WORK
set -uo pipefail
app=$1 mpiexec=$2 work=$3
# shellcheck source=tests/app/checks.sh
. "$(dirname "$0")/checks.sh"
layer=(--hidden 64 --ffn 32 --experts 16 --topk 2 --tokens 512 --ranks-per-node 2 --repeat 1)
run() { timeout 240 "$mpiexec" -n 4 --oversubscribe "$app" run "${layer[@]}" "$@" 2>&1; }

# 1. under a cap
cap_mib=6
out=$(run --dispatch auto --check --mem-cap "${cap_mib}M"); rc=$?
reason=$(sed -n 's/^dispatch auto: //p' <<<"$out")
d=${reason%% *}
total=$(sed -n "s/^$d: memory cap .*measured peak \([0-9.]*\) MiB (TOTAL)$/\1/p" <<<"$out")
if [ $rc -eq 0 ] && [ -n "$d" ] && grep -q "check $d vs reference.*PASS" <<<"$out" &&
   ! grep -q "[ (]$d [0-9.]* (over" <<<"$reason" && [ -n "$total" ] &&
   awk -v t="$total" -v c="$cap_mib" 'BEGIN { exit !(t <= c) }'; then
  ok "--mem-cap ${cap_mib}M: auto ran $d, --check PASS, TOTAL $total MiB under the cap ($reason)"
else
  bad "--mem-cap ${cap_mib}M: auto (exit $rc, dispatch '$d', TOTAL '$total')"; echo "$out"
fi

# 2. chunks asked for: not a2a-deepep's whole blocks
out=$(run --dispatch auto --check --chunk-rows 64); rc=$?
reason=$(sed -n 's/^dispatch auto: //p' <<<"$out")
d=${reason%% *}
if [ $rc -eq 0 ] && [ -n "$d" ] && [ "$d" != a2a-deepep ] && grep -q "check $d vs reference.*PASS" <<<"$out"; then
  ok "--chunk-rows 64: auto ran $d, --check PASS"
else
  bad "--chunk-rows 64: auto (exit $rc, dispatch '$d')"; echo "$out"
fi

# 3. a cap nothing meets: refused on every rank, nothing run
out=$(run --dispatch auto --mem-cap 64K); rc=$?
n=$(grep -c "memory cap 65536 bytes is too small" <<<"$out")
if [ $rc -ne 0 ] && [ "$n" -eq 4 ] && ! grep -q "forward+backward" <<<"$out"; then
  ok "--mem-cap 64K: refused on all 4 ranks (exit $rc)"
else
  bad "--mem-cap 64K: exit $rc, $n rank(s) named the cap"; echo "$out"
fi
[ $fails -eq 0 ] && exit 0 || exit 1
