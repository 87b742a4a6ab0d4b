"""``benchmarks/heldout.py``: the held-out splits, the resumable driver and its summary."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("sklearn")

from benchmarks import heldout  # noqa: E402


def test_splits_partition_the_rows_and_differ():
    tests = []
    for split in range(heldout.NUM_SPLITS):
        train, test = heldout.split_rows(442, split)
        assert len(test) == 44 and len(train) == 398
        assert np.array_equal(np.union1d(train, test), np.arange(442))
        assert np.intersect1d(train, test).size == 0
        again = heldout.split_rows(442, split)
        assert np.array_equal(again[0], train) and np.array_equal(again[1], test)
        tests.append(frozenset(test.tolist()))
    assert len(set(tests)) == heldout.NUM_SPLITS


def test_load_heldout_standardises_with_the_training_rows():
    from sklearn.datasets import load_diabetes

    data = heldout.load_heldout("diabetes", 3)
    x, y = load_diabetes(scaled=False, return_X_y=True)
    train, test = heldout.split_rows(len(y), 3)
    assert data.x_test.shape == (44, 10) and data.x_train.shape[0] + data.x_val.shape[0] == 398
    # training statistics (training and validation rows), not the test rows'
    np.testing.assert_allclose(data.y_mean.numpy(), [y[train].mean()], rtol=1e-6)
    np.testing.assert_allclose(data.x_std.numpy(), x[train].std(axis=0), rtol=1e-5)
    restored = data.y_test.numpy().ravel() * y[train].std() + y[train].mean()
    np.testing.assert_allclose(np.sort(restored), np.sort(y[test]), rtol=1e-5)
    with pytest.raises(ValueError, match="name must be one of"):
        heldout.load_heldout("iris", 0)
    with pytest.raises(ValueError, match=r"split must lie in \[0, 20\), got 20"):
        heldout.load_heldout("diabetes", 20)


def _fake_cells(scores: dict[tuple[str, int], tuple[float, float]]):
    def fake(model, data, split, seed=0):
        test, val = scores[model, split]
        return {
            "model": model,
            "set": data.name,
            "split": split,
            "test": {"log_lik": test, "rmse": 1.0, "coverage90": 0.9},
            "val": {"log_lik": val, "rmse": 1.0, "coverage90": 0.9},
            "cell_cpu_s": 1.0,
        }

    return fake


def test_run_resumes_and_the_summary_pairs_the_splits(tmp_path, monkeypatch, capsys):
    # test and validation log-likelihoods per (model, split); dgp_t4 wins validation on
    # average (-1.0 against -1.1) though dgp wins split 0's
    scores = {
        ("bgpn_select", 0): (-1.0, -0.9), ("bgpn_select", 1): (-2.0, -0.9),
        ("dgp", 0): (-1.5, -1.0), ("dgp", 1): (-1.0, -1.2),
        ("dgp_t4", 0): (-1.25, -1.05), ("dgp_t4", 1): (-2.43, -0.95),
        ("mcdrop", 0): (-3.0, -2.0), ("mcdrop", 1): (-4.0, -2.0),
        ("blr", 0): (-1.0, -1.0), ("blr", 1): (-1.0, -1.0),
    }  # fmt: skip
    fitted = []
    fake = _fake_cells(scores)

    def spy(model, data, split, seed=0):
        fitted.append((model, split))
        return fake(model, data, split, seed)

    monkeypatch.setattr(heldout, "score_cell", spy)
    monkeypatch.setattr(heldout, "bayesian_linear_cell", lambda d, k, seed=0: spy("blr", d, k))
    models = list(heldout.MODELS)
    assert heldout.run(["diabetes"], [0, 1], models, tmp_path) == 10
    assert len(fitted) == 10
    # a rerun fits nothing; a damaged cell is fitted again
    assert heldout.run(["diabetes"], [0, 1], models, tmp_path) == 0
    (tmp_path / "dgp__diabetes__01.json").write_text('{"test": ')
    fitted.clear()
    assert heldout.run(["diabetes"], [0, 1], models, tmp_path) == 1
    assert fitted == [("dgp", 1)]
    assert json.loads((tmp_path / "dgp__diabetes__01.json").read_text())["test"]["log_lik"] == -1.0

    assert heldout.dgp_chosen(tmp_path, "diabetes") == "dgp_t4"
    text = heldout.summary(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| diabetes"))
    cols = [c.strip() for c in row.strip("|").split("|")]
    # bgpn -1.5 +- 0.5; dgp_t4 -1.84 +- 0.59; mcdrop -3.5 +- 0.5; blr -1 +- 0; differences to
    # dgp_t4 (0.25, 0.43): 0.34 +- 0.09, 2 of 2; to mcdrop (2, 2): 2.00 +- 0.00; to blr (0, -1)
    assert cols[:6] == [
        "diabetes",
        "2",
        "-1.50 ± 0.50",
        "-1.84 ± 0.59",
        "-3.50 ± 0.50",
        "-1.00 ± 0.00",
    ]
    assert cols[6:9] == ["0.34 ± 0.09 (2/2)", "2.00 ± 0.00 (2/2)", "-0.50 ± 0.50 (0/2)"]
    assert "diabetes: dgp_t4" in text
    # every model's own cells: mcdrop's -3 and -4
    assert "| mcdrop | 2 | -3.500 ± 0.500 | 1.0 ± 0.0 | 0.900 ± 0.000 | 1 |" in text


def test_bayesian_linear_cell_scores_its_gaussian_predictive_in_original_units():
    from scipy import stats
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import BayesianRidge

    data = heldout.load_heldout("diabetes", 5)
    cell = heldout.bayesian_linear_cell(data, 5)
    # the same model on the raw rows' scale by hand: sklearn on the standardised rows, then
    # the density and the interval in original units
    model = BayesianRidge().fit(data.x_train.double().numpy(), data.y_train.double().numpy()[:, 0])
    mean, std = model.predict(data.x_test.double().numpy(), return_std=True)
    y_std, y_mean = float(data.y_std), float(data.y_mean)
    _, y = load_diabetes(scaled=False, return_X_y=True)
    _, test = heldout.split_rows(len(y), 5)
    restored = data.y_test.double().numpy()[:, 0] * y_std + y_mean
    np.testing.assert_allclose(restored, y[test], rtol=1e-5)  # the test rows, in order
    mu, sd = mean * y_std + y_mean, std * y_std
    y_orig = data.y_test.double().numpy()[:, 0] * y_std + y_mean
    log_lik = stats.norm.logpdf(y_orig, mu, sd).mean()
    assert cell["test"]["log_lik"] == pytest.approx(log_lik, rel=1e-6)
    inside = np.abs(y_orig - mu) <= stats.norm.ppf(0.95) * sd
    assert cell["test"]["coverage90"] == pytest.approx(inside.mean())
    assert cell["test"]["rmse"] == pytest.approx(np.sqrt(np.mean((y_orig - mu) ** 2)), rel=1e-6)


def test_command_line_refuses_bad_arguments(capsys):
    for argv, message in (
        (["--splits", "20"], "expected an integer in 0-19, got 20"),
        (["--sets", "boston"], "invalid choice: 'boston'"),
        (["--models", "bgpn"], "invalid choice: 'bgpn'"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            heldout.main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
