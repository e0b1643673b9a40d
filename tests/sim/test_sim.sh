#!/usr/bin/env bash
# A simulated 8-rank Qwen3-30B-A3B layer under starpu_smpirun (CTest label
# sim): ring expert routing, all-to-all and ring token routing on an 8-rank
# platform, each forward and backward, twice. Every dispatcher must complete
# with finite simulated times; the two runs must give the same times to the
# microsecond (a simulation is deterministic: that is what it is for; the
# runs go without address randomisation, scripts/lib/norand.sh, and where
# the kernel refuses that, within 0.05%); and each dispatcher's simulated
# peak (StarPU's accounting of the buffers it allocates, which a simulation
# keeps though no memory backs them) must lie above what lives across calls
# and at most 5% above the memory model's peak for the routing seen (the
# model counts every buffer of the graphs). Which dispatcher is faster or
# smaller is for the benchmarks (bench/sim/run.sh) to report, not a test.
#   test_sim.sh STARPU_SMPIRUN RELAYMOE WORKDIR
# The platform is scripts/sim/platform.py's MareNostrum 5 ACC (4 H100 per
# node) when that script and python3 are there, else platform8.xml with
# StarPU's shipped "sirocco" node description, one simulated GPU per rank.
#   RMOE_SIM_TEST_SCALE   divide H, F and tokens by this (default 4)
#   RMOE_SIM_TEST_FALLBACK=1   use the fallback platform
set -euo pipefail
smpirun=$1
app=$2
work=$3
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
scale=${RMOE_SIM_TEST_SCALE:-4}
rm -rf "$work"
mkdir -p "$work"
start=$(date +%s)

cfg=()
if [ -z "${RMOE_SIM_TEST_FALLBACK:-}" ] && [ -f "$src/scripts/sim/platform.py" ] &&
   command -v python3 >/dev/null 2>&1; then
  python3 "$src/scripts/sim/platform.py" "$src/scheduler/clusters/mn5-acc.cluster" -n 8 -o "$work/platform"
  # shellcheck disable=SC1091
  . "$work/platform/env.sh"
  platform=$RMOE_SIM_PLATFORM
  hostfile=$RMOE_SIM_HOSTFILE
  read -r -a cfg <<<"${RMOE_SIM_CFG:-}"
  what="mn5-acc (scripts/sim/platform.py)"
else
  prefix=$(dirname "$(dirname "$smpirun")")
  mkdir -p "$work/sampling/bus"
  cp "$prefix"/share/starpu/perfmodels/sampling/bus/sirocco.* "$work/sampling/bus/"
  export STARPU_PERF_MODEL_DIR=$work/sampling STARPU_HOSTNAME=sirocco
  export STARPU_NCUDA=1 STARPU_NCPU=0 STARPU_NOPENCL=0
  platform=$here/platform8.xml
  hostfile=$here/hostfile8
  what="platform8.xml with StarPU's sirocco node"
fi
export STARPU_HOME=$work STARPU_SILENT=1
# shellcheck source=../../scripts/lib/norand.sh
. "$src/scripts/lib/norand.sh"
rmoe_norand
tol=0
if [ "${#rmoe_norand[@]}" -eq 0 ]; then
  tol=0.0005
  echo "test_sim: setarch -R is not permitted here: the two runs need only agree within 0.05%"
fi
echo "test_sim: 8 ranks on $what, Qwen3-30B-A3B / $scale"

run_once() { # run_once N: the Nth simulated run into $work/simN.csv
  local rc=0
  "${rmoe_norand[@]}" "$smpirun" -np 8 -platform "$platform" -hostfile "$hostfile" "${cfg[@]}" \
    "$app" run --preset Qwen3-30B-A3B --scale "$scale" --dispatch all --repeat 1 \
    --csv "$work/sim$1.csv" >"$work/run$1.log" 2>&1 || rc=$?
  grep -v 'xbt_cfg/INFO\|ker_lmm/WARNING\|surf_parse/INFO\|smpi_config/INFO\|simgrid_update_xml\|thread_level_support\|^$' \
    "$work/run$1.log" || true
  if [ "$rc" -ne 0 ]; then
    echo "test_sim: FAIL: starpu_smpirun exited with $rc (log: $work/run$1.log)" >&2
    exit 1
  fi
  [ -s "$work/sim$1.csv" ] || { echo "test_sim: FAIL: no CSV written" >&2; exit 1; }
}
run_once 1
run_once 2
# Columns: dispatch,...,fwd_ms (9),bwd_ms (10),peak_fwd_bytes (11),peak_bwd_bytes (12),...
awk -F, -v want="ring a2a token" -v tol="$tol" '
  function near(a, b) { return tol == 0 ? a == b : (a - b <= tol * b && b - a <= tol * b) }
  FNR == 1 { next }
  NR == FNR { first[$1] = $9 "/" $10; f9[$1] = $9; f10[$1] = $10; next }
  {
    seen[$1] = 1
    ok = ($9 + 0 > 0) && ($10 + 0 > 0) && ($9 !~ /nan|inf/) && ($10 !~ /nan|inf/)
    same = tol == 0 ? first[$1] == $9 "/" $10 : near($9 + 0, f9[$1] + 0) && near($10 + 0, f10[$1] + 0)
    printf "test_sim: %-5s forward %s ms, backward %s ms simulated, again %s: %s\n", $1, $9, $10, first[$1],
           ok && same ? "ok" : "BAD"
    if (!ok || !same) bad = 1
    # peak_fwd (11), peak_bwd (12), resident (13), model_peak_fwd (18), model_peak_bwd (19)
    fits = ($11 + 0 > $13 + 0) && ($12 + 0 > $13 + 0) && ($11 + 0 <= 1.05 * $18) && ($12 + 0 <= 1.05 * $19)
    printf "test_sim: %-5s peak forward %s, backward %s bytes, model %s, %s: %s\n", $1, $11, $12, $18, $19,
           fits ? "ok" : "BAD"
    if (!fits) bad = 1
  }
  END {
    n = split(want, w, " ")
    for (i = 1; i <= n; i++)
      if (!(w[i] in seen)) { printf "test_sim: no row for %s\n", w[i]; bad = 1 }
    exit bad
  }' "$work/sim1.csv" "$work/sim2.csv" || { echo "test_sim: FAIL" >&2; exit 1; }
echo "test_sim: PASS ($(( $(date +%s) - start )) s wall)"
