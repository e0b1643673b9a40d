#!/usr/bin/python3
"""An independent NumPy implementation of the relaymoe layer (float64), for
checking `relaymoe run --load/--dump` against files.

  moe_numpy.py make DIR --ranks N --tokens T --hidden H --ffn F --experts E --seed S
                    [--shared-ffn FS [--shared-gated]]
      writes x, dy, w_router, w_gate, w_up, w_down (.npy, float32) into DIR, and
      with a shared expert w_shared_gate, w_shared_up, w_shared_down (and its
      gate w_shared_expert_gate)
  moe_numpy.py check IN OUT --topk K [--no-norm-topk] [--tol auto|T]
      computes y, dx and every gradient from IN/*.npy and compares them with
      OUT/*.npy (relative norm error), and OUT/topk_idx.npy with its own
      routing (a float32 near-tie aside); exits 1 past the tolerance or on a
      token routed otherwise. A shared
      expert is added where IN has its weights: ungated (DeepSeek-style), or,
      with w_shared_expert_gate.npy, as Qwen2-MoE's block adds it:
      sigmoid(x w_shared_expert_gate) * shared(x)
"""
import argparse
import os
import sys

import numpy as np


def silu(a):
    return a / (1.0 + np.exp(-a))


def route(x, w_router, k, norm):
    logits = x @ w_router
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    # K largest, descending; ties go to the lower expert (stable sort on -p)
    idx = np.argsort(-p, axis=1, kind="stable")[:, :k]
    g = np.take_along_axis(p, idx, axis=1)
    s = g.sum(axis=1, keepdims=True)
    return p, idx, (g / s if norm else g), s


def swiglu(x, dy, wg, wu, wd):
    """out = (silu(x wg) * (x wu)) wd, and for an output gradient dy the
    weights' gradients and dx."""
    a, b = x @ wg, x @ wu
    act = silu(a) * b
    dact = dy @ wd.T
    sig = 1.0 / (1.0 + np.exp(-a))
    da = dact * b * sig * (1.0 + a * (1.0 - sig))
    db = dact * silu(a)
    return act @ wd, x.T @ da, x.T @ db, act.T @ dy, da @ wg.T + db @ wu.T


def shared_expert(x, dy, shared):
    """Qwen2-MoE's shared expert (gated: sigmoid(x w) scales it per token) or
    DeepSeek's (ungated): its output and the gradients of its weights."""
    wg, wu, wd, gate = shared
    out, _, _, _, _ = swiglu(x, dy, wg, wu, wd)
    if gate is None:
        s = np.ones((x.shape[0], 1))
    else:
        s = 1.0 / (1.0 + np.exp(-(x @ gate)))[:, None]
    _, dwg, dwu, dwd, dx = swiglu(x, s * dy, wg, wu, wd)
    grads = {"dw_shared_gate": dwg, "dw_shared_up": dwu, "dw_shared_down": dwd}
    if gate is not None:
        dz = (dy * out).sum(axis=1, keepdims=True) * s * (1.0 - s)
        dx = dx + dz @ gate[None, :]
        grads["dw_shared_expert_gate"] = x.T @ dz[:, 0]
    return s * out, dx, grads


def layer(x, dy, w_router, w_gate, w_up, w_down, k, norm, shared=None):
    t, h = x.shape
    e = w_router.shape[1]
    p, idx, g, s = route(x, w_router, k, norm)
    y = np.zeros_like(x)
    dx = np.zeros_like(x)
    dgate, dup, ddown = (np.zeros_like(w_gate), np.zeros_like(w_up), np.zeros_like(w_down))
    dg = np.zeros_like(g)
    for ex in range(e):
        tok, slot = np.nonzero(idx == ex)
        if tok.size == 0:
            continue
        xe = x[tok]
        a = xe @ w_gate[ex]
        b = xe @ w_up[ex]
        act = silu(a) * b
        out = act @ w_down[ex]
        ge = g[tok, slot][:, None]
        np.add.at(y, tok, ge * out)
        dye = dy[tok]
        dg[tok, slot] = (dye * out).sum(axis=1)
        dout = ge * dye
        ddown[ex] += act.T @ dout
        dact = dout @ w_down[ex].T
        sig = 1.0 / (1.0 + np.exp(-a))
        da = dact * b * sig * (1.0 + a * (1.0 - sig))
        db = dact * silu(a)
        dgate[ex] += xe.T @ da
        dup[ex] += xe.T @ db
        np.add.at(dx, tok, da @ w_gate[ex].T + db @ w_up[ex].T)
    # router: through the renormalisation, then the softmax
    dpk = (dg - (dg * g).sum(axis=1, keepdims=True)) / s if norm else dg
    dp = np.zeros_like(p)
    np.put_along_axis(dp, idx, dpk, axis=1)
    dlogits = p * (dp - (p * dp).sum(axis=1, keepdims=True))
    dx += dlogits @ w_router.T
    out = {"y": y, "dx": dx, "dw_router": x.T @ dlogits, "dw_gate": dgate, "dw_up": dup,
           "dw_down": ddown}
    if shared is not None:
        ys, dxs, grads = shared_expert(x, dy, shared)
        out["y"] = y + ys
        out["dx"] = dx + dxs
        out.update(grads)
    return out


def make(a):
    rng = np.random.default_rng(a.seed)
    n, t, h, f, e = a.ranks, a.tokens, a.hidden, a.ffn, a.experts

    def u(shape, scale):
        return (rng.uniform(-1, 1, size=shape) * scale).astype(np.float32)

    arrays = {"x": u((n * t, h), 1.0), "dy": u((n * t, h), 1.0),
              "w_router": u((h, e), h ** -0.5), "w_gate": u((e, h, f), h ** -0.5),
              "w_up": u((e, h, f), h ** -0.5), "w_down": u((e, f, h), f ** -0.5)}
    if a.shared_ffn > 0:
        fs = a.shared_ffn
        arrays.update({"w_shared_gate": u((h, fs), h ** -0.5), "w_shared_up": u((h, fs), h ** -0.5),
                       "w_shared_down": u((fs, h), fs ** -0.5)})
        if a.shared_gated:
            arrays["w_shared_expert_gate"] = u((h,), h ** -0.5)
    for name, v in arrays.items():
        np.save(f"{a.dir}/{name}.npy", v)


def fp32_tolerance(load):
    """What fp32 rounding allows: Higham's gamma_n = n u / (1 - n u), u =
    2^-24, for the longest chain of accumulations an output goes through: a
    forward GEMM over H, the down projection over F, a weight gradient over
    every token (n = H + F + all tokens; K and E only shorten the sums)."""
    n = load["x"].shape[1] + load["w_gate"].shape[2] + load["x"].shape[0]
    u = 2.0 ** -24
    return n * u / (1 - n * u)


def check(a):
    load = {n: np.load(f"{a.inp}/{n}.npy").astype(np.float64)
            for n in ("x", "dy", "w_router", "w_gate", "w_up", "w_down")}
    shared = None
    if os.path.exists(f"{a.inp}/w_shared_gate.npy"):
        ws = [np.load(f"{a.inp}/w_shared_{n}.npy").astype(np.float64) for n in ("gate", "up", "down")]
        gate = f"{a.inp}/w_shared_expert_gate.npy"
        shared = (*ws, np.load(gate).astype(np.float64) if os.path.exists(gate) else None)
    want = layer(load["x"], load["dy"], load["w_router"], load["w_gate"], load["w_up"],
                 load["w_down"], a.topk, not a.no_norm_topk, shared)
    worst = 0.0
    for name, ref in want.items():
        got = np.load(f"{a.out}/{name}.npy")
        if got.dtype != np.float32 or got.shape != ref.shape:
            print(f"{name}: {got.dtype} {got.shape}, expected float32 {ref.shape}")
            return 1
        err = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300)
        worst = max(worst, err)
        print(f"{name:21s} relative error {err:.2e}")
    # The dump's routing (topk_idx.npy, int32 [N*T, K]): each token's
    # experts as the float64 router picks them, but at a float32 near-tie.
    p, idx, _, _ = route(load["x"], load["w_router"], a.topk, not a.no_norm_topk)
    got = np.load(f"{a.out}/topk_idx.npy")
    if got.dtype != np.int32 or got.shape != idx.shape:
        print(f"topk_idx: {got.dtype} {got.shape}, expected int32 {idx.shape}")
        return 1
    differ = (np.sort(got, axis=1) != np.sort(idx, axis=1)).any(axis=1)
    kth = np.take_along_axis(p, idx[:, -1:], axis=1)[:, 0]
    tied = kth - np.take_along_axis(p, got.astype(np.int64), axis=1).min(axis=1) <= 1e-6
    wrong = int((differ & ~tied).sum())
    print(f"topk_idx              {int(differ.sum())} of {len(idx)} tokens routed otherwise, "
          f"{wrong} of them beyond a near-tie")
    tol = fp32_tolerance(load) if a.tol == "auto" else float(a.tol)
    ok = worst <= tol and wrong == 0
    print(f"largest {worst:.2e}, tolerance {tol:.1e}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    for opt in ("ranks", "tokens", "hidden", "ffn", "experts", "seed"):
        m.add_argument(f"--{opt}", type=int, required=True)
    m.add_argument("--shared-ffn", type=int, default=0)
    m.add_argument("--shared-gated", action="store_true")
    c = sub.add_parser("check")
    c.add_argument("inp")
    c.add_argument("out")
    c.add_argument("--topk", type=int, required=True)
    c.add_argument("--no-norm-topk", action="store_true")
    c.add_argument("--tol", default="auto", help="relative norm error allowed (auto: from fp32 rounding)")
    a = ap.parse_args()
    if a.cmd == "make":
        make(a)
        return 0
    return check(a)


if __name__ == "__main__":
    sys.exit(main())
