#!/usr/bin/env python3
"""Checks `--dispatch auto` against the simulation (issue 42).

For each cluster file, Table 3 shape and EP: `relaymoe plan --json` (the
real build) gives auto's choice and every dispatcher's time bound; the
simulation (bench/sim/run.sh) runs the choice, then every other dispatcher
whose bound is below the choice's simulated time / (1 + --tolerance), the
only ones that could beat it by more. A bound is what no schedule of that
dispatcher beats on the described machine (scheduler/rmoe_time_bound.h), so
a dispatcher left unsimulated is proven no faster than the tolerance allows;
every simulated row is checked against its bound too (a simulated time below
its bound would void that proof, and is reported as such).

The choice passes when its simulated time is within the tolerance of the
fastest simulated one. Writes OUT/NAME.csv (a row per case) and OUT/NAME.md
(the table, the command, the date and the commit).

  bench/sim/auto_check.py --ep "8" [--presets "A B ..."] [--clusters "F ..."]
      [--scale-64 2] [--tolerance 0.05] [--out bench/results] [--name sim_auto]
      [--keep DIR] -- [run.sh options: --app, --prefix, ...]
"""
import argparse
import csv
import datetime
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Table 3's shapes, each MoE layer once: MoE-E128, MoE-K8 and MoE-H768 are
# Qwen3-30B-A3B's layer (scheduler/presets.c).
PRESETS = ("Qwen3-30B-A3B Qwen3.5-35B-A3B Qwen2-57B-A14B MoE-E64 MoE-E384 MoE-K4 MoE-K12 MoE-K16 "
           "MoE-H512 MoE-H2048")
CLUSTERS = "scheduler/clusters/mn5-acc.cluster scheduler/clusters/mn5-acc-1nic.cluster"
FIELDS = ("cluster", "preset", "ep", "scale", "auto", "auto_bound_ms", "auto_sim_ms", "fastest", "fastest_sim_ms",
          "auto_over_fastest", "simulated", "pruned", "bound_ok", "verdict", "commit")


def die(msg):
    print("auto_check: " + msg, file=sys.stderr)
    sys.exit(2)


def plan(app, cluster, preset, ep, scale):
    """auto's choice (a run.sh name) and every run.sh name's bound, ms."""
    cmd = [app, "plan", "--preset", preset, "--scale", str(scale), "--cluster", cluster, "--ranks", str(ep),
           "--dtype", "bf16", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        die("%s: %s" % (" ".join(cmd), p.stderr.strip()))
    tb = json.loads(p.stdout)["time_bound"]
    if tb.get("error"):
        die("%s %s EP %d: no time bound: %s" % (cluster, preset, ep, tb["error"]))
    bounds = {name: b["bound_ms"] for name, b in tb["dispatchers"].items()}
    for mode, b in tb.get("striped", {}).items():
        bounds[mode + "-striped"] = b["bound_ms"]
    a = tb["auto"]
    pick = a["dispatch"] + ("-striped" if a["stripes"] > 1 and a["dispatch"] in ("ring", "token") else "")
    if tb["dispatchers"].get(a["dispatch"], {}).get("fits_device") is False:
        die("%s %s EP %d: auto chose %s, over the device" % (cluster, preset, ep, pick))
    return pick, bounds


def simulate(names, cluster, preset, ep, scale, args, run_args):
    """Simulated forward + backward ms of each run.sh name."""
    tag = "%s-%s-%d-%s" % (os.path.basename(cluster).split(".")[0], preset, ep, "-".join(names))
    out = os.path.join(args.keep, "out")
    cmd = [os.path.join(ROOT, "bench/sim/run.sh"), "--ep", str(ep), "--dispatch", " ".join(names), "--preset", preset,
           "--scale", str(scale), "--cluster", cluster, "--transport", "gpudirect", "--dtype", "bf16",
           "--name", tag, "--out", out, "--keep", os.path.join(args.keep, tag), "--reuse"] + run_args
    print("auto_check: " + " ".join(cmd[1:]), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode:
        die("run.sh failed (rc %d):\n%s" % (p.returncode, p.stdout[-3000:]))
    got, commit = {}, ""
    with open(os.path.join(out, tag + ".csv")) as f:
        for r in csv.DictReader(f):
            if r["status"] != "ok":
                die("%s %s EP %d %s: %s" % (cluster, preset, ep, r["dispatch"], r["status"]))
            got[r["dispatch"]] = float(r["fwd_bwd_s"]) * 1e3
            commit = r["commit"]
    return got, commit


def check(cluster, preset, ep, args, run_args):
    scale = args.scale_64 if ep >= 64 else 1
    pick, bounds = plan(args.plan_app, cluster, preset, ep, scale)
    sims, commit = simulate([pick], cluster, preset, ep, scale, args, run_args)
    t = sims[pick]
    # Only a bound below t / (1 + tolerance) leaves room to beat the choice
    # by more than the tolerance.
    rivals = sorted(n for n, b in bounds.items() if n != pick and b * (1 + args.tolerance) < t)
    if rivals:
        more, commit = simulate(rivals, cluster, preset, ep, scale, args, run_args)
        sims.update(more)
    fastest = min(sims, key=sims.get)
    bound_ok = all(sims[n] >= bounds[n] * (1 - 1e-6) for n in sims)
    ok = t <= sims[fastest] * (1 + args.tolerance) and bound_ok
    return {"cluster": os.path.basename(cluster).rsplit(".", 1)[0], "preset": preset, "ep": ep, "scale": scale,
            "auto": pick, "auto_bound_ms": "%.1f" % bounds[pick], "auto_sim_ms": "%.1f" % t, "fastest": fastest,
            "fastest_sim_ms": "%.1f" % sims[fastest], "auto_over_fastest": "%.3f" % (t / sims[fastest]),
            "simulated": " ".join("%s:%.1f" % (n, sims[n]) for n in sorted(sims)),
            "pruned": " ".join("%s:%.1f" % (n, bounds[n]) for n in sorted(bounds) if n not in sims),
            "bound_ok": "yes" if bound_ok else "NO", "verdict": "ok" if ok else "FAIL", "commit": commit[:12]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ep", default="8 16 32 64", help="EP degrees (default: 8 16 32 64)")
    ap.add_argument("--presets", default=PRESETS, help="Table 3 shapes (default: each distinct layer)")
    ap.add_argument("--clusters", default=CLUSTERS, help="cluster files (default: mn5-acc and mn5-acc-1nic)")
    ap.add_argument("--scale-64", type=int, default=2, help="--scale from EP 64 on (default 2, as sim_ep_64)")
    ap.add_argument("--tolerance", type=float, default=0.05, help="how much slower than the fastest auto may be")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    ap.add_argument("--name", default="sim_auto")
    ap.add_argument("--keep", default="/tmp/rmoe-sim-auto", help="run.sh's work folders (reused at one commit)")
    ap.add_argument("--plan-app", default=os.path.join(ROOT, "build/apps/relaymoe"))
    ap.add_argument("run_args", nargs="*", help="after --: options for bench/sim/run.sh (--app, --prefix)")
    args = ap.parse_args()
    eps = [int(e) for e in args.ep.split()]
    if any(e < 2 for e in eps):
        die("--ep '%s': expected rank counts of 2 or more" % args.ep)
    if not 0 <= args.tolerance < 1:
        die("--tolerance %g: expected a fraction from 0 to 1" % args.tolerance)
    if not os.access(args.plan_app, os.X_OK):
        die("no relaymoe build at %s (--plan-app)" % args.plan_app)
    clusters = [c if os.path.isabs(c) else os.path.join(ROOT, c) for c in args.clusters.split()]
    for c in clusters:
        if not os.path.isfile(c):
            die("--clusters: no such file %s" % c)
    os.makedirs(args.keep, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for c in clusters:
        for ep in eps:
            for preset in args.presets.split():
                row = check(c, preset, ep, args, args.run_args)
                rows.append(row)
                print("auto_check: %s %s EP %d: auto %s %s ms, fastest %s %s ms: %s" %
                      (row["cluster"], preset, ep, row["auto"], row["auto_sim_ms"], row["fastest"],
                       row["fastest_sim_ms"], row["verdict"]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    tmp = os.path.join(args.out, args.name + ".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, os.path.join(args.out, args.name + ".csv"))
    bad = [r for r in rows if r["verdict"] != "ok"]
    cmd = "bench/sim/auto_check.py --ep \"%s\" --presets \"%s\" --clusters \"%s\" --tolerance %g --name %s" % (
        args.ep, args.presets, args.clusters, args.tolerance, args.name)
    # run.sh's --prefix and --app name this machine's builds: left out.
    shown, skip = [], False
    for a in args.run_args:
        if skip:
            skip = False
        elif a in ("--prefix", "--app"):
            skip = True
        else:
            shown.append(a)
    md = ["# `--dispatch auto` against the simulation", "",
          "Command: `%s%s` with run.sh's `--prefix` and `--app` for the SimGrid StarPU and the simulation "
          "build (docs/simulation.md) (%s, commit %s). Full size (EP 64 at scale %d), gpudirect, bf16, dmdas." %
          (cmd, " -- " + " ".join(shown) if shown else "", started, rows[0]["commit"] if rows else "-",
           args.scale_64), "",
          "auto: `relaymoe plan --cluster FILE --json`'s choice (the smallest time bound that fits). Simulated: "
          "the choice, and every dispatcher whose bound is below the choice's simulated time / %.2f; the others "
          "(pruned, with their bounds) cannot beat it by more than %d%%, since no simulated time is below its "
          "bound (bound_ok). Times: simulated forward + backward, ms." % (1 + args.tolerance,
                                                                         round(args.tolerance * 100)), "",
          "| cluster | shape | EP | auto | bound | simulated | fastest simulated | auto / fastest | also simulated |"
          " pruned (bound) | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append("| %s | %s | %d | %s | %s | %s | %s %s | %s | %s | %s | %s |" % (
            r["cluster"], r["preset"], r["ep"], r["auto"], r["auto_bound_ms"], r["auto_sim_ms"], r["fastest"],
            r["fastest_sim_ms"], r["auto_over_fastest"], r["simulated"], r["pruned"], r["verdict"]))
    md += ["", "%d of %d cases within %d%% of the fastest%s." % (len(rows) - len(bad), len(rows),
                                                                 round(args.tolerance * 100),
                                                                 "" if not bad else "; failing: " + ", ".join(
                                                                     "%s %s EP %d" % (r["cluster"], r["preset"],
                                                                                      r["ep"]) for r in bad))]
    tmp = os.path.join(args.out, args.name + ".md.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(md) + "\n")
    os.replace(tmp, os.path.join(args.out, args.name + ".md"))
    print("auto_check: wrote %s.csv and .md: %d of %d ok" % (os.path.join(args.out, args.name), len(rows) - len(bad),
                                                               len(rows)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
