#!/usr/bin/python3
"""The simulation's headline figures, from the committed EP sweeps.

  headline.py [--results DIR] [--check docs/results.md] [--quoted README.md ...]

For each simulated case the README quotes (1/8 scale at EP 8 and 64,
sim_ep.csv; full size at EP 8 and 32, sim_ep_full.csv; EP 64 at scale 2,
sim_ep_64.csv; all transport gpudirect), prints each all-to-all's forward +
backward time over the ring's, and its bound's ratio (bound_ms over the
ring's: what ideal schedules of both would reach). With --check, exits 1
unless the file (docs/results.md) states every one of those figures on the
line that names the case, so a table rerun without its row fails the test
suite; with --quoted, unless every line of the file (the README) that names
a case states its figures.
"""
import argparse
import csv
import os
import sys

BASELINES = ("a2a", "a2a-megatron", "a2a-deepep")
# (the README line's label, result file, EPs quoted)
CASES = (("simulation, MareNostrum 5, 1/8 scale", "sim_ep.csv", ("8", "64")),
         ("simulation at full size", "sim_ep_full.csv", ("8", "32")),
         ("simulation at EP 64, scale 1/2", "sim_ep_64.csv", ("64",)))


def figures(path, eps):
    """(times, bounds): per baseline, its ratios over the ring at each EP, joined
    as the README writes them ("2.18x, 1.64x; 2.09x, 1.77x; ...")."""
    with open(path, newline="") as f:
        rows = {(r["ep"], r["dispatch"]): r for r in csv.DictReader(f)}
    times, bounds = [], []
    for b in BASELINES:
        t, w = [], []
        for ep in eps:
            r, ring = rows.get((ep, b)), rows.get((ep, "ring"))
            if not r or not ring or r["status"] != "ok" or ring["status"] != "ok":
                raise SystemExit(f"sim/headline.py: {path}: no completed EP {ep} rows of ring and {b}")
            t.append(float(r["fwd_bwd_s"]) / float(ring["fwd_bwd_s"]))
            w.append(float(r["bound_ms"]) / float(ring["bound_ms"]))
        times.append(", ".join(f"{x:.2f}x" for x in t))
        bounds.append(", ".join(f"{x:.2f}x" for x in w))
    return "; ".join(times), bounds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--results", default=os.path.join(here, "..", "results"))
    ap.add_argument("--check", metavar="docs/results.md")
    ap.add_argument("--quoted", metavar="README.md", action="append", default=[])
    a = ap.parse_args()
    text = open(a.check).read().splitlines() if a.check else []
    quoted = {q: open(q).read().splitlines() for q in a.quoted}
    bad = 0
    for label, name, eps in CASES:
        times, bounds = figures(os.path.join(a.results, name), eps)
        print(f"{label} (EP {', '.join(eps)}), {'; '.join(b + '/ring' for b in BASELINES)}: time {times}; "
              f"bound {'; '.join(bounds)}")
        if a.check and not any(label in t and times in t and all(f in t for f in bounds) for t in text):
            print(f"FAIL: {a.check} has no line naming '{label}' with times '{times}' and bound ratios "
                  f"{', '.join(repr(f) for f in bounds)} ({name})", file=sys.stderr)
            bad = 1
        for q, lines in quoted.items():
            for no, t in enumerate(lines, 1):
                if label in t and not (times in t and all(f in t for f in bounds)):
                    print(f"FAIL: {q}:{no} names '{label}' without times '{times}' and bound ratios "
                          f"{', '.join(repr(f) for f in bounds)} ({name})", file=sys.stderr)
                    bad = 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
