#!/usr/bin/env bash
# A calibrated simulation end to end (CTest label sim): record StarPU
# history perfmodels from a real one-rank CPU run (bench/sim/calibrate.sh),
# replay them in the simulation build on scripts/sim/platform.py --cpu, and
# compare.
#   1. the replay is deterministic: two runs give the same simulated times;
#   2. the replay uses the recorded durations, not the analytic model: with
#      every recorded mean doubled the simulated forward and backward take
#      twice as long (within 2%: StarPU's own simulated costs are not scaled);
#   3. the replay agrees with the real run it was recorded from within
#      RMOE_SIM_TEST_TOL percent (default 30), forward and backward: one rank
#      and one CPU worker, so the layer's time is its tasks' time. The real
#      figure is the median of 7 repetitions: a single one took 10.0 ms
#      against 6.4 ms of tasks on a shared CI machine (one preemption), and
#      the recorded means average the same repetitions;
#   4. a recording that is not there is an error that names it, and the run
#      writes no results.
#   test_calibrated.sh STARPU_SMPIRUN SIM_RELAYMOE REAL_RELAYMOE WORKDIR
set -euo pipefail
smpirun=$1
sim_app=$2
real_app=$3
work=$4
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
tol=${RMOE_SIM_TEST_TOL:-30}
# Tasks of milliseconds on this kind of machine, so that the per-task costs
# StarPU does not simulate (submission, wake-ups) stay small beside them.
layer=(--hidden 256 --ffn 128 --experts 8 --topk 2 --tokens 2048)
rm -rf "$work"
mkdir -p "$work"
start=$(date +%s)
fail() { echo "test_calibrated: FAIL: $*" >&2; exit 1; }
[ -x "$real_app" ] || fail "no real build at $real_app"

"$src/bench/sim/calibrate.sh" --out "$work/rec" --np 1 --host rmoe-test -- "${layer[@]}" --dispatch ring \
  --repeat 7 --quiet --csv "$work/real.csv" || fail "recording failed"
models=$work/rec/.starpu/sampling/codelets/45
# Any version of each symbol (codelets/codelet_*.c bump it with their kernel).
for sym in expert_ffn expert_bwd gather scatter_add router_fwd; do
  recorded=("$models"/rmoe_"${sym}"_v*.rmoe-test)
  [ -s "${recorded[0]}" ] || fail "no recorded model of $sym in $models"
done

python3 "$src/scripts/sim/platform.py" --cpu -n 1 -o "$work/platform" >/dev/null
# shellcheck disable=SC1091
. "$work/platform/env.sh"
export STARPU_HOME=$work STARPU_SILENT=1
read -r -a cfg <<<"${RMOE_SIM_CFG:-}"
# One rank replays the same way at any address, but the runs go without
# address randomisation all the same, as every simulation here does.
# shellcheck source=../../scripts/lib/norand.sh
. "$src/scripts/lib/norand.sh"
rmoe_norand
simulate() { # simulate NAME HISTORY_DIR: $work/NAME.csv, exit status of the run
  RMOE_SIM_HISTORY=$2 RMOE_SIM_HISTORY_HOST=rmoe-test \
    "${rmoe_norand[@]}" "$smpirun" -np 1 -platform "$RMOE_SIM_PLATFORM" -hostfile "$RMOE_SIM_HOSTFILE" "${cfg[@]}" \
    "$sim_app" run "${layer[@]}" --dispatch ring --repeat 1 --quiet --csv "$work/$1.csv" >"$work/$1.log" 2>&1
}
simulate replay1 "$work/rec/.starpu/sampling" || fail "replay failed (log: $work/replay1.log)"
simulate replay2 "$work/rec/.starpu/sampling" || fail "second replay failed (log: $work/replay2.log)"

# The recording with every mean (column 4 of an entry) and sum doubled.
mkdir -p "$work/double/codelets/45"
for f in "$models"/rmoe_*.rmoe-test; do
  awk '/^# hash/ { print; entries = 1; next }
       entries && NF == 8 { $4 = sprintf("%e", 2 * $4); $6 = sprintf("%e", 2 * $6); $7 = sprintf("%e", 4 * $7) }
       !/^[0-9a-f]+[ \t]/ { entries = 0 }
       { print }' "$f" >"$work/double/codelets/45/$(basename "$f")"
done
simulate double "$work/double" || fail "replay of the doubled recording failed (log: $work/double.log)"

# (Under SMPI a rank that ends early leaves starpu_smpirun's status at 0:
# the error message and the missing CSV say that the run failed.)
simulate missing "$work/no-such-recording" || true
grep -q "RMOE_SIM_HISTORY=$work/no-such-recording: not a folder" "$work/missing.log" ||
  fail "a missing recording was not named (log: $work/missing.log)"
[ ! -e "$work/missing.csv" ] || fail "a run without its recording wrote $work/missing.csv"

python3 - "$work" "$tol" <<'EOF' || fail "see above"
import csv, sys
work, tol = sys.argv[1], float(sys.argv[2]) / 100
def last(name):
    r = list(csv.DictReader(open("%s/%s.csv" % (work, name))))[-1]
    return float(r["fwd_ms"]), float(r["bwd_ms"])
real, a, b, d = last("real"), last("replay1"), last("replay2"), last("double")
bad = 0
for i, ps in enumerate(("forward", "backward")):
    same = a[i] == b[i]
    ratio = d[i] / a[i]
    err = a[i] / real[i] - 1
    print("test_calibrated: %-8s real %.3f ms, replayed %.3f ms (again %.3f: %s), %+.1f%% (tolerance %g%%); "
          "doubled recording %.3f ms = %.3fx" % (ps, real[i], a[i], b[i], "same" if same else "DIFFERENT",
                                                  100 * err, 100 * tol, d[i], ratio))
    bad |= not same or not (1.96 <= ratio <= 2.04) or abs(err) > tol
sys.exit(bad)
EOF
echo "test_calibrated: PASS ($(( $(date +%s) - start )) s wall)"
