#!/usr/bin/env bash
# StarPU scheduling policies compared in simulation: one MoE layer (forward
# and backward) under every policy that makes sense here, with and without
# the ring's task priorities (relaymoe run --no-prio), at each EP on a
# simulated machine (default: MareNostrum 5 ACC, one GPU per rank), ring and
# all-to-all. A simulation is deterministic, so the policies separate where
# the 2-core machine's real runs could not (bench/results/sched.md); every
# case runs --rounds times and the report checks the simulated times agree.
#
#   bench/sim/sched.sh [options]
#
#   --ep "8 16 32 64"        EP degrees = ranks (default)
#   --dispatch "ring a2a"    dispatchers (default)
#   --policies "eager prio ws lws dm dmda dmdas modular-heft"
#                            StarPU policies (default; StarPU 1.3's "heft" is an
#                            alias of dmda, its HEFT is modular-heft). Each name
#                            must be one the simulation's StarPU lists
#                            (STARPU_SCHED=help), checked before any run.
#   --preset NAME --scale S  layer (default Qwen3-30B-A3B / 8)
#   --cluster FILE           machine (default scheduler/clusters/mn5-acc.cluster)
#   --gpu-tflops R --gpu-gbs B --floor-us U   analytic cost model (as run.sh)
#   --history DIR --history-host HOST         replay recorded perfmodels instead
#                            (bench/sim/calibrate.sh; RMOE_SIM_HISTORY)
#   --transport T --dtype D  gpudirect (default) or staged; bf16 (default) or f32
#                            (bench/sim/run.sh says what they mean; sweeps before
#                            they were choices ran staged and f32)
#   --compare CSV            another sweep's sim_sched.csv: the report says whether
#                            its ranking holds here
#   --prio "on off"          with the ring's priorities, without (--no-prio), or both (default)
#   --rounds "1 2"           round numbers to run (default "1 2": every case twice, the
#                            determinism check). Invocations with the same --keep DIR add
#                            up: each reports on every run kept there (e.g. a costly
#                            case once in one invocation, twice in another)
#   --jobs J                 simulations at a time (default 1: simulations running
#                            beside one another on a host changed the all-to-all's
#                            times at EP 32-64 by up to 0.23%; alone, every case
#                            repeats exactly, bench/results/sim_sched_a2a/sim_sched.md)
#   --timeout S              wall-clock limit of one run (default 1800)
#   --app PATH --prefix DIR  simulation build and StarPU (as run.sh)
#   --out DIR                results folder (default bench/results): writes
#                            sim_sched.csv, sim_sched_epN.png, sim_sched.md
#   --keep DIR               keep platforms and logs in DIR
#
# Per run, from StarPU's statistics (STARPU_PROFILING=1, STARPU_WORKER_STATS=1),
# each rank's GPU worker over the run (warm-up and timed pass): executing
# time, waiting time (awake, not executing: a task it took waits for its
# data, and scheduling work) and sleeping time (nothing to run).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/lib/opts.sh
. "$root/scripts/lib/opts.sh"
# shellcheck source=bench/sim/setup.sh
. "$root/bench/sim/setup.sh"
dispatches="ring a2a"
policies="eager prio ws lws dm dmda dmdas modular-heft"
scale=8
rounds="1 2"
prios="on off"
jobs=1
tmo=1800
compare=''
OPT_VALUE+=([--compare]=compare)
die() { echo "sim/sched.sh: $*" >&2; exit 2; }
OPT_VALUE+=([--policies]=policies [--rounds]=rounds [--prio]=prios [--jobs]=jobs)
opts_parse "$@"
py=/usr/bin/python3
for r in $rounds; do [[ $r =~ ^[0-9]+$ ]] && [ "$r" -ge 1 ] || die "--rounds: '$r' is not a round number"; done
[ -n "${rounds// /}" ] || die "--rounds: no round"
for p in $prios; do case $p in on|off) ;; *) die "--prio: '$p' is not on or off" ;; esac; done
[[ $jobs =~ ^[0-9]+$ ]] && [ "$jobs" -ge 1 ] || die "--jobs: '$jobs' is not a positive integer"
[[ $tmo =~ ^[0-9]+$ ]] || die "--timeout: '$tmo' is not a number of seconds"
sim_setup
mkdir -p "$out"
if [ -n "$keep" ]; then mkdir -p "$keep"; work=$(cd "$keep" && pwd)
else work=$(mktemp -d /tmp/rmoe-sim-sched.XXXXXX); trap 'rm -rf "$work"' EXIT; fi
export STARPU_SILENT=1 RMOE_SIM_GPU_TFLOPS=$gpu_tflops RMOE_SIM_GPU_GBS=$gpu_gbs RMOE_SIM_GPU_FLOOR_US=$floor_us

# The policies this StarPU knows, from StarPU itself: an unknown name would
# make StarPU warn and run its default policy, and the sweep would measure
# that one under the wrong label.
plat=$work/plat-$$
"$py" "$root/scripts/sim/platform.py" --cpu -n 1 -o "$plat-help" >/dev/null
known=$( . "$plat-help/env.sh"; cd "$work"
  STARPU_SCHED=help "$prefix/bin/starpu_smpirun" -np 1 -platform "$RMOE_SIM_PLATFORM" -hostfile "$RMOE_SIM_HOSTFILE" \
    $RMOE_SIM_CFG "$app" run --hidden 8 --ffn 8 --experts 2 --topk 1 --tokens 8 --repeat 1 --quiet 2>&1 |
  sed -n 's/^\([A-Za-z0-9_-]*\)[[:space:]]*-> .*/\1/p')
[ -n "$known" ] || die "could not list StarPU's policies (STARPU_SCHED=help) with $app"
for p in $policies; do
  grep -qx -- "$p" <<<"$known" || die "--policies: '$p' is not a policy of this StarPU; it knows: $(echo $known)"
done

started=$(date -u '+%Y-%m-%d %H:%M UTC')
t_all=$(date +%s)
scale_args=()
[ "$scale" = 1 ] || scale_args=(--scale "$scale")
for ep in $eps; do
  "$py" "$root/scripts/sim/platform.py" "$cluster" -n "$ep" -o "$plat-$ep" --transport "$transport" >/dev/null
done
# One case: ep dispatch policy prio round -> a row of results.
run_case() {
  local ep=$1 d=$2 p=$3 prio=$4 r=$5
  local tag="$ep-$d-$p-$prio-$r" rc=0 t0 wall status
  local csv=$work/run-$tag.csv log=$work/run-$tag.log
  local prio_args=()
  [ "$prio" = on ] || prio_args=(--no-prio)
  t0=$(date +%s%N)
  # A StarPU home per case: nothing one run writes is read by another (the
  # rounds of a case get homes of the same length: same environment size).
  mkdir -p "$work/home-$tag"
  ( . "$plat-$ep/env.sh"
    cd "$work"
    export STARPU_HOME=$work/home-$tag
    export STARPU_PROFILING=1 STARPU_WORKER_STATS=1
    [ -z "$history" ] || export RMOE_SIM_HISTORY=$history/.starpu/sampling RMOE_SIM_HISTORY_HOST=$history_host
    # shellcheck disable=SC2086
    exec "${sim_norand[@]}" timeout --kill-after=10 "$tmo" "$prefix/bin/starpu_smpirun" -np "$RMOE_SIM_NP" \
      -platform "$RMOE_SIM_PLATFORM" -hostfile "$RMOE_SIM_HOSTFILE" $RMOE_SIM_CFG \
      "$app" run --preset "$preset" "${scale_args[@]}" --dispatch "$d" --sched "$p" --dtype "$dtype" "${prio_args[@]}" \
      --repeat 1 --quiet --csv "$csv" ) >"$log" 2>&1 || rc=$?
  wall=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ $rc -eq 0 ] && [ -s "$csv" ]; then status=ok
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=timeout
  else status=failed-rc$rc
  fi
  echo "$ep,$d,$p,$prio,$r,$status,$wall,$csv,$log" >"$work/row-$tag"
  echo "sim/sched.sh: EP=$ep $d $p prio=$prio round $r: $status$( [ $status = ok ] &&
    echo ", fwd $(tail -n 1 "$csv" | cut -d, -f9) ms, bwd $(tail -n 1 "$csv" | cut -d, -f10) ms") ($((wall / 1000)) s wall)"
}
echo "sim/sched.sh: $preset / $scale, EP $eps, $dispatches, policies $policies, priorities $prios, round(s) $rounds, $jobs at a time"
n=0
for r in $rounds; do
  for ep in $eps; do
    for d in $dispatches; do
      for p in $policies; do
        for prio in $prios; do
          while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
          run_case "$ep" "$d" "$p" "$prio" "$r" &
          n=$((n + 1))
        done
      done
    done
  done
done
wait
echo "ep,dispatch,policy,prio,round,status,wall_ms,run_csv,log" >"$work/rows.csv"
cat "$work"/row-* >>"$work/rows.csv"
cmd="bench/sim/sched.sh --ep \"$eps\" --dispatch \"$dispatches\" --transport $transport --dtype $dtype --policies \"$policies\" --preset $preset --scale $scale --cluster ${cluster#$root/}"
if [ -n "$history" ]; then cmd="$cmd --history $history --history-host $history_host"
else cmd="$cmd --gpu-tflops $gpu_tflops --gpu-gbs $gpu_gbs --floor-us $floor_us"; fi
cmd="$cmd --prio \"$prios\" --rounds \"$rounds\""
# Runs kept from other invocations into the same folder are part of the
# report, and so are their commands.
if [ -n "$keep" ]; then
  echo "$cmd" >>"$work/commands.txt"
  cmd=$(awk '!seen[$0]++' "$work/commands.txt" | sed ':a;N;$!ba;s/\n/`; `/g')
fi
"$py" "$root/bench/sim/sched_report.py" --rows "$work/rows.csv" --out "$out" --cmd "$cmd" --date "$started" \
  --preset "$preset" --scale "$scale" --cluster "$cluster" --wall "$(( $(date +%s) - t_all ))" --jobs "$jobs" \
  --transport "$transport" --dtype "$dtype" --commit "$sim_commit" ${compare:+--compare "$compare"}
echo "sim/sched.sh: $n runs; wrote $out/sim_sched.csv, $out/sim_sched_ep*.png, $out/sim_sched.md ($(( $(date +%s) - t_all )) s)"
