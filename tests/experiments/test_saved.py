"""``pyro_gpn.load_run``: a ``pyro-gpn train`` folder read back, verified (issue 14)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import pyro_gpn
from pyro_gpn import io as pio
from pyro_gpn.experiments.cli import main
from pyro_gpn.experiments.runs import split_metrics
from pyro_gpn.experiments.saved import load_run

TRAIN = ["train", "yacht", "--max-epochs", "2", "--sizes", "4", "--quiet"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> object:
    """A finished 2-epoch yacht run (shared; tests copy it before damaging it)."""
    out = tmp_path_factory.mktemp("saved") / "run"
    assert main([*TRAIN, "--out", str(out)]) == 0
    return out


@pytest.fixture
def run_dir(trained, tmp_path):
    import shutil

    target = tmp_path / "run"
    shutil.copytree(trained, target)
    return target


def test_load_run_predicts_what_evaluate_reports(run_dir, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    run = pyro_gpn.load_run(run_dir)
    assert run.verified and not run.model.training
    assert run.settings["dataset"] == "yacht" and run.settings["sizes"] == [4]
    data = run.data()
    assert split_metrics(run.model, data, "test") == evaluated  # exactly the same numbers
    recorded = json.loads((run_dir / "result.json").read_text())
    assert recorded["format"] == 2
    assert evaluated == pytest.approx(recorded["metrics"]["test"], rel=1e-6)
    # and the weights are the saved ones, bit for bit
    state = torch.load(run_dir / "model.pt", weights_only=True)
    assert all(torch.equal(state[k], v) for k, v in run.model.state_dict().items())


def test_core_import_does_not_import_the_orchestration():
    code = (
        "import sys, pyro_gpn; assert 'pyro_gpn.experiments' not in sys.modules; "
        "f = pyro_gpn.load_run; assert 'pyro_gpn.experiments' in sys.modules; "
        "assert 'load_run' in pyro_gpn.__all__; print(f.__module__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pyro_gpn.experiments.saved"
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = pyro_gpn.no_such_name


def _flip_last_bytes(path, count=16):
    data = bytearray(path.read_bytes())
    for i in range(1, count + 1):
        data[-i - 30] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, name",
    [
        (lambda d: _flip_last_bytes(d / "model.pt"), "model.pt"),
        (lambda d: (d / "model.pt").write_bytes((d / "model.pt").read_bytes()[:100]), "model.pt"),
        (lambda d: (d / "model.pt").write_bytes(b""), "model.pt"),
        (lambda d: (d / "result.json").write_text('{"settings": {"da'), "result.json"),
        (lambda d: (d / "model.pt").unlink(), "model.pt"),
        (lambda d: (d / "model.pt.sha256").unlink(), "model.pt"),
        (lambda d: (d / "result.json.sha256").unlink(), "result.json"),
    ],
    ids=["flipped", "truncated", "empty", "truncated-result", "missing", "no-sum", "no-sum-json"],
)
def test_damaged_files_raise_corrupt_file_error_naming_the_file(run_dir, damage, name):
    damage(run_dir)
    with pytest.raises(pio.CorruptFileError, match=name.replace(".", r"\.")):
        load_run(run_dir)


def _rewrite_record(run_dir, edit):
    """Edit ``result.json`` and re-record its checksum (a deliberate, consistent edit)."""
    record = pio.load_json(run_dir / "result.json")
    edit(record)
    pio.save_json(record, run_dir / "result.json")


def test_weights_that_do_not_fit_the_recorded_network(run_dir):
    _rewrite_record(run_dir, lambda r: r["settings"].update(sizes=[5]))
    with pytest.raises(pio.CorruptFileError, match="model.pt.*result.json") as info:
        load_run(run_dir)
    assert "same run" in str(info.value)


def test_record_without_settings(run_dir):
    _rewrite_record(run_dir, lambda r: r.pop("settings"))
    with pytest.raises(pio.CorruptFileError, match="result.json.*no settings"):
        load_run(run_dir)


def test_settings_that_describe_no_network(run_dir):
    _rewrite_record(run_dir, lambda r: r["settings"].update(model="relu"))
    with pytest.raises(pio.CorruptFileError, match="result.json.*relu"):
        load_run(run_dir)


def test_missing_or_file_folder(tmp_path):
    with pytest.raises(pio.MissingFileError, match="nowhere"):
        load_run(tmp_path / "nowhere")
    (tmp_path / "f").write_text("x")
    with pytest.raises(pio.CorruptFileError, match="not a directory"):
        load_run(tmp_path / "f")


def _make_legacy(run_dir):
    """What `pyro-gpn train` wrote before format 2: no checksums, no format, no data_shape."""
    record = json.loads((run_dir / "result.json").read_text())
    for key in ("format", "data_shape", "data_dir"):
        record.pop(key)
    (run_dir / "result.json").write_text(json.dumps(record))
    for side in run_dir.glob("*.sha256"):
        side.unlink()


def test_legacy_folder_loads_unverified_with_a_warning(run_dir, capsys):
    _make_legacy(run_dir)
    run = load_run(run_dir)
    assert not run.verified and run.settings["sizes"] == [4]
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--json"]) == 0
    captured = capsys.readouterr()
    warning = [line for line in captured.err.splitlines() if line.strip()]
    assert len(warning) == 1 and "not verified" in warning[0]
    assert json.loads(captured.out) == split_metrics(run.model, run.data(), "test")


def test_format_2_without_its_checksum_is_refused(run_dir):
    (run_dir / "result.json.sha256").unlink()
    (run_dir / "model.pt.sha256").unlink()
    with pytest.raises(pio.MissingFileError, match=r"result\.json.*checksum"):
        load_run(run_dir)


def test_legacy_folder_with_a_checksummed_model_still_verifies_it(run_dir):
    _make_legacy(run_dir)
    pio.save_torch(torch.load(run_dir / "model.pt", weights_only=True), run_dir / "model.pt")
    _flip_last_bytes(run_dir / "model.pt")
    with pytest.raises(pio.CorruptFileError, match=r"model\.pt.*checksum"):
        load_run(run_dir)
