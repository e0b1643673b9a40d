"""Bad input raises a clear exception naming the bad value, before the
library is called, on every rank alike, and leaves the layer as it was: the
next good call gives the reference's results."""
import numpy as np
import pytest

import moe_reference as ref
import relaymoe
from conftest import SHAPE, TOL, make_tokens, make_weights

T, H, E = SHAPE["tokens"], SHAPE["hidden"], SHAPE["experts"]


@pytest.fixture(scope="module")
def setup(ctx, comm):
    """A layer with weights, this rank's x and dy, and the reference's y and dx."""
    w = make_weights(21, **SHAPE)
    _, _, x, dy = make_tokens(22, comm, **SHAPE)
    layer = relaymoe.Layer(ctx, **SHAPE, deterministic=True)
    layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
    y, cache = ref.forward(x, w, SHAPE["topk"])
    dx, _ = ref.backward(dy, cache)
    yield layer, x, dy, y, dx
    layer.close()


def good_pass(layer, x, dy, y, dx):
    # The layer still works, with the reference's results (relative error <= TOL).
    assert ref.relative_error(layer.forward(x), y) <= TOL
    assert ref.relative_error(layer.backward(dy), dx) <= TOL


BAD_ARRAYS = [
    ("float64", lambda x: x.astype(np.float64), TypeError, ["x", "float64", "float32"]),
    ("float16", lambda x: x.astype(np.float16), TypeError, ["x", "float16", "float32"]),
    ("big-endian", lambda x: x.astype(">f4"), TypeError, ["x", ">f4", "native byte order"]),
    ("list", lambda x: x.tolist(), TypeError, ["x", "numpy.ndarray", "list"]),
    ("transposed", lambda x: np.ascontiguousarray(x.T), ValueError, ["x", f"({H}, {T})", f"H={H}"]),
    ("too few columns", lambda x: x[:, :-1].copy(), ValueError, ["x", f"({T}, {H - 1})", f"H={H}"]),
    ("1-d", lambda x: x.ravel(), ValueError, ["x", f"({T * H},)"]),
    ("Fortran order", np.asfortranarray, ValueError, ["x", "not C-contiguous", "np.ascontiguousarray(x)"]),
    ("strided rows", lambda x: np.repeat(x, 2, axis=0)[::2], ValueError, ["x", "not C-contiguous"]),
]
# x may have any rows (this call's tokens); dy must have the last forward's.
BAD_DY = BAD_ARRAYS + [
    ("too few tokens", lambda x: x[:-1].copy(), ValueError, ["x", f"({T - 1}, {H})", f"T={T}, H={H}"]),
]


@pytest.mark.parametrize("make, error, words", [b[1:] for b in BAD_ARRAYS], ids=[b[0] for b in BAD_ARRAYS])
def test_bad_x(setup, make, error, words):
    layer, x, dy, y, dx = setup
    bad = make(x)
    with pytest.raises(error) as info:
        layer.forward(bad)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    good_pass(layer, x, dy, y, dx)


@pytest.mark.parametrize("make, error, words", [b[1:] for b in BAD_DY], ids=[b[0] for b in BAD_DY])
def test_bad_dy(setup, make, error, words):
    layer, x, dy, y, dx = setup
    layer.forward(x)
    with pytest.raises(error) as info:
        layer.backward(make(dy))
    words = ["dy" if w == "x" else w.replace("(x)", "(dy)") for w in words]
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    # The forward's state survived: backward of that forward is still right.
    assert ref.relative_error(layer.backward(dy), dx) <= TOL


def test_bad_outputs_and_weights(setup):
    layer, x, dy, y, dx = setup
    frozen = np.empty_like(x)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="out: read-only"):
        layer.forward(x, out=frozen)
    with pytest.raises(TypeError, match="out: dtype float64"):
        layer.forward(x, out=np.empty((T, H)))
    with pytest.raises(ValueError, match=rf"w_router: shape \({E}, {H}\), expected float32 \[H={H}, E={E}\]"):
        layer.set_router(np.zeros((E, H), np.float32))
    with pytest.raises(ValueError, match=r"dprobs: shape"):
        layer.forward(x)
        layer.backward(dy, dprobs=np.zeros((T, H), np.float32))
    with pytest.raises(TypeError, match="e: an int is expected"):
        layer.get_expert(1.0)
    good_pass(layer, x, dy, y, dx)


def test_library_errors_carry_its_message(ctx, setup, comm):
    layer, x, dy, y, dx = setup
    # A configuration the library refuses: its code and sentence, on every rank.
    with pytest.raises(relaymoe.RelayMoEError) as info:
        relaymoe.Layer(ctx, **dict(SHAPE, topk=E + 1))
    assert info.value.code == relaymoe.RMOE_EINVAL and info.value.name == "RMOE_EINVAL"
    assert "topk" in info.value.message and str(E + 1) in info.value.message
    # An expert this rank does not own.
    other = (layer.owned_experts.stop % E) if comm.Get_size() > 1 else E
    with pytest.raises(relaymoe.RelayMoEError) as info:
        layer.get_expert(other)
    assert str(other) in str(info.value)
    with pytest.raises(relaymoe.RelayMoEError, match="dispatch 'rings'"):
        relaymoe.Layer(ctx, **SHAPE, dispatch="rings")
    with pytest.raises(TypeError, match="hidden: an int is expected, not str"):
        relaymoe.Layer(ctx, **dict(SHAPE, hidden="64"))
    good_pass(layer, x, dy, y, dx)


def test_non_finite_input(setup):
    layer, x, dy, y, dx = setup
    bad = x.copy()
    bad[3, 5] = np.nan
    with pytest.raises(relaymoe.RelayMoEError) as info:
        layer.check_finite(x=bad)
    assert info.value.code == relaymoe.RMOE_ENONFINITE and "x[3, 5] = nan" in str(info.value), info.value
    good_pass(layer, x, dy, y, dx)


def test_backward_before_forward(ctx, comm):
    with relaymoe.Layer(ctx, **SHAPE) as fresh:
        _, _, _, dy = make_tokens(23, comm, **SHAPE)
        with pytest.raises(relaymoe.RelayMoEError) as info:
            fresh.backward(dy)
        assert info.value.code == relaymoe.RMOE_ESTATE and "before any rmoe_layer_forward" in str(info.value)


def test_one_rank_refuses(setup, comm):
    # Only rank 1 passes float64: it raises TypeError; the others get the
    # library's collective refusal naming rank 1; nobody is left waiting.
    if comm.Get_size() < 2:
        pytest.skip("needs 2 ranks")
    layer, x, dy, y, dx = setup
    bad = x.astype(np.float64) if comm.Get_rank() == 1 else x
    if comm.Get_rank() == 1:
        with pytest.raises(TypeError, match="x: dtype float64"):
            layer.forward(bad)
    else:
        with pytest.raises(relaymoe.RelayMoEError, match="rank 1: "):
            layer.forward(bad)
    good_pass(layer, x, dy, y, dx)


def test_closed_layer(ctx, comm):
    w = make_weights(24, **SHAPE)
    _, _, x, dy = make_tokens(25, comm, **SHAPE)
    layer = relaymoe.Layer(ctx, **SHAPE)
    layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
    layer.close()
    for call in (lambda: layer.forward(x), lambda: layer.backward(dy), lambda: layer.set_router(w["w_router"]),
                 layer.grads, layer.stats, layer.routing):
        with pytest.raises(relaymoe.RelayMoEError, match="the layer is closed") as info:
            call()
        assert info.value.code == relaymoe.RMOE_ESTATE
    layer.close()  # a second close does nothing
