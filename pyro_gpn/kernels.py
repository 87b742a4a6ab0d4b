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

import torch
from torch import Tensor

from ._validation import check_number, check_same_dtype_device, check_tensor, check_values

__all__ = ["gpn_kernel", "squared_exponential"]


def squared_exponential(a: Tensor, b: Tensor, lengthscale: Tensor | float) -> Tensor:
    """Unit-amplitude squared-exponential kernel between scalar points.

    Args:
        a: ``[..., P]`` points.
        b: ``[..., Q]`` points (batch dimensions broadcast with ``a``).
        lengthscale: scalar or ``[...]`` (one per batch element, broadcast), positive.

    Returns:
        ``[..., P, Q]`` with entries ``exp(-(a_p - b_q)^2 / (2 lambda^2))``.

    Raises:
        TypeError: if ``a`` or ``b`` is not a tensor, or ``lengthscale`` neither a tensor nor a
            real number.
        ValueError: naming the argument, for a scalar ``a`` or ``b``, batch dimensions that do
            not broadcast, mixed dtypes or devices, or a number ``lengthscale`` that is not
            positive and finite (all checked always); and while
            :func:`pyro_gpn.settings.is_validation_enabled`, non-finite ``a`` or ``b`` or a
            tensor ``lengthscale`` that is not positive. Nothing is checked while a JIT trace
            is recorded.
    """
    if not torch.jit.is_tracing():  # a JIT trace would keep none of the checks, only warnings
        _check_squared_exponential(a, b, lengthscale)
    return _squared_exponential(a, b, lengthscale)


def _check_squared_exponential(a: Tensor, b: Tensor, lengthscale: Tensor | float) -> None:
    check_tensor("a", a)
    check_tensor("b", b)
    for name, points in (("a", a), ("b", b)):
        if points.dim() == 0:
            raise ValueError(f"{name} must have shape [..., P] (at least 1 dimension), got ()")
    scale_batch = _check_lengthscale(lengthscale)
    _check_broadcast(
        {"a": a.shape[:-1], "b": b.shape[:-1], "lengthscale": scale_batch}, "a, b and lengthscale"
    )
    check_same_dtype_device("a", a, {"b": b, "lengthscale": lengthscale})
    check_values(finite={"a": a, "b": b}, positive=_tensor_scale(lengthscale))


def _squared_exponential(a: Tensor, b: Tensor, lengthscale: Tensor | float) -> Tensor:
    """:func:`squared_exponential` without the argument checks (for callers that made them)."""
    if isinstance(lengthscale, Tensor) and lengthscale.dim() > 0:
        lengthscale = lengthscale[..., None, None]
    diff = a.unsqueeze(-1) - b.unsqueeze(-2)
    return (-0.5 * (diff / lengthscale).square()).exp()


def gpn_kernel(
    x: Tensor, x2: Tensor | None, weight: Tensor, lengthscale: Tensor | float = 1.0
) -> Tensor:
    """The GPN covariance function ``k_w(x, x')`` (paper ``eq:gpn_cov_fn``).

    Args:
        x: ``[S, M]`` inputs (leading batch dimensions ``[..., S, M]`` broadcast with
            ``weight``'s).
        x2: ``[T, M]`` inputs, or ``None`` for ``x``.
        weight: ``[M]`` (one unit) or ``[M, N]`` (``N`` units, one kernel each).
        lengthscale: positive scalar, or ``[N]`` with a ``[M, N]`` weight.

    Returns:
        ``[S, T]`` for one unit, ``[N, S, T]`` for ``N`` units.

    Raises:
        TypeError: if ``x``, ``x2`` or ``weight`` is not a tensor, or ``lengthscale`` neither a
            tensor nor a real number.
        ValueError: naming the argument, for ``x``/``x2`` of fewer than 2 dimensions, a
            ``weight`` whose ``M`` is not the inputs' number of columns, batch dimensions that
            do not broadcast, a ``lengthscale`` that does not broadcast to the units' shape
            (without adding dimensions), mixed dtypes or devices, or a number
            ``lengthscale`` that is not positive and finite (all checked always); and while
            :func:`pyro_gpn.settings.is_validation_enabled`, non-finite ``x``, ``x2`` or
            ``weight`` or a tensor ``lengthscale`` that is not positive. Nothing is checked
            while a JIT trace is recorded (the NUTS models trace their potential energy).
    """
    if not torch.jit.is_tracing():  # a JIT trace would keep none of the checks, only warnings
        _check_gpn_kernel(x, x2, weight, lengthscale)
    return _gpn_kernel(x, x2, weight, lengthscale)


def _gpn_kernel(
    x: Tensor, x2: Tensor | None, weight: Tensor, lengthscale: Tensor | float
) -> Tensor:
    """:func:`gpn_kernel` without the argument checks: the NUTS models' per-state callers
    (:mod:`pyro_gpn.models.gp_rows`), where a divergent state's non-finite weights must give a
    NaN factor that the sampler rejects, not an exception."""
    x2 = x if x2 is None else x2
    a, a2 = x @ weight, x2 @ weight
    if weight.dim() == 1:
        return _squared_exponential(a, a2, lengthscale)
    return _squared_exponential(a.mT, a2.mT, lengthscale)


def _check_gpn_kernel(
    x: Tensor, x2: Tensor | None, weight: Tensor, lengthscale: Tensor | float
) -> None:
    check_tensor("x", x)
    check_tensor("weight", weight)
    if x2 is not None:
        check_tensor("x2", x2)
    for name, inputs in (("x", x), ("x2", x2)):
        if inputs is not None and inputs.dim() < 2:
            raise ValueError(
                f"{name} must have shape [S, M] (or [..., S, M]), got {tuple(inputs.shape)}"
            )
    if weight.dim() == 0:
        raise ValueError("weight must have shape [M] or [M, N], got ()")
    num_inputs = weight.shape[0] if weight.dim() == 1 else weight.shape[-2]
    for name, inputs in (("x", x), ("x2", x2)):
        if inputs is not None and inputs.shape[-1] != num_inputs:
            raise ValueError(
                f"weight {tuple(weight.shape)} projects M = {num_inputs} inputs but {name} has "
                f"{inputs.shape[-1]} columns (shape {tuple(inputs.shape)}): give weight as "
                "[M] or [M, N]"
            )
    batches = {"x": x.shape[:-2], "weight": weight.shape[:-2]}
    if x2 is not None:
        batches["x2"] = x2.shape[:-2]
    batch = _check_broadcast(batches, "x, x2 and weight")
    scale_batch = _check_lengthscale(lengthscale)
    units = batch if weight.dim() == 1 else (*batch, weight.shape[-1])
    what = "lengthscale and the units (" + ("one" if weight.dim() == 1 else "[..., N]") + ")"
    if _check_broadcast({"lengthscale": scale_batch, "units": units}, what) != units:
        # a lengthscale [N, 1] (or one with more dimensions) would silently add batch
        # dimensions to the result ([N, N, S, S] instead of [N, S, S])
        raise ValueError(
            f"lengthscale {scale_batch} must broadcast to the units' shape {units} (a scalar, "
            "or one per unit: [..., N] for a [M, N] weight) without adding dimensions"
        )
    check_same_dtype_device("x", x, {"x2": x2, "weight": weight, "lengthscale": lengthscale})
    check_values(finite={"x": x, "x2": x2, "weight": weight}, positive=_tensor_scale(lengthscale))


def _check_lengthscale(lengthscale: Tensor | float) -> tuple[int, ...]:
    """The batch shape ``lengthscale`` broadcasts over (``()`` for a scalar); a number must be
    positive and finite (checked here, always), a tensor floating (its values are checked with
    the other values)."""
    if isinstance(lengthscale, Tensor):
        check_tensor("lengthscale", lengthscale)
        return tuple(lengthscale.shape)
    check_number("lengthscale", lengthscale, positive=True)
    return ()


def _tensor_scale(lengthscale: Tensor | float) -> dict[str, Tensor]:
    return {"lengthscale": lengthscale} if isinstance(lengthscale, Tensor) else {}


def _check_broadcast(shapes: dict[str, tuple[int, ...]], what: str) -> tuple[int, ...]:
    """The broadcast of ``shapes``, or a ``ValueError`` naming them all."""
    try:
        return tuple(torch.broadcast_shapes(*shapes.values()))
    except RuntimeError:
        given = ", ".join(f"{name} {tuple(shape)}" for name, shape in shapes.items())
        raise ValueError(f"the batch dimensions of {what} do not broadcast: {given}") from None
