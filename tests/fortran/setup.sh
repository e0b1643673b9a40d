#!/usr/bin/env bash
# Fixture of the Fortran tests: installs relaymoe into WORK/prefix (cmake
# --install), builds fortran/example against the installed CMake package
# (find_package(RelayMoE COMPONENTS Fortran)), and the example again, the API
# test and the layout printer with mpif90 through relaymoe-fortran.pc.
# WORK/status says "ok" or why the tests cannot run (they then report
# skipped).
#   setup.sh SOURCE_DIR BUILD_DIR WORK
# RMOE_EMBED_REQUIRE=1 (CI) turns "cannot run" into a failure.
set -euo pipefail
src=$1 build=$2 work=$3
rm -rf "${work:?}/prefix" "${work:?}/example" "${work:?}/bin" "${work:?}/status"
mkdir -p "$work/bin"
fixture=fortran
# shellcheck source=../install/fixture.sh
. "$src/tests/install/fixture.sh"

cmake --install "$build" --prefix "$work/prefix" > /dev/null
[ -n "$(find "$work/prefix" -name relaymoe.mod)" ] ||
  fixture_unavailable "relaymoe was configured without a Fortran compiler (install gfortran, reconfigure, rebuild)"
command -v mpif90 > /dev/null || fixture_unavailable "mpif90 missing (libopenmpi-dev)"

cmake -S "$src/fortran/example" -B "$work/example" -DCMAKE_PREFIX_PATH="$work/prefix" > /dev/null
cmake --build "$work/example" > /dev/null
pcdir=$(dirname "$(find "$work/prefix" -name relaymoe-fortran.pc | head -1)")
flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags relaymoe-fortran)
libs=$(PKG_CONFIG_PATH=$pcdir pkg-config --libs relaymoe-fortran)
# The module files come from the installed package, so each program is
# compiled in its own folder (mpif90 writes no .mod for a program).
# shellcheck disable=SC2086
(cd "$work/bin" &&
  mpif90 -std=f2008 -Wall $flags "$src/fortran/example/reference.f90" "$src/fortran/example/embed.f90" $libs \
    -o embed_f-pc &&
  mpif90 -std=f2008 -Wall $flags "$src/tests/fortran/test_api.f90" $libs -o test_api &&
  mpif90 -std=f2008 -Wall $flags "$src/tests/fortran/layout.f90" $libs -o layout)
echo ok > "$work/status"
echo "fortran setup: relaymoe in $work/prefix; example (CMake package and pkg-config), test_api, layout built"
