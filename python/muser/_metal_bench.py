"""The Metal head benchmark: muser's routes against the GPU's read limit, all
measured in one run on one Metal device -- the CUDA bench's twin
(muser/_cuda_bench.py).

The limit is a read-only kernel streaming a buffer the size of the LM-head
weight (``read_bandwidth_u32`` in src/metal/kernels/bandwidth.metal, through
the project's kernel ABI, timed through the backend:
``_core.metal_read_bandwidth``, each read one command buffer's GPU time).
Each route with f32 and ``acts="q8"`` activations at each t is timed two
ways: *nodes*, ``head.profile()`` -- each step its own command buffer, its
GPU time (``lm_head`` is the matvec alone); and *call*, the wall clock of
``head(hidden)`` (Python, encoding, the wait; the logits are host memory
already on unified memory). ``route="pinned"`` (ggml-metal's own kernels,
when llama-cpp-python was built with Metal) has call time only. Medians over
``--reps`` after ``--warmup``. Ratios are against the read limit.

On the test-only Linux emulator (tests/metal_device/run_emulated.sh) the
script runs, to prove it works, on a small head (``--hidden 256 --vocab 2048``):
the emulator runs every GPU thread on the CPU (~1 us each), so its times
mean nothing about any GPU and are marked so in the output and the JSON.

Entry points: ``python bench/metal_head.py`` and :func:`main`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Optional

import numpy as np

from ._cuda_bench import SEED_SHAPE, _median, write_random_head

EMULATOR_NOTE = ("EMULATOR: these times come from the test-only Metal emulator (CPU fibers, ~1 us per GPU "
                 "thread); they mean nothing about any GPU -- this run only proves the script works")


def unavailable_reason() -> Optional[str]:
    """Why this build cannot run the Metal bench, or None."""
    import muser

    if not muser.build_info()["metal"]:
        return "this build of muser has no Metal backend (Apple, or MUSER_METAL_EMULATOR=ON on Linux)"
    from . import _core

    if not hasattr(_core, "metal_read_bandwidth"):
        return "this build of muser has no _core.metal_read_bandwidth"
    return None


def time_route(head: Any, x: np.ndarray, warmup: int, reps: int, profile: bool = True) -> dict:
    """Node times from profile() (GPU time per step) and the call's wall time."""
    for _ in range(warmup):
        if profile:
            head.profile(x)
        head(x)
    r: dict = {}
    if profile:
        totals, matvec, per_label = [], [], {}
        for _ in range(reps):
            prof = head.profile(x)
            totals.append(sum(p.seconds for p in prof))
            for p in prof:
                per_label.setdefault(p.label, []).append(p.seconds)
            # the step holding the matvec (on fused/canonical the epilogue is fused into it)
            matvec.append(sum(p.seconds for p in prof if "lm_head" in p.label.split("+")))
        r.update(nodes_sum_s=_median(totals), lm_head_s=_median(matvec),
                 nodes={k: _median(v) for k, v in per_label.items()})
    calls = []
    for _ in range(reps):
        s = time.perf_counter()
        head(x)
        calls.append(time.perf_counter() - s)
    r["call_s"] = _median(calls)
    return r


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=SEED_SHAPE["hidden"])
    p.add_argument("--vocab", type=int, default=SEED_SHAPE["vocab"])
    p.add_argument("--weight-type", default=SEED_SHAPE["weight_type"])
    p.add_argument("--routes", default="graph,fused,canonical", help="comma list; 'pinned' adds ggml-metal")
    p.add_argument("--acts", default="f32,q8", help="activation modes: f32, q8 or both")
    p.add_argument("--tokens", default="1,8")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--file", help="use (or keep) this GGUF instead of a temporary one")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' for stdout)")
    args = p.parse_args(argv)

    reason = unavailable_reason()
    if reason:
        print(f"muser bench --device metal: {reason}", file=sys.stderr)
        return 2
    import muser
    from muser import _core

    emulated = hasattr(_core, "_metal_emu_reset")
    if emulated:
        print(EMULATOR_NOTE, file=sys.stderr)
    tmp = None
    path = args.file
    if not path or not os.path.exists(path):
        if not path:
            tmp = tempfile.TemporaryDirectory(prefix="muser-metal-bench-")
            path = os.path.join(tmp.name, "head.gguf")
        s = time.perf_counter()
        write_random_head(path, args.hidden, args.vocab, args.weight_type)
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:,.1f} MB) in {time.perf_counter() - s:.1f} s",
              file=sys.stderr)

    results: dict = {"device": "metal", "emulated": emulated, "shape": [args.vocab, args.hidden],
                     "weight_type": args.weight_type, "warmup": args.warmup, "reps": args.reps, "routes": [],
                     "skipped": []}
    if emulated:
        results["note"] = EMULATOR_NOTE
    heads: dict = {}
    for a in args.acts.split(","):
        for r in args.routes.split(","):
            if r == "pinned" and a != "f32":
                continue  # ggml chooses its own activation handling
            try:
                heads[(r, a)] = muser.Head.load(path, device="metal", route=r, acts=a)
            except muser.Error as e:  # e.g. pinned without a Metal libggml
                results["skipped"].append({"route": r, "acts": a, "reason": str(e)})
                print(f"skipping {r}/{a}: {e}", file=sys.stderr)
    if not heads:
        print("muser bench --device metal: no route could be loaded", file=sys.stderr)
        return 2
    wbytes = next(iter(heads.values())).weight_bytes
    results["weight_bytes"] = wbytes
    limit = _median(_core.metal_read_bandwidth(wbytes, args.reps))
    results["read_limit_s"] = limit

    rng = np.random.default_rng(1)
    for t in (int(v) for v in args.tokens.split(",")):
        x = rng.standard_normal((t, args.hidden), dtype=np.float32)
        for (route, acts), head in heads.items():
            r = time_route(head, x, args.warmup, args.reps, profile=route != "pinned")
            r.update(route=route, acts=acts, t=t, call_x_limit=r["call_s"] / limit)
            if "lm_head_s" in r:
                r.update(lm_head_x_limit=r["lm_head_s"] / limit, nodes_x_limit=r["nodes_sum_s"] / limit)
            results["routes"].append(r)
    limit2 = _median(_core.metal_read_bandwidth(wbytes, args.reps))
    results["read_limit_after_s"] = limit2
    del heads

    us = lambda s: f"{s * 1e6:9.1f}" if s is not None else f"{'-':>9}"  # noqa: E731
    if emulated:
        print(EMULATOR_NOTE)
    print("muser Metal head bench" + (" (emulator: times mean nothing)" if emulated else ""))
    print(f"LM head {args.weight_type} [{args.vocab:,} x {args.hidden:,}] = {wbytes:,} bytes; "
          f"medians of {args.reps} after {args.warmup} warm-ups")
    print(f"read limit: {us(limit)} us ({wbytes / limit / 1e9:,.1f} GB/s); after the routes: {us(limit2)} us")
    print(f"{'route':<10} {'acts':<4} {'t':>3} {'lm_head us':>11} {'x limit':>8} {'nodes us':>10} {'x limit':>8} "
          f"{'call us':>10} {'x limit':>8}")
    for r in results["routes"]:
        lm, nd = r.get("lm_head_s"), r.get("nodes_sum_s")
        print(f"{r['route']:<10} {r['acts']:<4} {r['t']:>3} {us(lm):>11} "
              f"{(lm / limit if lm else float('nan')):>8.3f} {us(nd):>10} {(nd / limit if nd else float('nan')):>8.3f} "
              f"{us(r['call_s']):>10} {r['call_x_limit']:>8.3f}")
    for s in results["skipped"]:
        print(f"skipped {s['route']}/{s['acts']}: {s['reason']}")
    if args.json:
        from ._bench_util import write_json

        write_json(results, args.json, indent=2)
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
