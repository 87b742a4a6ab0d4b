"""One saved chain of a likelihood-informed ``[1, 4, 1]`` synthetic run
(``benchmarks.nuts_runs --run synthetic --sizes 1 4 1 --activations likelihood-informed
--checkpoint-dir DIR``), read back when the run was stopped before its other chains finished
(``docs/results/nuts.md``, session of 2026-11-24 17:15 UTC): the per-chain summary of
``benchmarks.nuts_noise_geometry``, the norm of the sampled ``e`` (about ``sqrt(54) = 7.3`` where
the anchor's Gaussian approximation holds), and the chain's own test RMSE (original units), its
draws mapped back to whitened coordinates with the chain's anchor -- recomputed from the same
seeded fit as ``run_nuts`` (``init="fit-prior-noise"``, ``seed``, ``num_chains``).

``--fits``: instead, for ``--num-chains`` seeded fits, each fit's activation range, its
correlation with the first fit's, and the observed Hessian of ``-log p(y | A)`` (the output GP
integrated out) at the fit's activations against the Gauss-Newton ``diag(kappa) / sigma2^2``
that the anchor uses (trace, largest and median eigenvalue / entry).

``--laplace N``: also the Laplace approximation of ``log p(theta | y)``
(``benchmarks.nuts_noise_geometry.laplace``) at ``N`` evenly spaced draws of the chain.
``--restart WARMUP SAMPLES``: also one whitened chain (the library's default parametrisation,
``run_nuts`` defaults otherwise) started at the chain's last draw (``init_to_value``): does the
default sampler stay in the region the chain sampled?

Example::

    OMP_NUM_THREADS=1 python -m benchmarks.nuts_informed_chain --checkpoint-dir DIR --chain 0 \\
        --out docs/results/nuts_runs/synthetic_141_reduced_informed_chain1.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyro
import torch
from pyro.infer import Predictive

from benchmarks.nuts_noise_geometry import summary
from pyro_gpn.data import synthetic_1d
from pyro_gpn.inference.nuts_informed import informed_chain_models, twin, whitened_samples
from pyro_gpn.inference.nuts_setup import fit_initial_params, noise_prior_medians
from pyro_gpn.models.nonparametric import NonParametricGPN


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--chain", type=int, default=0)
    parser.add_argument("--num-chains", type=int, default=2, help="of the run (its fits)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fits", action="store_true", help="the fits' curvature, no chain")
    parser.add_argument("--laplace", type=int, default=0, help="Laplace marginal at N draws")
    parser.add_argument("--restart", type=int, nargs=2, default=None, metavar=("WARMUP", "N"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    cpu = time.process_time()
    data = synthetic_1d(60, 100, seed=0)
    x, y = data.x_train.double(), data.y_train.double()[:, 0]
    x_test, y_test = data.x_test.double(), data.y_test.double()[:, 0]
    model = NonParametricGPN([1, 4, 1], activations="likelihood-informed", max_samples=154)
    pyro.set_rng_seed(args.seed)
    fits = fit_initial_params(
        model,
        x,
        y,
        None,
        num_chains=args.num_chains,
        seed=args.seed,
        hold=noise_prior_medians(model, x),
    )
    models, starts = informed_chain_models(model, x, y, None, fits)
    if args.fits:
        report = fit_curvature(models, y)
        report["cpu_s"] = round(time.process_time() - cpu, 1)
        print(json.dumps(report))
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=1) + "\n")
        return report
    files = sorted(args.checkpoint_dir.glob(f"chain{args.chain}-*.pt"))
    if not files:
        raise ValueError(f"--checkpoint-dir {args.checkpoint_dir} has no chain{args.chain}-*.pt")
    chain = torch.load(files[0], weights_only=False)
    samples = chain["samples"]
    norms = samples["Ea2_train"][0].norm(dim=-1).numpy()
    white = whitened_samples(models[args.chain], samples, (x, y, None))
    pyro.set_rng_seed(args.seed)
    with torch.no_grad():
        draws = Predictive(
            twin(model, "whitened").model,
            posterior_samples={k: v[0] for k, v in white.items()},
            return_sites=["y_test"],
            parallel=True,
        )(x, y, x_test)["y_test"]
    mean = draws.reshape(draws.shape[0], -1).mean(0)
    y_std = float(data.y_std.reshape(-1)[0])
    stats = chain["stats"]
    report = {
        "summary": summary([chain])["chain0"],
        "e_norm_start": round(float(starts["Ea2_train"][args.chain].norm()), 2),
        "e_norm_q10_q50_q90": np.quantile(norms, [0.1, 0.5, 0.9]).round(1).tolist(),
        "test_rmse": round(float((mean - y_test).square().mean().sqrt()) * y_std, 4),
        "mean_leapfrog_steps": round(float(np.mean(stats["n_steps"])), 1),
        "step_size": round(float(stats["step_size"][-1]), 4),
        "chain_cpu_s": round(chain["cpu_s"], 1),
    }
    if args.laplace:
        from benchmarks.nuts_noise_geometry import laplace, potential

        pot = potential("whitened", x, y)
        picks = np.linspace(0, len(norms) - 1, args.laplace).round().astype(int)
        points = []
        for i in picks:
            draw = {k: v[0, i].clone() for k, v in white.items()}
            draw["sigma1"], draw["sigma2"] = draw["sigma1"].log(), draw["sigma2"].log()
            points.append(laplace(pot, draw))
        report["laplace"] = points
    if args.restart is not None:
        report["restart_whitened"] = restart(model, white, x, y, x_test, y_test, y_std, args)
    report["cpu_s_this_script"] = round(time.process_time() - cpu, 1)
    print(json.dumps(report))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def restart(model, white, x, y, x_test, y_test, y_std, args) -> dict:
    """One whitened chain from the last draw of ``white`` (``init_to_value``)."""
    from pyro.infer.autoguide.initialization import init_to_value

    from pyro_gpn.inference.mcmc import run_nuts

    cpu = time.process_time()
    values = {k: v[0, -1].clone() for k, v in white.items()}
    warmup, num = args.restart
    result = run_nuts(
        twin(model, "whitened"),
        x,
        y,
        x_test,
        num_samples=num,
        warmup_steps=warmup,
        num_chains=1,
        seed=args.seed,
        init_strategy=init_to_value(values=values),
        progress_every=50,
    )
    s = result.samples
    mean = result.y_test.reshape(num, -1).mean(0)
    s_a = (s["W2"][:, 0] ** 2 * s["sigma1"] ** 2).sum(-1).sqrt()
    stats = result.sample_stats[0]
    half = num // 2
    return {
        "warmup_samples": [warmup, num],
        "sigma2_median_first_second_half": [
            round(float(s["sigma2"][:half, 0].median()), 4),
            round(float(s["sigma2"][half:, 0].median()), 4),
        ],
        "s_A_median_first_second_half": [
            round(float(s_a[:half].median()), 4),
            round(float(s_a[half:].median()), 4),
        ],
        "test_rmse": round(float((mean - y_test).square().mean().sqrt()) * y_std, 4),
        "divergences": int(result.num_divergences),
        "step_size": round(float(stats["step_size"][-1]), 4),
        "mean_leapfrog_steps": round(float(np.mean(stats["n_steps"])), 1),
        "chain_cpu_s": result.chain_cpu_s,
        "cpu_s": round(time.process_time() - cpu, 1),
    }


def fit_curvature(models: list[NonParametricGPN], y: torch.Tensor) -> dict:
    """Per fit (its chain's anchor): activation range, correlation with the first fit's, and the
    observed Hessian of ``-log N(y; 0, K(A) + sigma2^2 I)`` at ``A = a_hat`` (``sigma2 = 0.1``,
    the held noise) against ``diag(kappa) / sigma2^2``."""
    out, first = {}, models[0].activation_anchor[0]
    for c, model in enumerate(models):
        a_hat, kappa = model.activation_anchor
        var = 0.1**2 + model.jitter

        def nll(a, var=var):
            cov = torch.exp(-0.5 * (a[:, None] - a[None, :]) ** 2)
            cov = cov + var * torch.eye(len(a), dtype=a.dtype)
            zero = torch.zeros(len(a), dtype=a.dtype)
            return -torch.distributions.MultivariateNormal(zero, cov).log_prob(y)

        hess = torch.autograd.functional.hessian(nll, a_hat)
        evals = torch.linalg.eigvalsh(0.5 * (hess + hess.mT))
        gauss_newton = kappa / 0.1**2
        out[f"fit{c}"] = {
            "a_range": [round(float(a_hat.min()), 2), round(float(a_hat.max()), 2)],
            "corr_with_fit0": round(float(torch.corrcoef(torch.stack([a_hat, first]))[0, 1]), 2),
            "hessian_trace_max_median": [
                round(float(v), 1) for v in (evals.sum(), evals.max(), evals.median())
            ],
            "gauss_newton_trace_max_median": [
                round(float(v), 1)
                for v in (gauss_newton.sum(), gauss_newton.max(), gauss_newton.median())
            ],
        }
    return out


if __name__ == "__main__":
    main()
