"""threads= on a busy machine: the head's step time at each thread count (and
the default, threads=None) while `--busy` other processes spin on the CPUs,
against threads=1 in the same run. This is the measurement behind
``Head.load(threads=None)``'s default (docs/performance.md, "CPU threads").

    python bench/cpu_threads_busy.py                     # demo-sized head, 0 and 1 spinners
    python bench/cpu_threads_busy.py --seed-head         # and the seed's 925 MB head (cache folder)
    python bench/cpu_threads_busy.py --busy 0,1,2 --json out.json

Each spinner is a process running ``while True: pass`` for the duration of its
rows. Times: medians (and 90th percentiles) of ``--reps`` calls of
``head(hidden)`` after a warm-up; threads=1 is the peer of each row.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def spinners(n: int) -> list:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    time.sleep(0.3 if n else 0)  # let them reach the CPUs
    return procs


def stop(procs: list) -> None:
    for p in procs:
        p.kill()
        p.wait()


def time_head(head, x, reps: int) -> tuple[float, float]:
    head(x)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        head(x)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return statistics.median(ts), ts[min(len(ts) - 1, int(0.9 * len(ts)))]


def main() -> int:
    import muser
    from muser._args import positive_int, positive_ints

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--busy", default="0,1", help="comma-separated counts of spinning processes (default 0,1)")
    p.add_argument("--threads", type=positive_ints, default=None, help="thread counts besides the default (default: 1..CPUs)")
    p.add_argument("--tokens", default="1,8", type=positive_ints, help="batch sizes t (default 1,8)")
    p.add_argument("--routes", default="graph,canonical", help="routes (default graph,canonical)")
    p.add_argument("--acts", default="q8,f32", help="activation modes (default q8,f32)")
    p.add_argument("--reps", type=positive_int, default=40, help="timed calls of the small head (the seed head: reps / 8)")
    p.add_argument("--seed-head", action="store_true", help="also the seed's 925 MB head (written once, cached)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = p.parse_args()

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = args.threads if args.threads else list(range(1, cpus + 1))
    tmp = tempfile.TemporaryDirectory(prefix="muser-busy-")
    from muser.fixtures import MUSE_GLIMMER, write_head_gguf

    small = os.path.join(tmp.name, "demo.gguf")  # the demo's default head: 1,024 x 16,384 Q5_K
    write_head_gguf(small, hidden=1024, vocab=16384, weight_type="Q5_K", logit_scale=MUSE_GLIMMER["logit_scale"],
                    softcap=MUSE_GLIMMER["softcap"], seed=0, random_quants=True)
    heads = [("demo 1024x16384", small, args.reps)]
    if args.seed_head:
        from muser._bench_cpu import SEED_SHAPE, default_path, ensure_file

        heads.append(("seed 6656x202048", ensure_file(default_path(**SEED_SHAPE), **SEED_SHAPE),
                      max(3, args.reps // 8)))
    rows = []
    print(f"{cpus} CPUs; muser.build_info()['default_threads'] = {muser.build_info()['default_threads']}")
    print(f"{'head':<17} {'busy':>4} {'route':<10} {'acts':<4} {'t':>2} {'threads':>7} {'ms':>8} {'p90 ms':>8} "
          f"{'x threads=1':>11}")
    for label, path, reps in heads:
        H = muser.Head.load(path).spec.hidden_size
        for busy in [int(v) for v in args.busy.split(",")]:
            procs = spinners(busy)
            try:
                for route in args.routes.split(","):
                    for acts in args.acts.split(","):
                        for t in args.tokens:
                            x = np.random.default_rng(0).standard_normal((t, H)).astype(np.float32)
                            one = None
                            for n in threads + [None]:
                                head = muser.Head.load(path, route=route, acts=acts, threads=n)
                                med, p90 = time_head(head, x, reps)
                                del head
                                one = med if n == 1 else one
                                row = dict(head=label, busy=busy, route=route, acts=acts, t=t,
                                           threads="default" if n is None else n, ms=med * 1e3, p90_ms=p90 * 1e3,
                                           x_one=med / one if one else None)
                                rows.append(row)
                                print(f"{label:<17} {busy:>4} {route:<10} {acts:<4} {t:>2} {row['threads']!s:>7} "
                                      f"{row['ms']:>8.2f} {row['p90_ms']:>8.2f} "
                                      f"{row['x_one'] if row['x_one'] is not None else float('nan'):>11.2f}",
                                      flush=True)
            finally:
                stop(procs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cpus=cpus, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
