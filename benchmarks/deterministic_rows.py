"""The fused CPU row kernels on deterministic activations (``v = 0``), this checkout against an
older revision, side by side in one process.

Deterministic activations are what a first layer with point weights sees (kin8nm's chosen
network, the paper's networks, a GPN CNN's first convolution), and a CNN's zero patches give
runs of equal ones. Times :func:`~pyro_gpn.moments.cpu_kernels.cpu_response_meanvar` forward
and backward (a fixed random projection of mean and variance) of both packages on the same
``[S, N]`` activations, interleaved call by call, median process-CPU time of ``--rounds`` calls:

* ``distinct``: every activation different (``N(0, 1.5^2)`` means, lengthscales 0.4-1.4,
  14 equidistant points on [-2, 2], ``K + S`` well-conditioned);
* ``runs``: the same with ``--run-fraction`` of each unit's rows in runs of 16 equal
  activations (a CNN's background).

Also reports the largest relative difference of the two packages' outputs and gradients (the
new rows take the one-node rule everywhere, the old ones the closed form where its error bound
allowed: they differ at most by that bound, 1e-6)::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/deterministic_rows.py --baseline HEAD
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.layer_speed import load_baseline  # noqa: E402
from pyro_gpn.moments.cpu_kernels import (  # noqa: E402
    cpu_response_meanvar,
    cpu_virtual_observation_weights,
)

F64 = torch.float64


def inputs(S: int, N: int, run_fraction: float, seed: int = 0):
    """Means ``[S, N]`` (runs of 16 equal rows over ``run_fraction`` of them), zero variances,
    and one parametric layer's ``V, lam, beta, kappa, noise``."""
    g = torch.Generator().manual_seed(seed)
    R = 14
    mu = 1.5 * torch.randn(S, N, generator=g, dtype=F64)
    if run_fraction > 0:
        starts = torch.arange(0, S, 16)
        chosen = starts[torch.rand(len(starts), generator=g) < run_fraction]
        for s0 in chosen.tolist():
            mu[s0 : s0 + 16] = mu[s0]
    V = torch.linspace(-2, 2, R, dtype=F64).expand(N, R).contiguous()
    lam = 0.4 + torch.rand(N, generator=g, dtype=F64)
    U = torch.randn(N, R, generator=g, dtype=F64)
    Svar = 0.05 * (0.5 + torch.rand(N, R, generator=g, dtype=F64))
    kappa, beta = cpu_virtual_observation_weights(V, U, Svar, lam)
    noise = torch.full((N,), 0.01, dtype=F64)
    return mu, torch.zeros_like(mu), V, lam, beta.detach(), kappa.detach(), noise


def step(fn, tensors, proj):
    """Forward and backward of ``fn`` on fresh leaves; returns outputs and gradients."""
    mu, v, V, lam, beta, kappa, noise = (t.detach().clone() for t in tensors)
    leaves = [t.requires_grad_() for t in (mu, lam, beta, kappa)]
    mean, var = fn(mu, v, V, lam, beta, kappa, noise)
    ((mean * proj[0]).sum() + (var * proj[1]).sum()).backward()
    return [mean.detach(), var.detach()] + [t.grad for t in leaves]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD", help="git revision to compare with")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--units", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--run-fraction", type=float, default=0.65)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base = load_baseline(args.baseline)
    import pyro_gpn_base.moments.cpu_kernels  # noqa: F401

    fns = {
        "new": cpu_response_meanvar,
        f"@{args.baseline}": base.moments.cpu_kernels.cpu_response_meanvar,
    }
    print(
        f"load {os.getloadavg()}, torch {torch.__version__}, one thread, rows {args.rows}, "
        f"units {args.units}, rounds {args.rounds}, baseline {args.baseline}"
    )
    for case, fraction in (("distinct", 0.0), ("runs", args.run_fraction)):
        tensors = inputs(args.rows, args.units, fraction)
        g = torch.Generator().manual_seed(1)
        proj = [torch.randn(args.rows, args.units, generator=g, dtype=F64) for _ in range(2)]
        outs = {k: step(fn, tensors, proj) for k, fn in fns.items()}  # warm-up, compile
        a, b = outs.values()
        diff = max(
            float(((x - y).abs() / y.abs().max().clamp_min(1e-300)).max()) for x, y in zip(a, b)
        )
        times = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, fn in fns.items():
                t = time.process_time()
                step(fn, tensors, proj)
                times[k].append(time.process_time() - t)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        new, old = med.values()
        repeated = float((tensors[0][1:] == tensors[0][:-1]).double().mean())
        print(
            f"  {case:9s} (rows equal to the previous: {repeated:.2f})  new {new:.3f} ms, "
            f"@{args.baseline} {old:.3f} ms, speed-up {old / new:.2f}x; largest relative "
            f"difference of outputs and gradients {diff:.1e}"
        )
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
