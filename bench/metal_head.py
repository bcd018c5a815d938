"""muser's Metal head against the GPU's read limit (the CUDA bench's twin).

    python bench/metal_head.py [--json out.json] [--routes graph,fused,canonical[,pinned]] [--acts f32,q8] [--tokens 1,8]

Writes a random Q5_K head of the seed's shape (202,048 x 6,656) to a
temporary file, then in one run measures the read limit (a Metal read kernel
over a buffer the weight's size), each route with f32 and q8 activations at
t = 1 and 8, and the ratios against the limit; see muser/_metal_bench.py.
Exits 2 with the reason on a build without Metal.

On the Linux emulator (test-only) run it small to prove it works:
    python bench/metal_head.py --hidden 256 --vocab 2048 --reps 2 --warmup 1
Emulator times mean nothing (every GPU thread is ~1 us of CPU); the output says so.
"""
import sys

from muser._metal_bench import main

if __name__ == "__main__":
    sys.exit(main())
