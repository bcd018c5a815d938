"""What the board does while muser's CUDA route runs: SM clock, power, and
whether the power cap is engaged, next to the read kernel doing the same.

    python bench/experiments/cuda_route_power.py [--file head.gguf] [--route fused] [--acts q8] [--tokens 1] [--seconds 2.5]

Runs the read-limit kernel, then the head's route (as a call launches it,
``muser._cuda.route_seconds``), each in a loop for ``--seconds`` while
nvidia-smi samples the SM clock and the board power every 50 ms, and prints
the clock-event reasons nvidia-smi reports half-way through each loop. On
the H200 the q8 route meets the 700 W cap ("SW Power Cap: Active") and its SM
clock falls while the read kernel holds its full clock (docs/performance.md).
Without ``--file`` it writes the seed's random Q5_K head to a temporary file.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

import numpy as np

from gpu_sampling import GpuSampler


def loop_and_sample(tag: str, work: Callable[[], list], seconds: float) -> None:
    t0, times, reasons = time.time(), [], None
    with GpuSampler() as s:
        while time.time() - t0 < seconds:
            times += work()
            if reasons is None and time.time() - t0 > seconds / 2:
                q = subprocess.run(["nvidia-smi", "-q", "-d", "PERFORMANCE"], capture_output=True, text=True).stdout
                reasons = [line.split(":")[0].strip() for line in q.splitlines() if line.strip().endswith(": Active")]
    print(f"{tag:<28} median {statistics.median(times) * 1e6:7.1f} us   {s.summary()}   "
          f"active clock-event reasons: {', '.join(reasons or []) or 'none'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file")
    p.add_argument("--route", default="fused")
    p.add_argument("--acts", default="q8")
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--seconds", type=float, default=2.5)
    args = p.parse_args()

    import muser
    from muser import _cuda
    from muser._cuda_bench import SEED_SHAPE, write_random_head

    tmp = None
    path = args.file
    if not path:
        tmp = tempfile.TemporaryDirectory(prefix="muser-route-power-")
        path = write_random_head(os.path.join(tmp.name, "head.gguf"), SEED_SHAPE["hidden"], SEED_SHAPE["vocab"],
                                 SEED_SHAPE["weight_type"])
    head = muser.Head.load(path, device="cuda", route=args.route, acts=args.acts)
    x = np.random.default_rng(0).standard_normal((args.tokens, head.spec.hidden_size), dtype=np.float32)
    head(x)
    loop_and_sample("read kernel (the limit)", lambda: _cuda.read_bandwidth(head.weight_bytes, 100), args.seconds)
    loop_and_sample(f"{args.route} {args.acts} t={args.tokens}", lambda: _cuda.route_seconds(head, x, 100),
                    args.seconds)
    del head
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
