"""``python -m muser compare A B``: compare two logits sources and print a table.

A and B are each a GGUF path (``model.gguf``, ``model.gguf:pinned``,
``model.gguf:graph@cpu``) or saved logits (``.npy``, or ``.npz`` with a
``logits`` array). GGUF sources compute logits from ``--hidden`` (a ``.npy``
float32 [N, H], or an ``.npz`` with a ``hidden`` array, as
:meth:`muser.pinned.Capture.save` writes). With ``--max-delta``/``--mean-delta``
the bounded-logit policy is checked and the exit status is 1 when it fails.
With ``--targets`` (a ``.npy`` of int token ids, the next token of each row)
llama-perplexity's KL-divergence statistics follow, in its layout, B as the
base and A as Q.

Wired into ``muser.__main__`` by ``add_parser(subparsers)``; ``run(args)`` returns the exit status.
"""
from __future__ import annotations

import argparse
import sys

from ._core import Error

from .head import ROUTES


def add_parser(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add the ``compare`` sub-command to ``subparsers`` and return its parser."""
    p = subparsers.add_parser(
        "compare",
        help="compare two heads / routes / devices / saved logits row by row",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("a", help="candidate: path.gguf[:route][@device], or logits .npy/.npz")
    p.add_argument("b", help="reference: path.gguf[:route][@device], or logits .npy/.npz")
    p.add_argument("--hidden", help="hidden states .npy [N, H] float32 (or .npz with 'hidden')")
    p.add_argument("--route", choices=ROUTES, default=None,
                   help="route for GGUF sources that do not name one (default graph)")
    p.add_argument("--device", default=None, help="device for GGUF sources that do not name one (default cpu)")
    p.add_argument("--acts", choices=("f32", "q8"), default=None, help="activation mode for GGUF sources")
    p.add_argument("-k", "--top-k", type=int, default=5, help="k of the top-k overlap (default 5)")
    p.add_argument("--targets", help="next-token ids .npy [N] (int): add llama-perplexity's KL statistics")
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per streamed chunk")
    p.add_argument("--max-delta", type=float, default=None, help="policy: require max |a-b| < this")
    p.add_argument("--mean-delta", type=float, default=None, help="policy: require mean |a-b| < this")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--per-row", action="store_true", help="with --json, include per-row statistics")
    p.set_defaults(fn=run, func=run)  # muser.__main__ dispatches on args.fn
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``compare``; 0 on success, 1 when a given policy fails, 2 on a usage/input error."""
    from .compare import BoundedLogitPolicy, compare, load_source, result_json

    try:
        if (args.max_delta is None) != (args.mean_delta is None):
            raise Error("--max-delta and --mean-delta go together")
        srcs = [load_source(s, route=args.route, device=args.device, acts=args.acts) for s in (args.a, args.b)]
        res = compare(srcs[0], srcs[1], hidden=args.hidden, k=args.top_k, chunk_rows=args.chunk_rows,
                      targets=getattr(args, "targets", None))
        verdict = None
        if args.max_delta is not None:
            verdict = BoundedLogitPolicy(args.max_delta, args.mean_delta).check(res)
    except (Error, TypeError, ValueError) as e:
        print(f"muser compare: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(result_json(res, verdict, per_row=args.per_row))
    else:
        print(res.table())
        if res.has_targets:
            print()
            print(res.llama_table())
        if verdict is not None:
            print(str(verdict))
    return 0 if verdict is None or verdict.passed else 1


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m muser._cli_compare A B ...``) for use before wiring."""
    parser = argparse.ArgumentParser(prog="muser")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["compare", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
