"""The Python layer against the NumPy reference of moe_reference.py: outputs,
input gradients, router and expert gradients, routing, for every dispatch."""
import numpy as np
import pytest

import moe_reference as ref
import relaymoe
from conftest import SHAPE, TOL, expected, make_tokens, make_weights


def run_layer(ctx, comm, seed, dprobs=False, **options):
    cfg = dict(SHAPE, **options)
    w = make_weights(seed, **cfg)
    x_all, dy_all, x, dy = make_tokens(seed + 1, comm, **cfg)
    dp = None
    if dprobs:
        rng = np.random.default_rng(seed + 2 + comm.Get_rank())
        dp = rng.uniform(-1, 1, (cfg["tokens"], cfg["experts"])).astype(np.float32)
    with relaymoe.Layer(ctx, **cfg) as layer:
        layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
        if cfg.get("shared_ffn"):
            layer.set_shared(w["w_shared_gate"], w["w_shared_up"], w["w_shared_down"])
        if cfg.get("shared_gated"):
            layer.set_shared_expert_gate(w["w_shared_expert_gate"])
            assert np.array_equal(layer.get_shared_expert_gate(), w["w_shared_expert_gate"])
        y = layer.forward(x)
        dx = layer.backward(dy, dprobs=dp)
        got = dict(y=y, dx=dx, routing=layer.routing(), owned=layer.owned_experts, **layer.grads())
        if cfg.get("shared_ffn"):
            got["shared"] = layer.grad_shared()
        if cfg.get("shared_gated"):
            got["shared_expert_gate"] = layer.grad_shared_expert_gate()
    return cfg, w, x_all, dy_all, x, dy, dp, got


@pytest.mark.parametrize("options", [
    dict(dispatch="ring"),
    dict(dispatch="token"),
    dict(dispatch="a2a"),
    dict(dispatch="a2a-megatron"),
    dict(dispatch="a2a-deepep"),
    dict(dispatch="ring", norm_topk=False),
    dict(dispatch="ring", shared_ffn=16),
    dict(dispatch="ring", shared_ffn=16, shared_gated=True, norm_topk=False),
    dict(dispatch="a2a", shared_ffn=16, shared_gated=True),
], ids=["ring", "token", "a2a", "a2a-megatron", "a2a-deepep", "ring-no-norm", "ring-shared", "ring-shared-gated",
        "a2a-shared-gated"])
def test_layer_matches_numpy(ctx, comm, options):
    cfg, w, x_all, dy_all, x, dy, dp, got = run_layer(ctx, comm, 7, **options)
    y, dx, mine, whole, cache = expected(cfg, w, x, dy, dp, x_all, dy_all, comm)
    own = slice(got["owned"].start, got["owned"].stop)
    errors = {
        "y": ref.relative_error(got["y"], y),
        "dx": ref.relative_error(got["dx"], dx),
        "dw_router (this rank's part)": ref.relative_error(got["dw_router"], mine["w_router"]),
        "dw_gate": ref.relative_error(got["dw_gate"], whole["w_gate"][own]),
        "dw_up": ref.relative_error(got["dw_up"], whole["w_up"][own]),
        "dw_down": ref.relative_error(got["dw_down"], whole["w_down"][own]),
    }
    if "shared" in got:
        for name, g in zip(("w_shared_gate", "w_shared_up", "w_shared_down"), got["shared"]):
            errors["d" + name + " (this rank's part)"] = ref.relative_error(g, mine[name])
    if "shared_expert_gate" in got:
        errors["dw_shared_expert_gate (this rank's part)"] = ref.relative_error(got["shared_expert_gate"],
                                                                               mine["w_shared_expert_gate"])
    # fp32 layer against the float64 reference: relative norm error <= TOL (1e-5).
    assert max(errors.values()) <= TOL, errors
    idx, gw, probs = got["routing"]
    assert np.array_equal(idx, cache["idx"])
    assert ref.relative_error(gw, cache["g"]) <= TOL
    assert ref.relative_error(probs, cache["p"]) <= TOL


def test_dprobs_gradient(ctx, comm):
    # backward's dprobs (a loss on the router probabilities) reaches dx and dw_router.
    cfg, w, x_all, dy_all, x, dy, dp, got = run_layer(ctx, comm, 11, dprobs=True)
    _, dx, mine, _, _ = expected(cfg, w, x, dy, dp, x_all, dy_all, comm)
    assert ref.relative_error(got["dx"], dx) <= TOL
    assert ref.relative_error(got["dw_router"], mine["w_router"]) <= TOL


def test_weights_round_trip_and_outputs_in_place(ctx, comm):
    w = make_weights(3, **SHAPE)
    _, _, x, _ = make_tokens(4, comm, **SHAPE)
    with relaymoe.Layer(ctx, **SHAPE, deterministic=True) as layer:
        layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
        assert np.array_equal(layer.get_router(), w["w_router"])
        for e in layer.owned_experts:
            for got, want in zip(layer.get_expert(e), (w["w_gate"][e], w["w_up"][e], w["w_down"][e])):
                assert np.array_equal(got, want)
        y = layer.forward(x)
        out = np.full_like(x, np.nan)
        assert layer.forward(x, out=out) is out
        # deterministic=True: the same input gives the same bits.
        assert np.array_equal(out, y)


def test_context_and_layer_properties(ctx, comm):
    assert (ctx.rank, ctx.size) == (comm.Get_rank(), comm.Get_size())
    assert sorted(ctx.ring_order()) == list(range(comm.Get_size()))
    with relaymoe.Layer(ctx, **SHAPE, dispatch="token") as layer:
        per = SHAPE["experts"] // comm.Get_size()
        assert layer.owned_experts == range(comm.Get_rank() * per, (comm.Get_rank() + 1) * per)
        assert layer.dispatch == "token"
        w = make_weights(5, **SHAPE)
        layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
        _, _, x, dy = make_tokens(6, comm, **SHAPE)
        layer.forward(x)
        layer.backward(dy)
        stats = layer.stats()
        assert stats["hops"] == comm.Get_size()
        assert stats["forward_seconds"] > 0 and stats["peak_forward_bytes"] > 0
    assert layer.closed


def to_bf16(a):
    """The float32 values a bf16 layer stores: the upper 16 bits, rounded to
    nearest even (as rmoe_round_to_dtype)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32).reshape(np.shape(a))


def test_bf16(ctx, comm):
    # bf16 storage runs on every build (the CPU kernels compute in fp32
    # copies); the arrays at this interface stay float32. The reference is
    # the layer's definition on the values it stores: x and the experts'
    # weights in bf16, the router in fp32.
    layer = relaymoe.Layer(ctx, **SHAPE, dtype="bf16")
    with layer:
        w = make_weights(8, **SHAPE)
        layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
        _, _, x, _ = make_tokens(9, comm, **SHAPE)
        wb = dict(w, **{k: to_bf16(w[k]) for k in ("w_gate", "w_up", "w_down")})
        y, _ = ref.forward(to_bf16(x), wb, SHAPE["topk"])
        # bf16 intermediates keep 8 significant bits: a few 1e-3.
        assert ref.relative_error(layer.forward(x), y) <= 1e-2


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_raw_calls_on_host_buffers(ctx, comm, dtype):
    # forward_raw/backward_raw take addresses of buffers in the layer's
    # element type (on a GPU: torch tensors' data_ptr()); here NumPy
    # buffers in main memory. Same outputs as the float32 calls, bit for bit
    # in deterministic mode: bf16 as the top 16 bits of the float32 values.
    cfg = dict(SHAPE, dtype=dtype, deterministic=True)
    w = make_weights(12, **SHAPE)
    _, _, x, dy = make_tokens(13, comm, **SHAPE)
    with relaymoe.Layer(ctx, **cfg) as layer:
        layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
        y, dx = layer.forward(x), layer.backward(dy)
        if dtype == "bf16":
            to_el = lambda a: (to_bf16(a).view(np.uint32) >> 16).astype(np.uint16)
            from_el = lambda a: (a.astype(np.uint32) << 16).view(np.float32)
        else:
            to_el = from_el = lambda a: np.ascontiguousarray(a, np.float32)
        xr, dyr = to_el(x), to_el(dy)
        yr, dxr = np.zeros_like(xr), np.zeros_like(xr)
        layer.forward_raw(xr.ctypes.data, yr.ctypes.data, device=False)
        layer.backward_raw(dyr.ctypes.data, dxr.ctypes.data, device=False)
        assert np.array_equal(from_el(yr), y) and np.array_equal(from_el(dxr), dx)
        with pytest.raises(TypeError, match="expected a buffer's address"):
            layer.forward_raw(0, yr.ctypes.data, device=False)
