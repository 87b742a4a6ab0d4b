"""The ``pyro-gpn`` command: train and evaluate networks, reproduce the paper's table, a demo.

Subcommands (``pyro-gpn <command> --help`` for the options, each with its default):

* ``train``: train a GPN or a tanh baseline on a data set with the paper's schedule; writes
  ``model.pt`` and, last, ``result.json`` (settings and train / validation / test metrics),
  each with a checksum (:mod:`pyro_gpn.io`), in a folder locked for the run
  (:class:`~pyro_gpn.io.RunLock`); a finished run is not replaced without ``--overwrite``;
* ``evaluate``: load a ``train`` output folder, verified (:func:`~.saved.load_run`), and
  evaluate it on the test split;
* ``reproduce``: run (or continue) the grid of the paper's Table ``tab:gpn_exp_errors`` and
  write ``paper_table.md`` / ``paper_table.json`` (:mod:`pyro_gpn.experiments.paper`);
* ``demo``: train a GPN and a tanh network on the bundled yacht regression set (offline, about
  a minute of one CPU core), print test RMSE and log-likelihood and plot the learned
  activation functions (:mod:`pyro_gpn.experiments.demo`);
* ``compare``: fit one regression data set with every inference route (NUTS, parametric SVI,
  central-limit ML, variational GPN with ``Trace_ELBO`` and with the closed-form ELBO) and
  tabulate accuracy, calibration, time and sampler diagnostics
  (:mod:`pyro_gpn.experiments.routes`);
* ``uci``: the UCI regression benchmark on its fixed splits, the Bayesian GPN beside MC dropout,
  a deep ensemble and GPyTorch's deep GP (``benchmarks/uci.py`` of the source checkout;
  :mod:`pyro_gpn.experiments.uci_benchmark`).

Each subcommand is one ``add_<name>(subparsers)`` function that registers its parser and sets
``func`` to its handler; adding a command means adding such a function to ``_COMMANDS``. The
options that fill a settings dataclass (:class:`~.runs.ModelSettings`, :class:`~.runs.Schedule`,
:class:`~.paper.RunSettings`, :class:`~.routes.RouteBudget`) are generated from its fields
(:mod:`~.options`).

Errors a user can act on (a damaged file, a folder in use or already holding a run, a full or
read-only disk, a data file that fails its checksum, a diverged training, a bad argument) end in
one line ``pyro-gpn: error: <message>`` on stderr and exit status 1; ``--debug`` (or
``PYRO_GPN_DEBUG=1``) shows the traceback instead. Ctrl-C ends with exit status 130 and says how
to continue.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import io as pio
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
from .saved import FORMAT, MODEL_NAME, RESULT_NAME, data_shape, load_record, load_run
from .uci_benchmark import add_uci_parser

__all__ = ["build_parser", "main", "split_metrics"]

_SPLITS = ("train", "val", "test")


def _format_metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:.4f}" for key, value in metrics.items())


def _load_data(dataset: str, data_dir: str | None, split: int, seed: int = 0) -> Any:
    from ..data import load_dataset

    try:
        return load_dataset(dataset, data_dir=data_dir, seed=seed, split=split)
    except OSError as error:  # ChecksumError and DataUnavailableError included
        message = f"cannot load {dataset!r}: {error}"
        raise (OSError(error.errno, message) if error.errno else OSError(message)) from error
    except ValueError as error:
        raise ValueError(f"cannot load {dataset!r}: {error}") from error


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=None, help="folder with the raw data files")


# ---------------------------------------------------------------------------------- train
def _run_train(args: argparse.Namespace) -> int:
    check_device(args.device)
    out = Path(args.out or f"runs/{args.dataset}-{args.model}-seed{args.seed}")
    with pio.RunLock(out):
        pio.ensure_can_write(out, overwrite=args.overwrite or args.resume)
        if args.overwrite and not args.resume:
            _forget_finished_run(out)
        return _train_locked(args, out)


def _forget_finished_run(out: Path) -> None:
    """Remove the files of a finished run that ``--overwrite`` replaces (``result.json`` first:
    without it the folder no longer claims to hold a finished run)."""
    for name in (RESULT_NAME, MODEL_NAME):
        for path in (out / name, pio.checksum_path(out / name)):
            path.unlink(missing_ok=True)


def _check_checkpoint(out: Path) -> None:
    """Fail early, naming the file, when ``--resume`` would continue from a damaged checkpoint
    (verified against its checksum where it has one)."""
    from ..inference.trainer import CHECKPOINT_NAME

    path = out / CHECKPOINT_NAME
    if not path.exists():
        return
    try:
        pio.load_torch(path, require_checksum=pio.checksum_path(path).exists())
    except pio.CorruptFileError as error:
        raise pio.CorruptFileError(
            error.path,
            error.reason,
            "--resume cannot continue from it: run the same command without --resume to start "
            "afresh (with --overwrite if the folder holds a finished run)",
        ) from error


def _train_locked(args: argparse.Namespace, out: Path) -> int:
    from dataclasses import asdict

    from ..inference.trainer import Trainer, seed_everything

    if args.resume:
        _check_checkpoint(out)
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
    try:
        result = Trainer(model, config).fit(
            (data.x_train, data.y_train), (data.x_val, data.y_val), resume=args.resume
        )
    except ValueError as error:
        if "nan" not in str(error).lower():
            raise
        # a distribution's argument check saw NaN: the optimisation diverged
        raise FloatingPointError(
            f"training diverged: non-finite values in the network ({_first_line(error)}); "
            f"lower --lr (now {args.lr:g}); the checkpoint of the last finished epoch in {out} "
            "is intact"
        ) from error
    wall = time.perf_counter() - start
    metrics = {split: split_metrics(model, data, split, args.device) for split in _SPLITS}
    record = {
        "format": FORMAT,
        "settings": {**settings, "seed": args.seed},
        "data_shape": data_shape(data),
        "data_dir": None if args.data_dir is None else str(Path(args.data_dir).resolve()),
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
    pio.save_torch(model.state_dict(), out / MODEL_NAME)
    pio.save_json(record, out / RESULT_NAME)  # last: marks the run finished
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
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a finished run in --out (without it such a folder is refused)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_threads(parser)
    parser.set_defaults(func=_run_train)


# ---------------------------------------------------------------------------------- evaluate
def _run_evaluate(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    check_device(args.device)
    record, verified = load_record(run_dir)  # before the data: a damaged folder fails fast
    settings = record["settings"]
    data_dir = args.data_dir or record.get("data_dir")
    data = _load_data(settings["dataset"], data_dir, settings["split"])
    run = load_run(run_dir, device=args.device, data=data)
    if not run.verified:
        print(
            f"pyro-gpn: warning: {run_dir} has no checksums (written before format 2): its "
            "files are not verified",
            file=sys.stderr,
        )
    model = run.model
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
    parser.add_argument(
        "--data-dir",
        default=None,
        help="folder with the raw data files (None: the one recorded by `train`, else the default)",
    )
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
    add_uci_parser,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pyro-gpn`` with every subcommand of ``_COMMANDS``."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="pyro-gpn",
        description="Gaussian Process Neurons: train, evaluate, reproduce the paper, demo, "
        "compare inference routes, the UCI benchmark.",
    )
    parser.add_argument("--version", action="version", version=f"pyro-gpn {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for add in _COMMANDS:
        add(subparsers)
    for sub in subparsers.choices.values():  # also accepted after the command
        sub.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP
        )
    return parser


_DEBUG_HELP = "show the traceback of an error (also PYRO_GPN_DEBUG=1)"

#: Errors that end the command with one line on stderr and exit status 1 (no traceback).
USER_ERRORS: tuple[type[BaseException], ...] = (
    pio.CorruptFileError,  # an OSError; MissingFileError included
    pio.RunInUseError,
    pio.RunExistsError,
    OSError,  # disk full, read-only folder, ChecksumError and DataUnavailableError of the data
    FloatingPointError,  # a diverged training
    ValueError,  # argument checks
)

_INTERRUPTED = {
    "train": "interrupted; continue with the same command and --resume (the checkpoint of the "
    "last finished epoch is kept)",
    "reproduce": "interrupted; run the same command again to continue the grid",
}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _debugging(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("PYRO_GPN_DEBUG", "") not in (
        "",
        "0",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pyro-gpn`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "pass_through", False):
        # ``uci``: what follows the command goes to the benchmark's own parser; nothing before it
        at = argv.index(args.subcommand)
        leading = [a for a in argv[:at] if a != "--debug"]
        if leading:
            parser.error(f"unrecognized arguments: {' '.join(leading)}")
        args.benchmark_args = [a for a in argv[at + 1 :] if a != "--debug"]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.command = "pyro-gpn " + shlex.join(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        if _debugging(args):
            raise
        print(f"pyro-gpn: {_INTERRUPTED.get(args.subcommand, 'interrupted')}", file=sys.stderr)
        return 130
    except USER_ERRORS as error:
        if _debugging(args):
            raise
        message = str(error).strip() or type(error).__name__
        print(f"pyro-gpn: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
