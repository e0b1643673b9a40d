"""Contexts: closed ones refuse every use with a clear error, closing twice
does nothing, and a new context after a closed one works (StarPU-MPI
restarted over the same communicator)."""
import pytest

import moe_reference as ref
import relaymoe
from conftest import SHAPE, TOL, make_tokens, make_weights


def test_closed_context(comm):
    ctx = relaymoe.Context(comm)
    layer = relaymoe.Layer(ctx, **SHAPE)
    ctx.close()  # closes its layer first
    assert ctx.closed and layer.closed
    _, _, x, _ = make_tokens(31, comm, **SHAPE)
    with pytest.raises(relaymoe.RelayMoEError, match="the context is closed") as info:
        relaymoe.Layer(ctx, **SHAPE)
    assert info.value.code == relaymoe.RMOE_ESTATE
    with pytest.raises(relaymoe.RelayMoEError, match="the context is closed"):
        ctx.ring_order()
    with pytest.raises(relaymoe.RelayMoEError, match=r"the layer is closed \(its context was closed\)"):
        layer.forward(x)
    ctx.close()


def test_new_context_after_close(comm):
    with relaymoe.Context(comm) as ctx:
        w = make_weights(32, **SHAPE)
        _, _, x, _ = make_tokens(33, comm, **SHAPE)
        with relaymoe.Layer(ctx, **SHAPE) as layer:
            layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
            y, _ = ref.forward(x, w, SHAPE["topk"])
            assert ref.relative_error(layer.forward(x), y) <= TOL


def test_bad_communicator():
    with pytest.raises(TypeError, match="comm: an mpi4py communicator is expected, not int"):
        relaymoe.Context(0)
    from mpi4py import MPI
    with pytest.raises(ValueError, match="COMM_NULL"):
        relaymoe.Context(MPI.COMM_NULL)
    with pytest.raises(TypeError, match="not Datatype"):
        relaymoe.Context(MPI.FLOAT)
