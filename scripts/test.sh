#!/usr/bin/env bash
# Sets up (Debian packages), builds, and runs the whole test suite.
# RMOE_BUILD_DIR selects another build directory; extra arguments go to cmake.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${RMOE_BUILD_DIR:-$here/build}
"$here/scripts/setup.sh"
"$here/scripts/build.sh" "$@"
# shellcheck source=scripts/lib/blas-env.sh
. "$here/scripts/lib/blas-env.sh"
rmoe_blas_env "$build"
ctest --test-dir "$build" --output-on-failure --timeout 600 -j"${RMOE_TEST_JOBS:-1}"
