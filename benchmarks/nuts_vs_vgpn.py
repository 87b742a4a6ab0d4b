"""Does the variational GPN under-estimate the posterior spread? The sampled-targets posterior
(NUTS over ``U`` and the weights, :class:`~pyro_gpn.models.sampled_targets.SampledTargetsGPN`)
against the closed-form variational GPN (``q(U)``, ``q(W)``; :func:`~pyro_gpn.inference.fit_vgpn`
at the library's recommendations) of the same widths on the same training rows: per test row
the ratio of the predictive standard deviations (classification: of the standard deviation
of the class-1 probability under the posterior), the coverage of the central 90 % intervals,
test log-likelihood and RMSE (classification: accuracy and negative log-likelihood); behind
``docs/results/nuts.md``, issue 16's Build 3.

The two models share the widths and the data, not every prior: the variational GPN learns its
lengthscales and has its own number of inducing points, so a ratio far from 1 says how much
the two routes' predictive spreads differ, not which approximation of one posterior is worse.

Example::

    OMP_NUM_THREADS=1 python -m benchmarks.nuts_vs_vgpn --run synthetic --sizes 1 4 1 \\
        --chains 4 --workers 2 --warmup 300 --samples 300
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
from pyro_gpn.inference.mcmc import run_nuts


def _summary(mean: torch.Tensor, std: torch.Tensor, y: torch.Tensor, y_std: float) -> dict:
    """Gaussian test log-likelihood, RMSE (original units) and 90 % interval coverage."""
    z = 1.6448536269514722
    ll = -0.5 * (math.log(2 * math.pi) + 2 * std.log() + ((y - mean) / std) ** 2)
    return {
        "test_ll_gauss": float(ll.mean() - math.log(y_std)),
        "test_rmse": float((mean - y).square().mean().sqrt() * y_std),
        "coverage90": float(((y - mean).abs() <= z * std).double().mean()),
    }


def _class_summary(probs: torch.Tensor, labels: torch.Tensor) -> dict:
    """Test accuracy and mean negative log-likelihood of the predictive class probabilities."""
    labels = labels.long()
    picked = probs.gather(-1, labels[:, None])[:, 0].clamp_min(1e-12)
    return {
        "test_accuracy": float((probs.argmax(-1) == labels).double().mean()),
        "test_nll": float(-picked.log().mean()),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_problem_args(parser)
    add_sampler_args(parser, chains=4, draws=300)
    parser.add_argument("--vgpn-steps", type=int, default=None, help="default: recommended")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.model = "sampled-u"
    model, x, y, x_test, y_test, y_std, task = build_problem(args)
    cpu = time.process_time()
    result = run_nuts(model, x, y, x_test, **sampler_kwargs(args))
    nuts_cpu = time.process_time() - cpu
    nuts = result.predict()

    from pyro_gpn.inference.closed_form import fit_vgpn
    from pyro_gpn.models.variational import VariationalGPN

    cpu = time.process_time()
    if task == "regression":
        vgpn = VariationalGPN(args.sizes, head="gaussian")
        # the paper's ELBO: q is compared as a posterior approximation (the predictive
        # objective, the library's default since uci.md section 10, is not one)
        fit = fit_vgpn(
            vgpn, x, y[:, None], num_steps=args.vgpn_steps, seed=args.seed, elbo="closed_form"
        )
    else:  # the Bernoulli NUTS model against a two-class softmax head
        vgpn = VariationalGPN([*args.sizes[:-1], 2], head="softmax")
        fit = fit_vgpn(
            vgpn, x, y.long(), num_steps=args.vgpn_steps, seed=args.seed, elbo="closed_form"
        )
    vgpn_cpu = time.process_time() - cpu
    pred = vgpn.predict(x_test)
    if task == "regression":
        summary = {"nuts": _summary(nuts.mean, nuts.std, y_test, y_std)}
        summary["vgpn"] = _summary(pred.mean[:, 0], pred.std[:, 0], y_test, y_std)
        ratio = pred.std[:, 0] / nuts.std
    else:  # spread of the probability of class 1 under each posterior
        summary = {k: _class_summary(p.probs, y_test) for k, p in (("nuts", nuts), ("vgpn", pred))}
        ratio = pred.std[:, 1] / nuts.std[:, 1]
    quantiles = torch.tensor([0.1, 0.5, 0.9], dtype=ratio.dtype)
    report = {
        "settings": settings_of(args),
        "rows": {"train": len(x), "test": len(x_test)},
        "nuts": {
            **summary["nuts"],
            **convergence(
                result,
                [s for s in model.parameter_sites() if s.startswith("sigma")],
                "y_test" if task == "regression" else "p_test",
            ),
            "cpu_s": round(nuts_cpu, 1),
        },
        "vgpn": {
            **summary["vgpn"],
            "steps": fit.num_steps,
            "best_step": fit.best_step,
            "cpu_s": round(vgpn_cpu, 1),
        },
        "std_ratio_vgpn_over_nuts_q10_q50_q90": [
            round(float(q), 3) for q in ratio.quantile(quantiles)
        ],
        "load_at_end": os.getloadavg(),
    }
    print(json.dumps(report))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
