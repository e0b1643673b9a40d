#!/usr/bin/env bash
# CI stage: several hosts on one machine (label multihost, tests/multihost/):
# ring, token and a2a --check across 2 emulated hosts x 2 ranks placed by
# slot and interleaved, the planned ring's crossings read from relaymoe
# plan, and a host's link cut mid-pass three times in a row. Installs
# iproute2 (ip, tc) when missing, builds the program in the main build tree
# (or reuses it), runs the label (unless the README's test command ran and
# passed it already), then checks that no namespace, bridge or
# veth of the emulated hosts is left (scripts/cluster/cluster.sh leftovers);
# any left fails the stage. Needs root: network namespaces. Idempotent; about
# two minutes on 2 cores.
#   RMOE_BUILD_DIR   the main build tree (default build/)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${RMOE_BUILD_DIR:-$here/build}
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }

[ "$(id -u)" -eq 0 ] || { echo "stage-multihost: needs root (network namespaces)" >&2; exit 1; }
# util-linux (unshare, setsid, flock) is essential in Debian; iproute2 may not be.
RMOE_SETUP_EXTRA="iproute2 util-linux ${RMOE_SETUP_EXTRA:-}" "$here/scripts/setup.sh"
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE="${RMOE_BUILD_TYPE:-RelWithDebInfo}" > /dev/null
cmake --build "$build" -j"$(nproc)" --target relaymoe_app > /dev/null
echo "stage-multihost: built in $build ($(since))"

status=0
# The README's test command, run first by .ci/run as root, runs these tests
# too: when its report (newer than the program) shows every one of them run
# and passed, they are not run a second time (a minute of CI's budget).
junit=$build/Testing/test-sh-junit.xml
names=$(ctest --test-dir "$build" -N -L multihost | sed -n 's/^ *Test *#[0-9]*: //p')
ran=0
if [ -n "$names" ] && [ -f "$junit" ] && [ "$junit" -nt "$build/apps/relaymoe" ]; then
  ran=1
  for n in $names; do
    grep -q "<testcase name=\"$n\" [^>]*status=\"run\"" "$junit" || ran=0
  done
fi
if [ $ran -eq 1 ]; then
  echo "stage-multihost: the test command ran and passed" $names "($junit)"
else
  ctest --test-dir "$build" -L multihost --output-on-failure --timeout 900 | tee "$build/multihost-ctest.log" ||
    status=1
  # A skipped test (exit 77: no root, no iproute2) would hide the stage's point.
  if grep -qE "Not Run|Skipped|\*\*\*Skipped" "$build/multihost-ctest.log"; then
    echo "stage-multihost: a multihost test was skipped" >&2
    status=1
  fi
fi
if ! left=$("$here/scripts/cluster/cluster.sh" leftovers); then
  echo "stage-multihost: the emulated hosts left $left" | tr '\n' ' ' >&2
  echo >&2
  status=1
else
  echo "stage-multihost: no namespace, bridge or veth of the emulated hosts left"
fi
echo "stage-multihost: done ($(since)), status $status"
exit $status
