"""compare() with targets over many rows of a large vocabulary stays in O(chunk) memory.

Writes two heads of one random weight (Q8_0 and F16, H = 64 by default, V = 262,144)
with muser.fixtures, then runs muser.compare(q8, f16, hidden=, targets=) over N rows
(10^4 by default) and prints the peak RSS (resource.getrusage) next to the bound the
chunking promises and to what the [N, V] logits alone would take.

The bound: the RSS before compare() (interpreter, numpy, both heads' mapped weights
touched once by a warm call, the hidden states) plus, per element of one chunk
(chunk_rows x V): each head's pooled float32 logits buffer (4 + 4 bytes), compare's
float32 copies of both chunks (4 + 4), and at most three float64 [r, V] arrays alive
at once (log-softmax of a, of b, the probabilities of b: 24) plus one byte of mask
= 41 bytes. No [N, V] array is made, so N does not appear in it.

    python bench/compare_memory.py [--rows 10000] [--vocab 262144] [--hidden 64] [--chunk-rows R]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

import numpy as np

BYTES_PER_CHUNK_ELEMENT = 41


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--vocab", type=int, default=262_144)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--chunk-rows", type=int, default=None, help="default: compare's (about 4 M logits)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import muser
    from muser.compare import _CHUNK_ELEMENTS
    from muser.fixtures import write_head_gguf

    n, V, H = args.rows, args.vocab, args.hidden
    chunk = args.chunk_rows or max(1, _CHUNK_ELEMENTS // V)
    with tempfile.TemporaryDirectory(prefix="muser-bench-") as tmp:
        paths = {}
        for t in ("Q8_0", "F16"):
            paths[t] = write_head_gguf(os.path.join(tmp, f"{t}.gguf"), hidden=H, vocab=V, weight_type=t, seed=1)
        rng = np.random.default_rng(0)
        hidden = rng.standard_normal((n, H)).astype(np.float32) * 4
        targets = rng.integers(0, V, size=n)
        a = muser.Head.load(paths["Q8_0"], threads=args.threads)
        b = muser.Head.load(paths["F16"], threads=args.threads)
        a(hidden[:1]), b(hidden[:1])  # touch both weights (the mapped pages count in RSS)
        before = rss_mib()
        peak_before = peak_mib()
        t0 = time.perf_counter()
        r = muser.compare(a, b, hidden=hidden, targets=targets, chunk_rows=chunk)
        secs = time.perf_counter() - t0
        peak = peak_mib()

    chunk_mib = BYTES_PER_CHUNK_ELEMENT * chunk * V / 2**20
    whole_mib = 4 * n * V / 2**20
    print(f"compare(Q8_0 head, F16 head, targets) over {n:,} rows x {V:,} vocab (H = {H}), "
          f"chunks of {chunk} rows, {secs:.1f} s")
    print(f"  Mean KLD {r.kld_mean:.3e} ± {r.kld_mean_se:.1e}, Same top p {100 * r.same_top_p:.3f} %, "
          f"PPL(Q)/PPL(base) {r.ppl_ratio:.6f}")
    print(f"  RSS before compare          {before:10.1f} MiB (peak so far {peak_before:.1f} MiB)")
    print(f"  peak RSS (getrusage)        {peak:10.1f} MiB")
    print(f"  expected bound              {before + chunk_mib:10.1f} MiB = before + {BYTES_PER_CHUNK_ELEMENT} B x "
          f"{chunk} x {V:,} ({chunk_mib:.1f} MiB)")
    print(f"  peak / bound                {peak / (before + chunk_mib):10.3f}")
    print(f"  one side's [N, V] float32   {whole_mib:10.1f} MiB (never made); peak is "
          f"{peak / whole_mib:.4f} of it")
    return 0 if peak <= before + chunk_mib else 1


if __name__ == "__main__":
    sys.exit(main())
