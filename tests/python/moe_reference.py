"""The relaymoe layer in NumPy, float64, from its definition (docs/running.md,
"The layer"), for the Python tests: forward and backward of

    p = softmax(x w_router); the K largest p per token (ties: lower expert
    first); g = those p (divided by their sum with norm_topk);
    expert_e(x) = (silu(x w_gate[e]) * (x w_up[e])) w_down[e];
    y = sum_k g_k expert_{i_k}(x) + shared(x), or with w_shared_expert_gate
    (Qwen2-MoE) + sigmoid(x w_shared_expert_gate) shared(x).

Gradients flow through g into p and the router; the top-k choice is not
differentiated. Weights are the whole layer's: w_gate, w_up [E, H, F],
w_down [E, F, H].
"""
import numpy as np


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _swiglu(x, wg, wu, wd):
    a, b = x @ wg, x @ wu
    act = a * _sigmoid(a) * b
    return act @ wd, (a, b, act)


def _swiglu_backward(x, wg, wu, wd, saved, dout):
    a, b, act = saved
    s = _sigmoid(a)
    dact = dout @ wd.T
    da = dact * b * (s + a * s * (1.0 - s))  # d silu(a) / da = s + a s (1 - s)
    db = dact * a * s
    return da @ wg.T + db @ wu.T, x.T @ da, x.T @ db, act.T @ dout


def forward(x, w, topk, norm_topk=True):
    """y [T, H] and what backward needs. w: dict of float arrays (w_router,
    w_gate, w_up, w_down, and w_shared_gate/up/down for a shared expert)."""
    x = np.asarray(x, np.float64)
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    logits = x @ w["w_router"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    # Stable sort of -p: equal probabilities keep the lower expert first.
    idx = np.argsort(-p, axis=1, kind="stable")[:, :topk]
    chosen = np.take_along_axis(p, idx, axis=1)
    total = chosen.sum(axis=1, keepdims=True)
    g = chosen / total if norm_topk else chosen
    y = np.zeros_like(x)
    outs = {}
    for ex in range(w["w_router"].shape[1]):
        rows, slots = np.nonzero(idx == ex)
        if rows.size == 0:
            continue
        out, saved = _swiglu(x[rows], w["w_gate"][ex], w["w_up"][ex], w["w_down"][ex])
        y[rows] += g[rows, slots][:, None] * out
        outs[ex] = (rows, slots, out, saved)
    shared = None
    if "w_shared_gate" in w:
        out, saved = _swiglu(x, w["w_shared_gate"], w["w_shared_up"], w["w_shared_down"])
        gate = _sigmoid(x @ w["w_shared_expert_gate"])[:, None] if "w_shared_expert_gate" in w else None
        shared = (saved, out, gate)
        y += out if gate is None else gate * out
    cache = dict(x=x, w=w, p=p, idx=idx, chosen=chosen, total=total, g=g, outs=outs, shared=shared,
                 norm_topk=norm_topk)
    return y, cache


def backward(dy, cache, dprobs=None):
    """dx [T, H] and the weight gradients (dw_router from these tokens, the
    experts' from these tokens) for dy [T, H] (and dprobs [T, E], a gradient
    on p added to the one through g)."""
    dy = np.asarray(dy, np.float64)
    x, w, p, idx, g = cache["x"], cache["w"], cache["p"], cache["idx"], cache["g"]
    dx = np.zeros_like(x)
    dw = {name: np.zeros_like(w[name]) for name in ("w_gate", "w_up", "w_down")}
    dg = np.zeros_like(g)
    for ex, (rows, slots, out, saved) in cache["outs"].items():
        dg[rows, slots] = (dy[rows] * out).sum(axis=1)
        ddx, dwg, dwu, dwd = _swiglu_backward(x[rows], w["w_gate"][ex], w["w_up"][ex], w["w_down"][ex], saved,
                                              g[rows, slots][:, None] * dy[rows])
        np.add.at(dx, rows, ddx)
        dw["w_gate"][ex] += dwg
        dw["w_up"][ex] += dwu
        dw["w_down"][ex] += dwd
    if cache["shared"] is not None:
        saved, out, gate = cache["shared"]
        ddx, dwg, dwu, dwd = _swiglu_backward(x, w["w_shared_gate"], w["w_shared_up"], w["w_shared_down"],
                                              saved, dy if gate is None else gate * dy)
        dx += ddx
        dw.update(w_shared_gate=dwg, w_shared_up=dwu, w_shared_down=dwd)
        if gate is not None:
            dz = (dy * out).sum(axis=1, keepdims=True) * gate * (1.0 - gate)
            dx += dz @ w["w_shared_expert_gate"][None, :]
            dw["w_shared_expert_gate"] = x.T @ dz[:, 0]
    # Through the renormalisation g = c / sum(c), then the softmax.
    if cache["norm_topk"]:
        dchosen = (dg - (dg * g).sum(axis=1, keepdims=True)) / cache["total"]
    else:
        dchosen = dg
    dp = np.zeros_like(p)
    np.put_along_axis(dp, idx, dchosen, axis=1)
    if dprobs is not None:
        dp += np.asarray(dprobs, np.float64)
    dlogits = p * (dp - (p * dp).sum(axis=1, keepdims=True))
    dx += dlogits @ w["w_router"].T
    dw["w_router"] = x.T @ dlogits
    return dx, dw


def relative_error(got, want):
    """|got - want| / |want| in the Frobenius norm."""
    want = np.asarray(want, np.float64)
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / max(np.linalg.norm(want), 1e-300))
