"""``benchmarks/uci_seed_spread.py``: the model seed alone moves (the data and the mini-batch
draws stay), rows are resumable, and the summary's mean and spread are the rows'."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from tests.benchmarks.test_uci_capacity import _tiny_data


@pytest.fixture
def tiny_variant(monkeypatch):
    import benchmarks.uci_variants as variants
    import pyro_gpn.data.uci_regression as uci_regression

    monkeypatch.setitem(variants.VARIANTS, "tiny", ({"num_steps": 10}, {}))
    monkeypatch.setattr(uci_regression, "load_uci_regression", lambda *a, **k: _tiny_data())
    return variants


def test_model_seed_offset_moves_the_initialisation_only(tiny_variant, monkeypatch):
    seeds = []
    original = torch.manual_seed
    monkeypatch.setattr(torch, "manual_seed", lambda s: seeds.append(int(s)) or original(s))
    first = tiny_variant.run("tiny", split=2, name="boston")
    again = tiny_variant.run("tiny", split=2, name="boston")
    moved = tiny_variant.run("tiny", split=2, name="boston", model_seed_offset=1000)
    assert first["val_log_lik"] == again["val_log_lik"]  # deterministic
    assert moved["val_log_lik"] != first["val_log_lik"]
    assert moved["model_seed_offset"] == 1000 and "model_seed_offset" not in first
    # the model's seed is the benchmark's (seed + split) plus the offset
    assert 2 in seeds and 1002 in seeds


def test_spread_rows_resume_and_summarise(tiny_variant, tmp_path, capsys):
    from benchmarks import uci_seed_spread

    out = tmp_path / "spread.jsonl"
    args = ["--set", "boston", "--split", "1", "--seeds", "3", "--variants", "tiny"]
    assert uci_seed_spread.main([*args, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["model_seed_offset"] for r in rows] == [0, 1000, 2000]
    vals = [r["val_log_lik"] for r in rows]
    assert len(set(vals)) == 3  # three seeds, three fits
    table = capsys.readouterr().out
    assert f"{statistics.fmean(vals):.3f} ± {statistics.stdev(vals):.3f}" in table
    # finished rows are skipped: a second call fits nothing and prints the same table
    assert uci_seed_spread.main([*args, "--out", str(out), "--seeds", "3"]) == 0
    assert len(out.read_text().splitlines()) == 3
    with pytest.raises(SystemExit):
        uci_seed_spread.main([*args, "--out", str(out), "--seeds", "0"])
