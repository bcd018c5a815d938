"""``python -m muser bench``: the head benchmark of one device.

``--device cpu`` (the default) runs muser._bench_cpu, the same as
bench/cpu_head.py, with the options below. ``--device cuda`` or ``cuda:N``
runs muser._cuda_bench (bench/cuda_head.py) when this installation has it;
its own options follow ``--``: ``python -m muser bench --device cuda -- --help``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from . import _core
from .errors import Error


def run(args: argparse.Namespace) -> int:
    try:
        caps = _core.device_caps(args.device)  # what the device can do, not what it is called
    except (ValueError, Error) as e:
        print(f"python -m muser bench: {e}", file=sys.stderr)
        return 2
    if not caps["resident_logits"]:  # host memory: the CPU bench
        if args.options:
            print(f"python -m muser bench: unexpected arguments {args.options} for the CPU bench", file=sys.stderr)
            return 2
        from . import _bench_cpu

        return _bench_cpu.run(args)
    if caps["dlpack_device"] == 2:  # device memory of its own, reached through CUDA: the GPU bench
        if args.plot:
            print("python -m muser bench: --plot draws the CPU bench; the CUDA bench has no picture yet "
                  "(--json out.json holds its numbers)", file=sys.stderr)
            return 2
        try:
            cuda_bench = importlib.import_module("muser._cuda_bench")
        except ImportError as e:
            print(f"python -m muser bench --device {args.device}: the CUDA bench (muser._cuda_bench, "
                  f"bench/cuda_head.py) is not part of this installation ({e})", file=sys.stderr)
            return 2
        rest = [a for a in args.options if a != "--"]
        return int(cuda_bench.main(["--device", args.device] + rest) or 0)
    print(f"python -m muser bench: no bench for device {args.device!r} yet", file=sys.stderr)
    return 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from . import _bench_cpu

    b = subparsers.add_parser("bench", help="benchmark the head against its peer and the memory limit",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    _bench_cpu.add_arguments(b)
    b.add_argument("options", nargs=argparse.REMAINDER, help="after --: options of the CUDA bench")
    b.set_defaults(fn=run)
