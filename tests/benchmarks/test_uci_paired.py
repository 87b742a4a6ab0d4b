"""The paired UCI comparison: common splits only, differences and wins per split."""

import json

from benchmarks.uci_paired import paired_table


def _cell(runs, model, name, split, log_lik, coverage=0.9):
    test = {"log_lik": log_lik, "coverage90": coverage, "rmse": 1.0}
    path = runs / f"{model}__{name}__{split:02d}.json"
    path.write_text(json.dumps({"model": model, "set": name, "split": split, "test": test}))


def test_paired_table_uses_common_splits_and_the_substitute(tmp_path):
    for split, (a, b) in enumerate([(-2.0, -2.5), (-3.0, -2.0), (-1.0, -1.5)]):
        _cell(tmp_path, "bgpn", "boston", split, a)
        if split < 2:  # the third split has no "other" cell: left out of the pairs
            _cell(tmp_path, "other", "boston", split, b, coverage=0.8)
    _cell(tmp_path, "bgpn", "naval", 0, 3.0)  # replaced by its long schedule there
    _cell(tmp_path, "bgpn_long", "naval", 0, 5.0)
    _cell(tmp_path, "other", "naval", 0, 4.0)
    table = paired_table(tmp_path, ["bgpn", "other"], {"naval": "bgpn_long"})
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    # boston: splits 0, 1; bgpn -2.5 ± 0.5, other -2.25 ± 0.25, differences 0.5 and -1.0
    assert rows["boston"].split(" | ")[1:6] == [
        "2", "-2.50 ± 0.50", "-2.25 ± 0.25", "-0.25 ± 0.75 (1/2)", "0.90"
    ]  # fmt: skip
    assert rows["naval"].split(" | ")[1:5] == ["1", "5.00", "4.00", "1.00 (1/1)"]
    assert "energy" not in rows


def test_chosen_flag_substitutes_every_sets_chosen_column(tmp_path, capsys):
    """``--chosen``: the first model is each set's column of ``benchmarks.uci.CHOSEN``;
    ``--long`` still overrides a set."""
    from benchmarks.uci import CHOSEN
    from benchmarks.uci_paired import main

    _cell(tmp_path, CHOSEN["boston"], "boston", 0, -2.0)
    _cell(tmp_path, CHOSEN["wine"], "wine", 0, -0.5)
    _cell(tmp_path, "other_wine", "wine", 0, -0.7)
    for name in ("boston", "wine"):
        _cell(tmp_path, "dgp", name, 0, -1.0)
    main(["--models", "chosen", "dgp", "--chosen", "--runs", str(tmp_path)])
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()}
    assert rows["boston"].split(" | ")[2:5] == ["-2.00", "-1.00", "-1.00 (0/1)"]
    assert rows["wine"].split(" | ")[2] == "-0.50"
    main(
        [
            "--models",
            "chosen",
            "dgp",
            "--chosen",
            "--long",
            "wine=other_wine",
            "--runs",
            str(tmp_path),
        ]
    )
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()}
    assert rows["wine"].split(" | ")[2] == "-0.70"


def test_aggregate_writes_strict_json(tmp_path):
    """``uci.json``'s aggregate: a statistic no cell records (the deep GP's ``noise_std``) is
    ``null``, never ``NaN`` (not JSON)."""
    import json

    from benchmarks.uci import aggregate

    metrics = {"log_lik": -1.0, "rmse": 1.0, "coverage90": 0.9}
    for split in (0, 1):
        cell = {"model": "dgp", "set": "boston", "split": split, "test": metrics}
        (tmp_path / f"dgp__boston__{split:02d}.json").write_text(json.dumps(cell))
    result = aggregate(tmp_path)
    entry = result["benchmark_test"]["dgp"]["boston"]
    assert entry["noise_std"] is None and entry["log_lik"]["n"] == 2
    json.dumps(result, allow_nan=False)


def test_chosen_deep_gp_column_and_no_naval_substitute_for_other_first_models(tmp_path, capsys):
    """``dgp_chosen`` reads each set's chosen deep GP column (``DGP_CHOSEN``: the t on wine), and
    naval's ``bgpn_long`` stands in only for a first model ``bgpn``."""
    from benchmarks.uci import DGP_CHOSEN
    from benchmarks.uci_paired import main

    assert DGP_CHOSEN["wine"] == "dgp_t4"
    _cell(tmp_path, "a", "wine", 0, -1.0)
    _cell(tmp_path, "dgp", "wine", 0, -5.0)
    _cell(tmp_path, "dgp_t4", "wine", 0, -2.0)
    row = paired_table(tmp_path, ["a", "dgp_chosen"], {}, columns={"dgp_chosen": DGP_CHOSEN})
    assert row.splitlines()[2].split(" | ")[1:5] == ["1", "-1.00", "-2.00", "1.00 (1/1)"]
    _cell(tmp_path, "x", "naval", 0, 1.0)
    _cell(tmp_path, "bgpn_long", "naval", 0, 9.0)
    _cell(tmp_path, "y", "naval", 0, 0.0)
    main(["--models", "x", "y", "--runs", str(tmp_path)])
    naval = [line for line in capsys.readouterr().out.splitlines() if "naval" in line]
    assert naval[0].split(" | ")[2:4] == ["1.00", "0.00"]


def test_validation_rows_are_read_with_rows_val(tmp_path):
    """``rows="val"`` compares the validation rows (where choices are made), not the test rows."""
    for split, (val_a, val_b) in enumerate([(-1.0, -2.0), (-1.5, -1.0)]):
        for model, val in (("a", val_a), ("b", val_b)):
            test = {"log_lik": 0.0, "coverage90": 0.9, "rmse": 1.0}
            valm = {"log_lik": val, "coverage90": 0.8, "rmse": 1.0}
            cell = {"model": model, "set": "wine", "split": split, "test": test, "val": valm}
            (tmp_path / f"{model}__wine__{split:02d}.json").write_text(json.dumps(cell))
    row = paired_table(tmp_path, ["a", "b"], {}, rows="val").splitlines()[2].split(" | ")
    assert row[1:6] == ["2", "-1.25 ± 0.25", "-1.50 ± 0.50", "0.25 ± 0.75 (1/2)", "0.80"]
    test_row = paired_table(tmp_path, ["a", "b"], {}).splitlines()[2].split(" | ")
    assert test_row[4] == "0.00 ± 0.00 (0/2)"


def test_choices_table_counts_each_candidates_wins_and_the_calibrations(tmp_path, capsys):
    from benchmarks.uci_paired import main

    for split, (chosen, calibrated) in enumerate([("a", True), ("b", False), ("a", False)]):
        path = tmp_path / f"bgpn_auto__wine__{split:02d}.json"
        cell = {"chosen": chosen, "calibrated": calibrated, "cell_cpu_s": 10.0 * (split + 1)}
        path.write_text(json.dumps(cell))
    main(["--runs", str(tmp_path), "--choices", "bgpn_auto"])
    rows = capsys.readouterr().out.splitlines()
    assert rows[2] == "| wine | 3 | a 2, b 1 | 1 | 20 |" and len(rows) == 3


def test_a_later_chosen_model_is_each_sets_chosen_column(tmp_path, capsys):
    from benchmarks.uci import CHOSEN
    from benchmarks.uci_paired import main

    _cell(tmp_path, "bgpn_auto", "wine", 0, -0.6)
    _cell(tmp_path, CHOSEN["wine"], "wine", 0, -0.5)
    main(["--runs", str(tmp_path), "--models", "bgpn_auto", "chosen"])
    row = capsys.readouterr().out.splitlines()[2]
    assert row.split(" | ")[1:5] == ["1", "-0.60", "-0.50", "-0.10 (0/1)"]


def _stack_cell(split: int) -> dict:
    """Three candidates on 4 validation and 3 test rows, written out so that each rule's
    choice and metrics can be worked by hand: ``a`` is the portfolio's first, ``c`` has the
    highest validation mean but only by noise (within one standard error of ``a``)."""
    import math

    log = math.log
    rows = {
        "a": {"val": [-1.0, -1.0, -1.0, -1.0], "test": [-1.0, -1.0, -1.0], "cdf": [0.5, 0.9, 0.99]},
        "b": {"val": [-3.0, -3.0, -3.0, -3.0], "test": [-2.0, -2.0, -2.0], "cdf": [0.5, 0.5, 0.5]},
        "c": {
            "val": [0.0, -2.0, 0.0, -0.5],
            "test": [log(0.5), -3.0, -3.0],
            "cdf": [0.01, 0.02, 0.97],
        },
    }
    return {
        "split": split,
        "test": {"log_lik": 0.0, "coverage90": 1.0, "rmse": 1.0},
        "combine_crossfit_std": [-1.0, -0.5],
        "weights": {"a": 0.5, "c": 0.5},
        "calibrated": False,
        "candidate_rows": {
            n: {"val_log_density": r["val"], "test_log_density": r["test"], "test_cdf": r["cdf"]}
            for n, r in rows.items()
        },
    }


def test_rules_rebuild_each_choice_and_mixture_from_the_recorded_rows():
    import math

    import pytest

    from benchmarks.uci_paired import _rule_weights, rule_metrics

    cell = _stack_cell(0)
    # best: c (mean -0.625 against a's -1.0); one_se: a (c - a = 1, -1, 1, 0.5: mean 0.375,
    # standard error 0.473), the first within one standard error of the best
    assert _rule_weights(cell, "best") == {"c": 1.0}
    assert _rule_weights(cell, "one_se") == {"a": 1.0}
    assert _rule_weights(cell, "auto") == _rule_weights(cell, "stack")  # stacked -0.5 > -1.0
    best = rule_metrics(cell, "best", log_y_std=0.5)
    assert best["log_lik"] == pytest.approx((math.log(0.5) - 6.0) / 3 - 0.5)
    assert best["coverage90"] == pytest.approx(0.0)  # cdf 0.01, 0.02, 0.97: all outside
    equal = rule_metrics(cell, "equal", log_y_std=0.0)
    expected = [
        math.log((math.exp(-1.0) + math.exp(-2.0) + math.exp(t)) / 3)
        for t in (math.log(0.5), -3.0, -3.0)
    ]
    assert equal["log_lik"] == pytest.approx(sum(expected) / 3)
    # mixture cdfs: (0.5 + 0.5 + 0.01) / 3, (0.9 + 0.5 + 0.02) / 3, (0.99 + 0.5 + 0.97) / 3
    assert equal["coverage90"] == pytest.approx(1.0)
    stack = _rule_weights(cell, "stack")
    assert "b" not in stack and set(stack) == {"a", "c"}  # b is worse than a on every row
    assert sum(stack.values()) == pytest.approx(1.0)


def test_rules_table_reads_every_cell_of_a_set(tmp_path, capsys):
    from benchmarks.uci_paired import rules_table

    for split in range(2):
        (tmp_path / f"bgpn_stack__wine__{split:02d}.json").write_text(
            json.dumps(_stack_cell(split))
        )
    table = rules_table(tmp_path, log_y_std=lambda name, split: 0.0).splitlines()
    assert len(table) == 3
    row = table[2].split(" | ")
    assert row[0] == "| wine" and row[1] == "2"
    assert row[7] == "0.00 ± 0.00"  # the cell's own test log-likelihood
    assert row[-2:] == ["-1.000", "-0.500 |"]


def test_one_se_passes_over_a_first_candidate_outside_one_standard_error_and_stack_mixes():
    """``a`` is behind the best (``c``) by more than one paired standard error, ``b`` within
    it: the rule keeps ``b``. The stacked rule's metrics are its weights' mixture by hand."""
    import math

    import pytest

    from benchmarks.uci_paired import _rule_weights, rule_metrics

    cell = _stack_cell(0)
    rows = cell["candidate_rows"]
    rows["a"]["val_log_density"] = [-3.0, -3.0, -3.0, -3.0]  # c - a: 3, 1, 3, 2.5
    rows["b"]["val_log_density"] = [-0.5, -1.0, -0.5, -1.0]  # c - b: 0.5, -1, 0.5, 0.5
    assert _rule_weights(cell, "one_se") == {"b": 1.0}
    weights = _rule_weights(cell, "stack")
    got = rule_metrics(cell, "stack", log_y_std=0.25)
    dens = {n: rows[n]["test_log_density"] for n in weights}
    expected = [
        math.log(sum(w * math.exp(dens[n][i]) for n, w in weights.items())) for i in range(3)
    ]
    assert got["log_lik"] == pytest.approx(sum(expected) / 3 - 0.25, abs=1e-12)
    cdf = [sum(w * rows[n]["test_cdf"][i] for n, w in weights.items()) for i in range(3)]
    assert got["coverage90"] == pytest.approx(sum(0.05 <= c <= 0.95 for c in cdf) / 3)


def test_library_metrics_rebuild_a_mixture_that_an_earlier_rule_calibrated():
    """Section 29's ``calibrate="auto"`` left a stacked mixture unscaled: a cell whose mixture
    was calibrated by the earlier rule is rebuilt by the ``stack`` rule; a cell that kept one
    network, or calibrated nothing, is read as it is."""
    import pytest

    from benchmarks.uci_paired import _rule_weights, library_metrics, rule_metrics

    def no_data():
        raise AssertionError("the target scale is loaded only for a rebuild")

    cell = _stack_cell(0)
    assert library_metrics(cell, no_data) is cell["test"]  # not calibrated
    cell["calibrated"] = True
    cell["weights"] = dict.fromkeys(_rule_weights(cell, "stack"), 0.5)
    rebuilt = library_metrics(cell, lambda: 0.3)
    assert rebuilt == {**rule_metrics(cell, "stack", 0.3), "rmse": cell["test"]["rmse"]}
    cell["weights"] = {"a": 0.2, "b": 0.8}  # networks today's stacking would not keep
    with pytest.raises(SystemExit, match="cannot be rebuilt"):
        library_metrics(cell, lambda: 0.3)
    cell["weights"] = {"c": 1.0}  # one network, calibrated as the library still does
    assert library_metrics(cell, no_data) is cell["test"]


def test_the_library_pseudo_column_reads_the_stacked_cells(tmp_path, monkeypatch):
    """``bgpn_stack_library`` in a paired table is :func:`library_metrics` of each
    ``bgpn_stack`` cell (here one whose mixture an earlier rule calibrated: rebuilt)."""
    import pytest

    from benchmarks import uci_paired
    from benchmarks.uci_paired import LIBRARY, paired_table, rule_metrics

    monkeypatch.setattr(uci_paired, "_log_y_std", lambda name, split: 0.0)
    cell = {**_stack_cell(0), "calibrated": True}
    (tmp_path / "bgpn_stack__wine__00.json").write_text(json.dumps(cell))
    _cell(tmp_path, "other", "wine", 0, -1.0)
    row = paired_table(tmp_path, [LIBRARY, "other"], {}).splitlines()[2].split(" | ")
    expected = rule_metrics(cell, "stack", 0.0)["log_lik"]
    assert float(row[2]) == pytest.approx(expected, abs=0.005)
    with pytest.raises(SystemExit, match="test metrics only"):
        paired_table(tmp_path, [LIBRARY, "other"], {}, rows="val")


def test_a_rule_pseudo_column_reads_the_rule_on_the_cells(tmp_path, monkeypatch):
    import pytest

    from benchmarks import uci_paired
    from benchmarks.uci_paired import paired_table, rule_metrics

    monkeypatch.setattr(uci_paired, "_log_y_std", lambda name, split: 0.0)
    (tmp_path / "bgpn_stack__wine__00.json").write_text(json.dumps(_stack_cell(0)))
    row = paired_table(tmp_path, ["bgpn_stack:best", "bgpn_stack:equal"], {}).splitlines()[2]
    values = row.split(" | ")
    assert float(values[2]) == pytest.approx(
        rule_metrics(_stack_cell(0), "best", 0.0)["log_lik"], abs=0.005
    )
    assert float(values[3]) == pytest.approx(
        rule_metrics(_stack_cell(0), "equal", 0.0)["log_lik"], abs=0.005
    )
    with pytest.raises(SystemExit, match="the rule must be one of"):
        paired_table(tmp_path, ["bgpn_stack:median", "bgpn_stack:best"], {})
