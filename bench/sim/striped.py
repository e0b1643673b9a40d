#!/usr/bin/python3
"""The striped ring in the simulation: its sweep beside the flat ring's.

  striped.py [--results DIR] [--out FILE]

Reads the sweeps bench/sim/run.sh wrote with the striped ring among their
dispatchers (sim_ep_full.csv: every dispatcher at full size, EP 8, 16 and
32; sim_striped_64.csv: the flat and the striped ring at EP 64, scale 2;
gpudirect, bf16, mn5-acc), each at one commit, and prints per EP: each
ring's simulated forward + backward time, its bound (compute, wire) and
time over bound, the striped ring's time over the flat ring's (measured
side by side) and its bound's ratio, and the models' peaks. Beside them the
fastest all-to-all at that EP, with its commit: of the same sweep at full
size, of sim_ep_64.csv at EP 64 (another commit there, so a reference, not
a measurement of this run). Markdown on stdout, or into --out.
"""
import argparse
import csv
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.normpath(os.path.join(HERE, "..", "results"))
SWEEPS = (("sim_ep_full.csv", "sim_ep_full.csv"), ("sim_striped_64.csv", "sim_ep_64.csv"))
ALLTOALLS = ("a2a", "a2a-megatron", "a2a-deepep")
GIB = float(1 << 30)


def rows_of(path):
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        return {(int(r["ep"]), r["dispatch"]): r for r in csv.DictReader(f) if r["status"] == "ok"}


def ms(r):
    return float(r["fwd_bwd_s"]) * 1e3


def peak(r):
    return max(float(r["model_peak_fwd_bytes"]), float(r["model_peak_bwd_bytes"])) / GIB


def table(results):
    out = ["| EP | scale | commit | ring ms (bound: compute, wire) | ring-striped ms (bound: compute, wire) "
           "| striped/bound | striped/ring, time | striped/ring, bound | model peak GiB, ring / striped "
           "| fastest all-to-all ms (its commit) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    n = 0
    for striped, full in SWEEPS:
        s, f = rows_of(os.path.join(results, striped)), rows_of(os.path.join(results, full))
        for ep in sorted({e for e, _ in s}):
            ring, st = s.get((ep, "ring")), s.get((ep, "ring-striped"))
            if not ring or not st:
                continue
            fast = [f[(ep, d)] for d in ALLTOALLS if (ep, d) in f]
            best = min(fast, key=ms) if fast else None
            out.append("| %d | %s | %s | %.1f (%.1f: %.1f, %.1f) | %.1f (%.1f: %.1f, %.1f) | %.2fx | %.2fx | %.2fx "
                       "| %.2f / %.2f | %s |" % (
                           ep, st["scale"], st["commit"][:7], ms(ring), float(ring["bound_ms"]),
                           float(ring["bound_compute_ms"]), float(ring["bound_wire_ms"]), ms(st),
                           float(st["bound_ms"]), float(st["bound_compute_ms"]), float(st["bound_wire_ms"]),
                           ms(st) / float(st["bound_ms"]), ms(st) / ms(ring),
                           float(st["bound_ms"]) / float(ring["bound_ms"]), peak(ring), peak(st),
                           "%s %.1f (%s)" % (best["dispatch"], ms(best), best["commit"][:7]) if best else "-"))
            n += 1
    if not n:
        raise SystemExit("striped.py: no completed ring and ring-striped rows in %s" % results)
    return "\n".join(out) + "\n"


HEAD = """# The striped ring in the simulation

The rings with each node-crossing hop in a stripe per network adapter
(graph/pass/stripes.c; docs/planning.md, "The striped rings") beside the flat
ring, simulated with StarPU-SimGrid on MareNostrum 5's accelerated partition
(scheduler/clusters/mn5-acc.cluster: four H100 a node, one InfiniBand adapter
per GPU), Qwen3-30B-A3B's layer, bf16, gpudirect, dmdas. Both rings ran in
one sweep at one commit, at full size beside every other dispatcher
(sim_ep_full.csv); time = simulated forward + backward; bound = what no
schedule could beat (bench/sim/report.py): for the striped ring the flat
ring's cargo over the node's four adapters. The fastest all-to-all column
comes from the same sweep at full size, and at EP 64 from sim_ep_64.csv at
its own commit: a reference there, not a side-by-side measurement.

Table: `python3 bench/sim/striped.py --out bench/results/sim_striped.md`.
"""


def sweeps_text(results):
    out = []
    for striped, _ in SWEEPS:
        meta = os.path.join(results, striped[:-len(".csv")] + ".meta.json")
        if os.path.exists(meta):
            with open(meta) as f:
                m = json.load(f)
            out.append("- `%s` (%s, commit %s): `%s`" % (striped, m.get("date", "?"), m.get("commit", "?")[:7],
                                                        m.get("command", "?")))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--out")
    a = ap.parse_args()
    text = table(a.results)
    if a.out:
        text = HEAD + "\n" + sweeps_text(a.results) + "\n" + text
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
