"""What a head can do on a device with memory of its own, chosen by the
device's abilities (``head.caps``), never by its name: hidden states already
in device memory, logits returned without a copy (:class:`DeviceArray`), and
argmax/top-k ranked on the device so only the winners cross the bus.
``Head.__call__``, ``argmax`` and ``topk`` route here when the caps say so.

Device arrays are recognised by ``__cuda_array_interface__`` (CuPy, PyTorch,
Numba) or ``__dlpack__`` with a non-CPU device. On CUDA our kernels run on a
stream that waits for the legacy default stream, where PyTorch and CuPy queue
their work unless told otherwise; a hidden state written on another stream
must be synchronized by the caller first.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from . import _core

_KDL_CPU = 1  # DLPack device type of host memory


class DeviceArray:
    """Logits in device memory, shared without a copy.

    Exposes ``__cuda_array_interface__`` (``cupy.asarray(x)``,
    ``torch.as_tensor(x, device="cuda")``) and ``__dlpack__``
    (``torch.from_dlpack(x)``, ``cupy.from_dlpack(x)``). It keeps the head's
    device buffer (and the head) alive for as long as it, or anything made
    from it, exists. No later call writes this buffer while it is alive: the
    head takes another from its pool (or a new one) instead.
    """

    __slots__ = ("_nd", "_ptr", "_head", "shape", "device_id", "_dl_device")

    def __init__(self, nd: Any, ptr: int, shape: tuple, head_core: Any):
        caps = head_core.caps
        self._nd = nd  # nanobind's DLPack ndarray: owns the buffer (and the head)
        self._ptr = int(ptr)
        self._head = head_core
        self.shape = tuple(int(s) for s in shape)
        self.device_id = int(caps["ordinal"])
        self._dl_device = int(caps["dlpack_device"])

    dtype = np.dtype(np.float32)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return 4 * self.size

    @property
    def data_ptr(self) -> int:
        return self._ptr

    @property
    def __cuda_array_interface__(self) -> dict:
        # stream None: the data is complete (every muser call ends synchronized)
        return {"shape": self.shape, "typestr": "<f4", "data": (self._ptr, False), "strides": None,
                "version": 3, "stream": None}

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Optional[bool] = None) -> Any:
        del stream  # already synchronized: no producer stream to wait for
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
        """A new host copy (numpy)."""
        return np.asarray(_core.device_download(self._head, self._ptr, self.size)).reshape(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"muser.DeviceArray(shape={self.shape}, dtype=float32, device={self._head.device!r})"


def is_device_array(obj: Any) -> bool:
    """Whether ``obj`` is an array in device memory (CUDA array interface, or DLPack on a non-CPU device)."""
    if isinstance(obj, np.ndarray):
        return False
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return int(dev()[0]) != _KDL_CPU
    except Exception:  # noqa: BLE001 -- a foreign object's protocol failure means "not ours"
        return False


def _device_rows(hidden: Any, H: int) -> tuple[int, int, bool]:
    """(address, t, single) of a float32 [H] or [t, H] C-contiguous device array."""
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
    if is_device_array(hidden):
        ptr, t, single = _device_rows(hidden, H)
        return None, ptr, t, single
    rows, single = head._rows(hidden)  # the Head's own validation of host arrays
    return rows, 0, rows.shape[0], single


def call(head: Any, hidden: Any, *, on_device: bool, out: Optional[np.ndarray],
         check_finite: bool, log_softmax: bool = False) -> Union[np.ndarray, DeviceArray]:
    """``head(hidden, on_device=...)`` for a head whose device keeps logits in its own memory
    (``log_softmax``: ``head.log_softmax``, computed on the device)."""
    if not head.caps["resident_logits"]:
        raise ValueError("on_device=True and device hidden states need a device with memory of its own; "
                         f"this head runs on {head.device!r}")
    rows, ptr, t, single = _inputs(head, hidden)
    if out is not None and not on_device:
        head._check_out(out, t, single)
    nd, addr, _ = _core.device_run(head._core, rows, ptr, t, single, False, check_finite, log_softmax)
    V = head._local_vocab  # a sharded head's own columns
    logits = DeviceArray(nd, addr, (V,) if single else (t, V), head._core)
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
    if 0 < head.caps["max_topk"] < k:  # beyond the device kernel's range: rank the host copy
        logits = call(head, hidden, on_device=False, out=None, check_finite=check_finite)
        ids, vals = _core.topk_rows(np.ascontiguousarray(logits.reshape(t, -1)), k)
    else:
        ids, vals = _core.device_topk(head._core, rows, ptr, t, k, check_finite)
    ids = np.asarray(ids, dtype=np.int64).reshape(t, k)
    vals = np.asarray(vals, dtype=np.float32).reshape(t, k)
    return ids, vals, single


def argmax(head: Any, hidden: Any, check_finite: bool = True) -> Union[int, np.ndarray]:
    """Index of the largest logit per row, found on the device."""
    ids, _, single = topk(head, hidden, 1, check_finite)
    return int(ids[0, 0]) if single else ids[:, 0]


def route_seconds(head: Any, hidden: Any, reps: int, held: bool = False) -> list[float]:
    """Device seconds of ``reps`` runs of the head's whole route as a call launches it
    (on CUDA: one graph, no events between its nodes), after one untimed call.

    With ``held``, each run is enqueued behind a kernel that keeps the stream busy
    for 200 us, so the start event and the graph reach an already busy GPU: the time
    is the GPU's alone, without the host's launch latency (nvbench's method).
    """
    rows, ptr, t, _ = _inputs(head, hidden)
    return list(_core.device_route_seconds(head._core, rows, ptr, t, int(reps), True, bool(held)))
