#!/usr/bin/python3
"""Summary of bench/memory/run.sh: CSVs, plots and memory.md.

  summarize.py --runs DIR --app RELAYMOE --out OUT --scale S --repeat R --rounds N
               --start EPOCH_SECONDS --command CMD --source REV [--quick]

DIR holds one CSV per `relaymoe run` (named NNN__PRESET__RANKS__FACTOR__DISPATCH.csv),
torch__PRESET__ROUND.json from torch_moe.py bench, and check.log from torch_moe.py
check. The model's full-size predictions come from `relaymoe plan --json`.
Exits 1 when the memory model is more than 10% off a measured peak (for the
pipelined a2a and a2a-deepep, whose token blocks' inputs, and for
a2a-deepep the own block's outputs, may be gone before the peak: more than
10% under the model or 10% over the model less those rows,
model_leaving_*_bytes) or the PyTorch layer disagrees with relaymoe's
outputs.

The report is made in three steps, a module beside this script each:
summary_load.py reads the runs and asks `relaymoe plan`, summary_compute.py
computes the figures, summary_render.py writes them (CSVs, then the plots of
summary_plots.py, then memory.md, whose fixed prose is
docs/report-text/memory.md).
"""
import argparse
import os
import sys

# What the bench reports share (bench/lib/); this report's own modules lie
# beside this script, on the path already.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))

import summary_compute  # noqa: E402
import summary_load  # noqa: E402
import summary_render  # noqa: E402
import mdreport  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser()
    for a in ("runs", "app", "out", "command", "source"):
        ap.add_argument("--" + a, required=True)
    ap.add_argument("--scale", type=float, required=True)
    ap.add_argument("--repeat", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--start", type=int, required=True, help="the run's start, seconds since the epoch")
    ap.add_argument("--quick", action="store_true")
    return ap.parse_args()


def main():
    a = parse_args()
    inputs = summary_load.load(a.runs, a.app, a.scale, a.quick)
    figures = summary_compute.compute(inputs, a.scale, a.quick)
    figs = summary_render.write_figures(a.out, figures)
    # read once the files are written, as the run time should cover them
    host = summary_load.machine(a.start)
    mdreport.write_lines(os.path.join(a.out, "memory.md"), summary_render.markdown(figures, figs, host, a))
    return summary_render.console(figures, figs, a)


if __name__ == "__main__":
    sys.exit(main())
