#!/usr/bin/env bash
# Keeps docs/hardening.md current: every case the hardening tests try
# (expect, every_rank, cluster_case, npy_case and finite_case in
# test_bad_input.sh, expect_all in test_hardening.c) has a row whose first
# cell is its name, and the last cell of every row names tests that exist in
# this build.
#   check_doc.sh DOC CTEST BUILD_DIR
set -uo pipefail
doc=$1 ctest=$2 build=$3
src=$(cd "$(dirname "$doc")/.." && pwd)
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# Rows of the tables: | case | ... | tests |
rows=$(grep -E '^\| ' "$doc" | grep -vE '^\| *-+ *\|' | grep -vE '^\| *case *\|')
cases=$(awk -F'|' '{ gsub(/^ +| +$/, "", $2); print $2 }' <<<"$rows")
named=$(awk -F'|' '{ print $(NF - 1) }' <<<"$rows" | grep -oE '`[A-Za-z0-9_]+`' | tr -d '`' | sort -u)

tests=$("$ctest" --test-dir "$build" -N 2>/dev/null | sed -nE 's/^ *Test +#[0-9]+: +([^ ]+).*/\1/p' | sort -u)
[ -n "$tests" ] || { echo "no tests listed in $build"; exit 1; }
for t in $named; do
  grep -qxF "$t" <<<"$tests" || bad "docs/hardening.md names test '$t', which does not exist"
done
for t in $(grep -E '^(hardening_|fuzz_replay_)' <<<"$tests" | grep -vx hardening_doc); do
  grep -qxF "$t" <<<"$named" || bad "test '$t' has no row in docs/hardening.md"
done

tried=$( (sed -nE 's/^ *(expect|every_rank|cluster_case|npy_case|finite_case|RMOE_WAIT_TIMEOUT=[a-z]+ expect) "([^"]+)".*/\2/p' \
            "$src/tests/hardening/test_bad_input.sh" | grep -v '^\$'
          grep -oE 'expect_all\("[^"]+"' "$src/tests/hardening/test_hardening.c" | sed -E 's/expect_all\("//; s/"$//') |
        sort -u)
n=0
while IFS= read -r c; do
  [ -n "$c" ] || continue
  n=$((n + 1))
  grep -qxF -- "$c" <<<"$cases" || bad "case '$c' is tried by the tests but has no row in docs/hardening.md"
done <<<"$tried"

echo "check_doc: $(wc -l <<<"$rows") rows, $n cases tried by the tests, $(wc -w <<<"$named") tests named; $fails problem(s)"
[ $fails -eq 0 ]
