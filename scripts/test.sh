#!/usr/bin/env bash
# Sets up (Debian packages, and with them PyTorch and the pinned transformers
# the Python tests of relaymoe.autograd and relaymoe.hf need: setup.sh --hf),
# builds, and runs the test suite; at the end, the tests that did not run
# (skipped, or not run) with their labels and the reason each printed. Exits
# with ctest's status.
#   scripts/test.sh [--quick | --all] [cmake options...]
#   (default)        every test but the label extended: larger repeats of
#                    checks the suite makes (flow_np8, stripes_np6), which
#                    CI's time on two cores leaves out
#   --quick          only the label quick: the edit-build-test loop, about a
#                    minute on 2 cores (unit tests, each dispatcher at 2 ranks)
#   --all            every test, extended included
#   RMOE_TEST_LABEL  a ctest label regex to run instead of the whole suite
#   RMOE_BUILD_DIR   another build directory; RMOE_TEST_JOBS tests at once (1)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${RMOE_BUILD_DIR:-$here/build}
label=${RMOE_TEST_LABEL:-}
select=(-LE extended)
case "${1:-}" in
  --quick) label=quick; shift ;;
  --all) select=(); shift ;;
esac
"$here/scripts/setup.sh" --hf
"$here/scripts/build.sh" "$@"
# shellcheck source=scripts/lib/blas-env.sh
. "$here/scripts/lib/blas-env.sh"
rmoe_blas_env "$build"
[ -z "$label" ] || select=(-L "$label")
junit=$build/Testing/test-sh-junit.xml
rm -f "$junit"
rc=0
ctest --test-dir "$build" --output-on-failure --timeout 600 -j"${RMOE_TEST_JOBS:-1}" "${select[@]}" \
  --output-junit "$junit" || rc=$?
python3 "$here/scripts/lib/ctest-skipped.py" "$build" "$junit" || true
exit $rc
