#!/usr/bin/env bash
# Every simulated table of bench/results/sim.md and the gpudirect policy
# sweep, at one commit, by this one script: the EP sweep under transport
# gpudirect (sim_ep: the comparison with the paper; its EPs below 64 first,
# the rest last), the same under staged (sim_ep_staged: StarPU-MPI 1.3's
# host staging), and StarPU's policies under gpudirect bf16 (sim_sched_gpudirect/, its ranking set beside the
# staged f32 sweep's, bench/results/sim_sched.csv). Every row records the
# commit, transport, dtype, scale, policy and platform.
#
#   bench/sim/all.sh [options]
#
#   --scale S              H, F and tokens divided by S (default 8)
#   --dispatch "..."       dispatchers of both EP sweeps (default ring token a2a
#                          a2a-megatron a2a-deepep; any single one `relaymoe run
#                          --dispatch` accepts)
#   --ep "8 16 32 64"      EP of the gpudirect sweep (default)
#   --ep-staged "8 16 32"  EP of the staged sweep (default)
#   --dispatch-64 "..."    dispatchers run at EP 64 and above (default: all of
#                          --dispatch; fewer where the host's time is short)
#   --ep-sched "8 16"      EP of the policy sweep (default; "" skips it)
#   --keep DIR             runs kept here (default /tmp/rmoe-sim-all): an
#                          invocation at the same commit reuses the cases an
#                          earlier one completed (run.sh --reuse), so a sweep cut
#                          short resumes
#   --out DIR              results (default bench/results)
#
# Full size (--scale 1) needs ~23 GiB of host memory at EP 64 and hours of
# wall time per dispatcher; bench/results/sim.md lists the runs that remain.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/lib/opts.sh
. "$root/scripts/lib/opts.sh"
scale=8
dispatches="ring token a2a a2a-megatron a2a-deepep"
eps="8 16 32 64"
eps_staged="8 16 32"
dispatch64=''
eps_sched="8 16"
keep=/tmp/rmoe-sim-all
out=$root/bench/results
OPT_VALUE+=([--scale]=scale [--dispatch]=dispatches [--ep]=eps [--ep-staged]=eps_staged
  [--dispatch-64]=dispatch64 [--ep-sched]=eps_sched [--keep]=keep [--out]=out)
opts_parse "$@"
[ -n "$dispatch64" ] || dispatch64=$dispatches
t0=$(date +%s)
mkdir -p "$keep"
# One commit for every row, taken now (the scripts and the build are this
# commit's for the whole run; files edited meanwhile do not count).
# shellcheck source=bench/sim/commit.sh
. "$root/bench/sim/commit.sh"
RMOE_SIM_COMMIT=$(sim_tree_commit "$root")
export RMOE_SIM_COMMIT
echo "sim/all.sh: commit $RMOE_SIM_COMMIT"

# run_sweep NAME TRANSPORT EPS: one EP sweep; at EP 64 and above only
# --dispatch-64. Cases kept from an earlier invocation are not rerun.
run_sweep() {
  "$root/bench/sim/run.sh" --ep "$3" --dispatch "$dispatches" --dispatch-64 "$dispatch64" --transport "$2" \
    --dtype bf16 --scale "$scale" --name "$1" --keep "$keep/$1" --reuse --out "$out"
}
# The costly large EPs last: the small ones, the staged sweep and the policy
# sweep are done first, and an invocation cut short there resumes (--reuse).
small=''
for e in $eps; do [ "$e" -ge 64 ] || small="$small $e"; done
[ -z "$small" ] || [ "${small# }" = "$eps" ] || run_sweep sim_ep gpudirect "${small# }"
run_sweep sim_ep_staged staged "$eps_staged"
if [ -n "$eps_sched" ]; then
  mkdir -p "$out/sim_sched_gpudirect"
  "$root/bench/sim/sched.sh" --ep "$eps_sched" --dispatch "ring a2a" --transport gpudirect --dtype bf16 \
    --scale "$scale" --keep "$keep/sched" --out "$out/sim_sched_gpudirect" --compare "$out/sim_sched.csv"
fi
run_sweep sim_ep gpudirect "$eps"
echo "sim/all.sh: done ($(( $(date +%s) - t0 )) s)"
