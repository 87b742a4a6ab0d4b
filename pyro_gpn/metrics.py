r"""Test metrics of predictive distributions: one home for every number the library reports.

Regression (predictive mean ``m``, variance ``v`` per target; a data set standardised as
``y = (y_orig - mu) / s`` is scored in original units by passing ``scale=s``):

* :func:`rmse`: ``sqrt(mean((m - y)^2)) * s`` over all samples and outputs;
* :func:`gaussian_log_likelihood`: the mean over samples of ``log N(y_orig | s m + mu, s^2 v)``
  ``= log N(y | m, v) - sum_d log s_d`` (a full covariance is scored as a multivariate Gaussian);
* :func:`central_interval` / :func:`empirical_interval`: the central ``level`` interval of a
  Gaussian (``m +- z sqrt(v)``, ``z`` the standard normal's ``(1 + level) / 2`` quantile) or of
  draws (their empirical quantiles); :func:`interval_coverage`: the fraction of targets inside;
* :func:`central_interval_coverage`: the coverage of the central intervals of a regression
  :class:`~pyro_gpn.heads.Prediction` at several levels, the regression calibration curve
  (a calibrated predictive covers a fraction ``level`` of the targets at every level).

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

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

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
    """
    _same_shape("target", target, mean)
    return _reduce(((mean - target) * _scale(scale, mean)).square(), reduction)


def rmse(mean: Tensor, target: Tensor, scale: float | Tensor = 1.0) -> Tensor:
    """Root mean squared error over all samples and outputs, in original units (``scale``)."""
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
    """
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
    z = torch.special.ndtri(torch.tensor(0.5 + level / 2, dtype=torch.float64)).item()
    half = z * var.sqrt()
    return mean - half, mean + half


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
def _check_labels(scores: Tensor, labels: Tensor) -> None:
    if scores.ndim != 2:
        raise ValueError(f"probabilities / logits must be [S, C], got {tuple(scores.shape)}")
    if labels.shape != scores.shape[:1] or labels.dtype.is_floating_point:
        raise ValueError(f"labels must be integers of shape [{scores.shape[0]}], got {labels}")


def classification_error(scores: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """Misclassification: ``argmax_c scores[s, c] != labels[s]`` (``scores``: ``[S, C]``
    probabilities or logits; ties go to the lowest class index). Float64 0/1 per sample."""
    _check_labels(scores, labels)
    return _reduce((scores.argmax(-1) != labels).to(torch.float64), reduction)


def categorical_nll(probs: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """Negative log predictive probability of the labels, ``-log probs[s, labels[s]]``.

    Args:
        probs: ``[S, C]`` class probabilities (rows summing to one).
        labels: ``[S]`` integer labels.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[S]``).
    """
    _check_labels(probs, labels)
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
    _check_labels(probs, labels)
    if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive integer, got {num_bins!r}")
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
    """
    probs = _class_probs(probs)
    _check_labels(probs, labels)
    if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive integer, got {num_bins!r}")
    confidence, predicted = probs.to(torch.float64).max(-1)
    correct = (predicted == labels).to(torch.float64)
    bins = (confidence * num_bins).ceil().long().clamp(1, num_bins) - 1
    # n_b / S * |accuracy_b - confidence_b| = |sum over bin b of (correct - confidence)| / S
    gap = torch.zeros(num_bins, dtype=torch.float64, device=probs.device)
    gap.index_add_(0, bins, correct - confidence)
    return gap.abs().sum() / max(1, labels.shape[0])


# ---------------------------------------------------------------------------------- regression
def central_interval_coverage(
    prediction: Prediction,
    target: Tensor,
    levels: Sequence[float] = (0.5, 0.8, 0.9, 0.95),
) -> Tensor:
    """Coverage of the Gaussian central intervals ``mean +- z std`` at each of ``levels``.

    The regression counterpart of the reliability diagram: for a calibrated predictive the
    coverage equals the level (below it: over-confident, above: under-confident).

    Args:
        prediction: a regression :class:`~pyro_gpn.heads.Prediction` (any route's
            ``predict``: mean and std ``[S, D]``).
        target: ``[S, D]`` targets (``[S]`` for ``D = 1``), in the prediction's units.
        levels: the interval levels, each in ``(0, 1)``.

    Returns:
        ``[len(levels)]`` float64 coverages (fractions of target entries inside).
    """
    if not isinstance(prediction, Prediction) or prediction.task != "regression":
        raise ValueError("prediction must be a regression Prediction (mean and std)")
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a tensor, got {type(target).__name__}")
    if target.shape != prediction.mean.shape and target.numel() == prediction.mean.numel():
        target = target.reshape(prediction.mean.shape)
    _same_shape("target", target, prediction.mean)
    if target.numel() == 0:
        raise ValueError("target is empty: coverage needs at least one sample")
    levels = list(levels)
    if not levels:
        raise ValueError("levels must hold at least one level")
    var = prediction.std.detach().square()
    mean = prediction.mean.detach()
    out = []
    for level in levels:
        lower, upper = central_interval(mean, var, level)
        out.append(interval_coverage(target.detach().to(mean.dtype), lower, upper))
    return torch.stack(out)
