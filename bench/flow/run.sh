#!/usr/bin/env bash
# What the relays' flow control (graph/pass/flow.c) costs in time: the default
# layer (Qwen3-30B-A3B with H, F, tokens divided by 16) at N ranks, for each
# dispatcher asked, in three arms run by one binary:
#   credits    the default: W=2 receive slots per relayed kind, credits
#   nocredits  the same two slots with the credits off (RMOE_FLOW_CREDITS=off):
#              double buffering as before the credits, early data possible;
#              its difference from `credits` is what the credits cost
#   windowN    W=N: every hop has its own slot, no credit is ever needed,
#              at the memory of N slots
# and, with --baseline BIN, a fourth: a relaymoe binary built from another
# tree (the tree before the credits, say). The arms alternate process by
# process, the order rotating round by round, so all see the same machine;
# each process runs --repeat timed repetitions after a warm-up and reports
# its median forward+backward (max over ranks). Writes OUT/flow_window.csv
# and OUT/flow_window.md with the command and date: per arm the median and
# range over the rounds, the per-round ratio to `credits`, and the heap and
# StarPU peaks beside the model.
#   bench/flow/run.sh [--rounds R] [--repeat N] [--ranks N] [--ncpu C]
#                     [--dispatch "ring token"] [--app BIN] [--baseline BIN]
#                     [--budget S] [--out DIR]
# --ncpu: StarPU CPU workers per rank (default: scripts/mpirun.sh's, 1).
# --budget: no round starts after S seconds (the rounds run so far are
# summarised; at least one always runs). --out: default bench/results.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
rounds=5 repeat=3 np=4 baseline= app=$here/build/apps/relaymoe out=$here/bench/results budget=0 ncpu=
dispatches="ring token"
args=("$@")
die() { echo "run.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || case $1 in -h|--help) ;; *) die "$1 needs a value (see --help)" ;; esac
  case $1 in
    --rounds) rounds=$2 ;;
    --repeat) repeat=$2 ;;
    --ranks) np=$2 ;;
    --ncpu) ncpu=$2 ;;
    --dispatch) dispatches=$2 ;;
    --app) app=$2 ;;
    --baseline) baseline=$2 ;;
    --budget) budget=$2 ;;
    --out) out=$2 ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done
for v in rounds repeat np; do [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v/np/ranks} '${!v}': expected a positive integer"; done
[[ $budget =~ ^[0-9]+$ ]] || die "--budget '$budget': expected seconds"
[ -z "$ncpu" ] || [[ $ncpu =~ ^[1-9][0-9]*$ ]] || die "--ncpu '$ncpu': expected a positive integer"
[ "$np" -ge 3 ] || die "--ranks $np: the credits start at hop 3, so at least 3 ranks"
for d in $dispatches; do
  case $d in ring|token|a2a|a2a-deepep) ;; *) die "--dispatch '$d': expected ring, token, a2a or a2a-deepep (those with credits)" ;; esac
done
[ -x "$app" ] || die "no $app (scripts/build.sh first, or --app BIN)"
[ -z "$baseline" ] || [ -x "$baseline" ] || die "--baseline '$baseline' is not an executable"
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export STARPU_HOME=${STARPU_HOME:-$here/build/starpu-home}
mkdir -p "$STARPU_HOME"
[ -n "$ncpu" ] && export STARPU_NCPU=$ncpu
. "$here/scripts/lib/blas-env.sh"
rmoe_blas_env "$(dirname "$(dirname "$app")")"

arms=("credits" "nocredits" "window$np")
[ -n "$baseline" ] && arms+=("before")
echo "arm,round,dispatch,fwd_bwd_ms,peak_fwd_bytes,peak_bwd_bytes,heap_fwd_bytes,heap_bwd_bytes,model_fwd_bytes,model_bwd_bytes" > "$tmp/flow_window.csv"
start=$SECONDS done_rounds=0
for ((r = 0; r < rounds; r++)); do
  if [ "$budget" -gt 0 ] && [ $r -gt 0 ] && [ $((SECONDS - start)) -ge "$budget" ]; then
    echo "run.sh: the budget of $budget s is spent after $r rounds" >&2
    break
  fi
  n=${#arms[@]}
  for ((i = 0; i < n; i++)); do
    arm=${arms[$(((i + r) % n))]}
    envs=()
    case $arm in
      credits) cmd=("$app" run --window 2) ;;
      nocredits) cmd=("$app" run --window 2); envs=(-x RMOE_FLOW_CREDITS=off) ;;
      before) cmd=("$baseline" run) ;;
      *) cmd=("$app" run --window "$np") ;;
    esac
    for d in $dispatches; do
      rm -f "$tmp/run.csv"
      "$here/scripts/mpirun.sh" "${envs[@]}" -np "$np" "${cmd[@]}" --dispatch "$d" --repeat "$repeat" --quiet \
        --csv "$tmp/run.csv" > "$tmp/log.$arm.$r.$d" 2>&1 || { cat "$tmp/log.$arm.$r.$d" >&2; exit 1; }
      python3 - "$tmp/run.csv" "$arm" "$r" >> "$tmp/flow_window.csv" <<'PY'
import csv, sys
row = next(csv.DictReader(open(sys.argv[1])))
print(",".join([sys.argv[2], sys.argv[3], row["dispatch"], row["fwd_bwd_median_ms"], row["peak_fwd_bytes"],
                row["peak_bwd_bytes"], row["heap_fwd_bytes"], row["heap_bwd_bytes"], row["model_peak_fwd_bytes"],
                row["model_peak_bwd_bytes"]]))
PY
    done
    echo "round $r: $arm done ($((SECONDS - start)) s)"
  done
  done_rounds=$((r + 1))
done
# The commit the binary was built from: a bundle of bench/gpu/pack.sh names
# it (a copied tree's git may name another), else the tree's.
rev() {
  local c=$(dirname "$(dirname "$app")")/COMMIT
  if [ -s "$c" ]; then cut -c1-7 "$c"; else git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown; fi
}
mv "$tmp/flow_window.csv" "$out/flow_window.csv"
python3 "$here/bench/flow/summarize.py" "$out/flow_window.csv" "$out/flow_window.md" "bench/flow/run.sh ${args[*]}" \
  "$np" "$repeat" "$done_rounds" "$(rev)" \
  "${STARPU_NCPU:-1}" "${baseline:-}"
