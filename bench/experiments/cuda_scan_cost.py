"""What the NaN scan of a device hidden state adds to a call, by t:

    python bench/experiments/cuda_scan_cost.py head.gguf

prints, for t = 1, 64 and 256, the route's GPU time (route_seconds held) and
the host clock of head(x, on_device=True) + synchronize over it, with
check_finite=True and False (the better of two medians of 10 calls each,
interleaved). The head file is any GGUF head, e.g. the one bench/cuda_head.py
--file writes.
"""
import statistics, sys, time
import numpy as np, torch, muser
from muser import _cuda
head = muser.Head.load(sys.argv[1], device="cuda", route="fused", acts="q8")
H = head.spec.hidden_size
for t in (1, 64, 256):
    x = torch.from_numpy(np.random.default_rng(t).standard_normal((t, H), dtype=np.float32)).cuda()
    gpu = statistics.median(_cuda.route_seconds(head, x, 10, held=True))
    res = {}
    for cf in (True, False, True, False):
        ts = []
        for _ in range(12):
            torch.cuda.synchronize(); t0 = time.perf_counter()
            y = head(x, on_device=True, check_finite=cf); torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0); del y
        res.setdefault(cf, []).append(statistics.median(ts[2:]))
    print(f"t={t:4d} GPU {gpu*1e6:8.1f} us  check_finite=True over {(min(res[True])-gpu)*1e6:7.1f} us  False over {(min(res[False])-gpu)*1e6:7.1f} us")
