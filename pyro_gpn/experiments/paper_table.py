"""The paper's classification table from the grid's run files: aggregate, compare, write.

:func:`write_table` reads ``<out>/paper_runs/*.json`` (written by
:func:`~pyro_gpn.experiments.paper.run_grid`), aggregates them per table row
(:func:`aggregate_runs`: mean and sample standard deviation over the finished seeds) and writes
``<out>/paper_table.json`` and ``<out>/paper_table.md``, the latter next to the paper's own
numbers (:data:`~pyro_gpn.experiments.paper.PAPER_RESULTS`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import io as pio
from .paper import GRID_DATASETS, PAPER_GRID, PAPER_LAYER_SIZES, PAPER_RESULTS, PAPER_SEEDS
from .runs import write_atomically

__all__ = ["aggregate_runs", "load_runs", "write_table"]


def load_runs(runs_dir: str | Path) -> list[dict[str, Any]]:
    """All run records (``*.json``) in ``runs_dir``, sorted by file name."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    # a damaged file is a CorruptFileError naming it (not a bare JSONDecodeError)
    return [pio.load_json(path, require_checksum=False) for path in sorted(runs_dir.glob("*.json"))]


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (``None`` for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def aggregate_runs(runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Aggregate run records into table rows, one per (dataset, model, init, share).

    Rows follow :data:`PAPER_GRID`'s order (unknown rows last). Each has the means of the
    train / validation / test errors over the finished seeds, their sample standard deviations
    (``None`` with one seed), ``seeds`` (sorted), ``complete`` (at least five seeds),
    ``max_epochs`` (the distinct caps, ``None`` meaning uncapped), ``layer_sizes`` and the
    distinct ``command`` lines joined by ``"; "``.
    """
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        key = (run["dataset"], run["model"], run["init"], run["share"])
        groups.setdefault(key, []).append(run)
    order = [(d, *row) for d in GRID_DATASETS for row in PAPER_GRID[d]]
    keys = sorted(groups, key=lambda k: (order.index(k) if k in order else len(order), k))
    rows = []
    for key in keys:
        group = sorted(groups[key], key=lambda run: run["seed"])
        row: dict[str, Any] = dict(zip(("dataset", "model", "init", "share"), key, strict=True))
        for split in ("train", "val", "test"):
            mean, std = _mean_std([float(run[f"{split}_error"]) for run in group])
            row[f"{split}_error_mean"], row[f"{split}_error_std"] = mean, std
        row["seeds"] = [run["seed"] for run in group]
        row["complete"] = len(set(row["seeds"])) >= len(PAPER_SEEDS)
        row["max_epochs"] = sorted(
            {run.get("max_epochs") for run in group}, key=lambda v: (v is None, v or 0)
        )
        row["epochs_mean"] = statistics.fmean(run["epochs"] for run in group)
        row["layer_sizes"] = group[0].get("layer_sizes", "")
        row["command"] = "; ".join(dict.fromkeys(run["command"] for run in group))
        rows.append(row)
    return rows


def _fmt(mean: float | None, std: float | None) -> str:
    if mean is None:
        return ""
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def _markdown(rows: list[dict[str, Any]]) -> str:
    found = {(r["dataset"], r["model"], r["init"], r["share"]): r for r in rows}
    keys = list(PAPER_RESULTS) + [k for k in found if k not in PAPER_RESULTS]
    lines = [
        "# The paper's classification table (tab:gpn_exp_errors), reproduced",
        "",
        "Misclassification rates, mean ± sample standard deviation over the finished seeds "
        "(the paper: mean ± 68 % interval over five runs). Written by `pyro-gpn reproduce` "
        "(`pyro_gpn.experiments.write_table`) from the run files in `paper_runs/`; the exact "
        "command, machine, wall time, epoch count and stop reason of every run are in its file.",
        "",
        "* `tanh-dropout` is a tanh network with **fast** dropout (the paper's baseline); its "
        "rates are not stated in the paper, ours (chosen on validation error, see "
        "[paper_protocol.md](paper_protocol.md)) are in each run file.",
        "* Our Adult encoding has 108 input columns (the paper: 104); widths come from the data.",
        "* **Epoch cap**: `none` is the paper's protocol (train until the learning rate reaches "
        "1e-6 without improvement); a number means training was cut after that many epochs, "
        "so those rows are not the paper's protocol.",
        "* Rows with fewer than 5 finished seeds are marked *(n/5 seeds)*; rows with no run "
        "show the paper's numbers only.",
        "* MNIST (784x30x15x10) is not part of the grid: its training images are unavailable "
        "offline; a reduced experiment on the 10,000 test images is in "
        "[mnist_reduced.md](mnist_reduced.md).",
        "* The protocol (batch size, patience, preprocessing) and how it was chosen on "
        "validation data: [paper_protocol.md](paper_protocol.md). GPN run files without a "
        "`gp_compute_dtype` field predate the layers' float64 GP algebra and computed it in "
        "float32.",
        "",
        "| Dataset | Layer sizes | Model | Sharing | Act. init | Train (ours) | Val (ours) "
        "| Test (ours) | Train (paper) | Val (paper) | Test (paper) | Seeds | Epoch cap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in keys:
        dataset, model, init, share = key
        row = found.get(key)
        paper = PAPER_RESULTS.get(key)
        sizes = row["layer_sizes"] if row else PAPER_LAYER_SIZES.get(dataset, "")
        ours = ["", "", ""]
        seeds, cap = "0/5 (not run)", ""
        if row is not None:
            ours = [
                _fmt(row[f"{s}_error_mean"], row[f"{s}_error_std"])
                for s in ("train", "val", "test")
            ]
            n = len(row["seeds"])
            seeds = f"{n}/5" if row["complete"] else f"*({n}/5 seeds)*"
            cap = ", ".join("none" if c is None else str(c) for c in row["max_epochs"])
        theirs = ["", "", ""] if paper is None else [
            _fmt(paper[0], paper[1]), _fmt(paper[2], paper[3]), _fmt(paper[4], paper[5])
        ]  # fmt: skip
        fixed = model.startswith("tanh")
        cells = [
            dataset, sizes, model, "" if fixed else share, "" if fixed else init,
            *ours, *theirs, seeds, cap,
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_table(out: str | Path) -> list[dict[str, Any]]:
    """Aggregate ``out/paper_runs/*.json`` into ``out/paper_table.json`` and ``.md``.

    Returns:
        The aggregated rows (see :func:`aggregate_runs`).
    """
    out = Path(out)
    rows = aggregate_runs(load_runs(out / "paper_runs"))
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "paper_table.json", json.dumps({"rows": rows}, indent=1) + "\n")
    write_atomically(out / "paper_table.md", _markdown(rows))
    return rows
