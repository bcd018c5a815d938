"""The pictures of ``python -m muser demo --plot`` and ``bench --plot`` (matplotlib:
``pip install "muser[plot]"``). Each figure has a fixed pixel size
(``DEMO_PX``, ``BENCH_PX``) so a test can check what was written."""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

DPI = 100
DEMO_PX = (1100, 480)   # width, height of demo --plot's PNG
BENCH_PX = (1100, 520)  # of bench --plot's PNG, for one or two thread counts (wider for more)

# The seed's worked examples (§20.7), raw scaled logits a and b at the cap 20:
# 12 / 6 (gap 6.00 -> 4.915, -18 %) and 40 / 20 (gap 20.0 -> 4.049, -80 %).
WORKED_EXAMPLES = ((12.0, 6.0), (40.0, 20.0))


def require_matplotlib() -> Any:
    """matplotlib with a file-only backend, or ImportError saying how to get it."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install 'muser[plot]' (or pip install matplotlib)") from e
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _figure(plt: Any, px: tuple[int, int], ncols: int) -> tuple[Any, Any]:
    return plt.subplots(1, ncols, figsize=(px[0] / DPI, px[1] / DPI), dpi=DPI, squeeze=False)


def _save(fig: Any, path: str) -> None:
    fig.savefig(path, dpi=DPI, format="png")  # no bbox_inches="tight": the size stays what the figure says


def demo_plot(uncapped: np.ndarray, capped: np.ndarray, softcap: float, path: str,
              targets: Optional[np.ndarray] = None, title: str = "") -> None:
    """The soft cap ``y = c * tanh(x / c)`` as the head applied it: each logit of the demo's
    tokens before the cap (x, after the logit scale) against after (y), the identity it
    follows near 0, and the seed's worked examples (§20.7), whose gaps the cap shrinks."""
    plt = require_matplotlib()
    fig, axes = _figure(plt, DEMO_PX, 2)
    ax, hist = axes[0]
    x = np.asarray(uncapped, np.float64).ravel()
    y = np.asarray(capped, np.float64).ravel()
    reach = max(50.0, float(np.nanmax(np.abs(x))) * 1.05 if x.size else 50.0)
    grid = np.linspace(-reach, reach, 801)
    ax.plot(grid, grid, ls="--", lw=1, color="0.6", label="identity (no cap)")
    ax.plot(grid, softcap * np.tanh(grid / softcap), lw=2, color="C0",
            label=f"{softcap:g}·tanh(x/{softcap:g})")
    ax.axhline(softcap, lw=0.8, ls=":", color="C0")
    ax.axhline(-softcap, lw=0.8, ls=":", color="C0")
    step = max(1, x.size // 20000)  # a scatter of every logit would be slow and no clearer
    ax.scatter(x[::step], y[::step], s=3, color="C1", alpha=0.5, label=f"the demo's logits ({x.size:,})",
               zorder=3)
    for n, (a, b) in enumerate(WORKED_EXAMPLES):
        ca, cb = softcap * math.tanh(a / softcap), softcap * math.tanh(b / softcap)
        color = ("C2", "C3")[n % 2]
        ax.plot([a, b], [ca, cb], "o", color=color, ms=7, zorder=4,
                label=f"a={a:g}, b={b:g}: gap {a - b:.2f} → {ca - cb:.3f} ({(ca - cb) / (a - b) - 1:+.0%})")
        for v, cv in ((a, ca), (b, cb)):
            ax.annotate(f"{v:g} → {cv:.3f}", (v, cv), textcoords="offset points", xytext=(6, -12), fontsize=8,
                        color=color)
    ax.set_xlim(-reach, reach)
    ax.set_ylim(-max(reach, softcap * 1.2), max(reach, softcap * 1.2))
    ax.set_xlabel("logit before the soft cap (after the logit scale)")
    ax.set_ylabel("logit after the soft cap")
    ax.set_title("the soft cap: the identity near 0, the tails bent")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")

    bins = np.linspace(min(x.min(), y.min()), max(x.max(), y.max()), 80) if x.size else 10
    hist.hist(x, bins=bins, alpha=0.5, label="before", color="0.5", log=True)
    hist.hist(y, bins=bins, alpha=0.6, label="after", color="C0", log=True)
    if targets is not None:
        for i, v in enumerate(np.asarray(targets, np.float64).ravel()):
            hist.axvline(v, color="C1", lw=1, ls="--", label="aimed tokens (after)" if i == 0 else None)
    hist.set_xlabel("logit")
    hist.set_ylabel("tokens")
    hist.set_title("the same logits, counted: before and after")
    hist.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def bench_plot(results: dict, path: str) -> None:
    """Time per step against t for every route of a CPU bench run (one panel per thread
    count), with ggml's head and the read limit (the weight's bytes at the read bandwidth
    measured in the same run) drawn beside them."""
    plt = require_matplotlib()
    runs = results["runs"]
    px = (max(BENCH_PX[0], 550 * len(runs)), BENCH_PX[1])
    fig, axes = _figure(plt, px, max(1, len(runs)))
    for ax, run in zip(axes[0], runs):
        rows = run["rows"]
        ts = sorted({r["t"] for r in rows})
        series: dict[str, list[tuple[int, float]]] = {}
        for r in rows:
            series.setdefault(f"{r['route']} {r['acts']}" if r["acts"] != "ggml" else r["route"], []).append(
                (r["t"], r["seconds"] * 1e3))
        for n, (label, pts) in enumerate(series.items()):
            pts.sort()
            peer = label.startswith("pinned")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", lw=2.5 if peer else 1.5,
                    color="k" if peer else f"C{n % 10}", ls="-" if peer else "--" if "reference" in label else "-",
                    label=label)
        bw = max(run["bandwidth_before"]["gbps"], run["bandwidth_after"]["gbps"])
        if run.get("weight_bytes") and bw > 0:
            limit_ms = run["weight_bytes"] / (bw * 1e9) * 1e3
            ax.axhline(limit_ms, color="C3", lw=1.5, ls=":",
                       label=f"read limit {limit_ms:.1f} ms ({bw:.1f} GB/s, same run)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ts)
        ax.set_xticklabels([str(t) for t in ts])
        ax.set_yscale("log")
        ax.set_xlabel("tokens per step (t)")
        ax.set_ylabel("ms per step (median)")
        ax.set_title(f"threads {run['threads']}" + (f"; {run['ggml']}" if run.get("ggml") else ""), fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    wb = runs[0].get("weight_bytes") if runs else None
    fig.suptitle(f"CPU head ({results.get('cpu_isa', '')}" + (f", {wb:,} weight bytes" if wb else "") + ")",
                 fontsize=9)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
