"""The narrow-regime variance (:mod:`pyro_gpn.moments.quadrature`): the closed-form error rule
and the per-(sample, unit) node tiers (Gauss-Hermite, then trapezoidal), in the reference path
and the CPU kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pyro_gpn.moments.propagate as propagate
from pyro_gpn.moments import Moments, response_moments, virtual_observation_weights
from pyro_gpn.moments.backend import backend, numba_available
from pyro_gpn.moments.quadrature import (
    NODE_MAX_STD_RATIO,
    NODE_TIERS,
    _node_values,
    closed_form_error_scale,
    explicit_c_rows,
    node_rule,
    node_tier,
)
from tests.gradients import variance_slope_at_zero

F64 = torch.float64


def _layer(lengthscale: float, target_var: float, units: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    points = torch.linspace(-2, 2, 14, dtype=F64).expand(units, -1).clone()
    targets = torch.randn(units, 14, generator=g, dtype=F64)
    variances = torch.full_like(points, target_var)
    ls = torch.full((units,), lengthscale, dtype=F64)
    kappa, beta = virtual_observation_weights(points, targets, variances, ls)
    return points, ls, beta, kappa


def _activations(ls: float, samples: int = 40, units: int = 3, seed: int = 1):
    """Means inside and outside the range; sd / lambda spread over every node tier."""
    g = torch.Generator().manual_seed(seed)
    mean = 3 * torch.randn(samples, units, generator=g, dtype=F64)
    ratio = NODE_MAX_STD_RATIO * torch.rand(samples, units, generator=g, dtype=F64)
    ratio[::7] = 0.0  # deterministic rows: one node
    return mean, (ratio * ls).square()


def test_error_scale_grows_with_size_and_dtype():
    assert closed_form_error_scale(14, F64) < closed_form_error_scale(30, F64)
    assert closed_form_error_scale(14, F64) < closed_form_error_scale(14, torch.float32)
    assert closed_form_error_scale(14, F64) == pytest.approx(4 * 36 * torch.finfo(F64).eps)


@pytest.mark.parametrize("ill, expect_nodes", [(False, False), (True, True)])
def test_quadrature_only_where_the_closed_form_is_not_provably_accurate(
    ill, expect_nodes, monkeypatch
):
    """Well-conditioned units (lambda / h = 1.3, S = 0.1) take the closed form everywhere; an
    ill-conditioned one (lambda / h = 6.5, S = 1e-6) needs the nodes in the narrow regime."""
    points, ls, beta, kappa = _layer(2.0, 1e-6) if ill else _layer(0.4, 0.1)
    mean, var = _activations(float(ls[0]))
    calls = []
    original = propagate.node_variance_rows

    def spy(out_var, rows, *args):
        calls.append(int(rows.sum()))
        return original(out_var, rows, *args)

    monkeypatch.setattr(propagate, "node_variance_rows", spy)
    with backend("reference"):
        response_moments(Moments(mean, var=var), points, ls, beta, kappa, None, "meanvar")
    assert bool(calls) == expect_nodes
    if expect_nodes:
        assert calls[0] > 0.5 * mean.numel()


@pytest.mark.parametrize("which", ["reference", "cpu"])
def test_per_row_tiers_agree_with_the_widest_rule(which):
    """Every row with its own node tier against all rows at the largest tier (209 trapezoidal
    nodes), on an ill-conditioned unit where the nodes are used: values and the gradient
    w.r.t. the means."""
    if which == "cpu" and not numba_available():
        pytest.skip("numba is not installed")
    points, ls, beta, kappa = _layer(1.2, 1e-4)
    mean, var = _activations(float(ls[0]))
    mean.requires_grad_(True)
    with backend(which):
        out = response_moments(Moments(mean, var=var), points, ls, beta, kappa, None, "meanvar")
    (grad,) = torch.autograd.grad(out.var.sum(), mean)
    m = mean.detach().requires_grad_(True)
    wide = _node_values(m, var, points, ls, beta, kappa, None, None, len(NODE_TIERS) - 1).variance
    (grad_wide,) = torch.autograd.grad(wide.clamp_min(0).sum(), m)
    torch.testing.assert_close(out.var, wide.clamp_min(0), rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(grad, grad_wide, rtol=1e-5, atol=1e-8)
    assert torch.isfinite(grad).all()


@pytest.mark.skipif(not numba_available(), reason="numba is not installed")
# (at S = 1e-6 an explicit float64 C itself is off by ~1e-3, docs/results/accuracy.md, and the
# kernels' midpoint form of alpha^T C alpha rounds differently from the reference's)
@pytest.mark.parametrize("lengthscale, target_var", [(0.4, 0.1), (1.2, 1e-4), (2.0, 1e-4)])
def test_cpu_kernels_take_the_same_per_row_decisions_as_the_reference(lengthscale, target_var):
    points, ls, beta, kappa = _layer(lengthscale, target_var, units=5, seed=3)
    mean, var = _activations(lengthscale, samples=33, units=5, seed=4)
    outs = {}
    for which in ("reference", "cpu"):
        with backend(which):
            o = response_moments(Moments(mean, var=var), points, ls, beta, kappa, None, "meanvar")
        outs[which] = o
    # the mean is a linear form in beta (|beta| up to 1e6 at S = 1e-6): equal up to its rounding
    atol = 100 * torch.finfo(F64).eps * float(beta.abs().sum(-1).max())
    torch.testing.assert_close(outs["cpu"].mean, outs["reference"].mean, rtol=1e-8, atol=atol)
    # same rule per row; the values differ by the rounding of alpha^T C alpha (midpoint form in
    # the kernels), which an explicit C amplifies by cond(K + S): 1.7e-7 at lambda / h = 6.5
    torch.testing.assert_close(outs["cpu"].var, outs["reference"].var, rtol=1e-6, atol=1e-12)


def test_node_tiers_are_ordered_and_end_at_the_narrow_regimes_bound():
    ratios = [ratio for ratio, _, _ in NODE_TIERS]
    counts = [nodes for _, nodes, _ in NODE_TIERS]
    assert ratios == sorted(ratios) and counts == sorted(counts)
    assert ratios[-1] == NODE_MAX_STD_RATIO and counts[0] == 1
    assert [node_tier(r) for r in ratios] == list(range(len(NODE_TIERS)))
    assert node_tier(0.0) == 0 and node_tier(0.05) == 1 and node_tier(1e9) == len(NODE_TIERS) - 1


@pytest.mark.parametrize("tier", range(1, len(NODE_TIERS)))
def test_every_tiers_rule_integrates_against_the_standard_normal(tier):
    """Weights summing to 1, ``E[Z^2] = 1``, ``E[Z^4] = 3`` and ``E[cos(t Z)] = exp(-t^2 / 2)``
    at the frequency of a kernel bump at the tier's largest ratio (``t = ratio``: the
    integrands ``alpha(mu + sqrt(v) z)`` vary on ``z``-scales of ``lambda / sqrt(v)``)."""
    z, w = node_rule(tier)
    ratio, nodes, rule = NODE_TIERS[tier]
    assert z.shape == w.shape == (nodes,) and (w > 0).all()
    assert abs(w.sum() - 1) < 1e-14
    assert abs(w @ z**2 - 1) < 1e-12 and abs(w @ z**4 - 3) < 1e-11
    assert abs(w @ np.cos(ratio * z) - np.exp(-(ratio**2) / 2)) < 1e-12


def _explicit_reference(mean, var, points, ls, beta, kappa, nodes: int = 3001, half: float = 10.0):
    """``Var[f]`` by a trapezoidal rule written out here, at ``nodes`` points on
    ``[-half, half]`` standard deviations, with the explicit ``C = kappa``: ``[S, N]``."""
    z = torch.linspace(-half, half, nodes, dtype=F64)
    w = torch.exp(-0.5 * z * z)
    w = w / w.sum()
    a = mean[..., None] + var.sqrt()[..., None] * z  # [S, N, G]
    alpha = torch.exp(-0.5 * (a[..., None] - points[:, None, :]) ** 2 / ls[:, None, None] ** 2)
    m = torch.einsum("sngr,nr->sng", alpha, beta)
    cond = 1 - torch.einsum("sngr,nrt,sngt->sng", alpha, kappa, alpha)
    spread = m - (m * w).sum(-1, keepdim=True)
    return (cond * w).sum(-1) + (spread.square() * w).sum(-1)


@pytest.mark.parametrize("which", ["reference", "cpu"])
@pytest.mark.parametrize("ratio", [1.26, 1.5, 2.0, 3.0, 4.5])
def test_activations_past_the_old_narrow_bound_are_accurate_in_float64(which, ratio):
    """``sqrt(v) / lambda`` from just past 1.25 (where the narrow regime used to end and the
    closed form, about ``|beta|^2 eps`` off, missed 1e-6 by up to 30x on this layer) to 4.5:
    quadrature where the closed form is not provably accurate, within 1e-7 of a 3,001-node
    trapezoidal rule (converged: a 2,001-node rule on [-9.5, 9.5] agrees to 1e-10)."""
    if which == "cpu" and not numba_available():
        pytest.skip("numba is not installed")
    g = torch.Generator().manual_seed(17)
    points = torch.linspace(-2, 2, 14, dtype=F64).expand(3, -1).clone()
    targets = torch.randn(3, 14, generator=g, dtype=F64)
    variances = 1e-6 * (0.5 + torch.rand(3, 14, generator=g, dtype=F64))
    ls = 0.8 + 0.4 * torch.rand(3, generator=g, dtype=F64)  # lambda / h 2.6 to 3.9
    kappa, beta = virtual_observation_weights(points, targets, variances, ls, jitter=1e-6)
    mean = torch.linspace(-2.5, 2.5, 21, dtype=F64)[:, None] + torch.tensor([0.0, 0.05, 0.11])
    var = (ratio * ls) ** 2 * torch.ones(21, 3, dtype=F64)
    ref = _explicit_reference(mean, var, points, ls, beta, kappa)
    check = _explicit_reference(mean, var, points, ls, beta, kappa, 2001, 9.5)
    assert float(((check - ref).abs() / ref).max()) < 1e-10
    with backend(which):
        out = response_moments(Moments(mean, var=var), points, ls, beta, kappa, None, "meanvar")
    assert float(((out.var - ref).abs() / ref).max()) < 1e-7


@pytest.mark.parametrize("tier", range(len(NODE_TIERS)))
def test_each_tiers_rule_is_the_rule_it_names(tier):
    """The nodes and weights of each tier, written out here: ``"trapezoid"`` equally spaced on
    ``[-8, 8]`` with weights ``exp(-z^2 / 2)`` normalised; ``"gauss-hermite"`` exact for
    ``E[Z^k]`` up to ``k = 2 nodes - 1`` (the defining property; ``(k - 1)!!`` for even ``k``).
    Caught: a tier given the other rule at its node count (Gauss-Hermite's 45 nodes at 0.75
    pass the moment checks above), a half-width of 6."""
    ratio, nodes, rule = NODE_TIERS[tier]
    z, w = node_rule(tier)
    if rule == "trapezoid":
        want_z = -8.0 + 16.0 * np.arange(nodes) / (nodes - 1)
        want_w = np.exp(-0.5 * want_z**2)
        np.testing.assert_allclose(z, want_z, rtol=0, atol=1e-13)
        np.testing.assert_allclose(w, want_w / want_w.sum(), rtol=1e-12, atol=0)
    else:
        assert rule == "gauss-hermite" and ratio <= 0.4
        for k in range(0, min(2 * nodes, 30)):
            even = float(np.prod(np.arange(k - 1 + k % 2, 0, -2, dtype=float)))  # E[Z^2j] >= k
            want = 0.0 if k % 2 else even
            assert abs(w @ z**k - want) <= 1e-12 * even, k
        if nodes > 1:  # not exact one degree beyond: E[Z^(2 nodes)] is missed
            want = float(np.prod(np.arange(2 * nodes - 1, 0, -2, dtype=float)))
            assert abs(w @ z ** (2 * nodes) - want) > 1e-9 * want


def test_deterministic_rows_slope_through_the_factor():
    """``d var / dv`` at ``v = 0`` on the reference path given ``C``'s Cholesky factor (every
    narrow row evaluated at the nodes, so the deterministic rows take the one-node tier and its
    explicit slope ``m'(x)^2 + s''(x) / 2``), against autograd's derivatives of the mean
    function and the conditional variance written out. Caught: ``v = 0`` sent to the next tier
    (``searchsorted(..., right=True)``), whose nodes all sit at the mean and carry no slope."""
    g = torch.Generator().manual_seed(3)
    points = torch.linspace(-2, 2, 14, dtype=F64).expand(3, -1).clone()
    targets = torch.randn(3, 14, generator=g, dtype=F64)
    ls = torch.tensor([0.5, 0.7, 0.9], dtype=F64)
    kappa, beta, chol = virtual_observation_weights(
        points, targets, torch.full_like(points, 0.05), ls, with_cholesky=True
    )
    a = 1.5 * torch.randn(9, 3, generator=g, dtype=F64)
    want = variance_slope_at_zero(a, points, ls, beta, kappa)
    assert float(want.abs().max()) > 0.1
    v = torch.zeros_like(a, requires_grad=True)
    with backend("reference"):
        var = response_moments(
            Moments(a, var=v), points, ls, beta, kappa, None, "meanvar",
            variance_cholesky=chol,
        ).var  # fmt: skip
    (dv,) = torch.autograd.grad(var.sum(), v)
    torch.testing.assert_close(dv, want, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("lengthscale", [0.5, 1.0, 2.0])
def test_activations_exactly_at_the_narrow_bound_are_narrow(monkeypatch, lengthscale):
    """``sqrt(v) = NODE_MAX_STD_RATIO lambda`` exactly (``lambda`` a power of two: no rounding)
    is in the narrow regime, as documented and as the CPU kernels' ``row_rule`` and
    :func:`explicit_c_rows` take it: given ``C``'s factor every narrow row is evaluated at
    nodes, so the row reaches :func:`node_variance_rows`; a hair beyond it does not."""
    points, ls, beta, kappa = _layer(lengthscale, 1e-2, units=1)
    _, _, chol = virtual_observation_weights(
        points, torch.zeros_like(points), torch.full_like(points, 1e-2), ls, with_cholesky=True
    )
    seen = []
    original = propagate.node_variance_rows

    def spy(out_var, rows, *args):
        seen.append(rows.clone())
        return original(out_var, rows, *args)

    monkeypatch.setattr(propagate, "node_variance_rows", spy)
    bound = (NODE_MAX_STD_RATIO * lengthscale) ** 2
    var = torch.tensor([[bound], [bound * (1 + 1e-12)]], dtype=F64)
    mean = torch.tensor([[0.3], [0.3]], dtype=F64)
    with backend("reference"):
        response_moments(
            Moments(mean, var=var), points, ls, beta, kappa, None, "meanvar",
            variance_cholesky=chol,
        )  # fmt: skip
    assert len(seen) == 1 and seen[0].tolist() == [[True], [False]]
    rows = explicit_c_rows(torch.zeros(2, 1, dtype=F64), var, ls, torch.ones(1, dtype=F64), 1.0)
    assert rows.tolist() == [[True], [False]]
