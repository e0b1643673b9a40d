# Sourced by the end-to-end scripts of tests/app: NumPy present (77
# otherwise), a fresh work folder, and the helpers they share. Expects app,
# mpiexec and work set; RUN_TIMEOUT (seconds) bounds each relaymoe run.
#   run NP ARGS...   relaymoe run on NP ranks, within RUN_TIMEOUT
#   ok MSG / bad MSG a passed or failed check (bad counts it in fails)
py=/usr/bin/python3
$py -c "import numpy" 2>/dev/null || { echo "python3-numpy missing"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
fails=0
run() { timeout "${RUN_TIMEOUT:-120}" "$mpiexec" -n "$1" --oversubscribe "$app" run "${@:2}"; }
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
