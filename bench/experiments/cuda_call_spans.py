"""Each kernel of a t = 1 call and the call's GPU span, by torch.profiler (CUPTI):

    python bench/experiments/cuda_call_spans.py head.gguf [--reps 50] [--sample]

For the plain call, `argmax` and `topk(x, 50)` on the fused q8 route (with
--sample: the plain call, then `sample` greedy, at temperature 1, top_k 50,
top_p 0.9 and both): the median
over the calls of the span from the call's first kernel start to its last
kernel end (what the GPU spends on the call, free of the host), and each
kernel's median time. With programmatic dependent launch on (the default), a
kernel's time includes its wait for the one before; run with MUSER_PDL=0 for
each kernel's own time. MUSER_SELECT_IN_MATVEC=0 / argmax / 1 compares the
selection inside the matvec against the separate kernels (docs/performance.md,
"Per-call overhead").
"""
from __future__ import annotations

import argparse

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--sample", action="store_true", help="time head.sample's settings instead")
    args = p.parse_args()

    import muser
    import torch
    from torch.profiler import ProfilerActivity, profile

    head = muser.Head.load(args.file, device="cuda", route="fused", acts="q8")
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((1, head.spec.hidden_size), dtype=np.float32)).cuda()
    calls = [("call", lambda: head(x, on_device=True)), ("argmax", lambda: head.argmax(x)),
             ("topk50", lambda: head.topk(x, 50))]
    if args.sample:
        draw = lambda **kw: (lambda: head.sample(x[0], seed=1, positions=5, **kw))  # noqa: E731
        calls = [calls[0], ("sample greedy", draw(temperature=0.0)), ("sample temperature 1", draw()),
                 ("sample top_k 50", draw(top_k=50)), ("sample top_p 0.9", draw(top_p=0.9)),
                 ("sample top_k 50 top_p 0.9", draw(top_k=50, top_p=0.9))]
    for name, fn in calls:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
            for _ in range(args.reps):
                fn()
            torch.cuda.synchronize()
        kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                          and "Memcpy" not in e.name and "Memset" not in e.name), key=lambda e: e.time_range.start)
        n = len(kernels) // args.reps
        spans, own = [], {}
        for c in range(args.reps):
            group = kernels[c * n:(c + 1) * n]
            spans.append(max(e.time_range.end for e in group) - min(e.time_range.start for e in group))
            for e in group:
                own.setdefault(e.name[:90], []).append(e.time_range.end - e.time_range.start)
        print(f"== {name}: {n} kernels a call, GPU span median {np.median(spans):.1f} us (min {min(spans):.1f})")
        for k, v in own.items():
            print(f"   {np.median(v):8.1f} us  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
