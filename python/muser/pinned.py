"""The pinned route: the head computed by llama.cpp's own ggml kernels.

``Head.load(path, route="pinned")`` builds a :class:`PinnedHead`. It builds the
graph llama.cpp builds for the architecture (``src/models/<arch>.cpp`` and
``llm_graph_context::build_norm`` / ``build_lora_mm`` in llama.cpp)::

    rms_norm(eps) -> mul(gamma)               (norm = "rms")
    norm(eps) -> mul(gamma) [-> add(beta)]    (norm = "layer": command-r, cohere2)
    -> mul_mat(W, normed) [-> add(bias)]
    -> scale(logit_scale)                     (logit_scale_mode = "multiply": command-r, cohere2, muse-glimmer)
    -> scale(1/logit_scale)                   (logit_scale_mode = "divide": granite; 1/s rounded to f32 as in C)
    -> scale(1/cap) -> tanh -> scale(cap)     (softcap > 0: gemma2/3, muse-glimmer)

and runs it on ggml's CPU backend through :mod:`muser._ggml`, or (``backend=``,
e.g. ``"Metal"``) on a backend of ggml's registry through the ggml-backend API:
the weights copied once into a buffer of that backend, each call's graph
allocated there (``ggml_backend_alloc_ctx_tensors``), the hidden rows copied
in and the logits copied out. ``Head.load(device="metal", route="pinned")``
takes that path: ggml-metal's own kernels. On the CPU path ``W`` is a ggml
tensor whose data pointer is the GGUF file's own bytes (no copy); the logits
land in a numpy array the call returns. The epilogue uses ggml's ``*_inplace``
scale/tanh variants (the same CPU kernels on the same values, so the same
bytes as llama.cpp's out-of-place nodes) to avoid four logits-sized buffers.

What llama.cpp's CPU backend computes for ``mul_mat`` depends on the batch:
for one row it quantizes the activations to the weight type's ``vec_dot_type``
(Q8_K for K-quants, Q8_0 for Q8_0) and calls ``vec_dot``; for more rows it may
take the tiled K-quant path (>= 8 rows) or llamafile's sgemm. A PinnedHead
called on ``t`` rows computes what llama.cpp computes for a ubatch of ``t``
output rows; ``chunk_rows`` bounds memory at the price of fixing that batch.

:func:`capture_llama_cpp` runs a whole model through llama-cpp-python and
captures, for every position, the final hidden state before the final norm
and llama.cpp's logits: the real-model rung of the parity ladder.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from . import _ggml
from ._core import Error

__all__ = ["PinnedHead", "capture_llama_cpp", "Capture", "ggml_version", "PARITY_PROMPTS"]

#: The varied prompts the real-model parity test and bench/parity_real_model.py run
#: (prose, code, numbers, Spanish, Japanese, HTML, SQL, a question).
PARITY_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "1, 1, 2, 3, 5, 8, 13, 21,",
    "Once upon a time, in a kingdom far away, there lived a",
    "El perro corre por el parque y",
    "Q: What is 17 times 23?\nA:",
    "<html><body><h1>Hello",
    "The mitochondria is the powerhouse of the",
    "日本の首都は",
    "SELECT name, COUNT(*) FROM users GROUP BY",
)


def ggml_version() -> str:
    """The ggml the pinned route runs against: version, commit, llama-cpp-python version."""
    return _ggml.lib().version_string


def _get(spec: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in spec and spec[k] is not None:
            return spec[k]
    return default


def _tensor_entry(gguf_file: Any, name: str) -> Any:
    getter = getattr(gguf_file, "tensor", None)
    if callable(getter):
        try:
            return getter(name)
        except Exception as e:  # muser.GGUFFile raises a GGUFError/KeyError naming the tensor
            raise Error(f"{getattr(gguf_file, 'path', 'GGUF file')}: no tensor named {name!r} ({e})") from e
    tensors = gguf_file.tensors
    if isinstance(tensors, Mapping):
        if name in tensors:
            return tensors[name]
    else:
        for t in tensors:
            if getattr(t, "name", None) == name:
                return t
    raise Error(f"{getattr(gguf_file, 'path', 'GGUF file')}: no tensor named {name!r}")


def _entry_type(entry: Any) -> Any:
    for attr in ("type_id", "type", "ggml_type", "dtype"):
        v = getattr(entry, attr, None)
        if v is not None:
            return v
    raise Error(f"cannot read the ggml type of tensor {getattr(entry, 'name', entry)!r}")


def _f32_vector(g: _ggml.GGML, gguf_file: Any, name: str, n: int) -> np.ndarray:
    """A 1-d f32 tensor from the file: a zero-copy view when stored as F32, else via ggml's to_float."""
    entry = _tensor_entry(gguf_file, name)
    t = g.type(_entry_type(entry))
    raw = np.asarray(gguf_file.tensor_bytes(name)).reshape(-1)
    if raw.size != n // t.blck_size * t.type_size or n % t.blck_size:
        raise Error(f"tensor {name!r}: expected {n} {t.name} elements, got {raw.size} bytes")
    if t.id == 0:
        return raw.view(np.float32)
    return g.to_float(raw, t.id, n)


class PinnedHead:
    """The head as llama.cpp computes it, with ggml's kernels (CPU backend).

    Args:
        gguf_file: an open :class:`muser.GGUFFile` (kept alive: the weight is used in place).
        spec: ``Head.spec.to_dict()``: ``hidden_size``, ``vocab_size``, ``norm``
            ("rms"/"layer"), ``eps``, ``norm_weight``, optional ``norm_bias``,
            ``output_weight``, optional ``output_bias``, ``logit_scale``,
            ``logit_scale_mode`` ("none"/"multiply"/"divide"), ``softcap`` (0 = none).
        threads: ggml compute threads; None = every CPU this process may use
            (or ``$MUSER_THREADS``).
        chunk_rows: compute at most this many rows per ggml graph (None = all
            rows in one graph, as llama.cpp does for one ubatch).
        backend: None (ggml-cpu's graph compute on numpy buffers, the weight
            used in place), or the name of a ggml backend registry entry
            (``"Metal"``; ``"CPU"`` runs the same backend path on the CPU).

    Raises:
        muser.Error: llama-cpp-python is not installed, its ggml lacks a needed
            symbol or the named backend, or the spec names a tensor/type the
            file does not have.

    Calls are safe from several threads (each call builds its own graph).
    """

    def __init__(self, gguf_file: Any, spec: Mapping[str, Any], threads: int | None = None,
                 *, chunk_rows: int | None = None, backend: str | None = None):
        g = _ggml.lib()
        self._g = g
        self._file = gguf_file
        self.spec = dict(spec)
        # None or 0: every CPU this process may use (muser.Head's convention for 0)
        self.threads = _ggml._threads(threads) if threads else None
        if chunk_rows is not None and int(chunk_rows) < 1:
            raise Error(f"chunk_rows must be >= 1; got {chunk_rows}")
        self.chunk_rows = chunk_rows
        self.ggml_version: str = g.version_string
        self.ggml_info: dict[str, Any] = g.describe()

        self.hidden_size = int(_get(spec, "hidden_size", "hidden", "n_embd"))
        self.vocab_size = int(_get(spec, "vocab_size", "vocab", "n_vocab"))
        H, V = self.hidden_size, self.vocab_size
        self.norm = str(_get(spec, "norm", default="rms")).lower()
        if self.norm not in ("rms", "layer"):
            raise Error(f"spec norm must be 'rms' or 'layer'; got {self.norm!r}")
        self.eps = float(np.float32(_get(spec, "eps", default=1e-5)))

        # weights, used in place
        wname = _get(spec, "output_weight", default="output.weight")
        entry = _tensor_entry(gguf_file, wname)
        self.weight_type = g.type(_entry_type(entry))
        wt = self.weight_type
        if H % wt.blck_size:
            raise Error(f"{wname}: hidden size {H} is not a whole number of {wt.name} blocks ({wt.blck_size})")
        row_bytes = H // wt.blck_size * wt.type_size
        raw = np.asarray(gguf_file.tensor_bytes(wname))
        if raw.dtype != np.uint8 or raw.size != V * row_bytes:
            raise Error(f"{wname}: expected {V} rows x {row_bytes} bytes of {wt.name} "
                        f"({V * row_bytes} bytes); the file holds {raw.size}")
        self._w = raw.reshape(V, row_bytes)
        if not self._w.flags.c_contiguous:
            raise Error(f"{wname}: tensor bytes are not contiguous")
        self.weight_name = wname

        def opt(key: str) -> str | None:
            v = _get(spec, key)
            return v if v else None

        gname, bname, obname = opt("norm_weight"), opt("norm_bias"), opt("output_bias")
        self._gamma = _f32_vector(g, gguf_file, gname, H) if gname else None
        self._beta = _f32_vector(g, gguf_file, bname, H) if bname else None
        self._obias = _f32_vector(g, gguf_file, obname, V) if obname else None

        # epilogue constants, rounded to f32 exactly as llama.cpp's C does
        mode = str(_get(spec, "logit_scale_mode", "scale_mode", default="none")).lower()
        s = np.float32(_get(spec, "logit_scale", default=1.0))
        if mode == "multiply":
            self._scale: np.float32 | None = s
        elif mode == "divide":
            if s == 0:
                raise Error("logit_scale_mode 'divide' with logit_scale 0")
            self._scale = np.float32(np.float32(1.0) / s)
        elif mode == "none":
            self._scale = None
        else:
            raise Error(f"spec logit_scale_mode must be none/multiply/divide; got {mode!r}")
        self.logit_scale_mode = mode
        cap = np.float32(_get(spec, "softcap", default=0.0))
        self._cap = cap if cap > 0 else None

        self.backend: str | None = None
        self._backend: _ggml.Backend | None = None
        self._resident: _ggml.BackendTensors | None = None
        if backend is not None:
            self._backend = _ggml.Backend(g, str(backend), self.threads)
            self.backend = self._backend.name
            res = _ggml.BackendTensors(self._backend)
            res.add(wname, self._w, wt.id, H)
            for key, arr in (("output_norm.weight", self._gamma), ("output_norm.bias", self._beta),
                             ("output.bias", self._obias)):
                if arr is not None:
                    res.add(key, arr)
            res.upload()
            self._resident = res

    # ------------------------------------------------------------------
    def _build(self, gb: _ggml.GraphBuilder, hidden: np.ndarray):
        H = self.hidden_size
        x = gb.leaf_f32(hidden, "inp_hidden")
        cur = gb.rms_norm(x, self.eps) if self.norm == "rms" else gb.norm(x, self.eps)
        if self._gamma is not None:
            cur = gb.mul(cur, gb.leaf_f32(self._gamma, "output_norm.weight"))
        if self._beta is not None:
            cur = gb.add(cur, gb.leaf_f32(self._beta, "output_norm.bias"))
        gb.g.ggml_set_name(cur, b"result_norm")
        w = gb.leaf_quant(self._w, self.weight_type.id, H, self.weight_name)
        cur = gb.mul_mat(w, cur)
        if self._obias is not None:
            cur = gb.add(cur, gb.leaf_f32(self._obias, "output.bias"))
        if self._scale is not None:
            cur = gb.scale(cur, float(self._scale), inplace=True)
        if self._cap is not None:
            cur = gb.scale(cur, float(np.float32(np.float32(1.0) / self._cap)), inplace=True)
            cur = gb.tanh(cur, inplace=True)
            cur = gb.scale(cur, float(self._cap), inplace=True)
        gb.g.ggml_set_name(cur, b"result_output")
        return cur

    def graph_ops(self) -> list[str]:
        """The ggml op names of the graph this head runs, in order (e.g. RMS_NORM, MUL, MUL_MAT, ...)."""
        with _ggml.GraphBuilder(self._g) as gb:
            return gb.node_ops(self._build(gb, np.zeros((1, self.hidden_size), np.float32)))

    def __call__(self, hidden: np.ndarray) -> np.ndarray:
        """Logits for ``hidden`` float32 [t, H] (or [H]) -> new float32 [t, V] (or [V]).

        NaN/Inf in ``hidden`` propagate as ggml propagates them (no check: this
        is the comparator, it must do what llama.cpp does).
        """
        h = np.asarray(hidden)
        if h.dtype != np.float32:
            raise Error(f"hidden must be float32; got {h.dtype}")
        one = h.ndim == 1
        if one:
            h = h[None, :]
        if h.ndim != 2 or h.shape[1] != self.hidden_size:
            raise Error(f"hidden must be [t, {self.hidden_size}] (or [{self.hidden_size}]); got {hidden.shape}")
        h = np.ascontiguousarray(h)
        t = h.shape[0]
        if t == 0:
            out = np.empty((0, self.vocab_size), np.float32)
        elif self.chunk_rows is None or t <= self.chunk_rows:
            out = self._run(h)
        else:
            out = np.empty((t, self.vocab_size), np.float32)
            for s, e in _ggml.iter_chunks(t, self.chunk_rows):
                out[s:e] = self._run(h[s:e])
        return out[0] if one else out

    def _run(self, h: np.ndarray) -> np.ndarray:
        if self._backend is not None:
            with _ggml.BackendGraphBuilder(self._backend, self._resident.tensors) as gb:
                return gb.compute(self._build(gb, h))
        with _ggml.GraphBuilder(self._g) as gb:
            return gb.compute(self._build(gb, h), self.threads)

    def close(self) -> None:
        """Free the backend's buffer and the backend (``backend=`` only; the CPU path holds none)."""
        if self._resident is not None:
            self._resident.close()
            self._resident = None
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def __repr__(self) -> str:
        on = f", backend={self.backend}" if self.backend else ""
        return (f"PinnedHead({self.weight_name} {self.weight_type.name} [{self.vocab_size} x {self.hidden_size}], "
                f"norm={self.norm}, scale={self._scale}, softcap={self._cap}{on}, {self.ggml_version})")


# ---------------------------------------------------------------------------
# capturing a real model's final hidden states through llama-cpp-python

@dataclass
class Capture:
    """What :func:`capture_llama_cpp` returns: per position, the hidden state and llama.cpp's logits.

    Attributes:
        hidden: float32 [N, H], the last layer's output (``l_out-<n_layer-1>``), before the final norm.
        logits: float32 [N, V], llama.cpp's logits for the same positions.
        prompt_index: int32 [N], which prompt each row came from.
        position: int32 [N], the token position within its prompt.
        tokens: int32 [N], the token at that position.
        info: versions, model path, tensor name, ubatch sizes.
    """

    hidden: np.ndarray
    logits: np.ndarray
    prompt_index: np.ndarray
    position: np.ndarray
    tokens: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str) -> None:
        """Write to an ``.npz`` (info as a JSON string)."""
        import json
        np.savez(path, hidden=self.hidden, logits=self.logits, prompt_index=self.prompt_index,
                 position=self.position, tokens=self.tokens, info=np.array(json.dumps(self.info)))

    @classmethod
    def load(cls, path: str) -> "Capture":
        """Read what :meth:`save` wrote."""
        import json
        z = np.load(path, allow_pickle=False)
        return cls(z["hidden"], z["logits"], z["prompt_index"], z["position"], z["tokens"],
                   json.loads(str(z["info"])))


_LOG_CB: Any = None  # keeps the ctypes log callback alive for the life of the process


def _silence_llama_log(lc: Any) -> None:
    global _LOG_CB
    if _LOG_CB is None and hasattr(lc, "llama_log_set"):
        _LOG_CB = lc.llama_log_callback(lambda level, text, user: None)
        lc.llama_log_set(_LOG_CB, None)


def capture_llama_cpp(model_path: str, prompts: Sequence[str], *, n_threads: int | None = None,
                      n_ctx: int = 256, layer_tensor: str | None = None,
                      extra_buffers: bool = False, verbose: bool = False) -> Capture:
    """Run llama.cpp (through llama-cpp-python's C API) on each prompt with logits for every
    position, capturing each position's final hidden state before the final norm.

    The hidden state comes from ggml's eval callback (``cb_eval`` in the context
    params): the tensor llama.cpp names ``l_out-<n_layer-1>`` (override with
    ``layer_tensor``) is copied when computed. Each prompt is one batch (one
    ubatch: ``n_ubatch = n_batch = n_ctx``), all positions output.

    ``verbose=False`` silences llama.cpp's log for the rest of the process.

    ``extra_buffers=False`` (the default) sets ``use_extra_bufts = false`` in the
    model params: llama.cpp then keeps weights in plain CPU buffers and runs the
    same ggml-cpu ``mul_mat`` kernels the pinned route runs, instead of
    repacked (CPU_REPACK) or AMX copies of them. (On the machine muser was
    developed on, ggml's AMX ``mul_mat`` of a native build crashed with SIGSEGV.)

    Raises:
        muser.Error: llama-cpp-python is missing, the model does not load, a prompt is too long,
            or the callback never saw the tensor.
    """
    try:
        import llama_cpp as lc
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise Error(f"capture_llama_cpp needs llama-cpp-python: {e}") from e
    g = _ggml.lib()
    if not verbose:
        _silence_llama_log(lc)
    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    if hasattr(mparams, "use_extra_bufts"):
        mparams.use_extra_bufts = bool(extra_buffers)
    elif extra_buffers is False:
        raise Error("this llama-cpp-python has no use_extra_bufts model parameter")
    model = lc.llama_model_load_from_file(str(model_path).encode(), mparams)
    if not model:
        raise Error(f"llama.cpp could not load {model_path}")
    try:
        n_layer = lc.llama_model_n_layer(model)
        n_embd = lc.llama_model_n_embd(model)
        vocab = lc.llama_model_get_vocab(model)
        n_vocab = lc.llama_vocab_n_tokens(vocab)
        want = (layer_tensor or f"l_out-{n_layer - 1}").encode()
        grabbed: list[np.ndarray] = []
        bad: list[str] = []

        def cb(t_ptr: int, ask: bool, _user: int) -> bool:
            t = ctypes.cast(t_ptr, _ggml.TensorP).contents
            if t.name != want:
                return False
            if ask:
                return True
            rows = int(t.ne[1] * t.ne[2] * t.ne[3])
            if t.type != 0 or t.ne[0] != n_embd or t.nb[0] != 4 or t.nb[1] != 4 * n_embd:
                bad.append(f"{want.decode()} is not a contiguous f32 [n_tokens, {n_embd}] tensor "
                           f"(type {t.type}, ne {list(t.ne)}, nb {list(t.nb)})")
                return True
            out = np.empty((rows, n_embd), np.float32)
            # through the backend, so a GPU-resident tensor would be copied too
            g.ggml_backend_tensor_get(t_ptr, out.ctypes.data, 0, out.nbytes)
            grabbed.append(out)
            return True

        cb_c = lc.ggml_backend_sched_eval_callback(cb)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_ctx
        cparams.n_ubatch = n_ctx
        threads = _ggml._threads(n_threads)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.cb_eval = cb_c
        cparams.cb_eval_user_data = None
        if hasattr(cparams, "embeddings"):
            cparams.embeddings = False
        hidden, logits, pidx, pos, toks, ubatches = [], [], [], [], [], []
        ctx = lc.llama_init_from_model(model, cparams)
        if not ctx:
            raise Error("llama_init_from_model failed")
        try:
            for i, prompt in enumerate(prompts):
                # each prompt starts from an empty KV cache at position 0
                lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
                data = prompt.encode()
                tok = (lc.llama_token * (len(data) + 8))()
                n = lc.llama_tokenize(vocab, data, len(data), tok, len(tok), True, False)
                if n <= 0 or n > n_ctx:
                    raise Error(f"prompt {i}: {n} tokens (need 1..{n_ctx})")
                batch = lc.llama_batch_init(n, 0, 1)
                try:
                    for j in range(n):
                        batch.token[j] = tok[j]
                        batch.pos[j] = j
                        batch.n_seq_id[j] = 1
                        batch.seq_id[j][0] = 0
                        batch.logits[j] = True
                    batch.n_tokens = n
                    grabbed.clear()
                    rc = lc.llama_decode(ctx, batch)
                    if rc != 0:
                        raise Error(f"llama_decode returned {rc} on prompt {i}")
                finally:
                    lc.llama_batch_free(batch)
                if bad:
                    raise Error(bad[0])
                if not grabbed:
                    raise Error(f"the eval callback never saw {want.decode()!r}")
                h = np.concatenate(grabbed, axis=0)
                if h.shape[0] != n:
                    raise Error(f"{want.decode()}: {h.shape[0]} rows for {n} tokens")
                lp = lc.llama_get_logits(ctx)
                lg = np.ctypeslib.as_array(lp, shape=(n, n_vocab)).copy()
                hidden.append(h)
                logits.append(lg)
                pidx += [i] * n
                pos += list(range(n))
                toks += [tok[j] for j in range(n)]
                ubatches.append(n)
        finally:
            lc.llama_free(ctx)
    finally:
        lc.llama_model_free(model)
    info = {
        "model": str(model_path), "tensor": want.decode(), "n_layer": n_layer,
        "n_embd": n_embd, "n_vocab": n_vocab, "ubatch_rows": ubatches,
        "threads": threads, "extra_buffers": bool(extra_buffers), **g.describe(),
    }
    return Capture(np.concatenate(hidden), np.concatenate(logits), np.asarray(pidx, np.int32),
                   np.asarray(pos, np.int32), np.asarray(toks, np.int32), info)
