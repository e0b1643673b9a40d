#!/usr/bin/env bash
# The planner measured (bench/results/multihost.md): the ring with the
# planner's order against the ring in rank order, on the same emulated
# hosts in one session: 4 hosts x 2 ranks (scripts/cluster/), ranks dealt
# round-robin over the hosts (--map-by node), so that rank order crosses
# between hosts on every edge, two edges per host, and the planned order
# once per host. The hosts' fabric links run at RATE, well below shared
# memory, with one link per host, so the edges leaving a host share it.
#
#  1. calibration: the fabric unshaped, CAL runs of the planned ring; the
#     layer's expert flops over their median time give this machine's
#     planning rate (everything a hop costs besides its transfer counted
#     as compute);
#  2. the fabric at RATE; ROUNDS rounds of one run per order, which order
#     goes first alternating round by round; each run is relaymoe run
#     --dispatch ring --repeat 3 (medians, max over ranks);
#  3. the prediction: relaymoe plan under the same mpirun (the live hosts)
#     with a cluster file of the same figures (RATE, one adapter per host,
#     the calibrated rate), once per order: the ratio of its ring-pass
#     times (forward + backward).
# Writes bench/results/multihost.csv (one row per run), multihost.cluster
# (the file given to relaymoe plan), multihost-plan-planned.json and
# multihost-plan-rank.json (its plans), multihost.md and multihost.png.
#   bench/multihost/run.sh [ROUNDS]          (default 8; about 6 minutes)
#   RATE      fabric link per host and direction (default 1gbit)
#   DELAY     added one-way delay (needs the kernel's netem; default none)
#   CAL       calibration runs (default 3)
#   RMOE_APP  relaymoe to run (default build/apps/relaymoe)
# Needs root (network namespaces).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${1:-8}
rate=${RATE:-1gbit}
delay=${DELAY:-}
cal=${CAL:-3}
app=${RMOE_APP:-$here/build/apps/relaymoe}
out=$here/bench/results
py=/usr/bin/python3
# The layer: 4 experts of 3 x 512 x 256 fp32 weights per rank, a 6.3 MB
# partition per hop; 64 tokens per rank keep a hop's compute short, so the
# links, not the 2 cores, decide what the order changes.
layer=(--hidden 512 --ffn 256 --experts 32 --topk 2 --tokens 64)

if [ -z "${RMOE_CLUSTER_DIR:-}" ]; then
  [ -x "$app" ] || { echo "multihost/run.sh: no relaymoe at $app (scripts/build.sh)" >&2; exit 1; }
  "$py" -c 'import matplotlib' 2>/dev/null || { echo "multihost/run.sh: $py needs matplotlib (scripts/setup.sh)" >&2; exit 2; }
  export STARPU_HOME=${STARPU_HOME:-$(dirname "$(dirname "$app")")/starpu-home}
  mkdir -p "$STARPU_HOME" "$out"
  export BENCH_COMMAND="bench/multihost/run.sh $rounds${RATE:+ (RATE=$RATE)}${DELAY:+ (DELAY=$DELAY)}"
  exec "$here/scripts/cluster/cluster.sh" run --hosts 4 --ranks 2 ${delay:+--delay "$delay"} -- "$0" "$@"
fi

work=$RMOE_CLUSTER_DIR
started=$(date +%s)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run_ring() {  # order csv
  "$RMOE_CLUSTER_MPIRUN" --map-by node "$app" run --dispatch ring "${layer[@]}" --repeat 3 --quiet \
    --ring-order "$1" --csv "$2" >"$work/last.log" 2>&1 || { cat "$work/last.log" >&2; return 1; }
  grep "^ring order" "$work/last.log"
}
rows=$work/rows.csv
echo "phase,round,order,fwd_ms,bwd_ms,total_ms" >"$rows"
append() {  # phase round order csv
  tail -n 1 "$4" | awk -F, -v p="$1" -v r="$2" -v o="$3" '{ printf "%s,%s,%s,%s,%s,%.3f\n", p, r, o, $9, $10, $9 + $10 }' >>"$rows"
  rm -f "$4"
}

echo "== calibration: unshaped fabric, planned ring, $cal run(s)"
for i in $(seq 1 "$cal"); do
  run_ring planned "$work/c.csv" >/dev/null
  append calibration "$i" planned "$work/c.csv"
done
tail -n "$cal" "$rows"

echo "== fabric at $rate${delay:+ +$delay}: $rounds round(s), orders alternating"
"$RMOE_CLUSTER_SCRIPT" shape "$rate" "$delay"
for r in $(seq 1 "$rounds"); do
  orders="planned rank"
  [ $((r % 2)) -eq 0 ] && orders="rank planned"
  for o in $orders; do
    run_ring "$o" "$work/m.csv" | sed "s/^/round $r: /"
    append measured "$r" "$o" "$work/m.csv"
    tail -n 1 "$rows"
  done
done

# The cluster file: the shaped fabric and the calibrated rate. The
# prediction is relaymoe plan's, under this mpirun (live host names).
cal_ms=$(awk -F, '$1 == "calibration" { print $6 }' "$rows" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
cluster=$out/multihost.cluster
"$py" - "$cal_ms" "$rate" "$cluster" <<'EOF'
import sys
cal_ms, rate, path = float(sys.argv[1]), sys.argv[2], sys.argv[3]
H, F, E, K, T, N = 512, 256, 32, 2, 64, 8
# The planner's model (rmoe_hop_flops): T*K/N pairs per hop of 6*H*F flops
# forward, three times that backward; N hops each way. With unshaped links
# the transfers hide behind the hop's other costs, so a forward and backward
# of the planned ring take 4 * N hops' worth of forward compute.
hop_flops = T * K / N * 6 * H * F
tflops = hop_flops * 4 * N / (cal_ms * 1e-3) / 1e12
import re
m = re.fullmatch(r"([0-9.]+)(gbit|mbit|kbit|bit)?", rate)
gbs = float(m.group(1)) * {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}.get(m.group(2), 1) / 8e9
with open(path, "w") as f:
    f.write(f"""# The emulated hosts of bench/multihost/run.sh (scripts/cluster/), written by it.
# Format: docs/planning.md, "The cluster format".
name = emulated-4x2
nodes = 4
# CPU-only hosts, 2 ranks each (ranks dealt round-robin: --map-by node).
devices_per_node = 0
ranks_per_node = 2
# One fabric link (veth) per host: the ring edges leaving a host share it.
nics_per_node = 1

[device]
# Calibrated: the expert flops of a forward and backward of the planned
# ring with unshaped links over their measured median time ({cal_ms:.1f} ms),
# so a hop's cost besides its transfer (2 cores for 8 ranks, StarPU-MPI's
# hand-offs) counts as compute.
bf16_tflops = {tflops:.6g}
f32_tflops = {tflops:.6g}
memory = 8G

[link shm]
# Two ranks of a host: Open MPI's shared memory on cores the ranks share;
# an assumption (2 GB/s), small beside the fabric whatever it is.
bandwidth_gbs = 2
latency_us = 5

[link network]
# The fabric as shaped: tbf at {rate} per host and direction.
bandwidth_gbs = {gbs:.6g}
# veth, bridge and TCP on one machine, no netem delay: tens of us (assumed).
latency_us = 50
""")
print(f"cluster file {path}: {tflops:.6g} TFLOP/s from {cal_ms:.1f} ms, network {gbs:.6g} GB/s")
EOF
for o in planned rank; do
  "$RMOE_CLUSTER_MPIRUN" --map-by node "$app" plan "${layer[@]}" --dtype f32 --cluster "$cluster" \
    --ring-order "$o" --json >"$out/multihost-plan-$o.json"
  # The plan names the cluster file as given; results name no local paths.
  sed -i "s|\"file\": \"$here/|\"file\": \"|" "$out/multihost-plan-$o.json"
done

cp "$rows" "$out/multihost.csv"
"$py" "$here/bench/multihost/report.py" --rows "$out/multihost.csv" --plan-planned "$out/multihost-plan-planned.json" \
  --plan-rank "$out/multihost-plan-rank.json" --cluster "$cluster" --rate "$rate" --delay "$delay" \
  --command "${BENCH_COMMAND:-bench/multihost/run.sh}" --load "$load_before" \
  --minutes "$(( ($(date +%s) - started + 59) / 60 ))" --png "$out/multihost.png" --md "$out/multihost.md"
echo "wrote $out/multihost.csv, multihost.cluster, multihost-plan-*.json, multihost.md, multihost.png"
sed -n '/^| /p' "$out/multihost.md"
