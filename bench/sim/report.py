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
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def simplatform():
    """scripts/sim/platform.py (its name would shadow the standard module)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("rmoe_sim_platform",
                                                  os.path.join(ROOT, "scripts", "sim", "platform.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

EP_COLUMNS = ["ep", "dispatch", "status", "commit", "transport", "dtype", "scale", "policy", "platform",
              "fwd_s", "bwd_s", "fwd_bwd_s", "bound_ms", "bound_compute_ms", "bound_wire_ms",
              "bound_staging_ms", "bound_waiting_ms", "serial_ms", "model_peak_fwd_bytes",
              "model_peak_bwd_bytes", "resident_bytes", "sent_bytes", "sent_fwd_bytes", "sent_bwd_bytes",
              "gpu_exec_ms", "hidden", "ffn", "experts", "topk", "tokens", "plan_hop_bytes_fwd",
              "plan_hop_transfer_ms_fwd", "plan_hop_bytes_bwd", "plan_hop_transfer_ms_bwd", "nodes", "wall_s"]
# Any dispatcher `relaymoe run --dispatch` accepts is reported; these are the
# known ones' order, labels and colours (others come last, in grey).
ORDER = {"ring": 0, "token": 1, "a2a": 2, "a2a-megatron": 3, "a2a-deepep": 4}
LABEL = {"a2a": "all-to-all (lean)", "a2a-megatron": "all-to-all (Megatron)", "a2a-deepep": "all-to-all (DeepEP)",
         "ring": "ring, expert routing", "token": "ring, token routing"}
COLOR = {"a2a": "tab:red", "a2a-megatron": "tab:orange", "a2a-deepep": "tab:purple", "ring": "tab:blue",
         "token": "tab:green"}
RINGS = ("ring", "token")
PAPER_RATIO_EP8 = 2.0   # the paper's Fig. 10: ring about 2x faster than all-to-all at EP=8


def is_ring(d):
    return d in RINGS


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


def fnum(x, fmt="%.4g"):
    return "" if x is None or x == "" else fmt % float(x)


def gpu_exec_ms(log, iterations):
    """StarPU's worker statistics (STARPU_PROFILING=1, STARPU_WORKER_STATS=1):
    the busiest rank's GPU executing time over the run, per iteration (the
    warm-up and each timed repetition run the same graphs; start-up executes
    no task). None without statistics."""
    import re
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


def bound(row, cl, transport, ep):
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
    (no overlap at all), a reference for how much overlap a run achieved."""
    rpn = cl["ranks_per_node"]
    nic_bw, nic_lat = cl["link"]["network"]
    nv_bw, nv_lat = cl["link"][cl["gpu_link"]]
    pcie_bw, _ = cl["link"]["pcie"]
    multi = ep > rpn
    wire = staging = 0.0
    for p in ("fwd", "bwd"):
        sent = float(row["sent_%s_bytes" % p] or 0)
        if is_ring(row["dispatch"]):
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
        row["_pass_" + p] = max(w, st)
    comp = float(row["gpu_exec_ms"] or 0)
    b = max(comp, row.pop("_pass_fwd") + row.pop("_pass_bwd"))
    return b, comp, wire, staging, comp + wire + staging


def cmd_ep(a):
    cl = simplatform().parse_cluster(a.cluster)
    out_rows = []
    with open(a.rows) as f:
        runs = list(csv.DictReader(f))
    for r in runs:
        ep, d = int(r["ep"]), r["dispatch"]
        row = {k: "" for k in EP_COLUMNS}
        row.update(ep=ep, dispatch=d, status=r["status"], wall_s="%.1f" % float(r["wall_s"]),
                   commit=a.commit, transport=a.transport, dtype=a.dtype, scale=a.scale, policy=a.sched,
                   platform=cl["name"], nodes=(ep + cl["ranks_per_node"] - 1) // cl["ranks_per_node"])
        if r["status"] == "ok":
            c = read_last_row(r["run_csv"])
            if c.get("dtype") != a.dtype:
                sys.exit("report.py: %s ran with dtype %s, the sweep says %s" % (r["run_csv"], c.get("dtype"), a.dtype))
            fw, bw = float(c["fwd_ms"]) / 1e3, float(c["bwd_ms"]) / 1e3
            row.update(fwd_s="%.6f" % fw, bwd_s="%.6f" % bw, fwd_bwd_s="%.6f" % (fw + bw),
                       model_peak_fwd_bytes=c["model_peak_fwd_bytes"],
                       model_peak_bwd_bytes=c["model_peak_bwd_bytes"], resident_bytes=c["resident_bytes"],
                       sent_bytes=c["sent_bytes"], sent_fwd_bytes=c["sent_fwd_bytes"],
                       sent_bwd_bytes=c["sent_bwd_bytes"], hidden=c["hidden"], ffn=c["ffn"],
                       experts=c["experts"], topk=c["topk"], tokens=c["tokens"])
            ex = gpu_exec_ms(r["log"], int(a.repeat) + 1)
            row["gpu_exec_ms"] = "" if ex is None else "%.4f" % ex
            b, comp, wire, st, serial = bound(row, cl, a.transport, ep)
            row.update(bound_ms="%.4f" % b, bound_compute_ms="%.4f" % comp, bound_wire_ms="%.4f" % wire,
                       bound_staging_ms="%.4f" % st, bound_waiting_ms="%.4f" % ((fw + bw) * 1e3 - b),
                       serial_ms="%.4f" % serial)
        # The planner's hop (same element type as the run) over the slowest ring edge.
        pj = load_json(r["plan_json"])
        if is_ring(d) and pj:
            mode = "expert" if d == "ring" else "token"
            for ph, suf in (("forward", "fwd"), ("backward", "bwd")):
                h = pj["hops"][mode][ph]
                row["plan_hop_bytes_" + suf] = h["bytes"]
                row["plan_hop_transfer_ms_" + suf] = "%.4f" % h["transfer_ms"]
        out_rows.append(row)
    out_rows.sort(key=lambda x: (x["ep"], ORDER.get(x["dispatch"], 9), x["dispatch"]))
    csv_path = os.path.join(a.out, a.name + ".csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=EP_COLUMNS)
        w.writeheader()
        w.writerows(out_rows)
    links = {k: {"bandwidth_gbs": v[0], "latency_us": v[1], "from_file": cl.get("link_from_file_" + k, False)}
             for k, v in cl["link"].items()}
    meta = {"command": a.cmd, "date": a.date, "commit": a.commit, "transport": a.transport, "dtype": a.dtype,
            "cluster": cl["name"], "cluster_file": os.path.relpath(os.path.abspath(a.cluster), ROOT),
            "devices_per_node": cl["devices_per_node"], "ranks_per_node": cl["ranks_per_node"],
            "gpu_link": cl["gpu_link"], "device_memory_bytes": cl["memory"], "links": links,
            "sched": a.sched, "preset": a.preset, "scale": float(a.scale),
            "rates": {"RMOE_SIM_GPU_TFLOPS": float(a.gpu_tflops), "RMOE_SIM_GPU_GBS": float(a.gpu_gbs),
                      "RMOE_SIM_GPU_FLOOR_US": float(a.floor_us)},
            "wall_s": int(a.wall), "history": a.history}
    with open(os.path.join(a.out, a.name + ".meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    plot_ep(out_rows, meta, os.path.join(a.out, a.name + ".png"))
    write_md(a.out)


def ok_rows(rows):
    return [r for r in rows if r["status"] == "ok"]


def by(rows, d, key="fwd_bwd_s"):
    return {int(r["ep"]): float(r[key]) for r in ok_rows(rows) if r["dispatch"] == d and r[key] != ""}


def dispatchers(rows):
    return sorted({r["dispatch"] for r in rows}, key=lambda x: (ORDER.get(x, 9), x))


def plot_ep(rows, meta, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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
    for d in dispatchers(ok_rows(rows)):
        if is_ring(d):
            continue
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
    ylabels = ["ms", "ratio", "GiB"]
    for i in range(3):
        ax[i].set_xscale("log", base=2)
        ax[i].set_xticks(eps)
        ax[i].set_xticklabels([str(e) for e in eps])
        ax[i].set_xlabel("EP (GPUs, one rank each)")
        ax[i].set_ylabel(ylabels[i])
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


def read_csv(path):
    try:
        with open(path) as f:
            return list(csv.DictReader(f))
    except OSError:
        return None


def gib(x):
    return "" if x in (None, "") else "%.2f" % (float(x) / 2 ** 30)


def why_slow(x, meta, cl_links, rpn):
    """One line: a case simulated more than 1.5x its bound, and why in numbers."""
    ep, d = int(x["ep"]), x["dispatch"]
    sim = float(x["fwd_bwd_s"]) * 1e3
    b, comp, wire, st = (float(x[k]) for k in ("bound_ms", "bound_compute_ms", "bound_wire_ms", "bound_staging_ms"))
    serial = float(x["serial_ms"])
    floor = meta["rates"]["RMOE_SIM_GPU_FLOOR_US"]
    parts = ["EP=%d %s: %.2f ms simulated, %.2fx its bound %.2f ms (GPU executing %.2f ms, wire %.2f ms, "
             "staging %.2f ms; the three one after another %.2f ms)" % (ep, d, sim, sim / b, b, comp, wire, st, serial)]
    if sim > serial:
        parts.append("longer than the three one after another: %.2f ms is neither executing nor on the wire "
                     "(a GPU waiting for a block whose transfer another depends on, per-message costs)"
                     % (sim - serial))
    elif sim >= 0.9 * serial:
        parts.append("the simulated time is %.0f%% of the parts' sum: the run hardly overlapped compute with "
                     "transfers" % (100 * sim / serial))
    else:
        parts.append("the run overlapped %.2f ms of the %.2f ms the parts would take one after another"
                     % (serial - sim, serial - b))
    excess = sim - b
    if is_ring(d):
        hops = 2 * (ep - 1)
        parts.append("the excess %.2f ms is %.0f us per ring hop (%d hops forward and backward): StarPU-MPI's "
                     "~3 us per message, the hop's latency and, on the chain a partition follows from rank to "
                     "rank, the tasks between its arrival and its next send (%g us floor each)"
                     % (excess, 1e3 * excess / hops, hops, floor))
    else:
        msgs = 4 * (ep - 1)
        parts.append("the excess %.2f ms is %.0f us per exchanged block (%d: dispatch and combine to each of "
                     "EP-1 peers, both passes): the dispatch, the experts and the combine depend on one "
                     "another, so at most the chunks' pipeline overlaps them, and every block passes through "
                     "gather and scatter tasks (%g us floor each)" % (excess, 1e3 * excess / msgs, msgs, floor))
    return "; ".join(parts) + "."


def md_ep(out, lines, name, title):
    rows, meta = read_csv(os.path.join(out, name + ".csv")), load_json(os.path.join(out, name + ".meta.json"))
    w = lines.append
    w("## " + title)
    w("")
    if not rows or not meta:
        w("Not run yet: `bench/sim/all.sh` writes it.")
        w("")
        return
    L = meta["links"]
    sc = "full size" if meta["scale"] == 1 else "H, F and tokens divided by %g" % meta["scale"]
    r0 = next((r for r in rows if r["status"] == "ok"), None)
    w("Command: `%s` (%s, commit %s; %d s of wall time on this 2-core machine)." %
      (meta["command"], meta["date"], meta["commit"], meta["wall_s"]))
    w("")
    w("- Layer: %s, %s%s, forward and backward of one MoE layer, %s tensors on every link and in every "
      "kernel's bytes; GEMMs at the %s rate." %
      (meta["preset"], sc, (": H=%s F=%s E=%s K=%s, %s tokens per GPU" %
                            (r0["hidden"], r0["ffn"], r0["experts"], r0["topk"], r0["tokens"])) if r0 else "",
       meta["dtype"], meta["dtype"]))
    st = ("**staged**: every message crosses the rank's PCIe link (%g GB/s, %g us) to host memory before it is "
          "sent and after it is received, StarPU-MPI 1.3's way on GPUs" % (L["pcie"]["bandwidth_gbs"],
                                                                          L["pcie"]["latency_us"])
          if meta["transport"] == "staged" else
          "**gpudirect**: the host<->GPU link of StarPU-MPI's staging costs nothing, so every dispatcher's "
          "messages see only the links below (GPUDirect P2P inside a node, RDMA between nodes)")
    w("- Platform: `%s` through `scripts/sim/platform.py`: %d GPUs per node, one rank per GPU; %s inside a "
      "node %g GB/s, %g us per rank pair; network %g GB/s, %g us per GPU adapter, non-blocking fabric; "
      "%.0f GiB per GPU. Transport %s." % (meta["cluster_file"], meta["devices_per_node"], meta["gpu_link"],
                                          L[meta["gpu_link"]]["bandwidth_gbs"], L[meta["gpu_link"]]["latency_us"],
                                          L["network"]["bandwidth_gbs"], L["network"]["latency_us"],
                                          meta["device_memory_bytes"] / 2 ** 30, st))
    r = meta["rates"]
    if meta.get("history"):
        w("- Cost model: StarPU history perfmodels recorded by a real run, replayed (RMOE_SIM_HISTORY): %s. "
          "Scheduler: %s." % (meta["history"], meta["sched"]))
    else:
        w("- Cost model (codelets/sim_cost.c, a roofline per task): GEMMs at RMOE_SIM_GPU_TFLOPS=%g TFLOP/s "
          "(the file's %s rate), memory-bound kernels at RMOE_SIM_GPU_GBS=%g GB/s, "
          "RMOE_SIM_GPU_FLOOR_US=%g us per task. Scheduler: %s." %
          (r["RMOE_SIM_GPU_TFLOPS"], meta["dtype"], r["RMOE_SIM_GPU_GBS"], r["RMOE_SIM_GPU_FLOOR_US"],
           meta["sched"]))
    w("- Bound (`bound_ms`, report.py `bound()`): the larger of the busiest GPU's executing time per "
      "iteration (compute: every task at the cost model's rate, floors included, from StarPU's worker "
      "statistics) and, per pass, the busiest rank's sent bytes over the link they must cross (wire: a ring "
      "rank's over its slowest ring edge plus a latency per hop; an all-to-all rank's leaving the node "
      "through its adapter or going to each node-mate, uniform loads) or over its PCIe link (staging, "
      "staged only). waiting = simulated - bound.")
    w("")
    w("| EP | nodes | dispatcher | fwd ms | bwd ms | fwd+bwd ms | bound ms | sim/bound | compute / wire / "
      "staging ms | waiting ms | a2a/ring | bound a2a/ring | model peak GiB | sent GiB | wall s | status |")
    w("|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
    ring, ringb = by(rows, "ring"), by(rows, "ring", "bound_ms")
    slow = []
    for x in rows:
        ok = x["status"] == "ok"
        e = int(x["ep"])
        ratio = bratio = ""
        if ok and not is_ring(x["dispatch"]) and e in ring:
            ratio = "%.2fx" % (float(x["fwd_bwd_s"]) / ring[e])
            bratio = "%.2fx" % (float(x["bound_ms"]) / ringb[e])
        peak = max(float(x["model_peak_fwd_bytes"] or 0), float(x["model_peak_bwd_bytes"] or 0)) if ok else None
        sb = ""
        if ok:
            sb = "%.2fx" % (float(x["fwd_bwd_s"]) * 1e3 / float(x["bound_ms"]))
            if float(x["fwd_bwd_s"]) * 1e3 > 1.5 * float(x["bound_ms"]):
                slow.append(x)
        w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            e, x["nodes"], x["dispatch"], fnum(x["fwd_s"] and float(x["fwd_s"]) * 1e3, "%.2f"),
            fnum(x["bwd_s"] and float(x["bwd_s"]) * 1e3, "%.2f"),
            fnum(x["fwd_bwd_s"] and float(x["fwd_bwd_s"]) * 1e3, "%.2f"), fnum(x["bound_ms"], "%.2f"), sb,
            "%s / %s / %s" % (fnum(x["bound_compute_ms"], "%.2f"), fnum(x["bound_wire_ms"], "%.2f"),
                              fnum(x["bound_staging_ms"], "%.2f")) if ok else "",
            fnum(x["bound_waiting_ms"], "%.2f"), ratio, bratio, gib(peak) if ok else "", gib(x["sent_bytes"]),
            x["wall_s"], x["status"]))
    w("")
    w("![EP sweep](%s.png)" % name)
    w("")
    below = [x for x in ok_rows(rows) if float(x["fwd_bwd_s"]) * 1e3 < float(x["bound_ms"])]
    if below:
        w("**Below its bound (the bound or the run is wrong):** " + ", ".join(
            "EP=%s %s" % (x["ep"], x["dispatch"]) for x in below) + ".")
        w("")
    if slow:
        w("Cases simulated more than 1.5x their bound:")
        w("")
        for x in slow:
            w("- " + why_slow(x, meta, L, meta["ranks_per_node"]))
        w("")
    for line in meta.get("notes", []):
        w(line)
        w("")


def paper_note(out, lines, name, staged_name, title="Against the paper (Fig. 10), transport gpudirect"):
    """Ring/a2a at EP 8 and the largest EP beside the paper's ~2x; staged_name
    (or None) adds the staged sweep's ratios."""
    rows = read_csv(os.path.join(out, name + ".csv")) or []
    meta = load_json(os.path.join(out, name + ".meta.json")) or {}
    w = lines.append
    w("## " + title)
    w("")
    ring, ringb = by(rows, "ring"), by(rows, "ring", "bound_ms")
    if len(ring) < 1:
        w("No gpudirect ring runs yet.")
        w("")
        return
    eps = sorted(ring)
    w("The paper measures the ring about %gx faster than all-to-all at EP=8 and its lead growing with EP "
      "(real H100s, Megatron's all-to-all over NCCL with GPUDirect, bf16, 98304 tokens per GPU). Here, "
      "%s tensors, %s, %s scale:" % (PAPER_RATIO_EP8, meta.get("dtype"), meta.get("preset"),
                                     "full" if meta.get("scale") == 1 else "1/%g" % meta.get("scale", 0)))
    w("")
    w("| EP | all-to-all | simulated a2a/ring | bound a2a/ring | ring: compute / wire ms | a2a: compute / wire ms |")
    w("|---:|---|---:|---:|---|---|")
    for d in dispatchers(ok_rows(rows)):
        if is_ring(d):
            continue
        t, b = by(rows, d), by(rows, d, "bound_ms")
        comp, wire = by(rows, d, "bound_compute_ms"), by(rows, d, "bound_wire_ms")
        rc, rw = by(rows, "ring", "bound_compute_ms"), by(rows, "ring", "bound_wire_ms")
        for e in eps:
            if e in t:
                w("| %d | %s | %.2fx | %.2fx | %.2f / %.2f | %.2f / %.2f |" % (
                    e, d, t[e] / ring[e], b[e] / ringb[e], rc[e], rw[e], comp[e], wire[e]))
    w("")
    a2a, a2ab = by(rows, "a2a"), by(rows, "a2a", "bound_ms")
    ends = sorted({e for e in (8, max(eps)) if e in a2a})
    if ends:
        w("Ring over lean all-to-all: %s (simulated), against the bounds' %s. Where the two differ, the "
          "breakdown says why: the bound's ratio is the bytes' (the ring sends (EP-1) expert partitions "
          "per pass over its slowest edge, the all-to-all each rank's T*K*H rows' share that leaves the node "
          "through its adapter), the simulated ratio adds what each dispatcher loses to fixed costs (the "
          "waiting column above: per-task floors, StarPU-MPI's per-message cost, dependencies between "
          "dispatch, experts and combine)." % (
              ", ".join("%.2fx at EP=%d" % (a2a[e] / ring[e], e) for e in ends),
              ", ".join("%.2fx" % (a2ab[e] / ringb[e]) for e in ends)))
        w("")
    srows = read_csv(os.path.join(out, staged_name + ".csv")) or [] if staged_name else []
    sr, sa = by(srows, "ring"), by(srows, "a2a")
    common = [e for e in sorted(sr) if e in sa and e in ring and e in a2a]
    if common:
        w("Staged (StarPU-MPI 1.3 on GPUs today) for comparison: ring over lean all-to-all %s; gpudirect %s. "
          "What the staging hop adds, staged minus gpudirect: ring %s ms, all-to-all %s ms (the all-to-all's "
          "rows are produced and consumed on the GPU at both ends; the ring forwards weights from their host "
          "copy, so only what it receives crosses PCIe)." % (
              ", ".join("%.2fx at EP=%d" % (sa[e] / sr[e], e) for e in common),
              ", ".join("%.2fx" % (a2a[e] / ring[e]) for e in common),
              "/".join("%.2f" % ((sr[e] - ring[e]) * 1e3) for e in common),
              "/".join("%.2f" % ((sa[e] - a2a[e]) * 1e3) for e in common)))
        w("")


def md_check(out, lines):
    rows, meta = read_csv(os.path.join(out, "sim_check.csv")), load_json(os.path.join(out, "sim_check.meta.json"))
    w = lines.append
    w("## Real versus simulated (CPU)")
    w("")
    if not rows or not meta:
        w("Not run yet: `bench/sim/check_real.sh` writes it.")
        w("")
        return
    for line in meta.get("text", []):
        w(line)
    w("")
    w("| ranks | dispatcher | pass | real ms (rounds' range) | calibrated sim ms | error (rounds' range) | "
      "within %g%% | unexplained ms | analytic sim ms | analytic error | raw sim ms | raw error |" %
      meta["tolerance_pct"])
    w("|---:|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    pct = lambda x: ("%+.1f%%" % (100 * float(x))) if x else ""
    for r in rows:
        w("| %s | %s | %s | %s (%s-%s) | %s | %s (%s to %s) | %s | %s | %s | %s | %s | %s |" % (
            r["ranks"], r["dispatch"], r["pass"], fnum(r["real_ms"], "%.1f"), fnum(r["real_min_ms"], "%.1f"),
            fnum(r["real_max_ms"], "%.1f"), fnum(r["sim_ms"], "%.1f"), pct(r["rel_err"]), pct(r["rel_err_min"]),
            pct(r["rel_err_max"]), r["within_tol"], fnum(r.get("unexplained_ms"), "%.1f"),
            fnum(r.get("sim_analytic_ms"), "%.1f"),
            pct(r.get("rel_err_analytic")), fnum(r.get("sim_raw_ms"), "%.1f"), pct(r.get("rel_err_raw"))))
    w("")
    for line in meta.get("after", []):
        w(line)
    w("")


SWEEPS = (("sim_ep", "EP sweep, transport gpudirect (the paper's Fig. 10 analogue)"),
          ("sim_ep_staged", "EP sweep, transport staged (StarPU-MPI 1.3's host staging)"))
# Written only where their CSV exists: the full-size sweep, and EP 64 at the
# largest scale this host's memory allows (sim_notes.md gives the commands).
OPTIONAL_SWEEPS = (("sim_ep_full", "EP sweep at full size, transport gpudirect"),
                   ("sim_ep_64", "EP 64 at the largest scale that fits this host, transport gpudirect"))


def write_md(out):
    lines = ["# Simulated runs: StarPU-SimGrid over SMPI", "",
             "relaymoe's simulation build (`build-sim/apps/relaymoe`, StarPU 1.3 with SimGrid 3.32) runs the "
             "same task graphs as the real build; tasks last what the codelets' cost models say and every "
             "transfer crosses the simulated platform. Platforms come from the planner's cluster files "
             "(`scripts/sim/platform.py`); `scripts/sim/probe/check.sh` checks them with a StarPU-MPI probe "
             "(simulated bandwidth of every rank pair equal to the file's, latency plus StarPU-MPI's ~3 us "
             "per message). Each table below names the command, date and commit that wrote it, and each "
             "row of the EP sweeps records its commit, transport, element type, scale, policy and "
             "platform; `bench/sim/all.sh` reruns the 1/8-scale sweeps and the policy sweep at one "
             "commit; [sim_sched.md](sim_sched.md) holds the policy sweep.", ""]
    extra = os.path.join(out, "sim_notes.md")
    if os.path.exists(extra):
        with open(extra) as f:
            lines += [l.rstrip("\n") for l in f] + [""]
    probe = os.path.join(out, "sim_probe.txt")
    if os.path.exists(probe):
        lines += ["## Platform check", "",
                  "`scripts/sim/probe/check.sh --report bench/results/sim_probe.txt`: a StarPU-MPI probe "
                  "(scripts/sim/probe/ring.c) on the platforms written from both cluster files (transport "
                  "staged). Fitted bandwidth against the file's link per rank pair; the fitted intercept minus "
                  "the file's latency is StarPU-MPI's own cost per message in the simulation; then a ring of "
                  "1 ms GPU tasks whose data crosses PCIe both ways at every hop.", "", "```"]
        with open(probe) as f:
            lines += [l.rstrip("\n") for l in f]
        lines += ["```", ""]
    paper_note(out, lines, "sim_ep", "sim_ep_staged")
    if os.path.exists(os.path.join(out, "sim_ep_full.csv")):
        paper_note(out, lines, "sim_ep_full", None, "Against the paper at full size, transport gpudirect")
    for name, title in SWEEPS + tuple(o for o in OPTIONAL_SWEEPS if os.path.exists(os.path.join(out, o[0] + ".csv"))):
        md_ep(out, lines, name, title)
    md_check(out, lines)
    # Measured notes kept by hand beside the generated tables: the check's
    # exceptions explained, and what a simulated run costs on this host.
    for note in ("sim_check_notes.md", "sim_profile.md"):
        path = os.path.join(out, note)
        if os.path.exists(path):
            with open(path) as f:
                lines += [l.rstrip("\n") for l in f] + [""]
    with open(os.path.join(out, "sim.md"), "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


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
