"""``pyro-gpn demo``: the Bayesian GPN and a tanh network on the bundled yacht data, offline.

The GPN runs on the route that is best for it (``docs/results/uci.md``): the closed-form
variational GPN (:class:`~pyro_gpn.models.VariationalGPN`, variational targets, the library's
recommendations :data:`pyro_gpn.recommended.VGPN`, the predictive objective included;
``--elbo closed_form`` for the paper's ELBO) with input-dependent noise
(:class:`~pyro_gpn.heads.HeteroscedasticGaussianHead`, chosen on yacht's validation rows;
``--head gaussian`` for one noise level) and point-estimated weights, as in the paper (chosen on
the demo's validation rows over the library's default mean-field ``q(W)``,
``--weights variational``; docs/results/demo.md), trained by
:func:`~pyro_gpn.inference.fit_vgpn` with the UCI benchmark's schedule
:data:`pyro_gpn.recommended.VGPN` (at most 2000 steps, about 20 CPU-seconds on yacht;
docs/results/demo.md) until the validation log-likelihood stops improving (best state
restored). The tanh network of the same shape is trained by the
:class:`~pyro_gpn.inference.Trainer` with its own validation schedule. The command prints test
RMSE, log-likelihood (original units; under each model's own predictive, the GPN's a
Gauss-Hermite mixture over its log noise variance) and the coverage of the central 90 %
predictive interval (the mixture's quantiles) of both, and saves

* ``predictive.png``: (a) the test targets against the Froude number with each model's 90 %
  predictive interval; (b) calibration: the observed coverage of the central ``p`` interval
  against ``p`` on the test rows (the diagonal is perfect calibration);
* ``activations.png``: the GPN's learned activation functions, the mean of ``q(f | a)`` with
  its ±2 std band, the posterior mean of the targets and each unit's lengthscale.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..metrics import central_interval_coverage, mixture_central_interval
from ..recommended import VGPN
from .options import (
    HelpFormatter,
    add_options,
    add_threads,
    from_args,
    nonnegative_int,
    positive_float,
    positive_int,
)
from .runs import (
    ModelSettings,
    Schedule,
    build_model,
    machine_description,
    split_metrics,
    write_atomically,
)

__all__ = ["add_demo_parser", "calibration", "run_demo"]

#: the tanh network's schedule (``--lr``, ``--batch-size``, ``--epochs``, ``--patience``)
DEMO_SCHEDULE = {"lr": 1e-2, "batch_size": 32, "max_epochs": 300, "patience": 10}
#: nominal levels of the calibration curve
LEVELS = tuple(round(0.05 * k, 2) for k in range(1, 20))
#: the yacht input plotted on the x axis of the predictive panel (the Froude number)
FROUDE = 5


#: ``--head``: the likelihood of the GPN's targets
DEMO_HEADS = ("heteroscedastic", "gaussian")
#: ``--weights``: the GPN's weights, point estimates (the demo's choice on its validation rows,
#: docs/results/demo.md) or the library's default mean-field ``q(W)``
DEMO_WEIGHTS = ("point", "variational")

Mixture = tuple[Tensor, Tensor, Tensor]


def _predictive(model: nn.Module, x: Tensor) -> Mixture:
    """The model's predictive on ``x`` as a Gaussian mixture (weights ``[K]``, means and
    variances ``[K, S, 1]``): one component for a Gaussian head, the Gauss-Hermite mixture over
    the log noise variance for a heteroscedastic one."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model.head.predictive_mixture(model.hidden(x))
    finally:
        model.train(was_training)


def calibration(predictive: Mixture, y: Tensor, levels=LEVELS) -> list[float]:
    """Share of ``y`` inside the central ``p`` interval of the predictive mixture for each
    ``p`` (:func:`pyro_gpn.metrics.central_interval_coverage`)."""
    return central_interval_coverage(predictive, y, levels).tolist()


def _plot(path: Path, data: Any, predictions: dict[str, Mixture], curves) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale, shift = float(data.y_std), float(data.y_mean)
    froude = data.x_test[:, FROUDE]
    y = data.y_test.reshape(-1) * scale + shift
    fig, (ax, cal) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = {"gpn": "C0", "tanh": "C1"}
    labels = {"gpn": "Bayesian GPN", "tanh": "tanh network"}
    for k, (name, (weights, means, variances)) in enumerate(predictions.items()):
        lower, upper = mixture_central_interval(weights, means, variances, 0.9)
        m = (weights.view(-1, 1, 1) * means).sum(0).reshape(-1) * scale + shift
        below, above = (
            m - (lower.reshape(-1) * scale + shift),
            upper.reshape(-1) * scale + shift - m,
        )
        offset = (k - 0.5) * 0.02
        ax.errorbar(froude + offset, m, yerr=torch.stack([below, above]), fmt="o", ms=3,
                    capsize=2, color=colours[name],
                    label=f"{labels[name]}: mean and 90 % interval")  # fmt: skip
        cal.plot(LEVELS, curves[name], "o-", ms=3, color=colours[name], label=labels[name])
    ax.plot(froude, y, "kx", ms=5, label="test target")
    ax.set_xlabel("Froude number (standardised)")
    ax.set_ylabel("residuary resistance")
    ax.set_title("(a) yacht test rows")
    ax.legend(fontsize=8)
    cal.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    cal.set_xlabel("nominal level p of the central interval")
    cal.set_ylabel("share of test targets inside")
    cal.set_title("(b) calibration on the test rows")
    cal.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_activations(path: Path, model: nn.Module, units: int = 3) -> None:
    """The variational layers' learned activation functions: the mean of ``q(f | a)`` with its
    ±2 std band (the uncertainty of ``q(U)``) over the activation ``a``, and the posterior mean
    of the targets ``mu_hat`` at the inducing points; one row per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = list(model.layers)
    fig, axes = plt.subplots(len(layers), units, figsize=(3.2 * units, 2.6 * len(layers)))
    axes = [list(row) for row in (axes.reshape(len(layers), units))]
    grid = torch.linspace(-3, 3, 200, dtype=layers[0].weight.dtype)
    for l, layer in enumerate(layers):
        with torch.no_grad():
            n = layer.out_features
            mean, var = layer.conditional(grid[:, None].expand(-1, n), noise=False)
            loc = layer.target_posterior().mean
            if layer.response.whiten:
                loc = (layer.prior_scale_tril() @ loc.unsqueeze(-1)).squeeze(-1)
        points = layer.inducing_points.expand(n, -1)
        for u in range(units):
            ax = axes[l][u]
            if u >= n:
                ax.set_visible(False)
                continue
            sd = var[:, u].sqrt()
            ax.fill_between(grid, mean[:, u] - 2 * sd, mean[:, u] + 2 * sd, alpha=0.3)
            ax.plot(grid, mean[:, u], lw=1.5)
            ax.plot(points[u], loc[min(u, loc.shape[0] - 1)], "r.", ms=5)
            ls = float(layer.lengthscales.detach().reshape(-1)[min(u, layer.num_functions - 1)])
            ax.set_title(f"layer {l}, unit {u} (lengthscale {ls:.2f})", fontsize=9)
            ax.set_xlabel("activation a")
    fig.suptitle("Bayesian GPN: learned activation functions, q(f | a) mean ± 2 std; red: E[U]")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_demo(args: argparse.Namespace) -> int:
    """Run ``pyro-gpn demo``: prints the test metrics, writes ``<out>/demo.json``,
    ``<out>/predictive.png`` and ``<out>/activations.png`` (with matplotlib), returns 0."""
    import pyro

    from ..data import load_dataset
    from ..heads import GaussianHead, HeteroscedasticGaussianHead
    from ..inference import fit_vgpn
    from ..inference.trainer import Trainer, seed_everything
    from ..models import VariationalGPN

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_dataset("yacht", seed=args.seed)
    print(f"data: {data!r}")
    sizes = [data.num_features, *args.sizes, 1]
    results: dict[str, Any] = {}
    models: dict[str, nn.Module] = {}
    predictions: dict[str, tuple[Tensor, Tensor]] = {}
    curves: dict[str, list[float]] = {}
    for name in ("gpn", "tanh"):
        seed_everything(args.seed)
        start = time.perf_counter()
        if name == "gpn":
            pyro.clear_param_store()
            head = (
                HeteroscedasticGaussianHead(1)
                if args.head == "heteroscedastic"
                else GaussianHead(1)
            )
            model = VariationalGPN(sizes, head=head, weights=args.weights)
            fit = fit_vgpn(
                model, data.x_train, data.y_train, data.x_val, data.y_val,
                num_steps=args.steps, lr=args.gpn_lr, eval_every=VGPN.eval_every,
                patience=VGPN.patience, seed=args.seed, elbo=args.elbo,
            )  # fmt: skip
            facts = {
                "head": args.head,
                "weights": args.weights,
                "elbo": args.elbo,
                "steps": fit.num_steps,
                "best_step": fit.best_step,
                "val_log_likelihood": fit.best_val_log_lik - math.log(float(data.y_std[0])),
                "schedule": {
                    "lr": args.gpn_lr,
                    "lr_decay": VGPN.lr_decay,
                    "num_steps": args.steps,
                    "eval_every": VGPN.eval_every,
                    "patience": VGPN.patience,
                },
            }
            how = f"{fit.num_steps} steps, best {fit.best_step}"
        else:
            model = build_model("tanh", sizes, "gaussian", mode="meanvar", init=args.init)
            config = from_args(Schedule, args).config(
                seed=args.seed, task="regression", progress=False
            )
            res = Trainer(model, config).fit((data.x_train, data.y_train), (data.x_val, data.y_val))
            facts = {"epochs": res.epochs, "best_epoch": res.best_epoch}
            how = f"{res.epochs} epochs, best {res.best_epoch}"
        wall = time.perf_counter() - start
        metrics = split_metrics(model, data, "test")
        predictions[name] = _predictive(model, data.x_test)
        curves[name] = calibration(predictions[name], data.y_test)
        metrics["coverage90"] = curves[name][LEVELS.index(0.9)]
        label = "Bayesian GPN" if name == "gpn" else "tanh network"
        print(
            f"{label:>15}: test RMSE {metrics['rmse']:.3f}, test log-likelihood "
            f"{metrics['log_likelihood']:.3f}, 90 % interval covers "
            f"{100 * metrics['coverage90']:.0f} %  ({how}, {wall:.1f} s)"
        )
        results[name] = {**metrics, **facts, "wall_time_s": wall, "calibration": curves[name]}
        models[name] = model
    figures: dict[str, str] = {}
    try:
        import matplotlib

        matplotlib.use("Agg")
        _plot(out / "predictive.png", data, predictions, curves)
        figures["predictive"] = str(out / "predictive.png")
        _plot_activations(out / "activations.png", models["gpn"])
        figures["activations"] = str(out / "activations.png")
        print(f"figures: {', '.join(figures.values())}")
    except ImportError:
        print("matplotlib is not installed: no plots (pip install pyro-gpn[plots])")
    record = {
        "data": data.description,
        "sizes": sizes,
        "results": results,
        "levels": list(LEVELS),
        "figures": figures,
        "command": args.command,
        "machine": machine_description(),
        "threads": args.threads,
        "torch": torch.__version__,
    }
    write_atomically(out / "demo.json", json.dumps(record, indent=1) + "\n")
    return 0 if math.isfinite(results["gpn"]["rmse"]) else 1


def add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``pyro-gpn demo``."""
    parser = subparsers.add_parser(
        "demo",
        help="quick offline demo on the bundled yacht data",
        description=(
            "Train the Bayesian GPN (closed-form variational GPN, stopped on validation) and a "
            "tanh network of the same shape on the bundled UCI yacht regression set, print "
            "test RMSE, log-likelihood in original units and 90 % interval coverage, and save "
            "plots of the predictive intervals, the calibration and the GPN's learned "
            "activation functions. --lr, --batch-size, --epochs and --patience are the tanh "
            "network's schedule. Under a minute of one CPU core (docs/results/demo.md)."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--out", default="pyro-gpn-demo", help="output folder for the PNGs")
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=VGPN.num_steps,
        help="step budget of the GPN (stops earlier on validation; "
        "pyro_gpn.recommended.VGPN.num_steps, as the UCI benchmark)",
    )
    parser.add_argument(
        "--head",
        choices=DEMO_HEADS,
        default=DEMO_HEADS[0],
        help="the GPN's likelihood: input-dependent noise (pyro_gpn.heads."
        "HeteroscedasticGaussianHead, chosen on yacht's validation rows, docs/results/demo.md) "
        "or one noise level",
    )
    parser.add_argument(
        "--weights",
        choices=DEMO_WEIGHTS,
        default=DEMO_WEIGHTS[0],
        help="the GPN's weights: point estimates, as in the paper (chosen on yacht's validation "
        "rows, docs/results/demo.md), or the library's default mean-field q(W) with its prior",
    )
    parser.add_argument(
        "--elbo",
        choices=("predictive", "closed_form"),
        default=VGPN.elbo,
        help="the GPN's training objective: the closed-form predictive log-likelihood "
        "(pyro_gpn.recommended.VGPN.elbo, chosen on validation, docs/results/uci.md section 10) "
        "or the paper's closed-form ELBO",
    )
    parser.add_argument(
        "--gpn-lr",
        type=positive_float,
        default=VGPN.lr,
        help="the GPN's initial learning rate (decays exponentially to a tenth)",
    )
    add_options(parser, Schedule, defaults=DEMO_SCHEDULE, flags={"max_epochs": "--epochs"})
    add_options(
        parser, ModelSettings, ("sizes", "init"), defaults={"sizes": (10,), "init": "identity"}
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="initialisation seed")
    add_threads(parser, default=1)
    parser.set_defaults(func=run_demo)
