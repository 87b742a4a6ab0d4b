"""Tests of the ArviZ conversion and the convergence summaries."""

from __future__ import annotations

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS, Predictive

from pyro_gpn.diagnostics import (
    compare_heldout_lpd,
    convergence_report,
    heldout_lpd_from_draws,
    max_rhat,
    min_ess,
    num_divergences,
    summarize,
    to_inference_data,
)

az = pytest.importorskip("arviz")


def _normal_model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.fixture(scope="module")
def mcmc():
    pyro.set_rng_seed(0)
    y = torch.randn(20) + 3.0
    with warnings.catch_warnings():  # chains run one after the other on a 2-CPU machine
        warnings.filterwarnings("ignore", message="num_chains=.*drawn sequentially")
        # with more CPUs they run in processes: spawned, since forking a process whose autograd
        # has run on CUDA (an earlier test on a GPU machine) is refused by torch
        run = MCMC(
            NUTS(_normal_model),
            num_samples=200,  # 60 + 40 gave r-hat 1.14 once (chains in parallel, 16 CPUs)
            warmup_steps=100,
            num_chains=2,
            disable_progbar=True,
            mp_context="spawn",
        )
    run.run(y)
    return run


def test_to_inference_data_groups(mcmc):
    samples = mcmc.get_samples()
    predictive = Predictive(_normal_model, posterior_samples=samples, return_sites=["y"])
    pred = {"y_new": predictive(torch.zeros(20))["y"]}
    idata = to_inference_data(mcmc, posterior_predictive=pred)
    assert {"posterior", "posterior_predictive", "sample_stats", "observed_data"} <= set(
        idata.groups()
    )
    assert idata.posterior["mu"].shape == (2, 200)
    assert idata.posterior_predictive["y_new"].shape == (2, 200, 20)
    assert idata.sample_stats["diverging"].shape == (2, 200)
    np.testing.assert_array_equal(idata.observed_data["y"].values, mcmc._args[0].numpy())
    # chain-major order: draw j of chain c is row c * num_samples + j of get_samples()
    np.testing.assert_array_equal(idata.posterior["mu"].values.reshape(-1), samples["mu"].numpy())


def test_summary_and_scalars_on_a_converged_run(mcmc):
    idata = to_inference_data(mcmc)
    table = summarize(idata)
    assert {"mean", "sd", "ess_bulk", "ess_tail", "r_hat", "mcse_mean"} <= set(table.columns)
    assert list(table.index) == ["mu"]
    assert table.attrs["num_divergences"] == num_divergences(idata)
    diag = mcmc.diagnostics()
    assert num_divergences(idata) == sum(len(v) for v in diag["divergences"].values())
    assert max_rhat(idata) == pytest.approx(float(table.loc["mu", "r_hat"]), abs=0.01)
    assert max_rhat(idata) < 1.1
    assert min_ess(idata) == pytest.approx(float(table.loc["mu", "ess_bulk"]), rel=0.01)
    assert min_ess(idata, kind="tail") == pytest.approx(
        float(table.loc["mu", "ess_tail"]), rel=0.01
    )
    assert abs(table.loc["mu", "mean"] - mcmc.get_samples()["mu"].mean().item()) < 1e-3


def _idata(chains, diverging=None):
    """InferenceData from arrays ``{name: [chain, draw, ...]}``."""
    stats = None if diverging is None else {"diverging": diverging}
    return az.from_dict(posterior=chains, sample_stats=stats)


def test_max_rhat_detects_chains_that_disagree():
    rng = np.random.default_rng(0)
    mixed = rng.normal(size=(2, 500))
    stuck = mixed + np.array([[0.0], [3.0]])  # two chains in different modes
    idata = _idata({"a": mixed, "b": stuck})
    assert max_rhat(idata, ["a"]) < 1.02
    assert max_rhat(idata, ["b"]) > 1.5
    assert max_rhat(idata) == max_rhat(idata, ["b"])


def test_min_ess_detects_autocorrelation():
    rng = np.random.default_rng(1)
    iid = rng.normal(size=(2, 1000))
    walk = np.cumsum(iid, axis=1)  # a random walk has ESS of a handful
    idata = _idata({"iid": iid, "walk": walk})
    assert min_ess(idata, ["iid"]) > 500
    assert min_ess(idata, ["walk"]) < 50
    assert min_ess(idata) == min_ess(idata, ["walk"])


def test_num_divergences_counts_flags():
    diverging = np.zeros((2, 100), dtype=bool)
    diverging[0, [3, 7]] = True
    diverging[1, 50] = True
    idata = _idata({"a": np.random.default_rng(2).normal(size=(2, 100))}, diverging)
    assert num_divergences(idata) == 3
    assert summarize(idata.copy()).attrs["num_divergences"] == 3


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda i: max_rhat(i, ["nope"]), "var_names"),
        (lambda i: min_ess(i, kind="middle"), "kind"),
        (lambda i: summarize(i, group="posterior_predictive"), "group"),
        (lambda i: num_divergences(i), "sample_stats"),
    ],
)
def test_bad_arguments_raise(call, match):
    idata = _idata({"a": np.zeros((2, 10))})
    with pytest.raises(ValueError, match=match):
        call(idata)


def test_to_inference_data_checks_its_inputs(mcmc):
    with pytest.raises(ValueError, match="mcmc"):
        to_inference_data({"mu": torch.zeros(3)})
    with pytest.raises(ValueError, match="posterior_predictive"):
        to_inference_data(mcmc, posterior_predictive={"y": torch.zeros(7, 3)})


def test_pointwise_log_likelihood_and_sample_stats_groups(mcmc):
    """Supplied pointwise terms become the log_likelihood group (chain-major reshaped, so that
    az.loo sees the same terms as ArviZ's own computation) and extra stats join sample_stats."""
    samples = mcmc.get_samples()
    y = mcmc._args[0]
    terms = dist.Normal(samples["mu"][:, None], 1.0).log_prob(y)  # [400, 20]
    stats = {"energy": np.arange(400.0).reshape(2, 200)}
    idata = to_inference_data(mcmc, log_likelihood={"y": terms}, sample_stats=stats)
    reference = to_inference_data(mcmc, log_likelihood=True)
    np.testing.assert_allclose(
        idata.log_likelihood["y"].values, reference.log_likelihood["y"].values, rtol=1e-5
    )
    assert idata.sample_stats["energy"].values[1, 0] == 200.0
    assert az.loo(idata).elpd_loo == pytest.approx(az.loo(reference).elpd_loo, rel=1e-5)
    with pytest.raises(ValueError, match="sample_stats"):
        to_inference_data(mcmc, sample_stats={"energy": np.zeros(400)})
    with pytest.raises(ValueError, match="log_likelihood"):
        to_inference_data(mcmc, log_likelihood={"y": terms[:7]})


def test_heldout_lpd_is_the_log_mean_density():
    rng = np.random.default_rng(0)
    logs = rng.normal(-2.0, 3.0, size=(500, 4))
    want = np.log(np.mean(np.exp(logs.astype(np.longdouble)), axis=0)).astype(float)
    np.testing.assert_allclose(heldout_lpd_from_draws(torch.as_tensor(logs)), want, rtol=1e-10)
    with pytest.raises(ValueError, match="log_density"):
        heldout_lpd_from_draws(np.zeros(5))


def test_compare_heldout_lpd_ranks_by_the_sum_and_checks_its_inputs():
    good, bad = np.array([-0.1, -0.3, 0.2]), np.array([-1.0, -0.2, -2.0])
    table = compare_heldout_lpd({"bad": bad, "good": good})
    assert list(table.index) == ["good", "bad"]
    assert table.loc["good", "elpd_loo"] == pytest.approx(good.sum())
    # the documented se, sqrt(S_test) sd_j, with the population sd (ddof 0) as az.loo has it,
    # sqrt(3 * mean((lpd - mean lpd)^2)); for good the squared deviations from -1/15 sum to
    # 0.38/3, so se = sqrt(0.38/3) = 0.3559 (ddof 1 would give 0.4359)
    for name, lpd in (("good", good), ("bad", bad)):
        by_hand = np.sqrt(3 * np.mean((lpd - lpd.mean()) ** 2))
        assert table.loc[name, "se"] == pytest.approx(by_hand)
    assert table.loc["good", "se"] == pytest.approx(np.sqrt(0.38 / 3), rel=1e-12)
    diff = good - bad
    assert table.loc["bad", "elpd_diff"] == pytest.approx(diff.sum())
    assert table.loc["bad", "dse"] == pytest.approx(np.sqrt(3) * diff.std())
    with pytest.raises(ValueError, match="at least two"):
        compare_heldout_lpd({"good": good})
    with pytest.raises(ValueError, match="same test rows"):
        compare_heldout_lpd({"good": good, "short": bad[:2]})


# ------------------------------------------------------------------------ convergence_report
def _ar1(chains: int, draws: int, phi: float, seed: int, shift=None) -> np.ndarray:
    """Stationary AR(1) chains of unit variance, ``x_t = phi x_{t-1} + sqrt(1 - phi^2) e_t``,
    each chain's mean moved by ``shift[c]``."""
    rng = np.random.default_rng(seed)
    x = np.empty((chains, draws))
    x[:, 0] = rng.standard_normal(chains)
    for t in range(1, draws):
        x[:, t] = phi * x[:, t - 1] + np.sqrt(1 - phi**2) * rng.standard_normal(chains)
    return x + (0.0 if shift is None else np.asarray(shift)[:, None])


def test_convergence_report_passes_independent_draws():
    report = convergence_report({"a": _ar1(4, 1000, 0.0, 0), "b": _ar1(4, 1000, 0.0, 1)[..., None]})
    assert report.converged and report.problems == []
    assert report.quantities == ("a", "b") and (report.num_chains, report.num_draws) == (4, 1000)
    assert report.ess_threshold == 400 and report.max_rhat < 1.01
    assert "meet the standard" in str(report)


def test_convergence_report_r_hat_of_shifted_chains_is_the_variance_ratio():
    """Two chains at ``+d/2``, two at ``-d/2`` (unit variance within): the variance of the
    chain means is ``d^2 / 4`` times ``k / (k - 1)`` over ``k`` chains (4, or 8 halves for split
    r-hat), so r-hat is ``sqrt(1 + d^2 / 3)`` to ``sqrt(1 + 2 d^2 / 7)``; for 0.5 units 1.035 to
    1.041, and the report names it."""
    draws = _ar1(4, 4000, 0.0, 2, shift=[0.25, 0.25, -0.25, -0.25])
    report = convergence_report({"y_test": draws})
    assert np.sqrt(1 + 0.5 / 7) - 0.005 < report.max_rhat < np.sqrt(1 + 0.25 / 3) + 0.005
    assert not report.converged
    assert any(p.startswith("max r-hat") for p in report.problems)


def test_convergence_report_ess_of_autocorrelated_chains():
    """AR(1) with ``phi = 0.9``: the ESS of ``N`` draws is ``N (1 - phi) / (1 + phi)``, 105 of
    2,000 -- below the 400 asked of 4 chains."""
    report = convergence_report({"sigma2": _ar1(4, 500, 0.9, 3)})
    assert report.min_ess_bulk == pytest.approx(2000 * 0.1 / 1.9, rel=0.35)
    assert report.max_rhat < 1.05
    assert not report.converged and "bulk ESS" in str(report)


def test_convergence_report_divergences_and_the_empty_check():
    report = convergence_report({"a": _ar1(2, 400, 0.0, 4)}, divergence_rate=0.02)
    assert report.problems == ["2.0 % divergent transitions (>= 1 %)"]
    empty = convergence_report({})
    assert not empty.converged and "no identified quantity" in str(empty)


@pytest.mark.parametrize(
    ("draws", "match"),
    [
        ({"a": np.zeros(10)}, "num_chains"),
        ({"a": np.zeros((2, 3))}, "num_draws >= 4"),
        ({"a": np.full((2, 5), np.nan)}, "non-finite"),
        ({"a": np.zeros((2, 5)), "b": np.zeros((3, 5))}, "share"),
    ],
)
def test_convergence_report_checks_its_draws(draws, match):
    with pytest.raises(ValueError, match=match):
        convergence_report(draws)
