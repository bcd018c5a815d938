"""muser's CUDA head against the GPU's read limit and PyTorch bf16 F.linear.

    python bench/cuda_head.py [--json out.json] [--routes graph,fused,canonical] [--acts f32,q8] [--tokens 1,8]
    python -m muser bench --device cuda -- [the same options]

Writes a random Q5_K head of the seed's shape (202,048 x 6,656) to a
temporary file, then in one run measures the read limit, each route with
f32 and q8 activations at t = 1 and 8, and torch's bf16 F.linear; see
muser/_cuda_bench.py.
"""
import sys

from muser._cuda_bench import main

if __name__ == "__main__":
    sys.exit(main())
