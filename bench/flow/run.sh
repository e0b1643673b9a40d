#!/usr/bin/env bash
# What the rings' flow control (graph/flow.c) costs in time: the default
# layer (Qwen3-30B-A3B with H, F, tokens divided by 16) at 4 ranks, ring and
# token routing, with the default window (W=2: credits from hop 3 on) against
# W=N (=4: every hop has its own slot, no credit is ever sent, nothing
# waits), and, with --baseline BIN, against a relaymoe binary built from the
# tree before the credits. The arms alternate process by process, the order
# rotating round by round, so all see the same machine; each process runs
# --repeat timed repetitions after a warm-up and reports its median
# forward+backward (max over ranks). Writes bench/results/flow_window.{csv,md}
# with the command and date: per arm, the median and range over the rounds,
# and the heap and StarPU peaks beside the model.
#   bench/flow/run.sh [--rounds R] [--repeat N] [--ranks N] [--baseline BIN]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
rounds=5 repeat=3 np=4 baseline=
args=("$@")
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift ;;
    --repeat) repeat=$2; shift ;;
    --ranks) np=$2; shift ;;
    --baseline) baseline=$2; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
app=$here/build/apps/relaymoe
[ -x "$app" ] || { echo "run.sh: no $app (scripts/build.sh first)" >&2; exit 2; }
[ -z "$baseline" ] || [ -x "$baseline" ] || { echo "run.sh: --baseline '$baseline' is not an executable" >&2; exit 2; }
out=$here/bench/results
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export STARPU_HOME=${STARPU_HOME:-$here/build/starpu-home}
mkdir -p "$STARPU_HOME"
. "$here/scripts/lib/blas-env.sh"
rmoe_blas_env "$here/build"

arms=("window2" "window$np")
[ -n "$baseline" ] && arms+=("before")
echo "arm,round,dispatch,fwd_bwd_ms,peak_fwd_bytes,peak_bwd_bytes,heap_fwd_bytes,heap_bwd_bytes,model_fwd_bytes,model_bwd_bytes" > "$tmp/flow_window.csv"
for ((r = 0; r < rounds; r++)); do
  n=${#arms[@]}
  for ((i = 0; i < n; i++)); do
    arm=${arms[$(((i + r) % n))]}
    case $arm in
      window2) cmd=("$app" run --window 2) ;;
      before) cmd=("$baseline" run) ;;
      *) cmd=("$app" run --window "$np") ;;
    esac
    for d in ring token; do
      rm -f "$tmp/run.csv"
      "$here/scripts/mpirun.sh" -np "$np" "${cmd[@]}" --dispatch $d --repeat "$repeat" --quiet --csv "$tmp/run.csv" \
        > "$tmp/log.$arm.$r.$d" 2>&1 || { cat "$tmp/log.$arm.$r.$d" >&2; exit 1; }
      python3 - "$tmp/run.csv" "$arm" "$r" >> "$tmp/flow_window.csv" <<'PY'
import csv, sys
row = next(csv.DictReader(open(sys.argv[1])))
print(",".join([sys.argv[2], sys.argv[3], row["dispatch"], row["fwd_bwd_median_ms"], row["peak_fwd_bytes"],
                row["peak_bwd_bytes"], row["heap_fwd_bytes"], row["heap_bwd_bytes"], row["model_peak_fwd_bytes"],
                row["model_peak_bwd_bytes"]]))
PY
    done
    echo "round $r: $arm done"
  done
done
mv "$tmp/flow_window.csv" "$out/flow_window.csv"
python3 "$here/bench/flow/summarize.py" "$out/flow_window.csv" "$out/flow_window.md" "bench/flow/run.sh ${args[*]}" \
  "$np" "$repeat" "$rounds" "$(git -C "$here" rev-parse --short HEAD)" "${baseline:-}"
