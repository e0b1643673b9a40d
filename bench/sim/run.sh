#!/usr/bin/env bash
# The EP sweep under simulation (the paper's Fig. 10 analogue): one MoE layer,
# forward and backward, of a Table 3 shape on a simulated machine described by
# a cluster file (the one relaymoe plan reads), for each EP and dispatcher,
# run by relaymoe's simulation build under StarPU-SimGrid over SMPI.
#
#   bench/sim/run.sh [options]
#
#   --ep "8 16 32 64"        EP degrees = ranks, one GPU each (default)
#   --dispatch "ring token a2a a2a-megatron a2a-deepep"
#                            dispatchers (default: these four; any single one
#                            `relaymoe run --dispatch` accepts)
#   --dispatch-64 "..."      at EP 64 and above only these (default: all of
#                            --dispatch); the others are left out of the table
#   --transport T            gpudirect (default: no host staging, every
#                            dispatcher's device buffers over NVLink or the
#                            adapter) or staged (StarPU-MPI 1.3's host staging
#                            over PCIe for every message): scripts/sim/platform.py
#   --dtype D                bf16 (default) or f32: the tensors' type on every
#                            link and in every kernel's bytes; GEMMs at the
#                            cluster file's rate for it (bf16_tflops, f32_tflops)
#   --sched POLICY           StarPU scheduler (default dmdas)
#   --preset NAME            Table 3 shape (default Qwen3-30B-A3B, 49152 tokens/rank)
#   --scale S                divide H, F and tokens by S (default 1: full size)
#   --cluster FILE           machine (default scheduler/clusters/mn5-acc.cluster)
#   --gpu-tflops R           GPU GEMM rate of the cost model (default: the file's
#                            rate for --dtype); --gpu-gbs B its
#                            memory rate (default 2500), --floor-us U the per-task
#                            floor (default 20): RMOE_SIM_GPU_* of codelets/sim_cost.c
#   --history DIR --history-host HOST
#                            replay StarPU history perfmodels recorded by a real
#                            run (bench/sim/calibrate.sh --out DIR --host HOST)
#                            instead of the roofline (RMOE_SIM_HISTORY)
#   --repeat R               timed repetitions after the warm-up (default 1: a
#                            simulation is deterministic)
#   --timeout S              wall-clock limit of one run (default 900)
#   --app PATH               relaymoe simulation build (default build-sim/apps/relaymoe)
#   --prefix DIR             SimGrid StarPU (default /opt/starpu-sim)
#   --out DIR                results folder (default bench/results)
#   --name NAME              result files NAME.csv, NAME.png, NAME.meta.json
#                            (default sim_ep); bench/results/sim.md is rewritten
#   --keep DIR               keep platforms, plans, logs and raw CSVs in DIR
#   --reuse                  with --keep: a case DIR holds from an invocation at
#                            the same commit (and the same options) is not run
#                            again (bench/sim/all.sh resumes with it)
#
# Writes OUT/NAME.csv (EP, dispatcher, the commit, transport, dtype, scale,
# policy and platform, simulated forward and backward seconds, the bound no
# schedule could beat and its parts (bench/sim/report.py), the memory
# model's peak per rank, bytes sent per rank and pass, the planner's per-hop
# transfer for the ring modes, wall time), OUT/NAME.png (latency
# against EP per dispatcher) and OUT/sim.md (with bench/sim/report.py). A run
# that fails or times out is recorded with its status and the sweep goes on.
# Wall time: about 1-2 ms per simulated task on this 2-core machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/lib/opts.sh
. "$root/scripts/lib/opts.sh"
# shellcheck source=bench/sim/setup.sh
. "$root/bench/sim/setup.sh"
dispatches="ring token a2a a2a-megatron a2a-deepep"
sched=dmdas
scale=1
repeat=1
tmo=900
name=sim_ep
die() { echo "sim/run.sh: $*" >&2; exit 2; }
reuse='' dispatch64=''
OPT_VALUE+=([--dispatch-64]=dispatch64 [--sched]=sched [--repeat]=repeat [--name]=name)
OPT_FLAG+=([--reuse]=reuse)
opts_parse "$@"
py=/usr/bin/python3
[[ $repeat =~ ^[0-9]+$ ]] && [ "$repeat" -ge 1 ] || die "--repeat: '$repeat' is not a positive integer"
[[ $tmo =~ ^[0-9]+$ ]] || die "--timeout: '$tmo' is not a number of seconds"
[[ $name =~ ^[A-Za-z0-9._-]+$ ]] || die "--name: '$name': use letters, digits, . _ -"
sim_setup
plan_app=$root/build/apps/relaymoe   # the real build: plan is pure and runs without MPI
mkdir -p "$out"
if [ -n "$keep" ]; then mkdir -p "$keep"; work=$(cd "$keep" && pwd)
else work=$(mktemp -d /tmp/rmoe-sim-ep.XXXXXX); trap 'rm -rf "$work"' EXIT; fi
rows=$work/rows.csv
echo "ep,dispatch,status,wall_s,run_csv,plan_json,log" >"$rows"
export RMOE_SIM_GPU_TFLOPS=$gpu_tflops RMOE_SIM_GPU_GBS=$gpu_gbs RMOE_SIM_GPU_FLOOR_US=$floor_us
# The worker statistics give the bound its compute term (report.py); in
# simulated time they change nothing.
export STARPU_SILENT=1 STARPU_PROFILING=1 STARPU_WORKER_STATS=1
scale_args=()
[ "$scale" = 1 ] || scale_args=(--scale "$scale")
started=$(date -u '+%Y-%m-%d %H:%M UTC')
t_all=$(date +%s)
echo "sim/run.sh: $preset${scale_args:+ / $scale}, EP $eps, dispatch $dispatches, sched $sched, on $(basename "$cluster"), transport $transport, $dtype, commit $sim_commit"
echo "sim/run.sh: GPU cost model $gpu_tflops TFLOP/s, $gpu_gbs GB/s, floor $floor_us us; app $app"
rpn=$("$py" -c 'import re,sys; m=re.search(r"^ranks_per_node\s*=\s*(\d+)", open(sys.argv[1]).read(), re.M); print(m.group(1) if m else 1)' "$cluster")
for ep in $eps; do
  plat=$work/plat-$ep
  "$py" "$root/scripts/sim/platform.py" "$cluster" -n "$ep" -o "$plat" --transport "$transport" | sed 's/^/  /'
  pj=$work/plan-$ep.json
  if [ -x "$plan_app" ]; then
    "$plan_app" plan --preset "$preset" "${scale_args[@]}" --cluster "$cluster" --ranks "$ep" --dtype "$dtype" --json >"$pj" 2>/dev/null || rm -f "$pj"
  fi
  for d in $dispatches; do
    if [ "$ep" -ge 64 ] && [ -n "$dispatch64" ] && [[ " $dispatch64 " != *" $d "* ]]; then continue; fi
    csv=$work/run-$ep-$d.csv log=$work/run-$ep-$d.log stamp=$work/run-$ep-$d.done
    # What makes a kept case the same case: the commit and every option.
    same="$sim_commit $transport $dtype $preset $scale $sched $repeat $gpu_tflops $gpu_gbs $floor_us $history $(basename "$cluster")"
    if [ -n "$reuse" ] && [ -n "$keep" ] && [ -s "$csv" ] && [ -f "$stamp" ] && [ "$(sed -n 1p "$stamp")" = "$same" ]; then
      wall=$(sed -n 2p "$stamp")
      echo "$ep,$d,ok,$wall,$csv,$pj,$log" >>"$rows"
      echo "sim/run.sh: EP=$ep $d: kept from an earlier invocation (${wall%.*} s wall then)"
      continue
    fi
    rm -f "$csv" "$stamp"
    # The platform places ranks_per_node consecutive ranks on a node, each
    # rank a host of its own: the app groups them the same way. ring and
    # token are the flat rings; ring-striped and token-striped stripe each
    # node-crossing hop as planned.
    run_args=(--dispatch "$d")
    case $d in
      ring|token) run_args=(--dispatch "$d" --stripes 1) ;;
      ring-striped|token-striped) run_args=(--dispatch "${d%-striped}" --stripes 0) ;;
    esac
    echo "sim/run.sh: EP=$ep $d: running ($(date -u +%H:%M:%S))"
    t0=$(date +%s%N)
    rc=0
    ( . "$plat/env.sh"
      [ -z "$history" ] || export RMOE_SIM_HISTORY=$history/.starpu/sampling RMOE_SIM_HISTORY_HOST=$history_host
      cd "$work"
      # shellcheck disable=SC2086
      exec "${sim_norand[@]}" timeout --kill-after=10 "$tmo" "$prefix/bin/starpu_smpirun" -np "$RMOE_SIM_NP" \
        -platform "$RMOE_SIM_PLATFORM" -hostfile "$RMOE_SIM_HOSTFILE" $RMOE_SIM_CFG \
        "$app" run --preset "$preset" "${scale_args[@]}" "${run_args[@]}" --ranks-per-node "$rpn" --sched "$sched" \
        --dtype "$dtype" --repeat "$repeat" --quiet --csv "$csv" ) >"$log" 2>&1 || rc=$?
    # The variant's name in its rows, as the report keys them.
    [ "${d%-striped}" = "$d" ] || [ ! -s "$csv" ] || sed -i "2,\$s/^${d%-striped},/$d,/" "$csv"
    wall=$(( ($(date +%s%N) - t0) / 1000000 ))
    wall=$(printf '%d.%03d' $((wall / 1000)) $((wall % 1000)))
    if [ $rc -eq 0 ]; then
      if [ -s "$csv" ]; then status=ok; else status=no-csv; fi
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=timeout
    else status=failed-rc$rc
    fi
    echo "$ep,$d,$status,$wall,$csv,$pj,$log" >>"$rows"
    [ "$status" != ok ] || printf '%s\n%s\n' "$same" "$wall" >"$stamp"
    if [ "$status" = ok ]; then
      echo "sim/run.sh: EP=$ep $d: fwd $(tail -n 1 "$csv" | cut -d, -f9) ms, bwd $(tail -n 1 "$csv" | cut -d, -f10) ms simulated; ${wall%.*} s wall"
    else
      echo "sim/run.sh: EP=$ep $d: $status after ${wall%.*} s wall; last lines of the log:" >&2
      grep -v '^\[[0-9.]*\] \./src\|^$' "$log" | tail -n 5 | sed 's/^/    /' >&2
    fi
  done
done
cmd="bench/sim/run.sh --ep \"$eps\" --dispatch \"$dispatches\"${dispatch64:+ --dispatch-64 \"$dispatch64\"} --transport $transport --dtype $dtype --name $name --sched $sched --preset $preset --scale $scale --cluster ${cluster#$root/} --gpu-tflops $gpu_tflops --gpu-gbs $gpu_gbs --floor-us $floor_us --repeat $repeat${history:+ --history ${history#$root/} --history-host $history_host}"
"$py" "$root/bench/sim/report.py" ep --rows "$rows" --out "$out" --name "$name" --cmd "$cmd" \
  --date "$started" --cluster "$cluster" --sched "$sched" --preset "$preset" --scale "$scale" \
  --gpu-tflops "$gpu_tflops" --gpu-gbs "$gpu_gbs" --floor-us "$floor_us" --commit "$sim_commit" \
  --transport "$transport" --dtype "$dtype" --repeat "$repeat" --history "${history:+$history (host $history_host)}" --wall "$(( $(date +%s) - t_all ))"
echo "sim/run.sh: wrote $out/$name.csv, $out/$name.png, $out/sim.md ($(( $(date +%s) - t_all )) s)"
