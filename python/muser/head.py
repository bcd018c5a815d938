"""The Head: one model head (final norm, LM head, logit scale, soft cap) loaded
from a GGUF file onto one device, computing logits through one route."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Optional, Union

import numpy as np

from . import _core, _cuda

ROUTES = ("reference", "fused", "graph", "canonical", "pinned")
PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class HeadSpec:
    """What the head computes, read from GGUF metadata (see docs/architectures.md).

    ``logit_scale`` is the stored value; ``applied_scale`` the factor every logit
    is multiplied by (its f32 reciprocal for granite, 1.0 when there is none).
    ``softcap`` is None when the architecture has no final soft cap.
    """

    arch: str
    hidden_size: int
    vocab_size: int
    norm: str
    eps: float
    eps_source: str
    norm_weight: str
    norm_bias: Optional[str]
    output_weight: str
    output_type: str
    tied: bool
    output_bias: Optional[str]
    logit_scale_mode: str
    logit_scale: Optional[float]
    logit_scale_source: str
    applied_scale: float
    softcap: Optional[float]
    softcap_source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        scale = "none" if self.logit_scale is None else f"{self.logit_scale_mode} by {self.logit_scale:g}"
        cap = "none" if self.softcap is None else f"{self.softcap:g} * tanh(x / {self.softcap:g})"
        lines = [
            f"arch           {self.arch}",
            f"hidden x vocab {self.hidden_size} x {self.vocab_size}",
            f"final norm     {self.norm} (eps {self.eps:g} from {self.eps_source}), weight {self.norm_weight}"
            + (f", bias {self.norm_bias}" if self.norm_bias else ""),
            f"lm head        {self.output_weight} [{self.output_type}]" + (" (tied)" if self.tied else ""),
            f"logit scale    {scale} ({self.logit_scale_source})",
            f"soft cap       {cap} ({self.softcap_source})",
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class NodeProfile:
    """Time and traffic of one node of a route, under that node's own label."""

    label: str
    kind: str
    seconds: float
    bytes: float

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


class Head:
    """A model head loaded from a GGUF file.

    Create with :meth:`Head.load`. Calling the head on a float32 hidden state of
    shape ``[H]`` or ``[t, H]`` returns logits ``[V]`` or ``[t, V]``.

    **Zero copy.** Without ``out=``, the returned logits are a numpy *view* of a
    buffer the head owns: no copy is made, and the view stays valid (it keeps the
    buffer and the head alive) after ``del head``. The *next* call overwrites that
    buffer when it fits, so copy a result you want to keep, or pass ``out=`` to
    write into your own array instead.

    **Threads.** A Head may be shared between Python threads; calls are serialized
    by a lock, and the GIL is released while the head computes.

    **Non-finite input.** A hidden state holding NaN or ±inf raises
    :class:`muser.NonFiniteError` naming the row and column, before anything is
    computed. ``check_finite=False`` skips the check (NaN then propagates).
    """

    def __init__(self, core: Any, pinned: Any = None, *, path: str, route: str):
        self._core = core
        self._pinned = pinned
        self._path = path
        self._route = route
        self._spec = HeadSpec(**core.spec)

    @classmethod
    def load(
        cls,
        path: PathLike,
        device: str = "cpu",
        route: str = "graph",
        *,
        acts: str = "f32",
        threads: Optional[int] = None,
        **overrides: Any,
    ) -> "Head":
        """Load the head of the GGUF model at ``path``.

        Args:
            path: a GGUF v2/v3 file. It is memory-mapped; the CPU reads weights in place.
            device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"metal"``.
            route: ``"graph"`` (ggml's four soft-cap nodes), ``"fused"`` (one soft-cap
                kernel), ``"canonical"`` (bit-identical on every backend and batch size),
                ``"reference"`` (the scalar oracle) or ``"pinned"`` (llama.cpp's own
                kernels; needs ``llama-cpp-python``).
            acts: ``"f32"`` activations, or ``"q8"`` (int8 blocks as ggml's CPU quantizes them).
            threads: CPU threads, 1 to 256 (``build_info()["max_threads"]``; else ValueError); None: all usable CPUs.
            **overrides: switch a step: ``softcap=None`` or ``softcap=20.0``,
                ``logit_scale=None`` or a value, ``eps=1e-6``,
                ``output_weight="token_embd.weight"``, ``arch="gemma2"``.

        Raises:
            muser.GGUFError: the file is malformed.
            muser.SpecError: the file lacks what the head needs (the message names the key or tensor).
            muser.DeviceError: the device is absent or was not built.
            ValueError / TypeError: a bad argument.
        """
        if route not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}; got {route!r}")
        path = os.fspath(path)
        core_route = "graph" if route == "pinned" else route
        core = _core.Head.load(path, device, core_route, acts, int(threads or 0), dict(overrides))
        pinned = None
        if route == "pinned":
            if device != "cpu":
                raise ValueError("route='pinned' runs llama.cpp's ggml CPU backend; use device='cpu'")
            from . import pinned as _pinned  # optional dependency: llama-cpp-python
            from ._core import GGUFFile

            pinned = _pinned.PinnedHead(GGUFFile(path), core.spec, threads)
        return cls(core, pinned, path=path, route=route)

    # ---- what was loaded ----
    @property
    def spec(self) -> HeadSpec:
        """The head's conventions as read from metadata (and overrides)."""
        return self._spec

    @property
    def route(self) -> str:
        return self._route

    @property
    def device(self) -> str:
        return self._core.device

    @property
    def acts(self) -> str:
        return self._core.acts

    @property
    def path(self) -> str:
        return self._path

    @property
    def nodes(self) -> list[tuple[str, str]]:
        """The route's nodes in order, as ``(label, kind)`` pairs."""
        return list(self._core.nodes)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the LM-head weight: what one step must read."""
        return int(self._core.weight_bytes)

    @property
    def buffer(self) -> Optional[np.ndarray]:
        """The head's logits buffer (flat view), or None before the first call."""
        return self._core.buffer if self._pinned is None else None

    def __repr__(self) -> str:
        s = self._spec
        return (f"muser.Head({os.path.basename(self._path)!r}, arch={s.arch!r}, {s.hidden_size}x{s.vocab_size} "
                f"{s.output_type}, device={self.device!r}, route={self._route!r}, acts={self.acts!r})")

    # ---- compute ----
    def _rows(self, hidden: Any) -> tuple[np.ndarray, bool]:
        arr = hidden if isinstance(hidden, np.ndarray) else np.asarray(hidden)
        if arr.dtype != np.float32:
            raise TypeError(f"hidden must be float32, got {arr.dtype}")
        if arr.ndim == 1:
            arr, single = arr[None, :], True
        elif arr.ndim == 2:
            single = False
        else:
            raise ValueError(f"hidden must have shape [H] or [t, H] with H={self._spec.hidden_size}, got {arr.shape}")
        if arr.shape[-1] != self._spec.hidden_size:
            raise ValueError(f"hidden must have {self._spec.hidden_size} columns (H), got shape {hidden.shape}")
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        return arr, single

    def __call__(self, hidden: Any, *, out: Optional[np.ndarray] = None, check_finite: bool = True,
                 on_device: bool = False) -> Any:
        """Logits for one hidden state ``[H]`` (→ ``[V]``) or a batch ``[t, H]`` (→ ``[t, V]``).

        Returns a zero-copy view of the head's buffer (overwritten by the next call),
        or ``out`` (shape ``[V]`` or ``[t, V]``, float32, C-contiguous) when given.
        Row r of a t-token call equals the single-token call on row r, bit for bit.

        CUDA heads also take ``hidden`` in GPU memory (CuPy, PyTorch: anything with
        ``__cuda_array_interface__`` or CUDA ``__dlpack__``), and ``on_device=True``
        returns the logits as a :class:`muser._cuda.DeviceArray` -- the head's device
        buffer without a copy, for ``torch.from_dlpack`` / ``cupy.asarray``. A device
        hidden state with ``on_device=False`` gives a new host array.
        """
        if on_device or _cuda.is_device_array(hidden):
            return _cuda.call(self, hidden, on_device=on_device, out=out, check_finite=check_finite)
        rows, single = self._rows(hidden)
        if self._pinned is not None:
            if check_finite and not np.isfinite(rows).all():
                r, c = map(int, np.argwhere(~np.isfinite(rows))[0])
                from .errors import NonFiniteError

                raise NonFiniteError(f"hidden state row {r}, column {c} is {rows[r, c]}")
            result = self._pinned(rows)
            if out is not None:
                out.reshape(result.shape)[...] = result
                return out
            return result[0] if single else result
        out2 = None
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
            expect = (self._spec.vocab_size,) if single else (rows.shape[0], self._spec.vocab_size)
            if out.shape != expect:
                raise ValueError(f"out must have shape {expect}, got {out.shape}")
            if not out.flags.c_contiguous:
                raise ValueError("out must be C-contiguous")
            out2 = out.reshape(rows.shape[0], self._spec.vocab_size)
        view, _ = self._core.run(rows, out2, False, check_finite)
        if out is not None:
            return out
        return view[0] if single else view

    def argmax(self, hidden: Any) -> Union[int, np.ndarray]:
        """Index of the largest logit (an int for ``[H]``, int64 ``[t]`` for ``[t, H]``).

        Ties go to the lowest token id; NaN never wins. The soft cap is strictly
        increasing, so this is also the argmax of the uncapped scores.
        """
        if self.device.startswith("cuda"):
            return _cuda.argmax(self, hidden)  # ranked on the GPU: only the ids come back
        rows, single = self._rows(hidden)
        ids = np.asarray(_core.argmax_rows(self(rows)), dtype=np.int64)
        return int(ids[0]) if single else ids

    def topk(self, hidden: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best tokens: ``(ids, values)``, each ``[k]`` or ``[t, k]``, best first.

        Ties go to the lowest token id.
        """
        if self.device.startswith("cuda"):
            return _cuda.topk(self, hidden, k)  # ranked on the GPU: only the winners come back
        rows, single = self._rows(hidden)
        ids, vals = _core.topk_rows(self(rows), int(k))
        ids = np.asarray(ids, dtype=np.int64).reshape(rows.shape[0], k)
        vals = np.asarray(vals, dtype=np.float32).reshape(rows.shape[0], k)
        return (ids[0], vals[0]) if single else (ids, vals)

    def profile(self, hidden: Any) -> list[NodeProfile]:
        """Run once and report each node's time and bytes under its own label.

        The LM-head matvec is booked under ``"lm_head"``, never under a soft-cap
        label (each node is timed from its own start to its own end).
        """
        if self._pinned is not None:
            raise ValueError("profile() is not available for route='pinned'")
        rows, _ = self._rows(hidden)
        _, prof = self._core.run(rows, None, True, True)
        return [NodeProfile(p["label"], p["kind"], p["seconds"], p["bytes"]) for p in prof]
