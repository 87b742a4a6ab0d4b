"""Heads as likelihood objects: predictive moments, expected NLL, Pyro site, predictions."""

import math

import pyro
import pytest
import torch
from pyro import poutine

from pyro_gpn import GaussianHead, GPNNet, Moments, SoftmaxHead
from pyro_gpn.heads import HEADS, Prediction, make_head

DT = torch.float64


def _features(s=5, n=3, cov=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(s, n, dtype=DT, generator=g)
    if cov:
        root = 0.3 * torch.randn(s, n, n, dtype=DT, generator=g)
        return Moments(mean, cov=root @ root.mT + 1e-3 * torch.eye(n, dtype=DT))
    return Moments(mean, var=0.2 * torch.rand(s, n, dtype=DT, generator=g))


def test_gaussian_head_expected_nll_matches_monte_carlo():
    head = GaussianHead(3, noise_std_init=0.3, dtype=DT)
    features = _features()
    y = torch.randn(5, 3, dtype=DT)
    g = torch.Generator().manual_seed(1)
    draws = features.mean + features.var.sqrt() * torch.randn(200000, 5, 3, dtype=DT, generator=g)
    mc = -torch.distributions.Normal(draws, 0.3).log_prob(y).sum(-1).mean(0)
    with torch.no_grad():
        nll = head.expected_nll(features, y, reduction="none")
    torch.testing.assert_close(nll, mc, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("cov", [False, True], ids=["meanvar", "cov"])
@pytest.mark.parametrize("scale", [None, (1.0, 2.0, 0.5)], ids=["unscaled", "scaled"])
def test_gaussian_head_predictive_and_prediction_add_the_noise(cov, scale):
    """``F + eps``: the noise variance 0.25 added to every output's variance, times the
    predictive scale about the mean (each against a value written out, not the head's code)."""
    head = GaussianHead(3, noise_std_init=0.5, dtype=DT)
    s = torch.ones(3, dtype=DT)
    if scale is not None:
        s = torch.tensor(scale, dtype=DT)
        head.predictive_scale.copy_(s)
    features = _features(cov=cov)
    expected_var = (features.variance + 0.25) * s.square()
    predictive = head.predictive(features)
    torch.testing.assert_close(predictive.mean, features.mean)
    torch.testing.assert_close(predictive.variance, expected_var)
    if cov:
        expected_cov = (features.cov + 0.25 * torch.eye(3, dtype=DT)) * torch.outer(s, s)
        torch.testing.assert_close(predictive.cov, expected_cov)
    prediction = head.predict(features)
    assert prediction.task == "regression"
    torch.testing.assert_close(prediction.mean, features.mean)
    torch.testing.assert_close(prediction.std, expected_var.sqrt())
    with pytest.raises(AttributeError, match="classification"):
        _ = prediction.probs


def test_softmax_head_predict_matches_monte_carlo_in_the_small_variance_regime():
    torch.manual_seed(0)  # the readout's initial weights (4 of 30 seeds need atol 1e-2)
    head = SoftmaxHead(3, 4, dtype=DT)
    features = _features(cov=True)
    prediction = head.predict(features)
    torch.testing.assert_close(prediction.probs.sum(-1), torch.ones(5, dtype=DT))
    g = torch.Generator().manual_seed(2)
    chol = torch.linalg.cholesky(features.cov)
    eps = torch.randn(200000, 5, 3, 1, dtype=DT, generator=g)
    draws = features.mean + (chol @ eps).squeeze(-1)
    with torch.no_grad():
        probs = head.readout(draws).softmax(-1)
    # the unscented transform is exact to third order: close, not equal, to Monte Carlo
    torch.testing.assert_close(prediction.probs, probs.mean(0), atol=5e-3, rtol=0)
    torch.testing.assert_close(prediction.std, probs.std(0), atol=2e-2, rtol=0)


def test_softmax_head_point_mass_gives_softmax_and_zero_std():
    head = SoftmaxHead(3, 4, dtype=DT)
    mean = torch.randn(2, 3, dtype=DT)
    prediction = head.predict(Moments(mean))
    torch.testing.assert_close(prediction.probs, head.readout(mean).softmax(-1))
    assert bool((prediction.std == 0).all())


def test_softmax_head_observation_site_records_logits():
    head = SoftmaxHead(3, 4, dtype=DT)
    x, y = torch.randn(6, 3, dtype=DT), torch.tensor([0, 1, 2, 3, 0, 1])
    with pyro.plate("data", 6):
        trace = poutine.trace(head.observe).get_trace("obs", x, y)
    torch.testing.assert_close(trace.nodes["logits"]["value"], x @ head.weight + head.bias)
    expected = torch.distributions.Categorical(logits=x @ head.weight + head.bias).log_prob(y)
    torch.testing.assert_close(trace.nodes["obs"]["fn"].log_prob(y), expected)


def test_gaussian_head_marginal_observation_is_the_predictive_density():
    head = GaussianHead(2, noise_std_init=0.2, dtype=DT)
    mean, var = torch.randn(4, 2, dtype=DT), torch.rand(4, 2, dtype=DT)
    y = torch.randn(4, 2, dtype=DT)
    expected = torch.distributions.Normal(mean, (var + 0.04).sqrt()).log_prob(y).sum(-1)
    torch.testing.assert_close(head.marginal_observation(mean, var).log_prob(y), expected)


def test_prediction_from_draws():
    head = SoftmaxHead(2, 3, dtype=DT)
    logits = torch.randn(50, 4, 3, dtype=DT)
    prediction = head.predict_draws({"logits": logits}, "y")
    torch.testing.assert_close(prediction.probs, logits.softmax(-1).mean(0))
    gaussian = GaussianHead(2, dtype=DT).predict_draws({"y": logits[..., :2]}, "y")
    torch.testing.assert_close(gaussian.std, logits[..., :2].std(0))
    assert isinstance(gaussian, Prediction)


def test_network_takes_a_head_object_or_a_name():
    torch.manual_seed(0)
    head = SoftmaxHead(4, 3, unscented_kappa=1.0)
    net = GPNNet([2, 4, 3], head=head)
    assert net.head is head and net.num_classes == 3
    assert isinstance(GPNNet([2, 4, 3], head="softmax").head, SoftmaxHead)
    assert set(HEADS) == {"gaussian", "softmax"}
    with pytest.raises(ValueError, match="does not fit"):
        GPNNet([2, 4, 5], head=SoftmaxHead(4, 3))
    with pytest.raises(ValueError, match="head must be one of"):
        make_head("poisson", [2, 3])
    with pytest.raises(TypeError, match="head must be a name or a Head"):
        make_head(3, [2, 3])


def test_gaussian_network_owns_the_observation_noise_in_its_head():
    torch.manual_seed(0)
    net = GPNNet([2, 4, 1], head="gaussian", noise_std_init=0.3, share="layer")
    assert net.layers[-1].noise_std is None and net.layers[0].noise_std is not None
    assert net.head.noise_std.shape == (1,)
    assert math.isclose(float(net.noise_std.detach()), 0.3, rel_tol=1e-6)


def test_bad_targets_name_y():
    with pytest.raises(ValueError, match="y must have shape"):
        GaussianHead(2).check_target(torch.zeros(3, 1), 3)
    with pytest.raises(ValueError, match=r"y must hold class labels in \[0, 3\)"):
        SoftmaxHead(2, 3).check_target(torch.tensor([0, 3]), 2)
    with pytest.raises(ValueError, match="noise_std_init"):
        GaussianHead(2, noise_std_init=0.0)


def test_gaussian_head_observation_density_is_normal_with_std_sigma():
    """The Pyro site's density is ``prod_d N(y_d | F_d, sigma_d^2)``, by hand."""
    head = GaussianHead(3, noise_std_init=0.4, dtype=DT)
    with torch.no_grad():
        head.noise_std_unconstrained.copy_(torch.tensor([0.3, 0.5, 1.7], dtype=DT).log())
    g = torch.Generator().manual_seed(1)
    f = torch.randn(5, 3, dtype=DT, generator=g)
    y = f + torch.randn(5, 3, dtype=DT, generator=g)
    sigma = torch.tensor([0.3, 0.5, 1.7], dtype=DT)
    expected = (-0.5 * math.log(2 * math.pi) - sigma.log() - 0.5 * ((y - f) / sigma) ** 2).sum(-1)
    got = head.observation(f).log_prob(y)
    assert got.shape == (5,)
    torch.testing.assert_close(got, expected)
