"""Small, real GGUF heads written with the ``gguf`` package: the demo's model,
the tests' fixtures and the benchmarks' inputs all come from here, so there is
one definition of "a Muse Glimmer-style head file"."""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

import numpy as np

# Muse Glimmer's conventions (the seed, chapter 20).
MUSE_GLIMMER = dict(arch="muse-glimmer", hidden=6656, vocab=202048, weight_type="Q5_K",
                    logit_scale=0.196116, softcap=20.0, eps=1e-5)

_BLOCK = {"Q5_K": (256, 176), "Q4_K": (256, 144), "Q6_K": (256, 210), "Q8_0": (32, 34),
          "F16": (1, 2), "BF16": (1, 2), "F32": (1, 4)}


def random_blocks(weight_type: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random but well-formed blocks of a quantized type: random quants, small finite f16 scales."""
    elems, nbytes = _BLOCK[weight_type]
    nb = cols // elems
    raw = rng.integers(0, 256, size=(rows, nb, nbytes), dtype=np.uint8)
    def f16(shape: tuple, lo: float, hi: float) -> np.ndarray:
        return rng.uniform(lo, hi, size=shape).astype(np.float16).view(np.uint8).reshape(*shape[:-1], -1)
    if weight_type in ("Q5_K", "Q4_K"):
        raw[..., 0:2] = f16((rows, nb, 1), 1e-4, 3e-3)  # d
        raw[..., 2:4] = f16((rows, nb, 1), 1e-4, 3e-3)  # dmin
    elif weight_type == "Q6_K":
        raw[..., 208:210] = f16((rows, nb, 1), 1e-5, 2e-4)
    elif weight_type == "Q8_0":
        raw[..., 0:2] = f16((rows, nb, 1), 1e-4, 1e-3)
    return raw.reshape(rows, nb * nbytes)


def quantized_weight(weight_type: str, w: np.ndarray) -> np.ndarray:
    """Bytes of ``w`` (float32 [rows, cols]) in ``weight_type``, via muser's quantizer."""
    from . import quantize
    return quantize(np.ascontiguousarray(w, dtype=np.float32), weight_type)


def write_head_gguf(
    path: "os.PathLike[str] | str",
    *,
    arch: str = "muse-glimmer",
    hidden: int = 512,
    vocab: int = 4096,
    weight_type: str = "Q5_K",
    logit_scale: Optional[float] = 0.196116,
    softcap: Optional[float] = 20.0,
    eps: float = 1e-5,
    tied: bool = False,
    norm_bias: bool = False,
    seed: int = 0,
    weight: Optional[np.ndarray] = None,
    extra_metadata: Optional[dict[str, Any]] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    norm_type: str = "F32",
    random_quants: bool = False,
    alignment: Optional[int] = None,
) -> str:
    """Write a GGUF holding only a head: ``output_norm.weight`` and the LM head.

    The head weight is ``weight`` (float32 ``[vocab, hidden]``) quantized with
    muser's quantizer, or random Gaussian rows (std 0.02, a trained head's
    scale) quantized in chunks when ``weight`` is None — or, for a type without
    a quantizer or with ``random_quants=True``, random well-formed blocks
    (fast: benchmarks at the seed's shape skip 1.3 G floats of quantization). ``progress(done_rows, total_rows)``
    is called while the weight is produced. Metadata keys follow the
    architecture's conventions (docs/architectures.md); None omits a key; a
    ``np.float64`` value in ``extra_metadata`` is written as FLOAT64 (an ``arch``
    key given there replaces the one written from the arguments). ``alignment``
    sets ``general.alignment``.
    """
    import gguf

    rng = np.random.default_rng(seed)
    elems, nbytes = _BLOCK[weight_type]
    if hidden % elems:
        raise ValueError(f"hidden={hidden} is not a multiple of the {weight_type} block ({elems})")
    row_bytes = hidden // elems * nbytes
    data = np.empty((vocab, row_bytes), dtype=np.uint8)
    chunk = max(1, (1 << 22) // hidden)
    for r0 in range(0, vocab, chunk):
        r1 = min(vocab, r0 + chunk)
        if weight is not None:
            rows = np.ascontiguousarray(weight[r0:r1], dtype=np.float32)
        elif weight_type in ("F32", "F16", "BF16") or (not random_quants and (
                weight_type in ("Q5_K", "Q8_0") or _has_quantizer(weight_type))):
            rows = (rng.standard_normal((r1 - r0, hidden), dtype=np.float32) * np.float32(0.02))
        else:
            rows = None
        data[r0:r1] = random_blocks(weight_type, r1 - r0, hidden, rng) if rows is None else \
            quantized_weight(weight_type, rows)
        if progress:
            progress(r1, vocab)

    w = gguf.GGUFWriter(os.fspath(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    extra = dict(extra_metadata or {})
    w.add_uint32(f"{arch}.embedding_length", hidden)
    eps_key = "attention.layer_norm_epsilon" if arch in ("command-r", "cohere2") else "attention.layer_norm_rms_epsilon"
    for key, value in ((f"{arch}.{eps_key}", eps), (f"{arch}.logit_scale", logit_scale),
                       (f"{arch}.final_logit_softcapping", softcap)):
        if value is not None and key not in extra:
            w.add_float32(key, value)
    w.add_uint32(f"{arch}.vocab_size", vocab)
    for k, v in extra.items():
        if isinstance(v, np.float64):
            w.add_float64(k, float(v))
        elif isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, v)
    gamma = (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
    if norm_type == "F32":
        w.add_tensor("output_norm.weight", gamma)
    else:
        w.add_tensor("output_norm.weight", gamma.astype(np.float16))
    if norm_bias:
        w.add_tensor("output_norm.bias", (0.01 * rng.standard_normal(hidden)).astype(np.float32))
    qtype = getattr(gguf.GGMLQuantizationType, weight_type)
    name = "token_embd.weight" if tied else "output.weight"
    w.add_tensor(name, data, raw_dtype=qtype)  # byte shape; gguf derives [vocab, hidden]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    return os.fspath(path)


def _has_quantizer(weight_type: str) -> bool:
    from . import quantize
    try:
        quantize(np.zeros((1, 256), dtype=np.float32), weight_type)
        return True
    except (ValueError, TypeError):
        return False
