"""Post-hoc calibration of a regression network's predictive: one scale per output.

A network's predictive can be right in its mean and wrong in its spread: the closed-form ELBO's
fitted noise absorbs ``Var[F]`` and the predictive then counts it twice, a fit stopped early
leaves the noise high, and the targets' own rounding makes the residuals non-Gaussian (on
naval the 90 % intervals of every model covered 95-99 % of the rows; ``docs/results/uci.md``
section 17). :func:`fit_predictive_scale` fits the ``sigma``-scaling of Laves et al. (2020,
"Well-calibrated regression uncertainty in medical imaging with deep learning"; the regression
counterpart of temperature scaling, Guo et al. 2017): the scale ``s`` that maximises the mean
log predictive density of held-out rows when the predictive is stretched about its mean by
``s`` (the regression heads' ``predictive_scale``). One number per output, fitted on rows the
network was not trained on; the network itself does not change.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from .._validation import check_finite, check_tensor
from ..losses import gaussian_mixture_log_density

__all__ = ["fit_predictive_scale"]

#: log-spaced scales of the first search; the best one is then refined by golden section
_GRID = 161
_GOLDEN_STEPS = 60


def _mean_log_density(weights: Tensor, mean: Tensor, var: Tensor, y: Tensor, scale: Tensor):
    """Mean log density of ``y [S, D]`` per output under the mixture ``(weights [K], mean,
    var [K, S, D])`` stretched about its mean by each of ``scale [G, D]``: ``[G, D]``. The
    stretched density of ``y`` is the unstretched one of ``m + (y - m) / s`` over ``s``."""
    centre = torch.einsum("k,ksd->sd", weights, mean)
    out = []
    for s in scale:  # [D]
        u = centre + (y - centre) / s
        per_output = [
            gaussian_mixture_log_density(weights, mean[..., [d]], var[..., [d]], u[:, d])
            for d in range(y.shape[1])
        ]
        out.append(torch.stack(per_output, -1).mean(0) - s.log())
    return torch.stack(out)


def fit_predictive_scale(
    model,
    x: Tensor,
    y: Tensor,
    *,
    bounds: tuple[float, float] = (1e-2, 1e2),
    set_scale: bool = True,
) -> Tensor:
    """Fit the predictive scale of a regression network on held-out rows (``sigma``-scaling).

    For each output ``d`` finds the ``s_d`` in ``bounds`` that maximises the mean log predictive
    density of ``y[:, d]`` when the model's predictive (the head's
    :meth:`~pyro_gpn.heads.Head.predictive_mixture`, taken with scale 1) is stretched about its
    mean by ``s_d``: a grid of 161 log-spaced values, then golden-section search between the
    best one's neighbours. For a Gaussian predictive the optimum is ``s^2 = mean(z^2)``,
    ``z = (y - mean) / sd``; the search covers mixtures (the heteroscedastic head) too.

    Args:
        model: a network with a regression head (:class:`~pyro_gpn.heads.GaussianHead` or
            :class:`~pyro_gpn.heads.HeteroscedasticGaussianHead`) and ``hidden(x)`` (the
            closed-form networks: :class:`~pyro_gpn.GPNNet`,
            :class:`~pyro_gpn.models.VariationalGPN`, the fixed-activation baselines).
        x, y: held-out rows ``[S, M]`` and targets ``[S, D]`` (or ``[S]`` for ``D = 1``),
            ``S >= 2``, never the test rows.
        bounds: ``(low, high)``, ``0 < low < 1 < high``: the range searched. A scale at a bound
            warns.
        set_scale: write the result into ``model.head.predictive_scale``.

    Returns:
        ``[D]`` the fitted scales (``s > 1`` widens the predictive, ``s < 1`` narrows it).

    Raises:
        ValueError: a head that is not a regression head, bad rows or bounds.
    """
    head = getattr(model, "head", None)
    if getattr(head, "task", None) != "regression" or not hasattr(head, "predictive_scale"):
        raise ValueError(
            "model must have a regression head (GaussianHead or HeteroscedasticGaussianHead) "
            f"to calibrate its predictive, got {type(head).__name__}"
        )
    low, high = (float(b) for b in bounds)
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low < 1 < high):
        raise ValueError(f"bounds must satisfy 0 < low < 1 < high, got {bounds!r}")
    check_tensor("x", x)
    check_tensor("y", y)
    check_finite("x", x)
    check_finite("y", y)
    if x.dim() != 2 or x.shape[0] < 2:
        raise ValueError(f"x must be [S, M] with at least 2 rows, got {tuple(x.shape)}")
    y = y.reshape(x.shape[0], -1) if y.dim() == 1 else y
    if y.shape != (x.shape[0], head.num_outputs):
        raise ValueError(
            f"y must be [{x.shape[0]}, {head.num_outputs}] (or [{x.shape[0]}] for one output), "
            f"got {tuple(y.shape)}"
        )
    kept = head.predictive_scale.clone()
    try:
        head.predictive_scale.fill_(1.0)
        with torch.no_grad():
            weights, mean, var = head.predictive_mixture(model.hidden(x))
    finally:
        head.predictive_scale.copy_(kept)
    weights, mean, var = weights.double(), mean.double(), var.double()
    y = y.double()

    def score(scale: Tensor) -> Tensor:
        return _mean_log_density(weights, mean, var, y, scale)

    grid = torch.logspace(math.log10(low), math.log10(high), _GRID, dtype=torch.float64)
    values = score(grid[:, None].expand(-1, y.shape[1]))  # [G, D]
    best = values.argmax(0)  # [D]
    log_grid = grid.log()
    lo = log_grid[(best - 1).clamp_min(0)]
    hi = log_grid[(best + 1).clamp_max(_GRID - 1)]
    ratio = (math.sqrt(5.0) - 1) / 2
    for _ in range(_GOLDEN_STEPS):  # every output at once: a bracket per output
        a = hi - ratio * (hi - lo)
        b = lo + ratio * (hi - lo)
        pair = score(torch.stack([a, b]).exp())
        left = pair[0] > pair[1]  # the maximum lies in [lo, b]
        hi = torch.where(left, b, hi)
        lo = torch.where(left, lo, a)
    scale = ((lo + hi) / 2).exp()
    at_bound = (best == 0) | (best == _GRID - 1)
    if bool(at_bound.any()):
        warnings.warn(
            f"fit_predictive_scale: the scale of output(s) {at_bound.nonzero().flatten().tolist()} "
            f"reached a bound of {bounds} ({scale.tolist()}); the predictive is far off",
            stacklevel=2,
        )
    scale = scale.to(head.predictive_scale)
    if set_scale:
        head.predictive_scale.copy_(scale)
    return scale
