"""Per-kernel device times of the plain call and of ``head.sample`` settings (greedy, temperature 1
with no cut, top_p 0.9, top_k 50) on the seed-shaped random head, by torch.profiler (CUPTI), 10 calls each.

Kernels launched with programmatic dependent launch start before the one they wait for, so
their times include that wait: read the list as which kernels run and how many, not as a sum.

    python bench/experiments/cuda_sample_kernels.py
"""
import os, sys, tempfile, numpy as np, torch, muser
from muser._cuda_bench import SEED_SHAPE, write_random_head
from torch.profiler import profile, ProfilerActivity
tmp = tempfile.mkdtemp()
path = write_random_head(os.path.join(tmp, "h.gguf"), SEED_SHAPE["hidden"], SEED_SHAPE["vocab"], SEED_SHAPE["weight_type"])
head = muser.Head.load(path, device="cuda", route="fused", acts="q8")
for t in (1, 8):
    x = torch.from_numpy(np.random.default_rng(t).standard_normal((t, SEED_SHAPE["hidden"]), dtype=np.float32)).cuda()
    pos = np.arange(t)
    for name, kw in (("plain", None), ("greedy", dict(temperature=0.0)), ("temp 1", dict(temperature=1.0)), ("top_p", dict(temperature=1.0, top_p=0.9)), ("top_k", dict(temperature=1.0, top_k=50))):
        fn = (lambda: head(x, on_device=True)) if kw is None else (lambda kw=kw: head.sample(x, seed=0, positions=pos, **kw))
        for _ in range(3): fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10): fn()
            torch.cuda.synchronize()
        ev = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                ev.setdefault(e.name[:70], []).append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
        tot = sum(sum(v) for v in ev.values()) / 10
        print(f"t={t} {name}: device total {tot:.1f} us/call")
        for k, v in sorted(ev.items(), key=lambda kv: -sum(kv[1]))[:12]:
            print(f"   {sum(v)/10:8.1f} us  x{len(v)/10:.1f}  {k}")
