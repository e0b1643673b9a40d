#!/usr/bin/env bash
# The striped ring measured on emulated hosts (bench/results/multihost_striped.md):
# 2 hosts x 2 ranks (scripts/cluster/), each rank with its own fabric
# adapter shaped at RATE (--nics 2, scripts/cluster/nic.sh), as each GPU of
# a MareNostrum 5 node has its own. The flat ring (--stripes 1) sends each
# hop that leaves a host over one adapter; the striped ring (as planned: a
# stripe per rank of the host) over both.
#
# ROUNDS rounds of one run of each, which goes first alternating round by
# round; each run is relaymoe run --dispatch D --repeat 3 (medians, max over
# ranks). The metric, chosen before measuring: forward + backward time of
# the striped ring over the flat ring's, per round, and its median and range
# over rounds. Beside it the planner's bound ratio (relaymoe plan under the
# same mpirun with a cluster file of the shaped adapters).
# Writes bench/results/multihost_striped.csv (one row per run),
# multihost_striped.cluster and multihost_striped.md.
#   bench/multihost/striped.sh [ROUNDS]      (default 6; about 2 minutes)
#   RATE      each adapter's link, each direction (default 500mbit)
#   DISPATCH  ring or token (default ring)
#   RMOE_APP  relaymoe to run (default build/apps/relaymoe)
# Needs root (network namespaces).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${1:-6}
rate=${RATE:-500mbit}
dispatch=${DISPATCH:-ring}
app=${RMOE_APP:-$here/build/apps/relaymoe}
out=$here/bench/results
py=/usr/bin/python3
# 4 experts of 3 x 512 x 256 fp32 weights per rank: a 6.3 MB partition per
# hop; 64 tokens per rank keep a hop's compute short, so the links, not the
# 2 cores, decide.
layer=(--hidden 512 --ffn 256 --experts 16 --topk 2 --tokens 64)

if [ -z "${RMOE_CLUSTER_DIR:-}" ]; then
  [[ $rounds =~ ^[0-9]+$ ]] && [ "$rounds" -ge 1 ] || { echo "striped.sh: ROUNDS '$rounds': expected a positive count" >&2; exit 2; }
  case $dispatch in ring | token) ;; *) echo "striped.sh: DISPATCH '$dispatch': expected ring or token" >&2; exit 2 ;; esac
  [ -x "$app" ] || { echo "striped.sh: no relaymoe at $app (scripts/build.sh)" >&2; exit 1; }
  export STARPU_HOME=${STARPU_HOME:-$(dirname "$(dirname "$app")")/starpu-home}
  mkdir -p "$STARPU_HOME" "$out"
  export BENCH_COMMAND="bench/multihost/striped.sh $rounds${RATE:+ (RATE=$RATE)}${DISPATCH:+ (DISPATCH=$DISPATCH)}"
  exec "$here/scripts/cluster/cluster.sh" run --hosts 2 --ranks 2 --nics 2 --rate "$rate" -- "$0" "$@"
fi

work=$RMOE_CLUSTER_DIR
date=$(date -u '+%Y-%m-%d %H:%M UTC')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
rows=$work/rows.csv
echo "round,stripes,fwd_ms,bwd_ms,total_ms" >"$rows"
for r in $(seq 1 "$rounds"); do
  order="1 0"
  [ $((r % 2)) -eq 0 ] && order="0 1"
  for s in $order; do
    "$RMOE_CLUSTER_MPIRUN" "$RMOE_CLUSTER_NIC" "$app" run --dispatch "$dispatch" "${layer[@]}" --stripes "$s" \
      --repeat 3 --quiet --csv "$work/m.csv" >"$work/last.log" 2>&1 || { cat "$work/last.log" >&2; exit 1; }
    tail -n 1 "$work/m.csv" | awk -F, -v r="$r" -v s="$s" '{ printf "%s,%s,%s,%s,%.3f\n", r, s, $9, $10, $9 + $10 }' >>"$rows"
    rm -f "$work/m.csv"
    echo "round $r: $(tail -n 1 "$rows")"
  done
done

# The planner's view of the same machine: the shaped adapters, one per rank.
cluster=$out/multihost_striped.cluster
bits=$("$py" -c 'import re, sys; m = re.fullmatch(r"([0-9.]+)(gbit|mbit|kbit|bit)?", sys.argv[1]); print(float(m.group(1)) * {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}.get(m.group(2), 1))' "$rate")
cat >"$cluster" <<EOF
# The emulated hosts of bench/multihost/striped.sh (scripts/cluster/ --nics 2),
# written by it. Format: docs/planning.md, "The cluster format".
name = emulated-2x2-2nic
nodes = 2
devices_per_node = 0
ranks_per_node = 2
# A fabric adapter per rank, each shaped on its own.
nics_per_node = 2

[device]
# Not calibrated: the bound's compute is not what this compares.
bf16_tflops = 1
f32_tflops = 1
memory = 8G

[link shm]
bandwidth_gbs = 2
latency_us = 5

[link network]
# tbf at $rate per adapter and direction.
bandwidth_gbs = $("$py" -c "print($bits / 8e9)")
latency_us = 50
EOF
"$RMOE_CLUSTER_MPIRUN" "$app" plan "${layer[@]}" --dtype f32 --cluster "$cluster" --json >"$work/plan.json"

"$py" - "$rows" "$work/plan.json" "$out" "$dispatch" "$rate" "$date" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "${BENCH_COMMAND:-bench/multihost/striped.sh $rounds}" "$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo -)" <<'EOF'
import csv, json, os, statistics, sys
rows_path, plan_path, out, dispatch, rate, date, load0, load1, command, commit = sys.argv[1:]
rows = list(csv.DictReader(open(rows_path)))
by = {}
for r in rows:
    by.setdefault(int(r["round"]), {})[r["stripes"]] = float(r["total_ms"])
ratios = [v["0"] / v["1"] for _, v in sorted(by.items()) if "0" in v and "1" in v]
flat = statistics.median(float(r["total_ms"]) for r in rows if r["stripes"] == "1")
striped = statistics.median(float(r["total_ms"]) for r in rows if r["stripes"] == "0")
tb = json.load(open(plan_path))["time_bound"]
b_flat = tb["dispatchers"][dispatch]["wire_ms"]
b_str = tb["striped"][dispatch]["wire_ms"] if tb.get("striped") else float("nan")
tmp = os.path.join(out, "multihost_striped.csv.tmp")
with open(tmp, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=["round", "stripes", "fwd_ms", "bwd_ms", "total_ms"])
    w.writeheader()
    w.writerows(rows)
os.replace(tmp, os.path.join(out, "multihost_striped.csv"))
md = f"""# The striped ring on emulated hosts with an adapter per rank

Command: `{command}` on {date} (commit {commit}); load average {load0} before, {load1} after.
2 hosts x 2 ranks on this machine's 2 cores (scripts/cluster/ --nics 2): each rank's messages
between hosts over its own veth adapter, shaped at {rate} each way (scripts/cluster/nic.sh);
`relaymoe run --dispatch {dispatch} --hidden 512 --ffn 256 --experts 16 --topk 2 --tokens 64
--repeat 3`, fp32, with `--stripes 1` (flat: a hop that leaves a host goes over one adapter) and
`--stripes 0` (as planned: 2 stripes, one per adapter), one run of each per round, the order
alternating. Times: forward + backward, median of 3, max over ranks.

| | flat ring | striped ring | striped / flat |
|---|---|---|---|
| measured, median over {len(ratios)} rounds (ms) | {flat:.1f} | {striped:.1f} | **{statistics.median(ratios):.2f}x** (rounds {min(ratios):.2f}-{max(ratios):.2f}x) |
| planner's wire bound (ms; `relaymoe plan --cluster multihost_striped.cluster`) | {b_flat:.1f} | {b_str:.1f} | {b_str / b_flat:.2f}x |

Per round (striped / flat): {", ".join("%.2f" % r for r in ratios)}.

Caveats: the adapters are veth pairs shaped by tbf on one machine, and 4 ranks share 2 cores, so
a hop's compute and StarPU-MPI's hand-offs take longer than on a cluster; the layer keeps compute
short so that the links decide. The bound counts wire only (the cluster file's compute rate is not
calibrated). Raw rows: multihost_striped.csv.
"""
tmp = os.path.join(out, "multihost_striped.md.tmp")
with open(tmp, "w") as f:
    f.write(md)
os.replace(tmp, os.path.join(out, "multihost_striped.md"))
print(md)
EOF
