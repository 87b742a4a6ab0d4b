"""Tests of the sampled-targets GPN: its closed-form layer moments against quadrature (an
independent implementation), the likelihood of a tiny network against a grid integration of
the exact model, the classification likelihoods, and argument checks."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine
from scipy import integrate
from torch import Tensor

from pyro_gpn.models.sampled_targets import SampledTargetsGPN, clt_layer_moments

F64 = torch.float64


def _gp_conditional(a: float, inducing: Tensor, targets: Tensor, lam: float, jitter: float):
    """E[f | a, U] and Var[f | a, U] of the unit's GP, written out directly."""
    k = torch.exp(-0.5 * (inducing[:, None] - inducing[None, :]) ** 2 / lam**2)
    k = k + jitter * torch.eye(len(inducing), dtype=F64)
    alpha = torch.exp(-0.5 * (a - inducing) ** 2 / lam**2)
    sol = torch.linalg.solve(k, alpha)
    return float(sol @ targets), float(1.0 - alpha @ sol)


def _moments_by_quadrature(m, v, inducing, targets, lam, jitter, noise):
    """Mean and variance of f(a) + noise, a ~ N(m, v), by adaptive quadrature over a."""
    if v < 1e-12:
        mean, var = _gp_conditional(m, inducing, targets, lam, jitter)
        return mean, var + noise**2
    sd = math.sqrt(v)

    def density(a):
        return math.exp(-0.5 * (a - m) ** 2 / v) / math.sqrt(2 * math.pi * v)

    def first(a):
        return _gp_conditional(a, inducing, targets, lam, jitter)[0] * density(a)

    def second(a):
        mean, var = _gp_conditional(a, inducing, targets, lam, jitter)
        return (mean**2 + var) * density(a)

    lo, hi = m - 12 * sd, m + 12 * sd
    e1 = integrate.quad(first, lo, hi, limit=200, epsabs=1e-12)[0]
    e2 = integrate.quad(second, lo, hi, limit=200, epsabs=1e-12)[0]
    return e1, e2 - e1**2 + noise**2


@pytest.mark.parametrize(
    ("m", "v", "lam"),
    [
        (0.3, 0.2, 0.5),  # typical
        (0.3, 1e-14, 0.5),  # (numerically) deterministic activation
        (6.0, 0.5, 0.5),  # far outside the inducing range [-2, 2]
        (-1.0, 4.0, 0.5),  # wider than the inducing range
        (0.5, 0.3, 2.0),  # long lengthscale: ill-conditioned K (jitter 1e-6)
    ],
)
def test_layer_moments_match_quadrature(m, v, lam):
    inducing = torch.linspace(-2, 2, 8, dtype=F64)
    targets = torch.sin(2 * inducing) + 0.3 * inducing
    noise, jitter = 0.15, 1e-6
    mean, var = clt_layer_moments(
        torch.tensor([[m]], dtype=F64),
        torch.tensor([[v]], dtype=F64),
        torch.ones(1, 1, dtype=F64),
        inducing,
        targets[None],
        lam,
        jitter,
        torch.tensor([noise], dtype=F64),
    )
    want_mean, want_var = _moments_by_quadrature(m, v, inducing, targets, lam, jitter, noise)
    torch.testing.assert_close(float(mean), want_mean, rtol=0, atol=1e-7)
    torch.testing.assert_close(float(var), want_var, rtol=0, atol=1e-6)


def test_layer_moments_with_draw_dimensions_equal_each_draw_alone():
    """``[D1, D2, ...]`` draws in front (a vectorised predictive / the sampler's batch): each
    draw's moments are those of the unbatched call, for either midpoint branch, and equal to
    the explicit ``O(R^2)`` pair sum (the grouping by midpoint changes no value)."""
    g = torch.Generator().manual_seed(3)
    inducing = torch.linspace(-2, 2, 10, dtype=F64)
    batch, rows, fan_in, units = (2, 3), 5, 2, 4
    mean = torch.randn(*batch, rows, fan_in, dtype=F64, generator=g)
    var = torch.rand(*batch, rows, fan_in, dtype=F64, generator=g)
    weight = torch.randn(*batch, units, fan_in, dtype=F64, generator=g)
    targets = torch.randn(*batch, units, 10, dtype=F64, generator=g)
    noise = torch.rand(*batch, units, dtype=F64, generator=g) + 0.05
    out = {
        eq: clt_layer_moments(mean, var, weight, inducing, targets, 0.5, 1e-6, noise, eq)
        for eq in (None, True, False)
    }
    for eq in (True, False):
        torch.testing.assert_close(out[eq], out[None], rtol=0, atol=1e-10)
    for i in range(2):
        for j in range(3):
            alone = clt_layer_moments(
                mean[i, j], var[i, j], weight[i, j], inducing, targets[i, j], 0.5, 1e-6, noise[i, j]
            )
            torch.testing.assert_close(alone[0], out[None][0][i, j], rtol=0, atol=1e-13)
            # the variance's closed form cancels terms of size |beta|^2: batched and unbatched
            # products round differently, by up to 2e-13 on an AVX-512 CPU (a lent GPU
            # machine's), by 0 on this CI's
            torch.testing.assert_close(alone[1], out[None][1][i, j], rtol=0, atol=2e-12)
    # the pairs written out: Omega_rt with its own midpoint and separation per pair
    lam2 = 0.25
    m = (mean @ weight.mT).unsqueeze(-1).unsqueeze(-1)  # [..., S, N, 1, 1]
    v = (var @ weight.square().mT).unsqueeze(-1).unsqueeze(-1)
    mid = 0.5 * (inducing[:, None] + inducing[None, :])
    sep = inducing[:, None] - inducing[None, :]
    omega = torch.sqrt(lam2 / (lam2 + 2 * v)) * torch.exp(
        -sep.square() / (4 * lam2) - (m - mid).square() / (lam2 + 2 * v)
    )
    kern = torch.exp(-0.5 * sep.square() / lam2) + 1e-6 * torch.eye(10, dtype=F64)
    cinv = torch.linalg.inv(kern)
    beta = targets @ cinv  # cinv symmetric: [..., N, R]
    coef = cinv - beta.unsqueeze(-1) * beta.unsqueeze(-2)
    trace = (omega * coef.unsqueeze(-4)).sum((-1, -2))
    want_var = 1 - trace - out[None][0].square() + noise.unsqueeze(-2).square()
    torch.testing.assert_close(out[None][1], want_var, rtol=0, atol=1e-10)
    assert SampledTargetsGPN([1, 2, 1]).equidistant


def test_layer_moments_match_quadrature_on_an_irregular_grid():
    """The midpoint-grouped Omega trace does not assume a uniform grid of inducing points."""
    inducing = torch.tensor([-2.0, -1.1, -0.7, 0.2, 0.25, 1.4, 2.2], dtype=F64)
    targets = torch.cos(1.5 * inducing) - 0.2 * inducing
    for m, v in ((0.1, 0.3), (1.8, 1.5)):
        mean, var = clt_layer_moments(
            torch.tensor([[m]], dtype=F64),
            torch.tensor([[v]], dtype=F64),
            torch.ones(1, 1, dtype=F64),
            inducing,
            targets[None],
            0.6,
            1e-6,
            torch.tensor([0.05], dtype=F64),
        )
        want_mean, want_var = _moments_by_quadrature(m, v, inducing, targets, 0.6, 1e-6, 0.05)
        torch.testing.assert_close(float(mean), want_mean, rtol=0, atol=1e-7)
        torch.testing.assert_close(float(var), want_var, rtol=0, atol=1e-6)


def test_likelihood_of_a_two_layer_network_matches_grid_integration():
    """[1, 1, 1] on one row: the hidden output is exactly Gaussian (the activation is
    deterministic), so the closed-form mean and variance of y are exact; here they are computed
    by integrating the exact model over the hidden output on a fine grid."""
    gpn = SampledTargetsGPN([1, 1, 1], num_inducing=6)
    z1 = torch.tensor([[0.4, -1.1, 0.8, 0.2, -0.5, 1.3]], dtype=F64)
    z2 = torch.tensor([[-0.7, 0.9, 0.1, -1.2, 0.6, 0.3]], dtype=F64)
    params = {
        "W1": torch.tensor([[0.9]], dtype=F64),
        "z1": z1,
        "sigma1": torch.tensor([0.3], dtype=F64),
        "W2": torch.tensor([[1.4]], dtype=F64),
        "z2": z2,
        "sigma2": torch.tensor([0.2], dtype=F64),
    }
    x, y = torch.tensor([[0.7]], dtype=F64), torch.tensor([0.25], dtype=F64)
    trace = poutine.trace(poutine.condition(gpn.model, params)).get_trace(x, y)
    fn = trace.nodes["y"]["fn"]
    got_mean, got_var = float(fn.mean), float(fn.variance)

    inducing, lam, jitter = gpn.inducing_points, gpn.lengthscale, gpn.jitter
    k = torch.exp(-0.5 * (inducing[:, None] - inducing[None, :]) ** 2 / lam**2)
    chol = torch.linalg.cholesky(k + jitter * torch.eye(6, dtype=F64))
    u1, u2 = chol @ z1[0], chol @ z2[0]
    f_mean, f_var = _gp_conditional(0.9 * 0.7, inducing, u1, lam, jitter)
    h_var = f_var + 0.3**2  # X1 ~ N(f_mean, h_var) exactly
    grid = np.linspace(f_mean - 10 * math.sqrt(h_var), f_mean + 10 * math.sqrt(h_var), 4001)
    dens = np.exp(-0.5 * (grid - f_mean) ** 2 / h_var) / math.sqrt(2 * math.pi * h_var)
    cond = np.array([_gp_conditional(1.4 * h, inducing, u2, lam, jitter) for h in grid])
    e1 = integrate.simpson(cond[:, 0] * dens, x=grid)
    e2 = integrate.simpson((cond[:, 0] ** 2 + cond[:, 1]) * dens, x=grid)
    assert got_mean == pytest.approx(e1, abs=1e-7)
    assert got_var == pytest.approx(e2 - e1**2 + 0.2**2, abs=1e-7)
    # the likelihood is the Gaussian with these moments, one factor per row
    want = -0.5 * math.log(2 * math.pi * got_var) - 0.5 * (0.25 - got_mean) ** 2 / got_var
    assert float(fn.log_prob(y[:, None]).sum()) == pytest.approx(want, abs=1e-10)


def test_bernoulli_likelihood_matches_quadrature():
    gpn = SampledTargetsGPN([2, 1], likelihood="bernoulli")
    mean = torch.tensor([[-1.5], [0.3], [4.0]], dtype=F64)
    var = torch.tensor([[0.5], [2.0], [9.0]], dtype=F64)
    probs = gpn.observation(mean, var).probs
    for i in range(3):
        m, s = float(mean[i]), math.sqrt(float(var[i]))
        want = integrate.quad(
            lambda f, m=m, s=s: (
                math.exp(-0.5 * ((f - m) / s) ** 2)
                / (s * math.sqrt(2 * math.pi))
                / (1 + math.exp(-f))
            ),
            m - 12 * s,
            m + 12 * s,
        )[0]
        assert float(probs[i]) == pytest.approx(want, abs=1e-6)


def _output_moments_by_hand(gpn, draw, x):
    """The last layer's output moments of one draw: targets ``U = L_K z`` with ``L_K`` the
    Cholesky factor of the hand-built ``K(V, V) + jitter I``, then the layers' closed-form
    moments (checked against quadrature above) chained from the deterministic inputs."""
    inducing, lam = gpn.inducing_points, gpn.lengthscale
    k = torch.exp(-0.5 * (inducing[:, None] - inducing[None, :]) ** 2 / lam**2)
    chol = torch.linalg.cholesky(k + gpn.jitter * torch.eye(len(inducing), dtype=F64))
    mean, var = x, torch.zeros_like(x)
    for l in range(1, gpn.num_layers + 1):
        u = draw[f"z{l}"] @ chol.mT
        mean, var = clt_layer_moments(
            mean, var, draw[f"W{l}"], inducing, u, lam, gpn.jitter, draw.get(f"sigma{l}")
        )
    return mean, var


def _bernoulli_probs(mean: Tensor, var: Tensor) -> Tensor:
    """E[sigmoid(f)], f ~ N(mean, var), by 100-node probabilists' Gauss-Hermite in numpy."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(100)
    f = mean.numpy()[..., None] + np.sqrt(var.numpy())[..., None] * nodes
    return torch.as_tensor((weights / (1 + np.exp(-f))).sum(-1) / math.sqrt(2 * math.pi))


def _probit_logits(mean: Tensor, var: Tensor) -> Tensor:
    return mean / torch.sqrt(1 + math.pi * var / 8)


def _log_lik_by_hand(likelihood: str, mean: Tensor, var: Tensor, y: Tensor) -> Tensor:
    """Per-row log p(y_s) under the observation model, built here from the moments."""
    if likelihood == "gaussian":
        return torch.distributions.Normal(mean[:, 0], var[:, 0].sqrt()).log_prob(y)
    if likelihood == "bernoulli":
        p = _bernoulli_probs(mean[:, 0], var[:, 0])
        return torch.where(y == 1, p.log(), (1 - p).log())
    log_probs = torch.log_softmax(_probit_logits(mean, var), -1)
    return log_probs.gather(-1, y[:, None]).squeeze(-1)


@pytest.mark.parametrize("likelihood", ["gaussian", "bernoulli", "categorical"])
def test_sites_and_pointwise_log_likelihood(likelihood):
    """Sites and shapes; the pointwise terms of two different posterior draws are each draw's
    per-row log density of the observed y (computed by hand from the draw's output moments);
    and ``p_test`` holds the class probabilities of ``y_test``."""
    pyro.set_rng_seed(0)
    n_out = {"gaussian": 1, "bernoulli": 1, "categorical": 3}[likelihood]
    gpn = SampledTargetsGPN([2, 3, n_out], likelihood=likelihood, num_inducing=5)
    x = torch.randn(7, 2, dtype=F64)
    y = (
        torch.randn(7, dtype=F64)
        if likelihood == "gaussian"
        else torch.tensor([0, 1, 0, 1, 1, 0, 1])
    )
    if likelihood == "categorical":
        y = torch.tensor([0, 2, 1, 2, 1, 0, 1])
    traces = [poutine.trace(gpn.model).get_trace(x, y, x[:4]) for _ in range(2)]
    trace = traces[0]
    shapes = {k: tuple(v["value"].shape) for k, v in trace.nodes.items() if v["type"] == "sample"}
    assert shapes["z1"] == (3, 5) and shapes["W2"] == (n_out, 3)
    assert ("sigma2" in shapes) == (likelihood == "gaussian")
    draws = [{k: t.nodes[k]["value"] for k in gpn.parameter_sites()} for t in traces]
    samples = {k: torch.stack([draw[k] for draw in draws]) for k in gpn.parameter_sites()}
    terms = gpn.pointwise_log_likelihood(samples, x, y)
    assert terms.shape == (2, 7)
    for d, draw in enumerate(draws):
        mean, var = _output_moments_by_hand(gpn, draw, x)
        torch.testing.assert_close(terms[d], _log_lik_by_hand(likelihood, mean, var, y))
    assert (terms[0] - terms[1]).abs().max() > 1e-3  # the two draws are told apart
    if likelihood == "gaussian":
        return
    mean, var = _output_moments_by_hand(gpn, draws[0], x[:4])
    probs = trace.nodes["p_test"]["value"]
    assert probs.shape == (4, 2 if likelihood == "bernoulli" else 3)
    fn = trace.nodes["y_test"]["fn"]
    if likelihood == "bernoulli":
        # column 1 is P(y = 1): the y_test site's Bernoulli probability
        torch.testing.assert_close(probs[:, 1], fn.probs)
        torch.testing.assert_close(probs[:, 1], _bernoulli_probs(mean[:, 0], var[:, 0]))
        torch.testing.assert_close(probs[:, 0], 1 - probs[:, 1])
    else:
        torch.testing.assert_close(probs, torch.softmax(_probit_logits(mean, var), -1))
        torch.testing.assert_close(fn.probs, probs)


def test_categorical_observation_is_the_probit_approximation():
    """Logits ``mean / sqrt(1 + pi var / 8)`` at given moments; the variance correction matters
    (different variances per class change the class probabilities)."""
    gpn = SampledTargetsGPN([2, 3], likelihood="categorical")
    mean = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.2, -0.3]], dtype=F64)
    var = torch.tensor([[0.1, 4.0, 9.0], [2.0, 0.5, 6.0]], dtype=F64)
    fn = gpn.observation(mean, var)
    want = torch.softmax(mean / torch.sqrt(1 + math.pi * var / 8), -1)
    torch.testing.assert_close(fn.probs, want)
    assert (want - torch.softmax(mean, -1)).abs().max() > 0.05


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sizes": [2]}, "sizes"),
        ({"likelihood": "poisson"}, "likelihood"),
        ({"likelihood": "bernoulli", "sizes": [2, 2]}, "bernoulli"),
        ({"likelihood": "categorical", "sizes": [2, 1]}, "categorical"),
        ({"num_inducing": 1}, "num_inducing"),
        ({"inducing_range": (1.0, -1.0)}, "inducing_range"),
        ({"lengthscale": 0.0}, "lengthscale"),
        ({"jitter": -1.0}, "jitter"),
        ({"dtype": torch.int64}, "dtype"),
        ({"dtype": torch.float16}, "dtype"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SampledTargetsGPN(**({"sizes": [2, 1]} | kwargs))


def test_bad_labels_raise():
    gpn = SampledTargetsGPN([2, 1], likelihood="bernoulli")
    with pytest.raises(ValueError, match="labels"):
        gpn.model(torch.zeros(3, 2, dtype=F64), torch.tensor([0, 2, 1]))
