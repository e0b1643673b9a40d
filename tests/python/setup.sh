#!/usr/bin/env bash
# Fixture of the Python tests: installs relaymoe into WORK/prefix (cmake
# --install), makes a virtual environment WORK/venv that sees Debian's numpy,
# mpi4py, pytest and torch (--system-site-packages) and pip-installs a copy
# of python/ into it (the copy keeps setuptools' build files out of the
# source tree; offline: --no-index, --no-build-isolation). WORK/status says
# "ok" or why the tests cannot run, which they report as skipped.
#   setup.sh SOURCE_DIR BUILD_DIR WORK
# RMOE_EMBED_REQUIRE=1 (CI) turns "cannot run" into a failure.
set -euo pipefail
src=$1 build=$2 work=$3
py=/usr/bin/python3
rm -rf "${work:?}/prefix" "${work:?}/venv" "${work:?}/package" "${work:?}/status"
mkdir -p "$work"
fixture=python
# shellcheck source=../install/fixture.sh
. "$src/tests/install/fixture.sh"

cmake --install "$build" --prefix "$work/prefix" > /dev/null
[ -x $py ] || fixture_unavailable "$py missing"
for module in numpy mpi4py pytest; do
  $py -c "import $module" 2> /dev/null || fixture_unavailable "python3-$module missing"
done
$py -m venv --system-site-packages "$work/venv" > /dev/null 2>&1 || fixture_unavailable "python3-venv missing"
cp -r "$src/python" "$work/package"
"$work/venv/bin/pip" install -q --disable-pip-version-check --no-index --no-build-isolation "$work/package"
"$work/venv/bin/python" -c "import relaymoe"
echo ok > "$work/status"
echo "python setup: relaymoe installed in $work/prefix, the package in $work/venv"
