#!/usr/bin/env bash
# Scheduler experiments: one configuration (the default layer, ring expert
# routing, 4 ranks) under each StarPU policy, with the ring's priorities
# (graph/: earlier hops first, transfers above their hop's compute) and
# without (--no-prio), rounds alternating over every case so all see the
# same machine. Per run: forward and backward time (relaymoe's medians) and,
# with a relaymoe built against StarPU with FxT, the hidden fraction of the
# transfers from its trace.
# Writes bench/results/sched.csv, sched.md, sched.png.
#   bench/sched/run.sh [ROUNDS]                      (default 2)
#   POLICIES="lws prio ws dmdas eager"               (the default)
#   RMOE_APP   relaymoe to run (default: build/relaymoe-fxt/apps/relaymoe if
#              present, else build/apps/relaymoe: times only)
#   NP         ranks (default 4); extra relaymoe options in RUN_ARGS
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${1:-2}
np=${NP:-4}
policies=${POLICIES:-lws prio ws dmdas eager}
app=${RMOE_APP:-}
if [ -z "$app" ]; then
  app=$here/build/relaymoe-fxt/apps/relaymoe
  [ -x "$app" ] || app=$here/build/apps/relaymoe
fi
[ -x "$app" ] || { echo "sched/run.sh: no relaymoe at $app" >&2; exit 1; }
out=$here/bench/results
# shellcheck source=common.sh
. "$here/bench/sched/common.sh"
trace=0
grep -qs '^#define RMOE_STARPU_HAS_FXT 1' "$(dirname "$(dirname "$app")")/generated/rmoe_config.h" && trace=1
rows=$work/rows.csv
echo "round,policy,prio,fwd_ms,bwd_ms,transfer_ms,hidden_ms,hidden_frac" >"$rows"

run() {  # round policy prio(1|0)
  local flags=(--dispatch ring --repeat "$repeat" --quiet --sched "$2" --csv "$work/t.csv")
  [ "$3" = 0 ] && flags+=(--no-prio)
  [ $trace = 1 ] && flags+=(--trace "$work/trace")
  rm -rf "$work/t.csv" "$work/trace"
  "$here/scripts/mpirun.sh" -np "$np" "$app" run "${flags[@]}" "${extra[@]}" >"$work/log" 2>&1 ||
    { cat "$work/log"; exit 1; }
  # StarPU falls back to its default on a name it does not know: say so.
  if grep -q "scheduling policy '$2' was not found" "$work/log"; then
    echo "sched/run.sh: StarPU has no policy '$2'" >&2; exit 1
  fi
  local times ov=",,"
  times=$(tail -n 1 "$work/t.csv" | cut -d, -f9,10)
  if [ $trace = 1 ]; then
    ov=$($py "$here/scripts/trace/overlap.py" "$work/trace" --quiet --passes "$counted" |
         sed -E 's/.*transfer ([0-9.]+) ms, hidden ([0-9.]+) ms \(([0-9.]+)%\).*/\1,\2,\3/' |
         awk -F, '{printf "%s,%s,%.4f", $1, $2, $3/100}')
  fi
  echo "$1,$2,$3,$times,$ov" >>"$rows"
  echo "round $1 $2 prio=$3: fwd,bwd ms $times; transfer,hidden ms,fraction $ov"
}

# dmda-family policies learn from performance models: one unmeasured run
# each calibrates them in this STARPU_HOME.
for p in $policies; do
  case $p in dm*) run 0 "$p" 1 >/dev/null ;; esac
done
sed -i '/^0,/d' "$rows"
for r in $(seq 1 "$rounds"); do
  for p in $policies; do
    for prio in 1 0; do
      run "$r" "$p" $prio
    done
  done
done
cp "$rows" "$out/sched.csv"
$py "$here/bench/sched/report.py" sched "$out/sched.csv" "$out/sched.png" \
  --command "bench/sched/run.sh $rounds" --np "$np" >"$out/sched.md"
cat "$out/sched.md"
