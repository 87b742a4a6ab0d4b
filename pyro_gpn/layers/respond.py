"""The response half of every layer's propagation.

:meth:`GPNLayerBase.propagate <pyro_gpn.layers.base.GPNLayerBase.propagate>` computes the
activation moments (a dense projection, or ``q(W)``'s for variational weights) and hands them to
:func:`respond`, which applies :func:`~pyro_gpn.moments.response_moments` with the layer's
response weights. Convolutional and recurrent layers (:mod:`pyro_gpn.layers.conv`,
:mod:`pyro_gpn.layers.recurrent`) compute their activation moments differently but respond
through the same function, with the same precision policy (``compute_dtype``, Cholesky factors
below float64), so that no layer repeats the response algebra.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..moments import cpu_layer
from ..moments.backend import cpu_kernels_evaluate
from ..moments.gaussian import Moments
from ..moments.propagate import Mode, response_moments

if TYPE_CHECKING:
    from .base import GPNLayerBase

__all__ = ["ResponseParts", "respond", "response_parts"]


@dataclass(frozen=True)
class ResponseParts:
    """A layer's response weights for one mode, in its compute dtype (reusable over time steps).

    Attributes:
        points: ``[G, R]`` inducing points; lengthscales ``[G]``; beta ``[G, R]``;
        reduction: ``C [G, R, R]`` (``None`` in ``"mean"`` mode); chol, inner: its factors or
        ``None``; noise_var: ``[G]`` or ``None``.
    """

    points: Tensor
    lengthscales: Tensor
    beta: Tensor
    reduction: Tensor | None
    chol: Tensor | None
    inner: Tensor | None
    noise_var: Tensor | None


def response_parts(layer: GPNLayerBase, mode: Mode, noise: bool = True) -> ResponseParts:
    """Evaluate ``layer``'s response weights once for ``mode`` (as ``propagate`` does)."""
    chol = inner = None
    if mode == "mean":
        beta, reduction = layer.response_mean_weights(), None
    elif layer._needs_factors():
        beta, reduction, chol, inner = layer.response_factored_weights()
    else:
        beta, reduction = layer.response_weights()
    return ResponseParts(
        layer.compute_inducing_points(),
        layer.to_compute(layer.lengthscales),
        beta,
        reduction,
        chol,
        inner,
        layer._compute_noise_var() if noise else None,
    )


def respond(
    layer: GPNLayerBase,
    activations: Moments,
    mode: Mode,
    noise: bool = True,
    parts: ResponseParts | None = None,
) -> Moments:
    """Output moments ``[S, N]`` of ``layer``'s units given activation moments ``[S, N]``.

    ``eq:gpn_normal_mu``, ``eq:gpn_normal_Sigmatilde`` (``_cov`` in ``"cov"`` mode) through
    :func:`~pyro_gpn.moments.response_moments`, computed in ``layer.compute_dtype`` and returned
    in the activations' dtype. ``parts`` (from :func:`response_parts`) skips re-evaluating the
    response weights (a recurrent layer reuses them at every time step).

    A parametric layer (:class:`~pyro_gpn.layers.parametric.VirtualObservations`) with fixed,
    equidistant inducing points on the fused CPU backend responds through
    :func:`~pyro_gpn.moments.cpu_layer.cpu_layer_response`: the parameter-only algebra and the
    per-row pass in one autograd node, the same numbers without the intermediate tensors.
    """
    if parts is None:
        fused = _fused_parametric(layer, activations, mode, noise)
        if fused is not None:
            return fused
    parts = response_parts(layer, mode, noise) if parts is None else parts
    out_dtype = activations.mean.dtype
    if layer.compute_dtype is not None:
        activations = activations.to(layer.compute_dtype)
    outputs = response_moments(
        activations,
        parts.points,
        parts.lengthscales,
        parts.beta,
        parts.reduction,
        parts.noise_var,
        mode,
        equidistant=layer._equidistant,
        variance_cholesky=parts.chol,
        variance_inner=parts.inner,
    )
    return outputs.to(out_dtype)


_VirtualObservations = None  # pyro_gpn.layers.parametric.VirtualObservations, imported on first use


def _fused_parametric(
    layer: GPNLayerBase, activations: Moments, mode: Mode, noise: bool
) -> Moments | None:
    """:func:`respond` through :func:`~pyro_gpn.moments.cpu_layer.cpu_layer_response`, or
    ``None`` where that path does not apply (another response, a full activation covariance,
    a Cholesky-factored variance below float64, or a backend other than ``"cpu"``)."""
    global _VirtualObservations
    if _VirtualObservations is None:
        from .parametric import VirtualObservations as _VirtualObservations

    response = layer.response
    if (
        type(response).weights is not _VirtualObservations.weights
        or not isinstance(response, _VirtualObservations)
        or (mode == "cov" and activations.cov is not None)
        or (mode != "mean" and layer._needs_factors())
        or not layer._equidistant
    ):
        return None
    mean = activations.mean
    var = None if activations.is_deterministic else activations.variance
    lengthscales, targets = layer.lengthscales, response.targets
    target_variances = response.target_variances
    noise_var = None
    if mode != "mean" and noise and layer.noise_std is not None:
        noise_var = layer.noise_std.square()
    fused = cpu_kernels_evaluate(
        mean,
        var,
        lengthscales,
        targets,
        target_variances,
        noise_var,
        inducing_points=layer.inducing_points,
        equidistant=True,
    )
    if not fused:
        return None
    cpu_layer_response = cpu_layer.cpu_layer_response
    args = (mean, var, layer.inducing_points, lengthscales, targets, target_variances)
    try:
        if mode == "mean":
            return Moments(cpu_layer_response(*args, None, response.jitter, False), validate=False)
        if var is None:
            var = mean.new_zeros(mean.shape)
            args = (mean, var, *args[2:])
        out_mean, out_var = cpu_layer_response(*args, noise_var, response.jitter, True)
    except cpu_layer.NotPositiveDefinite:
        return None  # the reference path retries with more jitter
    if mode == "cov":
        return Moments(out_mean, cov=torch.diag_embed(out_var), validate=False)
    return Moments(out_mean, var=out_var, validate=False)
