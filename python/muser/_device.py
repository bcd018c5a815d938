"""What a head can do on a device with memory of its own, chosen by the
device's abilities (``head.caps``), never by its name: hidden states already
in device memory, logits returned without a copy (:class:`DeviceArray`), and
argmax/top-k ranked on the device so only the winners cross the bus.
``Head.__call__``, ``argmax`` and ``topk`` route here when the caps say so.

Device arrays are recognised by ``__cuda_array_interface__`` (CuPy, PyTorch,
Numba) or ``__dlpack__`` with a non-CPU device. On CUDA our kernels run on a
stream that waits for the legacy default stream, where PyTorch and CuPy queue
their work unless told otherwise; a hidden state written on another stream
must be synchronized by the caller first -- except for ``head(x,
on_device=True)``, which runs on the caller's stream (``stream=``, by default
PyTorch's or CuPy's current stream when ``x`` is theirs): see :func:`call`.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Union

import numpy as np

from . import _core

_KDL_CPU = 1  # DLPack device type of host memory


class DeviceArray:
    """Logits (or a reduction's results, ``on_device=True``) in device memory, shared without a copy.

    Exposes ``__cuda_array_interface__`` (``cupy.asarray(x)``,
    ``torch.as_tensor(x, device="cuda")``) and ``__dlpack__``
    (``torch.from_dlpack(x)``, ``cupy.from_dlpack(x)``). It keeps the head's
    device buffer (and the head) alive for as long as it, or anything made
    from it, exists. No later call writes this buffer while it is alive: the
    head takes another from its pool (or a new one) instead.
    """

    __slots__ = ("_nd", "_ptr", "_head", "shape", "device_id", "_dl_device", "stream", "dtype")

    def __init__(self, nd: Any, ptr: int, shape: tuple, head_core: Any, caps: Optional[dict] = None,
                 stream: Optional[int] = None, dtype: Any = np.float32):
        caps = head_core.caps if caps is None else caps
        #: float32 (logits, log-probabilities) or int64 (ids, ranks)
        self.dtype = np.dtype(dtype)
        self._nd = nd  # nanobind's DLPack ndarray: owns the buffer (and the head)
        self._ptr = int(ptr)
        self._head = head_core
        self.shape = shape
        self.device_id = int(caps["ordinal"])
        self._dl_device = int(caps["dlpack_device"])
        #: the CUDA stream (a handle) the logits are being written on when the call returned
        #: without waiting (``stream=``, ``check_finite=False``), else None: complete
        self.stream = stream

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * self.size

    @property
    def data_ptr(self) -> int:
        return self._ptr

    @property
    def __cuda_array_interface__(self) -> dict:
        # stream None: the data is complete; else the stream that writes it (0, the legacy default, is 1 here)
        stream = None if self.stream is None else (self.stream or 1)
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self._ptr, False), "strides": None,
                "version": 3, "stream": stream}

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Optional[bool] = None) -> Any:
        if self.stream is not None and stream != -1:
            # the consumer's stream (None: the legacy default) waits for the one that writes the logits
            consumer = 1 if stream is None else int(stream)
            if consumer != self.stream and not (consumer == 1 and self.stream == 0):
                _core.cuda_stream_wait(consumer, self.stream)
        kwargs = {}
        if max_version is not None:
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        return self._nd.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple:
        return (self._dl_device, self.device_id)

    def get(self) -> np.ndarray:
        """A new host copy (numpy); waits for the stream that writes the logits."""
        words = np.asarray(_core.device_download(self._head, self._ptr, self.nbytes // 4))
        return words.view(self.dtype).reshape(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"muser.DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self._head.device!r})"


def _torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")  # never imported here: a tensor exists only if torch is loaded
    return torch is not None and isinstance(obj, torch.Tensor)


def is_device_array(obj: Any) -> bool:
    """Whether ``obj`` is an array in device memory (CUDA array interface, or DLPack on a non-CPU device)."""
    if isinstance(obj, np.ndarray):
        return False
    if _torch_tensor(obj):  # without building torch's __cuda_array_interface__ dict
        return bool(obj.is_cuda)
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return int(dev()[0]) != _KDL_CPU
    except Exception:  # noqa: BLE001 -- a foreign object's protocol failure means "not ours"
        return False


def _torch_rows(hidden: Any, H: int) -> tuple[int, int, bool]:
    """_device_rows for a CUDA torch.Tensor, from its own attributes (a few microseconds less)."""
    shape = tuple(hidden.shape)
    if hidden.dtype != sys.modules["torch"].float32:
        raise TypeError(f"hidden must be float32, got {hidden.dtype}")
    if len(shape) not in (1, 2) or shape[-1] != H:
        raise ValueError(f"hidden must have shape [H] or [t, H] with H={H}, got {shape}")
    if not hidden.is_contiguous():
        raise ValueError("a device hidden state must be C-contiguous")
    single = len(shape) == 1
    return int(hidden.data_ptr()), 1 if single else int(shape[0]), single


def _device_rows(hidden: Any, H: int) -> tuple[int, int, bool]:
    """(address, t, single) of a float32 [H] or [t, H] C-contiguous device array."""
    if _torch_tensor(hidden):
        return _torch_rows(hidden, H)
    cai = getattr(hidden, "__cuda_array_interface__", None)
    if cai is not None:
        typestr, shape, strides, ptr = cai["typestr"], tuple(cai["shape"]), cai.get("strides"), cai["data"][0]
        if typestr != "<f4":
            raise TypeError(f"hidden must be float32, got typestr {typestr!r}")
        contiguous = strides is None or tuple(strides) == tuple(
            int(np.prod(shape[i + 1:])) * 4 for i in range(len(shape)))
    else:
        ptr, shape, strides_el, dtype, _, _ = _core.cuda_array_info(hidden)
        if dtype != "float32":
            raise TypeError("hidden must be float32")
        shape = tuple(shape)
        contiguous = tuple(strides_el) == tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    if len(shape) not in (1, 2) or shape[-1] != H:
        raise ValueError(f"hidden must have shape [H] or [t, H] with H={H}, got {shape}")
    if not contiguous:
        raise ValueError("a device hidden state must be C-contiguous")
    single = len(shape) == 1
    return int(ptr), 1 if single else int(shape[0]), single


def _inputs(head: Any, hidden: Any) -> tuple[Optional[np.ndarray], int, int, bool]:
    H = head.spec.hidden_size
    if _torch_tensor(hidden) and hidden.is_cuda:
        return (None, *_torch_rows(hidden, H))
    if is_device_array(hidden):
        ptr, t, single = _device_rows(hidden, H)
        return None, ptr, t, single
    rows, single = head._rows(hidden)  # the Head's own validation of host arrays
    return rows, 0, rows.shape[0], single


def stream_handle(stream: Any) -> int:
    """The CUDA stream handle of ``stream``: an int, a ``torch.cuda.Stream`` (``.cuda_stream``)
    or a CuPy stream (``.ptr``)."""
    if isinstance(stream, bool):
        raise TypeError("stream must be a CUDA stream (an int handle, torch.cuda.Stream or cupy Stream), got a bool")
    if isinstance(stream, (int, np.integer)):
        handle = int(stream)
    elif hasattr(stream, "cuda_stream"):
        handle = int(stream.cuda_stream)
    elif hasattr(stream, "ptr"):
        handle = int(stream.ptr)
    else:
        raise TypeError("stream must be a CUDA stream (an int handle, torch.cuda.Stream or cupy Stream), "
                        f"got {type(stream).__name__}")
    if handle < 0:
        raise ValueError(f"stream must be a CUDA stream handle (>= 0), got {handle}")
    return handle


def _current_stream(hidden: Any) -> Optional[int]:
    """PyTorch's or CuPy's current stream when ``hidden`` is their device array, else None."""
    if _torch_tensor(hidden):
        if not hidden.is_cuda:
            return None
        cuda = sys.modules["torch"].cuda
        index = hidden.get_device()
        raw = getattr(sys.modules["torch"]._C, "_cuda_getCurrentRawStream", None)
        return int(raw(index)) if raw is not None else int(cuda.current_stream(index).cuda_stream)
    if type(hidden).__module__.startswith("cupy"):
        return int(sys.modules["cupy"].cuda.get_current_stream().ptr)
    return None


def call(head: Any, hidden: Any, *, on_device: bool, out: Optional[np.ndarray],
         check_finite: bool, log_softmax: bool = False, stream: Any = None) -> Union[np.ndarray, DeviceArray]:
    """``head(hidden, on_device=...)`` for a head whose device keeps logits in its own memory
    (``log_softmax``: ``head.log_softmax``, computed on the device).

    With ``on_device=True`` the call runs on ``stream`` (by default PyTorch's or CuPy's current
    stream when ``hidden`` is theirs; else the head's own stream, synchronized). On a stream it
    never waits for the route: ``check_finite=True`` on a device hidden state waits only for the
    NaN scan that runs beside it (its answer raises NonFiniteError), ``check_finite=False``
    returns at once with the work queued -- capturable in the caller's CUDA graph. See
    Head.__call__.
    """
    caps = getattr(head, "_caps", None) or head.caps
    if not caps["resident_logits"]:
        raise ValueError("on_device=True and device hidden states need a device with memory of its own; "
                         f"this head runs on {head.device!r}")
    rows, ptr, t, single = _inputs(head, hidden)
    if out is not None and not on_device:
        head._check_out(out, t, single)
    if stream is not None:
        if not on_device:
            raise ValueError("stream= goes with on_device=True (host logits wait for the GPU anyway)")
        handle: Optional[int] = stream_handle(stream)
    else:
        handle = _current_stream(hidden) if on_device else None
    nd, addr, _ = _core.device_run(head._core, rows, ptr, t, single, False, check_finite, log_softmax, handle,
                                   False)
    V = head._local_vocab  # a sharded head's own columns
    pending = handle is not None  # run_call's rule: on a stream only the scan's answer is waited for
    logits = DeviceArray(nd, addr, (V,) if single else (t, V), head._core, caps, handle if pending else None)
    if on_device:
        if out is not None:
            raise ValueError("out= takes host memory; with on_device=True the result is the head's device buffer")
        return logits
    host = logits.get()
    if out is not None:
        out[...] = host
        return out
    return host


def topk(head: Any, hidden: Any, k: int, check_finite: bool = True) -> tuple[np.ndarray, np.ndarray, bool]:
    """The k best tokens per row, ranked on the device; only ids and values come back:
    ``(ids [t, k], values [t, k], single)``, ``single`` when the input was one row."""
    rows, ptr, t, single = _inputs(head, hidden)
    k = int(k)
    if 0 < (getattr(head, "_caps", None) or head.caps)["max_topk"] < k:  # beyond the device kernel's range: rank the host copy
        logits = call(head, hidden, on_device=False, out=None, check_finite=check_finite)
        ids, vals = _core.topk_rows(np.ascontiguousarray(logits.reshape(t, -1)), k)
    else:
        ids, vals = _core.device_topk(head._core, rows, ptr, t, k, check_finite)
    ids = np.asarray(ids, dtype=np.int64).reshape(t, k)
    vals = np.asarray(vals, dtype=np.float32).reshape(t, k)
    return ids, vals, single


def argmax(head: Any, hidden: Any, check_finite: bool = True) -> Union[int, np.ndarray]:
    """Index of the largest logit per row, found on the device in the call's own graph."""
    rows, ptr, t, single = _inputs(head, hidden)
    ids = _core.device_topk(head._core, rows, ptr, t, 1, check_finite, True)
    return int(ids[0, 0]) if single else np.asarray(ids).reshape(t)


def route_seconds(head: Any, hidden: Any, reps: int, held: bool = False) -> list[float]:
    """Device seconds of ``reps`` runs of the head's whole route as a call launches it
    (on CUDA: one graph, no events between its nodes), after one untimed call.

    With ``held``, each run is enqueued behind a kernel that keeps the stream busy
    for 200 us, so the start event and the graph reach an already busy GPU: the time
    is the GPU's alone, without the host's launch latency (nvbench's method).
    """
    rows, ptr, t, _ = _inputs(head, hidden)
    return list(_core.device_route_seconds(head._core, rows, ptr, t, int(reps), True, bool(held)))
