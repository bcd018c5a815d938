"""Where a t = 1 (or t) draw's GPU time goes, kernel by kernel, from stamps the kernels write:

    git apply bench/experiments/cuda_sample_trace.patch && pip install --no-build-isolation .
    python bench/experiments/cuda_sample_trace.py head.gguf [t]
    git checkout src            # the patch is an instrument, never the product

The patch makes thread 0 of every CTA of sample_prep, top_p's two passes and
sample_kept stamp the GPU's global timer (ns) at its start, when its
`pdl_wait` returns, when its tile work is done and, in the row's finishing
CTA, when its tail starts and ends; it also counts the distinct SMs a kernel's
CTAs ran on and the longest CTA's tile work in ns and in SM cycles, and splits every CTA-per-tile CTA's
tile work into phases at CTA barriers it adds (the setup after the wait; the
tokens' loop, or top_p's scan; the tile pairs, or top_p's bins into global
memory; the rest), summed in cycles. For each setting this prints the medians
over 60 calls, in µs after the moment the last sample_prep CTA's wait returned
(at t = 1: the route's end), and each kernel's mean and longest phases. Kernels that a
setting does not launch are left out (greedy: sample_prep alone; top_k by
selection: its own kernels, not stamped).
"""
from __future__ import annotations

import ctypes
import sys
import warnings

import numpy as np

KERNELS = ["prep", "top_p 0", "top_p 1", "kept"]


def main() -> int:
    import muser
    import muser._core as core
    import torch

    if not hasattr(core, "_trace_reset"):
        print("this build has no stamps: apply bench/experiments/cuda_sample_trace.patch and reinstall")
        return 2
    head = muser.Head.load(sys.argv[1], device="cuda", route="fused", acts="q8")
    t = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((t, head.spec.hidden_size), dtype=np.float32)).cuda()
    hidden, positions = (x[0], 5) if t == 1 else (x, np.arange(t) + 5)
    buf = (ctypes.c_ulonglong * 88)()
    settings = [("greedy", dict(temperature=0.0)), ("temperature 1", {}), ("top_p 0.9", dict(top_p=0.9)),
                ("min_p 0.05", dict(min_p=0.05))]
    for name, kw in settings:
        for _ in range(10):
            head.sample(hidden, seed=1, positions=positions, **kw)
        rows = []
        for _ in range(60):
            torch.cuda.synchronize()
            core._trace_reset()
            head.sample(hidden, seed=1, positions=positions, **kw)
            torch.cuda.synchronize()
            core._trace_read(ctypes.addressof(buf))
            a = np.array(buf[:40], dtype=np.float64).reshape(4, 10)
            stamped = (a > 0) & (a < 1.8e19)  # the minima's resets are all ones
            rel = np.where(stamped, (a - a[0, 3]) / 1000.0, np.nan)
            rel[:, 7:9] = a[:, 7:9] / 1000.0  # durations (µs, k cycles), not times
            sms = np.array(buf[40:56], dtype=np.uint64).reshape(4, 4)
            count = [sum(bin(int(w)).count("1") for w in sms[k]) for k in range(4)]
            ph = np.array(buf[56:88], dtype=np.float64).reshape(4, 8)
            n = np.maximum(ph[:, 4:5], 1)
            phases = np.concatenate([ph[:, 0:4] / n, ph[:, 7:8], ph[:, 5:7]], axis=1) / 1000.0  # k cycles
            rows.append(np.concatenate([rel, np.array(count, dtype=np.float64)[:, None], phases], axis=1))
        with warnings.catch_warnings():  # the columns of kernels a setting does not launch are all NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            r = np.nanmedian(np.array(rows), axis=0)
        print(f"== {name}, t = {t}: µs after the last sample_prep CTA's wait returned (medians of 60 calls)")
        for k, kernel in enumerate(KERNELS):
            if r[k, 10] == 0:
                continue
            print(f"  {kernel:8s} started {r[k, 0]:6.1f} … {r[k, 1]:6.1f}  waited until {r[k, 3]:6.1f}"
                  f"  tiles done {r[k, 4]:6.1f}  tail {r[k, 5]:6.1f} → {r[k, 6]:6.1f}"
                  f"  (longest CTA's tile work {r[k, 7]:5.1f} µs, {r[k, 8]:5.1f} k cycles; {r[k, 10]:.0f} SMs)")
            print(f"  {'':8s} phases, k cycles, mean (longest): setup {r[k, 11]:5.1f} ({r[k, 15]:5.1f})"
                  f"  tokens {r[k, 12]:5.1f} ({r[k, 16]:5.1f})  pairs/bins {r[k, 13]:5.1f} ({r[k, 17]:5.1f})"
                  f"  rest {r[k, 14]:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
