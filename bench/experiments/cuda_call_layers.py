"""Where a t = 1 call's time goes beyond the GPU's: each layer of the call timed by the host clock.

    python bench/experiments/cuda_call_layers.py [head.gguf] [--reps 200] [--route fused] [--acts q8]

Without a file it writes the seed-shaped random Q5_K head (202,048 x 6,656). Prints the route's
GPU time (route_seconds(held=True)) and, per layer, the median host time of a call and its
excess over that GPU time: the Head methods (what a caller waits), the bindings called directly
(_core.device_run / device_topk: no Python above them), check_finite on and off, and -- where
the build has them -- stream= calls (torch's current stream) without waiting. Runs against
older builds too (layers they lack are skipped), so before/after come from the same script.
"""
from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import tempfile

import numpy as np

from muser._bench_util import median_call_seconds


def clock(fn, reps: int, warmup: int = 20) -> float:
    return median_call_seconds(fn, reps, warmup)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("file", nargs="?")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--route", default="fused")
    p.add_argument("--acts", default="q8")
    args = p.parse_args()

    import torch

    import muser
    from muser import _core, _cuda

    tmp = None
    path = args.file
    if not path:
        from muser._cuda_bench import SEED_SHAPE, write_random_head

        tmp = tempfile.TemporaryDirectory(prefix="muser-call-")
        path = os.path.join(tmp.name, "head.gguf")
        write_random_head(path, SEED_SHAPE["hidden"], SEED_SHAPE["vocab"], SEED_SHAPE["weight_type"])
    head = muser.Head.load(path, device="cuda", route=args.route, acts=args.acts)
    H = head.spec.hidden_size
    x_host = np.random.default_rng(1).standard_normal((1, H), dtype=np.float32)
    x = torch.from_numpy(x_host).cuda()
    torch.cuda.synchronize()
    core = head._core
    ptr = x.data_ptr()
    sync = torch.cuda.synchronize
    gpu = float(statistics.median(_cuda.route_seconds(head, x, 50, held=True)))
    new_api = "stream" in inspect.signature(head.__call__).parameters

    layers = [
        ("head(x, on_device=True) + synchronize", lambda: (head(x, on_device=True), sync())),
        ("head(x, on_device=True, check_finite=False) + synchronize",
         lambda: (head(x, on_device=True, check_finite=False), sync())),
        ("head.argmax(x)", lambda: head.argmax(x)),
        ("head.argmax(x, check_finite=False)", lambda: head.argmax(x, check_finite=False)),
        ("head.topk(x, 50)", lambda: head.topk(x, 50)),
        ("head.topk(x, 50, check_finite=False)", lambda: head.topk(x, 50, check_finite=False)),
        ("head(x_host) (pinned host logits)", lambda: head(x_host)),
        ("head.score(x, 7)", lambda: head.score(x[0], 7)),
        ("head.logsumexp(x)", lambda: head.logsumexp(x[0])),
        ("head.sample(x, temperature=0) (greedy)", lambda: head.sample(x[0], temperature=0.0)),
        ("head.sample(x, temperature=0, check_finite=False)",
         lambda: head.sample(x[0], temperature=0.0, check_finite=False)),
        ("head.sample(x, seed, positions)", lambda: head.sample(x[0], seed=1, positions=5)),
        ("head.sample(x, seed, positions, top_k=50)", lambda: head.sample(x[0], seed=1, positions=5, top_k=50)),
        ("head.sample(x, seed, positions, top_p=0.9)", lambda: head.sample(x[0], seed=1, positions=5, top_p=0.9)),
    ]
    # a new device address each call (8 buffers in turn, as an engine's fresh hidden states):
    # graphs keyed by the input's address are captured again unless their cache holds it
    xs = [x.clone() for _ in range(8)]
    turn = [0]

    def next_x():
        turn[0] = (turn[0] + 1) % len(xs)
        return xs[turn[0]]

    layers += [
        ("head(x, on_device=True) + synchronize, x from 8 buffers", lambda: (head(next_x(), on_device=True), sync())),
        ("head.argmax(x), x from 8 buffers", lambda: head.argmax(next_x())),
        ("head.sample(x, temperature=0), x from 8 buffers", lambda: head.sample(next_x()[0], temperature=0.0)),
        ("head.score(x, 7), x from 8 buffers", lambda: head.score(next_x()[0], 7)),
    ]
    if hasattr(_core, "device_sample"):
        pos1 = np.zeros(1, np.uint64)
        layers.append(("_core.device_sample(greedy, check_finite=False)",
                       lambda: _core.device_sample(core, None, ptr, 1, pos1, 0, 0.0, 0, 1.0, 0.0, None, None, False,
                                                   False, [])))
    if new_api:
        stream = torch.cuda.current_stream().cuda_stream
        layers += [
            ("_core.device_run(check_finite=True), own stream", lambda: _core.device_run(core, None, ptr, 1, False,
                                                                                        False, True, False)),
            ("_core.device_run(check_finite=False), own stream",
             lambda: _core.device_run(core, None, ptr, 1, False, False, False, False)),
            ("_core.device_run(stream, no wait) + synchronize",
             lambda: (_core.device_run(core, None, ptr, 1, False, False, False, False, stream, False), sync())),
            ("_core.device_topk(k=1, ids_only)", lambda: _core.device_topk(core, None, ptr, 1, 1, True, True)),
            ("_core.device_topk(k=50)", lambda: _core.device_topk(core, None, ptr, 1, 50, True)),
            ("head(x, on_device=True, check_finite=False), no sync (enqueue only)",
             lambda: head(x, on_device=True, check_finite=False)),
        ]
    else:
        layers += [
            ("_core.device_run(check_finite=True)", lambda: _core.device_run(core, None, ptr, 1, False, False, True)),
            ("_core.device_run(check_finite=False)", lambda: _core.device_run(core, None, ptr, 1, False, False, False)),
            ("_core.device_topk(k=1)", lambda: _core.device_topk(core, None, ptr, 1, 1, True)),
            ("_core.device_topk(k=50)", lambda: _core.device_topk(core, None, ptr, 1, 50, True)),
        ]
    print(f"muser per-call layers: {_core.cuda_device_description(0)}; {head!r}")
    print(f"route GPU time (route_seconds held): {gpu * 1e6:.1f} us; medians of {args.reps} calls "
          f"(host clock); new call path: {new_api}")
    print(f"{'layer':<72} {'call us':>9} {'over GPU us':>12}")
    for name, fn in layers:
        s = clock(fn, args.reps)
        sync()
        print(f"{name:<72} {s * 1e6:9.1f} {(s - gpu) * 1e6:12.1f}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
