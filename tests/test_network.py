"""GPNNet: shapes per head and mode, uncertain inputs, objective, validation."""

import math

import pytest
import torch

from pyro_gpn import GPNNet
from tests.mc import assert_mc_covariance, assert_mc_mean, assert_mc_variance

DT = torch.float64


@pytest.mark.parametrize("mode", ["mean", "meanvar", "cov"])
def test_softmax_head_shapes_and_logit_covariance(mode):
    torch.manual_seed(0)
    net = GPNNet([4, 6, 5, 3], mode=mode, head="softmax", dtype=DT)
    x = torch.rand(7, 4, dtype=DT)
    logits = net(x)
    assert logits.mean.shape == (7, 3)
    features = net.hidden(x)
    w, b = net.head.weight, net.head.bias
    torch.testing.assert_close(logits.mean, features.mean @ w + b)
    if mode == "mean":
        assert logits.is_deterministic and features.is_deterministic
    else:
        torch.testing.assert_close(logits.cov, w.mT @ features.covariance @ w)


@pytest.mark.parametrize("mode", ["mean", "meanvar", "cov"])
def test_gaussian_head_predictive_adds_observation_noise(mode):
    torch.manual_seed(0)
    net = GPNNet([2, 5, 2], mode=mode, head="gaussian", dtype=DT)
    x = torch.rand(4, 2, dtype=DT)
    response, predictive = net.hidden(x), net(x)
    torch.testing.assert_close(predictive.mean, response.mean)
    torch.testing.assert_close(predictive.variance, response.variance + net.noise_std.square())


def test_meanvar_and_cov_agree_on_the_mean_of_a_one_layer_net():
    torch.manual_seed(0)
    x = torch.rand(5, 3, dtype=DT)
    nets = {
        m: GPNNet([3, 4], mode=m, head="gaussian", dtype=DT) for m in ("mean", "meanvar", "cov")
    }
    state = nets["mean"].state_dict()
    for net in nets.values():
        net.load_state_dict(state)
    means = [nets[m](x).mean for m in nets]
    torch.testing.assert_close(means[0], means[1])
    torch.testing.assert_close(means[1], means[2])
    torch.testing.assert_close(
        nets["meanvar"](x).var, torch.diagonal(nets["cov"](x).cov, dim1=-2, dim2=-1)
    )


def test_uncertain_inputs_propagate_and_match_monte_carlo():
    """The model's promise: input variances raise the predictive variance, correctly."""
    torch.manual_seed(0)
    net = GPNNet([2, 3], mode="meanvar", head="gaussian", dtype=DT)
    layer = net.layers[0]
    x = torch.rand(3, 2, dtype=DT)
    x_var = torch.full((3, 2), 0.2, dtype=DT)
    with torch.no_grad():
        certain, uncertain = net(x), net(x, x_var)
        assert bool((uncertain.var > certain.var).all())
        g = torch.Generator().manual_seed(0)
        xs = x + x_var.sqrt() * torch.randn(60000, 3, 2, dtype=DT, generator=g)
        mean, var = layer.conditional((xs @ layer.weight).reshape(-1, 3))
        var = var + net.noise_std.square()  # the observation noise lives in the head
        mean, var = mean.reshape(60000, 3, 3), var.reshape(60000, 3, 3)
        ys = mean + var.sqrt() * torch.randn(mean.shape, dtype=DT, generator=g)
    assert_mc_mean(ys, uncertain.mean)
    assert_mc_variance(ys, uncertain.var)


def test_full_input_covariance_propagates_and_matches_monte_carlo():
    """``x_var [S, M, M]`` (documented: input covariances): in ``"cov"`` mode a one-layer
    network's output moments are exact for correlated Gaussian inputs (``a = x W`` is Gaussian
    with covariance ``W^T Sigma W``), so they match draws of ``x ~ N(x, Sigma)`` pushed through
    the layer's conditional and the head's noise, within 5 Monte Carlo s.e. per entry. The
    inputs' correlations (0.9, -0.8, -0.7) move the variances far from the diagonal's."""
    torch.manual_seed(0)
    net = GPNNet([3, 4], mode="cov", head="gaussian", dtype=DT)
    layer = net.layers[0]
    x = torch.rand(2, 3, dtype=DT)
    corr = torch.tensor([[1.0, 0.9, -0.8], [0.9, 1.0, -0.7], [-0.8, -0.7, 1.0]], dtype=DT)
    scale = torch.tensor([[0.5, 0.4, 0.6], [0.3, 0.6, 0.4]], dtype=DT)
    x_cov = scale.unsqueeze(-1) * corr * scale.unsqueeze(-2)
    with torch.no_grad():
        out = net(x, x_cov)
        xs = torch.distributions.MultivariateNormal(x, covariance_matrix=x_cov).sample((60000,))
        mean, var = layer.conditional((xs @ layer.weight).reshape(-1, 4))
        var = var + net.noise_std.square()  # the observation noise lives in the head
        mean, var = mean.reshape(60000, 2, 4), var.reshape(60000, 2, 4)
        g = torch.Generator().manual_seed(1)
        ys = mean + var.sqrt() * torch.randn(mean.shape, dtype=DT, generator=g)
    assert out.cov.shape == (2, 4, 4)
    assert_mc_mean(ys, out.mean)
    assert_mc_variance(ys, out.variance)
    assert_mc_covariance(ys, out.cov)


def test_mean_mode_treats_variances_as_zero():
    torch.manual_seed(0)
    net = GPNNet([2, 3, 2], mode="mean", head="softmax")
    x = torch.rand(3, 2)
    torch.testing.assert_close(net(x).mean, net(x, torch.ones(3, 2)).mean)


def test_objective_is_finite_and_differentiable():
    torch.manual_seed(0)
    for head, y in (("softmax", torch.tensor([0, 2, 1, 0])), ("gaussian", torch.randn(4, 2))):
        sizes = [3, 5, 3] if head == "softmax" else [3, 5, 2]
        net = GPNNet(sizes, head=head)
        loss = net.loss(torch.rand(4, 3), y) + net.penalty()
        loss.backward()
        assert math.isfinite(loss.item())
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_predict():
    torch.manual_seed(0)
    net = GPNNet([3, 4, 5], head="softmax")
    prediction = net.predict(torch.rand(6, 3))
    assert prediction.task == "classification"
    torch.testing.assert_close(prediction.probs.sum(-1), torch.ones(6))
    assert bool((prediction.std > 0).all())
    regression = GPNNet([3, 2], head="gaussian")
    x = torch.rand(2, 3)
    prediction = regression.predict(x)
    torch.testing.assert_close(prediction.mean, regression(x).mean)
    torch.testing.assert_close(prediction.std, regression(x).variance.sqrt())


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda n: n(torch.rand(2, 5)), "x must have 3 features"),
        (lambda n: n(torch.rand(2)), "x must have 2 dimensions"),
        (lambda n: n(torch.tensor([[0.0, math.nan, 0.0]])), "x contains NaN"),
        (lambda n: n(torch.rand(2, 3), -torch.ones(2, 3)), "x_var must be non-negative"),
        (lambda n: n(torch.rand(2, 3), torch.ones(2, 2)), "x_var must have shape"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call(GPNNet([3, 4, 2]))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sizes": [3, 2], "head": "softmax"}, "sizes must be at least 3"),
        ({"sizes": [3, 0, 2]}, "sizes must be"),
        ({"sizes": [2, True, 1]}, "sizes must be integers, got True"),
        ({"sizes": [2, True], "head": "gaussian"}, "sizes must be integers, got True"),
        ({"sizes": [3, 4, 2], "head": "poisson"}, "head must be one of"),
        ({"sizes": [3, 4, 2], "mode": "var"}, "mode must be one of"),
    ],
)
def test_bad_construction_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPNNet(**kwargs)


def test_layer_noise_and_the_gaussian_heads_noise_follow_the_options():
    # gaussian head: the last layer is noise-free (F^L) and the head holds sigma, initialised
    # from noise_std_init, one per output or one shared with share="layer"
    net = GPNNet([2, 3, 2], head="gaussian", noise_std_init=0.3, dtype=DT)
    assert net.layers[0].noise_std is not None and net.layers[-1].noise_std is None
    torch.testing.assert_close(net.noise_std, torch.tensor([0.3, 0.3], dtype=DT))
    shared = GPNNet([2, 3, 2], head="gaussian", noise_std_init=0.3, share="layer", dtype=DT)
    torch.testing.assert_close(shared.noise_std, torch.tensor([0.3], dtype=DT))
    # softmax head: every GPN layer, the last included, adds its output noise
    classifier = GPNNet([2, 3, 4], head="softmax", noise_std_init=0.3, dtype=DT)
    for layer in classifier.layers:
        torch.testing.assert_close(layer.noise_std, torch.full((3,), 0.3, dtype=DT))


def test_default_targets_are_the_inducing_points():
    # the recommended initialisation: U = V, an activation close to the identity
    net = GPNNet([2, 3, 2], head="gaussian", dtype=DT)
    for layer in net.layers:
        expected = torch.linspace(-2.0, 2.0, 14, dtype=DT).expand(layer.out_features, -1)
        torch.testing.assert_close(layer.response.targets.detach(), expected)


def test_penalty_defaults_are_the_papers_alpha_and_beta():
    # L_S = sum_l 0.1 mean(sigmoid(1e-3 / S_l)) (eq:gpn_ls): two layers with every S = 2e-3
    net = GPNNet([2, 3, 2], head="gaussian", target_variance_init=2e-3, dtype=DT)
    expected = 2 * 0.1 / (1 + math.exp(-1e-3 / 2e-3))
    assert net.penalty().item() == pytest.approx(expected, rel=1e-12)


def test_kl_divergence_is_the_sum_over_the_layers():
    from pyro_gpn.layers import VariationalGPNLayer

    torch.manual_seed(0)
    net = GPNNet([2, 3, 2], head="gaussian", layer=VariationalGPNLayer, dtype=DT)
    with torch.no_grad():  # move q(U) away from the prior: every layer's KL is positive
        for parameter in net.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    terms = [float(layer.kl_divergence().detach()) for layer in net.layers]
    assert all(term > 1e-3 for term in terms)
    assert float(net.kl_divergence().detach()) == pytest.approx(math.fsum(terms), rel=1e-12)
