#!/usr/bin/python3
"""Checks a converted relaymoe trace of `relaymoe run --dispatch all`:
every rank ran, for every hop of every ring pass, the tasks of the method
under their names, and received the transfers that hop sends under theirs.

    check_trace.py DIR NRANKS

Prints one line per pass and exits 1 with the missing names on failure.
"""

import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
# Run from the source tree: leave no __pycache__ in it.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(here, "..", "..", "scripts", "trace"))
import rmoe_trace  # noqa: E402

# Per dispatcher and direction: tasks named "op hN" at hops first..N-1.
TASKS = {
    ("ring", False): [("gather", 0), ("expert-ffn", 0), ("scatter-add", 0)],
    ("ring", True): [("gather", 0), ("gather-dy", 0), ("recompute", 0), ("expert-bwd", 0),
                     ("grad-accumulate", 1)],
    ("token", False): [("gather", 0), ("expert-ffn", 0), ("scatter-add", 0), ("accumulate", 1)],
    ("token", True): [("gather", 0), ("gather-dy", 0), ("recompute", 0), ("expert-bwd", 0), ("accumulate", 1),
                      ("accumulate-dg", 1)],
}


def main():
    directory, n = sys.argv[1], int(sys.argv[2])
    for f in ("paje.trace", "tasks.rec", "dag.dot", "relaymoe-trace.txt"):
        if not os.path.getsize(os.path.join(directory, f)):
            print("FAIL: %s is empty" % f)
            return 1
    t = rmoe_trace.Trace(directory)
    problems = []
    if t.nranks != n:
        problems.append("relaymoe-trace.txt says %s ranks, expected %d" % (t.nranks, n))
    seen_kinds = set()
    for p in t.passes:
        seen_kinds.add((p.kind, p.backward))
        want_tasks = TASKS.get((p.kind, p.backward), [])
        want_x = rmoe_trace.expected_transfers(p.kind, p.backward, n)
        missing = []
        for r in range(n):
            names = {x.name for x in t.tasks if x.rank == r and x.pass_index == p.index}
            for op, first in want_tasks:
                for h in range(first, n):
                    if "%s h%d" % (op, h) not in names:
                        missing.append("rank %d task '%s h%d'" % (r, op, h))
            got = {(x.what, x.hop) for x in t.transfers if x.dst == r and x.pass_index == p.index}
            for what, h in want_x:
                if (what, h) not in got:
                    missing.append("rank %d transfer '%s h%d'" % (r, what, h))
        nx = sum(1 for x in t.transfers if x.pass_index == p.index)
        print("pass %d %s: %d tasks, %d transfers%s" % (
            p.index, p.label, sum(1 for x in t.tasks if x.pass_index == p.index), nx,
            "" if not missing else "; missing " + ", ".join(missing)))
        problems += ["pass %d %s: %s" % (p.index, p.label, m) for m in missing]
    for kind in [("ring", False), ("ring", True), ("token", False), ("token", True)]:
        if kind not in seen_kinds:
            problems.append("no %s %s pass in the trace" % (kind[0], "bwd" if kind[1] else "fwd"))
    unnamed = [x for x in t.transfers if x.what == "transfer"]
    if unnamed:
        problems.append("%d transfer(s) without a name, e.g. tag %d from %d to %d"
                        % (len(unnamed), unnamed[0].tag, unnamed[0].src, unnamed[0].dst))
    if problems:
        for m in problems:
            print("FAIL:", m)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
