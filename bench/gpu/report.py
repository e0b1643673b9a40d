#!/usr/bin/env python3
"""The table of bench/gpu/run.sh: reads RESULTS_DIR/layer.csv (relaymoe run
--csv), torch.jsonl (torch_moe.py bench), gemm_rate.csv (rmoe_gemm_rate) and
tasks.rec (StarPU's tasks of a traced ring run), writes RESULTS_DIR/
breakdown.csv (the figures of the step's breakdown) and gpu.md, and prints
the latter.

Rows (each case T, K): ring (relaymoe's ring over the ring's partitions),
a2a (relaymoe's all-to-all), torch (the PyTorch peer, one expert group),
torch-part (the PyTorch peer with the ring's grouping), and ring-live and
a2a-live (relaymoe again with StarPU's device cache off: CSV device_cache
= off). Time: forward+backward, the median over rounds of each process's
median step (the range over rounds beside it); ratios are taken round by
round. Expert FLOP per step: the expert GEMM work each issues (relaymoe
22*T*K*H*F, its recompute stopping at the SwiGLU output; PyTorch
24*T*K*H*F, the block recomputed) over the whole step's time, which
includes everything but the experts; expert TFLOP/s in-task: the same work
over the time the expert tasks themselves took, from the trace (the traced
ring case only), the figure to hold against the cuBLAS rates. Device
memory: two figures each, side by side (the notes under the table say what
each includes).

The breakdown (tasks.rec of one ring run at the first case, its last
step: from its last router-fwd to its last task): per task kind the time
its tasks held the worker (a task queued behind another on the stream is
counted from the other's end), the GEMM kinds' in-task TFLOP/s against
cuBLAS (rmoe_gemm_rate: one expert's GEMMs a call each, and the fastest way
over a partition), the row kinds' bytes (2 x their rows for a gather, 3 x
for a scatter-add: rows in, destination rows read and written) per second
against the copy bandwidth rmoe_gemm_rate measured, and the worker's idle
time and gaps.

Exits 1 unless every expected row is there (--cases x --expect) and, on a
GPU (not --dry-run), every relaymoe row ran on a CUDA worker with a device
figure and every PyTorch row on CUDA; the targets' verdicts do not change
the exit status.

  report.py RESULTS_DIR [--cases "T:K ..."] [--expect "ring a2a ..."] [--checks WORD] [--gemm WORD]
            [--peer WORD] [--trace WORD] [--failures FILE] [--dry-run 0|1] [--quiet]
"""
import argparse
import csv
import json
import os
import statistics
import sys

# scripts/trace/'s reader of tasks.rec (standard library only); leave no
# __pycache__ in the tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "trace"))
import rmoe_trace  # noqa: E402

GiB = 1024.0 ** 3
MiB = 1024.0 ** 2
ORDER = ("ring", "torch-part", "a2a", "torch", "ring-live", "a2a-live")
WHAT = {
    "ring": "relaymoe ring: {g} partitions of the experts visited in turn on the one GPU, one partition's rows "
            "alive at a time",
    "torch-part": "PyTorch, the ring's grouping: {g} groups of experts in turn, each under its own checkpoint",
    "a2a": "relaymoe all-to-all at EP=1 (nothing is sent): all T*K rows at once, {g} group(s) of experts",
    "torch": "PyTorch all-to-all style, {g} group of all experts, the block under one checkpoint: what a user "
             "would run instead",
}
COMPARES = [
    ("ring", "torch-part", "the same expert grouping: relaymoe's task graph against PyTorch doing the same work"),
    ("a2a", "torch", "the same grouping (one group): relaymoe's all-to-all against PyTorch's"),
    ("ring", "torch", "the ring against what a user would run: the acceptance ratios"),
]


def fnum(r, name, default=0.0):
    v = r.get(name)
    try:
        return float(v) if v not in (None, "") else default
    except ValueError:
        return default


def load_layer(path):
    """(impl, T, K) -> rows in round order."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("dispatch") in (None, "dispatch"):
                continue  # a header repeated by an appending run
            impl = r["dispatch"] + ("-live" if r.get("device_cache") == "off" else "")
            fb = fnum(r, "fwd_bwd_median_ms", fnum(r, "fwd_ms") + fnum(r, "bwd_ms"))
            out.setdefault((impl, int(r["tokens"]), int(r["topk"])), []).append({
                "ms": fb, "groups": int(fnum(r, "partitions", 1)) or 1,
                "dev": max(fnum(r, "peak_device_fwd_bytes"), fnum(r, "peak_device_bwd_bytes")),
                "host": max(fnum(r, "peak_fwd_bytes"), fnum(r, "peak_bwd_bytes")),
                "cuda_workers": int(fnum(r, "cuda_workers")), "io": r.get("io", "?"),
                "H": int(r["hidden"]), "F": int(r["ffn"]), "E": int(r["experts"]),
                "ran_on": f"StarPU {r.get('starpu', '?')}, policy {r.get('sched', '?')}, {r.get('cpu_workers', '?')} "
                          f"CPU and {r.get('cuda_workers', '?')} CUDA worker(s), activations on the {r.get('io', '?')}"})
    return out


def load_torch(path):
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            j = json.loads(line)
            groups = int(j.get("groups", 1))
            impl = "torch" if groups == 1 else "torch-part"
            out.setdefault((impl, j["tokens"], j["topk"]), []).append({
                "ms": j["median_ms"], "groups": groups, "device": j.get("device", "?"),
                "dev": j.get("peak_device_bytes", 0), "reserved": j.get("peak_device_reserved_bytes", 0),
                "host": j.get("peak_rss_bytes", 0), "gemm": j.get("gemm", "?"), "torch": j.get("torch", "?"),
                "H": j["hidden"], "F": j["ffn"], "E": j["experts"]})
    return out


def load_rates(path):
    rates = {}
    if os.path.exists(path):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                rates[r["case"]] = r
    return rates


# ---- the step's breakdown, from the trace ----------------------------------

# Expert GEMM work of a step per task kind (all hops), in units of T*K*H*F
# (codelets/flops.c: the forward 6, the recompute 4, the backward 12), and
# the router's, in units of T*H*E; used where tasks.rec has no GFlop.
EXPERT_FLOPS = {"expert-ffn": 6, "recompute": 4, "expert-bwd": 12}
ROUTER_FLOPS = {"router-fwd": 2, "router-bwd": 4}
# Bytes a row kernel moves per byte of its rows, and which of its buffers
# holds them (tasks.rec's Sizes; "W": its output): a gather reads a source
# row and writes it; a scatter-add reads its row and reads and writes its
# token's; the all-to-all's combine backward reads dy and a row, writes one.
ROW_BYTES = {"gather": (2, "W"), "gather-dy": (2, "W"), "scatter-add": (3, 0), "unpermute-bwd": (3, "W")}
GAP_MS = 0.05


def load_tasks(path):
    """tasks.rec's tasks that ran, or None without the file."""
    if not os.path.exists(path):
        return None
    out = []
    for r in rmoe_trace.read_task_records(path):
        try:
            start, end = float(r["StartTime"]), float(r["EndTime"])
            sizes = [int(x) for x in r.get("Sizes", "").split()]
            gflop = float(r["GFlop"]) if "GFlop" in r else None
        except ValueError:
            continue
        m = rmoe_trace.HOP_NAME.match(r["Name"])
        out.append({"op": m.group("op") if m else r["Name"], "worker": int(r.get("WorkerId", 0)), "start": start,
                    "end": end, "gflop": gflop, "sizes": sizes, "modes": r.get("Modes", "").split()})
    return out


def row_bytes(t, shape):
    """(bytes a row task moved, where its size came from)."""
    factor, which = ROW_BYTES[t["op"]]
    if t["sizes"]:
        at = which if which != "W" else next((i for i, m in enumerate(t["modes"]) if m == "W"), None)
        if at is not None and at < len(t["sizes"]):
            return factor * t["sizes"][at], "trace"
    rows = shape["T"] * shape["K"] / shape["parts"]
    return factor * rows * shape["H"] * shape["es"], "shape"


def breakdown(tasks, shape):
    """The trace's last step (from its last router-fwd to its last task):
    per kind the time its tasks held their worker, their GFLOP and bytes;
    the step's length, busy and idle time, gaps. A task that starts before
    the one ahead of it on its worker ends (queued on the stream) counts
    from that end."""
    marks = sorted(t["start"] for t in tasks if t["op"] == "router-fwd")
    lo = marks[-1] if marks else min(t["start"] for t in tasks)
    step = [t for t in tasks if t["start"] >= lo]
    hi = max(t["end"] for t in step)
    kinds, busy, idle, gaps = {}, 0.0, 0.0, 0
    workers = sorted({t["worker"] for t in step})
    for w in workers:
        prev = lo
        for t in sorted((t for t in step if t["worker"] == w), key=lambda t: (t["start"], t["end"])):
            own = max(0.0, t["end"] - max(t["start"], prev))
            gaps += t["start"] - prev > GAP_MS
            idle += max(0.0, t["start"] - prev)
            prev = max(prev, t["end"])
            k = kinds.setdefault(t["op"], {"tasks": 0, "ms": 0.0, "gflop": 0.0, "gflop_from": "trace", "bytes": 0.0,
                                          "bytes_from": "-"})
            k["tasks"] += 1
            k["ms"] += own
            busy += own
            if t["gflop"] is None:
                k["gflop_from"] = "shape"
            else:
                k["gflop"] += t["gflop"]
            if t["op"] in ROW_BYTES:
                b, k["bytes_from"] = row_bytes(t, shape)
                k["bytes"] += b
        idle += hi - prev
    for op, k in kinds.items():
        if k["gflop_from"] == "shape" or k["gflop"] <= 0:
            tkhf = shape["T"] * shape["K"] * shape["H"] * shape["F"]
            k["gflop"] = (EXPERT_FLOPS.get(op, 0) * tkhf + ROUTER_FLOPS.get(op, 0) * shape["T"] * shape["H"] *
                          shape["E"]) / 1e9
            k["gflop_from"] = "shape" if k["gflop"] > 0 else "-"
    return {"ms": hi - lo, "workers": len(workers), "busy": busy, "idle": idle, "gaps": gaps, "steps": len(marks),
            "kinds": kinds}


def breakdown_rows(b, rates):
    """breakdown.csv's rows: per kind, then the expert GEMM tasks together,
    the idle time and the step."""
    mix = fnum(rates.get("expert_mix", {}), "tflops", None)
    copy = fnum(rates.get("hbm_copy", {}), "gbps", None)
    rows = []

    def row(kind, tasks, ms, gflop, gbytes, ref, ref_value, basis):
        tf = gflop / ms if gflop and ms > 0 else None  # GFLOP per ms
        gbps = gbytes / ms * 1e3 if gbytes and ms > 0 else None
        rate = tf if ref == "expert_mix" else gbps if ref == "hbm_copy" else None
        rows.append({"kind": kind, "tasks": tasks, "in_task_ms": ms, "share": ms / (b["ms"] * b["workers"]),
                     "gflop": gflop, "tflops": tf, "gbytes": gbytes, "gbps": gbps, "against": ref,
                     "fraction": rate / ref_value if rate and ref_value else None, "basis": basis})

    order = sorted(b["kinds"].items(), key=lambda kv: -kv[1]["ms"])
    for op, k in order:
        ref = "expert_mix" if op in EXPERT_FLOPS else "hbm_copy" if op in ROW_BYTES else "-"
        row(op, k["tasks"], k["ms"], k["gflop"] or None, k["bytes"] / 1e9 or None, ref,
            mix if ref == "expert_mix" else copy if ref == "hbm_copy" else None,
            "/".join(sorted({k["gflop_from"], k["bytes_from"]} - {"-"})) or "-")
    ex = [k for op, k in b["kinds"].items() if op in EXPERT_FLOPS]
    if ex:
        row("(expert GEMM tasks)", sum(k["tasks"] for k in ex), sum(k["ms"] for k in ex),
            sum(k["gflop"] for k in ex), None, "expert_mix", mix, "sum")
    row("(idle)", b["gaps"], b["idle"], None, None, "-", None, "gaps over %g ms in tasks" % GAP_MS)
    row("(step)", b["steps"], b["ms"] * b["workers"], None, None, "-", None, "%d worker(s)" % b["workers"])
    return rows


def write_breakdown(path, rows):
    keys = ["kind", "tasks", "in_task_ms", "share", "gflop", "tflops", "gbytes", "gbps", "against", "fraction", "basis"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for r in rows:
            w.writerow(["" if r[k] is None else ("%.6g" % r[k] if isinstance(r[k], float) else r[k]) for k in keys])


def breakdown_table(rows, case, rates, dry):
    """The breakdown as text for gpu.md."""
    fmt = (lambda v, spec: "-" if v is None else spec % v)  # noqa: E731
    step = next(r for r in rows if r["kind"] == "(step)")
    idle = next(r for r in rows if r["kind"] == "(idle)")
    say = [f"### Where the ring's step goes: T={case[0]} K={case[1]}, traced, the last of {step['tasks']} step(s)", ""]
    ex = next((r for r in rows if r["kind"] == "(expert GEMM tasks)"), None)
    line = (f"step {step['in_task_ms']:.2f} ms ({step['basis']}): idle {idle['in_task_ms']:.2f} ms, "
            f"{idle['tasks']} gap(s) over {GAP_MS} ms between tasks")
    if ex and ex["tflops"]:
        line += f"; expert GEMM tasks {ex['tflops']:.{3 if dry else 0}f} TFLOP/s in-task"
        if ex["fraction"]:
            line += f", {ex['fraction']:.2f} of one expert's cuBLAS GEMMs ({fnum(rates['expert_mix'], 'tflops'):.0f})"
        best = max((r for c, r in rates.items() if c.startswith("gemms_") and c != "gemms_strided_nopad"),
                   key=lambda r: fnum(r, "tflops"), default=None)
        if best and fnum(best, "tflops") > 0:
            line += (f", {ex['tflops'] / fnum(best, 'tflops'):.2f} of the fastest way over a partition "
                     f"({best['case'][6:]}, {fnum(best, 'tflops'):.0f})")
    say.append(line)
    say.append("")
    say.append("| kind | tasks | in-task ms | share of the step | TFLOP/s in-task | of cuBLAS (expert mix) | GB/s "
               "| of the copy's bandwidth | from |")
    say.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["kind"].startswith("("):
            continue
        say.append(f"| {r['kind']} | {r['tasks']} | {r['in_task_ms']:.3f} | {r['share']:.3f} "
                   f"| {fmt(r['tflops'], '%.3f' if dry else '%.0f')} "
                   f"| {fmt(r['fraction'] if r['against'] == 'expert_mix' else None, '%.2f')} "
                   f"| {fmt(r['gbps'], '%.1f' if dry else '%.0f')} "
                   f"| {fmt(r['fraction'] if r['against'] == 'hbm_copy' else None, '%.2f')} | {r['basis']} |")
    return say


def fmt_range(vals, spec="%.1f"):
    if not vals:
        return "-"
    med = statistics.median(vals)
    if len(vals) == 1:
        return spec % med
    return f"{spec % med} [{spec % min(vals)}-{spec % max(vals)}]"


def ratios(a, b):
    """Round by round: a[i] / b[i] over the rounds both have."""
    n = min(len(a), len(b))
    return [a[i] / b[i] for i in range(n) if b[i] > 0]


def problems_of(runs, cases, expect, dry):
    """What is missing or wrong, one sentence each."""
    out = []
    for t, k in cases:
        for impl in expect:
            rs = runs.get((impl, t, k), [])
            if not rs:
                out.append(f"T={t} K={k} {impl}: no result row")
            elif not dry and impl.startswith("torch"):
                if any(r["device"] != "cuda" or r["dev"] <= 0 for r in rs):
                    out.append(f"T={t} K={k} {impl}: a row not on CUDA or without device memory")
            elif not dry:
                if any(r["cuda_workers"] < 1 or r["dev"] <= 0 for r in rs):
                    out.append(f"T={t} K={k} {impl}: a row without a CUDA worker or without device memory")
    return out


def time_table(runs, cases, dry, in_task):
    """in_task: (row, T, K) -> the expert tasks' in-task TFLOP/s (traced rows)."""
    say = []
    say.append("| T | K | row | expert groups | fwd+bwd ms | expert FLOP per step, TFLOP/s | expert TFLOP/s in-task "
               "| time / PyTorch, same grouping | time / PyTorch, 1 group |")
    say.append("|---|---|---|---|---|---|---|---|---|")
    for t, k in cases:
        for impl in ("ring", "torch-part", "a2a", "torch"):
            rs = runs.get((impl, t, k), [])
            if not rs:
                say.append(f"| {t} | {k} | {impl} | | **no result** | | | | |")
                continue
            g = rs[0]["groups"]
            ms = [r["ms"] for r in rs]
            fl = (24 if impl.startswith("torch") else 22) * t * k * rs[0]["H"] * rs[0]["F"]
            tf = [fl / (m * 1e-3) / 1e12 for m in ms]
            same = "-"
            if not impl.startswith("torch"):
                peer = [p for key in (("torch", t, k), ("torch-part", t, k)) for p in runs.get(key, [])
                        if p["groups"] == g]
                if peer:
                    same = fmt_range(ratios(ms, [p["ms"] for p in peer]), "%.2f")
            one = "-"
            if impl != "torch" and runs.get(("torch", t, k)):
                one = fmt_range(ratios(ms, [p["ms"] for p in runs[("torch", t, k)]]), "%.2f")
            it = in_task.get((impl, t, k))
            it = "-" if it is None else ("%.3f" if dry else "%.0f") % it
            say.append(f"| {t} | {k} | {impl} | {g} | {fmt_range(ms)} | {fmt_range(tf, '%.3f' if dry else '%.0f')} "
                       f"| {it} | {same} | {one} |")
    return say


def memory_table(runs, cases, dry):
    say = []
    if dry:
        say.append("| T | K | row | peak host MiB (relaymoe: StarPU's data; PyTorch: VmHWM of the process) |")
        say.append("|---|---|---|---|")
        for t, k in cases:
            for impl in ("ring", "torch-part", "a2a", "torch"):
                rs = runs.get((impl, t, k), [])
                v = [r["host"] / MiB for r in rs if r["host"] > 0]
                say.append(f"| {t} | {k} | {impl} | {fmt_range(v) if v else ('**no result**' if not rs else '-')} |")
        return say
    say.append("| T | K | row | data held, GiB | held with the allocator's cache, GiB | data / PyTorch's allocated "
               "(1 group) | held / PyTorch's reserved (1 group) |")
    say.append("|---|---|---|---|---|---|---|")
    for t, k in cases:
        torch1 = runs.get(("torch", t, k), [])
        t_alloc = max((r["dev"] for r in torch1), default=0)
        t_res = max((r["reserved"] for r in torch1), default=0)
        for impl in ("ring", "torch-part", "a2a", "torch"):
            if impl.startswith("torch"):
                rs = runs.get((impl, t, k), [])
                data = max((r["dev"] for r in rs), default=0)
                held = max((r["reserved"] for r in rs), default=0)
            else:
                live = runs.get((impl + "-live", t, k), [])
                timed = runs.get((impl, t, k), [])
                data = max((r["dev"] for r in live), default=0)
                held = max((r["dev"] for r in timed), default=0)
            cell = lambda v: f"{v / GiB:.2f}" if v > 0 else "**no result**"  # noqa: E731
            rd = f"{data / t_alloc:.2f}" if data > 0 and t_alloc > 0 and impl != "torch" else "-"
            rh = f"{held / t_res:.2f}" if held > 0 and t_res > 0 and impl != "torch" else "-"
            say.append(f"| {t} | {k} | {impl} | {cell(data)} | {cell(held)} | {rd} | {rh} |")
    return say


MEMORY_NOTES = [
    "What the memory figures include (peaks over a forward and backward, weights and inputs on the GPU counted; "
    "no figure counts the CUDA context):",
    "- relaymoe, data held: StarPU's bytes on the GPU's memory node with its cache of freed buffers off "
    "(RMOE_DEVICE_CACHE=off: each freed buffer returned at once; one pass in a process of its own, rows ring-live "
    "and a2a-live): weights and their gradients, x, dy, y, dx, and each temporary while it lives; scratch only "
    "where it is StarPU data (STARPU_SCRATCH); not cuBLAS's own workspace nor cudaMallocAsync scratch; buffers "
    "of up to 4 MiB come from 32 MiB chunks, counted whole.",
    "- relaymoe, held with the cache: the same in the timed run, where StarPU keeps freed device buffers for a "
    "later allocation of the same size class (total minus available on the node).",
    "- PyTorch, data held: torch.cuda.max_memory_allocated, the live tensors (cuBLAS's workspace included: "
    "PyTorch allocates it through its allocator).",
    "- PyTorch, held with the cache: torch.cuda.max_memory_reserved, the segments its caching allocator took "
    "from CUDA, free cached blocks included.",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--cases", default="", help="expected cases, T:K separated by spaces or commas")
    ap.add_argument("--expect", default="", help="expected rows of each case (ring a2a torch torch-part ...)")
    ap.add_argument("--checks", default="?")
    ap.add_argument("--gemm", default="?")
    ap.add_argument("--peer", default="?")
    ap.add_argument("--trace", default="?", help="the traced run's outcome; 'recorded': tasks.rec must be there")
    ap.add_argument("--failures", help="a file of the run's failures, one a line")
    ap.add_argument("--dry-run", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="write gpu.md only")
    a = ap.parse_args()
    dry = bool(a.dry_run)
    layer = load_layer(os.path.join(a.results, "layer.csv"))
    runs = {**layer, **load_torch(os.path.join(a.results, "torch.jsonl"))}
    rates = load_rates(os.path.join(a.results, "gemm_rate.csv"))
    mix = float(rates["expert_mix"]["tflops"]) if "expert_mix" in rates else None
    square = float(rates["square"]["tflops"]) if "square" in rates else None
    device = rates.get("square", {}).get("device", "no GPU")
    expected = []
    for c in a.cases.replace(",", " ").split():
        t, k = c.split(":")
        expected.append((int(t), int(k)))
    expect = a.expect.replace(",", " ").split()
    cases = sorted(set(expected) | {(t, k) for (_, t, k) in runs}, key=lambda c: (expected + [c]).index(c))
    problems = problems_of(runs, expected, expect, dry)
    if a.gemm == "measured" and (mix is None or square is None):
        problems.append("gemm_rate.csv: the square or the expert-mix rate is missing")
    # The breakdown: the trace of the ring at the first case.
    tasks = load_tasks(os.path.join(a.results, "tasks.rec"))
    traced = expected[0] if expected else (65536, 8)
    ring_rows = runs.get(("ring",) + traced, [])
    brows, in_task = None, {}
    if tasks and ring_rows:
        r0 = ring_rows[0]
        shape = {"T": traced[0], "K": traced[1], "H": r0["H"], "F": r0["F"], "E": r0["E"],
                 "parts": r0["groups"], "es": 2}
        brows = breakdown_rows(breakdown(tasks, shape), rates)
        write_breakdown(os.path.join(a.results, "breakdown.csv"), brows)
        ex = next((r for r in brows if r["kind"] == "(expert GEMM tasks)"), None)
        if ex and ex["tflops"]:
            in_task[("ring",) + traced] = ex["tflops"]
    if a.trace == "recorded" and not tasks:
        problems.append("tasks.rec: the traced run left no task records")
    if a.trace == "recorded" and tasks and not ring_rows:
        problems.append(f"the breakdown: no ring row at T={traced[0]} K={traced[1]} for its shape")
    failures = []
    if a.failures and os.path.exists(a.failures):
        with open(a.failures) as f:
            failures = [line.strip() for line in f if line.strip()]

    out = []
    title = "dry run on CPU workers (sizes /16): checks the script, measures nothing" if dry else \
        f"Qwen3-30B-A3B layer, bf16, forward+backward, one GPU ({device})"
    out.append(f"## {title}\n")
    verdict = "complete" if not problems and not failures else "INCOMPLETE or FAILED"
    out.append(f"run: {verdict}; gpu checks: {a.checks}; cuBLAS rate: {a.gemm}; PyTorch peer vs relaymoe (bf16, "
               f"1 and 4 groups): {a.peer}; trace: {a.trace}")
    for what in failures + [p for p in problems if p not in failures]:
        out.append(f"- FAIL: {what}")
    ran = sorted({r["ran_on"] for rs in layer.values() for r in rs})
    if ran:
        out.append("relaymoe: " + "; ".join(ran))
    torch_seen = sorted({f"PyTorch {r['torch']} on {r['device']} ({r['gemm']} GEMM)"
                         for key, rs in runs.items() if key[0].startswith("torch") for r in rs})
    if torch_seen:
        out.append("; ".join(torch_seen))
    if square:
        out.append(f"cuBLAS bf16: {square:.0f} TFLOP/s at {rates['square']['m']}^3, "
                   f"{mix:.0f} TFLOP/s over one expert's GEMMs at {rates['expert_mix']['m']} rows")
    ways = [(c[6:], fnum(r, "tflops")) for c, r in rates.items()
            if c.startswith("gemms_") and c != "gemms_strided_nopad"]
    if ways:
        r0 = rates["gemms_" + ways[0][0]]
        bound = fnum(rates.get("gemms_strided_nopad", {}), "tflops", None)
        out.append(f"expert GEMMs over a partition of {r0['experts']} experts, one call per matrix (TFLOP/s): "
                   + ", ".join(f"{w} {v:.0f}" for w, v in ways)
                   + (f" (strided without its padding copies, a bound: {bound:.0f})" if bound else "")
                   + f"; fastest {r0['fastest']}, the way run.sh gives the layer's runs (RMOE_CUDA_GEMM)")
    hops = [(c[4:], fnum(r, "tflops")) for c, r in rates.items() if c.startswith("hop_")]
    if hops:
        out.append("one hop's expert tasks, GEMMs and elementwise kernels (TFLOP/s): "
                   + ", ".join(f"{w} {v:.0f}" for w, v in hops))
    if "hbm_copy" in rates:
        out.append(f"device copy: {fnum(rates['hbm_copy'], 'gbps'):.0f} GB/s (read and write)")
    out.append("")
    out.append("Rows:")
    for impl in ("ring", "torch-part", "a2a", "torch"):
        g = next((r["groups"] for (i, _, _), rs in runs.items() if i == impl for r in rs), None)
        out.append(f"- {impl}: {WHAT[impl].format(g='?' if g is None else g)}")
    out.append("Comparisons:")
    for x, y, why in COMPARES:
        out.append(f"- {x} / {y}: {why}")
    out.append("")
    out.extend(time_table(runs, cases, dry, in_task))
    if brows:
        out.append("")
        out.extend(breakdown_table(brows, traced, rates, dry))
    out.append("")
    out.extend(memory_table(runs, cases, dry))
    if not dry:
        out.append("")
        out.extend(MEMORY_NOTES)
    verdicts = []
    key = (65536, 8)
    ring, torch1 = runs.get(("ring",) + key, []), runs.get(("torch",) + key, [])
    if not dry and ring and torch1:
        tr = statistics.median(ratios([r["ms"] for r in ring], [r["ms"] for r in torch1]))
        verdicts.append(("ring time / PyTorch (1 group) time at T=65536 K=8 (target <= 0.8)", tr, tr <= 0.8))
        live = runs.get(("ring-live",) + key, [])
        alloc = max(r["dev"] for r in torch1)
        if live and alloc > 0:
            m = max(r["dev"] for r in live) / alloc
            verdicts.append(("ring data held / PyTorch max_memory_allocated at T=65536 K=8 (target <= 0.25)", m,
                             m <= 0.25))
        res = max(r["reserved"] for r in torch1)
        if res > 0:
            m = max(r["dev"] for r in ring) / res
            verdicts.append(("ring held with the cache / PyTorch max_memory_reserved at T=65536 K=8 "
                             "(target <= 0.25)", m, m <= 0.25))
        if mix and ("ring",) + key in in_task:
            r = in_task[("ring",) + key] / mix
            verdicts.append((f"ring expert GEMM tasks' in-task rate / cuBLAS expert-mix rate {mix:.0f} TFLOP/s "
                             f"(target >= 0.5)", r, r >= 0.5))
        elif mix:
            fl = 22 * key[0] * key[1] * ring[0]["H"] * ring[0]["F"]
            r = statistics.median([fl / (x["ms"] * 1e-3) / 1e12 for x in ring]) / mix
            verdicts.append((f"ring expert FLOP per step (no trace: not in-task) / cuBLAS expert-mix rate {mix:.0f} "
                             f"TFLOP/s (target >= 0.5)", r, r >= 0.5))
    if verdicts:
        out.append("")
        for what, v, ok in verdicts:
            out.append(f"- {what}: {v:.2f} {'PASS' if ok else 'FAIL'}")
    text = "\n".join(out) + "\n"
    with open(os.path.join(a.results, "gpu.md"), "w") as f:
        f.write(text)
    if not a.quiet:
        print(text, end="")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
