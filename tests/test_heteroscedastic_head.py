"""The heteroscedastic Gaussian head: its closed-form expected NLL, predictive mixture and
density against Monte Carlo and numerical integration, gradients, networks built on it, and a
fit that must find input-dependent noise."""

import math

import pytest
import torch
from scipy import integrate

from pyro_gpn import Moments
from pyro_gpn.heads import GaussianHead, HeteroscedasticGaussianHead, make_head
from pyro_gpn.losses import heteroscedastic_expected_nll
from pyro_gpn.models import VariationalGPN
from tests.mc import assert_mc_mean

DT = torch.float64


pytestmark = pytest.mark.usefixtures("fresh_param_store")


def _head(offset=-1.0, slope=1.3, num_outputs=1, **kwargs):
    head = HeteroscedasticGaussianHead(num_outputs, dtype=DT, **kwargs)
    with torch.no_grad():
        head.noise_offset.fill_(offset)
        head.noise_slope.fill_(slope)
    return head


def _pair_moments(corr: float, var_f=0.3, var_h=0.8, s=4, seed=0):
    """Features ``[S, 2]`` (output, noise feature) with a full covariance of correlation
    ``corr``."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(s, 2, dtype=DT, generator=g)
    c = corr * math.sqrt(var_f * var_h)
    cov = torch.tensor([[var_f, c], [c, var_h]], dtype=DT).expand(s, 2, 2).clone()
    return Moments(mean, cov=cov)


@pytest.mark.parametrize("corr", [0.0, 0.6, -0.95])
def test_expected_nll_matches_monte_carlo(corr):
    """Exact closed form (tilted Gaussian) within 5 standard errors of 400k joint draws, with a
    strong correlation between the output and the log noise variance."""
    head = _head()
    features = _pair_moments(corr)
    y = torch.tensor([[0.5], [-1.0], [2.0], [0.0]], dtype=DT)
    g = torch.Generator().manual_seed(1)
    chol = torch.linalg.cholesky(features.cov)
    z = torch.randn(400_000, 4, 2, 1, dtype=DT, generator=g)
    draws = features.mean + (chol @ z).squeeze(-1)  # [K, S, 2]
    log_var = head.noise_offset + head.noise_slope * draws[..., 1:]
    nll = -torch.distributions.Normal(draws[..., :1], (0.5 * log_var).exp()).log_prob(y)
    with torch.no_grad():
        closed = head.expected_nll(features, y, reduction="none")
    assert_mc_mean(nll.sum(-1), closed, n_se=5.0)
    # meanvar moments drop the correlation: the closed form of independent (F, G)
    diag = features.diagonal()
    with torch.no_grad():
        indep = head.expected_nll(diag, y, reduction="none")
    if corr == 0.0:
        torch.testing.assert_close(indep, closed)
    else:
        assert not torch.allclose(indep, closed)


def test_point_mass_is_the_gaussian_nll_with_the_modelled_variance():
    head = _head(offset=0.3, slope=-0.7, num_outputs=2)
    mean = torch.randn(6, 4, dtype=DT)
    y = torch.randn(6, 2, dtype=DT)
    std = (0.5 * (0.3 - 0.7 * mean[:, 2:])).exp()
    expected = -torch.distributions.Normal(mean[:, :2], std).log_prob(y).sum(-1)
    features = Moments(mean)
    torch.testing.assert_close(head.expected_nll(features, y, reduction="none"), expected)
    torch.testing.assert_close(head.log_predictive(features, y), -expected)


@pytest.mark.parametrize("corr", [0.0, 0.9])
def test_log_predictive_matches_numerical_integration(corr):
    """``log p(y) = log int int N(y | f, e^g) N((f, g)) df dg`` by scipy's dblquad, with the
    Gauss-Hermite mixture of the head (64 nodes) to 1e-6 relative."""
    head = _head(offset=-1.5, slope=1.1)
    features = _pair_moments(corr, var_f=0.2, var_h=1.5, s=2)
    y = torch.tensor([[0.4], [-2.5]], dtype=DT)
    with torch.no_grad():
        got = head.log_predictive(features, y)
    for s in range(2):
        mu = features.mean[s].numpy()
        cov = features.cov[s].numpy()
        vf, vh, c = float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1])
        det = vf * vh - c * c
        joint = torch.distributions.MultivariateNormal(
            torch.as_tensor(mu), covariance_matrix=torch.as_tensor(cov)
        )

        def density(f, h, mu=mu, vf=vf, vh=vh, c=c, det=det):
            """The bivariate normal density in plain ``math`` (a torch call per point made
            this test 15 s)."""
            df_, dh = f - float(mu[0]), h - float(mu[1])
            quad = (vh * df_ * df_ - 2 * c * df_ * dh + vf * dh * dh) / det
            return math.exp(-0.5 * quad) / (2 * math.pi * math.sqrt(det))

        point = torch.tensor([0.3, -0.4], dtype=DT) + torch.as_tensor(mu)
        assert density(*point.tolist()) == pytest.approx(float(joint.log_prob(point).exp()))

        def integrand(h, f, s=s):
            var = math.exp(-1.5 + 1.1 * h)
            like = math.exp(-0.5 * (float(y[s, 0]) - f) ** 2 / var) / math.sqrt(2 * math.pi * var)
            return like * density(f, h)

        sf, sh = math.sqrt(cov[0, 0]), math.sqrt(cov[1, 1])
        val, _ = integrate.dblquad(
            integrand, mu[0] - 9 * sf, mu[0] + 9 * sf, mu[1] - 9 * sh, mu[1] + 9 * sh,
            epsabs=1e-13, epsrel=1e-10,
        )  # fmt: skip
        assert float(got[s]) == pytest.approx(math.log(val), rel=1e-6)


def test_predictive_moments_match_the_mixture():
    head = _head()
    features = _pair_moments(0.5)
    w, mean, var = head.predictive_mixture(features)
    mix_mean = (w.view(-1, 1, 1) * mean).sum(0)
    mix_var = (w.view(-1, 1, 1) * (var + mean.square())).sum(0) - mix_mean.square()
    pred = head.predict(features)
    torch.testing.assert_close(pred.mean, mix_mean)
    torch.testing.assert_close(pred.std.square(), mix_var, rtol=1e-8, atol=1e-10)


def test_gradcheck_expected_nll():
    features = _pair_moments(0.7, s=3)
    y = torch.randn(3, 1, dtype=DT)
    mean = features.mean.clone().requires_grad_()
    cov = features.cov.clone().requires_grad_()
    offset = torch.tensor([-0.5], dtype=DT, requires_grad=True)
    slope = torch.tensor([0.8], dtype=DT, requires_grad=True)

    def fn(mean, cov, offset, slope):
        sym = 0.5 * (cov + cov.mT)
        return heteroscedastic_expected_nll(Moments(mean, cov=sym), y, offset, slope, "none")

    assert torch.autograd.gradcheck(fn, (mean, cov, offset, slope))


def test_networks_give_the_last_layer_two_units_per_output():
    model = VariationalGPN([3, 5, 2], head=HeteroscedasticGaussianHead(2, dtype=DT), dtype=DT)
    assert [(l.in_features, l.out_features) for l in model.layers] == [(3, 5), (5, 4)]
    assert model.layers[-1].noise_std is None  # the head owns the noise
    x = torch.randn(7, 3, dtype=DT)
    pred = model.predict(x)
    assert pred.mean.shape == (7, 2) and pred.std.shape == (7, 2)
    with pytest.raises(ValueError, match="does not fit"):
        make_head(HeteroscedasticGaussianHead(1), [3, 5, 2])
    with pytest.raises(ValueError, match="dtype"):
        VariationalGPN([3, 5, 1], head=HeteroscedasticGaussianHead(1), dtype=DT)
    draws = model.sample_predictive(x, num_samples=3)
    assert draws["obs"].shape == (3, 7, 2)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_outputs=0), "num_outputs"),
        (dict(num_outputs=1, num_nodes=0), "num_nodes"),
        (dict(num_outputs=1, noise_std_init=0.0), "noise_std_init"),
        (dict(num_outputs=1, noise_slope_init=float("nan")), "noise_slope_init"),
        (dict(num_outputs=1, noise_floor=-0.1), "noise_floor"),
        (dict(num_outputs=1, noise_floor=float("inf")), "noise_floor"),
        (dict(num_outputs=1, noise_floor="0.1"), "noise_floor"),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        HeteroscedasticGaussianHead(**kwargs)


def test_bad_targets_and_features_name_the_argument():
    head = _head()
    with pytest.raises(ValueError, match="target"):
        head.expected_nll(_pair_moments(0.0), torch.zeros(4, 2, dtype=DT))
    with pytest.raises(ValueError, match="2 N features"):
        heteroscedastic_expected_nll(
            Moments(torch.zeros(4, 3, dtype=DT)), torch.zeros(4, 1, dtype=DT), 0.0, 1.0
        )
    with pytest.raises(ValueError, match="y"):
        head.check_target(torch.zeros(4, dtype=DT), 4)


def test_fit_finds_input_dependent_noise():
    """On data whose noise grows tenfold across the input range, the fitted heteroscedastic
    variational GPN predicts a noise level that grows with it, and scores higher on held-out
    rows than the same network with a Gaussian head -- under the paper's ELBO (under the
    predictive objective ``Var[F]`` itself can grow with the input, so the Gaussian head is a
    closer competitor there)."""
    from pyro_gpn.inference import fit_vgpn

    g = torch.Generator().manual_seed(0)
    x = torch.rand(400, 1, dtype=DT, generator=g) * 4 - 2
    noise = 0.05 + 0.45 * (x + 2) / 4
    y = torch.sin(2 * x) + noise * torch.randn(400, 1, dtype=DT, generator=g)
    x_tr, y_tr, x_va, y_va = x[:300], y[:300], x[300:], y[300:]
    scores = {}
    for name, head in (("hetero", HeteroscedasticGaussianHead(1, dtype=DT)), ("homo", "gaussian")):
        torch.manual_seed(0)
        model = VariationalGPN([1, 6, 1], head=head, dtype=DT)
        fit = fit_vgpn(
            model, x_tr, y_tr, x_va, y_va, num_steps=250, lr=0.05, eval_every=25, seed=0,
            elbo="closed_form",
        )  # fmt: skip
        scores[name] = fit.best_val_log_lik
        if name == "hetero":
            grid = torch.tensor([[-1.8], [1.8]], dtype=DT)
            with torch.no_grad():
                std = model.predict(grid).std.reshape(-1)
            # noise alone: 0.455 / 0.095 = 4.8 (the predictive adds the epistemic part);
            # a homoscedastic model gives about 1
            assert float(std[1] / std[0]) > 2.0
    assert scores["hetero"] > scores["homo"] + 0.1


def test_gaussian_head_log_predictive_is_the_gaussian_density():
    head = GaussianHead(2, noise_std_init=0.4, dtype=DT)
    features = Moments(torch.randn(5, 2, dtype=DT), var=torch.rand(5, 2, dtype=DT))
    y = torch.randn(5, 2, dtype=DT)
    scale = (features.var + 0.16).sqrt()
    expected = torch.distributions.Normal(features.mean, scale).log_prob(y).sum(-1)
    torch.testing.assert_close(head.log_predictive(features, y), expected)


def test_float32_agrees_with_float64_in_a_hard_regime():
    """float32 features and parameters (the library's default dtype) against float64: a log
    variance of large spread (variance 2.5 before the slope) and correlation -0.99 with the
    output, targets far in the tails; expected NLL and log predictive to 1e-4 relative."""
    features = _pair_moments(-0.99, var_f=0.5, var_h=2.5, s=4, seed=3)
    y = torch.tensor([[4.0], [-3.0], [0.1], [8.0]], dtype=DT)
    head64 = _head(offset=-3.0, slope=1.2)
    head32 = HeteroscedasticGaussianHead(1)
    with torch.no_grad():
        head32.noise_offset.fill_(-3.0)
        head32.noise_slope.fill_(1.2)
        f32 = Moments(features.mean.float(), cov=features.cov.float())
        for fn in ("expected_nll", "log_predictive"):
            kwargs = {"reduction": "none"} if fn == "expected_nll" else {}
            want = getattr(head64, fn)(features, y, **kwargs)
            got = getattr(head32, fn)(f32, y.float(), **kwargs)
            assert got.dtype == torch.float32 and torch.isfinite(got).all()
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_log_predictive_gradient_stays_finite_for_a_very_wide_log_variance():
    """A trained network reached a log-variance feature of mean -20 and standard deviation 7.1
    (energy, split 3, float32): the outer Gauss-Hermite nodes then put ``G`` near 89, where
    ``exp`` overflows in float32 and its backward gave inf * 0 = NaN. The log predictive and
    its gradient must stay finite, and agree with float64 (where nothing overflows)."""
    features = _pair_moments(0.3, var_f=0.05, var_h=1.0, s=4, seed=5)
    y = torch.tensor([[0.1], [-0.2], [0.3], [1.5]], dtype=DT)
    values = {}
    for dtype in (torch.float32, torch.float64):
        head = HeteroscedasticGaussianHead(1, dtype=dtype)
        with torch.no_grad():
            head.noise_offset.fill_(-20.0)
            head.noise_slope.fill_(7.1)
        mean = features.mean.to(dtype).requires_grad_()
        log_p = head.log_predictive(Moments(mean, cov=features.cov.to(dtype)), y.to(dtype))
        grads = torch.autograd.grad(log_p.sum(), [mean, head.noise_slope, head.noise_offset])
        assert torch.isfinite(log_p).all()
        assert all(torch.isfinite(g).all() for g in grads), grads
        values[dtype] = log_p.double()
    torch.testing.assert_close(values[torch.float32], values[torch.float64], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("corr", [0.0, 0.6])
def test_noise_floor_quadrature_and_bound(corr):
    """``noise_floor``: a tiny floor's quadrature is the closed form; a floor's expected NLL
    matches Monte Carlo with noise variance ``c^2 + e^G``; the predictive std (and every
    mixture component's) never falls below ``c``, even where ``G`` is very negative."""
    features = _pair_moments(corr)
    y = torch.tensor([[0.5], [-1.0], [2.0], [0.0]], dtype=DT)
    with torch.no_grad():
        closed = _head().expected_nll(features, y, reduction="none")
        tiny = _head(noise_floor=1e-9).expected_nll(features, y, reduction="none")
    torch.testing.assert_close(tiny, closed, rtol=1e-7, atol=1e-7)
    floor = 0.4
    head = _head(offset=-6.0, slope=2.0, noise_floor=floor)
    g = torch.Generator().manual_seed(1)
    chol = torch.linalg.cholesky(features.cov)
    draws = features.mean + (chol @ torch.randn(200_000, 4, 2, 1, dtype=DT, generator=g)).squeeze(
        -1
    )
    noise_var = floor**2 + (head.noise_offset + head.noise_slope * draws[..., 1:]).exp()
    nll = -torch.distributions.Normal(draws[..., :1], noise_var.sqrt()).log_prob(y)
    with torch.no_grad():
        quad = head.expected_nll(features, y, reduction="none")
        assert_mc_mean(nll.sum(-1), quad, n_se=5.0)
        assert not torch.allclose(
            quad, _head(offset=-6.0, slope=2.0).expected_nll(features, y, reduction="none")
        )
        far = Moments(
            torch.tensor([[0.0, -5.0]], dtype=DT), var=torch.tensor([[0.0, 0.0]], dtype=DT)
        )
        assert float(head.predict(far).std) >= floor
        assert float(_head(offset=-6.0, slope=2.0).predict(far).std) < floor / 10
        _, _, comp_var = head.predictive_mixture(features)
        assert bool((comp_var >= floor**2).all())
        sample_scale = head.observation(draws[:10]).base_dist.scale
        assert bool((sample_scale >= floor).all())


@pytest.mark.parametrize("floor", [0.0, 0.2])
def test_observation_density_uses_the_noise_features(floor):
    """The Pyro site: ``y_d ~ N(F_d, c^2 + exp(a + b H_d))`` with ``F`` the first ``D``
    features and ``H`` the last ``D``, by hand."""
    head = _head(offset=-1.0, slope=1.3, num_outputs=2, noise_floor=floor)
    g = torch.Generator().manual_seed(3)
    features = torch.randn(6, 4, dtype=DT, generator=g)
    y = torch.randn(6, 2, dtype=DT, generator=g)
    f, h = features[:, :2], features[:, 2:]
    var = floor**2 + torch.exp(-1.0 + 1.3 * h)
    expected = (-0.5 * torch.log(2 * math.pi * var) - 0.5 * (y - f) ** 2 / var).sum(-1)
    torch.testing.assert_close(head.observation(features).log_prob(y), expected)
