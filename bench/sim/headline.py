#!/usr/bin/python3
"""The simulation's headline figures, from the committed EP sweeps.

  headline.py [--results DIR] [--check docs/results.md] [--quoted README.md ...]
  headline.py [--results DIR] --table

For each simulated case docs/results.md quotes (full size at EP 8, 16 and
32, sim_ep_full.csv; EP 64 at scale 2, sim_ep_64.csv; transport gpudirect,
bf16: no 1/8-scale case, where the per-task floors, not the links, set the
times), prints each all-to-all's forward +
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
CASES = (("simulation at full size", "sim_ep_full.csv", ("8", "16", "32")),
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


def per_ep_table(path, eps):
    """A Markdown table per EP: every dispatcher's simulated forward +
    backward time, its bound, the one over the other (how far the schedule
    is from what its links and GPU allow), over its no-overlap sum (serial:
    below 1 where its pipeline overlaps), both over the ring's, and its
    model peak; the fastest all-to-all named beside the ring."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    out = []
    for ep in eps:
        at = {r["dispatch"]: r for r in rows if r["ep"] == ep}
        ring = at.get("ring")
        if not ring:
            continue
        out.append(f"EP {ep} ({os.path.basename(path)}, commit {ring['commit'][:7]}):\n")
        out.append("| dispatcher | time ms | bound ms (compute, wire) | time/bound | time/serial | time/ring "
                   "| bound/ring | model peak GiB |\n|---|---|---|---|---|---|---|---|\n")
        for d, r in at.items():
            t, b = 1e3 * float(r["fwd_bwd_s"]), float(r["bound_ms"])
            peak = max(float(r["model_peak_fwd_bytes"]), float(r["model_peak_bwd_bytes"])) / 2**30
            out.append(f"| {d} | {t:.1f} | {b:.1f} ({float(r['bound_compute_ms']):.1f}, "
                       f"{float(r['bound_wire_ms']):.1f}) | {t / b:.2f}x | {t / float(r['serial_ms']):.2f}x "
                       f"| {t / (1e3 * float(ring['fwd_bwd_s'])):.2f}x "
                       f"| {b / float(ring['bound_ms']):.2f}x | {peak:.2f} |\n")
        base = [d for d in at if d in BASELINES]
        if base:
            fast = min(base, key=lambda d: float(at[d]["fwd_bwd_s"]))
            out.append(f"\nFastest all-to-all: {fast}.\n\n")
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--results", default=os.path.join(here, "..", "results"))
    ap.add_argument("--check", metavar="docs/results.md")
    ap.add_argument("--quoted", metavar="README.md", action="append", default=[])
    ap.add_argument("--table", action="store_true", help="print the per-EP tables (Markdown) instead")
    a = ap.parse_args()
    if a.table:
        for _, name, eps in CASES:
            print(per_ep_table(os.path.join(a.results, name), eps), end="")
        return 0
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
