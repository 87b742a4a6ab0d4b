"""Tests of the paper table's aggregation and its markdown."""

from __future__ import annotations

import json
import statistics

import pytest

from pyro_gpn.experiments.paper_table import aggregate_runs, write_table


def _run(dataset, model, init, share, seed, test, max_epochs=None):
    return {
        "dataset": dataset, "model": model, "init": init, "share": share, "seed": seed,
        "train_error": test / 2, "val_error": test + 0.01, "test_error": test,
        "epochs": 10 + seed, "max_epochs": max_epochs, "command": "cmd",
        "layer_sizes": "16x30x15x26",
    }  # fmt: skip


def test_aggregate_runs_means_and_stds(tmp_path):
    errors = [0.10, 0.12, 0.11, 0.13, 0.09]
    runs = [_run("letter", "gpn-meanvar", "random", "none", s, e) for s, e in enumerate(errors)]
    runs += [_run("letter", "tanh", "none", "none", 0, 0.2, max_epochs=5)]
    rows = aggregate_runs(runs)
    assert [row["model"] for row in rows] == ["tanh", "gpn-meanvar"]  # the paper's order
    tanh, gpn = rows
    assert gpn["test_error_mean"] == pytest.approx(statistics.fmean(errors))
    assert gpn["test_error_std"] == pytest.approx(statistics.stdev(errors))
    assert gpn["train_error_mean"] == pytest.approx(statistics.fmean(errors) / 2)
    assert gpn["val_error_mean"] == pytest.approx(statistics.fmean(errors) + 0.01)
    assert gpn["seeds"] == [0, 1, 2, 3, 4] and gpn["complete"]
    assert gpn["max_epochs"] == [None] and gpn["command"] == "cmd"
    assert tanh["test_error_std"] is None and not tanh["complete"]
    assert tanh["max_epochs"] == [5]

    runs_dir = tmp_path / "paper_runs"
    runs_dir.mkdir()
    for run in runs:
        name = f"{run['dataset']}__{run['model']}__{run['init']}__{run['share']}__seed{run['seed']}"
        (runs_dir / f"{name}.json").write_text(json.dumps(run))
    written = write_table(tmp_path)
    saved = json.loads((tmp_path / "paper_table.json").read_text())["rows"]
    assert saved == json.loads(json.dumps(written))
    for key in ("dataset", "model", "init", "share", "train_error_mean", "val_error_mean",
                "test_error_mean", "test_error_std", "seeds", "command"):  # fmt: skip
        assert key in saved[0]
    markdown = (tmp_path / "paper_table.md").read_text()
    assert f"{statistics.fmean(errors):.4f} ± {statistics.stdev(errors):.4f}" in markdown
    assert "| 5/5 |" in markdown and "*(1/5 seeds)*" in markdown
    assert "0/5 (not run)" in markdown  # paper rows without runs are still listed
