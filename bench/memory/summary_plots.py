"""The memory report's plots (bench/memory/summarize.py's render step)."""
import os

import mdreport
from summary_compute import (BASELINES, DISPATCHERS, FULLSIZE_EP, FULLSIZE_PRESETS, MIB, PRESET_TOKENS, RINGS,
                             exec_peak, key, model_peak, peak, ratios)

LABEL = {"ring": "ring, expert routing", "token": "ring, token routing", "a2a": "all-to-all (lean)",
         "a2a-megatron": "all-to-all (Megatron)", "a2a-deepep": "all-to-all (DeepEP)"}
COLOR = {"ring": "tab:blue", "token": "tab:green", "a2a": "tab:red", "a2a-megatron": "tab:purple",
         "a2a-deepep": "tab:orange"}


def sweep(plt, out, pts, scale, name, keys, xs, xlabel, title, logx=False):
    """Measured and modelled peaks of every dispatcher along one sweep of
    points; False when the sweep has fewer than two."""
    if len(keys) < 2:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, mlabel in ((axes[0], peak, "total peak"), (axes[1], exec_peak, "execution peak (diagnostic)")):
        for d in (d for d in DISPATCHERS if all(d in pts[k] for k in keys)):
            ys = [metric(pts[k][d]) / MIB for k in keys]
            ax.plot(xs, ys, "o-", color=COLOR[d], label=LABEL[d] + " (measured)")
            if metric is peak:
                ms = [model_peak(pts[k][d]) / MIB for k in keys]
            else:
                ms = [(model_peak(pts[k][d]) - pts[k][d]["resident_bytes"]) / MIB for k in keys]
            ax.plot(xs, ms, "x--", color=COLOR[d], alpha=0.6, label=LABEL[d] + " (model)")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{mlabel}, MiB per rank")
        ax.set_title(mlabel)
        ax.set_xticks(xs)
        if logx:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([str(x) for x in xs])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title} — H, F, tokens divided by {scale:g}, fp32, measured on CPU", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return True


def sweeps(plt, out, pts, scale, base_tokens):
    """The three sweeps: tokens, EP and top-k; the names of those drawn."""
    made = []
    tok = sorted(k for k in pts if k[0] == "Qwen3-30B-A3B" and k[1] == 4)
    if sweep(plt, out, pts, scale, "memory_tokens.png", tok, [k[2] for k in tok], "tokens per rank",
             "Qwen3-30B-A3B at EP=4, tokens 0.25x-2x", logx=True):
        made.append("memory_tokens.png")
    ep = sorted(k for k in pts if k[0] == "Qwen3-30B-A3B" and k[2] == base_tokens)
    if sweep(plt, out, pts, scale, "memory_ep.png", ep, [k[1] for k in ep], "EP (ranks)",
             "Qwen3-30B-A3B over EP"):
        made.append("memory_ep.png")
    ks = sorted((k for k in pts if k[1] == 8 and (k[0].startswith("MoE-K") or k[0] == "Qwen3-30B-A3B")
                 and k[2] == base_tokens), key=lambda k: pts[k]["a2a"]["topk"])
    if sweep(plt, out, pts, scale, "memory_topk.png", ks, [pts[k]["a2a"]["topk"] for k in ks], "top-k K",
             "MoE-K4/K8/K12/K16 (E=128) at EP=8"):
        made.append("memory_topk.png")
    return made


def ratio_bars(plt, out, pts, scale, base_tokens):
    """Each baseline over each ring mode at every point; False without one."""
    keys = sorted((k for k in pts if k[2] == base_tokens or k[0] != "Qwen3-30B-A3B"),
                  key=lambda k: (k[0], k[1], k[2]))
    if not keys:
        return False
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.6 * len(keys) + 2), 7.5), sharex=True)
    xs = range(len(keys))
    bs = [b for b in BASELINES if all(b in pts[k] for k in keys)]
    w = 0.8 / (2 * len(bs))
    for ax, d in zip(axes, RINGS):
        for i, b in enumerate(bs):
            tot = [ratios(pts[k], b)[d][0] for k in keys]
            ex = [ratios(pts[k], b)[d][1] for k in keys]
            ax.bar([x - 0.4 + (2 * i + 0.5) * w for x in xs], tot, w, label=f"{b}: total peak",
                   color=COLOR[b], alpha=0.45)
            ax.bar([x - 0.4 + (2 * i + 1.5) * w for x in xs], ex, w, label=f"{b}: execution peak (diagnostic)",
                   color=COLOR[b])
        ax.axhline(3.8, color="k", ls=":", lw=1, label="paper, EP=8 average (3.8x)")
        ax.set_ylabel(f"baseline / {d} peak")
        ax.set_title(f"all-to-all baselines over {LABEL[d]}")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    axes[1].set_xticks(list(xs))
    axes[1].set_xticklabels([f"{k[0]} EP{k[1]}" for k in keys], rotation=70, ha="right", fontsize=7)
    fig.suptitle(f"Peak memory ratios, measured (H, F, tokens divided by {scale:g}, fp32, CPU)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory_ratios.png"), dpi=110)
    plt.close(fig)
    return True


def fullsize_axis(ax, full, suffix, title):
    import matplotlib.ticker
    for preset in sorted({r["preset"] for r in full}, key=FULLSIZE_PRESETS.index):
        rs = [r for r in full if r["preset"] == preset]
        line, = ax.plot([r["ep"] for r in rs], [r[key("a2a", "ring") + suffix] for r in rs], "o-",
                        label=preset)
        if key("a2a-megatron", "ring") in rs[0]:
            ax.plot([r["ep"] for r in rs], [r[key("a2a-megatron", "ring") + suffix] for r in rs], "x--",
                    color=line.get_color(), alpha=0.6)
        if key("a2a-deepep", "ring") in rs[0]:
            ax.plot([r["ep"] for r in rs], [r[key("a2a-deepep", "ring") + suffix] for r in rs], "s:",
                    color=line.get_color(), alpha=0.6)
    ax.plot([8, 64], [3.8, 7.6], "k*", ms=10, label="paper average (3.8x, 7.6x)")
    ax.plot([64], [13.4], "r*", ms=10, label="paper top-16 (13.4x)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(FULLSIZE_EP))
    ax.set_xticklabels([str(e) for e in FULLSIZE_EP])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("EP (ranks)")
    ax.set_ylabel("baseline / ring (solid a2a, dashed a2a-megatron, dotted a2a-deepep)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")


def fullsize(plt, out, full):
    """The model's ratios at full size over EP, per shape; False without them."""
    full = [r for r in full if r["tokens"] == PRESET_TOKENS]
    if not full:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, suffix, title in ((axes[0], "", "total peak"), (axes[1], "_exec", "execution peak (diagnostic)")):
        fullsize_axis(ax, full, suffix, title)
    axes[0].legend(fontsize=7)
    fig.suptitle("Memory model at full size (scale 1): 49152 tokens per rank, bf16, even routing",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory_fullsize.png"), dpi=110)
    plt.close(fig)
    return True


def plots(out, pts, full, scale, base_tokens):
    """Every plot the figures allow; the names of those written."""
    plt = mdreport.pyplot()
    made = sweeps(plt, out, pts, scale, base_tokens)
    if ratio_bars(plt, out, pts, scale, base_tokens):
        made.append("memory_ratios.png")
    if fullsize(plt, out, full):
        made.append("memory_fullsize.png")
    return made
