"""The UCI harness's metric code (``benchmarks/uci.py``) against scipy (the variational weights
it benchmarks are tested in ``tests/layers/test_variational.py``)."""

import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from benchmarks import uci
from benchmarks.uci import metrics_of


def test_gaussian_metrics_match_scipy_in_original_units():
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(1, 300, generator=gen, dtype=torch.float64)
    var = torch.rand(1, 300, generator=gen, dtype=torch.float64) + 0.05
    y = torch.randn(300, generator=gen, dtype=torch.float64)
    y_std = 3.7
    got = metrics_of(mean, var, y, y_std)
    m, s, t = mean[0].numpy() * y_std, var[0].sqrt().numpy() * y_std, y.numpy() * y_std
    assert got["log_lik"] == pytest.approx(stats.norm.logpdf(t, m, s).mean(), abs=1e-10)
    assert got["rmse"] == pytest.approx(np.sqrt(np.mean((t - m) ** 2)), rel=1e-10)
    lo, hi = stats.norm.ppf(0.05, m, s), stats.norm.ppf(0.95, m, s)
    assert got["coverage90"] == pytest.approx(np.mean((t >= lo) & (t <= hi)))


def test_mixture_metrics_match_scipy():
    gen = torch.Generator().manual_seed(1)
    mean = 2 * torch.randn(3, 50, generator=gen, dtype=torch.float64)
    var = torch.rand(3, 50, generator=gen, dtype=torch.float64) + 0.01
    y = torch.randn(50, generator=gen, dtype=torch.float64)
    got = metrics_of(mean, var, y, 1.0)
    m, s, t = mean.numpy(), var.sqrt().numpy(), y.numpy()
    dens = stats.norm.pdf(t[None], m, s).mean(0)
    assert got["log_lik"] == pytest.approx(np.log(dens).mean(), abs=1e-10)
    assert got["rmse"] == pytest.approx(np.sqrt(np.mean((t - m.mean(0)) ** 2)), rel=1e-10)
    inside = []
    for j in range(50):
        cdf = lambda v, q, j=j: stats.norm.cdf(v, m[:, j], s[:, j]).mean() - q  # noqa: E731
        lo = optimize.brentq(cdf, -50, 50, args=(0.05,), xtol=1e-12)
        hi = optimize.brentq(cdf, -50, 50, args=(0.95,), xtol=1e-12)
        inside.append(lo <= t[j] <= hi)
    assert got["coverage90"] == pytest.approx(np.mean(inside))


def test_weighted_mixture_metrics_match_scipy():
    """Unequal weights (a Gauss-Hermite mixture, as ``bgpn_het`` gives) against scipy."""
    gen = torch.Generator().manual_seed(2)
    mean = torch.randn(4, 30, generator=gen, dtype=torch.float64)
    var = torch.rand(4, 30, generator=gen, dtype=torch.float64) + 0.02
    w = torch.tensor([0.1, 0.4, 0.3, 0.2], dtype=torch.float64)
    y = torch.randn(30, generator=gen, dtype=torch.float64)
    got = metrics_of(mean, var, y, 1.5, weights=w)
    m, s, t, wn = mean.numpy() * 1.5, var.sqrt().numpy() * 1.5, y.numpy() * 1.5, w.numpy()
    dens = (wn[:, None] * stats.norm.pdf(t[None], m, s)).sum(0)
    assert got["log_lik"] == pytest.approx(np.log(dens).mean(), abs=1e-10)
    assert got["rmse"] == pytest.approx(np.sqrt(np.mean((t - wn @ m) ** 2)), rel=1e-10)
    inside = []
    for j in range(30):
        cdf = lambda v, q, j=j: wn @ stats.norm.cdf(v, m[:, j], s[:, j]) - q  # noqa: E731
        lo = optimize.brentq(cdf, -50, 50, args=(0.05,), xtol=1e-12)
        hi = optimize.brentq(cdf, -50, 50, args=(0.95,), xtol=1e-12)
        inside.append(lo <= t[j] <= hi)
    assert got["coverage90"] == pytest.approx(np.mean(inside))
    with pytest.raises(ValueError, match="weights"):
        metrics_of(mean, var, y, 1.0, weights=torch.full((4,), 0.3, dtype=torch.float64))


def test_identical_components_equal_one_gaussian():
    mean, var, y = torch.randn(1, 40), torch.rand(1, 40) + 0.1, torch.randn(40, 1)
    one = metrics_of(mean, var, y, 2.0)
    many = metrics_of(mean.expand(4, -1), var.expand(4, -1), y, 2.0)
    for key in one:
        assert many[key] == pytest.approx(one[key], abs=1e-6)


def test_metrics_reject_bad_shapes():
    with pytest.raises(ValueError, match="mean and var"):
        metrics_of(torch.zeros(3), torch.ones(3), torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="rows"):
        metrics_of(torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(4), 1.0)


def test_published_table_compares_the_mean_over_splits(tmp_path):
    import json

    from benchmarks.uci import PUBLISHED, PUBLISHED_COLUMNS, published_table

    for split, ll in ((0, 1.00), (1, 1.10), (2, 0.96)):
        cell = {"model": "bgpn", "set": "kin8nm", "split": split, "test": {"log_lik": ll}}
        (tmp_path / f"bgpn__kin8nm__{split:02d}.json").write_text(json.dumps(cell))
    other = {"model": "mcdrop", "set": "boston", "split": 0, "test": {"log_lik": 0.0}}
    (tmp_path / "mcdrop__boston__00.json").write_text(json.dumps(other))
    lines = published_table(tmp_path).splitlines()
    assert len(lines) == 3  # header, rule, kin8nm only (boston has no bgpn cell)
    row = lines[2].split(" | ")
    mean, se = np.mean([1.00, 1.10, 0.96]), np.std([1.00, 1.10, 0.96], ddof=1) / np.sqrt(3)
    assert row[1] == f"{mean:.2f} ± {se:.2f} [0,1,2]"
    # mean 1.02: ahead of PBP 0.90, MC dropout 0.95 and hoDVI 1.01; behind the ensemble and DVI
    signs = [cell.strip(" |")[-2] for cell in row[2:]]
    assert signs == ["+" if mean > m else "−" for m, _ in PUBLISHED["kin8nm"]]
    assert signs == ["+", "+", "−", "−", "+"]
    assert len(PUBLISHED_COLUMNS) == 5 and set(PUBLISHED) >= {"protein", "naval"}


def test_timing_reports_every_model_side_by_side_and_keeps_one_thread():
    """``benchmarks/uci_timing.py`` on boston: one block per model, the ratios are the quotients
    of the medians, and a variational GPN step leaves torch's thread count where it was (the
    ``cpu_kernels._k`` pool fix)."""
    import argparse
    import math
    import os

    from benchmarks.uci import DATA_DIR
    from pyro_gpn.data.uci_regression import load_uci_regression

    try:
        load_uci_regression("boston", DATA_DIR, split=0, download=False)
    except (FileNotFoundError, OSError, RuntimeError) as err:
        pytest.skip(f"UCI data not found under {DATA_DIR}: {err}")
    from benchmarks.uci_timing import time_set

    threads = torch.get_num_threads()
    a = argparse.Namespace(batch=64, block=1, repeats=1, models=["gpn_variational", "mlp"])
    row = time_set("boston", a)
    assert set(row["s_per_epoch_median"]) == {"gpn_variational", "mlp"}
    assert row["batch"] == 64 and row["num_train"] > 64 and row["gpn_width"] == 50
    med, cpu = row["s_per_epoch_median"], row["cpu_s_per_epoch_median"]
    assert all(math.isfinite(v) and v > 0 for v in [*med.values(), *cpu.values()])
    assert row["ratio_mlp_over_gpn_vi"] == pytest.approx(med["mlp"] / med["gpn_variational"])
    assert row["cpu_ratio_mlp_over_gpn_vi"] == pytest.approx(cpu["mlp"] / cpu["gpn_variational"])
    assert "ratio_dgp_over_gpn_vi" not in row and "ratio_mlp_over_gpn_point" not in row
    assert row["torch_threads_end"] == threads == torch.get_num_threads()
    assert os.getloadavg()[0] >= 0


def test_student_t_predictive_matches_scipy():
    """The deep GP's Student-t predictive (``student_t_predictive``): with a vanishing latent
    variance it is the t itself (scipy), with two latent Gaussians the equal mixture of their
    t-convolutions (scipy's t density integrated against each Gaussian by quadrature)."""
    from scipy import integrate

    from benchmarks.uci import student_t_predictive

    y = torch.tensor([-30.0, -2.5, 0.1, 1.0, 8.0], dtype=torch.float64)
    mean_f = torch.tensor([[0.3] * 5], dtype=torch.float64)
    mean, var, w = student_t_predictive(mean_f, torch.full_like(mean_f, 1e-14), 0.49, 4.0)
    got = metrics_of(mean, var, y, 1.0, w)["log_lik"]
    want = stats.t.logpdf(y.numpy(), 4.0, 0.3, 0.7).mean()
    assert got == pytest.approx(want, abs=1e-6)

    mean_f = torch.tensor([[0.3] * 5, [-1.0] * 5], dtype=torch.float64)
    var_f = torch.tensor([[0.2] * 5, [1.5] * 5], dtype=torch.float64)
    mean, var, w = student_t_predictive(mean_f, var_f, 0.25, 4.0)
    assert mean.shape == var.shape and w.shape == (mean.shape[0],)
    dens = []
    for t in y.tolist():
        d = 0.0
        for m, v in ((0.3, 0.2), (-1.0, 1.5)):
            f = lambda u, m=m, v=v, t=t: (  # noqa: E731
                stats.t.pdf(t, 4.0, u, 0.5) * stats.norm.pdf(u, m, np.sqrt(v))
            )
            d += 0.5 * integrate.quad(f, m - 12 * np.sqrt(v), m + 12 * np.sqrt(v), limit=200)[0]
        dens.append(d)
    got = metrics_of(mean, var, y, 1.0, w)["log_lik"]
    assert got == pytest.approx(np.log(dens).mean(), abs=1e-6)


def test_student_t_likelihood_fixes_the_degrees_of_freedom_and_its_noise_is_the_squared_scale():
    """``student_t_likelihood(4)``: GPyTorch's t with ν = 4 not trained, and ``noise`` the
    squared scale ``student_t_predictive`` takes (its log density against scipy's t)."""
    from benchmarks.uci import student_t_likelihood

    likelihood = student_t_likelihood(4.0)
    assert float(likelihood.deg_free) == pytest.approx(4.0)
    assert not likelihood.raw_deg_free.requires_grad
    assert all(p is not likelihood.raw_deg_free for p in likelihood.parameters() if p.requires_grad)
    likelihood.noise = torch.tensor(0.3)
    f = torch.tensor([0.2, -1.0, 3.0])
    y = torch.tensor([0.5, 2.0, -4.0])
    got = likelihood(f).log_prob(y).detach().numpy()
    want = stats.t.logpdf(y.numpy(), 4.0, f.numpy(), np.sqrt(0.3))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_deep_gp_with_student_t_noise_fits_and_scores():
    """``fit_dgp(df=4)`` (the ``dgp_t4`` column): a short fit keeps the degrees of freedom at 4
    and gives a finite predictive mixture whose weights sum to 1."""
    from benchmarks.uci import DATA_DIR, fit_dgp
    from pyro_gpn.data.uci_regression import load_uci_regression

    try:
        data = load_uci_regression("boston", DATA_DIR, split=0, download=False)
    except (FileNotFoundError, OSError, RuntimeError) as err:
        pytest.skip(f"UCI data not found under {DATA_DIR}: {err}")
    fit = fit_dgp(data, 0, steps=30, eval_every=10, inducing=16, df=4.0)
    mean, var, w = fit["predict"](data.x_test)
    assert torch.isfinite(mean).all() and torch.isfinite(var).all() and (var > 0).all()
    assert mean.shape[0] == 10 * 90  # 10 latent samples x the t's 90 scale components
    score = metrics_of(mean, var, data.y_test, float(data.y_std), w)
    assert np.isfinite(score["log_lik"]) and 0 <= score["coverage90"] <= 1
    assert fit["noise_std"] > 0


def _small_yacht(rows: int = 64):
    """Split 0 of yacht (shipped with the package) with its first ``rows`` training rows."""
    import dataclasses

    from pyro_gpn.data.uci_regression import load_uci_regression

    data = load_uci_regression("yacht", split=0, download=False)
    return dataclasses.replace(data, x_train=data.x_train[:rows], y_train=data.y_train[:rows])


@pytest.mark.parametrize("runner", ["clt", "mcdrop", "ensemble", "dgp"])
def test_peer_models_fit_and_score(runner):
    """Each peer model of the benchmark (the central-limit GPN, MC dropout, the deep ensemble and
    GPyTorch's deep GP with its default Gaussian noise) fits on a small set and gives a finite
    predictive whose metrics are finite, with the fields a cell records."""
    from benchmarks import uci

    data = _small_yacht()
    fits = {
        "clt": lambda: uci.fit_clt(data, 0),
        "mcdrop": lambda: uci.fit_mcdrop(data, 0, rates=(0.01, 0.1)),
        "ensemble": lambda: uci.fit_ensemble(data, 0, members=2),
        "dgp": lambda: uci.fit_dgp(data, 0, steps=20, eval_every=10, inducing=8),
    }
    fit = fits[runner]()
    assert fit["fit_s"] > 0 and fit["epochs"] > 0
    mean, var, *weights = fit["predict"](data.x_test)
    assert mean.shape[-1] == data.x_test.shape[0] and mean.shape == var.shape
    assert torch.isfinite(mean).all() and (var > 0).all()
    score = uci._score(fit["predict"], data.x_test, data.y_test, float(data.y_std))
    assert np.isfinite(score["log_lik"]) and np.isfinite(score["rmse"])
    assert 0 <= score["coverage90"] <= 1
    if runner == "mcdrop":  # the rate chosen on the validation rows' log-likelihood
        assert fit["dropout"] == max(fit["val_ll_by_rate"], key=fit["val_ll_by_rate"].get)
    if runner == "ensemble":  # an equal mixture of the members' Gaussians
        assert mean.shape[0] == 2


def test_aggregate_records_times_commands_and_machine(tmp_path):
    """``uci.json`` (``aggregate``) carries the time per fit of every (model, set) -- wall and
    CPU seconds per cell, seconds per epoch, as mean and standard error over the cells that
    record them --, the commands and the machine."""
    import json

    from benchmarks.uci import aggregate

    for split, (wall, cpu) in enumerate(((10.0, 9.0), (14.0, 11.0))):
        cell = {
            "model": "bgpn", "set": "yacht", "split": split, "noise_std": 0.1,
            "test": {"log_lik": 1.0, "rmse": 0.5, "coverage90": 0.9},
            "cell_s": wall, "cell_cpu_s": cpu, "s_per_epoch": 0.01 * (split + 1),
            "load_avg_1m_end": 1.0,
        }  # fmt: skip
        (tmp_path / f"bgpn__yacht__{split:02d}.json").write_text(json.dumps(cell))
    result = aggregate(tmp_path)
    row = result["benchmark_test"]["bgpn"]["yacht"]
    assert row["cell_s"] == {"mean": 12.0, "se": pytest.approx(2.0), "n": 2}
    assert row["cell_cpu_s"]["mean"] == 10.0 and row["s_per_epoch"]["n"] == 2
    assert "benchmarks/uci.py" in result["commands"]["cells"]
    assert result["machine"]["aggregated_on"]["cpus"] >= 1
    json.dumps(result)  # serialisable as written


def test_the_library_portfolio_holds_every_sets_chosen_configuration():
    """``VGPN_PORTFOLIO`` (``select_vgpn``'s default candidates) is the per-set choices of
    ``CHOSEN``: every set's chosen column has a candidate with its head, noise, weights, width,
    objective and noise warm-up (the schedules of merged twins may differ: power's chosen
    column takes the larger step of the ``het_point`` candidate's, yacht's, ``lr`` 0.02)."""
    from pyro_gpn.recommended import VGPN_PORTFOLIO

    def key(head, df, weights, width, elbo, warmup):
        weights = tuple(weights) if isinstance(weights, list) else weights
        return (head, df, weights, width, elbo, warmup)

    candidates = {
        key(
            c.head,
            c.df,
            c.weights,
            c.width_factor,
            c.fit.get("elbo", uci.VGPN.elbo),
            c.fit.get("noise_warmup", 0),
        ): c.name
        for c in VGPN_PORTFOLIO
    }
    for name, column in uci.CHOSEN.items():
        config = uci.bgpn_config(column, name)
        want = key(
            config.get("head", "gaussian"),
            config.get("df"),
            config["weights"],
            config.get("hidden", (1,))[0],
            config["elbo"],
            config.get("noise_warmup", 0),
        )
        assert want in candidates, (name, column, want)
        # the schedule too, where the candidate is the column's own (not a merged twin)
        if name in ("power", "wine"):
            continue
        candidate = next(c for c in VGPN_PORTFOLIO if c.name == candidates[want])
        for key_name in ("lr", "patience"):
            assert candidate.fit.get(key_name, getattr(uci.VGPN, key_name)) == config[key_name]
        steps = config.get("set_steps", config["num_steps"])
        assert candidate.fit.get("num_steps", uci.VGPN.num_steps) == steps, (name, column)


def test_stacked_cell_records_rows_that_rebuild_its_own_metrics(monkeypatch):
    """``bgpn_stack`` (``fit_bgpn_auto(combine="stack")``, calibration off) records every
    candidate's per-row densities and distribution function; the stacked mixture rebuilt from
    them with the cell's weights gives the cell's own test log-likelihood and 90 % coverage
    (computed by ``metrics_of`` through quantiles): the rows that any later rule is scored on
    are the predictive's."""
    from benchmarks import uci
    from pyro_gpn.inference import selection as selection_module
    from pyro_gpn.recommended import VGPNCandidate

    steps = {"num_steps": 60, "eval_every": 20}
    portfolio = (
        VGPNCandidate("gaussian", fit=steps),
        VGPNCandidate("het", head="heteroscedastic", weights="point", fit=steps),
        VGPNCandidate("t4", df=4.0, fit=steps),
    )
    # fixed weights: on so few steps one candidate takes every row and stacking keeps it alone
    fixed = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    monkeypatch.setattr(selection_module, "stacking_weights", lambda log_densities: fixed)
    monkeypatch.setattr("pyro_gpn.recommended.VGPN_PORTFOLIO", portfolio)
    real = selection_module.select_vgpn
    monkeypatch.setattr(
        selection_module, "select_vgpn", lambda *a, **k: real(*a, **k, calibrate=False)
    )
    monkeypatch.setattr("pyro_gpn.inference.select_vgpn", selection_module.select_vgpn)
    data = _small_yacht(rows=120)
    fit = uci.fit_bgpn_auto(data, 0, combine="stack")
    assert set(fit["candidate_rows"]) == {"gaussian", "het", "t4"} and not fit["calibrated"]
    assert fit["predictive_scale"] == [1.0]
    assert fit["weights"] == pytest.approx({"gaussian": 0.2, "het": 0.5, "t4": 0.3})
    score = uci._score(fit["predict"], data.x_test, data.y_test, float(data.y_std))
    rows = fit["candidate_rows"]
    log_w = torch.tensor([math.log(w) for w in fit["weights"].values()], dtype=torch.float64)
    dens = torch.tensor([rows[n]["test_log_density"] for n in fit["weights"]], dtype=torch.float64)
    rebuilt = torch.logsumexp(dens + log_w[:, None], 0).mean() - math.log(float(data.y_std))
    assert float(rebuilt) == pytest.approx(score["log_lik"], abs=1e-6)
    cdf = sum(w * torch.tensor(rows[n]["test_cdf"]) for n, w in fit["weights"].items())
    inside = ((cdf >= 0.05) & (cdf <= 0.95)).double().mean()
    assert float(inside) == pytest.approx(score["coverage90"], abs=1.5 / data.x_test.shape[0])
    best, stacked = fit["combine_crossfit_std"]
    assert math.isfinite(best) and math.isfinite(stacked)
    for name, row in rows.items():  # every candidate's validation mean is its recorded score
        mean = sum(row["val_log_density"]) / len(row["val_log_density"])
        assert mean == pytest.approx(fit["candidate_val_log_lik_std"][name], abs=1e-5)


def test_the_closed_bgpn_stack_column_takes_no_new_cells(monkeypatch):
    """``bgpn_stack`` holds section 29's rule, which the library no longer follows: a new cell
    is refused before any data is loaded (``bgpn_select`` runs today's rule)."""
    monkeypatch.setattr(
        "pyro_gpn.data.uci_regression.load_uci_regression",
        lambda *a, **k: pytest.fail("no data should be loaded"),
    )
    with pytest.raises(SystemExit, match="run bgpn_select"):
        uci.run_cell("bgpn_stack", "wine", 0)
    assert "bgpn_select" in uci.MODELS


def test_candidate_rows_are_the_uncalibrated_predictive_and_leave_the_scale_as_it_was():
    """A calibrated network's rows are those of its predictive at scale 1 (the rules mix the
    candidates as fitted), its scale is restored afterwards, and the distribution function at
    each test target is the Gaussian predictive's by scipy."""
    from pyro_gpn.models import VariationalGPN

    data = _small_yacht()
    torch.manual_seed(0)
    net = VariationalGPN([data.num_features, 6, 1])
    with torch.no_grad():
        plain_val = net.log_predictive(data.x_val, data.y_val).double()
        pred = net.predict(data.x_test)
    net.head.predictive_scale.fill_(1.5)
    rows = uci.candidate_rows({"net": net}, data)["net"]
    assert float(net.head.predictive_scale) == 1.5
    np.testing.assert_allclose(rows["val_log_density"], plain_val.numpy(), rtol=0, atol=1e-12)
    expected = stats.norm.cdf(
        data.y_test.reshape(-1).numpy(), pred.mean.reshape(-1).numpy(), pred.std.reshape(-1).numpy()
    )
    np.testing.assert_allclose(rows["test_cdf"], expected, rtol=0, atol=1e-5)
    assert len(rows["test_log_density"]) == data.x_test.shape[0]


def test_published_table_of_the_library_rule_rebuilds_only_calibrated_mixtures(
    tmp_path, monkeypatch
):
    """``published_table(out, "bgpn_stack_library")``: the ``bgpn_stack`` cells with section
    29's rule; a cell whose mixture was calibrated is rebuilt from its rows (loading the split's
    target scale), the others are read as they are."""
    import json

    from tests.benchmarks.test_uci_paired import _stack_cell

    loaded = []
    monkeypatch.setattr(uci, "log_target_std", lambda name, split: loaded.append(split) or 0.0)
    for split, calibrated in ((0, False), (1, True)):
        cell = {**_stack_cell(split), "model": "bgpn_stack", "set": "wine"}
        cell["calibrated"] = calibrated
        cell["test"] = {"log_lik": -0.5, "coverage90": 0.9, "rmse": 1.0}
        cell["weights"] = dict.fromkeys(("a", "c"), 0.5)
        (tmp_path / f"bgpn_stack__wine__{split:02d}.json").write_text(json.dumps(cell))
    row = uci.published_table(tmp_path, "bgpn_stack_library").splitlines()[2]
    from benchmarks.uci_paired import rule_metrics

    rebuilt = rule_metrics(_stack_cell(1), "stack", 0.0)["log_lik"]
    mean = (-0.5 + rebuilt) / 2
    assert row.startswith(f"| wine | {mean:.2f} ± ") and "[0,1]" in row
    assert loaded == [1]
