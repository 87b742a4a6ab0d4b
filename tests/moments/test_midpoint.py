"""The midpoint expansion of ``tr[M Omega]``: against ``Omega`` by Gauss-Hermite quadrature of
``E[k(a, V_r) k(a, V_t)]`` (independent of the closed form), with batch dimensions in front, both
branches, and under ``torch.jit.trace`` with the branch decided outside the trace."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from pyro_gpn.moments.midpoint import is_equidistant, midpoint_expansion

F64 = torch.float64


def _trace_by_quadrature(mean, var, points, matrix, ls, num=4001):
    """``sum_rt M_rt E[k(a, V_r) k(a, V_t)]``, ``a ~ N(mean, var)``, by the trapezoidal rule on
    ``mean +- 12 sd`` (spectrally accurate for these smooth, decaying integrands);
    ``mean, var [..., S, N]``, ``points [..., N, R]``, ``matrix [..., N, R, R]``, ``ls [..., N]``
    -> ``[..., S, N]``."""
    x = torch.linspace(-12, 12, num, dtype=F64)
    w = torch.exp(-0.5 * x.square()) / np.sqrt(2 * np.pi) * (x[1] - x[0])
    a = mean.unsqueeze(-1) + var.sqrt().unsqueeze(-1) * x  # [..., S, N, Q]
    k = torch.exp(
        -0.5
        * (a.unsqueeze(-1) - points.unsqueeze(-2).unsqueeze(-4)).square()
        / ls.square()[..., None, :, None, None]
    )  # [..., S, N, Q, R]
    return torch.einsum("...snqr,...nrt,...snqt,q->...sn", k, matrix, k, w)


def _expansion_trace(mean, var, points, matrix, ls, equidistant):
    centers, weights = midpoint_expansion(points, matrix, ls, equidistant)
    width = ls.square().unsqueeze(-2) + 2 * var  # [..., S, N]
    gauss = torch.exp(-(mean.unsqueeze(-1) - centers.unsqueeze(-3)).square() / width.unsqueeze(-1))
    return (ls.square().unsqueeze(-2) / width).sqrt() * (gauss * weights.unsqueeze(-3)).sum(-1)


def _problem(batch, num_points, uniform, seed=0, num_units=3, num_rows=4):
    g = torch.Generator().manual_seed(seed)
    if uniform:
        points = torch.linspace(-2, 2, num_points, dtype=F64).expand(*batch, num_units, -1)
    else:
        points = torch.sort(torch.rand(*batch, num_units, num_points, generator=g, dtype=F64), -1)
        points = 4 * points.values - 2
    half = torch.randn(*batch, num_units, num_points, num_points, generator=g, dtype=F64)
    matrix = half + half.mT
    ls = 0.3 + torch.rand(*batch, num_units, generator=g, dtype=F64)
    mean = 2 * torch.randn(*batch, num_rows, num_units, generator=g, dtype=F64)
    var = torch.rand(*batch, num_rows, num_units, generator=g, dtype=F64) + 0.05
    return mean, var, points, matrix, ls


@pytest.mark.parametrize("batch", [(), (2,), (3, 2)])
@pytest.mark.parametrize("uniform", [True, False])
def test_expansion_matches_quadrature_with_batch_dimensions(batch, uniform):
    mean, var, points, matrix, ls = _problem(batch, 6, uniform)
    want = _trace_by_quadrature(mean, var, points, matrix, ls)
    branches = (None, True, False) if uniform else (None, False)
    for equidistant in branches:
        got = _expansion_trace(mean, var, points, matrix, ls, equidistant)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)
    centers, _ = midpoint_expansion(points, matrix, ls, None)
    assert centers.shape == (*batch, 3, 11 if uniform else 21)


def test_batch_dimensions_equal_the_unbatched_call_per_element():
    """Each batch element of a ``[2, 3, N, ...]`` call is the ``[N, ...]`` call on that element,
    including shared (``[R]``, ``[]``) inducing points and lengthscale."""
    _, _, _, matrix, _ = _problem((2, 3), 5, True)
    points = torch.linspace(-1.5, 2.5, 5, dtype=F64)
    ls = torch.tensor(0.7, dtype=F64)
    for equidistant in (True, False):
        centers, weights = midpoint_expansion(points, matrix, ls, equidistant)
        assert centers.shape == weights.shape == (2, 3, 3, 9 if equidistant else 15)
        for i in range(2):
            for j in range(3):
                c, w = midpoint_expansion(points[None], matrix[i, j], ls[None], equidistant)
                torch.testing.assert_close(centers[i, j], c, rtol=0, atol=0)
                torch.testing.assert_close(weights[i, j], w, rtol=0, atol=1e-15)


def test_equidistant_grid_has_the_uniform_midpoints():
    points = torch.linspace(-2, 2, 10, dtype=F64)
    matrix = torch.eye(10, dtype=F64)
    centers, weights = midpoint_expansion(points, matrix, torch.tensor(0.5, dtype=F64), True)
    torch.testing.assert_close(centers, torch.linspace(-2, 2, 19, dtype=F64), rtol=0, atol=1e-15)
    # identity: only the pairs (r, r) contribute, at the even midpoints, with weight 1
    torch.testing.assert_close(weights[::2], torch.ones(10, dtype=F64))
    torch.testing.assert_close(weights[1::2], torch.zeros(9, dtype=F64))
    assert is_equidistant(points) and not is_equidistant(points.flip(-1))


def test_traced_expansion_with_the_branch_given_is_exact_away_from_the_trace_point():
    mean, var, points, matrix, ls = _problem((2,), 7, True, seed=1)

    def fn(mat, m, v):
        return _expansion_trace(m, v, points, mat, ls, True)

    with warnings.catch_warnings():
        # a data-dependent branch would warn (TracerWarning)
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(fn, (matrix, mean, var))
    mean2, var2, _, matrix2, _ = _problem((2,), 7, True, seed=2)
    torch.testing.assert_close(traced(matrix2, mean2, var2), fn(matrix2, mean2, var2))
    torch.testing.assert_close(
        traced(matrix2, mean2, var2), _trace_by_quadrature(mean2, var2, points, matrix2, ls)
    )


def test_three_uneven_points_take_the_general_expansion():
    """Three unevenly spaced points (the smallest grid whose spacing can differ) are not
    equidistant, and the detected expansion agrees with quadrature: the anti-diagonal
    grouping would put the pair (V_0, V_2) at the midpoint of (V_1, V_1)."""
    points = torch.tensor([[-1.0, 0.2, 1.0], [-2.0, -1.5, 0.5]], dtype=F64)
    assert not is_equidistant(points)
    assert not is_equidistant(points[:1]) and not is_equidistant(points[1:])
    assert is_equidistant(torch.tensor([[-1.0, 0.0, 1.0]], dtype=F64))
    mean, var, _, matrix, ls = _problem((), 3, True, num_units=2)
    want = _trace_by_quadrature(mean, var, points, matrix, ls)
    got = _expansion_trace(mean, var, points, matrix, ls, None)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-11)
