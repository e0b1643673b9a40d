#!/usr/bin/python3
"""Where a pass's time goes (issue 16 item 2), without FxT: from StarPU's own
accounting of the breakdown runs of bench/rate/run.sh.

Per codelet, the history model StarPU recorded in the run's STARPU_HOME
(STARPU_CALIBRATE=1; one home per rank): per data footprint the mean
duration of its executions and their number n. StarPU leaves out the first
execution of each footprint (perfmodel_history.c: "very often quite
bogus"), which here is the warm-up's, so a footprint that runs c times a
step ran (n + 1) / steps times per step, steps = the timed repetitions + the
warm-up; its time per step is mean * (n + 1) / steps. The warm-up's later
executions stay in the mean.

Codelets to passes and categories:
  forward   router-fwd, dispatch-map (router); expert-ffn (expert GEMMs);
            scatter-add and one in three gathers (gather/scatter)
  backward  recompute, expert-bwd (expert GEMMs); router-bwd (router); two
            in three gathers: x and dy, of the same rows as the forward's
            (gather/scatter); grad-accumulate, zero (accumulate)
A pass's worker time is its wall time (the mean of the timed passes rank 0
printed, as the models' means; else relaymoe's median, max over ranks)
times the workers of all ranks; what no codelet filled of it is "no codelet":
workers idle (waiting for a dependency, a transfer, the host's submission
and its synchronisation on the routing counts) and StarPU's own work
between tasks. The workers' statistics (STARPU_WORKER_STATS, whole run)
give StarPU's overhead (awake, not executing) per step apart.

  breakdown.py --runs FILE --sgemm T1S1.csv --routing ROUTING.csv --shapes LIST
               --repeat R --out OUT.csv
"""
import argparse
import csv
import glob
import math
import os
import re
import statistics
import sys

CATEGORY = {
    "rmoe_router_fwd": ("fwd", "router"), "rmoe_dispatch_map": ("fwd", "router"),
    "rmoe_expert_ffn": ("fwd", "expert GEMMs"), "rmoe_scatter_add": ("fwd", "gather/scatter"),
    "rmoe_expert_recompute": ("bwd", "expert GEMMs"), "rmoe_expert_bwd": ("bwd", "expert GEMMs"),
    "rmoe_router_bwd": ("bwd", "router"), "rmoe_accumulate": ("bwd", "accumulate"),
    "rmoe_zero": ("bwd", "accumulate"),
}
CATEGORIES = ["expert GEMMs", "gather/scatter", "router", "accumulate", "other", "no codelet"]


def read_history(path):
    """[(footprint, flops, mean_us, n)] of a StarPU history model file (version 45)."""
    rows, in_table = [], False
    with open(path) as f:
        for line in f:
            if line.startswith("# hash"):
                in_table = True
                continue
            if in_table:
                parts = line.split()
                if len(parts) == 8 and not line.startswith("#"):
                    rows.append((parts[0], float(parts[2]), float(parts[3]), int(parts[7])))
                else:
                    in_table = False
    return rows


def codelets_of(home, steps):
    """{codelet: (ms per step, tasks per step, flops per step)} of one rank."""
    out = {}
    for path in glob.glob(os.path.join(home, ".starpu", "sampling", "codelets", "*", "*.rate")):
        sym = re.sub(r"_v\d+$", "", os.path.basename(path)[:-len(".rate")])
        ms = tasks = flops = 0.0
        for _, fl, mean_us, n in read_history(path):
            if n == 0:
                continue
            per_step = (n + 1) / steps
            ms += mean_us * 1e-3 * per_step
            tasks += per_step
            flops += (fl if math.isfinite(fl) else 0.0) * per_step
        out[sym] = (ms, tasks, flops)
    return out


def worker_stats(log):
    """Sum over the rank's workers of (tasks, total, executing, sleeping, overhead) ms."""
    tot = [0.0] * 5
    if not os.path.exists(log):
        return None
    text = open(log, errors="replace").read()
    for m in re.finditer(r"(\d+) task\(s\)\s*\n\s*total: ([\d.]+) ms executing: ([\d.]+) ms sleeping: ([\d.]+) ms "
                         r"overhead (-?[\d.]+) ms", text):
        for i in range(5):
            tot[i] += float(m.group(i + 1))
    return tot if tot[1] > 0 else None


def split(sym, ms):
    """[(pass, category, ms)] of one codelet's time per step."""
    if sym == "rmoe_gather":
        return [("fwd", "gather/scatter", ms / 3), ("bwd", "gather/scatter", 2 * ms / 3)]
    p, c = CATEGORY.get(sym, ("bwd", "other"))
    return [(p, c, ms)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True)
    ap.add_argument("--sgemm", required=True)
    ap.add_argument("--routing", required=True)
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--repeat", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    steps = a.repeat + 1
    fields = ["shape", "config", "ranks", "workers", "blas_threads", "pass", "wall_ms", "worker_ms", "category", "ms",
              "share", "tasks", "gflops", "sgemm_t1s1_gflops"]
    t1s1 = {}
    with open(a.sgemm) as f:
        for r in csv.DictReader(f):
            t1s1[(r["shape"], int(r["ranks"]), r["pass"])] = float(r["gflops_median"])
    rows = []
    runs = [line.split() for line in open(a.runs) if line.strip()]
    for name, config, d in runs:
        m = re.match(r"r(\d+)-w(\d+)b(\d+)-(.+)$", config)
        np_, ncpu, nblas = int(m.group(1)), int(m.group(2)), int(m.group(3))
        with open(os.path.join(d, "run.csv")) as f:
            run = list(csv.DictReader(f))[-1]
        wall = {"fwd": float(run["fwd_ms"]), "bwd": float(run["bwd_ms"])}
        # The models hold means over the timed passes: against them the mean
        # of the timed passes' wall times (rank 0 prints every pass), not
        # the median, which one slow pass on a busy machine leaves apart.
        timed = re.findall(r"run: forward ([\d.]+) ms, backward ([\d.]+) ms",
                           open(os.path.join(d, "homes", "r0", "out.log"), errors="replace").read())
        if len(timed) == a.repeat:
            wall = {"fwd": statistics.mean(float(f) for f, _ in timed),
                    "bwd": statistics.mean(float(b) for _, b in timed)}
        busy = {(p, c): 0.0 for p in wall for c in CATEGORIES}
        gemm = {p: [0.0, 0.0] for p in wall}     # expert GEMM codelets: ms, flops (all ranks)
        tasks = {(p, c): 0.0 for p in wall for c in CATEGORIES}
        stats = [0.0] * 5
        homes = sorted(glob.glob(os.path.join(d, "homes", "r*")))
        if len(homes) != np_:
            sys.exit(f"breakdown.py: {d}: {len(homes)} rank homes, expected {np_}")
        for home in homes:
            cl = codelets_of(home, steps)
            if not cl:
                sys.exit(f"breakdown.py: {home}: no history model recorded")
            for sym, (ms, n, fl) in cl.items():
                for p, c, t in split(sym, ms):
                    busy[(p, c)] += t
                    tasks[(p, c)] += n * t / ms if ms > 0 else 0
                if CATEGORY.get(sym, ("", ""))[1] == "expert GEMMs":
                    p = CATEGORY[sym][0]
                    gemm[p][0] += ms
                    gemm[p][1] += fl
            ws = worker_stats(os.path.join(home, "out.log"))
            if ws:
                stats = [s + w for s, w in zip(stats, ws)]
        for p in ("fwd", "bwd"):
            worker_ms = wall[p] * ncpu * np_
            busy[(p, "no codelet")] = worker_ms - sum(busy[(p, c)] for c in CATEGORIES if c != "no codelet")
            ref = t1s1.get((name, np_, p), float("nan"))
            for c in CATEGORIES:
                ms = busy[(p, c)]
                gf = gemm[p][1] / gemm[p][0] / 1e6 if c == "expert GEMMs" and gemm[p][0] > 0 else ""
                rows.append({"shape": name, "config": config, "ranks": np_, "workers": ncpu, "blas_threads": nblas,
                             "pass": p, "wall_ms": f"{wall[p]:.3f}", "worker_ms": f"{worker_ms:.3f}", "category": c,
                             "ms": f"{ms:.3f}", "share": f"{ms / worker_ms:.4f}",
                             "tasks": f"{tasks[(p, c)]:.2f}" if c != "no codelet" else "",
                             "gflops": f"{gf:.3f}" if gf != "" else "",
                             "sgemm_t1s1_gflops": f"{ref:.3f}" if c == "expert GEMMs" else ""})
        if stats[1] > 0:
            # StarPU's own accounting over the whole run (start-up and the
            # warm-up included), per step: awake and not executing
            step_ms = (wall["fwd"] + wall["bwd"]) * ncpu * np_
            rows.append({"shape": name, "config": config, "ranks": np_, "workers": ncpu, "blas_threads": nblas,
                         "pass": "run/step", "wall_ms": f"{wall['fwd'] + wall['bwd']:.3f}",
                         "worker_ms": f"{step_ms:.3f}", "category": "StarPU overhead (worker stats)",
                         "ms": f"{stats[4] / steps:.3f}", "share": f"{stats[4] / steps / step_ms:.4f}",
                         "tasks": f"{stats[0] / steps:.2f}", "gflops": "", "sgemm_t1s1_gflops": ""})
            rows.append({"shape": name, "config": config, "ranks": np_, "workers": ncpu, "blas_threads": nblas,
                         "pass": "run/step", "wall_ms": f"{wall['fwd'] + wall['bwd']:.3f}",
                         "worker_ms": f"{step_ms:.3f}", "category": "executing (worker stats)",
                         "ms": f"{stats[2] / steps:.3f}", "share": f"{stats[2] / steps / step_ms:.4f}",
                         "tasks": "", "gflops": "", "sgemm_t1s1_gflops": ""})
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        if r["category"] in ("expert GEMMs", "no codelet"):
            print(f"breakdown {r['shape']} {r['config']} {r['pass']}: {r['category']} {float(r['ms']):.1f} ms of "
                  f"{float(r['worker_ms']):.1f} worker ms ({100 * float(r['share']):.1f}%)"
                  + (f", {r['gflops']} GFLOP/s in the codelets (one-thread sgemm {r['sgemm_t1s1_gflops']})"
                     if r["gflops"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
