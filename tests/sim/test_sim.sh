#!/usr/bin/env bash
# A simulated 8-rank Qwen3-30B-A3B layer (H, F and tokens divided by
# RMOE_SIM_TEST_SCALE, default 8), bf16, through bench/sim/run.sh on
# scripts/sim/platform.py's MareNostrum 5 ACC (CTest label sim): ring, token
# ring, lean and Megatron all-to-all, each forward and backward, under
# transport gpudirect twice and staged once. Checks:
#   - every case completes with finite times;
#   - a simulation is deterministic: the two gpudirect sweeps give the same
#     times to the microsecond (runs go without address randomisation,
#     scripts/lib/norand.sh; where the kernel refuses that, within 0.05%);
#   - no simulated time lies below its bound (bench/sim/report.py bound());
#   - the two transports differ only in staging: their SMPI platforms are the
#     same file, their StarPU descriptions differ in the host<->GPU link only,
#     and each case sends the same bytes per pass, executes the same GPU work
#     and has the same wire term, with a staging term under staged alone;
#   - each dispatcher's simulated peak (StarPU's accounting of the buffers it
#     allocates, kept though no memory backs them) lies above what lives
#     across calls and at most 5% above the memory model's peak.
# Which dispatcher is faster is for the benchmarks to report, not a test.
#   test_sim.sh STARPU_SMPIRUN RELAYMOE WORKDIR
set -euo pipefail
smpirun=$1
app=$2
work=$3
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
scale=${RMOE_SIM_TEST_SCALE:-8}
py=/usr/bin/python3
rm -rf "$work"
mkdir -p "$work"
start=$(date +%s)
prefix=$(dirname "$(dirname "$smpirun")")
# shellcheck source=../../scripts/lib/norand.sh
. "$src/scripts/lib/norand.sh"
rmoe_norand
tol=0
if [ "${#rmoe_norand[@]}" -eq 0 ]; then
  tol=0.0005
  echo "test_sim: setarch -R is not permitted here: the two runs need only agree within 0.05%"
fi
disp="ring token a2a a2a-megatron a2a-deepep"
sweep() { # sweep NAME TRANSPORT
  echo "test_sim: $1 ($2), EP 8, Qwen3-30B-A3B / $scale, bf16"
  "$src/bench/sim/run.sh" --ep 8 --dispatch "$disp" --transport "$2" --dtype bf16 --scale "$scale" \
    --app "$app" --prefix "$prefix" --out "$work/out" --name "$1" --keep "$work/$1" --timeout 300 |
    grep '^sim/run.sh: EP' || true
}
sweep gd1 gpudirect
sweep gd2 gpudirect
sweep st staged
# The platforms: one SMPI file, StarPU descriptions apart in the staging link only.
cmp -s "$work/gd1/plat-8/platform.xml" "$work/st/plat-8/platform.xml" ||
  { echo "test_sim: FAIL: the transports' SMPI platforms differ" >&2; exit 1; }
d=$(diff "$work/gd1/plat-8/sampling/bus/"*.platform.v4.xml "$work/st/plat-8/sampling/bus/"*.platform.v4.xml |
    grep '^[<>]' | grep -vc 'RAM-CUDA0\|CUDA0-RAM' || true)
[ "$d" = 0 ] || { echo "test_sim: FAIL: the StarPU descriptions differ beyond the host<->GPU link" >&2; exit 1; }
"$py" - "$work" "$tol" "$disp" <<'EOF'
import csv, math, sys
work, tol, want = sys.argv[1], float(sys.argv[2]), sys.argv[3].split()
rows = lambda n: {r["dispatch"]: r for r in csv.DictReader(open("%s/out/%s.csv" % (work, n)))}
g1, g2, st = rows("gd1"), rows("gd2"), rows("st")
bad = []
def check(ok, what):
    print("test_sim: %s: %s" % (what, "ok" if ok else "BAD"))
    if not ok:
        bad.append(what)
near = lambda a, b: a == b if tol == 0 else abs(a - b) <= tol * abs(b)
for d in want:
    for n, t in (("gd1", g1), ("gd2", g2), ("st", st)):
        r = t.get(d)
        check(r is not None and r["status"] == "ok", "%s %s completed" % (n, d))
        if r is None or r["status"] != "ok":
            continue
        f, b = float(r["fwd_s"]), float(r["bwd_s"])
        check(f > 0 and b > 0 and math.isfinite(f + b), "%s %s forward %.3f, backward %.3f ms" % (n, d, 1e3 * f, 1e3 * b))
        sim, bound = 1e3 * float(r["fwd_bwd_s"]), float(r["bound_ms"])
        check(sim >= bound and bound > 0, "%s %s simulated %.3f ms >= bound %.3f ms" % (n, d, sim, bound))
        check(all(r[k] for k in ("commit", "transport", "dtype", "bound_ms")) and r["dtype"] == "bf16",
              "%s %s row records commit, transport, dtype, bound" % (n, d))
        raw = list(csv.DictReader(open("%s/%s/run-8-%s.csv" % (work, n, d))))[-1]
        pf, pb, res = float(raw["peak_fwd_bytes"]), float(raw["peak_bwd_bytes"]), float(raw["resident_bytes"])
        mf, mb = float(raw["model_peak_fwd_bytes"]), float(raw["model_peak_bwd_bytes"])
        check(pf > res and pb > res and pf <= 1.05 * mf and pb <= 1.05 * mb,
              "%s %s peaks %.0f/%.0f above resident %.0f, within 5%% of the model's %.0f/%.0f" % (n, d, pf, pb, res, mf, mb))
    if d not in g1 or d not in g2 or d not in st or "ok" != g1[d]["status"] or "ok" != st[d]["status"] \
            or "ok" != g2[d]["status"]:
        continue
    a, b = g1[d], g2[d]
    check(near(float(a["fwd_s"]), float(b["fwd_s"])) and near(float(a["bwd_s"]), float(b["bwd_s"])),
          "%s deterministic: %s/%s s, again %s/%s s" % (d, a["fwd_s"], a["bwd_s"], b["fwd_s"], b["bwd_s"]))
    s = st[d]
    same = all(a[k] == s[k] for k in ("sent_fwd_bytes", "sent_bwd_bytes", "bound_wire_ms"))
    check(same and near(float(a["bound_compute_ms"]), float(s["bound_compute_ms"])),
          "%s transports: same bytes (%s/%s), wire %s ms, GPU work %s/%s ms" % (
              d, a["sent_fwd_bytes"], a["sent_bwd_bytes"], a["bound_wire_ms"], a["bound_compute_ms"],
              s["bound_compute_ms"]))
    check(float(a["bound_staging_ms"]) == 0 and float(s["bound_staging_ms"]) > 0,
          "%s staging term: gpudirect %s ms, staged %s ms" % (d, a["bound_staging_ms"], s["bound_staging_ms"]))
sys.exit(1 if bad else 0)
EOF
echo "test_sim: PASS ($(( $(date +%s) - start )) s wall)"
