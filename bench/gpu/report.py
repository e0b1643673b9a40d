#!/usr/bin/env python3
"""The table of bench/gpu/run.sh: reads RESULTS_DIR/layer.csv (relaymoe run
--csv), torch.jsonl (torch_moe.py bench) and gemm_rate.csv (rmoe_gemm_rate),
writes RESULTS_DIR/gpu.md and prints it.

Per case and implementation: forward+backward time (the median over rounds
of each process's median step; the range over rounds), peak device memory
(relaymoe: what StarPU held on the CUDA memory node, its allocation cache
included, sampled at every task; PyTorch: max_memory_allocated, reserved
beside it), and the rate of the expert GEMM work (the FLOPs each
implementation issues: relaymoe 22*T*K*H*F, its recompute stopping at the
SwiGLU output; PyTorch 24*T*K*H*F, the whole block recomputed) against the
cuBLAS rate measured in the same run. Ratios ring/PyTorch are per round.

  report.py RESULTS_DIR [--checks WORD] [--peer WORD] [--dry-run 0|1]
"""
import argparse
import csv
import json
import os
import statistics
import sys

GiB = 1024.0 ** 3


def load_layer(path):
    """(impl, T, K) -> list of (ms, peak bytes, row) in round order."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("dispatch") == "dispatch":
                continue  # a header repeated by an appending run
            impl = "ring" if r["dispatch"] == "ring" else r["dispatch"]
            key = (impl, int(r["tokens"]), int(r["topk"]))
            dev = max(float(r.get("peak_device_fwd_bytes") or 0), float(r.get("peak_device_bwd_bytes") or 0))
            host = max(float(r["peak_fwd_bytes"]), float(r["peak_bwd_bytes"]))
            ran_on = (f"StarPU {r.get('starpu', '?')}, policy {r.get('sched', '?')}, {r.get('cpu_workers', '?')} CPU "
                      f"and {r.get('cuda_workers', '?')} CUDA worker(s), activations on the {r.get('io', '?')}")
            out.setdefault(key, []).append({"ms": float(r["fwd_ms"]) + float(r["bwd_ms"]), "dev": dev, "ran_on": ran_on,
                                            "host": host, "resident": float(r["resident_bytes"]),
                                            "H": int(r["hidden"]), "F": int(r["ffn"]), "E": int(r["experts"]),
                                            "partitions": int(r.get("partitions") or 1)})
    return out


def load_torch(path):
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            if line.strip():
                j = json.loads(line)
                out.setdefault(("torch", j["tokens"], j["topk"]), []).append(
                    {"ms": j["median_ms"], "dev": j.get("peak_device_bytes", 0),
                     "reserved": j.get("peak_device_reserved_bytes", 0), "gemm": j.get("gemm", "?"),
                     "torch": j.get("torch", "?"), "H": j["hidden"], "F": j["ffn"], "E": j["experts"]})
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--checks", default="?")
    ap.add_argument("--peer", default="?")
    ap.add_argument("--dry-run", type=int, default=0)
    a = ap.parse_args()
    layer = load_layer(os.path.join(a.results, "layer.csv"))
    runs = {**layer, **load_torch(os.path.join(a.results, "torch.jsonl"))}
    rates = load_rates(os.path.join(a.results, "gemm_rate.csv"))
    mix = float(rates["expert_mix"]["tflops"]) if "expert_mix" in rates else None
    square = float(rates["square"]["tflops"]) if "square" in rates else None
    device = rates.get("square", {}).get("device", "no GPU")
    cases = sorted({(t, k) for (_, t, k) in runs})
    lines = []
    say = lines.append
    mem_name = "peak host MiB (StarPU data)" if a.dry_run else "peak device GiB"
    say(f"| T | K | implementation | fwd+bwd ms | {mem_name} | expert TFLOP/s | time / torch | memory / torch |")
    say("|---|---|---|---|---|---|---|---|")
    verdicts = []
    for t, k in cases:
        torch_runs = runs.get(("torch", t, k), [])
        for impl in ("ring", "a2a", "torch"):
            rs = runs.get((impl, t, k), [])
            if not rs:
                say(f"| {t} | {k} | {impl} | no result | | | | |")
                continue
            H, F = rs[0]["H"], rs[0]["F"]
            flops = (24 if impl == "torch" else 22) * t * k * H * F
            ms = [r["ms"] for r in rs]
            if a.dry_run:
                mem = [r["host"] / 2 ** 20 for r in rs] if impl != "torch" else []
            else:
                mem = [r["dev"] / GiB for r in rs]
            tf = [flops / (m * 1e-3) / 1e12 for m in ms]
            name = {"ring": f"relaymoe ring, {rs[0].get('partitions', 1)} partitions", "a2a": "relaymoe all-to-all",
                    "torch": f"PyTorch {rs[0].get('torch', '')} ({rs[0].get('gemm', '?')} GEMM)"}[impl]
            tr = tm = "-"
            if impl != "torch" and torch_runs:
                n = min(len(rs), len(torch_runs))
                tratio = [rs[i]["ms"] / torch_runs[i]["ms"] for i in range(n)]
                tr = fmt_range(tratio, "%.2f")
                if not a.dry_run and all(x["dev"] > 0 for x in torch_runs[:n]):
                    mratio = [rs[i]["dev"] / torch_runs[i]["dev"] for i in range(n)]
                    tm = fmt_range(mratio, "%.2f")
                    if impl == "ring" and (t, k) == (65536, 8):
                        verdicts.append(("ring time / PyTorch time at T=65536 K=8 (target <= 0.8)",
                                         statistics.median(tratio), statistics.median(tratio) <= 0.8))
                        verdicts.append(("ring peak device memory / PyTorch's at T=65536 K=8 (target <= 0.25)",
                                         statistics.median(mratio), statistics.median(mratio) <= 0.25))
                        if mix:
                            r = statistics.median(tf) / mix
                            verdicts.append((f"ring expert GEMM rate / cuBLAS expert-mix rate {mix:.0f} TFLOP/s "
                                             "(target >= 0.5)", r, r >= 0.5))
            mem_s = fmt_range(mem, "%.1f" if a.dry_run else "%.2f") if mem else "-"
            if impl == "torch" and not a.dry_run and rs[0].get("reserved"):
                mem_s += f" (reserved {statistics.median([r['reserved'] for r in rs]) / GiB:.2f})"
            say(f"| {t} | {k} | {name} | {fmt_range(ms)} | {mem_s} | {fmt_range(tf, '%.3f' if a.dry_run else '%.0f')} | {tr} | {tm} |")
    out = []
    title = "dry run on CPU workers (sizes /16): checks the script, measures nothing" if a.dry_run else \
        f"Qwen3-30B-A3B layer, bf16, forward+backward, one GPU ({device})"
    out.append(f"## {title}\n")
    out.append(f"gpu checks: {a.checks}; PyTorch peer vs relaymoe (bf16): {a.peer}")
    ran = sorted({r["ran_on"] for k, rs in layer.items() for r in rs})
    if ran:
        out.append("relaymoe: " + "; ".join(ran))
    if square:
        out.append(f"cuBLAS bf16: {square:.0f} TFLOP/s at {rates['square']['m']}^3, "
                   f"{mix:.0f} TFLOP/s over one expert's GEMMs at {rates['expert_mix']['m']} rows")
    out.append("")
    out.extend(lines)
    if verdicts:
        out.append("")
        for what, v, ok in verdicts:
            out.append(f"- {what}: {v:.2f} {'PASS' if ok else 'FAIL'}")
    text = "\n".join(out) + "\n"
    with open(os.path.join(a.results, "gpu.md"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0 if cases else 1


if __name__ == "__main__":
    sys.exit(main())
