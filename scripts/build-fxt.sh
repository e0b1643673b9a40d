#!/usr/bin/env bash
# Traces on the CPU: StarPU with FxT into a prefix under the build tree
# (scripts/build-starpu.sh; nothing to do when it is there already), a second
# relaymoe build against it with only the program the trace tests run, and
# those tests (CTest label trace: a 2-rank run traced, converted, checked by
# name for every hop, the overlap summary and the Gantt PNG). CI runs the
# same tests in .ci/stage-cuda.sh, whose StarPU has FxT too; this builds
# what bench/sched/overlap.sh runs by default (build/relaymoe-fxt).
#   RMOE_BUILD_DIR   the main build tree (default build/)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${RMOE_BUILD_DIR:-$here/build}
prefix=$build/starpu-fxt
fxt_build=$build/relaymoe-fxt
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }

"$here/scripts/build-starpu.sh" --prefix "$prefix" --fxt
echo "build-fxt: StarPU with FxT in $prefix ($(since))"
cmake -S "$here" -B "$fxt_build" -DRMOE_STARPU_PREFIX="$prefix" \
  -DCMAKE_BUILD_TYPE="${RMOE_BUILD_TYPE:-RelWithDebInfo}" >/dev/null
grep -q '^#define RMOE_STARPU_HAS_FXT 1' "$fxt_build/generated/rmoe_config.h" ||
  { echo "build-fxt: relaymoe did not find FxT in the StarPU of $prefix" >&2; exit 1; }
cmake --build "$fxt_build" -j"$(nproc)" --target relaymoe_app >/dev/null
echo "build-fxt: relaymoe against it in $fxt_build ($(since))"
ctest --test-dir "$fxt_build" -L trace --output-on-failure --timeout 600
echo "build-fxt: done ($(since))"
