"""The five-network comparison of ``benchmarks/uci_ensemble.py`` and ``uci_paired --ensembles``:
paired differences within each cell, the adoption rule, the reproduction check."""

import json

import pytest

from benchmarks.uci_ensemble import calibration_table, ensemble_table


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


def _mixcal_cell(runs, name, split, scale, val_raw, val_cal, test_raw, test_cal):
    cell = {
        "model": "bgpn_ens5_mixcal",
        "set": name,
        "split": split,
        "test": _metrics(test_cal, 0.9),
        "val": _metrics(val_cal + 0.01),  # in-sample: optimistic, never read
        "single": {"test": _metrics(test_raw - 0.1), "val": _metrics(val_raw - 0.05)},
        "mixture_calibration": {
            "scale": [scale],
            "val_crossfit": {"log_lik_uncalibrated": val_raw, "log_lik_calibrated": val_cal},
            "test_uncalibrated": _metrics(test_raw, 0.95),
        },
    }
    (runs / f"bgpn_ens5_mixcal__{name}__{split:02d}.json").write_text(json.dumps(cell))


def test_calibration_table_reads_the_crossfitted_gain_and_checks_the_recorded_mixture(tmp_path):
    # kin8nm: cross-fitted gains +0.02, +0.04 (mean 0.03 > s.e. 0.01): adopted
    _mixcal_cell(tmp_path, "kin8nm", 0, 0.8, 1.20, 1.22, 1.25, 1.27)
    _mixcal_cell(tmp_path, "kin8nm", 1, 0.9, 1.10, 1.14, 1.15, 1.16)
    # boston: gains -0.05, +0.01: not adopted
    _mixcal_cell(tmp_path, "boston", 0, 0.9, -2.30, -2.35, -2.4, -2.5)
    _mixcal_cell(tmp_path, "boston", 1, 1.1, -2.30, -2.29, -2.4, -2.3)
    recorded = {"set": "kin8nm", "split": 1, "test": _metrics(1.15 + 2e-3)}
    (tmp_path / "bgpn_ens5__kin8nm__01.json").write_text(json.dumps(recorded))
    # the uncalibrated table: a plain ens5 column wins over a calibrated one; a set run only
    # calibrated enters with its mixture at scale 1 against member 0
    _cell(tmp_path, "bgpn_ens5", "boston", 0, -2.3, -2.4, -2.5, -2.5)
    _cell(tmp_path, "bgpn_ens5", "boston", 1, -2.6, -2.2, -2.5, -2.5)
    table = ensemble_table(tmp_path)
    assert "`bgpn_ens5_mixcal` |" not in [r for r in table.splitlines() if "boston" in r][0]
    kin8nm = next(r.split(" | ") for r in table.splitlines() if r.startswith("| kin8nm"))
    assert kin8nm[1] == "`bgpn_ens5_mixcal`"
    assert kin8nm[3:7] == ["+0.050 ± 0.000 (2/2)", "yes", "+0.100 ± 0.000 (2/2)", "1.100 → 1.200"]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in
            calibration_table(tmp_path).splitlines()[2:]}  # fmt: skip
    assert rows["kin8nm"][3:6] == ["0.85 (0.80–0.90)", "+0.030 ± 0.010 (2/2)", "yes"]
    assert rows["kin8nm"][6:9] == ["0.950 → 0.900", "1.200 → 1.215", "+0.015 ± 0.005 (2/2)"]
    assert rows["kin8nm"][9].startswith("2.0e-03 (1)")
    assert rows["boston"][5] == "no"
    # a calibrated column enters beside another column's plain cells (kin8nm, section 22: the
    # new chosen column run only calibrated, the previous one plain): both rows
    _cell(tmp_path, "bgpn_old_ens5", "kin8nm", 0, 1.0, 1.0, 1.0, 1.0)
    _cell(tmp_path, "bgpn_old_ens5", "kin8nm", 1, 1.0, 1.0, 1.0, 1.0)
    table = ensemble_table(tmp_path)
    columns = [r.split(" | ")[1] for r in table.splitlines() if r.startswith("| kin8nm")]
    assert columns == ["`bgpn_ens5_mixcal`", "`bgpn_old_ens5`"]


def test_mixcal_column_fits_a_mixture_and_needs_ens5():
    from benchmarks.uci import MODELS, bgpn_config, fit_bgpn

    config = bgpn_config("bgpn_wide_point_long_cal_ens5_mixcal_pll", "kin8nm")
    assert config["members"] == 5 and config["mixture_calibrate"] and config["calibrate"]
    assert config["elbo"] == "predictive"
    assert all(f"{m}_ens5_mixcal" in MODELS for m in ("bgpn_long", "bgpn_het_qw2"))
    with pytest.raises(ValueError, match="use it with ens5"):
        fit_bgpn(None, {**bgpn_config("bgpn_long", "boston"), "mixture_calibrate": True}, 0)


def test_mixcal_cell_end_to_end_records_the_scale_and_the_unscaled_mixture():
    """Two tiny members on synthetic rows: the cell's test metrics are the scaled mixture's,
    its ``test_uncalibrated`` the mixture at scale 1, and the scale the validation fit's."""
    from types import SimpleNamespace

    import torch

    from benchmarks.uci import _score, bgpn_config, fit_bgpn
    from pyro_gpn.inference import fit_predictive_scale

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(160, 3, generator=gen)
    y = torch.sin(x[:, :1]) + 0.1 * torch.randn(160, 1, generator=gen)
    data = SimpleNamespace(
        name="boston", num_features=3, y_std=torch.tensor(2.0),
        x_train=x[:100], y_train=y[:100], x_val=x[100:130], y_val=y[100:130],
        x_test=x[130:], y_test=y[130:],
    )  # fmt: skip
    config = {
        **bgpn_config("bgpn_long_ens5_mixcal", "boston"),
        "members": 2,
        "set_steps": 10,
        "eval_every": 5,
    }
    fit = fit_bgpn(data, config, seed=0)
    facts, ensemble = fit["mixture_calibration"], fit["net"]
    assert facts["scale"] == ensemble.predictive_scale.tolist()
    assert _score(fit["predict"], data.x_test, data.y_test, 2.0)["log_lik"] != pytest.approx(
        facts["test_uncalibrated"]["log_lik"], abs=1e-9
    )
    refit = fit_predictive_scale(ensemble, data.x_val, data.y_val, set_scale=False)
    assert refit.tolist() == pytest.approx(facts["scale"], rel=1e-5)
    ensemble.predictive_scale.fill_(1.0)
    unscaled = _score(fit["predict"], data.x_test, data.y_test, 2.0)
    assert unscaled["log_lik"] == pytest.approx(facts["test_uncalibrated"]["log_lik"], abs=1e-9)
    assert set(facts["val_crossfit"]) == {"log_lik_uncalibrated", "log_lik_calibrated"}
