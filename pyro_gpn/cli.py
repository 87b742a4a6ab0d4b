"""The ``pyro-gpn`` command: train and evaluate networks, reproduce the paper's table, a demo.

Subcommands (``pyro-gpn <command> --help`` for the options):

* ``train``: train a GPN or a tanh baseline on a data set with the paper's schedule; writes
  ``result.json`` (settings and train / validation / test metrics) and ``model.pt``;
* ``evaluate``: load a ``train`` output folder and evaluate it on the test split;
* ``reproduce``: run (or continue) the grid of the paper's Table ``tab:gpn_exp_errors`` and
  write ``paper_table.md`` / ``paper_table.json`` (:mod:`pyro_gpn.experiments`);
* ``demo``: train a GPN and a tanh network on the bundled yacht regression set (offline, about
  a minute on a laptop CPU), print test RMSE and log-likelihood and plot the learned activation
  functions;
* ``compare``: fit one regression data set with every inference route (NUTS, parametric SVI,
  central-limit ML, variational GPN with ``Trace_ELBO`` and with the closed-form ELBO) and
  tabulate accuracy, calibration, time and sampler diagnostics (:mod:`pyro_gpn.compare`).

Each subcommand is one ``_add_<name>(subparsers)`` function that registers its parser and sets
``func`` to its handler; adding a command means adding such a function to ``_COMMANDS``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["build_parser", "main", "split_metrics"]

RESULT_NAME = "result.json"
MODEL_NAME = "model.pt"
_SPLITS = ("train", "val", "test")


# ---------------------------------------------------------------------------------- helpers
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {value}")
    return value


def _check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pyro-gpn: error: --device cuda requested but CUDA is not available")


def _add_threads(parser: argparse.ArgumentParser, default: int | None = None) -> None:
    """The ``--threads`` option shared by the training commands (applied in :func:`main`)."""
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=default,
        help="torch CPU threads; small networks often run fastest on one "
        f"(default: {default or 'torch default'})",
    )


def _add_dropout(
    parser: argparse.ArgumentParser, dropout: float, input_dropout: float | None
) -> None:
    """The ``--dropout`` / ``--input-dropout`` options of the dropout baselines."""
    parser.add_argument(
        "--dropout",
        type=_probability,
        default=dropout,
        help=f"drop rate of the dropout baselines' hidden units (default: {dropout})",
    )
    parser.add_argument(
        "--input-dropout",
        type=_probability,
        default=input_dropout,
        help="drop rate of their inputs (default: "
        f"{'--dropout' if input_dropout is None else input_dropout}; 0: hidden units only)",
    )


def _task(data: Any) -> str:
    return "classification" if hasattr(data, "num_classes") else "regression"


def _output_width(data: Any) -> int:
    return data.num_classes if hasattr(data, "num_classes") else data.y_train.shape[1]


@torch.no_grad()
def split_metrics(model: nn.Module, data: Any, split: str, device: str = "cpu") -> dict[str, float]:
    """Metrics of ``model`` on one split (``"train"``, ``"val"`` or ``"test"``) of ``data``.

    Classification: ``{"error": ...}`` (misclassification rate). Regression:
    ``{"rmse": ..., "log_likelihood": ...}`` in the original units of the targets (the mean over
    samples of ``log N(y | mean, var)`` of the Gaussian predictive mapped back through the
    data's standardisation; a full output covariance is reduced to its diagonal).
    """
    from .inference.trainer import evaluate
    from .losses import gaussian_predictive_log_likelihood
    from .moments.gaussian import Moments

    x = getattr(data, f"x_{split}").to(device)
    y = getattr(data, f"y_{split}").to(device)
    if _task(data) == "classification":
        return evaluate(model, x, y, "classification")
    was_training = model.training
    model.eval()
    try:
        prediction = model(x)
    finally:
        model.train(was_training)
    y_std, y_mean = data.y_std.to(device), data.y_mean.to(device)
    mean = prediction.mean * y_std + y_mean
    var = prediction.variance * y_std.square()
    target = y * y_std + y_mean
    log_lik = gaussian_predictive_log_likelihood(Moments(mean, var=var), target)
    rmse = (mean - target).square().mean().sqrt()
    return {"rmse": float(rmse), "log_likelihood": float(log_lik)}


def _format_metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:.4f}" for key, value in metrics.items())


def _command_line(argv: Sequence[str]) -> str:
    return "pyro-gpn " + shlex.join(argv)


def _load_data(args: argparse.Namespace, seed: int = 0) -> Any:
    from .data import load_dataset

    try:
        return load_dataset(args.dataset, data_dir=args.data_dir, seed=seed, split=args.split)
    except (FileNotFoundError, OSError, ValueError) as error:
        raise SystemExit(f"pyro-gpn: error: cannot load {args.dataset!r}: {error}") from error


def _build(settings: dict[str, Any], data: Any) -> nn.Module:
    from .experiments import build_model

    sizes = [data.num_features, *settings["sizes"], _output_width(data)]
    head = "softmax" if _task(data) == "classification" else "gaussian"
    return build_model(
        settings["model"],
        sizes,
        head,
        mode=settings["mode"],
        init=settings["init"],
        share=settings["share"],
        dropout=settings["dropout"],
        input_dropout=settings.get("input_dropout"),
    )


# ---------------------------------------------------------------------------------- train
def _run_train(args: argparse.Namespace) -> int:
    from .experiments import machine_description
    from .inference.trainer import TrainConfig, Trainer, seed_everything

    _check_device(args.device)
    out = Path(args.out or f"runs/{args.dataset}-{args.model}-seed{args.seed}")
    data = _load_data(args)
    settings = {
        key: getattr(args, key)
        for key in (
            "dataset", "split", "model", "mode", "sizes", "init", "share", "dropout",
            "input_dropout",
        )
    }  # fmt: skip
    seed_everything(args.seed)
    model = _build(settings, data)
    config = TrainConfig(
        lr=args.lr,
        batch_size=args.batch_size,
        max_epochs=args.max_epochs,
        patience=args.patience,
        seed=args.seed,
        device=args.device,
        task=_task(data),
        out_dir=str(out),
        progress=not args.quiet,
    )
    start = time.perf_counter()
    result = Trainer(model, config).fit(
        (data.x_train, data.y_train), (data.x_val, data.y_val), resume=args.resume
    )
    wall = time.perf_counter() - start
    metrics = {split: split_metrics(model, data, split, args.device) for split in _SPLITS}
    record = {
        "settings": {**settings, "seed": args.seed},
        "metrics": metrics,
        "epochs": result.epochs,
        "best_epoch": result.best_epoch,
        "stop_reason": result.stop_reason,
        "max_epochs": args.max_epochs,
        "batch_size": args.batch_size,
        "patience": args.patience,
        "lr": args.lr,
        "wall_time_s": wall,
        "command": args.command,
        "machine": machine_description(args.device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "data": data.description,
    }
    torch.save(model.state_dict(), out / MODEL_NAME)
    (out / RESULT_NAME).write_text(json.dumps(record, indent=1) + "\n")
    for split, values in metrics.items():
        print(f"{split:>5}: {_format_metrics(values)}")
    print(f"{result.epochs} epochs ({result.stop_reason}) in {wall:.1f} s; wrote {out}")
    return 0


def _add_train(subparsers: argparse._SubParsersAction) -> None:
    from .data import available_datasets
    from .experiments import CLI_MODELS

    parser = subparsers.add_parser(
        "train",
        help="train a GPN or tanh network on a data set",
        description=(
            "Train with the paper's schedule (Adam 1e-3, /10 on validation plateau, stop at "
            "1e-6, keep the best-validation parameters), then report train/val/test error "
            "(classification) or RMSE and log-likelihood in original units (regression). "
            "Writes result.json, model.pt, metrics and a checkpoint to --out."
        ),
    )
    parser.add_argument("dataset", choices=available_datasets(), help="data set name")
    parser.add_argument("--model", choices=CLI_MODELS, default="gpn", help="network kind")
    parser.add_argument(
        "--mode", choices=("mean", "meanvar", "cov"), default="meanvar", help="GPN propagation"
    )
    parser.add_argument(
        "--sizes",
        type=_positive_int,
        nargs="+",
        default=[30, 15],
        metavar="N",
        help="hidden layer widths; input and output widths come from the data (default 30 15)",
    )
    parser.add_argument(
        "--init", choices=("random", "identity"), default="random", help="GPN targets init"
    )
    parser.add_argument(
        "--share", choices=("none", "layer"), default="none", help="GPN activation sharing"
    )
    _add_dropout(parser, dropout=0.2, input_dropout=None)
    parser.add_argument("--seed", type=_nonnegative_int, default=0, help="initialisation seed")
    parser.add_argument(
        "--split",
        type=_nonnegative_int,
        default=0,
        help="train/test split (where there are several)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--out", default=None, help="output folder (default runs/<dataset>-<model>-seed<k>)"
    )
    parser.add_argument("--data-dir", default=None, help="folder with the raw data files")
    parser.add_argument("--max-epochs", type=_positive_int, default=1000)
    parser.add_argument("--batch-size", type=_positive_int, default=128)
    parser.add_argument(
        "--patience",
        type=_nonnegative_int,
        default=30,
        help="epochs without validation improvement before a lr reduction (30: the paper grid's "
        "choice, docs/results/paper_protocol.md)",
    )
    parser.add_argument("--lr", type=_positive_float, default=1e-3, help="initial learning rate")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the checkpoint in --out"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_threads(parser)
    parser.set_defaults(func=_run_train)


# ---------------------------------------------------------------------------------- evaluate
def _run_evaluate(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    result_path, model_path = run_dir / RESULT_NAME, run_dir / MODEL_NAME
    for path in (result_path, model_path):
        if not path.exists():
            raise SystemExit(f"pyro-gpn: error: {path} not found; is this a `train` output?")
    _check_device(args.device)
    settings = json.loads(result_path.read_text())["settings"]
    data_args = argparse.Namespace(
        dataset=settings["dataset"], data_dir=args.data_dir, split=settings["split"]
    )
    data = _load_data(data_args)
    model = _build(settings, data)
    model.load_state_dict(torch.load(model_path, map_location="cpu", weights_only=True))
    model.to(args.device)
    metrics = split_metrics(model, data, "test", args.device)
    if args.json:
        print(json.dumps(metrics))
    else:
        print(f"test: {_format_metrics(metrics)}")
    return 0


def _add_evaluate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate a trained run on the test split",
        description="Rebuild the model of a `pyro-gpn train` output folder and evaluate it.",
    )
    parser.add_argument("run_dir", help="the --out folder of `pyro-gpn train`")
    parser.add_argument("--data-dir", default=None, help="folder with the raw data files")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")
    parser.set_defaults(func=_run_evaluate)


# ---------------------------------------------------------------------------------- reproduce
def _run_reproduce(args: argparse.Namespace) -> int:
    from .experiments import RunSettings, grid_cells, run_grid, write_table

    if args.table_only:
        rows = write_table(args.out)
        print(f"wrote {args.out}/paper_table.md and .json ({len(rows)} rows)")
        return 0
    _check_device(args.device)
    cells = grid_cells(args.datasets, args.models, args.seeds)
    settings = RunSettings(
        max_epochs=args.max_epochs,
        batch_size=args.batch_size,
        patience=args.patience,
        dropout=args.dropout,
        input_dropout=args.input_dropout,
        device=args.device,
        data_dir=args.data_dir,
        progress=args.progress,
    )
    budget = None if args.time_budget is None else 60.0 * args.time_budget
    report = run_grid(
        args.out, cells, settings, time_budget_s=budget, work_dir=args.work_dir,
        command=args.command,
    )  # fmt: skip
    print(
        f"finished {len(report['finished'])}, already done {len(report['skipped'])}, "
        f"not started {len(report['pending'])}; table in {args.out}/paper_table.md"
    )
    return 0


def _add_reproduce(subparsers: argparse._SubParsersAction) -> None:
    from .experiments import GRID_DATASETS, GRID_MODELS, RunSettings

    parser = subparsers.add_parser(
        "reproduce",
        help="run the paper's classification grid and write the table",
        description=(
            "Run the cells of the paper's Table tab:gpn_exp_errors (data sets x models x seeds) "
            "that have no result file in OUT/paper_runs yet, then write OUT/paper_table.md and "
            "OUT/paper_table.json. Re-run the same command to continue an unfinished grid."
        ),
    )
    parser.add_argument("--datasets", nargs="+", choices=GRID_DATASETS, default=None)
    parser.add_argument("--models", nargs="+", choices=GRID_MODELS, default=None)
    parser.add_argument(
        "--seeds", nargs="+", type=_nonnegative_int, default=None, help="default 0 1 2 3 4"
    )
    parser.add_argument(
        "--max-epochs",
        type=_positive_int,
        default=None,
        help="epoch cap, recorded in each run (default: none, the paper's protocol)",
    )
    parser.add_argument(
        "--time-budget",
        type=_positive_float,
        default=None,
        metavar="MINUTES",
        help="start no new run after this many minutes",
    )
    parser.add_argument("--out", default="docs/results", help="results folder")
    parser.add_argument(
        "--work-dir",
        default="runs/paper",
        help="checkpoints of unfinished runs (resumed on the next call)",
    )
    defaults = RunSettings()
    parser.add_argument("--batch-size", type=_positive_int, default=defaults.batch_size)
    parser.add_argument(
        "--patience",
        type=_nonnegative_int,
        default=defaults.patience,
        help="epochs without validation improvement before the learning rate is divided by 10",
    )
    _add_dropout(parser, dropout=defaults.dropout, input_dropout=defaults.input_dropout)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--data-dir", default=None, help="folder with the raw UCI files")
    parser.add_argument("--progress", action="store_true", help="per-run progress bars")
    parser.add_argument(
        "--table-only", action="store_true", help="only rewrite the table from the run files"
    )
    _add_threads(parser)
    parser.set_defaults(func=_run_reproduce)


# ---------------------------------------------------------------------------------- demo
def _run_demo(args: argparse.Namespace) -> int:
    from .data import load_dataset
    from .experiments import build_model, machine_description
    from .inference.trainer import TrainConfig, Trainer, seed_everything

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
        config = TrainConfig(
            lr=args.lr,
            batch_size=args.batch_size,
            max_epochs=args.epochs,
            patience=args.patience,
            seed=args.seed,
            task="regression",
            progress=False,
        )
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
        from .plotting import plot_network_activations

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
    (out / "demo.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


def _add_demo(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="quick offline demo on the bundled yacht data",
        description=(
            "Train a GPN (mean + variance propagation) and a tanh network of the same shape on "
            "the bundled UCI yacht regression set, print test RMSE and log-likelihood in "
            "original units, and save a plot of the learned activation functions with their "
            "virtual observations and uncertainty bands. About a minute on a laptop CPU."
        ),
    )
    parser.add_argument("--out", default="pyro-gpn-demo", help="output folder for the PNG")
    parser.add_argument("--epochs", type=_positive_int, default=150, help="maximum epochs")
    parser.add_argument("--batch-size", type=_positive_int, default=32)
    parser.add_argument("--lr", type=_positive_float, default=1e-2, help="initial learning rate")
    parser.add_argument("--patience", type=_nonnegative_int, default=10)
    parser.add_argument(
        "--sizes", type=_positive_int, nargs="+", default=[20], metavar="N", help="hidden widths"
    )
    parser.add_argument(
        "--init", choices=("random", "identity"), default="identity", help="GPN targets init"
    )
    parser.add_argument("--seed", type=_nonnegative_int, default=0)
    _add_threads(parser, default=1)
    parser.set_defaults(func=_run_demo)


# ---------------------------------------------------------------------------------- main
def _add_compare(subparsers: argparse._SubParsersAction) -> None:
    from .compare import add_compare_parser

    add_compare_parser(subparsers)


_COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_train,
    _add_evaluate,
    _add_reproduce,
    _add_demo,
    _add_compare,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pyro-gpn`` with every subcommand of ``_COMMANDS``."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="pyro-gpn",
        description="Gaussian Process Neurons: train, evaluate, reproduce the paper, demo, "
        "compare inference routes.",
    )
    parser.add_argument("--version", action="version", version=f"pyro-gpn {__version__}")
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for add in _COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pyro-gpn`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command = _command_line(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
