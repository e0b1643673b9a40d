#!/usr/bin/python3
"""The tables, the plot and rate.md of bench/rate/run.sh, with its checks.

Flops, from the shapes and the routing (rate_routing.csv: the rows of each
rank's tokens routed to each expert), as the kernels run them
(codelets/kernels/expert.c, router.c):
  forward   per routed row 3 GEMMs of 2*H*F (gate, up, down): 6*H*F; the
            router's logits 2*H*E per token
  backward  per routed row 8 GEMMs of 2*H*F (gate and up recomputed; u =
            dy w_down^T, dw_down, dw_gate, dw_up, and dx in two): 16*H*F;
            the router's dw_router and dx: 4*H*E per token
Element-wise work (SwiGLU, softmax, top-k, gathers, weighting) is not
counted. A rate is these flops over the pass's time; sgemm rows carry the
flops of the GEMMs sgemm_rate ran, which must equal the count (checked).

Per round, each relaymoe rate is divided by the machine's sgemm rate of the
same round, shape, rank count and pass: the best of the sgemm modes on the
kernels' layout (1 rank: t2s1, t1s2; 2 ranks: t1s2 on the two ranks'
lists), and relaymoe's forward+backward time by torch's; medians and ranges
over the rounds.

  report.py --raw RAW.csv --routing ROUTING.csv --breakdown BREAKDOWN.csv
            --known KNOWN.csv --meta META.txt --shapes LIST --out DIR
Exit status 1 when a check fails (nothing is written then).
"""
import argparse
import csv
import math
import os
import statistics
import sys

SGEMM_MODES = {"t1s1": "1 thread", "t2s1": "2 threads, one call at a time",
               "t1s2": "2 streams of 1-thread calls", "t2s1f": "2 threads, gate+up fused [H,2F]",
               "t2s1d": "2 threads, OpenBLAS's own kernel choice"}


def flops_of(H, F, E, tokens, rows):
    """Forward and backward flops of a layer pass: tokens of all ranks, rows routed in all."""
    return (6 * H * F * rows + 2 * H * E * tokens, 16 * H * F * rows + 4 * H * E * tokens)


def med_range(v):
    v = [x for x in v if x is not None and math.isfinite(x)]
    if not v:
        return (float("nan"),) * 3
    return statistics.median(v), min(v), max(v)


def fmt(t, digits=1, unit=""):
    m, lo, hi = t
    if not math.isfinite(m):
        return "–"
    if lo == hi:
        return f"{m:.{digits}f}{unit}"
    return f"{m:.{digits}f}{unit} [{lo:.{digits}f}–{hi:.{digits}f}]"


class Checks:
    def __init__(self):
        self.failed = []

    def expect(self, ok, what):
        if not ok:
            self.failed.append(what)
            print(f"report.py: check failed: {what}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for n in ("raw", "routing", "breakdown", "known", "meta", "shapes", "out"):
        ap.add_argument("--" + n, required=True)
    ap.add_argument("--trace", help="trace_gaps.py's CSV")
    a = ap.parse_args()
    chk = Checks()
    meta = dict(line.rstrip("\n").split("=", 1) for line in open(a.meta) if "=" in line)
    shapes = {}
    for s in a.shapes.split():
        name, *dims = s.split(":")
        shapes[name] = dict(zip("HFEKT", map(int, dims)))

    # ---- flops from the routing ----
    routing = {}
    for r in csv.DictReader(open(a.routing)):
        routing.setdefault((r["shape"], int(r["ranks"])), {}).setdefault(int(r["rank"]), 0)
        routing[(r["shape"], int(r["ranks"]))][int(r["rank"])] += int(r["rows"])
    flops = {}
    for (name, nranks), per_rank in routing.items():
        s = shapes[name]
        chk.expect(len(per_rank) == nranks, f"{name} at {nranks} ranks: routing of {len(per_rank)} ranks")
        for rank, rows in per_rank.items():
            chk.expect(rows == s["T"] // nranks * s["K"],
                       f"{name} rank {rank}/{nranks}: {rows} routed rows, expected T/N*K = {s['T'] // nranks * s['K']}")
        fwd, bwd = flops_of(s["H"], s["F"], s["E"], s["T"], sum(per_rank.values()))
        flops[(name, nranks, "fwd")], flops[(name, nranks, "bwd")] = fwd, bwd
        flops[(name, nranks, "step")] = fwd + bwd
    # the known routing of run.sh: H=64 F=32 E=3, 8 tokens per rank, K=2, 2 ranks
    known = {r[0]: float(r[5]) for r in csv.reader(open(a.known))}
    kf = flops_of(64, 32, 3, 16, 5 + 0 + 11 + 7 + 9 + 0)
    chk.expect(abs(known.get("fwd", 0) - kf[0]) <= 1e-9 * kf[0] and abs(known.get("bwd", 0) - kf[1]) <= 1e-9 * kf[1],
               f"flops of the known routing: sgemm_rate ran {known}, counted fwd {kf[0]:.0f} bwd {kf[1]:.0f}")

    # ---- the measurements, with their flops and rates ----
    raw = list(csv.DictReader(open(a.raw)))
    chk.expect(len(raw) > 0, "no measurement")
    rate = {}          # (round, shape, ranks, impl, config, pass) -> GFLOP/s or ms (torch)
    ms_of = {}
    for r in raw:
        key = (int(r["round"]), r["shape"], int(r["ranks"]), r["impl"], r["config"], r["pass"])
        ms = float(r["ms"])
        chk.expect(math.isfinite(ms) and ms > 0, f"{key}: time {r['ms']} ms")
        ms_of[key] = ms
        if r["impl"] == "relaymoe":
            r["flops"] = f"{flops[(r['shape'], int(r['ranks']), r['pass'])]:.6e}"
        elif r["impl"] == "sgemm":
            # what it ran against the count: t1s2 on one rank's routing runs the list twice
            times = 2 if r["config"] == "t1s2" and r["ranks"] == "1" else 1
            want = times * flops[(r["shape"], int(r["ranks"]), r["pass"])]
            chk.expect(abs(float(r["flops"]) - want) <= 1e-6 * want,
                       f"sgemm {r['shape']} {r['config']} {r['pass']}: ran {float(r['flops']):.6e} flops, counted {want:.6e}")
        if r["flops"]:
            g = float(r["flops"]) / ms / 1e6
            r["gflops"] = f"{g:.3f}"
            chk.expect(math.isfinite(g) and g > 0, f"{key}: rate {g}")
            rate[key] = g
        else:
            r["gflops"] = ""
    rounds = sorted({k[0] for k in ms_of})

    def series(shape, ranks, impl, config, p, what=rate):
        return [what.get((rd, shape, ranks, impl, config, p)) for rd in rounds]

    def reference(rd, shape, ranks, p):
        modes = ("t2s1", "t1s2") if ranks == 1 else ("t1s2",)
        v = [rate[(rd, shape, ranks, "sgemm", m, p)] for m in modes if (rd, shape, ranks, "sgemm", m, p) in rate]
        return max(v) if v else None

    configs = []
    for r in raw:
        if r["impl"] == "relaymoe" and (int(r["ranks"]), r["config"]) not in configs:
            configs.append((int(r["ranks"]), r["config"]))
    torch_cfg = next((k[4] for k in ms_of if k[3] == "torch"), None)
    # per-round ratios
    summary = []
    for name in shapes:
        for nranks, config in configs:
            row = {"shape": name, "config": config, "ranks": nranks}
            for p in ("fwd", "bwd"):
                row[p] = med_range(series(name, nranks, "relaymoe", config, p))
                ratios = []
                for rd in rounds:
                    ref = reference(rd, name, nranks, p)
                    g = rate.get((rd, name, nranks, "relaymoe", config, p))
                    ratios.append(g / ref if g and ref else None)
                row[p + "_ratio"] = med_range(ratios)
                row[p + "_ref"] = med_range([reference(rd, name, nranks, p) for rd in rounds])
            # forward+backward: the time sgemm would take for both passes'
            # flops over relaymoe's time for them
            fb = []
            for rd in rounds:
                t = [ms_of.get((rd, name, nranks, "relaymoe", config, p)) for p in ("fwd", "bwd")]
                g = [rate.get((rd, name, nranks, "relaymoe", config, p)) for p in ("fwd", "bwd")]
                ref = [reference(rd, name, nranks, p) for p in ("fwd", "bwd")]
                if all(t) and all(g) and all(ref):
                    fb.append(sum(g[i] * t[i] / ref[i] for i in range(2)) / sum(t))
            row["fb_ratio"] = med_range(fb)
            row["step_ms"] = med_range(series(name, nranks, "relaymoe", config, "step", ms_of))
            tr = []
            for rd in rounds:
                t = ms_of.get((rd, name, 1, "torch", torch_cfg, "step"))
                m = ms_of.get((rd, name, nranks, "relaymoe", config, "step"))
                tr.append(m / t if m and t else None)
            row["torch_ratio"] = med_range(tr)
            summary.append(row)

    # ---- the breakdown ----
    bd = list(csv.DictReader(open(a.breakdown))) if os.path.getsize(a.breakdown) else []
    for r in bd:
        if r["pass"] in ("fwd", "bwd") and r["category"] != "no codelet":
            chk.expect(float(r["ms"]) >= 0, f"breakdown {r['shape']} {r['config']} {r['category']}: {r['ms']} ms")

    if chk.failed:
        return 1
    os.makedirs(a.out, exist_ok=True)
    fields = list(raw[0].keys())
    if "gflops" not in fields:
        fields.append("gflops")
    with open(os.path.join(a.out, "rate.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(raw)
    plot(os.path.join(a.out, "rate.png"), shapes, configs, rounds, rate, reference, bd)
    traced = list(csv.DictReader(open(a.trace))) if a.trace else []
    write_md(os.path.join(a.out, "rate.md"), meta, shapes, configs, rounds, summary, rate, ms_of, bd, flops, torch_cfg,
             traced)
    for row in summary:
        print(f"{row['shape']:10s} {row['config']:14s} fwd {fmt(row['fwd'])} GFLOP/s = {fmt(row['fwd_ratio'], 2)} "
              f"of sgemm {fmt(row['fwd_ref'])}; bwd {fmt(row['bwd'])} = {fmt(row['bwd_ratio'], 2)} of "
              f"{fmt(row['bwd_ref'])}; time / torch {fmt(row['torch_ratio'], 2)}")
    return 0


def sgemm_table(shapes, rounds, rate):
    lines = ["| shape | ranks' lists | mode | fwd GFLOP/s | bwd GFLOP/s |", "|---|---|---|---|---|"]
    modes = sorted({(k[2], k[4]) for k in rate if k[3] == "sgemm"})
    for name in shapes:
        for nranks, mode in modes:
            f = med_range([rate.get((rd, name, nranks, "sgemm", mode, "fwd")) for rd in rounds])
            b = med_range([rate.get((rd, name, nranks, "sgemm", mode, "bwd")) for rd in rounds])
            if math.isfinite(f[0]):
                lines.append(f"| {name} | {nranks} | {mode} ({SGEMM_MODES.get(mode, mode)}) | {fmt(f)} | {fmt(b)} |")
    return lines


def breakdown_table(bd):
    cats = ["expert GEMMs", "gather/scatter", "router", "accumulate", "other", "no codelet"]
    lines = ["| shape | config | pass | wall ms | worker ms | " + " | ".join(cats) +
             " | expert codelets GFLOP/s (1-thread sgemm) |",
             "|---|---|---|---|---|" + "---|" * len(cats) + "---|"]
    keys = []
    for r in bd:
        k = (r["shape"], r["config"], r["pass"])
        if r["pass"] in ("fwd", "bwd") and k not in keys:
            keys.append(k)
    for k in keys:
        rs = {r["category"]: r for r in bd if (r["shape"], r["config"], r["pass"]) == k}
        any_r = next(iter(rs.values()))
        cells = []
        for c in cats:
            r = rs.get(c)
            cells.append(f"{float(r['ms']):.0f} ({100 * float(r['share']):.0f}%)" if r else "–")
        g = rs.get("expert GEMMs", {})
        gf = f"{float(g['gflops']):.1f} ({float(g['sgemm_t1s1_gflops']):.1f})" if g.get("gflops") else "–"
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {float(any_r['wall_ms']):.0f} | {float(any_r['worker_ms']):.0f} | "
                     + " | ".join(cells) + f" | {gf} |")
    over = [r for r in bd if r["category"] == "StarPU overhead (worker stats)"]
    exe = {(r["shape"], r["config"]): r for r in bd if r["category"] == "executing (worker stats)"}
    if over:
        lines += ["", "StarPU's worker statistics over each whole breakdown run, per step (forward+backward), "
                  "start-up and warm-up included:", "",
                  "| shape | config | step wall ms | worker ms | executing ms | overhead ms (awake, not executing) | "
                  "tasks |", "|---|---|---|---|---|---|---|"]
        for r in over:
            e = exe.get((r["shape"], r["config"]))
            lines.append(f"| {r['shape']} | {r['config']} | {float(r['wall_ms']):.0f} | {float(r['worker_ms']):.0f} | "
                         f"{float(e['ms']):.0f} | {float(r['ms']):.1f} ({100 * float(r['share']):.1f}%) | "
                         f"{float(r['tasks']):.1f} |" if e else "")
    return lines


def ratio_of(summary, shape, a, b, key):
    ra = next((r for r in summary if r["shape"] == shape and r["config"] == a), None)
    rb = next((r for r in summary if r["shape"] == shape and r["config"] == b), None)
    if not ra or not rb or not math.isfinite(ra[key][0]) or not math.isfinite(rb[key][0]):
        return None
    return ra[key][0] / rb[key][0]


def trace_table(traced, meta):
    L = ["", "### From FxT traces", "",
         "The breakdown runs again with relaymoe built against a StarPU with FxT "
         f"({meta.get('trace_starpu', '?')}; bench/rate/trace_gaps.py), one timed pass of median span per row, of "
         "the rank whose tasks span longest: wall = relaymoe's median of the traced run; span = first task's start "
         "to last task's end; outside = wall - span (registration, submission before the first task, waiting for "
         "the outputs after the last); in tasks = the span covered by at least one of the rank's tasks; gaps = the "
         "rest of the span (no task running: dependencies, transfers, the host's synchronisation on the expert "
         "counts, StarPU between tasks); per operation, its tasks' time in that pass.", "",
         "| run | pass | wall ms | span | outside | in tasks | gaps | largest gap (between) | tasks | per operation (ms) |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in traced:
        L.append(f"| {r['label']} | {r['pass']} | {float(r['wall_ms']):.0f} | {float(r['span_ms']):.0f} | "
                 f"{float(r['outside_span_ms']):.0f} | {float(r['task_ms']):.0f} | {float(r['gaps_ms']):.1f} | "
                 f"{float(r['largest_gap_ms']):.1f} ({r['largest_gap_between']}) | {r['tasks']} | {r['ops']} |")
    return L


def write_md(path, meta, shapes, configs, rounds, summary, rate, ms_of, bd, flops, torch_cfg, traced):
    L = ["# The layer's FLOP rate against OpenBLAS sgemm on the same cores (issue 16)", ""]
    L += [f"Command: `{meta.get('command', '')}` on {meta.get('date', '')} (UTC), commit {meta.get('commit', '')}; "
          f"{meta.get('seconds', '?')} s.",
          f"Machine: {meta.get('nproc', '?')} cores, {meta.get('cpu', '?')}; OpenBLAS {meta.get('openblas', '?')} "
          f"(pthreads), StarPU {meta.get('starpu', '?')}, {meta.get('mpi', '?')}, PyTorch {meta.get('torch') or '–'}.",
          f"Load average (1, 5, 15 min) at the start: {meta.get('load_start', '?')}; at the end: "
          f"{meta.get('load_end', '?')}. The machine is shared: other jobs ran during the measurement, and each "
          "measurement's 1-minute load is in rate.csv (load1).",
          f"{len(rounds)} round(s); relaymoe and torch: median of {meta.get('repeat', '?')} timed steps after a "
          "warm-up per run; figures below: median over the rounds [min–max].", ""]
    if meta.get("quick") == "1":
        L += ["**--quick: a check of the script on a small shape, not a measurement.**", ""]
    L += ["## What is counted", "",
          "Flops from the shapes and the routing each run produced (rate_routing.csv, `relaymoe run --routing`), as "
          "the kernels run them:",
          "- forward: per routed (token, expert) row 3 GEMMs of 2·H·F (gate, up, down) = 6·H·F, plus the router's "
          "logits 2·H·E per token;",
          "- backward: per routed row 8 GEMMs of 2·H·F: gate and up recomputed (§3.3), then u = dy·w_downᵀ, dw_down, "
          "dw_gate, dw_up and dx in two GEMMs (codelets/kernels/expert.c) = 16·H·F; plus the router's dw_router and "
          "dx, 4·H·E per token;",
          "- element-wise work (SwiGLU, softmax and top-k, gathers, routing weights) is not counted.",
          "Every rank routes T/N·K rows (top-K of distinct experts), so the count depends on the routing only "
          "through the GEMM shapes (rows per expert), which sgemm runs as they are.", "",
          "| shape | H | F | E | K | tokens | rows/expert (1 rank) | fwd GFLOP | bwd GFLOP |",
          "|---|---|---|---|---|---|---|---|---|"]
    for name, s in shapes.items():
        f, b = flops.get((name, 1, "fwd")), flops.get((name, 1, "bwd"))
        if f is None:
            f, b = flops.get((name, 2, "fwd"), float("nan")), flops.get((name, 2, "bwd"), float("nan"))
        L.append(f"| {name} | {s['H']} | {s['F']} | {s['E']} | {s['K']} | {s['T']} | {s['T'] * s['K'] // s['E']} | "
                 f"{f / 1e9:.2f} | {b / 1e9:.2f} |")
    L += ["", "Configurations: rN-wXbY-POLICY = N ranks, STARPU_NCPU=X workers per rank, OPENBLAS_NUM_THREADS=Y, "
          "StarPU policy POLICY; a -nocache suffix: RMOE_HOST_CACHE=off, -nosampler: RMOE_HEAP_SAMPLER_US=off; "
          "all on the same cores, `mpirun --bind-to none --mca mpi_yield_when_idle 1` (as "
          "scripts/mpirun.sh), STARPU_WORKERS_NOBIND=1. "
          "The library keeps OPENBLAS_NUM_THREADS when it is set (rmoe_ctx_config.blas_threads, automatic); "
          "without it, it gives each worker the cores the rank's workers leave, so r1-w1b2 and r2-w1b1 are what "
          "`relaymoe run` does by default on 2 cores. Builds before that set OpenBLAS to one thread; b2 "
          "configurations preload bench/rate/blas_threads.c, which ignores that call, so OPENBLAS_NUM_THREADS=2 "
          "holds there too.",
          "sgemm: bench/rate/sgemm_rate.c runs the layer's GEMM list (router and each expert's GEMMs at its routed "
          "rows, the kernels' layout and transposes, without their element-wise work): " +
          "; ".join(f"{k} = {v}" for k, v in SGEMM_MODES.items()) +
          ". The reference of a relaymoe rate is the best of t2s1 and t1s2 of the same round (2 ranks: t1s2 on the "
          "two ranks' lists).", ""]
    L += ["## The library's defaults against the targets", "",
          "The configurations `relaymoe run` takes with no flags on these 2 cores (r1-w1b2-lws at 1 rank, "
          "r2-w1b1-lws at 2 ranks); targets of issue 16: forward+backward at 70% of sgemm at 1 rank and 60% at "
          "2 ranks on the issue's shape, and relaymoe's time at most 0.8x PyTorch's. Median over the rounds "
          "[min–max].", "",
          "| shape | config | fwd+bwd / sgemm | target | relaymoe / torch time | target |",
          "|---|---|---|---|---|---|"]
    for r in summary:
        if r["config"] not in ("r1-w1b2-lws", "r2-w1b1-lws"):
            continue
        goal = 0.70 if r["config"].startswith("r1-") else 0.60
        fb, tr = r["fb_ratio"], r["torch_ratio"]
        L.append(f"| {r['shape']} | {r['config']} | {fmt(fb, 2)} | {goal:.2f}: "
                 f"{'met' if math.isfinite(fb[0]) and fb[0] >= goal else 'not met'} | {fmt(tr, 2)} | 0.80: "
                 f"{'met' if math.isfinite(tr[0]) and tr[0] <= 0.8 else 'not met'} |")
    L += ["", "## Rates", "",
          "| shape | config | fwd GFLOP/s | bwd GFLOP/s | sgemm fwd | sgemm bwd | fwd / sgemm | bwd / sgemm | "
          "fwd+bwd / sgemm | fwd+bwd ms | relaymoe / torch time |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary:
        L.append(f"| {r['shape']} | {r['config']} | {fmt(r['fwd'])} | {fmt(r['bwd'])} | {fmt(r['fwd_ref'])} | "
                 f"{fmt(r['bwd_ref'])} | {fmt(r['fwd_ratio'], 2)} | {fmt(r['bwd_ratio'], 2)} | "
                 f"{fmt(r['fb_ratio'], 2)} | {fmt(r['step_ms'], 0)} | {fmt(r['torch_ratio'], 2)} |")
    if torch_cfg:
        L += ["", f"torch: bench/gpu/torch_moe.py bench --device cpu ({torch_cfg}: as many threads as cores), the "
              "same layer at EP=1 with the MoE block under one checkpoint (backward recomputes it), a matmul per "
              "expert; forward+backward ms:", ""]
        L.append("| shape | torch fwd+bwd ms |")
        L.append("|---|---|")
        for name in shapes:
            L.append(f"| {name} | {fmt(med_range([ms_of.get((rd, name, 1, 'torch', torch_cfg, 'step')) for rd in rounds]), 0)} |")
    L += ["", "### OpenBLAS sgemm on the layer's GEMM lists", ""] + sgemm_table(shapes, rounds, rate)
    L += ["", "## Where the time goes", "",
          "From the breakdown runs (one per shape and configuration, before the rounds; bench/rate/breakdown.py): "
          "per codelet, StarPU's history model recorded in a fresh STARPU_HOME per rank (STARPU_CALIBRATE=1): the "
          "mean duration of each footprint times its executions per step; per pass the codelets' time against the "
          "pass's worker time (wall time, max over ranks, x workers x ranks). \"no codelet\" is the rest: workers "
          "idle (a chain of dependent tasks leaves all but one idle; waits for transfers, for the host's "
          "submission and its synchronisation on the expert counts) and StarPU's work between tasks. Codelet time "
          "includes the codelets' own element-wise work (SwiGLU, routing weights, the dx scatter of expert-bwd). "
          "Cells: ms per pass (share of the worker time).", ""]
    L += breakdown_table(bd) if bd else ["(no breakdown run)"]
    if traced:
        L += trace_table(traced, meta)
    L += ["", "## Against the gap: the configurations measured", ""]
    L += closing_notes(shapes, summary, rate, rounds, bd, meta.get("openblas_own_core", ""))
    L += ["", "## Caveats", "",
          "- Shared machine: the load average above and each row's load1 say how busy it was (the benchmark's own "
          "2-3 busy threads included); rounds rotate the order so no implementation always runs first, and ratios "
          "are taken within a round.",
          "- Two cores: a configuration with more threads than free cores (the MPI progress thread of StarPU-MPI, "
          "the main thread submitting tasks, OpenBLAS's threads spinning after a call) competes with itself.",
          "- The breakdown runs record models and profiling (STARPU_CALIBRATE=1, STARPU_PROFILING=1), which cost a "
          "little; their wall times are their own, not the rounds'. StarPU leaves out the first execution of each "
          "footprint; the warm-up's others stay in the means. The gathers' time is split between the passes by "
          "count (forward one gather per hop, backward two of the same rows).",
          "- The sgemm lists leave out the element-wise work the codelets do; the expert codelets' own rate "
          "includes it.",
          "- Debian's StarPU has no FxT: the breakdown uses StarPU's own accounting; the traces (when present) come "
          "from another build of the same StarPU version with FxT (and CUDA, unused here), with tracing's own cost.",
          "- The routing is the layer's (seed 1, Gaussian inputs): close to even (rate_routing.csv)."]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


# The configurations the closing notes compare: (a, b, what), a's rate
# against b's, forward and backward.
CONFIG_COMPARISONS = [
    ("r1-w1b2-lws", "r1-w2b1-lws",
     "one worker with 2 OpenBLAS threads (r1-w1b2) against 2 workers of one thread (r1-w2b1)"),
    ("r2-w1b1-lws", "r1-w2b1-lws", "2 ranks of one worker (r2-w1b1) against 1 rank of 2 workers"),
    ("r1-w1b2-lws", "r1-w1b2-lws-nocache",
     "StarPU's host buffers through the cache (r1-w1b2-lws) against RMOE_HOST_CACHE=off"),
    ("r1-w1b2-lws", "r1-w1b2-lws-nosampler",
     "the heap probe's sampler thread on (r1-w1b2-lws, the default) against RMOE_HEAP_SAMPLER_US=off"),
] + [(f"r1-w2b1-{pol}", "r1-w2b1-lws", f"policy {pol} against lws (r1-w2b1)")
     for pol in ("eager", "dmdas", "prio", "ws")]


def closing_notes(shapes, summary, rate, rounds, bd, own_core):
    L = []
    for name in shapes:
        items = []
        for a, b, what in CONFIG_COMPARISONS:
            r = ratio_of(summary, name, a, b, "fwd")
            if r:
                items.append(f"{what}: forward x{r:.2f}, backward x{ratio_of(summary, name, a, b, 'bwd'):.2f}")
        for p in ("fwd", "bwd"):
            f = med_range([rate.get((rd, name, 1, "sgemm", "t2s1f", p)) for rd in rounds])
            k = med_range([rate.get((rd, name, 1, "sgemm", "t2s1", p)) for rd in rounds])
            if math.isfinite(f[0]) and math.isfinite(k[0]):
                items.append(f"gate and up as one [H,2F] GEMM, sgemm at 2 threads, {p}: {f[0]:.1f} against "
                             f"{k[0]:.1f} GFLOP/s (x{f[0] / k[0]:.2f})")
        for p in ("fwd", "bwd"):
            d = med_range([rate.get((rd, name, 1, "sgemm", "t2s1d", p)) for rd in rounds])
            k = med_range([rate.get((rd, name, 1, "sgemm", "t2s1", p)) for rd in rounds])
            if math.isfinite(d[0]) and math.isfinite(k[0]):
                items.append(f"OpenBLAS's kernels as relaymoe sets them against OpenBLAS's own choice "
                             f"({own_core}), sgemm at 2 threads, {p}: {k[0]:.1f} against {d[0]:.1f} GFLOP/s "
                             f"(x{k[0] / d[0]:.2f})")
        for r in bd:
            if r["shape"] == name and r["category"] == "expert GEMMs" and r["gflops"] and r["blas_threads"] == "1":
                items.append(f"{r['config']} {r['pass']}: the expert codelets run at {float(r['gflops']):.1f} "
                             f"GFLOP/s against one-thread sgemm's {float(r['sgemm_t1s1_gflops']):.1f} on the same "
                             f"GEMMs; they fill {100 * float(r['share']):.0f}% of the pass's worker time")
        if items:
            L.append(f"{name}:")
            L += [f"- {i}" for i in items]
            L.append("")
    return L


def plot(path, shapes, configs, rounds, rate, reference, bd):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(shapes)
    fig, axes = plt.subplots(2, len(names), figsize=(5.2 * len(names), 8.5), squeeze=False)
    handles, labels = [], []
    for j, name in enumerate(names):
        ax = axes[0][j]
        bars = [(f"relaymoe {c}", n, "relaymoe", c) for n, c in configs]
        modes = sorted({(k[2], k[4]) for k in rate if k[3] == "sgemm" and k[1] == name})
        bars += [(f"sgemm {m} ({n}r)", n, "sgemm", m) for n, m in modes]
        x = range(len(bars))
        for i, p in enumerate(("fwd", "bwd")):
            meds, lo, hi = [], [], []
            for _, n, impl, c in bars:
                m, a, b = med_range([rate.get((rd, name, n, impl, c, p)) for rd in rounds])
                meds.append(m if math.isfinite(m) else 0)
                lo.append(m - a if math.isfinite(m) else 0)
                hi.append(b - m if math.isfinite(m) else 0)
            ax.bar([k + (i - 0.5) * 0.4 for k in x], meds, 0.4, yerr=[lo, hi], capsize=2, label=p,
                   color=("tab:blue", "tab:orange")[i])
        ax.set_xticks(list(x))
        ax.set_xticklabels([b[0] for b in bars], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("GFLOP/s (median, min–max over rounds)")
        s = shapes[name]
        ax.set_title(f"{name}: H={s['H']} F={s['F']} E={s['E']} K={s['K']} T={s['T']}", fontsize=9)
        ax.legend(fontsize=8)
        ax = axes[1][j]
        cats = ["expert GEMMs", "gather/scatter", "router", "accumulate", "other", "no codelet"]
        keys = []
        for r in bd:
            k = (r["config"], r["pass"])
            if r["shape"] == name and r["pass"] in ("fwd", "bwd") and k not in keys:
                keys.append(k)
        bottom = [0.0] * len(keys)
        for c in cats:
            v = []
            for k in keys:
                r = next((r for r in bd if r["shape"] == name and (r["config"], r["pass"]) == k and r["category"] == c),
                         None)
                v.append(100 * float(r["share"]) if r else 0)
            ax.bar(range(len(keys)), v, bottom=bottom, label=c)
            bottom = [b + y for b, y in zip(bottom, v)]
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"{c} {p}" for c, p in keys], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("% of the pass's worker time")
        ax.set_title("where the time goes (StarPU history models)", fontsize=9)
        if j == 0:
            handles, labels = ax.get_legend_handles_labels()
    if bd:
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.03 if bd else 0, 1, 1))
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
