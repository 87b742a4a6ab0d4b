"""Arguments and data of the GPN models that NUTS samples, validated once for both
(:class:`~pyro_gpn.models.nonparametric.NonParametricGPN` and
:class:`~pyro_gpn.models.sampled_targets.SampledTargetsGPN`): layer widths, likelihood, priors,
inputs and targets (regression outputs or class labels). Every check raises ``ValueError``
(``TypeError`` for a non-tensor) naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyro.distributions as dist
import torch
from torch import Tensor

from pyro_gpn._validation import check_finite, check_ndim, check_tensor, integer_sizes

__all__ = [
    "LIKELIHOODS",
    "check_positive",
    "check_prior",
    "check_sizes",
    "check_xy",
    "class_probs",
    "default_noise_prior",
    "per_layer",
]

LIKELIHOODS = ("gaussian", "bernoulli", "categorical")
"""Observation models of the last layer: Gaussian noise (regression), or a Bernoulli /
categorical likelihood on its latent function values (classification)."""


def check_sizes(sizes: Sequence[int], likelihood: str) -> list[int]:
    """Widths ``[M, N_1, ..., N_L]`` as ints, checked against the likelihood (one output for
    ``"bernoulli"``, at least two for ``"categorical"``)."""
    sizes = integer_sizes(sizes)
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise ValueError(f"sizes must list >= 2 positive widths [M, N_1, ..., N_L], got {sizes}")
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
    if likelihood == "bernoulli" and sizes[-1] != 1:
        raise ValueError(f"likelihood='bernoulli' needs one output, got sizes {sizes}")
    if likelihood == "categorical" and sizes[-1] < 2:
        raise ValueError(f"likelihood='categorical' needs >= 2 outputs, got sizes {sizes}")
    return sizes


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    """``value`` as a float, which must be finite and positive (or zero with ``allow_zero``)."""
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be {kind} and finite, got {value}")
    return value


def default_noise_prior(dtype: torch.dtype) -> dist.Distribution:
    """``LogNormal(log 0.1, 1)`` over a noise standard deviation: keeps it away from zero,
    where the posterior of the latent outputs degenerates."""
    return dist.LogNormal(torch.tensor(math.log(0.1), dtype=dtype), torch.tensor(1.0, dtype=dtype))


def per_layer(name: str, value: object, num_layers: int) -> list:
    """Broadcast a single prior (or ``None``) to every layer, or check a per-layer sequence."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != num_layers:
            raise ValueError(
                f"{name} must have one entry per layer ({num_layers}), got {len(value)}"
            )
        return list(value)
    return [value] * num_layers


def check_prior(name: str, prior: object) -> None:
    """``prior`` must be ``None`` or a Pyro distribution over scalars."""
    if prior is not None and not isinstance(prior, dist.Distribution):
        raise ValueError(f"{name} must be a pyro Distribution, got {type(prior).__name__}")
    if prior is not None and prior.event_shape != ():
        raise ValueError(
            f"{name} must be a distribution over scalars, got event_shape "
            f"{tuple(prior.event_shape)}"
        )


def check_xy(
    sizes: Sequence[int],
    likelihood: str,
    dtype: torch.dtype,
    x_train: Tensor,
    y_train: Tensor | None,
    x_test: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Validate and convert the data of a network with widths ``sizes``.

    Args:
        x_train: ``[S, M]`` inputs; x_test: optional ``[S_test, M]``.
        y_train: regression: ``[S]`` (one output) or ``[S, N_L]``; classification: ``[S]`` (or
            ``[S, 1]``) integer labels in ``[0, C)``; or ``None``.

    Returns:
        ``x_train`` and ``x_test`` in ``dtype``; ``y_train`` as ``[S, N_L]`` in ``dtype``
        (regression), ``[S]`` in ``dtype`` (Bernoulli) or ``[S]`` long (categorical).

    Value checks (finite, integer labels) are skipped inside a JIT trace, where they would
    bake the traced data's outcome into the graph.
    """
    m, n_out = sizes[0], sizes[-1]
    tracing = torch._C._get_tracing_state() is not None
    check_ndim("x_train", check_tensor("x_train", x_train), 2)
    if x_train.shape[-1] != m:
        raise ValueError(f"x_train must have {m} columns, got shape {tuple(x_train.shape)}")
    if x_train.shape[0] < 1:
        raise ValueError("x_train must have at least one row")
    if x_test is not None:
        check_ndim("x_test", check_tensor("x_test", x_test), 2)
        if x_test.shape[-1] != m:
            raise ValueError(f"x_test must have {m} columns, got shape {tuple(x_test.shape)}")
    rows = x_train.shape[0]
    if y_train is not None and likelihood != "gaussian":
        if not isinstance(y_train, Tensor):
            raise TypeError(f"y_train must be a torch.Tensor, got {type(y_train).__name__}")
        if y_train.dim() == 2 and y_train.shape[-1] == 1:
            y_train = y_train[:, 0]
        if y_train.shape != (rows,):
            raise ValueError(
                f"y_train must hold one class label per row, shape ({rows},), "
                f"got {tuple(y_train.shape)}"
            )
        classes = 2 if likelihood == "bernoulli" else n_out
        if (
            not tracing
            and ((y_train < 0) | (y_train >= classes) | (y_train != y_train.round())).any()
        ):
            raise ValueError(f"y_train must hold integer class labels in [0, {classes})")
        y_train = y_train.to(dtype if likelihood == "bernoulli" else torch.long)
    elif y_train is not None:
        check_tensor("y_train", y_train)
        if y_train.dim() == 1 and n_out == 1:
            y_train = y_train.unsqueeze(-1)
        if y_train.shape != (rows, n_out):
            raise ValueError(
                f"y_train must have shape ({rows}, {n_out})"
                + (f" or ({rows},)" if n_out == 1 else "")
                + f", got {tuple(y_train.shape)}"
            )
        y_train = y_train.to(dtype)
        if not tracing:
            check_finite("y_train", y_train)
    if not tracing:
        check_finite("x_train", x_train)
        if x_test is not None:
            check_finite("x_test", x_test)
    return x_train.to(dtype), y_train, None if x_test is None else x_test.to(dtype)


def class_probs(logits: Tensor, likelihood: str) -> Tensor:
    """Class probabilities ``[..., S, C]`` from the latent function ``[..., S, N_L]``
    (Bernoulli: ``C = 2`` from one logit; categorical: softmax over the ``N_L`` logits)."""
    if likelihood == "bernoulli":
        p = torch.sigmoid(logits)
        return torch.cat([1 - p, p], dim=-1)
    if likelihood == "categorical":
        return torch.softmax(logits, dim=-1)
    raise ValueError(f"likelihood must be 'bernoulli' or 'categorical', got {likelihood!r}")
