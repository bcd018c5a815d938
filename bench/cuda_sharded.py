"""A vocabulary-sharded CUDA head (muser.shard) against the unsharded head, in one run.

    python bench/cuda_sharded.py [--route graph] [--tokens 1,8,64] [--reps 50] [--json out.json]

Writes a random head of the seed's shape (202,048 x 6,656 Q5_K unless told) to a temporary
file and times, per t, the wall time of one call of each operation:

  unsharded  Head.load(path, device="cuda:0")               -- the peer
  world=1    Head.load(..., shard=(0, 1)): the sharded code path on one GPU
  world=2    two processes (torch.multiprocessing spawn, NCCL), shard r on cuda:r

and prints world2/unsharded. Operations: ``logits`` (``head(x, on_device=True)``: each shard
reads its half of the weight; no exchange), ``argmax`` (ranked on the device, one all_gather of
the winners), ``logsumexp`` (the sharded head reduces its local logits on the host: a download
the unsharded head does not make). world=2 needs two GPUs and torch.distributed with NCCL; with
fewer the run measures world=1 and says so. ``--device cpu`` runs the same on the CPU (world=2 then
over gloo) as a smoke test of the script.
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

import muser
from muser._bench_util import write_json
from muser.fixtures import MUSE_GLIMMER, write_head_gguf

OPS = ("logits", "argmax", "logsumexp")


def _call(head: Any, op: str, x: np.ndarray) -> Any:
    if op == "logits":
        return head(x, on_device=head.caps["resident_logits"])
    return getattr(head, op)(x)


def time_calls(head: Any, x: np.ndarray, op: str, reps: int, barrier: Any = None) -> float:
    """Median wall seconds of one call (after two untimed ones); ``barrier`` lines the ranks up first."""
    for _ in range(2):
        _call(head, op, x)
    times = []
    for _ in range(reps):
        if barrier is not None:
            barrier()
        t0 = time.perf_counter()
        _call(head, op, x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(head: Any, hidden: int, tokens: list, reps: int, barrier: Any = None) -> dict:
    rng = np.random.default_rng(0)
    out: dict = {}
    for t in tokens:
        x = rng.standard_normal((t, hidden)).astype(np.float32)
        out[t] = {op: time_calls(head, x, op, reps, barrier) for op in OPS}
    return out


def _world2_worker(rank: int, args: argparse.Namespace, path: str, result_path: str) -> None:
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{result_path}.rendezvous",
                            rank=rank, world_size=2)
    try:
        device = f"cuda:{rank}" if cuda else "cpu"
        head = muser.Head.load(path, device=device, route=args.route, shard=(rank, 2), group=dist.group.WORLD)
        res = measure(head, args.hidden, args.tokens, args.reps, barrier=lambda: dist.barrier())
        # the slower rank's time is the call's
        flat = torch.tensor([res[t][op] for t in args.tokens for op in OPS], dtype=torch.float64)
        gathered = [torch.zeros_like(flat) for _ in range(2)]
        dist.all_gather_object(gathered, flat)  # CPU objects: no NCCL tensor needed
        if rank == 0:
            worst = torch.stack(gathered).max(dim=0).values.tolist()
            np.save(result_path, np.array(worst))
    finally:
        dist.destroy_process_group()


def world2_unavailable(device: str) -> Optional[str]:
    """Why world=2 cannot run here (None when it can)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed (world=2 runs over torch.distributed)"
    if not dist.is_available():
        return "this torch has no torch.distributed"
    if device == "cuda":
        n = torch.cuda.device_count()
        if n < 2:
            return f"world=2 needs two GPUs; this machine has {n}"
        if not dist.is_nccl_available():
            return "this torch has no NCCL backend"
    return None


def run_world2(args: argparse.Namespace, path: str) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        result_path = os.path.join(d, "world2.npy")
        mp.spawn(_world2_worker, args=(args, path, result_path), nprocs=2)
        worst = np.load(result_path).tolist()
    it = iter(worst)
    return {t: {op: next(it) for op in OPS} for t in args.tokens}


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--route", default="graph")
    ap.add_argument("--tokens", default="1,8,64")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--hidden", type=int, default=MUSE_GLIMMER["hidden"])
    ap.add_argument("--vocab", type=int, default=MUSE_GLIMMER["vocab"])
    ap.add_argument("--weight-type", default=MUSE_GLIMMER["weight_type"])
    ap.add_argument("--json", default=None, help="write the results here ('-': stdout)")
    args = ap.parse_args(argv)
    args.tokens = [int(t) for t in args.tokens.split(",")]
    device = "cuda:0" if args.device == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "head.gguf")
        write_head_gguf(path, hidden=args.hidden, vocab=args.vocab, weight_type=args.weight_type,
                        random_quants=True)
        full = muser.Head.load(path, device=device, route=args.route)
        results: dict = {"device": device, "route": args.route, "shape": [args.vocab, args.hidden],
                         "weight_type": args.weight_type, "weight_bytes": full.weight_bytes}
        results["unsharded"] = measure(full, args.hidden, args.tokens, args.reps)
        del full
        results["world1"] = measure(muser.Head.load(path, device=device, route=args.route, shard=(0, 1)),
                                    args.hidden, args.tokens, args.reps)
        why = world2_unavailable(args.device)
        results["world2"] = None if why else run_world2(args, path)
        results["world2_not_run"] = why
    print(f"LM head {args.weight_type} [{args.vocab:,} x {args.hidden:,}] on {device}, route={args.route}: "
          f"median wall time of one call (us)")
    print(f"{'t':>4} {'op':>10} {'unsharded':>10} {'world=1':>10} {'world=2':>10} {'w2/unsharded':>13} "
          f"{'w1/unsharded':>13}")
    for t in args.tokens:
        for op in OPS:
            u, w1 = results["unsharded"][t][op], results["world1"][t][op]
            w2 = results["world2"][t][op] if results["world2"] else None
            w2s = f"{w2 * 1e6:10.1f}" if w2 is not None else f"{'-':>10}"
            r2 = f"{w2 / u:13.3f}" if w2 is not None else f"{'-':>13}"
            print(f"{t:>4} {op:>10} {u * 1e6:10.1f} {w1 * 1e6:10.1f} {w2s} {r2} {w1 / u:13.3f}")
    if why:
        print(f"world=2 not measured: {why}. world=2 needs two GPUs (nvidia-h200-x2) and torch.distributed "
              "with NCCL.")
    if args.json:
        write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
