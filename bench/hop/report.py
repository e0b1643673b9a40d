#!/usr/bin/python3
"""Table and plot of bench/hop/run.sh: Markdown on stdout, a PNG beside it.

    report.py hop.csv hop.png --command CMD
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


def human(n):
    for unit, f in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= f:
            return "%g %s" % (n / f, unit)
    return "%d B" % n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("png")
    ap.add_argument("--command", default="")
    a = ap.parse_args()
    with open(a.csv) as f:
        rows = list(csv.DictReader(f))
    variants, sizes = [], []
    for r in rows:
        if r["label"] not in variants:
            variants.append(r["label"])
        b = int(r["bytes"])
        if b not in sizes:
            sizes.append(b)
    sizes.sort()

    def med(label, b, key):
        v = [float(r[key]) for r in rows if r["label"] == label and int(r["bytes"]) == b]
        return statistics.median(v) if v else float("nan")

    # Ratio per run (StarPU-MPI over the same run's plain MPI), then the median.
    ratio = {(v, b): med(v, b, "starpu_over_mpi") for v in variants for b in sizes}
    rounds = len({r["round"] for r in rows})
    out = ["# One ring hop: StarPU-MPI against plain MPI", "",
           "Command: `%s` on %s, %d cores (%s), 2 ranks, one StarPU CPU worker per rank. Other jobs shared "
           "the machine: each ratio is StarPU-MPI over plain MPI measured in the same run, the median of %d "
           "rounds (rounds alternate over the variants)."
           % (a.command, datetime.date.today().isoformat(), os.cpu_count(), platform.machine(), rounds), "",
           "Per hop: every rank sends its buffer to the right and receives the next into the other buffer "
           "(bench/hop/hop_bench.c). mpi: MPI_Isend/MPI_Irecv/MPI_Waitall with StarPU paused; awake: the same "
           "with StarPU's idle worker running; starpu: starpu_mpi_isend_detached/irecv_detached on "
           "double-buffered handles and one task per hop reading the held buffer, as the layer's ring.", "",
           "## StarPU-MPI / plain MPI, per hop (median ratio)", "",
           "| size | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    for b in sizes:
        out.append("| %s | " % human(b) + " | ".join("%.2f" % ratio[(v, b)] for v in variants) + " |")
    out += ["", "## Milliseconds per hop (median): plain MPI / StarPU idle-awake MPI / StarPU-MPI", "",
            "| size | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    for b in sizes:
        cells = ["%.3f / %.3f / %.3f" % (med(v, b, "mpi_ms"), med(v, b, "awake_ms"), med(v, b, "starpu_ms"))
                 for v in variants]
        out.append("| %s | " % human(b) + " | ".join(cells) + " |")
    big = [b for b in sizes if b >= 2**20]
    if big:
        out += ["", "Messages of 1 MB and more, worst ratio per variant: " + "; ".join(
            "%s %.2fx" % (v, max(ratio[(v, b)] for b in big)) for v in variants) + "."]
    out += ["", "Why, and the settings behind each column: docs/tuning.md, \"Ranks on shared cores: what a hop costs\". "
            "The awake column is the cause measured directly: plain MPI slows down as soon as StarPU's idle "
            "worker spins beside it.", "", "Raw rows: hop.csv; plot: hop.png.", ""]

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, v in enumerate(variants):
        c = colours[i % len(colours)]
        ax[0].plot(sizes, [med(v, b, "starpu_ms") for b in sizes], "o-", color=c, label="StarPU-MPI, " + v)
        ax[0].plot(sizes, [med(v, b, "mpi_ms") for b in sizes], ":", color=c, label="plain MPI, " + v)
        ax[1].plot(sizes, [ratio[(v, b)] for b in sizes], "o-", color=c, label=v)
    ax[1].axhline(2.0, color="black", linewidth=0.8, linestyle="--")
    ax[1].text(sizes[0], 2.1, "2x", fontsize=8)
    for x in ax:
        x.set_xscale("log", base=2)
        x.set_xlabel("message bytes")
    ax[0].set_yscale("log")
    ax[0].set_ylabel("ms per hop")
    ax[0].legend(fontsize=6, ncol=2)
    ax[1].set_yscale("log")
    ax[1].set_ylabel("StarPU-MPI / plain MPI (same run)")
    ax[1].legend(fontsize=7)
    fig.suptitle("one ring hop, 2 ranks on %d cores" % os.cpu_count(), fontsize=10)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    print("\n".join(out))


if __name__ == "__main__":
    main()
