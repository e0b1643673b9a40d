#!/usr/bin/env bash
# The Fortran tests, with what setup.sh built (exit 77, skipped, when it
# found something missing):
#   run.sh WORK mpi MPIEXEC NRANKS   the example (built through the CMake package
#                                    and through pkg-config) and test_api under
#                                    mpiexec -n NRANKS
#   run.sh WORK layout SOURCE_DIR CC the module's struct mirrors and enums
#                                    against the installed relaymoe.h
#   run.sh WORK readme SOURCE_DIR    the Fortran example of docs/embedding.md,
#                                    built and run on 2 ranks as it says
set -euo pipefail
work=$1 kind=$2
status=$(cat "$work/status" 2> /dev/null || echo "unavailable: the fortran_setup fixture did not run")
[ "$status" = ok ] || { echo "$status"; exit 77; }
libdir=$(dirname "$(find "$work/prefix" -name 'librelaymoe.so' | head -1)")
export LD_LIBRARY_PATH=$libdir:${LD_LIBRARY_PATH:-}
case $kind in
  mpi)
    mpiexec=$3 n=$4
    for exe in "$work/example/embed_f" "$work/bin/embed_f-pc" "$work/bin/test_api"; do
      "$mpiexec" -n "$n" --oversubscribe "$exe"
    done ;;
  layout)
    src=$3 cc=$4
    python3 "$src/tests/python/struct_layout.py" c "$work/prefix/include" "$cc" > "$work/layout-c.txt"
    "$work/bin/layout" > "$work/layout-fortran.txt"
    python3 "$src/tests/python/struct_layout.py" compare "$work/layout-c.txt" "$work/layout-fortran.txt" \
      "the Fortran module relaymoe" ;;
  readme)
    src=$3
    rm -rf "${work:?}/readme" && mkdir -p "$work/readme" && cd "$work/readme"
    python3 "$src/tests/python/readme_example.py" "$src/docs/embedding.md" "program moe" > moe.f90
    PKG_CONFIG_PATH=$(dirname "$(find "$work/prefix" -name relaymoe-fortran.pc | head -1)")
    export PKG_CONFIG_PATH
    # shellcheck disable=SC2046
    mpif90 moe.f90 $(pkg-config --cflags --libs relaymoe-fortran) -o moe
    "$src/scripts/mpirun.sh" -np 2 ./moe | tee out.txt
    grep -q 'rank 0: y(1:2, 1) = ' out.txt && grep -q 'rank 1: y(1:2, 1) = ' out.txt ;;
  *) echo "run.sh: unknown kind '$kind'" >&2; exit 2 ;;
esac
