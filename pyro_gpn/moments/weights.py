"""Parameter-only part of a GPN layer: the virtual observations' weights ``beta``, ``kappa``
and the Cholesky factor of ``K(V, V) + diag(S)`` (``eq:gpn_normal_alpha_kappa``), computed
once per step (not per sample)."""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import (
    check_ndim,
    check_number,
    check_per_unit,
    check_same_dtype_device,
    check_tensor,
    check_values,
)
from ..kernels import _squared_exponential
from .backend import cpu_parameter_kernels

__all__ = [
    "safe_cholesky",
    "virtual_observation_weights",
]


def virtual_observation_weights(
    inducing_points: Tensor,
    targets: Tensor,
    target_variances: Tensor,
    lengthscales: Tensor,
    jitter: float | Tensor = 0.0,
    with_kappa: bool = True,
    with_cholesky: bool = False,
) -> tuple[Tensor | None, Tensor] | tuple[Tensor | None, Tensor, Tensor]:
    """GP-regression weights of the virtual observations (``eq:gpn_normal_alpha_kappa``).

    Args:
        inducing_points: ``[N | 1, R]`` inducing points ``V``.
        targets: ``[N | 1, R]`` targets ``U``.
        target_variances: ``[N | 1, R]`` variances ``S`` (positive).
        lengthscales: ``[N | 1]``.
        jitter: added to the diagonal of ``K(V, V) + diag(S)``: a non-negative number (or a
            one-element floating-point tensor).
        with_kappa: also return ``kappa`` (needed for variances, not for means).
        with_cholesky: also return the lower Cholesky factor ``L`` of ``K(V, V) + diag(S)``,
            the ``variance_cholesky`` of :func:`response_moments` (the accurate conditional
            variance ``1 - |L^-1 alpha(a)|^2``).

    Returns:
        ``kappa = (K(V, V) + diag(S))^-1`` of shape ``[N | 1, R, R]`` (or ``None``),
        ``beta = kappa U`` of shape ``[N | 1, R]``, and with ``with_cholesky`` ``L``
        ``[N | 1, R, R]``. ``beta`` comes from two triangular solves with ``L``. ``kappa`` is
        the LU-based inverse, symmetrised: measured against 50-digit arithmetic
        (``docs/results/accuracy.md``) it gives ``alpha^T kappa alpha`` more accurately than
        ``cholesky_inverse`` when ``K + S`` is ill-conditioned; where that matters the variance
        path uses ``L`` instead.

    Raises:
        TypeError: if an argument is not a tensor (``jitter`` neither a tensor nor a real
            number: Python's or NumPy's).
        ValueError: naming the argument, for shapes that do not fit together (every argument
            has ``G`` rows or 1, and ``R`` inducing points as ``inducing_points``; a tensor
            ``jitter`` has one element), mixed dtypes or devices, or a
            negative or non-finite number ``jitter`` (all checked always); and while
            :func:`pyro_gpn.settings.is_validation_enabled`, non-finite ``inducing_points`` or
            ``targets``, negative ``target_variances`` or a tensor ``jitter`` that is negative
            or not finite, or non-positive ``lengthscales``; or if ``K(V, V) + diag(S)`` is not
            positive definite.
    """
    _check_weight_arguments(inducing_points, targets, target_variances, lengthscales, jitter)
    return _virtual_observation_weights(
        inducing_points, targets, target_variances, lengthscales, jitter, with_kappa, with_cholesky
    )


def _virtual_observation_weights(
    inducing_points: Tensor,
    targets: Tensor,
    target_variances: Tensor,
    lengthscales: Tensor,
    jitter: float | Tensor = 0.0,
    with_kappa: bool = True,
    with_cholesky: bool = False,
) -> tuple[Tensor | None, Tensor] | tuple[Tensor | None, Tensor, Tensor]:
    """:func:`virtual_observation_weights` without the argument checks: the layers call it
    every step with their own parameters (checked when the layer was built)."""
    if not with_cholesky and cpu_parameter_kernels(
        inducing_points, targets, target_variances, lengthscales
    ):
        from .cpu_kernels import NotPositiveDefinite, cpu_virtual_observation_weights

        try:
            kappa, beta = cpu_virtual_observation_weights(
                inducing_points, targets, target_variances, lengthscales, jitter
            )
            return (kappa if with_kappa else None), beta
        except NotPositiveDefinite:
            pass  # the reference path below retries with more jitter
    gram = _squared_exponential(inducing_points, inducing_points, lengthscales)
    gram = gram + torch.diag_embed(target_variances + jitter)
    chol = safe_cholesky(gram)
    beta = torch.cholesky_solve(targets.unsqueeze(-1), chol).squeeze(-1)
    kappa = None
    if with_kappa:
        kappa = torch.linalg.inv(gram)
        kappa = 0.5 * (kappa + kappa.mT)
    if with_cholesky:
        return kappa, beta, chol
    return kappa, beta


def _check_weight_arguments(
    inducing_points: Tensor,
    targets: Tensor,
    target_variances: Tensor,
    lengthscales: Tensor,
    jitter: float | Tensor,
) -> None:
    """The argument checks of :func:`virtual_observation_weights`: types, shapes, dtypes,
    devices and a number ``jitter`` (no device synchronisation), and the tensors' values (a
    tensor ``jitter``'s included) in one synchronisation while validation is on."""
    check_tensor("inducing_points", inducing_points)
    if inducing_points.dim() != 2:
        raise ValueError(
            "inducing_points must have shape [N | 1, R] (one row per activation function, or "
            f"one shared: V[None] for a [R] tensor V), got {tuple(inducing_points.shape)}"
        )
    check_tensor("targets", targets)
    check_ndim("targets", targets, 2)
    check_tensor("target_variances", target_variances)
    check_ndim("target_variances", target_variances, 2)
    check_tensor("lengthscales", lengthscales)
    check_ndim("lengthscales", lengthscales, 1)
    rows = {
        "inducing_points": inducing_points.shape[0],
        "targets": targets.shape[0],
        "target_variances": target_variances.shape[0],
        "lengthscales": lengthscales.shape[0],
    }
    if len(set(rows.values()) - {1}) > 1:
        given = ", ".join(f"{name} {size}" for name, size in rows.items())
        raise ValueError(
            f"the arguments' numbers of rows disagree ({given}): each must be G (one per "
            "activation function) or 1 (shared)"
        )
    groups = max(rows.values())
    num_points = inducing_points.shape[-1]
    points = f"R = {num_points} inducing points as in inducing_points"
    check_per_unit("inducing_points", inducing_points, groups, (num_points,))
    check_per_unit("targets", targets, groups, (num_points,), points)
    check_per_unit("target_variances", target_variances, groups, (num_points,), points)
    check_per_unit("lengthscales", lengthscales, groups)
    jitter_value = None
    if isinstance(jitter, Tensor):  # its value is checked with the others (no .item() here)
        check_tensor("jitter", jitter)
        if jitter.numel() != 1:  # the fused CPU path takes one number
            raise ValueError(
                f"jitter must be a number or a one-element tensor, got shape {tuple(jitter.shape)}"
            )
        jitter_value = jitter
    else:
        check_number("jitter", jitter)
    check_same_dtype_device(
        "inducing_points",
        inducing_points,
        {"targets": targets, "target_variances": target_variances, "lengthscales": lengthscales},
    )
    check_values(
        finite={"inducing_points": inducing_points, "targets": targets},
        nonnegative={"target_variances": target_variances, "jitter": jitter_value},
        positive={"lengthscales": lengthscales},
    )


def safe_cholesky(matrix: Tensor, max_tries: int = 4) -> Tensor:
    """Lower Cholesky factor of the symmetric positive definite ``[..., R, R]`` ``matrix``.

    When rounding makes a numerically singular ``matrix`` (a long lengthscale and a target
    variance near the dtype's resolution) indefinite, retries with ``10^k * eps * max diag``
    added to the diagonal, ``k = 0 .. max_tries - 1``, and raises a clear error after that.
    """
    chol, info = torch.linalg.cholesky_ex(matrix)
    if not bool((info > 0).any()):
        return chol
    eps = torch.finfo(matrix.dtype).eps
    scale = torch.diagonal(matrix, dim1=-2, dim2=-1).amax(-1, keepdim=True).detach()
    for k in range(max_tries):
        extra = torch.diag_embed((10.0**k * eps * scale).expand(matrix.shape[:-1]))
        chol, info = torch.linalg.cholesky_ex(matrix + extra)
        if not bool((info > 0).any()):
            return chol
    raise ValueError(
        "K(V, V) + diag(S) is not positive definite in "
        f"{matrix.dtype} (increase the target variances or the jitter, or compute in float64)"
    )
