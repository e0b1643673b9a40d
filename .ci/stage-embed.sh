#!/usr/bin/env bash
# CI stage: embedding from Fortran. Installs gfortran (scripts/setup.sh adds
# only what is missing), configures the main build tree again (it now finds
# gfortran and builds the Fortran interface), builds what the installed
# package holds, and runs the tests labelled fortran (tests/fortran): the
# library installed into a prefix; the Fortran example built against the
# installed package (CMake and pkg-config) and checked against its reference
# at 1 and 2 ranks, with the API test and the struct mirrors against
# relaymoe.h, and the Fortran example of docs/embedding.md. Nothing may be
# skipped (RMOE_EMBED_REQUIRE=1). The Python tests, relaymoe.hf's included,
# run once, in the README's test command (.ci/run), which installs what they
# need and fails if one of them skipped.
#   RMOE_BUILD_DIR   the main build tree (default build/)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${RMOE_BUILD_DIR:-$here/build}
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }

RMOE_SETUP_EXTRA="gfortran ${RMOE_SETUP_EXTRA:-}" "$here/scripts/setup.sh"
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE="${RMOE_BUILD_TYPE:-RelWithDebInfo}" -DRMOE_FORTRAN=ON > /dev/null
grep -q '^CMAKE_Fortran_COMPILER:[A-Z]*=/' "$build/CMakeCache.txt" ||
  { echo "stage-embed: the build did not find gfortran" >&2; exit 1; }
# What `cmake --install` takes: the library, the program, the Fortran interface.
cmake --build "$build" -j"$(nproc)" --target relaymoe relaymoe_app relaymoe_fortran > /dev/null
echo "stage-embed: built in $build ($(since))"
RMOE_EMBED_REQUIRE=1 ctest --test-dir "$build" -L fortran --output-on-failure --timeout 600
echo "stage-embed: done ($(since))"
