#!/usr/bin/python3
"""Tables and plots of bench/sched/: Markdown on stdout, a PNG beside it.

    report.py overlap ROWS.csv OUT.png --command CMD --np N [--tables ON.txt OFF.txt]
    report.py sched   ROWS.csv OUT.png --command CMD --np N
"""

import argparse
import csv
import datetime
import os
import platform
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def med(values):
    values = [float(v) for v in values if v not in ("", None)]
    return statistics.median(values) if values else float("nan")


def header(title, command, np):
    return ["# " + title, "",
            "Command: `%s` on %s, %d cores (%s), CPU only, %d ranks oversubscribed through scripts/mpirun.sh."
            % (command, datetime.date.today().isoformat(), os.cpu_count(), platform.machine(), np),
            "Layer: the default (Qwen3-30B-A3B with H, F and tokens divided by 16: H=128, F=48, E=128, K=8, "
            "3072 tokens per rank), ring expert routing, fp32. Times: relaymoe's medians of 3 after a warm-up, "
            "max over ranks; every case is run once per round, rounds alternate, values are medians over rounds. "
            "Other jobs shared the machine: compare values of one table, not across tables.", ""]


def overlap(a):
    rows = read(a.rows)
    out = header("Ring overlap on and off, from traces", a.command, a.np)
    if a.note:
        out += [a.note, ""]
    out += ["A transfer's time comes from its own StarPU-MPI events in the converted FxT trace: the sender's "
            "isend submission to the receiver's completion of the request (the data is there). Hidden = the "
            "intersection of that interval with the receiving rank's tasks, so between 0 and the transfer's time; "
            "warm-up passes left out (scripts/trace/overlap.py). The ranks' clocks, aligned by StarPU on one "
            "barrier, are shifted where that left a link ending before it started, sharing the slack around the "
            "ring (the \"clocks:\" line under each table). A transfer whose events are missing or still out of "
            "order would be flagged under its table and left out, not counted as 0 ms.", ""]
    stats = {}
    for mode in ("on", "off"):
        tr = [r for r in rows if r["mode"] == mode and r["traced"] == "1"]
        un = [r for r in rows if r["mode"] == mode and r["traced"] == "0"]
        stats[mode] = {
            "hidden": med(r["hidden_frac"] for r in tr),
            "transfer": med(r["transfer_ms"] for r in tr),
            "compute": med(r["compute_ms"] for r in tr),
            "time_traced": med(float(r["fwd_ms"]) + float(r["bwd_ms"]) for r in tr),
            "time": med(float(r["fwd_ms"]) + float(r["bwd_ms"]) for r in un),
            "lo": min([float(r["fwd_ms"]) + float(r["bwd_ms"]) for r in un] or [float("nan")]),
            "hi": max([float(r["fwd_ms"]) + float(r["bwd_ms"]) for r in un] or [float("nan")]),
            "hlo": min([float(r["hidden_frac"]) for r in tr] or [float("nan")]),
            "hhi": max([float(r["hidden_frac"]) for r in tr] or [float("nan")]),
            "fwd": med(r["fwd_ms"] for r in un),
            "bwd": med(r["bwd_ms"] for r in un),
            "rounds": len(un),
        }
    out += ["| overlap | hidden fraction | rounds' range | transfer ms | compute ms (hop tasks) | fwd ms | bwd ms "
            "| fwd+bwd ms | rounds' range | fwd+bwd ms traced |", "|---|---|---|---|---|---|---|---|---|---|"]
    for mode in ("on", "off"):
        s = stats[mode]
        out.append("| %s | %.1f%% | %.0f-%.0f%% | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f-%.0f | %.1f |"
                   % (mode, 100 * s["hidden"], 100 * s["hlo"], 100 * s["hhi"], s["transfer"], s["compute"],
                      s["fwd"], s["bwd"], s["time"], s["lo"], s["hi"], s["time_traced"]))
    ratio = stats["off"]["time"] / stats["on"]["time"]
    ratio_tr = stats["off"]["time_traced"] / stats["on"]["time_traced"]
    out += ["", "Time ratio off/on (forward+backward): **%.2fx** untraced, %.2fx traced; hidden fraction "
            "**%.1f%%** with overlap against **%.1f%%** without (transfer and compute per pass summed over "
            "hops and ranks)." % (ratio, ratio_tr, 100 * stats["on"]["hidden"], 100 * stats["off"]["hidden"]), "",
            "Gantt charts of one forward and backward: %s_gantt_on.png, %s_gantt_off.png. "
            "Raw rows: %s.csv." % (a.name, a.name, a.name), ""]
    if a.tables:
        for path in a.tables:
            with open(path) as f:
                out += ["```", f.read().rstrip(), "```", ""]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.6))
    modes = ["on", "off"]
    ax[0].bar(modes, [100 * stats[m]["hidden"] for m in modes], color=["#2ca02c", "#d62728"])
    ax[0].set_ylabel("transfer time hidden (%)")
    ax[0].set_ylim(0, 100)
    ax[0].set_title("hidden behind compute")
    ax[1].bar(modes, [stats[m]["fwd"] for m in modes], label="forward", color="#4fb3d9")
    ax[1].bar(modes, [stats[m]["bwd"] for m in modes], bottom=[stats[m]["fwd"] for m in modes],
              label="backward", color="#1f4e9e")
    ax[1].set_ylabel("ms (median)")
    ax[1].set_title("layer time, off/on %.2fx" % ratio)
    ax[1].legend(fontsize=8)
    for x in ax:
        x.set_xlabel("ring overlap")
    fig.suptitle("ring on %d ranks: overlap on vs --no-overlap" % a.np, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    print("\n".join(out))


def sched(a):
    rows = read(a.rows)
    out = header("StarPU scheduling policies, with and without the ring's priorities", a.command, a.np)
    out += ["Priorities: graph/ gives earlier hops higher priority and each hop's transfers one level above its "
            "compute; `--no-prio` clamps every task of the ring to one level (STARPU_MIN_PRIO=0, STARPU_MAX_PRIO=1; "
            "router-bwd, given none, stays at 0) and sends in submission order (STARPU_MPI_PRIORITIES=0). Hidden: see overlap.md.", ""]
    policies = []
    for r in rows:
        if r["policy"] not in policies:
            policies.append(r["policy"])
    table = {}
    for p in policies:
        for prio in ("1", "0"):
            sel = [r for r in rows if r["policy"] == p and r["prio"] == prio]
            totals = [float(r["fwd_ms"]) + float(r["bwd_ms"]) for r in sel]
            table[(p, prio)] = {
                "lo": min(totals) if totals else float("nan"),
                "hi": max(totals) if totals else float("nan"),
                "fwd": med(r["fwd_ms"] for r in sel),
                "bwd": med(r["bwd_ms"] for r in sel),
                "time": med(float(r["fwd_ms"]) + float(r["bwd_ms"]) for r in sel),
                "hidden": med(r["hidden_frac"] for r in sel),
                "n": len(sel),
            }
    best = min(table[(p, "1")]["time"] for p in policies)
    out += ["| policy | fwd ms | bwd ms | fwd+bwd ms | rounds' range | vs best | hidden | fwd+bwd ms, no prio "
            "| rounds' range | hidden, no prio | prio gain |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in policies:
        w, n = table[(p, "1")], table[(p, "0")]
        out.append("| %s | %.1f | %.1f | %.1f | %.0f-%.0f | %.2fx | %s | %.1f | %.0f-%.0f | %s | %+.1f%% |"
                   % (p, w["fwd"], w["bwd"], w["time"], w["lo"], w["hi"], w["time"] / best, pct(w["hidden"]),
                      n["time"], n["lo"], n["hi"], pct(n["hidden"]), 100 * (n["time"] / w["time"] - 1)))
    out += ["", "prio gain: how much longer the run takes without priorities (positive: priorities help). "
            "rounds' range: the fastest and slowest round of forward+backward; where the ranges of two cases "
            "overlap, this machine does not tell them apart. Raw rows: sched.csv.", ""]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    xs = range(len(policies))
    wd = 0.38
    ax[0].bar([x - wd / 2 for x in xs], [table[(p, "1")]["time"] for p in policies], wd, label="priorities",
              color="#1f4e9e")
    ax[0].bar([x + wd / 2 for x in xs], [table[(p, "0")]["time"] for p in policies], wd, label="--no-prio",
              color="#9ad3ea")
    ax[0].set_xticks(list(xs))
    ax[0].set_xticklabels(policies)
    ax[0].set_ylabel("forward+backward ms (median)")
    ax[0].legend(fontsize=8)
    ax[1].bar([x - wd / 2 for x in xs], [100 * nz(table[(p, "1")]["hidden"]) for p in policies], wd,
              label="priorities", color="#2ca02c")
    ax[1].bar([x + wd / 2 for x in xs], [100 * nz(table[(p, "0")]["hidden"]) for p in policies], wd,
              label="--no-prio", color="#98df8a")
    ax[1].set_xticks(list(xs))
    ax[1].set_xticklabels(policies)
    ax[1].set_ylabel("transfer time hidden (%)")
    ax[1].set_ylim(0, 100)
    ax[1].legend(fontsize=8)
    fig.suptitle("ring on %d ranks under each StarPU policy" % a.np, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    print("\n".join(out))


def pct(v):
    return "n/a" if v != v else "%.1f%%" % (100 * v)


def nz(v):
    return 0.0 if v != v else v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["overlap", "sched"])
    ap.add_argument("rows")
    ap.add_argument("png")
    ap.add_argument("--command", default="")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--tables", nargs="*")
    ap.add_argument("--name", default="overlap")
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    overlap(a) if a.what == "overlap" else sched(a)


if __name__ == "__main__":
    main()
