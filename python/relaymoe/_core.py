"""Context and Layer over the C API, with NumPy arrays in and out.

Arrays are float32 (int32 for routing indices), C order (row-major), with
the shapes of include/relaymoe/relaymoe.h: x, y, dy, dx [T, H];
w_router [H, E]; w_gate[e], w_up[e] [H, F]; w_down[e] [F, H]. T is this
rank's token count in a forward, any number from 0 (a layer's tokens= is a
capacity, not the count of every call): forward takes it from x's rows, and
backward, routing and the _raw backward take the last forward's. Anything
else is refused, never converted: a float64 array, a transposed view or a
slice with strides raises TypeError or ValueError naming the argument, what
it is and what was expected, before the library is called.

Collective calls (Context(), Layer(), forward, backward, check_finite,
Context.close) must be made by every rank of the context, in the same
order, as in C. When one rank's arguments to forward or backward are
refused, that rank still enters the library's collective argument check
with NULL pointers, so every rank fails the call alike (the others with the
library's message naming that rank) and none is left waiting.

Objects are not thread-safe: use a context and its layers from one thread.
"""
import atexit
import ctypes
import weakref

import numpy as np

from . import _capi
from ._capi import lib


class RelayMoEError(RuntimeError):
    """A call that failed: code is the library's negative RMOE_E* code, name
    its name, and the message the library's sentence naming the bad value
    (rmoe_strerror)."""

    def __init__(self, code, message):
        self.code = int(code)
        self.name = _capi.ERROR_NAMES.get(self.code, f"error {self.code}")
        self.message = message
        super().__init__(f"{message} ({self.name})")


def _check(rc):
    if rc != 0:
        raise RelayMoEError(rc, lib().rmoe_strerror(rc).decode("utf-8", "replace"))


def _closed(message):
    return RelayMoEError(_capi.RMOE_ESTATE, message)


# ---- argument checks -----------------------------------------------------------


def _array(name, a, shape, labels, dtype=np.float32, writable=False):
    """a, unchanged, if it is an ndarray of dtype and shape, C-contiguous and
    aligned (and writable for outputs); otherwise TypeError or ValueError.
    A None in shape takes any size (a forward's rows)."""
    dims = ", ".join(l if n is None else f"{l}={n}" for l, n in zip(labels, shape))
    want = f"{np.dtype(dtype).name} [{dims}], C order"
    free = [l for l, n in zip(labels, shape) if n is None]
    if free:
        want += f" (any {', '.join(free)} >= 0)"
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: a numpy.ndarray of {want} is expected, not {type(a).__name__}")
    if a.dtype != np.dtype(dtype):
        raise TypeError(f"{name}: dtype {a.dtype.str if a.dtype.byteorder not in '=|' else a.dtype.name}, "
                        f"expected {np.dtype(dtype).name} in native byte order "
                        f"(convert explicitly, e.g. {name}.astype(np.{np.dtype(dtype).name}))")
    if a.ndim != len(shape) or any(n is not None and m != n for m, n in zip(a.shape, shape)):
        raise ValueError(f"{name}: shape {tuple(a.shape)}, expected {want}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: not C-contiguous (strides {a.strides} for shape {tuple(a.shape)}); "
                         f"pass np.ascontiguousarray({name})")
    if not a.flags.aligned:
        raise ValueError(f"{name}: not aligned to its {a.dtype.itemsize}-byte elements; pass a copy")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name}: read-only; an output array must be writable")
    return a


def _out(name, out, shape, labels, dtype=np.float32):
    if out is None:
        return np.empty(shape, dtype=dtype)
    return _array(name, out, shape, labels, dtype, writable=True)


def _ptr(a):
    return None if a is None else a.ctypes.data


def _address(name, v):
    """A buffer's address for the _raw calls: an int (data_ptr(), ctypes) > 0."""
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise TypeError(f"{name} = {v!r}: expected a buffer's address, a positive int (e.g. tensor.data_ptr())")
    return v


def _int(name, v):
    # Values are the library's to check (collectively); the type is ours.
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: an int is expected, not {type(v).__name__} ({v!r})")
    return int(v)


def _flag(name, v):
    if not isinstance(v, (bool, np.bool_, int, np.integer)) or int(v) not in (0, 1):
        raise TypeError(f"{name}: True or False is expected, not {v!r}")
    return int(bool(v))


def _text(name, v):
    if not isinstance(v, (str, bytes, type(None))):
        raise TypeError(f"{name}: a str is expected, not {type(v).__name__}")
    return v.encode() if isinstance(v, str) else v


# ---- context -------------------------------------------------------------------

_open_contexts = []


@atexit.register
def _close_all():
    # Collective: every rank runs its handlers in the same order. Python's
    # handlers run before mpi4py finalises MPI.
    for c in reversed(list(_open_contexts)):
        try:
            c.close()
        except RelayMoEError:
            pass


def _fortran_comm(comm):
    """The Fortran handle of an mpi4py communicator (portable across MPI
    libraries, unlike the C handle's type)."""
    # Only an mpi4py object has py2f: importing mpi4py before knowing that
    # would initialise MPI as a side effect.
    if getattr(comm, "py2f", None) is None:
        raise TypeError(f"comm: an mpi4py communicator is expected, not {type(comm).__name__}")
    from mpi4py import MPI
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm: an mpi4py communicator is expected, not {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm: MPI.COMM_NULL; a communicator of the ranks that run the layers is expected")
    if comm.Is_inter():
        raise ValueError("comm: an intercommunicator; an intracommunicator is expected")
    return comm.py2f()


class Context:
    """MPI and StarPU for this process (rmoe_ctx). Collective.

    comm: an mpi4py communicator (the expert-parallel group), or None for
    MPI_COMM_WORLD. With mpi4py imported, MPI is already initialised (mpi4py
    asks for MPI_THREAD_MULTIPLE by default, which relaymoe needs). Without
    it the library initialises MPI itself and finalises it on close(): MPI
    cannot be initialised twice, so such a process has one context.
    Keywords are the fields of rmoe_ctx_config (None: the library's default).
    """

    def __init__(self, comm=None, *, ncpus=None, ncuda=None, sched=None, verbose=None,
                 cluster_file=None, trace=None, ring_order=None, blas_threads=None, ranks_per_node=None):
        L = lib()
        fcomm = None if comm is None else _fortran_comm(comm)
        cfg = _capi.padded(_capi.CtxConfig)
        L.rmoe_ctx_config_init(cfg)
        if ncpus is not None:
            cfg.ncpus = _int("ncpus", ncpus)
        if ncuda is not None:
            cfg.ncuda = _int("ncuda", ncuda)
        if verbose is not None:
            cfg.verbose = _int("verbose", verbose)
        if ring_order is not None:
            cfg.ring_order = _int("ring_order", ring_order)
        if blas_threads is not None:
            cfg.blas_threads = _int("blas_threads", blas_threads)
        if ranks_per_node is not None:
            cfg.ranks_per_node = _int("ranks_per_node", ranks_per_node)
        for field, value in (("sched", sched), ("cluster_file", cluster_file), ("trace", trace)):
            if value is not None:
                setattr(cfg, field, _text(field, value))
        finalized = ctypes.c_int(0)
        L.MPI_Finalized(ctypes.byref(finalized))
        if finalized.value:
            raise RelayMoEError(_capi.RMOE_EMPI,
                                "MPI has been finalised in this process (by a context that initialised it, "
                                "or by the application); it cannot be initialised again. Import mpi4py "
                                "before the first context to keep MPI up across contexts")
        handle = ctypes.c_void_p()
        if fcomm is None:
            rc = L.rmoe_ctx_create(ctypes.byref(handle), cfg)
        else:
            rc = L.rmoe_ctx_create_fcomm(ctypes.byref(handle), cfg, fcomm)
        _check(rc)
        self._h = handle
        self._cfg = cfg  # its strings: StarPU may read the policy name after creation
        self._layers = weakref.WeakSet()
        self.comm = comm  # the mpi4py communicator given, or None (MPI_COMM_WORLD)
        self.rank = L.rmoe_ctx_rank(handle)
        self.size = L.rmoe_ctx_size(handle)
        _open_contexts.append(self)

    @property
    def closed(self):
        return self._h is None

    def _handle(self):
        if self._h is None:
            raise _closed("the context is closed")
        return self._h

    def ring_order(self):
        """order[i]: the rank at ring position i (the same on every rank)."""
        order = np.empty(self.size, dtype=np.intc)
        _check(lib().rmoe_ctx_ring_order(self._handle(), order.ctypes.data))
        return order

    def blas_threads(self):
        """OpenBLAS threads per call the context set (0: not OpenBLAS)."""
        return lib().rmoe_ctx_blas_threads(self._handle())

    def close(self):
        """Close this context's open layers, then the context. Collective.
        A second close does nothing."""
        if self._h is None:
            return
        for layer in list(self._layers):
            layer.close()
        h, self._h = self._h, None
        _open_contexts.remove(self)
        _check(lib().rmoe_ctx_destroy(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # A context is this process's MPI and StarPU, which cannot be duplicated:
    # copying an object that holds one (a model, for an EMA) shares it.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("a relaymoe.Context cannot be pickled (it is this process's MPI and StarPU): save the "
                        "weights (a model's state_dict) and create the context and its layers again where they "
                        "are loaded")

    def __repr__(self):
        state = "closed" if self._h is None else f"rank {self.rank} of {self.size}"
        return f"<relaymoe.Context {state}>"


# ---- layer ---------------------------------------------------------------------

_DTYPES = {"f32": _capi.RMOE_DTYPE_F32, "float32": _capi.RMOE_DTYPE_F32,
           "bf16": _capi.RMOE_DTYPE_BF16, "bfloat16": _capi.RMOE_DTYPE_BF16}


def _dispatch_code(name):
    if not isinstance(name, str):
        raise TypeError(f"dispatch: one of 'ring', 'token', 'a2a', 'auto', 'a2a-megatron', 'a2a-deepep' is expected, "
                        f"not {name!r}")
    code = ctypes.c_int(0)
    _check(lib().rmoe_dispatch_parse(name.encode(), ctypes.byref(code)))
    return code.value


def _default_config():
    """An rmoe_layer_config as rmoe_layer_config_init leaves it: the
    library's defaults and what the environment sets (RMOE_WAIT_TIMEOUT for
    wait_timeout, say)."""
    cfg = _capi.padded(_capi.LayerConfig)
    lib().rmoe_layer_config_init(cfg)
    return cfg


def config_default(field):
    """One field of _default_config()."""
    return getattr(_default_config(), field)


class Layer:
    """One MoE layer (rmoe_layer) of a context. Collective creation.

    Keywords are the fields of rmoe_layer_config; None keeps the library's
    default (rmoe_layer_config_init). dispatch: 'ring' (expert routing),
    'token', 'a2a' (the lean all-to-all, pipelined per peer and chunk),
    'a2a-megatron' (Megatron Core 0.13's alltoall dispatcher), 'a2a-deepep' (DeepEP's normal-mode
    dispatch: a token sent once per destination rank) or 'auto'. dtype: 'f32', or 'bf16' (bf16 storage of
    weights, activations and transfers, fp32 accumulation): arrays stay
    float32 at this interface either way, as the C API's are.

    tokens is the capacity: the most tokens one rank is expected to bring to
    one forward, what the layer allocates and mem_cap plans for, the same on
    every rank. Each forward takes any count from 0 (forward: x's rows;
    forward_raw: tokens=, or set_tokens), different on each rank and from
    call to call. A count above the capacity grows it on every rank at that
    forward, except under mem_cap (RelayMoEError RMOE_EINVAL on every rank).
    The layer serves any mix of counts: one layer per MoE layer of a model.
    """

    _FLAG_FIELDS = ("norm_topk", "shared_gated", "overlap", "deterministic", "check_finite")

    def __init__(self, ctx, *, hidden=None, ffn=None, experts=None, topk=None, tokens=None,
                 norm_topk=None, shared_ffn=None, shared_gated=None, dispatch=None, dtype=None, chunk_rows=None,
                 overlap=None, deterministic=None, mem_cap=None, check_finite=None, wait_timeout=None,
                 partitions=None, window=None, stripes=None):
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: a relaymoe.Context is expected, not {type(ctx).__name__}")
        given = dict(hidden=hidden, ffn=ffn, experts=experts, topk=topk, tokens=tokens,
                     norm_topk=norm_topk, shared_ffn=shared_ffn, shared_gated=shared_gated, chunk_rows=chunk_rows, overlap=overlap,
                     deterministic=deterministic, mem_cap=mem_cap, check_finite=check_finite,
                     partitions=partitions, window=window, stripes=stripes)
        L = lib()
        cfg = _default_config()
        for field, value in given.items():
            if value is None:
                continue
            setattr(cfg, field, _flag(field, value) if field in self._FLAG_FIELDS else _int(field, value))
        if dispatch is not None:
            cfg.dispatch = _dispatch_code(dispatch)
        if dtype is not None:
            if dtype not in _DTYPES:
                raise ValueError(f"dtype {dtype!r}: expected 'f32' or 'bf16'")
            cfg.dtype = _DTYPES[dtype]
        if wait_timeout is not None:
            if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)):
                raise TypeError(f"wait_timeout: seconds as a number are expected, not {wait_timeout!r}")
            cfg.wait_timeout = float(wait_timeout)
        handle = ctypes.c_void_p()
        _check(L.rmoe_layer_create(ctypes.byref(handle), ctx._handle(), cfg))
        self._h = handle
        self._ctx = ctx
        self.config = {name: getattr(cfg, name) for name, _ in _capi.LayerConfig._fields_}
        c = self.config
        self.hidden, self.ffn, self.experts, self.topk, self.shared_ffn = (
            c["hidden"], c["ffn"], c["experts"], c["topk"], c["shared_ffn"])
        # The library's counts, kept here too (readable once the layer is
        # closed): the next forward's, and the last forward's, which the
        # backward's arrays have. Both are the capacity until set.
        self._tokens = self._forward_tokens = c["tokens"]
        self.shared_gated = bool(c["shared_gated"])
        first, count = ctypes.c_int64(), ctypes.c_int64()
        _check(L.rmoe_layer_owned_experts(handle, ctypes.byref(first), ctypes.byref(count)))
        self.owned_experts = range(first.value, first.value + count.value)
        self.forwards = 0  # successful forwards: backward applies to the last one
        ctx._layers.add(self)

    # -- state ------------------------------------------------------------------

    @property
    def closed(self):
        return self._h is None

    def _handle(self):
        if self._h is None:
            if self._ctx.closed:
                raise _closed("the layer is closed (its context was closed)")
            raise _closed("the layer is closed")
        return self._h

    def close(self):
        """Destroy the layer (not collective). A second close does nothing."""
        if self._h is None:
            return
        h, self._h = self._h, None
        self._ctx._layers.discard(self)
        _check(lib().rmoe_layer_destroy(h))

    def __del__(self):
        # Not collective, so safe at any time; the context outlives its
        # layers (it closes them first).
        try:
            if getattr(self, "_h", None) is not None and not self._ctx.closed:
                lib().rmoe_layer_destroy(self._h)
                self._h = None
        except Exception:  # interpreter shutdown: the module may be gone
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Creating a layer is collective, and a copy made inside copy.deepcopy on
    # one rank would leave the others waiting: copies are refused, naming how.
    def _refuse_copy(self, *_):
        raise TypeError("a relaymoe.Layer cannot be copied or pickled: create another relaymoe.Layer with the "
                        "same keywords (collective: on every rank at once) and set its weights from this one's "
                        "(get_router, get_expert)")

    __copy__ = __deepcopy__ = __reduce__ = _refuse_copy

    def __repr__(self):
        if self._h is None:
            return "<relaymoe.Layer closed>"
        return (f"<relaymoe.Layer {self.dispatch} H={self.hidden} F={self.ffn} E={self.experts} "
                f"K={self.topk} T={self.tokens} (capacity {self.config['tokens']}) "
                f"experts {self.owned_experts.start}.."
                f"{self.owned_experts.stop - 1} here>")

    @property
    def dispatch(self):
        """The dispatch the layer runs ('auto' resolved)."""
        L = lib()
        return L.rmoe_dispatch_name(L.rmoe_layer_dispatch(self._handle())).decode()

    @property
    def dispatch_reason(self):
        return lib().rmoe_layer_dispatch_reason(self._handle()).decode()

    # -- token counts -------------------------------------------------------------

    @property
    def tokens(self):
        """This rank's count for the next forward (rmoe_layer_tokens): as last
        set (set_tokens, forward, forward_raw's tokens=), the capacity until then."""
        return self._tokens

    @property
    def forward_tokens(self):
        """This rank's count in the last forward: the rows of dy, dx, dprobs and
        routing() (the capacity before any forward)."""
        return self._forward_tokens

    def set_tokens(self, tokens):
        """This rank's count for the forwards that follow (forward sets it
        from x's rows itself; forward_raw from its tokens=). Not collective:
        ranks may set different counts. A count above the capacity grows it
        at the next forward (under mem_cap that forward fails on every
        rank); a negative one raises RelayMoEError RMOE_EINVAL."""
        h = self._handle()
        tokens = _int("tokens", tokens)
        _check(lib().rmoe_layer_set_tokens(h, tokens))
        self._tokens = tokens

    # -- shapes -----------------------------------------------------------------

    def _tokens_shape(self, tokens):
        return (tokens, self.hidden), ("T", "H")

    def _expert_shapes(self, ffn):
        return ((self.hidden, ffn), ("H", "F")), ((self.hidden, ffn), ("H", "F")), ((ffn, self.hidden),
                                                                                  ("F", "H"))

    def _expert_index(self, e):
        return _int("e", e)

    # -- weights ----------------------------------------------------------------

    def set_router(self, w_router):
        """w_router [H, E], the same on every rank."""
        h = self._handle()
        w = _array("w_router", w_router, (self.hidden, self.experts), ("H", "E"))
        _check(lib().rmoe_layer_set_router(h, _ptr(w)))

    def get_router(self, out=None):
        h = self._handle()
        w = _out("out", out, (self.hidden, self.experts), ("H", "E"))
        _check(lib().rmoe_layer_get_router(h, _ptr(w)))
        return w

    def set_expert(self, e, w_gate, w_up, w_down):
        """Expert e (global number, owned by this rank): w_gate, w_up [H, F], w_down [F, H]."""
        h = self._handle()
        e = self._expert_index(e)
        (sg, lg), (su, lu), (sd, ld) = self._expert_shapes(self.ffn)
        g = _array("w_gate", w_gate, sg, lg)
        u = _array("w_up", w_up, su, lu)
        d = _array("w_down", w_down, sd, ld)
        _check(lib().rmoe_layer_set_expert(h, e, _ptr(g), _ptr(u), _ptr(d)))

    def get_expert(self, e):
        """(w_gate, w_up, w_down) of owned expert e."""
        return self._expert_triplet(lib().rmoe_layer_get_expert, e)

    def set_shared(self, w_gate, w_up, w_down):
        """The shared expert (shared_ffn = FS): w_gate, w_up [H, FS], w_down [FS, H], the same on every rank."""
        h = self._handle()
        H, FS = self.hidden, self.shared_ffn
        g = _array("w_gate", w_gate, (H, FS), ("H", "FS"))
        u = _array("w_up", w_up, (H, FS), ("H", "FS"))
        d = _array("w_down", w_down, (FS, H), ("FS", "H"))
        _check(lib().rmoe_layer_set_shared(h, _ptr(g), _ptr(u), _ptr(d)))

    def set_shared_expert_gate(self, w):
        """The gate of a gated shared expert (shared_gated): w [H], the same on
        every rank (Qwen2-MoE's shared_expert_gate, a Linear(H, 1) weight)."""
        h = self._handle()
        w = _array("w", w, (self.hidden,), ("H",))
        _check(lib().rmoe_layer_set_shared_expert_gate(h, _ptr(w)))

    def get_shared_expert_gate(self, out=None):
        h = self._handle()
        w = _out("out", out, (self.hidden,), ("H",))
        _check(lib().rmoe_layer_get_shared_expert_gate(h, _ptr(w)))
        return w

    def set_weights(self, w_router, w_gate, w_up, w_down):
        """The router [H, E] and the experts this rank owns, picked from the
        whole layer's w_gate, w_up [E, H, F] and w_down [E, F, H]."""
        self._handle()
        E, H, F = self.experts, self.hidden, self.ffn
        g = _array("w_gate", w_gate, (E, H, F), ("E", "H", "F"))
        u = _array("w_up", w_up, (E, H, F), ("E", "H", "F"))
        d = _array("w_down", w_down, (E, F, H), ("E", "F", "H"))
        self.set_router(w_router)
        for e in self.owned_experts:
            self.set_expert(e, g[e], u[e], d[e])

    # -- passes -----------------------------------------------------------------

    def _refuse_forward(self):
        # The other ranks are entering the same collective call: NULL
        # arguments fail the library's argument check on every rank. A rank
        # set to 0 tokens may pass NULL, so the refusal is made with 1, and
        # the count set before is restored.
        L = lib()
        L.rmoe_layer_set_tokens(self._h, max(self._tokens, 1))
        L.rmoe_layer_forward(self._h, None, None)
        L.rmoe_layer_set_tokens(self._h, self._tokens)

    def _refuse_backward(self):
        # As for the forward; but the count is the last forward's, so a rank
        # that had no tokens there passes the library's check (it has no
        # arrays to give) and only the others' backward goes on.
        lib().rmoe_layer_backward_ex(self._h, None, None, None)

    def _count_or_refuse(self, tokens):
        """set_tokens(tokens) before a forward; a refused count refuses the
        forward on every rank too."""
        try:
            self.set_tokens(tokens)
        except (TypeError, RelayMoEError):
            self._refuse_forward()
            raise

    def forward(self, x, out=None):
        """y [T, H] for x [T, H], T = x's rows, any number from 0 (the
        layer's tokens= is the capacity; a larger T grows it). Collective;
        ranks may bring different counts. The layer keeps a copy of x and
        the routing for backward."""
        h = self._handle()
        L = lib()
        try:
            x = _array("x", x, (None, self.hidden), ("T", "H"))
            shape, labels = self._tokens_shape(x.shape[0])
            y = _out("out", out, shape, labels)
        except (TypeError, ValueError):
            self._refuse_forward()
            raise
        self._count_or_refuse(x.shape[0])
        _check(L.rmoe_layer_forward(h, _ptr(x), _ptr(y)))
        self._forward_tokens = x.shape[0]
        self.forwards += 1
        return y

    def backward(self, dy, dprobs=None, out=None):
        """dx [T, H] for dy [T, H] of the last forward, T its count
        (forward_tokens), and dprobs [T, E], a gradient on the router
        probabilities, when given. Collective. Weight gradients stay in the
        layer: grad_router(), grad_expert()."""
        h = self._handle()
        shape, labels = self._tokens_shape(self._forward_tokens)
        L = lib()
        try:
            dy = _array("dy", dy, shape, labels)
            if dprobs is not None:
                dprobs = _array("dprobs", dprobs, (self._forward_tokens, self.experts), ("T", "E"))
            dx = _out("out", out, shape, labels)
        except (TypeError, ValueError):
            self._refuse_backward()
            raise
        _check(L.rmoe_layer_backward_ex(h, _ptr(dy), _ptr(dprobs), _ptr(dx)))
        return dx

    def forward_raw(self, x_ptr, y_ptr, device=True, tokens=None):
        """The forward on buffers given by address, in the layer's element type
        ([T, H] float32, or bf16 such as a torch.bfloat16 tensor's data_ptr()),
        on the rank's CUDA device (device=True) or in main memory: nothing is
        converted or copied through the host. Collective. T is tokens when
        given (set_tokens(tokens) first), else the count last set (by
        set_tokens, a forward, an earlier tokens=): the capacity until then,
        so callers that always bring the capacity need not say it."""
        h = self._handle()
        where = _capi.RMOE_MEMORY_DEVICE if device else _capi.RMOE_MEMORY_HOST
        try:
            x_ptr, y_ptr = _address("x_ptr", x_ptr), _address("y_ptr", y_ptr)
        except TypeError:
            self._refuse_forward()
            raise
        if tokens is not None:
            self._count_or_refuse(tokens)
        _check(lib().rmoe_layer_forward_raw(h, where, x_ptr, y_ptr))
        self._forward_tokens = self._tokens
        self.forwards += 1

    def backward_raw(self, dy_ptr, dx_ptr, dprobs_ptr=None, device=True):
        """The backward likewise, on the last forward's T tokens
        (forward_tokens); dprobs_ptr ([T, E] float32) may be None."""
        h = self._handle()
        where = _capi.RMOE_MEMORY_DEVICE if device else _capi.RMOE_MEMORY_HOST
        try:
            dy_ptr, dx_ptr = _address("dy_ptr", dy_ptr), _address("dx_ptr", dx_ptr)
            dprobs_ptr = None if dprobs_ptr is None else _address("dprobs_ptr", dprobs_ptr)
        except TypeError:
            self._refuse_backward()
            raise
        _check(lib().rmoe_layer_backward_raw(h, where, dy_ptr, dprobs_ptr, dx_ptr))

    def check_finite(self, x=None, dy=None):
        """Collective: RelayMoEError RMOE_ENONFINITE on every rank when a
        weight, x or dy holds NaN or infinity. x is the next forward's input
        (any T rows: its count is set, as forward would), dy the last
        forward's gradient [forward_tokens, H]."""
        h = self._handle()
        x = None if x is None else _array("x", x, (None, self.hidden), ("T", "H"))
        shape, labels = self._tokens_shape(self._forward_tokens)
        dy = None if dy is None else _array("dy", dy, shape, labels)
        if x is not None:
            self.set_tokens(x.shape[0])
        _check(lib().rmoe_layer_check_finite(h, _ptr(x), _ptr(dy)))

    # -- gradients and routing ----------------------------------------------------

    def grad_router(self, out=None):
        """dw_router [H, E] from this rank's tokens: sum it over ranks."""
        h = self._handle()
        w = _out("out", out, (self.hidden, self.experts), ("H", "E"))
        _check(lib().rmoe_layer_get_grad_router(h, _ptr(w)))
        return w

    def grad_expert(self, e):
        """(dw_gate, dw_up, dw_down) of owned expert e, complete over all ranks' tokens."""
        return self._expert_triplet(lib().rmoe_layer_get_grad_expert, e)

    def _expert_triplet(self, fn, e):
        """Three new arrays (gate, up, down shapes) that fn fills for owned expert e."""
        h = self._handle()
        e = self._expert_index(e)
        (sg, _), (su, _), (sd, _) = self._expert_shapes(self.ffn)
        g, u, d = np.empty(sg, np.float32), np.empty(su, np.float32), np.empty(sd, np.float32)
        _check(fn(h, e, _ptr(g), _ptr(u), _ptr(d)))
        return g, u, d

    def grad_shared(self):
        h = self._handle()
        (sg, _), (su, _), (sd, _) = self._expert_shapes(self.shared_ffn)
        g, u, d = np.empty(sg, np.float32), np.empty(su, np.float32), np.empty(sd, np.float32)
        _check(lib().rmoe_layer_get_grad_shared(h, _ptr(g), _ptr(u), _ptr(d)))
        return g, u, d

    def grad_shared_expert_gate(self, out=None):
        """dw [H] of the shared expert's gate from this rank's tokens: sum it over ranks."""
        h = self._handle()
        w = _out("out", out, (self.hidden,), ("H",))
        _check(lib().rmoe_layer_get_grad_shared_expert_gate(h, _ptr(w)))
        return w

    def grads(self):
        """dw_router [H, E] (this rank's part) and the owned experts'
        dw_gate, dw_up [n, H, F], dw_down [n, F, H] (n = len(owned_experts))."""
        per = [self.grad_expert(e) for e in self.owned_experts]
        H, F = self.hidden, self.ffn
        return {"dw_router": self.grad_router(),
                "dw_gate": np.stack([p[0] for p in per]) if per else np.empty((0, H, F), np.float32),
                "dw_up": np.stack([p[1] for p in per]) if per else np.empty((0, H, F), np.float32),
                "dw_down": np.stack([p[2] for p in per]) if per else np.empty((0, F, H), np.float32)}

    def routing(self):
        """Routing of the last forward, T its count (forward_tokens):
        (indices [T, K] int32, weights [T, K], probs [T, E])."""
        h = self._handle()
        T, K, E = self._forward_tokens, self.topk, self.experts
        idx, w, p = np.empty((T, K), np.int32), np.empty((T, K), np.float32), np.empty((T, E), np.float32)
        _check(lib().rmoe_layer_get_routing(h, _ptr(idx), _ptr(w), _ptr(p)))
        return idx, w, p

    def stats(self):
        """rmoe_layer_stats of the last forward and backward, as a dict."""
        h = self._handle()
        s = _capi.padded(_capi.LayerStats)
        _check(lib().rmoe_layer_get_stats(h, s))
        return {name: getattr(s, name) for name, _ in _capi.LayerStats._fields_}
