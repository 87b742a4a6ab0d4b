"""NUTS on the non-parametric GPN: convergence (r-hat), recovery of a known function at the test
inputs, the joint (paper) and factorised ways of predicting, and argument checks."""

from __future__ import annotations

import math

import pyro
import pytest
import torch

from pyro_gpn.diagnostics import max_rhat, num_divergences
from pyro_gpn.inference.mcmc import NUTSResult, run_nuts
from pyro_gpn.models.nonparametric import NonParametricGPN

F64 = torch.float64
NOISE = 0.1


def sine_data(num_train: int, num_test: int, seed: int = 1):
    """``y = sin(x) + N(0, 0.1^2)``, one ``x`` uniform in each of ``num_train`` equal cells of
    [-3, 3] (so the test grid on [-2.7, 2.7] is interpolation, not extrapolation)."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.arange(num_train, dtype=F64) + torch.rand(num_train, generator=g, dtype=F64)
    x = (cells * 6 / num_train - 3)[:, None]
    y = torch.sin(x[:, 0]) + NOISE * torch.randn(num_train, generator=g, dtype=F64)
    x_test = torch.linspace(-2.7, 2.7, num_test, dtype=F64)[:, None]
    return x, y, x_test


def check_recovery(
    result: NUTSResult, last: int, coverage: float = 0.75, rhat_noise: float = 1.05
) -> None:
    """Converged on identified quantities, and the 90 % predictive band covers sin(x_test)."""
    idata = result.to_arviz()
    assert max_rhat(idata, [f"sigma{last}"]) < rhat_noise
    assert max_rhat(idata, ["y_test"], group="posterior_predictive") < 1.05
    truth = torch.sin(result.x_test[:, 0])
    low, high = result.y_test.quantile(0.05, dim=0), result.y_test.quantile(0.95, dim=0)
    assert ((truth >= low) & (truth <= high)).double().mean() >= coverage
    # not covered by being vague: the band is a few noise widths, the mean close to the truth
    assert (high - low).median() < 8 * NOISE  # the prior's band is ~3.3 wide
    assert (result.y_test.mean(0) - truth).square().mean().sqrt() < 2 * NOISE
    noise = result.samples[f"sigma{last}"]
    assert 0.5 * NOISE < noise.median() < 2 * NOISE


@pytest.fixture(scope="module")
def gp_run():
    """A one-layer GPN (a GP with the projected kernel): 15 train, 8 test points."""
    pyro.enable_validation(True)
    x, y, x_test = sine_data(15, 8)
    return run_nuts(
        NonParametricGPN([1, 1]), x, y, x_test, num_samples=100, warmup_steps=100, seed=0
    )


def test_nuts_recovers_sine(gp_run):
    check_recovery(gp_run, last=1)
    assert gp_run.num_divergences() == num_divergences(gp_run.to_arviz())


def test_result_layout_and_arviz_groups(gp_run):
    assert gp_run.num_chains == 2 and gp_run.num_samples == 100
    assert gp_run.samples["W1"].shape == (200, 1, 1)
    assert gp_run.samples["sigma1"].shape == (200, 1)
    assert gp_run.posterior_predictive["y_test"].shape == (200, 1, 8)
    assert gp_run.y_test.shape == (200, 8)
    prediction = gp_run.predict()  # the predict of every route
    torch.testing.assert_close(prediction.mean, gp_run.y_test.mean(0))
    torch.testing.assert_close(prediction.std, gp_run.y_test.std(0))
    assert prediction.task == "regression"
    assert gp_run.wall_time_s > 0
    idata = gp_run.to_arviz()
    assert {"posterior", "posterior_predictive", "sample_stats", "observed_data"} <= set(
        idata.groups()
    )
    assert set(idata.posterior.data_vars) == {"W1", "sigma1"}
    assert idata.posterior_predictive["y_test"].shape == (2, 100, 1, 8)
    assert idata.observed_data["y_train"].shape == (1, 15)
    assert idata.sample_stats["diverging"].shape == (2, 100)


def test_joint_sampling_keeps_test_rows_in_the_chain():
    x, y, x_test = sine_data(6, 3)
    joint = run_nuts(
        NonParametricGPN([1, 2, 1]),
        x,
        y,
        x_test,
        num_samples=4,
        warmup_steps=4,
        num_chains=1,
        joint=True,
    )
    assert set(joint.samples) == {"W1", "sigma1", "Z1_train", "Z1_test", "W2", "sigma2", "y_test"}
    assert joint.samples["Z1_test"].shape == (4, 2, 3)
    torch.testing.assert_close(joint.posterior_predictive["y_test"], joint.samples["y_test"])
    idata = joint.to_arviz()
    assert "y_test" in idata.posterior and "posterior_predictive" not in idata.groups()


@pytest.mark.slow
def test_joint_sampling_of_test_rows_agrees(gp_run):
    """The paper's formulation (test outputs inside the chain) predicts the same."""
    joint = run_nuts(
        gp_run.model,
        gp_run.x_train,
        gp_run.y_train,
        gp_run.x_test,
        num_samples=100,
        warmup_steps=100,
        seed=1,
        joint=True,
    )
    assert joint.y_test.shape == gp_run.y_test.shape
    # Monte Carlo standard error of each mean is ~0.02 here
    torch.testing.assert_close(joint.y_test.mean(0), gp_run.y_test.mean(0), atol=0.1, rtol=0.0)


@pytest.mark.slow
def test_nuts_two_layer_network_recovers_sine():
    """Network [1, 2, 1] (hidden outputs latent), 20 train and 10 test points: the run of
    ``benchmarks/nuts_synthetic.py`` recorded in ``docs/results/nuts_synthetic.md``."""
    pyro.enable_validation(True)
    x, y, x_test = sine_data(20, 10)
    result = run_nuts(
        NonParametricGPN([1, 2, 1]), x, y, x_test, num_samples=150, warmup_steps=150, seed=0
    )
    # 150 + 150 draws per chain are too few for the output noise to reach r-hat 1.05 in this
    # posterior (the recorded run measured 1.088); the predictions do (1.019).
    check_recovery(result, last=2, coverage=0.8, rhat_noise=1.1)


def test_without_test_inputs():
    x, y, _ = sine_data(6, 1)
    result = run_nuts(NonParametricGPN([1, 1]), x, y, num_samples=5, warmup_steps=5, num_chains=1)
    assert result.posterior_predictive == {}
    with pytest.raises(ValueError, match="x_test"):
        _ = result.y_test
    assert "posterior_predictive" not in result.to_arviz().groups()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"y_train": None}, "y_train"),
        ({"num_samples": 0}, "num_samples"),
        ({"num_chains": 1.5}, "num_chains"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"target_accept_prob": 1.0}, "target_accept_prob"),
        ({"model": "gpn"}, "model"),
        ({"x_test": torch.zeros(500, 1, dtype=F64)}, "max_samples"),
        ({"x_train": torch.zeros(6, 2, dtype=F64)}, "x_train"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    x, y, x_test = sine_data(6, 2)
    args = {"model": NonParametricGPN([1, 1]), "x_train": x, "y_train": y, "x_test": x_test}
    args |= {"num_samples": 5, "warmup_steps": 2} | kwargs
    with pytest.raises(ValueError, match=match):
        run_nuts(**args)


def test_sine_data_noise_level():
    """The synthetic data really has the stated noise (guards the recovery thresholds)."""
    x, y, _ = sine_data(2000, 1)
    residual = y - torch.sin(x[:, 0])
    assert abs(residual.std().item() - NOISE) < 0.01
    assert abs(residual.mean().item()) < 3 * NOISE / math.sqrt(2000)
