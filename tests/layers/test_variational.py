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
    targets_kl = layer.kl_divergence() - layer.weight_kl_divergence()  # the q(U) part
    torch.testing.assert_close(targets_kl, expected)
    # and in the coordinates of the sample site, with the layer's own distributions
    site_kl = kl_divergence(layer.target_posterior(), layer.target_prior()).sum()
    torch.testing.assert_close(targets_kl, site_kl)
    assert targets_kl > 0


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
    """The paper's check: mu_hat = 0, Sigma_hat = K gives Khat = 0, mean 0, variance 1 + sigma^2
    (point weights: the KL is then that of q(U) alone)."""
    layer = _layer(whiten=whiten, weights="point")
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
    prior_like = VariationalGPNLayer(
        2, 3, targets_init="zero", targets_scale_init=1.0, dtype=DT, weights="point"
    )
    torch.testing.assert_close(prior_like.kl_divergence(), torch.tensor(0.0, dtype=DT))
    white = VariationalGPNLayer(
        2, 3, whiten=True, targets_init="zero", targets_scale_init=1.0, weights="point"
    )
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


# ---------------------------------------------------------------------- variational weights
def _wlayer(m=3, n=4, scale=0.4, seed=0, **kwargs):
    """A layer with ``q(W)`` of a non-trivial spread (``weight_scale`` ~ ``scale``)."""
    layer = _layer(m, n, seed=seed, **kwargs)
    with torch.no_grad():
        layer.weight_scale = (torch.rand(m, n, dtype=DT) + 0.5) * scale
    return layer


def test_weights_default_to_variational_and_point_keeps_the_paper():
    layer = VariationalGPNLayer(3, 2, dtype=DT)
    assert layer.variational_weights and layer.weight_scale.shape == (3, 2)
    point = VariationalGPNLayer(3, 2, dtype=DT, weights="point")
    assert not point.variational_weights and "weight_scale" not in dict(point.named_parameters())
    assert point.weight_kl_divergence() == 0
    assert "weights='point'" in repr(point)


@pytest.mark.parametrize("mode", ["meanvar", "cov"])
def test_activation_moments_match_monte_carlo(mode):
    """Moments of A = X W for Gaussian X (full covariance) and W ~ q(W), against sampling."""
    from pyro_gpn.layers.variational import activation_moments

    gen = torch.Generator().manual_seed(1)
    s, m, n, k = 3, 4, 3, 200_000
    mean = torch.randn(s, m, dtype=DT, generator=gen)
    root = torch.randn(s, m, m, dtype=DT, generator=gen) * 0.4
    cov = root @ root.mT + 0.05 * torch.eye(m, dtype=DT)
    loc = torch.randn(m, n, dtype=DT, generator=gen)
    var = torch.rand(m, n, dtype=DT, generator=gen) * 0.5 + 0.1
    inputs = Moments(mean, cov=cov)
    got = activation_moments(inputs if mode == "cov" else inputs.diagonal(), loc, var, mode)
    # every draw from the test's own generator (not the global one: the same draws whatever
    # ran before)
    eps = torch.randn(k, s, m, 1, dtype=DT, generator=gen)
    xs = mean + (torch.linalg.cholesky(cov) @ eps).squeeze(-1)  # [K, S, M]
    if mode == "meanvar":  # the diagonal mode sees independent inputs
        xs = mean + cov.diagonal(dim1=-2, dim2=-1).sqrt() * eps.squeeze(-1)
    # one W per draw, shared by samples
    ws = loc + var.sqrt() * torch.randn(k, m, n, dtype=DT, generator=gen)
    acts = xs @ ws  # [K, S, N]
    assert_mc_mean(acts, got.mean, n_se=4.5)
    assert_mc_variance(acts, got.variance, n_se=4.5)
    if mode == "cov":
        from tests.mc import assert_mc_covariance

        assert_mc_covariance(acts, got.cov, n_se=4.5)
    # the weights' variance is a visible part of the answer (the test can fail)
    point = activation_moments(inputs if mode == "cov" else inputs.diagonal(), loc, None, mode)
    assert (got.variance - point.variance).min() > 0.1


def test_activation_moments_of_point_weights_and_mean_mode_are_the_linear_map():
    from pyro_gpn.layers.variational import activation_moments

    x = torch.randn(5, 3, dtype=DT)
    loc, var = torch.randn(3, 2, dtype=DT), torch.rand(3, 2, dtype=DT)
    det = activation_moments(Moments(x), loc, var, "meanvar")
    torch.testing.assert_close(det.var, (x.square() @ var))  # deterministic inputs: E[x^2] v
    assert activation_moments(Moments(x), loc, var, "mean").is_deterministic
    torch.testing.assert_close(activation_moments(Moments(x), loc, None, "meanvar").mean, x @ loc)


@pytest.mark.parametrize("kwargs", [dict(), dict(share="layer", whiten=True)])
def test_propagate_with_variational_weights_matches_monte_carlo_over_q_w(kwargs):
    """Observed inputs: the layer's output moments under q(W) q(U) are exact; compare with
    W drawn from q(W) and the conditional response given the activation (law of total
    variance)."""
    layer = _wlayer(**kwargs)
    x = torch.rand(5, 3, dtype=DT) * 2 - 1
    k = 100_000
    ws = layer.weight_posterior().sample((k,))  # [K, 3, 4]
    acts = (x @ ws).reshape(-1, layer.out_features)  # [K * 5, 4]
    with torch.no_grad():
        mean, var = layer.conditional(acts, noise=True)
        got = layer.propagate(x)
    mean, var = mean.reshape(k, 5, -1), var.reshape(k, 5, -1)
    total_mean = mean.mean(0)
    total_var = var.mean(0) + mean.var(0)
    se_mean = (var.mean(0) + mean.var(0)).sqrt() / k**0.5
    assert ((total_mean - got.mean).abs() < 4.5 * se_mean).all()
    torch.testing.assert_close(total_var, got.var, rtol=0.03, atol=1e-3)
    # and the weights' spread matters here (otherwise the test could not fail)
    point = layer.propagate(Moments(x), mode="mean")
    assert (got.var - layer.noise_std.square()).max() > 0.05
    assert (total_mean - point.mean).abs().max() > 0.01


def test_weight_kl_equals_torch_kl_divergence_and_enters_the_layer_kl():
    layer = _wlayer(m=5, n=3)
    q = torch.distributions.Normal(layer.weight, layer.weight_scale)
    p = torch.distributions.Normal(torch.zeros_like(layer.weight), 1 / 5**0.5)
    expected = kl_divergence(q, p).sum()
    torch.testing.assert_close(layer.weight_kl_divergence(), expected)
    torch.testing.assert_close(
        kl_divergence(layer.weight_posterior(), layer.weight_prior()).sum(), expected
    )
    targets_kl = kl_divergence(layer.target_posterior(), layer.target_prior()).sum()
    torch.testing.assert_close(layer.kl_divergence(), targets_kl + expected)
    wide = VariationalGPNLayer(5, 3, dtype=DT, weight_prior_scale=3.0)
    assert wide.weight_prior().scale[0, 0] == pytest.approx(3.0 / 5**0.5)


def test_tiny_weight_variance_is_the_point_layer():
    """q(W) of vanishing spread gives the point-weight layer's moments (float64, 1e-10)."""
    point = _layer(weights="point")
    tiny = _layer()
    with torch.no_grad():
        tiny.weight_scale = torch.full_like(tiny.weight, 1e-9)
    x = Moments(torch.randn(6, 3, dtype=DT), var=torch.rand(6, 3, dtype=DT) * 0.1)
    for mode in ("meanvar", "cov"):
        a, b = point.propagate(x, mode), tiny.propagate(x, mode)
        torch.testing.assert_close(a.mean, b.mean, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(a.covariance, b.covariance, rtol=1e-8, atol=1e-10)


def test_variational_weights_in_float32_agree_with_float64():
    """float32 parameters (the GP algebra in float64) give the float64 moments to 1e-5."""
    layer64 = _wlayer()
    layer32 = VariationalGPNLayer(3, 4, num_inducing=6, dtype=torch.float32)
    layer32.load_state_dict({k: v.float() for k, v in layer64.state_dict().items()})
    x = torch.rand(7, 3, dtype=DT) * 4 - 2
    with torch.no_grad():
        a, b = layer64.propagate(x), layer32.propagate(x.float())
    assert b.mean.dtype == torch.float32
    torch.testing.assert_close(b.mean.double(), a.mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.var.double(), a.var, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(weights="bayes"), "weights"),
        (dict(weight_prior_scale=0.0), "weight_prior_scale"),
        (dict(weight_prior_scale="empirical-bayes"), "weight_prior_scale"),
        (dict(weight_prior_scale=True), "weight_prior_scale"),
        (dict(weight_scale_init=-1.0), "weight_scale_init"),
        (dict(weight_scale_init=float("nan")), "weight_scale_init"),
    ],
)
def test_invalid_weight_options_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        VariationalGPNLayer(2, 3, **kwargs)
    with pytest.raises(ValueError, match="weights"):
        VariationalGPNLayer(2, 3, weights="point", dtype=DT).weight_posterior()


def test_empirical_prior_scale_maximises_the_elbo_over_the_prior_scale():
    """``weight_prior_scale="empirical"``: the weight KL equals the fixed-prior KL at the scale
    that minimises it, found independently by scipy over torch's own KL, and is below it at
    any other scale; its gradients in ``q(W)`` pass gradcheck (float64)."""
    from scipy.optimize import minimize_scalar

    torch.manual_seed(3)
    layer = VariationalGPNLayer(5, 3, num_inducing=6, dtype=DT, weight_prior_scale="empirical")
    with torch.no_grad():
        layer.weight.copy_(0.7 * torch.randn(5, 3, dtype=DT))
        layer.weight_scale = 0.05 + 0.3 * torch.rand(5, 3, dtype=DT)
    q = layer.weight_posterior()

    def fixed_kl(scale: float) -> float:
        p = torch.distributions.Normal(torch.zeros_like(layer.weight), scale)
        return float(kl_divergence(q, p).sum().detach())

    best = minimize_scalar(
        fixed_kl, bounds=(1e-3, 10.0), method="bounded", options={"xatol": 1e-10}
    )
    assert float(layer.weight_prior_std().detach()) == pytest.approx(best.x, rel=1e-6)
    assert float(layer.weight_kl_divergence().detach()) == pytest.approx(best.fun, rel=1e-10)
    for other in (0.5 * best.x, 2.0 * best.x, 1.0 / 5**0.5):
        assert fixed_kl(other) > float(layer.weight_kl_divergence().detach())
    torch.testing.assert_close(
        kl_divergence(q, layer.weight_prior()).sum(), layer.weight_kl_divergence()
    )
    assert layer.weight_prior_scale == "empirical"
    # the prior's scale depends on q(W): the gradients through it pass gradcheck

    class _WeightKL(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self):
            return self.layer.weight_kl_divergence()

    wrapper = _WeightKL(layer)
    names = ["layer.weight", "layer.weight_scale_unconstrained"]
    params = dict(wrapper.named_parameters())
    inputs = tuple(params[n].detach().clone().requires_grad_() for n in names)
    with pyro.settings.context(module_local_params=True):

        def fn(*values):
            return functional_call(wrapper, dict(zip(names, values, strict=True)), ())

        grads = torch.autograd.grad(fn(*inputs), inputs)
        assert all(g.abs().sum() > 0 for g in grads)  # the substitution reaches the KL
        assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("whiten", ["yes", "false", 1, 0.0])
def test_whiten_must_be_a_bool(whiten):
    """A string would be read by its truth value (``"false"`` whitens)."""
    with pytest.raises(ValueError, match="whiten must be True, False or None"):
        VariationalGPNLayer(3, 2, whiten=whiten)


def test_whiten_takes_numpy_bools():
    import numpy as np

    from pyro_gpn.layers.variational import check_whiten

    check_whiten(np.bool_(True))
    assert VariationalGPNLayer(2, 3, whiten=np.bool_(False)).whiten is False
    with pytest.raises(ValueError, match="whiten must be True, False or None"):
        check_whiten("yes")


@pytest.mark.parametrize("q_cov", ["full", "diag"])
@pytest.mark.parametrize("whiten", [False, True])
def test_initial_q_marginal_variances_are_a_fraction_of_the_prior(q_cov, whiten):
    """``targets_scale_init = c``: the initial q(U) has marginal variances ``c^2 diag(K)``
    (every parametrisation). A large jitter makes ``diag(K) = 1 + jitter`` differ from its
    square root, so a variance initialised as a standard deviation is seen."""
    torch.manual_seed(0)
    c, jitter = 0.3, 0.5
    layer = VariationalGPNLayer(
        2,
        3,
        num_inducing=5,
        q_cov=q_cov,
        whiten=whiten,
        targets_scale_init=c,
        jitter=jitter,
        targets_init="zero",
        weights="point",
        dtype=DT,
    )
    _, cov = _unwhitened_q(layer)
    expected = torch.full((3, 5), c**2 * (1 + jitter), dtype=DT)  # diag of the SE gram + jitter
    torch.testing.assert_close(torch.diagonal(cov, dim1=-2, dim2=-1), expected)
    if q_cov == "full":  # Sigma_hat = c^2 K, off-diagonal terms included
        torch.testing.assert_close(cov, c**2 * _gram(layer))


@pytest.mark.parametrize("kwargs", VARIANTS)
def test_factored_weights_reassemble_khat_and_k(kwargs):
    """The factors of the float32 path: ``L L^T = K`` and ``L^-T M L^-1 = K^-1 - K^-1 Sigma_hat
    K^-1`` (``M = I - B B^T``, not ``I - B^T B``), against K and q(U) rebuilt by hand."""
    layer = _layer(**kwargs)
    beta, khat, chol, inner = layer.response_factored_weights()
    loc, cov = _unwhitened_q(layer)
    gram = _gram(layer)
    kinv = torch.linalg.inv(gram)
    torch.testing.assert_close(chol @ chol.mT, gram)
    torch.testing.assert_close(beta, (kinv @ loc.unsqueeze(-1)).squeeze(-1))
    expected = kinv - kinv @ cov @ kinv
    torch.testing.assert_close(khat, expected)
    linv = torch.linalg.inv(chol)
    torch.testing.assert_close(linv.mT @ inner @ linv, expected)


def test_target_conditional_noise_adds_the_noise_variance():
    """``noise=True`` adds ``sigma^2`` (not ``sigma``) to the GP conditional's variance."""
    layer = _layer()
    a = torch.randn(5, 4, dtype=DT)
    _, var = layer.target_conditional(a, layer.targets_loc)
    _, noisy = layer.target_conditional(a, layer.targets_loc, noise=True)
    sigma = layer.noise_std.detach()
    assert bool((sigma < 0.3).all())  # sigma^2 and sigma differ clearly
    torch.testing.assert_close(noisy - var, (sigma**2).expand(5, 4))
