r"""The narrow regime of the output variance (issue 13, ``docs/results/accuracy.md``).

Where the activation ``a ~ N(mu, v)`` is narrow against the lengthscale
(``sqrt(v) <= NODE_MAX_STD_RATIO lambda``) and the closed form
``1 - tr[(C - beta beta^T) Omega] - mu^2`` is not provably accurate (its rounding-error bound,
:func:`closed_form_error_scale`, exceeds :data:`CLOSED_FORM_RTOL` of its value: ``K + S``
ill-conditioned, ``|beta|^2`` huge), ``Var f = E[1 - alpha(a)^T C alpha(a)] + Var[m(a)]`` is
evaluated at quadrature nodes of ``a``, with the rule and node count of each row's
``sqrt(v) / lambda`` (:data:`NODE_TIERS`): Gauss-Hermite for the narrowest, the trapezoidal
rule beyond."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "CLOSED_FORM_RTOL",
    "EXPLICIT_C_ERROR_FACTOR",
    "NODE_MAX_STD_RATIO",
    "NODE_TIERS",
    "TRAPEZOID_HALF_WIDTH",
    "closed_form_error_scale",
    "explicit_c_rows",
    "gauss_hermite",
    "node_rule",
    "node_tier",
    "node_variance_rows",
]


#: The narrow regime: activation standard deviation at most this multiple of the lengthscale.
#: Beyond it the closed form serves, within 6e-7 in float64 for units with ``lambda / h`` up to
#: 7 and ``S`` down to 1e-6 (up to 2e-6 at ``lambda / h`` 6.5 to 10), against a 3,001-node
#: trapezoidal reference (``benchmarks/node_tiers.py --broad``; ``docs/results/accuracy.md``,
#: "The narrow regime to 6 lambda"). Where the regime ended at 1.25 the closed form was off by
#: up to 3e-5 just past it, and UCI fits of the default network have 44-66 % of the first
#: layer's rows there.
NODE_MAX_STD_RATIO = 6.0


#: Node tiers of the narrow regime: ``(ratio, nodes, rule)``; the first row whose ratio is at
#: least a row's ``sqrt(v) / lambda`` gives its rule: ``"gauss-hermite"`` (exact for
#: polynomials: the fewest nodes where the Gaussian is narrow against the kernel) or
#: ``"trapezoid"`` (equally spaced on ``[-TRAPEZOID_HALF_WIDTH, TRAPEZOID_HALF_WIDTH]``
#: standard deviations with Gaussian weights: geometrically convergent for these analytic
#: integrands, where Gauss-Hermite needed 96 nodes at 1.25 and its rules of 250 and 300 nodes
#: disagree by up to 8.9e-3 at 4). Measured in float64 by ``benchmarks/node_tiers.py`` on units with
#: ``lambda / h`` from 1.0 to 9.75 and ``S`` down to 1e-6 with the default jitter: each
#: trapezoidal tier has 6 to 22 % more nodes than the fewest within 1e-9 relative of a
#: 3,001-node rule on [-10, 10] (37, 45, 51, 59, 73, 87, 103, 133, 165, 197 from 0.75 to 6),
#: and the library's variances are within 4.3e-9 of it at every tier's largest ratio from 0.4
#: to 5 (4.3e-8 at 6, where rows round to the broad side; 7.9e-7 at 0.1, where the variances
#: are small and ``alpha^T C alpha`` with an explicit ill-conditioned ``C`` differs by that
#: much between evaluation orders). Deterministic activations (``v = 0``) need one node.
NODE_TIERS: tuple[tuple[float, int, str], ...] = (
    (0.0, 1, "gauss-hermite"),
    (0.1, 8, "gauss-hermite"),
    (0.2, 12, "gauss-hermite"),
    (0.4, 24, "gauss-hermite"),
    (0.75, 45, "trapezoid"),
    (1.0, 51, "trapezoid"),
    (1.25, 57, "trapezoid"),
    (1.5, 65, "trapezoid"),
    (2.0, 81, "trapezoid"),
    (2.5, 97, "trapezoid"),
    (3.0, 113, "trapezoid"),
    (4.0, 145, "trapezoid"),
    (5.0, 177, "trapezoid"),
    (6.0, 209, "trapezoid"),
)


#: Half-width in standard deviations of the trapezoidal tiers' nodes: the Gaussian's mass
#: beyond it is 1.2e-15.
TRAPEZOID_HALF_WIDTH = 8.0


#: The closed-form variance is used in the narrow regime too wherever its rounding-error bound
#: (:func:`closed_form_error_scale` times the magnitude of its terms) is at most this fraction
#: of its value: well-conditioned units (``K + S`` far from singular) pay no quadrature. The
#: bound is a worst case, so this is the accuracy guaranteed where the closed form is used:
#: issue 13's float64 target (1e-6). On fitted UCI networks the bound overstates the actual
#: error about 1,000-fold (largest error against quadrature everywhere 2e-9 at 1e-6, where
#: 1e-8 sent 98 % of the output layer's rows to quadrature; ``docs/results/accuracy.md``).
CLOSED_FORM_RTOL = 1e-6


#: The explicit ``C``'s error in a variance is taken as ``EXPLICIT_C_ERROR_FACTOR * eps *
#: ||L^-1||_F^2`` (:func:`explicit_c_rows`). Measured against quadrature
#: (``benchmarks/factored_rows_probe.py ratio``: the fused kernel, 14 points, jitter 1e-6,
#: lengthscales 1 to 4, posterior scales 1e-3 to 1) the actual error was at most 0.74 of
#: ``eps ||L^-1||_F^2`` for the nearly collapsed posteriors whose variances come near the
#: threshold, and up to 1.22 for ``q = p``, whose variances (~1) stay 1,000x above it; at
#: lengthscale 0.4 other rounding dominates (at most 3.4e-10 relative). So with 1 the narrow
#: rows kept on the closed form are within CLOSED_FORM_RTOL in every case measured. A larger
#: margin costs speed (``... boston``, one step of a fitted network: 1 refines 11 of 20,450
#: hidden rows, 1.25 77, 4 816, and the closed form of all 816 was within 2.4e-7 of the refined;
#: ``vgpn_step.py``: with 1.25 the point-weights step took 1.47x as long as before the rule).
EXPLICIT_C_ERROR_FACTOR = 1.0


def explicit_c_rows(variance, activation_variance, lengthscales, inverse_trace, eps: float):
    """The rows ``[S, N]`` whose variance an explicit ``C`` cannot give to
    :data:`CLOSED_FORM_RTOL`, and quadrature nodes through ``C``'s factors can.

    ``C = L^-T M L^-1`` formed explicitly carries an absolute error of about ``eps ||L^-1||_F^2 =
    eps tr(K^-1)`` (``EXPLICIT_C_ERROR_FACTOR`` times it, measured), which the closed form's own
    rounding bound (:func:`closed_form_error_scale`) does not see: the rows whose ``variance``
    (``[S, N]``, as returned, with any output noise) is below it divided by
    :data:`CLOSED_FORM_RTOL`, among the narrow ones (``activation_variance [S, N] <=
    (NODE_MAX_STD_RATIO lambda)^2``, ``lengthscales [N | 1]``): broader activations keep the closed
    form, as everywhere. ``inverse_trace [N | 1]`` is ``||L^-1||_F^2``. One rule for NumPy arrays
    (the fused CPU layer decides inside its node) and tensors (the other paths): operators only."""
    threshold = (EXPLICIT_C_ERROR_FACTOR * eps / CLOSED_FORM_RTOL) * inverse_trace
    narrow = activation_variance <= (NODE_MAX_STD_RATIO * lengthscales) ** 2
    return (variance < threshold) & narrow


def closed_form_error_scale(num_points: int, dtype: torch.dtype) -> float:
    """Rounding-error factor of the closed-form variance ``1 - tr[(C - beta beta^T) Omega] -
    mu^2``: each of its ``2R - 1`` midpoint terms (and the ``R`` products summed into each) is
    exact to ``~(2R + 8) eps`` relative, so the sum is wrong by at most this factor times the sum
    of the terms' magnitudes ``1 + tr[(|C| + |beta| |beta|^T) Omega] + mu^2`` (a factor 4 of
    margin)."""
    return 4.0 * (2 * num_points + 8) * torch.finfo(dtype).eps


def node_tier(std_ratio: float) -> int:
    """Index into :data:`NODE_TIERS` of the tier for a ``sqrt(v) / lambda`` (the last tier's
    beyond it)."""
    for t, (ratio, _, _) in enumerate(NODE_TIERS):
        if std_ratio <= ratio:
            return t
    return len(NODE_TIERS) - 1


@functools.cache
def _rule(num_nodes: int, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``z`` and weights ``w`` (summing to 1) of a rule for ``E[g(Z)]``, ``Z ~ N(0, 1)``."""
    if rule == "gauss-hermite":
        z, w = np.polynomial.hermite_e.hermegauss(num_nodes)
    elif rule == "trapezoid":
        z = np.linspace(-TRAPEZOID_HALF_WIDTH, TRAPEZOID_HALF_WIDTH, num_nodes)
        w = np.exp(-0.5 * z * z)
    else:
        raise ValueError(f"rule must be 'gauss-hermite' or 'trapezoid', got {rule!r}")
    return np.ascontiguousarray(z), np.ascontiguousarray(w / w.sum())


def node_rule(tier: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``z`` and weights ``w`` (summing to 1, each ``[G]``) of :data:`NODE_TIERS` tier
    ``tier``: ``E[g(Z)] ~ sum_i w_i g(z_i)`` for ``Z ~ N(0, 1)``."""
    _, num_nodes, rule = NODE_TIERS[tier]
    return _rule(num_nodes, rule)


@functools.lru_cache(maxsize=64)
def _rule_tensors(
    num_nodes: int, rule: str, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    z, w = _rule(num_nodes, rule)
    return torch.tensor(z, dtype=dtype, device=device), torch.tensor(w, dtype=dtype, device=device)


def _node_rule_tensors(
    tier: int, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """:func:`node_rule` of tier ``tier`` as tensors."""
    _, num_nodes, rule = NODE_TIERS[tier]
    return _rule_tensors(num_nodes, rule, dtype, device)


def gauss_hermite(
    num_nodes: int, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Probabilists' Gauss-Hermite rule: nodes ``z`` and weights ``w`` (summing to 1) with
    ``E[g(Z)] ~ sum_i w_i g(z_i)`` for ``Z ~ N(0, 1)``, exact for polynomials of degree
    ``< 2 num_nodes``. Each ``[num_nodes]``."""
    return _rule_tensors(num_nodes, "gauss-hermite", dtype, device)


def _safe_sqrt(x: Tensor) -> Tensor:
    """``sqrt(max(x, 0))`` with a zero (not infinite) derivative at ``x <= 0``."""
    positive = x > 0
    return torch.where(positive, torch.where(positive, x, 1).sqrt(), 0)


class _NodeValues:
    """The mean function at the quadrature nodes ``a_i = mu + sqrt(v) z_i`` of each activation
    (narrow regime)."""

    def __init__(
        self, centred: Tensor, variance: Tensor, std: Tensor, nodes: Tensor, weights: Tensor
    ):
        self.centred = centred  # [S, N, G]: m(a_i) - sum_i w_i m(a_i)
        self.variance = variance  # [S, N]: E[1 - alpha^T C alpha] + Var[m(a)], noise-free
        self.std = std  # [S, N]
        self.nodes = nodes  # [G]: z_i
        self.weights = weights  # [G]


def node_variance_rows(
    out_var: Tensor,
    rows: Tensor,
    mean: Tensor,
    var: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    variance_reduction: Tensor,
    variance_cholesky: Tensor | None,
    variance_inner: Tensor | None,
) -> Tensor:
    r"""``out_var`` ``[S, N]`` with the entries ``rows`` (bool ``[S, N]``) replaced by their
    quadrature variance (:func:`_node_values`), each with the rule of its own
    ``sqrt(v) / lambda`` (:data:`NODE_TIERS`): the rows of one tier are gathered, evaluated with
    their units' parameters and scattered back."""
    num_units = mean.shape[-1]
    ls2 = lengthscales.expand(num_units).square()
    std_ratio = (var.detach() / ls2.detach()).clamp_min(0).sqrt()
    bounds = torch.tensor([r for r, _, _ in NODE_TIERS], dtype=std_ratio.dtype, device=mean.device)
    tier = torch.searchsorted(bounds, std_ratio.contiguous()).clamp_max(len(NODE_TIERS) - 1)
    points = inducing_points.expand(num_units, -1)
    beta = beta.expand(num_units, -1)
    flat = out_var.reshape(-1)
    for t in tier[rows].unique().tolist():
        sel = (rows & (tier == t)).reshape(-1).nonzero().squeeze(-1)
        unit = sel % num_units
        z, w = _node_rule_tensors(t, mean.dtype, mean.device)
        m_sel = mean.reshape(-1)[sel]
        std = _safe_sqrt(var.reshape(-1)[sel])
        nodes = m_sel.unsqueeze(-1) + std.unsqueeze(-1) * z  # [P, G]
        diff = nodes.unsqueeze(-1) - points[unit].unsqueeze(-2)  # [P, G, R]
        alpha = (diff.square() * (-0.5 / ls2[unit])[:, None, None]).exp()
        values = (alpha @ beta[unit].unsqueeze(-1)).squeeze(-1)
        centred = values - (values @ w).unsqueeze(-1)
        chol = inner = reduction = solved = None
        if variance_cholesky is not None:
            chol = variance_cholesky.expand(num_units, -1, -1)[unit]
            solved = torch.linalg.solve_triangular(chol, alpha.mT, upper=False)  # [P, R, G]
            if variance_inner is None:
                quad = solved.square().sum(-2)
            else:
                inner = variance_inner.expand(num_units, -1, -1)[unit]
                quad = (solved * (inner @ solved)).sum(-2)
        else:
            reduction = variance_reduction.expand(num_units, -1, -1)[unit]
            quad = ((alpha @ reduction) * alpha).sum(-1)
        value = ((1 - quad) + centred.square()) @ w
        if NODE_TIERS[t][1] == 1:  # deterministic rows: one node, whose sqrt(v) has no slope
            v_sel = var.reshape(-1)[sel]
            slope = _deterministic_variance_slope(
                diff, alpha, ls2[unit], beta[unit], reduction, chol, inner, solved
            )
            value = value + torch.where(v_sel == 0, v_sel * slope, 0)
        flat = flat.index_put((sel,), value)
    return flat.reshape(out_var.shape)


def _deterministic_variance_slope(
    diff: Tensor,
    alpha: Tensor,
    ls2: Tensor,
    beta: Tensor,
    reduction: Tensor | None,
    chol: Tensor | None,
    inner: Tensor | None,
    solved: Tensor | None,
) -> Tensor:
    r"""``d Var / dv`` at ``v = 0`` of the rows of one node (``diff = a - V`` ``[P, 1, R]``,
    ``alpha = k(a, V)``, the rows' ``ls2 [P]`` and ``beta [P, R]``): ``m'(a)^2 + s''(a) / 2``
    (``Var[m(a)]`` and ``E[s(a)]`` to first order in ``v``), with the mean function
    ``m = alpha^T beta`` and the conditional variance ``s = 1 - alpha^T C alpha``, ``C`` in the
    rows' form of :func:`node_variance_rows`: ``reduction [P, R, R]``, or ``chol`` (with
    ``inner``) and ``solved = chol^-1 alpha^T``. Not differentiated (it multiplies ``v = 0``)."""
    with torch.no_grad():
        d1 = -diff / ls2[:, None, None]
        alpha1 = alpha * d1  # d alpha / da
        alpha2 = alpha1 * d1 - alpha / ls2[:, None, None]  # d^2 alpha / da^2 (0 where alpha is)
        m1 = (alpha1 @ beta.unsqueeze(-1)).squeeze(-1)
        if chol is not None:
            derivatives = torch.cat([alpha1, alpha2], dim=-2).mT  # [P, R, 2]
            x12 = torch.linalg.solve_triangular(chol, derivatives, upper=False)
            x = torch.cat([solved.detach(), x12], dim=-1)  # [P, R, 3]: alpha and its derivatives
            mx = x if inner is None else inner @ x
            half_q2 = (x[..., 1] * mx[..., 1]).sum(-1) + (x[..., 0] * mx[..., 2]).sum(-1)
        else:
            half_q2 = ((alpha1 @ reduction) * alpha1).sum(-1).squeeze(-1) + (
                (alpha @ reduction) * alpha2
            ).sum(-1).squeeze(-1)
        slope = m1.squeeze(-1).square() - half_q2
        return torch.where(torch.isfinite(slope), slope, 0)  # an infinite activation: none


def _node_values(
    mean: Tensor,
    var: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    variance_reduction: Tensor,
    variance_cholesky: Tensor | None,
    variance_inner: Tensor | None = None,
    tier: int = len(NODE_TIERS) - 1,
) -> _NodeValues:
    r"""``Var[f] = E[1 - alpha(a)^T C alpha(a)] + E[(m(a) - E m)^2]`` at the nodes of
    :data:`NODE_TIERS` tier ``tier``.

    With ``a_i = mu + sqrt(v) z_i``: ``m_i = alpha(a_i)^T beta`` (a linear form: accurate
    however large and alternating ``beta`` is), ``q_i = alpha(a_i)^T C alpha(a_i)`` or, given
    ``L`` with ``C = (L L^T)^-1``, ``q_i = |L^-1 alpha(a_i)|^2`` by a triangular solve
    (``x^T M x`` with ``x = L^-1 alpha(a_i)`` given ``M = variance_inner``) (accurate
    to ~eps where an explicit ``C`` loses ``eps * cond(K + S)``), and
    ``Var = sum_i w_i [(1 - q_i) + (m_i - sum_j w_j m_j)^2]``: no cancellation of terms of size
    ``|beta|^2``.
    """
    num_units = mean.shape[-1]
    z, w = _node_rule_tensors(tier, mean.dtype, mean.device)
    std = _safe_sqrt(var)
    nodes = mean.unsqueeze(-1) + std.unsqueeze(-1) * z  # [S, N, G]
    points = inducing_points.expand(num_units, -1)
    ls2 = lengthscales.expand(num_units).square()
    diff = nodes.unsqueeze(-1) - points.unsqueeze(-2)  # [S, N, G, R]
    alpha = (diff.square() * (-0.5 / ls2)[:, None, None]).exp()
    values = torch.einsum("sngr,nr->sng", alpha, beta.expand(num_units, -1))
    centred = values - (values @ w).unsqueeze(-1)
    if variance_cholesky is not None:
        chol = variance_cholesky.expand(num_units, -1, -1)
        rhs = alpha.permute(1, 3, 0, 2).reshape(num_units, alpha.shape[-1], -1)  # [N, R, S*G]
        solved = torch.linalg.solve_triangular(chol, rhs, upper=False)
        if variance_inner is None:
            quad = solved.square().sum(-2)
        else:
            inner = variance_inner.expand(num_units, -1, -1)
            quad = (solved * (inner @ solved)).sum(-2)
        quad = quad.reshape(num_units, mean.shape[0], -1).permute(1, 0, 2)
    else:
        reduction = variance_reduction.expand(num_units, -1, -1)
        quad = torch.einsum("sngr,nrt,sngt->sng", alpha, reduction, alpha)
    variance = ((1 - quad) + centred.square()) @ w
    return _NodeValues(centred, variance, std, z, w)
