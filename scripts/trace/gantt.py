#!/usr/bin/python3
"""Gantt chart of a relaymoe trace as a PNG, no GUI needed.

    scripts/trace/gantt.py DIR [-o DIR/gantt.png] [--passes A-B] [--title T]

One band per rank: a row per StarPU worker with its tasks coloured by
operation, and below it the transfers the rank received (StarPU-MPI links),
coloured by what they carry and labelled with the hop that sent them. Thin
vertical lines mark where each hop's first task starts on that rank; shaded
columns are the passes (forward, backward) with their names on top.
--passes picks passes by index (as overlap.py numbers them), e.g. 2-3 for the
second forward and backward after a warm-up.
"""

import argparse
import os
import sys

# Run from the source tree: leave no __pycache__ in it.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rmoe_trace  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

# The method's operations; the rest (router, all-to-all stages) in greys.
OP_COLOURS = {
    "gather": "#4fb3d9",
    "gather-dy": "#9ad3ea",
    "expert-ffn": "#d62728",
    "scatter-add": "#ff9f1c",
    "recompute": "#9467bd",
    "expert-bwd": "#1f4e9e",
    "grad-accumulate": "#2ca02c",
    "accumulate": "#2ca02c",
    "accumulate-dg": "#98df8a",
    "zero-grad": "#cccccc",
    "zero-partial": "#cccccc",
}
TRANSFER_COLOURS = {
    "weights": "#8c564b",
    "grad": "#e377c2",
    "grad-return": "#f7b6d2",
    "tokens": "#8c564b",
    "y-acc": "#e377c2",
    "dx-acc": "#e377c2",
}
OTHER_GREYS = ["#7f7f7f", "#a0a0a0", "#5a5a5a", "#bdbdbd"]


def op_colour(op, others):
    if op in OP_COLOURS:
        return OP_COLOURS[op]
    if op not in others:
        others[op] = OTHER_GREYS[len(others) % len(OTHER_GREYS)]
    return others[op]


def transfer_colour(what):
    return TRANSFER_COLOURS.get(what, "#17becf")


def lanes(items):
    """Greedy lanes so that overlapping bars do not hide each other."""
    ends = []
    out = []
    for s, e in items:
        for i, end in enumerate(ends):
            if s >= end:
                ends[i] = e
                out.append(i)
                break
        else:
            ends.append(e)
            out.append(len(ends) - 1)
    return out, max(1, len(ends))


def parse_range(text, count):
    if not text:
        return list(range(count))
    a, _, b = text.partition("-")
    lo = int(a)
    hi = int(b) if b else lo
    return [i for i in range(lo, hi + 1) if 0 <= i < count]


def draw(trace, out, passes=None, title=None):
    chosen = parse_range(passes, len(trace.passes))
    if trace.passes and not chosen:
        raise SystemExit("gantt: --passes %s selects none of the %d passes" % (passes, len(trace.passes)))
    if trace.passes:
        t0 = min(trace.passes[i].start for i in chosen)
        t1 = max(trace.passes[i].end for i in chosen)
        keep = set(chosen)
        tasks = [t for t in trace.tasks if t.pass_index in keep or (t.pass_index is None and t.end > t0
                                                                     and t.start < t1)]
        transfers = [x for x in trace.transfers if x.pass_index in keep]
        if transfers:
            t0 = min(t0, min(x.start for x in transfers))
            t1 = max(t1, max(x.end for x in transfers))
    else:
        tasks, transfers = trace.tasks, trace.transfers
        t0 = min([t.start for t in tasks] + [0.0])
        t1 = max([t.end for t in tasks] + [1.0])

    # Rows: per rank its workers, then its incoming transfers in lanes.
    rows = []          # (label, kind, rank, worker)
    transfer_lane = {}
    nlanes = {}
    for r in range(trace.nranks):
        workers = sorted({t.worker for t in trace.tasks if t.rank == r}) or [0]
        for w in workers:
            rows.append(("rank %d  w%d" % (r, w), "worker", r, w))
        mine = sorted((x for x in transfers if x.dst == r), key=lambda x: x.start)
        lane_of, n = lanes([(x.start, max(x.end, x.start)) for x in mine])
        for x, lane in zip(mine, lane_of):
            transfer_lane[id(x)] = lane
        nlanes[r] = n
        for lane in range(n):
            rows.append(("rank %d  recv" % r if lane == 0 else "", "recv", r, lane))
    ypos = {}
    y = 0
    band = {}
    for label, kind, r, k in rows:
        ypos[(kind, r, k)] = y
        band.setdefault(r, [y, y])
        band[r][1] = y
        y += 1
    height = max(3.0, 0.32 * len(rows) + 1.6)
    fig, ax = plt.subplots(figsize=(16, height))
    others = {}

    # Passes: shaded columns with their names.
    for i in chosen:
        p = trace.passes[i]
        ax.axvspan(p.start - t0, p.end - t0, color="#f2f2f2" if i % 2 else "#e6eef7", zorder=0)
        ax.text((p.start + p.end) / 2 - t0, -0.9, "pass %d: %s" % (i, p.label), ha="center", va="bottom",
                fontsize=8, color="#333333")

    for t in tasks:
        yy = ypos.get(("worker", t.rank, t.worker))
        if yy is None:
            continue
        ax.barh(yy, t.end - t.start, left=t.start - t0, height=0.8, color=op_colour(t.op, others),
                edgecolor="none", zorder=2)
    for x in transfers:
        yy = ypos.get(("recv", x.dst, transfer_lane.get(id(x), 0)))
        if yy is None:
            continue
        ax.barh(yy, max(x.duration, (t1 - t0) * 1e-4), left=x.start - t0, height=0.7,
                color=transfer_colour(x.what), edgecolor="black", linewidth=0.3, zorder=2)
        if x.duration > (t1 - t0) * 0.025:
            ax.text(x.start - t0 + x.duration / 2, yy, x.label, ha="center", va="center", fontsize=6.5,
                    color="white", zorder=3)

    # Hop boundaries: where each hop's first task starts, per rank.
    for r in range(trace.nranks):
        lo, hi = band[r]
        firsts = {}
        for t in tasks:
            if t.rank == r and t.hop is not None and t.pass_index is not None:
                key = (t.pass_index, t.hop)
                firsts[key] = min(firsts.get(key, t.start), t.start)
        for (p, h), s in firsts.items():
            ax.plot([s - t0, s - t0], [lo - 0.45, hi + 0.45], color="black", linewidth=0.6, zorder=4)
            ax.text(s - t0, lo - 0.5, "h%d" % h, fontsize=6, ha="left", va="bottom", zorder=4)
        if r > 0:
            ax.axhline(lo - 0.5, color="#888888", linewidth=0.6, zorder=1)

    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.4, -1.4)
    ax.set_xlim(0, t1 - t0)
    ax.set_xlabel("ms")
    ops_seen = []
    for t in tasks:
        if t.op not in ops_seen:
            ops_seen.append(t.op)
    handles = [Patch(color=op_colour(op, others), label=op) for op in ops_seen]
    whats = []
    for x in transfers:
        if x.what not in whats:
            whats.append(x.what)
    handles += [Patch(facecolor=transfer_colour(w), edgecolor="black", label="recv: " + w) for w in whats]
    ax.legend(handles=handles, fontsize=7, ncol=min(6, max(1, len(handles))), loc="upper center",
              bbox_to_anchor=(0.5, -0.35 / height * 3), frameon=False)
    s = trace.summary()
    ax.set_title(title or "%s: %d ranks, %d passes; transfers %.1f ms, %.0f%% hidden behind compute"
                 % (os.path.basename(os.path.abspath(trace.dir)), trace.nranks, len(trace.passes),
                    s["transfer_ms"], 100 * s["hidden_frac"]), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("-o", "--output")
    ap.add_argument("--passes", help="passes to show, e.g. 2-3 (default: all)")
    ap.add_argument("--title")
    a = ap.parse_args()
    trace = rmoe_trace.Trace(a.dir)
    out = a.output or os.path.join(a.dir, "gantt.png")
    draw(trace, out, a.passes, a.title)
    print("gantt: %s" % out)


if __name__ == "__main__":
    main()
