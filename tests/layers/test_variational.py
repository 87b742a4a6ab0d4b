"""VariationalGPNLayer: KL, response weights, the paper's consistency checks, Monte Carlo."""

import pyro
import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence
from torch.func import functional_call

from pyro_gpn import Moments
from pyro_gpn.layers.variational import VariationalGPNLayer
from tests.mc import assert_mc_mean, assert_mc_variance

DT = torch.float64
VARIANTS = [
    dict(q_cov="full", whiten=False),
    dict(q_cov="full", whiten=True),
    dict(q_cov="diag", whiten=False),
    dict(q_cov="diag", whiten=True),
    dict(q_cov="full", whiten=False, share="layer"),
    dict(q_cov="diag", whiten=True, share="layer"),
]


def _layer(m=3, n=4, seed=0, num_inducing=6, **kwargs):
    """A layer with random, non-default parameters (float64)."""
    torch.manual_seed(seed)
    layer = VariationalGPNLayer(m, n, num_inducing=num_inducing, dtype=DT, **kwargs)
    g, r = layer.num_functions, layer.num_inducing
    with torch.no_grad():
        layer.lengthscales = torch.rand(g, dtype=DT) * 0.5 + 0.6
        layer.noise_std = torch.rand(g, dtype=DT) * 0.2 + 0.05
        layer.targets_loc.copy_(torch.randn(g, r, dtype=DT))
        if layer.q_cov == "full":
            tril = torch.randn(g, r, r, dtype=DT).tril(-1) * 0.3
            layer.targets_scale_tril = tril + torch.diag_embed(
                torch.rand(g, r, dtype=DT) * 0.5 + 0.1
            )
        else:
            layer.targets_scale = torch.rand(g, r, dtype=DT) * 0.5 + 0.1
    return layer


def _unwhitened_q(layer):
    """mu_hat [G, R] and Sigma_hat [G, R, R] of q(U), whatever the parametrisation."""
    loc, tril = layer.targets_loc, layer.variational_scale_tril()
    if layer.whiten:
        chol = layer.prior_scale_tril()
        loc, tril = (chol @ loc.unsqueeze(-1)).squeeze(-1), chol @ tril
    return loc, tril @ tril.mT


def _gram(layer):
    v, ls = layer.inducing_points, layer.lengthscales
    k = torch.exp(-((v[:, :, None] - v[:, None, :]) ** 2) / (2 * ls[:, None, None] ** 2))
    return k + layer.jitter * torch.eye(layer.num_inducing, dtype=DT)


@pytest.mark.parametrize("kwargs", VARIANTS)
def test_kl_equals_torch_kl_divergence(kwargs):
    layer = _layer(**kwargs)
    loc, cov = _unwhitened_q(layer)
    q = MultivariateNormal(loc, covariance_matrix=cov)
    p = MultivariateNormal(torch.zeros_like(loc), covariance_matrix=_gram(layer))
    expected = kl_divergence(q, p).sum()
    torch.testing.assert_close(layer.kl_divergence(), expected)
    # and in the coordinates of the sample site, with the layer's own distributions
    site_kl = kl_divergence(layer.target_posterior(), layer.target_prior()).sum()
    torch.testing.assert_close(layer.kl_divergence(), site_kl)
    assert layer.kl_divergence() > 0


@pytest.mark.parametrize("kwargs", VARIANTS)
def test_response_weights_are_the_papers_beta_and_khat(kwargs):
    layer = _layer(**kwargs)
    loc, cov = _unwhitened_q(layer)
    kinv = torch.linalg.inv(_gram(layer))
    beta, khat = layer.response_weights()
    torch.testing.assert_close(beta, (kinv @ loc.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(khat, kinv - kinv @ cov @ kinv)


@pytest.mark.parametrize("whiten", [False, True])
@pytest.mark.parametrize("mode", ["meanvar", "cov"])
def test_q_equal_to_prior_gives_the_gp_prior(whiten, mode):
    """The paper's check: mu_hat = 0, Sigma_hat = K gives Khat = 0, mean 0, variance 1 + sigma^2."""
    layer = _layer(whiten=whiten)
    with torch.no_grad():
        layer.targets_loc.zero_()
        layer.targets_scale_tril = (
            torch.eye(layer.num_inducing, dtype=DT).expand(4, -1, -1)
            if whiten
            else layer.prior_scale_tril()
        )
    beta, khat = layer.response_weights()
    torch.testing.assert_close(khat, torch.zeros_like(khat), atol=1e-9, rtol=0)
    torch.testing.assert_close(
        layer.kl_divergence(), torch.tensor(0.0, dtype=DT), atol=1e-9, rtol=0
    )
    x = torch.randn(7, 3, dtype=DT)
    for inputs in (x, Moments(x, var=torch.rand(7, 3, dtype=DT))):
        out = layer.propagate(inputs, mode)
        torch.testing.assert_close(out.mean, torch.zeros(7, 4, dtype=DT), atol=1e-9, rtol=0)
        expected = (1 + layer.noise_std.square()).expand(7, 4)
        torch.testing.assert_close(out.variance, expected, atol=1e-8, rtol=0)


@pytest.mark.parametrize("whiten", [False, True])
def test_zero_variance_q_is_gp_regression_on_the_targets(whiten):
    """Sigma_hat -> 0: Khat = K^-1, the conditional is GP regression on (V, mu_hat)."""
    layer = _layer(whiten=whiten)
    with torch.no_grad():
        layer.targets_scale_tril = 1e-7 * torch.eye(layer.num_inducing, dtype=DT).expand(4, -1, -1)
    loc, _ = _unwhitened_q(layer)
    a = torch.randn(9, 4, dtype=DT) * 1.5
    mean, var = layer.conditional(a, noise=False)
    gram = _gram(layer)
    for n in range(4):
        v, ls = layer.inducing_points[n], layer.lengthscales[n]
        kav = torch.exp(-((a[:, n, None] - v[None]) ** 2) / (2 * ls**2))
        torch.testing.assert_close(mean[:, n], kav @ torch.linalg.solve(gram[n], loc[n]))
        expected = 1 - (kav @ torch.linalg.solve(gram[n], kav.T)).diagonal()
        torch.testing.assert_close(var[:, n], expected, atol=1e-10, rtol=1e-6)


@pytest.mark.parametrize("kwargs", VARIANTS[:4])
def test_marginal_conditional_matches_sampled_targets(kwargs):
    """q(f | a) (through the core) = the average over U ~ q of p(f | a, U), by Monte Carlo."""
    layer = _layer(**kwargs)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(5, 4, dtype=DT, generator=gen)
    count = 20000
    q = layer.target_posterior()
    with torch.no_grad():
        targets = q.sample((count, 1))  # [P, 1, N, R]: plate-aligned particles
        mean_u, var_u = layer.target_conditional(a, targets)  # [P, 5, 4]
        f = mean_u + var_u.sqrt() * torch.randn(mean_u.shape, dtype=DT, generator=gen)
        mean, var = layer.conditional(a, noise=False)
    assert_mc_mean(f, mean, n_se=4.5)
    assert_mc_variance(f, var, n_se=4.5)


def test_target_conditional_broadcasts_over_particles():
    layer = _layer()
    a = torch.randn(6, 4, dtype=DT)
    targets = torch.randn(3, 1, 4, layer.num_inducing, dtype=DT)
    mean, var = layer.target_conditional(a, targets, noise=True)
    assert mean.shape == var.shape == (3, 6, 4)
    for p in range(3):
        m, v = layer.target_conditional(a, targets[p, 0], noise=True)
        torch.testing.assert_close(mean[p], m)
        torch.testing.assert_close(var[p], v)
    # given U = mu_hat and Sigma_hat = 0 the two conditionals agree
    m_u, v_u = layer.target_conditional(a, layer.targets_loc)
    with torch.no_grad():
        layer.targets_scale_tril = torch.zeros_like(layer.targets_scale_tril)
    m_q, v_q = layer.conditional(a, noise=False)
    torch.testing.assert_close(m_u, m_q)
    torch.testing.assert_close(v_u, v_q)


def test_initialisation():
    torch.manual_seed(0)
    prior_like = VariationalGPNLayer(2, 3, targets_init="zero", targets_scale_init=1.0, dtype=DT)
    torch.testing.assert_close(prior_like.kl_divergence(), torch.tensor(0.0, dtype=DT))
    white = VariationalGPNLayer(2, 3, whiten=True, targets_init="zero", targets_scale_init=1.0)
    assert abs(white.kl_divergence().item()) < 1e-5
    ident = VariationalGPNLayer(2, 3, targets_init="identity", targets_scale_init=1e-3, dtype=DT)
    a = torch.linspace(-1.5, 1.5, 11, dtype=DT)[:, None].expand(-1, 3)
    mean, _ = ident.conditional(a)
    torch.testing.assert_close(mean, a, atol=2e-2, rtol=0)  # 1.1e-2 measured at 1.5
    for whiten in (False, True):
        ident_w = VariationalGPNLayer(2, 3, whiten=whiten, targets_init="identity", dtype=DT)
        torch.testing.assert_close(ident_w.response_weights()[0], ident.response_weights()[0])
    diag = VariationalGPNLayer(2, 3, q_cov="diag", targets_scale_init=0.5, dtype=DT)
    assert diag.targets_scale.shape == (3, 14)
    assert not hasattr(diag, "targets_scale_tril")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(q_cov="banded"),
        dict(targets_init="ones"),
        dict(targets_scale_init=0.0),
        dict(jitter=-1.0),
    ],
)
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        VariationalGPNLayer(2, 3, **kwargs)


class _KLAndMoments(torch.nn.Module):
    """Wraps a layer so that torch.func.functional_call can substitute its parameters."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, x_var):
        out = self.layer.propagate(Moments(x, var=x_var), "meanvar")
        return self.layer.kl_divergence(), out.mean, out.var


@pytest.mark.parametrize("kwargs", VARIANTS[:4])
def test_gradcheck_kl_and_propagation_wrt_variational_parameters(kwargs):
    layer = _layer(m=2, n=2, num_inducing=4, **kwargs)
    scale = "targets_scale_tril" if layer.q_cov == "full" else "targets_scale"
    names = ["layer.response.targets_loc", f"layer.response.{scale}_unconstrained"]
    inputs = tuple(
        dict(_KLAndMoments(layer).named_parameters())[n].detach().clone().requires_grad_()
        for n in names
    )
    x, x_var = torch.randn(3, 2, dtype=DT), torch.rand(3, 2, dtype=DT)
    wrapper = _KLAndMoments(layer)
    with pyro.settings.context(module_local_params=True):

        def fn(*params):
            return functional_call(wrapper, dict(zip(names, params, strict=True)), (x, x_var))

        total = sum(out.sum() for out in fn(*inputs))
        grads = torch.autograd.grad(total, inputs)
        assert all(g.abs().sum() > 0 for g in grads)  # the substitution reaches the outputs
        assert torch.autograd.gradcheck(fn, inputs)
