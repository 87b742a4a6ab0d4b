"""Profile one meanvar GPN layer step (50 -> 50, batch 256, forward + backward) on the default
backend: wall time with validation on and off against Linear+tanh, then cProfile by internal time.

    OMP_NUM_THREADS=1 python benchmarks/profile_layer.py
"""

from __future__ import annotations

import cProfile
import pstats
import time

import torch

import pyro_gpn.settings as settings
from pyro_gpn import GPNLayer
from pyro_gpn.moments.gaussian import Moments


def main(steps: int = 200) -> None:
    torch.manual_seed(0)
    layer = GPNLayer(50, 50)
    x = Moments(torch.randn(256, 50) * 0.5, torch.rand(256, 50) * 0.1)

    def step() -> None:
        out = layer.propagate(x, "meanvar")
        (out.mean.sum() + out.var.sum()).backward()

    for _ in range(20):  # warm-up (numba kernels load from the cache)
        step()
    for validate in (True, False):
        with settings.validation(validate):
            start = time.perf_counter()
            for _ in range(steps):
                step()
        elapsed_ms = (time.perf_counter() - start) / steps * 1e3
        print(f"GPN meanvar, validation {validate}: {elapsed_ms:.3f} ms")
    linear, inputs = torch.nn.Linear(50, 50), torch.randn(256, 50)
    start = time.perf_counter()
    for _ in range(steps):
        torch.tanh(linear(inputs)).sum().backward()
    print(f"Linear+tanh: {(time.perf_counter() - start) / steps * 1e3:.3f} ms")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps // 2):
        step()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
