"""The memory report's figures (bench/memory/summarize.py's compute step):
pure functions of the loaded runs and plans, no file read or written."""

MODEL_TOLERANCE = 0.10
MIB = 1024.0 * 1024.0
GIB = 1024.0 * MIB
DISPATCHERS = ("ring", "token", "a2a", "a2a-megatron", "a2a-deepep")
RINGS = ("ring", "token")
# The all-to-all baselines: `a2a`, pipelined per peer and chunk with the
# ring's kernel discipline, `a2a-megatron`, Megatron Core 0.13's alltoall
# dispatcher (the paper's baseline, as Megatron runs it today), and
# `a2a-deepep`, DeepEP's normal-mode dispatch (a token once per destination
# rank, a2a's pipeline).
BASELINES = ("a2a", "a2a-megatron", "a2a-deepep")
# Their models are bounds: what may be gone before the peak is leaving.
PIPELINED = ("a2a", "a2a-deepep")
HEAP = "heap_bwd_bytes"
PRESET_TOKENS = 49152
FULLSIZE_EP = (8, 16, 32, 64)
# the paper's §2 profile, and its EP-scaling runs (Fig. 10: b=12, sequence 8192 per GPU)
FULLSIZE_TOKENS = (PRESET_TOKENS, 98304)
# Qwen2-57B-A14B is left out: `relaymoe plan` models no shared expert.
FULLSIZE_PRESETS = ("Qwen3-30B-A3B", "Qwen3.5-35B-A3B", "MoE-E64", "MoE-E384", "MoE-K4", "MoE-K12",
                    "MoE-K16", "MoE-H512", "MoE-H2048")
# --quick: two shapes, each `relaymoe plan` spends half a second starting MPI
QUICK_PRESETS = ("Qwen3-30B-A3B", "MoE-K16")
# The paper's figures at the paper's own configuration: Fig. 10 runs 98304
# tokens per GPU (micro-batch 12, sequence 8192), not the 49152 of its §2
# profile.
PAPER_AT_EP = ((8, "3.8x average"), (64, "7.6x average, 13.4x for MoE-K16"))


# ---- the metrics ----

def starpu_peak(r):
    """StarPU's figure: the larger pass peak of the layer's StarPU data."""
    return max(r["peak_fwd_bytes"], r["peak_bwd_bytes"])


def heap_peak(r):
    return max(r["heap_fwd_bytes"], r["heap_bwd_bytes"])


def peak(r):
    """The headline metric, fixed before any measurement and used for every
    ratio: the total peak of a pass, the larger of StarPU's figure and the
    heap figure (what runs out of memory), max over the two passes. Runs
    from a build without the heap figure fall back to StarPU's."""
    return max(starpu_peak(r), heap_peak(r)) if r.get(HEAP, 0) > 0 else starpu_peak(r)


def exec_peak(r):
    """A diagnostic, not a headline: the total peak above the resident data
    every dispatcher holds alike (the CSV's resident_bytes: weights, their
    gradients, saved x and routing, dy, dx)."""
    return peak(r) - r["resident_bytes"]


def model_peak(r):
    return max(r["model_peak_fwd_bytes"], r["model_peak_bwd_bytes"])


def key(b, d):
    """Column name of baseline b over ring mode d."""
    return f"{b.replace('-', '_')}_over_{d}"


def partition_bytes(r):
    """One rank's expert weights (the ring's hop message), f32."""
    return r["experts"] / r["ranks"] * 3 * r["hidden"] * r["ffn"] * 4


def pass_of(which):
    """'fwd' or 'bwd' from an error column's name."""
    return "fwd" if which.endswith("fwd") else "bwd"


# ---- the measured runs ----

def derive(rows, scale):
    """Each run's errors against the model, its execution peaks and the
    sweep's scale, added to its row."""
    for r in rows:
        r["err_fwd"] = r["model_peak_fwd_bytes"] / r["peak_fwd_bytes"] - 1.0
        r["err_bwd"] = r["model_peak_bwd_bytes"] / r["peak_bwd_bytes"] - 1.0
        # The independent figure (the process heap, sampled also while
        # exchanges are in flight), where the build reports it, against the
        # model of the data plus the runtime's structures of the pass's
        # graph (handles, tasks, requests), which the heap holds beside the
        # data (0 from a build without them).
        if r.get(HEAP, 0) > 0:
            for p in ("fwd", "bwd"):
                r[f"runtime_{p}_bytes"] = r.get(f"runtime_{p}_bytes", 0.0)
                r[f"err_heap_{p}"] = ((r[f"model_peak_{p}_bytes"] + r[f"runtime_{p}_bytes"])
                                      / r[f"heap_{p}_bytes"] - 1.0)
        r["exec_peak_bytes"] = exec_peak(r)
        r["model_exec_peak_bytes"] = model_peak(r) - r["resident_bytes"]
        r["scale"] = scale
    return rows


def by_point(rows):
    """{(preset, ranks, tokens): {dispatch: row}} for the multi-rank runs."""
    pts = {}
    for r in rows:
        if r["ranks"] > 1:
            pts.setdefault((r["preset"], r["ranks"], r["tokens"]), {})[r["dispatch"]] = r
    return pts


def ratios(pt, b="a2a"):
    """{ring mode: (total peak, execution peak, time median, time min, time
    max)} of baseline b over each ring mode. Against the ring, the run's
    first dispatcher, the time is the median and range of the per-repetition
    ratios (the dispatchers alternate repetition by repetition); against
    token routing, the ratio of the medians."""
    a = pt[b]
    out = {}
    for d in RINGS:
        if d not in pt:
            continue
        if d == "ring" and a.get("time_vs_first_median", 0) > 0:
            t = (a["time_vs_first_median"], a["time_vs_first_min"], a["time_vs_first_max"])
        else:
            m = a["fwd_bwd_median_ms"] / pt[d]["fwd_bwd_median_ms"]
            t = (m, m, m)
        out[d] = (peak(a) / peak(pt[d]), exec_peak(a) / exec_peak(pt[d])) + t
    return out


def point_ratios(pts):
    """[(point, baseline, ratios)] of every point measured with both ring
    modes, in the table's order."""
    out = []
    for k in sorted(pts, key=lambda k: (k[0], k[1], k[2])):
        for b in (b for b in BASELINES if b in pts[k]):
            q = ratios(pts[k], b)
            if all(d in q for d in RINGS):
                out.append((k, b, q))
    return out


def headline(pts, preset, ep, base_tokens):
    """{baseline: ratios over the rings} at one point, None where the ring
    did not run there."""
    pt = pts.get((preset, ep, base_tokens))
    if not pt or "ring" not in pt:
        return None
    return {b: ratios(pt, b) for b in BASELINES if b in pt}


def resident_mismatches(pts, resident_plans):
    """The points where `relaymoe plan`'s resident bytes (f32, as measured)
    differ from the measured ones: (preset, ranks, tokens, measured, plan)."""
    out = []
    for (preset, ranks, tokens), pt in sorted(pts.items()):
        mr = resident_plans[(preset, ranks, tokens)]["memory"]["dispatchers"]["ring"]["resident_backward_bytes"]
        got = pt["ring"]["resident_bytes"]
        if abs(mr / got - 1.0) > 1e-9:
            out.append((preset, ranks, tokens, got, mr))
    return out


# ---- the model against the measurements ----

def missed(r, e):
    """Whether the model misses run r's pass (error column e) beyond the
    tolerance."""
    if r["dispatch"] in PIPELINED:
        # a2a pipelines its chunks (graph/dispatch/alltoall_fwd.c), a2a-deepep its
        # blocks: their token blocks' inputs may leave before the peak, the
        # model less them is the least they hold.
        p = "fwd" if e == "err_fwd" else "bwd"
        low = (r[f"model_peak_{p}_bytes"] - r.get(f"model_leaving_{p}_bytes", 0.0)) / r[f"peak_{p}_bytes"] - 1.0
        return r[e] < -MODEL_TOLERANCE or low > MODEL_TOLERANCE
    return abs(r[e]) > MODEL_TOLERANCE


def model_errors(rows):
    """The model against StarPU's figure (the one the run fails on) and
    against the independent heap figure (reported, each miss named):
    every error, the worst and the misses, as (|error|, row, column)."""
    errs = [(abs(r[e]), r, e) for r in rows for e in ("err_fwd", "err_bwd")]
    herrs = [(abs(r[e]), r, e) for r in rows for e in ("err_heap_fwd", "err_heap_bwd") if e in r]
    off = [(abs(r[e]), r, e) for r in rows for e in ("err_fwd", "err_bwd") if missed(r, e)]
    return {"errs": errs, "worst": max(errs, key=lambda x: x[0]) if errs else (0.0, None, None),
            "off": off, "failed": bool(off), "herrs": herrs,
            "hworst": max(herrs, key=lambda x: x[0]) if herrs else (0.0, None, None),
            "hoff": [x for x in herrs if x[0] > MODEL_TOLERANCE]}


def heap_excess(rows):
    """[(dispatcher, largest excess of the heap over the model with the
    runtime's structures, largest excess of the model)] at EP >= 4, both
    passes: the bound the flow control exists for, at the sizes where early
    data could occur. The pipelined all-to-alls' models are bounds (rows may
    leave before the peak); how far below they fall is given as well."""
    out = []
    for d in DISPATCHERS:
        es = [r[e] for r in rows if r["ranks"] >= 4 and r["dispatch"] == d
              for e in ("err_heap_fwd", "err_heap_bwd") if e in r]
        if es:
            out.append((d, max(-e for e in es), max(es)))
    return out


def over_model(rows):
    """[(baseline, its runs measured more than 2% above the model, its run
    count)]. The all-to-all's exchanges are asynchronous
    (graph/dispatch/alltoall_megatron.c); StarPU frees an unregistered buffer in a
    callback after its last task, and the next stage's first task, released
    by the same completion, can allocate first."""
    out = []
    for b in BASELINES:
        over = [x for x in rows if x["dispatch"] == b and (x["err_fwd"] < -0.02 or x["err_bwd"] < -0.02)]
        if over:
            out.append((b, over, sum(1 for x in rows if x["dispatch"] == b)))
    return out


def heap_misses_split(hoff):
    """(the heap misses where the heap holds more than the model with the
    runtime's structures, whether every other one is a pipelined
    all-to-all's)."""
    def more(x):
        fb = pass_of(x[2])
        return x[1]["heap_" + fb + "_bytes"] > x[1]["model_peak_" + fb + "_bytes"] + x[1]["runtime_" + fb + "_bytes"]
    over = [x for x in hoff if more(x)]
    return over, all(x[1]["dispatch"] in PIPELINED for x in hoff if x not in over)


# ---- the PyTorch peer at EP=1 ----

def peer_runs(rows, torch):
    """One row per process at EP=1, relaymoe's then PyTorch's, each with
    its round (the rounds alternate the implementations)."""
    runs = []
    for r in (r for r in rows if r["ranks"] == 1):
        runs.append({"preset": r["preset"], "impl": f"relaymoe {r['dispatch']}", "hidden": r["hidden"],
                     "ffn": r["ffn"], "experts": r["experts"], "topk": r["topk"], "tokens": r["tokens"],
                     "fwd_bwd_ms": r["fwd_ms"] + r["bwd_ms"], "peak_rss_bytes": r["peak_rss_bytes"],
                     "peak_layer_bytes": peak(r), "rss_before_bytes": ""})
    for t in torch:
        runs.append({"preset": t["preset"], "impl": f"torch {t['torch']} a2a",
                     "hidden": t["hidden"], "ffn": t["ffn"], "experts": t["experts"], "topk": t["topk"],
                     "tokens": t["tokens"], "fwd_bwd_ms": t["median_ms"],
                     "peak_rss_bytes": t["peak_rss_bytes"], "peak_layer_bytes": "",
                     "rss_before_bytes": t["rss_before_bytes"]})
    groups = {}
    for r in runs:
        groups.setdefault((r["preset"], r["impl"]), []).append(r)
        r["round"] = len(groups[(r["preset"], r["impl"])])
    return runs, groups


def peer_best(groups):
    """Per implementation and shape: the best time of the rounds (other load
    only ever adds), the largest RSS, and every round's time."""
    peer = []
    for rs in groups.values():
        best = dict(min(rs, key=lambda r: r["fwd_bwd_ms"]))
        best["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in rs)
        if best["rss_before_bytes"] != "":
            best["rss_before_bytes"] = max(r["rss_before_bytes"] for r in rs)
        best["rounds"] = len(rs)
        best["all_ms"] = ", ".join(f"{r['fwd_bwd_ms']:.0f}" for r in rs)
        peer.append(best)
    return peer


def peer_comparisons(peer):
    """[(preset, relaymoe implementation, torch's row, relaymoe's row)]."""
    out = []
    for preset in sorted({p["preset"] for p in peer}):
        t = [p for p in peer if p["preset"] == preset and p["impl"].startswith("torch")]
        for impl in ("relaymoe a2a-megatron", "relaymoe a2a", "relaymoe ring"):
            rm = [p for p in peer if p["preset"] == preset and p["impl"] == impl]
            if t and rm:
                out.append((preset, impl, t[0], rm[0]))
    return out


# ---- the model at full size ----

def fullsize_row(tokens, preset, ep, m):
    """One shape's peaks per dispatcher from its `relaymoe plan --json`, and
    each baseline over each ring mode."""
    mem = m["memory"]["dispatchers"]
    row = {"preset": preset, "ep": ep, "tokens": tokens, "dtype": "bf16",
           "hidden": m["model"]["hidden"], "ffn": m["model"]["ffn"],
           "experts": m["model"]["experts"], "topk": m["model"]["topk"]}
    for d in (d for d in DISPATCHERS if d in mem):
        e = mem[d]
        p = max(e["peak_forward_bytes"], e["peak_backward_bytes"])
        row[f"{d}_peak_fwd_bytes"] = e["peak_forward_bytes"]
        row[f"{d}_peak_bwd_bytes"] = e["peak_backward_bytes"]
        row[f"{d}_resident_bytes"] = e["resident_backward_bytes"]
        row[f"{d}_peak_bytes"] = p
        row[f"{d}_exec_peak_bytes"] = p - e["resident_backward_bytes"]
    for b in (b for b in BASELINES if b in mem):
        for d in RINGS:
            row[key(b, d)] = row[f"{b}_peak_bytes"] / row[f"{d}_peak_bytes"]
            row[key(b, d) + "_exec"] = row[f"{b}_exec_peak_bytes"] / row[f"{d}_exec_peak_bytes"]
    return row


def fullsize_columns(full):
    cols = ["preset", "ep", "tokens", "dtype", "hidden", "ffn", "experts", "topk"]
    for d in (d for d in DISPATCHERS if full and f"{d}_peak_bytes" in full[0]):
        cols += [f"{d}_peak_fwd_bytes", f"{d}_peak_bwd_bytes", f"{d}_resident_bytes", f"{d}_peak_bytes",
                 f"{d}_exec_peak_bytes"]
    return cols + [key(b, d) + x for b in BASELINES for d in RINGS for x in ("", "_exec")
                   if full and key(b, d) in full[0]]


def fullsize_baselines(full):
    return [b for b in BASELINES if full and key(b, "ring") in full[0]]


def fullsize_averages(full, b):
    """{(tokens, ep): (mean total ratio, mean execution ratio, MoE-K16's
    row or None)} of baseline b over the ring, over the shapes."""
    c = key(b, "ring")
    out = {}
    for tokens in FULLSIZE_TOKENS:
        for ep in FULLSIZE_EP:
            rs = [r for r in full if r["ep"] == ep and r["tokens"] == tokens]
            k16 = [r for r in rs if r["preset"] == "MoE-K16"]
            out[(tokens, ep)] = (sum(r[c] for r in rs) / len(rs), sum(r[c + "_exec"] for r in rs) / len(rs),
                                 k16[0] if k16 else None)
    return out


def paper_size(full):
    """At the paper's Fig. 10 size: [(EP, the paper's figure, shapes, [(baseline,
    mean total, mean execution, MoE-K16's row or None)])]."""
    out = []
    for ep, paper in PAPER_AT_EP:
        fe = [r for r in full if r["ep"] == ep and r["tokens"] == 98304]
        if not fe:
            continue
        k16 = [r for r in fe if r["preset"] == "MoE-K16"]
        parts = []
        for b in (b for b in BASELINES if key(b, "ring") in fe[0]):
            c = key(b, "ring")
            parts.append((b, sum(r[c] for r in fe) / len(fe), sum(r[c + "_exec"] for r in fe) / len(fe),
                          k16[0] if k16 else None))
        out.append((ep, paper, len(fe), parts))
    return out


# ---- all of them ----

def compute(inputs, scale, quick):
    """The report's figures from the loaded inputs (summary_load.load): a
    dict the render step writes out."""
    rows, plans = inputs["rows"], inputs["plans"]
    base_tokens = round(PRESET_TOKENS / scale)
    derive(rows, scale)
    pts = by_point(rows)
    runs, groups = peer_runs(rows, inputs["torch"])
    full = [fullsize_row(tokens, preset, ep, m) for (tokens, preset, ep), m in plans["fullsize"]]
    return {"scale": scale, "base_tokens": base_tokens, "quick": quick, "rows": rows,
            "sweep_rows": [r for r in rows if r["ranks"] > 1], "pts": pts, "point_ratios": point_ratios(pts),
            "resident_mismatch": resident_mismatches(pts, plans["resident"]),
            "peer_runs": runs, "peer": peer_best(groups), "full": full,
            "errors": model_errors(rows), "heap_excess": heap_excess(rows), "over_model": over_model(rows),
            "headline": {p: headline(pts, p, 8, base_tokens) for p in ("Qwen3-30B-A3B", "MoE-K16")},
            "paper_size": paper_size(full),
            # the log as the report shows it: the run's temporary folder named DIR
            "check_log": inputs["check_log"].replace(inputs["runs_dir"], "DIR"),
            "check_failed": "FAIL" in inputs["check_log"]}
