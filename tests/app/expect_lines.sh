#!/usr/bin/env bash
# A command that must succeed and print every line asked for: passes only
# when it exits 0 and its output matches each pattern (grep -E) and none of
# its lines says FAIL. CTest's own output-matching pass condition ignores
# the exit status, so a crash after the lines it wants would pass.
#   expect_lines.sh PATTERN... -- COMMAND [ARG...]
set -uo pipefail
patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patterns+=("$1"); shift; done
[ "${1:-}" = "--" ] && [ $# -gt 1 ] || { echo "usage: expect_lines.sh PATTERN... -- COMMAND [ARG...]" >&2; exit 2; }
shift
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out"
fails=0
[ $rc -eq 0 ] || { echo "FAILED: exit status $rc"; fails=1; }
for p in "${patterns[@]}"; do
  grep -Eq -- "$p" <<<"$out" || { echo "FAILED: no line matches '$p'"; fails=1; }
done
grep -q "FAIL" <<<"$(grep -v '^FAILED: ' <<<"$out")" && { echo "FAILED: a line says FAIL"; fails=1; }
exit $fails
