#!/usr/bin/env python3
"""Plots the loss curves written by `relaymoe train --csv` into one PNG.

  train_plot.py --out OUT.png CURVE.csv [CURVE.csv ...] [--labels A,B] [--title T]

One panel of loss per step with the corpus's floor; with two or more
curves, a second panel of each curve's relative difference to the first on
a log scale, beside the rounding bound s * 2**-24 (bench/train_compare.py).
Without matplotlib it says so and exits 0: the plot is optional.
"""
import argparse
import csv
import os
import sys


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    loss = [float(r["loss"]) for r in rows]
    floor = float(rows[0]["floor_nats"]) if rows else None
    return steps, loss, floor


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--labels", default="")
    ap.add_argument("--title", default="relaymoe train")
    ap.add_argument("curves", nargs="+")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: skipping the plot {args.out}")
        return 0

    labels = args.labels.split(",") if args.labels else [os.path.splitext(os.path.basename(c))[0]
                                                          for c in args.curves]
    data = [load(c) for c in args.curves]
    two = len(data) > 1
    fig, axes = plt.subplots(2 if two else 1, 1, figsize=(7.5, 6.5 if two else 4), sharex=True,
                             squeeze=False)
    ax = axes[0][0]
    styles = ["-", "--", ":", "-."]
    for i, ((steps, loss, _), label) in enumerate(zip(data, labels)):
        ax.plot(steps, loss, styles[i % len(styles)], linewidth=1.2, label=label)
    floor = data[0][2]
    if floor is not None:
        ax.axhline(floor, color="gray", linewidth=0.8, linestyle=":", label=f"floor {floor:.3f} nats")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(args.title)
    ax.legend()
    ax.grid(alpha=0.3)
    if two:
        bx = axes[1][0]
        s0, l0, _ = data[0]
        for (steps, loss, _), label in zip(data[1:], labels[1:]):
            pts = [(s, abs(a - b) / abs(a)) for s, a, b in zip(s0, l0, loss) if a != b]
            if pts:
                bx.semilogy([p[0] for p in pts], [p[1] for p in pts], ".", markersize=3,
                            label=f"|{labels[0]} - {label}| / loss (bit-identical steps not shown)")
        bx.semilogy(s0, [s * 2.0 ** -24 for s in s0], "k-", linewidth=1, label="bound s * 2^-24")
        bx.set_xlabel("step")
        bx.set_ylabel("relative difference")
        bx.legend(fontsize=8)
        bx.grid(alpha=0.3, which="both")
    else:
        ax.set_xlabel("step")
    fig.tight_layout()
    tmp = args.out + ".tmp.png"
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
