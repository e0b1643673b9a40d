#!/usr/bin/python3
"""The relaymoe layer in PyTorch on the CPU, all-to-all style at EP=1: the
peer a user would run instead, for time and memory on the same machine.

Router softmax (fp32) and top-k with renormalised weights; permute the
token-expert pairs by expert and expand the tokens to [T*K, H]; SwiGLU
experts as a loop of torch.matmul over the experts (the CPU stand-in for a
grouped GEMM); weighted unpermute. The whole MoE block runs under one
activation checkpoint, so backward recomputes it, as Megatron-LM does with
recomputation on and as relaymoe's all-to-all backward does.

  torch_moe.py bench --hidden H --ffn F --experts E --topk K --tokens T [--repeat R]
      one fp32 forward+backward after a warm-up, R times, one thread; prints
      one JSON line: median ms, peak RSS of the timed steps, RSS before them
  torch_moe.py check DIR --topk K [--tol 1e-4]
      runs the layer on DIR/x.npy, dy.npy and the weights (`relaymoe run
      --dump DIR`) and compares y, dx and every gradient with DIR's outputs
      (relative norm error); exits 1 past the tolerance

Needs python3-torch (Debian): RMOE_SETUP_EXTRA=python3-torch scripts/setup.sh
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


def moe_block(x, w_router, w_gate, w_up, w_down, k, norm=True):
    t, h = x.shape
    e = w_router.shape[1]
    probs = torch.softmax(x.float() @ w_router.float(), dim=-1)
    g, idx = torch.topk(probs, k, dim=-1)
    if norm:
        g = g / g.sum(dim=-1, keepdim=True)
    # permute: pairs sorted by expert (stable, so token order inside an expert)
    flat = idx.reshape(-1)
    _, order = torch.sort(flat, stable=True)
    token_of_pair = torch.div(order, k, rounding_mode="floor")
    counts = torch.bincount(flat, minlength=e).tolist()
    expanded = x.index_select(0, token_of_pair)  # top-k expand: [T*K, H]
    # split and unbind, not slicing and indexing: their backward is one
    # concatenation, where each slice's would zero-fill a full-size gradient
    rows = torch.split(expanded, counts)
    gate, up, down = w_gate.unbind(0), w_up.unbind(0), w_down.unbind(0)
    outs = [(nnf.silu(xe @ gate[ex]) * (xe @ up[ex])) @ down[ex] for ex, xe in enumerate(rows) if counts[ex]]
    expert_out = torch.cat(outs, dim=0)
    weighted = expert_out * g.reshape(-1).index_select(0, order).unsqueeze(1).to(x.dtype)
    # weighted unpermute
    return torch.zeros_like(x).index_add(0, token_of_pair, weighted)


def run_layer(x, w, k, norm=True):
    return checkpoint(moe_block, x, w["w_router"], w["w_gate"], w["w_up"], w["w_down"], k, norm,
                      use_reentrant=False)


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
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    t, h, f, e = a.tokens, a.hidden, a.ffn, a.experts
    x = torch.randn(t, h).requires_grad_()
    dy = torch.randn(t, h)
    w = {"w_router": (torch.randn(h, e) / h ** 0.5).requires_grad_(),
         "w_gate": (torch.randn(e, h, f) / h ** 0.5).requires_grad_(),
         "w_up": (torch.randn(e, h, f) / h ** 0.5).requires_grad_(),
         "w_down": (torch.randn(e, f, h) / f ** 0.5).requires_grad_()}
    params = [x] + list(w.values())

    def step():
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        y = run_layer(x, w, a.topk)
        y.backward(dy)
        return (time.perf_counter() - t0) * 1e3

    step()  # warm-up: allocator pools and first-touch pages, as relaymoe's warm-up run
    rss_before = vm_kib("VmRSS")
    resettable = reset_hwm()
    times = [step() for _ in range(a.repeat)]
    peak_kib = vm_kib("VmHWM") if resettable else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times.sort()
    print(json.dumps({"hidden": h, "ffn": f, "experts": e, "topk": a.topk, "tokens": t,
                      "repeat": a.repeat, "median_ms": times[len(times) // 2],
                      "peak_rss_bytes": peak_kib * 1024, "rss_before_bytes": rss_before * 1024,
                      "peak_rss_source": "VmHWM after reset" if resettable else "ru_maxrss",
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))
    return 0


def check(a):
    import numpy as np
    torch.set_num_threads(1)

    def load(name):
        return torch.from_numpy(np.load(f"{a.dir}/{name}.npy")).to(torch.float32)

    x = load("x").requires_grad_()
    dy = load("dy")
    w = {n: load(n).requires_grad_() for n in ("w_router", "w_gate", "w_up", "w_down")}
    y = run_layer(x, w, a.topk, not a.no_norm_topk)
    y.backward(dy)
    mine = {"y": y, "dx": x.grad, "dw_router": w["w_router"].grad, "dw_gate": w["w_gate"].grad,
            "dw_up": w["w_up"].grad, "dw_down": w["w_down"].grad}
    worst = 0.0
    for name, got in mine.items():
        ref = load(name).double()
        err = float(torch.linalg.norm(got.detach().double() - ref) / torch.linalg.norm(ref))
        worst = max(worst, err)
        print(f"  {name:9s} {tuple(ref.shape)} relative error {err:.2e}")
    ok = worst <= a.tol
    print(f"torch vs relaymoe ({a.dir}): largest relative error {worst:.2e}, tolerance {a.tol:.0e}: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    for n in ("hidden", "ffn", "experts", "topk", "tokens"):
        b.add_argument("--" + n, type=int, required=True)
    b.add_argument("--repeat", type=int, default=3)
    b.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("--topk", type=int, required=True)
    c.add_argument("--no-norm-topk", action="store_true")
    # fp32 on both sides, summed in different orders
    c.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    return bench(a) if a.cmd == "bench" else check(a)


if __name__ == "__main__":
    sys.exit(main())
