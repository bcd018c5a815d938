"""``python -m muser sensitivity model.gguf --hidden h.npy --types Q4_K,Q5_K,Q6_K,Q8_0,F16``:
what quantizing only the head costs.

For each type the head is requantized (:func:`muser.requantize`: dequantized to
float32, quantized with muser's quantizers) into a temporary file and compared with
the original head on the hidden states ``--hidden`` (``.npy`` float32 [t, H], or an
``.npz`` with ``hidden``): weight bytes, KL(original || requantized) mean and max,
top-1 agreement and the median time of a one-row step; with ``--targets`` (``.npy``
int [t]) also the perplexity ratio and RMS Δp. A progress bar goes to stderr (tqdm
when it is installed).

Wired into ``muser.__main__`` by ``add_parser(subparsers)``; ``run(args)`` returns the exit status.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Optional

from ._cli_lens import _load_layers, add_head_options
from ._core import Error


def add_parser(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add the ``sensitivity`` sub-command to ``subparsers`` and return its parser."""
    p = subparsers.add_parser("sensitivity", help="what quantizing only the head to each type costs",
                              description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("model", help="GGUF file holding the head")
    p.add_argument("--hidden", required=True, help="hidden states .npy [t, H] float32 (or .npz with 'hidden')")
    p.add_argument("--targets", help="next-token ids .npy [t] (int)")
    p.add_argument("--types", default="Q4_K,Q5_K,Q6_K,Q8_0,F16",
                   help="comma-separated weight types (default Q4_K,Q5_K,Q6_K,Q8_0,F16)")
    add_head_options(p)
    p.add_argument("--repeats", type=int, default=5, help="timed one-row steps per type (median)")
    p.add_argument("--keep", metavar="DIR", help="write the requantized heads here and keep them")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(fn=run)
    return p


def _progress(total_types: int) -> tuple[Callable[[str, int, int], None], Callable[[], None]]:
    """A per-type progress report on stderr: tqdm's bar when tqdm is installed, else a text line."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    state: dict[str, Any] = {"type": None, "bar": None, "i": 0}

    def update(name: str, done: int, total: int) -> None:
        if state["type"] != name:
            if state["bar"] is not None:
                state["bar"].close()
            state["type"], state["i"] = name, state["i"] + 1
            desc = f"[{state['i']}/{total_types}] {name}"
            state["bar"] = tqdm(total=total, desc=desc, unit="row", file=sys.stderr) if tqdm else None
            state["desc"], state["last"] = desc, 0
        if state["bar"] is not None:
            state["bar"].update(done - state["last"])
            state["last"] = done
        else:
            sys.stderr.write(f"\r  {state['desc']}: {done:,}/{total:,} rows")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()

    def close() -> None:
        if state["bar"] is not None:
            state["bar"].close()

    return update, close


def run(args: argparse.Namespace) -> int:
    """Run ``sensitivity``; 0 on success, 2 on a usage or input error."""
    from .requantize import sensitivity

    types = [t.strip() for t in args.types.split(",") if t.strip()]
    update, close = _progress(len(types))
    try:
        hidden = _load_layers(args.hidden)
        base, rows = sensitivity(args.model, hidden, types, targets=args.targets, device=args.device,
                                 route=args.route, acts=args.acts, threads=args.threads, repeats=args.repeats,
                                 workdir=args.keep, on_type=update)
    except (Error, TypeError, ValueError, OSError) as e:
        close()
        print(f"muser sensitivity: {e}", file=sys.stderr)
        return 2
    close()
    if args.json:
        print(json.dumps({"model": args.model, "rows": int(hidden.shape[0]), "original": base.to_dict(),
                          "types": [r.to_dict() for r in rows]}, indent=2))
        return 0
    targets = base.ppl_ratio is not None
    print(f"{args.model}: head {base.type}, {hidden.shape[0]} rows, route {args.route} on {args.device}")
    head = f"{'type':<12} {'weight bytes':>14} {'KL mean':>11} {'KL max':>11} {'top-1 agree':>11} {'step':>10}"
    if targets:
        head += f" {'PPL ratio':>10} {'RMS Δp':>9}"
    print(head)
    for label, r in [(f"{base.type} (orig)", base)] + [(r.type, r) for r in rows]:
        line = (f"{label:<12} {r.weight_bytes:>14,} {r.kl_mean:>11.3e} {r.kl_max:>11.3e} "
                f"{100 * r.top1_agreement:>10.2f}% {r.step_seconds * 1e3:>7.3f} ms")
        if targets:
            line += f" {r.ppl_ratio:>10.6f} {100 * r.delta_p_rms:>7.3f} %"
        print(line)
    print("KL(original || requantized) in nats; step: median of one-row calls")
    return 0
