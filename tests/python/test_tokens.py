"""One layer, any token count: a layer of capacity C (conftest's SHAPE
tokens) run with counts that change from call to call and differ between
the ranks, 0 on one rank, and above C (the capacity grows on every rank),
for every dispatch in f32 and bf16, against the NumPy reference: y, dx, the
router's gradient (this rank's part), the experts' gradients (complete over
every rank's tokens) and the routing. Also the _raw calls with tokens=, and
the counts refused: negative ones, growth under mem_cap, a dy of another
count than the last forward's."""
import numpy as np
import pytest

import moe_reference as ref
import relaymoe
from conftest import SHAPE, TOL, make_weights, uniform
from test_layer import to_bf16

CAP = SHAPE["tokens"]
# Rank r's count in each call (ranks take the columns in turn; ranks past
# the second add 7 per pair, so that no two pairs agree): under the
# capacity on one rank, none on rank 0 then on rank 1, above the capacity
# (it grows on every rank), then above the grown one on the other rank.
CALLS = [(CAP, CAP // 2 + 1), (0, 37), (13, 0), (CAP + 29, 5), (3, CAP + 40)]
# bf16 storage of x, dy, the experts' weights and the activations (8
# significant bits), fp32 accumulation: the project's bound for bf16.
TOL_BF16 = 1e-2
DISPATCHES = ["ring", "token", "a2a", "a2a-megatron", "a2a-deepep"]


def counts_of(call, nranks):
    return [CALLS[call][r % 2] + (7 * (r // 2) if CALLS[call][r % 2] else 0) for r in range(nranks)]


def make_call(seed, counts, hidden, experts):
    """Every rank's x, dy and dprobs, stacked in rank order (each rank draws
    them all, so it can compute the experts' complete gradients), and the
    offsets of each rank's rows."""
    rng = np.random.default_rng(seed)
    n = sum(counts)
    x, dy = uniform(rng, (n, hidden), 1.0), uniform(rng, (n, hidden), 1.0)
    dp = uniform(rng, (n, experts), 1.0)
    return x, dy, dp, np.cumsum([0] + list(counts))


def rows_of(rank, offsets, *arrays):
    """This rank's rows of each array."""
    return tuple(np.ascontiguousarray(a[offsets[rank]:offsets[rank + 1]]) for a in arrays)


def reference(w, topk, x_all, dy_all, dp_all, offsets, rank):
    """This rank's y, dx, dw_router and routing, and the experts' gradients
    over every rank's tokens."""
    whole = {k: np.zeros(w[k].shape) for k in ("w_gate", "w_up", "w_down")}
    for r in range(len(offsets) - 1):
        rows = slice(offsets[r], offsets[r + 1])
        y, cache = ref.forward(x_all[rows], w, topk)
        dx, dw = ref.backward(dy_all[rows], cache, dp_all[rows])
        for k in whole:
            whole[k] += dw[k]
        if r == rank:
            mine = (y, dx, dw["w_router"], cache)
    return mine + (whole,)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_counts_change_per_call_and_rank(ctx, comm, dispatch, dtype):
    rank, size = comm.Get_rank(), comm.Get_size()
    H, E, K = SHAPE["hidden"], SHAPE["experts"], SHAPE["topk"]
    w = make_weights(61, **SHAPE)
    bf16 = dtype == "bf16"
    # The reference runs on the values a bf16 layer stores: x, dy and the
    # experts' weights in bf16, the router in fp32 (as test_layer's test_bf16).
    wr = dict(w, **{k: to_bf16(w[k]) for k in ("w_gate", "w_up", "w_down")}) if bf16 else w
    tol = TOL_BF16 if bf16 else TOL
    with relaymoe.Layer(ctx, **SHAPE, dispatch=dispatch, dtype=dtype) as layer:
        assert layer.tokens == layer.forward_tokens == CAP and layer.config["tokens"] == CAP
        layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
        own = slice(layer.owned_experts.start, layer.owned_experts.stop)
        for call in range(len(CALLS)):
            counts = counts_of(call, size)
            x_all, dy_all, dp_all, at = make_call(100 + call, counts, H, E)
            x, dy, dp = rows_of(rank, at, x_all, dy_all, dp_all)
            y = layer.forward(x)
            assert layer.tokens == layer.forward_tokens == counts[rank]
            dx = layer.backward(dy, dprobs=dp)
            g = layer.grads()
            idx, gw, probs = layer.routing()
            if bf16:
                x_all, dy_all = to_bf16(x_all), to_bf16(dy_all)
            want_y, want_dx, want_router, cache, whole = reference(wr, K, x_all, dy_all, dp_all, at, rank)
            where = f"call {call}, counts {counts}"
            assert y.shape == dx.shape == (counts[rank], H), where
            assert idx.shape == gw.shape == (counts[rank], K) and probs.shape == (counts[rank], E), where
            errors = {
                "y": ref.relative_error(y, want_y),
                "dx": ref.relative_error(dx, want_dx),
                "dw_router (this rank's part)": ref.relative_error(g["dw_router"], want_router),
                "dw_gate": ref.relative_error(g["dw_gate"], whole["w_gate"][own]),
                "dw_up": ref.relative_error(g["dw_up"], whole["w_up"][own]),
                "dw_down": ref.relative_error(g["dw_down"], whole["w_down"][own]),
                "routing weights": ref.relative_error(gw, cache["g"]),
                "probs": ref.relative_error(probs, cache["p"]),
            }
            assert max(errors.values()) <= tol, (where, errors)
            if counts[rank] == 0:
                # No tokens: no part of the router's gradient, not the last call's.
                assert not np.any(g["dw_router"]), where
            if not bf16:
                assert np.array_equal(idx, cache["idx"]), where


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_raw_calls_take_tokens(ctx, comm, dtype):
    # forward_raw's tokens= sets the count (kept for the calls that omit
    # it); the raw calls give the float32 calls' results bit for bit in
    # deterministic mode.
    rank, size = comm.Get_rank(), comm.Get_size()
    H = SHAPE["hidden"]
    w = make_weights(71, **SHAPE)
    if dtype == "bf16":
        to_el = lambda a: (to_bf16(a).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
        from_el = lambda a: (a.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    else:
        to_el = from_el = lambda a: np.ascontiguousarray(a, np.float32)  # noqa: E731
    with relaymoe.Layer(ctx, **SHAPE, dtype=dtype, deterministic=True) as layer:
        layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
        for call, given in enumerate((True, False, True, True)):
            counts = counts_of(call + 1, size)
            x_all, dy_all, _, at = make_call(200 + call, counts, H, SHAPE["experts"])
            x, dy = rows_of(rank, at, x_all, dy_all)
            y, dx = layer.forward(x), layer.backward(dy)
            # One row more than the count: an address for every rank, the
            # one without tokens too.
            pad = np.ones((1, H), np.float32)
            xr, dyr = to_el(np.vstack([x, pad])), to_el(np.vstack([dy, pad]))
            yr, dxr = np.zeros_like(xr), np.zeros_like(xr)
            if given:
                layer.set_tokens(CAP)  # replaced by tokens=
                layer.forward_raw(xr.ctypes.data, yr.ctypes.data, device=False, tokens=counts[rank])
            else:
                # The count forward set, kept.
                layer.forward_raw(xr.ctypes.data, yr.ctypes.data, device=False)
            assert layer.tokens == layer.forward_tokens == counts[rank]
            layer.backward_raw(dyr.ctypes.data, dxr.ctypes.data, device=False)
            n = counts[rank]
            assert np.array_equal(from_el(yr[:n]), y) and np.array_equal(from_el(dxr[:n]), dx), (call, counts)


def test_counts_refused(ctx, comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    H = SHAPE["hidden"]
    w = make_weights(81, **SHAPE)
    x_all, dy_all, _, at = make_call(300, counts_of(0, size), H, SHAPE["experts"])
    x, dy = rows_of(rank, at, x_all, dy_all)
    y_want, cache = ref.forward(x, w, SHAPE["topk"])
    with relaymoe.Layer(ctx, **SHAPE, deterministic=True) as layer:
        layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
        with pytest.raises(relaymoe.RelayMoEError) as info:
            layer.set_tokens(-1)
        assert info.value.code == relaymoe.RMOE_EINVAL and "tokens = -1" in info.value.message
        assert layer.tokens == CAP
        with pytest.raises(TypeError, match="tokens: an int is expected"):
            layer.set_tokens(2.5)
        # Refused on every rank before the forward: the others are not left waiting.
        y = np.empty_like(x)
        with pytest.raises(relaymoe.RelayMoEError, match="tokens = -3"):
            layer.forward_raw(x.ctypes.data, y.ctypes.data, device=False, tokens=-3)
        # A dy of another count than the last forward's names that count.
        assert ref.relative_error(layer.forward(x), y_want) <= TOL
        short = np.ascontiguousarray(np.vstack([dy, dy[:1]]))
        want = rf"dy: shape \({len(x) + 1}, {H}\), expected float32 \[T={len(x)}, H={H}\]"
        with pytest.raises(ValueError, match=want):
            layer.backward(short)
        # x may have any rows, but H columns.
        with pytest.raises(ValueError, match=rf"x: shape \({len(x)}, {H - 1}\), expected float32 \[T, H={H}\]"):
            layer.forward(np.ascontiguousarray(x[:, 1:]))
        dx_want, _ = ref.backward(dy, cache)
        assert ref.relative_error(layer.backward(dy), dx_want) <= TOL


def test_growth_under_mem_cap_refused(ctx, comm):
    # mem_cap was planned for the capacity: a forward above it fails on
    # every rank, naming the rank and its count; counts within it still run.
    rank, size = comm.Get_rank(), comm.Get_size()
    H = SHAPE["hidden"]
    w = make_weights(91, **SHAPE)
    with relaymoe.Layer(ctx, **SHAPE, dispatch="ring", mem_cap=1 << 34) as layer:
        layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
        counts = [CAP + 1 if r == size - 1 else 4 for r in range(size)]
        x_all, _, _, at = make_call(400, counts, H, SHAPE["experts"])
        (x,) = rows_of(rank, at, x_all)
        with pytest.raises(relaymoe.RelayMoEError) as info:
            layer.forward(x)
        assert info.value.code == relaymoe.RMOE_EINVAL, info.value
        assert f"rank {size - 1}: {CAP + 1} tokens" in info.value.message and "mem_cap" in info.value.message
        x = np.ascontiguousarray(x[:4])
        y_want, _ = ref.forward(x, w, SHAPE["topk"])
        assert ref.relative_error(layer.forward(x), y_want) <= TOL
