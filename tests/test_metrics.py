"""Tests of :mod:`pyro_gpn.metrics` against independent formulas (scipy, numpy loops)."""

from __future__ import annotations

import math

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


# ---------------------------------------------------------------------------------- calibration
def _hand_made_classification():
    """Five samples, two bins: hand-computed confidences, accuracies and ECE."""
    from pyro_gpn.heads import Prediction

    probs = torch.tensor(
        [[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.45, 0.55]], dtype=torch.float64
    )
    labels = torch.tensor([0, 1, 1, 0, 0])
    return Prediction(probs, torch.zeros_like(probs), "classification"), labels


def test_reliability_diagram_against_hand_computed_bins():
    from pyro_gpn.metrics import expected_calibration_error, reliability_diagram

    prediction, labels = _hand_made_classification()
    diagram = reliability_diagram(prediction, labels, num_bins=2)
    # top probabilities 0.9, 0.8, 0.7, 0.6, 0.55: all in (0.5, 1] -> bin 1; bin 0 empty.
    # correct: yes, no, yes, yes, no -> accuracy 3/5; confidence (0.9+0.8+0.7+0.6+0.55)/5 = 0.71
    assert diagram.counts.tolist() == [0, 5]
    assert math.isnan(diagram.confidence[0]) and math.isnan(diagram.accuracy[0])
    assert diagram.confidence[1].item() == pytest.approx(0.71)
    assert diagram.accuracy[1].item() == pytest.approx(0.6)
    assert diagram.ece == pytest.approx(0.11)
    assert diagram.edges.tolist() == [0.0, 0.5, 1.0]
    # five bins: (0.8, 1] holds 0.9 (correct); (0.6, 0.8] holds 0.8 (wrong), 0.7 (correct);
    # (0.4, 0.6] holds 0.6 (correct), 0.55 (wrong):
    # ECE = 1/5 |1 - 0.9| + 2/5 |0.5 - 0.75| + 2/5 |0.5 - 0.575| = 0.02 + 0.1 + 0.03 = 0.15
    five = reliability_diagram(prediction.probs, labels, num_bins=5)
    assert five.counts.tolist() == [0, 0, 2, 2, 1]
    assert five.ece == pytest.approx(0.15)
    assert expected_calibration_error(prediction, labels, 5).item() == pytest.approx(0.15)


def test_central_interval_coverage_against_hand_computed_counts():
    from pyro_gpn.heads import Prediction
    from pyro_gpn.metrics import central_interval_coverage

    # standard normal predictive; targets at 0.5, 1.0, 1.5 and 2.5 standard deviations.
    # 50 % interval: +-0.674 -> one inside; 90 %: +-1.645 -> three inside; 99 %: +-2.576 -> all
    mean = torch.zeros(4, 1, dtype=torch.float64)
    prediction = Prediction(mean, torch.ones_like(mean), "regression")
    target = torch.tensor([0.5, -1.0, 1.5, 2.5], dtype=torch.float64)
    coverage = central_interval_coverage(prediction, target, levels=(0.5, 0.9, 0.99))
    assert coverage.tolist() == [0.25, 0.75, 1.0]
    # the same counts at mean 1 and standard deviation 2 (the targets scaled and shifted):
    # a predictive read as a variance (4) or a standard deviation of 1 would count otherwise
    scaled = Prediction(mean + 1.0, torch.full_like(mean, 2.0), "regression")
    coverage = central_interval_coverage(scaled, 1.0 + 2.0 * target, levels=(0.5, 0.9, 0.99))
    assert coverage.tolist() == [0.25, 0.75, 1.0]
    # std 0.5: the 90 % interval is +-0.822, so only the target at 0.25 std (0.125) and at
    # -0.8 lie inside (hand count: 2 of 4), the 50 % one (+-0.337) holds one
    half = Prediction(mean, torch.full_like(mean, 0.5), "regression")
    inside = torch.tensor([0.125, -0.8, 0.9, -1.3], dtype=torch.float64)
    assert central_interval_coverage(half, inside, levels=(0.5, 0.9)).tolist() == [0.25, 0.5]


def test_central_interval_coverage_of_a_calibrated_gaussian_matches_its_levels():
    from pyro_gpn.heads import Prediction
    from pyro_gpn.metrics import central_interval_coverage

    generator = torch.Generator().manual_seed(0)
    std = torch.rand(20000, 1, generator=generator, dtype=torch.float64) + 0.5
    target = std * torch.randn(20000, 1, generator=generator, dtype=torch.float64)
    prediction = Prediction(torch.zeros_like(std), std, "regression")
    levels = (0.5, 0.8, 0.95)
    coverage = central_interval_coverage(prediction, target, levels)
    # binomial standard error at n = 20000 is at most 0.0035: three of them
    assert torch.allclose(coverage, torch.tensor(levels, dtype=torch.float64), atol=0.0105)
    # per band of standard deviations too (5,000 rows each: 3 binomial s.e. <= 0.021), so that
    # errors at small and large std cannot cancel
    for lo in (0.5, 0.75, 1.0, 1.25):
        band = ((std >= lo) & (std < lo + 0.25)).squeeze(1)
        part = Prediction(prediction.mean[band], std[band], "regression")
        got = central_interval_coverage(part, target[band], levels)
        assert torch.allclose(got, torch.tensor(levels, dtype=torch.float64), atol=0.021), lo
    # an over-confident predictive (std halved) covers less
    narrow = Prediction(prediction.mean, std / 2, "regression")
    assert (central_interval_coverage(narrow, target, levels) < coverage - 0.1).all()


def test_calibration_functions_refuse_the_wrong_task():
    from pyro_gpn.heads import Prediction
    from pyro_gpn.metrics import central_interval_coverage, reliability_diagram

    prediction, labels = _hand_made_classification()
    with pytest.raises(ValueError, match="prediction must be a regression"):
        central_interval_coverage(prediction, labels.double())
    regression = Prediction(torch.zeros(3, 1), torch.ones(3, 1), "regression")
    with pytest.raises(ValueError, match="probs is a regression Prediction"):
        reliability_diagram(regression, torch.tensor([0, 1, 0]))


# ---------------------------------------------------------------------------------- mixtures
def _scipy_mixture_quantile(weights, means, stds, q):
    """The ``q`` quantile of ``sum_k w_k N(m_k, s_k^2)`` by Brent's method on scipy's CDF."""
    from scipy.optimize import brentq

    def cdf(t):
        return float(np.sum(weights * stats.norm.cdf(t, loc=means, scale=stds))) - q

    lo, hi = float(np.min(means - 12 * stds)), float(np.max(means + 12 * stds))
    return brentq(cdf, lo, hi, xtol=1e-14, rtol=1e-14, maxiter=500)


@pytest.mark.parametrize(
    "weights, means, stds",
    [
        # two well-separated modes: the 90 % interval spans the gap between them
        ([0.5, 0.5], [-4.0, 4.0], [0.3, 0.3]),
        # a heavy-tailed scale mixture (as the heteroscedastic head's log-variance nodes)
        ([0.7, 0.25, 0.05], [0.0, 0.0, 0.0], [0.5, 2.0, 20.0]),
        # a tiny component far away, and a very narrow one
        ([0.98, 0.02], [0.0, 1e3], [1e-4, 1.0]),
        # unequal weights, unequal means and scales
        ([0.2, 0.3, 0.5], [-1.0, 0.5, 3.0], [0.1, 1.5, 0.7]),
    ],
)
@pytest.mark.parametrize("level", [0.5, 0.9, 0.99])
def test_mixture_central_interval_matches_scipy_quantiles(weights, means, stds, level):
    from pyro_gpn.metrics import mixture_central_interval

    w, m, s = (np.array(v, dtype=np.float64) for v in (weights, means, stds))
    lower, upper = mixture_central_interval(
        torch.tensor(w), torch.tensor(m)[:, None], torch.tensor(s)[:, None] ** 2, level
    )
    expected = [_scipy_mixture_quantile(w, m, s, q) for q in (0.5 - level / 2, 0.5 + level / 2)]
    assert lower.shape == upper.shape == (1,)
    scale = float(np.max(s))
    assert float(lower) == pytest.approx(expected[0], abs=1e-9 * scale, rel=1e-9)
    assert float(upper) == pytest.approx(expected[1], abs=1e-9 * scale, rel=1e-9)


def test_mixture_central_interval_of_one_component_is_the_gaussian_interval(regression):
    from pyro_gpn.metrics import mixture_central_interval

    mean, var, _ = regression
    lower, upper = mixture_central_interval(
        torch.ones(1, dtype=torch.float64), mean[None], var[None]
    )
    reference = central_interval(mean, var, 0.9)
    torch.testing.assert_close(lower, reference[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(upper, reference[1], atol=1e-12, rtol=0)


def test_mixture_central_interval_in_float32_against_float64():
    from pyro_gpn.metrics import mixture_central_interval

    g = torch.Generator().manual_seed(1)
    weights = torch.softmax(torch.randn(16, generator=g, dtype=torch.float64), 0)
    mean = torch.randn(16, 300, generator=g, dtype=torch.float64) * 3
    var = torch.exp(2 * torch.randn(16, 300, generator=g, dtype=torch.float64))
    lower64, upper64 = mixture_central_interval(weights, mean, var, 0.9)
    lower32, upper32 = mixture_central_interval(weights.float(), mean.float(), var.float(), 0.9)
    assert lower32.dtype == torch.float32
    width = (upper64 - lower64).abs()
    assert ((lower32.double() - lower64).abs() <= 1e-5 * width + 1e-5).all()
    assert ((upper32.double() - upper64).abs() <= 1e-5 * width + 1e-5).all()


def test_mixture_coverage_of_draws_from_the_heteroscedastic_predictive_matches_its_levels():
    """Draw targets from the heteroscedastic head's own generative model (``F``, ``G`` jointly
    Gaussian, ``y ~ N(F, e^G)``, by Monte Carlo, not through the mixture); the Gauss-Hermite
    mixture's central intervals must cover them at their levels, and the moment-matched
    Gaussian's must not (a heavy-tailed predictive: its 50 % interval too wide)."""
    from pyro_gpn.heads import HeteroscedasticGaussianHead
    from pyro_gpn.metrics import central_interval_coverage

    torch.manual_seed(0)
    head = HeteroscedasticGaussianHead(1, dtype=torch.float64)
    with torch.no_grad():
        head.noise_slope.fill_(3.0)  # a wide log-variance: strongly non-Gaussian predictive
    n = 20_000
    g = torch.Generator().manual_seed(2)
    mean = torch.randn(n, 2, generator=g, dtype=torch.float64)
    std = 0.2 + torch.rand(n, 2, generator=g, dtype=torch.float64)
    rho = torch.full((n,), 0.6, dtype=torch.float64)
    cov = torch.zeros(n, 2, 2, dtype=torch.float64)
    cov[:, 0, 0], cov[:, 1, 1] = std[:, 0] ** 2, std[:, 1] ** 2
    cov[:, 0, 1] = cov[:, 1, 0] = rho * std[:, 0] * std[:, 1]
    features = Moments(mean, cov=cov)
    fg = torch.distributions.MultivariateNormal(mean, cov).sample()
    log_var = head.noise_offset.detach() + head.noise_slope.detach() * fg[:, 1:]
    y = fg[:, :1] + (0.5 * log_var).exp() * torch.randn(n, 1, generator=g, dtype=torch.float64)
    levels = (0.5, 0.9, 0.99)
    mixture = head.predictive_mixture(features)
    coverage = central_interval_coverage(mixture, y, levels)
    # binomial standard error at n = 20,000 is at most 0.0036
    assert torch.allclose(coverage, torch.tensor(levels, dtype=torch.float64), atol=0.012)
    gaussian = central_interval_coverage(head.predict(features), y, (0.5,))
    assert float(gaussian[0]) > 0.55  # 0.62 at n = 40,000


def test_mixture_interval_rejects_bad_arguments():
    from pyro_gpn.metrics import central_interval_coverage, mixture_central_interval

    mean, var = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="weights must be"):
        mixture_central_interval(torch.ones(3) / 3, mean, var)
    with pytest.raises(ValueError, match="weights must be non-negative"):
        mixture_central_interval(torch.tensor([0.7, 0.7]), mean, var)
    with pytest.raises(ValueError, match="var must be positive"):
        mixture_central_interval(torch.ones(2) / 2, mean, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="var must have the shape"):
        mixture_central_interval(torch.ones(2) / 2, mean, torch.ones(2, 4))
    with pytest.raises(ValueError, match="level must lie"):
        mixture_central_interval(torch.ones(2) / 2, mean, var, 1.0)
    with pytest.raises(ValueError, match="a mixture prediction must be"):
        central_interval_coverage((torch.ones(2) / 2, mean), torch.zeros(3))


# ---------------------------------------------------------------------------------- bad input
def _probs_and_labels():
    probs = torch.softmax(torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), -1)
    return probs, torch.tensor([0, 1, 2, 1, 0])


@pytest.mark.parametrize("shift", [5, -5, 100])
@pytest.mark.parametrize(
    "metric", [classification_error, categorical_nll, expected_calibration_error]
)
def test_labels_out_of_range_are_refused_not_scored(metric, shift):
    # classification_error used to score them as errors (1.0), the calibration error as a
    # number, and categorical_nll raised torch's gather error
    probs, labels = _probs_and_labels()
    with pytest.raises(ValueError, match=r"labels must hold class labels in \[0, 3\)"):
        metric(probs, labels + shift)


def test_labels_out_of_range_are_refused_with_validation_off():
    from pyro_gpn import settings
    from pyro_gpn.metrics import reliability_diagram

    probs, labels = _probs_and_labels()
    with settings.validation(False), pytest.raises(ValueError, match="labels"):
        classification_error(probs, labels + 3)
    with pytest.raises(ValueError, match="labels"):
        reliability_diagram(probs, labels - 1)


@pytest.mark.parametrize(
    "call",
    [
        lambda: rmse(torch.zeros(0, 1), torch.zeros(0, 1)),
        lambda: mean_squared_error(torch.zeros(0), torch.zeros(0)),
        lambda: classification_error(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)),
        lambda: categorical_nll(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)),
        lambda: expected_calibration_error(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)),
        lambda: gaussian_log_likelihood(
            Moments(torch.zeros(0, 1), var=torch.ones(0, 1)), torch.zeros(0, 1)
        ),
    ],
    ids=["rmse", "mse", "error", "nll", "ece", "log_likelihood"],
)
def test_the_mean_over_no_samples_is_refused(call):
    # these returned NaN (the calibration error 0.0)
    with pytest.raises(ValueError, match="empty"):
        call()


def test_sums_over_no_samples_stay_zero():
    empty = torch.zeros(0, dtype=torch.long)
    assert float(classification_error(torch.zeros(0, 3), empty, reduction="sum")) == 0.0
    assert float(mean_squared_error(torch.zeros(0), torch.zeros(0), reduction="sum")) == 0.0


def test_nan_inputs_are_refused_while_validation_is_on():
    probs, labels = _probs_and_labels()
    with pytest.raises(ValueError, match="mean contains NaN"):
        rmse(torch.full((3, 1), math.nan), torch.zeros(3, 1))
    with pytest.raises(ValueError, match="target contains infinite"):
        rmse(torch.zeros(3, 1), torch.full((3, 1), math.inf))
    with pytest.raises(ValueError, match="probs contains NaN"):
        expected_calibration_error(probs * math.nan, labels)
    with pytest.raises(ValueError, match="scores contains NaN"):
        classification_error(probs * math.nan, labels)


def test_integer_regression_tensors_are_refused():
    # torch's mean() raised its own dtype error
    with pytest.raises(ValueError, match="mean must be a floating-point tensor"):
        rmse(torch.ones(3, 1, dtype=torch.long), torch.ones(3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="target must be a floating-point tensor"):
        rmse(torch.ones(3, 1), torch.ones(3, 1, dtype=torch.long))
    with pytest.raises(TypeError, match="labels must be a torch.Tensor"):
        classification_error(torch.ones(3, 2), [0, 1, 0])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
@pytest.mark.parametrize(
    "metric", [classification_error, categorical_nll, expected_calibration_error]
)
def test_narrow_integer_labels_are_scored(metric, dtype):
    """uint8 and int16 labels passed the check and crashed in gather()."""
    probs, labels = _probs_and_labels()
    torch.testing.assert_close(metric(probs, labels.to(dtype)), metric(probs, labels))
