#!/usr/bin/python3
"""The memory headline in its one metric, from the committed result files.

  headline.py [--results DIR] [--check docs/results.md] [--quoted README.md ...]

The metric is fixed before any measurement and used for every ratio: the
total peak of a pass, the larger of StarPU's figure (peak_*_bytes) and the
heap figure (heap_*_bytes), the larger of forward and backward, max over
ranks. Prints each all-to-all baseline over the ring for the default layer
at 2 and 4 ranks (layer_default.csv) and Qwen3-30B-A3B at EP=8, sizes / 16
(memory_sweep.csv); and, from the same sweep at EP = 4 and 8, the largest
excess of the heap figure over the memory model plus the runtime's
structures (runtime_*_bytes), every dispatcher, forward and backward: the
bound the rings' flow control holds. With --check, exits 1 unless the file
(docs/results.md) states every one of those figures on the line that names
it; with --quoted, unless every line of the file (the README, which quotes
some of them) that names one states its figures.
"""
import argparse
import csv
import os
import sys

BASELINES = ("a2a", "a2a-megatron", "a2a-deepep")


def total_peak(r):
    return max(float(r["peak_fwd_bytes"]), float(r["peak_bwd_bytes"]),
               float(r.get("heap_fwd_bytes") or 0), float(r.get("heap_bwd_bytes") or 0))


def ratios(rows):
    """{baseline: baseline / ring} in the total peak, from one point's rows."""
    by = {r["dispatch"]: r for r in rows}
    return {b: total_peak(by[b]) / total_peak(by["ring"]) for b in BASELINES if b in by and "ring" in by}


def headline(results):
    out = []
    with open(os.path.join(results, "layer_default.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    per = [ratios([r for r in rows if r["ranks"] == str(n)]) for n in (2, 4)]
    out.append(("default layer, 2 and 4 ranks",
                "; ".join(", ".join(f"{q[b]:.2f}x" for b in BASELINES if b in q) for q in per)))
    with open(os.path.join(results, "memory_sweep.csv"), newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["preset"] == "Qwen3-30B-A3B" and r["ranks"] == "8"
                and float(r["token_factor"]) == 1.0 and float(r["scale"]) == 16.0]
    q = ratios(rows)
    out.append(("Qwen3-30B-A3B at EP 8", ", ".join(f"{q[b]:.2f}x" for b in BASELINES if b in q)))
    with open(os.path.join(results, "memory_sweep.csv"), newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["ranks"]) >= 4 and float(r.get("heap_fwd_bytes") or 0) > 0]
    # As memory.md's summary measures it: 1 - (model + runtime) / heap.
    excess = max(1.0 - (float(r[f"model_peak_{p}_bytes"]) + float(r.get(f"runtime_{p}_bytes") or 0))
                 / float(r[f"heap_{p}_bytes"]) for r in rows for p in ("fwd", "bwd"))
    out.append(("heap figure over the model with the runtime's structures, EP 4 and 8", f"{100 * excess:+.1f}%"))
    return out


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--results", default=os.path.join(here, "..", "results"))
    ap.add_argument("--check")
    ap.add_argument("--quoted", action="append", default=[])
    a = ap.parse_args()
    lines = headline(a.results)
    for label, figs in lines:
        what = "largest" if figs.endswith("%") else f"total peak, {' and '.join(b + '/ring' for b in BASELINES)}"
        print(f"{label}: {what}: {figs}")
    bad = 0
    if a.check:
        with open(a.check) as f:
            text = f.read().splitlines()
        for label, figs in lines:
            if not any(label in t and figs in t for t in text):
                print(f"FAIL: {a.check} has no line naming '{label}' with '{figs}' (the result files' total peak)",
                      file=sys.stderr)
                bad = 1
    for quoted in a.quoted:
        with open(quoted) as f:
            text = f.read().splitlines()
        for label, figs in lines:
            for no, t in enumerate(text, 1):
                if label in t and figs not in t:
                    print(f"FAIL: {quoted}:{no} names '{label}' without '{figs}' (the result files' total peak)",
                          file=sys.stderr)
                    bad = 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
