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

from torch import Tensor

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
    """
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
