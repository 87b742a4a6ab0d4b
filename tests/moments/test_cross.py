"""The off-diagonal output covariances (``pyro_gpn/moments/cross.py``): Mehler's series against
Gauss-Hermite quadrature and the quadrature reference of ``benchmarks/accuracy_grid.py``, its
truncation bound, its fallback to ``Lambda`` and its gradients."""

import math

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

from benchmarks.accuracy_grid import Unit, mehler_serves, reference_cov, reference_meanvar
from pyro_gpn.moments import Moments, cross, response_moments, virtual_observation_weights
from pyro_gpn.moments.backend import backend

F64, F32 = torch.float64, torch.float32
POINTS = torch.linspace(-2, 2, 14, dtype=F64)


def _standard_normal_grid(num=4001, width=10.0):
    """Trapezoid nodes and weights of the standard normal on ``[-width, width]`` (spectrally
    accurate for smooth integrands that the grid resolves)."""
    z = np.linspace(-width, width, num)
    return z, np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi) * (z[1] - z[0])


def _coefficients_by_quadrature(mu, v, ls, beta, num_terms):
    """``E[m(mu + sqrt(v) z) He_k(z)] / sqrt(k!)``, ``k = 1 .. K``, by the trapezoid rule on a
    fine grid in numpy."""
    z, w = _standard_normal_grid()
    a = mu + math.sqrt(v) * z
    m = np.exp(-((a[:, None] - POINTS.numpy()) ** 2) / (2 * ls**2)) @ beta
    out, h_prev, h = [], np.ones_like(z), z.copy()
    for k in range(1, num_terms + 1):
        out.append(w @ (m * h))
        h_prev, h = h, (z * h - math.sqrt(k) * h_prev) / math.sqrt(k + 1)
    return np.array(out)


@pytest.mark.parametrize(
    "mu, v, ls",
    [(0.3, 0.05, 0.4), (-1.1, 1.0, 0.4), (2.5, 4.0, 1.2), (6.0, 1.0, 0.8), (0.0, 0.3, 0.1)],
)
def test_hermite_coefficients_match_quadrature(mu, v, ls):
    """``b_k (v / c)^{k/2} = E[m(a) He_k(z)] / sqrt(k!)`` (Stein's identity), for means inside
    and outside the inducing points and input spreads narrow and wide against ``lambda``."""
    beta = torch.randn(1, 14, dtype=F64, generator=torch.Generator().manual_seed(0))
    coef, _ = cross._hermite_coefficients(
        torch.tensor([[mu]], dtype=F64),
        torch.tensor([[v]], dtype=F64),
        POINTS.reshape(1, -1),
        torch.tensor([ls], dtype=F64),
        beta,
        12,
    )
    c = ls**2 + v
    scaled = coef[0, 0].numpy() * (v / c) ** (np.arange(1, 13) / 2)
    expected = _coefficients_by_quadrature(mu, v, ls, beta[0].numpy(), 12)
    scale = np.abs(beta.numpy()).sum()
    np.testing.assert_allclose(scaled, expected, rtol=0, atol=1e-12 * scale)


def test_coefficients_obey_cramers_bound_and_never_overflow():
    """``|b_k| <= B`` for every ``k`` up to :data:`MEHLER_MAX_TERMS`, means up to 40
    lengthscales outside the inducing points, float32 and float64 (the bound is what makes the
    truncation rule safe)."""
    g = torch.Generator().manual_seed(1)
    for dtype in (F64, F32):
        mean = torch.linspace(-20, 20, 81, dtype=dtype).reshape(-1, 1).expand(-1, 3)
        var = torch.tensor([0.0, 1e-6, 1.0], dtype=dtype).expand(81, -1)
        for ls in (0.05, 0.4, 5.0):
            beta = (1e3 * torch.randn(3, 14, generator=g)).to(dtype)
            lengthscales = torch.full((3,), ls, dtype=dtype)
            coef, bound = cross._hermite_coefficients(
                mean,
                var,
                POINTS.to(dtype).expand(3, -1),
                lengthscales,
                beta,
                cross.MEHLER_MAX_TERMS,
            )
            assert torch.isfinite(coef).all() and torch.isfinite(bound).all()
            assert (coef.abs() <= bound.unsqueeze(-1) * (1 + 1e-5)).all()


def _weights(ls, s, kinds=("smooth", "rough"), dtype=F64):
    units = [Unit.make(ls_i, s, kind, dtype) for ls_i, kind in zip(ls, kinds)]
    tens = [torch.tensor(x, dtype=dtype) for x in ([u.points for u in units],)]
    points = tens[0]
    targets = torch.tensor([u.targets for u in units], dtype=dtype)
    variances = torch.tensor([u.variances for u in units], dtype=dtype)
    lengthscales = torch.tensor(ls, dtype=dtype)
    kappa, beta, chol = virtual_observation_weights(
        points, targets, variances, lengthscales, with_cholesky=True
    )
    return units, points, lengthscales, beta, kappa, chol


# pairs the series serves (moderate correlations, or narrow units): the hard regimes of the
# accuracy grid -- ill-conditioned units (lambda / h = 6.5, S at the jitter), means far outside
# the inducing range, narrow and broad activations
SERVED = [
    ((0.4, 0.6), 1e-1, (0.3, -0.5), (0.05, 0.05), 0.9),
    ((2.0, 3.0), 1e-6, (0.3, -0.5), (0.05, 0.05), 0.999),
    ((2.0, 3.0), 1e-6, (0.3, -0.5), (1.0, 1.0), -0.5),
    ((0.4, 0.6), 1e-3, (2.5, 20.0), (0.05, 2.0), 0.9),
    ((0.05, 0.075), 1e-1, (-6.0, 6.0), (1e-6, 1e-6), -0.999),
    ((1.2, 1.8), 1e-6, (-1.1, 1.9), (1.0, 1.0), 0.5),
    ((0.4, 0.6), 1e-1, (0.3, -0.5), (1.0, 1.0), 0.0),
]


def _brute_force_cov(mu, cov, points, lengthscales, beta, num=1201):
    """``Cov[m_n(a_n), m_m(a_m)]`` by the two-dimensional trapezoid rule over whitened
    coordinates, with the same ``beta``: no series, no ``Lambda``."""
    z, w = _standard_normal_grid(num, 9.0)
    chol = np.linalg.cholesky(cov)
    z1, z2 = np.meshgrid(z, z, indexing="ij")
    weight = w[:, None] * w[None, :]
    a = (mu[0] + chol[0, 0] * z1, mu[1] + chol[1, 0] * z1 + chol[1, 1] * z2)
    values = []
    for i in range(2):
        bumps = np.exp(-((a[i][..., None] - points[i]) ** 2) / (2 * lengthscales[i] ** 2))
        f = bumps @ beta[i]
        values.append(f - (weight * f).sum())
    return float((weight * values[0] * values[1]).sum())


def _pair_cov(mu, cov, points, lengthscales, beta, kappa, **options):
    """``"cov"``-mode output covariance ``[2, 2]`` of one sample of two units whose activations
    have means ``mu`` and covariance ``cov``."""
    moments = Moments(torch.tensor([mu], dtype=F64), cov=torch.tensor(cov).unsqueeze(0))
    out = response_moments(moments, points, lengthscales, beta, kappa, None, "cov", **options)
    return out.cov[0]


@pytest.mark.parametrize("ls, s, mu, v, rho", SERVED)
def test_series_matches_quadrature(ls, s, mu, v, rho):
    """Every case is served by the series (not the ``Lambda`` fallback); it agrees with the
    independent quadrature reference of the accuracy grid (mpmath weights, Gauss-Legendre over
    ``a_n``) to 1e-6 of ``sd f_n sd f_m`` (issue 13's float64 target; the float64 ``beta`` of
    ill-conditioned units is itself no closer), and with a brute-force two-dimensional
    quadrature of the same ``beta`` to 1e-10."""
    units = (Unit.make(ls[0], s, "smooth", F64), Unit.make(ls[1], s, "rough", F64))
    c = rho * math.sqrt(v[0] * v[1])
    cov = np.array([[v[0], c], [c, v[1]]])
    assert mehler_serves(units, mu, cov, F64)
    ref = reference_cov(units[0], units[1], mu, cov)
    _, var_n = reference_meanvar(units[0], mu[0], v[0])
    _, var_m = reference_meanvar(units[1], mu[1], v[1])
    _, points, lengthscales, beta, kappa, chol = _weights(ls, s)
    brute = _brute_force_cov(mu, cov, points.numpy(), ls, beta.numpy())
    out_cov = _pair_cov(mu, cov, points, lengthscales, beta, kappa, variance_cholesky=chol)
    scale = math.sqrt(var_n * var_m)
    assert abs(float(out_cov[0, 1]) - ref) <= 1e-6 * scale
    assert abs(float(out_cov[0, 1]) - brute) <= 1e-10 * scale


def _random_layer(num_units=6, samples=5, seed=0, dtype=F64, scale=0.3, ls=0.4):
    g = torch.Generator().manual_seed(seed)
    points = POINTS.to(dtype).expand(num_units, -1)
    targets = torch.randn(num_units, 14, generator=g).to(dtype)
    variances = torch.full((num_units, 14), 0.01, dtype=dtype)
    lengthscales = torch.full((num_units,), ls, dtype=dtype)
    kappa, beta = virtual_observation_weights(points, targets, variances, lengthscales)
    mean = (1.5 * torch.randn(samples, num_units, generator=g)).to(dtype)
    a = torch.randn(samples, num_units, num_units, generator=g) / num_units**0.5
    cov = (scale * a @ a.mT + 0.01 * torch.eye(num_units)).to(dtype)
    return mean, cov, points, lengthscales, beta, kappa


def _cov(mean, cov, points, lengthscales, beta, kappa):
    return response_moments(
        Moments(mean, cov=cov, validate=False), points, lengthscales, beta, kappa, None, "cov"
    ).cov


@pytest.mark.parametrize("name", ["auto", "reference"])
@pytest.mark.parametrize("rtol", [1e-2, 1e-4])
def test_looser_tolerance_stops_earlier_and_stays_within_it(monkeypatch, rtol, name):
    """The truncation rule: with ``MEHLER_RTOL`` loosened the series takes fewer terms, its
    error against the full series grows but stays within ``rtol sqrt(Var f_n Var f_m)`` (the
    bound is a bound), and is not zero (the test would notice a rule that always takes
    every term); on the CPU kernels and on whole tensors."""
    import pyro_gpn.moments.cpu_mehler as cpu_mehler

    mean, cov, points, ls, beta, kappa = _random_layer(scale=1.0)
    exact = _cov(mean, cov, points, ls, beta, kappa)
    terms = []
    module = cross if name == "reference" else cpu_mehler
    function = "_hermite_coefficients" if name == "reference" else "cpu_hermite_coefficients"
    original = getattr(module, function)

    def spy(*args):
        terms.append(args[-1])
        return original(*args)

    monkeypatch.setattr(module, function, spy)
    monkeypatch.setattr(cross, "MEHLER_RTOL", rtol)
    with backend(name):
        loose = _cov(mean, cov, points, ls, beta, kappa)
    monkeypatch.undo()
    var = exact.diagonal(dim1=-2, dim2=-1)
    err = ((loose - exact).abs() / (var.unsqueeze(-1) * var.unsqueeze(-2)).sqrt()).max()
    assert 0 < err <= rtol
    assert 1 < max(terms) < cross.MEHLER_MAX_TERMS


def test_pairs_the_series_cannot_bound_go_through_lambda(monkeypatch):
    """With at most 3 terms most pairs cannot be bounded: they are evaluated through
    ``Lambda`` (the narrow regime's nodes where both units are narrow) and the result equals
    the series' to 1e-9; with no term allowed every pair falls back, gradients included."""
    mean, cov, points, ls, beta, kappa = _random_layer(scale=1.0)
    for tensor in (mean, cov, beta):
        tensor.requires_grad_(True)
    series = _cov(mean, cov, points, ls, beta, kappa)
    grads = torch.autograd.grad(series.square().sum(), (mean, cov, beta))
    eye = torch.eye(6, dtype=torch.bool)
    for max_terms in (3, 0):
        monkeypatch.setattr(cross, "MEHLER_MAX_TERMS", max_terms)
        _, unbounded = cross._mehler_cross_covariance(
            mean, cov, points, ls, beta, series.diagonal(dim1=-2, dim2=-1).detach()
        )
        assert unbounded is not None and bool(unbounded[:, ~eye].any())
        assert bool(unbounded[:, ~eye].all()) == (max_terms == 0)
        fallback = _cov(mean, cov, points, ls, beta, kappa)
        torch.testing.assert_close(fallback, series, rtol=0, atol=1e-9)
        assert torch.equal(fallback, fallback.mT)
        fallback_grads = torch.autograd.grad(fallback.square().sum(), (mean, cov, beta))
        for got, want in zip(fallback_grads, grads):
            if got.shape == cov.shape:  # Lambda reads the upper triangle, the series both
                got, want = got + got.mT, want + want.mT
            torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", ["auto", "reference"])
def test_series_float32_agrees_with_float64(name):
    """float32 activations (float32 algebra) against the float64 series: off-diagonal entries
    within 1e-5 of the scale, on the CPU kernels and on whole tensors."""
    mean, cov, points, ls, beta, kappa = _random_layer(seed=3)
    want = _cov(mean, cov, points, ls, beta, kappa)
    with backend(name):
        got = _cov(*(t.float() for t in (mean, cov, points, ls, beta, kappa)))
    var = want.diagonal(dim1=-2, dim2=-1)
    err = (got.double() - want).abs() / (var.unsqueeze(-1) * var.unsqueeze(-2)).sqrt()
    assert err[:, ~torch.eye(6, dtype=torch.bool)].max() < 1e-5


@pytest.mark.parametrize("name", ["auto", "reference"])
def test_no_sample_and_one_unit(name):
    """An empty batch gives an empty ``[0, N, N]`` covariance, one unit a ``[S, 1, 1]`` one
    (its variance), with gradients."""
    mean, cov, points, ls, beta, kappa = _random_layer(num_units=3, samples=2)
    with backend(name):
        empty = _cov(mean[:0], cov[:0], points, ls, beta, kappa)
        assert empty.shape == (0, 3, 3)
        m = mean[:, :1].clone().requires_grad_(True)
        one = _cov(m, cov[:, :1, :1], points[:1], ls[:1], beta[:1], kappa[:1])
        alone = response_moments(
            Moments(m, var=cov[:, 0, :1]), points[:1], ls[:1], beta[:1], kappa[:1], None
        )
        torch.testing.assert_close(one[:, 0, 0], alone.var[:, 0])
        torch.autograd.grad(one.sum(), m)


@pytest.mark.parametrize("name", ["auto", "reference"])
def test_series_gradcheck(name):
    """Gradients of the series in float64 (means, covariances, ``beta``, lengthscales), on the
    CPU kernels (``"auto"``, where Numba is installed) and on whole tensors."""
    mean, cov, points, ls, beta, _ = _random_layer(num_units=3, samples=2, seed=2)
    out_var = torch.ones(2, 3, dtype=F64)

    def fn(mean, cov, beta, ls):
        cov = 0.5 * (cov + cov.mT)
        return cross._mehler_cross_covariance(mean, cov, points, ls, beta, out_var)[0]

    inputs = tuple(t.clone().requires_grad_(True) for t in (mean, cov, beta, ls))
    with backend(name):
        assert gradcheck(fn, inputs, atol=1e-6)


@pytest.mark.parametrize(
    "ls, mu, v, rho",
    [
        ((0.4, 0.6), (0.3, -0.5), (1.0, 1.0), 0.6),  # both broad: Lambda's closed form
        ((0.4, 0.6), (2.5, 1.0), (0.05, 2.0), -0.9),  # one narrow: Lambda's closed form
        ((1.2, 1.8), (-0.4, 0.9), (1.0, 1.0), 0.8),  # both narrow: the nodes' conditional
    ],
)
def test_lambda_fallback_with_unequal_lengthscales_matches_quadrature(monkeypatch, ls, mu, v, rho):
    """Every pair sent through the fallback (no Mehler term allowed), two units with different
    lengthscales: ``Lambda``'s closed form where a unit is broad, the Gauss-Hermite nodes of
    ``a_n`` and the conditional of ``a_m`` given it where both are narrow. The covariance
    agrees with the brute-force two-dimensional quadrature to 1e-9 of ``sd f_n sd f_m``.
    Caught: a per-unit quantity taken from the wrong unit of the pair
    (``c_n = lambda_m^2 + Sigma_nn``), the conditional variance without ``- Sigma_nm^2 /
    Sigma_nn``."""
    monkeypatch.setattr(cross, "MEHLER_MAX_TERMS", 0)
    _, points, lengthscales, beta, kappa, _ = _weights(ls, 1e-1)
    c = rho * math.sqrt(v[0] * v[1])
    cov = np.array([[v[0], c], [c, v[1]]])
    brute = _brute_force_cov(mu, cov, points.numpy(), ls, beta.numpy())
    with backend("reference"):
        out_cov = _pair_cov(mu, cov, points, lengthscales, beta, kappa)
    scale = float(out_cov[0, 0] * out_cov[1, 1]) ** 0.5
    assert abs(float(out_cov[0, 1]) - brute) <= 1e-9 * scale
    assert float(out_cov[0, 1]) == float(out_cov[1, 0])


@pytest.mark.parametrize("ratio", [2.0, 5.5])
def test_narrow_pairs_past_the_old_bound_match_quadrature(monkeypatch, ratio):
    """Both units narrow at ``sqrt(v) / lambda`` 2 and 5.5 (the trapezoidal tiers), ``K + S``
    ill-conditioned (``S`` ~1e-6, ``|beta|`` ~6e5), every pair through the fallback: the nodes
    of ``a_n`` are the diagonal tier's, and the covariance agrees with the brute-force
    two-dimensional quadrature of the same ``beta`` to 1e-11 of ``sd f_n sd f_m`` (measured:
    2.5e-13). Caught: the pairs' tier taken at half the ratio (off by 4e-11) or at the square
    root of it (off by 1.6e-7 at 5.5)."""
    monkeypatch.setattr(cross, "MEHLER_MAX_TERMS", 0)
    g = torch.Generator().manual_seed(17)
    points = POINTS.expand(2, -1).clone()
    targets = torch.randn(2, 14, generator=g, dtype=F64)
    variances = 1e-6 * (0.5 + torch.rand(2, 14, generator=g, dtype=F64))
    ls = torch.tensor([0.8, 1.15], dtype=F64)
    kappa, beta = virtual_observation_weights(points, targets, variances, ls, jitter=1e-6)
    assert float(beta.abs().max()) > 1e5
    v = [(ratio * float(lam)) ** 2 for lam in ls]
    for mu in ((0.3, -0.4), (1.5, 0.2)):
        c = 0.7 * math.sqrt(v[0] * v[1])
        cov = np.array([[v[0], c], [c, v[1]]])
        brute = _brute_force_cov(mu, cov, points.numpy(), ls.tolist(), beta.numpy())
        with backend("reference"):
            out_cov = _pair_cov(mu, cov, points, ls, beta, kappa)
        scale = float(out_cov[0, 0] * out_cov[1, 1]) ** 0.5
        assert abs(float(out_cov[0, 1]) - brute) <= 1e-11 * scale, mu
