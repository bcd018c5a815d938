"""Command line: ``python -m muser demo | inspect | bench | compare | lens | sensitivity``."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Optional

import numpy as np


def _progress(done: int, total: int) -> None:
    width = 40
    filled = width * done // total
    sys.stderr.write(f"\r  writing head [{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,} rows")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def cmd_demo(args: argparse.Namespace) -> int:
    import muser
    from muser.fixtures import MUSE_GLIMMER, write_head_gguf

    hidden, vocab = (MUSE_GLIMMER["hidden"], MUSE_GLIMMER["vocab"]) if args.full else (args.hidden, args.vocab)
    tmp = None
    if args.keep:
        path = args.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix="muser-demo-")
        path = os.path.join(tmp.name, "muse-glimmer-head.gguf")
    t0 = time.perf_counter()
    write_head_gguf(path, hidden=hidden, vocab=vocab, weight_type="Q5_K",
                    logit_scale=MUSE_GLIMMER["logit_scale"], softcap=MUSE_GLIMMER["softcap"],
                    eps=MUSE_GLIMMER["eps"], seed=args.seed, progress=_progress if args.full else None)
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:,.1f} MB) in {time.perf_counter() - t0:.1f} s")

    head = muser.Head.load(path, device=args.device, route=args.route)
    print(head.spec)
    print(f"route {head.route}: " + " -> ".join(label for label, _ in head.nodes))

    # Hidden states aimed at chosen tokens: h = w_target / gamma, so the final
    # norm's output is proportional to the target's own row and it should win.
    f = muser.GGUFFile(path)
    gamma = muser.dequantize(f.tensor_bytes("output_norm.weight"), "F32", (hidden,))
    targets = np.random.default_rng(args.seed + 1).integers(0, vocab, size=args.tokens)
    wbytes = f.tensor_bytes("output.weight").reshape(vocab, -1)
    rows = muser.dequantize(np.ascontiguousarray(wbytes[targets]), "Q5_K", (args.tokens, hidden))
    states = np.ascontiguousarray(rows / gamma, dtype=np.float32)

    logits = head(states)  # zero-copy view of the head's buffer
    times = []
    for _ in range(args.repeats):
        s = time.perf_counter()
        head(states)
        times.append(time.perf_counter() - s)
    step = float(np.median(times))
    vals, ids, _ = head.topk(states, 5)
    for r in range(args.tokens):
        print(f"token {r}: aimed at {targets[r]}; top-5 " +
              ", ".join(f"{i}:{v:+.3f}" for i, v in zip(ids[r], vals[r])))
    ok = bool(np.all(ids[:, 0] == targets))
    print(f"{args.tokens} token(s) x {vocab:,} logits in {step * 1e3:.2f} ms per step "
          f"({head.weight_bytes / step / 1e9:.1f} GB/s of weight), every logit in "
          f"({logits.min():+.3f}, {logits.max():+.3f}); targets recovered: {ok}")
    del head
    if tmp is not None:
        tmp.cleanup()
    return 0 if ok else 1


def cmd_inspect(args: argparse.Namespace) -> int:
    import muser

    f = muser.GGUFFile(args.file)
    spec: Optional[dict] = None
    spec_error: Optional[str] = None
    try:
        spec = muser.Head.load(args.file).spec.to_dict()
    except muser.Error as e:
        spec_error = str(e)
    tensors = [dict(name=t.name, type=t.type, shape=list(t.shape), offset=t.offset, nbytes=t.nbytes)
               for t in f.tensors]
    if args.json:
        print(json.dumps(dict(path=args.file, version=f.version, alignment=f.alignment, n_kv=len(f),
                              spec=spec, spec_error=spec_error, tensors=tensors), indent=2))
        return 0 if spec else 1
    print(f"{args.file}: GGUF v{f.version}, {len(f)} metadata keys, {len(tensors)} tensors, alignment {f.alignment}")
    if spec:
        print(muser.HeadSpec(**spec))
    else:
        print(f"head: {spec_error}")
    print(f"{'tensor':<40} {'type':<6} {'shape':<20} {'offset':>14} {'bytes':>14}")
    for t in tensors:
        print(f"{t['name']:<40} {t['type']:<6} {str(tuple(t['shape'])):<20} {t['offset']:>14,} {t['nbytes']:>14,}")
    return 0 if spec else 1


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m muser", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="write a small Muse Glimmer-style head and run a step")
    d.add_argument("--full", action="store_true", help="the real 202,048 x 6,656 Q5_K shape (925 MB)")
    d.add_argument("--hidden", type=int, default=1024)
    d.add_argument("--vocab", type=int, default=16384)
    d.add_argument("--tokens", type=int, default=3)
    d.add_argument("--route", default="graph", choices=["reference", "fused", "graph", "canonical", "pinned"])
    d.add_argument("--device", default="cpu")
    d.add_argument("--repeats", type=int, default=5)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--keep", metavar="PATH", help="write the GGUF here and keep it")
    d.set_defaults(fn=cmd_demo)

    i = sub.add_parser("inspect", help="print a GGUF file's head spec and tensors")
    i.add_argument("file")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=cmd_inspect)

    for name in ("_cli_bench", "_cli_compare", "_cli_lens", "_cli_sensitivity"):
        try:
            mod = __import__(f"muser.{name}", fromlist=["add_parser"])
        except ImportError:
            continue
        mod.add_parser(sub)

    args = p.parse_args(argv)
    from muser import Error
    try:
        return int(args.fn(args) or 0)
    except (Error, OSError) as e:
        # a bad file or device is the user's to fix: say what, not where in muser
        print(f"muser: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
