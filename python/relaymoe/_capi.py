"""The C library through ctypes: where librelaymoe.so is found, the mirrors of
the public structs and enums of relaymoe.h, and the function prototypes.

Finding the library, first match wins:
  1. RELAYMOE_LIBRARY: the path of librelaymoe.so itself;
  2. RELAYMOE_PREFIX: the prefix given to `cmake --install` (lib/, lib64/ or
     lib/<multiarch>/ under it);
  3. pkg-config: the libdir of relaymoe.pc (PKG_CONFIG_PATH);
  4. the dynamic loader's own search (LD_LIBRARY_PATH, ldconfig).

The mirrors below must match include/relaymoe/relaymoe.h field for field;
tests/python/test_layout.py compiles a program from the installed header and
fails on any difference (a field added, moved, resized or retyped).
"""
import ctypes
import ctypes.util
import glob
import os
import subprocess
import sysconfig

# ---- enums of relaymoe.h (values checked against the header by the tests) ----

RMOE_OK = 0
RMOE_EINVAL = -1
RMOE_ENOMEM = -2
RMOE_EMPI = -3
RMOE_ESTARPU = -4
RMOE_EMISMATCH = -5
RMOE_ESTATE = -6
RMOE_ENOTSUP = -7
RMOE_EIO = -8
RMOE_ENONFINITE = -9
RMOE_EFORMAT = -10
RMOE_EPEER = -11

RMOE_DISPATCH_ALLTOALL = 0
RMOE_DISPATCH_RING_EXPERT = 1
RMOE_DISPATCH_RING_TOKEN = 2
RMOE_DISPATCH_AUTO = 3
RMOE_DISPATCH_ALLTOALL_MEGATRON = 4
RMOE_DISPATCH_ALLTOALL_DEEPEP = 5

RMOE_DTYPE_F32 = 0
RMOE_DTYPE_BF16 = 1

RMOE_MEMORY_HOST = 0
RMOE_MEMORY_DEVICE = 1

RMOE_RING_PLANNED = 0
RMOE_RING_RANK = 1

ENUMS = {name: value for name, value in globals().items() if name.startswith("RMOE_")}
ERROR_NAMES = {value: name for name, value in ENUMS.items()
               if name == "RMOE_OK" or name.startswith("RMOE_E")}

# ---- struct mirrors ------------------------------------------------------------
# C enums are int on every ABI the library builds for (gcc, x86-64/aarch64).


class CtxConfig(ctypes.Structure):
    _fields_ = [
        ("ncpus", ctypes.c_int),
        ("ncuda", ctypes.c_int),
        ("sched", ctypes.c_char_p),
        ("verbose", ctypes.c_int),
        ("cluster_file", ctypes.c_char_p),
        ("trace", ctypes.c_char_p),
        ("ring_order", ctypes.c_int),
        ("blas_threads", ctypes.c_int),
        ("ranks_per_node", ctypes.c_int),
    ]


class LayerConfig(ctypes.Structure):
    _fields_ = [
        ("hidden", ctypes.c_int64),
        ("ffn", ctypes.c_int64),
        ("experts", ctypes.c_int64),
        ("topk", ctypes.c_int64),
        ("tokens", ctypes.c_int64),
        ("norm_topk", ctypes.c_int),
        ("shared_ffn", ctypes.c_int64),
        ("shared_gated", ctypes.c_int),
        ("dispatch", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("chunk_rows", ctypes.c_int64),
        ("overlap", ctypes.c_int),
        ("deterministic", ctypes.c_int),
        ("mem_cap", ctypes.c_int64),
        ("check_finite", ctypes.c_int),
        ("wait_timeout", ctypes.c_double),
        ("partitions", ctypes.c_int64),
        ("window", ctypes.c_int),
        ("stripes", ctypes.c_int),
    ]


class LayerStats(ctypes.Structure):
    _fields_ = [
        ("forward_seconds", ctypes.c_double),
        ("backward_seconds", ctypes.c_double),
        ("peak_forward_bytes", ctypes.c_int64),
        ("peak_backward_bytes", ctypes.c_int64),
        ("resident_bytes", ctypes.c_int64),
        ("largest_temporary_bytes", ctypes.c_int64),
        ("bytes_sent_forward", ctypes.c_int64),
        ("bytes_sent_backward", ctypes.c_int64),
        ("peak_rss_bytes", ctypes.c_int64),
        ("hops", ctypes.c_int),
        ("chunk_rows", ctypes.c_int64),
        ("peak_device_forward_bytes", ctypes.c_int64),
        ("peak_device_backward_bytes", ctypes.c_int64),
        ("host_waits_forward", ctypes.c_int),
        ("host_waits_backward", ctypes.c_int),
        ("peak_heap_forward_bytes", ctypes.c_int64),
        ("peak_heap_backward_bytes", ctypes.c_int64),
        ("runtime_forward_bytes", ctypes.c_int64),
        ("runtime_backward_bytes", ctypes.c_int64),
    ]


MIRRORS = {"rmoe_ctx_config": CtxConfig, "rmoe_layer_config": LayerConfig,
           "rmoe_layer_stats": LayerStats}

# The C side writes whole structs (the *_init functions, get_stats). Each is
# given a buffer this much larger than its mirror, so that a library newer
# than this package, whose struct gained fields, writes into slack rather
# than past the end; the fields it adds keep the values its *_init gave them.
_SLACK = 1024


def padded(mirror):
    """A zeroed mirror struct at the start of a buffer _SLACK bytes larger."""
    buf = (ctypes.c_char * (ctypes.sizeof(mirror) + _SLACK))()
    return mirror.from_buffer(buf)


# ---- finding and loading the library ----------------------------------------------


class LibraryNotFound(OSError):
    pass


def _in_prefix(prefix):
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for sub in ("lib", "lib64", os.path.join("lib", multiarch) if multiarch else None):
        if sub is None:
            continue
        for name in ("librelaymoe.so", "librelaymoe.so.*"):
            hits = sorted(glob.glob(os.path.join(prefix, sub, name)))
            if hits:
                return hits[0]
    return None


def _from_pkg_config():
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "relaymoe"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    libdir = out.stdout.strip()
    if out.returncode != 0 or not libdir:
        return None
    path = os.path.join(libdir, "librelaymoe.so")
    return path if os.path.exists(path) else None


def find_library():
    """The path (or loader name) of librelaymoe.so, by the order above."""
    path = os.environ.get("RELAYMOE_LIBRARY")
    if path:
        if not os.path.exists(path):
            raise LibraryNotFound(f"RELAYMOE_LIBRARY={path}: no such file")
        return path
    prefix = os.environ.get("RELAYMOE_PREFIX")
    if prefix:
        path = _in_prefix(prefix)
        if not path:
            raise LibraryNotFound(f"RELAYMOE_PREFIX={prefix}: no librelaymoe.so under its lib/, lib64/ "
                                  f"or lib/<multiarch>/ (was relaymoe installed there with cmake --install?)")
        return path
    path = _from_pkg_config()
    if path:
        return path
    name = ctypes.util.find_library("relaymoe")
    return name or "librelaymoe.so.0"


_lib = None
_path = None


def _prototypes(lib):
    c_int, c_int64, vp, cp = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p
    P = ctypes.POINTER
    protos = {
        "rmoe_strerror": (cp, [c_int]),
        "rmoe_ctx_config_init": (None, [P(CtxConfig)]),
        "rmoe_ctx_create": (c_int, [P(vp), P(CtxConfig)]),
        "rmoe_ctx_create_fcomm": (c_int, [P(vp), P(CtxConfig), c_int]),
        "rmoe_ctx_destroy": (c_int, [vp]),
        "rmoe_ctx_rank": (c_int, [vp]),
        "rmoe_ctx_size": (c_int, [vp]),
        "rmoe_ctx_ring_order": (c_int, [vp, vp]),
        "rmoe_ctx_blas_threads": (c_int, [vp]),
        "rmoe_layer_config_init": (None, [P(LayerConfig)]),
        "rmoe_layer_create": (c_int, [P(vp), vp, P(LayerConfig)]),
        "rmoe_layer_destroy": (c_int, [vp]),
        "rmoe_layer_set_tokens": (c_int, [vp, c_int64]),
        "rmoe_layer_tokens": (c_int64, [vp]),
        "rmoe_layer_owned_experts": (c_int, [vp, P(c_int64), P(c_int64)]),
        "rmoe_layer_dispatch": (c_int, [vp]),
        "rmoe_layer_dispatch_reason": (cp, [vp]),
        "rmoe_layer_set_router": (c_int, [vp, vp]),
        "rmoe_layer_get_router": (c_int, [vp, vp]),
        "rmoe_layer_set_expert": (c_int, [vp, c_int64, vp, vp, vp]),
        "rmoe_layer_get_expert": (c_int, [vp, c_int64, vp, vp, vp]),
        "rmoe_layer_set_shared": (c_int, [vp, vp, vp, vp]),
        "rmoe_layer_set_shared_expert_gate": (c_int, [vp, vp]),
        "rmoe_layer_get_shared_expert_gate": (c_int, [vp, vp]),
        "rmoe_layer_get_grad_shared_expert_gate": (c_int, [vp, vp]),
        "rmoe_layer_forward": (c_int, [vp, vp, vp]),
        "rmoe_layer_backward_ex": (c_int, [vp, vp, vp, vp]),
        "rmoe_layer_forward_raw": (c_int, [vp, c_int, vp, vp]),
        "rmoe_layer_backward_raw": (c_int, [vp, c_int, vp, vp, vp]),
        "rmoe_layer_get_grad_router": (c_int, [vp, vp]),
        "rmoe_layer_get_grad_expert": (c_int, [vp, c_int64, vp, vp, vp]),
        "rmoe_layer_get_grad_shared": (c_int, [vp, vp, vp, vp]),
        "rmoe_layer_check_finite": (c_int, [vp, vp, vp]),
        "rmoe_layer_get_routing": (c_int, [vp, vp, vp, vp]),
        "rmoe_layer_get_stats": (c_int, [vp, P(LayerStats)]),
        "rmoe_dispatch_name": (cp, [c_int]),
        "rmoe_dispatch_parse": (c_int, [cp, P(c_int)]),
        # From the MPI library librelaymoe links: a context must not be
        # created once MPI is finalised (MPI_Init would abort the process).
        "MPI_Initialized": (c_int, [P(c_int)]),
        "MPI_Finalized": (c_int, [P(c_int)]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def lib():
    """The loaded library (loaded on first use)."""
    global _lib, _path
    if _lib is None:
        path = find_library()
        try:
            # RTLD_GLOBAL: Open MPI loads its components with dlopen and they
            # resolve libmpi's symbols from the global scope; loading
            # librelaymoe globally puts its libmpi there too (mpi4py does the
            # same when it is imported first).
            handle = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise LibraryNotFound(
                f"cannot load the relaymoe library ({path}): {e}. Set RELAYMOE_LIBRARY to the path of "
                f"librelaymoe.so or RELAYMOE_PREFIX to the prefix it was installed into "
                f"(cmake --install build --prefix PREFIX)") from None
        _prototypes(handle)
        _lib, _path = handle, path
    return _lib


def library_path():
    """Where the library was loaded from (loads it)."""
    lib()
    return _path
