"""PyTorch: a relaymoe layer as a torch.autograd.Function (LayerFunction) and
a torch.nn.Module holding its parameters (MoE).

The torch parameters are the weights: every forward copies them into the
layer, and backward returns their gradients. The router is replicated: its
gradient is this rank's part (from its own tokens), to be summed over ranks
like any replicated parameter (MPI Allreduce, DDP). Each rank holds only the
experts it owns (layer.owned_experts), and their gradients are complete.

Tensors are CPU float32 (or bfloat16 for a layer created with dtype='bf16':
they are converted to float32 at the C interface, which takes float32 in
every build, and the output is returned in bfloat16). Other dtypes raise
TypeError. A non-contiguous tensor is copied into a contiguous one (torch
hands backward such gradients, e.g. from mean()).
"""
import numpy as np
import torch

from ._capi import RMOE_DTYPE_BF16
from ._core import Context, Layer


def _numpy(name, t, layer):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: a torch.Tensor is expected, not {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"{name}: on {t.device}; the layer reads host memory (move it with .cpu())")
    allowed = (torch.float32, torch.bfloat16) if layer.config["dtype"] == RMOE_DTYPE_BF16 else (torch.float32,)
    if t.dtype not in allowed:
        raise TypeError(f"{name}: {t.dtype}, expected {' or '.join(str(a) for a in allowed)} "
                        f"(convert explicitly, e.g. {name}.float())")
    return t.detach().to(torch.float32).contiguous().numpy()


class LayerFunction(torch.autograd.Function):
    """y = LayerFunction.apply(layer, x, w_router, w_gate, w_up, w_down)

    x [T, H], T this rank's tokens in this call: any number from 0,
    different on each rank and from call to call (the layer's tokens= is
    its capacity, grown when a call brings more); w_router [H, E];
    w_gate, w_up [n, H, F] and w_down [n, F, H]: the n experts this rank
    owns, in the order of layer.owned_experts. Collective, forward and
    backward. A layer keeps the state of its last forward only: backward
    refuses to run after another forward of the same layer.
    """

    @staticmethod
    def forward(ctx, layer, x, w_router, w_gate, w_up, w_down):
        if not isinstance(layer, Layer):
            raise TypeError(f"layer: a relaymoe.Layer is expected, not {type(layer).__name__}")
        layer._handle()  # a closed layer raises here, on every rank
        if layer.shared_ffn > 0:
            raise ValueError("the autograd wrapper covers routed experts only; this layer has a shared "
                             f"expert (shared_ffn={layer.shared_ffn})")
        n = len(layer.owned_experts)
        H, F, E = layer.hidden, layer.ffn, layer.experts
        want = {"w_router": (H, E), "w_gate": (n, H, F), "w_up": (n, H, F), "w_down": (n, F, H)}
        got = {"w_router": w_router, "w_gate": w_gate, "w_up": w_up, "w_down": w_down}
        try:
            arrays = {}
            for name, t in got.items():
                a = _numpy(name, t, layer)
                if a.shape != want[name]:
                    raise ValueError(f"{name}: shape {tuple(a.shape)}, expected {want[name]} "
                                     f"({n} owned experts of H={H}, F={F}, E={E})")
                arrays[name] = a
            xn = _numpy("x", x, layer)
        except (TypeError, ValueError):
            layer._refuse_forward()  # so that no other rank waits in the forward
            raise
        layer.set_router(arrays["w_router"])
        for i, e in enumerate(layer.owned_experts):
            layer.set_expert(e, arrays["w_gate"][i], arrays["w_up"][i], arrays["w_down"][i])
        y = layer.forward(xn)
        ctx.layer = layer
        ctx.forward_number = layer.forwards
        ctx.out_dtype = x.dtype
        # Saved so that torch refuses a backward after they were modified in place.
        ctx.save_for_backward(w_router, w_gate, w_up, w_down)
        return torch.from_numpy(y).to(x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        ctx.saved_tensors  # noqa: B018 (torch's in-place modification check)
        layer = ctx.layer
        if layer.forwards != ctx.forward_number:
            raise RuntimeError(
                f"relaymoe layer: backward of forward {ctx.forward_number}, but the layer has run "
                f"{layer.forwards - ctx.forward_number} more forward(s) since and keeps only the last one's "
                f"state; use one layer per call, or run backward before the next forward")
        try:
            dyn = _numpy("dy", dy, layer)
        except TypeError:
            layer._refuse_backward()
            raise
        dx = layer.backward(dyn)
        g = layer.grads()
        dtype = ctx.out_dtype
        return (None, torch.from_numpy(dx).to(dtype), torch.from_numpy(g["dw_router"]),
                torch.from_numpy(g["dw_gate"]), torch.from_numpy(g["dw_up"]), torch.from_numpy(g["dw_down"]))


class MoE(torch.nn.Module):
    """A relaymoe layer with its weights as torch parameters.

    w_router [H, E] is replicated (sum its gradient over ranks);
    w_gate, w_up [n, H, F] and w_down [n, F, H] are the n experts this rank
    owns (self.layer.owned_experts). tokens is the layer's capacity: the
    most tokens of one rank in one call (forward takes any x [T, H], T from
    0; more than the capacity grows it). Keywords after tokens go to Layer.
    Parameters start from reset_parameters(generator): drawn for the whole
    layer and sliced, so a generator seeded alike on every rank gives every
    rank the same router and the experts of one layer.
    """

    def __init__(self, ctx, *, hidden, ffn, experts, topk, tokens, generator=None, **options):
        super().__init__()
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: a relaymoe.Context is expected, not {type(ctx).__name__}")
        self.layer = Layer(ctx, hidden=hidden, ffn=ffn, experts=experts, topk=topk, tokens=tokens, **options)
        n = len(self.layer.owned_experts)
        self.w_router = torch.nn.Parameter(torch.empty(hidden, experts))
        self.w_gate = torch.nn.Parameter(torch.empty(n, hidden, ffn))
        self.w_up = torch.nn.Parameter(torch.empty(n, hidden, ffn))
        self.w_down = torch.nn.Parameter(torch.empty(n, ffn, hidden))
        self.reset_parameters(generator)

    def reset_parameters(self, generator=None):
        H, F, E = self.layer.hidden, self.layer.ffn, self.layer.experts

        def uniform(shape, bound):
            return (torch.rand(shape, generator=generator) * 2 - 1) * bound

        self.load_full(uniform((H, E), H ** -0.5), uniform((E, H, F), H ** -0.5),
                       uniform((E, H, F), H ** -0.5), uniform((E, F, H), F ** -0.5))

    @torch.no_grad()
    def load_full(self, w_router, w_gate, w_up, w_down):
        """Set the parameters from the whole layer's weights: w_router [H, E],
        w_gate, w_up [E, H, F], w_down [E, F, H]; this rank keeps its experts."""
        own = slice(self.layer.owned_experts.start, self.layer.owned_experts.stop)
        self.w_router.copy_(torch.as_tensor(np.asarray(w_router)))
        self.w_gate.copy_(torch.as_tensor(np.asarray(w_gate))[own])
        self.w_up.copy_(torch.as_tensor(np.asarray(w_up))[own])
        self.w_down.copy_(torch.as_tensor(np.asarray(w_down))[own])

    def replicated_parameters(self):
        """The parameters whose gradients are per-rank parts (sum them over ranks)."""
        return [self.w_router]

    def forward(self, x):
        return LayerFunction.apply(self.layer, x, self.w_router, self.w_gate, self.w_up, self.w_down)

    def close(self):
        self.layer.close()
