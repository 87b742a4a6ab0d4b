r"""Mehler's series for the off-diagonal output covariances on the fused CPU kernels.

:func:`cpu_mehler_terms`, :func:`cpu_hermite_coefficients` and :func:`cpu_mehler_pairs`
compute what :func:`~pyro_gpn.moments.cross._mehler_cross_covariance` computes on whole
tensors: the truncation rule (:func:`~pyro_gpn.moments.cross._mehler_terms`), the Hermite
coefficients (:func:`~pyro_gpn.moments.cross._hermite_coefficients`, one pass per sample and
unit) and the pair sum ``T_nm = sum_{k=1}^{K_nm} rho_nm^k b_kn b_km`` with
``rho_nm = Sigma_nm / sqrt(c_n c_m)`` and each pair's own number of terms ``K_nm``, for every
sample and unit pair, in one compiled pass over the unordered pairs, forward and backward.
On whole ``[S, N, N]`` tensors the rule takes a dozen elementwise passes and each of the ``K``
Horner steps two forward and some five backward (a 50-unit layer at batch 256: about 1-1.5 ms
per pass); here a pair's terms stay in registers. A pair's covariance is taken as the symmetric
part ``(Sigma_nm + Sigma_mn) / 2`` (the activation covariance is symmetric up to rounding).
Everything is computed in float64; the results and gradients are returned in the inputs' dtypes.
Gradients are first order only (``once_differentiable``, as every CPU kernel's): for
second-order derivatives (``create_graph=True``) use ``backend("reference")``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .cpu_kernels import _numba_module
from .cpu_layer import _f64, _out

__all__ = ["cpu_hermite_coefficients", "cpu_mehler_pairs", "cpu_mehler_terms"]


def cpu_mehler_terms(
    cov: Tensor, scale: Tensor, per_unit: Tensor, rtol: float, max_terms: int
) -> tuple[int, Tensor, bool]:
    """The truncation rule of :func:`~pyro_gpn.moments.cross._mehler_terms` in one pass, with
    each pair's own number of terms.

    Args:
        cov: ``[S, N, N]`` activation covariances; scale: ``[S, N]``, ``(lambda^2 + v)^-1/2``.
        per_unit: ``[S, N]``, ``log(sqrt(out_var) / B)`` (``+inf`` where ``B = 0``).
        rtol, max_terms: :data:`~pyro_gpn.moments.cross.MEHLER_RTOL` and
            :data:`~pyro_gpn.moments.cross.MEHLER_MAX_TERMS`.

    Returns:
        The largest number of terms (at least 1), every pair's number of terms (``[S, N, N]``,
        int32: 0 where every term is zero, -1 where the pair is not served; the diagonal 0) and
        whether every pair is served.
    """
    terms = np.empty(cov.shape, dtype=np.int32)
    largest, missed = _numba_module("_numba_mehler").mehler_terms(
        _f64(cov), _f64(scale), _f64(per_unit), math.log(rtol), float(max_terms), terms
    )
    return max(1, int(largest)), torch.from_numpy(terms), missed == 0


class _MehlerPairs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx, cov: Tensor, scale: Tensor, coef: Tensor, terms: Tensor
    ) -> Tensor:
        cov_, scale_, coef_ = _f64(cov), _f64(scale), _f64(coef)
        terms_ = np.ascontiguousarray(terms.numpy(), dtype=np.int32)
        out = np.empty(cov_.shape)
        _numba_module("_numba_mehler").mehler_pairs_fwd(cov_, scale_, coef_, terms_, out)
        ctx.save_for_backward(cov, scale, coef)  # (version-checked)
        ctx.terms = terms_
        return _out(out, cov)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, gout: Tensor):
        cov, scale, coef = ctx.saved_tensors
        cov_, scale_, coef_ = _f64(cov), _f64(scale), _f64(coef)
        dcov, dscale, dcoef = np.empty(cov_.shape), np.empty(scale_.shape), np.empty(coef_.shape)
        _numba_module("_numba_mehler").mehler_pairs_bwd(
            cov_, scale_, coef_, ctx.terms, _f64(gout), dcov, dscale, dcoef
        )
        need = ctx.needs_input_grad
        return (
            _out(dcov, cov) if need[0] else None,
            _out(dscale, scale) if need[1] else None,
            _out(dcoef, coef) if need[2] else None,
            None,
        )


def cpu_mehler_pairs(cov: Tensor, scale: Tensor, coef: Tensor, terms: Tensor) -> Tensor:
    """``sum_{k=1}^{K_nm} rho_nm^k coef[s, n, k-1] coef[s, m, k-1]`` with
    ``rho_nm = (cov_nm + cov_mn) / 2 * scale_n * scale_m`` and each pair's own number of terms
    ``K_nm = terms[s, n, m]`` (at most ``coef``'s ``K``); zero where ``K_nm <= 0`` and on the
    diagonal.

    Shape:
        - cov: ``[S, N, N]``; scale: ``[S, N]``; coef: ``[S, N, K]``; terms: ``[S, N, N]`` (int)
        - returns ``[S, N, N]`` (symmetric) in ``cov``'s dtype, differentiable w.r.t. ``cov``,
          ``scale`` and ``coef``.
    """
    return _MehlerPairs.apply(cov, scale, coef, terms)


class _HermiteCoefficients(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, mean, var, points, lengthscales, beta, num_terms: int):
        mean_, var_, points_, lam_, beta_ = (
            _f64(t) for t in (mean, var, points, lengthscales, beta)
        )
        coef = np.empty((*mean_.shape, num_terms))
        bound = np.empty(mean_.shape)
        roots = np.sqrt(np.arange(num_terms + 2, dtype=np.float64))
        kernels = _numba_module("_numba_mehler")
        kernels.hermite_fwd(mean_, var_, points_, lam_, beta_, roots, coef, bound)
        ctx.save_for_backward(mean, var, points, lengthscales, beta)
        coef_, bound_ = _out(coef, mean), _out(bound, mean)
        ctx.mark_non_differentiable(bound_)
        return coef_, bound_

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, gcoef, gbound):
        mean, var, points, lengthscales, beta = ctx.saved_tensors
        mean_, var_, points_, lam_, beta_ = (
            _f64(t) for t in (mean, var, points, lengthscales, beta)
        )
        dmean, dvar = np.empty(mean_.shape), np.empty(var_.shape)
        dlam, dbeta = np.zeros(lam_.shape), np.zeros(beta_.shape)
        roots = np.sqrt(np.arange(gcoef.shape[-1] + 2, dtype=np.float64))
        _numba_module("_numba_mehler").hermite_bwd(
            mean_, var_, points_, lam_, beta_, roots, _f64(gcoef), dmean, dvar, dlam, dbeta
        )
        need = ctx.needs_input_grad
        return (
            _out(dmean, mean) if need[0] else None,
            _out(dvar, var) if need[1] else None,
            None,  # the inducing points are fixed on this path
            _out(dlam, lengthscales) if need[3] else None,
            _out(dbeta, beta) if need[4] else None,
            None,
        )


def cpu_hermite_coefficients(
    mean: Tensor,
    var: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    num_terms: int,
) -> tuple[Tensor, Tensor]:
    """:func:`~pyro_gpn.moments.cross._hermite_coefficients` in one compiled pass per
    (sample, unit), forward and backward (fixed inducing points: no gradient for them).

    Shape:
        - mean, var: ``[S, N]``; inducing_points, beta: ``[N | 1, R]``; lengthscales ``[N | 1]``
        - returns the coefficients ``[S, N, K]`` (differentiable w.r.t. ``mean``, ``var``,
          ``lengthscales`` and ``beta``) and the bound ``[S, N]`` (not differentiable).
    """
    if torch.is_grad_enabled() and inducing_points.requires_grad:
        raise ValueError(
            "cpu_hermite_coefficients: inducing_points must be fixed (requires_grad=False); "
            "learnable inducing points take the tensor path"
        )
    num_units = mean.shape[-1]
    for name, tensor in (("inducing_points", inducing_points), ("lengthscales", lengthscales),
                         ("beta", beta)):  # fmt: skip
        if tensor.shape[0] not in (1, num_units):
            raise ValueError(
                f"cpu_hermite_coefficients: {name} must have a leading size of 1 or "
                f"{num_units}, got {tuple(tensor.shape)}"
            )
    coef, bound = _HermiteCoefficients.apply(
        mean, var, inducing_points, lengthscales, beta, int(num_terms)
    )
    return coef, bound.detach()
