#!/usr/bin/env python3
"""The table of bench/gpu/run.sh: reads RESULTS_DIR/layer.csv (relaymoe run
--csv), torch.jsonl (torch_moe.py bench) and gemm_rate.csv (rmoe_gemm_rate),
writes RESULTS_DIR/gpu.md and prints it.

Rows (each case T, K): ring (relaymoe's ring over the ring's partitions),
a2a (relaymoe's all-to-all), torch (the PyTorch peer, one expert group),
torch-part (the PyTorch peer with the ring's grouping), and ring-live and
a2a-live (relaymoe again with StarPU's device cache off: CSV device_cache
= off). Time: forward+backward, the median over rounds of each process's
median step (the range over rounds beside it); ratios are taken round by
round. Expert TFLOP/s: the expert GEMM work each issues (relaymoe
22*T*K*H*F, its recompute stopping at the SwiGLU output; PyTorch
24*T*K*H*F, the block recomputed) over the time, against the cuBLAS rate
of the same run. Device memory: two figures each, side by side (the notes
under the table say what each includes).

Exits 1 unless every expected row is there (--cases x --expect) and, on a
GPU (not --dry-run), every relaymoe row ran on a CUDA worker with a device
figure and every PyTorch row on CUDA; the targets' verdicts do not change
the exit status.

  report.py RESULTS_DIR [--cases "T:K ..."] [--expect "ring a2a ..."] [--checks WORD] [--gemm WORD]
            [--peer WORD] [--failures FILE] [--dry-run 0|1] [--quiet]
"""
import argparse
import csv
import json
import os
import statistics
import sys

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


def time_table(runs, cases, dry):
    say = []
    say.append("| T | K | row | expert groups | fwd+bwd ms | expert TFLOP/s | time / PyTorch, same grouping "
               "| time / PyTorch, 1 group |")
    say.append("|---|---|---|---|---|---|---|---|")
    for t, k in cases:
        for impl in ("ring", "torch-part", "a2a", "torch"):
            rs = runs.get((impl, t, k), [])
            if not rs:
                say.append(f"| {t} | {k} | {impl} | | **no result** | | | |")
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
            say.append(f"| {t} | {k} | {impl} | {g} | {fmt_range(ms)} | {fmt_range(tf, '%.3f' if dry else '%.0f')} "
                       f"| {same} | {one} |")
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
               f"1 and 4 groups): {a.peer}")
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
    out.append("")
    out.append("Rows:")
    for impl in ("ring", "torch-part", "a2a", "torch"):
        g = next((r["groups"] for (i, _, _), rs in runs.items() if i == impl for r in rs), None)
        out.append(f"- {impl}: {WHAT[impl].format(g='?' if g is None else g)}")
    out.append("Comparisons:")
    for x, y, why in COMPARES:
        out.append(f"- {x} / {y}: {why}")
    out.append("")
    out.extend(time_table(runs, cases, dry))
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
        if mix:
            fl = 22 * key[0] * key[1] * ring[0]["H"] * ring[0]["F"]
            r = statistics.median([fl / (x["ms"] * 1e-3) / 1e12 for x in ring]) / mix
            verdicts.append((f"ring expert GEMM rate / cuBLAS expert-mix rate {mix:.0f} TFLOP/s (target >= 0.5)",
                             r, r >= 0.5))
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
