"""The metrics and table of ``benchmarks/bayes_classification.py``."""

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss

from benchmarks.bayes_classification import class_metrics, summary

pytestmark = pytest.mark.usefixtures("fresh_param_store")


def test_class_metrics_match_sklearn():
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(200, 5, generator=gen, dtype=torch.float64).softmax(-1)
    y = torch.randint(0, 5, (200,), generator=gen)
    got = class_metrics(probs, y)
    assert got["nll"] == pytest.approx(log_loss(y.numpy(), probs.numpy(), labels=range(5)))
    assert got["error"] == pytest.approx(np.mean(probs.argmax(1).numpy() != y.numpy()))


def test_class_metrics_of_a_zero_probability_stay_finite_and_reject_bad_shapes():
    got = class_metrics(torch.tensor([[1.0, 0.0]], dtype=torch.float64), torch.tensor([1]))
    assert got["error"] == 1.0 and 600 < got["nll"] < 800  # -log(1e-300), not inf
    with pytest.raises(ValueError, match="probs"):
        class_metrics(torch.ones(3), torch.zeros(3))
    with pytest.raises(ValueError, match="probs"):
        class_metrics(torch.ones(3, 2), torch.zeros(4))


def test_summary_puts_the_bayesian_rows_beside_the_ml_rows(tmp_path):
    runs, paper = tmp_path / "runs", tmp_path / "paper"
    runs.mkdir(), paper.mkdir()
    for seed, err in enumerate((0.10, 0.12)):
        ml = dict(model="gpn-meanvar", init="random", share="none", seed=seed, train_time_s=5.0)
        ml.update(train_error=0.05, val_error=0.08, test_error=err)
        (paper / f"letter__gpn-meanvar__random__none__seed{seed}.json").write_text(json.dumps(ml))
        cell = dict(tag="bgpn", set="letter", seed=seed, cell_cpu_s=3.0, load_avg_1m_end=1.0)
        cell.update(train_error=0.04, val_error=0.07, test_error=err - 0.02, test_nll=0.3 + seed)
        (runs / f"bgpn__letter__seed{seed}.json").write_text(json.dumps(cell))
    table = summary(runs, paper)
    ml_row = next(r for r in table.splitlines() if "ML GPN (gpn-meanvar, random, none)" in r)
    bayes_row = next(r for r in table.splitlines() if "Bayesian GPN (bgpn)" in r)
    assert "0.1100 ± 0.0141" in ml_row and "not recorded" in ml_row
    assert (
        "0.0900 ± 0.0141" in bayes_row and "0.800 ± 0.707" in bayes_row and "| 0,1 |" in bayes_row
    )


def _cell(tag, seed, val_log_lik, batch, steps, run, epochs):
    config = dict(num_steps=steps, batch_size=batch, lr=0.01)
    return dict(
        tag=tag, set="connect4", seed=seed, config=config, best_step=run, num_steps=run,
        epochs=epochs, best_val_log_lik=val_log_lik, val_error=0.17, train_error=0.16,
        test_error=0.5, test_nll=9.0, cell_cpu_s=100.0, load_avg_1m_end=2.0,
    )  # fmt: skip


def test_validation_table_ranks_one_seeds_configurations_and_shows_no_test_figure(tmp_path):
    from benchmarks.bayes_classification import validation_table

    cells = {
        "short__connect4__seed0.json": _cell("short", 0, -0.45, 512, 6000, 6000, 76.0),
        # stopped early at 10,000 of 20,000 steps of 128 rows: 40 epochs run, a budget of 80
        "b128__connect4__seed0.json": _cell("b128", 0, -0.40, 128, 20000, 10000, 40.0),
        "b128__connect4__seed1.json": _cell("b128", 1, -0.10, 128, 20000, 20000, 80.0),
        "ml__connect4__seed0.json": dict(tag="ml", set="connect4", seed=0),
    }
    for name, cell in cells.items():
        (tmp_path / name).write_text(json.dumps(cell))
    rows = validation_table(tmp_path, seed=0).splitlines()[2:]
    assert [r.split(" | ")[1] for r in rows] == ["b128", "short"]  # best first, seed 0 only
    assert "| 20000 (80) |" in rows[0] and "| 10000 / 10000 |" in rows[0]
    assert "| -0.400 | 0.1700 | 0.1600 | 100 (2.0) |" in rows[0]
    assert not any("9.0" in r or "0.5000" in r for r in rows)


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "loose"])
def test_weight_prior_scale_option_rejects_bad_values_naming_the_argument(bad, capsys):
    from benchmarks.bayes_classification import main

    with pytest.raises(SystemExit):
        main(["--weight-prior-scale", bad, "--summary"])
    assert "--weight-prior-scale" in capsys.readouterr().err


def _tiny_data():
    """A 3-class problem of 60 / 20 / 20 rows with 4 features in [0, 1] (``load_dataset``'s
    fields that ``run_cell`` reads)."""
    from types import SimpleNamespace

    gen = torch.Generator().manual_seed(0)
    parts = {}
    for split, n in (("train", 60), ("val", 20), ("test", 20)):
        x = torch.rand(n, 4, generator=gen)
        parts[f"x_{split}"], parts[f"y_{split}"] = x, (x[:, 0] * 3).long().clamp_max(2)
    return SimpleNamespace(num_features=4, num_classes=3, description="tiny", **parts)


def _tiny_data_and_built_models(monkeypatch) -> list:
    """Make the benchmark load :func:`_tiny_data`; return the list that every
    ``VariationalGPN`` it builds is appended to."""
    import pyro_gpn.data
    import pyro_gpn.models

    monkeypatch.setattr(pyro_gpn.data, "load_dataset", lambda *a, **k: _tiny_data())
    built = []
    original = pyro_gpn.models.VariationalGPN

    def spy(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(pyro_gpn.models, "VariationalGPN", spy)
    return built


@pytest.mark.parametrize("scale", ["empirical", "10"])
def test_a_tiny_run_records_the_weight_prior_scale_and_builds_the_layers_with_it(
    scale, tmp_path, monkeypatch
):
    from benchmarks.bayes_classification import main

    built = _tiny_data_and_built_models(monkeypatch)
    argv = ["--sets", "connect4", "--seeds", "0", "--num-steps", "4", "--eval-every", "2"]
    argv += ["--batch-size", "16", "--weight-prior-scale", scale, "--tag", "tiny"]
    assert main([*argv, "--out", str(tmp_path), "--paper-runs", str(tmp_path)]) == 0
    cell = json.loads((tmp_path / "tiny__connect4__seed0.json").read_text())
    expected = "empirical" if scale == "empirical" else 10.0
    assert cell["config"]["weight_prior_scale"] == expected
    # the record names what differs from the library's defaults, not "library defaults"
    assert f"weight_prior_scale={expected}" in cell["model"] and "num_steps=4" in cell["model"]
    assert "lr=" not in cell["model"]  # the default rate is not an override
    assert cell["sizes"] == [4, 30, 15, 3] and cell["num_steps"] == 4
    assert 0.0 <= cell["test_error"] <= 1.0 and np.isfinite(cell["test_nll"])
    (model,) = built
    layers = [m for m in model.modules() if hasattr(m, "weight_prior_scale")]
    assert len(layers) == 2 and {m.weight_prior_scale for m in layers} == {expected}


@pytest.mark.parametrize(
    "argv",
    [
        ["--elbo", "predictive"],  # the default tag names the ELBO
        ["--elbo", "predictive", "--tag", "bgpn-wps10"],
        ["--tag", "bgpn-wps10-pll"],  # a predictive tag on the ELBO
        ["--elbo", "trace", "--tag", "x"],
    ],
)
def test_the_objective_option_rejects_a_tag_that_misnames_it(argv, capsys):
    from benchmarks.bayes_classification import main

    with pytest.raises(SystemExit):
        main([*argv, "--sets", "adult", "--seeds", "0"])
    assert "--elbo" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "elbo"), [([], "closed_form"), (["--elbo", "predictive"], "predictive")]
)
def test_a_tiny_run_trains_on_the_objective_it_records(argv, elbo, tmp_path, monkeypatch):
    import pyro_gpn.data
    import pyro_gpn.inference
    from benchmarks.bayes_classification import main

    monkeypatch.setattr(pyro_gpn.data, "load_dataset", lambda *a, **k: _tiny_data())
    seen = []
    original = pyro_gpn.inference.fit_vgpn

    def spy(*args, **kwargs):
        seen.append(kwargs["elbo"])
        return original(*args, **kwargs)

    monkeypatch.setattr(pyro_gpn.inference, "fit_vgpn", spy)
    tag = "tiny-pll" if elbo == "predictive" else "tiny"
    argv = [*argv, "--sets", "adult", "--seeds", "0", "--num-steps", "2", "--eval-every", "2"]
    argv += ["--batch-size", "16", "--tag", tag, "--out", str(tmp_path)]
    assert main([*argv, "--paper-runs", str(tmp_path)]) == 0
    cell = json.loads((tmp_path / f"{tag}__adult__seed0.json").read_text())
    assert seen == [elbo] and cell["config"]["elbo"] == elbo
    assert np.isfinite(cell["test_nll"]) and np.isfinite(cell["best_val_log_lik"])


def test_paired_table_pairs_each_tag_with_the_ml_reruns_seed_by_seed(tmp_path):
    from benchmarks.bayes_classification import paired_table

    def write(tag, seed, err, nll):
        cell = dict(tag=tag, set="adult", seed=seed, test_error=err, test_nll=nll)
        if tag == "ml":
            cell = dict(cell, test_error=0.9, test_error_probs=err)  # the probs' argmax counts
        (tmp_path / f"{tag}__adult__seed{seed}.json").write_text(json.dumps(cell))

    write("ml", 0, 0.15, 0.32), write("ml", 1, 0.15, 0.30)
    write("b", 0, 0.14, 0.31), write("b", 1, 0.16, 0.30), write("b", 2, 0.10, 0.10)  # no ML 2
    rows = paired_table(tmp_path, ["b"]).splitlines()[2:]
    assert len(rows) == 3 and rows[0].startswith("| adult | b | 0 | 0.1400 / 0.1500 |")
    assert "| -0.0100 | -0.0100 |" in rows[0] and "| +0.0100 | +0.0000 |" in rows[1]
    assert "| 2 paired | lower on 1 of 2 | lower on 1 of 2 | +0.0000 ± 0.0141 |" in rows[2]


def test_ml_rows_cover_every_set_and_mnist_is_the_reduced_experiments_row():
    """``--ml`` reruns a row for every set, and the reduced MNIST's is the GPN row that
    ``benchmarks/mnist_reduced.py`` trains (mean + variance, random targets, nothing shared)."""
    from benchmarks.bayes_classification import ML_ROW, SETS
    from benchmarks.mnist_reduced import MODELS

    assert set(ML_ROW) == set(SETS)
    model, init, share = ML_ROW["mnist-test-only"]
    flags = MODELS[model]
    assert flags[flags.index("--mode") + 1] == "meanvar"
    assert flags[flags.index("--init") + 1] == init and share == "none"
    assert "--share" not in flags


@pytest.mark.filterwarnings("ignore:fit_predictive_scale")  # 6 steps: a near-uniform model
def test_a_calibrated_run_records_the_temperature_and_the_uncalibrated_test_metrics(
    tmp_path, monkeypatch
):
    """``--calibrate``: the cell's test metrics are at the temperature fitted on all validation
    rows (which the head keeps), the uncalibrated ones are kept beside, and the cross-fitted
    validation NLL is recorded; a tag without ``-cal`` is refused."""
    from benchmarks.bayes_classification import main

    built = _tiny_data_and_built_models(monkeypatch)
    argv = ["--sets", "adult", "--seeds", "0", "--num-steps", "6", "--eval-every", "2"]
    argv += ["--batch-size", "16", "--out", str(tmp_path), "--paper-runs", str(tmp_path)]
    with pytest.raises(SystemExit):
        main([*argv, "--calibrate", "--tag", "tiny"])
    assert main([*argv, "--calibrate", "--tag", "tiny-cal"]) == 0
    cell = json.loads((tmp_path / "tiny-cal__adult__seed0.json").read_text())
    (model,) = built
    assert cell["config"]["calibrate"] is True
    assert cell["temperature"] == pytest.approx(float(model.head.predictive_scale), rel=1e-12)
    assert cell["temperature"] != 1.0
    data = _tiny_data()
    with torch.no_grad():
        probs = model.predict(data.x_test).probs
    assert cell["test_nll"] == pytest.approx(class_metrics(probs, data.y_test)["nll"], rel=1e-9)
    model.head.predictive_scale.fill_(1.0)
    with torch.no_grad():
        raw = class_metrics(model.predict(data.x_test).probs, data.y_test)
    assert cell["test_nll_uncalibrated"] == pytest.approx(raw["nll"], rel=1e-9)
    assert cell["test_error_uncalibrated"] == pytest.approx(raw["error"])
    crossfit = cell["val_crossfit"]
    assert np.isfinite(crossfit["nll_uncalibrated"]) and np.isfinite(crossfit["nll_calibrated"])
