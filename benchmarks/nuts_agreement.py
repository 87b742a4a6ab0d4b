"""The margins of the two-layer agreement test (issue 16, Build 5), and its power.

Runs the two independent NUTS runs of
``tests/inference/test_mcmc.py::test_two_layer_runs_from_independent_starts_agree`` (the test's own
functions, seeds 0 and 1) and a third run of the same network with the noise prior's median
tripled (seed 1), then prints, per compared quantity, the largest ``|difference| / combined mcse``
and the smallest ESS of the means: the correct pair must stay within the test's 4, the mutated
pair should not. Writes the draws of each run to ``--out`` (a ``torch.save`` file) when given.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python -m benchmarks.nuts_agreement
"""

from __future__ import annotations

import argparse
import math
import time

import pyro.distributions as dist
import torch

from pyro_gpn.diagnostics import max_rhat, min_ess
from tests.inference.test_mcmc import _identified_draws, _two_layer_run
from tests.mc import mcmc_runs_difference


def _run(label: str, seed: int, **model_options) -> dict[str, torch.Tensor]:
    start = time.perf_counter()
    result = _two_layer_run(seed, **model_options)
    idata = result.to_arviz()
    print(
        f"{label} (seed {seed}): {time.perf_counter() - start:.0f} s, max r-hat y_test "
        f"{max_rhat(idata, ['y_test'], group='posterior_predictive'):.4f} / sigma2 "
        f"{max_rhat(idata, ['sigma2']):.4f}, min bulk ESS "
        f"{min_ess(idata, ['y_test'], group='posterior_predictive'):.0f} / "
        f"{min_ess(idata, ['sigma2']):.0f}, divergences {result.divergence_rate:.2%}",
        flush=True,
    )
    return _identified_draws(result)


def _compare(label: str, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for name in a:
        z, ess, difference = mcmc_runs_difference(a[name], b[name])
        print(
            f"{label}, {name}: max |difference| / mcse {z.max().item():.2f}, "
            f"min ESS of the means {ess.min().item():.0f}, "
            f"max |difference| {difference.max().item():.4f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="torch.save file for the runs' draws")
    args = parser.parse_args()
    first = _run("run A", 0)
    second = _run("run B", 1)
    _compare("A vs B", first, second)
    tripled = dist.LogNormal(
        torch.tensor(math.log(0.3), dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    )
    mutated = _run("run B, noise prior median x3", 1, noise_prior=tripled)
    _compare("A vs mutated B", first, mutated)
    if args.out:
        torch.save({"A": first, "B": second, "mutated": mutated}, args.out)


if __name__ == "__main__":
    main()
