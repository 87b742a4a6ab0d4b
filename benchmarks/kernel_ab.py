"""A/B timing of the fused CPU layer kernels: the package's ``_numba_kernels`` against another
version of that module (a patched copy), side by side in one process.

The layer response (:func:`pyro_gpn.moments.cpu_layer.cpu_layer_response`, meanvar, forward and
backward) runs with each kernel module in turn, interleaved round by round, one thread, on
``rows`` activations of ``units`` units with a shared equidistant grid (R = 14 on [-2, 2]),
lengthscale ``--lengthscale``, target variance 0.01, activation means ``N(0, 1.5^2)`` and input
variances 0 (a first layer) or ``U(0, 0.07)``. Reports median process CPU time per (row, unit)
and the largest relative difference of every output and gradient between the two versions.
The default shape is the first layer of the MNIST GPN CNN of ``benchmarks/cnn_step.py``
(64 images x 28 x 28 positions, 8 channels).

    git show REV:pyro_gpn/moments/_numba_kernels.py > /tmp/old_kernels.py
    OMP_NUM_THREADS=1 python benchmarks/kernel_ab.py /tmp/old_kernels.py

A patch file (``git apply``-able, e.g. ``docs/results/attempts/*.patch``) can be given instead
of a module: it is applied to a temporary copy of the package's module.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from pyro_gpn.moments import cpu_layer
from pyro_gpn.moments.cpu_kernels import _kernels

ROOT = Path(__file__).resolve().parents[1]
MODULE = "pyro_gpn/moments/_numba_kernels.py"


def load_alternative(path: str):
    """The kernel module at ``path`` (a ``.py`` file, or a patch to the package's module)."""
    src = Path(path)
    if src.suffix == ".patch":
        tmp = Path(tempfile.mkdtemp())
        (tmp / Path(MODULE).parent).mkdir(parents=True)
        (tmp / MODULE).write_text((ROOT / MODULE).read_text())
        subprocess.run(["git", "apply", str(src.resolve())], cwd=tmp, check=True)
        src = tmp / MODULE
    spec = importlib.util.spec_from_file_location("alternative_kernels", src)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("alternative", help="a _numba_kernels.py version or a patch to it")
    parser.add_argument("--rows", type=int, default=64 * 28 * 28)
    parser.add_argument("--units", type=int, default=8)
    parser.add_argument("--lengthscale", type=float, default=0.4)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    modules = {"package": _kernels()[1], "alternative": load_alternative(args.alternative)}
    current = ["package"]
    cpu_layer._k = lambda name: getattr(modules[current[0]], name + "_serial")
    S, N, R = args.rows, args.units, 14
    V = torch.linspace(-2, 2, R, dtype=torch.float64).expand(1, R).contiguous()
    f64 = {"dtype": torch.float64}
    lam = torch.full((N,), args.lengthscale, **f64, requires_grad=True)
    U = torch.tanh(V.expand(N, R)).clone().requires_grad_()
    Svar = torch.full((N, R), 0.01, **f64, requires_grad=True)
    print(f"rows {S}, units {N}, lengthscale {args.lengthscale}, load {os.getloadavg()}")
    for label, scale in (("v = 0", 0.0), ("v ~ U(0, 0.07)", 0.07)):
        mu = (1.5 * torch.randn(S, N, **f64)).requires_grad_()
        v = (scale * torch.rand(S, N, **f64)).requires_grad_()
        times = {k: ([], []) for k in modules}
        outputs = {}
        for rnd in range(args.rounds + 1):
            for k in modules:
                current[0] = k
                for p in (mu, v, lam, U, Svar):
                    p.grad = None
                t0 = time.process_time()
                mean, var = cpu_layer.cpu_layer_response(mu, v, V, lam, U, Svar, None, 1e-6)
                t1 = time.process_time()
                (mean.sum() + 0.3 * var.sum()).backward()
                t2 = time.process_time()
                if rnd:  # round 0 compiles / loads the kernels
                    times[k][0].append(t1 - t0)
                    times[k][1].append(t2 - t1)
                outputs[k] = [t.detach() for t in (mean, var, mu.grad, v.grad, lam.grad, U.grad)]
        diff = max(
            float((a - b).abs().max() / a.abs().max().clamp_min(1e-300))
            for a, b in zip(outputs["package"], outputs["alternative"], strict=True)
        )
        (fp, bp), (fa, ba) = (
            [statistics.median(t) / (S * N) * 1e9 for t in times[k]] for k in modules
        )
        print(
            f"  {label:15s} forward: package {fp:6.1f}, alternative {fa:6.1f} ns/element "
            f"({fp / fa:.2f}x) | backward: {bp:6.1f}, {ba:6.1f} ({bp / ba:.2f}x) | "
            f"max rel. difference {diff:.1e}"
        )


if __name__ == "__main__":
    sys.exit(main())
