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
        run = MCMC(
            NUTS(_normal_model), num_samples=60, warmup_steps=40, num_chains=2, disable_progbar=True
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
    assert idata.posterior["mu"].shape == (2, 60)
    assert idata.posterior_predictive["y_new"].shape == (2, 60, 20)
    assert idata.sample_stats["diverging"].shape == (2, 60)
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
