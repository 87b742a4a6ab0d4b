"""Tests of the paper grid: cells, one run on tiny data, skipping finished runs, protocols."""

from __future__ import annotations

import json

import pytest
import torch

from pyro_gpn.data import ClassificationData
from pyro_gpn.experiments.paper import (
    PAPER_GRID,
    PAPER_RESULTS,
    GridCell,
    RunSettings,
    grid_cells,
    run_grid,
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


def test_run_settings_checks_and_dropout_record():
    with pytest.raises(ValueError, match="max_epochs"):
        RunSettings(max_epochs=0)
    with pytest.raises(ValueError, match="input_dropout"):
        RunSettings(input_dropout=1.0)
    assert RunSettings(dropout=0.3, input_dropout=0.0).dropout_record == {
        "kind": "fast", "rate": 0.3, "input_rate": 0.0,
    }  # fmt: skip


def test_paper_table_is_data_in_the_table_order():
    assert len(PAPER_RESULTS) == 14 and all(len(v) == 6 for v in PAPER_RESULTS.values())
    assert list(PAPER_GRID) == ["letter", "adult", "connect4"]
    assert PAPER_GRID["connect4"][-1] == ("gpn-meanvar", "random", "layer")
    assert PAPER_RESULTS[("adult", "gpn-meanvar", "identity", "none")][4] == 0.1390


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


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_run_grid_drops_a_damaged_checkpoint_and_reruns_the_cell(tmp_path, damage):
    cells = grid_cells(["letter"], ["tanh"], [0])
    work = tmp_path / "work"
    settings = RunSettings(max_epochs=1, batch_size=16)
    run = lambda: run_grid(
        tmp_path, cells, settings, work_dir=work, loader=tiny_classification, log=lambda _: None
    )
    run()
    checkpoint = work / cells[0].run_id / "checkpoint.pt"
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"")
    (tmp_path / "paper_runs" / f"{cells[0].run_id}.json").unlink()
    assert run()["finished"] == [cells[0].run_id]  # not torch's unpickling error
    saved = torch.load(checkpoint, weights_only=True)  # a fresh, whole checkpoint
    assert saved["result"]["epochs"] == 1


def test_run_grid_reruns_a_cell_whose_run_file_is_damaged(tmp_path):
    cells = grid_cells(["letter"], ["tanh"], [0])
    settings = RunSettings(max_epochs=1, batch_size=16)
    run = lambda: run_grid(tmp_path, cells, settings, loader=tiny_classification, log=print)
    run()
    path = tmp_path / "paper_runs" / f"{cells[0].run_id}.json"
    path.write_text(path.read_text()[:50])  # cut short (full disk under an older version)
    assert run()["finished"] == [cells[0].run_id]
    assert json.loads(path.read_text())["epochs"] == 1
    assert not list(tmp_path.rglob("*.tmp"))


def test_run_cell_locks_its_work_folder(tmp_path):
    from pyro_gpn.experiments.paper import run_cell
    from pyro_gpn.io import RunInUseError, RunLock

    cell = grid_cells(["letter"], ["tanh"], [0])[0]
    settings = RunSettings(max_epochs=1, batch_size=16)
    work = tmp_path / "work"
    with RunLock(work / cell.run_id), pytest.raises(RunInUseError, match=cell.run_id):
        run_cell(cell, tmp_path / "runs", settings, work, loader=tiny_classification)
    assert not (tmp_path / "runs").exists()
    run_cell(cell, tmp_path / "runs", settings, work, loader=tiny_classification)
    assert not (work / cell.run_id / ".lock").exists()
