"""relaymoe from Python: Mixture-of-Experts layers run as StarPU task graphs
with the ring dispatch, through the installed C library (ctypes).

    from mpi4py import MPI            # optional: MPI with MPI_THREAD_MULTIPLE
    import numpy as np, relaymoe
    with relaymoe.Context(MPI.COMM_WORLD) as ctx:
        layer = relaymoe.Layer(ctx, hidden=64, ffn=32, experts=8, topk=2, tokens=96)  # capacity
        layer.set_weights(w_router, w_gate, w_up, w_down)
        y = layer.forward(x)           # float32 [T, H], C order, any T rows (each rank its own)
        dx = layer.backward(dy)

relaymoe.autograd (with PyTorch) wraps a layer as a torch.autograd.Function
and a torch.nn.Module; relaymoe.hf swaps a Hugging Face model's sparse MoE
blocks (Qwen2-MoE, Mixtral, Qwen3-MoE) for blocks that run on relaymoe. The library is found through RELAYMOE_LIBRARY,
RELAYMOE_PREFIX, pkg-config or the loader's path (relaymoe._capi).
"""
from ._capi import (ENUMS, LibraryNotFound, RMOE_DISPATCH_ALLTOALL, RMOE_DISPATCH_ALLTOALL_DEEPEP,
                    RMOE_DISPATCH_ALLTOALL_MEGATRON,
                    RMOE_DISPATCH_AUTO, RMOE_DISPATCH_RING_EXPERT, RMOE_DISPATCH_RING_TOKEN, RMOE_DTYPE_BF16,
                    RMOE_DTYPE_F32, RMOE_EFORMAT, RMOE_EINVAL, RMOE_EIO, RMOE_EMISMATCH, RMOE_EMPI, RMOE_ENOMEM,
                    RMOE_ENONFINITE, RMOE_ENOTSUP, RMOE_EPEER, RMOE_ESTARPU, RMOE_ESTATE, RMOE_OK,
                    library_path)
from ._core import Context, Layer, RelayMoEError

__version__ = "0.1.0"

__all__ = [
    "Context", "Layer", "RelayMoEError", "LibraryNotFound", "library_path", "ENUMS",
    "RMOE_OK", "RMOE_EINVAL", "RMOE_ENOMEM", "RMOE_EMPI", "RMOE_ESTARPU", "RMOE_EMISMATCH", "RMOE_ESTATE",
    "RMOE_ENOTSUP", "RMOE_EIO", "RMOE_ENONFINITE", "RMOE_EFORMAT", "RMOE_EPEER",
    "RMOE_DISPATCH_ALLTOALL", "RMOE_DISPATCH_RING_EXPERT", "RMOE_DISPATCH_RING_TOKEN", "RMOE_DISPATCH_AUTO",
    "RMOE_DISPATCH_ALLTOALL_MEGATRON", "RMOE_DISPATCH_ALLTOALL_DEEPEP",
    "RMOE_DTYPE_F32", "RMOE_DTYPE_BF16",
]
