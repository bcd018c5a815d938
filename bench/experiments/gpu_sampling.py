"""The board's SM clock and power, sampled by nvidia-smi while work runs: the
one sampler the CUDA power benches share (bench/experiments/cuda_stream_power.py,
bench/experiments/cuda_route_power.py).

    with GpuSampler() as s:
        run_the_work()
    print(s.summary())
"""
import statistics
import subprocess


class GpuSampler:
    """nvidia-smi every `period_ms` from entry to exit; the first four samples
    and the last one (the ramp at both ends) are dropped."""

    def __init__(self, period_ms: int = 50):
        self.period_ms = period_ms
        self.clocks: list[float] = []
        self.watts: list[float] = []

    def __enter__(self) -> "GpuSampler":
        self._mon = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                                      "--format=csv,noheader,nounits", "-lms", str(self.period_ms)],
                                     stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc) -> None:
        self._mon.terminate()
        for line in self._mon.communicate()[0].strip().splitlines()[4:-1]:
            clock, watts = line.split(",")
            self.clocks.append(float(clock))
            self.watts.append(float(watts))

    def summary(self) -> str:
        return (f"SM clock mean {statistics.mean(self.clocks):5.0f} MHz (min {min(self.clocks):5.0f})   "
                f"power mean {statistics.mean(self.watts):4.0f} W (max {max(self.watts):4.0f})")
