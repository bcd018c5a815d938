"""Launch the LM-head matvec a few times for Nsight Compute to read:

    ncu --clock-control none -k regex:matvec_canon --launch-skip 1 --launch-count 3 \\
        --section SpeedOfLight --section WarpStateStats ... python3 bench/cuda_profile_matvec.py head.gguf

runs route canonical at t = 1, 1, 8, 8 (the first launch warms up). The head
file is any GGUF head, e.g. the one bench/cuda_head.py --file writes.
"""
import sys

import numpy as np

import muser

path = sys.argv[1]
head = muser.Head.load(path, device="cuda", route="canonical")
H = head.spec.hidden_size
rng = np.random.default_rng(0)
for t in (1, 1, 8, 8):
    head(rng.standard_normal((t, H), dtype=np.float32))
print("ran t = 1, 1, 8, 8 on", head)
