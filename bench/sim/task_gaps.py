#!/usr/bin/env python3
"""Where each rank's GPU sat idle, from a task log (RMOE_TASK_LOG=PREFIX:
PREFIX.RANK.csv, one line per task as it ended; docs/traces.md).

  task_gaps.py PREFIX [--short-us 40] [--worker W] [--top 5]

The last iteration of the log (from the last router-fwd task on), per rank:
its tasks, the time its worker was executing (the union of the tasks'
intervals), and the time between tasks split in two: short gaps, at most
--short-us, where the worker went from one ready task to the next (in the
simulation, StarPU's modelled CUDA queueing and input fetches: the per-task
cost the task-time model leaves out), and long ones, where it waited for
data (a transfer, a peer). Prints the mean and the largest over ranks, and
one rank's longest gaps with the task that ended each.
"""
import argparse
import csv
import glob
import statistics
import sys


def load(prefix, worker):
    ranks = {}
    paths = sorted(glob.glob(prefix + ".*.csv"))
    if not paths:
        sys.exit("task_gaps.py: no %s.RANK.csv" % prefix)
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if worker is not None and int(r["worker"]) != worker:
                    continue
                s, e = float(r["start_us"]), float(r["end_us"])
                if e > s > 0:
                    ranks.setdefault(int(r["rank"]), []).append((s, e, r["task"]))
    return ranks


def last_iteration(tasks):
    starts = [s for s, _, name in tasks if name.startswith("router-fwd")]
    t0 = max(starts) if starts else min(s for s, _, _ in tasks)
    return t0, sorted(t for t in tasks if t[0] >= t0)


def rank_stats(tasks, short_us):
    t0, it = last_iteration(tasks)
    cur, busy, short, long_, gaps = t0, 0.0, 0.0, 0.0, []
    for s, e, name in it:
        g = s - cur
        if g > 0:
            if g <= short_us:
                short += g
            else:
                long_ += g
                gaps.append((g, s - t0, name))
        busy += max(0.0, e - max(s, cur))
        cur = max(cur, e)
    return {"tasks": len(it), "span": cur - t0, "busy": busy, "short": short, "long": long_,
            "gaps": sorted(gaps, reverse=True)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prefix")
    ap.add_argument("--short-us", type=float, default=40.0)
    ap.add_argument("--worker", type=int, help="one worker's tasks only (default: all)")
    ap.add_argument("--top", type=int, default=5)
    a = ap.parse_args()
    ranks = load(a.prefix, a.worker)
    st = {r: rank_stats(t, a.short_us) for r, t in ranks.items() if t}
    keys = ("tasks", "span", "busy", "short", "long")
    print("| %d ranks, last iteration | %s |" % (len(st), " | ".join(keys)))
    print("|---|%s" % ("---|" * len(keys)))
    for label, f in (("mean", statistics.mean), ("largest", max)):
        print("| %s | %s |" % (label, " | ".join("%.0f" % f(s[k] for s in st.values()) for k in keys)))
    mean = {k: statistics.mean(s[k] for s in st.values()) for k in keys}
    print("\ntimes in us; short gaps: %.1f us a task on average" % (mean["short"] / max(mean["tasks"], 1)))
    r0 = min(st)
    print("rank %d's longest gaps (us, at us from the iteration's start, before task):" % r0)
    for g, at, name in st[r0]["gaps"][:a.top]:
        print("  %8.0f at %9.0f before %s" % (g, at, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
