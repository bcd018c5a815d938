"""``python -m muser lens model.gguf --hidden layers.npy``: the logit lens, one line per layer.

``--hidden`` is a ``.npy`` float32 [L, t, H] (every layer's residual stream for the
same t positions, the last layer the one the model's head reads), or an ``.npz``
with a ``hidden`` array of that shape. ``--targets`` (a ``.npy`` of int token ids,
the next token of each position) adds the target's mean log-probability and median
rank per layer. Each line: mean entropy, (target), mean KL(final layer || layer),
and the top-1 token of the last position with its log-probability.

Wired into ``muser.__main__`` by ``add_parser(subparsers)``; ``run(args)`` returns the exit status.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from ._core import Error

from .head import ROUTES


def add_head_options(p: argparse.ArgumentParser) -> None:
    """The options that load the head a sub-command runs (lens, sensitivity)."""
    p.add_argument("--route", choices=ROUTES, default="graph", help="the route the head runs (default graph)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or metal (default cpu)")
    p.add_argument("--acts", choices=("f32", "q8"), default="f32", help="f32 activations, or q8 (ggml's int8 quantization)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: every CPU the process may use)")


def add_parser(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add the ``lens`` sub-command to ``subparsers`` and return its parser."""
    p = subparsers.add_parser("lens", help="the logit lens: the head applied to every layer's hidden states",
                              description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("model", help="GGUF file holding the head")
    p.add_argument("--hidden", required=True, help="hidden states .npy [L, t, H] float32 (or .npz with 'hidden')")
    p.add_argument("--targets", help="next-token ids .npy [t] (int)")
    p.add_argument("-k", "--k", dest="k", type=int, default=5, help="top tokens kept per layer and row (default 5)")
    add_head_options(p)
    p.add_argument("--chunk", type=int, default=None, help="rows per head call")
    p.add_argument("--json", action="store_true", help="print the per-layer summary as JSON")
    p.set_defaults(fn=run)
    return p


def _load_layers(path: str) -> np.ndarray:
    from .compare import _read_hidden_file

    try:
        return _read_hidden_file(path)
    except (OSError, ValueError) as e:
        raise Error(f"{path}: cannot read hidden states: {e}") from e


def run(args: argparse.Namespace) -> int:
    """Run ``lens``; 0 on success, 2 on a usage or input error."""
    import muser

    try:
        head = muser.Head.load(args.model, device=args.device, route=args.route, acts=args.acts,
                               threads=args.threads)
        res = muser.lens(head, _load_layers(args.hidden), k=args.k, targets=args.targets, chunk=args.chunk)
    except (Error, TypeError, ValueError, OSError) as e:
        print(f"muser lens: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(res.to_json())
    else:
        L, t, _ = res.top_ids.shape
        print(f"{args.model}: {L} layers x {t} positions, head {head.spec.hidden_size} x {head.spec.vocab_size} "
              f"{head.spec.output_type}, route {head.route}")
        print(res.table())
    return 0
