#!/usr/bin/python3
"""The planner's time bound against the simulation's, from the committed EP
sweeps.

  plan_bounds.py [--app build/apps/relaymoe] [--results DIR] [--csv OUT] [--check]

For every completed row of sim_ep_full.csv and sim_ep_64.csv (the preset
their .meta.json's command names, on the platform the row names), runs `relaymoe plan --json` on the same
layer (scale, element type, EP) and cluster description and sets its
time_bound (scheduler/rmoe_time_bound.h) beside what the simulation
measured: the bytes the busiest rank sent per pass (sent_fwd_bytes,
sent_bwd_bytes), the wire term bench/sim/report.py bound() derives from
them (bound_wire_ms), the compute term (gpu_exec_ms, the busiest GPU's
executing time) and the bound (bound_ms). Prints the table (Markdown);
--csv writes it.

With --check, exits 1 unless, per row:
  - the bytes and the wire are within TOLERANCE of the simulation's: 2% where
    a graph's traffic is fixed by the configuration, 5% for a2a-deepep,
    whose distinct tokens per block are a uniform router's expectation (a
    striped ring's wire only: its busiest rank also sends relayed pieces);
  - the planner's compute is at most gpu_exec_ms: the simulation costs each
    task at least its flops at the same rate (codelets/sim_cost.c), the
    busiest GPU has at least the mean pairs, and the planner counts no
    per-task floor and no memory-bound kernel;
  - its bound, the larger of compute and wire in each pass summed, is at
    most the simulated time (forward + backward), within the wire
    tolerance: what a bound promises. The simulation's bound, the larger of
    the two totals (StarPU's worker statistics do not split the compute by
    pass), stands beside it; the planner's may exceed it where one pass
    leans on compute and the other on wire.
How far the compute terms are apart is reported, not checked.
"""
import argparse
import csv
import json
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SWEEPS = ("sim_ep_full.csv", "sim_ep_64.csv")
DEFAULT_PRESET = "Qwen3-30B-A3B"
TOLERANCE = {"a2a-deepep": 0.05}
STRIPED = {"ring-striped", "token-striped"}
DEFAULT_TOLERANCE = 0.02
SHAPE = (("hidden", "hidden"), ("ffn", "ffn"), ("experts", "experts"), ("topk", "topk"))
COLUMNS = ("sweep", "ep", "dispatch", "plan_fwd_bytes", "sim_fwd_bytes", "fwd_rel", "plan_bwd_bytes",
           "sim_bwd_bytes", "bwd_rel", "plan_wire_ms", "sim_wire_ms", "wire_rel", "plan_compute_ms",
           "sim_gpu_exec_ms", "compute_ratio", "plan_bound_ms", "sim_bound_ms", "bound_rel", "sim_ms")


def sweep_options(results, sweep):
    """The options the sweep ran with (its .meta.json's command), as a dict
    of option to value; empty without one."""
    try:
        with open(os.path.join(results, sweep[:-len(".csv")] + ".meta.json")) as f:
            words = shlex.split(json.load(f).get("command", ""))
    except (OSError, ValueError):
        return {}
    return {w: v for w, v in zip(words, words[1:]) if w.startswith("--")}


def plan(app, row, opts):
    """The planner's time bounds for the row's layer and platform."""
    cluster = os.path.join(ROOT, "scheduler", "clusters", row["platform"] + ".cluster")
    cmd = [app, "plan", "--preset", opts.get("--preset", DEFAULT_PRESET), "--scale", row["scale"], "--cluster",
           cluster, "--ranks", row["ep"], "--dtype", row["dtype"], "--json"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if out.returncode:
        raise SystemExit("plan_bounds.py: %s failed (%d): %s" % (" ".join(cmd), out.returncode, out.stderr))
    p = json.loads(out.stdout)
    for key, col in SHAPE:
        if p["model"][key] != int(row[col]):
            raise SystemExit("plan_bounds.py: EP %s: the plan's %s = %s, the sweep's %s" %
                             (row["ep"], key, p["model"][key], row[col]))
    if p["tokens_per_rank"] != int(row["tokens"]):
        raise SystemExit("plan_bounds.py: EP %s: the plan's tokens per rank %s, the sweep's %s" %
                         (row["ep"], p["tokens_per_rank"], row["tokens"]))
    tb = p["time_bound"]
    if tb["error"]:
        raise SystemExit("plan_bounds.py: EP %s: no time bound: %s" % (row["ep"], tb["error"]))
    # The simulation's GPU rate (run.sh --gpu-tflops) must be the rate the plan computes at.
    rate = opts.get("--gpu-tflops")
    if rate and float(rate) != tb["device_tflops"]:
        raise SystemExit("plan_bounds.py: the sweep ran GPUs at %s TFLOP/s, the plan computes at %g" %
                         (rate, tb["device_tflops"]))
    # The striped variants (run.sh's ring-striped, token-striped) are the
    # plan's striped table of their flat dispatcher.
    return dict(tb["dispatchers"], **{d + "-striped": b for d, b in tb.get("striped", {}).items()})


def rel(plan_value, sim_value):
    return plan_value / sim_value - 1.0


def compare(app, results):
    """The table's rows, in the sweeps' order."""
    rows = []
    for sweep in SWEEPS:
        with open(os.path.join(results, sweep), newline="") as f:
            done = [r for r in csv.DictReader(f) if r["status"] == "ok"]
        plans, opts = {}, sweep_options(results, sweep)
        for r in done:
            key = (r["ep"], r["scale"], r["dtype"], r["platform"])
            if key not in plans:
                plans[key] = plan(app, r, opts)
            b = plans[key][r["dispatch"]]
            fwd, bwd = b["forward"]["bytes"], b["backward"]["bytes"]
            sf, sb = float(r["sent_fwd_bytes"]), float(r["sent_bwd_bytes"])
            # A striped ring's busiest rank sends the relayed pieces too: its
            # bytes are not its cargo (report.py bound()); the wire compares.
            striped = r["dispatch"].endswith("-striped")
            rows.append(dict(
                sweep=sweep, ep=int(r["ep"]), dispatch=r["dispatch"],
                plan_fwd_bytes=fwd, sim_fwd_bytes=int(sf), fwd_rel=None if striped else rel(fwd, sf),
                plan_bwd_bytes=bwd, sim_bwd_bytes=int(sb), bwd_rel=None if striped else rel(bwd, sb),
                plan_wire_ms=b["wire_ms"], sim_wire_ms=float(r["bound_wire_ms"]),
                wire_rel=rel(b["wire_ms"], float(r["bound_wire_ms"])),
                plan_compute_ms=b["compute_ms"], sim_gpu_exec_ms=float(r["gpu_exec_ms"]),
                compute_ratio=float(r["gpu_exec_ms"]) / b["compute_ms"],
                plan_bound_ms=b["bound_ms"], sim_bound_ms=float(r["bound_ms"]),
                bound_rel=rel(b["bound_ms"], float(r["bound_ms"])), sim_ms=1e3 * float(r["fwd_bwd_s"])))
    return rows


def problems(rows):
    """What --check refuses (module docstring), one sentence each."""
    out = []
    for r in rows:
        tol = TOLERANCE.get(r["dispatch"], DEFAULT_TOLERANCE)
        case = "%s EP %d %s" % (r["sweep"], r["ep"], r["dispatch"])
        for k in ("fwd_rel", "bwd_rel", "wire_rel"):
            if r[k] is not None and abs(r[k]) > tol:
                out.append("%s: %s %+.2f%%, beyond %.0f%%" % (case, k[:-4], 100 * r[k], 100 * tol))
        if r["plan_compute_ms"] > r["sim_gpu_exec_ms"]:
            out.append("%s: the planner's compute %.3f ms exceeds the simulated GPU's %.3f ms" %
                       (case, r["plan_compute_ms"], r["sim_gpu_exec_ms"]))
        if r["plan_bound_ms"] > r["sim_ms"] * (1 + tol):
            out.append("%s: the planner's bound %.3f ms exceeds the simulated time %.3f ms by more than %.0f%%" %
                       (case, r["plan_bound_ms"], r["sim_ms"], 100 * tol))
    expected = {"ring", "token", "a2a", "a2a-megatron", "a2a-deepep"}
    for sweep in SWEEPS:
        for ep in sorted({r["ep"] for r in rows if r["sweep"] == sweep}):
            seen = {r["dispatch"] for r in rows if r["sweep"] == sweep and r["ep"] == ep} - STRIPED
            if seen != expected:
                out.append("%s EP %d: completed rows of %s only" % (sweep, ep, ", ".join(sorted(seen))))
    if not rows:
        out.append("no completed row in %s" % ", ".join(SWEEPS))
    return out


def markdown(rows):
    lines = ["| EP | dispatch | fwd MB plan / sim | bwd MB plan / sim | bytes off | wire ms plan / sim | "
             "compute ms plan / sim GPU | bound ms plan / sim | simulated ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        off = ("%.2f%%" % (100 * max(abs(r["fwd_rel"]), abs(r["bwd_rel"])))
               if r["fwd_rel"] is not None else "relays' pieces")
        lines.append("| %d | %s | %.1f / %.1f | %.1f / %.1f | %s | %.2f / %.2f | %.2f / %.2f (%.2fx) | "
                     "%.2f / %.2f | %.2f |" %
                     (r["ep"], r["dispatch"], r["plan_fwd_bytes"] / 1e6, r["sim_fwd_bytes"] / 1e6,
                      r["plan_bwd_bytes"] / 1e6, r["sim_bwd_bytes"] / 1e6, off, r["plan_wire_ms"],
                      r["sim_wire_ms"], r["plan_compute_ms"], r["sim_gpu_exec_ms"], r["compute_ratio"],
                      r["plan_bound_ms"], r["sim_bound_ms"], r["sim_ms"]))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", default=os.path.join(ROOT, "build", "apps", "relaymoe"))
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--csv", metavar="OUT", help="write the table as CSV")
    ap.add_argument("--check", action="store_true", help="exit 1 beyond the tolerances")
    a = ap.parse_args()
    rows = compare(a.app, a.results)
    print(markdown(rows))
    if a.csv:
        tmp = a.csv + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, a.csv)
    bad = problems(rows) if a.check else []
    for p in bad:
        print("FAIL: " + p)
    if a.check and not bad:
        print("plan_bounds: %d rows within the tolerances" % len(rows))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
