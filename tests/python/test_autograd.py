"""The PyTorch wrapper: gradients through torch.autograd against the NumPy
reference, and two training steps of a tiny model against the same model
with the layer written in PyTorch."""
import os

import numpy as np
import pytest

# Skipped without PyTorch, unless RMOE_EMBED_REQUIRE=1 (CI) requires it.
if os.environ.get("RMOE_EMBED_REQUIRE") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import moe_reference as ref  # noqa: E402
from conftest import SHAPE, TOL, expected, make_tokens, make_weights  # noqa: E402
from relaymoe.autograd import MoE  # noqa: E402

# Two cores shared with StarPU's worker and MPI progress threads.
torch.set_num_threads(1)


def loaded_moe(ctx, seed):
    """The MoE module of SHAPE over ctx holding make_weights(seed)'s weights,
    and those weights."""
    w = make_weights(seed, **SHAPE)
    moe = MoE(ctx, **SHAPE)
    moe.load_full(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
    return moe, w


def test_gradients_match_numpy(ctx, comm):
    moe, w = loaded_moe(ctx, 41)
    x_all, dy_all, x, dy = make_tokens(42, comm, **SHAPE)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    y = moe(xt)
    (y * torch.from_numpy(dy)).sum().backward()  # dL/dy = dy
    want_y, want_dx, mine, whole, _ = expected(SHAPE, w, x, dy, None, x_all, dy_all, comm)
    own = slice(moe.layer.owned_experts.start, moe.layer.owned_experts.stop)
    errors = {
        "y": ref.relative_error(y.detach().numpy(), want_y),
        "x.grad": ref.relative_error(xt.grad.numpy(), want_dx),
        "w_router.grad (this rank's part)": ref.relative_error(moe.w_router.grad.numpy(), mine["w_router"]),
        "w_gate.grad": ref.relative_error(moe.w_gate.grad.numpy(), whole["w_gate"][own]),
        "w_up.grad": ref.relative_error(moe.w_up.grad.numpy(), whole["w_up"][own]),
        "w_down.grad": ref.relative_error(moe.w_down.grad.numpy(), whole["w_down"][own]),
    }
    # fp32 against the float64 reference: relative norm error <= TOL (1e-5).
    assert max(errors.values()) <= TOL, errors
    moe.close()


def torch_layer(x, w_router, w_gate, w_up, w_down, topk):
    """The layer in PyTorch with every expert (docs/running.md, "The layer")."""
    p = torch.softmax(x @ w_router, dim=1)
    idx = torch.sort(p, dim=1, descending=True, stable=True).indices[:, :topk]  # ties: lower expert
    g = p.gather(1, idx)
    g = g / g.sum(dim=1, keepdim=True)
    y = torch.zeros_like(x)
    for e in range(w_router.shape[1]):
        rows, slots = (idx == e).nonzero(as_tuple=True)
        xe = x[rows]
        out = (torch.nn.functional.silu(xe @ w_gate[e]) * (xe @ w_up[e])) @ w_down[e]
        y = y.index_add(0, rows, g[rows, slots].unsqueeze(1) * out)
    return y


STEPS, LR = 2, 0.5


def test_training_matches_pytorch(ctx, comm):
    """h = x w_in; y = h + MoE(h); loss = sum((y - target)^2) / (N T), all
    ranks' tokens together; plain SGD. Through relaymoe each rank runs its
    own tokens and experts and the replicated gradients (w_in, the router)
    are summed over ranks; the PyTorch model runs the whole batch with every
    expert on each rank."""
    H, N, T = SHAPE["hidden"], comm.Get_size(), SHAPE["tokens"]
    from mpi4py import MPI
    moe, w = loaded_moe(ctx, 51)
    x_all, target_all, x, target = make_tokens(52, comm, **SHAPE)
    w_in0 = (np.random.default_rng(53).uniform(-1, 1, (H, H)) * H ** -0.5).astype(np.float32)

    w_in = torch.nn.Parameter(torch.from_numpy(w_in0.copy()))
    ours = [w_in, moe.w_router, moe.w_gate, moe.w_up, moe.w_down]
    replicated = [w_in] + moe.replicated_parameters()

    ref_params = [torch.nn.Parameter(torch.from_numpy(a.copy()))
                  for a in (w_in0, w["w_router"], w["w_gate"], w["w_up"], w["w_down"])]
    xt, tt = torch.from_numpy(x), torch.from_numpy(target)
    xa, ta = torch.from_numpy(x_all), torch.from_numpy(target_all)

    losses, ref_losses = [], []
    for _ in range(STEPS):
        for p in ours + ref_params:
            p.grad = None
        h = xt @ w_in
        local = ((h + moe(h) - tt) ** 2).sum() / (N * T)
        local.backward()
        losses.append(comm.allreduce(local.item(), op=MPI.SUM))
        for p in replicated:
            comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)

        r_in, r_router, r_gate, r_up, r_down = ref_params
        hr = xa @ r_in
        loss = ((hr + torch_layer(hr, r_router, r_gate, r_up, r_down, SHAPE["topk"]) - ta) ** 2).sum() / (N * T)
        loss.backward()
        ref_losses.append(loss.item())

        with torch.no_grad():
            for p in ours + ref_params:
                p -= LR * p.grad

    # The same loss within 1e-5 (relative) at every step, and training moved it.
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= 1e-5 * abs(b), (step, a, b)
    assert losses[-1] < losses[0]
    # The parameters after the steps agree too (relative norm).
    own = slice(moe.layer.owned_experts.start, moe.layer.owned_experts.stop)
    pairs = [(w_in, ref_params[0]), (moe.w_router, ref_params[1]), (moe.w_gate, ref_params[2][own]),
             (moe.w_up, ref_params[3][own]), (moe.w_down, ref_params[4][own])]
    for a, b in pairs:
        assert ref.relative_error(a.detach().numpy(), b.detach().numpy()) <= TOL
    print(f"training losses relaymoe {losses} pytorch {ref_losses}")
    moe.close()


def test_backward_after_another_forward(ctx, comm):
    moe, _ = loaded_moe(ctx, 61)
    _, _, x, _ = make_tokens(62, comm, **SHAPE)
    xt = torch.from_numpy(x)
    first = moe(xt)
    second = moe(xt)
    with pytest.raises(RuntimeError, match="keeps only the last one's state"):
        first.sum().backward()
    second.sum().backward()  # the last forward's backward still runs
    assert moe.w_router.grad is not None
    moe.close()


def test_bad_tensors(ctx, comm):
    moe, w = loaded_moe(ctx, 63)
    _, _, x, dy = make_tokens(64, comm, **SHAPE)
    xt = torch.from_numpy(x)
    with pytest.raises(TypeError, match="x: torch.float64, expected torch.float32"):
        moe(xt.double())
    with pytest.raises(ValueError, match=r"x: shape \(96, 32\)"):
        moe(xt[:, :32])
    with pytest.raises(TypeError, match="x: a torch.Tensor is expected, not ndarray"):
        moe(x)
    # Non-contiguous tensors are copied (torch hands backward such gradients).
    y = moe(xt.t().contiguous().t())
    want, _ = ref.forward(x, w, SHAPE["topk"])
    assert ref.relative_error(y.detach().numpy(), want) <= TOL
    moe.close()
    with pytest.raises(Exception, match="the layer is closed"):
        moe(xt)


def test_any_token_count(ctx, comm):
    # The module's layer takes each call's rows: counts that change per call
    # and rank, none on one rank, more than the capacity (tokens=).
    from test_tokens import counts_of, make_call, reference, rows_of
    rank, size = comm.Get_rank(), comm.Get_size()
    moe, w = loaded_moe(ctx, 45)
    own = slice(moe.layer.owned_experts.start, moe.layer.owned_experts.stop)
    for call in (1, 2, 3):
        counts = counts_of(call, size)
        x_all, dy_all, dp_all, at = make_call(500 + call, counts, SHAPE["hidden"], SHAPE["experts"])
        x, dy = rows_of(rank, at, x_all, dy_all)
        for p in moe.parameters():
            p.grad = None
        xt = torch.from_numpy(x).requires_grad_()
        y = moe(xt)
        (y * torch.from_numpy(dy)).sum().backward()
        want_y, want_dx, want_router, _, whole = reference(w, SHAPE["topk"], x_all, dy_all, 0 * dp_all, at, rank)
        errors = {
            "y": ref.relative_error(y.detach().numpy(), want_y),
            "x.grad": ref.relative_error(xt.grad.numpy(), want_dx),
            "w_router.grad (this rank's part)": ref.relative_error(moe.w_router.grad.numpy(), want_router),
            "w_gate.grad": ref.relative_error(moe.w_gate.grad.numpy(), whole["w_gate"][own]),
            "w_down.grad": ref.relative_error(moe.w_down.grad.numpy(), whole["w_down"][own]),
        }
        assert y.shape == (counts[rank], SHAPE["hidden"]) and max(errors.values()) <= TOL, (counts, errors)
    moe.close()
