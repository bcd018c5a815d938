"""Head-only quantization: :func:`requantize` writes a model's head in another weight type,
and :func:`sensitivity` measures what that costs against the original head.

The new file holds only the head: ``output_norm.weight`` (its bytes copied unchanged) and
the LM-head weight in the new type, under the name the architecture reads it from
(``output.weight``; ``token_embd.weight`` for a tied head or an architecture that always
ties), with the metadata the :class:`muser.HeadSpec` is read from (architecture, hidden
size, norm epsilon, logit scale, soft cap: docs/architectures.md). Source weights in a
quantized type are dequantized to float32 first (:func:`muser.dequantize`, bit-equal to
``gguf.quants.dequantize``) and then quantized with :func:`muser.quantize` (ggml's
reference quantizers, byte for byte). The file loads in muser and in ``gguf.GGUFReader``.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from ._core import Error, GGUFFile
from ._quant import dequantize, quantize

__all__ = ["requantize", "sensitivity", "SensitivityRow", "TYPES"]

#: The weight types requantize() writes (those muser.quantize() produces and the head multiplies).
TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "F16", "BF16", "F32")

# float32 elements per quantization chunk (16 MiB)
_CHUNK_ELEMENTS = 1 << 22

# the spec fields a requantized file must reproduce (output_type changes by design; the
# *_source fields say where a value came from, which a new file cannot keep for overrides)
_SPEC_FIELDS = ("arch", "hidden_size", "vocab_size", "norm", "eps", "norm_weight", "output_weight", "tied",
                "logit_scale_mode", "logit_scale", "applied_scale", "softcap")

PathLike = Union[str, "os.PathLike[str]"]


def _type_name(weight_type: Any) -> str:
    name = weight_type if isinstance(weight_type, str) else getattr(weight_type, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"type must be a type name (one of {', '.join(TYPES)}), got {weight_type!r}")
    if name.upper() not in TYPES:
        raise ValueError(f"type must be one of {', '.join(TYPES)}, got {name!r}")
    return name.upper()


def _source(source: Any):
    """(GGUFFile, HeadSpec, label) of a GGUF path or a Head."""
    from .head import Head

    if isinstance(source, Head):
        if source._pinned is None:
            source._core.check_file()  # the head's file unchanged since it was loaded (else GGUFError)
        return GGUFFile(source.path), source.spec, source.path
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        return GGUFFile(path), Head.load(path).spec, path
    raise TypeError(f"source must be a GGUF path or a muser.Head, got {type(source).__name__}")


def _tensor_type(f: GGUFFile, name: str) -> str:
    return str(f.tensor(name).type)


def requantize(source: Union[PathLike, Any], type: Any, path: PathLike, *,
               progress: Optional[Callable[[int, int], None]] = None) -> str:
    """Write the head of ``source`` to ``path`` with its LM-head weight in ``type``.

    Args:
        source: a GGUF path, or a :class:`muser.Head` (its spec, overrides included, is what
            the new file's metadata says; its file must be unchanged since it was loaded).
        type: one of ``Q4_K``, ``Q5_K``, ``Q6_K``, ``Q8_0``, ``F16``, ``BF16``, ``F32`` (or a
            ``gguf.GGMLQuantizationType`` member).
        path: the GGUF file to write (replaced if it exists).
        progress: ``progress(done_rows, total_rows)``, called as the weight is quantized.

    Returns:
        ``path`` as a string. ``muser.Head.load(path).spec`` equals the source's spec in every
        field but ``output_type`` and the ``*_source`` fields.

    Raises:
        TypeError / ValueError: a bad source or type.
        muser.Error: the source's spec cannot be written as metadata its architecture reads
            (an override muser cannot express in a file, e.g. no logit scale for muse-glimmer);
            nothing is left at ``path`` then.
    """
    import gguf

    tname = _type_name(type)
    f, spec, label = _source(source)
    if os.path.exists(path) and os.path.samefile(path, label):
        raise ValueError(f"path must not be the source file itself ({label}): the source is read while it is written")
    V, H = spec.vocab_size, spec.hidden_size
    src_type = _tensor_type(f, spec.output_weight)
    src = f.tensor_bytes(spec.output_weight).reshape(V, -1)

    probe = quantize(np.zeros((1, H), np.float32), tname)  # the block rule for H (ValueError if H does not fit)
    out = np.empty((V, probe.shape[1]), np.uint8)
    step = max(1, _CHUNK_ELEMENTS // H)
    for r0 in range(0, V, step):
        r1 = min(V, r0 + step)
        rows = dequantize(np.ascontiguousarray(src[r0:r1]), src_type, (r1 - r0, H))
        out[r0:r1] = quantize(rows, tname)
        if progress:
            progress(r1, V)

    path = os.fspath(path)
    arch = spec.arch
    w = gguf.GGUFWriter(path, arch)
    w.add_uint32(f"{arch}.embedding_length", H)
    w.add_uint32(f"{arch}.vocab_size", V)
    # the epsilon key by the norm's kind, as llama.cpp names them (LLM_KV_ATTENTION_LAYERNORM[_RMS]_EPS)
    eps_key = spec.eps_source if spec.eps_source.startswith(f"{arch}.") else \
        f"{arch}.attention.{'layer_norm_rms_epsilon' if spec.norm == 'rms' else 'layer_norm_epsilon'}"
    w.add_float32(eps_key, spec.eps)
    if spec.logit_scale_source not in ("none", "absent"):  # the architecture reads a scale
        w.add_float32(f"{arch}.logit_scale", spec.logit_scale if spec.logit_scale_mode != "none" else 0.0)
    if spec.softcap_source != "none":  # the architecture reads a cap (0: none)
        w.add_float32(f"{arch}.final_logit_softcapping", spec.softcap or 0.0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_string("muser.requantize.source", os.path.basename(label))
    w.add_string("muser.requantize.source_type", src_type)
    norm_type = _tensor_type(f, spec.norm_weight)
    w.add_tensor(spec.norm_weight, f.tensor_bytes(spec.norm_weight),
                 raw_dtype=getattr(gguf.GGMLQuantizationType, norm_type))
    w.add_tensor(spec.output_weight, out, raw_dtype=getattr(gguf.GGMLQuantizationType, tname))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    del out

    _check_spec(path, spec)
    return path


def _check_spec(path: str, want: Any) -> None:
    """Load what was written and compare its spec with the source's; remove the file if they differ."""
    from .head import Head

    try:
        got = Head.load(path).spec
        diff = [f"{name}: source {getattr(want, name)!r}, written {getattr(got, name)!r}"
                for name in _SPEC_FIELDS if getattr(want, name) != getattr(got, name)]
    except Error as e:
        diff = [f"the written file does not load: {e}"]
    if diff:
        os.unlink(path)
        raise Error(f"{path}: cannot write this head's spec as {want.arch} metadata ({'; '.join(diff)}); "
                    "an override the architecture's keys cannot express? nothing was kept")


# ---------------------------------------------------------------------------
# sensitivity

@dataclass
class SensitivityRow:
    """One weight type's cost, measured against the original head on the same hidden states.

    ``kl_mean``/``kl_max``: KL(original || requantized) over rows, nats; ``top1_agreement``:
    fraction of rows with the same argmax; ``step_seconds``: median time of one head call
    on one row; ``ppl_ratio``/``delta_p_rms``: with targets (else None).
    """

    type: str
    weight_bytes: int
    kl_mean: float
    kl_max: float
    top1_agreement: float
    step_seconds: float
    ppl_ratio: Optional[float] = None
    delta_p_rms: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _step_seconds(head: Any, row: np.ndarray, repeats: int) -> float:
    head(row)  # warm: first-touch of the weight pages
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        head(row)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def sensitivity(model: PathLike, hidden: np.ndarray, types: Sequence[str], *, targets: Any = None,
                device: str = "cpu", route: str = "graph", acts: str = "f32", threads: Optional[int] = None,
                repeats: int = 5, workdir: Optional[PathLike] = None,
                on_type: Optional[Callable[[str, int, int], None]] = None) -> tuple[SensitivityRow, list[SensitivityRow]]:
    """Requantize the head of ``model`` to each of ``types`` and compare each with the original.

    Returns ``(original, rows)``: the original head's own row (KL 0) and one
    :class:`SensitivityRow` per type, in order. Each requantized file is written to
    ``workdir`` (default: a temporary directory) and removed after it was measured, unless
    ``workdir`` is given. ``on_type(type, done_rows, total_rows)`` reports progress.
    """
    import tempfile

    from .compare import compare
    from .head import Head

    names = [_type_name(t) for t in types]
    if not names:
        raise ValueError("types must name at least one weight type")
    hidden = np.asarray(hidden)
    if hidden.ndim != 2 or hidden.shape[0] == 0:
        raise ValueError(f"hidden must be [t, H] with t >= 1, got shape {hidden.shape}")
    kw = dict(device=device, route=route, acts=acts, threads=threads)
    original = Head.load(model, **kw)
    row0 = np.ascontiguousarray(hidden[:1])
    base = SensitivityRow(original.spec.output_type, original.weight_bytes, 0.0, 0.0, 1.0,
                          _step_seconds(original, row0, repeats),
                          1.0 if targets is not None else None, 0.0 if targets is not None else None)
    tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="muser-sensitivity-")
    folder = os.fspath(workdir) if workdir is not None else tmp.name
    rows = []
    try:
        for name in names:
            path = os.path.join(folder, f"head-{name}.gguf")
            requantize(original, name, path,
                       progress=None if on_type is None else (lambda d, n, name=name: on_type(name, d, n)))
            head = Head.load(path, **kw)
            r = compare(head, original, hidden=hidden, targets=targets)
            rows.append(SensitivityRow(name, head.weight_bytes, r.kl_divergence, float(r.per_row["kl"].max()),
                                       r.argmax_agreement, _step_seconds(head, row0, repeats),
                                       r.ppl_ratio, r.delta_p_rms))
            del head
            if tmp is not None:
                os.unlink(path)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return base, rows
