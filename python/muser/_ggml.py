"""ctypes binding to llama.cpp's ggml, as installed by the ``llama-cpp-python`` package.

This is muser's comparator: the pinned route (:mod:`muser.pinned`) and the parity
ladder tests call ggml's own public C API through it, so "equal to llama.cpp"
is measured against llama.cpp's kernels, not against a re-implementation.

Where the libraries come from: ``<site-packages>/llama_cpp/lib`` (found without
importing ``llama_cpp``), or the directory named by ``MUSER_GGML_LIB_DIR``.
``libggml-base`` holds the graph API, type traits and quantizers;
``libggml-cpu`` holds graph compute and the CPU kernels.

Nothing here is called at import time: :func:`lib` loads and checks the
libraries on first use and raises :class:`muser.Error` (never crashes) when
they are missing, lack a symbol, or have a struct layout this module does not
know. ggml aborts the process on a failed internal assertion, so every wrapper
validates shapes and types in Python before calling into C.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ._core import Error

__all__ = [
    "GGML",
    "GraphBuilder",
    "Backend",
    "BackendTensors",
    "BackendGraphBuilder",
    "lib",
    "available",
    "unavailable_reason",
    "type_id",
    "type_name",
]

# ---------------------------------------------------------------------------
# C declarations (mirroring ggml/include/ggml.h and ggml-cpu.h of the
# installed version; layouts are verified at load time, see _verify_layouts)

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64

c_ctx_p = ctypes.c_void_p  # struct ggml_context *
c_graph_p = ctypes.c_void_p  # struct ggml_cgraph *


class InitParams(ctypes.Structure):
    """``struct ggml_init_params``."""

    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


class Tensor(ctypes.Structure):
    """``struct ggml_tensor`` (ggml.h; same layout since the ``extra``/``padding`` tail of 2024)."""


Tensor._fields_ = [
    ("type", ctypes.c_int),
    ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
    ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
    ("op", ctypes.c_int),
    ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
    ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(Tensor) * GGML_MAX_SRC),
    ("view_src", ctypes.POINTER(Tensor)),
    ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p),
    ("name", ctypes.c_char * GGML_MAX_NAME),
    ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]
TensorP = ctypes.POINTER(Tensor)

# typedef void (*ggml_to_float_t)  (const void  * x, float * y, int64_t k);
# typedef void (*ggml_from_float_t)(const float * x, void  * y, int64_t k);
ToFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
FromFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
# typedef void (*ggml_vec_dot_t)(int n, float * s, size_t bs, const void * x, size_t bx,
#                                const void * y, size_t by, int nrc);
VecDot = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
)


class TypeTraits(ctypes.Structure):
    """``struct ggml_type_traits`` as of ggml 0.9.x (has ``blck_size_interleave``)."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


class TypeTraitsOld(ctypes.Structure):
    """``struct ggml_type_traits`` before ``blck_size_interleave`` was added (2024)."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


class TypeTraitsCpu(ctypes.Structure):
    """``struct ggml_type_traits_cpu`` (ggml-cpu.h)."""

    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


class CPlan(ctypes.Structure):
    """``struct ggml_cplan`` (ggml-cpu.h)."""

    _fields_ = [
        ("work_size", ctypes.c_size_t),
        ("work_data", ctypes.c_void_p),
        ("n_threads", ctypes.c_int),
        ("threadpool", ctypes.c_void_p),
        ("abort_callback", ctypes.c_void_p),
        ("abort_callback_data", ctypes.c_void_p),
        ("use_ref", ctypes.c_bool),
    ]


# name -> (library key, restype, argtypes). "base" = libggml-base, "cpu" = libggml-cpu.
_F = ctypes.c_float
_SIGNATURES: dict[str, tuple[str, Any, list[Any]]] = {
    "ggml_version": ("base", ctypes.c_char_p, []),
    "ggml_commit": ("base", ctypes.c_char_p, []),
    "ggml_init": ("base", c_ctx_p, [InitParams]),
    "ggml_free": ("base", None, [c_ctx_p]),
    "ggml_tensor_overhead": ("base", ctypes.c_size_t, []),
    "ggml_graph_overhead_custom": ("base", ctypes.c_size_t, [ctypes.c_size_t, ctypes.c_bool]),
    "ggml_new_tensor_1d": ("base", TensorP, [c_ctx_p, ctypes.c_int, ctypes.c_int64]),
    "ggml_new_tensor_2d": ("base", TensorP, [c_ctx_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
    "ggml_get_data": ("base", ctypes.c_void_p, [TensorP]),
    "ggml_get_name": ("base", ctypes.c_char_p, [TensorP]),
    "ggml_set_name": ("base", TensorP, [TensorP, ctypes.c_char_p]),
    "ggml_nbytes": ("base", ctypes.c_size_t, [TensorP]),
    "ggml_nelements": ("base", ctypes.c_int64, [TensorP]),
    "ggml_type_size": ("base", ctypes.c_size_t, [ctypes.c_int]),
    "ggml_blck_size": ("base", ctypes.c_int64, [ctypes.c_int]),
    "ggml_row_size": ("base", ctypes.c_size_t, [ctypes.c_int, ctypes.c_int64]),
    "ggml_type_name": ("base", ctypes.c_char_p, [ctypes.c_int]),
    "ggml_op_name": ("base", ctypes.c_char_p, [ctypes.c_int]),
    "ggml_rms_norm": ("base", TensorP, [c_ctx_p, TensorP, _F]),
    "ggml_norm": ("base", TensorP, [c_ctx_p, TensorP, _F]),
    "ggml_mul": ("base", TensorP, [c_ctx_p, TensorP, TensorP]),
    "ggml_add": ("base", TensorP, [c_ctx_p, TensorP, TensorP]),
    "ggml_mul_mat": ("base", TensorP, [c_ctx_p, TensorP, TensorP]),
    "ggml_scale": ("base", TensorP, [c_ctx_p, TensorP, _F]),
    "ggml_scale_inplace": ("base", TensorP, [c_ctx_p, TensorP, _F]),
    "ggml_tanh": ("base", TensorP, [c_ctx_p, TensorP]),
    "ggml_tanh_inplace": ("base", TensorP, [c_ctx_p, TensorP]),
    "ggml_new_graph_custom": ("base", c_graph_p, [c_ctx_p, ctypes.c_size_t, ctypes.c_bool]),
    "ggml_new_graph": ("base", c_graph_p, [c_ctx_p]),
    "ggml_build_forward_expand": ("base", None, [c_graph_p, TensorP]),
    "ggml_graph_n_nodes": ("base", ctypes.c_int, [c_graph_p]),
    "ggml_graph_node": ("base", TensorP, [c_graph_p, ctypes.c_int]),
    "ggml_quantize_chunk": ("base", ctypes.c_size_t, [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]),
    "ggml_quantize_requires_imatrix": ("base", ctypes.c_bool, [ctypes.c_int]),
    "ggml_get_type_traits": ("base", ctypes.c_void_p, [ctypes.c_int]),
    "ggml_backend_tensor_get": ("base", None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]),
    "ggml_cpu_init": ("cpu", None, []),
    "ggml_get_type_traits_cpu": ("cpu", ctypes.POINTER(TypeTraitsCpu), [ctypes.c_int]),
    "ggml_graph_plan": ("cpu", CPlan, [c_graph_p, ctypes.c_int, ctypes.c_void_p]),
    "ggml_graph_compute": ("cpu", ctypes.c_int, [c_graph_p, ctypes.POINTER(CPlan)]),
    "ggml_graph_compute_with_ctx": ("cpu", ctypes.c_int, [c_ctx_p, c_graph_p, ctypes.c_int]),
}
# The ggml-backend API (ggml-backend.h, ggml-alloc.h, ggml-metal.h): what
# PinnedHead(backend=...) computes through. Optional: a library without them
# still serves the CPU graph API; Backend() says what is missing.
_BACKEND_SIGNATURES: dict[str, tuple[str, Any, list[Any]]] = {
    "ggml_backend_reg_by_name": ("ggml", ctypes.c_void_p, [ctypes.c_char_p]),
    "ggml_backend_reg_dev_count": ("base", ctypes.c_size_t, [ctypes.c_void_p]),
    "ggml_backend_reg_dev_get": ("base", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
    "ggml_backend_dev_init": ("base", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "ggml_backend_free": ("base", None, [ctypes.c_void_p]),
    "ggml_backend_name": ("base", ctypes.c_char_p, [ctypes.c_void_p]),
    "ggml_backend_alloc_ctx_tensors": ("base", ctypes.c_void_p, [c_ctx_p, ctypes.c_void_p]),
    "ggml_backend_buffer_free": ("base", None, [ctypes.c_void_p]),
    "ggml_backend_tensor_set": ("base", None, [TensorP, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]),
    "ggml_backend_graph_compute": ("base", ctypes.c_int, [ctypes.c_void_p, c_graph_p]),
    "ggml_backend_supports_op": ("base", ctypes.c_bool, [ctypes.c_void_p, TensorP]),
}
_BACKEND_OPTIONAL: dict[str, tuple[str, Any, list[Any]]] = {
    "ggml_backend_load_all": ("ggml", None, []),  # dynamic-backend builds (GGML_BACKEND_DL) register on demand
    "ggml_backend_metal_init": ("metal", ctypes.c_void_p, []),
    "ggml_backend_cpu_set_n_threads": ("cpu", None, [ctypes.c_void_p, ctypes.c_int]),
}

# optional: informational only
_OPTIONAL = {
    "ggml_cpu_has_avx2": ("cpu", ctypes.c_int, []),
    "ggml_cpu_has_avx512": ("cpu", ctypes.c_int, []),
    "ggml_cpu_has_avx512_vnni": ("cpu", ctypes.c_int, []),
    "ggml_cpu_has_avx_vnni": ("cpu", ctypes.c_int, []),
    "ggml_cpu_has_amx_int8": ("cpu", ctypes.c_int, []),
    "ggml_cpu_has_neon": ("cpu", ctypes.c_int, []),
    "ggml_cpu_has_llamafile": ("cpu", ctypes.c_int, []),
}

# ggml's enum ggml_type is append-only ("always add types at the end"); these
# ids are stable across versions. Only types with a name muser uses are listed.
_KNOWN_TYPES = {
    0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 9: "q8_1",
    10: "q2_K", 11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K", 15: "q8_K", 30: "bf16",
}

GGML_STATUS = {-2: "ALLOC_FAILED", -1: "FAILED", 0: "SUCCESS", 1: "ABORTED"}


# ---------------------------------------------------------------------------
# finding and loading the libraries

def _lib_names(stem: str) -> list[str]:
    if sys.platform == "darwin":
        return [f"lib{stem}.dylib"]
    if sys.platform == "win32":
        return [f"{stem}.dll", f"lib{stem}.dll"]
    return [f"lib{stem}.so"]


def _candidate_dirs() -> list[Path]:
    env = os.environ.get("MUSER_GGML_LIB_DIR")
    if env:
        return [Path(env)]
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return []
    out = []
    for loc in spec.submodule_search_locations:
        out += [Path(loc) / "lib", Path(loc)]
    return out


def _llama_cpp_python_version() -> str | None:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class TypeInfo:
    """One ggml type as the installed library describes it."""

    id: int
    name: str  # ggml's own spelling: "q5_K", "q8_0", "f16", ...
    blck_size: int  # elements per block
    type_size: int  # bytes per block
    is_quantized: bool


class GGML:
    """The loaded ggml libraries: declared functions, type table, version.

    Use :func:`lib` to get the process-wide instance. Attributes named like
    the C functions (``g.ggml_rms_norm``) are the ctypes function objects.
    """

    def __init__(self, lib_dir: Path):
        self.lib_dir = lib_dir
        mode = getattr(os, "RTLD_GLOBAL", 0)
        self._libs: dict[str, ctypes.CDLL] = {}
        for key, stem in (("base", "ggml-base"), ("cpu", "ggml-cpu"), ("ggml", "ggml"), ("metal", "ggml-metal")):
            path = next((lib_dir / n for n in _lib_names(stem) if (lib_dir / n).exists()), None)
            if path is None:
                if key in ("ggml", "metal"):
                    continue  # the umbrella library and ggml-metal are not needed for the CPU graph API
                raise Error(
                    f"ggml library {_lib_names(stem)[0]} not found in {lib_dir} "
                    "(llama-cpp-python installed without its ggml shared libraries?)")
            try:
                self._libs[key] = ctypes.CDLL(str(path), mode=mode)
            except OSError as e:
                raise Error(f"cannot load {path}: {e}") from e
        self.paths = {k: Path(v._name) for k, v in self._libs.items()}
        for name, (where, restype, argtypes) in _SIGNATURES.items():
            fn = self._symbol(where, name)
            if fn is None:
                raise Error(
                    f"the installed ggml ({self.paths[where]}) lacks the symbol {name}; "
                    "muser's pinned route needs it (llama-cpp-python too old or too new?)")
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)
        self._optional: dict[str, Any] = {}
        for name, (where, restype, argtypes) in _OPTIONAL.items():
            fn = self._symbol(where, name)
            if fn is not None:
                fn.restype, fn.argtypes = restype, argtypes
                self._optional[name] = fn
        self._backend_missing: list[str] = []
        for table, required in ((_BACKEND_SIGNATURES, True), (_BACKEND_OPTIONAL, False)):
            for name, (where, restype, argtypes) in table.items():
                fn = self._symbol(where, name)
                if fn is None:
                    if required:
                        self._backend_missing.append(name)
                    continue
                fn.restype, fn.argtypes = restype, argtypes
                setattr(self, name, fn)
        self.ggml_cpu_init()
        self.version = (self.ggml_version() or b"?").decode()
        self.commit = (self.ggml_commit() or b"?").decode()
        self.package_version = _llama_cpp_python_version()
        self._traits_cls = self._verify_layouts()
        self.types = self._type_table()
        self._by_name = {t.name.lower(): t for t in self.types.values()}

    def _symbol(self, where: str, name: str):
        for key in (where, "base", "cpu", "ggml", "metal"):
            lib_ = self._libs.get(key)
            if lib_ is not None:
                try:
                    return getattr(lib_, name)
                except AttributeError:
                    pass
        return None

    # -- layout checks: a wrong mirror would read garbage, so prove each one
    def _verify_layouts(self):
        ctx = self.ggml_init(InitParams(1 << 16, None, False))
        if not ctx:
            raise Error("ggml_init failed for a 64 KiB context")
        try:
            t = self.ggml_new_tensor_2d(ctx, 0, 5, 3)
            self.ggml_set_name(t, b"muser_probe")
            ok = (
                t.contents.ne[0] == 5 and t.contents.ne[1] == 3 and t.contents.ne[2] == 1
                and t.contents.nb[0] == 4 and t.contents.nb[1] == 20
                and t.contents.data == self.ggml_get_data(t)
                and t.contents.name == b"muser_probe"
                and ctypes.string_at(self.ggml_get_name(t)) == b"muser_probe"
            )
            if not ok:
                raise Error(f"struct ggml_tensor layout of ggml {self.version} differs from muser's mirror")
        finally:
            self.ggml_free(ctx)
        q8 = 8  # GGML_TYPE_Q8_0: 32 elements in 34 bytes in every ggml version
        for cls in (TypeTraits, TypeTraitsOld):
            tr = ctypes.cast(self.ggml_get_type_traits(q8), ctypes.POINTER(cls)).contents
            if (tr.blck_size == self.ggml_blck_size(q8) == 32
                    and tr.type_size == self.ggml_type_size(q8) == 34
                    and tr.type_name == self.ggml_type_name(q8) and tr.is_quantized):
                return cls
        raise Error(f"struct ggml_type_traits layout of ggml {self.version} is not one muser knows")

    def _type_table(self) -> dict[int, TypeInfo]:
        # ggml_get_type_traits does not range-check in release builds, so only
        # ids from ggml's append-only enum are looked up, and each is checked
        # against the name ggml gives it
        out = {}
        for i, expect in _KNOWN_TYPES.items():
            tr = ctypes.cast(self.ggml_get_type_traits(i), ctypes.POINTER(self._traits_cls)).contents
            name = (tr.type_name or b"").decode(errors="replace")
            if name.lower() != expect.lower() or tr.blck_size <= 0:
                raise Error(f"ggml {self.version}: type id {i} is {name!r}, expected {expect!r}")
            out[i] = TypeInfo(i, name, int(tr.blck_size), int(tr.type_size), bool(tr.is_quantized))
        return out

    # -- small helpers
    def traits(self, type_: int | str):
        """``ggml_get_type_traits(type)`` as a ctypes struct."""
        t = self.type(type_)
        return ctypes.cast(self.ggml_get_type_traits(t.id), ctypes.POINTER(self._traits_cls)).contents

    def traits_cpu(self, type_: int | str) -> TypeTraitsCpu:
        """``ggml_get_type_traits_cpu(type)``: the CPU backend's from_float/vec_dot."""
        return self.ggml_get_type_traits_cpu(self.type(type_).id).contents

    def type(self, type_: int | str) -> TypeInfo:
        """Look a type up by ggml id or by name (case-insensitive: "Q5_K", "q5_k", "BF16")."""
        if isinstance(type_, (int, np.integer)):
            t = self.types.get(int(type_))
        else:
            t = self._by_name.get(str(type_).lower())
        if t is None:
            raise Error(f"ggml {self.version} has no tensor type {type_!r}")
        return t

    def cpu_features(self) -> dict[str, bool]:
        """The CPU features ggml-cpu was built for and detects (informational)."""
        return {k.removeprefix("ggml_cpu_has_"): bool(f()) for k, f in self._optional.items()}

    def describe(self) -> dict[str, Any]:
        """Version record: ggml version/commit, llama-cpp-python version, library paths."""
        return {
            "ggml_version": self.version,
            "ggml_commit": self.commit,
            "llama_cpp_python": self.package_version,
            "lib_dir": str(self.lib_dir),
            "cpu_features": self.cpu_features(),
        }

    @property
    def version_string(self) -> str:
        """``"ggml <version> (<commit>), llama-cpp-python <version>"``."""
        return f"ggml {self.version} ({self.commit}), llama-cpp-python {self.package_version}"

    # -- the oracles the parity ladder uses
    def to_float(self, raw: np.ndarray, type_: int | str, n: int) -> np.ndarray:
        """ggml's ``to_float`` for ``type_``: decode ``n`` elements from the bytes ``raw``."""
        t = self.type(type_)
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
        if n % t.blck_size or raw.size != n // t.blck_size * t.type_size:
            raise Error(f"{t.name}: {n} elements need {n // t.blck_size * t.type_size} bytes "
                        f"in whole {t.blck_size}-element blocks; got {raw.size} bytes")
        fn_ptr = self.traits(t.id).to_float
        if not fn_ptr:
            raise Error(f"ggml has no to_float for {t.name}")
        out = np.empty(n, dtype=np.float32)
        ToFloat(fn_ptr)(raw.ctypes.data, out.ctypes.data, n)
        return out

    def quantize_chunk(self, x: np.ndarray, type_: int | str) -> np.ndarray:
        """``ggml_quantize_chunk(type, x, ..., imatrix=NULL)`` over the rows of ``x`` [rows, n]."""
        t = self.type(type_)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] % t.blck_size:
            raise Error(f"{t.name}: rows must hold whole {t.blck_size}-element blocks; got shape {x.shape}")
        if self.ggml_quantize_requires_imatrix(t.id):
            raise Error(f"{t.name} needs an importance matrix; the parity ladder does not cover it")
        rows, n = x.shape
        out = np.zeros((rows, n // t.blck_size * t.type_size), dtype=np.uint8)
        written = self.ggml_quantize_chunk(t.id, x.ctypes.data, out.ctypes.data, 0, rows, n, None)
        if written != out.size:
            raise Error(f"ggml_quantize_chunk wrote {written} bytes, expected {out.size}")
        return out

    def cpu_from_float(self, x: np.ndarray, type_: int | str) -> np.ndarray:
        """The CPU backend's ``from_float`` for ``type_`` (the SIMD activation quantizer
        ``mul_mat`` applies to ``src1``), one row at a time; returns bytes [rows, row_bytes]."""
        t = self.type(type_)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim == 1:
            x = x[None, :]
        if x.shape[1] % t.blck_size:
            raise Error(f"{t.name}: rows must hold whole {t.blck_size}-element blocks; got {x.shape}")
        fn_ptr = self.traits_cpu(t.id).from_float
        if not fn_ptr:
            raise Error(f"ggml-cpu has no from_float for {t.name}")
        fn = FromFloat(fn_ptr)
        rb = x.shape[1] // t.blck_size * t.type_size
        out = np.zeros((x.shape[0], rb), dtype=np.uint8)
        for r in range(x.shape[0]):
            fn(x[r].ctypes.data, out[r].ctypes.data, x.shape[1])
        return out

    def vec_dot_type(self, type_: int | str) -> TypeInfo:
        """The type ggml-cpu quantizes activations to before a dot with weights of ``type_``."""
        return self.type(self.traits_cpu(type_).vec_dot_type)

    # -- the ggml-backend API
    def backend_unavailable_reason(self, name: str) -> str | None:
        """Why :class:`Backend` ``(self, name)`` cannot be made, or None when it can."""
        try:
            Backend(self, name).close()
            return None
        except Error as e:
            return str(e)

    # -- graphs
    def compute(self, graph: int, n_threads: int | None = None, use_ref: bool = False) -> None:
        """Plan and run ``graph`` on the CPU backend with a work buffer owned by numpy."""
        n = _threads(n_threads)
        plan = self.ggml_graph_plan(graph, n, None)
        work = np.empty(max(int(plan.work_size), 1), dtype=np.uint8)
        plan.work_data = work.ctypes.data
        plan.use_ref = bool(use_ref)
        status = self.ggml_graph_compute(graph, ctypes.byref(plan))
        if status != 0:
            raise Error(f"ggml_graph_compute failed: {GGML_STATUS.get(status, status)}")


def _threads(n: int | None) -> int:
    if n is None:
        env = os.environ.get("MUSER_THREADS")
        n = int(env) if env else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                  else (os.cpu_count() or 1))
    if int(n) < 1:
        raise Error(f"threads must be >= 1; got {n}")
    return int(n)


_LOCK = threading.Lock()
_LIB: GGML | None = None
_ERR: Error | None = None


def lib() -> GGML:
    """The process-wide :class:`GGML`; raises :class:`muser.Error` saying why it is unavailable."""
    global _LIB, _ERR
    with _LOCK:
        if _LIB is not None:
            return _LIB
        if _ERR is not None:
            raise _ERR
        dirs = _candidate_dirs()
        if not dirs:
            _ERR = Error(
                "llama.cpp's ggml is not available: the llama-cpp-python package is not installed "
                "(pip install 'muser[pinned]' or pip install llama-cpp-python), "
                "and MUSER_GGML_LIB_DIR is not set")
            raise _ERR
        found = next((d for d in dirs if any((d / n).exists() for n in _lib_names("ggml-base"))), None)
        if found is None:
            _ERR = Error(f"no libggml-base found in {', '.join(map(str, dirs))}")
            raise _ERR
        try:
            _LIB = GGML(found)
        except Error as e:
            _ERR = e
            raise
        return _LIB


def available() -> bool:
    """True when :func:`lib` loads."""
    try:
        lib()
        return True
    except Error:
        return False


def unavailable_reason() -> str | None:
    """Why :func:`lib` fails, or None when it loads."""
    try:
        lib()
        return None
    except Error as e:
        return str(e)


def type_id(type_: int | str) -> int:
    """ggml type id for a name or id."""
    return lib().type(type_).id


def type_name(type_: int | str) -> str:
    """ggml's spelling of a type."""
    return lib().type(type_).name


# ---------------------------------------------------------------------------
# a tiny graph builder: tensors whose data live in numpy arrays

class GraphBuilder:
    """Build and run one ggml graph whose tensor data are numpy arrays.

    The context is ``no_alloc``: every leaf and every non-view result gets its
    data pointer set to a numpy buffer this object keeps alive, so weights can
    be used in place (a view of the GGUF mmap) and results land directly in
    arrays Python owns. Inplace ops (``scale(..., inplace=True)``) are views and
    inherit their source's pointer when they are created, so set data before
    building on top of a tensor (the methods here do).

    numpy shape ``[rows, n]`` maps to ggml ``ne = (n, rows)``.
    """

    def __init__(self, g: GGML, max_tensors: int = 64, graph_size: int = 64):
        self.g = g
        size = g.ggml_tensor_overhead() * max_tensors + g.ggml_graph_overhead_custom(graph_size, False) + 4096
        self.ctx = g.ggml_init(InitParams(size, None, True))
        if not self.ctx:
            raise Error("ggml_init failed")
        self._graph_size = graph_size
        self._keep: list[Any] = []
        self._outputs: dict[int, np.ndarray] = {}

    def close(self) -> None:
        """Free the ggml context (the numpy buffers stay valid)."""
        if self.ctx:
            self.g.ggml_free(self.ctx)
            self.ctx = None

    def __enter__(self) -> "GraphBuilder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - GC timing
        try:
            self.close()
        except Exception:
            pass

    def _bind(self, t, arr: np.ndarray, name: str | None):
        if not t:
            raise Error("ggml_new_tensor returned NULL (context too small)")
        t.contents.data = arr.ctypes.data
        self._keep.append(arr)
        if name:
            self.g.ggml_set_name(t, name.encode()[: GGML_MAX_NAME - 1])
        return t

    def leaf_f32(self, arr: np.ndarray, name: str | None = None):
        """An F32 leaf viewing ``arr`` (1-d [n] or 2-d [rows, n], C-contiguous float32)."""
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.ndim == 1:
            t = self.g.ggml_new_tensor_1d(self.ctx, 0, arr.shape[0])
        elif arr.ndim == 2:
            t = self.g.ggml_new_tensor_2d(self.ctx, 0, arr.shape[1], arr.shape[0])
        else:
            raise Error(f"expected a 1-d or 2-d float32 array; got shape {arr.shape}")
        return self._bind(t, arr, name)

    def leaf_quant(self, raw: np.ndarray, type_: int | str, n_cols: int, name: str | None = None):
        """A weight [rows, n_cols] of ggml type ``type_`` whose bytes are ``raw`` [rows, row_bytes] (zero copy)."""
        t = self.g.type(type_)
        if raw.dtype != np.uint8 or raw.ndim != 2 or not raw.flags.c_contiguous:
            raise Error(f"weight bytes must be a C-contiguous uint8 [rows, row_bytes] array; "
                        f"got {raw.dtype} {raw.shape}")
        if n_cols % t.blck_size or raw.shape[1] != n_cols // t.blck_size * t.type_size:
            raise Error(f"{t.name} row of {n_cols} elements is {n_cols // t.blck_size * t.type_size} "
                        f"bytes in whole {t.blck_size}-blocks; the weight has {raw.shape[1]} bytes per row")
        tt = self.g.ggml_new_tensor_2d(self.ctx, t.id, n_cols, raw.shape[0])
        return self._bind(tt, raw, name)

    def _result(self, t, name: str | None, shape: Sequence[int]):
        """Give a fresh (non-view) op result its own float32 numpy buffer."""
        if not t:
            raise Error("ggml op returned NULL")
        if t.contents.view_src:
            # inplace op: data inherited from the source at creation
            if name:
                self.g.ggml_set_name(t, name.encode())
            return t
        out = np.empty(tuple(shape), dtype=np.float32)
        self._outputs[ctypes.addressof(t.contents)] = out
        return self._bind(t, out, name)

    @staticmethod
    def _shape(t) -> tuple[int, int]:
        c = t.contents
        return (int(c.ne[1]), int(c.ne[0]))

    def array(self, t) -> np.ndarray:
        """The numpy array holding tensor ``t``'s data (for a view: its base's array)."""
        c = t.contents
        while c.view_src:
            c = c.view_src.contents
        return self._outputs[ctypes.addressof(c)]

    # ops, each the ggml function of the same name
    def rms_norm(self, x, eps: float, name: str | None = None):
        return self._result(self.g.ggml_rms_norm(self.ctx, x, eps), name, self._shape(x))

    def norm(self, x, eps: float, name: str | None = None):
        return self._result(self.g.ggml_norm(self.ctx, x, eps), name, self._shape(x))

    def mul(self, a, b, name: str | None = None):
        self._check_broadcast(a, b, "mul")
        return self._result(self.g.ggml_mul(self.ctx, a, b), name, self._shape(a))

    def add(self, a, b, name: str | None = None):
        self._check_broadcast(a, b, "add")
        return self._result(self.g.ggml_add(self.ctx, a, b), name, self._shape(a))

    def mul_mat(self, w, x, name: str | None = None):
        wc, xc = w.contents, x.contents
        if wc.ne[0] != xc.ne[0] or xc.type != 0:
            raise Error(f"mul_mat: weight rows have {wc.ne[0]} elements, activations {xc.ne[0]} "
                        f"(type {xc.type}); need equal lengths and f32 activations")
        return self._result(self.g.ggml_mul_mat(self.ctx, w, x), name, (int(xc.ne[1]), int(wc.ne[1])))

    def scale(self, x, s: float, inplace: bool = False, name: str | None = None):
        fn = self.g.ggml_scale_inplace if inplace else self.g.ggml_scale
        return self._result(fn(self.ctx, x, s), name, self._shape(x))

    def tanh(self, x, inplace: bool = False, name: str | None = None):
        fn = self.g.ggml_tanh_inplace if inplace else self.g.ggml_tanh
        return self._result(fn(self.ctx, x), name, self._shape(x))

    def _check_broadcast(self, a, b, op: str) -> None:
        ac, bc = a.contents, b.contents
        if any(ac.ne[i] % bc.ne[i] for i in range(GGML_MAX_DIMS)):
            raise Error(f"{op}: cannot broadcast ggml shape {tuple(bc.ne)} over {tuple(ac.ne)}")

    def compute(self, out, n_threads: int | None = None, use_ref: bool = False) -> np.ndarray:
        """Build the forward graph ending at ``out``, run it, return ``out``'s array."""
        graph = self.g.ggml_new_graph_custom(self.ctx, self._graph_size, False)
        if not graph:
            raise Error("ggml_new_graph_custom failed (context too small)")
        self.g.ggml_build_forward_expand(graph, out)
        for i in range(self.g.ggml_graph_n_nodes(graph)):
            node = self.g.ggml_graph_node(graph, i).contents
            if not node.data:
                raise Error(f"ggml node {node.name.decode()!r} has no data buffer (muser bug)")
        self.g.compute(graph, n_threads, use_ref)
        return self.array(out)

    def node_ops(self, out) -> list[str]:
        """The op names of the graph ending at ``out``, in execution order (for tests/docs)."""
        graph = self.g.ggml_new_graph_custom(self.ctx, self._graph_size, False)
        self.g.ggml_build_forward_expand(graph, out)
        return [self.g.ggml_op_name(self.g.ggml_graph_node(graph, i).contents.op).decode()
                for i in range(self.g.ggml_graph_n_nodes(graph))]


# ---------------------------------------------------------------------------
# ggml-backend: the same graphs computed by a registered backend (Metal, CPU)

class Backend:
    """One ggml backend (``ggml_backend_t``) of the registry entry ``name``
    (``"Metal"``, ``"CPU"``): ``ggml_backend_metal_init()`` where libggml-metal
    exports it, else the registry's first device of that name
    (``ggml_backend_reg_by_name`` -> ``ggml_backend_reg_dev_get(reg, 0)`` ->
    ``ggml_backend_dev_init``). Raises :class:`muser.Error` saying what the
    installed ggml lacks. One compute at a time (``lock``)."""

    def __init__(self, g: GGML, name: str, threads: int | None = None):
        self.g = g
        self.handle: int | None = None
        if g._backend_missing:
            raise Error(f"the installed ggml ({g.lib_dir}) lacks the ggml-backend API "
                        f"({', '.join(g._backend_missing)}); the pinned route needs it for the {name} backend")
        handle = None
        if name == "Metal" and hasattr(g, "ggml_backend_metal_init"):
            handle = g.ggml_backend_metal_init()
        if not handle:
            reg = g.ggml_backend_reg_by_name(name.encode())
            if not reg and hasattr(g, "ggml_backend_load_all"):
                g.ggml_backend_load_all()
                reg = g.ggml_backend_reg_by_name(name.encode())
            if not reg:
                raise Error(f"the installed ggml ({g.lib_dir}) has no {name} backend "
                            f"(llama-cpp-python {g.package_version} was built without it)")
            if g.ggml_backend_reg_dev_count(reg) < 1:
                raise Error(f"ggml's {name} backend has no device on this machine")
            handle = g.ggml_backend_dev_init(g.ggml_backend_reg_dev_get(reg, 0), None)
        if not handle:
            raise Error(f"ggml's {name} backend failed to initialize")
        self.handle = handle
        self.name = (g.ggml_backend_name(handle) or name.encode()).decode()
        if threads and hasattr(g, "ggml_backend_cpu_set_n_threads") and name == "CPU":
            g.ggml_backend_cpu_set_n_threads(handle, int(threads))
        self.lock = threading.Lock()

    def close(self) -> None:
        if self.handle:
            self.g.ggml_backend_free(self.handle)
            self.handle = None

    def __del__(self) -> None:  # pragma: no cover - GC timing
        try:
            self.close()
        except Exception:
            pass


class BackendTensors:
    """Tensors that live in one buffer of ``backend`` for its life (a head's
    weights): declare with :meth:`add`, then :meth:`upload` allocates the
    buffer and copies every array in (``ggml_backend_tensor_set``)."""

    def __init__(self, backend: Backend, max_tensors: int = 16):
        self.backend, self.g = backend, backend.g
        self.ctx = self.g.ggml_init(InitParams(self.g.ggml_tensor_overhead() * max_tensors + 1024, None, True))
        if not self.ctx:
            raise Error("ggml_init failed")
        self.buffer: int | None = None
        self.tensors: dict[str, Any] = {}
        self._pending: list[tuple[Any, np.ndarray]] = []

    def add(self, name: str, arr: np.ndarray, type_: int = 0, n_cols: int | None = None):
        """An F32 tensor of ``arr`` [n] / [rows, n], or (``type_``, ``n_cols``) a
        quantized weight whose bytes are ``arr`` uint8 [rows, row_bytes]."""
        if type_ == 0:
            arr = np.ascontiguousarray(arr, dtype=np.float32)
            t = (self.g.ggml_new_tensor_1d(self.ctx, 0, arr.shape[0]) if arr.ndim == 1
                 else self.g.ggml_new_tensor_2d(self.ctx, 0, arr.shape[1], arr.shape[0]))
        else:
            t = self.g.ggml_new_tensor_2d(self.ctx, int(type_), int(n_cols), arr.shape[0])
        if not t:
            raise Error("ggml_new_tensor returned NULL (context too small)")
        if self.g.ggml_nbytes(t) != arr.nbytes:
            raise Error(f"{name}: ggml tensor is {self.g.ggml_nbytes(t)} bytes, the array {arr.nbytes}")
        self.g.ggml_set_name(t, name.encode()[: GGML_MAX_NAME - 1])
        self.tensors[name] = t
        self._pending.append((t, arr))
        return t

    def upload(self) -> None:
        self.buffer = self.g.ggml_backend_alloc_ctx_tensors(self.ctx, self.backend.handle)
        if not self.buffer:
            raise Error(f"ggml's {self.backend.name} backend could not allocate the head's weights")
        for t, arr in self._pending:
            self.g.ggml_backend_tensor_set(t, arr.ctypes.data, 0, arr.nbytes)
        self._pending.clear()

    def close(self) -> None:
        if self.buffer:
            self.g.ggml_backend_buffer_free(self.buffer)
            self.buffer = None
        if self.ctx:
            self.g.ggml_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:  # pragma: no cover - GC timing
        try:
            self.close()
        except Exception:
            pass


class BackendGraphBuilder(GraphBuilder):
    """:class:`GraphBuilder`'s graph computed on a ggml backend: a leaf whose
    name is in ``params`` is that resident tensor (:class:`BackendTensors`);
    any other leaf is an input copied in at :meth:`compute`; op results get no
    numpy buffer: ``ggml_backend_alloc_ctx_tensors`` places them (and the
    inplace views) in one buffer of the backend, freed with the builder."""

    def __init__(self, backend: Backend, params: dict[str, Any], max_tensors: int = 64, graph_size: int = 64):
        super().__init__(backend.g, max_tensors, graph_size)
        self.backend = backend
        self._params = params
        self._inputs: list[tuple[Any, np.ndarray]] = []
        self._buffer: int | None = None

    def close(self) -> None:
        if self._buffer:
            self.g.ggml_backend_buffer_free(self._buffer)
            self._buffer = None
        super().close()

    def leaf_f32(self, arr: np.ndarray, name: str | None = None):
        if name in self._params:
            return self._params[name]
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        t = (self.g.ggml_new_tensor_1d(self.ctx, 0, arr.shape[0]) if arr.ndim == 1
             else self.g.ggml_new_tensor_2d(self.ctx, 0, arr.shape[1], arr.shape[0]))
        if not t:
            raise Error("ggml_new_tensor returned NULL (context too small)")
        if name:
            self.g.ggml_set_name(t, name.encode()[: GGML_MAX_NAME - 1])
        self._inputs.append((t, arr))
        return t

    def leaf_quant(self, raw: np.ndarray, type_: int | str, n_cols: int, name: str | None = None):
        if name not in self._params:
            raise Error(f"weight {name!r} is not resident on ggml's {self.backend.name} backend (muser bug)")
        return self._params[name]

    def _result(self, t, name: str | None, shape: Sequence[int]):
        if not t:
            raise Error("ggml op returned NULL")
        if name:
            self.g.ggml_set_name(t, name.encode())
        return t

    def compute(self, out, n_threads: int | None = None, use_ref: bool = False) -> np.ndarray:
        """Run the graph ending at ``out`` on the backend; return ``out`` copied to a new array."""
        g, b = self.g, self.backend
        graph = g.ggml_new_graph_custom(self.ctx, self._graph_size, False)
        if not graph:
            raise Error("ggml_new_graph_custom failed (context too small)")
        g.ggml_build_forward_expand(graph, out)
        for i in range(g.ggml_graph_n_nodes(graph)):
            node = g.ggml_graph_node(graph, i)
            if not g.ggml_backend_supports_op(b.handle, node):
                c = node.contents
                raise Error(f"ggml's {b.name} backend does not support {g.ggml_op_name(c.op).decode()} "
                            f"on {g.ggml_type_name(c.src[0].contents.type).decode() if c.src[0] else '-'}")
        self._buffer = g.ggml_backend_alloc_ctx_tensors(self.ctx, b.handle)
        if not self._buffer:
            raise Error(f"ggml's {b.name} backend could not allocate the graph")
        for t, arr in self._inputs:
            g.ggml_backend_tensor_set(t, arr.ctypes.data, 0, arr.nbytes)
        with b.lock:
            status = g.ggml_backend_graph_compute(b.handle, graph)
        if status != 0:
            raise Error(f"ggml_backend_graph_compute on {b.name} failed: {GGML_STATUS.get(status, status)}")
        res = np.empty(self._shape(out), dtype=np.float32)
        if g.ggml_nbytes(out) != res.nbytes:
            raise Error(f"result is {g.ggml_nbytes(out)} bytes, expected {res.nbytes} (muser bug)")
        g.ggml_backend_tensor_get(ctypes.cast(out, ctypes.c_void_p), res.ctypes.data, 0, res.nbytes)
        return res


def iter_chunks(n: int, chunk: int | None) -> Iterable[tuple[int, int]]:
    """``(start, stop)`` pairs covering ``range(n)`` in ``chunk``-sized steps (one step when None)."""
    step = n if not chunk else int(chunk)
    for s in range(0, n, max(step, 1)):
        yield s, min(n, s + step)
