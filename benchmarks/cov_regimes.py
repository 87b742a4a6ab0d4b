"""Cost of ``"cov"`` mode where Mehler's series needs many terms or leaves pairs to ``Lambda``:
broad activations correlated near +-1 (issue 13; ``docs/results/layer_speed.md``).

A 50 -> 50 GPN layer (float64 algebra, the default) at batch 256, forward + backward, fed full
activation covariances ``scale * (W / 5 u u^T + 0.05 A A^T) + 1e-3 I`` per sample (``u`` a
random unit-scale direction: one dominant common factor, so most pairs are correlated near
+-1; the larger ``scale``, the broader the activations against the lengthscale), for
``--scales``; the package now and, with ``--baseline REV``, at ``REV`` side by side (process
CPU time, median of ``--rounds``). Also reports how many unit pairs the series served, how
many terms it took and how many pairs it left to ``Lambda``::

    OMP_NUM_THREADS=1 python benchmarks/cov_regimes.py --baseline b441324
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
from pyro_gpn import GPNLayer  # noqa: E402
from pyro_gpn.moments import Moments, cross  # noqa: E402


def inputs(scale: float, batch: int = 256, width: int = 50, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mean = torch.rand(batch, width, generator=g)
    u = torch.randn(batch, width, 1, generator=g) / width**0.5
    a = torch.randn(batch, width, width, generator=g) / width
    cov = scale * (u @ u.mT * width / 5 + 0.05 * a @ a.mT) + 1e-3 * torch.eye(width)
    return mean, cov


def served(layer: GPNLayer, mean, cov) -> tuple[int, int, int]:
    """(pairs served by the series, its largest number of terms, pairs left to Lambda)."""
    from pyro_gpn.moments import cpu_mehler

    seen = {}
    rules = [(cross, "_mehler_terms"), (cpu_mehler, "cpu_mehler_terms")]
    originals = [getattr(module, name) for module, name in rules]

    def spy(original):
        def rule(*args):
            out = original(*args)
            seen["terms"] = out[0]
            return out

        return rule

    for (module, name), original in zip(rules, originals):
        setattr(module, name, spy(original))
    series = cross._mehler_cross_covariance

    def served_pairs(*args):
        out, unbounded = series(*args)
        seen["left"] = 0 if unbounded is None else int(unbounded.sum()) // 2
        return out, unbounded

    cross._mehler_cross_covariance = served_pairs
    try:
        with torch.no_grad():
            layer.propagate(Moments(mean, cov=cov, validate=False), "cov")
    finally:
        for (module, name), original in zip(rules, originals):
            setattr(module, name, original)
        cross._mehler_cross_covariance = series
    pairs = mean.shape[0] * mean.shape[1] * (mean.shape[1] - 1) // 2
    return pairs - seen["left"], seen["terms"], seen["left"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[0.1, 1.0, 3.0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="also time the package at this rev")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load {os.getloadavg()}, torch {torch.__version__}, one thread")
    base = load_baseline(args.baseline) if args.baseline else None
    for scale in args.scales:
        mean, cov = inputs(scale)
        torch.manual_seed(0)
        layers = {"now": (GPNLayer(50, 50), Moments)}
        if base is not None:
            torch.manual_seed(0)
            layers[f"@{args.baseline}"] = (base.GPNLayer(50, 50), base.Moments)
        times = {key: [] for key in layers}
        for _ in range(args.rounds):
            for key, (layer, moments) in layers.items():
                start = time.process_time()
                out = layer.propagate(moments(mean, cov=cov, validate=False), "cov")
                (out.mean.sum() + out.cov.sum()).backward()
                times[key].append(time.process_time() - start)
        count, terms, left = served(layers["now"][0], mean, cov)
        line = ", ".join(f"{k} {statistics.median(v) * 1e3:8.1f} ms" for k, v in times.items())
        print(
            f"scale {scale:g}: {line} | series: {count} pairs, up to {terms} terms; "
            f"Lambda: {left} pairs",
            flush=True,
        )


if __name__ == "__main__":
    main()
