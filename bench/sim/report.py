#!/usr/bin/python3
"""Reports of the simulation benchmarks (bench/sim/run.sh, bench/sim/check_real.sh).

  report.py ep --rows ROWS --out DIR --name NAME --cmd CMD --date DATE --cluster FILE
               --sched S --preset P --scale S --gpu-tflops R --gpu-gbs B --floor-us U --wall SEC
               --commit C --transport T --dtype D --repeat R
      the EP sweep: DIR/NAME.csv (every row with its commit, transport, dtype,
      scale, policy, platform and bound_ms), DIR/NAME.png, DIR/NAME.meta.json,
      then DIR/sim.md
  report.py md --out DIR
      rewrites DIR/sim.md from the sweep's and the check's files found in DIR

Standard library, numpy and matplotlib (/usr/bin/python3).
"""
import argparse
import csv
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# What the bench reports share (bench/lib/mdreport.py); the fixed prose of
# sim.md is docs/report-text/sim.md.
sys.path.insert(0, os.path.join(ROOT, "bench", "lib"))
import mdreport  # noqa: E402

EP_COLUMNS = ["ep", "dispatch", "status", "commit", "transport", "dtype", "scale", "policy", "platform",
              "fwd_s", "bwd_s", "fwd_bwd_s", "bound_ms", "bound_compute_ms", "bound_wire_ms",
              "bound_staging_ms", "bound_waiting_ms", "serial_ms", "model_peak_fwd_bytes",
              "model_peak_bwd_bytes", "resident_bytes", "sent_bytes", "sent_fwd_bytes", "sent_bwd_bytes",
              "gpu_exec_ms", "hidden", "ffn", "experts", "topk", "tokens", "plan_hop_bytes_fwd",
              "plan_hop_transfer_ms_fwd", "plan_hop_bytes_bwd", "plan_hop_transfer_ms_bwd", "nodes", "wall_s"]
# What a sweep's row takes from the run's CSV as it is.
RUN_COLUMNS = ("model_peak_fwd_bytes", "model_peak_bwd_bytes", "resident_bytes", "sent_bytes", "sent_fwd_bytes",
               "sent_bwd_bytes", "hidden", "ffn", "experts", "topk", "tokens")
# Any dispatcher `relaymoe run --dispatch` accepts is reported; these are the
# known ones' order, labels and colours (others come last, in grey).
ORDER = {"ring": 0, "ring-striped": 1, "token": 2, "token-striped": 3, "a2a": 4, "a2a-megatron": 5,
         "a2a-deepep": 6}
LABEL = {"a2a": "all-to-all (lean)", "a2a-megatron": "all-to-all (Megatron)", "a2a-deepep": "all-to-all (DeepEP)",
         "ring": "ring, expert routing", "ring-striped": "ring, striped crossing hops", "token": "ring, token routing",
         "token-striped": "ring, token routing, striped"}
COLOR = {"a2a": "tab:red", "a2a-megatron": "tab:orange", "a2a-deepep": "tab:purple", "ring": "tab:blue",
         "ring-striped": "tab:cyan", "token": "tab:green", "token-striped": "tab:olive"}
RINGS = ("ring", "ring-striped", "token", "token-striped")
# run.sh's variants: the app's dispatcher each runs (with its stripes).
RUNS_AS = {"ring-striped": "ring", "token-striped": "token"}
PAPER_RATIO_EP8 = 2.0   # the paper's Fig. 10: ring about 2x faster than all-to-all at EP=8
SLOW = 1.5              # a case this many times its bound is explained in the report
SWEEPS = (("sim_ep", "EP sweep, transport gpudirect (the paper's Fig. 10 analogue)"),
          ("sim_ep_staged", "EP sweep, transport staged (StarPU-MPI 1.3's host staging)"))
# Written only where their CSV exists: the full-size sweep, and EP 64 at the
# largest scale this host's memory allows (sim_notes.md gives the commands).
OPTIONAL_SWEEPS = (("sim_ep_full", "EP sweep at full size, transport gpudirect"),
                   ("sim_ep_64", "EP 64 at the largest scale that fits this host, transport gpudirect"))
# Measured notes kept by hand beside the generated tables: the check's
# exceptions explained, and what a simulated run costs on this host.
HAND_NOTES = ("sim_check_notes.md", "sim_profile.md")


# ---- load ----

def simplatform():
    """scripts/sim/platform.py (its name would shadow the standard module)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("rmoe_sim_platform",
                                                  os.path.join(ROOT, "scripts", "sim", "platform.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def read_last_row(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else None


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_csv(path):
    try:
        with open(path) as f:
            return list(csv.DictReader(f))
    except OSError:
        return None


def read_lines(path):
    """A text file's lines, None where it does not exist."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return [line.rstrip("\n") for line in f]


def gpu_exec_ms(log, iterations):
    """StarPU's worker statistics (STARPU_PROFILING=1, STARPU_WORKER_STATS=1):
    the busiest rank's GPU executing time over the run, per iteration (the
    warm-up and each timed repetition run the same graphs; start-up executes
    no task). None without statistics."""
    pat = re.compile(r"executing: ([0-9.]+) ms")
    best, cur_cuda = None, False
    try:
        lines = open(log, errors="replace").read().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("CUDA "):
            cur_cuda = True
        elif line.startswith("CPU "):
            cur_cuda = False
        m = pat.search(line)
        if m and cur_cuda:
            v = float(m.group(1))
            best = v if best is None or v > best else best
    return None if best is None else best / iterations


def load_runs(rows_path, iterations):
    """The sweep's runs as run.sh lists them (ROWS: ep, dispatch, status,
    wall_s, run_csv, plan_json, log), each with what it wrote: the last row
    of its CSV and its GPU executing time (completed runs only) and the
    planner's answer (None without one)."""
    with open(rows_path) as f:
        runs = list(csv.DictReader(f))
    for r in runs:
        if r["status"] == "ok":
            r["csv"] = read_last_row(r["run_csv"])
            r["gpu_exec_ms"] = gpu_exec_ms(r["log"], iterations)
        r["plan"] = load_json(r["plan_json"])
    return runs


def load_sweep(out, name):
    """(rows, meta) of sweep NAME in DIR, each None where missing."""
    return read_csv(os.path.join(out, name + ".csv")), load_json(os.path.join(out, name + ".meta.json"))


def load_results(out):
    """Everything sim.md is written from, as found in DIR."""
    exists = lambda name: os.path.exists(os.path.join(out, name))  # noqa: E731
    names = ["sim_ep", "sim_ep_staged"] + [n for n, _ in OPTIONAL_SWEEPS if exists(n + ".csv")]
    return {"notes": read_lines(os.path.join(out, "sim_notes.md")),
            "probe": read_lines(os.path.join(out, "sim_probe.txt")),
            "sweeps": {n: load_sweep(out, n) for n in names},
            "check": (read_csv(os.path.join(out, "sim_check.csv")),
                      load_json(os.path.join(out, "sim_check.meta.json"))),
            "hand_notes": [lines for lines in (read_lines(os.path.join(out, n)) for n in HAND_NOTES)
                           if lines is not None]}


# ---- compute ----

def is_ring(d):
    return d in RINGS


def bound(row, cl, transport, ep, plan=None):
    """The time no schedule of this case could beat on the simulated platform,
    in ms, and its parts. Per pass (forward, then backward: timed apart):
      wire: the bytes the busiest rank sends over the link they must cross at
        that link's bandwidth, plus one latency per hop along the ring. A
        ring rank sends everything to its successor, so over the slowest
        ring edge (the network adapter as soon as the ring leaves a node).
        An all-to-all rank sends (EP-1)/EP of its rows, spread evenly over its
        peers (the simulation draws uniform loads): (EP-R)/(EP-1) of its bytes
        leave the node through its adapter, 1/(EP-1) go to each node-mate
        over their NVLink pair link; the larger of the two.
      staging (transport staged only): the same bytes over the rank's PCIe
        link (StarPU-MPI 1.3 copies a device buffer to host memory to send
        it, and a received one back to use it).
    and for both passes together
      compute: the busiest GPU's executing time per iteration (StarPU's worker
        statistics: every task at the cost model's rate, floor included).
    A perfect schedule overlaps all of them: bound = max(compute, sum over
    passes of max(wire, staging)). serial: the same parts one after another
    (no overlap at all), a reference for how much overlap a run achieved.
    The striped rings (ring-striped, token-striped) send the flat ring's
    cargo (the plan's bytes of ring or token) with each node-crossing hop in
    S stripes (the plan's
    stripes), each through an adapter of its own, relayed over NVLink at both
    ends: per pass the slower of cargo / (S x adapter) and cargo over an
    NVLink edge, plus per hop the adapter's latency and two NVLink ones. Its
    measured bytes hold the relayed pieces too, so they are not its wire."""
    rpn = cl["ranks_per_node"]
    nic_bw, nic_lat = cl["link"]["network"]
    nv_bw, nv_lat = cl["link"][cl["gpu_link"]]
    pcie_bw, _ = cl["link"]["pcie"]
    multi = ep > rpn
    wire = staging = 0.0
    passes = {}
    for p in ("fwd", "bwd"):
        sent = float(row["sent_%s_bytes" % p] or 0)
        if row["dispatch"] in RUNS_AS and plan and multi:
            tb = plan["time_bound"]
            flat = RUNS_AS[row["dispatch"]]
            cargo = float(tb["dispatchers"][flat]["forward" if p == "fwd" else "backward"]["bytes"])
            S = int(tb.get("stripes", 1))
            w = (max(cargo / (S * nic_bw * 1e9), cargo / (nv_bw * 1e9)) * 1e3
                 + (ep - 1) * (nic_lat + 2 * nv_lat) * 1e-3)
            sent = cargo
        elif is_ring(row["dispatch"]):
            bw, lat = (nic_bw, nic_lat) if multi else (nv_bw, nv_lat)
            w = sent / (bw * 1e9) * 1e3 + (ep - 1) * lat * 1e-3
        else:
            remote = sent * (ep - rpn) / (ep - 1) if multi else 0.0
            local = sent / (ep - 1)
            w = max(remote / (nic_bw * 1e9) * 1e3 + nic_lat * 1e-3 if multi else 0.0,
                    local / (nv_bw * 1e9) * 1e3 + nv_lat * 1e-3)
        st = sent / (pcie_bw * 1e9) * 1e3 if transport == "staged" else 0.0
        wire += w
        staging += st
        passes[p] = max(w, st)
    comp = float(row["gpu_exec_ms"] or 0)
    b = max(comp, passes["fwd"] + passes["bwd"])
    return b, comp, wire, staging, comp + wire + staging


def sweep_row(r, a, cl):
    """One run's row of the sweep's CSV: what it ran, its simulated times,
    its bound and parts, and the planner's hop for the ring modes."""
    ep, d = int(r["ep"]), r["dispatch"]
    row = {k: "" for k in EP_COLUMNS}
    row.update(ep=ep, dispatch=d, status=r["status"], wall_s="%.1f" % float(r["wall_s"]),
               commit=a.commit, transport=a.transport, dtype=a.dtype, scale=a.scale, policy=a.sched,
               platform=cl["name"], nodes=(ep + cl["ranks_per_node"] - 1) // cl["ranks_per_node"])
    if r["status"] == "ok":
        c = r["csv"]
        if c.get("dtype") != a.dtype:
            sys.exit("report.py: %s ran with dtype %s, the sweep says %s" % (r["run_csv"], c.get("dtype"), a.dtype))
        fw, bw = float(c["fwd_ms"]) / 1e3, float(c["bwd_ms"]) / 1e3
        row.update(fwd_s="%.6f" % fw, bwd_s="%.6f" % bw, fwd_bwd_s="%.6f" % (fw + bw),
                   **{k: c[k] for k in RUN_COLUMNS})
        ex = r["gpu_exec_ms"]
        row["gpu_exec_ms"] = "" if ex is None else "%.4f" % ex
        b, comp, wire, st, serial = bound(row, cl, a.transport, ep, r["plan"])
        row.update(bound_ms="%.4f" % b, bound_compute_ms="%.4f" % comp, bound_wire_ms="%.4f" % wire,
                   bound_staging_ms="%.4f" % st, bound_waiting_ms="%.4f" % ((fw + bw) * 1e3 - b),
                   serial_ms="%.4f" % serial)
    # The planner's hop (same element type as the run) over the slowest ring edge.
    pj = r["plan"]
    if is_ring(d) and pj:
        mode = "token" if RUNS_AS.get(d, d) == "token" else "expert"
        for ph, suf in (("forward", "fwd"), ("backward", "bwd")):
            h = pj["hops"][mode][ph]
            row["plan_hop_bytes_" + suf] = h["bytes"]
            row["plan_hop_transfer_ms_" + suf] = "%.4f" % h["transfer_ms"]
    return row


def sweep_rows(runs, a, cl):
    rows = [sweep_row(r, a, cl) for r in runs]
    rows.sort(key=lambda x: (x["ep"], ORDER.get(x["dispatch"], 9), x["dispatch"]))
    return rows


def sweep_meta(a, cl):
    """The sweep's meta.json: how it ran, on what platform, at what rates."""
    links = {k: {"bandwidth_gbs": v[0], "latency_us": v[1], "from_file": cl.get("link_from_file_" + k, False)}
             for k, v in cl["link"].items()}
    return {"command": a.cmd, "date": a.date, "commit": a.commit, "transport": a.transport, "dtype": a.dtype,
            "cluster": cl["name"], "cluster_file": os.path.relpath(os.path.abspath(a.cluster), ROOT),
            "devices_per_node": cl["devices_per_node"], "ranks_per_node": cl["ranks_per_node"],
            "gpu_link": cl["gpu_link"], "device_memory_bytes": cl["memory"], "links": links,
            "sched": a.sched, "preset": a.preset, "scale": float(a.scale),
            "rates": {"RMOE_SIM_GPU_TFLOPS": float(a.gpu_tflops), "RMOE_SIM_GPU_GBS": float(a.gpu_gbs),
                      "RMOE_SIM_GPU_FLOOR_US": float(a.floor_us)},
            "wall_s": int(a.wall), "history": a.history}


def ok_rows(rows):
    return [r for r in rows if r["status"] == "ok"]


def by(rows, d, key="fwd_bwd_s"):
    return {int(r["ep"]): float(r[key]) for r in ok_rows(rows) if r["dispatch"] == d and r[key] != ""}


def dispatchers(rows):
    return sorted({r["dispatch"] for r in rows}, key=lambda x: (ORDER.get(x, 9), x))


def ms(x, key):
    """A row's seconds column in ms, "" where empty."""
    return x[key] and float(x[key]) * 1e3


def case_figures(x, ring, ringb):
    """One row of a sweep's table: ratios over the ring, simulated over the
    bound, the model's peak; and whether it is slow (more than SLOW x its
    bound) or below its bound."""
    ok, e = x["status"] == "ok", int(x["ep"])
    f = {"ok": ok, "ep": e, "ratio": "", "bratio": "", "peak": None, "sim_bound": "", "slow": False, "below": False}
    if ok and not is_ring(x["dispatch"]) and e in ring:
        f["ratio"] = "%.2fx" % (float(x["fwd_bwd_s"]) / ring[e])
        f["bratio"] = "%.2fx" % (float(x["bound_ms"]) / ringb[e])
    if ok:
        f["peak"] = max(float(x["model_peak_fwd_bytes"] or 0), float(x["model_peak_bwd_bytes"] or 0))
        sim, b = float(x["fwd_bwd_s"]) * 1e3, float(x["bound_ms"])
        f["sim_bound"] = "%.2fx" % (sim / b)
        f["slow"], f["below"] = sim > SLOW * b, sim < b
    return f


def slow_case(x):
    """Why case x lies more than SLOW x above its bound, in numbers: its
    parts, how much of them it overlapped, and its excess per ring hop or
    per exchanged block."""
    ep, d = int(x["ep"]), x["dispatch"]
    sim = float(x["fwd_bwd_s"]) * 1e3
    b, comp, wire, st = (float(x[k]) for k in ("bound_ms", "bound_compute_ms", "bound_wire_ms", "bound_staging_ms"))
    serial = float(x["serial_ms"])
    overlap = "longer" if sim > serial else "hardly" if sim >= 0.9 * serial else "overlapped"
    # a ring partition makes 2 (EP-1) hops over both passes; an all-to-all
    # rank exchanges dispatch and combine blocks with EP-1 peers in each
    units = 2 * (ep - 1) if is_ring(d) else 4 * (ep - 1)
    return {"ep": ep, "dispatch": d, "sim": sim, "bound": b, "compute": comp, "wire": wire, "staging": st,
            "serial": serial, "overlap": overlap, "excess": sim - b, "units": units}


def paper_figures(rows, srows):
    """Each all-to-all over the ring at every EP of the gpudirect sweep, and
    the staged sweep's beside it at the EPs both ran."""
    ring, ringb = by(rows, "ring"), by(rows, "ring", "bound_ms")
    eps = sorted(ring)
    rc, rw = by(rows, "ring", "bound_compute_ms"), by(rows, "ring", "bound_wire_ms")
    table = []
    for d in (d for d in dispatchers(ok_rows(rows)) if not is_ring(d)):
        t, b = by(rows, d), by(rows, d, "bound_ms")
        comp, wire = by(rows, d, "bound_compute_ms"), by(rows, d, "bound_wire_ms")
        table += [(e, d, t[e] / ring[e], b[e] / ringb[e], rc[e], rw[e], comp[e], wire[e]) for e in eps if e in t]
    a2a, a2ab = by(rows, "a2a"), by(rows, "a2a", "bound_ms")
    ends = sorted({e for e in (8, max(eps)) if e in a2a}) if eps else []
    sr, sa = by(srows, "ring"), by(srows, "a2a")
    common = [e for e in sorted(sr) if e in sa and e in ring and e in a2a]
    return {"ring": ring, "table": table,
            "ends": [(e, a2a[e] / ring[e], a2ab[e] / ringb[e]) for e in ends],
            "staged": [(e, sa[e] / sr[e], a2a[e] / ring[e], (sr[e] - ring[e]) * 1e3, (sa[e] - a2a[e]) * 1e3)
                       for e in common]}


# ---- render ----

def text(section, **values):
    return mdreport.text("sim", section, **values)


def text1(section, **values):
    return mdreport.text1("sim", section, **values)


def fnum(x, fmt="%.4g"):
    return "" if x is None or x == "" else fmt % float(x)


def gib(x):
    return "" if x in (None, "") else "%.2f" % (float(x) / 2 ** 30)


def write_sweep(out, name, rows, meta):
    """NAME.csv, NAME.meta.json and NAME.png of a sweep."""
    with open(os.path.join(out, name + ".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=EP_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out, name + ".meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    plot_ep(rows, meta, os.path.join(out, name + ".png"))


def plot_ep(rows, meta, path):
    plt = mdreport.pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.4))
    eps = sorted({int(r["ep"]) for r in rows})
    for d in dispatchers(ok_rows(rows)):
        t, b = by(rows, d), by(rows, d, "bound_ms")
        x = sorted(t)
        c = COLOR.get(d, "grey")
        ax[0].plot(x, [t[e] * 1e3 for e in x], "o-", color=c, label=LABEL.get(d, d) + ": simulated")
        ax[0].plot(x, [b[e] for e in x if e in b], "x:", color=c, alpha=0.7, label=LABEL.get(d, d) + ": bound")
        pk = {int(r["ep"]): max(float(r["model_peak_fwd_bytes"] or 0), float(r["model_peak_bwd_bytes"] or 0))
              for r in ok_rows(rows) if r["dispatch"] == d}
        ax[2].plot(sorted(pk), [pk[e] / 2 ** 30 for e in sorted(pk)], "o-", color=c, label=LABEL.get(d, d))
    ring, ringb = by(rows, "ring"), by(rows, "ring", "bound_ms")
    for d in (d for d in dispatchers(ok_rows(rows)) if not is_ring(d)):
        t, b = by(rows, d), by(rows, d, "bound_ms")
        x = sorted(e for e in t if e in ring)
        c = COLOR.get(d, "grey")
        ax[1].plot(x, [t[e] / ring[e] for e in x], "o-", color=c, label=LABEL.get(d, d) + ": simulated")
        ax[1].plot(x, [b[e] / ringb[e] for e in x if e in b and e in ringb], "x:", color=c,
                   label=LABEL.get(d, d) + ": bounds")
    if meta["transport"] == "gpudirect":
        ax[1].plot([8], [PAPER_RATIO_EP8], "k*", ms=10, label="paper, Fig. 10 (~2x at EP=8)")
    ax[1].axhline(1.0, color="grey", lw=0.8)
    titles = ["forward+backward latency: simulated and bound", "all-to-all time / ring time (fwd+bwd)",
              "peak memory per GPU (memory model)"]
    for i, ylabel in enumerate(["ms", "ratio", "GiB"]):
        ax[i].set_xscale("log", base=2)
        ax[i].set_xticks(eps)
        ax[i].set_xticklabels([str(e) for e in eps])
        ax[i].set_xlabel("EP (GPUs, one rank each)")
        ax[i].set_ylabel(ylabel)
        ax[i].set_title(titles[i], fontsize=10)
        ax[i].grid(alpha=0.3)
        if ax[i].get_legend_handles_labels()[0]:
            ax[i].legend(fontsize=6)
    ax[0].set_yscale("log")
    ax[1].set_ylim(bottom=0)
    sc = "" if meta["scale"] == 1 else " / scale %g" % meta["scale"]
    fig.suptitle("%s%s, %s, transport %s, %s, StarPU %s, commit %s" %
                 (meta["preset"], sc, meta["cluster"], meta["transport"], meta["dtype"], meta["sched"],
                  meta["commit"][:10]), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def why_slow(case, floor):
    """One line: a case simulated more than SLOW x its bound, and why in numbers."""
    c = case
    sim, serial, excess = c["sim"], c["serial"], c["excess"]
    parts = ["EP=%d %s: %.2f ms simulated, %.2fx its bound %.2f ms (GPU executing %.2f ms, wire %.2f ms, "
             "staging %.2f ms; the three one after another %.2f ms)" % (
                 c["ep"], c["dispatch"], sim, sim / c["bound"], c["bound"], c["compute"], c["wire"], c["staging"],
                 serial)]
    if c["overlap"] == "longer":
        parts.append(text1("slow-longer", excess="%.2f" % (sim - serial)))
    elif c["overlap"] == "hardly":
        parts.append("the simulated time is %.0f%% of the parts' sum: the run hardly overlapped compute with "
                     "transfers" % (100 * sim / serial))
    else:
        parts.append("the run overlapped %.2f ms of the %.2f ms the parts would take one after another"
                     % (serial - sim, serial - c["bound"]))
    per = "%.0f" % (1e3 * excess / c["units"])
    if is_ring(c["dispatch"]):
        parts.append(text1("slow-ring", excess="%.2f" % excess, per_hop=per, hops=c["units"], floor="%g" % floor))
    else:
        parts.append(text1("slow-a2a", excess="%.2f" % excess, per_block=per, blocks=c["units"], floor="%g" % floor))
    return "; ".join(parts) + "."


def md_ep_setup(rows, meta):
    """The sweep's command, layer, platform, cost model and bound."""
    L = meta["links"]
    sc = "full size" if meta["scale"] == 1 else "H, F and tokens divided by %g" % meta["scale"]
    r0 = next((r for r in rows if r["status"] == "ok"), None)
    st = (text1("transport-staged", bandwidth="%g" % L["pcie"]["bandwidth_gbs"], latency="%g" % L["pcie"]["latency_us"])
          if meta["transport"] == "staged" else text1("transport-gpudirect"))
    lines = ["Command: `%s` (%s, commit %s; %d s of wall time on this 2-core machine)." %
             (meta["command"], meta["date"], meta["commit"], meta["wall_s"]), "",
             "- Layer: %s, %s%s, forward and backward of one MoE layer, %s tensors on every link and in every "
             "kernel's bytes; GEMMs at the %s rate." %
             (meta["preset"], sc, (": H=%s F=%s E=%s K=%s, %s tokens per GPU" %
                                   (r0["hidden"], r0["ffn"], r0["experts"], r0["topk"], r0["tokens"])) if r0 else "",
              meta["dtype"], meta["dtype"]),
             "- Platform: `%s` through `scripts/sim/platform.py`: %d GPUs per node, one rank per GPU; %s inside a "
             "node %g GB/s, %g us per rank pair; network %g GB/s, %g us per GPU adapter, non-blocking fabric; "
             "%.0f GiB per GPU. Transport %s." % (meta["cluster_file"], meta["devices_per_node"], meta["gpu_link"],
                                                 L[meta["gpu_link"]]["bandwidth_gbs"], L[meta["gpu_link"]]["latency_us"],
                                                 L["network"]["bandwidth_gbs"], L["network"]["latency_us"],
                                                 meta["device_memory_bytes"] / 2 ** 30, st)]
    r = meta["rates"]
    if meta.get("history"):
        lines.append("- Cost model: StarPU history perfmodels recorded by a real run, replayed (RMOE_SIM_HISTORY): "
                     "%s. Scheduler: %s." % (meta["history"], meta["sched"]))
    else:
        lines.append("- Cost model (codelets/sim_cost.c, a roofline per task): GEMMs at RMOE_SIM_GPU_TFLOPS=%g "
                     "TFLOP/s (the file's %s rate), memory-bound kernels at RMOE_SIM_GPU_GBS=%g GB/s, "
                     "RMOE_SIM_GPU_FLOOR_US=%g us per task. Scheduler: %s." %
                     (r["RMOE_SIM_GPU_TFLOPS"], meta["dtype"], r["RMOE_SIM_GPU_GBS"], r["RMOE_SIM_GPU_FLOOR_US"],
                      meta["sched"]))
    return lines + text("bound") + [""]


def md_ep_row(x, f):
    return mdreport.row([
        f["ep"], x["nodes"], x["dispatch"], fnum(ms(x, "fwd_s"), "%.2f"), fnum(ms(x, "bwd_s"), "%.2f"),
        fnum(ms(x, "fwd_bwd_s"), "%.2f"), fnum(x["bound_ms"], "%.2f"), f["sim_bound"],
        "%s / %s / %s" % (fnum(x["bound_compute_ms"], "%.2f"), fnum(x["bound_wire_ms"], "%.2f"),
                          fnum(x["bound_staging_ms"], "%.2f")) if f["ok"] else "",
        fnum(x["bound_waiting_ms"], "%.2f"), f["ratio"], f["bratio"], gib(f["peak"]) if f["ok"] else "",
        gib(x["sent_bytes"]), x["wall_s"], x["status"]])


def md_ep(name, title, rows, meta):
    """A sweep's section: its setup, its table, the cases below or far above
    their bound."""
    lines = ["## " + title, ""]
    if not rows or not meta:
        return lines + ["Not run yet: `bench/sim/all.sh` writes it.", ""]
    lines += md_ep_setup(rows, meta)
    lines += ["| EP | nodes | dispatcher | fwd ms | bwd ms | fwd+bwd ms | bound ms | sim/bound | compute / wire / "
              "staging ms | waiting ms | a2a/ring | bound a2a/ring | model peak GiB | sent GiB | wall s | status |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    ring, ringb = by(rows, "ring"), by(rows, "ring", "bound_ms")
    figures = [(x, case_figures(x, ring, ringb)) for x in rows]
    lines += [md_ep_row(x, f) for x, f in figures]
    lines += ["", "![EP sweep](%s.png)" % name, ""]
    below = [x for x, f in figures if f["below"]]
    if below:
        lines += ["**Below its bound (the bound or the run is wrong):** " + ", ".join(
            "EP=%s %s" % (x["ep"], x["dispatch"]) for x in below) + ".", ""]
    slow = [x for x, f in figures if f["slow"]]
    if slow:
        floor = meta["rates"]["RMOE_SIM_GPU_FLOOR_US"]
        lines += ["Cases simulated more than %gx their bound:" % SLOW, ""]
        lines += ["- " + why_slow(slow_case(x), floor) for x in slow] + [""]
    for line in meta.get("notes", []):
        lines += [line, ""]
    return lines


def md_paper(rows, meta, srows, title):
    """Ring over all-to-all at EP 8 and the largest EP beside the paper's
    ~2x; srows (the staged sweep's, or []) adds the staged ratios."""
    lines = ["## " + title, ""]
    f = paper_figures(rows, srows)
    if len(f["ring"]) < 1:
        return lines + ["No gpudirect ring runs yet.", ""]
    lines += text("paper-intro", paper="%g" % PAPER_RATIO_EP8, dtype=meta.get("dtype"), preset=meta.get("preset"),
                  scale="full" if meta.get("scale") == 1 else "1/%g" % meta.get("scale", 0))
    lines += ["", "| EP | all-to-all | simulated a2a/ring | bound a2a/ring | ring: compute / wire ms | "
              "a2a: compute / wire ms |", "|---:|---|---:|---:|---|---|"]
    lines += ["| %d | %s | %.2fx | %.2fx | %.2f / %.2f | %.2f / %.2f |" % t for t in f["table"]]
    lines.append("")
    if f["ends"]:
        lines += text("paper-ends", simulated=", ".join("%.2fx at EP=%d" % (t, e) for e, t, _ in f["ends"]),
                      bounds=", ".join("%.2fx" % b for _, _, b in f["ends"])) + [""]
    if f["staged"]:
        s = f["staged"]
        lines += text("paper-staged", staged=", ".join("%.2fx at EP=%d" % (x[1], x[0]) for x in s),
                      gpudirect=", ".join("%.2fx" % x[2] for x in s), ring="/".join("%.2f" % x[3] for x in s),
                      a2a="/".join("%.2f" % x[4] for x in s)) + [""]
    return lines


def md_check(rows, meta):
    lines = ["## Real versus simulated (CPU)", ""]
    if not rows or not meta:
        return lines + ["Not run yet: `bench/sim/check_real.sh` writes it.", ""]
    lines += meta.get("text", []) + [""]
    lines += ["| ranks | dispatcher | pass | real ms (rounds' range) | calibrated sim ms | error (rounds' range) | "
              "within %g%% | unexplained ms | analytic sim ms | analytic error | raw sim ms | raw error |" %
              meta["tolerance_pct"], "|---:|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    pct = lambda x: ("%+.1f%%" % (100 * float(x))) if x else ""  # noqa: E731
    for r in rows:
        lines.append("| %s | %s | %s | %s (%s-%s) | %s | %s (%s to %s) | %s | %s | %s | %s | %s | %s |" % (
            r["ranks"], r["dispatch"], r["pass"], fnum(r["real_ms"], "%.1f"), fnum(r["real_min_ms"], "%.1f"),
            fnum(r["real_max_ms"], "%.1f"), fnum(r["sim_ms"], "%.1f"), pct(r["rel_err"]), pct(r["rel_err_min"]),
            pct(r["rel_err_max"]), r["within_tol"], fnum(r.get("unexplained_ms"), "%.1f"),
            fnum(r.get("sim_analytic_ms"), "%.1f"),
            pct(r.get("rel_err_analytic")), fnum(r.get("sim_raw_ms"), "%.1f"), pct(r.get("rel_err_raw"))))
    return lines + [""] + meta.get("after", []) + [""]


def markdown(res):
    """sim.md's lines from what load_results found."""
    lines = ["# Simulated runs: StarPU-SimGrid over SMPI", "", *text("intro"), ""]
    if res["notes"] is not None:
        lines += res["notes"] + [""]
    if res["probe"] is not None:
        lines += ["## Platform check", "", *text("probe"), "", "```"] + res["probe"] + ["```", ""]
    sweeps = res["sweeps"]
    rows, meta = sweeps["sim_ep"]
    lines += md_paper(rows or [], meta or {}, sweeps["sim_ep_staged"][0] or [],
                      "Against the paper (Fig. 10), transport gpudirect")
    if "sim_ep_full" in sweeps:
        rows, meta = sweeps["sim_ep_full"]
        lines += md_paper(rows or [], meta or {}, [], "Against the paper at full size, transport gpudirect")
    for name, title in SWEEPS + tuple(o for o in OPTIONAL_SWEEPS if o[0] in sweeps):
        lines += md_ep(name, title, *sweeps[name])
    lines += md_check(*res["check"])
    for note in res["hand_notes"]:
        lines += note + [""]
    return lines


def write_md(out):
    with open(os.path.join(out, "sim.md"), "w") as f:
        f.write("\n".join(markdown(load_results(out))).rstrip() + "\n")


# ---- the commands ----

def cmd_ep(a):
    cl = simplatform().parse_cluster(a.cluster)
    runs = load_runs(a.rows, int(a.repeat) + 1)
    rows, meta = sweep_rows(runs, a, cl), sweep_meta(a, cl)
    write_sweep(a.out, a.name, rows, meta)
    write_md(a.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="action", required=True)
    e = sub.add_parser("ep")
    for k in ("rows", "out", "name", "cmd", "date", "cluster", "sched", "preset", "scale", "gpu-tflops",
              "gpu-gbs", "floor-us", "wall", "commit", "transport", "dtype", "repeat"):
        e.add_argument("--" + k, required=True)
    e.add_argument("--history", default="", help="recorded perfmodels replayed instead of the roofline")
    m = sub.add_parser("md")
    m.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.action == "ep":
        cmd_ep(a)
    else:
        write_md(a.out)


if __name__ == "__main__":
    main()
