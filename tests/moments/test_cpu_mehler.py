"""Mehler's series on the fused CPU kernels (``pyro_gpn/moments/cpu_mehler.py``): the compiled
truncation rule against the tensor rule, the compiled pair sum against the sum written out and
the whole-tensor Horner scheme of the reference path, values and gradients, and by gradcheck."""

import math

import pytest
import torch
from torch.autograd import gradcheck

from pyro_gpn.moments import Moments, cross, response_moments, virtual_observation_weights
from pyro_gpn.moments.backend import backend, numba_available

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")
F64 = torch.float64


def _inputs(samples=4, units=5, terms=6, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(samples, units, units, generator=g, dtype=F64)
    cov = 0.9 * torch.tanh(a)  # not symmetric: the kernel takes the symmetric part
    scale = 0.5 + torch.rand(samples, units, generator=g, dtype=F64)
    coef = torch.randn(samples, units, terms, generator=g, dtype=F64)
    return cov.to(dtype), scale.to(dtype), coef.to(dtype)


def _written_out(cov, scale, coef, terms=None):
    """The pair sum term by term (no Horner), each pair to its own number of terms (all of
    ``coef``'s by default), zero diagonal."""
    rho = 0.5 * (cov + cov.mT) * scale.unsqueeze(-1) * scale.unsqueeze(-2)
    if terms is None:
        terms = torch.full(rho.shape, coef.shape[-1]).masked_fill(torch.eye(rho.shape[-1]) > 0, 0)
    return sum(
        (terms > k) * rho.pow(k + 1) * coef[..., k].unsqueeze(-1) * coef[..., k].unsqueeze(-2)
        for k in range(coef.shape[-1])
    )


def _all_terms(cov, num):
    eye = torch.eye(cov.shape[-1], dtype=torch.bool)
    return torch.full(cov.shape, num, dtype=torch.int32).masked_fill(eye, 0)


@pytest.mark.parametrize("units, terms", [(1, 1), (2, 1), (5, 6), (7, 40)])
def test_pairs_match_the_sum_written_out(units, terms):
    """Values and every gradient against autograd through the written-out sum, every pair with
    its own number of terms (some none, some not served)."""
    from pyro_gpn.moments.cpu_mehler import cpu_mehler_pairs

    cov, scale, coef = _inputs(units=units, terms=terms)
    g = torch.Generator().manual_seed(2)
    per_pair = torch.randint(-1, terms + 1, (4, units, units), generator=g, dtype=torch.int32)
    per_pair = per_pair.triu(1) + per_pair.triu(1).mT  # symmetric, zero diagonal
    inputs = [t.requires_grad_(True) for t in (cov, scale, coef)]
    got = cpu_mehler_pairs(*inputs, per_pair)
    want = _written_out(*inputs, per_pair)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    weight = torch.randn(got.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((got * weight).sum(), inputs)
    want_grads = torch.autograd.grad((want * weight).sum(), inputs)
    for x, y in zip(grads, want_grads):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def test_pairs_gradcheck():
    from pyro_gpn.moments.cpu_mehler import cpu_mehler_pairs

    cov, scale, coef = _inputs(samples=2, units=4, terms=5)
    terms = _all_terms(cov, 5)
    inputs = tuple(t.requires_grad_(True) for t in (cov, scale, coef))
    assert gradcheck(lambda *x: cpu_mehler_pairs(*x, terms), inputs)


def test_float32_results_in_float32():
    from pyro_gpn.moments.cpu_mehler import cpu_mehler_pairs

    cov, scale, coef = _inputs(dtype=torch.float32)
    out = cpu_mehler_pairs(cov, scale, coef, _all_terms(cov, coef.shape[-1]))
    assert out.dtype == torch.float32
    want = _written_out(cov.double(), scale.double(), coef.double())
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)


def test_truncation_rule_same_as_the_tensor_rule():
    """:func:`cpu_mehler_terms` against :func:`cross._mehler_terms`: every pair's number of
    terms (and so the same pairs served), over random pairs and the edge cases (a zero
    covariance, a unit with ``B = 0``, one with ``out_var = 0`` or NaN, ``|rho|`` just below and
    at 1)."""
    from pyro_gpn.moments.cpu_mehler import cpu_mehler_terms

    g = torch.Generator().manual_seed(3)
    samples, units = 6, 7
    a = torch.randn(samples, units, units, generator=g, dtype=F64)
    cov = torch.tanh(a + a.mT)
    cov[0, 1, 2] = cov[0, 2, 1] = 0.0
    cov[1, 0, 3] = cov[1, 3, 0] = 1.0 - 1e-12
    cov[2, 0, 3] = cov[2, 3, 0] = 1.0
    scale = torch.ones(samples, units, dtype=F64)
    per_unit = torch.randn(samples, units, generator=g, dtype=F64) + 3.0
    per_unit[3, 4] = math.inf  # B = 0
    per_unit[4, 5] = -math.inf  # out_var = 0
    per_unit[5, 1] = math.nan  # out_var NaN
    per_unit[2, 0] = math.inf  # B = 0 beside |rho| = 1 (sample 2's pair 0, 3): served, all zero
    for rtol, max_terms in ((1e-8, 40), (1e-3, 5), (1e-8, 2), (1e-8, 0)):
        ratio = (cov * scale.unsqueeze(-1) * scale.unsqueeze(-2)).masked_fill(
            torch.eye(units, dtype=torch.bool), 0
        )
        saved = cross.MEHLER_RTOL, cross.MEHLER_MAX_TERMS
        cross.MEHLER_RTOL, cross.MEHLER_MAX_TERMS = rtol, max_terms
        try:
            want_largest, want_terms = cross._mehler_terms(ratio, per_unit)
        finally:
            cross.MEHLER_RTOL, cross.MEHLER_MAX_TERMS = saved
        largest, terms, every = cpu_mehler_terms(cov, scale, per_unit, rtol, max_terms)
        assert largest == want_largest == max(1, int(terms.amax()))
        assert torch.equal(terms, want_terms)  # every pair's number of terms
        assert every == bool((want_terms >= 0).all())
        assert bool((terms <= max_terms).all())
        assert not every  # the edge cases include pairs that are not served


def test_layer_covariance_same_with_and_without_the_kernel(monkeypatch):
    """``response_moments`` in ``"cov"`` mode: the compiled pair sum (backend ``"auto"``) and
    the whole-tensor Horner scheme (``"reference"``) agree, values and gradients; the kernel
    is what ``"auto"`` runs."""
    import pyro_gpn.moments.cpu_mehler as cpu_mehler

    g = torch.Generator().manual_seed(0)
    points = torch.linspace(-2, 2, 14, dtype=F64).expand(6, -1)
    targets = torch.randn(6, 14, generator=g, dtype=F64).requires_grad_(True)
    variances = torch.full((6, 14), 0.01, dtype=F64)
    ls = torch.full((6,), 0.4, dtype=F64)
    mean = (1.5 * torch.randn(5, 6, generator=g, dtype=F64)).requires_grad_(True)
    a = torch.randn(5, 6, 6, generator=g, dtype=F64) / 6**0.5
    cov = (a @ a.mT + 0.01 * torch.eye(6, dtype=F64)).requires_grad_(True)
    calls = []
    original = cpu_mehler.cpu_mehler_pairs
    monkeypatch.setattr(cpu_mehler, "cpu_mehler_pairs", lambda *x: calls.append(1) or original(*x))

    def run():
        kappa, beta = virtual_observation_weights(points, targets, variances, ls)
        out = response_moments(Moments(mean, cov=cov), points, ls, beta, kappa, None, "cov")
        return [out.cov, *torch.autograd.grad(out.cov.square().sum(), (mean, cov, targets))]

    got = run()
    assert calls
    with backend("reference"):
        want = run()
    assert len(calls) == 1
    for i, (x, y) in enumerate(zip(got, want)):
        if i == 2:  # d/dcov: split evenly by the kernel, by the Horner tensors as they come
            x, y = x + x.mT, y + y.mT
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("num_terms", [1, 7, 200])
def test_coefficients_match_the_tensor_recurrence(shared, num_terms):
    """The compiled Hermite coefficients (and Cramér's bound) against
    :func:`cross._hermite_coefficients`, values and the gradients w.r.t. the means, variances,
    lengthscales and ``beta``, for means up to 50 lengthscales outside the grid, zero and wide
    variances, per-unit and shared (leading size 1) parameters."""
    from pyro_gpn.moments.cpu_mehler import cpu_hermite_coefficients

    g = torch.Generator().manual_seed(4)
    units = 1 if shared else 5
    mean = torch.linspace(-20, 20, 9, dtype=F64).unsqueeze(-1).repeat(1, 5)
    mean = mean + torch.randn(9, 5, generator=g, dtype=F64)
    var = torch.rand(9, 5, generator=g, dtype=F64) * torch.tensor([0, 1e-6, 0.1, 1, 10])
    points = torch.linspace(-2, 2, 14, dtype=F64).expand(units, -1)
    ls = (0.3 + torch.rand(units, generator=g, dtype=F64)).requires_grad_(True)
    beta = (10 * torch.randn(units, 14, generator=g, dtype=F64)).requires_grad_(True)
    inputs = [mean.requires_grad_(True), var.requires_grad_(True), ls, beta]
    got, got_bound = cpu_hermite_coefficients(inputs[0], inputs[1], points, ls, beta, num_terms)
    want, want_bound = cross._hermite_coefficients(inputs[0], inputs[1], points, ls, beta,
                                                   num_terms)  # fmt: skip
    scale = float(beta.detach().abs().sum())
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-13 * scale)
    torch.testing.assert_close(got_bound, want_bound.detach(), rtol=1e-12, atol=0)
    weight = torch.randn(got.shape, generator=g, dtype=F64)
    grads = torch.autograd.grad((got * weight).sum(), inputs)
    want_grads = torch.autograd.grad((want * weight).sum(), inputs)
    for x, y in zip(grads, want_grads):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-12 * scale * num_terms)


def test_coefficients_gradcheck():
    from pyro_gpn.moments.cpu_mehler import cpu_hermite_coefficients

    g = torch.Generator().manual_seed(5)
    points = torch.linspace(-2, 2, 6, dtype=F64).expand(3, -1)
    inputs = (
        torch.randn(2, 3, generator=g, dtype=F64),
        torch.rand(2, 3, generator=g, dtype=F64),
        0.5 + torch.rand(3, generator=g, dtype=F64),
        torch.randn(3, 6, generator=g, dtype=F64),
    )
    inputs = tuple(t.requires_grad_(True) for t in inputs)

    def fn(mean, var, ls, beta):
        return cpu_hermite_coefficients(mean, var, points, ls, beta, 6)[0]

    assert gradcheck(fn, inputs)


def test_coefficients_refuse_learnable_points_and_bad_shapes():
    """The compiled coefficients give no gradient for the inducing points, so learnable ones
    are refused (the series then takes the tensor path), as are parameters of a leading size
    other than 1 or N."""
    from pyro_gpn.moments.cpu_mehler import cpu_hermite_coefficients

    mean, var = torch.zeros(2, 3, dtype=F64), torch.ones(2, 3, dtype=F64)
    points = torch.linspace(-2, 2, 6, dtype=F64).expand(3, -1)
    ls, beta = torch.ones(3, dtype=F64), torch.ones(3, 6, dtype=F64)
    with pytest.raises(ValueError, match="inducing_points must be fixed"):
        cpu_hermite_coefficients(mean, var, points.clone().requires_grad_(True), ls, beta, 3)
    with pytest.raises(ValueError, match="beta must have a leading size of 1 or 3"):
        cpu_hermite_coefficients(mean, var, points, ls, torch.ones(2, 6, dtype=F64), 3)


def test_truncation_rule_refuses_a_pair_at_rho_one():
    """``|rho| = 1`` exactly with both coefficient bounds nonzero (the series does not
    converge; ``log(1 - q) = -inf``): not served, as by the tensor rule, whichever the sign
    and however large the units' margins; just below 1 the pair is served or not by its bound
    alone."""
    from pyro_gpn.moments.cpu_mehler import cpu_mehler_terms

    cov = torch.zeros(3, 3, 3, dtype=F64)
    cov[0, 0, 1] = cov[0, 1, 0] = 1.0
    cov[1, 1, 2] = cov[1, 2, 1] = -1.0
    cov[2, 0, 2] = cov[2, 2, 0] = 1.0 - 1e-9
    scale = torch.ones(3, 3, dtype=F64)
    per_unit = torch.tensor([[0.5, 2.0, 40.0], [300.0, 1.0, 300.0], [30.0, 0.0, 30.0]], dtype=F64)
    ratio = cov.masked_fill(torch.eye(3, dtype=torch.bool), 0)
    _, want = cross._mehler_terms(ratio, per_unit)
    _, terms, every = cpu_mehler_terms(
        cov, scale, per_unit, cross.MEHLER_RTOL, cross.MEHLER_MAX_TERMS
    )
    assert torch.equal(terms, want)
    assert terms[0, 0, 1] == terms[0, 1, 0] == -1 and terms[1, 1, 2] == -1 and not every
    assert terms[2, 0, 2] > 0  # margins of 30 on both units: served just below 1
