r"""Sums of Gaussians in the activation mean: the one per-sample primitive of the closed-form
moments (``psi^T beta`` over the inducing points, ``tr[M Omega]`` over their midpoints,
``eq:gpn_normal_omega``), and the midpoint expansion that turns ``tr[M Omega]`` into such a
sum with ``2R - 1`` terms for equidistant inducing points."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

__all__ = [
    "gaussian_sum",
    "is_equidistant",
    "midpoint_expansion",
]


def is_equidistant(inducing_points: Tensor, rtol: float = 1e-6) -> bool:
    """True if every row of ``inducing_points`` ``[N, R]`` is equally spaced and ascending."""
    if inducing_points.shape[-1] < 3:
        return True
    steps = inducing_points.diff(dim=-1)
    scale = steps.abs().amax().clamp_min(torch.finfo(steps.dtype).tiny)
    return bool(((steps - steps[..., :1]).abs() <= rtol * scale).all() and (steps > 0).all())


@functools.lru_cache(maxsize=32)
def _antidiagonal_sum_matrix(size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[R*R, 2R-1]`` 0/1 matrix mapping entry ``(r, t)`` to anti-diagonal ``r + t``."""
    idx = torch.arange(size, device=device)
    k = (idx[:, None] + idx[None, :]).reshape(-1)
    out = torch.zeros(size * size, 2 * size - 1, dtype=dtype, device=device)
    out[torch.arange(size * size, device=device), k] = 1
    return out


def midpoint_expansion(
    inducing_points: Tensor,
    matrix: Tensor,
    lengthscales: Tensor,
    equidistant: bool | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Write ``tr[M Omega]`` as a sum of Gaussians centred at the midpoints of ``V``.

    From ``eq:gpn_normal_omega``, for a symmetric ``M``,

    .. math::

        \sum_{rt} M_{rt}\Omega_{rt} = \sqrt{\frac{\lambda^2}{\lambda^2 + 2v}}
            \sum_k P_k \exp\Big(-\frac{(\mu - c_k)^2}{\lambda^2 + 2v}\Big),
        \qquad P_k = \sum_{(r,t):\,(V_r+V_t)/2 = c_k} M_{rt}\,
                     e^{-(V_r - V_t)^2 / (4\lambda^2)}.

    Leading batch dimensions broadcast (the layers use ``[N | 1, ...]``; a sampler's model
    ``[..., N, ...]`` with the draws' dimensions in front).

    Args:
        inducing_points: ``[..., R]``.
        matrix: ``[..., R, R]`` symmetric ``M``.
        lengthscales: ``[...]``.
        equidistant: whether each row of ``V`` is equally spaced and ascending (then the
            ``2R - 1`` midpoints are a grid and the pairs are summed per anti-diagonal).
            ``None`` detects it (:func:`is_equidistant`; only for inducing points that need no
            gradient). Pass it explicitly under ``torch.jit.trace``: detection reads the values,
            and a trace must not branch on data.

    Returns:
        ``centers`` and ``weights``, each ``[..., K]`` (the broadcast batch shape) with
        ``K = 2R - 1`` (equidistant) or ``R (R + 1) / 2`` (one term per unordered pair).
    """
    num_points = inducing_points.shape[-1]
    if equidistant is None:
        equidistant = not inducing_points.requires_grad and is_equidistant(inducing_points)
    sep = inducing_points.unsqueeze(-1) - inducing_points.unsqueeze(-2)
    damped = matrix * (-sep.square() / (4 * lengthscales.square()[..., None, None])).exp()
    batch = torch.broadcast_shapes(damped.shape[:-2], inducing_points.shape[:-1])
    if equidistant:
        summed = damped.flatten(-2)  # [..., R * R], entry (r, t) at r R + t
        weights = summed @ _antidiagonal_sum_matrix(num_points, damped.dtype, damped.device)
        # anti-diagonal k = r + t holds the pair (floor(k / 2), ceil(k / 2)): its midpoint
        k = torch.arange(2 * num_points - 1, device=damped.device)
        centers = 0.5 * (inducing_points[..., k // 2] + inducing_points[..., (k + 1) // 2])
    else:
        rows, cols = torch.triu_indices(num_points, num_points, device=damped.device)
        multiplicity = torch.where(rows == cols, 1.0, 2.0).to(damped.dtype)
        weights = damped[..., rows, cols] * multiplicity
        centers = 0.5 * (inducing_points[..., rows] + inducing_points[..., cols])
    num_terms = centers.shape[-1]
    return centers.expand(*batch, num_terms), weights.expand(*batch, num_terms)


class _GaussianSum(torch.autograd.Function):
    """Autograd for :func:`gaussian_sum` with a hand-derived backward pass.

    With ``e_k = exp(-(mu - c_k)^2 / w)`` and ``out = sum_k p_k e_k``:
    ``d out / d mu = -2 / w * sum_k p_k e_k (mu - c_k)``,
    ``d out / d w = 1 / w^2 * sum_k p_k e_k (mu - c_k)^2``,
    ``d out / d p_k = e_k`` and ``d out / d c_k = 2 / w * p_k e_k (mu - c_k)``.
    Compared with recording each elementwise step it makes about half as many passes over the
    ``[S, N, K]`` tensors and keeps two of them (differences and exponentials) for the backward.
    """

    @staticmethod
    def forward(ctx, mean: Tensor, width: Tensor, centers: Tensor, weights: Tensor) -> Tensor:
        diff = mean.unsqueeze(-1) - centers
        expo = diff.square().mul_((-1 / width).unsqueeze(-1)).exp_()
        ctx.save_for_backward(width, weights, diff, expo)
        return (expo * weights).sum(-1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        width, weights, diff, expo = ctx.saved_tensors
        need_mean, need_width, need_centers, need_weights = ctx.needs_input_grad
        grad_mean = grad_width = grad_centers = grad_weights = None
        if need_mean or need_width or need_centers:
            scaled = grad / width
            weighted = (expo * weights).mul_(diff)  # p_k e_k (mu - c_k)
            if need_mean:
                grad_mean = -2 * scaled * weighted.sum(-1)
            if need_width:
                grad_width = scaled / width * (weighted * diff).sum(-1)
            if need_centers:
                grad_centers = 2 * torch.einsum("sn,snk->nk", scaled, weighted)
        if need_weights:
            grad_weights = torch.einsum("sn,snk->nk", grad, expo)
        return grad_mean, grad_width, grad_centers, grad_weights


def gaussian_sum(mean: Tensor, width: Tensor, centers: Tensor, weights: Tensor) -> Tensor:
    """``sum_k weights[n, k] * exp(-(mean[s, n] - centers[n, k])^2 / width[s, n])``.

    The one per-sample primitive of the mean and variance paths: ``psi^T beta`` is such a sum
    with ``width = 2 (lambda^2 + v)`` over the inducing points, ``tr[M Omega]`` one with
    ``width = lambda^2 + 2 v`` over the midpoints (:func:`midpoint_expansion`).

    Args:
        mean: ``[S, N]``; width: ``[S, N]`` (positive); centers, weights: ``[N, K]``.

    Returns:
        ``[S, N]``.
    """
    return _GaussianSum.apply(mean, width.expand_as(mean), centers, weights)
