#!/usr/bin/python3
"""The arithmetic of bench/sim/check_real.sh.

  check_eval.py links HOP_CSV RANKS
      bench/hop/hop_bench.c's per-hop times fitted as latency + bytes / bandwidth,
      for plain MPI and StarPU-MPI: CSV rows ranks,kind,latency_us,bandwidth_gbs
  check_eval.py eval --real CSV --sims CSV --links CSV --out DIR --tol PCT ...
      real runs against their simulations: DIR/sim_check.csv and
      DIR/sim_check.meta.json (bench/sim/report.py md renders them in sim.md);
      exit status 0 when every history case is within the tolerance, 3 if not

Standard library only.
"""
import argparse
import csv
import json
import statistics
import sys


def links(path, ranks):
    rows = list(csv.DictReader(open(path)))
    for kind, col in (("mpi", "mpi_ms"), ("starpu", "starpu_ms")):
        xs = [float(r["bytes"]) for r in rows]
        ys = [float(r[col]) * 1e-3 for r in rows]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0
        if slope <= 0:   # noisy: the largest size alone
            slope = max(ys[i] / xs[i] for i in range(n))
        lat = max(0.0, my - slope * mx)
        print("%s,%s,%.3f,%.4f" % (ranks, kind, lat * 1e6, 1e-9 / slope))


def last(path):
    try:
        r = list(csv.DictReader(open(path)))
        return r[-1] if r else None
    except OSError:
        return None


def evaluate(a):
    tol = float(a.tol) / 100
    real = {}
    for r in csv.DictReader(open(a.real)):
        real.setdefault((int(r["ranks"]), r["dispatch"]), {})[int(r["round"])] = last(r["real_csv"])
    sims = {}
    for r in csv.DictReader(open(a.sims)):
        row = last(r["run_csv"]) if r["status"] == "ok" else None
        sims.setdefault((int(r["ranks"]), r["dispatch"], r["variant"]), {})[int(r["round"])] = row
    order = {"ring": 0, "token": 1, "a2a": 2}
    out, all_ok = [], True
    for (n, d) in sorted(real, key=lambda k: (k[0], order[k[1]])):
        for ps, col in (("fwd", "fwd_ms"), ("bwd", "bwd_ms")):
            rounds = sorted(real[(n, d)])
            rv = {i: float(real[(n, d)][i][col]) for i in rounds if real[(n, d)][i]}
            hist = sims.get((n, d, "history"), {})
            hv = {i: float(hist[i][col]) for i in rounds if hist.get(i)}
            errs = [hv[i] / rv[i] - 1 for i in rounds if i in hv and i in rv]
            med_real = statistics.median(rv.values()) if rv else None
            err = statistics.median(errs) if errs else None
            ok = err is not None and len(errs) == len(rounds) and abs(err) <= tol
            all_ok &= ok
            row = {"ranks": n, "dispatch": d, "pass": ps, "rounds": len(rv),
                   "real_ms": "%.3f" % med_real if rv else "",
                   "real_min_ms": "%.3f" % min(rv.values()) if rv else "",
                   "real_max_ms": "%.3f" % max(rv.values()) if rv else "",
                   "sim_ms": "%.3f" % statistics.median(hv.values()) if hv else "",
                   "rel_err": "" if err is None else "%.4f" % err,
                   "rel_err_min": "%.4f" % min(errs) if errs else "",
                   "rel_err_max": "%.4f" % max(errs) if errs else "",
                   "within_tol": "yes" if ok else "no",
                   "unexplained_ms": "%.3f" % (med_real - statistics.median(hv.values())) if rv and hv else ""}
            for v in ("analytic", "raw"):
                s = sims.get((n, d, v), {}).get(0)
                x = float(s[col]) if s else None
                row["sim_%s_ms" % v] = "" if x is None else "%.3f" % x
                row["rel_err_%s" % v] = "" if x is None or not med_real else "%.4f" % (x / med_real - 1)
            out.append(row)
    cols = ["ranks", "dispatch", "pass", "rounds", "real_ms", "real_min_ms", "real_max_ms", "sim_ms", "rel_err",
            "rel_err_min", "rel_err_max", "within_tol", "unexplained_ms", "sim_analytic_ms", "rel_err_analytic", "sim_raw_ms",
            "rel_err_raw"]
    with open(a.out + "/sim_check.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(out)
    return out, all_ok


def meta(a, out, all_ok):
    tol = float(a.tol)
    lk = {}
    for l in csv.DictReader(open(a.links)):
        lk.setdefault(l["ranks"], {})[l["kind"]] = (float(l["latency_us"]), float(l["bandwidth_gbs"]))
    mx = lambda k: max((abs(float(r[k])) for r in out if r[k]), default=None)
    pct = lambda x: "n/a" if x is None else "%.0f%%" % (100 * x)
    text = [
        "Command: `%s` (%s, %s cores; 1-minute load average %s at the start and %s at the end: other jobs "
        "shared the machine, and the real runs and the calibration measured it as it was)." % (
            a.cmd, a.date, a.cores, a.load[0], a.load[1]),
        "",
        "- Layer: `%s`. Real: %s rounds, interleaved (every case once per round), each a warm-up and one "
        "timed pass (`scripts/mpirun.sh`, one StarPU CPU worker per rank) recorded by `bench/sim/calibrate.sh` "
        "(StarPU history perfmodels, every sample kept); real ms is the median over rounds, with the "
        "rounds' range." % (a.layer, a.rounds),
        "- history (the calibrated simulation): each round's recorded perfmodels replayed "
        "(codelets/sim_cost.c: a task of a recorded footprint takes its recorded mean, others a line "
        "fitted over the codelet's entries) on `scripts/sim/platform.py --cpu` with plain MPI's measured "
        "link; error = median over rounds of (simulated / real of the same round - 1), with the rounds' "
        "range. The tolerance (%g%%) applies to it. Unexplained = real - simulated (medians): the time "
        "neither the recorded tasks nor the link account for." % tol,
        "- analytic: the roofline rates measured on one core just before (bench/sim/cpu_rates.c: "
        "RMOE_SIM_CPU_GFLOPS=%s, RMOE_SIM_CPU_GBS=%s, RMOE_SIM_CPU_FLOOR_US=%s) times min(1, cores/ranks), "
        "StarPU-MPI's hop as the link; raw: the same rates on a dedicated core per rank and plain MPI's "
        "link. Both against the real median." % (a.gflops, a.gbs, a.floor_us),
        "- Links (bench/hop/hop_bench.c, same launcher and rank count, latency + bytes/bandwidth over "
        "64 KB - 4 MB hops): " + "; ".join(
            "%s ranks: plain MPI %.0f us + %.2f GB/s, StarPU-MPI hop %.0f us + %.2f GB/s" %
            (n, v["mpi"][0], v["mpi"][1], v["starpu"][0], v["starpu"][1]) for n, v in sorted(lk.items())) + ".",
    ]
    after = ["Largest error: history %s, analytic %s, raw %s. %s" % (
        pct(mx("rel_err")), pct(mx("rel_err_analytic")), pct(mx("rel_err_raw")),
        "Every calibrated (history) case is within the tolerance." if all_ok else
        "Not every calibrated (history) case is within the tolerance (rows marked no).")]
    m = {"command": a.cmd, "date": a.date, "tolerance_pct": tol, "cores": int(a.cores), "cpu_gflops": float(a.gflops),
         "cpu_gbs": float(a.gbs), "floor_us": float(a.floor_us), "links": lk, "text": text, "after": after,
         "all_within_tolerance": all_ok, "rounds": int(a.rounds)}
    with open(a.out + "/sim_check.meta.json", "w") as f:
        json.dump(m, f, indent=1)
        f.write("\n")
    print("sim/check_real.sh: %s" % after[0])


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "links":
        links(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["eval"])
    for k in ("real", "sims", "links", "out", "tol", "cores", "gflops", "gbs", "floor-us", "date", "layer",
              "rounds", "cmd"):
        ap.add_argument("--" + k, required=True)
    ap.add_argument("--load", nargs=2, required=True)
    a = ap.parse_args()
    out, all_ok = evaluate(a)
    meta(a, out, all_ok)
    return 0 if all_ok else 3


if __name__ == "__main__":
    sys.exit(main())
