r"""Test metrics of predictive distributions: one home for every number the library reports.

Regression (predictive mean ``m``, variance ``v`` per target; a data set standardised as
``y = (y_orig - mu) / s`` is scored in original units by passing ``scale=s``):

* :func:`rmse`: ``sqrt(mean((m - y)^2)) * s`` over all samples and outputs;
* :func:`gaussian_log_likelihood`: the mean over samples of ``log N(y_orig | s m + mu, s^2 v)``
  ``= log N(y | m, v) - sum_d log s_d`` (a full covariance is scored as a multivariate Gaussian);
* :func:`central_interval` / :func:`mixture_central_interval` / :func:`empirical_interval`: the
  central ``level`` interval of a Gaussian (``m +- z sqrt(v)``, ``z`` the standard normal's
  ``(1 + level) / 2`` quantile), of a Gaussian mixture (its quantiles, by bisection on its
  distribution function) or of draws (their empirical quantiles); :func:`interval_coverage`: the
  fraction of targets inside;
* :func:`central_interval_coverage`: the coverage of the central intervals of a regression
  :class:`~pyro_gpn.heads.Prediction`, or of a head's Gaussian-mixture predictive
  (``head.predictive_mixture``), at several levels: the regression calibration curve (a
  calibrated predictive covers a fraction ``level`` of the targets at every level).

Classification (class probabilities ``p`` ``[S, C]`` or logits, labels ``[S]``):

* :func:`classification_error`: the fraction of samples whose label is not the argmax;
* :func:`categorical_nll`: the mean of ``-log p[label]``;
* :func:`expected_calibration_error`: ``sum_b |B_b| / S * |accuracy(B_b) - confidence(B_b)|``
  over equal-width bins of the top-class probability (Guo et al., 2017);
  :func:`reliability_diagram`: the bins themselves (accuracy against confidence).

The calibration functions take a :class:`~pyro_gpn.heads.Prediction` from any route's
``predict`` (or plain tensors); :mod:`pyro_gpn.plotting` draws them
(:func:`~pyro_gpn.plotting.plot_reliability_diagram`,
:func:`~pyro_gpn.plotting.plot_interval_coverage`).

Functions take and return tensors (a 0-d tensor for a mean) and do not detach; the
``reduction`` argument (``"mean"``, ``"sum"``, ``"none"``) of the per-sample metrics lets a
caller accumulate over mini-batches.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ._validation import check_class_labels, check_finite, check_int, check_not_empty, check_tensor
from .heads import Prediction
from .losses import gaussian_predictive_log_likelihood
from .moments.gaussian import Moments

__all__ = [
    "ReliabilityDiagram",
    "categorical_nll",
    "central_interval",
    "central_interval_coverage",
    "classification_error",
    "empirical_interval",
    "expected_calibration_error",
    "gaussian_log_likelihood",
    "interval_coverage",
    "mean_squared_error",
    "mixture_central_interval",
    "reliability_diagram",
    "rmse",
]

_REDUCTIONS = ("mean", "sum", "none")


def _reduce(values: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return values.mean()
    if reduction == "sum":
        return values.sum()
    if reduction == "none":
        return values
    raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _same_shape(name: str, value: Tensor, reference: Tensor) -> None:
    if value.shape != reference.shape:
        raise ValueError(
            f"{name} must have the shape {tuple(reference.shape)}, got {tuple(value.shape)}"
        )


def _scale(scale: float | Tensor, like: Tensor) -> Tensor:
    scale = torch.as_tensor(scale, dtype=like.dtype, device=like.device)
    if not bool((scale > 0).all()) or not bool(torch.isfinite(scale).all()):
        raise ValueError(f"scale must be positive and finite, got {scale}")
    return scale


def _check_level(level: float) -> None:
    if not (isinstance(level, (int, float)) and 0.0 < level < 1.0):
        raise ValueError(f"level must lie in (0, 1), got {level!r}")


_SQRT_2PI = math.sqrt(2 * math.pi)


def _normal_quantile(q: float) -> float:
    """The standard normal's ``q`` quantile."""
    return torch.special.ndtri(torch.tensor(q, dtype=torch.float64)).item()


# ---------------------------------------------------------------------------------- regression
def mean_squared_error(
    mean: Tensor, target: Tensor, scale: float | Tensor = 1.0, reduction: str = "mean"
) -> Tensor:
    """Squared errors ``(scale * (mean - target))^2``, averaged (or summed) over all entries.

    Args:
        mean: ``[S, D]`` (or ``[S]``) predictive means.
        target: targets of the same shape.
        scale: the targets' standard deviation ``s`` (a number or ``[D]``): errors in original
            units of data standardised as ``(y - mu) / s``.
        reduction: ``"mean"`` / ``"sum"`` over every entry, or ``"none"`` (the shape of
            ``mean``).

    Raises:
        TypeError: ``mean`` or ``target`` is not a tensor.
        ValueError: naming ``mean`` or ``target``: not floating point, shapes that differ, no
            entries to average (``reduction="mean"``), or (while validation is on) NaN or
            infinite values.
    """
    check_tensor("mean", mean)
    check_tensor("target", target)
    _same_shape("target", target, mean)
    check_not_empty("mean", mean, reduction, rows=False)
    check_finite("mean", mean)
    check_finite("target", target)
    return _reduce(((mean - target) * _scale(scale, mean)).square(), reduction)


def rmse(mean: Tensor, target: Tensor, scale: float | Tensor = 1.0) -> Tensor:
    """Root mean squared error over all samples and outputs, in original units (``scale``).

    Raises:
        TypeError, ValueError: as :func:`mean_squared_error` (an empty ``mean`` included).
    """
    return mean_squared_error(mean, target, scale).sqrt()


def gaussian_log_likelihood(
    predictive: Moments, target: Tensor, scale: float | Tensor = 1.0, reduction: str = "mean"
) -> Tensor:
    """Per-sample log density of the targets under a Gaussian predictive, in original units.

    ``log N(y | m, v) - sum_d log s_d``: the density of the un-standardised target under the
    un-standardised predictive (:func:`~pyro_gpn.losses.gaussian_predictive_log_likelihood`
    gives the first term; ``var`` or a full ``cov`` are both scored).

    Args:
        predictive: ``Moments`` with mean ``[S, D]`` and a variance or covariance (observation
            noise included).
        target: ``[S, D]`` targets in the predictive's (standardised) units.
        scale: the targets' standard deviations ``s`` (a number or ``[D]``).
        reduction: ``"mean"`` (over samples), ``"sum"`` or ``"none"`` (``[S]``).

    Raises:
        ValueError: naming the argument: a bad ``scale``, targets that do not fit, or no
            samples to average (``reduction="mean"``).
    """
    check_not_empty("predictive.mean", predictive.mean, reduction, rows=False)
    scale = _scale(scale, predictive.mean)
    per_sample = gaussian_predictive_log_likelihood(predictive, target, reduction="none")
    log_scale = scale.log().expand(predictive.mean.shape[-1:]).sum()
    return _reduce(per_sample - log_scale, reduction)


def central_interval(mean: Tensor, var: Tensor, level: float = 0.9) -> tuple[Tensor, Tensor]:
    """The central ``level`` interval ``mean +- z sqrt(var)`` of Gaussians (any equal shapes)."""
    _check_level(level)
    _same_shape("var", var, mean)
    if bool((var < 0).any()):
        raise ValueError("var must be non-negative")
    z = _normal_quantile(0.5 + level / 2)
    half = z * var.sqrt()
    return mean - half, mean + half


def mixture_central_interval(
    weights: Tensor, mean: Tensor, var: Tensor, level: float = 0.9, max_steps: int = 100
) -> tuple[Tensor, Tensor]:
    """The central ``level`` interval of Gaussian mixtures ``sum_k w_k N(mean_k, var_k)``: their
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles.

    The mixture's distribution function ``F(t) = sum_k w_k Phi((t - mean_k) / sd_k)`` is
    increasing, so each quantile is its unique root of ``F(t) = q``, found by Newton's method
    safeguarded by bisection: the bracket starts at ``min_k (mean_k - 10 sd_k)`` and
    ``max_k (mean_k + 10 sd_k)`` (which holds every quantile between ``1e-23`` and
    ``1 - 1e-23``) and shrinks at every step; a Newton step that leaves it or fails to halve
    the step before it (Newton's method can cycle on a mixture's distribution function), or a
    density that underflows, is replaced by the midpoint. Newton starts at the moment-matched
    Gaussian's quantile; each entry stops once its step is below the dtype's resolution. One
    component gives the Gaussian interval of :func:`central_interval` (to rounding). No closed
    form exists for ``K > 1``, and torch's ``MixtureSameFamily`` has ``cdf`` but no ``icdf``.

    Args:
        weights: ``[K]`` mixture weights summing to 1 (e.g. from a head's
            ``predictive_mixture``: Gauss-Hermite weights of the heteroscedastic head).
        mean, var: ``[K, ...]`` component means and (positive) variances.
        level: the interval's probability, in ``(0, 1)``.
        max_steps: the most Newton / bisection steps per quantile.

    Returns:
        ``lower, upper``, each of ``mean.shape[1:]``.
    """
    _check_level(level)
    if weights.ndim != 1 or mean.ndim < 1 or weights.shape[0] != mean.shape[0]:
        raise ValueError(
            f"weights must be [K] and mean [K, ...] with the same K, got {tuple(weights.shape)} "
            f"and {tuple(mean.shape)}"
        )
    _same_shape("var", var, mean)
    if bool((weights < 0).any()) or not abs(float(weights.sum()) - 1.0) < 1e-4:
        raise ValueError(f"weights must be non-negative and sum to 1, got {weights}")
    if bool((var <= 0).any()) or not bool(torch.isfinite(var).all()):
        raise ValueError("var must be positive and finite")
    shape = mean.shape[1:]
    weights = (weights / weights.sum()).reshape(-1, 1)
    mean, std = mean.reshape(mean.shape[0], -1), var.reshape(var.shape[0], -1).sqrt()
    mix_mean = (weights * mean).sum(0)
    mix_var = (weights * (std.square() + mean.square())).sum(0) - mix_mean.square()
    mix_sd = (mix_var.clamp_min(0) + (weights * std.square()).sum(0) * 1e-12).sqrt()
    bounds = []
    for q in (0.5 - level / 2, 0.5 + level / 2):
        lo, hi = (mean - 10 * std).amin(0), (mean + 10 * std).amax(0)
        # start at the quantile of the moment-matched Gaussian
        t = (mix_mean + _normal_quantile(q) * mix_sd).clamp(lo, hi)
        previous = hi - lo
        active = torch.arange(t.shape[0], device=t.device)  # the columns still moving
        for _ in range(max_steps):
            if active.numel() == 0:
                break
            m, s, ta, a, b = mean[:, active], std[:, active], t[active], lo[active], hi[active]
            z = (ta - m) / s
            excess = (weights * torch.special.ndtr(z)).sum(0) - q
            density = (weights * torch.exp(-0.5 * z.square()) / s).sum(0) / _SQRT_2PI
            a, b = torch.where(excess < 0, ta, a), torch.where(excess < 0, b, ta)
            newton = ta - excess / density.clamp_min(torch.finfo(ta.dtype).tiny)
            resolution = 4 * torch.finfo(ta.dtype).eps * (ta.abs() + s.amin(0))
            # Newton's step if it stays inside the open bracket and is less than half the step
            # before it (else it may cycle: Numerical Recipes' rtsafe), or once converged
            move = (newton - ta).abs()
            fast = (newton > a) & (newton < b) & (move < 0.5 * previous[active].abs())
            take = (fast | (move <= resolution)) & (density > 0)
            step = torch.where(take, newton, 0.5 * (a + b)) - ta
            t[active], lo[active], hi[active], previous[active] = ta + step, a, b, step
            active = active[step.abs() > resolution]
        bounds.append(t.reshape(shape))
    return bounds[0], bounds[1]


def empirical_interval(draws: Tensor, level: float = 0.9) -> tuple[Tensor, Tensor]:
    """The empirical ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of ``draws``
    ``[K, ...]`` over the first dimension (``K`` draws of the predictive)."""
    _check_level(level)
    if draws.ndim < 1 or draws.shape[0] < 2:
        raise ValueError(f"draws must hold at least two draws along dim 0, got {draws.shape}")
    probs = torch.tensor([0.5 - level / 2, 0.5 + level / 2], dtype=draws.dtype)
    bounds = torch.quantile(draws, probs.to(draws.device), dim=0)
    return bounds[0], bounds[1]


def interval_coverage(target: Tensor, lower: Tensor, upper: Tensor) -> Tensor:
    """The fraction of ``target`` entries with ``lower <= target <= upper`` (equal shapes)."""
    _same_shape("lower", lower, target)
    _same_shape("upper", upper, target)
    return ((target >= lower) & (target <= upper)).to(torch.float64).mean()


# ---------------------------------------------------------------------------------- classification
def _check_labels(scores: Tensor, labels: Tensor, name: str = "probs") -> Tensor:
    """``scores`` (the argument ``name``) ``[S, C]``, finite while validation is on, and
    ``labels`` ``[S]`` integers in ``[0, C)`` (one device synchronisation for the range);
    returns ``labels`` as ``long``."""
    if not isinstance(scores, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(scores).__name__}")
    if scores.ndim != 2:
        raise ValueError(
            f"{name} (probabilities / logits) must be [S, C], got {tuple(scores.shape)}"
        )
    if not isinstance(labels, Tensor):
        raise TypeError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if labels.shape != scores.shape[:1] or labels.dtype.is_floating_point:
        raise ValueError(f"labels must be integers of shape [{scores.shape[0]}], got {labels}")
    labels = check_class_labels("labels", labels, scores.shape[1])
    if scores.is_floating_point():
        check_finite(name, scores)
    return labels


def classification_error(scores: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """Misclassification: ``argmax_c scores[s, c] != labels[s]`` (``scores``: ``[S, C]``
    probabilities or logits; ties go to the lowest class index). Float64 0/1 per sample.

    Raises:
        ValueError: naming ``labels``: not ``[S]`` integers in ``[0, C)``, or no samples to
            average (``reduction="mean"``); scores that are not ``[S, C]`` (or, while validation
            is on, not finite).
    """
    labels = _check_labels(scores, labels, "scores")
    check_not_empty("labels", labels, reduction)
    return _classification_error(scores, labels, reduction)


def _classification_error(scores: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """:func:`classification_error` without the checks (no device synchronisation): for
    callers that checked the labels once (:func:`pyro_gpn.inference.evaluate`'s batches)."""
    return _reduce((scores.argmax(-1) != labels).to(torch.float64), reduction)


def categorical_nll(probs: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """Negative log predictive probability of the labels, ``-log probs[s, labels[s]]``.

    Args:
        probs: ``[S, C]`` class probabilities (rows summing to one).
        labels: ``[S]`` integer labels.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[S]``).

    Raises:
        ValueError: naming ``labels`` (not ``[S]`` integers in ``[0, C)``, or no samples to
            average with ``reduction="mean"``) or ``probs`` (not rows of probabilities).
    """
    labels = _check_labels(probs, labels)
    check_not_empty("labels", labels, reduction)
    if bool((probs < 0).any()) or not torch.allclose(
        probs.sum(-1), torch.ones((), dtype=probs.dtype, device=probs.device), atol=1e-4
    ):
        raise ValueError("probs must be non-negative rows that sum to one")
    picked = probs.gather(-1, labels[:, None])[:, 0]
    return _reduce(-picked.log(), reduction)


def _class_probs(probs: Tensor | Prediction) -> Tensor:
    if isinstance(probs, Prediction):
        if probs.task != "classification":
            raise ValueError(
                f"probs is a {probs.task} Prediction; calibration by bins needs class "
                "probabilities (for regression use central_interval_coverage)"
            )
        return probs.probs
    if not isinstance(probs, Tensor):
        raise TypeError(f"probs must be a Prediction or a tensor, got {type(probs).__name__}")
    return probs


@dataclass(frozen=True)
class ReliabilityDiagram:
    """The equal-width bins of top-class probability behind the expected calibration error.

    Attributes:
        edges: ``[B + 1]`` bin edges on ``[0, 1]``.
        confidence: ``[B]`` mean top-class probability of the samples in each bin (NaN where
            a bin is empty).
        accuracy: ``[B]`` fraction of them classified correctly (NaN where empty).
        counts: ``[B]`` number of samples per bin.
        ece: the expected calibration error, ``sum_b counts_b / S * |accuracy_b -
            confidence_b|``.
    """

    edges: Tensor
    confidence: Tensor
    accuracy: Tensor
    counts: Tensor
    ece: float


def reliability_diagram(
    probs: Tensor | Prediction, labels: Tensor, num_bins: int = 15
) -> ReliabilityDiagram:
    """Bin the samples by top-class probability (a calibrated classifier has accuracy equal to
    confidence in every bin).

    A sample with top probability ``c`` falls in bin ``b`` with ``b / B < c <= (b + 1) / B``.

    Args:
        probs: ``[S, C]`` class probabilities, or a classification
            :class:`~pyro_gpn.heads.Prediction` (any route's ``predict``).
        labels: ``[S]`` integer labels.
        num_bins: the number of bins ``B``.

    Returns:
        :class:`ReliabilityDiagram` (float64 tensors on the probabilities' device).
    """
    probs = _class_probs(probs)
    labels = _check_labels(probs, labels)
    num_bins = check_int("num_bins", num_bins, 1)
    if labels.shape[0] == 0:
        raise ValueError("labels is empty: a reliability diagram needs at least one sample")
    confidence, predicted = probs.detach().to(torch.float64).max(-1)
    correct = (predicted == labels).to(torch.float64)
    bins = (confidence * num_bins).ceil().long().clamp(1, num_bins) - 1
    zeros = torch.zeros(num_bins, dtype=torch.float64, device=probs.device)
    counts = zeros.index_add(0, bins, torch.ones_like(confidence))
    conf_sum = zeros.index_add(0, bins, confidence)
    correct_sum = zeros.index_add(0, bins, correct)
    ece = float((correct_sum - conf_sum).abs().sum() / labels.shape[0])
    empty = counts == 0
    safe = counts.clamp_min(1)
    nan = torch.full_like(zeros, float("nan"))
    return ReliabilityDiagram(
        edges=torch.linspace(0, 1, num_bins + 1, dtype=torch.float64, device=probs.device),
        confidence=torch.where(empty, nan, conf_sum / safe),
        accuracy=torch.where(empty, nan, correct_sum / safe),
        counts=counts.long(),
        ece=ece,
    )


def expected_calibration_error(
    probs: Tensor | Prediction, labels: Tensor, num_bins: int = 15
) -> Tensor:
    """Expected calibration error of the top-class probabilities (equal-width bins on [0, 1]).

    A sample with top probability ``c`` falls in bin ``b`` with ``b / B < c <= (b + 1) / B``;
    the error is ``sum_b n_b / S * |accuracy_b - mean confidence_b|`` over the non-empty bins
    (:func:`reliability_diagram` returns the bins).

    Args:
        probs: ``[S, C]`` class probabilities, or a classification
            :class:`~pyro_gpn.heads.Prediction`.
        labels: ``[S]`` integer labels.
        num_bins: the number of bins ``B``.

    Raises:
        ValueError: naming ``labels`` (not ``[S]`` integers in ``[0, C)``, or empty),
            ``num_bins``, or the probabilities (not ``[S, C]``; NaN or infinite while validation
            is on).
    """
    probs = _class_probs(probs)
    labels = _check_labels(probs, labels)
    num_bins = check_int("num_bins", num_bins, 1)
    if labels.shape[0] == 0:
        raise ValueError("labels is empty: the calibration error needs at least one sample")
    confidence, predicted = probs.to(torch.float64).max(-1)
    correct = (predicted == labels).to(torch.float64)
    bins = (confidence * num_bins).ceil().long().clamp(1, num_bins) - 1
    # n_b / S * |accuracy_b - confidence_b| = |sum over bin b of (correct - confidence)| / S
    gap = torch.zeros(num_bins, dtype=torch.float64, device=probs.device)
    gap.index_add_(0, bins, correct - confidence)
    return gap.abs().sum() / labels.shape[0]


# ---------------------------------------------------------------------------------- regression
def central_interval_coverage(
    prediction: Prediction | tuple[Tensor, Tensor, Tensor],
    target: Tensor,
    levels: Sequence[float] = (0.5, 0.8, 0.9, 0.95),
) -> Tensor:
    """Coverage of the central predictive intervals at each of ``levels``.

    The regression counterpart of the reliability diagram: for a calibrated predictive the
    coverage equals the level (below it: over-confident, above: under-confident).

    Args:
        prediction: a regression :class:`~pyro_gpn.heads.Prediction` (any route's
            ``predict``: mean and std ``[S, D]``; Gaussian intervals ``mean +- z std``), or a
            Gaussian-mixture predictive ``(weights [K], mean [K, S, D], var [K, S, D])`` as a
            head's ``predictive_mixture`` returns it (the mixture's own quantiles,
            :func:`mixture_central_interval`: the heteroscedastic head's predictive is not
            Gaussian, and its moment-matched Gaussian interval would be too wide).
        target: ``[S, D]`` targets (``[S]`` for ``D = 1``), in the prediction's units.
        levels: the interval levels, each in ``(0, 1)``.

    Returns:
        ``[len(levels)]`` float64 coverages (fractions of target entries inside).
    """
    if isinstance(prediction, tuple):
        if len(prediction) != 3:
            raise ValueError("a mixture prediction must be (weights, mean, var)")
        weights, mean, var = (t.detach() for t in prediction)
        interval = functools.partial(mixture_central_interval, weights, mean, var)
        reference = mean[0]
    elif isinstance(prediction, Prediction) and prediction.task == "regression":
        mean, var = prediction.mean.detach(), prediction.std.detach().square()
        interval = functools.partial(central_interval, mean, var)
        reference = mean
    else:
        raise ValueError(
            "prediction must be a regression Prediction (mean and std) or a Gaussian mixture "
            "(weights, mean, var)"
        )
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a tensor, got {type(target).__name__}")
    if target.shape != reference.shape and target.numel() == reference.numel():
        target = target.reshape(reference.shape)
    _same_shape("target", target, reference)
    if target.numel() == 0:
        raise ValueError("target is empty: coverage needs at least one sample")
    levels = list(levels)
    if not levels:
        raise ValueError("levels must hold at least one level")
    target = target.detach().to(reference.dtype)
    out = []
    for level in levels:
        lower, upper = interval(level)
        out.append(interval_coverage(target, lower, upper))
    return torch.stack(out)
