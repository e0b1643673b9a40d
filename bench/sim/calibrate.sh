#!/usr/bin/env bash
# Records StarPU history perfmodels of relaymoe's codelets from a real run,
# for the simulation to replay (StarPU's calibrate-then-simulate workflow):
#
#   bench/sim/calibrate.sh --out DIR [--np N] [--host NAME] [--app PATH]
#       [--launcher CMD] [--keep-samples] -- RUN-ARGS...
#
# runs `LAUNCHER -np N APP run RUN-ARGS` (the real build: its codelets'
# perfmodels are history-based, codelets/codelet.h) with STARPU_HOME=DIR,
# STARPU_CALIBRATE=1 and STARPU_HOSTNAME=NAME, so that StarPU writes
# DIR/.starpu/sampling/codelets/45/rmoe_*.NAME: per codelet and worker
# architecture, the mean duration of every data footprint it executed.
# Replay them in the simulation build with
#
#   RMOE_SIM_HISTORY=DIR/.starpu/sampling RMOE_SIM_HISTORY_HOST=NAME
#
# (codelets/sim_cost.c; bench/sim/run.sh --history DIR, check_real.sh do
# this). Runs of several dispatchers into one DIR add up: StarPU loads the
# models at start and writes them back at the end. All ranks of a run share
# DIR and write the same files at shutdown: the last rank's samples stay.
#
# On a GPU machine the same command records the CUDA workers' models (arch
# cuda0) with the CUDA build, e.g.
#   STARPU_NCPU=0 STARPU_NCUDA=1 bench/sim/calibrate.sh --out gpu-models \
#       --host h200 --np 1 --app build-cuda/apps/relaymoe \
#       -- --preset Qwen3-30B-A3B --dispatch all --dtype bf16 --repeat 5
# and bench/sim/run.sh --history gpu-models --history-host h200 replays them
# on the simulated MareNostrum 5 (one simulated CUDA worker per rank: the
# same arch). The shapes of a simulated task should be ones the recording
# ran (same H, F, tokens per rank and EP-dependent row counts near the
# recorded ones): others take a line fitted over the recorded sizes.
#
#   --np N           ranks (default 1); --launcher CMD default scripts/mpirun.sh
#   --host NAME      STARPU_HOSTNAME of the recording (default rmoe-real-<hostname>)
#   --app PATH       the real build's relaymoe (default build/apps/relaymoe)
#   --keep-samples   keep StarPU's outlier filter (by default every sample is
#                    kept, STARPU_HISTORY_MAX_ERROR=100000: on a shared machine
#                    the default 50% filter drops and flushes most entries)
#
# Exit status: 0 with the models written, 1 when the run fails or writes no
# model, 2 on bad options. DIR/calibration.txt says what was recorded.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=
np=1
host=rmoe-real-$(hostname -s 2>/dev/null || echo host)
app=$root/build/apps/relaymoe
launcher=$root/scripts/mpirun.sh
keep_samples=0
die() { echo "sim/calibrate.sh: $*" >&2; exit 2; }
# shellcheck source=scripts/lib/opts.sh
. "$root/scripts/lib/opts.sh"
OPT_VALUE+=([--out]=out [--np]=np [--host]=host [--app]=app [--launcher]=launcher)
OPT_FLAG+=([--keep-samples]=keep_samples)
OPT_REST=1
opts_parse "$@"
set -- "${rest[@]}"
[ -n "$out" ] || die "--out DIR is required"
[[ $np =~ ^[0-9]+$ ]] && [ "$np" -ge 1 ] || die "--np: '$np' is not a rank count"
[[ $host =~ ^[A-Za-z0-9._-]+$ ]] || die "--host: '$host': use letters, digits, . _ -"
[ -x "$app" ] || die "--app $app: no such program (the real build: cmake --build build)"
[ $# -gt 0 ] || die "give the run's arguments after -- (e.g. -- --preset Qwen3-30B-A3B --scale 16 --dispatch all)"
mkdir -p "$out" || die "--out $out: cannot create it"
out=$(cd "$out" && pwd)
models=$out/.starpu/sampling/codelets/45
log=$out/calibrate-$(date +%s%N).log
# StarPU measures the buses into DIR on its first start there; ranks that
# start together race on those files (one reads another's half-written
# affinity file and aborts): one rank of a tiny layer measures them first.
if [ "$np" -gt 1 ] && [ ! -s "$out/.starpu/sampling/bus/$host.affinity" ]; then
  # shellcheck disable=SC2086
  env STARPU_HOME="$out" STARPU_HOSTNAME="$host" $launcher -np 1 "$app" run --hidden 8 --ffn 8 --experts 2 \
    --topk 1 --tokens 8 --dispatch ring --repeat 1 --quiet >"$log.bus" 2>&1 ||
    { tail -n 5 "$log.bus" >&2; echo "sim/calibrate.sh: measuring the buses failed (log: $log.bus)" >&2; exit 1; }
fi
env_args=(STARPU_HOME="$out" STARPU_CALIBRATE=1 STARPU_HOSTNAME="$host")
[ "$keep_samples" -eq 1 ] || env_args+=(STARPU_HISTORY_MAX_ERROR=100000)
# shellcheck disable=SC2086
if ! env "${env_args[@]}" $launcher -np "$np" "$app" run "$@" >"$log" 2>&1; then
  tail -n 5 "$log" >&2
  echo "sim/calibrate.sh: the real run failed (log: $log)" >&2
  exit 1
fi
n=$(find "$models" -maxdepth 1 -name "rmoe_*.$host" 2>/dev/null | wc -l)
if [ "$n" -eq 0 ]; then
  echo "sim/calibrate.sh: the run wrote no rmoe_*.$host model in $models (log: $log)" >&2
  exit 1
fi
{
  echo "recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname) as STARPU_HOSTNAME=$host: $np rank(s) of"
  echo "  $app run $*"
  echo "replay: RMOE_SIM_HISTORY=$out/.starpu/sampling RMOE_SIM_HISTORY_HOST=$host"
} >>"$out/calibration.txt"
echo "sim/calibrate.sh: $n models in $models; replay with RMOE_SIM_HISTORY=$out/.starpu/sampling RMOE_SIM_HISTORY_HOST=$host"
