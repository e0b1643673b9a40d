"""The memory report's files (bench/memory/summarize.py's render step): the
computed figures as CSV, the plots, then memory.md, whose fixed prose comes
from docs/report-text/memory.md."""
import csv
import os
import sys

import mdreport
from summary_compute import (DISPATCHERS, FULLSIZE_EP, FULLSIZE_TOKENS, GIB, MIB, MODEL_TOLERANCE,
                             PRESET_TOKENS, fullsize_averages, fullsize_baselines, fullsize_columns, heap_misses_split,
                             key, partition_bytes, pass_of, peer_comparisons)
from summary_plots import plots

SWEEP_COLUMNS = ["scale", "preset", "token_factor", "dispatch", "ranks", "hidden", "ffn", "experts", "topk", "tokens",
                 "chunk_rows", "fwd_ms", "bwd_ms", "peak_fwd_bytes", "peak_bwd_bytes", "resident_bytes",
                 "exec_peak_bytes", "peak_rss_bytes", "sent_bytes", "largest_temp_bytes", "skew",
                 "model_peak_fwd_bytes", "model_peak_bwd_bytes", "model_exec_peak_bytes", "err_fwd", "err_bwd",
                 "heap_fwd_bytes", "heap_bwd_bytes", "runtime_fwd_bytes", "runtime_bwd_bytes", "err_heap_fwd",
                 "err_heap_bwd", "fwd_bwd_median_ms",
                 "time_vs_first_median", "time_vs_first_min", "time_vs_first_max", "sched", "cpu_workers", "starpu"]
PEER_COLUMNS = ["preset", "impl", "round", "hidden", "ffn", "experts", "topk", "tokens", "fwd_bwd_ms",
                "peak_rss_bytes", "peak_layer_bytes", "rss_before_bytes"]


def text(section, **values):
    return mdreport.text("memory", section, **values)


def text1(section, **values):
    return mdreport.text1("memory", section, **values)


def mib(b):
    return f"{b / MIB:.1f}"


def write_csv(path, rows, cols):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def write_figures(out, figures):
    """The figures as files: the runs, the peer's and the model's at full
    size as CSV, then the plots; the plots' names."""
    write_csv(os.path.join(out, "memory_sweep.csv"), figures["sweep_rows"], SWEEP_COLUMNS)
    if figures["peer_runs"]:
        write_csv(os.path.join(out, "memory_peer.csv"), figures["peer_runs"], PEER_COLUMNS)
    write_csv(os.path.join(out, "memory_fullsize.csv"), figures["full"], fullsize_columns(figures["full"]))
    return plots(out, figures["pts"], figures["full"], figures["scale"], figures["base_tokens"])


# ---- memory.md, section by section ----

def md_header(figures, host, a):
    S = figures["scale"]
    return [f"# Peak memory per dispatcher on the paper's Table 3 shapes (H, F, tokens / {S:g})", "",
            f"Command: `{a.command}` on {host['date']}; machine: {host['cores']} cores "
            f"({host['cpu']}, {host['arch']}), CPU only, ranks oversubscribed, one StarPU CPU worker "
            f"and one OpenBLAS thread per rank. Run time {host['elapsed'] // 60} min {host['elapsed'] % 60} s. "
            f"relaymoe built from {a.source}.", "",
            *text("scale", scale=f"{S:g}", base_tokens=figures["base_tokens"], repeat=a.repeat), "",
            "## Metrics", "", *text("metrics", tolerance=f"{MODEL_TOLERANCE:.0%}"), ""]


def headline_line(h, b):
    q = h[b]["ring"]
    return (f"{b}/ring **{q[0]:.2f}x** total peak (execution peak, a diagnostic: {q[1]:.2f}x), time "
            f"{q[2]:.2f}x [{q[3]:.2f}-{q[4]:.2f}]")


def where(r, which):
    return f"{r['preset']}, EP={r['ranks']}, {r['tokens']} tokens, {r['dispatch']}, " + (
        "forward" if pass_of(which) == "fwd" else "backward")


def md_model_headline(figures):
    """The model's largest errors against both figures, and how far the heap
    rises above the model with the runtime's structures."""
    L, e = [], figures["errors"]
    worst, hworst = e["worst"], e["hworst"]
    if worst[1] is not None:
        L.append(f"- Largest model error against StarPU's figure: {worst[0]:.1%} ({where(worst[1], worst[2])}) "
                 f"over {len(figures['rows'])} measured dispatcher runs: "
                 + ("**FAIL**, above 10% (a2a, a2a-deepep: under it by 10%, or its model less the rows leaving over "
                    "it by 10%)."
                    if e["failed"]
                    else "within 10% (a2a, a2a-deepep: the measured peak within 10% of the span from its model less "
                         "the rows that may leave first to its model)."))
    if hworst[1] is not None:
        L.append(f"- Largest model error against the independent heap figure: {hworst[0]:.1%} "
                 f"({where(hworst[1], hworst[2])}); "
                 + (f"{len(e['hoff'])} of {len(e['herrs'])} pass peaks are more than 10% off (listed below)."
                    if e["hoff"] else f"all {len(e['herrs'])} pass peaks within 10%."))
        parts = [f"{d} {excess:+.1%} (model at most {above:+.1%} above)" for d, excess, above in figures["heap_excess"]]
        if parts:
            L.append("- The heap above the model with the runtime's structures, EP = 4 and 8, the largest excess "
                     "over forward and backward of every shape: " + "; ".join(parts) + ".")
    return L


def md_headline(figures):
    S, hq, hk = figures["scale"], figures["headline"]["Qwen3-30B-A3B"], figures["headline"]["MoE-K16"]
    L = ["## Headline", ""]
    if hq:
        L.append(f"- Qwen3-30B-A3B (K=8) at EP=8, scale {S:g}: " + "; ".join(headline_line(hq, b) for b in hq) + ".")
    if hk:
        L.append(f"- MoE-K16 at EP=8, scale {S:g}: " + "; ".join(headline_line(hk, b) for b in hk) + ".")
    if hq and "a2a-megatron" in hq:
        L += text("paper-megatron", ratio=f"{hq['a2a-megatron']['ring'][0]:.2f}x")
    # 8 ranks share 2 cores: the ring's hops form one chain per rank that
    # the cores serialise, where the all-to-all's ranks all compute at once.
    L += text("time-note")
    L += md_model_headline(figures)
    for b, over, runs in figures["over_model"]:
        L += text("over-model", baseline=b, n=len(over), runs=runs,
                  cases=", ".join(f"{x['preset']} EP={x['ranks']}" for x in over))
    for ep, paper, shapes, parts in figures["paper_size"]:
        L.append(f"- Model at the paper's Fig. 10 size (full size, 98304 tokens per rank, bf16), EP={ep}, averaged "
                 f"over {shapes} shapes: " + "; ".join(
                     f"{b}/ring {avg:.2f}x total peak (execution peak, diagnostic: {avgx:.2f}x)"
                     + (f" (MoE-K16: {k16[key(b, 'ring')]:.2f}x / {k16[key(b, 'ring') + '_exec']:.2f}x)" if k16 else "")
                     for b, avg, avgx, k16 in parts)
                 + f". The paper measured {paper} against Megatron's dispatcher. A model, not a measurement: "
                 "see the table below.")
    return L + [""]


def md_figures(figs, S):
    if not figs:
        return []
    L = ["## Figures", ""]
    for f in figs:
        L.append(f"- `{f}`" + (" (model, full size)" if f == "memory_fullsize.png"
                               else f" (measured, scale {S:g})" if f == "memory_ratios.png"
                               else f" (measured, scale {S:g}; dashed: model)"))
    L.append("")
    for f in figs:
        L += [f"![{f}]({f})", ""]
    return L


def md_ratios(figures):
    L = [f"## Ratios per point (measured, scale {figures['scale']:g})", "", *text("ratios-intro"), "",
         mdreport.row(["shape", "EP", "tokens/rank", "baseline", "/ring total", "/ring exec", "/token total",
                       "/token exec", "time /ring", "time /token"]),
         "|" + "---|" * 10]
    for k, b, q in figures["point_ratios"]:
        L.append(f"| {k[0]} | {k[1]} | {k[2]} | {b} | {q['ring'][0]:.2f} | {q['ring'][1]:.2f} | "
                 f"{q['token'][0]:.2f} | {q['token'][1]:.2f} | {q['ring'][2]:.2f} [{q['ring'][3]:.2f}-"
                 f"{q['ring'][4]:.2f}] | {q['token'][2]:.2f} |")
    return L + [""]


def point_row(r):
    def hcell(c):
        return mib(r[c]) if r.get(c, 0) > 0 else ""

    def ecell(c):
        return f"{r[c]:+.1%}" if c in r else ""

    return mdreport.row([
        r["preset"], r["ranks"], r["tokens"], r["dispatch"], f"{r['fwd_ms']:.0f}", f"{r['bwd_ms']:.0f}",
        mib(r["peak_fwd_bytes"]), hcell("heap_fwd_bytes"), mib(r["model_peak_fwd_bytes"]), hcell("runtime_fwd_bytes"),
        f"{r['err_fwd']:+.1%}", ecell("err_heap_fwd"), mib(r["peak_bwd_bytes"]), hcell("heap_bwd_bytes"),
        mib(r["model_peak_bwd_bytes"]), hcell("runtime_bwd_bytes"), f"{r['err_bwd']:+.1%}", ecell("err_heap_bwd"),
        mib(r["resident_bytes"]), mib(r["exec_peak_bytes"]), mib(r["peak_rss_bytes"]), mib(r["sent_bytes"])])


def md_points(figures):
    L = [f"## Every measured point against the model (scale {figures['scale']:g}, MiB per rank)", "",
         *text("points-intro"), "",
         mdreport.row(["shape", "EP", "tokens", "dispatch", "fwd ms", "bwd ms", "peak fwd", "heap fwd", "model fwd",
                       "runtime fwd", "err", "err heap", "peak bwd", "heap bwd", "model bwd", "runtime bwd", "err",
                       "err heap", "resident", "exec peak", "peak RSS", "sent"]),
         "|" + "---|" * 22]
    for r in sorted(figures["rows"], key=lambda r: (r["preset"], r["ranks"], r["tokens"],
                                                DISPATCHERS.index(r["dispatch"]))):
        L.append(point_row(r))
    return L + [""]


def md_heap_misses(figures):
    """The pass peaks where the model misses the heap figure by more than
    the tolerance, each with its numbers, and what explains them."""
    e = figures["errors"]
    hoff = e["hoff"]
    if not hoff:
        return []
    L = [f"**The model more than {MODEL_TOLERANCE:.0%} off the heap figure** ({len(hoff)} of {len(e['herrs'])} "
         "pass peaks):", ""]
    for _, r, which in sorted(hoff, key=lambda x: -x[0]):
        fb = pass_of(which)
        extra = r["heap_" + fb + "_bytes"] - r["model_peak_" + fb + "_bytes"] - r["runtime_" + fb + "_bytes"]
        L.append(f"- {r['preset']} EP={r['ranks']} {r['dispatch']} {'forward' if fb == 'fwd' else 'backward'}: heap "
                 f"{mib(r['heap_' + fb + '_bytes'])} MiB, StarPU {mib(r['peak_' + fb + '_bytes'])} MiB, model "
                 f"{mib(r['model_peak_' + fb + '_bytes'])} MiB + runtime {mib(r['runtime_' + fb + '_bytes'])} MiB "
                 f"({r[which]:+.1%}); the heap's excess is "
                 f"{extra / partition_bytes(r):.2f} times one partition's expert weights ({mib(partition_bytes(r))} MiB)")
    over, under_pipelined = heap_misses_split(hoff)
    L += ["", text1("early-data", over=len(over), under=len(hoff) - len(over)) + " "
          + (text1("pipelined-under") + " " if under_pipelined and len(hoff) > len(over) else "")
          + (text1("heap-over") if over else ""), ""]
    return L


def md_model_misses(figures, a):
    """The runs the model misses by more than the tolerance (the run fails),
    each with the command that reproduces it."""
    off = figures["errors"]["off"]
    if not off:
        return []
    L = [f"**Model errors above {MODEL_TOLERANCE:.0%}** (each reproduces with the command beside it; "
         "`build/` is the build tree):", ""]
    for _, r, which in off:
        p = pass_of(which)
        tok = "" if r["token_factor"] == 1 else f" --tokens {r['tokens']}"
        L.append(f"- {r['preset']} EP={r['ranks']} {r['dispatch']} {'forward' if p == 'fwd' else 'backward'}: "
                 f"measured {mib(r[f'peak_{p}_bytes'])} MiB, model {mib(r[f'model_peak_{p}_bytes'])} MiB "
                 f"({r[which]:+.1%}): `scripts/mpirun.sh -np {r['ranks']} build/apps/relaymoe run --preset "
                 f"{r['preset']} --scale {figures['scale']:g}{tok} --dispatch {r['run_dispatch']} --repeat {a.repeat}`")
    return L + [""]


def md_resident(figures):
    if not figures["resident_mismatch"]:
        return ["The resident bytes of `relaymoe plan --dtype f32` equal the measured ones at every point.", ""]
    L = ["Resident bytes of `relaymoe plan --dtype f32` differ from the measured ones at:"]
    for preset, ranks, tokens, got, mr in figures["resident_mismatch"]:
        L.append(f"- {preset} EP={ranks} {tokens} tokens: measured {mib(got)} MiB, plan {mib(mr)} MiB "
                 f"(`relaymoe plan --preset {preset} --scale {figures['scale']:g} --ranks {ranks} --tokens {tokens} "
                 "--dtype f32 --json`)")
    return L + [""]


def fullsize_table(full, fb):
    """The model's peaks per shape and EP, GiB, and the ratios."""
    L = ["| shape | EP | ring peak | token peak | " + " | ".join(f"{b} peak" for b in fb) + " | ring exec | "
         + " | ".join(f"{b} exec" for b in fb) + " | "
         + " | ".join(f"{b}/ring total | {b}/ring exec | {b}/token total | {b}/token exec" for b in fb) + " |",
         "|---|---|---|---|" + "---|" * (2 * len(fb) + 1 + 4 * len(fb))]
    for r in (r for r in full if r["tokens"] == PRESET_TOKENS):
        L.append(f"| {r['preset']} | {r['ep']} | {r['ring_peak_bytes'] / GIB:.2f} | {r['token_peak_bytes'] / GIB:.2f} | "
                 + "".join(f"{r[b + '_peak_bytes'] / GIB:.2f} | " for b in fb)
                 + f"{r['ring_exec_peak_bytes'] / GIB:.2f} | "
                 + "".join(f"{r[b + '_exec_peak_bytes'] / GIB:.2f} | " for b in fb)
                 + "".join(f"{r[key(b, 'ring')]:.2f} | {r[key(b, 'ring') + '_exec']:.2f} | {r[key(b, 'token')]:.2f} | "
                           f"{r[key(b, 'token') + '_exec']:.2f} | " for b in fb).rstrip(" |") + " |")
    return L


def fullsize_average_table(full, b):
    c = key(b, "ring")
    avg = fullsize_averages(full, b)
    L = [f"{b}/ring averaged over the shapes, total / execution peak (MoE-K16 alone in brackets):", "",
         "| tokens per rank | " + " | ".join(f"EP={ep}" for ep in FULLSIZE_EP) + " |",
         "|---|" + "---|" * len(FULLSIZE_EP)]
    for tokens in FULLSIZE_TOKENS:
        cells = []
        for ep in FULLSIZE_EP:
            total, execution, k16 = avg[(tokens, ep)]
            cells.append(f"{total:.2f} / {execution:.2f}"
                         + (f" ({k16[c]:.2f} / {k16[c + '_exec']:.2f})" if k16 else ""))
        L.append(f"| {tokens} | " + " | ".join(cells) + " |")
    return L + [""]


def md_fullsize(figures):
    full = figures["full"]
    fb = fullsize_baselines(full)
    L = ["## The model at full size (scale 1)", "", *text("fullsize-intro"), "", *fullsize_table(full, fb), ""]
    for b in fb:
        L += fullsize_average_table(full, b)
    return L + text("paper-scaling") + [""]


def md_peer(figures, a):
    peer = figures["peer"]
    if not peer:
        return []
    L = [f"## PyTorch peer at EP=1 (scale {figures['scale']:g}, fp32, one thread)", "",
         *text("peer-intro", steps=a.repeat + 1, repeat=a.repeat, rounds=a.rounds), "",
         mdreport.row(["shape", "T", "K", "implementation", "fwd+bwd ms", "peak RSS MiB", "RSS before step MiB",
                       "layer peak MiB", "every round, ms"]),
         "|" + "---|" * 9]
    for p in sorted(peer, key=lambda p: (p["preset"], p["impl"])):
        L.append(mdreport.row([
            p["preset"], p["tokens"], p["topk"], p["impl"], f"{p['fwd_bwd_ms']:.0f}", mib(p["peak_rss_bytes"]),
            mib(p["rss_before_bytes"]) if p["rss_before_bytes"] != "" else "",
            mib(p["peak_layer_bytes"]) if p["peak_layer_bytes"] != "" else "", p["all_ms"]]))
    L.append("")
    for preset, impl, t, rm in peer_comparisons(peer):
        L.append(f"- {preset}: torch / {impl}: time {t['fwd_bwd_ms'] / rm['fwd_bwd_ms']:.2f}x, "
                 f"peak RSS {t['peak_rss_bytes'] / rm['peak_rss_bytes']:.2f}x; torch's peak "
                 f"above its RSS before the step: "
                 f"{(t['peak_rss_bytes'] - t['rss_before_bytes']) / MIB:.1f} MiB.")
    return L + [""]


def md_check(figures):
    if not figures["check_log"]:
        return []
    return ["### PyTorch against relaymoe's outputs", "", *text("check-intro"), "",
            "```", figures["check_log"].rstrip(), "```", ""]


def markdown(figures, figs, host, a):
    """memory.md's lines."""
    return (md_header(figures, host, a) + md_headline(figures) + md_figures(figs, figures["scale"]) + md_ratios(figures)
            + md_points(figures) + md_heap_misses(figures) + md_model_misses(figures, a) + md_resident(figures)
            + md_fullsize(figures) + md_peer(figures, a) + md_check(figures)
            + ["## Notes", "", *text("notes", scale=f"{figures['scale']:g}")])


def console(figures, figs, a):
    """What the run prints: the files written and the headline, then each
    failure on stderr; the exit status."""
    print(f"wrote {a.out}/memory.md, memory_sweep.csv, memory_fullsize.csv"
          + (", memory_peer.csv" if figures["peer"] else "") + (", " + ", ".join(figs) if figs else ""))
    for name in ("Qwen3-30B-A3B", "MoE-K16"):
        h = figures["headline"][name]
        for b in (h or {}):
            print(f"{name} EP=8: {b}/ring {h[b]['ring'][0]:.2f}x total, {h[b]['ring'][1]:.2f}x execution peak (diagnostic)")
    worst = figures["errors"]["worst"]
    if worst[1] is not None:
        print(f"largest model error {worst[0]:.1%}")
    rc = 0
    if figures["errors"]["failed"]:
        for _, r, which in figures["errors"]["off"]:
            print(f"FAIL: model {r[which]:+.1%} off the measured {which[4:]} peak: {r['preset']} EP={r['ranks']} "
                  f"{r['tokens']} tokens {r['dispatch']} (tolerance 10%; a2a, a2a-deepep: the span from the model less its "
                  "rows leaving to the model)", file=sys.stderr)
        rc = 1
    if figures["check_failed"]:
        print("FAIL: the PyTorch layer disagrees with relaymoe's outputs (check.log)", file=sys.stderr)
        rc = 1
    return rc
