"""Launch the LM-head matvec a few times for Nsight Compute to read:

    ncu --clock-control none -k regex:"matvec_(canon|q8)_kernel" \\
        --metrics smsp__inst_executed.sum,sm__inst_executed_pipe_fma.sum,... \\
        python3 bench/experiments/cuda_profile_matvec.py head.gguf [f32,q8] [1,1,8,8]

runs route canonical at t = 1, 1, 8, 8 (or the batch sizes given; the first
launch of each t warms up) for each activation mode named (f32 by default; q8: int8 activations,
whose quantize kernel ncu skips with the -k filter above). The head file is
any GGUF head, e.g. the one bench/cuda_head.py --file writes.
"""
import sys

import numpy as np

import muser

path = sys.argv[1]
modes = (sys.argv[2] if len(sys.argv) > 2 else "f32").split(",")
tokens = [int(v) for v in (sys.argv[3] if len(sys.argv) > 3 else "1,1,8,8").split(",")]
rng = np.random.default_rng(0)
for acts in modes:
    head = muser.Head.load(path, device="cuda", route="canonical", acts=acts)
    H = head.spec.hidden_size
    for t in tokens:
        head(rng.standard_normal((t, H), dtype=np.float32))
    print(f"ran t = {', '.join(map(str, tokens))} on {head}")
    del head
