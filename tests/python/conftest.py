"""Fixtures of the Python tests. They run under mpiexec at 1 and 2 ranks
(tests/python/run.sh): every rank runs every test in the same order, so the
collective calls match. Data are seeded and the same on every rank: each rank
draws the whole batch of all ranks and takes its own rows, so it can compute
the complete expert gradients of the reference itself."""
import numpy as np
import pytest
from mpi4py import MPI

import moe_reference
import relaymoe

# The tests' layer: small enough for 2 ranks on 2 cores.
SHAPE = dict(hidden=64, ffn=32, experts=8, topk=2, tokens=96)

# fp32 against the float64 reference: the relative error in the Frobenius
# norm of every output and gradient (the C suite's bound for the layer).
TOL = 1e-5


@pytest.fixture(scope="session")
def comm():
    return MPI.COMM_WORLD


@pytest.fixture(scope="module")
def ctx(comm):
    # One context per test module: each module starts StarPU-MPI afresh.
    c = relaymoe.Context(comm)
    yield c
    c.close()


def uniform(rng, shape, scale):
    return (rng.uniform(-1.0, 1.0, size=shape) * scale).astype(np.float32)


def make_weights(seed, hidden, ffn, experts, shared_ffn=0, shared_gated=False, **_):
    rng = np.random.default_rng(seed)
    H, F, E = hidden, ffn, experts
    w = {"w_router": uniform(rng, (H, E), H ** -0.5), "w_gate": uniform(rng, (E, H, F), H ** -0.5),
         "w_up": uniform(rng, (E, H, F), H ** -0.5), "w_down": uniform(rng, (E, F, H), F ** -0.5)}
    if shared_ffn:
        w.update(w_shared_gate=uniform(rng, (H, shared_ffn), H ** -0.5),
                 w_shared_up=uniform(rng, (H, shared_ffn), H ** -0.5),
                 w_shared_down=uniform(rng, (shared_ffn, H), shared_ffn ** -0.5))
        if shared_gated:
            w["w_shared_expert_gate"] = uniform(rng, (H,), H ** -0.5)
    return w


def make_tokens(seed, comm, tokens, hidden, **_):
    """x and dy of all ranks ([N*T, H]) and this rank's rows of each."""
    rng = np.random.default_rng(seed)
    n = comm.Get_size() * tokens
    x_all, dy_all = uniform(rng, (n, hidden), 1.0), uniform(rng, (n, hidden), 1.0)
    rows = slice(comm.Get_rank() * tokens, (comm.Get_rank() + 1) * tokens)
    return x_all, dy_all, np.ascontiguousarray(x_all[rows]), np.ascontiguousarray(dy_all[rows])


def expected(cfg, w, x, dy, dp, x_all, dy_all, comm):
    """This rank's y, dx, weight gradients from its tokens (what the layer
    gives for the replicated router and shared expert) and routing, and the
    gradients over every rank's tokens (what the owner of an expert gets)."""
    norm = cfg.get("norm_topk", True)
    y, cache = moe_reference.forward(x, w, cfg["topk"], norm)
    dx, dw = moe_reference.backward(dy, cache, dp)
    T, N = cfg["tokens"], comm.Get_size()
    whole = {k: np.zeros_like(v, dtype=np.float64) for k, v in dw.items()}
    for r in range(N):
        rows = slice(r * T, (r + 1) * T)
        _, c = moe_reference.forward(x_all[rows], w, cfg["topk"], norm)
        _, d = moe_reference.backward(dy_all[rows], c, dp if r == comm.Get_rank() else None)
        for k in whole:
            whole[k] += d[k]
    return y, dx, dw, whole, cache
