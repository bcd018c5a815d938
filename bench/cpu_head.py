"""CPU head benchmark: muser's routes (t = 1 and 8, acts f32 and q8) against
ggml's CPU kernels at equal thread counts and against the read bandwidth
measured in the same run. The logic is muser._bench_cpu (also
``python -m muser bench``); its docstring says what is timed and how.

    python bench/cpu_head.py                      # threads 1 and all; --json out.json
    taskset -c 0 python bench/cpu_head.py --threads 1
"""
import sys

from muser._bench_cpu import main

if __name__ == "__main__":
    sys.exit(main(prog="bench/cpu_head.py"))
