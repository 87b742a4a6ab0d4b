"""Tests of :mod:`pyro_gpn.metrics` against independent formulas (scipy, numpy loops)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from pyro_gpn import Moments
from pyro_gpn.metrics import (
    categorical_nll,
    central_interval,
    classification_error,
    empirical_interval,
    expected_calibration_error,
    gaussian_log_likelihood,
    interval_coverage,
    mean_squared_error,
    rmse,
)


@pytest.fixture
def regression():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(50, 2, generator=g, dtype=torch.float64)
    var = torch.rand(50, 2, generator=g, dtype=torch.float64) + 0.05
    target = mean + var.sqrt() * torch.randn(50, 2, generator=g, dtype=torch.float64)
    return mean, var, target


def test_rmse_in_original_units(regression):
    mean, _, target = regression
    scale, shift = torch.tensor([2.0, 0.5], dtype=torch.float64), 3.0
    original = np.sqrt(np.mean(((mean - target) * scale).numpy() ** 2))
    assert float(rmse(mean * 1.0, target, scale)) == pytest.approx(original, rel=1e-12)
    # shifting both by the data mean changes nothing
    assert float(rmse(mean + shift, target + shift, scale)) == pytest.approx(original, rel=1e-12)
    summed = mean_squared_error(mean, target, reduction="sum")
    assert float(summed) == pytest.approx(float((mean - target).square().sum()))


@pytest.mark.parametrize("scale", [1.0, 0.01, 37.0])
def test_gaussian_log_likelihood_matches_scipy_in_original_units(regression, scale):
    mean, var, target = regression
    s = np.array([scale, 2 * scale])
    mu = np.array([1.0, -4.0])
    expected = stats.norm.logpdf(
        target.numpy() * s + mu, loc=mean.numpy() * s + mu, scale=np.sqrt(var.numpy()) * s
    ).sum(-1)
    got = gaussian_log_likelihood(Moments(mean, var=var), target, torch.tensor(s))
    assert float(got) == pytest.approx(expected.mean(), rel=1e-10)
    per_sample = gaussian_log_likelihood(
        Moments(mean, var=var), target, torch.tensor(s), reduction="none"
    )
    np.testing.assert_allclose(per_sample.numpy(), expected, rtol=1e-10)


def test_gaussian_log_likelihood_with_a_full_covariance(regression):
    mean, var, target = regression
    cov = torch.diag_embed(var)
    cov[:, 0, 1] = cov[:, 1, 0] = 0.5 * (var[:, 0] * var[:, 1]).sqrt()
    expected = [
        stats.multivariate_normal.logpdf(t * 3.0, m * 3.0, c * 9.0)
        for t, m, c in zip(target.numpy(), mean.numpy(), cov.numpy())
    ]
    got = gaussian_log_likelihood(Moments(mean, cov=cov), target, 3.0, reduction="sum")
    assert float(got) == pytest.approx(sum(expected), rel=1e-10)


def test_central_interval_holds_its_level(regression):
    mean, var, _ = regression
    lower, upper = central_interval(mean, var, level=0.9)
    z = (upper - mean) / var.sqrt()
    torch.testing.assert_close(z, torch.full_like(z, stats.norm.ppf(0.95)))
    torch.testing.assert_close(mean - lower, upper - mean)
    # Monte Carlo: draws of the Gaussians fall inside 90 % of the time
    g = torch.Generator().manual_seed(1)
    draws = mean + var.sqrt() * torch.randn(400, *mean.shape, generator=g, dtype=mean.dtype)
    inside = float(interval_coverage(draws, lower.expand_as(draws), upper.expand_as(draws)))
    assert inside == pytest.approx(0.9, abs=3 * np.sqrt(0.09 / draws.numel()))


def test_empirical_interval_is_numpy_quantiles():
    draws = torch.randn(101, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    lower, upper = empirical_interval(draws, level=0.8)
    np.testing.assert_allclose(lower.numpy(), np.quantile(draws.numpy(), 0.1, axis=0))
    np.testing.assert_allclose(upper.numpy(), np.quantile(draws.numpy(), 0.9, axis=0))


def test_interval_coverage_counts_the_bounds_inside():
    target = torch.tensor([0.0, 1.0, 2.0, 3.0])
    lower, upper = torch.tensor([0.0, 1.5, 1.0, -1.0]), torch.tensor([1.0, 2.0, 2.0, 0.0])
    assert float(interval_coverage(target, lower, upper)) == 0.5


def test_classification_metrics_against_loops():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(200, 4, generator=g, dtype=torch.float64) * 2
    probs = logits.softmax(-1)
    labels = torch.randint(0, 4, (200,), generator=g)
    p, y = probs.numpy(), labels.numpy()
    assert float(classification_error(logits, labels)) == np.mean(p.argmax(1) != y)
    assert float(classification_error(probs, labels, reduction="sum")) == np.sum(p.argmax(1) != y)
    nll = -np.log(p[np.arange(200), y]).mean()
    assert float(categorical_nll(probs, labels)) == pytest.approx(nll, rel=1e-12)
    ece = 0.0
    for b in range(10):
        conf = p.max(1)
        in_bin = (conf > b / 10) & (conf <= (b + 1) / 10)
        if in_bin.any():
            accuracy = np.mean(p.argmax(1)[in_bin] == y[in_bin])
            ece += in_bin.mean() * abs(accuracy - conf[in_bin].mean())
    assert float(expected_calibration_error(probs, labels, num_bins=10)) == pytest.approx(ece)


def test_calibration_error_of_calibrated_and_overconfident_predictions():
    # every prediction says 0.75 for class 0, and 3 in 4 are right: perfectly calibrated
    probs = torch.tensor([[0.75, 0.25]]).repeat(400, 1)
    labels = (torch.arange(400) % 4 == 0).long()
    assert float(expected_calibration_error(probs, labels)) == pytest.approx(0.0, abs=1e-12)
    sure = torch.tensor([[1.0, 0.0]]).repeat(400, 1)  # says 1.0, right 3 in 4 times
    assert float(expected_calibration_error(sure, labels)) == pytest.approx(0.25)


def test_bad_arguments_name_the_argument(regression):
    mean, var, target = regression
    with pytest.raises(ValueError, match="target"):
        rmse(mean, target[:3])
    with pytest.raises(ValueError, match="scale"):
        rmse(mean, target, scale=0.0)
    with pytest.raises(ValueError, match="reduction"):
        mean_squared_error(mean, target, reduction="max")
    with pytest.raises(ValueError, match="level"):
        central_interval(mean, var, level=1.0)
    with pytest.raises(ValueError, match="labels"):
        classification_error(mean, torch.zeros(50))
    with pytest.raises(ValueError, match="probs"):
        categorical_nll(torch.full((2, 2), 0.9), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="num_bins"):
        expected_calibration_error(torch.full((2, 2), 0.5), torch.zeros(2, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="draws"):
        empirical_interval(torch.zeros(1, 3))
