#!/usr/bin/python3
"""The relaymoe layer in PyTorch, all-to-all style at EP=1: the peer a user
would run instead, for time and memory on the same machine, on the CPU
(bench/memory/) or on a GPU (bench/gpu/).

Router softmax (fp32) and top-k with renormalised weights; permute the
token-expert pairs by expert and expand the tokens to [T*K, H]; SwiGLU
experts; weighted unpermute. The whole MoE block runs under one activation
checkpoint, so backward recomputes it, as Megatron-LM does with
recomputation on and as relaymoe's all-to-all backward does.

--groups G splits the experts into G groups of E/G consecutive experts, as
relaymoe's ring splits a rank's experts into --partitions: the router runs
once, then each group in turn gathers the rows of its pairs, runs its
experts and adds its weighted rows into y, under a checkpoint of its own;
backward recomputes one group at a time. Each group's weights are leaves of
their own (a slice of one weight would get a zero-filled gradient of the
whole weight in backward). The same expert grouping as the ring's
partitions, in PyTorch: the ring against this compares the task graph at
equal grouping; the ring against G=1 compares with what a user runs.

The experts' GEMMs (--gemm):
  grouped  one grouped GEMM per matrix over all experts (torch's
           grouped_mm, bf16 on sm_90, offsets on the device: no host sync),
           gate and up fused into one [E, H, 2F] weight, as Megatron-LM's
           GroupedMLP; checked against the loop on a small problem first
  loop     torch.matmul per expert (what the CPU has)
  auto     grouped where it runs (a GPU), else loop

  torch_moe.py bench --hidden H --ffn F --experts E --topk K --tokens T
                     [--repeat R] [--device cpu|cuda] [--dtype f32|bf16] [--gemm auto|grouped|loop]
                     [--groups G]
      forward+backward steps after warm-ups, R times; prints one JSON line:
      median ms (and every step's), peak memory of the timed steps (CPU:
      VmHWM; GPU: max_memory_allocated and max_memory_reserved) and what was
      resident before them (inputs and weights)
  torch_moe.py check DIR --topk K [--tol 1e-4] [--peer-tol T] [--device ...] [--dtype ...] [--gemm ...]
                     [--groups G]
      runs the layer on DIR/x.npy, dy.npy and the weights (`relaymoe run
      --dump DIR`) in float64, and compares DIR's outputs (y, dx, every
      gradient) and this peer's own path (--dtype, --gemm, --groups) with it
      (relative norm error); exits 1 when relaymoe is past --tol or the
      peer past --peer-tol. Both sides are judged against the definition,
      not against each other: at bf16 each rounds in its own places. Where
      relaymoe's routing (DIR/topk_idx.npy) differs at a near-tie
      (TIE_TOL), the check takes relaymoe's: rounding decides those

Needs PyTorch (Debian: RMOE_SETUP_EXTRA=python3-torch scripts/setup.sh).
"""
import argparse
import json
import resource
import sys
import time

try:
    import torch
    import torch.nn.functional as nnf
    from torch.utils.checkpoint import checkpoint
except ImportError:
    print("torch_moe.py: PyTorch is missing; install it with "
          "RMOE_SETUP_EXTRA=python3-torch scripts/setup.sh", file=sys.stderr)
    sys.exit(77)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def grouped_mm_fn():
    """torch's grouped GEMM ([M, K] x [G, K, N] with group end offsets), or None."""
    for f in (getattr(nnf, "grouped_mm", None), getattr(torch, "_grouped_mm", None)):
        if f is not None:
            return f
    return None


# A router's choice within this much probability of a tie is decided by
# rounding (bf16 activations, another summation order): where relaymoe's
# dump chose otherwise inside it, check follows relaymoe's choice, as
# rmoe_results_check's reference does at float32 (apps/results.c).
TIE_TOL = 1e-3


def follow_ties(probs, g, idx, follow):
    """idx with relaymoe's experts (follow [T, K]) on the tokens where the two
    routings differ and every expert relaymoe chose is within TIE_TOL of
    torch's K-th best probability; and the mask of tokens that differ beyond
    it (a routing error, left to show in the comparison)."""
    differ = (idx.sort(dim=-1).values != follow.sort(dim=-1).values).any(dim=-1)
    near = (g[:, -1:] - probs.gather(-1, follow)).amax(dim=-1) <= TIE_TOL
    return torch.where((differ & near).unsqueeze(1), follow, idx), differ & ~near


def route(x, w_router, k, norm, follow=None):
    """fp32 softmax top-k; pairs sorted by expert (stable: token order inside an expert).
    follow: relaymoe's routing, taken at near-ties (follow_ties)."""
    probs = torch.softmax(x.float() @ w_router.float(), dim=-1)
    g, idx = torch.topk(probs, k, dim=-1)
    if follow is not None:
        idx, _ = follow_ties(probs, g, idx, follow)
        g = probs.gather(-1, idx)
    if norm:
        g = g / g.sum(dim=-1, keepdim=True)
    flat = idx.reshape(-1)
    _, order = torch.sort(flat, stable=True)
    token_of_pair = torch.div(order, k, rounding_mode="floor")
    return g, flat, order, token_of_pair


def experts_loop(expanded, counts, w_gate, w_up, w_down):
    counts = counts.tolist()
    # split and unbind, not slicing and indexing: their backward is one
    # concatenation, where each slice's would zero-fill a full-size gradient
    rows = torch.split(expanded, counts)
    gate, up, down = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)
    outs = [(nnf.silu(xe @ gate[ex]) * (xe @ up[ex])) @ down[ex] for ex, xe in enumerate(rows) if counts[ex]]
    return torch.cat(outs, dim=0)


def experts_grouped(expanded, counts, w_gate_up, w_down, mm):
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    gu = mm(expanded, w_gate_up, offs=offs)
    gate, up = gu.chunk(2, dim=-1)
    return mm(nnf.silu(gate) * up, w_down, offs=offs)


def moe_block(x, w_router, w_a, w_b, w_c, k, norm, gemm, follow=None):
    """w_a, w_b, w_c: gate, up, down (loop) or gate_up, down, None (grouped)."""
    e = w_router.shape[1]
    g, flat, order, token_of_pair = route(x, w_router, k, norm, follow)
    counts = torch.bincount(flat, minlength=e)
    expanded = x.index_select(0, token_of_pair)  # top-k expand: [T*K, H]
    if gemm == "loop":
        expert_out = experts_loop(expanded, counts, w_a, w_b, w_c)
    else:
        expert_out = experts_grouped(expanded, counts, w_a, w_b, grouped_mm_fn())
    weighted = expert_out * g.reshape(-1).index_select(0, order).unsqueeze(1).to(x.dtype)
    return torch.zeros_like(x).index_add(0, token_of_pair, weighted)  # weighted unpermute


def group_block(x, tok, gw, counts, wa, wb, wc, gemm):
    """One group of experts: its pairs' rows (tok: their tokens, sorted by
    expert; gw: their routing weights), its experts, the weighted rows."""
    expanded = x.index_select(0, tok)
    if gemm == "loop":
        out = experts_loop(expanded, counts, wa, wb, wc)
    else:
        out = experts_grouped(expanded, counts, wa, wb, grouped_mm_fn())
    return out * gw.unsqueeze(1).to(x.dtype)


def moe_groups(x, w_router, groups, k, norm, gemm, follow=None):
    """--groups: the router once, then each group under its own checkpoint.
    groups: per group (w_a, w_b, w_c), as layer_weights lays them out."""
    e = w_router.shape[1]
    per = e // len(groups)
    # Checkpointed too: the router's fp32 copy of x would otherwise be kept
    # for its backward through the whole step.
    g, flat, order, token_of_pair = checkpoint(route, x, w_router, k, norm, follow, use_reentrant=False)
    counts = torch.bincount(flat, minlength=e)
    # The group bounds in the sorted pairs reach the host once per step, as
    # relaymoe's expert counts do.
    ends = torch.cumsum(counts, 0).tolist()
    gw_sorted = g.reshape(-1).index_select(0, order)
    y = torch.zeros_like(x)
    for p, (wa, wb, wc) in enumerate(groups):
        first = ends[p * per - 1] if p else 0
        last = ends[(p + 1) * per - 1]
        if last == first:
            continue
        tok = token_of_pair[first:last]
        rows = checkpoint(group_block, x, tok, gw_sorted[first:last], counts[p * per:(p + 1) * per], wa, wb, wc,
                          gemm, use_reentrant=False)
        y = y.index_add(0, tok, rows)
    return y


def layer_weights(w, gemm, groups=1):
    """The weights in the layout the GEMM path takes: leaves to train.
    [router, a, b, c, None]; with groups > 1, [router, [(a, b, c)] per group]."""
    def layout(gate, up, down):
        if gemm == "loop":
            return [gate, up, down]
        return [torch.cat([gate, up], dim=-1).detach().requires_grad_(), down, None]

    if groups == 1:
        return [w["w_router"]] + layout(w["w_gate"], w["w_up"], w["w_down"]) + [None]
    e = w["w_gate"].shape[0]
    if e % groups:
        print(f"torch_moe.py: --groups {groups}: {e} experts do not split into {groups} equal groups", file=sys.stderr)
        sys.exit(2)
    per = e // groups
    leaf = lambda t: t.detach().clone().requires_grad_()  # noqa: E731
    parts = [layout(*[leaf(w[n][p * per:(p + 1) * per]) for n in ("w_gate", "w_up", "w_down")])
             for p in range(groups)]
    return [w["w_router"], parts]


def leaves(lw):
    """The tensors of layer_weights that get gradients."""
    if isinstance(lw[1], list):
        return [lw[0]] + [t for part in lw[1] for t in part if t is not None]
    return [t for t in lw if t is not None]


def run_layer(x, lw, k, norm, gemm, follow=None):
    if isinstance(lw[1], list):
        return moe_groups(x, lw[0], lw[1], k, norm, gemm, follow)
    return checkpoint(moe_block, x, lw[0], lw[1], lw[2], lw[3], k, norm, gemm, follow, use_reentrant=False)


def grads_of(lw, gemm):
    """dw_router, dw_gate, dw_up, dw_down, whatever the layout."""
    def grad(t):
        return t.grad if t.grad is not None else torch.zeros_like(t)

    def split(a, b, c):
        if gemm == "loop":
            return grad(a), grad(b), grad(c)
        dg, du = grad(a).chunk(2, dim=-1)
        return dg, du, grad(b)

    if isinstance(lw[1], list):
        per_group = [split(*part) for part in lw[1]]
        dg, du, dd = (torch.cat([pg[i] for pg in per_group], dim=0) for i in range(3))
    else:
        dg, du, dd = split(lw[1], lw[2], lw[3])
    return {"dw_router": lw[0].grad, "dw_gate": dg, "dw_up": du, "dw_down": dd}


def pick_gemm(a, device, dtype):
    """auto: grouped where it runs and agrees with the loop on a small uneven problem."""
    if a.gemm == "loop" or (a.gemm == "auto" and device.type != "cuda"):
        return "loop"
    mm = grouped_mm_fn()
    why = "this PyTorch has no grouped_mm" if mm is None else ""
    if mm is not None:
        try:
            gen = torch.Generator(device="cpu").manual_seed(7)
            h, f, e = 64, 32, 4
            counts = torch.tensor([5, 0, 19, 8])
            x = torch.randn(int(counts.sum()), h, generator=gen).to(device, dtype)
            w = {"w_gate": torch.randn(e, h, f, generator=gen), "w_up": torch.randn(e, h, f, generator=gen),
                 "w_down": torch.randn(e, f, h, generator=gen)}
            w = {n: (v / h ** 0.5).to(device, dtype) for n, v in w.items()}
            ref = experts_loop(x.float(), counts, w["w_gate"].float(), w["w_up"].float(), w["w_down"].float())
            got = experts_grouped(x, counts.to(device), torch.cat([w["w_gate"], w["w_up"]], -1), w["w_down"], mm)
            err = float(torch.linalg.norm(got.float() - ref) / torch.linalg.norm(ref))
            if err <= (2e-2 if dtype == torch.bfloat16 else 1e-4):
                return "grouped"
            why = f"grouped_mm differs from the loop by {err:.1e}"
        except (RuntimeError, TypeError, NotImplementedError) as ex:
            why = f"grouped_mm failed: {str(ex).splitlines()[0][:160]}"
    if a.gemm == "grouped":
        print(f"torch_moe.py: --gemm grouped: {why}", file=sys.stderr)
        sys.exit(1)
    print(f"torch_moe.py: {why}; using the loop of matmuls", file=sys.stderr)
    return "loop"


def setup(a):
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_moe.py: --device cuda but PyTorch sees no GPU", file=sys.stderr)
        sys.exit(77)
    device, dtype = torch.device(a.device), DTYPES[a.dtype]
    if device.type == "cpu":
        torch.set_num_threads(a.threads)
    return device, dtype, pick_gemm(a, device, dtype)


def vm_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def reset_hwm():
    """VmHWM restarts from the current RSS (Linux >= 4.0); False when not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def bench(a):
    device, dtype, gemm = setup(a)
    torch.manual_seed(a.seed)
    t, h, f, e = a.tokens, a.hidden, a.ffn, a.experts

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=device) * scale).to(dtype)

    x = randn(t, h).requires_grad_()
    dy = randn(t, h)
    # The router's weights stay fp32, as relaymoe's.
    w = {"w_router": (torch.randn(h, e, device=device) / h ** 0.5).requires_grad_(),
         "w_gate": randn(e, h, f, scale=h ** -0.5).requires_grad_(),
         "w_up": randn(e, h, f, scale=h ** -0.5).requires_grad_(),
         "w_down": randn(e, f, h, scale=f ** -0.5).requires_grad_()}
    lw = layer_weights(w, gemm, a.groups)
    del w  # the grouped layout and the groups hold their own copies
    params = [x] + leaves(lw)
    cuda = device.type == "cuda"

    def step():
        for p in params:
            p.grad = None
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        y = run_layer(x, lw, a.topk, True, gemm)
        y.backward(dy)
        if cuda:
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        return (time.perf_counter() - t0) * 1e3

    for _ in range(a.warmup):  # allocator pools, cuBLAS plans, first-touch pages
        step()
    for p in params:
        p.grad = None
    out = {"hidden": h, "ffn": f, "experts": e, "topk": a.topk, "tokens": t, "repeat": a.repeat,
           "device": a.device, "dtype": a.dtype, "gemm": gemm, "groups": a.groups, "torch": torch.__version__}
    if cuda:
        torch.cuda.synchronize()
        out["device_name"] = torch.cuda.get_device_name()
        out["resident_device_bytes"] = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        times = [step() for _ in range(a.repeat)]
        out["peak_device_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_device_reserved_bytes"] = torch.cuda.max_memory_reserved()
    else:
        rss_before = vm_kib("VmRSS")
        resettable = reset_hwm()
        times = [step() for _ in range(a.repeat)]
        peak_kib = vm_kib("VmHWM") if resettable else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out.update({"peak_rss_bytes": peak_kib * 1024, "rss_before_bytes": rss_before * 1024,
                    "peak_rss_source": "VmHWM after reset" if resettable else "ru_maxrss",
                    "threads": torch.get_num_threads()})
    out["times_ms"] = [round(v, 3) for v in times]
    out["median_ms"] = sorted(times)[len(times) // 2]
    print(json.dumps(out))
    return 0


def check(a):
    """relaymoe's dump and this peer's own path (--dtype, --gemm, --groups)
    against one float64 evaluation of the layer on the same inputs (each
    rounded to --dtype as both paths see it) and the same routing."""
    import numpy as np
    device, dtype, gemm = setup(a)

    def load(name, to=dtype):
        t = torch.from_numpy(np.load(f"{a.dir}/{name}.npy")).to(device)
        # the router's weights stay float32 in both paths (route)
        return t.to(to) if name == "w_router" else t.to(dtype).to(to)

    names = ("w_router", "w_gate", "w_up", "w_down")
    # relaymoe's routing (dumps since topk_idx.npy was added), followed at
    # near-ties only: a token routed otherwise beyond TIE_TOL keeps the
    # peer's own choice and shows in the errors below.
    follow = None
    try:
        follow = torch.from_numpy(np.load(f"{a.dir}/topk_idx.npy")).to(device, torch.int64)
    except FileNotFoundError:
        print(f"  {a.dir}/topk_idx.npy: none (an older dump); near-ties are not followed")
    x = load("x")
    if follow is not None:
        if tuple(follow.shape) != (x.shape[0], a.topk):
            print(f"torch_moe.py: {a.dir}/topk_idx.npy has shape {tuple(follow.shape)}, expected "
                  f"({x.shape[0]}, {a.topk}) (--topk {a.topk})", file=sys.stderr)
            return 2
        with torch.no_grad():
            probs = torch.softmax(x.float() @ load("w_router", torch.float32), dim=-1)
            g, idx = torch.topk(probs, a.topk, dim=-1)
            followed, beyond = follow_ties(probs, g, idx, follow)
        ties = int((followed != idx).any(dim=-1).sum())
        print(f"  routing: relaymoe's followed on {ties} of {x.shape[0]} tokens (a near-tie, within {TIE_TOL:.0e}); "
              f"{int(beyond.sum())} routed otherwise beyond it")

    def grads(to, path, groups):
        x = load("x", to).requires_grad_()
        w = {n: load(n, torch.float32 if n == "w_router" and to != torch.float64 else to).requires_grad_()
             for n in names}
        lw = layer_weights(w, path, groups)
        y = run_layer(x, lw, a.topk, not a.no_norm_topk, path, follow)
        y.backward(load("dy", to))
        return {"y": y.detach(), "dx": x.grad, **grads_of(lw, path)}

    # float64: the layer's definition, summed exactly enough to judge both
    ref = grads(torch.float64, "loop", 1)
    peer = grads(dtype, gemm, a.groups)
    worst = {"relaymoe": 0.0, "torch": 0.0}
    for name, want in ref.items():
        n = torch.linalg.norm(want)
        got = torch.from_numpy(np.load(f"{a.dir}/{name}.npy")).to(device, torch.float64)
        err = {"relaymoe": float(torch.linalg.norm(got - want) / n),
               "torch": float(torch.linalg.norm(peer[name].double() - want) / n)}
        for k in worst:
            worst[k] = max(worst[k], err[k])
        print(f"  {name:9s} {tuple(want.shape)} relative error against float64: relaymoe {err['relaymoe']:.2e}, "
              f"torch {err['torch']:.2e}")
    peer_tol = a.tol if a.peer_tol is None else a.peer_tol
    ok = worst["relaymoe"] <= a.tol and worst["torch"] <= peer_tol
    print(f"relaymoe ({a.dir}) and torch ({a.device}, {a.dtype}, {gemm} GEMMs, {a.groups} expert group(s)) against "
          f"float64: largest relative error {worst['relaymoe']:.2e} (tolerance {a.tol:.0e}) and "
          f"{worst['torch']:.2e} (tolerance {peer_tol:.0e}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    for n in ("hidden", "ffn", "experts", "topk", "tokens"):
        b.add_argument("--" + n, type=int, required=True)
    b.add_argument("--repeat", type=int, default=3)
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("--topk", type=int, required=True)
    c.add_argument("--no-norm-topk", action="store_true")
    # fp32 on both sides, summed in different orders (bf16: pass 2e-2)
    c.add_argument("--tol", type=float, default=1e-4)
    c.add_argument("--peer-tol", type=float, default=None,
                   help="the tolerance of this peer's own path (default: --tol)")
    for p in (b, c):
        p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
        p.add_argument("--dtype", choices=tuple(DTYPES), default="f32")
        p.add_argument("--gemm", choices=("auto", "grouped", "loop"), default="auto")
        p.add_argument("--threads", type=int, default=1, help="CPU threads (1: as one StarPU CPU worker)")
        p.add_argument("--groups", type=int, default=1,
                       help="experts in G groups, each under its own checkpoint (relaymoe's --partitions)")
    a = ap.parse_args()
    for n in ("hidden", "ffn", "experts", "topk", "tokens", "repeat", "groups"):
        if getattr(a, n, 1) < 1:
            ap.error(f"--{n} {getattr(a, n)}: expected a positive integer")
    return bench(a) if a.cmd == "bench" else check(a)


if __name__ == "__main__":
    sys.exit(main())
