"""Command line: ``python -m muser demo | inspect | bench | compare | lens | sensitivity | cache``
(also the ``muser`` console script). Every sub-command has ``--help``."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Optional

import numpy as np

from muser._args import positive_int
from muser.head import ROUTES


def cmd_demo(args: argparse.Namespace) -> int:
    import muser
    from muser._progress import Progress
    from muser.fixtures import MUSE_GLIMMER, write_head_gguf

    if args.plot:
        from muser._plot import require_matplotlib

        require_matplotlib()
    # with --json, stdout carries only the JSON; what the text mode prints goes to stderr
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    hidden, vocab = (MUSE_GLIMMER["hidden"], MUSE_GLIMMER["vocab"]) if args.full else (args.hidden, args.vocab)
    tmp = None
    if args.keep:
        path = args.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix="muser-demo-")
        path = os.path.join(tmp.name, "muse-glimmer-head.gguf")
    t0 = time.perf_counter()
    bar = Progress(vocab, "writing head", unit="row", enabled=args.full)
    try:
        write_head_gguf(path, hidden=hidden, vocab=vocab, weight_type="Q5_K",
                        logit_scale=MUSE_GLIMMER["logit_scale"], softcap=MUSE_GLIMMER["softcap"],
                        eps=MUSE_GLIMMER["eps"], seed=args.seed, progress=bar.rows())
    finally:
        bar.close()
    say(f"wrote {path} ({os.path.getsize(path) / 1e6:,.1f} MB) in {time.perf_counter() - t0:.1f} s"
        + ("" if args.keep else " (a temporary file, removed at exit; --keep PATH keeps it)"))

    head = muser.Head.load(path, device=args.device, route=args.route)
    say(head.spec)
    say(f"route {head.route}: " + " -> ".join(label for label, _ in head.nodes))

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
    ok = bool(np.all(ids[:, 0] == targets))
    lo, hi = float(logits.min()), float(logits.max())
    if args.plot:
        from muser._plot import demo_plot

        uncapped = muser.Head.load(path, device=args.device, route=args.route, softcap=None)(states)
        demo_plot(uncapped, logits, float(head.spec.softcap or 0.0) or float("inf"), args.plot,
                  targets=logits[np.arange(args.tokens), targets],
                  title=f"{head.spec.arch} head {hidden:,} x {vocab:,} Q5_K, route {head.route}, "
                        f"{args.tokens} token(s) aimed at chosen ids")
        say(f"wrote {os.path.abspath(args.plot)}")
    if args.json:
        print(json.dumps(dict(
            path=path if args.keep else None, spec=head.spec.to_dict(), route=head.route, device=head.device,
            nodes=[label for label, _ in head.nodes],
            tokens=[dict(target=int(targets[r]), top=[dict(id=int(i), logit=float(v)) for i, v in zip(ids[r], vals[r])])
                    for r in range(args.tokens)],
            step_seconds=step, weight_bytes=head.weight_bytes, weight_gbps=head.weight_bytes / step / 1e9,
            logit_min=lo, logit_max=hi, targets_recovered=ok, plot=args.plot), indent=1))
    else:
        for r in range(args.tokens):
            print(f"token {r}: aimed at {targets[r]}; top-5 " +
                  ", ".join(f"{i}:{v:+.3f}" for i, v in zip(ids[r], vals[r])))
        print(f"{args.tokens} token(s) x {vocab:,} logits in {step * 1e3:.2f} ms per step "
              f"({head.weight_bytes / step / 1e9:.1f} GB/s of weight), every logit in "
              f"({lo:+.3f}, {hi:+.3f}); targets recovered: {ok}")
    del head, logits
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



def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every sub-command and option (each with its help)."""
    p = argparse.ArgumentParser(prog="python -m muser", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="{demo,inspect,bench,compare,cache}")

    d = sub.add_parser("demo", help="write a small Muse Glimmer-style head and run a step")
    d.add_argument("--full", action="store_true", help="the real 202,048 x 6,656 Q5_K shape (925 MB)")
    d.add_argument("--hidden", type=positive_int, default=1024, help="hidden size H, a multiple of 256 (default 1024)")
    d.add_argument("--vocab", type=positive_int, default=16384, help="vocabulary size V (default 16384)")
    d.add_argument("--tokens", type=positive_int, default=3, help="hidden states aimed at random tokens (default 3)")
    d.add_argument("--route", default="graph", choices=ROUTES, help="the route (default graph; README: Routes)")
    d.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or metal")
    d.add_argument("--repeats", type=positive_int, default=5, help="timed steps; the median is reported (default 5)")
    d.add_argument("--seed", type=int, default=0, help="seed of the weights and of the aimed-at tokens")
    d.add_argument("--keep", metavar="PATH", help="write the GGUF here and keep it (else a temporary file)")
    d.add_argument("--json", action="store_true", help="print the result as JSON (the text goes to stderr)")
    d.add_argument("--plot", metavar="PNG", help="draw the logits before and after the soft cap "
                                                 "(needs matplotlib: pip install 'muser[plot]')")
    d.set_defaults(fn=cmd_demo)

    i = sub.add_parser("inspect", help="print a GGUF file's head spec and tensors")
    i.add_argument("file", help="a GGUF file")
    i.add_argument("--json", action="store_true", help="print JSON instead of text")
    i.set_defaults(fn=cmd_inspect)

    for name in ("_cli_bench", "_cli_compare", "_cli_lens", "_cli_sensitivity", "_cli_cache"):
        try:
            mod = __import__(f"muser.{name}", fromlist=["add_parser"])
        except ImportError:
            continue
        mod.add_parser(sub)
    return p


def _quiet_stdout() -> None:
    # the reader left (`... | head`): later writes, and the flush at exit, go nowhere
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from muser import Error
    try:
        rc = int(args.fn(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
        return rc
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except (Error, OSError, ValueError) as e:
        # a bad file, device or argument value is the user's to fix: say what, not where in muser
        print(f"muser: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except ImportError as e:  # an optional extra (--plot's matplotlib) that is not installed
        print(f"muser: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
