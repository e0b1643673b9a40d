#!/usr/bin/env bash
# The ring's overlap of transfers and compute (paper §3.1, Fig. 17's naive
# ring), measured from traces: the default layer on 4 ranks, ring expert
# routing with overlap on and with --no-overlap, rounds alternating so both
# see the same machine. Per run: the hidden fraction of transfer time
# (scripts/trace/overlap.py, warm-up passes left out) and the layer's
# forward+backward time, traced and untraced.
# Writes bench/results/overlap.csv, overlap.md, overlap.png and the Gantt
# charts overlap_gantt_on.png, overlap_gantt_off.png (one forward and
# backward after the warm-up).
#   bench/sched/overlap.sh [ROUNDS]     (default 3)
#   RMOE_FXT_APP   relaymoe built against StarPU with FxT
#                  (default: build/relaymoe-fxt/apps/relaymoe, scripts/build-fxt.sh's)
#   NP             ranks (default 4); extra relaymoe options in RUN_ARGS
#   NAME           name of the result files instead of "overlap"
#   NOTE           a line for the Markdown (e.g. which StarPU the app uses)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${1:-3}
np=${NP:-4}
app=${RMOE_FXT_APP:-$here/build/relaymoe-fxt/apps/relaymoe}
out=$here/bench/results
name=${NAME:-overlap}
[ -x "$app" ] || { echo "overlap.sh: no relaymoe with FxT at $app (run scripts/build-fxt.sh, or set RMOE_FXT_APP)" >&2; exit 1; }
# shellcheck source=common.sh
. "$here/bench/sched/common.sh"
rows=$work/rows.csv
echo "round,mode,traced,fwd_ms,bwd_ms,transfer_ms,hidden_ms,hidden_frac,compute_ms,transfers" >"$rows"

run() {  # round mode traced
  local flags=(--dispatch ring --repeat "$repeat" --quiet --csv "$work/t.csv")
  [ "$2" = off ] && flags+=(--no-overlap)
  [ "$3" = 1 ] && flags+=(--trace "$work/trace-$2")
  rm -f "$work/t.csv"
  [ "$3" = 1 ] && rm -rf "$work/trace-$2"
  "$here/scripts/mpirun.sh" -np "$np" "$app" run "${flags[@]}" "${extra[@]}" >"$work/log" 2>&1 ||
    { cat "$work/log"; exit 1; }
  local times s=""
  times=$(tail -n 1 "$work/t.csv" | cut -d, -f9,10)
  if [ "$3" = 1 ]; then
    s=$($py "$here/scripts/trace/overlap.py" "$work/trace-$2" --quiet --passes "$counted" --label "$2" |
        sed -E 's/.*transfers ([0-9]+): transfer ([0-9.]+) ms, hidden ([0-9.]+) ms \(([0-9.]+)%\), compute ([0-9.]+) ms.*/\2,\3,\4,\5,\1/')
    IFS=, read -r tr hid pct comp nx <<<"$s"
    echo "$1,$2,1,$times,$tr,$hid,$(awk -v p="$pct" 'BEGIN{printf "%.4f", p/100}'),$comp,$nx" >>"$rows"
    echo "round $1 overlap $2 (traced): fwd,bwd ms $times; transfer $tr ms, hidden $pct%"
  else
    echo "$1,$2,0,$times,,,,," >>"$rows"
    echo "round $1 overlap $2: fwd,bwd ms $times"
  fi
}

for r in $(seq 1 "$rounds"); do
  for mode in on off; do
    run "$r" $mode 1
    run "$r" $mode 0
  done
done
for mode in on off; do
  $py "$here/scripts/trace/rmoe_trace.py" name "$work/trace-$mode" >/dev/null
  $py "$here/scripts/trace/gantt.py" "$work/trace-$mode" --passes 2-3 -o "$out/${name}_gantt_$mode.png" \
    --title "ring on $np ranks, overlap $mode: one forward and backward after the warm-up" >/dev/null
  $py "$here/scripts/trace/overlap.py" "$work/trace-$mode" --passes "$counted" --by-hop \
    --label "overlap $mode, last round" >"$work/table-$mode.txt"
done
cp "$rows" "$out/$name.csv"
$py "$here/bench/sched/report.py" overlap "$out/$name.csv" "$out/$name.png" --name "$name" --note "${NOTE:-}" \
  --command "bench/sched/overlap.sh $rounds" --np "$np" --tables "$work/table-on.txt" "$work/table-off.txt" \
  >"$out/$name.md"
cat "$out/$name.md"
