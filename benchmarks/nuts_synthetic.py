"""NUTS on the non-parametric GPN for a noisy sine: convergence, coverage and wall time.

Data: ``y = sin(x) + N(0, 0.1^2)`` with one ``x`` uniform in each of ``--num-train`` equal cells
of [-3, 3]; test inputs on a grid over [-2.7, 2.7]. Reports the wall time of the chains, the
largest r-hat and smallest bulk / tail ESS over the identified quantities (output noise
``sigma_L`` and the test predictions ``y_test``), the number of divergent transitions, and how
many test points have ``sin(x)`` inside the 90 % posterior predictive interval.

Example (the run recorded in ``docs/results/nuts_synthetic.md``)::

    OMP_NUM_THREADS=1 python -m benchmarks.nuts_synthetic --sizes 1 2 1 --num-train 20 \\
        --num-test 10 --samples 200 --warmup 200 --chains 2 --seed 0
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from benchmarks.nuts_common import add_sampler_args, sampler_kwargs, settings_of
from pyro_gpn.diagnostics import max_rhat, min_ess, num_divergences
from pyro_gpn.inference.mcmc import run_nuts
from pyro_gpn.models.nonparametric import NonParametricGPN

NOISE = 0.1


def sine_data(num_train: int, num_test: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    cells = torch.arange(num_train, dtype=torch.float64)
    x = (cells + torch.rand(num_train, generator=g, dtype=torch.float64)) * 6 / num_train - 3
    y = torch.sin(x) + NOISE * torch.randn(num_train, generator=g, dtype=torch.float64)
    x_test = torch.linspace(-2.7, 2.7, num_test, dtype=torch.float64)
    return x[:, None], y, x_test[:, None]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 1])
    parser.add_argument("--num-train", type=int, default=20)
    parser.add_argument("--num-test", type=int, default=10)
    parser.add_argument("--data-seed", type=int, default=1)
    add_sampler_args(parser, chains=2, draws=200)
    parser.add_argument("--centred", action="store_true", help="whiten=False")
    parser.add_argument("--joint", action="store_true", help="test rows inside the chain")
    args = parser.parse_args(argv)

    x, y, x_test = sine_data(args.num_train, args.num_test, args.data_seed)
    model = NonParametricGPN(args.sizes, whiten=not args.centred)
    result = run_nuts(model, x, y, x_test, joint=args.joint, **sampler_kwargs(args))
    idata = result.to_arviz()
    last = f"sigma{len(args.sizes) - 1}"
    test_group = "posterior" if args.joint else "posterior_predictive"
    truth = torch.sin(x_test[:, 0])
    low, high = result.y_test.quantile(0.05, dim=0), result.y_test.quantile(0.95, dim=0)
    report = {
        "settings": settings_of(args),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "wall_time_s": round(result.wall_time_s, 1),
        "max_rhat_sigma_out": round(max_rhat(idata, [last]), 3),
        "max_rhat_y_test": round(max_rhat(idata, ["y_test"], group=test_group), 3),
        "min_ess_bulk": round(
            min(min_ess(idata, [last]), min_ess(idata, ["y_test"], group=test_group)), 1
        ),
        "min_ess_tail": round(
            min(
                min_ess(idata, [last], kind="tail"),
                min_ess(idata, ["y_test"], kind="tail", group=test_group),
            ),
            1,
        ),
        "divergences": num_divergences(idata),
        "draws": result.num_chains * result.num_samples,
        "coverage_90": f"{int(((truth >= low) & (truth <= high)).sum())}/{len(truth)}",
        "interval_width_mean": round((high - low).mean().item(), 3),
        "rmse_mean_vs_sin": round((result.y_test.mean(0) - truth).square().mean().sqrt().item(), 3),
        "sigma_out_median": round(result.samples[last].median().item(), 3),
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
