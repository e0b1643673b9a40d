#!/usr/bin/python3
"""Where a pass's time goes, from a relaymoe FxT trace (`relaymoe run
--trace DIR`): per pass and rank, the span from its first task's start to
its last task's end, the part of it no task of the rank covers (gaps: the
rank's workers all idle or in StarPU between tasks, waiting for a transfer
or for the host's submission), the largest gap and the tasks around it, and
each operation's time; against the pass's wall time as relaymoe measured it
(from before its first submission to after its outputs are back), the rest
lies outside the tasks' span.

  trace_gaps.py DIR [DIR ...] --labels L1,L2,... --csv RUN.csv --repeat R --out OUT.csv

Each DIR is one run's trace with the CSV row relaymoe wrote (--csv, the
same order as the DIRs); passes: the warm-up is left out, figures are
medians over the R timed forwards (backwards), per rank, then the rank with
the longest span. Passes are found in the tasks themselves: a forward
begins with router-fwd; its backward begins where, in submission order, a
task is submitted after every earlier task had ended (the application waits
for a pass's outputs) before the first backward-only operation.
"""
import argparse
import csv
import os
import statistics
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "trace"))
import rmoe_trace  # noqa: E402

BACKWARD_OPS = {"gather-dy", "recompute", "expert-bwd", "router-bwd", "grad-accumulate"}


def read_submits(path):
    """SubmitTime of every task (tasks.rec), in the order rmoe_trace.read_tasks reads them."""
    return [float(r.get("SubmitTime", r["StartTime"])) for r in rmoe_trace.read_task_records(path)]


class Timed:
    """A trace's task with its submission time."""

    def __init__(self, task, submit):
        self.name, self.op, self.rank = task.name, task.op, task.rank
        self.start, self.end, self.submit = task.start, task.end, submit


def passes_of(tasks):
    """[(kind, [tasks])] of one rank, in time order."""
    tasks = sorted(tasks, key=lambda t: t.submit)
    groups, cur = [], None
    for t in tasks:
        if t.op == "router-fwd":
            cur = []
            groups.append(cur)
        if cur is not None:
            cur.append(t)
    out = []
    for g in groups:
        first_bwd = next((i for i, t in enumerate(g) if t.op in BACKWARD_OPS), None)
        if first_bwd is None:
            out.append(("fwd", g))
            continue
        split, latest_end = 0, float("-inf")
        for i, t in enumerate(g):
            if i > 0 and t.submit >= latest_end and i <= first_bwd:
                split = i
            latest_end = max(latest_end, t.end)
        out.append(("fwd", g[:split]))
        out.append(("bwd", g[split:]))
    return out


def pass_figures(tasks):
    start = min(t.start for t in tasks)
    end = max(t.end for t in tasks)
    union = rmoe_trace.merge([(t.start, t.end) for t in tasks if t.end > t.start])
    covered = sum(b - a for a, b in union)
    biggest, where = 0.0, ""
    for (a0, a1), (b0, b1) in zip(union, union[1:]):
        if b0 - a1 > biggest:
            before = max((t for t in tasks if t.end <= b0 + 1e-9), key=lambda t: t.end)
            after = min((t for t in tasks if t.start >= a1 - 1e-9), key=lambda t: t.start)
            biggest, where = b0 - a1, f"{before.name} -> {after.name}"
    ops = {}
    for t in tasks:
        ops[t.op] = ops.get(t.op, 0.0) + (t.end - t.start)
    return {"span": end - start, "covered": covered, "gaps": end - start - covered, "biggest": biggest,
            "where": where, "ops": ops, "tasks": len(tasks), "submit_to_start": start - min(t.submit for t in tasks)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--labels", required=True)
    ap.add_argument("--csv", required=True, help="comma-separated run CSVs, one per DIR")
    ap.add_argument("--repeat", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    labels, csvs = a.labels.split(","), a.csv.split(",")
    if not (len(labels) == len(csvs) == len(a.dirs)):
        sys.exit("trace_gaps.py: one label and one CSV per trace folder")
    fields = ["label", "pass", "wall_ms", "span_ms", "outside_span_ms", "task_ms", "gaps_ms", "largest_gap_ms",
              "largest_gap_between", "first_task_wait_ms", "tasks", "ops"]
    rows = []
    for d, label, runcsv in zip(a.dirs, labels, csvs):
        read = rmoe_trace.read_tasks(os.path.join(d, "tasks.rec"))
        submits = read_submits(os.path.join(d, "tasks.rec"))
        tasks = [Timed(t, s) for t, s in zip(read, submits) if not t.name.startswith(("_starpu", "starpu_"))]
        run = list(csv.DictReader(open(runcsv)))[-1]
        by_rank = {}
        for t in tasks:
            by_rank.setdefault(max(t.rank, 0), []).append(t)
        for kind in ("fwd", "bwd"):
            per_rank = {}
            for r, ts in by_rank.items():
                ps = [p for k, p in passes_of(ts) if k == kind and p]
                if len(ps) != a.repeat + 1:
                    sys.exit(f"trace_gaps.py: {d} rank {r}: {len(ps)} {kind} passes, expected {a.repeat + 1}")
                per_rank[r] = [pass_figures(p) for p in ps[1:]]
            # the rank with the longest median span, and its median pass
            r = max(per_rank, key=lambda q: statistics.median(f["span"] for f in per_rank[q]))
            f = sorted(per_rank[r], key=lambda x: x["span"])[len(per_rank[r]) // 2]
            wall = float(run["fwd_ms" if kind == "fwd" else "bwd_ms"])
            rows.append({"label": label, "pass": kind, "wall_ms": f"{wall:.2f}", "span_ms": f"{f['span']:.2f}",
                         "outside_span_ms": f"{wall - f['span']:.2f}", "task_ms": f"{f['covered']:.2f}",
                         "gaps_ms": f"{f['gaps']:.2f}", "largest_gap_ms": f"{f['biggest']:.2f}",
                         "largest_gap_between": f["where"], "first_task_wait_ms": f"{f['submit_to_start']:.2f}",
                         "tasks": f["tasks"],
                         "ops": " ".join(f"{op}={v:.1f}" for op, v in sorted(f["ops"].items(), key=lambda x: -x[1]))})
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"trace {r['label']} {r['pass']}: wall {r['wall_ms']} ms, tasks' span {r['span_ms']} "
              f"(outside {r['outside_span_ms']}), in tasks {r['task_ms']}, gaps {r['gaps_ms']} (largest "
              f"{r['largest_gap_ms']}: {r['largest_gap_between']}); {r['ops']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
