# Sourced by the end-to-end scripts of tests/app that compare with NumPy:
# NumPy present (77 otherwise), then checks.sh (a fresh work folder, ok and
# bad), and relaymoe run. Expects app, mpiexec and work set; RUN_TIMEOUT
# (seconds) bounds each relaymoe run.
#   run NP ARGS...   relaymoe run on NP ranks, within RUN_TIMEOUT
py=/usr/bin/python3
$py -c "import numpy" 2>/dev/null || { echo "python3-numpy missing"; exit 77; }
# shellcheck source=tests/app/checks.sh
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
run() { timeout "${RUN_TIMEOUT:-120}" "$mpiexec" -n "$1" --oversubscribe "$app" run "${@:2}"; }
