#!/usr/bin/env bash
# CI stage: embedding from Fortran and Python. Installs what those need from
# Debian (gfortran, python3-mpi4py, python3-pip, python3-pytest, python3-torch,
# python3-venv; scripts/setup.sh adds only the missing ones), configures the
# main build tree again (it now finds gfortran and builds the Fortran
# interface), builds what the installed package holds, and runs the tests
# labelled fortran and python (tests/fortran, tests/python): the library
# installed into a prefix; the Fortran example built against the installed
# package (CMake and pkg-config) and checked against its reference at 1 and
# 2 ranks, with the API test and the struct mirrors against relaymoe.h; the
# Python package pip-installed into a virtual environment, pytest at 1 and 2
# ranks (NumPy reference, autograd, a PyTorch training step, bad input), the
# package without mpi4py, and relaymoe.hf against Hugging Face transformers
# (pinned below: the newest release checked to import with Debian 12's
# PyTorch 1.13). Nothing may be skipped (RMOE_EMBED_REQUIRE=1).
#   RMOE_BUILD_DIR   the main build tree (default build/)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${RMOE_BUILD_DIR:-$here/build}
start=$(date +%s)
sudo=(); [ "$(id -u)" -eq 0 ] || sudo=(sudo)
since() { echo "$(( $(date +%s) - start )) s"; }

RMOE_SETUP_EXTRA="gfortran python3-mpi4py python3-pip python3-pytest python3-torch python3-venv ${RMOE_SETUP_EXTRA:-}" \
  "$here/scripts/setup.sh"
# transformers from PyPI for Debian's python3 (its torch): relaymoe.hf's tests.
transformers=${RMOE_TRANSFORMERS_VERSION:-4.47.1}
[ "$(/usr/bin/python3 -c 'import transformers; print(transformers.__version__)' 2> /dev/null)" = "$transformers" ] ||
  "${sudo[@]}" /usr/bin/python3 -m pip install -q --break-system-packages "transformers==$transformers"
/usr/bin/python3 -c "import torch, transformers; print('stage-embed: torch', torch.__version__, 'transformers', transformers.__version__)"
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE="${RMOE_BUILD_TYPE:-RelWithDebInfo}" -DRMOE_FORTRAN=ON > /dev/null
grep -q '^CMAKE_Fortran_COMPILER:[A-Z]*=/' "$build/CMakeCache.txt" ||
  { echo "stage-embed: the build did not find gfortran" >&2; exit 1; }
# What `cmake --install` takes: the library, the program, the Fortran interface.
cmake --build "$build" -j"$(nproc)" --target relaymoe relaymoe_app relaymoe_fortran > /dev/null
echo "stage-embed: built in $build ($(since))"
RMOE_EMBED_REQUIRE=1 ctest --test-dir "$build" -L 'fortran|python' --output-on-failure --timeout 600
echo "stage-embed: done ($(since))"
