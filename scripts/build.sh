#!/usr/bin/env bash
# Configures and builds relaymoe in build/ (or $RMOE_BUILD_DIR).
# Extra arguments go to cmake's configure step, e.g. -DRMOE_SANITIZE=ON.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${RMOE_BUILD_DIR:-$here/build}
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=${RMOE_BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
