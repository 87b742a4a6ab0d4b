"""The five-network comparison of ``benchmarks/uci_ensemble.py`` and ``uci_paired --ensembles``:
paired differences within each cell, the adoption rule, the reproduction check."""

import json

from benchmarks.uci_ensemble import ensemble_table


def _metrics(log_lik: float, coverage: float = 0.9) -> dict:
    return {"log_lik": log_lik, "rmse": 1.0, "coverage90": coverage}


def _cell(runs, model, name, split, test, val, single_test, single_val):
    cell = {
        "model": model,
        "set": name,
        "split": split,
        "test": _metrics(test),
        "val": _metrics(val),
        "single": {"test": _metrics(single_test), "val": _metrics(single_val)},
    }
    (runs / f"{model}__{name}__{split:02d}.json").write_text(json.dumps(cell))


def test_table_pairs_each_cell_with_its_member_zero_and_applies_the_rule(tmp_path):
    # boston: validation gains +0.1, +0.3 (mean 0.2 > s.e. 0.1): adopted; test gains +0.2, -0.1
    _cell(tmp_path, "bgpn_ens5", "boston", 0, -2.3, -2.4, -2.5, -2.5)
    _cell(tmp_path, "bgpn_ens5", "boston", 1, -2.6, -2.2, -2.5, -2.5)
    # wine: gains +0.1, -0.3 (mean below zero): not adopted
    _cell(tmp_path, "bgpn_ens5", "wine", 0, -0.9, -0.8, -1.0, -0.9)
    _cell(tmp_path, "bgpn_ens5", "wine", 1, -0.9, -1.2, -1.0, -0.9)
    recorded = {"model": "bgpn", "set": "boston", "split": 0, "test": _metrics(-2.5 + 1e-3)}
    (tmp_path / "bgpn__boston__00.json").write_text(json.dumps(recorded))
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in
            ensemble_table(tmp_path).splitlines()[2:]}  # fmt: skip
    assert rows["boston"][3:6] == ["+0.200 ± 0.100 (2/2)", "yes", "+0.050 ± 0.150 (1/2)"]
    assert rows["boston"][6] == "-2.500 → -2.450"
    assert rows["boston"][8].startswith("1.0e-03 (1)")
    assert rows["wine"][4] == "no"


def test_ensembles_flag_puts_the_adopted_mixture_first(tmp_path, capsys):
    from benchmarks.uci import CHOSEN, ENSEMBLES
    from benchmarks.uci_paired import main

    for model, value in ((ENSEMBLES["wine"], -0.7), (CHOSEN["wine"], -0.9), ("dgp", -1.0)):
        cell = {"model": model, "set": "wine", "split": 0, "test": _metrics(value)}
        (tmp_path / f"{model}__wine__00.json").write_text(json.dumps(cell))
    main(["--models", "chosen", "dgp", "--chosen", "--ensembles", "--runs", str(tmp_path)])
    wine = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| wine"))
    assert wine.split(" | ")[2:5] == ["-0.70", "-1.00", "0.30 (1/1)"]
