#!/usr/bin/env bash
# Every dispatcher's simulated time against what no schedule of it could
# beat (CTest label sim): an 8-rank Qwen3-30B-A3B layer / 2 on
# MareNostrum 5 ACC (two nodes of four, an adapter per GPU), bf16,
# gpudirect, through bench/sim/run.sh; simulated time is deterministic, so
# these are checks of the schedule, not of the machine's load. At 1/8 scale
# the per-task floors dominate; at 1/2 the exchanges and GEMMs do, as at
# full size. Limits (issue 41's targets), each against a ratio measured
# below it:
#   - the rings at most 1.05x their bound (bench/sim/report.py bound()),
#     the token ring 1.10x;
#   - the striped ring (issue 42; run.sh's ring-striped) at most 1.30x:
#     at this size its wire is within 10% of its compute (8.7 against
#     9.6 ms), and a backward hop's weights and gradient stripes take
#     about as long on an adapter as the hop's compute, so the lock step
#     shows (1.26x); at full size, where it is compute-bound, it runs
#     1.08x (bench/results/sim_ep_full.csv). A crossing sender's compute
#     waiting for its own pieces to leave (the unpartition fixed in
#     graph/pass/stripes.c) made it 1.32x here;
#   - a2a and a2a-deepep at most 1.3x theirs;
#   - a2a-megatron, Megatron Core's stages one after another by design, at
#     most 1.10x its no-overlap sum (compute and wire one after the other).
# Which dispatcher is fastest is for the benchmarks to say: no check
# compares two of them.
#   test_sim_bounds.sh STARPU_SMPIRUN RELAYMOE WORKDIR
set -euo pipefail
smpirun=$1
app=$2
work=$3
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"
start=$(date +%s)
prefix=$(dirname "$(dirname "$smpirun")")
disp="ring ring-striped token a2a a2a-megatron a2a-deepep"
echo "test_sim_bounds: EP 8, Qwen3-30B-A3B / 2, bf16, gpudirect: $disp"
"$src/bench/sim/run.sh" --ep 8 --dispatch "$disp" --transport gpudirect --dtype bf16 --scale 2 \
  --app "$app" --prefix "$prefix" --out "$work/out" --name bounds --keep "$work/keep" --timeout 300 |
  grep '^sim/run.sh: EP' || true
/usr/bin/python3 - "$work/out/bounds.csv" "$disp" <<'PY'
import csv, sys
rows = {r["dispatch"]: r for r in csv.DictReader(open(sys.argv[1]))}
# (what the time is measured against, the limit)
limits = {"ring": ("bound_ms", 1.05), "ring-striped": ("bound_ms", 1.30), "token": ("bound_ms", 1.10), "a2a": ("bound_ms", 1.30),
          "a2a-deepep": ("bound_ms", 1.30), "a2a-megatron": ("serial_ms", 1.10)}
bad = 0
for d in sys.argv[2].split():
    r = rows.get(d)
    if r is None or r["status"] != "ok":
        print("test_sim_bounds: %s did not complete: BAD" % d)
        bad += 1
        continue
    key, lim = limits[d]
    t, ref = 1e3 * float(r["fwd_bwd_s"]), float(r[key])
    ratio = t / ref if ref > 0 else float("inf")
    ok = ref > 0 and t >= float(r["bound_ms"]) and ratio <= lim
    print("test_sim_bounds: %-12s %8.3f ms, %s %8.3f ms: %.3fx (limit %.2fx): %s" % (
        d, t, "bound" if key == "bound_ms" else "no-overlap sum", ref, ratio, lim, "ok" if ok else "BAD"))
    bad += not ok
sys.exit(1 if bad else 0)
PY
echo "test_sim_bounds: PASS ($(( $(date +%s) - start )) s wall)"
