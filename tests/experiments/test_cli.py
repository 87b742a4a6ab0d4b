"""End-to-end tests of the ``pyro-gpn`` command on tiny runs (bundled yacht, synthetic grid)."""

from __future__ import annotations

import json

import pytest

import pyro_gpn.data
from pyro_gpn.experiments.cli import build_parser, main

from .test_paper import tiny_classification


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("train", "evaluate", "reproduce", "demo"):
        assert command in out


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "yacht", "--max-epochs", "0"],
        ["train", "yacht", "--model", "relu"],
        ["train", "no-such-data"],
        ["reproduce", "--datasets", "mnist"],
        ["reproduce", "--time-budget", "-1"],
        ["demo", "--epochs", "two"],
        [],
    ],
)
def test_bad_arguments_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_train_then_evaluate_on_bundled_yacht(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "yacht", "--max-epochs", "2", "--sizes", "4", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "test: rmse" in printed
    result = json.loads((out / "result.json").read_text())
    assert result["epochs"] == 2 and result["max_epochs"] == 2
    assert result["settings"]["sizes"] == [4] and result["settings"]["model"] == "gpn"
    assert result["command"] == "pyro-gpn " + " ".join(argv)
    test = result["metrics"]["test"]
    assert set(test) == {"rmse", "log_likelihood"} and test["rmse"] > 0
    assert (out / "model.pt").exists()

    assert main(["evaluate", str(out), "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated == pytest.approx(test, rel=1e-5)


def test_train_tanh_baseline_and_resume(tmp_path, capsys):
    out = tmp_path / "tanh"
    base = ["train", "yacht", "--model", "tanh-fastdropout", "--sizes", "4", "--quiet"]
    assert main([*base, "--max-epochs", "1", "--out", str(out)]) == 0
    assert main([*base, "--max-epochs", "2", "--out", str(out), "--resume"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["epochs"] == 2 and result["settings"]["input_dropout"] is None
    hidden_only = tmp_path / "hidden-only"
    argv = [*base, "--max-epochs", "1", "--input-dropout", "0", "--out", str(hidden_only)]
    assert main(argv) == 0
    assert json.loads((hidden_only / "result.json").read_text())["settings"]["input_dropout"] == 0
    assert main(["evaluate", str(hidden_only), "--json"]) == 0
    capsys.readouterr()


def test_evaluate_rejects_a_folder_without_a_run(tmp_path):
    with pytest.raises(SystemExit, match="result.json"):
        main(["evaluate", str(tmp_path)])


def test_reproduce_runs_the_grid_once_and_skips_finished_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pyro_gpn.data, "load_dataset", tiny_classification)
    argv = [
        "reproduce", "--datasets", "adult", "--models", "tanh", "--seeds", "0", "1",
        "--max-epochs", "1", "--batch-size", "16", "--out", str(tmp_path),
        "--work-dir", str(tmp_path / "work"),
    ]  # fmt: skip
    assert main(argv) == 0
    assert "finished 2, already done 0" in capsys.readouterr().out
    runs = sorted(p.name for p in (tmp_path / "paper_runs").glob("*.json"))
    assert runs == ["adult__tanh__none__none__seed0.json", "adult__tanh__none__none__seed1.json"]
    record = json.loads((tmp_path / "paper_runs" / runs[0]).read_text())
    assert record["command"] == "pyro-gpn " + " ".join(argv) and record["max_epochs"] == 1

    assert main(argv) == 0
    assert "finished 0, already done 2" in capsys.readouterr().out
    rows = json.loads((tmp_path / "paper_table.json").read_text())["rows"]
    assert len(rows) == 1 and rows[0]["seeds"] == [0, 1]
    assert "*(2/5 seeds)*" in (tmp_path / "paper_table.md").read_text()

    assert main(["reproduce", "--table-only", "--out", str(tmp_path)]) == 0
    assert "1 rows" in capsys.readouterr().out


def test_train_and_evaluate_classification(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pyro_gpn.data, "load_dataset", tiny_classification)
    out = tmp_path / "letter"
    argv = ["train", "letter", "--mode", "mean", "--share", "layer", "--init", "identity"]
    assert main([*argv, "--sizes", "4", "--max-epochs", "1", "--quiet", "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    assert set(result["metrics"]) == {"train", "val", "test"}
    assert set(result["metrics"]["test"]) == {"error"}
    capsys.readouterr()
    assert main(["evaluate", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == result["metrics"]["test"]
