"""GPNLayer: the conditional, exact first layer, Monte Carlo agreement, sharing, validation."""

import math

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

from pyro_gpn import GPNLayer, Moments
from tests.mc import assert_mc_covariance, assert_mc_mean, assert_mc_variance, random_covariance

DT = torch.float64


def _layer(m=3, n=4, seed=0, **kwargs):
    torch.manual_seed(seed)
    layer = GPNLayer(m, n, dtype=DT, **kwargs)
    with torch.no_grad():  # random, non-default parameters
        layer.lengthscales = torch.rand(layer.num_functions, dtype=DT) * 0.5 + 0.4
        layer.noise_std = torch.rand(layer.num_functions, dtype=DT) * 0.2 + 0.05
        layer.target_variances = (
            torch.rand(layer.num_functions, layer.num_inducing, dtype=DT) * 0.3 + 0.05
        )
    return layer


def _sample_outputs(layer, x, generator, noise=True):
    """Draw the layer's outputs given inputs x [..., M] from the exact conditional."""
    mean, var = layer.conditional((x @ layer.weight).reshape(-1, layer.out_features), noise=noise)
    mean, var = mean.reshape(*x.shape[:-1], -1), var.reshape(*x.shape[:-1], -1)
    return mean + var.sqrt() * torch.randn(mean.shape, dtype=DT, generator=generator)


def test_conditional_is_gp_regression_on_the_virtual_observations():
    layer = _layer(targets_init="random")
    a = torch.randn(6, 4, dtype=DT)
    mean, var = layer.conditional(a)
    for n in range(4):
        v, u, s = layer.inducing_points[n], layer.targets[n], layer.target_variances[n]
        ls, sigma = layer.lengthscales[n], layer.noise_std[n]
        k = lambda p, q, ls=ls: torch.exp(-((p[:, None] - q[None]) ** 2) / (2 * ls**2))
        gram = k(v, v) + torch.diag(s + layer.jitter)
        kav = k(a[:, n], v)
        torch.testing.assert_close(mean[:, n], kav @ torch.linalg.solve(gram, u))
        expected = 1 - (kav @ torch.linalg.solve(gram, kav.T)).diagonal() + sigma**2
        torch.testing.assert_close(var[:, n], expected)


def test_first_layer_with_deterministic_inputs_is_exact():
    layer = _layer()
    x = torch.randn(5, 3, dtype=DT)
    mean, var = layer.conditional(x @ layer.weight)
    for mode in ("mean", "meanvar", "cov"):
        out = layer.propagate(x, mode)
        torch.testing.assert_close(out.mean, mean)
        if mode != "mean":
            torch.testing.assert_close(out.variance, var)
    cov = layer.propagate(x, "cov").cov
    torch.testing.assert_close(cov, torch.diag_embed(var))


@pytest.mark.parametrize("share", ["none", "layer"])
def test_gaussian_inputs_match_monte_carlo(share):
    layer = _layer(share=share)
    g = torch.Generator().manual_seed(3)
    mean, cov = torch.randn(2, 3, dtype=DT, generator=g), random_covariance(2, 3, generator=g)
    x = mean + (
        torch.linalg.cholesky(cov) @ torch.randn(60000, 2, 3, 1, dtype=DT, generator=g)
    ).squeeze(-1)
    y = _sample_outputs(layer, x, g)
    with torch.no_grad():
        full = layer.propagate(Moments(mean, cov=cov), "cov")
        diag_in = Moments(mean, var=torch.diagonal(cov, dim1=-2, dim2=-1))
        meanvar = layer.propagate(diag_in, "meanvar")
    assert_mc_mean(y, full.mean)
    assert_mc_covariance(y, full.cov)
    # meanvar drops the input correlations: compare it with independent inputs
    xd = mean + diag_in.var.sqrt() * torch.randn(60000, 2, 3, dtype=DT, generator=g)
    yd = _sample_outputs(layer, xd, g)
    assert_mc_mean(yd, meanvar.mean)
    assert_mc_variance(yd, meanvar.var)


def test_two_layers_central_limit_approximation_is_close():
    """Layer-2 activations are not exactly Gaussian; the approximation must still be close."""
    torch.manual_seed(0)
    first, second = GPNLayer(3, 10, dtype=DT), GPNLayer(10, 2, dtype=DT)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(4, 3, dtype=DT, generator=g)
    samples = _sample_outputs(second, _sample_outputs(first, x.expand(40000, 4, 3), g), g)
    with torch.no_grad():
        closed = second.propagate(first.propagate(x, "cov"), "cov")
    mc_mean, mc_var = samples.mean(0), samples.var(0)
    scale = mc_var.sqrt()
    assert ((closed.mean - mc_mean).abs() / scale).max() < 0.1
    rel_var = (torch.diagonal(closed.cov, dim1=-2, dim2=-1) / mc_var - 1).abs()
    assert rel_var.max() < 0.1


def test_identity_init_is_close_to_identity_inside_the_inducing_range():
    layer = GPNLayer(1, 3, targets_init="identity", dtype=DT)
    a = torch.linspace(-1.5, 1.5, 31, dtype=DT)[:, None].expand(31, 3)
    mean, _ = layer.conditional(a)
    # GP smoothing with S = sqrt(0.1) shrinks the slope a little: the fit is close, not exact
    assert (mean - a).abs().max() < 0.15
    slope = (mean[16:] - mean[15:-1]) / (a[16:] - a[15:-1])
    assert bool(((slope > 0.8) & (slope < 1.2)).all())


def test_layer_sharing_really_shares():
    layer = GPNLayer(3, 5, share="layer")
    assert layer.targets.shape == (1, 14) and layer.target_variances.shape == (1, 14)
    assert layer.lengthscales.shape == (1,) and layer.inducing_points.shape == (1, 14)
    a = torch.linspace(-2, 2, 7)[:, None].expand(7, 5)
    mean, var = layer.conditional(a)
    torch.testing.assert_close(mean, mean[:, :1].expand(7, 5))
    per_unit = sum(p.numel() for p in GPNLayer(3, 5).parameters())
    shared = sum(p.numel() for p in layer.parameters())
    assert per_unit - shared == 4 * (14 + 14 + 1 + 1)


def test_parameters_stay_positive_and_inducing_points_fixed_by_default():
    layer = GPNLayer(2, 3)
    assert "inducing_points" not in dict(layer.named_parameters())
    with torch.no_grad():
        layer.target_variances_unconstrained.fill_(-50.0)
    assert bool((layer.target_variances > 0).all())
    learn = GPNLayer(2, 3, learn_inducing=True)
    assert "inducing_points" in dict(learn.named_parameters())


def test_gradcheck_layer_propagation():
    layer = _layer(m=2, n=3, num_inducing=4, learn_inducing=True)
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(2, 2, dtype=DT, generator=g, requires_grad=True)
    cov = random_covariance(2, 2, generator=g).requires_grad_()
    params = [
        layer.weight,
        layer.inducing_points,
        layer.targets,
        layer.target_variances_unconstrained,
        layer.lengthscales_unconstrained,
        layer.noise_std_unconstrained,
    ]

    def fn(m, c, *_):
        out = layer.propagate(Moments(m, cov=0.5 * (c + c.mT), validate=False), "cov")
        var_out = layer.propagate(
            Moments(m, var=torch.diagonal(c, dim1=-2, dim2=-1), validate=False), "meanvar"
        )
        return out.mean, out.cov, var_out.var

    assert gradcheck(fn, [mean, cov, *params])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda l: l.propagate(torch.zeros(2, 4)), "inputs must have 3 features"),
        (lambda l: l.propagate(torch.full((2, 3), math.nan)), "inputs contains NaN"),
        (lambda l: l.propagate(torch.zeros(2, 3), mode="full"), "mode must be one of"),
        (lambda l: l.conditional(torch.zeros(2, 3)), "activations must have shape"),
        (lambda l: l.conditional(torch.full((2, 4), math.inf)), "activations contains infinite"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call(GPNLayer(3, 4))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"share": "unit"}, "share must be one of"),
        ({"targets_init": "tanh"}, "targets_init must be one of"),
        ({"num_inducing": 0}, "num_inducing must be a positive integer"),
        ({"lengthscale_init": -1.0}, "lengthscale_init must be positive"),
        ({"target_variance_init": 0.0}, "target_variance_init must be positive"),
    ],
)
def test_bad_construction_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPNLayer(3, 4, **kwargs)


def test_default_target_variance_and_fixed_variances():
    # the paper's S = sqrt(0.1) per virtual observation; learn_target_variances=False keeps
    # them out of the parameters
    layer = GPNLayer(2, 3, num_inducing=5, dtype=torch.float64)
    torch.testing.assert_close(
        layer.target_variances.detach(), torch.full((3, 5), math.sqrt(0.1), dtype=torch.float64)
    )
    fixed = GPNLayer(2, 3, num_inducing=5, learn_target_variances=False, dtype=torch.float64)
    names = {name for name, _ in fixed.named_parameters()}
    assert not any("target_variances" in name for name in names)
    assert any("target_variances" in name for name, _ in layer.named_parameters())


def test_jitter_enters_the_virtual_observation_solve():
    # mu(a) = k(a, V) (K(V, V) + diag(S) + jitter I)^-1 U, written out with NumPy; a large
    # jitter so that it matters
    layer = GPNLayer(1, 1, num_inducing=4, jitter=0.5, targets_init="identity", dtype=torch.float64)
    v = np.linspace(-2.0, 2.0, 4)
    ls = 0.4
    gram = np.exp(-((v[:, None] - v[None, :]) ** 2) / (2 * ls**2))
    gram += np.eye(4) * (math.sqrt(0.1) + 0.5)
    a = np.array([-1.0, 0.3, 1.7])
    k = np.exp(-((a[:, None] - v[None, :]) ** 2) / (2 * ls**2))
    expected = k @ np.linalg.solve(gram, v)
    mean, _ = layer.conditional(torch.tensor(a)[:, None])
    np.testing.assert_allclose(mean.detach().numpy()[:, 0], expected, rtol=1e-10)
