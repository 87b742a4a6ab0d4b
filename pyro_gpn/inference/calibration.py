"""Post-hoc calibration of a network's predictive: one scale per output, or a temperature.

A network's predictive can be right in its mean and wrong in its spread: the closed-form ELBO's
fitted noise absorbs ``Var[F]`` and the predictive then counts it twice, a fit stopped early
leaves the noise high, and the targets' own rounding makes the residuals non-Gaussian (on
naval the 90 % intervals of every model covered 95-99 % of the rows; ``docs/results/uci.md``
section 17). :func:`fit_predictive_scale` fits the ``sigma``-scaling of Laves et al. (2020,
"Well-calibrated regression uncertainty in medical imaging with deep learning"; the regression
counterpart of temperature scaling, Guo et al. 2017): the scale ``s`` that maximises the mean
log predictive density of held-out rows when the predictive is stretched about its mean by
``s`` (the regression heads' ``predictive_scale``). One number per output, fitted on rows the
network was not trained on; the network itself does not change. For a classifier
(:class:`~pyro_gpn.heads.SoftmaxHead`) the same search fits the temperature of Guo et al.
(2017): the one ``T`` that maximises the held-out log probability of the labels when every
sigma point's logits are divided by it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .._validation import check_finite, check_ndim, check_tensor
from ..losses import check_labels, gaussian_mixture_log_density, log_mean_softmax

__all__ = ["crossfitted_scores", "fit_predictive_scale", "predictive_scale_of"]

#: log-spaced scales of the first search; the best one is then refined by golden section
_GRID = 161
_GOLDEN_STEPS = 60


def _mean_log_probability(logits: Tensor, weights: Tensor, labels: Tensor, scale: Tensor):
    """Mean log probability of ``labels [S]`` under the softmax of ``logits [S, P, C]`` over
    each temperature of ``scale [G, 1]``, averaged over the points with ``weights [P]`` (the
    :class:`~pyro_gpn.heads.SoftmaxHead` predictive): ``[G, 1]``."""
    out = []
    for temperature in scale:
        out.append(log_mean_softmax(logits / temperature, weights, labels).mean().reshape(1))
    return torch.stack(out)


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
    """Fit the predictive scale of a network on held-out rows (``sigma``-scaling of a
    regression predictive, temperature scaling of a classifier's).

    Regression: for each output ``d`` finds the ``s_d`` in ``bounds`` that maximises the mean
    log predictive density of ``y[:, d]`` when the model's predictive (the head's
    :meth:`~pyro_gpn.heads.Head.predictive_mixture`, taken with scale 1) is stretched about its
    mean by ``s_d``. For a Gaussian predictive the optimum is ``s^2 = mean(z^2)``,
    ``z = (y - mean) / sd``; the search covers mixtures (the heteroscedastic head) too.

    Classification (:class:`~pyro_gpn.heads.SoftmaxHead`): finds the one temperature ``T`` in
    ``bounds`` that maximises the mean log predictive probability of the labels ``y`` when the
    logits of every unscented sigma point (:meth:`~pyro_gpn.heads.SoftmaxHead.point_logits`)
    are divided by ``T`` -- the quantity :meth:`~pyro_gpn.heads.Head.log_predictive` reports.

    A :class:`~pyro_gpn.models.NetworkEnsemble` is calibrated as a whole: its own scale
    stretches the members' mixture about the mixture's mean (per output, fitted on that
    output's marginal predictive), or its temperature divides every member's sigma-point
    logits; the members' own scales stay as they are and act first.

    Both: a grid of 161 log-spaced values, then golden-section search between the best one's
    neighbours.

    Args:
        model: a network with a head and ``hidden(x)`` (the closed-form networks:
            :class:`~pyro_gpn.GPNNet`, :class:`~pyro_gpn.models.VariationalGPN`,
            :class:`~pyro_gpn.GPNSequential`, the fixed-activation baselines) whose head is
            :class:`~pyro_gpn.heads.GaussianHead`,
            :class:`~pyro_gpn.heads.HeteroscedasticGaussianHead`,
            :class:`~pyro_gpn.heads.StudentTHead` or
            :class:`~pyro_gpn.heads.SoftmaxHead`; or a
            :class:`~pyro_gpn.models.NetworkEnsemble` of such networks.
        x, y: held-out rows ``[S, M]`` and targets: ``[S, D]`` (or ``[S]`` for ``D = 1``)
            regression targets or ``[S]`` integer class labels; ``S >= 2``, never the test rows.
        bounds: ``(low, high)``, ``0 < low < 1 < high``: the range searched. A scale at a bound
            warns.
        set_scale: write the result into ``model.head.predictive_scale`` (an ensemble's:
            ``model.predictive_scale``).

    Returns:
        the fitted scales: ``[D]`` for regression (``s > 1`` widens the predictive, ``s < 1``
        narrows it), ``[1]`` (the temperature) for classification (``T > 1`` softens the class
        probabilities, ``T < 1`` sharpens them).

    Raises:
        ValueError: a head without a predictive scale (and not an ensemble), bad rows, labels
            or bounds.
    """
    target = _CalibrationTarget.of(model)
    task = target.task
    low, high = (float(b) for b in bounds)
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low < 1 < high):
        raise ValueError(f"bounds must satisfy 0 < low < 1 < high, got {bounds!r}")
    check_tensor("x", x)
    check_finite("x", x)
    if x.dim() != 2 or x.shape[0] < 2:
        raise ValueError(f"x must be [S, M] with at least 2 rows, got {tuple(x.shape)}")
    if task == "classification":
        check_labels(y, x.shape[0], target.width, name="y")
    else:
        check_tensor("y", y)
        check_finite("y", y)
        y = y.reshape(x.shape[0], -1) if y.dim() == 1 else y
        if y.shape != (x.shape[0], target.width):
            raise ValueError(
                f"y must be [{x.shape[0]}, {target.width}] (or [{x.shape[0]}] for one "
                f"output), got {tuple(y.shape)}"
            )
    kept = target.scale.clone()
    try:
        target.scale.fill_(1.0)
        with torch.no_grad():
            if task == "classification":
                logits, point_weights = target.point_logits(x)
            else:
                weights, mean, var = target.predictive_mixture(x)
    finally:
        target.scale.copy_(kept)

    if task == "classification":
        logits, point_weights, labels = logits.double(), point_weights.double(), y.long()

        def score(scale: Tensor) -> Tensor:
            return _mean_log_probability(logits, point_weights, labels, scale)

        width = 1
    else:
        weights, mean, var, y = weights.double(), mean.double(), var.double(), y.double()

        def score(scale: Tensor) -> Tensor:
            return _mean_log_density(weights, mean, var, y, scale)

        width = y.shape[1]

    scale, at_bound = _maximise_over_scale(score, width, low, high)
    if bool(at_bound.any()):
        warnings.warn(
            f"fit_predictive_scale: the scale of output(s) {at_bound.nonzero().flatten().tolist()} "
            f"reached a bound of {bounds} ({scale.tolist()}); the predictive is far off",
            stacklevel=2,
        )
    scale = scale.to(target.scale)
    if set_scale:
        target.scale.copy_(scale)
    return scale


def predictive_scale_of(model) -> Tensor:
    """The buffer :func:`fit_predictive_scale` fits for ``model``: its head's
    ``predictive_scale``, or a :class:`~pyro_gpn.models.NetworkEnsemble`'s own (the tensor
    itself, not a copy: writing it rescales the predictive).

    Raises:
        ValueError: as :func:`fit_predictive_scale`, for a model without one.
    """
    return _CalibrationTarget.of(model).scale


def crossfit_halves(num_rows: int) -> tuple[tuple[Tensor, Tensor, float], ...]:
    """The two folds every cross-fitted check here uses: the even and the odd rows of
    ``num_rows``, each fitting once and scoring once: ``((fit_rows, score_rows, share), ...)``,
    ``share`` the scored half's fraction of the rows (its weight in the cross-fitted mean)."""
    even, odd = (torch.arange(start, num_rows, 2) for start in (0, 1))
    return (even, odd, len(odd) / num_rows), (odd, even, len(even) / num_rows)


def crossfitted_scores(
    model,
    x_val: Tensor,
    y_val: Tensor,
    score: Callable[[Tensor, Tensor], float] | None = None,
) -> tuple[float, float]:
    """A validation score of ``model`` without and with a fitted predictive scale, both out of
    sample: the validation rows are split into their even and odd rows, the scale is fitted on
    one half (:func:`fit_predictive_scale`) and the other half scored with it, and back; each
    half's score is weighted by its share of the rows. The in-sample calibrated score (scale
    fitted and scored on the same rows) is optimistic by construction and must not decide
    whether to calibrate; this pair may (``docs/results/uci.md`` section 17).

    Args:
        model: a network with a predictive scale, or a
            :class:`~pyro_gpn.models.NetworkEnsemble` (:func:`predictive_scale_of`).
        x_val, y_val: ``[S, M]`` validation inputs (at least 4 rows: the scale is fitted on
            each half) and their targets, as ``model.log_predictive`` takes them.
        score: ``score(x, y)``, the score of rows at the model's current scale (higher is
            better); ``None``: the mean log predictive density, ``model.log_predictive(x, y)``.

    Returns:
        ``(uncalibrated, calibrated)``. The model's scale is left as it was.
    """
    check_ndim("x_val", check_tensor("x_val", x_val), 2)
    if x_val.shape[0] < 4:
        raise ValueError(
            f"x_val needs at least 4 rows to cross-fit (2 per half), got {x_val.shape[0]}"
        )
    if y_val.shape[0] != x_val.shape[0]:
        raise ValueError(
            f"y_val must have one row per row of x_val ({x_val.shape[0]}), got {y_val.shape[0]}"
        )
    if score is None:

        def score(x: Tensor, y: Tensor) -> float:
            with torch.no_grad():
                return float(model.log_predictive(x, y).mean())

    scale = predictive_scale_of(model)
    kept = scale.clone()
    raw, calibrated = 0.0, 0.0
    try:
        for fit_rows, score_rows, share in crossfit_halves(x_val.shape[0]):
            x_score, y_score = x_val[score_rows], y_val[score_rows]
            fit_predictive_scale(model, x_val[fit_rows], y_val[fit_rows])  # sets the scale
            calibrated += share * score(x_score, y_score)
            scale.fill_(1.0)
            raw += share * score(x_score, y_score)
    finally:
        scale.copy_(kept)
    return raw, calibrated


@dataclass(frozen=True)
class _CalibrationTarget:
    """What :func:`fit_predictive_scale` calibrates: a network's head, or a
    :class:`~pyro_gpn.models.NetworkEnsemble` as a whole (its own scale; the members' scales
    stay as they are). ``scale`` is the buffer to fit, ``width`` the number of outputs
    (regression) or classes, and ``predictive_mixture(x)`` / ``point_logits(x)`` give the
    predictive at the current scale."""

    task: str
    scale: Tensor
    width: int
    predictive_mixture: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]
    point_logits: Callable[[Tensor], tuple[Tensor, Tensor]]

    @classmethod
    def of(cls, model) -> _CalibrationTarget:
        from ..models.ensemble import NetworkEnsemble

        if isinstance(model, NetworkEnsemble):
            task = model.task
            width = model.num_outputs if task == "regression" else model.num_classes
            return cls(
                task, model.predictive_scale, width, model.predictive_mixture, model.point_logits
            )
        head = getattr(model, "head", None)
        task = getattr(head, "task", None)
        if task not in ("regression", "classification") or not hasattr(head, "predictive_scale"):
            raise ValueError(
                "model must have a head with a predictive scale (GaussianHead, "
                "HeteroscedasticGaussianHead, StudentTHead or SoftmaxHead) or be a "
                "NetworkEnsemble to "
                f"calibrate its predictive, got {type(head).__name__}"
            )
        return cls(
            task,
            head.predictive_scale,
            head.num_outputs if task == "regression" else head.num_classes,
            lambda x: head.predictive_mixture(model.hidden(x)),
            lambda x: head.point_logits(model.hidden(x)),
        )


def _maximise_over_scale(score, width: int, low: float, high: float) -> tuple[Tensor, Tensor]:
    """The scale ``[width]`` in ``[low, high]`` that maximises ``score`` (``[G, width]`` scales
    to ``[G, width]`` values, one independent problem per column), by a log-spaced grid and
    golden-section search between the best grid point's neighbours; and whether the grid's best
    point was a bound (``[width]`` bool)."""
    grid = torch.logspace(math.log10(low), math.log10(high), _GRID, dtype=torch.float64)
    values = score(grid[:, None].expand(-1, width))  # [G, width]
    best = values.argmax(0)  # [width]
    log_grid = grid.log()
    lo = log_grid[(best - 1).clamp_min(0)]
    hi = log_grid[(best + 1).clamp_max(_GRID - 1)]
    ratio = (math.sqrt(5.0) - 1) / 2
    for _ in range(_GOLDEN_STEPS):  # every column at once: a bracket per column
        a = hi - ratio * (hi - lo)
        b = lo + ratio * (hi - lo)
        pair = score(torch.stack([a, b]).exp())
        left = pair[0] > pair[1]  # the maximum lies in [lo, b]
        hi = torch.where(left, b, hi)
        lo = torch.where(left, lo, a)
    return ((lo + hi) / 2).exp(), (best == 0) | (best == _GRID - 1)
