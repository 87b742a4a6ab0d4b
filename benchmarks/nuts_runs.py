"""The NUTS runs of ``docs/results/nuts.md``: convergence (r-hat, bulk ESS, divergences) on the
identified quantities, wall time and test log-likelihood for one configuration.

Runs (``--run``):

* ``synthetic``: ``NonParametricGPN(sizes)`` on the routes' synthetic problem
  (``synthetic_1d(60, 100, seed=0)``: 54 training rows, 100 test rows);
* ``uci``: ``NonParametricGPN(sizes)`` on a UCI regression split (``--dataset``, ``--split``),
  the training split without its validation hold-out;
* ``sampled-u``: ``SampledTargetsGPN(sizes)`` on a UCI regression split, optionally the first
  ``--max-train`` training rows;
* ``moons``: classification, two interleaving half circles (``sklearn.datasets.make_moons``,
  ``--n-train`` rows, noise 0.2), ``--model nonparametric`` or ``sampled-u``.

r-hat and ESS are ArviZ's rank-normalised split r-hat and bulk ESS over the posterior predictive
test outputs (regression: ``y_test``; classification: the class probabilities ``p_test``) and
the noise scales; latent sites (weights, hidden outputs, targets) are not identified (unit
permutations, sign flips) and are not reported. Test log-likelihood in original target units:
``lpd`` is the mean over test rows of ``log mean_d p(y_j | theta_d)``; ``ll_gauss`` that of the
moment-matched Gaussian of the predictive draws (what ``docs/results/routes.md`` reports).

Progress: a line per chain every ``--progress-every`` iterations on stderr; with
``--checkpoint-dir`` every finished chain is saved and a rerun of the same command resumes.

Example::

    OMP_NUM_THREADS=1 python -m benchmarks.nuts_runs --run synthetic --sizes 1 4 1 \\
        --checkpoint-dir /tmp/nuts_synthetic --out docs/results/nuts_runs/synthetic.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

from benchmarks.nuts_common import (
    add_problem_args,
    add_sampler_args,
    build_problem,
    convergence,
    sampler_kwargs,
    settings_of,
)
from pyro_gpn.diagnostics import heldout_lpd_from_draws
from pyro_gpn.inference.mcmc import run_nuts


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_problem_args(parser)
    add_sampler_args(parser, chains=4, draws=500)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    model, x, y, x_test, y_test, y_std, task = build_problem(args)
    cpu = time.process_time()
    result = run_nuts(model, x, y, x_test, **sampler_kwargs(args))
    cpu = time.process_time() - cpu
    noise = [s for s in model.parameter_sites() if s.startswith("sigma")]
    pred = "y_test" if task == "regression" else "p_test"
    lpd = heldout_lpd_from_draws(result.test_log_density(y_test))
    report = {
        "settings": settings_of(args),
        "rows": {"train": len(x), "test": len(x_test)},
        "machine": f"{platform.machine()}, torch {torch.__version__}, threads "
        f"{torch.get_num_threads()}",
        "cpu_s_this_process": round(cpu, 1),
        "chain_cpu_s": result.chain_cpu_s,
        **convergence(result, noise, pred),
        "test_lpd": float(lpd.mean() - math.log(y_std)),
    }
    if task == "regression":
        draws = result.y_test
        mean, var = draws.mean(0), draws.var(0)
        gauss = -0.5 * (math.log(2 * math.pi) + var.log() + (y_test - mean) ** 2 / var)
        report["test_ll_gauss"] = float(gauss.mean() - math.log(y_std))
        report["test_rmse"] = float((mean - y_test).square().mean().sqrt() * y_std)
    else:
        probs = result.predict().probs
        report["test_accuracy"] = float((probs.argmax(-1) == y_test.long()).double().mean())
    print(json.dumps(report))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
