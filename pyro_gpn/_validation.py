"""Argument checks for the public boundary.

Every public entry point checks its tensors here so that bad input raises a ``ValueError`` that
names the argument, instead of a NaN or a wrong shape travelling silently through the network.
Form checks (:func:`check_tensor`, :func:`check_ndim`, :func:`check_shape`) always run; value
checks (:func:`check_finite`, :func:`check_nonnegative`, :func:`check_positive`,
:func:`check_psd`) read the tensor back to the host -- a device synchronisation -- and run only
while :func:`pyro_gpn.settings.is_validation_enabled` (on by default, off inside the training
loops).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from . import settings

__all__ = [
    "check_finite",
    "check_ndim",
    "check_nonnegative",
    "check_positive",
    "check_psd",
    "check_shape",
    "check_tensor",
]


def check_tensor(name: str, value: object) -> Tensor:
    """Return ``value`` if it is a floating tensor, else raise ``TypeError``/``ValueError``."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def check_ndim(name: str, value: Tensor, ndim: int | Sequence[int]) -> Tensor:
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if value.dim() not in allowed:
        want = " or ".join(str(d) for d in allowed)
        raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(value.shape)}")
    return value


def check_shape(name: str, value: Tensor, shape: Sequence[int | None]) -> Tensor:
    """Check ``value.shape`` against ``shape``; ``None`` entries match any size."""
    if value.dim() != len(shape) or any(
        want is not None and got != want for got, want in zip(value.shape, shape)
    ):
        pretty = tuple("*" if s is None else s for s in shape)
        raise ValueError(f"{name} must have shape {pretty}, got {tuple(value.shape)}")
    return value


def check_finite(name: str, value: Tensor) -> Tensor:
    if not settings.is_validation_enabled():
        return value
    if not bool(torch.isfinite(value).all()):
        bad = "NaN" if bool(torch.isnan(value).any()) else "infinite"
        raise ValueError(f"{name} contains {bad} values")
    return value


def check_nonnegative(name: str, value: Tensor) -> Tensor:
    if not settings.is_validation_enabled():
        return value
    check_finite(name, value)
    if bool((value < 0).any()):
        raise ValueError(f"{name} must be non-negative, got minimum {value.min().item():.3g}")
    return value


def check_positive(name: str, value: Tensor) -> Tensor:
    if not settings.is_validation_enabled():
        return value
    check_finite(name, value)
    if bool((value <= 0).any()):
        raise ValueError(f"{name} must be positive, got minimum {value.min().item():.3g}")
    return value


def check_psd(name: str, value: Tensor, rtol: float = 1e-5) -> Tensor:
    """Check that a batch of square matrices ``[..., N, N]`` is symmetric positive semi-definite.

    Symmetry is checked to ``rtol`` of the largest entry; semi-definiteness by the smallest
    eigenvalue, allowing ``-rtol * max|eigenvalue|`` of round-off.
    """
    if value.dim() < 2 or value.shape[-1] != value.shape[-2]:
        raise ValueError(f"{name} must be a batch of square matrices, got {tuple(value.shape)}")
    if not settings.is_validation_enabled():
        return value
    check_finite(name, value)
    scale = value.abs().amax().clamp_min(torch.finfo(value.dtype).tiny)
    if bool(((value - value.mT).abs() > rtol * scale).any()):
        raise ValueError(f"{name} must be symmetric")
    eig = torch.linalg.eigvalsh(value)
    tol = rtol * eig.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(value.dtype).tiny)
    if bool((eig < -tol).any()):
        raise ValueError(
            f"{name} must be positive semi-definite, got eigenvalue {eig.min().item():.3g}"
        )
    return value
