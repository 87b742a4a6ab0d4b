"""Test metrics of a trained model's predictions and the checks of ``(x, y)`` data pairs."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from .._validation import (
    check_class_labels,
    check_finite,
    check_inputs,
    check_int,
    check_ndim,
    check_tensor,
)
from ..metrics import _classification_error, gaussian_log_likelihood, mean_squared_error
from .train_config import _TASKS

__all__ = ["evaluate"]


def _infer_task(y: Tensor) -> str:
    return "regression" if y.is_floating_point() else "classification"


def _parameter_like(model: nn.Module) -> Tensor | None:
    """The model's first floating parameter (its dtype and device), if any."""
    return next((p for p in model.parameters() if p.is_floating_point()), None)


def _check_data(
    name: str, data: tuple[Tensor, Tensor], like: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """A data pair ``(x [S, M], y)`` with ``S >= 1``: tensors or NumPy arrays, on one device
    (cpu or cuda), ``x`` finite (unscaled inputs draw a warning), floating targets finite.
    With ``like`` (a model parameter), floating ``x`` and ``y`` are cast to its dtype (the rule
    of :mod:`pyro_gpn._validation`); the caller moves them to its device."""
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError(f"{name} must be a pair (x, y) of tensors")
    x, y = (
        torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for v in data
    )
    check_tensor(f"{name} x", x)
    check_ndim(f"{name} x", x, 2)
    if not isinstance(y, Tensor):
        raise TypeError(f"{name} y must be a torch.Tensor, got {type(y).__name__}")
    for part, value in (("x", x), ("y", y)):
        if value.device.type not in ("cpu", "cuda"):
            raise ValueError(
                f"{name} {part} is on device {value.device}, which holds no data; give the data "
                "on cpu or cuda (the Trainer moves them to config.device)"
            )
    if y.device != x.device:
        raise ValueError(f"{name} x is on device {x.device} but {name} y on {y.device}")
    if y.shape[:1] != x.shape[:1] or x.shape[0] == 0:
        raise ValueError(
            f"{name} x and y must hold the same, non-zero number of samples, "
            f"got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    check_inputs(f"{name} x", x)
    if y.is_floating_point():
        check_finite(f"{name} y", y)
    if like is not None:
        x = x.to(like.dtype)
        if y.is_floating_point():
            y = y.to(like.dtype)
    return x, y


def _check_labels(
    name: str, labels: Tensor, num_classes: int | None, check_range: bool = True
) -> Tensor:
    """Class labels ``{name} y``: integers in ``[0, num_classes)`` (the model's head, where it
    has one), one device synchronisation (none without ``check_range``); returned as
    ``long``."""
    return check_class_labels(
        f"{name} y",
        labels,
        num_classes,
        check_range=check_range,
        hint="task='classification' takes integer class labels; float targets: task='regression'",
    )


def _batches(n: int, batch_size: int, order: Tensor | None = None):
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        yield slice(start, stop) if order is None else order[start:stop]


@torch.no_grad()
def _mean_loss(model: nn.Module, x: Tensor, y: Tensor, batch_size: int) -> float:
    total = 0.0
    for index in _batches(x.shape[0], batch_size):
        total += float(model.loss(x[index], y[index])) * (index.stop - index.start)
    return total / x.shape[0]


@torch.no_grad()
def evaluate(
    model: nn.Module, x: Tensor, y: Tensor, task: str | None = None, batch_size: int = 4096
) -> dict[str, float]:
    """Test metrics of a model's predictions ``model(x)`` (in ``eval()`` mode, no gradients).

    * classification: ``{"error": e}``, the fraction of samples whose label differs from the
      argmax of the predictive mean logits (for Gaussian logits with a full covariance this is the
      most probable class of the mean prediction, not of the averaged softmax);
    * regression: ``{"rmse": r, "log_likelihood": ll}``, the root mean squared error of the
      predictive mean over all samples and outputs, and the mean over samples of the log
      predictive density: ``model.log_predictive(x, y)`` where the model has one (the head's
      own predictive: a Gaussian, the heteroscedastic head's mixture, the Student-t head's
      scale mixture), else ``log N(y | mean, var)``
      (:func:`~pyro_gpn.metrics.gaussian_log_likelihood`).

    Args:
        model: returns :class:`~pyro_gpn.moments.gaussian.Moments` from ``model(x)``.
        x: ``[S, M]`` inputs.
        y: ``[S]`` integer labels or ``[S, D]`` real targets.
        task: ``"classification"``, ``"regression"`` or ``None`` (inferred from ``y``'s dtype).
        batch_size: evaluation batch size (memory only), a positive integer.

    Raises:
        TypeError: ``x`` or ``y`` is not a tensor (or NumPy array).
        ValueError: naming the argument: ``x`` and ``y`` of different or zero rows, NaN or
            infinite values, an unknown ``task``, class labels ``y`` that are not integers in
            ``[0, C)`` (``C`` the model head's classes), or a ``batch_size`` that is not a
            positive integer.
    """
    batch_size = check_int("batch_size", batch_size, 1)
    like = _parameter_like(model)
    x, y = _check_data("data", (x, y), like)
    if like is not None:
        x, y = x.to(like.device), y.to(like.device)
    task = _infer_task(y) if task is None else task
    if task not in _TASKS:
        raise ValueError(f"task must be one of {_TASKS} or None, got {task!r}")
    if task == "regression" and not y.is_floating_point():
        raise ValueError(
            f"task='regression' needs floating targets y, got y of dtype {y.dtype} (class "
            "labels: use task='classification')"
        )
    classes = None
    if task == "classification":  # an out-of-range label would score as a silent error
        # once, here: the batches below score with the unchecked metric; a model without a
        # head gives the number of classes with its first prediction
        classes = getattr(getattr(model, "head", None), "num_classes", None)
        y = _check_labels("data", y, classes, check_range=classes is not None)
    was_training = model.training
    model.eval()
    try:
        errors = squared = log_lik = 0.0
        for index in _batches(x.shape[0], batch_size):
            prediction = model(x[index])
            if task == "classification":
                if classes is None:
                    classes = prediction.mean.shape[-1]
                    _check_labels("data", y, classes)
                errors += float(_classification_error(prediction.mean, y[index], reduction="sum"))
            else:
                if y[index].numel() != prediction.mean.numel():
                    raise ValueError(
                        f"task='regression': y {tuple(y.shape)} does not match the predictions "
                        f"{tuple(prediction.mean.shape[1:])} per sample (a classifier? use "
                        "task='classification')"
                    )
                target = y[index].reshape(prediction.mean.shape)
                squared += float(mean_squared_error(prediction.mean, target, reduction="sum"))
                if hasattr(model, "log_predictive"):  # the head's own predictive density
                    log_lik += float(model.log_predictive(x[index], target).sum())
                else:
                    log_lik += float(gaussian_log_likelihood(prediction, target, reduction="sum"))
    finally:
        model.train(was_training)
    n = x.shape[0]
    if task == "classification":
        return {"error": errors / n}
    return {"rmse": math.sqrt(squared / y.numel()), "log_likelihood": log_lik / n}
