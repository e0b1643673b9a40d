#!/usr/bin/python3
"""The table of bench/flow/run.sh from its CSV.

  summarize.py CSV MD COMMAND RANKS REPEAT ROUNDS REV NCPU [BASELINE]
"""
import csv
import datetime
import os
import statistics
import sys


path, md, command, np, repeat, rounds, rev, ncpu = sys.argv[1:9]
baseline = sys.argv[9] if len(sys.argv) > 9 else ""
rows = list(csv.DictReader(open(path)))
# The baseline by name (a local path says nothing elsewhere): relaymoe built
# from the commit its name carries.
if baseline:
    command = command.replace(baseline, os.path.basename(baseline))
arms = list(dict.fromkeys(r["arm"] for r in rows))
label = {"credits": "W=2 (default, credits)", "nocredits": "W=2, credits off (RMOE_FLOW_CREDITS=off)",
         "window%s" % np: "W=%s (=N: no credit ever needed)" % np,
         "before": "the baseline binary (%s)" % os.path.basename(baseline)}
ncores = os.cpu_count()
oversub = int(np) * (int(ncpu) + 1) > ncores
MiB = 1048576.0
out = ["# Flow control of the rings: its cost in time", "",
       "Command: `%s` on %s, commit %s, %d cores (%s), CPU only, %s ranks of %s StarPU CPU worker(s) each%s%s." % (
           command, datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), rev, ncores,
           os.uname().machine, np, ncpu, " (oversubscribed: workers and MPI threads exceed the cores)" if oversub else "",
           (", baseline `%s`" % os.path.basename(baseline)) if baseline else ""),
       "Layer: the default (Qwen3-30B-A3B with H, F and tokens divided by 16: H=128, F=48, E=128, K=8, 3072 "
       "tokens per rank), fp32. Each process: a warm-up and %s timed repetitions, its median forward+backward "
       "(max over ranks); the arms alternate process by process, the order rotating over %s rounds. Below: the "
       "median and range over the rounds, and the arm's time over the default's in the same round (median and range of "
       "the per-round ratios)." % (repeat, rounds), "",
       "| dispatch | arm | forward+backward ms, median [range] | over the default, per round | heap fwd / bwd MiB | StarPU fwd / bwd MiB | model fwd / bwd MiB |",
       "|---|---|---|---|---|---|---|"]
for d in dict.fromkeys(r["dispatch"] for r in rows):
    for a in arms:
        sel = [r for r in rows if r["arm"] == a and r["dispatch"] == d]
        if not sel:
            continue
        t = [float(r["fwd_bwd_ms"]) for r in sel]
        med = statistics.median(t)
        # Paired within a round (the arms ran back to back): this arm over the default.
        w2 = {r["round"]: float(r["fwd_bwd_ms"]) for r in rows if r["arm"] == "credits" and r["dispatch"] == d}
        pr = sorted(float(r["fwd_bwd_ms"]) / w2[r["round"]] for r in sel if r["round"] in w2)
        mx = lambda k: max(float(r[k]) for r in sel) / MiB
        out.append("| %s | %s | %.0f [%.0f-%.0f] | %s | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f |" % (
            d, label.get(a, a), med, min(t), max(t),
            "%.2fx [%.2f-%.2f]" % (statistics.median(pr), pr[0], pr[-1]) if pr and a != "credits" else "1",
            mx("heap_fwd_bytes"), mx("heap_bwd_bytes"), mx("peak_fwd_bytes"), mx("peak_bwd_bytes"),
            mx("model_fwd_bytes"), mx("model_bwd_bytes")))
out += ["", "Reading the times: only the medians of the per-round ratios are read, and a difference within their "
        "range is not resolved. The credits-off arm is the same binary with the same two slots, so its "
        "difference from the default is the credits' cost; W=N shows what the slot reuse itself costs "
        "(a receive waits for the readers of the hop before, so the ring runs as a chain), at the memory "
        "of N slots.", "",
        "Memory: max over the rounds and ranks. The model counts W receive slots per relayed kind "
        "(min(W, N-1); gradients min(W, N)), so W=N costs more memory by the model as by the heap. Ranks "
        "here run at the same speed; where the credits-off arm holds more than the model by the heap, that "
        "is early data. With one rank slowed the ring without credits held up to 21% more in its backward "
        "(test `flow_np4`, docs/memory.md).", ""]
open(md, "w").write("\n".join(out))
print("\n".join(out))
