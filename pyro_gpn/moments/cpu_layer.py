r"""A parametric GPN layer's whole response on the fused CPU kernels: one autograd node.

:func:`cpu_layer_response` maps activation moments ``mu, v [S, N]`` and the layer's parameters
(lengthscales ``lambda``, targets ``U``, target variances ``S``, output noise ``sigma^2``) to the
output means and variances (``eq:gpn_normal_alpha_kappa``, ``eq:gpn_normal_mu``,
``eq:gpn_normal_Sigmatilde``) -- the same function as
:func:`~pyro_gpn.moments.cpu_kernels.cpu_virtual_observation_weights` followed by
:func:`~pyro_gpn.moments.cpu_kernels.cpu_response_meanvar`, and the same numbers, but

* one :class:`torch.autograd.Function` for the layer instead of one for the parameter-only part
  and one for the rows, with the midpoint weights inside (no intermediate ``beta``, ``kappa``
  tensors, no conversions to and from the compute dtype: the inputs are read once as float64
  NumPy arrays, the outputs returned in the activations' dtype, the parameters' gradients in
  theirs);
* two compiled calls per direction: the per-unit ``R x R`` algebra and midpoint weights
  (:mod:`pyro_gpn.moments._numba_params`: ``R`` exponentials per unit for the Gram matrix and
  the midpoint decay, not ``R^2``; the means-only backward solves with the Cholesky factor
  instead of forming ``kappa``), then one pass per (sample, unit)
  (:func:`~pyro_gpn.moments._numba_kernels.meanvar_fwd` / ``meanvar_bwd``, with the per-row
  closed-form / Gauss-Hermite rule of ``docs/results/accuracy.md``).

Inducing points are fixed and equidistant (not differentiated). Everything is computed in
float64.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .cpu_kernels import (
    NotPositiveDefinite,
    _closed_form_rtol,
    _k,
    _numba_module,
    _ratio2,
    _tier_rules,
    closed_form_error_scale,
)

__all__ = ["NotPositiveDefinite", "cpu_layer_response"]


def _f64(t: Tensor, rows: int | None = None) -> np.ndarray:
    """``t`` as a C-contiguous float64 array (no copy for contiguous float64 tensors),
    broadcast along its first dimension to ``rows`` if given."""
    a = t.detach().numpy()
    if rows is not None and a.shape[0] != rows:
        a = np.broadcast_to(a, (rows, *a.shape[1:]))
    if a.dtype != np.float64 or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=np.float64)
    return a


def _out(a: np.ndarray, like: Tensor) -> Tensor:
    """``a`` as a tensor in ``like``'s dtype (summed to ``like``'s leading size 1 if shared)."""
    if like.dim() and like.shape[0] == 1 and a.shape[0] != 1:
        a = a.sum(0, keepdims=True)
    if like.dtype == torch.float64:
        return torch.from_numpy(a)
    return torch.from_numpy(a.astype(np.float32 if like.dtype == torch.float32 else np.float64)).to(
        like.dtype
    )


class _LayerResponse(torch.autograd.Function):
    """``(mean, var)`` (``with_var``) or ``mean`` of one parametric layer."""

    @staticmethod
    def forward(ctx: FunctionCtx, mu, v, lam, U, Svar, noise_var, V, jitter, with_var):
        S, N = mu.shape
        G = max(U.shape[0], Svar.shape[0], lam.shape[0], V.shape[0])
        R = V.shape[-1]
        K = 2 * R - 1
        mu_ = _f64(mu)
        v_ = np.zeros((S, N)) if v is None else _f64(v)
        V_, U_, S_, lam_ = _f64(V, G), _f64(U, G), _f64(Svar, G), _f64(lam, G)
        beta = np.empty((G, R))
        chol = np.empty((G, R, R))
        if with_var:
            kappa = np.empty((G, R, R))
            P, PC, PA = np.empty((G, K)), np.empty((G, K)), np.empty((G, K))
        else:
            kappa = np.zeros((1, 1, 1))
            P = PC = PA = np.zeros((1, 1))
        ok = _numba_module("_numba_params").params_fwd(
            V_, U_, S_, lam_, float(jitter), with_var, beta, kappa, chol, P, PC, PA
        )
        if not ok:
            raise NotPositiveDefinite(
                "K(V, V) + diag(target_variances) is not positive definite (fused CPU kernel)"
            )
        zs, ws, offs, tier_r2 = _tier_rules()
        noise_ = np.zeros(1) if noise_var is None else _f64(noise_var)
        mean = np.empty((S, N))
        var = np.empty((S, N)) if with_var else mean
        pre = np.empty((S, N)) if with_var else mean
        how = np.zeros((S, N) if with_var else (1, 1), dtype=np.int8)
        _k("meanvar_fwd")(
            mu_, v_, V_, lam_, beta, P, PA, PC, zs, ws, offs, tier_r2, _ratio2(),
            closed_form_error_scale(R, torch.float64), _closed_form_rtol(), noise_, with_var,
            mean, var, pre, how,
        )  # fmt: skip
        ctx.arrays = (mu_, v_, V_, U_, lam_, beta, kappa, chol, P, PC, mean, pre, how)
        ctx.with_var = with_var
        ctx.like = (mu, lam, U, Svar, noise_var)
        ctx.has_v = v is not None
        if not with_var:
            return _out(mean, mu)
        return _out(mean, mu), _out(var, mu)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, gmean, gvar=None):
        mu_, v_, V_, U_, lam_, beta, kappa, chol, P, PC, mean, pre, how = ctx.arrays
        mu, lam, U, Svar, noise_var = ctx.like
        with_var = ctx.with_var
        S, N = mu_.shape
        G, R = U_.shape
        K = 2 * R - 1
        gm = np.zeros((S, N)) if gmean is None else _f64(gmean)
        gv = np.zeros((S, N)) if (gvar is None or not with_var) else _f64(gvar)
        dmu, dv = np.empty((S, N)), np.empty((S, N))
        dlam_rows = np.empty(N)
        dbeta = np.zeros((N, R))
        if with_var:
            dP, dPC = np.zeros((N, K)), np.zeros((N, K))
        else:
            dP, dPC = np.zeros((N, 1)), np.zeros((N, 1))
        zs, ws, offs, _ = _tier_rules()
        _k("meanvar_bwd")(
            mu_, v_, V_, lam_, beta, P, PC, zs, ws, offs, mean, pre, how, gm, gv, with_var,
            dmu, dv, dlam_rows, dbeta, dP, dPC,
        )  # fmt: skip
        dU, dS, dlam = np.empty((G, R)), np.empty((G, R)), np.empty(G)
        _numba_module("_numba_params").params_bwd(
            V_, U_, lam_, with_var, beta, kappa, chol, dP, dPC, dbeta, dlam_rows, dU, dS, dlam
        )
        need = ctx.needs_input_grad
        g_noise = None
        if noise_var is not None and need[5]:
            g_noise = _out(gv.sum(0) if noise_var.shape[0] > 1 else gv.sum().reshape(1), noise_var)
        return (
            _out(dmu, mu) if need[0] else None,
            _out(dv, mu) if (need[1] and ctx.has_v) else None,
            _out(dlam, lam) if need[2] else None,
            _out(dU, U) if need[3] else None,
            _out(dS, Svar) if need[4] else None,
            g_noise,
            None,
            None,
            None,
        )


def cpu_layer_response(
    mu: Tensor,
    v: Tensor | None,
    inducing_points: Tensor,
    lengthscales: Tensor,
    targets: Tensor,
    target_variances: Tensor,
    noise_var: Tensor | None = None,
    jitter: float = 0.0,
    with_var: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """Output moments of a parametric GPN layer from its activation moments, in one autograd node.

    Args:
        mu: ``[S, N]`` activation means; v: ``[S, N]`` activation variances or ``None``
            (deterministic activations).
        inducing_points: ``[N | 1, R]`` fixed, equidistant, ascending ``V`` (not differentiated).
        lengthscales: ``[N | 1]``; targets ``U`` and target_variances ``S``: ``[N | 1, R]``.
        noise_var: ``[N | 1]`` output noise variance ``sigma^2`` or ``None``.
        jitter: added to the diagonal of ``K(V, V) + diag(S)``.
        with_var: return ``(mean, var)`` (``eq:gpn_normal_Sigmatilde``) or the means only.

    Returns:
        ``mean [S, N]`` (and ``var [S, N]``) in ``mu``'s dtype, differentiable w.r.t. ``mu``,
        ``v``, ``lengthscales``, ``targets``, ``target_variances`` and ``noise_var`` (gradients
        in each argument's dtype; shared parameters get the sum over the units).

    Raises:
        NotPositiveDefinite: if a ``K(V, V) + diag(S)`` fails the Cholesky factorisation (the
            reference path retries with more jitter).
    """
    return _LayerResponse.apply(
        mu, v, lengthscales, targets, target_variances, noise_var, inducing_points, jitter, with_var
    )
