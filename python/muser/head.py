"""The Head: one model head (final norm, LM head, logit scale, soft cap) loaded
from a GGUF file onto one device, computing logits through one route."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union, overload

import numpy as np

from . import _core, _device, _sampling
from . import shard as _shard
from ._args import int64_ids, int_arg, threads_arg
from ._sampling import Sample
from .errors import DeviceError

if TYPE_CHECKING:  # the shapes the overloads tell apart (numpy >= 2 types an array's shape)
    from typing import Literal

    from numpy.typing import NDArray

    from ._device import DeviceArray

    Row = np.ndarray[tuple[int], np.dtype[Any]]  # one hidden state [H]
    Batch = np.ndarray[tuple[int, int], np.dtype[Any]]  # a batch [t, H]
    Logits = np.ndarray[tuple[int], np.dtype[np.float32]]  # [V]
    BatchLogits = np.ndarray[tuple[int, int], np.dtype[np.float32]]  # [t, V]

ROUTES = ("reference", "fused", "graph", "canonical", "pinned")
PathLike = Union[str, "os.PathLike[str]"]


def _host_f32(hidden: Any) -> np.ndarray:
    """A host hidden state as float32: float32 as it is; float16 and bfloat16 (what
    torch engines hold; numpy's ml_dtypes or anything speaking DLPack on the CPU)
    widened exactly -- every half and bfloat16 value is a float32 value."""
    if isinstance(hidden, np.ndarray):
        arr = hidden
    else:
        try:
            arr = np.asarray(hidden)
        except (TypeError, RuntimeError, BufferError):  # e.g. a torch bfloat16 tensor: numpy has no bfloat16
            if not hasattr(hidden, "__dlpack__"):
                raise TypeError(f"hidden must be an array of float32, float16 or bfloat16, "
                                f"got {type(hidden).__name__}") from None
            wide = np.asarray(_core.widen_to_f32(hidden))
            return wide[0] if len(getattr(hidden, "shape", (0, 0))) == 1 else wide
    if arr.dtype == np.float32:
        return arr
    if arr.dtype == np.float16:
        return arr.astype(np.float32)
    if arr.dtype.name == "bfloat16" and arr.dtype.itemsize == 2:
        return (np.ascontiguousarray(arr).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    raise TypeError(f"hidden must be float32 (or float16/bfloat16, widened exactly), got {arr.dtype}")


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
    output_weight: str
    output_type: str
    tied: bool
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
            f"final norm     {self.norm} (eps {self.eps:g} from {self.eps_source}), weight {self.norm_weight}",
            f"lm head        {self.output_weight} [{self.output_type}]" + (" (tied)" if self.tied else ""),
            f"logit scale    {scale} ({self.logit_scale_source})",
            f"soft cap       {cap} ({self.softcap_source})",
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class NodeProfile:
    """Time and traffic of one kernel of a route: one node, under its own label, or
    the nodes a device fused into one kernel, each named (``label`` joins them by
    ``+``, as ``"lm_head+softcap"``; ``nodes`` lists them)."""

    label: str
    kind: str
    seconds: float
    bytes: float

    @property
    def nodes(self) -> tuple[str, ...]:
        """The labels of the nodes this kernel computed."""
        return tuple(self.label.split("+"))

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


class Scores(NamedTuple):
    """What :meth:`Head.score` returns for chosen tokens: each field takes the
    shape of ``token_ids`` (``logsumexp``: one per row, a float for one row)."""

    logprobs: Any   # float32: logit - logsumexp (the capped logits' log-softmax)
    logits: Any     # float32: the capped logit
    ranks: Any      # int64, 1-based: ties to the lower id, NaN behind every number
    logsumexp: Any  # float32 per row


class TopK(NamedTuple):
    """What :meth:`Head.topk` returns, in torch's order: ``[k]`` or ``[t, k]`` each, best first."""

    values: "NDArray[np.float32]"              # the capped logits
    indices: "NDArray[np.int64]"               # token ids (ties: the lower id first)
    logprobs: "Optional[NDArray[np.float32]]"  # log-probabilities of the same tokens, or None unless asked


class Head:
    """A model head loaded from a GGUF file.

    Create with :meth:`Head.load`. Calling the head on a float32 hidden state of
    shape ``[H]`` or ``[t, H]`` returns logits ``[V]`` or ``[t, V]``.

    **Zero copy.** Without ``out=``, the returned logits are a numpy *view* of a
    buffer the head owns: no copy is made, and the view stays valid (it keeps the
    buffer and the head alive) after ``del head``. A buffer is written again only
    once every view of it is gone: a result is never overwritten by a later call.
    The head pools a few buffers (``Head.POOL_SIZE``), so a loop that drops each
    result before the next call reuses memory instead of allocating; each result
    you keep holds its own ``[t, V]`` floats. Pass ``out=`` to write into your own
    (writable) array instead.

    **Threads.** A Head may be shared between any number of Python threads: calls
    are serialized by a lock, the GIL is released while the head computes, and
    each call's logits, ``argmax`` and ``topk`` are that call's own.

    **The file.** The GGUF file is memory-mapped and read in place on the CPU. Before
    each call the head checks that the file is still the one it loaded (size, mtime,
    ctime, inode of the mapped file) and raises :class:`muser.GGUFError` if it changed:
    truncated, rewritten, or replaced by rename -- load it again. A file truncated
    *during* a step cannot be caught and ends the process (SIGBUS); with
    ``Head.load(..., mmap=False)`` the head reads the file into private memory at
    load and nothing done to the file afterwards reaches it. (CUDA heads copy the
    weights to the GPU at load and need no check.)

    **Non-finite input.** A hidden state holding NaN or ±inf raises
    :class:`muser.NonFiniteError` naming the row and column, before anything is
    computed. ``check_finite=False`` skips the check (NaN then propagates).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("make a Head with muser.Head.load(path, ...)")

    @classmethod
    def _from_core(cls, core: Any, pinned: Any, path: str, route: str) -> "Head":
        self = cls.__new__(cls)
        self._core = core
        self._pinned = pinned
        self._path = path
        self._route = route
        self._spec = HeadSpec(**core.spec)
        self._caps = dict(core.caps)  # fixed for the head's life; read on every device call
        self._ranks_on_device = bool(self._caps["ranks_on_device"]) and pinned is None
        self._threads = 0  # the reductions' CPU threads: the default
        start, stop = (int(v) for v in core.shard_rows)
        self._local_vocab = stop - start  # the columns of this head's logits (V unless sharded)
        self._shard: Optional[tuple[int, int]] = None
        self._layout: Optional[_shard.Layout] = None
        self._collective: Optional[_shard.Collective] = None
        return self

    @classmethod
    def load(
        cls,
        path: PathLike,
        device: str = "cpu",
        route: str = "graph",
        *,
        acts: str = "f32",
        threads: Optional[int] = None,
        mmap: bool = True,
        fuse: bool = True,
        shard: Optional[tuple[int, int]] = None,
        group: Any = None,
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
            mmap: map the file and read the weights in place (default), or ``False`` to
                read the whole file into private memory at load: nothing done to the file
                afterwards can reach the head.
            fuse: run the adjacent nodes the route allows to fuse (the norm with γ; on
                ``fused``/``canonical`` the epilogue with the matvec) as one kernel where
                the device has one -- the same bytes either way; ``False`` runs and
                profiles every node on its own (``Head.steps`` lists the kernels).
            shard: ``(rank, world)``: load only the LM-head rows ``[rank*V//world, (rank+1)*V//world)``
                (``shard_rows``); calls return those logits, and the reductions (argmax, topk,
                logsumexp, log_softmax, score, sample) return the unsharded head's results, bit
                for bit, by exchanging small summaries with the other shards (muser.shard;
                docs/numerics.md, "Sharded heads"). None: the whole vocabulary.
            group: the shards' collective: a :class:`muser.shard.LocalGroup` (shards in one
                process), a torch.distributed process group (gloo for CPU heads, NCCL for CUDA
                heads), or None (torch.distributed's default group when it is initialized).
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
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        for name, flag in (("mmap", mmap), ("fuse", fuse)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        for name, text in (("device", device), ("acts", acts)):
            if not isinstance(text, str):
                raise TypeError(f"{name} must be a str, got {type(text).__name__}")
        pinned_backend = None  # ggml-cpu's graph compute
        if route == "pinned":  # decided by what the device is (its caps), refused before any upload
            caps = _core.device_caps(device)
            if caps["compute_device"] == 8:  # kDLMetal: ggml's own Metal backend (ggml-metal)
                pinned_backend = "Metal"
            elif caps["resident_logits"]:
                raise ValueError("route='pinned' runs llama.cpp's ggml CPU or Metal backend; "
                                 "use device='cpu' (or 'metal' on a Mac)")
        rank, world = _check_shard(shard)
        if shard is not None and route == "pinned":
            raise ValueError("route='pinned' runs llama.cpp's whole head; it cannot be sharded (shard=None)")
        core_route = "graph" if route == "pinned" else route
        core = _core.Head.load(path, device, core_route, acts, threads_arg(threads), mmap, fuse, dict(overrides),
                               rank, world)
        pinned = None
        if route == "pinned":
            from . import pinned as _pinned  # optional dependency: llama-cpp-python
            from ._core import GGUFFile

            pinned = _pinned.PinnedHead(GGUFFile(path), core.spec, threads, backend=pinned_backend)
        head = cls._from_core(core, pinned, path, route)
        if shard is not None:
            head._shard = (rank, world)
            head._layout = _shard.make_layout(head._spec.vocab_size, rank, world)
            head._collective = _shard.collective_for(group, rank, world, head.device)
        elif group is not None:
            raise ValueError("group= is the shards' collective; pass shard=(rank, world) with it")
        return head

    # ---- what was loaded ----
    @property
    def spec(self) -> HeadSpec:
        """The head's conventions as read from metadata (and overrides)."""
        return self._spec

    @property
    def route(self) -> str:
        return self._route

    @property
    def shard(self) -> Optional[tuple[int, int]]:
        """``(rank, world)`` of a sharded head, or None."""
        return self._shard

    @property
    def shard_rows(self) -> tuple[int, int]:
        """``(start, stop)``: the LM-head rows (token ids) this head computes; ``(0, V)`` unsharded."""
        start, stop = self._core.shard_rows
        return int(start), int(stop)

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
    def steps(self) -> list[tuple[str, ...]]:
        """The kernels the device runs, in order: each the labels of the nodes it contains
        (one, or several the device fuses)."""
        return [tuple(s) for s in self._core.steps]

    @property
    def caps(self) -> dict[str, Any]:
        """What the head's device can do: ``resident_logits`` (``on_device=True``),
        ``ranks_on_device`` (argmax/top-k where the logits are), ``max_topk``,
        ``dlpack_device`` (where its logits live), ``compute_device`` (the DLPack type of
        what runs its kernels: 8 on Metal, whose logits are host memory), ``ordinal``."""
        return dict(self._core.caps)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the LM-head weight: what one step must read."""
        return int(self._core.weight_bytes)

    POOL_SIZE: int = int(_core.Head.POOL_SIZE)

    @property
    def buffer(self) -> Optional[np.ndarray]:
        """The buffer the latest call without ``out=`` wrote, as a flat float32 view
        (its first ``t * V`` floats are that call's logits), or None before the first
        call. Holding this view keeps the buffer from being reused."""
        if self._pinned is not None:
            return None
        buf = self._core.buffer
        return None if buf is None else buf.reshape(-1)

    def __repr__(self) -> str:
        s = self._spec
        return (f"muser.Head({os.path.basename(self._path)!r}, arch={s.arch!r}, {s.hidden_size}x{s.vocab_size} "
                f"{s.output_type}, device={self.device!r}, route={self._route!r}, acts={self.acts!r})")

    # ---- compute ----
    def _rows(self, hidden: Any) -> tuple[np.ndarray, bool]:
        arr = _host_f32(hidden)
        if arr.ndim == 1:
            arr, single = arr[None, :], True
        elif arr.ndim == 2:
            single = False
        else:
            raise ValueError(f"hidden must have shape [H] or [t, H] with H={self._spec.hidden_size}, got {arr.shape}")
        if arr.shape[-1] != self._spec.hidden_size:
            raise ValueError(f"hidden must have {self._spec.hidden_size} columns (H), got shape {arr.shape}")
        if not (arr.flags.c_contiguous and arr.flags.aligned):
            arr = np.array(arr, order="C")  # a fresh array: contiguous and aligned
        return arr, single

    @overload
    def __call__(self, hidden: Row, *, out: Optional[np.ndarray] = ..., check_finite: bool = ...,
                 on_device: Literal[False] = ..., stream: None = ...) -> Logits: ...
    @overload
    def __call__(self, hidden: Batch, *, out: Optional[np.ndarray] = ..., check_finite: bool = ...,
                 on_device: Literal[False] = ..., stream: None = ...) -> BatchLogits: ...
    @overload
    def __call__(self, hidden: Any, *, out: None = ..., check_finite: bool = ...,
                 on_device: Literal[True], stream: Any = ...) -> DeviceArray: ...
    @overload
    def __call__(self, hidden: Any, *, out: Optional[np.ndarray] = ..., check_finite: bool = ...,
                 on_device: bool = ..., stream: Any = ...) -> Union[NDArray[np.float32], DeviceArray]: ...

    def __call__(self, hidden: Any, *, out: Optional[np.ndarray] = None, check_finite: bool = True,
                 on_device: bool = False, stream: Any = None) -> Any:
        """Logits for one hidden state ``[H]`` (→ ``[V]``) or a batch ``[t, H]`` (→ ``[t, V]``).

        Returns a zero-copy view of a buffer the head owns (never written again while the view lives),
        or ``out`` (shape ``[V]`` or ``[t, V]``, float32, C-contiguous) when given.
        Row r of a t-token call equals the single-token call on row r, bit for bit.

        CUDA heads also take ``hidden`` in GPU memory (CuPy, PyTorch: anything with
        ``__cuda_array_interface__`` or CUDA ``__dlpack__``), and ``on_device=True``
        returns the logits as a :class:`muser.DeviceArray` -- the head's device
        buffer without a copy, for ``torch.from_dlpack`` / ``cupy.asarray``. A device
        hidden state with ``on_device=False`` gives a new host array.

        ``stream`` (``on_device=True`` only): the CUDA stream the call runs on -- an int
        handle, a ``torch.cuda.Stream`` or a CuPy stream; by default PyTorch's (CuPy's)
        current stream when ``hidden`` is a tensor (array) of theirs, else the head's own
        stream, waited for. On a stream:

        - ``check_finite=False``: the call returns with its work queued on the stream,
          without waiting for the GPU, so it can be captured in the caller's CUDA graph
          (``torch.cuda.graph``: call it once with the same ``t`` first, so the buffers
          exist; each replay writes the buffer of the DeviceArray the capture returned --
          keep that one for as long as the graph is replayed). The DeviceArray's
          ``stream`` names the stream; ``__dlpack__(stream=...)`` makes the consumer's
          stream wait for it and ``get()`` waits too.
        - ``check_finite=True`` with a device hidden state: the NaN/inf scan runs in the
          same graph as the route, beside it, and the call waits for the scan alone -- it
          raises :class:`muser.NonFiniteError` before anything is returned, else returns
          with the route still queued on the stream, as above (inside a graph capture this
          is refused with a ValueError: pass ``check_finite=False``).

        The buffer rule without waiting: a DeviceArray's buffer goes back to the head's
        pool when the array and everything made from it is gone; work that reads it must
        be queued (on this stream, or one ordered after it) before you let it go. A later
        call on the same stream reuses it in stream order; a call on another stream takes
        a fresh buffer, or waits for the device. Calls of one head are ordered among
        themselves (an event joins the streams), whatever streams they use.
        """
        if stream is not None and not on_device:
            raise ValueError("stream= goes with on_device=True (host logits wait for the GPU anyway)")
        if on_device or _device.is_device_array(hidden):
            return _device.call(self, hidden, on_device=on_device, out=out, check_finite=check_finite,
                                stream=stream)
        rows, single = self._rows(hidden)
        if out is not None:
            self._check_out(out, rows.shape[0], single)
        if self._pinned is not None:
            self._core.check_file()
            if check_finite and not np.isfinite(rows).all():
                r, c = map(int, np.argwhere(~np.isfinite(rows))[0])
                from .errors import NonFiniteError

                raise NonFiniteError(f"hidden state row {r}, column {c} is {rows[r, c]}")
            result = self._pinned(rows)
            if out is not None:
                out.reshape(result.shape)[...] = result
                return out
            return result[0] if single else result
        out2 = None if out is None else out.reshape(rows.shape[0], self._local_vocab)
        view, _ = self._core.run(rows, out2, False, check_finite)
        if out is not None:
            return out
        return view[0] if single else view

    def _check_out(self, out: Any, t: int, single: bool) -> None:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
        if out.dtype != np.float32:
            raise TypeError(f"out must be float32, got {out.dtype}")
        expect = (self._local_vocab,) if single else (t, self._local_vocab)
        if out.shape != expect:
            raise ValueError(f"out must have shape {expect}, got {out.shape}")
        if not (out.flags.c_contiguous and out.flags.aligned):
            raise ValueError("out must be C-contiguous and aligned")
        if not out.flags.writeable:
            raise ValueError("out must be writable; got a read-only array (out.flags.writeable is False)")

    @overload
    def argmax(self, hidden: Row, *, check_finite: bool = ...) -> int: ...
    @overload
    def argmax(self, hidden: Batch, *, check_finite: bool = ...) -> NDArray[np.int64]: ...
    @overload
    def argmax(self, hidden: Any, *, check_finite: bool = ...) -> Union[int, NDArray[np.int64]]: ...

    def argmax(self, hidden: Any, *, check_finite: bool = True) -> Union[int, NDArray[np.int64]]:
        """Index of the largest logit (an int for ``[H]``, int64 ``[t]`` for ``[t, H]``).

        Ties go to the lowest token id; NaN never wins. The soft cap is strictly
        increasing, so this is also the argmax of the uncapped scores.
        """
        if self._shard is not None:
            return _shard.argmax(self, hidden, check_finite)
        if self._ranks_on_device:
            return _device.argmax(self, hidden, check_finite)  # ranked on the device: only the ids come back
        rows, single = self._rows(hidden)
        ids = np.asarray(_core.argmax_rows(self(rows, check_finite=check_finite)), dtype=np.int64)
        return int(ids[0]) if single else ids

    @overload
    def topk(self, hidden: Row, k: int, *, logprobs: bool = ..., check_finite: bool = ...) -> TopK: ...
    @overload
    def topk(self, hidden: Batch, k: int, *, logprobs: bool = ..., check_finite: bool = ...) -> TopK: ...
    @overload
    def topk(self, hidden: Any, k: int, *, logprobs: bool = ..., check_finite: bool = ...) -> TopK: ...

    def topk(self, hidden: Any, k: int, *, logprobs: bool = False, check_finite: bool = True) -> TopK:
        """The k best tokens: ``TopK(values, indices, logprobs)`` (torch's order), each ``[k]``
        for one row ``[H]`` or ``[t, k]`` for a batch ``[t, H]``, best first. Ties go to the
        lowest token id.

        ``logprobs=True`` also gives their log-probabilities (``value - logsumexp`` of the
        row, the logsumexp of :meth:`logsumexp`); otherwise ``logprobs`` is None.
        """
        k = int_arg("k", k)
        if not 1 <= k <= self._spec.vocab_size:
            raise ValueError(f"k must be in [1, {self._spec.vocab_size}] (V), got {k}")
        if not isinstance(logprobs, bool):
            raise TypeError(f"logprobs must be a bool, got {type(logprobs).__name__}")
        if self._shard is not None:
            vals, ids, lps, single = _shard.topk(self, hidden, k, logprobs, check_finite)
            return TopK(vals[0], ids[0], None if lps is None else lps[0]) if single else TopK(vals, ids, lps)
        if logprobs:  # one pass over the logits for both the winners and the row's logsumexp
            logits, single = self._host_logits(hidden, check_finite)
            ids, vals = _core.topk_rows(logits, k)
            lse = np.asarray(_core.logsumexp_rows(logits, self._threads), dtype=np.float32)
        elif self._ranks_on_device:
            ids, vals, single = _device.topk(self, hidden, k, check_finite)  # only the winners come back
            lse = None
        else:
            rows, single = self._rows(hidden)
            ids, vals = _core.topk_rows(self(rows, check_finite=check_finite), k)
            lse = None
        t = -1
        ids = np.asarray(ids, dtype=np.int64).reshape(t, k)
        vals = np.asarray(vals, dtype=np.float32).reshape(t, k)
        lps = None if lse is None else (vals - lse[:, None]).astype(np.float32)
        if single:
            return TopK(vals[0], ids[0], None if lps is None else lps[0])
        return TopK(vals, ids, lps)

    # ---- what users compute from the logits (docs/numerics.md: the vocabulary reduction) ----
    def _host_logits(self, hidden: Any, check_finite: bool) -> tuple[np.ndarray, bool]:
        rows, single = self._rows(hidden) if not _device.is_device_array(hidden) else (None, False)
        if rows is None:  # a device hidden state: its logits come back to the host
            logits = self(hidden, check_finite=check_finite)
            return (logits.reshape(1, -1) if logits.ndim == 1 else logits), logits.ndim == 1
        return self(rows, check_finite=check_finite), single

    def logsumexp(self, hidden: Any, *, check_finite: bool = True, on_device: bool = False) -> Any:
        """The logsumexp of each row's logits: a float for ``[H]``, float32 ``[t]`` for ``[t, H]``.

        The canonical order (tiles of 2,048 ids, 32 lanes, fixed merge trees; exp and
        log from exact operations): the same bits for any batch size and thread count.
        The vocabulary is reduced tile by tile: no ``[t, V]`` logits are kept.
        ``on_device=True`` (CUDA) leaves the result in device memory: a :class:`muser.DeviceArray`
        of shape ``()`` or ``[t]``.
        """
        if on_device:
            inputs = self._device_inputs(hidden)
            lse_shape = () if inputs[3] else (inputs[2],)
            got = _core.device_score(self._core, inputs[0], inputs[1], inputs[2],
                                     np.zeros((inputs[2], 0), np.int64), check_finite, True, [0], list(lse_shape))
            return self._device_result(got[2], lse_shape, np.float32)
        inputs = self._inputs(hidden)
        lse = self._reduce(hidden, inputs, np.zeros((inputs[2], 0), np.int64), check_finite)[2]
        return float(lse[0]) if inputs[3] else lse

    def _device_inputs(self, hidden: Any) -> tuple[Optional[np.ndarray], int, int, bool]:
        """_inputs for a reduction whose results stay in device memory (``on_device=True``)."""
        if self._pinned is not None or self._shard is not None or not self._caps["resident_logits"]:
            raise ValueError("on_device=True needs an unsharded head on a device with memory of its own; "
                             f"this head runs on {self.device!r}"
                             + (" (sharded)" if self._shard is not None else "")
                             + (" (route='pinned')" if self._pinned is not None else ""))
        return _device._inputs(self, hidden)

    def _device_result(self, view: tuple, shape: tuple, dtype: Any) -> "DeviceArray":
        """A :class:`muser.DeviceArray` of an engine's ``(DLPack ndarray, address)``."""
        return _device.DeviceArray(view[0], view[1], shape, self._core, self._caps, dtype=dtype)

    def _inputs(self, hidden: Any) -> tuple[Optional[np.ndarray], int, int, bool]:
        """``(host rows or None, device address, t, single)`` of a validated hidden state."""
        if self._pinned is not None and not _device.is_device_array(hidden):
            rows, single = self._rows(hidden)
            return rows, 0, rows.shape[0], single
        return _device._inputs(self, hidden)

    def _reduce(self, hidden: Any, inputs: tuple[Optional[np.ndarray], int, int, bool], grid: np.ndarray,
                check_finite: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The vocabulary reduction of the route's logits for ids ``grid`` [t, m] (m may be 0):
        ``(values [t, m], ranks [t, m], lse [t], logprobs [t, m])``."""
        rows, ptr, t, _ = inputs
        if self._shard is None and self._pinned is None:  # the device's own reduction: its arrays as they are
            vals, ranks, lse, lp = _core.device_score(self._core, rows, ptr, t, grid, check_finite)
            return vals, ranks, lse.reshape(t), lp
        if self._shard is not None:  # every shard's summaries, exchanged (muser.shard)
            vals, ranks, lse = _shard.reduce(self, hidden, grid, check_finite)
        else:  # route="pinned": llama.cpp's logits, reduced on the host
            logits = self(rows if rows is not None else hidden, check_finite=check_finite).reshape(t, -1)
            _, vals, ranks, lse = _core.score_rows(logits, grid, self._threads)
        vals = np.asarray(vals, np.float32).reshape(t, -1)
        lse = np.asarray(lse, np.float32).reshape(t)
        lp = (vals - lse[:, None]).astype(np.float32)  # logit - logsumexp: log_softmax's one subtraction
        return vals, np.asarray(ranks, np.int64).reshape(t, -1), lse, lp

    def log_softmax(self, hidden: Any, *, out: Optional[np.ndarray] = None, check_finite: bool = True,
                    on_device: bool = False) -> Any:
        """Log-probabilities ``logit - logsumexp`` per row: float32 ``[V]`` or ``[t, V]``, a view
        of a buffer the head owns (like ``head(hidden)``), or ``out`` when given.

        On a device with memory of its own (CUDA) the reduction runs there, and
        ``on_device=True`` returns the :class:`muser.DeviceArray` without a copy. A sharded
        head returns its columns of the unsharded log-softmax, in host memory.
        """
        if self._shard is not None:
            if on_device:
                raise ValueError("a sharded head's log_softmax returns host memory; on_device=True is not supported")
            if out is not None:
                _, _, t, single = self._inputs(hidden)
                self._check_out(out, t, single)
            return _shard.log_softmax(self, hidden, out, check_finite)
        if self._pinned is None and self._caps["resident_logits"]:
            return _device.call(self, hidden, on_device=on_device, out=out, check_finite=check_finite,
                                log_softmax=True)
        if on_device:
            raise ValueError("on_device=True needs a device with memory of its own; "
                             f"this head runs on {self.device!r}")
        V = self._spec.vocab_size
        rows, single = self._rows(hidden)
        if out is not None:
            self._check_out(out, rows.shape[0], single)
        logits = self(rows, out=None if out is None else out.reshape(rows.shape[0], V), check_finite=check_finite)
        logits = logits.reshape(rows.shape[0], V)
        if self._pinned is not None or not self._core.log_softmax_in_place(logits):  # else done on the device
            lse = _core.logsumexp_rows(logits, self._threads)
            _core.log_softmax_inplace(logits, lse, self._threads)
        if out is not None:
            return out
        return logits[0] if single else logits

    def score(self, hidden: Any, token_ids: Any, *, check_finite: bool = True, on_device: bool = False) -> Scores:
        """The log-probability, capped logit and 1-based rank of chosen tokens, and each row's
        logsumexp (see :class:`Scores`).

        ``token_ids``: an int or int array ``[m]`` for one row ``[H]``; ``[t]`` (one token per
        row) or ``[t, m]`` for a batch ``[t, H]``. Ids must lie in ``[0, V)``. The vocabulary
        is reduced tile by tile (the chosen ids' logits first, from their rows alone), so
        memory is O(t * m) plus a bounded scratch: no ``[t, V]`` logits are kept.
        ``on_device=True`` (CUDA) leaves the four fields in device memory, each a
        :class:`muser.DeviceArray` of the shape it would have on the host (``()`` for a scalar).
        """
        ids = int64_ids(token_ids, "token_ids")
        inputs = self._device_inputs(hidden) if on_device else self._inputs(hidden)
        t, single = inputs[2], inputs[3]
        shape = ids.shape
        if single:
            if ids.ndim > 1:
                raise ValueError(f"token_ids for one row must be an int or [m], got shape {shape}")
            grid = ids.reshape(1, -1)
        elif ids.ndim == 1 and ids.shape[0] == t:
            grid = ids.reshape(t, 1)
        elif ids.ndim == 2 and ids.shape[0] == t:
            grid = ids
        else:
            raise ValueError(f"token_ids for {t} rows must have shape [{t}] or [{t}, m], got {shape}")
        # ids outside [0, V) are refused by the reduction itself, before it computes
        grid = np.ascontiguousarray(grid, dtype=np.int64).reshape(t, -1)
        if on_device:
            lse_shape = () if single else (t,)
            dv, dr, dl, dp = _core.device_score(self._core, inputs[0], inputs[1], t, grid, check_finite, True,
                                                list(shape), list(lse_shape))
            return Scores(self._device_result(dp, shape, np.float32), self._device_result(dv, shape, np.float32),
                          self._device_result(dr, shape, np.int64), self._device_result(dl, lse_shape, np.float32))
        vals, ranks, lse, lp = self._reduce(hidden, inputs, grid, check_finite)
        if single and ids.ndim == 0:
            return Scores(float(lp[0, 0]), float(vals[0, 0]), int(ranks[0, 0]), float(lse[0]))
        vals, ranks, lp = vals.reshape(shape), ranks.reshape(shape), lp.reshape(shape)
        return Scores(lp, vals, ranks, float(lse[0]) if single else lse)

    def sample(self, hidden: Any, *, seed: Optional[int] = None, positions: Any = None, temperature: float = 1.0,
               top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, logit_bias: Any = None,
               allowed: Any = None, check_finite: bool = True, on_device: bool = False) -> Sample:
        """One token per row, drawn reproducibly: ``Sample(tokens, logprobs, processed_logprobs,
        kept_mass)`` (an int and floats for ``[H]``, arrays ``[t]`` for ``[t, H]``).

        The processed distribution (docs/numerics.md, "Sampling"): ``logit_bias`` (a
        ``{token: value}`` dict or float ``[V]``, added in float32) and ``allowed`` (bool ``[V]``)
        first, then ``temperature`` (0: greedy, the argmax of the biased, allowed logits), then
        ``top_k`` (0: off), ``top_p`` (1: off) and ``min_p`` (0: off), each over the previous
        step's kept set, then renormalized. ``seed`` (``[0, 2^64)``) and ``positions`` (an int for
        one row, int ``[t]`` for a batch: the rows' sequence positions) are required when
        ``temperature > 0``: the token depends only on the row's logits, the seed and its
        position (a Philox4x32-10 uniform per (seed, position, token id)), never on the batch.
        ``logprobs`` are those of :meth:`score` (the raw capped logits), ``processed_logprobs``
        those of the processed distribution, ``kept_mass`` the kept set's raw probability.
        A bias is float32 arithmetic: one of 1e9 swamps the logits it is added to, so force
        tokens with ``allowed`` instead (docs/numerics.md, "What comes back").
        """
        p = _sampling.check_params(self._spec.vocab_size, seed=seed, positions=positions,
                                   temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                   logit_bias=logit_bias, allowed=allowed)
        if self._shard is not None:
            return _shard.sample(self, hidden, p, positions, check_finite)
        if on_device:
            self._device_inputs(hidden)  # refuses a head without device memory of its own
        if self._pinned is None and self._caps.get("sample_on_device"):
            rows, ptr, t, single = self._inputs(hidden)
            pos = _sampling.check_positions(positions, t, single)
            shape = () if single else (t,)
            drawn = _core.device_sample(self._core, rows, ptr, t, pos, p.seed, p.temperature, p.top_k, p.top_p,
                                        p.min_p, p.bias, p.allowed, check_finite, on_device, list(shape))
            if drawn is not None:
                if on_device:
                    return Sample(*(self._device_result(v, shape, dt) for v, dt in
                                    zip(drawn, (np.int64, np.float32, np.float32, np.float32))))
                return _sampling.sample_result(drawn, single)
            # the device left this draw to the host (a row's problem is named there)
        logits, single = self._host_logits(hidden, check_finite)
        pos = _sampling.check_positions(positions, logits.shape[0], single)
        drawn_host = _sampling.sample_logits(logits, single, p, pos, self._threads)  # names a row's problem
        if on_device:  # the device declines only rows the host refuses, or ids past its 28-bit order keys
            raise DeviceError(f"sampling on {self.device!r} with on_device=True does not take a "
                                           f"vocabulary of {self._spec.vocab_size} tokens with top_k/top_p")
        return drawn_host

    def profile(self, hidden: Any, *, check_finite: bool = True) -> list[NodeProfile]:
        """Run once and report each kernel's time and bytes under the labels of its nodes.

        The LM-head matvec is booked under ``"lm_head"``, never under a soft-cap
        label alone: each kernel is timed from its own start to its own end, and a
        kernel that fuses the soft cap into the matvec is named ``"lm_head+softcap"``.
        Load with ``fuse=False`` to time every node on its own.
        """
        if self._pinned is not None:
            raise ValueError("profile() is not available for route='pinned'")
        rows, _ = self._rows(hidden)
        _, prof = self._core.run(rows, None, True, check_finite)
        return [NodeProfile(p["label"], p["kind"], p["seconds"], p["bytes"]) for p in prof]


def _check_shard(shard: Any) -> tuple[int, int]:
    """``(rank, world)`` of a ``shard=`` argument ((0, 1) for None); the row formula checks the rest."""
    if shard is None:
        return 0, 1
    if not isinstance(shard, (tuple, list)) or len(shard) != 2:
        raise TypeError(f"shard must be a (rank, world) pair of ints, got {shard!r}")
    rank, world = (int_arg(f"shard {name}", v) for name, v in zip(("rank", "world"), shard))
    if world < 1:
        raise ValueError(f"shard world must be >= 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"shard rank must be in [0, {world}) (world {world}), got {rank}")
    return rank, world
