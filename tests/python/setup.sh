#!/usr/bin/env bash
# Fixture of the Python tests: installs relaymoe into WORK/prefix (cmake
# --install), makes a virtual environment WORK/venv that sees Debian's numpy,
# mpi4py, pytest and torch and the transformers scripts/setup.sh installs
# (--system-site-packages) and pip-installs python/ into it as
# docs/embedding.md does (offline: --no-index, --no-build-isolation, Debian's
# hatchling), failing if that wrote anything into the source tree. WORK/status
# says "ok" or why the tests cannot run, which they report as skipped.
#   setup.sh SOURCE_DIR BUILD_DIR WORK
# RMOE_EMBED_REQUIRE=1 (CI) turns "cannot run" into a failure.
set -euo pipefail
src=$1 build=$2 work=$3
py=/usr/bin/python3
rm -rf "${work:?}/prefix" "${work:?}/venv" "${work:?}/status"
mkdir -p "$work"
fixture=python
# shellcheck source=../install/fixture.sh
. "$src/tests/install/fixture.sh"

cmake --install "$build" --prefix "$work/prefix" > /dev/null
[ -x $py ] || fixture_unavailable "$py missing"
for module in numpy mpi4py pytest hatchling; do
  $py -c "import $module" 2> /dev/null || fixture_unavailable "python3-$module missing"
done
$py -m venv --system-site-packages "$work/venv" > /dev/null 2>&1 || fixture_unavailable "python3-venv missing"
# The install straight from the source tree, as a user runs it: it must
# leave that tree as it was (no build/, no *.egg-info).
find "$src/python" | sort > "$work/source-before"
"$work/venv/bin/pip" install -q --disable-pip-version-check --no-index --no-build-isolation "$src/python"
find "$src/python" | sort > "$work/source-after"
if ! diff "$work/source-before" "$work/source-after" > "$work/source-diff"; then
  echo "python setup: pip install wrote into the source tree:" >&2
  cat "$work/source-diff" >&2
  exit 1
fi
"$work/venv/bin/python" -c "import relaymoe"
echo ok > "$work/status"
echo "python setup: relaymoe installed in $work/prefix, the package in $work/venv"
