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
from ..moments.propagate import Mode, _response_moments
from ..moments.quadrature import explicit_c_rows, node_variance_rows

if TYPE_CHECKING:
    from .base import GPNLayerBase

__all__ = ["ResponseParts", "respond", "response_parts"]


@dataclass(frozen=True)
class ResponseParts:
    """A layer's response weights for one mode, in its compute dtype (reusable over time steps).

    Attributes:
        points: ``[G, R]`` inducing points; lengthscales ``[G]``; beta ``[G, R]``;
        reduction: ``C [G, R, R]`` (``None`` in ``"mean"`` mode); chol, inner: its factors or
        ``None``; noise_var: ``[G]`` or ``None``; inverse_trace: ``||L^-1||_F^2 [G]`` of
        ``C``'s factor where the explicit ``C`` is used (:func:`_with_factored_rows`), else
        ``None``.
    """

    points: Tensor
    lengthscales: Tensor
    beta: Tensor
    reduction: Tensor | None
    chol: Tensor | None
    inner: Tensor | None
    noise_var: Tensor | None
    inverse_trace: Tensor | None = None


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
        _inverse_trace(layer) if mode != "mean" and chol is None else None,
    )


def _inverse_trace(layer: GPNLayerBase) -> Tensor | None:
    """``||L^-1||_F^2 [G]`` of the factor of ``layer``'s ``C`` (without gradient), or ``None``
    where its response has no factor (:meth:`~pyro_gpn.layers.base.Response.variance_factor`)."""
    with torch.no_grad():
        factor = layer.response.variance_factor(*layer.compute_grid())
        if factor is None:
            return None
        eye = torch.eye(factor.shape[-1], dtype=factor.dtype, device=factor.device)
        return torch.linalg.solve_triangular(factor, eye, upper=False).square().sum((-2, -1))


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

    A parametric layer (:class:`~pyro_gpn.layers.parametric.VirtualObservations`) or a
    variational one with a whitened posterior
    (:class:`~pyro_gpn.layers.variational.VariationalTargets`, ``whiten=True``, the default)
    with fixed, equidistant inducing points on the fused CPU backend responds through
    :func:`~pyro_gpn.moments.cpu_layer.cpu_layer_response` or
    :func:`~pyro_gpn.moments.cpu_layer.cpu_variational_layer_response`: the parameter-only
    algebra and the per-row pass in one autograd node, the same numbers without the
    intermediate tensors.
    """
    if parts is None:
        fused = _fused_layer(layer, activations, mode, noise)
        if fused is not None:
            outputs, refine = fused
            if refine is None:
                return outputs
            return _with_factored_rows(layer, activations, outputs, mode, noise, refine)
    parts = response_parts(layer, mode, noise) if parts is None else parts
    out_dtype = activations.mean.dtype
    if layer.compute_dtype is not None:
        activations = activations.to(layer.compute_dtype)
    outputs = _response_moments(
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
    if parts.inverse_trace is not None:
        outputs = _with_factored_rows(
            layer, activations, outputs, mode, noise, inverse_trace=parts.inverse_trace
        )
    return outputs.to(out_dtype)


def _with_factored_rows(
    layer: GPNLayerBase,
    activations: Moments,
    outputs: Moments,
    mode: Mode,
    noise: bool,
    rows: Tensor | None = None,
    inverse_trace: Tensor | None = None,
) -> Moments:
    """``outputs`` with the variances that the explicit ``C`` cannot give to
    :data:`~pyro_gpn.moments.quadrature.CLOSED_FORM_RTOL` recomputed from ``C``'s factors
    (the rows of :func:`~pyro_gpn.moments.quadrature.explicit_c_rows`).

    In float64 the layers hand ``response_moments`` (and the fused CPU layer) the explicit
    ``C`` (``Khat`` of a variational posterior, ``(K + S)^-1`` of virtual observations): fast,
    but ``C`` itself is formed with an absolute error of about ``eps ||L^-1||_F^2 = eps
    tr(K^-1)`` (``L`` its factor, :meth:`~pyro_gpn.layers.base.Response.variance_factor`),
    which the closed form's own error bound does not see. Where the variance returned (with the
    output noise, if it is added) is small against it -- a nearly collapsed posterior or tiny
    target variances at a long lengthscale, without noise: variances ~1e-6 with ``tr(K^-1)`` ~1e7 --
    and the activation narrow (``sqrt(v) <= NODE_MAX_STD_RATIO lambda``, 6), the rows are
    evaluated again at quadrature nodes through the factors (``1 - x^T M x``, ``x = L^-1
    alpha(a)``): the float64 variances of narrow activations then agree with quadrature to 4.4e-7
    relative where the explicit ``C`` lost up to 8.2e-4 (``tests/layers/test_respond.py``,
    ``docs/results/accuracy.md``). Broader activations keep the closed form, and so do other rows
    and whole layers whose units are well conditioned. The decision costs one
    ``R x R`` factorisation per unit without gradient (``inverse_trace``, once per sequence
    for a recurrent layer: :class:`ResponseParts`) and one read-back (a device
    synchronisation on a GPU); nothing where the fused CPU layer makes it (``rows``, bool
    ``[S, N]``: :func:`~pyro_gpn.moments.cpu_layer.layer_response`). Below float64 the layers
    use the factors everywhere already. In ``"cov"`` mode the diagonal is refined (the
    variances, from each activation's marginal); the off-diagonal does not involve ``C``.
    """
    if mode == "mean":
        return outputs
    dtype = layer.compute_dtype or layer.weight.dtype
    out_var = outputs.variance.to(dtype)
    if rows is None:  # not the fused layer's rows: decided from the given ||L^-1||_F^2
        rows = explicit_c_rows(
            out_var.detach(),
            activations.variance.detach().to(dtype),
            layer.to_compute(layer.lengthscales).detach(),
            inverse_trace,
            torch.finfo(dtype).eps,
        )
        if not bool(rows.any()):
            return outputs
    noise_var = layer._compute_noise_var() if noise else None
    noise_free = out_var if noise_var is None else out_var - noise_var
    acts = activations.to(dtype)
    points, lengthscales = layer.compute_grid()
    beta, _, chol, inner = layer.response_factored_weights(with_reduction=False)
    noise_free = node_variance_rows(
        noise_free, rows, acts.mean, acts.variance, points, lengthscales, beta, None, chol,
        inner,
    ).clamp_min(0)  # fmt: skip
    out_var = noise_free if noise_var is None else noise_free + noise_var
    out_var = out_var.to(outputs.mean.dtype)
    if mode == "cov":
        cov = outputs.cov.diagonal_scatter(out_var, dim1=-2, dim2=-1)
        return Moments(outputs.mean, cov=cov, validate=False)
    return Moments(outputs.mean, var=out_var, validate=False)


_RESPONSES = None  # (VirtualObservations, VariationalTargets), imported on first use


def _fused_kind(layer: GPNLayerBase) -> str | None:
    """The fused layer's name for ``layer``'s response (``"observations"``: virtual
    observations; ``"whitened"``: a whitened variational posterior), or ``None`` if it has
    none (another response, or a subclass that computes its weights otherwise)."""
    global _RESPONSES
    if _RESPONSES is None:
        from .parametric import VirtualObservations
        from .variational import VariationalTargets

        _RESPONSES = (VirtualObservations, VariationalTargets)
    response = layer.response
    for cls, kind in zip(_RESPONSES, ("observations", "whitened"), strict=True):
        if (
            isinstance(response, cls)
            and type(response).weights is cls.weights
            and type(response).mean_weights is cls.mean_weights
            and (kind == "observations" or response.whiten)
        ):
            return kind
    return None


def _fused_layer(
    layer: GPNLayerBase, activations: Moments, mode: Mode, noise: bool
) -> tuple[Moments, Tensor | None] | None:
    """:func:`respond` through :func:`~pyro_gpn.moments.cpu_layer.cpu_layer_response` (virtual
    observations) or :func:`~pyro_gpn.moments.cpu_layer.cpu_variational_layer_response` (a
    whitened ``q(U)``) with the rows to recompute from ``C``'s factors
    (:func:`~pyro_gpn.moments.cpu_layer.layer_response`'s ``refine``, ``None`` for none), or
    ``None`` where that path does not apply (another response, a full
    activation covariance, a variance whose algebra is below float64 -- the fused layer
    computes in float64; the means alone, ``"mean"`` mode, take it whatever the
    ``compute_dtype``: faster, and as accurate as float64 --, learnable or uneven inducing
    points, or a backend other than ``"cpu"``)."""
    kind = _fused_kind(layer)
    if (
        kind is None
        or (mode == "cov" and activations.cov is not None)
        or (mode != "mean" and layer._needs_factors())
        or not layer._equidistant
    ):
        return None
    response = layer.response
    if kind == "observations":
        first, second = response.targets, response.target_variances
    else:  # the scale (a constrained parameter) is evaluated once the path is sure
        first, second = response.targets_loc, None
    mean = activations.mean
    var = None if activations.is_deterministic else activations.variance
    lengthscales = layer.lengthscales
    noise_var = None
    if mode != "mean" and noise and layer.noise_std is not None:
        noise_var = layer.noise_std.square()
    fused = cpu_kernels_evaluate(
        mean,
        var,
        lengthscales,
        first,
        second,
        noise_var,
        inducing_points=layer.inducing_points,
        equidistant=True,
    )
    if not fused:
        return None
    if second is None:  # the means do not read the scale: a placeholder in "mean" mode
        second = first.new_zeros(1, 1, 1) if mode == "mean" else response.variational_scale_tril()
    args = (mean, var, layer.inducing_points, lengthscales, first, second)
    try:
        if mode == "mean":
            out = cpu_layer.layer_response(kind, *args, None, response.jitter, False)
            return Moments(out, validate=False), None
        if var is None:
            var = mean.new_zeros(mean.shape)
            args = (mean, var, *args[2:])
        out_mean, out_var, refine = cpu_layer.layer_response(
            kind, *args, noise_var, response.jitter, True, refine=True
        )
    except cpu_layer.NotPositiveDefinite:
        # the reference path decides: the parametric one retries with more jitter, the
        # variational one factorises with PyTorch (which raises if it fails too)
        return None
    if mode == "cov":
        return Moments(out_mean, cov=torch.diag_embed(out_var), validate=False), refine
    return Moments(out_mean, var=out_var, validate=False), refine
