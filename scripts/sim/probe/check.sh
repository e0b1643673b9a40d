#!/usr/bin/env bash
# Checks the platform files of scripts/sim/platform.py under StarPU-SimGrid,
# independently of relaymoe: builds ring.c (a StarPU-MPI probe) with smpicc
# against a SimGrid StarPU, writes the platform of each cluster file, and runs
# the probe on it at two message sizes.
#
#   scripts/sim/probe/check.sh [--prefix DIR] [--ranks N] [--tol PCT] [--keep DIR] [CLUSTER ...]
#
#   --prefix DIR  SimGrid StarPU (default /opt/starpu-sim: scripts/build-starpu.sh --simgrid)
#   --ranks N     ranks per platform (default 8: two mn5-acc nodes, one DGX node)
#   --tol PCT     tolerance on the fitted bandwidth (default 2)
#   --keep DIR    leave the platforms and logs in DIR (default: a temporary folder)
#   --report FILE also write the results into FILE (bench/results/sim_probe.txt
#                 is what bench/sim/report.py puts into sim.md)
#   CLUSTER       cluster files (default scheduler/clusters/mn5-acc.cluster and dgx-h100.cluster)
#
# Per rank pair it measures the one-way time of StarPU-MPI messages of 1 MiB
# and 16 MiB from rank 0 (host memory to host memory), fits time = a + bytes/bw,
# and compares bw with the link the pair uses in the file (must agree within
# --tol) and a with its latency: a - latency is StarPU-MPI's own per-message
# cost in the simulation (envelope, progress loop), which must lie in 0-5 us.
# The 16 MiB time against bytes/bw + latency is printed. Then an 8-hop ring with
# a 1 ms GPU task per hop checks that each rank has one simulated GPU with the
# file's memory (StarPU uses 90% of it, as on a real GPU) and that a hop costs about task + 2 PCIe copies + the slowest
# link (within 10%: StarPU also simulates its own submission and allocation costs).
# Exit 0 when everything agrees, 1 otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
prefix=/opt/starpu-sim
ranks=8
tol=2
keep=
report=
clusters=()
die() { echo "probe/check: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a folder"; prefix=$2; shift 2 ;;
    --ranks) [ $# -ge 2 ] || die "--ranks needs a count"; ranks=$2; shift 2 ;;
    --tol) [ $# -ge 2 ] || die "--tol needs a percentage"; tol=$2; shift 2 ;;
    --keep) [ $# -ge 2 ] || die "--keep needs a folder"; keep=$2; shift 2 ;;
    --report) [ $# -ge 2 ] || die "--report needs a file"; report=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) die "unknown option '$1'" ;;
    *) clusters+=("$1"); shift ;;
  esac
done
[ ${#clusters[@]} -gt 0 ] || clusters=("$root/scheduler/clusters/mn5-acc.cluster" "$root/scheduler/clusters/dgx-h100.cluster")
[ -f "$prefix/lib/libstarpumpi-1.3.a" ] || die "$prefix has no SimGrid StarPU-MPI (scripts/build-starpu.sh --prefix $prefix --simgrid)"
command -v smpicc >/dev/null || die "smpicc not found (apt-get install libsimgrid-dev)"
if [ -n "$keep" ]; then mkdir -p "$keep"; work=$(cd "$keep" && pwd); else work=$(mktemp -d /tmp/rmoe-probe.XXXXXX); trap 'rm -rf "$work"' EXIT; fi

echo "probe/check: building ring.c against $prefix"
smpicc -O1 -Wall "$here/ring.c" -o "$work/ring" -I"$prefix/include/starpu/1.3" \
  "$prefix/lib/libstarpumpi-1.3.a" "$prefix/lib/libstarpu-1.3.a" -lsimgrid -lstdc++ -lblas -lm -lrt -lpthread

fail=0
summary=$work/summary.txt
: >"$summary"
for c in "${clusters[@]}"; do
  name=$(basename "$c" .cluster)
  plat="$work/$name-$ranks"
  /usr/bin/python3 "$root/scripts/sim/platform.py" "$c" -n "$ranks" -o "$plat"
  for bytes in 1048576 16777216; do
    echo "probe/check: $name, $ranks ranks, $bytes-byte messages"
    ( . "$plat/env.sh"; export STARPU_SILENT=1
      timeout 600 "$prefix/bin/starpu_smpirun" -np "$RMOE_SIM_NP" -platform "$RMOE_SIM_PLATFORM" \
        -hostfile "$RMOE_SIM_HOSTFILE" $RMOE_SIM_CFG "$work/ring" "$bytes" 8 1000 ) \
      > "$plat/run-$bytes.log" 2>&1 || { echo "probe/check: the probe failed; see $plat/run-$bytes.log" >&2; tail -5 "$plat/run-$bytes.log" >&2; fail=1; }
  done
  echo "$name, $ranks ranks ($(basename "$c")): StarPU-MPI messages from rank 0 at 1 MiB and 16 MiB" >>"$summary"
  /usr/bin/python3 - "$plat" "$tol" >"$plat/result.txt" <<'EOF' || fail=1
import json, re, sys
plat, tol = sys.argv[1], float(sys.argv[2]) / 100
info = json.load(open(plat + "/platform.json"))
node, dev = info["node"], info["device"]
def cls(a, b):
    if node[a] != node[b]: return "network"
    return "same_device" if dev[a] == dev[b] else [k for k in info["links_used"] if k in ("nvlink", "pcie")][0]
pp, ring = {}, {}
for size in (1048576, 16777216):
    for line in open("%s/run-%d.log" % (plat, size)):
        m = re.match(r"pingpong src=0 dst=(\d+) bytes=(\d+) oneway_s=([\d.e+-]+)", line)
        if m: pp.setdefault(int(m.group(1)), {})[int(m.group(2))] = float(m.group(3))
        m = re.match(r"ring rank=(\d+) .*bytes=(\d+) .*hop_s=([\d.e+-]+) .*ncuda=(\d+) .*gpu_mem=(\d+)", line)
        if m: ring.setdefault(int(m.group(2)), {})[int(m.group(1))] = (float(m.group(3)), (int(m.group(4)), int(m.group(5))))
ok = True
print("  %-5s %-8s %12s %12s %8s %14s %14s %7s %12s" % ("pair", "link", "file GB/s", "fit GB/s", "err",
      "16MiB model us", "16MiB sim us", "err", "overhead us"))
for dst in sorted(pp):
    t = pp[dst]
    if len(t) != 2:
        print("  0->%d: missing sizes" % dst); ok = False; continue
    k = cls(0, dst)
    bw, lat = info["links_used"][k]["bandwidth_gbs"] * 1e9, info["links_used"][k]["latency_us"] * 1e-6
    (s1, t1), (s2, t2) = sorted(t.items())
    fit_bw = (s2 - s1) / (t2 - t1)
    a = t1 - s1 / fit_bw
    model = s2 / bw + lat
    e_bw, e_t = fit_bw / bw - 1, t2 / model - 1
    over = a - lat
    good = abs(e_bw) <= tol and 0 <= over <= 5e-6
    ok &= good
    print("  0->%-2d %-8s %12.4g %12.4g %+7.2f%% %14.2f %14.2f %+6.2f%% %12.2f %s" % (dst, k, bw / 1e9,
          fit_bw / 1e9, 100 * e_bw, model * 1e6, t2 * 1e6, 100 * e_t, over * 1e6, "" if good else "FAIL"))
pcie_bw, pcie_lat = info["pcie"][0] * 1e9, info["pcie"][1] * 1e-6
for size in sorted(ring):
    hops = ring[size]
    worst = max(s / (info["links_used"][cls(r, (r + 1) % info["ranks"])]["bandwidth_gbs"] * 1e9)
                + info["links_used"][cls(r, (r + 1) % info["ranks"])]["latency_us"] * 1e-6
                for r in range(info["ranks"]) for s in [size])
    model = 1e-3 + 2 * (size / pcie_bw + pcie_lat) + worst
    sim = max(h for h, _ in hops.values())
    ncuda = {n for _, n in hops.values()}
    # StarPU's CUDA driver keeps 10% of a device back (FREE_MARGIN 0.9), as on a real GPU.
    want = (1, int(info["memory_bytes"] // (1 << 20) * 0.9) << 20)
    good = abs(sim / model - 1) <= 0.10 and ncuda == {want} and len(hops) == info["ranks"]
    ok &= good
    print("  ring %8d B: hop %.1f us simulated, %.1f us = 1 ms task + 2 PCIe copies + slowest link "
          "(%+.1f%%); (GPUs, usable device memory) per rank %s, expected %s %s" % (size, sim * 1e6, model * 1e6, 100 * (sim / model - 1),
          sorted(ncuda), want, "" if good else "FAIL"))
print("  %s" % ("ok" if ok else "FAILED"))
sys.exit(0 if ok else 1)
EOF
  tee -a "$summary" <"$plat/result.txt"
done
if [ -n "$report" ]; then
  { echo "scripts/sim/probe/check.sh on $(date -u '+%Y-%m-%d') against $prefix (SimGrid $(smpirun -version 2>/dev/null | head -n 1 | sed 's/.*version //'))"; cat "$summary"; } >"$report"
fi
[ "$fail" -eq 0 ] && echo "probe/check: all platforms agree with their cluster files" || echo "probe/check: FAILED" >&2
exit "$fail"
