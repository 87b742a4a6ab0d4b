"""``pyro-gpn demo``: a GPN and a tanh network on the bundled yacht data, offline.

Trains both with the same schedule (:class:`~.runs.Schedule`, with the demo's defaults), prints
test RMSE and log-likelihood in original units (:func:`~.runs.split_metrics`) and plots the
GPN's learned activation functions (:func:`~pyro_gpn.plotting.plot_network_activations`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .options import HelpFormatter, add_options, add_threads, from_args, nonnegative_int
from .runs import (
    ModelSettings,
    Schedule,
    build_model,
    machine_description,
    split_metrics,
    write_atomically,
)

__all__ = ["add_demo_parser", "run_demo"]

#: the demo's schedule (``--lr``, ``--batch-size``, ``--epochs``, ``--patience``)
DEMO_SCHEDULE = {"lr": 1e-2, "batch_size": 32, "max_epochs": 150, "patience": 10}


def run_demo(args: argparse.Namespace) -> int:
    """Run ``pyro-gpn demo``: prints the test metrics, writes ``<out>/demo.json`` and
    ``<out>/activations.png`` (with matplotlib), returns 0."""
    from ..data import load_dataset
    from ..inference.trainer import Trainer, seed_everything

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_dataset("yacht", seed=args.seed)
    print(f"data: {data!r}")
    sizes = [data.num_features, *args.sizes, 1]
    results: dict[str, Any] = {}
    models: dict[str, nn.Module] = {}
    for name in ("gpn", "tanh"):
        seed_everything(args.seed)
        model = build_model(name, sizes, "gaussian", mode="meanvar", init=args.init)
        config = from_args(Schedule, args).config(seed=args.seed, task="regression", progress=False)
        start = time.perf_counter()
        fit = Trainer(model, config).fit((data.x_train, data.y_train), (data.x_val, data.y_val))
        wall = time.perf_counter() - start
        metrics = split_metrics(model, data, "test")
        label = "GPN (mean+var)" if name == "gpn" else "tanh network"
        print(
            f"{label:>15}: test RMSE {metrics['rmse']:.3f}, test log-likelihood "
            f"{metrics['log_likelihood']:.3f}  ({fit.epochs} epochs, best {fit.best_epoch}, "
            f"{wall:.1f} s)"
        )
        results[name] = {**metrics, "epochs": fit.epochs, "best_epoch": fit.best_epoch,
                         "wall_time_s": wall}  # fmt: skip
        models[name] = model
    figure_path = out / "activations.png"
    try:
        import matplotlib

        matplotlib.use("Agg")
        from ..plotting import plot_network_activations

        figure = plot_network_activations(models["gpn"], units_per_layer=3)
        figure.suptitle("GPN activation functions learned on yacht", y=1.03)
        figure.savefig(figure_path, dpi=110, bbox_inches="tight")
        print(f"activation functions: {figure_path}")
    except ImportError:
        figure_path = None
        print("matplotlib is not installed: no plot (pip install pyro-gpn[plots])")
    record = {
        "data": data.description,
        "sizes": sizes,
        "results": results,
        "figure": None if figure_path is None else str(figure_path),
        "command": args.command,
        "machine": machine_description(),
        "threads": args.threads,
        "torch": torch.__version__,
    }
    write_atomically(out / "demo.json", json.dumps(record, indent=1) + "\n")
    return 0


def add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``pyro-gpn demo``."""
    parser = subparsers.add_parser(
        "demo",
        help="quick offline demo on the bundled yacht data",
        description=(
            "Train a GPN (mean + variance propagation) and a tanh network of the same shape on "
            "the bundled UCI yacht regression set, print test RMSE and log-likelihood in "
            "original units, and save a plot of the learned activation functions with their "
            "virtual observations and uncertainty bands. About a minute on a laptop CPU."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--out", default="pyro-gpn-demo", help="output folder for the PNG")
    add_options(parser, Schedule, defaults=DEMO_SCHEDULE, flags={"max_epochs": "--epochs"})
    add_options(
        parser, ModelSettings, ("sizes", "init"), defaults={"sizes": (20,), "init": "identity"}
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="initialisation seed")
    add_threads(parser, default=1)
    parser.set_defaults(func=run_demo)
