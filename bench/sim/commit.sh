# shellcheck shell=bash
# Sourced by bench/sim/setup.sh and bench/sim/all.sh: the commit a
# simulated row records.
# sim_tree_commit ROOT: prints HEAD's hash, with -dirty when a tracked file
# differs from it. bench/results/ does not count: it is what the sweeps
# write, and one sweep run after (or beside) another finds the other's
# tables there.
sim_tree_commit() {
  local c
  c=$(git -C "$1" rev-parse HEAD 2>/dev/null || echo unknown)
  git -C "$1" diff --quiet HEAD -- . ':!bench/results' 2>/dev/null || c=$c-dirty
  echo "$c"
}
