"""Time and power of the q8 matvec's weight stream, copy mechanism by layout.

    python bench/experiments/cuda_stream_power.py [--seconds 2] [--only NAME,...]

Builds bench/experiments/cuda_stream_power.cu with nvcc, prints every variant's median
kernel time against the plain read kernel, then runs each variant alone in a
loop while nvidia-smi samples the SM clock and the board power, so a
variant that streams as fast but draws more power (and, beside the matvec's
arithmetic, meets the board's power cap) shows up. See the .cu for the
variants.
"""
import argparse
import os
import subprocess
import sys
import tempfile

from gpu_sampling import GpuSampler

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--only", help="comma-separated variant names")
    args = p.parse_args()
    exe = os.path.join(tempfile.mkdtemp(prefix="muser-sp-"), "sp")
    src = os.path.join(HERE, "..", "src")
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", f"-I{src}/cpp", f"-I{src}/cuda", "-o", exe,
                    os.path.join(HERE, "cuda_stream_power.cu")], check=True)
    listing = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    print(listing, end="")
    names = [line[:22].strip() for line in listing.splitlines()[1:]]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    print(f"each alone for {args.seconds:g} s, nvidia-smi every 50 ms:")
    for name in names:
        with GpuSampler() as s:
            out = subprocess.run([exe, name, str(args.seconds)], capture_output=True, text=True, check=True).stdout
        print(f"{out.strip()}   {s.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
