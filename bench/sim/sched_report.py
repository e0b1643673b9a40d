#!/usr/bin/python3
"""Report of bench/sim/sched.sh: StarPU policies compared in simulation.

  sched_report.py --rows ROWS [--rows ROWS ...] --out DIR --cmd CMD --date DATE
                  --preset P --scale S --cluster FILE --wall SEC --jobs J
                  [--transport T --dtype D --commit C] [--compare CSV]

--transport, --dtype and --commit are recorded in the rows of sched.sh's runs
(defaults: staged, f32 and no commit, what every sweep before they were
recorded ran: StarPU-MPI's host staging and the f32 tensors of `relaymoe
run`'s default); rows of an earlier sim_sched.csv keep theirs. --compare: a
sim_sched.csv of another sweep (e.g. the staged f32 one) whose ranking at the
EPs both have is set beside this one's, with whether it holds.

ROWS lists every run (ep, dispatch, policy, prio, round, status, wall_ms,
run_csv, log), as sched.sh writes it; or it is the sim_sched.csv of an
earlier report, whose runs are taken as they stand (so sweeps of the ring
and of the all-to-all, run apart, make one report). Writes DIR/sim_sched.csv (one row per run, with StarPU's
per-worker statistics parsed from the log), DIR/sim_sched_epN.png (per EP,
forward+backward time per policy, with and without priorities, ring and
all-to-all) and DIR/sim_sched.md (the ranking, why, and the determinism
check). Standard library and matplotlib (/usr/bin/python3).
"""
import argparse
import csv
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import read_last_row, simplatform  # noqa: E402

COLUMNS = ["ep", "dispatch", "policy", "prio", "round", "status", "commit", "transport", "dtype", "fwd_ms", "bwd_ms", "fwd_bwd_ms",
           "exec_ms_mean", "exec_ms_max", "wait_ms_mean", "wait_ms_max", "sleep_ms_mean", "tasks_per_rank",
           "wall_s"]
# Policies that place each task on a worker when it becomes ready, with the
# worker's queue known in advance, and so start its input transfers then
# (StarPU's dm* family and modular-heft prefetch); the others hand a task to
# a worker when the worker asks, and its data moves after that.
PREFETCHING = {"dm", "dmda", "dmdas", "dmdar", "dmdap", "dmdasd", "modular-heft", "modular-heft-prio",
               "modular-heft2"}
STATS = re.compile(r"total: ([0-9.]+) ms executing: ([0-9.]+) ms sleeping: ([0-9.]+) ms overhead ([0-9.-]+) ms")


def worker_stats(log):
    """Per simulated GPU worker (one per rank): tasks, executing, sleeping, overhead (ms)."""
    out, cur = [], None
    try:
        lines = open(log, errors="replace").read().splitlines()
    except OSError:
        return out
    for line in lines:
        if line.startswith("CUDA "):
            cur = {"tasks": 0}
        elif cur is not None and line.strip().endswith("task(s)"):
            cur["tasks"] = int(line.split()[0])
        elif cur is not None:
            m = STATS.search(line)
            if m:
                cur.update(total=float(m.group(1)), exec=float(m.group(2)), sleep=float(m.group(3)),
                           wait=float(m.group(4)))
                out.append(cur)
                cur = None
    return out


# Columns a sim_sched.csv written before they were recorded lacks, and what
# those sweeps ran: StarPU-MPI's host staging, f32 tensors.
RECORDED = {"commit": "", "transport": "staged", "dtype": "f32"}


def collect(rows_path, rec=RECORDED):
    rows = []
    reader = csv.DictReader(open(rows_path))
    if "run_csv" not in (reader.fieldnames or []):
        # An earlier report's sim_sched.csv: its runs already parsed.
        for r in reader:
            for k, v in RECORDED.items():
                r.setdefault(k, v)
            if set(COLUMNS) - set(r):
                sys.exit("sched_report.py: %s: neither sched.sh's rows nor a sim_sched.csv (missing %s)" % (
                    rows_path, ", ".join(sorted(set(COLUMNS) - set(r)))))
            row = {k: r[k] for k in COLUMNS if r[k] != ""}
            row["ep"], row["round"] = int(row["ep"]), int(row["round"])
            rows.append(row)
        return rows
    for r in reader:
        row = {k: r[k] for k in ("ep", "dispatch", "policy", "prio", "round", "status")}
        row.update((k, v) for k, v in rec.items() if v != "")
        row["ep"], row["round"] = int(row["ep"]), int(row["round"])
        row["wall_s"] = "%.1f" % (float(r["wall_ms"]) / 1e3)
        last = read_last_row(r["run_csv"]) if r["status"] == "ok" else None
        if last:
            row["fwd_ms"], row["bwd_ms"] = last["fwd_ms"], last["bwd_ms"]
            row["fwd_bwd_ms"] = "%.3f" % (float(last["fwd_ms"]) + float(last["bwd_ms"]))
        st = worker_stats(r["log"]) if last else []
        if st:
            for k in ("exec", "wait"):
                row[k + "_ms_mean"] = "%.3f" % statistics.mean(s[k] for s in st)
                row[k + "_ms_max"] = "%.3f" % max(s[k] for s in st)
            row["sleep_ms_mean"] = "%.3f" % statistics.mean(s["sleep"] for s in st)
            row["tasks_per_rank"] = "%.0f" % statistics.mean(s["tasks"] for s in st)
        rows.append(row)
    return rows


def cases(rows):
    """(ep, dispatch, policy, prio) -> the rounds' rows."""
    out = {}
    for r in rows:
        out.setdefault((r["ep"], r["dispatch"], r["policy"], r["prio"]), []).append(r)
    return out


def value(rs, key):
    ok = [float(r[key]) for r in rs if r["status"] == "ok" and r.get(key)]
    return ok[0] if ok else None


def plot(rows, by, eps, dispatches, policies, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for ep in eps:
        fig, axes = plt.subplots(1, len(dispatches), figsize=(5.2 * len(dispatches), 3.8), squeeze=False)
        for ax, d in zip(axes[0], dispatches):
            xs = range(len(policies))
            # A series that was not run (e.g. --prio on only) gets no bars
            # and no legend entry; a lone series takes the full width.
            series = [(prio, color, [value(by.get((ep, d, p, prio), []), "fwd_bwd_ms") or 0 for p in policies])
                      for prio, color in (("on", "tab:blue"), ("off", "tab:orange"))]
            series = [s for s in series if any(s[2])]
            width = 0.8 / max(len(series), 1)
            for i, (prio, color, ys) in enumerate(series):
                off = (i - (len(series) - 1) / 2) * width
                ax.bar([x + off for x in xs], ys, width=width, color=color,
                       label="priorities" if prio == "on" else "--no-prio")
            ax.set_xticks(list(xs))
            ax.set_xticklabels(policies, rotation=35, ha="right", fontsize=8)
            ax.set_ylabel("forward+backward, simulated ms")
            ax.set_title("EP=%d, %s" % (ep, "all-to-all" if d == "a2a" else d))
            vals = [v for p in policies for prio in ("on", "off")
                    for v in [value(by.get((ep, d, p, prio), []), "fwd_bwd_ms")] if v]
            if vals:
                ax.set_ylim(min(vals) * 0.9, max(vals) * 1.04)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "sim_sched_ep%d.png" % ep), dpi=110)
        plt.close(fig)


def determinism(by, rounds):
    same, differ, single = 0, [], 0
    for key, rs in sorted(by.items()):
        t = [(r["fwd_ms"], r["bwd_ms"]) for r in rs if r["status"] == "ok"]
        if len(t) < 2:
            single += 1
        elif all(x == t[0] for x in t):
            same += 1
        else:
            differ.append((key, t))
    return same, differ, single


def table(w, by, ep, d, policies):
    best = min((v for p in policies for v in [value(by.get((ep, d, p, "on"), []), "fwd_bwd_ms")] if v),
               default=None)
    ranked = sorted(policies, key=lambda p: value(by.get((ep, d, p, "on"), []), "fwd_bwd_ms") or float("inf"))
    w("| rank | policy | fwd ms | bwd ms | fwd+bwd ms | vs best | no-prio fwd+bwd ms | prio gain | "
      "GPU executing ms | GPU waiting ms (mean / max) | GPU sleeping ms | wall s |")
    w("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for i, p in enumerate(ranked, 1):
        on, off = by.get((ep, d, p, "on"), []), by.get((ep, d, p, "off"), [])
        t, t0 = value(on, "fwd_bwd_ms"), value(off, "fwd_bwd_ms")
        f = lambda v, fmt="%.2f": "" if v is None else fmt % v
        w("| %d | %s%s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s | %s |" % (
            i, p, " (prefetch)" if p in PREFETCHING else "", f(value(on, "fwd_ms")), f(value(on, "bwd_ms")),
            f(t), f(t / best if t and best else None, "%.3fx"), f(t0),
            f(100 * (t0 / t - 1) if t and t0 else None, "%+.1f%%"), f(value(on, "exec_ms_mean")),
            f(value(on, "wait_ms_mean")), f(value(on, "wait_ms_max")), f(value(on, "sleep_ms_mean")),
            f(value(on, "wall_s"), "%.0f")))
    return ranked


def why(w, by, ep, d, ranked):
    """The measured differences behind the ranking of one EP and dispatcher."""
    get = lambda p, k, prio="on": value(by.get((ep, d, p, prio), []), k)
    ok = [p for p in ranked if get(p, "fwd_bwd_ms")]
    if len(ok) < 2:
        return
    b, z = ok[0], ok[-1]
    pre = [get(p, "fwd_bwd_ms") for p in ok if p in PREFETCHING]
    non = [get(p, "fwd_bwd_ms") for p in ok if p not in PREFETCHING]
    ex = {get(p, "exec_ms_mean") for p in ok}
    txt = ("EP=%d %s: best %s %.2f ms, worst %s %.2f ms (%+.1f%%); the GPU executes the same work under every "
           "policy (%s ms per rank over the run), so the spread is waiting and idle time: waiting %.2f ms "
           "(%s) against %.2f ms (%s), sleeping %.2f against %.2f ms per rank." % (
               ep, "ring" if d == "ring" else "all-to-all", b, get(b, "fwd_bwd_ms"), z, get(z, "fwd_bwd_ms"),
               100 * (get(z, "fwd_bwd_ms") / get(b, "fwd_bwd_ms") - 1),
               "/".join("%.2f" % e for e in sorted(ex)) if len(ex) <= 2 else "%.2f-%.2f" % (min(ex), max(ex)),
               get(b, "wait_ms_mean"), b, get(z, "wait_ms_mean"), z, get(b, "sleep_ms_mean"),
               get(z, "sleep_ms_mean")))
    same = {}
    for p in ok:
        same.setdefault((get(p, "fwd_ms"), get(p, "bwd_ms")), []).append(p)
    groups = [" = ".join(g) for g in same.values() if len(g) > 1]
    if groups:
        txt += (" Identical simulated times, so identical schedules: %s (with one worker per rank, policies "
                "that hand a ready task to the worker when it asks all run the same order)." % "; ".join(groups))
    if pre and non:
        txt += " Prefetching policies average %.2f ms, the others %.2f ms." % (statistics.mean(pre),
                                                                              statistics.mean(non))
    gains = [(p, 100 * (get(p, "fwd_bwd_ms", "off") / get(p, "fwd_bwd_ms") - 1)) for p in ok
             if get(p, "fwd_bwd_ms", "off")]
    if gains:
        txt += " Priorities: " + ", ".join("%s %+.1f%%" % g for g in gains) + " (positive: they help)."
    w("- " + txt)


def ranking(by, ep, d, policies):
    t = {p: value(by.get((ep, d, p, "on"), []), "fwd_bwd_ms") for p in policies}
    return [p for p in sorted((p for p in t if t[p]), key=lambda p: t[p])], t


def compare(w, path, by, eps, dispatches, policies):
    """This sweep's ranking beside another sweep's (another transport or type)."""
    other = collect(path)
    ob = cases(other)
    kinds = sorted({"%s %s" % (r.get("transport"), r.get("dtype")) for r in other})
    w("## Does the ranking hold? Against %s (%s)" % (os.path.basename(os.path.dirname(os.path.abspath(path)))
                                                    + "/" + os.path.basename(path), ", ".join(kinds)))
    w("")
    w("Prefetching policies (%s) against the others, and the order of the policies, with the ring's "
      "priorities; a group's members within 0.3%% of one another are not ordered (run-to-run shifts between "
      "invocations reach 0.35%%, docs/simulation.md)." % ", ".join(p for p in policies if p in PREFETCHING))
    w("")
    w("| EP | dispatcher | this sweep | the other | prefetching ahead here / there | same order |")
    w("|---:|---|---|---|---|---|")
    for ep in eps:
        for d in dispatches:
            here, th = ranking(by, ep, d, policies)
            there, tt = ranking(ob, ep, d, policies)
            if not here or not there:
                continue
            def ahead(order, t):
                pre = [t[p] for p in order if p in PREFETCHING]
                non = [t[p] for p in order if p not in PREFETCHING]
                if not pre or not non:
                    return "n/a"
                return "yes (%.1f%%)" % (100 * (min(non) / max(pre) - 1)) if max(pre) < min(non) else \
                    "no (best other %.1f%% vs worst prefetching)" % (100 * (min(non) / max(pre) - 1))
            common = [p for p in here if p in there]
            # Same order up to ties within 0.3%: every pair ordered apart by more than that agrees.
            agree = all(not (th[p] * 1.003 < th[q] and tt[q] * 1.003 < tt[p]) for i, p in enumerate(common)
                        for q in common[i + 1:])
            w("| %d | %s | %s | %s | %s / %s | %s |" % (ep, d, " < ".join(here), " < ".join(there),
                                                         ahead(here, th), ahead(there, tt),
                                                         "yes" if agree else "no"))
    w("")


def markdown(a, rows, by, meta_rounds):
    eps = sorted({r["ep"] for r in rows})
    dispatches = sorted({r["dispatch"] for r in rows},
                        key=lambda d: ({"ring": 0, "token": 1, "a2a": 2, "a2a-megatron": 3, "a2a-deepep": 4}.get(d, 9), d))
    policies = sorted({r["policy"] for r in rows}, key=lambda p: (p in PREFETCHING, p))
    plot(rows, by, eps, dispatches, policies, a.out)
    same, differ, single = determinism(by, meta_rounds)
    c = simplatform().parse_cluster(a.cluster)
    lines = ["# StarPU scheduling policies in simulation (StarPU-SimGrid)", ""]
    w = lines.append
    w("Command: `%s` (%s; %s s of wall time on this 2-core machine, %s simulation(s) at a time; %d runs)." % (
        a.cmd, a.date, a.wall, a.jobs, len(rows)))
    w("")
    kinds = sorted({(r.get("transport", ""), r.get("dtype", ""), r.get("commit", "")) for r in rows})
    w("- Layer: %s, H, F and tokens divided by %s (sizes in `relaymoe run`'s line of each log), forward "
      "and backward, `relaymoe run --repeat 1` (a warm-up pass, then the timed pass reported). Transport, "
      "element type and commit of the runs (columns of sim_sched.csv): %s." %
      (a.preset, a.scale, "; ".join("%s, %s, %s" % (t, d, ("commit " + c) if c else "commit not recorded")
                                   for t, d, c in kinds)))
    w("- Machine: `%s` (%s) through `scripts/sim/platform.py`, one rank and one simulated GPU per EP "
      "degree; every task runs on its rank's one GPU worker, so a policy decides the order of the ready "
      "tasks and when their data moves, not where they run." % (os.path.relpath(a.cluster, os.path.dirname(
          os.path.dirname(HERE))), c["name"]))
    w("- Metric: simulated forward+backward milliseconds of the timed pass, max over ranks. GPU "
      "executing, waiting and sleeping: StarPU's worker statistics (STARPU_PROFILING=1, "
      "STARPU_WORKER_STATS=1) of each rank's GPU worker over the whole run (start-up, warm-up and "
      "timed pass), mean over ranks; waiting is the time the worker was awake and not executing "
      "(a task it holds waits for its inputs to arrive over PCIe, and scheduling work); sleeping is "
      "the time it had nothing to run (including StarPU's simulated start-up, the same in every run).")
    w("- Priorities: with them, graph/ gives earlier hops higher priority and each hop's transfers one "
      "level above its compute; `--no-prio` clamps every task to one level and StarPU-MPI sends in "
      "submission order. eager, dm and dmda ignore task priorities (StarPU 1.3), so their no-prio "
      "difference comes from StarPU-MPI's send order alone.")
    w("- Caveats: a simulation is a model. It models the task graph, StarPU's scheduling decisions, "
      "its data transfers over PCIe and StarPU-MPI's messages over the platform's links (SMPI, "
      "bandwidth sharing, latency); task durations come from codelets/sim_cost.c's roofline (or a "
      "recording, if the command says --history). It does not model kernel interference on the GPU, "
      "CPU-side costs of the runtime (submission, callbacks: zero simulated time), or network contention "
      "beyond the links' fair sharing. Transport staged: StarPU-MPI 1.3's host staging over PCIe; "
      "gpudirect: that hop free (scripts/sim/platform.py --transport).")
    w("")
    w("## Determinism")
    w("")
    if differ:
        w("%d case(s) gave identical simulated times in all %d rounds; %d did not:" % (same, meta_rounds,
                                                                                  len(differ)))
        for key, t in differ[:20]:
            w("- EP=%d %s %s prio=%s: %s" % (key + (", ".join("%s/%s" % x for x in t),)))
    else:
        w("Every case (%d) gave identical simulated forward and backward times (to the precision the "
          "CSV keeps, the microsecond) in all %d rounds%s." % (same, meta_rounds, "" if not single else
                                                "; %d case(s) completed only once" % single))
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        w("")
        w("Runs that did not complete: " + ", ".join("EP=%d %s %s prio=%s round %d (%s)" % (
            r["ep"], r["dispatch"], r["policy"], r["prio"], r["round"], r["status"]) for r in failed) + ".")
    # What was measured about the cases that differ, kept by hand beside the
    # generated report (OUT/sim_sched_notes.md).
    notes = os.path.join(a.out, "sim_sched_notes.md")
    if os.path.exists(notes):
        w("")
        w(open(notes).read().strip())
    w("")
    w("## Summary")
    w("")
    w("Ranking with the ring's priorities (fastest first), forward+backward; prio gain: how much longer "
      "the same policy takes with `--no-prio` (positive: priorities help).")
    w("")
    w("| EP | dispatcher | ranking | best ms | worst ms | spread | prio gain, range over policies |")
    w("|---:|---|---|---:|---:|---:|---|")
    for ep in eps:
        for d in dispatches:
            t = {p: value(by.get((ep, d, p, "on"), []), "fwd_bwd_ms") for p in policies}
            ok = sorted((p for p in t if t[p]), key=lambda p: t[p])
            if not ok:
                continue
            g = [100 * (value(by.get((ep, d, p, "off"), []), "fwd_bwd_ms") / t[p] - 1) for p in ok
                 if value(by.get((ep, d, p, "off"), []), "fwd_bwd_ms")]
            w("| %d | %s | %s | %.2f | %.2f | %.1f%% | %s |" % (
                ep, d, " < ".join(ok), t[ok[0]], t[ok[-1]], 100 * (t[ok[-1]] / t[ok[0]] - 1),
                "%+.1f%% to %+.1f%%" % (min(g), max(g)) if g else "not run"))
    w("")
    if a.compare:
        compare(w, a.compare, by, eps, dispatches, policies)
    for ep in eps:
        w("## EP=%d" % ep)
        w("")
        w("![EP=%d](sim_sched_ep%d.png)" % (ep, ep))
        w("")
        for d in dispatches:
            w("### %s" % ("ring, expert routing" if d == "ring" else "all-to-all" if d == "a2a" else "ring, token routing"))
            w("")
            ranked = table(w, by, ep, d, policies)
            w("")
            why(w, by, ep, d, ranked)
            w("")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k in ("rows", "out", "cmd", "date", "preset", "scale", "cluster", "wall", "jobs"):
        ap.add_argument("--" + k, required=True, action="append" if k == "rows" else "store")
    ap.add_argument("--transport", default=RECORDED["transport"], choices=("staged", "gpudirect"))
    ap.add_argument("--dtype", default=RECORDED["dtype"], choices=("f32", "bf16"))
    ap.add_argument("--commit", default="")
    ap.add_argument("--compare", help="another sweep's sim_sched.csv, to compare rankings")
    a = ap.parse_args()
    rec = {"commit": a.commit, "transport": a.transport, "dtype": a.dtype}
    rows = [r for src in a.rows for r in collect(src, rec)]
    def run_key(r):
        return (r["ep"], r["dispatch"], r["policy"], r["prio"], r["round"])
    rows.sort(key=run_key)
    for prev, r in zip(rows, rows[1:]):
        if run_key(prev) == run_key(r):
            sys.exit("sched_report.py: EP=%d %s %s prio=%s round %d given twice" % run_key(r))
    by = cases(rows)
    rounds = max((r["round"] for r in rows), default=0)
    tmp = os.path.join(a.out, ".sim_sched.csv.tmp")
    with open(tmp, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        wr.writeheader()
        wr.writerows(rows)
    lines = markdown(a, rows, by, rounds)
    os.replace(tmp, os.path.join(a.out, "sim_sched.csv"))
    with open(os.path.join(a.out, ".sim_sched.md.tmp"), "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    os.replace(os.path.join(a.out, ".sim_sched.md.tmp"), os.path.join(a.out, "sim_sched.md"))


if __name__ == "__main__":
    main()
