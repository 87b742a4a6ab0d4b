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
    for command in ("train", "evaluate", "reproduce", "demo", "compare", "uci"):
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


def test_train_tanh_baseline_and_resume(tmp_path, capsys, monkeypatch):
    from pyro_gpn.inference.trainer import Trainer

    loaded = []  # the checkpoints the trainer continued from (a restart would load none)
    load = Trainer._load_checkpoint

    def spy(self):
        checkpoint = load(self)
        loaded.append(None if checkpoint is None else checkpoint["result"]["epochs"])
        return checkpoint

    monkeypatch.setattr(Trainer, "_load_checkpoint", spy)
    out = tmp_path / "tanh"
    base = ["train", "yacht", "--model", "tanh-fastdropout", "--sizes", "4", "--quiet"]
    assert main([*base, "--max-epochs", "1", "--out", str(out)]) == 0
    assert loaded == []
    assert main([*base, "--max-epochs", "2", "--out", str(out), "--resume"]) == 0
    assert loaded == [1]
    result = json.loads((out / "result.json").read_text())
    assert result["epochs"] == 2 and result["settings"]["input_dropout"] is None
    hidden_only = tmp_path / "hidden-only"
    argv = [*base, "--max-epochs", "1", "--input-dropout", "0", "--out", str(hidden_only)]
    assert main(argv) == 0
    assert json.loads((hidden_only / "result.json").read_text())["settings"]["input_dropout"] == 0
    assert main(["evaluate", str(hidden_only), "--json"]) == 0
    capsys.readouterr()


def test_evaluate_rejects_a_folder_without_a_run(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pyro-gpn: error: ") and "result.json" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------- faults
TINY = ["train", "yacht", "--max-epochs", "1", "--sizes", "4", "--quiet"]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("pyro-gpn: error: ") and len(err.splitlines()) == 1, err
    return err


def test_train_refuses_a_finished_run_without_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--out", str(out)]) == 0
    first = (out / "model.pt").read_bytes()
    assert main([*TINY, "--seed", "1", "--out", str(out)]) == 1
    assert "--overwrite" in _one_line_error(capsys)
    assert (out / "model.pt").read_bytes() == first  # untouched
    assert main([*TINY, "--seed", "1", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "result.json").read_text())["settings"]["seed"] == 1
    assert (out / "model.pt").read_bytes() != first
    assert not (out / ".lock").exists()  # released


def test_train_refuses_a_folder_in_use(tmp_path, capsys):
    from pyro_gpn.io import RunLock

    out = tmp_path / "run"
    with RunLock(out):  # another run holds the folder (flock is per open file)
        assert main([*TINY, "--out", str(out)]) == 1
    assert "in use" in _one_line_error(capsys)
    assert not (out / "result.json").exists()


def test_train_refuses_an_output_folder_under_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main([*TINY, "--out", str(tmp_path / "f" / "run")]) == 1
    assert str(tmp_path / "f") in _one_line_error(capsys)


def test_ctrl_c_says_how_to_continue(tmp_path, monkeypatch, capsys):
    from pyro_gpn.inference import trainer

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Trainer, "fit", interrupted)
    assert main([*TINY, "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    assert not (tmp_path / "run" / ".lock").exists()


def test_divergence_is_a_floating_point_error_with_advice(tmp_path, monkeypatch, capsys):
    from pyro_gpn.inference import trainer

    def diverged(self, *args, **kwargs):
        raise ValueError("Expected parameter loc to satisfy Real(), but found NaN values")

    monkeypatch.setattr(trainer.Trainer, "fit", diverged)
    assert main([*TINY, "--lr", "1e6", "--out", str(tmp_path / "run")]) == 1
    err = _one_line_error(capsys)
    assert "diverged" in err and "--lr" in err and "1e+06" in err
    with pytest.raises(FloatingPointError, match="diverged"):
        main([*TINY, "--lr", "1e6", "--out", str(tmp_path / "run"), "--debug"])
    monkeypatch.setenv("PYRO_GPN_DEBUG", "1")
    with pytest.raises(FloatingPointError):
        main([*TINY, "--lr", "1e6", "--out", str(tmp_path / "run")])


def test_data_checksum_error_is_one_line(tmp_path, monkeypatch, capsys):
    from pyro_gpn.data import ChecksumError

    def corrupted(name, **kwargs):
        raise ChecksumError(f"{tmp_path}/letter-recognition.data is corrupted")

    assert issubclass(ChecksumError, OSError) and issubclass(ChecksumError, RuntimeError)
    monkeypatch.setattr(pyro_gpn.data, "load_dataset", corrupted)
    assert main(["train", "letter", "--quiet", "--out", str(tmp_path / "o")]) == 1
    err = _one_line_error(capsys)
    assert "'letter'" in err and "letter-recognition.data" in err


def test_evaluate_damaged_model_is_one_line_and_debug_shows_it(tmp_path, capsys):
    from pyro_gpn.io import CorruptFileError

    out = tmp_path / "run"
    assert main([*TINY, "--out", str(out)]) == 0
    data = bytearray((out / "model.pt").read_bytes())
    data[-40] ^= 0xFF
    (out / "model.pt").write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["evaluate", str(out)]) == 1
    assert "model.pt" in _one_line_error(capsys) and not capsys.readouterr().out
    with pytest.raises(CorruptFileError):
        main(["--debug", "evaluate", str(out)])


def test_evaluate_reuses_the_recorded_data_dir(tmp_path, monkeypatch, capsys):
    seen = []

    def loader(name, data_dir=None, **kwargs):
        seen.append(data_dir)
        return tiny_classification(name, data_dir, **kwargs)

    monkeypatch.setattr(pyro_gpn.data, "load_dataset", loader)
    out, data_dir = tmp_path / "run", tmp_path / "data"
    argv = ["train", "letter", "--sizes", "4", "--max-epochs", "1", "--quiet"]
    assert main([*argv, "--out", str(out), "--data-dir", str(data_dir)]) == 0
    assert main(["evaluate", str(out)]) == 0
    assert main(["evaluate", str(out), "--data-dir", str(tmp_path / "elsewhere")]) == 0
    assert seen == [str(data_dir), str(data_dir.resolve()), str(tmp_path / "elsewhere")]
    capsys.readouterr()


def test_every_option_has_help_and_debug_everywhere():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "train" in a.choices)
    for name, sub in subparsers.choices.items():
        options = {opt for action in sub._actions for opt in action.option_strings}
        assert "--debug" in options, name
    train = subparsers.choices["train"]
    overwrite = next(a for a in train._actions if "--overwrite" in a.option_strings)
    assert overwrite.help and not overwrite.default


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


def test_resume_from_a_damaged_checkpoint_names_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--out", str(out)]) == 0
    checkpoint = out / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    capsys.readouterr()
    assert main([*TINY, "--max-epochs", "2", "--out", str(out), "--resume"]) == 1
    err = _one_line_error(capsys)
    assert "checkpoint.pt" in err and "without --resume" in err
    assert main([*TINY, "--max-epochs", "2", "--out", str(out), "--overwrite"]) == 0


def test_unknown_arguments_of_a_command_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--bogus"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_uci_passes_its_arguments_to_the_benchmark(tmp_path, capsys):
    """``pyro-gpn uci`` is ``benchmarks/uci.py`` with the arguments after ``uci``: its help,
    its refusals (an unknown model or set, exit status 2) and its summary of a folder."""
    with pytest.raises(SystemExit) as exit_info:
        main(["uci", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "usage: pyro-gpn uci" in help_text and "--models" in help_text
    for bad, message in (
        (["--models", "nope"], "unknown model"),
        (["--sets", "iris"], "unknown set"),
        (["--splits", "20"], "--splits: expected an integer in 0-19, got 20"),
        (["--splits", "-1"], "--splits: expected an integer in 0-19, got -1"),
        (["--splits", "two"], "--splits: expected an integer, got 'two'"),
        (["--sets", "protein", "--splits", "5", "7"], "protein has 5 splits (0-4)"),
        (["--large-steps", "0"], "--large-steps: expected an integer at least 1, got 0"),
        (["--seed", "-3"], "--seed: expected an integer in 0-4294967295, got -3"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["uci", *bad, "--out", str(tmp_path)])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    assert main(["uci", "--summary", "--out", str(tmp_path)]) == 0
    assert "**test log_lik**" in capsys.readouterr().out
    # --debug after the command is the command's; other options before it are refused
    assert main(["uci", "--summary", "--debug", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--summary", "uci", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --summary" in capsys.readouterr().err
    # an abbreviation is the benchmark's (--d: its --diag), not pyro-gpn's --debug
    assert main(["uci", "--summary", "--d", str(tmp_path / "diag"), "--out", str(tmp_path)]) == 0


def test_uci_runs_each_sets_chosen_column(tmp_path, monkeypatch, capsys):
    """``--models chosen`` fits each set's validation-chosen Bayesian GPN (``CHOSEN``), once
    even where it is also named, and skips the cells already in ``--out``."""
    from benchmarks import uci

    fitted = []

    def fake_cell(model, name, split, seed=0):
        fitted.append((model, name, split))
        metrics = {"log_lik": -1.0, "rmse": 1.0, "coverage90": 0.9}
        return {
            "model": model,
            "set": name,
            "split": split,
            "test": metrics,
            "val": metrics,
            "cell_s": 1.0,
            "s_per_epoch": 0.1,
        }

    monkeypatch.setattr(uci, "run_cell", fake_cell)
    # protein's splits past its five are skipped with a note, the other sets' run
    assert main(["uci", "--splits", "6", "--sets", "protein", "wine", "--models", "mcdrop",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    assert "protein has 5 splits: skipping its splits [6]" in capsys.readouterr().out
    assert fitted == [("mcdrop", "wine", 6)]
    fitted.clear()
    chosen = uci.CHOSEN["kin8nm"]
    argv = ["uci", "--splits", "0", "--out", str(tmp_path)]
    assert main([*argv, "--sets", "kin8nm", "--models", "chosen", chosen, "dgp"]) == 0
    assert fitted == [(chosen, "kin8nm", 0), ("dgp", "kin8nm", 0)]
    assert (tmp_path / f"{chosen}__kin8nm__00.json").is_file()
    assert main([*argv, "--sets", "kin8nm", "yacht", "--models", "chosen"]) == 0
    assert fitted[2:] == [(uci.CHOSEN["yacht"], "yacht", 0)]  # kin8nm's cell was there


def test_uci_without_the_checkout_says_what_to_do(monkeypatch, tmp_path, capsys):
    from pyro_gpn.experiments import uci_benchmark

    monkeypatch.setattr(uci_benchmark, "__file__", str(tmp_path / "a" / "b" / "uci_benchmark.py"))
    assert main(["uci", "--summary"]) == 1
    assert "clone the repository" in capsys.readouterr().err
