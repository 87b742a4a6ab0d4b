"""Where should NUTS start? The candidate starts of ``run_nuts(init=...)`` on the ``[1, 4, 1]``
synthetic problem: each start's noise scales, the largest eigenvalue of the potential's Hessian
there (which bounds the first step sizes NUTS can take), and optionally one short chain from
it (adapted step size, leapfrog steps per iteration, bulk ESS of ``y_test`` and the output
noise, CPU seconds), behind ``docs/results/nuts.md``.

Starts (``--starts``): ``uniform`` (uniform in ``(-2, 2)`` unconstrained, as ``init_to_uniform``),
``uniform-prior-noise`` (the same, the noise at its prior median), ``fit`` (500 Adam steps of
the MAP over everything: weights, noise and latent activations), ``fit50`` (50 steps),
``fit-prior-noise`` (500 steps with the noise held at its prior median). ``--chain-for`` takes
``start`` or ``start:metric`` (a ``run_nuts`` metric instead of ``--metric``).

Example::

    OMP_NUM_THREADS=1 python -m benchmarks.nuts_starts --starts uniform fit fit-prior-noise \\
        --chain-for uniform fit-prior-noise --warmup 200 --samples 100 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from pyro_gpn.data import synthetic_1d
from pyro_gpn.inference.nuts_setup import (
    fit_initial_params,
    noise_prior_medians,
    potential_hessians,
)
from pyro_gpn.models.nonparametric import NonParametricGPN

STARTS = {  # name: (Adam steps, hold the noise at its prior median, run_nuts init)
    "uniform": (0, False, "uniform"),
    "uniform-prior-noise": (0, True, None),
    "fit": (500, False, "fit"),
    "fit50": (50, False, "fit"),
    "fit-prior-noise": (500, True, "fit-prior-noise"),
}


def _data(n_train: int, n_test: int, with_y_test: bool = False):
    data = synthetic_1d(n_train, n_test, seed=0)
    out = data.x_train.double(), data.y_train.double(), data.x_test.double()
    return out + (data.y_test.double()[:, 0],) if with_y_test else out


def start_report(name: str, sizes: list[int], n_train: int, seed: int) -> dict:
    """The start's noise scales, potential energy and Hessian spectrum (one chain's start)."""
    x, y, _ = _data(n_train, 10)
    model = NonParametricGPN(sizes)
    steps, hold, _ = STARTS[name]
    held = noise_prior_medians(model, x) if hold else None
    params = fit_initial_params(model, x, y, None, num_chains=1, steps=steps, seed=seed, hold=held)
    hess = potential_hessians(model, x, y, None, params)[0]
    evals, evecs = torch.linalg.eigh(hess)
    names = sorted(params)
    sizes_ = [params[k][0].numel() for k in names]
    top = evecs[:, -1].square().split(sizes_)
    return {
        "start": name,
        "seed": seed,
        "noise": {k: params[k][0].exp().tolist() for k in names if k.startswith("sigma")},
        "max_eig": float(evals[-1]),
        "min_eig": float(evals[0]),
        "top_eigvec_weight": {k: round(float(t.sum()), 3) for k, t in zip(names, top, strict=True)},
    }


def chain_report(config: str, sizes: list[int], n_train: int, n_test: int, args: dict) -> dict:
    """One chain through ``run_nuts``; ``config`` is ``start`` or ``start:metric``."""
    torch.set_num_threads(1)
    from benchmarks.nuts_common import convergence
    from pyro_gpn.diagnostics import heldout_lpd_from_draws
    from pyro_gpn.inference.mcmc import run_nuts

    x, y, x_test, y_test = _data(n_train, n_test, with_y_test=True)
    model = NonParametricGPN(sizes)
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    name, _, metric = config.partition(":")
    args = args | ({"metric": metric} if metric else {})
    steps, _, init = STARTS[name]
    cpu = time.process_time()
    result = run_nuts(
        model, x, y, x_test, num_chains=1, init=init, init_steps=max(steps, 1), **args
    )
    cpu = time.process_time() - cpu
    report = convergence(result, [f"sigma{len(sizes) - 1}"])
    ess = report["min_bulk_ess"]
    medians = {
        k: [round(float(m), 4) for m in v.median(0).values.reshape(-1)]
        for k, v in result.samples.items()
        if k.startswith("sigma")
    }
    lpd = heldout_lpd_from_draws(result.test_log_density(y_test)).mean()
    return {
        "start": name,
        **args,
        "load_at_start": load,
        "cpu_s": round(cpu, 1),
        "noise_median": medians,
        "test_lpd": round(float(lpd), 4),
        "ess_per_draw": {k: round(v / args["num_samples"], 3) for k, v in ess.items()},
        "ess_per_cpu_s": {k: round(v / cpu, 3) for k, v in ess.items()},
        **report,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 1])
    parser.add_argument("--n-train", type=int, default=60)
    parser.add_argument("--n-test", type=int, default=100)
    parser.add_argument("--starts", nargs="+", default=list(STARTS), choices=list(STARTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--chain-for", nargs="*", default=[], help="starts (or start:metric) to run a chain from"
    )
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--metric", default="dense-block")
    parser.add_argument("--max-tree-depth", type=int, default=10)
    parser.add_argument("--target-accept", type=float, default=0.8)
    parser.add_argument("--jobs", type=int, default=1, help="chains at a time (processes)")
    args = parser.parse_args(argv)

    out = []
    for name in args.starts:
        for seed in args.seeds:
            out.append(start_report(name, args.sizes, args.n_train, seed))
            print(json.dumps(out[-1]), flush=True)
    sampler = {
        "num_samples": args.samples,
        "warmup_steps": args.warmup,
        "metric": args.metric,
        "max_tree_depth": args.max_tree_depth,
        "target_accept_prob": args.target_accept,
    }
    jobs = [
        (name, args.sizes, args.n_train, args.n_test, sampler | {"seed": seed})
        for name in args.chain_for
        for seed in args.seeds
    ]
    if args.jobs > 1 and len(jobs) > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            results = [pool.apply_async(chain_report, job) for job in jobs]
            for r in results:
                out.append(r.get())
                print(json.dumps(out[-1]), flush=True)
    else:
        for job in jobs:
            out.append(chain_report(*job))
            print(json.dumps(out[-1]), flush=True)
    print("load", " ".join(f"{v:.1f}" for v in os.getloadavg()), flush=True)
    return out


if __name__ == "__main__":
    main()
