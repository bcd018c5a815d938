"""muser's CUDA head against the GPU's read limit and PyTorch bf16 F.linear.

    python bench/cuda_head.py [--json out.json] [--routes graph,fused,canonical] [--acts f32,q8] [--tokens 1,8]
    python -m muser bench --device cuda -- [the same options]

Writes a random Q5_K head of the seed's shape (202,048 x 6,656) to a
temporary file, then in one run measures the read limit, each route with
f32 and q8 activations at t = 1 and 8, and torch's bf16 F.linear (+ the soft
cap); see muser/_cuda_bench.py. The batch sweep of issue 14:

    python bench/cuda_head.py --tokens 1,2,4,8,16,32,64,128,256 --reps 10

prints, per route, acts and t, the GPU time against the read limit and the
compute bound (int8 tensor cores for q8, FP32 FMA for f32) and the per-call time.
"""
import sys

from muser._cuda_bench import main

if __name__ == "__main__":
    sys.exit(main())
