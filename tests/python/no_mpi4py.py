"""The Python layer without mpi4py (run under mpiexec at 1 and 2 ranks):
the library initialises MPI itself over MPI_COMM_WORLD and finalises it when
the context closes; a second context in the same process is then refused
with a clear error instead of MPI aborting the process.
  no_mpi4py.py    exit 0 on success, 1 on a failed check
"""
import sys

import numpy as np

import moe_reference as ref
import relaymoe

SHAPE = dict(hidden=64, ffn=32, experts=8, topk=2, tokens=96)
TOL = 1e-5  # fp32 against the float64 reference, relative norm error


def main():
    ctx = relaymoe.Context()
    assert "mpi4py" not in sys.modules
    H, F, E, T = SHAPE["hidden"], SHAPE["ffn"], SHAPE["experts"], SHAPE["tokens"]
    rng = np.random.default_rng(71)

    def uniform(shape, scale):
        return (rng.uniform(-1, 1, shape) * scale).astype(np.float32)

    w = {"w_router": uniform((H, E), H ** -0.5), "w_gate": uniform((E, H, F), H ** -0.5),
         "w_up": uniform((E, H, F), H ** -0.5), "w_down": uniform((E, F, H), F ** -0.5)}
    x_all, dy_all = uniform((ctx.size * T, H), 1.0), uniform((ctx.size * T, H), 1.0)
    rows = slice(ctx.rank * T, (ctx.rank + 1) * T)
    x, dy = np.ascontiguousarray(x_all[rows]), np.ascontiguousarray(dy_all[rows])
    with relaymoe.Layer(ctx, **SHAPE) as layer:
        layer.set_weights(w["w_router"], w["w_gate"], w["w_up"], w["w_down"])
        y = layer.forward(x)
        dx = layer.backward(dy)
    want_y, cache = ref.forward(x, w, SHAPE["topk"])
    want_dx, _ = ref.backward(dy, cache)
    errors = {"y": ref.relative_error(y, want_y), "dx": ref.relative_error(dx, want_dx)}
    rank, size = ctx.rank, ctx.size
    ctx.close()
    ok = max(errors.values()) <= TOL
    try:
        relaymoe.Context()
        ok = False
        refused = "a second context was created after MPI_Finalize"
    except relaymoe.RelayMoEError as e:
        ok = ok and e.code == relaymoe.RMOE_EMPI and "finalised" in str(e)
        refused = str(e)
    print(f"no_mpi4py: rank {rank} of {size}: y {errors['y']:.1e}, dx {errors['dx']:.1e} (tolerance {TOL:.0e}); "
          f"second context: {refused}: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
