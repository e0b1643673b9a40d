# Sourced by bench/sched/run.sh and overlap.sh once app and out are set:
# Debian's Python, a scratch folder removed on exit, StarPU's home beside
# the build of app (its calibration shared with the tests), and the
# repetitions: 3 timed passes after the warm-up forward and backward, which
# are trace passes 0-1 (counted: the passes the summaries keep). RUN_ARGS:
# extra relaymoe options.
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export STARPU_HOME=${STARPU_HOME:-$(dirname "$(dirname "$app")")/starpu-home}
mkdir -p "$STARPU_HOME" "$out"
repeat=3
counted=2-$((2 * repeat + 1))
# shellcheck disable=SC2206
extra=(${RUN_ARGS:-})
