"""``respond``: the float64 layers' explicit ``C`` and the rows it cannot give accurately.

In float64 the layers evaluate the variance with the explicit ``C`` (``Khat`` of a variational
posterior, ``(K + S)^-1`` of virtual observations). Where a unit is ill-conditioned (a long
lengthscale against the inducing spacing) and its output variance tiny (a nearly collapsed
posterior, target variances near the jitter), ``C``'s own rounding error exceeded issue 13's
float64 target (1e-6 relative) by up to 800x; :func:`pyro_gpn.layers.respond._with_factored_rows`
recomputes those rows from ``C``'s factors. Checked here against adaptive quadrature (scipy,
:func:`tests.moments.test_cpu_layer._quadrature_moments`, independent of the library).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pyro_gpn import GPNLayer, Moments, VariationalGPNLayer
from pyro_gpn.layers import respond as respond_module
from pyro_gpn.layers.respond import respond
from pyro_gpn.moments.backend import backend, triton_available, triton_interpret
from tests.moments.test_cpu_layer import _quadrature_moments

pytestmark = pytest.mark.usefixtures("fresh_param_store")

F64 = torch.float64
R = 14
V = np.linspace(-2, 2, R)
MUS, VARS = (-6.0, -1.1, 0.3, 2.5), (0.0, 1e-8, 1e-3, 0.3, 4.0)


def _activations() -> Moments:
    mean = torch.tensor([[mu for mu in MUS for _ in VARS]], dtype=F64).T
    var = torch.tensor([[v for _ in MUS for v in VARS]], dtype=F64).T
    return Moments(mean, var=var)


def _unit(response: str, lengthscale: float, spread: float):
    """A one-unit float64 layer on 14 points in ``[-2, 2]`` and its quadrature factors
    ``(L, m, T)``: ``"whitened"``, a variational posterior of scale ``spread`` (``U = L z``,
    ``q(z) = N(m, T T^T)``, ``L L^T = K + 1e-6 I``); ``"observations"``, smooth targets
    ``tanh(V)`` with target variances ``spread`` (``L L^T = K + S + jitter``, ``m = L^-1 U``,
    ``T = 0``)."""
    gram = np.exp(-0.5 * (V[:, None] - V) ** 2 / lengthscale**2)
    if response == "whitened":
        g = np.random.default_rng(0)
        layer = VariationalGPNLayer(1, 1, num_inducing=R, weights="point", dtype=F64)
        chol = np.linalg.cholesky(gram + layer.response.jitter * np.eye(R))
        m = g.standard_normal(R)
        T = np.tril(0.3 * spread * g.standard_normal((R, R)), -1)
        T = T + np.diag(spread * (0.5 + g.random(R)))
        with torch.no_grad():
            layer.response.targets_loc.copy_(torch.tensor(m).reshape(1, -1))
            layer.response.targets_scale_tril = torch.tensor(T).unsqueeze(0)
    else:
        layer = GPNLayer(1, 1, num_inducing=R, dtype=F64)
        chol = np.linalg.cholesky(gram + (spread + layer.response.jitter) * np.eye(R))
        targets = np.tanh(V)
        m, T = np.linalg.solve(chol, targets), np.zeros((R, R))
        with torch.no_grad():
            layer.response.targets.copy_(torch.tensor(targets).reshape(1, -1))
            layer.response.target_variances = torch.full((1, R), spread, dtype=F64)
    layer.lengthscales = torch.tensor([lengthscale], dtype=F64)
    np.testing.assert_allclose(layer.inducing_points.detach().numpy()[0], V, atol=1e-12)
    return layer, (chol, m, T)


CASES = [
    ("whitened", 0.4, 1e-3),
    ("whitened", 2.0, 1e-3),  # the gap: 8.2e-4 (fused), 4.8e-5 (reference) before
    ("whitened", 4.0, 1e-3),
    ("whitened", 2.0, 0.3),
    ("observations", 0.4, 1e-6),
    ("observations", 2.0, 1e-6),  # 1.6e-4 (fused), 2.0e-4 (reference) before
    ("observations", 4.0, 1e-6),
    ("observations", 4.0, 1e-4),
]


# the Triton kernels: compiled on a GPU, else in Triton's interpreter on the CPU (CI)
TRITON = pytest.param(
    "triton",
    marks=pytest.mark.skipif(
        not (triton_available() and (torch.cuda.is_available() or triton_interpret())),
        reason="needs triton, and CUDA or TRITON_INTERPRET=1",
    ),
)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("kind", ["cpu", "reference", TRITON])
@pytest.mark.parametrize(("response", "lengthscale", "spread"), CASES)
def test_float64_layer_variance_against_quadrature(kind, response, lengthscale, spread):
    """Issue 13's float64 target: the noise-free output variance to 1e-6 relative and the mean
    to 1e-8 of ``|E f| + sd f``, on the fused CPU layer, the reference path and the Triton
    kernels (compiled on a GPU, interpreted on the CPU), from activations 40 lengthscales outside
    the grid to broad ones, deterministic ones included."""
    layer, (chol, m, T) = _unit(response, lengthscale, spread)
    acts = _activations()
    if kind == "triton" and torch.cuda.is_available():
        layer, acts = layer.cuda(), Moments(acts.mean.cuda(), var=acts.variance.cuda())
    with backend(kind):
        out = respond(layer, acts, "meanvar", noise=False)
    out = Moments(out.mean.detach().cpu(), var=out.var.detach().cpu())
    for i, (mu, v) in enumerate((mu, v) for mu in MUS for v in VARS):
        want_mean, want_var = _quadrature_moments(mu, v, lengthscale, chol, m, T)
        scale = abs(want_mean) + math.sqrt(want_var)  # docs/results/accuracy.md's mean error
        assert abs(float(out.mean[i, 0]) - want_mean) <= 1e-8 * scale, (mu, v)
        assert abs(float(out.var[i, 0]) - want_var) <= 1e-6 * want_var, (mu, v)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize(("response", "lengthscale", "spread"), [CASES[1], CASES[5]])
def test_cov_mode_diagonal_against_quadrature(response, lengthscale, spread):
    """``"cov"`` mode with a full activation covariance (the reference path): the diagonal is
    refined as ``"meanvar"``'s variances are (1e-6 against quadrature), the rest of the
    covariance left as the closed form gives it."""
    layer, (chol, m, T) = _unit(response, lengthscale, spread)
    acts = _activations()
    full = Moments(acts.mean, cov=acts.variance.unsqueeze(-1))  # [S, 1, 1]
    with backend("reference"):
        out = respond(layer, full, "cov", noise=False)
    assert out.cov is not None
    for i, (mu, v) in enumerate((mu, v) for mu in MUS for v in VARS):
        _, want_var = _quadrature_moments(mu, v, lengthscale, chol, m, T)
        assert abs(float(out.cov[i, 0, 0]) - want_var) <= 1e-6 * want_var, (mu, v)


def _wide_grid_unit(lengthscale: float) -> GPNLayer:
    """A unit on 61 points in ``[-15, 15]`` with targets 0 and ``S = 1e-6``: its output
    variance is the tiny Nystrom residual, ~1e-6, for activations of any width."""
    layer = GPNLayer(1, 1, num_inducing=61, inducing_range=(-15, 15), dtype=F64)
    with torch.no_grad():
        layer.response.targets.zero_()
        layer.response.target_variances = torch.full((1, 61), 1e-6, dtype=F64)
    layer.lengthscales = torch.tensor([lengthscale], dtype=F64)
    return layer


def _wide_grid_variance(layer: GPNLayer, variance: float) -> float:
    """The output variance of :func:`_wide_grid_unit`'s ``layer`` for ``a ~ N(0, variance)``
    by adaptive quadrature (scipy): ``E[1 - |L^-1 alpha(a)|^2]``, the mean function being 0."""
    from scipy import integrate
    from scipy.linalg import solve_triangular

    points = layer.inducing_points.detach().numpy()[0]
    lengthscale = float(layer.lengthscales.detach()[0])
    gram = np.exp(-0.5 * (points[:, None] - points) ** 2 / lengthscale**2)
    chol = np.linalg.cholesky(gram + (1e-6 + layer.response.jitter) * np.eye(len(points)))

    def residual(a):
        x = solve_triangular(chol, np.exp(-0.5 * (a - points) ** 2 / lengthscale**2), lower=True)
        return (1.0 - x @ x) * math.exp(-0.5 * a**2 / variance) / math.sqrt(2 * math.pi * variance)

    sd = math.sqrt(variance)
    inside = [float(p) for p in points if abs(p) < 12 * sd]
    return integrate.quad(
        residual, -12 * sd, 12 * sd, epsabs=0.0, epsrel=1e-12, limit=2000, points=inside
    )[0]


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("kind", ["cpu", "reference"])
@pytest.mark.parametrize(
    ("lengthscale", "variance", "refined"),
    [(1.0, 9.0, True), (0.8, 9.0, True), (1.0, 30.0, False), (0.8, 40.0, False)],
)
def test_broad_activations_against_quadrature(kind, lengthscale, variance, refined, monkeypatch):
    """Activations 3 and 3.75 lambda wide are refined at the trapezoidal nodes of their tier
    (Gauss-Hermite with the old narrow regime's nodes erred by 1.9e-3 and 4.7e-3 here, and the
    closed form that then served them by 4.5e-5 and 7.6e-7: a review found it). At 5.5 lambda
    the variance (1e-3) is above the explicit ``C``'s error and the layer leaves the row to the
    row kernels' own rule; past ``NODE_MAX_STD_RATIO lambda`` (7.9) the closed form serves.
    Within 1e-8 of adaptive quadrature where refined, 1e-6 otherwise."""
    calls = _count_refined(monkeypatch)
    layer = _wide_grid_unit(lengthscale)
    want = _wide_grid_variance(layer, variance)
    acts = Moments(torch.zeros(1, 1, dtype=F64), var=torch.full((1, 1), variance, dtype=F64))
    with backend(kind):
        got = float(respond(layer, acts, "meanvar", noise=False).var)
    assert calls == ([1] if refined else [])
    assert abs(got - want) <= (1e-8 if refined else 1e-6) * want


@pytest.mark.parametrize("kind", ["cpu", "reference"])
def test_refined_rows_carry_the_noise(kind, monkeypatch):
    """With an output noise small enough that rows are still refined, the variance returned is
    the refined noise-free variance plus the noise (the refinement subtracts it and adds it
    back)."""
    calls = _count_refined(monkeypatch)
    layer = _unit("whitened", 2.0, 1e-3)[0]
    layer.noise_std = torch.tensor([1e-4], dtype=F64)
    acts = _activations()
    with backend(kind):
        quiet = respond(layer, acts, "meanvar", noise=False)
        noisy = respond(layer, acts, "meanvar")
    assert len(calls) == 2 and calls[1] > 0
    torch.testing.assert_close(noisy.var, quiet.var + 1e-8, rtol=1e-12, atol=0)


def test_cov_mode_refines_only_the_diagonal(monkeypatch):
    """Three units with a full activation covariance: the refined covariance differs from the
    closed form's only on its diagonal."""
    layer = VariationalGPNLayer(3, 3, num_inducing=R, weights="point", dtype=F64)
    layer.lengthscales = torch.full((3,), 2.0, dtype=F64)
    layer.response.targets_scale_tril = torch.diag_embed(torch.full((3, R), 1e-3, dtype=F64))
    g = torch.Generator().manual_seed(0)
    a = torch.randn(20, 3, 3, generator=g, dtype=F64) / 3
    acts = Moments(torch.randn(20, 3, generator=g, dtype=F64), cov=a @ a.mT + 1e-3 * torch.eye(3))
    with backend("reference"):
        refined = respond(layer, acts, "cov", noise=False).cov
        monkeypatch.setattr(respond_module, "_with_factored_rows", lambda *a, **k: a[2])
        closed = respond(layer, acts, "cov", noise=False).cov
    off = ~torch.eye(3, dtype=torch.bool)
    assert torch.equal(refined[:, off], closed[:, off])
    assert not torch.equal(refined.diagonal(dim1=-2, dim2=-1), closed.diagonal(dim1=-2, dim2=-1))


def _count_refined(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of rows of each refinement (``node_variance_rows`` calls) from now on."""
    calls = []
    original = respond_module.node_variance_rows

    def counting(out_var, rows, *args):
        calls.append(int(rows.sum()))
        return original(out_var, rows, *args)

    monkeypatch.setattr(respond_module, "node_variance_rows", counting)
    return calls


@pytest.mark.parametrize("kind", ["cpu", "reference"])
def test_only_ill_conditioned_rows_are_refined(kind, monkeypatch):
    """The refinement is the exception: a layer at its initial state (lengthscale 0.4, the
    library's default posterior or target variances) and a long lengthscale with a broad
    posterior refine nothing; a collapsed posterior at lengthscale 2 refines rows of its
    noise-free variance. With the output noise added the variance returned is larger, the
    explicit ``C``'s error smaller against it: no row is refined, and the result is still the
    refined noise-free variance plus the noise to 1e-6."""
    calls = _count_refined(monkeypatch)
    acts = _activations()
    for layer in (
        VariationalGPNLayer(1, 1, num_inducing=R, weights="point", dtype=F64),
        GPNLayer(1, 1, num_inducing=R, dtype=F64),
        _unit("whitened", 2.0, 1.0)[0],
    ):
        with backend(kind):
            respond(layer, acts, "meanvar")
    assert calls == []
    layer = _unit("whitened", 2.0, 1e-3)[0]
    with backend(kind):
        quiet = respond(layer, acts, "meanvar", noise=False)
        assert len(calls) == 1 and calls[0] > 0
        noisy = respond(layer, acts, "meanvar")
    assert len(calls) == 1
    noise = layer.noise_std.detach().square()
    torch.testing.assert_close(noisy.var, quiet.var + noise, rtol=1e-6, atol=0)


NAMES = (
    "lengthscales_unconstrained",
    "response.targets_loc",
    "response.targets_scale_tril_unconstrained",
)


def test_refined_rows_are_differentiable(monkeypatch):
    """``gradcheck`` through the refined rows (float64, the fused CPU layer): the activations'
    moments, the lengthscale and the posterior's mean and scale (swapped in by
    ``torch.func.functional_call``), on a collapsed posterior at lengthscale 2. The rows refined
    lie far from the decision's threshold, so it does not flip under the finite differences."""
    from torch.func import functional_call

    layer, _ = _unit("whitened", 2.0, 1e-3)
    acts = _activations()

    def output(mean, var, *params):
        out = functional_call(
            layer,
            dict(zip(NAMES, params, strict=True)),
            (Moments(mean, var=var), "meanvar", False),
            strict=False,
        )
        return out.mean, out.var

    layer.forward = lambda moments, mode, noise: respond(layer, moments, mode, noise)
    values = dict(layer.named_parameters())
    inputs = (
        acts.mean.clone().requires_grad_(True),
        (acts.variance + 1e-2).requires_grad_(True),  # off 0 by more than the steps below
        *(values[n].detach().clone().requires_grad_(True) for n in NAMES),
    )
    calls = _count_refined(monkeypatch)
    with backend("cpu"):
        output(*inputs)
        assert calls and calls[0] > 0
        # steps of 1e-3: the closed-form rows round to ~1e-10 absolute, smaller steps are noise
        assert torch.autograd.gradcheck(output, inputs, eps=1e-3, atol=1e-6, rtol=1e-4)


def test_a_recurrent_layer_decides_once_per_sequence(monkeypatch):
    """A recurrent layer responds at every time step with the weights of one
    :func:`~pyro_gpn.layers.respond.response_parts`: the explicit ``C``'s error scale is
    computed once per sequence, not per step."""
    from pyro_gpn.layers import GPNRecurrent

    calls = []
    original = respond_module._inverse_trace
    monkeypatch.setattr(
        respond_module, "_inverse_trace", lambda layer: calls.append(1) or original(layer)
    )
    torch.manual_seed(0)
    layer = GPNRecurrent(2, 3, dtype=F64)
    x = torch.randn(4, 5 * 2, dtype=F64)  # 5 time steps
    out = layer(x, "meanvar")
    assert calls == [1]
    assert torch.isfinite(out.var).all()


def _refuse(name):
    def check(*args, **kwargs):
        raise AssertionError(f"{name} ran on the layers' per-step path")

    return check


@pytest.mark.parametrize("kind", ["reference", "cpu"])
def test_layers_call_the_unchecked_implementations(monkeypatch, kind):
    """The public response_moments / virtual_observation_weights / squared_exponential and the
    CPU kernels check their arguments (a device synchronisation for the values); the layers
    call the private implementations, which check nothing, every step."""
    from pyro_gpn import GPNNet
    from pyro_gpn import kernels as kernels_module
    from pyro_gpn.models.variational import VariationalGPN
    from pyro_gpn.moments import cpu_kernels, propagate, weights

    monkeypatch.setattr(propagate, "_check_response_arguments", _refuse("response checks"))
    monkeypatch.setattr(weights, "_check_weight_arguments", _refuse("weight checks"))
    monkeypatch.setattr(cpu_kernels, "_check_shapes", _refuse("cpu kernel checks"))
    monkeypatch.setattr(kernels_module, "_check_squared_exponential", _refuse("kernel checks"))
    monkeypatch.setattr(kernels_module, "_check_gpn_kernel", _refuse("gpn kernel checks"))
    torch.manual_seed(0)
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 1, dtype=torch.float64)
    with backend(kind):
        for mode in ("meanvar", "cov"):
            net = GPNNet([3, 4, 1], head="gaussian", dtype=torch.float64, mode=mode)
            net.loss(x, y).backward()
            net.predict(x)
            vgpn = VariationalGPN(
                [3, 4, 1], head="gaussian", dtype=torch.float64, mode=mode, num_data=6
            )
            vgpn.loss(x, y).backward()


@pytest.mark.parametrize("kind", ["cpu", "reference"])
@pytest.mark.parametrize("ratio", [0.05, 1.26, 1.5, 2.0, 4.0])
def test_ill_conditioned_units_across_the_regimes(kind, ratio):
    """Three units with random targets and ``S`` near the jitter (``lambda / h`` 2.6 to 3.9,
    ``|beta|`` ~1e5), at ``sqrt(v) / lambda`` from 0.05 to 4: the layer's variance within 1e-6
    of a 3,001-node trapezoidal rule through ``C``'s factor, written out here. Just past 1.25,
    where the narrow regime used to end, the closed form was off by up to 1.7e-5."""
    g = torch.Generator().manual_seed(17)
    targets = torch.randn(3, R, generator=g, dtype=F64)
    variances = 1e-6 * (0.5 + torch.rand(3, R, generator=g, dtype=F64))
    ls = 0.8 + 0.4 * torch.rand(3, generator=g, dtype=F64)
    layer = GPNLayer(1, 3, num_inducing=R, dtype=F64)
    with torch.no_grad():
        layer.response.targets.copy_(targets)
        layer.response.target_variances = variances
    layer.lengthscales = ls
    mean = torch.linspace(-2.5, 2.5, 21, dtype=F64)[:, None] + torch.tensor([0.0, 0.05, 0.11])
    var = (ratio * ls) ** 2 * torch.ones(21, 3, dtype=F64)
    with backend(kind):
        got = respond(layer, Moments(mean, var=var), "meanvar", noise=False).var.detach()
    points = torch.tensor(V, dtype=F64)
    gram = torch.exp(-0.5 * (points[:, None] - points) ** 2 / ls[:, None, None] ** 2)
    chol = torch.linalg.cholesky(gram + torch.diag_embed(variances + layer.response.jitter))
    beta = torch.cholesky_solve(targets.unsqueeze(-1), chol).squeeze(-1)  # [3, R]
    z = torch.linspace(-10, 10, 3001, dtype=F64)
    w = torch.exp(-0.5 * z * z)
    w = w / w.sum()
    want = torch.empty(21, 3, dtype=F64)
    for n in range(3):
        a = mean[:, n, None] + var[:, n, None].sqrt() * z  # [21, G]
        alpha = torch.exp(-0.5 * (a[..., None] - points) ** 2 / ls[n] ** 2)  # [21, G, R]
        m = alpha @ beta[n]
        x = torch.linalg.solve_triangular(chol[n], alpha.reshape(-1, R).T, upper=False)
        cond = 1 - x.square().sum(0).reshape(21, -1)
        spread = m - (m @ w)[:, None]
        want[:, n] = cond @ w + spread.square() @ w
    assert float(((got - want).abs() / want).max()) < 1e-6
