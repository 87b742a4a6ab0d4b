"""Covariance functions of Gaussian Process Neurons.

* :func:`squared_exponential` -- the unit-amplitude SE kernel on *scalar* activations,
  ``k(a, a') = exp(-(a - a')^2 / (2 lambda^2))`` (paper ``eq:gpn_value``). The amplitude is 1
  because an output scale is redundant with the norm of the next layer's weights; this is where
  the ``1 -`` in the GPN variance formulas comes from.
* :func:`gpn_kernel` -- the GPN covariance function on *input vectors*, the SE kernel applied to
  the projections ``a = x w`` (paper ``eq:gpn_cov_fn``):
  ``k_w(x, x') = exp(-[sum_m w_m (x_m - x'_m)]^2 / (2 lambda^2))``.
  Unlike the ARD kernel of a deep GP it projects before squaring, so one unit's covariance has
  rank-one structure in input space (paper section "The Relation to Deep Gaussian Processes").
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["gpn_kernel", "squared_exponential"]


def squared_exponential(a: Tensor, b: Tensor, lengthscale: Tensor | float) -> Tensor:
    """Unit-amplitude squared-exponential kernel between scalar points.

    Args:
        a: ``[..., P]`` points.
        b: ``[..., Q]`` points (batch dimensions broadcast with ``a``).
        lengthscale: scalar or ``[...]`` (one per batch element, broadcast).

    Returns:
        ``[..., P, Q]`` with entries ``exp(-(a_p - b_q)^2 / (2 lambda^2))``.
    """
    if isinstance(lengthscale, Tensor) and lengthscale.dim() > 0:
        lengthscale = lengthscale[..., None, None]
    diff = a.unsqueeze(-1) - b.unsqueeze(-2)
    return (-0.5 * (diff / lengthscale).square()).exp()


def gpn_kernel(
    x: Tensor, x2: Tensor | None, weight: Tensor, lengthscale: Tensor | float = 1.0
) -> Tensor:
    """The GPN covariance function ``k_w(x, x')`` (paper ``eq:gpn_cov_fn``).

    Args:
        x: ``[S, M]`` inputs.
        x2: ``[T, M]`` inputs, or ``None`` for ``x``.
        weight: ``[M]`` (one unit) or ``[M, N]`` (``N`` units, one kernel each).
        lengthscale: scalar, or ``[N]`` with a ``[M, N]`` weight.

    Returns:
        ``[S, T]`` for one unit, ``[N, S, T]`` for ``N`` units.
    """
    x2 = x if x2 is None else x2
    a, a2 = x @ weight, x2 @ weight
    if weight.dim() == 1:
        return squared_exponential(a, a2, lengthscale)
    return squared_exponential(a.mT, a2.mT, lengthscale)
