#!/usr/bin/env bash
# Real against simulated, on this machine's CPUs: one small layer run for real
# (build/apps/relaymoe through scripts/mpirun.sh, one StarPU CPU worker per
# rank) and simulated (build-sim/apps/relaymoe under StarPU-SimGrid on the
# --cpu platform of scripts/sim/platform.py, one CPU worker per rank).
# The real runs are interleaved: --repeat rounds, each running every case
# once (a warm-up and one timed pass), each recording StarPU history
# perfmodels of its own (bench/sim/calibrate.sh). Calibration of the links
# and of the analytic rates is measured just before:
#   links    bench/hop/hop_bench.c run with the same launcher and rank count:
#            per-hop time of plain MPI and of StarPU-MPI at 64 KB - 4 MB,
#            fitted as latency + bytes / bandwidth
#   compute  bench/sim/cpu_rates.c: OpenBLAS sgemm on one core at the layer's
#            expert GEMM shapes -> RMOE_SIM_CPU_GFLOPS; a row gather ->
#            RMOE_SIM_CPU_GBS (codelets/sim_cost.c's roofline)
# Three simulations per case:
#   raw       plain MPI's link fit, the analytic rates, a dedicated core per
#             rank: what the hardware alone explains
#   analytic  StarPU-MPI's hop fit (its progress thread, wake-ups and polling
#             on oversubscribed cores become link latency) and the analytic
#             rates times min(1, cores / ranks) (ranks share the cores)
#   history   plain MPI's link and every task as long as the real run of the
#             same round recorded it (codelets/sim_cost.c, RMOE_SIM_HISTORY):
#             the calibrated simulation, one per round, each compared with
#             its own real run; what it leaves unexplained (real - simulated)
#             is the runtime's cost on shared cores, reported per case
# The tolerance applies to the history variant: the median over rounds of
# its error against the round's real run, forward and backward.
#
#   bench/sim/check_real.sh [--ranks "2 4"] [--dispatch "ring token a2a"]
#       [--layer "--hidden 128 --ffn 48 --experts 16 --topk 4 --tokens 1024"]
#       [--repeat 5] [--tol 30] [--floor-us 5] [--sched POLICY]
#       [--real-app PATH] [--sim-app PATH] [--prefix /opt/starpu-sim]
#       [--out bench/results] [--keep DIR] [--resimulate DIR]
#
# --resimulate DIR: a folder an earlier check kept (--keep DIR): its
# calibration, real runs and recordings are reused, only the simulations
# and the report are made again (e.g. after a change of the cost models).
#
# Writes OUT/sim_check.csv, OUT/sim_check.meta.json and rewrites OUT/sim.md.
# Exit 0 when every calibrated (history) case is within --tol percent of the
# real runs, 1 otherwise (the files are written either way), 2 on bad options.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
ranks="2 4"
dispatches="ring token a2a"
layer="--hidden 128 --ffn 48 --experts 16 --topk 4 --tokens 1024"
repeat=5
tol=30
floor_us=5
sched=
real_app=$root/build/apps/relaymoe
sim_app=$root/build-sim/apps/relaymoe
prefix=/opt/starpu-sim
out=$root/bench/results
keep=
resim=
die() { echo "sim/check_real.sh: $*" >&2; exit 2; }
# shellcheck source=scripts/lib/opts.sh
. "$root/scripts/lib/opts.sh"
OPT_VALUE+=([--ranks]=ranks [--dispatch]=dispatches [--layer]=layer [--repeat]=repeat [--tol]=tol
  [--floor-us]=floor_us [--sched]=sched [--real-app]=real_app [--sim-app]=sim_app [--prefix]=prefix
  [--out]=out [--keep]=keep [--resimulate]=resim)
opts_parse "$@"
py=/usr/bin/python3
for n in $ranks; do [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || die "--ranks: '$n' is not a count of at least 2"; done
for d in $dispatches; do case $d in ring|token|a2a) ;; *) die "--dispatch: '$d' is not ring, token or a2a" ;; esac; done
[[ $repeat =~ ^[0-9]+$ ]] && [ "$repeat" -ge 1 ] || die "--repeat: '$repeat' is not a positive integer"
[[ $tol =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--tol: '$tol' is not a percentage"
[[ $floor_us =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--floor-us: '$floor_us' is not a number of microseconds"
# shellcheck disable=SC2206
layer_args=($layer)
get() {  # value of option $1 in the layer arguments
  local i
  for ((i = 0; i < ${#layer_args[@]} - 1; i++)); do
    [ "${layer_args[$i]}" = "$1" ] && { echo "${layer_args[$((i + 1))]}"; return; }
  done
  die "--layer must give $1"
}
H=$(get --hidden) || exit 2
F=$(get --ffn) || exit 2
E=$(get --experts) || exit 2
K=$(get --topk) || exit 2
T=$(get --tokens) || exit 2
[ -x "$real_app" ] || die "no real build at $real_app (scripts/build.sh)"
[ -x "$sim_app" ] || die "no simulation build at $sim_app (cmake -DRMOE_SIMGRID=ON, see docs/simulation.md)"
[ -x "$prefix/bin/starpu_smpirun" ] || die "no starpu_smpirun in $prefix/bin (scripts/build-starpu.sh --prefix $prefix --simgrid)"
# The simulations start in the work folder: absolute paths.
prefix=$(cd "$prefix" && pwd)
sim_app=$(cd "$(dirname "$sim_app")" && pwd)/$(basename "$sim_app")
real_app=$(cd "$(dirname "$real_app")" && pwd)/$(basename "$real_app")
sched_args=()
[ -n "$sched" ] && sched_args=(--sched "$sched")
cores=$(nproc)
mkdir -p "$out"
if [ -n "$resim" ]; then
  [ -f "$resim/real.csv" ] && [ -f "$resim/links.csv" ] && [ -f "$resim/rates.txt" ] ||
    die "--resimulate $resim: not a folder a check kept (real.csv, links.csv, rates.txt)"
  work=$(cd "$resim" && pwd); keep=$work
elif [ -n "$keep" ]; then mkdir -p "$keep"; work=$(cd "$keep" && pwd)
else work=$(mktemp -d /tmp/rmoe-sim-check.XXXXXX); trap 'rm -rf "$work"' EXIT; fi
export STARPU_SILENT=1 OPENBLAS_NUM_THREADS=1
export STARPU_HOME=$work/starpu-home
mkdir -p "$STARPU_HOME"
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1 /proc/loadavg)

links=$work/links.csv
real_rows=$work/real.csv
if [ -n "$resim" ]; then
  read -r started load0 gflops gbs <"$work/rates.txt"
  started=${started//_/ }
  echo "sim/check_real.sh: reusing the measurements of $started in $work"
else
echo "sim/check_real.sh: calibrating this machine ($cores cores)"
gcc -O2 -Wall "$root/bench/sim/cpu_rates.c" -o "$work/cpu_rates" $(pkg-config --cflags --libs openblas)
rates=$("$work/cpu_rates" "$H" "$F" "$E" "$K" "$T")
gflops=$(sed 's/.*gflops=\([0-9.]*\).*/\1/' <<<"$rates")
gbs=$(sed 's/.*gbs=\([0-9.]*\).*/\1/' <<<"$rates")
echo "  one core: sgemm $gflops GFLOP/s at the layer's expert GEMMs, row gather $gbs GB/s"
mpicc -O2 -std=gnu11 "$root/bench/hop/hop_bench.c" -o "$work/hop_bench" $(pkg-config --cflags --libs starpumpi-1.3 starpu-1.3)

echo "${started// /_} $load0 $gflops $gbs" >"$work/rates.txt"
echo "ranks,kind,latency_us,bandwidth_gbs" >"$links"
for n in $ranks; do
  echo "sim/check_real.sh: $n ranks: StarPU-MPI and plain MPI hops (bench/hop/hop_bench.c)"
  "$root/scripts/mpirun.sh" -np "$n" "$work/hop_bench" --sizes 64K,512K,4M --reps 3 --csv "$work/hop-$n.csv" \
    >"$work/hop-$n.log" 2>&1 || { tail -n 5 "$work/hop-$n.log" >&2; die "hop_bench failed on $n ranks"; }
  "$py" "$root/bench/sim/check_eval.py" links "$work/hop-$n.csv" "$n" >>"$links"
  grep "^$n," "$links" | awk -F, '{printf "  %s: latency %.1f us, %.3f GB/s\n", $2, $3, $4}'
done

# The real runs, interleaved: round after round every case once, each a
# single timed pass (after its warm-up) recorded by bench/sim/calibrate.sh
# into a folder of its own, so that its replay uses that pass's durations.
echo "ranks,dispatch,round,real_csv,history" >"$real_rows"
for r in $(seq 1 "$repeat"); do
  for n in $ranks; do
    for d in $dispatches; do
      rec=$work/rec-$n-$d-$r real=$work/real-$n-$d-$r.csv
      echo "sim/check_real.sh: round $r, $n ranks, $d: real run"
      "$root/bench/sim/calibrate.sh" --out "$rec" --np "$n" --host rmoe-check --app "$real_app" -- \
        "${layer_args[@]}" --dispatch "$d" --repeat 1 "${sched_args[@]}" --quiet --csv "$real" >/dev/null ||
        die "the real run failed ($n ranks, $d; log in $rec)"
      echo "$n,$d,$r,$real,$rec/.starpu/sampling" >>"$real_rows"
    done
  done
done
fi

sims=$work/sims.csv
echo "ranks,dispatch,variant,round,run_csv,status" >"$sims"
# simulate N D VARIANT ROUND [HISTORY]: one simulated run, a row of $sims
simulate() {
  local n=$1 d=$2 v=$3 r=$4 hist=${5:-} kind=mpi share=1 status=ok
  [ "$v" != analytic ] || kind=starpu
  [ "$v" != analytic ] || share=$("$py" -c "print(max(1.0, $n / $cores))")
  local lat bw
  IFS=, read -r _ _ lat bw < <(grep "^$n,$kind," "$links")
  local plat=$work/plat-$n-$kind sim=$work/sim-$n-$d-$v-$r.csv
  [ -d "$plat" ] || "$py" "$root/scripts/sim/platform.py" --cpu -n "$n" -o "$plat" --shm-gbs "$bw" \
    --shm-lat-us "$lat" --cpu-gflops "$gflops" >/dev/null
  ( . "$plat/env.sh"
    export RMOE_SIM_CPU_GFLOPS=$("$py" -c "print($gflops / $share)")
    export RMOE_SIM_CPU_GBS=$("$py" -c "print($gbs / $share)")
    export RMOE_SIM_CPU_FLOOR_US=$floor_us
    [ -z "$hist" ] || export RMOE_SIM_HISTORY=$hist RMOE_SIM_HISTORY_HOST=rmoe-check
    cd "$work"
    # shellcheck disable=SC2086
    exec timeout --kill-after=10 600 "$prefix/bin/starpu_smpirun" -np "$RMOE_SIM_NP" \
      -platform "$RMOE_SIM_PLATFORM" -hostfile "$RMOE_SIM_HOSTFILE" $RMOE_SIM_CFG \
      "$sim_app" run "${layer_args[@]}" --dispatch "$d" --repeat 1 "${sched_args[@]}" --quiet --csv "$sim"
  ) >"${sim%.csv}.log" 2>&1 || status=failed
  [ "$status" = ok ] && [ ! -s "$sim" ] && status=no-csv
  echo "$n,$d,$v,$r,$sim,$status" >>"$sims"
  [ "$status" = ok ] || { echo "  $v simulation ($n ranks, $d, round $r) $status; last lines of its log:" >&2
    grep -v '^\[[0-9.]*\] \./src\|^$' "${sim%.csv}.log" | tail -n 5 | sed 's/^/    /' >&2; }
}
echo "sim/check_real.sh: simulations (raw and analytic once, history per recorded round)"
for n in $ranks; do
  for d in $dispatches; do
    simulate "$n" "$d" raw 0
    simulate "$n" "$d" analytic 0
    for r in $(seq 1 "$repeat"); do simulate "$n" "$d" history "$r" "$work/rec-$n-$d-$r/.starpu/sampling"; done
  done
done

load1=$(cut -d' ' -f1 /proc/loadavg)
rc=0
"$py" "$root/bench/sim/check_eval.py" eval --real "$real_rows" --sims "$sims" --links "$links" --out "$out" \
  --tol "$tol" --cores "$cores" --gflops "$gflops" --gbs "$gbs" --floor-us "$floor_us" --date "$started" \
  --layer "$layer" --rounds "$repeat" --load "$load0" "$load1" \
  --cmd "bench/sim/check_real.sh --ranks \"$ranks\" --dispatch \"$dispatches\" --layer \"$layer\" --repeat $repeat --tol $tol --floor-us $floor_us${sched:+ --sched $sched}" || rc=$?
"$py" "$root/bench/sim/report.py" md --out "$out"
echo "sim/check_real.sh: wrote $out/sim_check.csv and $out/sim.md"
[ $rc -eq 0 ] || exit 1
