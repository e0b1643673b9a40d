#!/usr/bin/env bash
# CI stage: the simulation build. StarPU in SimGrid mode with StarPU-MPI over
# SMPI into a prefix under the build tree (scripts/build-starpu.sh --simgrid;
# nothing to do when it is there already), relaymoe configured against it
# (RMOE_SIMGRID=ON: smpicc, the program and tests/sim only) and its test
# (CTest label sim: a simulated 8-rank Qwen3-30B-A3B layer / 8, bf16, every
# dispatcher under transports gpudirect (twice) and staged: deterministic, at
# or above its bound, the transports apart in staging only; about 30 s; and a
# calibrated simulation: history perfmodels recorded from a run of the real
# build in $RMOE_BUILD_DIR, replayed and compared with that run).
#   RMOE_BUILD_DIR       the main build tree (default build/)
#   RMOE_SIM_BUILD_DIR   the simulation build (default $RMOE_BUILD_DIR/relaymoe-sim)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${RMOE_BUILD_DIR:-$here/build}
prefix=$build/starpu-sim
sim_build=${RMOE_SIM_BUILD_DIR:-$build/relaymoe-sim}
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }

"$here/scripts/build-starpu.sh" --prefix "$prefix" --simgrid
echo "stage-sim: StarPU-SimGrid in $prefix ($(since))"
[ -x "$build/apps/relaymoe" ] || { echo "stage-sim: no real build in $build (scripts/build.sh first)" >&2; exit 1; }
cmake -S "$here" -B "$sim_build" -DRMOE_SIMGRID=ON -DRMOE_STARPU_PREFIX="$prefix" \
  -DRMOE_SIM_REAL_APP="$build/apps/relaymoe" \
  -DCMAKE_BUILD_TYPE="${RMOE_BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build "$sim_build" -j"$(nproc)" >/dev/null
echo "stage-sim: relaymoe-sim in $sim_build ($(since))"
ctest --test-dir "$sim_build" -L sim --output-on-failure --timeout 600
echo "stage-sim: done ($(since))"
