#!/usr/bin/python3
"""Reports of the simulation benchmarks (bench/sim/run.sh, bench/sim/check_real.sh).

  report.py ep --rows ROWS --out DIR --name NAME --cmd CMD --date DATE --cluster FILE
               --sched S --preset P --scale S --gpu-tflops R --gpu-gbs B --floor-us U --wall SEC
      the EP sweep: DIR/NAME.csv, DIR/NAME.png, DIR/NAME.meta.json, then DIR/sim.md
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

EP_COLUMNS = ["ep", "dispatch", "status", "fwd_s", "bwd_s", "fwd_bwd_s", "model_peak_fwd_bytes",
              "model_peak_bwd_bytes", "resident_bytes", "sent_bytes", "hidden", "ffn", "experts", "topk",
              "tokens", "plan_hop_bytes_fwd", "plan_hop_transfer_ms_fwd", "plan_hop_compute_ms_fwd",
              "plan_hop_bytes_bwd", "plan_hop_transfer_ms_bwd", "plan_hop_compute_ms_bwd", "nodes",
              "wall_s"]
ORDER = {"a2a": 0, "ring": 1, "token": 2}
LABEL = {"a2a": "all-to-all", "ring": "ring, expert routing", "token": "ring, token routing"}
COLOR = {"a2a": "tab:red", "ring": "tab:blue", "token": "tab:green"}


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


def cmd_ep(a):
    cl = simplatform().parse_cluster(a.cluster)
    out_rows = []
    with open(a.rows) as f:
        runs = list(csv.DictReader(f))
    for r in runs:
        ep, d = int(r["ep"]), r["dispatch"]
        row = {k: "" for k in EP_COLUMNS}
        row.update(ep=ep, dispatch=d, status=r["status"], wall_s="%.1f" % float(r["wall_s"]),
                   nodes=(ep + cl["ranks_per_node"] - 1) // cl["ranks_per_node"])
        if r["status"] == "ok":
            c = read_last_row(r["run_csv"])
            fw, bw = float(c["fwd_ms"]) / 1e3, float(c["bwd_ms"]) / 1e3
            row.update(fwd_s="%.6f" % fw, bwd_s="%.6f" % bw, fwd_bwd_s="%.6f" % (fw + bw),
                       model_peak_fwd_bytes=c["model_peak_fwd_bytes"],
                       model_peak_bwd_bytes=c["model_peak_bwd_bytes"], resident_bytes=c["resident_bytes"],
                       sent_bytes=c["sent_bytes"], hidden=c["hidden"], ffn=c["ffn"], experts=c["experts"],
                       topk=c["topk"], tokens=c["tokens"])
        # The planner's hop: bytes and transfer of f32 tensors (what the
        # simulation moves), compute at the cost model's GEMM rate.
        p16, p32 = load_json(r["plan_json"]), load_json(r["plan_json_f32"])
        if d in ("ring", "token") and p16 and p32:
            mode = "expert" if d == "ring" else "token"
            rate_fix = float(p16["cluster"]["device_tflops"]) / float(a.gpu_tflops)
            for ph, suf in (("forward", "fwd"), ("backward", "bwd")):
                h32, h16 = p32["hops"][mode][ph], p16["hops"][mode][ph]
                row["plan_hop_bytes_" + suf] = h32["bytes"]
                row["plan_hop_transfer_ms_" + suf] = "%.4f" % h32["transfer_ms"]
                row["plan_hop_compute_ms_" + suf] = "%.4f" % (h16["compute_ms"] * rate_fix)
        out_rows.append(row)
    out_rows.sort(key=lambda x: (x["ep"], ORDER.get(x["dispatch"], 9)))
    csv_path = os.path.join(a.out, a.name + ".csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=EP_COLUMNS)
        w.writeheader()
        w.writerows(out_rows)
    links = {k: {"bandwidth_gbs": v[0], "latency_us": v[1], "from_file": cl.get("link_from_file_" + k, False)}
             for k, v in cl["link"].items()}
    meta = {"command": a.cmd, "date": a.date, "cluster": cl["name"],
            "cluster_file": os.path.relpath(os.path.abspath(a.cluster), ROOT),
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


def plot_ep(rows, meta, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if r["status"] == "ok"]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.4))
    eps = sorted({r["ep"] for r in rows})
    for d in sorted({r["dispatch"] for r in ok}, key=lambda x: ORDER.get(x, 9)):
        pts = sorted((r["ep"], float(r["fwd_bwd_s"]) * 1e3, float(r["fwd_s"]) * 1e3,
                      max(float(r["model_peak_fwd_bytes"] or 0), float(r["model_peak_bwd_bytes"] or 0)))
                     for r in ok if r["dispatch"] == d)
        x = [p[0] for p in pts]
        ax[0].plot(x, [p[1] for p in pts], "o-", color=COLOR.get(d), label=LABEL.get(d, d) + ": fwd+bwd")
        ax[0].plot(x, [p[2] for p in pts], "x--", color=COLOR.get(d), alpha=0.6, label=LABEL.get(d, d) + ": fwd")
        ax[2].plot(x, [p[3] / 2 ** 30 for p in pts], "o-", color=COLOR.get(d), label=LABEL.get(d, d))
    a2a = {r["ep"]: float(r["fwd_bwd_s"]) for r in ok if r["dispatch"] == "a2a"}
    for d in ("ring", "token"):
        pts = sorted((r["ep"], a2a[r["ep"]] / float(r["fwd_bwd_s"])) for r in ok
                     if r["dispatch"] == d and r["ep"] in a2a)
        if pts:
            ax[1].plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=COLOR[d], label=LABEL[d])
    ax[1].axhline(1.0, color="grey", lw=0.8)
    titles = ["forward+backward latency (simulated)", "speedup over all-to-all (fwd+bwd)",
              "peak memory per GPU (memory model)"]
    ylabels = ["ms", "all-to-all time / ring time", "GiB"]
    for i in range(3):
        ax[i].set_xscale("log", base=2)
        ax[i].set_xticks(eps)
        ax[i].set_xticklabels([str(e) for e in eps])
        ax[i].set_xlabel("EP (GPUs, one rank each)")
        ax[i].set_ylabel(ylabels[i])
        ax[i].set_title(titles[i], fontsize=10)
        ax[i].grid(alpha=0.3)
        if ax[i].get_legend_handles_labels()[0]:
            ax[i].legend(fontsize=7)
    lat = [float(r["fwd_bwd_s"]) for r in ok]
    if lat and max(lat) > 8 * min(lat):
        ax[0].set_yscale("log")
    else:
        ax[0].set_ylim(bottom=0)
    ax[1].set_ylim(bottom=0)
    sc = "" if meta["scale"] == 1 else " / scale %g" % meta["scale"]
    fig.suptitle("%s%s, one MoE layer, %s (%s), StarPU %s, GPU model %g TFLOP/s" %
                 (meta["preset"], sc, meta["cluster"], meta["cluster_file"], meta["sched"],
                  meta["rates"]["RMOE_SIM_GPU_TFLOPS"]), fontsize=10)
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


def md_ep(out, lines, name="sim_ep", title="EP sweep (the paper's Fig. 10 analogue)", note=True):
    rows, meta = read_csv(os.path.join(out, name + ".csv")), load_json(os.path.join(out, name + ".meta.json"))
    for r in rows or []:
        r["ep"] = int(r["ep"])
    w = lines.append
    w("## " + title)
    w("")
    if not rows or not meta:
        w("Not run yet: `bench/sim/run.sh` writes it (it needs the simulation build, "
          "build-sim/apps/relaymoe).")
        w("")
        return
    L = meta["links"]
    sc = "full size" if meta["scale"] == 1 else "H, F and tokens divided by %g" % meta["scale"]
    r0 = next((r for r in rows if r["status"] == "ok"), None)
    w("Command: `%s` (%s; %d s of wall time on this 2-core machine)." % (meta["command"], meta["date"], meta["wall_s"]))
    w("")
    w("- Layer: %s, %s%s, forward and backward of one MoE layer, f32 tensors (this implementation's type: "
      "every transfer carries twice the bytes of the paper's bf16)." %
      (meta["preset"], sc, (": H=%s F=%s E=%s K=%s, %s tokens per GPU" %
                            (r0["hidden"], r0["ffn"], r0["experts"], r0["topk"], r0["tokens"])) if r0 else ""))
    w("- Platform: `%s` through `scripts/sim/platform.py` (the file `relaymoe plan --cluster` reads): "
      "%d GPUs per node, one rank per GPU; %s inside a node %g GB/s, %g us per rank pair; "
      "network %g GB/s, %g us per GPU adapter, non-blocking fabric; PCIe to host %g GB/s, %g us; "
      "%.0f GiB per GPU." % (meta["cluster_file"], meta["devices_per_node"], meta["gpu_link"],
                             L[meta["gpu_link"]]["bandwidth_gbs"], L[meta["gpu_link"]]["latency_us"],
                             L["network"]["bandwidth_gbs"], L["network"]["latency_us"],
                             L["pcie"]["bandwidth_gbs"], L["pcie"]["latency_us"],
                             meta["device_memory_bytes"] / 2 ** 30))
    r = meta["rates"]
    if meta.get("history"):
        w("- Cost model: StarPU history perfmodels recorded by a real run, replayed (codelets/sim_cost.c, "
          "RMOE_SIM_HISTORY): %s. Scheduler: %s." % (meta["history"], meta["sched"]))
    else:
        w("- Cost model (codelets/sim_cost.c, a roofline per task): GEMMs at RMOE_SIM_GPU_TFLOPS=%g TFLOP/s "
          "(the file's planning rate), memory-bound kernels at RMOE_SIM_GPU_GBS=%g GB/s, "
          "RMOE_SIM_GPU_FLOOR_US=%g us per task. Scheduler: %s." %
          (r["RMOE_SIM_GPU_TFLOPS"], r["RMOE_SIM_GPU_GBS"], r["RMOE_SIM_GPU_FLOOR_US"], meta["sched"]))
    w("- Memory: the memory model's peak per rank (a simulation allocates nothing; `relaymoe run` "
      "reports the model there). Bytes sent: per rank, forward + backward, max over ranks. Per-hop "
      "columns: the planner's hop (`relaymoe plan`, f32 bytes) over the slowest ring edge, against the "
      "hop's expert GEMMs at the cost model's rate.")
    w("")
    w("| EP | nodes | dispatcher | fwd ms | bwd ms | fwd+bwd ms | vs a2a | model peak GiB | sent GiB | "
      "hop MB fwd | hop transfer / compute us fwd | wall s | status |")
    w("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    a2a = {r["ep"]: float(r["fwd_bwd_s"]) for r in rows if r["dispatch"] == "a2a" and r["status"] == "ok"}
    for x in rows:
        ok = x["status"] == "ok"
        sp = ""
        if ok and x["dispatch"] != "a2a" and x["ep"] in a2a:
            sp = "%.2fx" % (a2a[x["ep"]] / float(x["fwd_bwd_s"]))
        peak = max(float(x["model_peak_fwd_bytes"] or 0), float(x["model_peak_bwd_bytes"] or 0)) if ok else None
        hop = ""
        if x["plan_hop_transfer_ms_fwd"]:
            hop = "%.0f / %.1f" % (1e3 * float(x["plan_hop_transfer_ms_fwd"]), 1e3 * float(x["plan_hop_compute_ms_fwd"]))
        w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            x["ep"], x["nodes"], x["dispatch"], fnum(x["fwd_s"] and float(x["fwd_s"]) * 1e3, "%.1f"),
            fnum(x["bwd_s"] and float(x["bwd_s"]) * 1e3, "%.1f"),
            fnum(x["fwd_bwd_s"] and float(x["fwd_bwd_s"]) * 1e3, "%.1f"), sp, gib(peak) if ok else "",
            gib(x["sent_bytes"]), fnum(x["plan_hop_bytes_fwd"] and float(x["plan_hop_bytes_fwd"]) / 1e6, "%.1f"),
            hop, x["wall_s"], x["status"]))
    w("")
    w("![EP sweep](%s.png)" % name)
    w("")
    if not note:
        main = read_csv(os.path.join(out, "sim_ep.csv")) or []
        mmeta = load_json(os.path.join(out, "sim_ep.meta.json")) or {}
        def speedups(rs):
            a = {int(r["ep"]): float(r["fwd_bwd_s"]) for r in rs if r["dispatch"] == "a2a" and r["status"] == "ok"}
            return {int(r["ep"]): a[int(r["ep"])] / float(r["fwd_bwd_s"]) for r in rs
                    if r["dispatch"] == "ring" and r["status"] == "ok" and int(r["ep"]) in a}
        here, there = speedups(rows), speedups(main)
        fit = ring_fit(main)
        if fit and mmeta.get("scale", 1) > 1 and meta["scale"] < mmeta["scale"]:
            a, b = fit
            k = (mmeta["scale"] / meta["scale"]) ** 2
            pts = sorted((int(r["ep"]), float(r["fwd_s"])) for r in rows if r["dispatch"] == "ring" and r["status"] == "ok")
            if pts:
                w("Ring forward time against the scale-%g fit's extrapolation (fixed part kept, size-dependent "
                  "part times %g): %s." % (mmeta["scale"], k, ", ".join(
                      "EP=%d %.1f ms simulated vs %.1f ms extrapolated" % (e, t * 1e3, (e - 1) * (a + k * b / e) * 1e3)
                      for e, t in pts)))
                w("")
        if here:
            w("Ring (expert routing) over all-to-all, forward+backward: %s at scale %g; %s at scale %g. "
              "A smaller scale factor makes every hop larger against the fixed per-hop costs." % (
                  ", ".join("%.2fx at EP=%d" % (v, e) for e, v in sorted(here.items())), meta["scale"],
                  ", ".join("%.2fx at EP=%d" % (v, e) for e, v in sorted(there.items()) if e in here) or "n/a",
                  mmeta.get("scale", 0)))
            w("")
    # Measured notes on a sweep's rows kept by hand in its meta.json ("notes":
    # lines), e.g. a row rerun alone after a fix.
    for line in meta.get("notes", []):
        w(line)
        w("")
    if note:
        w("### Against the paper's Fig. 10")
        w("")
        for line in fig10_note(rows, meta):
            w(line)
        w("")


def ring_fit(rows):
    """Forward time per transfer hop of the ring = a + b / EP (least squares), or None."""
    ring = sorted((int(r["ep"]), float(r["fwd_s"])) for r in rows
                  if r["dispatch"] == "ring" and r["status"] == "ok" and int(r["ep"]) > 1)
    if len(ring) < 2:
        return None
    xs = [1.0 / e for e, _ in ring]
    ys = [t / (e - 1) for e, t in ring]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def fig10_note(rows, meta):
    ok = [r for r in rows if r["status"] == "ok"]
    a2a = {r["ep"]: float(r["fwd_bwd_s"]) for r in ok if r["dispatch"] == "a2a"}
    out = []
    eps = sorted(a2a)
    if len(eps) < 2:
        return ["Too few all-to-all points to compare a trend."]
    lo, hi = eps[0], eps[-1]
    parts = []
    trend = {}
    for d in ("ring", "token"):
        t = {r["ep"]: float(r["fwd_bwd_s"]) for r in ok if r["dispatch"] == d}
        if lo in t and hi in t:
            s0, s1 = a2a[lo] / t[lo], a2a[hi] / t[hi]
            trend[d] = (s0, s1)
            parts.append("%s %.2fx at EP=%d and %.2fx at EP=%d" % (LABEL[d], s0, lo, s1, hi))
    if not parts:
        return ["The ring runs are missing: no comparison."]
    growth = {d: s1 / s0 for d, (s0, s1) in trend.items()}
    g = growth.get("ring", list(growth.values())[0])
    if g > 1.1:
        verdict = "The trend agrees with Fig. 10: the ring's advantage over all-to-all grows with EP"
    elif g < 0.9:
        verdict = "The trend does not agree with Fig. 10: the ring's advantage over all-to-all shrinks as EP grows"
    else:
        verdict = ("The trend only partly agrees with Fig. 10: the ring's advantage over all-to-all stays "
                   "about constant with EP instead of growing")
    out.append("Speedup of the ring over all-to-all (forward+backward): %s. %s." % ("; ".join(parts), verdict))
    out.append("")
    L = meta["links"]
    gl = meta["gpu_link"]
    rpn = meta["ranks_per_node"]
    a2a_g = a2a[hi] / a2a[lo]
    out.append(
        "All-to-all: with one rank per GPU and %d GPUs per node, each rank sends (EP-1)/EP of its T*K "
        "dispatched rows (and receives as many returns), and the share that leaves the node over the %g GB/s "
        "adapter instead of %s (%g GB/s) grows from %.0f%% at EP=%d to %.0f%% at EP=%d: its simulated time "
        "grows %.2fx over that range at a fixed per-GPU token count." % (
            rpn, L["network"]["bandwidth_gbs"], gl, L[gl]["bandwidth_gbs"],
            100.0 * (lo - rpn) / lo if lo > rpn else 0.0, lo, 100.0 * (hi - rpn) / hi, hi, a2a_g))
    ring = sorted((r["ep"], float(r["fwd_s"]), r) for r in ok if r["dispatch"] == "ring" and r["ep"] > 1)
    if len(ring) >= 2:
        # Forward time per transfer hop = a + b / EP (least squares).
        xs = [1.0 / e for e, _, _ in ring]
        ys = [t / (e - 1) for e, t, _ in ring]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
        a = my - b * mx
        plan = [(e, float(r["plan_hop_transfer_ms_fwd"]) * 1e-3) for e, _, r in ring if r["plan_hop_transfer_ms_fwd"]]
        plan_txt = ""
        if plan:
            plan_txt = (" The EP-dependent part b/EP matches the planner's transfer of a hop over the slowest "
                        "edge (b/EP = %s us against %s us planned)." % (
                            "/".join("%.0f" % (b / e * 1e6) for e, _ in plan),
                            "/".join("%.0f" % (t * 1e6) for _, t in plan)))
        out.append("")
        out.append(
            "The ring: its forward time per transfer hop fits a + b/EP with a = %.0f us fixed per hop and "
            "b = %.2f ms.%s The fixed part is what a hop costs whatever its size: the cost model's per-task "
            "floor (%g us) for each of the hop's tasks, the PCIe copies and their latency (StarPU-MPI 1.3 stages "
            "GPU data through host memory), StarPU-MPI's per-message cost (~3 us, scripts/sim/probe) and "
            "StarPU's own simulated runtime costs (task submission, data fetch, allocation). With EP-1 hops, the "
            "ring's time grows with EP once the fixed part dominates: at this scale a forward hop moves only "
            "%.1f MB at EP=%d, so a is %.0f%% of the hop there. All-to-all sends one exchange per peer, "
            "the EP-1 messages in flight together rather than one hop after another, so its fixed costs do not "
            "add up along a chain of EP-1 steps." % (
                a * 1e6, b * 1e3, plan_txt, meta["rates"]["RMOE_SIM_GPU_FLOOR_US"],
                float(ring[-1][2]["plan_hop_bytes_fwd"] or 0) / 1e6, ring[-1][0],
                100.0 * a / (a + b / ring[-1][0]) if a + b / ring[-1][0] > 0 else 0))
        if meta["scale"] > 1:
            s2 = meta["scale"] ** 2
            full = [(e, (e - 1) * (a + s2 * b / e)) for e, _, _ in ring]
            out.append("")
            out.append(
                "Scale matters for this comparison: H, F and tokens divided by %g divide every hop's bytes by "
                "%g, not its fixed costs. Keeping the fit's fixed part and multiplying the size-dependent part "
                "by %g (an extrapolation, not a simulation) gives a full-size ring forward time of %s ms at "
                "EP = %s: about flat, as the planner expects (one copy of all expert weights crosses each "
                "rank's slowest edge whatever EP), while all-to-all's inter-node share keeps growing with EP. "
                "At full size the ring's advantage would therefore be expected to grow with EP, as in Fig. 10; "
                "the full-size sweep below, where present, checks it (section Full size). "
                "The sensitivity sweep below, where present, checks the direction at a smaller scale factor." % (
                    meta["scale"], s2, s2, "/".join("%.0f" % (t * 1e3) for _, t in full),
                    "/".join(str(e) for e, _ in full)))
    peaks = {}
    for r in ok:
        peaks.setdefault(r["dispatch"], {})[r["ep"]] = max(float(r["model_peak_fwd_bytes"] or 0),
                                                            float(r["model_peak_bwd_bytes"] or 0))
    if "ring" in peaks and "a2a" in peaks and all(e in peaks["ring"] and e in peaks["a2a"] for e in (lo, hi)):
        m0, m1 = peaks["a2a"][lo] / peaks["ring"][lo], peaks["a2a"][hi] / peaks["ring"][hi]
        out.append("")
        out.append(
            "Memory (the memory model's peak per GPU; scaling H, F and tokens together keeps every buffer's proportions, so the ratios hold at full size): all-to-all over the ring %.1fx "
            "at EP=%d and %.1fx at EP=%d. Fig. 10's experiments report 3.8x at EP=8 and 7.6x at EP=64 on "
            "average over their shapes: the ring's peak falls as its expert partition and per-hop activations "
            "shrink with EP, all-to-all's does not." % (m0, lo, m1, hi))
    out.append("")
    out.append(
        "Token routing carries every rank's tokens and their accumulator around the whole ring (Table 2: "
        "the per-hop volume does not shrink with EP while the hop count grows), so its time grows about "
        "linearly with EP; the planner picks expert routing for this shape at every EP. Differences from the "
        "paper's setting: it measured real GPUs with bf16 tensors, Megatron's tuned all-to-all and 98304 "
        "tokens per GPU (b=12, S=8192); here tensors are f32 (twice the bytes on every link), tokens per GPU "
        "are the preset's, kernels follow a roofline cost model, the fabric is non-blocking and StarPU-MPI "
        "stages inter-node data through host memory over PCIe (no GPUDirect).")
    return out


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


def write_md(out):
    lines = ["# Simulated runs: StarPU-SimGrid over SMPI", "",
             "relaymoe's simulation build (`build-sim/apps/relaymoe`, StarPU 1.3 with SimGrid 3.32) runs the "
             "same task graphs as the real build; tasks last what the codelets' cost models say and every "
             "transfer crosses the simulated platform. Platforms come from the planner's cluster files "
             "(`scripts/sim/platform.py`); `scripts/sim/probe/check.sh` checks them with a StarPU-MPI probe "
             "(simulated bandwidth of every rank pair equal to the file's, latency plus StarPU-MPI's ~3 us "
             "per message).", ""]
    summary = {}
    for name in ["sim_ep"] + sorted(f[:-len(".meta.json")] for f in os.listdir(out)
                                    if f.startswith("sim_ep_") and f.endswith(".meta.json")):
        rs, m = read_csv(os.path.join(out, name + ".csv")), load_json(os.path.join(out, name + ".meta.json"))
        if not rs or not m:
            continue
        a = {int(r["ep"]): float(r["fwd_bwd_s"]) for r in rs if r["dispatch"] == "a2a" and r["status"] == "ok"}
        sp = {int(r["ep"]): a[int(r["ep"])] / float(r["fwd_bwd_s"]) for r in rs
              if r["dispatch"] == "ring" and r["status"] == "ok" and int(r["ep"]) in a}
        # Sweeps of one scale (e.g. full size at EP 8-16 and at 32-64) report together.
        if sp:
            summary.setdefault(m["scale"], {}).update(sp)
    summary = ["scale %g: %s" % (sc, ", ".join("%.2fx (EP=%d)" % (v, e) for e, v in sorted(sp.items())))
               for sc, sp in summary.items() if len(sp) >= 2]
    if summary:
        lines += ["Summary, ring (expert routing) over all-to-all, forward+backward, on the simulated MareNostrum 5 "
                  "ACC: " + "; ".join(summary) + ". The direction of the trend with EP depends on how large a hop "
                  "is against the ring's fixed per-hop costs (details below).", ""]
    probe = os.path.join(out, "sim_probe.txt")
    if os.path.exists(probe):
        lines += ["## Platform check", "",
                  "`scripts/sim/probe/check.sh --report bench/results/sim_probe.txt`: a StarPU-MPI probe "
                  "(scripts/sim/probe/ring.c) on the platforms written from both cluster files. Fitted "
                  "bandwidth against the file's link per rank pair; the fitted intercept minus the file's "
                  "latency is StarPU-MPI's own cost per message in the simulation; then a ring of 1 ms GPU "
                  "tasks whose data crosses PCIe both ways at every hop.", "", "```"]
        with open(probe) as f:
            lines += [l.rstrip("\n") for l in f]
        lines += ["```", ""]
    md_ep(out, lines)
    for extra in sorted(f[:-len(".meta.json")] for f in os.listdir(out) if f.startswith("sim_ep_") and f.endswith(".meta.json")):
        m = load_json(os.path.join(out, extra + ".meta.json")) or {}
        title = ("Full size (%s)" % extra) if m.get("scale") == 1 else \
            "Sensitivity: the same sweep at scale %g (%s)" % (m.get("scale", 0), extra)
        md_ep(out, lines, extra, title, note=False)
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
              "gpu-gbs", "floor-us", "wall"):
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
