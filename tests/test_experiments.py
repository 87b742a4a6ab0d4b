"""Tests of the paper grid: cells, one run on tiny data, skipping finished runs, aggregation."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from pyro_gpn.data import ClassificationData
from pyro_gpn.experiments import (
    PAPER_GRID,
    PAPER_RESULTS,
    GridCell,
    RunSettings,
    aggregate_runs,
    build_model,
    grid_cells,
    run_grid,
    write_table,
)


def tiny_classification(name: str, data_dir=None, seed: int = 0, **_) -> ClassificationData:
    """A stand-in for ``load_dataset``: 3 features, 3 classes, a few dozen samples."""
    generator = torch.Generator().manual_seed(seed)

    def part(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.rand(n, 3, generator=generator)
        return x, (x[:, 0] * 3).long().clamp_max(2)

    (x_train, y_train), (x_val, y_val), (x_test, y_test) = part(40), part(12), part(12)
    return ClassificationData(
        name=name, x_train=x_train, y_train=y_train, x_val=x_val, y_val=y_val,
        x_test=x_test, y_test=y_test, feature_names=("a", "b", "c"),
        description="synthetic test data", class_names=("0", "1", "2"),
    )  # fmt: skip


def test_grid_matches_the_paper_table():
    cells = grid_cells()
    assert len(cells) == 5 * sum(len(rows) for rows in PAPER_GRID.values()) == 70
    assert {cell.row_key for cell in cells} == set(PAPER_RESULTS)
    assert cells[0] == GridCell("letter", "tanh", "none", "none", 0)
    assert cells[0].run_id == "letter__tanh__none__none__seed0"
    subset = grid_cells(["adult"], ["gpn-meanvar"], [3])
    assert [c.run_id for c in subset] == [
        "adult__gpn-meanvar__random__none__seed3",
        "adult__gpn-meanvar__identity__none__seed3",
    ]
    with pytest.raises(ValueError, match="datasets"):
        grid_cells(["mnist"])
    with pytest.raises(ValueError, match="models"):
        grid_cells(models=["relu"])
    with pytest.raises(ValueError, match="seeds"):
        grid_cells(seeds=[-1])


def test_build_model_kinds():
    assert build_model("gpn", [3, 4, 2], "softmax", mode="mean").mode == "mean"
    fast = build_model("tanh-fastdropout", [3, 4, 2], "softmax", dropout=0.3)
    assert fast.fast_dropout and fast.dropout == 0.3
    assert fast.input_dropout == 0.3
    hidden_only = build_model("tanh-fastdropout", [3, 4, 2], "softmax", input_dropout=0.0)
    assert hidden_only.dropout == 0.2 and hidden_only.input_dropout == 0.0
    assert not build_model("tanh-dropout", [3, 4, 2], "softmax").fast_dropout
    with pytest.raises(ValueError, match="model"):
        build_model("relu", [3, 4, 2], "softmax")
    with pytest.raises(ValueError, match="max_epochs"):
        RunSettings(max_epochs=0)
    with pytest.raises(ValueError, match="input_dropout"):
        RunSettings(input_dropout=1.0)
    assert RunSettings(dropout=0.3, input_dropout=0.0).dropout_record == {
        "kind": "fast", "rate": 0.3, "input_rate": 0.0,
    }  # fmt: skip


def test_run_grid_writes_runs_and_skips_finished(tmp_path):
    cells = grid_cells(["letter"], ["tanh-dropout", "gpn-mean"], [0])
    settings = RunSettings(max_epochs=1, batch_size=16)
    logs: list[str] = []
    report = run_grid(
        tmp_path, cells, settings, work_dir=tmp_path / "work", command="test-cmd",
        loader=tiny_classification, log=logs.append,
    )  # fmt: skip
    assert report["finished"] == [c.run_id for c in cells] and not report["skipped"]
    record = json.loads((tmp_path / "paper_runs" / f"{cells[0].run_id}.json").read_text())
    assert record["max_epochs"] == 1 and record["epochs"] == 1
    assert record["dropout"] == {"kind": "fast", "rate": 0.05, "input_rate": 0.0}
    assert record["sizes"] == [3, 30, 15, 3] and record["command"] == "test-cmd"
    assert "no GPU" in record["machine"] or "GPU" in record["machine"]
    assert 0.0 <= record["test_error"] <= 1.0
    assert record["gp_compute_dtype"] is None  # the tanh baseline has no GPN layer
    gpn = json.loads((tmp_path / "paper_runs" / f"{cells[1].run_id}.json").read_text())
    assert gpn["gp_compute_dtype"] == "float64"
    table = json.loads((tmp_path / "paper_table.json").read_text())
    assert [row["model"] for row in table["rows"]] == ["tanh-dropout", "gpn-mean"]
    markdown = (tmp_path / "paper_table.md").read_text()
    assert "*(1/5 seeds)*" in markdown and "0.0625 ± 0.0042" in markdown

    again = run_grid(tmp_path, cells, settings, loader=tiny_classification, log=logs.append)
    assert again["skipped"] == report["finished"] and not again["finished"]

    # a different epoch cap (e.g. the paper's uncapped protocol later) reruns and replaces
    longer = RunSettings(max_epochs=2, batch_size=16)
    third = run_grid(tmp_path, cells[:1], longer, loader=tiny_classification, log=logs.append)
    assert third["finished"] == [cells[0].run_id]
    record = json.loads((tmp_path / "paper_runs" / f"{cells[0].run_id}.json").read_text())
    assert record["max_epochs"] == 2


@pytest.mark.parametrize(
    "change",
    [{"patience": 3}, {"batch_size": 8}, {"dropout": 0.1}, {"input_dropout": None}],
    ids=lambda c: next(iter(c)),
)
def test_run_grid_reruns_runs_of_another_protocol(tmp_path, change):
    cells = grid_cells(["letter"], ["tanh-dropout"], [0])
    base = {"max_epochs": 1, "batch_size": 16}
    work = tmp_path / "work"
    run = lambda settings: run_grid(
        tmp_path, cells, settings, work_dir=work, loader=tiny_classification, log=lambda _: None
    )
    run(RunSettings(**base))
    checkpoint = work / cells[0].run_id / "checkpoint.pt"
    assert checkpoint.exists()
    other = RunSettings(**{**base, **change})
    assert run(other)["finished"] == [cells[0].run_id]
    record = json.loads((tmp_path / "paper_runs" / f"{cells[0].run_id}.json").read_text())
    assert record["patience"] == other.patience and record["batch_size"] == other.batch_size
    assert record["dropout"] == other.dropout_record
    # trained afresh under the new protocol, not continued from the old checkpoint
    saved = torch.load(checkpoint, weights_only=False)
    assert saved["config"]["patience"] == other.patience
    assert saved["config"]["batch_size"] == other.batch_size
    assert run(other)["skipped"] == [cells[0].run_id]


def test_run_grid_time_budget_starts_nothing_when_spent(tmp_path):
    cells = grid_cells(["letter"], ["tanh"], [0, 1])
    report = run_grid(tmp_path, cells, time_budget_s=0.0, loader=tiny_classification)
    assert report["pending"] == [c.run_id for c in cells]
    assert not (tmp_path / "paper_runs").exists()


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
