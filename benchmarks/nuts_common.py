"""What the NUTS benchmark scripts share (``nuts_runs``, ``nuts_profile``, ``nuts_synthetic``):
the sampler's command-line options, their mapping onto :func:`pyro_gpn.inference.mcmc.run_nuts`,
and the convergence summary on the identified quantities.

Run the scripts as modules from the repository root (``python -m benchmarks.nuts_runs ...``), so
that the checkout's ``pyro_gpn`` is the one imported.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from pyro_gpn.diagnostics import max_rhat, min_ess


def add_sampler_args(parser: argparse.ArgumentParser, *, chains: int, draws: int) -> None:
    """The options of :func:`run_nuts` every script takes (defaults: the library's, except the
    chains and draws)."""
    parser.add_argument("--chains", type=int, default=chains)
    parser.add_argument("--samples", type=int, default=draws)
    parser.add_argument("--warmup", type=int, default=draws)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--metric", default="dense-block")
    parser.add_argument("--metric-start", default="identity", help="run_nuts(metric_start=)")
    parser.add_argument(
        "--no-shrink", action="store_true", help="run_nuts(shrink_dense=False): Pyro's adaptation"
    )
    parser.add_argument("--max-tree-depth", type=int, default=10)
    parser.add_argument("--target-accept", type=float, default=0.8)
    parser.add_argument("--init", default="fit-prior-noise", help="run_nuts(init=...)")
    parser.add_argument("--init-steps", type=int, default=500)
    parser.add_argument("--workers", type=int, default=1, help="chains run at the same time")
    parser.add_argument("--progress-every", type=int, default=50, help="0: silent")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="resume from here")


def sampler_kwargs(args: argparse.Namespace) -> dict:
    """``run_nuts`` keyword arguments from :func:`add_sampler_args`' options."""
    return {
        "num_samples": args.samples,
        "warmup_steps": args.warmup,
        "num_chains": args.chains,
        "seed": args.seed,
        "metric": args.metric,
        "shrink_dense": not args.no_shrink,
        "metric_start": args.metric_start,
        "max_tree_depth": args.max_tree_depth,
        "target_accept_prob": args.target_accept,
        "init": args.init,
        "init_steps": args.init_steps,
        "workers": args.workers,
        "progress_every": args.progress_every,
        "checkpoint_dir": args.checkpoint_dir,
    }


def settings_of(args: argparse.Namespace) -> dict:
    """The options as JSON-ready values."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def convergence(result, noise_sites: list[str], predictive: str = "y_test") -> dict:
    """r-hat (rank-normalised split, max) and bulk ESS (min) of the posterior predictive test
    outputs and the noise scales, divergences, leapfrog steps and the adapted step sizes."""
    idata = result.to_arviz()
    report = {
        "max_rhat": {
            "predictive": max_rhat(idata, [predictive], group="posterior_predictive"),
            "noise": max_rhat(idata, noise_sites) if noise_sites else None,
        },
        "min_bulk_ess": {
            "predictive": min_ess(idata, [predictive], group="posterior_predictive"),
            "noise": min_ess(idata, noise_sites) if noise_sites else None,
        },
        "divergences": int(result.num_divergences),
        "divergence_rate": result.divergence_rate,
    }
    stats = result.sample_stats
    steps = np.concatenate([s["n_steps"] for s in stats])
    depth = np.concatenate([s["tree_depth"] for s in stats]).astype(int)
    report |= {
        "mean_leapfrog_steps": float(steps.mean()),
        "tree_depth_hist": np.bincount(depth).tolist(),
        "step_size": [round(s["step_size"][-1], 4) for s in stats],
        "wall_s": round(result.wall_time_s, 1),
        "init_s": round(result.init_time_s, 1),
        "load_at_end": " ".join(f"{v:.1f}" for v in os.getloadavg()),
    }
    return report


def add_problem_args(parser: argparse.ArgumentParser) -> None:
    """The problem options (``--run`` and its data and model) of :func:`build_problem`."""
    parser.add_argument("--run", choices=["synthetic", "uci", "sampled-u", "moons"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 1])
    parser.add_argument("--dataset", default="yacht")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--max-train", type=int, default=None)
    parser.add_argument("--n-train", type=int, default=100)
    parser.add_argument("--model", default="nonparametric")
    parser.add_argument("--num-inducing", type=int, default=10)
    parser.add_argument(
        "--activations",
        default=None,
        help="NonParametricGPN(activations=...): 'whitened', 'centred' or 'likelihood-informed' "
        "(default: the model's)",
    )


def _moons(n_train: int, n_test: int, seed: int):
    import torch
    from sklearn.datasets import make_moons

    x, y = make_moons(n_train + n_test, noise=0.2, random_state=seed)
    x = (x - x[:n_train].mean(0)) / x[:n_train].std(0)
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def build_problem(args: argparse.Namespace):
    """``(model, x, y, x_test, y_test, y_std, task)`` for :func:`add_problem_args`' options:
    ``synthetic`` (``synthetic_1d(60, 100, seed=0)``), ``uci`` / ``sampled-u`` (a UCI split, the
    first ``--max-train`` training rows), ``moons`` (``--n-train`` rows, 200 test rows, noise
    0.2, seeded by ``--seed``); ``SampledTargetsGPN`` for ``sampled-u`` or ``--model sampled-u``,
    else ``NonParametricGPN``."""
    from pyro_gpn.models.nonparametric import NonParametricGPN
    from pyro_gpn.models.sampled_targets import SampledTargetsGPN

    y_std, task = 1.0, "regression"
    if args.run == "moons":
        task = "classification"
        x, y, x_test, y_test = _moons(args.n_train, 200, args.seed)
    else:
        if args.run == "synthetic":
            from pyro_gpn.data import synthetic_1d

            data = synthetic_1d(60, 100, seed=0)
        else:
            from pyro_gpn.data import load_dataset

            data = load_dataset(args.dataset, seed=0, split=args.split)
        x, y = data.x_train.double(), data.y_train.double()[:, 0]
        x_test, y_test = data.x_test.double(), data.y_test.double()[:, 0]
        y_std = float(data.y_std.reshape(-1)[0])
        if args.max_train is not None:
            x, y = x[: args.max_train], y[: args.max_train]
    likelihood = "gaussian" if task == "regression" else "bernoulli"
    if args.run == "sampled-u" or args.model == "sampled-u":
        model = SampledTargetsGPN(args.sizes, likelihood=likelihood, num_inducing=args.num_inducing)
    else:
        rows = len(x) + len(x_test)
        extra = {} if args.activations is None else {"activations": args.activations}
        model = NonParametricGPN(args.sizes, max_samples=rows, likelihood=likelihood, **extra)
    return model, x, y, x_test, y_test, y_std, task
