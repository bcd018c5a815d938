"""The CPU head benchmark: every route and activation mode against ggml's own
CPU kernels (route="pinned", through llama-cpp-python's libggml) at the same
thread count, and against the machine's read bandwidth measured in the same
run (``_core.read_bandwidth``: each thread streams its share of a 1 GiB
buffer). On shared machines the bandwidth moves by tens of percent between
runs, so ratios are only meaningful within one run; the probe runs before and
after the routes to show the drift.

Entry points: ``python bench/cpu_head.py`` and ``python -m muser bench``.
One pinned core: ``taskset -c 0 python bench/cpu_head.py --threads 1``.

Times are wall clock of ``head(hidden)`` (zero-copy output, GIL released),
medians over ``--reps`` after one warm-up; ``reference`` runs once (it is the
slow scalar oracle). The per-node split comes from one ``head.profile()``
call: ``lm_head`` is the matvec (activation quantization included for
acts="q8", as in ggml's mul_mat), ``tail`` every node after it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Optional

import numpy as np

SEED_SHAPE = dict(hidden=6656, vocab=202048, weight_type="Q5_K")  # the seed's head, 924,571,648 bytes
ROUTES = ("reference", "fused", "graph", "canonical")
ACTS = ("f32", "q8")
TAIL_LABELS_AFTER = "lm_head"


def default_path(hidden: int, vocab: int, weight_type: str, cache_dir: Optional[str] = None) -> str:
    from ._cli_cache import cache_dir as _cache_dir

    return os.path.join(_cache_dir(cache_dir), f"bench-{weight_type.lower()}-{hidden}x{vocab}.gguf")


def ensure_file(path: str, hidden: int, vocab: int, weight_type: str, quiet: bool = False) -> str:
    """The benchmark head, written once (random well-formed blocks: seconds, not the quantizer's minutes)."""
    if os.path.exists(path):
        return path
    from ._cuda_bench import write_random_head  # one writer for both benches (pure Python)
    from ._progress import Progress

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".part"
    t0 = time.perf_counter()
    bar = Progress(vocab, "writing the bench head", unit="row", enabled=not quiet)
    try:
        write_random_head(tmp, hidden, vocab, weight_type, progress=bar.rows())
    finally:
        bar.close()
    os.replace(tmp, path)
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:,.1f} MB) in {time.perf_counter() - t0:.1f} s; "
          f"kept for the next run (remove with: python -m muser cache --clear)", file=sys.stderr)
    return path


def read_bandwidth(threads: int, nbytes: int = 1 << 30, repeats: int = 3) -> dict:
    from . import _core

    r = _core.read_bandwidth(nbytes, threads, repeats)
    rates = [r["bytes"] / s / 1e9 for s in r["seconds"]]
    return dict(threads=r["threads"], bytes=r["bytes"], gbps=max(rates), gbps_all=rates)


def time_calls(fn: Any, x: np.ndarray, reps: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn(x)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t0)
    return out


def bench_threads(path: str, threads: int, tokens: list[int], routes: list[str], acts: list[str], reps: int,
                  with_ggml: bool, log: Any, bandwidth_bytes: int = 1 << 30, tick: Any = None) -> dict:
    import muser

    bw_before = read_bandwidth(threads, bandwidth_bytes)
    log(f"threads {threads}: read bandwidth {bw_before['gbps']:.1f} GB/s ({bandwidth_bytes:,} B, best of 3)")
    rng = np.random.default_rng(0)
    hidden = muser.Head.load(path).spec.hidden_size
    rows: list[dict] = []
    weight_bytes = None
    ggml_version = None
    for t in tokens:
        x = rng.standard_normal((t, hidden)).astype(np.float32)
        x[:, rng.integers(0, x.shape[1], 64)] *= 20
        ggml_s = None
        if with_ggml:
            try:
                pinned = muser.Head.load(path, route="pinned", threads=threads)
                ggml_s = statistics.median(time_calls(pinned, x, reps))
                ggml_version = pinned._pinned.ggml_version  # noqa: SLF001 - informational
                rows.append(dict(route="pinned (ggml)", acts="ggml", t=t, seconds=ggml_s, lm_head=None, tail=None))
                log(f"  t={t} pinned (ggml): {ggml_s * 1e3:.1f} ms")
                del pinned
                if tick:
                    tick()
            except Exception as e:  # llama-cpp-python missing or its ggml unusable
                log(f"  ggml comparator unavailable: {e}")
                with_ggml = False
        for route in routes:
            for a in acts:
                head = muser.Head.load(path, route=route, acts=a, threads=threads)
                weight_bytes = head.weight_bytes
                n = 1 if route == "reference" else reps
                secs = statistics.median(time_calls(head, x, n, warmup=0 if route == "reference" else 1))
                prof = head.profile(x)
                i = next(k for k, p in enumerate(prof) if TAIL_LABELS_AFTER in p.nodes)  # its kernel, fused or not
                lm = prof[i].seconds
                tail = sum(p.seconds for p in prof[i + 1:])
                rows.append(dict(route=route, acts=a, t=t, seconds=secs, lm_head=lm, tail=tail,
                                 nodes={p.label: p.seconds for p in prof}))
                log(f"  t={t} {route} {a}: {secs * 1e3:.1f} ms")
                del head
                if tick:
                    tick()
    bw_after = read_bandwidth(threads, bandwidth_bytes)
    for r in rows:
        ggml = next((g["seconds"] for g in rows if g["route"] == "pinned (ggml)" and g["t"] == r["t"]), None)
        r["x_ggml"] = r["seconds"] / ggml if ggml else None
        r["weight_gbps"] = weight_bytes / r["seconds"] / 1e9 if weight_bytes else None
        # against the better of the two probes: the conservative reading of a drifting machine
        r["x_bandwidth"] = r["weight_gbps"] / max(bw_before["gbps"], bw_after["gbps"]) if r["weight_gbps"] else None
        one = next((o["seconds"] for o in rows if o["route"] == r["route"] and o["acts"] == r["acts"] and o["t"] == 1),
                   None)
        r["x_t1"] = r["seconds"] / one if one else None
        r["tail_share"] = r["tail"] / (r["lm_head"] + r["tail"]) if r.get("lm_head") else None
    return dict(threads=threads, bandwidth_before=bw_before, bandwidth_after=bw_after, weight_bytes=weight_bytes,
                ggml=ggml_version, rows=rows)


def format_table(res: dict) -> str:
    b0, b1 = res["bandwidth_before"]["gbps"], res["bandwidth_after"]["gbps"]
    lines = [f"threads {res['threads']}: read bandwidth {b0:.1f} GB/s before, {b1:.1f} GB/s after the routes "
             f"(x bw uses the larger); "
             f"weight {res['weight_bytes']:,} B" + (f"; {res['ggml']}" if res.get("ggml") else ""),
             f"{'route':<14} {'acts':<9} {'t':>2} {'ms':>9} {'x ggml':>7} {'GB/s':>6} {'x bw':>5} {'x t=1':>6} "
             f"{'lm_head ms':>10} {'tail %':>6}"]
    for r in res["rows"]:
        f = lambda v, fmt: (fmt % v) if v is not None else "-"  # noqa: E731
        lines.append(f"{r['route']:<14} {r['acts']:<9} {r['t']:>2} {r['seconds'] * 1e3:>9.1f} {f(r['x_ggml'], '%.2f'):>7} "
                     f"{f(r['weight_gbps'], '%.1f'):>6} {f(r['x_bandwidth'], '%.2f'):>5} {f(r['x_t1'], '%.2f'):>6} "
                     f"{f(r['lm_head'] and r['lm_head'] * 1e3, '%.1f'):>10} "
                     f"{f(r['tail_share'] and 100 * r['tail_share'], '%.1f'):>6}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench's options (shared by bench/cpu_head.py and ``python -m muser bench``)."""
    from ._args import positive_int, positive_ints
    from ._cli_cache import add_cache_dir_argument

    p.add_argument("--threads", default=None, type=positive_ints,
                   help="comma-separated thread counts, each 1 to muser.build_info()['max_threads'] "
                        "(default: 1 and every CPU this process may use)")
    p.add_argument("--tokens", default="1,8", type=positive_ints, help="comma-separated batch sizes t (default 1,8)")
    p.add_argument("--routes", default=",".join(ROUTES), help=f"comma-separated routes (default {','.join(ROUTES)})")
    p.add_argument("--acts", default=",".join(ACTS), help=f"comma-separated activation modes (default {','.join(ACTS)})")
    p.add_argument("--reps", type=positive_int, default=5, help="timed calls per configuration; the median is reported (default 5)")
    p.add_argument("--no-ggml", action="store_true", help="skip the pinned (ggml) comparator")
    p.add_argument("--file", help="GGUF head to run (default: the seed's shape, written once into the cache folder)")
    add_cache_dir_argument(p)
    p.add_argument("--json", metavar="PATH", nargs="?", const="-",
                   help="also write the results as JSON to PATH; '--json' alone or '--json -': JSON on stdout "
                        "and the tables on stderr")
    p.add_argument("--plot", metavar="PNG", help="draw time per step against t, with the read limit and ggml "
                                                 "(needs matplotlib: pip install 'muser[plot]')")
    p.add_argument("--bandwidth-bytes", type=int, default=1 << 30,
                   help="buffer the read-bandwidth probe streams (default 1 GiB)")
    p.add_argument("--quiet", action="store_true", help="no progress lines or bars on stderr")


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = args.threads or sorted({1, cpus})  # lists of ints >= 1 (positive_ints)
    tokens = args.tokens
    routes = [r for r in args.routes.split(",") if r]
    acts = [a for a in args.acts.split(",") if a]
    bad = [r for r in routes if r not in ROUTES] + [a for a in acts if a not in ACTS]
    if bad:
        print(f"unknown route/acts {bad}; routes are {ROUTES}, acts {ACTS}", file=sys.stderr)
        return 2
    from . import _core

    max_threads = _core.build_info()["max_threads"]
    if any(not 1 <= n <= max_threads for n in threads):
        print(f"--threads: each count must be 1 to {max_threads} (muser's maximum); got {threads}", file=sys.stderr)
        return 2
    if args.plot:
        from ._plot import require_matplotlib

        require_matplotlib()  # before the minutes of benching, not after
    quiet = args.quiet
    path = args.file or ensure_file(default_path(**SEED_SHAPE, cache_dir=args.cache_dir), **SEED_SHAPE,
                                    quiet=quiet)
    import muser
    from ._progress import Progress

    per_run = len(tokens) * (len(routes) * len(acts) + (0 if args.no_ggml else 1))
    bar = Progress(per_run * len(threads), "bench", enabled=not quiet)
    log = (lambda s: None) if quiet else bar.write
    tables = sys.stderr if args.json == "-" else sys.stdout  # JSON on stdout: keep it parseable

    results = dict(file=path, cpus=cpus, cpu_isa=muser.build_info()["cpu_isa_active"], runs=[])
    try:
        for n in threads:
            res = bench_threads(path, n, tokens, routes, acts, args.reps, not args.no_ggml, log,
                                args.bandwidth_bytes, tick=bar.step)
            results["runs"].append(res)
            print(format_table(res), file=tables, flush=True)
            print(file=tables, flush=True)
    finally:
        bar.close()
    if args.json:
        from ._bench_util import write_json

        write_json(results, args.json, indent=1)
    if args.plot:
        from ._plot import bench_plot

        bench_plot(results, args.plot)
        print(f"wrote {os.path.abspath(args.plot)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
