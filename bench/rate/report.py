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

# What the bench reports share (bench/lib/mdreport.py); the fixed prose of
# rate.md is docs/report-text/rate.md.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import mdreport  # noqa: E402

SGEMM_MODES = {"t1s1": "1 thread", "t2s1": "2 threads, one call at a time",
               "t1s2": "2 streams of 1-thread calls", "t2s1f": "2 threads, gate+up fused [H,2F]",
               "t2s1d": "2 threads, OpenBLAS's own kernel choice"}
# The breakdown's categories of codelet time, in the tables' order.
CATEGORIES = ["expert GEMMs", "gather/scatter", "router", "accumulate", "other", "no codelet"]
# The configurations `relaymoe run` takes with no flags on 2 cores, and the
# targets of issue 16 for them: forward+backward at least this share of
# sgemm's rate, and relaymoe's time at most TORCH_TARGET of PyTorch's.
DEFAULT_CONFIGS = {"r1-w1b2-lws": 0.70, "r2-w1b1-lws": 0.60}
TORCH_TARGET = 0.8
# The known routing of run.sh: H=64 F=32 E=3, 8 tokens per rank, K=2, 2
# ranks; its rows per (rank, expert), an expert without rows among them.
KNOWN_SHAPE = (64, 32, 3, 16)
KNOWN_ROWS = (5, 0, 11, 7, 9, 0)
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


# ---- load ----

def load_meta(path):
    """run.sh's KEY=VALUE lines: the command, machine, versions, loads."""
    return dict(line.rstrip("\n").split("=", 1) for line in open(path) if "=" in line)


def parse_shapes(spec):
    """{name: {H, F, E, K, T}} of "NAME:H:F:E:K:T ..."."""
    shapes = {}
    for s in spec.split():
        name, *dims = s.split(":")
        shapes[name] = dict(zip("HFEKT", map(int, dims)))
    return shapes


def load_routing(path):
    """{(shape, ranks): {rank: rows routed}} of rate_routing.csv."""
    routing = {}
    for r in csv.DictReader(open(path)):
        routing.setdefault((r["shape"], int(r["ranks"])), {}).setdefault(int(r["rank"]), 0)
        routing[(r["shape"], int(r["ranks"]))][int(r["rank"])] += int(r["rows"])
    return routing


def load_inputs(a):
    """Every input of the report, as plain records."""
    return {"meta": load_meta(a.meta), "shapes": parse_shapes(a.shapes), "routing": load_routing(a.routing),
            # sgemm_rate's rows on the known routing: pass, ..., flops (column 6)
            "known": {r[0]: float(r[5]) for r in csv.reader(open(a.known))},
            "raw": list(csv.DictReader(open(a.raw))),
            "breakdown": list(csv.DictReader(open(a.breakdown))) if os.path.getsize(a.breakdown) else [],
            "traced": list(csv.DictReader(open(a.trace))) if a.trace else []}


# ---- compute ----

class Checks:
    def __init__(self):
        self.failed = []

    def expect(self, ok, what):
        if not ok:
            self.failed.append(what)
            print(f"report.py: check failed: {what}", file=sys.stderr)


def flops_of(H, F, E, tokens, rows):
    """Forward and backward flops of a layer pass: tokens of all ranks, rows routed in all."""
    return (6 * H * F * rows + 2 * H * E * tokens, 16 * H * F * rows + 4 * H * E * tokens)


def med_range(v):
    v = [x for x in v if x is not None and math.isfinite(x)]
    if not v:
        return (float("nan"),) * 3
    return statistics.median(v), min(v), max(v)


def count_flops(shapes, routing, chk):
    """{(shape, ranks, pass): flops} from the routing, every rank's rows
    checked against T/N*K."""
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
    return flops


def check_known(known, chk):
    """The count against sgemm_rate's own on the known routing."""
    kf = flops_of(*KNOWN_SHAPE, sum(KNOWN_ROWS))
    chk.expect(abs(known.get("fwd", 0) - kf[0]) <= 1e-9 * kf[0] and abs(known.get("bwd", 0) - kf[1]) <= 1e-9 * kf[1],
               f"flops of the known routing: sgemm_rate ran {known}, counted fwd {kf[0]:.0f} bwd {kf[1]:.0f}")


def measurements(raw, flops, chk):
    """rate.csv's rows (each with its flops and GFLOP/s), and {(round, shape,
    ranks, impl, config, pass): GFLOP/s} and {...: ms}."""
    chk.expect(len(raw) > 0, "no measurement")
    rows, rate, ms_of = [], {}, {}
    for r in (dict(r) for r in raw):
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
        r["gflops"] = ""
        if r["flops"]:
            g = float(r["flops"]) / ms / 1e6
            r["gflops"] = f"{g:.3f}"
            chk.expect(math.isfinite(g) and g > 0, f"{key}: rate {g}")
            rate[key] = g
        rows.append(r)
    return rows, rate, ms_of


def check_breakdown(bd, chk):
    for r in bd:
        if r["pass"] in ("fwd", "bwd") and r["category"] != "no codelet":
            chk.expect(float(r["ms"]) >= 0, f"breakdown {r['shape']} {r['config']} {r['category']}: {r['ms']} ms")


class Rates:
    """The measurements by round: GFLOP/s and ms per (round, shape, ranks,
    impl, config, pass)."""

    def __init__(self, rate, ms_of):
        self.rate, self.ms_of = rate, ms_of
        self.rounds = sorted({k[0] for k in ms_of})

    def series(self, shape, ranks, impl, config, p, what=None):
        what = self.rate if what is None else what
        return [what.get((rd, shape, ranks, impl, config, p)) for rd in self.rounds]

    def reference(self, rd, shape, ranks, p):
        """sgemm's best rate on the kernels' layout in round rd."""
        modes = ("t2s1", "t1s2") if ranks == 1 else ("t1s2",)
        v = [self.rate[(rd, shape, ranks, "sgemm", m, p)] for m in modes
             if (rd, shape, ranks, "sgemm", m, p) in self.rate]
        return max(v) if v else None

    def sgemm(self, shape, ranks, mode, p):
        return med_range([self.rate.get((rd, shape, ranks, "sgemm", mode, p)) for rd in self.rounds])


def configs_of(raw):
    """The relaymoe configurations measured, (ranks, config), in run order."""
    configs = []
    for r in raw:
        if r["impl"] == "relaymoe" and (int(r["ranks"]), r["config"]) not in configs:
            configs.append((int(r["ranks"]), r["config"]))
    return configs


def summary_row(R, name, nranks, config, torch_cfg):
    """One configuration's rates, their ratios to sgemm's and its time's to
    torch's: (median, min, max) over the rounds of the per-round figures."""
    row = {"shape": name, "config": config, "ranks": nranks}
    for p in ("fwd", "bwd"):
        row[p] = med_range(R.series(name, nranks, "relaymoe", config, p))
        ratios = []
        for rd in R.rounds:
            ref = R.reference(rd, name, nranks, p)
            g = R.rate.get((rd, name, nranks, "relaymoe", config, p))
            ratios.append(g / ref if g and ref else None)
        row[p + "_ratio"] = med_range(ratios)
        row[p + "_ref"] = med_range([R.reference(rd, name, nranks, p) for rd in R.rounds])
    # forward+backward: the time sgemm would take for both passes' flops
    # over relaymoe's time for them
    fb = []
    for rd in R.rounds:
        t = [R.ms_of.get((rd, name, nranks, "relaymoe", config, p)) for p in ("fwd", "bwd")]
        g = [R.rate.get((rd, name, nranks, "relaymoe", config, p)) for p in ("fwd", "bwd")]
        ref = [R.reference(rd, name, nranks, p) for p in ("fwd", "bwd")]
        if all(t) and all(g) and all(ref):
            fb.append(sum(g[i] * t[i] / ref[i] for i in range(2)) / sum(t))
    row["fb_ratio"] = med_range(fb)
    row["step_ms"] = med_range(R.series(name, nranks, "relaymoe", config, "step", R.ms_of))
    tr = []
    for rd in R.rounds:
        t = R.ms_of.get((rd, name, 1, "torch", torch_cfg, "step"))
        m = R.ms_of.get((rd, name, nranks, "relaymoe", config, "step"))
        tr.append(m / t if m and t else None)
    row["torch_ratio"] = med_range(tr)
    return row


def ratio_of(summary, shape, a, b, key):
    ra = next((r for r in summary if r["shape"] == shape and r["config"] == a), None)
    rb = next((r for r in summary if r["shape"] == shape and r["config"] == b), None)
    if not ra or not rb or not math.isfinite(ra[key][0]) or not math.isfinite(rb[key][0]):
        return None
    return ra[key][0] / rb[key][0]


def gap_figures(name, summary, R, bd):
    """What closes the gap to sgemm on one shape: the configurations against
    one another, sgemm's variants, the expert codelets' own rate; as
    (kind, figures) in the notes' order."""
    items = []
    for a, b, what in CONFIG_COMPARISONS:
        r = ratio_of(summary, name, a, b, "fwd")
        if r:
            items.append(("config", (what, r, ratio_of(summary, name, a, b, "bwd"))))
    for p in ("fwd", "bwd"):
        f, k = R.sgemm(name, 1, "t2s1f", p), R.sgemm(name, 1, "t2s1", p)
        if math.isfinite(f[0]) and math.isfinite(k[0]):
            items.append(("fused", (p, f[0], k[0])))
    for p in ("fwd", "bwd"):
        d, k = R.sgemm(name, 1, "t2s1d", p), R.sgemm(name, 1, "t2s1", p)
        if math.isfinite(d[0]) and math.isfinite(k[0]):
            items.append(("own-core", (p, k[0], d[0])))
    for r in bd:
        if r["shape"] == name and r["category"] == "expert GEMMs" and r["gflops"] and r["blas_threads"] == "1":
            items.append(("codelets", r))
    return items


def compute(inp, chk):
    """Every figure of the report, checking the inputs on the way."""
    shapes = inp["shapes"]
    flops = count_flops(shapes, inp["routing"], chk)
    check_known(inp["known"], chk)
    rows, rate, ms_of = measurements(inp["raw"], flops, chk)
    R = Rates(rate, ms_of)
    configs = configs_of(rows)
    torch_cfg = next((k[4] for k in ms_of if k[3] == "torch"), None)
    summary = [summary_row(R, name, nranks, config, torch_cfg) for name in shapes for nranks, config in configs]
    check_breakdown(inp["breakdown"], chk)
    return {"rows": rows, "R": R, "configs": configs, "torch_cfg": torch_cfg, "summary": summary, "flops": flops,
            "gaps": {name: gap_figures(name, summary, R, inp["breakdown"]) for name in shapes}}


# ---- render ----

def text(section, **values):
    return mdreport.text("rate", section, **values)


def fmt(t, digits=1, unit=""):
    m, lo, hi = t
    if not math.isfinite(m):
        return "–"
    if lo == hi:
        return f"{m:.{digits}f}{unit}"
    return f"{m:.{digits}f}{unit} [{lo:.{digits}f}–{hi:.{digits}f}]"


def write_rate_csv(path, rows):
    fields = list(rows[0].keys())
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def header(meta, rounds):
    L = ["# The layer's FLOP rate against OpenBLAS sgemm on the same cores (issue 16)", "",
         f"Command: `{meta.get('command', '')}` on {meta.get('date', '')} (UTC), commit {meta.get('commit', '')}; "
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
    return L


def counted(shapes, flops):
    """What is counted: the flops of each shape, then the configurations."""
    L = ["## What is counted", "", *text("counted"), "",
         "| shape | H | F | E | K | tokens | rows/expert (1 rank) | fwd GFLOP | bwd GFLOP |",
         "|---|---|---|---|---|---|---|---|---|"]
    for name, s in shapes.items():
        f, b = flops.get((name, 1, "fwd")), flops.get((name, 1, "bwd"))
        if f is None:
            f, b = flops.get((name, 2, "fwd"), float("nan")), flops.get((name, 2, "bwd"), float("nan"))
        L.append(f"| {name} | {s['H']} | {s['F']} | {s['E']} | {s['K']} | {s['T']} | {s['T'] * s['K'] // s['E']} | "
                 f"{f / 1e9:.2f} | {b / 1e9:.2f} |")
    return L + ["", *text("configurations", modes="; ".join(f"{k} = {v}" for k, v in SGEMM_MODES.items())), ""]


def defaults_table(summary):
    L = ["## The library's defaults against the targets", "", *text("defaults"), "",
         "| shape | config | fwd+bwd / sgemm | target | relaymoe / torch time | target |",
         "|---|---|---|---|---|---|"]
    for r in (r for r in summary if r["config"] in DEFAULT_CONFIGS):
        goal = DEFAULT_CONFIGS[r["config"]]
        fb, tr = r["fb_ratio"], r["torch_ratio"]
        L.append(f"| {r['shape']} | {r['config']} | {fmt(fb, 2)} | {goal:.2f}: "
                 f"{'met' if math.isfinite(fb[0]) and fb[0] >= goal else 'not met'} | {fmt(tr, 2)} | "
                 f"{TORCH_TARGET:.2f}: {'met' if math.isfinite(tr[0]) and tr[0] <= TORCH_TARGET else 'not met'} |")
    return L


def rates_table(fig, shapes):
    L = ["", "## Rates", "",
         "| shape | config | fwd GFLOP/s | bwd GFLOP/s | sgemm fwd | sgemm bwd | fwd / sgemm | bwd / sgemm | "
         "fwd+bwd / sgemm | fwd+bwd ms | relaymoe / torch time |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in fig["summary"]:
        L.append(f"| {r['shape']} | {r['config']} | {fmt(r['fwd'])} | {fmt(r['bwd'])} | {fmt(r['fwd_ref'])} | "
                 f"{fmt(r['bwd_ref'])} | {fmt(r['fwd_ratio'], 2)} | {fmt(r['bwd_ratio'], 2)} | "
                 f"{fmt(r['fb_ratio'], 2)} | {fmt(r['step_ms'], 0)} | {fmt(r['torch_ratio'], 2)} |")
    torch_cfg, R = fig["torch_cfg"], fig["R"]
    if torch_cfg:
        L += ["", *text("torch", config=torch_cfg), "", "| shape | torch fwd+bwd ms |", "|---|---|"]
        for name in shapes:
            L.append(f"| {name} | {fmt(med_range(R.series(name, 1, 'torch', torch_cfg, 'step', R.ms_of)), 0)} |")
    return L


def sgemm_table(shapes, R):
    L = ["| shape | ranks' lists | mode | fwd GFLOP/s | bwd GFLOP/s |", "|---|---|---|---|---|"]
    modes = sorted({(k[2], k[4]) for k in R.rate if k[3] == "sgemm"})
    for name in shapes:
        for nranks, mode in modes:
            f, b = R.sgemm(name, nranks, mode, "fwd"), R.sgemm(name, nranks, mode, "bwd")
            if math.isfinite(f[0]):
                L.append(f"| {name} | {nranks} | {mode} ({SGEMM_MODES.get(mode, mode)}) | {fmt(f)} | {fmt(b)} |")
    return L


def breakdown_keys(bd, shape=None):
    """The breakdown's (shape, config, pass) runs of both passes, in file
    order; of one shape, (config, pass)."""
    keys = []
    for r in bd:
        k = (r["shape"], r["config"], r["pass"]) if shape is None else (r["config"], r["pass"])
        if r["pass"] in ("fwd", "bwd") and (shape is None or r["shape"] == shape) and k not in keys:
            keys.append(k)
    return keys


def breakdown_table(bd):
    lines = ["| shape | config | pass | wall ms | worker ms | " + " | ".join(CATEGORIES) +
             " | expert codelets GFLOP/s (1-thread sgemm) |",
             "|---|---|---|---|---|" + "---|" * len(CATEGORIES) + "---|"]
    for k in breakdown_keys(bd):
        rs = {r["category"]: r for r in bd if (r["shape"], r["config"], r["pass"]) == k}
        any_r = next(iter(rs.values()))
        cells = [f"{float(rs[c]['ms']):.0f} ({100 * float(rs[c]['share']):.0f}%)" if c in rs else "–"
                 for c in CATEGORIES]
        g = rs.get("expert GEMMs", {})
        gf = f"{float(g['gflops']):.1f} ({float(g['sgemm_t1s1_gflops']):.1f})" if g.get("gflops") else "–"
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {float(any_r['wall_ms']):.0f} | {float(any_r['worker_ms']):.0f} | "
                     + " | ".join(cells) + f" | {gf} |")
    over = [r for r in bd if r["category"] == "StarPU overhead (worker stats)"]
    exe = {(r["shape"], r["config"]): r for r in bd if r["category"] == "executing (worker stats)"}
    if over:
        lines += ["", *text("worker-stats"), "",
                  "| shape | config | step wall ms | worker ms | executing ms | overhead ms (awake, not executing) | "
                  "tasks |", "|---|---|---|---|---|---|---|"]
        for r in over:
            e = exe.get((r["shape"], r["config"]))
            lines.append(f"| {r['shape']} | {r['config']} | {float(r['wall_ms']):.0f} | {float(r['worker_ms']):.0f} | "
                         f"{float(e['ms']):.0f} | {float(r['ms']):.1f} ({100 * float(r['share']):.1f}%) | "
                         f"{float(r['tasks']):.1f} |" if e else "")
    return lines


def trace_table(traced, meta):
    L = ["", "### From FxT traces", "", *text("traces", starpu=meta.get("trace_starpu", "?")), "",
         "| run | pass | wall ms | span | outside | in tasks | gaps | largest gap (between) | tasks | per operation (ms) |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in traced:
        L.append(f"| {r['label']} | {r['pass']} | {float(r['wall_ms']):.0f} | {float(r['span_ms']):.0f} | "
                 f"{float(r['outside_span_ms']):.0f} | {float(r['task_ms']):.0f} | {float(r['gaps_ms']):.1f} | "
                 f"{float(r['largest_gap_ms']):.1f} ({r['largest_gap_between']}) | {r['tasks']} | {r['ops']} |")
    return L


def gap_item(kind, f, own_core):
    if kind == "config":
        what, fwd, bwd = f
        return f"{what}: forward x{fwd:.2f}, backward x{bwd:.2f}"
    if kind == "fused":
        p, fused, kernels = f
        return (f"gate and up as one [H,2F] GEMM, sgemm at 2 threads, {p}: {fused:.1f} against "
                f"{kernels:.1f} GFLOP/s (x{fused / kernels:.2f})")
    if kind == "own-core":
        p, kernels, own = f
        return (f"OpenBLAS's kernels as relaymoe sets them against OpenBLAS's own choice "
                f"({own_core}), sgemm at 2 threads, {p}: {kernels:.1f} against {own:.1f} GFLOP/s "
                f"(x{kernels / own:.2f})")
    return (f"{f['config']} {f['pass']}: the expert codelets run at {float(f['gflops']):.1f} "
            f"GFLOP/s against one-thread sgemm's {float(f['sgemm_t1s1_gflops']):.1f} on the same "
            f"GEMMs; they fill {100 * float(f['share']):.0f}% of the pass's worker time")


def closing_notes(gaps, own_core):
    L = []
    for name, items in gaps.items():
        if items:
            L += [f"{name}:"] + [f"- {gap_item(kind, f, own_core)}" for kind, f in items] + [""]
    return L


def markdown(fig, inp):
    """rate.md's lines."""
    meta, shapes, bd = inp["meta"], inp["shapes"], inp["breakdown"]
    L = header(meta, fig["R"].rounds) + counted(shapes, fig["flops"]) + defaults_table(fig["summary"])
    L += rates_table(fig, shapes)
    L += ["", "### OpenBLAS sgemm on the layer's GEMM lists", ""] + sgemm_table(shapes, fig["R"])
    L += ["", "## Where the time goes", "", *text("time-goes"), ""]
    L += breakdown_table(bd) if bd else ["(no breakdown run)"]
    if inp["traced"]:
        L += trace_table(inp["traced"], meta)
    L += ["", "## Against the gap: the configurations measured", ""]
    L += closing_notes(fig["gaps"], meta.get("openblas_own_core", ""))
    return L + ["", "## Caveats", "", *text("caveats")]


def plot_rates(ax, name, shape, configs, R):
    bars = [(f"relaymoe {c}", n, "relaymoe", c) for n, c in configs]
    modes = sorted({(k[2], k[4]) for k in R.rate if k[3] == "sgemm" and k[1] == name})
    bars += [(f"sgemm {m} ({n}r)", n, "sgemm", m) for n, m in modes]
    x = range(len(bars))
    for i, p in enumerate(("fwd", "bwd")):
        meds, lo, hi = [], [], []
        for _, n, impl, c in bars:
            m, a, b = med_range(R.series(name, n, impl, c, p))
            meds.append(m if math.isfinite(m) else 0)
            lo.append(m - a if math.isfinite(m) else 0)
            hi.append(b - m if math.isfinite(m) else 0)
        ax.bar([k + (i - 0.5) * 0.4 for k in x], meds, 0.4, yerr=[lo, hi], capsize=2, label=p,
               color=("tab:blue", "tab:orange")[i])
    ax.set_xticks(list(x))
    ax.set_xticklabels([b[0] for b in bars], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GFLOP/s (median, min–max over rounds)")
    ax.set_title(f"{name}: H={shape['H']} F={shape['F']} E={shape['E']} K={shape['K']} T={shape['T']}", fontsize=9)
    ax.legend(fontsize=8)


def plot_breakdown(ax, name, bd):
    keys = breakdown_keys(bd, name)
    bottom = [0.0] * len(keys)
    for c in CATEGORIES:
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


def plot(path, shapes, configs, R, bd):
    plt = mdreport.pyplot()
    names = list(shapes)
    fig, axes = plt.subplots(2, len(names), figsize=(5.2 * len(names), 8.5), squeeze=False)
    handles, labels = [], []
    for j, name in enumerate(names):
        plot_rates(axes[0][j], name, shapes[name], configs, R)
        plot_breakdown(axes[1][j], name, bd)
        if j == 0:
            handles, labels = axes[1][j].get_legend_handles_labels()
    if bd:
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.03 if bd else 0, 1, 1))
    fig.savefig(path, dpi=110)


def console(summary):
    for row in summary:
        print(f"{row['shape']:10s} {row['config']:14s} fwd {fmt(row['fwd'])} GFLOP/s = {fmt(row['fwd_ratio'], 2)} "
              f"of sgemm {fmt(row['fwd_ref'])}; bwd {fmt(row['bwd'])} = {fmt(row['bwd_ratio'], 2)} of "
              f"{fmt(row['bwd_ref'])}; time / torch {fmt(row['torch_ratio'], 2)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for n in ("raw", "routing", "breakdown", "known", "meta", "shapes", "out"):
        ap.add_argument("--" + n, required=True)
    ap.add_argument("--trace", help="trace_gaps.py's CSV")
    a = ap.parse_args()
    chk = Checks()
    inp = load_inputs(a)
    fig = compute(inp, chk)
    if chk.failed:
        return 1
    os.makedirs(a.out, exist_ok=True)
    write_rate_csv(os.path.join(a.out, "rate.csv"), fig["rows"])
    plot(os.path.join(a.out, "rate.png"), inp["shapes"], fig["configs"], fig["R"], inp["breakdown"])
    mdreport.write_lines(os.path.join(a.out, "rate.md"), markdown(fig, inp))
    console(fig["summary"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
