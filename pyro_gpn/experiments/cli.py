"""The ``pyro-gpn`` command: train and evaluate networks, reproduce the paper's table, a demo.

Subcommands (``pyro-gpn <command> --help`` for the options, each with its default):

* ``train``: train a GPN or a tanh baseline on a data set with the paper's schedule; writes
  ``result.json`` (settings and train / validation / test metrics) and ``model.pt``;
* ``evaluate``: load a ``train`` output folder and evaluate it on the test split;
* ``reproduce``: run (or continue) the grid of the paper's Table ``tab:gpn_exp_errors`` and
  write ``paper_table.md`` / ``paper_table.json`` (:mod:`pyro_gpn.experiments.paper`);
* ``demo``: train a GPN and a tanh network on the bundled yacht regression set (offline, about
  a minute on a laptop CPU), print test RMSE and log-likelihood and plot the learned activation
  functions (:mod:`pyro_gpn.experiments.demo`);
* ``compare``: fit one regression data set with every inference route (NUTS, parametric SVI,
  central-limit ML, variational GPN with ``Trace_ELBO`` and with the closed-form ELBO) and
  tabulate accuracy, calibration, time and sampler diagnostics
  (:mod:`pyro_gpn.experiments.routes`).

Each subcommand is one ``add_<name>(subparsers)`` function that registers its parser and sets
``func`` to its handler; adding a command means adding such a function to ``_COMMANDS``. The
options that fill a settings dataclass (:class:`~.runs.ModelSettings`, :class:`~.runs.Schedule`,
:class:`~.paper.RunSettings`, :class:`~.routes.RouteBudget`) are generated from its fields
(:mod:`~.options`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .demo import add_demo_parser
from .options import (
    HelpFormatter,
    add_device,
    add_options,
    add_threads,
    check_device,
    from_args,
    nonnegative_int,
    positive_float,
)
from .paper import GRID_DATASETS, GRID_MODELS, RunSettings
from .routes.cli import add_compare_parser
from .runs import ModelSettings, Schedule, machine_description, split_metrics

__all__ = ["build_parser", "main", "split_metrics"]

RESULT_NAME = "result.json"
MODEL_NAME = "model.pt"
_SPLITS = ("train", "val", "test")


def _format_metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:.4f}" for key, value in metrics.items())


def _load_data(dataset: str, data_dir: str | None, split: int, seed: int = 0) -> Any:
    from ..data import load_dataset

    try:
        return load_dataset(dataset, data_dir=data_dir, seed=seed, split=split)
    except (FileNotFoundError, OSError, ValueError) as error:
        raise SystemExit(f"pyro-gpn: error: cannot load {dataset!r}: {error}") from error


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=None, help="folder with the raw data files")


# ---------------------------------------------------------------------------------- train
def _run_train(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..inference.trainer import Trainer, seed_everything

    check_device(args.device)
    out = Path(args.out or f"runs/{args.dataset}-{args.model}-seed{args.seed}")
    data = _load_data(args.dataset, args.data_dir, args.split)
    model_settings, schedule = from_args(ModelSettings, args), from_args(Schedule, args)
    settings = {"dataset": args.dataset, "split": args.split, **asdict(model_settings)}
    seed_everything(args.seed)
    model = model_settings.build(data)
    config = schedule.config(
        seed=args.seed,
        device=args.device,
        task="classification" if hasattr(data, "num_classes") else "regression",
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
        "max_epochs": schedule.max_epochs,
        "batch_size": schedule.batch_size,
        "patience": schedule.patience,
        "lr": schedule.lr,
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


def add_train_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``pyro-gpn train``."""
    from ..data import available_datasets

    parser = subparsers.add_parser(
        "train",
        help="train a GPN or tanh network on a data set",
        description=(
            "Train with the paper's schedule (Adam 1e-3, /10 on validation plateau, stop at "
            "1e-6, keep the best-validation parameters), then report train/val/test error "
            "(classification) or RMSE and log-likelihood in original units (regression). "
            "Writes result.json, model.pt, metrics and a checkpoint to --out."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("dataset", choices=available_datasets(), help="data set name")
    add_options(parser.add_argument_group("network"), ModelSettings)
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="initialisation seed")
    parser.add_argument(
        "--split",
        type=nonnegative_int,
        default=0,
        help="train/test split (where several)",
    )
    add_device(parser)
    parser.add_argument(
        "--out", default=None, help="output folder (None: runs/<dataset>-<model>-seed<k>)"
    )
    _add_data_dir(parser)
    add_options(parser.add_argument_group("schedule"), Schedule)
    parser.add_argument(
        "--resume", action="store_true", help="continue from the checkpoint in --out"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_threads(parser)
    parser.set_defaults(func=_run_train)


# ---------------------------------------------------------------------------------- evaluate
def _run_evaluate(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    result_path, model_path = run_dir / RESULT_NAME, run_dir / MODEL_NAME
    for path in (result_path, model_path):
        if not path.exists():
            raise SystemExit(f"pyro-gpn: error: {path} not found; is this a `train` output?")
    check_device(args.device)
    settings = json.loads(result_path.read_text())["settings"]
    data = _load_data(settings["dataset"], args.data_dir, settings["split"])
    model = ModelSettings.from_record(settings).build(data)
    model.load_state_dict(torch.load(model_path, map_location="cpu", weights_only=True))
    model.to(args.device)
    metrics = split_metrics(model, data, "test", args.device)
    if args.json:
        print(json.dumps(metrics))
    else:
        print(f"test: {_format_metrics(metrics)}")
    return 0


def add_evaluate_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``pyro-gpn evaluate``."""
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate a trained run on the test split",
        description="Rebuild the model of a `pyro-gpn train` output folder and evaluate it.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("run_dir", help="the --out folder of `pyro-gpn train`")
    _add_data_dir(parser)
    add_device(parser)
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")
    parser.set_defaults(func=_run_evaluate)


# ---------------------------------------------------------------------------------- reproduce
def _run_reproduce(args: argparse.Namespace) -> int:
    from .paper import grid_cells, run_grid
    from .paper_table import write_table

    if args.table_only:
        rows = write_table(args.out)
        print(f"wrote {args.out}/paper_table.md and .json ({len(rows)} rows)")
        return 0
    check_device(args.device)
    cells = grid_cells(args.datasets, args.models, args.seeds)
    settings = from_args(RunSettings, args)
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


def add_reproduce_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``pyro-gpn reproduce``; the training options come from ``RunSettings``."""
    parser = subparsers.add_parser(
        "reproduce",
        help="run the paper's classification grid and write the table",
        description=(
            "Run the cells of the paper's Table tab:gpn_exp_errors (data sets x models x seeds) "
            "that have no result file in OUT/paper_runs yet, then write OUT/paper_table.md and "
            "OUT/paper_table.json. Re-run the same command to continue an unfinished grid."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--datasets", nargs="+", choices=GRID_DATASETS, default=None, help="None: all"
    )
    parser.add_argument("--models", nargs="+", choices=GRID_MODELS, default=None, help="None: all")
    parser.add_argument(
        "--seeds", nargs="+", type=nonnegative_int, default=None, help="None: 0 1 2 3 4"
    )
    parser.add_argument(
        "--time-budget",
        type=positive_float,
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
    add_options(parser.add_argument_group("training (RunSettings)"), RunSettings)
    parser.add_argument(
        "--table-only", action="store_true", help="only rewrite the table from the run files"
    )
    add_threads(parser)
    parser.set_defaults(func=_run_reproduce)


# ---------------------------------------------------------------------------------- main
_COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    add_train_parser,
    add_evaluate_parser,
    add_reproduce_parser,
    add_demo_parser,
    add_compare_parser,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pyro-gpn`` with every subcommand of ``_COMMANDS``."""
    from .. import __version__

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
    args.command = "pyro-gpn " + shlex.join(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
