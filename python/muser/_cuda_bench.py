"""The CUDA head benchmark: muser's routes against the GPU's read limit and
PyTorch's bf16 ``F.linear``, all measured in one run on one GPU.

The limit is a read-only kernel streaming a buffer the size of the LM-head
weight (muser's own, ``_core.cuda_read_bandwidth``). Each route (with f32
activations, and with ``acts="q8"``: int8 activations and integer dot
products on the tensor cores, the quantization booked under lm_head) is timed
three ways: *route* time, CUDA events around the route's graph as a call
launches it (the device time of the whole head, the host's launch latency
included since the GPU is idle when the start event is recorded); *GPU*, the
same events with each run enqueued behind a kernel that holds the stream
(nvbench's method: no host latency; the read limit is also measured this
way, for the *x GPU limit* ratio); *nodes*, the profile --
each node between its own events (``lm_head`` is the matvec alone; events
between nodes keep a node from overlapping the next, so the sum exceeds the
route time); and *call* time, the wall clock of
``head(hidden_on_gpu, on_device=True)`` including Python, the launch and the
final synchronize. Medians over ``--reps`` after ``--warmup``.

Entry points: ``python bench/cuda_head.py`` and :func:`main` (for a CLI
wrapper such as ``python -m muser bench --device cuda``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Optional

import numpy as np

from ._args import positive_int, positive_ints
from ._bench_util import median_call_seconds

SEED_SHAPE = dict(hidden=6656, vocab=202048, weight_type="Q5_K")  # the seed's head, 924,571,648 bytes
SWEEP_TOKENS = "1,2,4,8,16,32,64,128,256"  # --tokens sweep: decoding, speculative checks, batches, scoring

# Compute bounds of a batch (2 V H t operations), from the H200's (H100 SXM's) data-sheet
# peaks: dense int8 on the tensor cores (wgmma; mma.sync reaches less) and FP32 FMA
# (132 SMs x 128 lanes x 2 x 1.98 GHz). The exact-f32 routes are FMA bound from t of a few on.
INT8_TENSOR_PEAK_OPS = 1979e12
FP32_FMA_PEAK_FLOPS = 66.9e12


def compute_bound_s(acts: str, vocab: int, hidden: int, t: int) -> float:
    """Seconds the batch's multiply-adds take at the peak of the units that run them."""
    return 2.0 * vocab * hidden * t / (INT8_TENSOR_PEAK_OPS if acts == "q8" else FP32_FMA_PEAK_FLOPS)


def write_random_head(path: str, hidden: int, vocab: int, weight_type: str, seed: int = 0,
                      progress: Any = None) -> str:
    """A Muse Glimmer-style head with random well-formed blocks (fast: no quantization).

    Random quants and small f16 scales are fine for timing (never zeros, which
    can run faster than real data); the file is fixtures.write_head_gguf's.
    """
    from .fixtures import write_head_gguf

    return write_head_gguf(path, hidden=hidden, vocab=vocab, weight_type=weight_type, seed=seed,
                           random_quants=True, progress=progress)


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def time_route(head: Any, x_host: np.ndarray, x_dev: Any, warmup: int, reps: int) -> dict:
    """Route time (the call's graph), node times from profile(), call time on device input."""
    from . import _cuda

    route = _median(_cuda.route_seconds(head, x_dev, reps))
    route_held = _median(_cuda.route_seconds(head, x_dev, reps, held=True))
    for _ in range(warmup):
        head.profile(x_host)
        head(x_dev, on_device=True)
    totals, matvec, per_label = [], [], {}
    for _ in range(reps):
        prof = head.profile(x_host)
        totals.append(sum(p.seconds for p in prof))
        for p in prof:
            per_label.setdefault(p.label, []).append(p.seconds)
        # "lm_head", or "lm_head+softcap" where the matvec stores through the soft cap
        matvec.append(next(p.seconds for p in prof if "lm_head" in p.label.split("+")))
    calls = []
    for _ in range(reps):
        s = time.perf_counter()
        head(x_dev, on_device=True)
        calls.append(time.perf_counter() - s)
    import torch

    def per_call(fn) -> float:  # what a caller waits, by the host clock
        return median_call_seconds(fn, reps, warmup)

    return {"route_s": route, "route_held_s": route_held, "nodes_sum_s": _median(totals), "lm_head_s": _median(matvec),
            "call_s": _median(calls), "nodes": {k: _median(v) for k, v in per_label.items()},
            "call_sync_s": per_call(lambda: (head(x_dev, on_device=True), torch.cuda.synchronize())),
            "argmax_s": per_call(lambda: head.argmax(x_dev)),
            "topk50_s": per_call(lambda: head.topk(x_dev, min(50, head.spec.vocab_size)))}


def time_torch_linear(hidden: int, vocab: int, t: int, warmup: int, reps: int,
                      w: Any = None) -> Optional[dict]:
    """torch bf16 F.linear, and F.linear + the soft cap (f32 tanh), between CUDA events; None without torch.

    Returns {"linear_s", "capped_s", "capped_call_s"} (the last by the host clock with a synchronize).
    """
    try:
        import torch
    except ImportError:
        return None
    g = torch.Generator(device="cuda").manual_seed(0)
    if w is None:
        w = torch.randn((vocab, hidden), device="cuda", dtype=torch.bfloat16, generator=g)
    x = torch.randn((t, hidden), device="cuda", dtype=torch.bfloat16, generator=g)
    f = torch.nn.functional.linear
    scale, cap = 0.196116, 20.0

    def capped():
        return torch.tanh(f(x, w).float() * (scale / cap)) * cap

    def events(fn):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e-3)
        return _median(times)

    out = {"linear_s": events(lambda: f(x, w)), "capped_s": events(capped)}
    calls = []
    for _ in range(reps):
        s = time.perf_counter()
        capped()
        torch.cuda.synchronize()
        calls.append(time.perf_counter() - s)
    out["capped_call_s"] = _median(calls)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=positive_int, default=SEED_SHAPE["hidden"])
    p.add_argument("--vocab", type=positive_int, default=SEED_SHAPE["vocab"])
    p.add_argument("--weight-type", default=SEED_SHAPE["weight_type"])
    p.add_argument("--routes", default="graph,fused,canonical")
    p.add_argument("--acts", default="f32,q8", help="activation modes: f32, q8 or both")
    p.add_argument("--tokens", default="1,8", type=positive_ints, help=f"batch sizes, e.g. the sweep {SWEEP_TOKENS}")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=positive_int, default=30)
    p.add_argument("--file", help="use (or keep) this GGUF instead of a temporary one")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' for stdout)")
    args = p.parse_args(argv)

    import muser
    from muser import _core

    if not muser.build_info()["cuda"] or _core.cuda_device_count() == 0:
        print("muser bench --device cuda: " + (_core.cuda_no_device_reason() or "no CUDA backend"), file=sys.stderr)
        return 2
    ordinal = int(args.device.split(":")[1]) if ":" in args.device else 0
    tmp = None
    path = args.file
    if not path or not os.path.exists(path):
        if not path:
            tmp = tempfile.TemporaryDirectory(prefix="muser-cuda-bench-")
            path = os.path.join(tmp.name, "head.gguf")
        s = time.perf_counter()
        write_random_head(path, args.hidden, args.vocab, args.weight_type)
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:,.1f} MB) in {time.perf_counter() - s:.1f} s",
              file=sys.stderr)

    desc = _core.cuda_device_description(ordinal)
    results: dict = {"device": desc, "shape": [args.vocab, args.hidden], "weight_type": args.weight_type,
                     "warmup": args.warmup, "reps": args.reps, "routes": []}
    heads = {(r, a): muser.Head.load(path, device=args.device, route=r, acts=a)
             for a in args.acts.split(",") for r in args.routes.split(",")}
    wbytes = next(iter(heads.values())).weight_bytes
    results["weight_bytes"] = wbytes
    limit = _median(_core.cuda_read_bandwidth(wbytes, args.reps, ordinal))
    results["read_limit_s"] = limit
    limit_held = _median(_core.cuda_read_bandwidth(wbytes, args.reps, ordinal, True))
    results["read_limit_held_s"] = limit_held

    import torch  # the device hidden states (torch is on the device machines; cupy would do too)

    rng = np.random.default_rng(1)
    for t in args.tokens:
        x = rng.standard_normal((t, args.hidden), dtype=np.float32)
        xd = torch.from_numpy(x).to(f"cuda:{ordinal}")
        for (route, acts), head in heads.items():
            r = time_route(head, x, xd, args.warmup, args.reps)
            r.update(route=route, acts=acts, t=t)
            results["routes"].append(r)
    # the limit again after the routes: the clock and the memory are warm by now
    limit2 = _median(_core.cuda_read_bandwidth(wbytes, args.reps, ordinal))
    results["read_limit_after_s"] = limit2
    del heads
    if not args.no_torch:
        results["torch_bf16"] = {}
        try:
            import torch

            w = torch.randn((args.vocab, args.hidden), device="cuda", dtype=torch.bfloat16)
            for t in args.tokens:  # keyed by the text of t, as the JSON has it
                results["torch_bf16"][str(t)] = time_torch_linear(args.hidden, args.vocab, t, args.warmup,
                                                             args.reps, w)
            del w
            torch.cuda.empty_cache()
        except ImportError:
            pass

    us = lambda s: f"{s * 1e6:9.1f}"  # noqa: E731
    print(f"muser CUDA head bench: {desc}")
    print(f"LM head {args.weight_type} [{args.vocab:,} x {args.hidden:,}] = {wbytes:,} bytes; "
          f"medians of {args.reps} after {args.warmup} warm-ups")
    print(f"read limit: {us(limit)} us ({wbytes / limit / 1e9:,.0f} GB/s); after the routes: {us(limit2)} us; "
          f"GPU (held): {us(limit_held)} us")
    print(f"{'route':<10} {'acts':<4} {'t':>3} {'lm_head us':>11} {'x limit':>8} {'route us':>10} {'x limit':>8} "
          f"{'GPU us':>9} {'x GPU limit':>11} {'nodes us':>10} {'call us':>10}")
    for r in results["routes"]:
        print(f"{r['route']:<10} {r['acts']:<4} {r['t']:>3} {us(r['lm_head_s']):>11} {r['lm_head_s'] / limit:>8.3f} "
              f"{us(r['route_s']):>10} {r['route_s'] / limit:>8.3f} {us(r['route_held_s']):>9} "
              f"{r['route_held_s'] / limit_held:>11.3f} {us(r['nodes_sum_s']):>10} {us(r['call_s']):>10}")
    torch_t = results.get("torch_bf16") or {}
    for t, r in torch_t.items():
        if r is not None:
            print(f"torch bf16 F.linear t={t}: {us(r['linear_s'])} us ({r['linear_s'] / limit:.3f} x the limit; reads "
                  f"{2 * args.vocab * args.hidden:,} bytes of bf16 weight); + cap {us(r['capped_s'])} us, "
                  f"per call {us(r['capped_call_s'])} us")
    # the batch view: GPU time (held) and per-call time against the read limit and the compute bound
    print(f"\nbatch sweep: GPU = route_seconds(held=True), call = head(x_gpu, on_device=True) by the host clock; "
          f"bound = 2 V H t at {INT8_TENSOR_PEAK_OPS / 1e12:,.0f} int8 TOPS (q8) or "
          f"{FP32_FMA_PEAK_FLOPS / 1e12:.1f} FP32 TFLOP/s (f32)")
    print(f"{'route':<10} {'acts':<4} {'t':>3} {'GPU us':>9} {'x read':>7} {'bound us':>9} {'x bound':>8} "
          f"{'call us':>9} {'torch+cap us':>12}")
    for r in results["routes"]:
        bound = compute_bound_s(r["acts"], args.vocab, args.hidden, r["t"])
        tr = torch_t.get(str(r["t"]))
        print(f"{r['route']:<10} {r['acts']:<4} {r['t']:>3} {us(r['route_held_s'])} "
              f"{r['route_held_s'] / limit_held:>7.3f} {us(bound)} {r['route_held_s'] / bound:>8.2f} "
              f"{us(r['call_s'])} {us(tr['capped_s']) if tr else '-':>12}")
    # per call: what a caller waits beyond the route's GPU time (issue 14's goal at t = 1: <= 15 us for the
    # call + synchronize and argmax, <= 25 us for top-50)
    print("\nper call (host clock) over the route's GPU time (route_seconds held): "
          "call = head(x_gpu, on_device=True) + torch.cuda.synchronize()")
    print(f"{'route':<10} {'acts':<4} {'t':>3} {'GPU us':>9} {'call us':>9} {'over':>7} {'argmax us':>10} {'over':>7} "
          f"{'topk50 us':>10} {'over':>7}")
    for r in results["routes"]:
        g = r["route_held_s"]
        print(f"{r['route']:<10} {r['acts']:<4} {r['t']:>3} {us(g)} {us(r['call_sync_s'])} "
              f"{(r['call_sync_s'] - g) * 1e6:7.1f} {us(r['argmax_s']):>10} {(r['argmax_s'] - g) * 1e6:7.1f} "
              f"{us(r['topk50_s']):>10} {(r['topk50_s'] - g) * 1e6:7.1f}")
    if args.json:
        from ._bench_util import write_json

        write_json(results, args.json, indent=2)
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
