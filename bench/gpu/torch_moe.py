#!/usr/bin/python3
"""The relaymoe layer in PyTorch, all-to-all style at EP=1: the peer a user
would run instead, for time and memory on the same machine, on the CPU
(bench/memory/) or on a GPU (bench/gpu/).

Router softmax (fp32) and top-k with renormalised weights; permute the
token-expert pairs by expert and expand the tokens to [T*K, H]; SwiGLU
experts; weighted unpermute. The whole MoE block runs under one activation
checkpoint, so backward recomputes it, as Megatron-LM does with
recomputation on and as relaymoe's all-to-all backward does.

The experts' GEMMs (--gemm):
  grouped  one grouped GEMM per matrix over all experts (torch's
           grouped_mm, bf16 on sm_90, offsets on the device: no host sync),
           gate and up fused into one [E, H, 2F] weight, as Megatron-LM's
           GroupedMLP; checked against the loop on a small problem first
  loop     torch.matmul per expert (what the CPU has)
  auto     grouped where it runs (a GPU), else loop

  torch_moe.py bench --hidden H --ffn F --experts E --topk K --tokens T
                     [--repeat R] [--device cpu|cuda] [--dtype f32|bf16] [--gemm auto|grouped|loop]
      forward+backward steps after warm-ups, R times; prints one JSON line:
      median ms (and every step's), peak memory of the timed steps (CPU:
      VmHWM; GPU: max_memory_allocated and max_memory_reserved) and what was
      resident before them (inputs and weights)
  torch_moe.py check DIR --topk K [--tol 1e-4] [--device ...] [--dtype ...] [--gemm ...]
      runs the layer on DIR/x.npy, dy.npy and the weights (`relaymoe run
      --dump DIR`) and compares y, dx and every gradient with DIR's outputs
      (relative norm error); exits 1 past the tolerance

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


def route(x, w_router, k, norm):
    """fp32 softmax top-k; pairs sorted by expert (stable: token order inside an expert)."""
    probs = torch.softmax(x.float() @ w_router.float(), dim=-1)
    g, idx = torch.topk(probs, k, dim=-1)
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


def moe_block(x, w_router, w_a, w_b, w_c, k, norm, gemm):
    """w_a, w_b, w_c: gate, up, down (loop) or gate_up, down, None (grouped)."""
    e = w_router.shape[1]
    g, flat, order, token_of_pair = route(x, w_router, k, norm)
    counts = torch.bincount(flat, minlength=e)
    expanded = x.index_select(0, token_of_pair)  # top-k expand: [T*K, H]
    if gemm == "loop":
        expert_out = experts_loop(expanded, counts, w_a, w_b, w_c)
    else:
        expert_out = experts_grouped(expanded, counts, w_a, w_b, grouped_mm_fn())
    weighted = expert_out * g.reshape(-1).index_select(0, order).unsqueeze(1).to(x.dtype)
    return torch.zeros_like(x).index_add(0, token_of_pair, weighted)  # weighted unpermute


def layer_weights(w, gemm):
    """The weights in the layout the GEMM path takes: leaves to train."""
    if gemm == "loop":
        return [w["w_router"], w["w_gate"], w["w_up"], w["w_down"], None]
    gate_up = torch.cat([w["w_gate"], w["w_up"]], dim=-1).detach().requires_grad_()
    return [w["w_router"], gate_up, w["w_down"], None, None]


def run_layer(x, lw, k, norm, gemm):
    return checkpoint(moe_block, x, lw[0], lw[1], lw[2], lw[3], k, norm, gemm, use_reentrant=False)


def grads_of(lw, gemm):
    """dw_router, dw_gate, dw_up, dw_down, whatever the layout."""
    if gemm == "loop":
        return {"dw_router": lw[0].grad, "dw_gate": lw[1].grad, "dw_up": lw[2].grad, "dw_down": lw[3].grad}
    dg, du = lw[1].grad.chunk(2, dim=-1)
    return {"dw_router": lw[0].grad, "dw_gate": dg, "dw_up": du, "dw_down": lw[2].grad}


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
    lw = layer_weights(w, gemm)
    del w  # the grouped layout holds its own copy of gate and up
    params = [x] + [p for p in lw if p is not None]
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
           "device": a.device, "dtype": a.dtype, "gemm": gemm, "torch": torch.__version__}
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
    import numpy as np
    device, dtype, gemm = setup(a)

    def load(name, to=dtype):
        return torch.from_numpy(np.load(f"{a.dir}/{name}.npy")).to(device, to)

    x = load("x").requires_grad_()
    dy = load("dy")
    w = {n: load(n, torch.float32 if n == "w_router" else dtype).requires_grad_()
         for n in ("w_router", "w_gate", "w_up", "w_down")}
    lw = layer_weights(w, gemm)
    y = run_layer(x, lw, a.topk, not a.no_norm_topk, gemm)
    y.backward(dy)
    mine = {"y": y, "dx": x.grad, **grads_of(lw, gemm)}
    worst = 0.0
    for name, got in mine.items():
        ref = load(name, torch.float64)
        err = float(torch.linalg.norm(got.detach().double() - ref) / torch.linalg.norm(ref))
        worst = max(worst, err)
        print(f"  {name:9s} {tuple(ref.shape)} relative error {err:.2e}")
    ok = worst <= a.tol
    print(f"torch ({a.device}, {a.dtype}, {gemm} GEMMs) vs relaymoe ({a.dir}): largest relative error {worst:.2e}, "
          f"tolerance {a.tol:.0e}: {'PASS' if ok else 'FAIL'}")
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
    for p in (b, c):
        p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
        p.add_argument("--dtype", choices=tuple(DTYPES), default="f32")
        p.add_argument("--gemm", choices=("auto", "grouped", "loop"), default="auto")
        p.add_argument("--threads", type=int, default=1, help="CPU threads (1: as one StarPU CPU worker)")
    a = ap.parse_args()
    for n in ("hidden", "ffn", "experts", "topk", "tokens", "repeat"):
        if getattr(a, n, 1) < 1:
            ap.error(f"--{n} {getattr(a, n)}: expected a positive integer")
    return bench(a) if a.cmd == "bench" else check(a)


if __name__ == "__main__":
    sys.exit(main())
