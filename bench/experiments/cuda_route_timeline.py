"""The route's kernels on the GPU's own clock: torch.profiler (CUPTI) records
each kernel's start and duration, so the overlap that programmatic dependent
launch allows, the gap between the graph's launch and its first kernel, and
the soft-cap tail after the matvec are visible (no nsys on the device
machine). Three calls of the seed head (random Q5_K 202,048 x 6,656,
acts="q8") per route, after ten warm-ups:

    python bench/experiments/cuda_route_timeline.py [head.gguf] [t] [routes] [acts]

(or any GGUF head file, batch size, comma-separated routes -- fused,graph by
default -- and activation mode -- q8 by default -- given) prints, per device
event: start (us from the first event), duration, the gap to the previous
event's end (negative: overlapping) and the kernel's name. E.g. the
canonical Q6_K route, whose matvec runs ~230 us longer with programmatic
dependent launch than without (docs/performance.md, "Found: Q6_K's routes"):

    python bench/cuda_head.py --weight-type Q6_K --file q6k.gguf --routes canonical --acts f32 --tokens 1 --no-torch
    python bench/experiments/cuda_route_timeline.py q6k.gguf 1 canonical f32
    MUSER_PDL=0 python bench/experiments/cuda_route_timeline.py q6k.gguf 1 canonical f32
"""
import json, sys
import numpy as np, torch, muser
from muser._cuda_bench import write_random_head
if len(sys.argv) > 1:
    p = sys.argv[1]
else:
    p = "/tmp/head.gguf"
    write_random_head(p, 6656, 202048, "Q5_K")
t = int(sys.argv[2]) if len(sys.argv) > 2 else 1
routes = sys.argv[3].split(",") if len(sys.argv) > 3 else ["fused", "graph"]
acts = sys.argv[4] if len(sys.argv) > 4 else "q8"
for route in routes:
    h = muser.Head.load(p, device="cuda", route=route, acts=acts)
    H = h.spec.hidden_size
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((t, H), dtype=np.float32)).cuda()
    for _ in range(10):
        h(x, on_device=True)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            h(x, on_device=True)
        torch.cuda.synchronize()
    prof.export_chrome_trace(f"/tmp/trace_{route}.json")
    ev = [e for e in json.load(open(f"/tmp/trace_{route}.json"))["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    ev.sort(key=lambda e: e["ts"])
    print(f"== {route}: {len(ev)} device events")
    t0 = ev[0]["ts"]
    prev_end = None
    for e in ev:
        gap = "" if prev_end is None else f"gap {e['ts'] - prev_end:7.2f}"
        print(f"{e['ts'] - t0:9.2f} +{e['dur']:8.2f}  {gap:>13}  {e['name'][:60]}")
        prev_end = e["ts"] + e["dur"]
    del h
