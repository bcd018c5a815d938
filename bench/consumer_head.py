"""What the consumer's reductions cost against the plain call of the same route, in one run.

    python bench/consumer_head.py --device cuda [--tokens 1,256] [--route fused --acts q8]
    python bench/consumer_head.py --device cpu --threads 2 [--tokens 1]

Writes a random head of the seed's shape (Q5_K 202,048 x 6,656; ``--hidden/--vocab``
to change it), then times, per t, the host clock of what a caller waits for:
``head(x)`` (plain: on CUDA ``head(x, on_device=True)`` and a synchronize),
``head.score(x, ids)`` (one target per row), ``head.logsumexp(x)``,
``head.log_softmax(x)`` (on CUDA ``on_device=True``) and ``head.sample(x, seed=0,
positions=arange(t), ...)`` greedy (temperature 0), at temperature 1 (the default:
no cut), with top_p 0.9 and with top_k 50, each as a ratio to the plain call. On CUDA it also prints the device memory a score call took (cudaMemGetInfo
around its first call on a fresh head) against the [t, V] logits it never keeps.
Medians over ``--reps``, taken round-robin over the columns (a shared machine's
load then weighs on every column alike).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import muser
from muser import _core
from muser._args import positive_int, positive_ints
from muser._cuda_bench import SEED_SHAPE, write_random_head


def _load() -> str:
    """The host's 1- and 5-minute load averages (other jobs share a CPU bench's cores)."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:  # not every platform has it
        return "unknown"
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def _timed_interleaved(fns: list, reps: int, sync) -> list[float]:
    """Median seconds of each fn, the reps taken round-robin (fn 0, 1, ..., then again), so a
    machine whose load drifts (other jobs on a shared host) slows every column alike."""
    for fn in fns:
        fn()
        sync()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            s = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - s)
    return [float(statistics.median(ts)) for ts in times]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    p.add_argument("--route", default="fused", help="the route (default fused)")
    p.add_argument("--acts", default="q8", help="f32 or q8 (default q8)")
    p.add_argument("--tokens", default="1,256", type=positive_ints, help="comma-separated batch sizes t")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads (cpu device)")
    p.add_argument("--reps", type=positive_int, default=20, help="timed repetitions per measurement")
    p.add_argument("--hidden", type=positive_int, default=SEED_SHAPE["hidden"], help="H")
    p.add_argument("--vocab", type=positive_int, default=SEED_SHAPE["vocab"], help="V")
    p.add_argument("--weight-type", default=SEED_SHAPE["weight_type"], help="LM-head weight type")
    args = p.parse_args()
    tmp = tempfile.mkdtemp()
    path = write_random_head(os.path.join(tmp, "head.gguf"), args.hidden, args.vocab, args.weight_type)
    cuda = args.device.startswith("cuda")
    head = muser.Head.load(path, device=args.device, route=args.route, acts=args.acts, threads=args.threads)
    torch = None
    if cuda:
        import torch  # noqa: F811 -- device hidden states and the synchronize
        sync = torch.cuda.synchronize
    else:
        def sync() -> None:
            return None
    print(f"{head!r}; reps {args.reps}; load average {_load()}")
    print(f"{'':>14} {'':>7} {'':>9} {'':>11} {'sample':^35}")
    print(f"{'t':>4} {'plain ms':>9} {'score':>7} {'logsumexp':>9} {'log_softmax':>11} "
          f"{'greedy':>8} {'temp 1':>8} {'top_p .9':>8} {'top_k 50':>8}   (ratios to plain)")
    for t in args.tokens:
        x = np.random.default_rng(t).standard_normal((t, args.hidden), dtype=np.float32)
        ids = np.random.default_rng(1).integers(0, args.vocab, size=t)
        xin = torch.from_numpy(x).cuda() if cuda else x
        if cuda:
            fresh = muser.Head.load(path, device=args.device, route=args.route, acts=args.acts)
            sync()
            free0 = _core.cuda_memory_info(0)[0]
            fresh.score(xin, ids)
            took = free0 - _core.cuda_memory_info(0)[0]
            del fresh
        pos = np.arange(t)
        fns = [lambda: head(xin, on_device=True) if cuda else head(xin),
               lambda: head.score(xin, ids),
               lambda: head.logsumexp(xin),
               lambda: head.log_softmax(xin, on_device=True) if cuda else head.log_softmax(xin)]
        fns += [lambda kw=kw: head.sample(xin, seed=0, positions=pos, **kw)
                for kw in (dict(temperature=0.0), dict(temperature=1.0), dict(temperature=1.0, top_p=0.9),
                           dict(temperature=1.0, top_k=50))]
        plain, score, lse, lsm, *samples = _timed_interleaved(fns, args.reps, sync)
        print(f"{t:4d} {plain * 1e3:9.3f} {score / plain:7.3f} {lse / plain:9.3f} {lsm / plain:11.3f} "
              + " ".join(f"{v / plain:8.3f}" for v in samples)
              + (f"   score took {took / 2**20:.1f} MiB of device memory; [t, V] logits are "
                 f"{t * args.vocab * 4 / 2**20:.1f} MiB" if cuda else ""))
    print(f"load average after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
