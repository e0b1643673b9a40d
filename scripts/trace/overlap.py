#!/usr/bin/python3
"""How much of the ring's transfer time compute hides, from a relaymoe trace.

    scripts/trace/overlap.py DIR [--csv FILE] [--label TEXT] [--passes A-B] [--by-hop] [--quiet]

Per pass, hop and rank: the transfers the rank received that the hop sent
(what they carry, bytes), their time (each from its own StarPU-MPI events:
the sender's isend submission to the receiver's completion of the request),
the part of that interval during which the rank ran a task (hidden: an
intersection, so between 0 and the transfer's time), and the rank's time in
the hop's tasks (compute). The last line sums every row:

    overlap LABEL: ranks 4, passes 8, transfers 96: transfer 812.3 ms, hidden 610.0 ms (75.1%), compute 900.1 ms, passes 1400.2 ms

A transfer that cannot be timed (its link has no end, or ends before it
starts even once the clocks are aligned) or that the tag layout expects
and the trace lacks is flagged: counted in the "flagged" column, left out
of the times, named below the table, and the summary line ends with
"FLAGGED N transfer(s)". --strict then exits 2.

--by-hop sums the passes of one kind (ring fwd, ring bwd, ...) per hop and
rank (pass -1 in the rows). --csv appends the rows (with the label) to FILE,
writing a header first when the file is new.
"""

import argparse
import csv
import os
import sys

# Run from the source tree: leave no __pycache__ in it.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rmoe_trace  # noqa: E402

FIELDS = ["label", "pass", "kind", "hop", "rank", "what", "transfers", "bytes", "transfer_ms", "hidden_ms",
          "hidden_frac", "compute_ms", "flagged"]


def select(rows, passes, count):
    if not passes:
        return rows
    a, _, b = passes.partition("-")
    lo, hi = int(a), int(b) if b else int(a)
    return [r for r in rows if lo <= r["pass"] <= hi]


def by_hop(rows):
    out = {}
    for r in rows:
        key = (r["kind"], r["hop"], r["rank"])
        o = out.setdefault(key, {"pass": -1, "kind": r["kind"], "hop": r["hop"], "rank": r["rank"], "what": set(),
                                 "transfers": 0, "bytes": 0, "transfer_ms": 0.0, "hidden_ms": 0.0,
                                 "compute_ms": 0.0, "passes": set(), "flagged": 0, "problems": []})
        for k in ("transfers", "bytes", "transfer_ms", "hidden_ms", "compute_ms", "flagged"):
            o[k] += r[k]
        o["problems"] += ["pass %d: %s" % (r["pass"], p) for p in r["problems"]]
        o["what"].update(r["what"].split("+"))
        o["passes"].add(r["pass"])
    for o in out.values():
        o["what"] = "+".join(sorted(o["what"]))
    return [out[k] for k in sorted(out, key=lambda k: (k[0].endswith("bwd"), k))]


def summary_line(label, trace, rows, passes):
    s = trace.summary(rows)
    line = ("overlap %s: ranks %d, passes %d, transfers %d: transfer %.1f ms, hidden %.1f ms (%.1f%%), "
            "compute %.1f ms, passes %.1f ms" % (label, s["ranks"], len(passes), s["transfers"], s["transfer_ms"],
                                                s["hidden_ms"], 100 * s["hidden_frac"], s["compute_ms"],
                                                sum(max(0.0, trace.passes[p].end - trace.passes[p].start)
                                                    for p in passes)))
    if s["flagged"]:
        line += ", FLAGGED %d transfer(s) not timed" % s["flagged"]
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--csv")
    ap.add_argument("--label")
    ap.add_argument("--passes", help="passes to count, e.g. 2-7 to leave out a warm-up")
    ap.add_argument("--by-hop", action="store_true", help="sum the passes of each kind per hop and rank")
    ap.add_argument("--quiet", action="store_true", help="print the summary line only")
    ap.add_argument("--strict", action="store_true", help="exit 2 when a transfer is flagged")
    a = ap.parse_args()
    trace = rmoe_trace.Trace(a.dir)
    label = a.label or os.path.basename(os.path.abspath(a.dir))
    rows = select(trace.overlap_rows(), a.passes, len(trace.passes))
    passes = sorted({r["pass"] for r in rows})
    if a.by_hop:
        rows = by_hop(rows)
    for r in rows:
        r["hidden_frac"] = r["hidden_ms"] / r["transfer_ms"] if r["transfer_ms"] > 0 else 0.0
        r["label"] = label
    if not a.quiet:
        print("%4s %-9s %3s %4s %-22s %9s %11s %10s %7s %10s %7s" % ("pass", "kind", "hop", "rank", "what", "MiB",
                                                                  "transfer ms", "hidden ms", "hidden",
                                                                  "compute ms", "flagged"))
        for r in rows:
            head = "%4s %-9s %3d %4d %-22s %9.2f" % ("all" if r["pass"] < 0 else r["pass"], r["kind"], r["hop"],
                                                   r["rank"], r["what"], r["bytes"] / 2**20)
            if r["transfers"]:
                times = "%11.2f %10.2f %6.1f%%" % (r["transfer_ms"], r["hidden_ms"], 100 * r["hidden_frac"])
            else:
                times = "%11s %10s %7s" % ("-", "-", "-")
            print("%s %s %10.2f %7s" % (head, times, r["compute_ms"], r["flagged"] or ""))
        problems = [p for r in rows for p in r["problems"]]
        for p in problems[:20]:
            print("flagged: %s" % p)
        if len(problems) > 20:
            print("flagged: ... and %d more" % (len(problems) - 20))
    if a.csv:
        new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
        with open(a.csv, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
            if new:
                w.writeheader()
            for r in rows:
                w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    if trace.clock_shift and not a.quiet:
        print("clocks: %s (StarPU's start-up alignment left transfers ending before they started)"
              % ", ".join("rank %d shifted %+.2f ms" % (r, v) for r, v in sorted(trace.clock_shift.items())))
    print(summary_line(label, trace, rows, passes))
    if a.strict and any(r["flagged"] for r in rows):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
