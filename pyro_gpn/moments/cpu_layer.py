r"""A GPN layer's whole response on the fused CPU kernels: one autograd node.

:func:`cpu_layer_response` maps activation moments ``mu, v [S, N]`` and a parametric layer's
parameters (lengthscales ``lambda``, targets ``U``, target variances ``S``, output noise
``sigma^2``) to the output means and variances (``eq:gpn_normal_alpha_kappa``,
``eq:gpn_normal_mu``, ``eq:gpn_normal_Sigmatilde``) -- the same function as
:func:`~pyro_gpn.moments.cpu_kernels.cpu_virtual_observation_weights` followed by
:func:`~pyro_gpn.moments.cpu_kernels.cpu_response_meanvar`, and the same numbers.
:func:`cpu_variational_layer_response` does the same for a variational layer whose posterior
is whitened, ``q(z) = N(m, T T^T)`` with ``U = L z``, ``L L^T = K(V, V) + jitter I``
(``eq:gpn_vi_sampling_muhat_fl``, ``eq:gpn_vi_sampling_sigmahat_fl``: ``beta = L^-T m``,
``Khat = L^-T (I - T T^T) L^-1``) -- the same function as
:meth:`~pyro_gpn.layers.variational.VariationalTargets.weights` followed by the row kernels.
Both are

* one :class:`torch.autograd.Function` for the layer instead of one for the parameter-only part
  and one for the rows (and for the variational layer some twenty PyTorch operations and their
  backward nodes for ``L``, its inverse and ``Khat``), with the midpoint weights inside (no
  intermediate ``beta``, ``kappa`` tensors, no conversions to and from the compute dtype: the
  inputs are read once as float64 NumPy arrays, the outputs returned in the activations' dtype,
  the parameters' gradients in theirs);
* two compiled calls per direction: the per-unit ``R x R`` algebra and midpoint weights
  (:mod:`pyro_gpn.moments._numba_params`: ``R`` exponentials per unit for the Gram matrix and
  the midpoint decay, not ``R^2``; the parametric means-only backward solves with the Cholesky
  factor instead of forming ``kappa``), then one pass per (sample, unit)
  (:func:`~pyro_gpn.moments._numba_kernels.meanvar_fwd` / ``meanvar_bwd``, with the per-row
  closed-form / quadrature rule of ``docs/results/accuracy.md``).

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
from .quadrature import explicit_c_rows

__all__ = ["NotPositiveDefinite", "cpu_layer_response", "cpu_variational_layer_response"]


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
    """``(mean, var, rows)`` (``with_var``; ``rows`` as :func:`layer_response` returns it) or
    ``mean`` of one layer. ``kind`` names its response: ``"observations"`` (``a, b = U, S``:
    virtual observations) or ``"whitened"`` (``a, b = m, T``: the whitened variational
    posterior)."""

    @staticmethod
    def forward(ctx: FunctionCtx, mu, v, lam, a, b, noise_var, V, jitter, with_var, kind, refine):
        S, N = mu.shape
        G = max(a.shape[0], b.shape[0], lam.shape[0], V.shape[0])
        R = V.shape[-1]
        K = 2 * R - 1
        mu_ = _f64(mu)
        v_ = np.zeros((S, N)) if v is None else _f64(v)
        V_, a_, b_, lam_ = _f64(V, G), _f64(a, G), _f64(b, G), _f64(lam, G)
        beta = np.empty((G, R))
        chol = np.empty((G, R, R))
        if with_var:
            kappa = np.empty((G, R, R))
            P, PC, PA = np.empty((G, K)), np.empty((G, K)), np.empty((G, K))
        else:
            kappa = np.zeros((1, 1, 1))
            P = PC = PA = np.zeros((1, 1))
        kernels = _numba_module("_numba_params")
        if kind == "whitened":
            linv = np.empty((G, R, R))
            ok = kernels.whitened_params_fwd(
                V_, a_, b_, lam_, float(jitter), with_var, beta, kappa, chol, linv, P, PC, PA
            )
            saved = (V_, a_, b_, lam_, beta, kappa, chol, linv)  # kappa holds Khat
        else:
            ok = kernels.params_fwd(
                V_, a_, b_, lam_, float(jitter), with_var, beta, kappa, chol, P, PC, PA
            )
            saved = (V_, a_, lam_, beta, kappa, chol)
        if not ok:
            what = (
                "K(V, V) + jitter I is not positive definite or singular to half the working "
                "precision"
                if kind == "whitened"
                else "K(V, V) + diag(target_variances) is not positive definite"
            )
            raise NotPositiveDefinite(f"{what} (fused CPU kernel)")
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
        ctx.arrays = (mu_, v_, lam_, V_, beta, P, PC, mean, pre, how)
        ctx.params = saved
        ctx.with_var = with_var
        ctx.kind = kind
        ctx.like = (mu, lam, a, b, noise_var)
        ctx.has_v = v is not None
        if not with_var:
            return _out(mean, mu)
        # the rows the explicit C cannot give (quadrature.explicit_c_rows, with ||L^-1||_F^2 of
        # C's factor: Khat = L^-T M L^-1, kappa = L^-T L^-1), decided here in NumPy: no tensor
        # is read back
        rows = None
        if refine:
            if kind == "whitened":
                inverse_trace = np.einsum("grt,grt->g", linv, linv)
            else:
                inverse_trace = np.trace(kappa, axis1=1, axis2=2)
            found = explicit_c_rows(var, v_, lam_, inverse_trace, float(np.finfo(np.float64).eps))
            if found.any():
                rows = torch.from_numpy(found)
                ctx.mark_non_differentiable(rows)
        return _out(mean, mu), _out(var, mu), rows

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, gmean, gvar=None, _grows=None):
        mu_, v_, lam_, V_, beta, P, PC, mean, pre, how = ctx.arrays
        mu, lam, a, b, noise_var = ctx.like
        with_var = ctx.with_var
        S, N = mu_.shape
        G, R = beta.shape
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
        kernels = _numba_module("_numba_params")
        da, dlam = np.empty((G, R)), np.empty(G)
        if ctx.kind == "whitened":
            V_, m_, T_, lam_, beta, khat, chol, linv = ctx.params
            db = np.empty((G, R, R))  # written only with_var: T does not reach beta
            kernels.whitened_params_bwd(
                V_, m_, T_, lam_, with_var, beta, khat, chol, linv, dP, dPC, dbeta, dlam_rows,
                da, db, dlam,
            )  # fmt: skip
        else:
            V_, U_, lam_, beta, kappa, chol = ctx.params
            db = np.empty((G, R))
            kernels.params_bwd(
                V_, U_, lam_, with_var, beta, kappa, chol, dP, dPC, dbeta, dlam_rows, da, db, dlam
            )
        need = ctx.needs_input_grad
        g_noise = None
        if noise_var is not None and need[5]:
            g_noise = _out(gv.sum(0) if noise_var.shape[0] > 1 else gv.sum().reshape(1), noise_var)
        return (
            _out(dmu, mu) if need[0] else None,
            _out(dv, mu) if (need[1] and ctx.has_v) else None,
            _out(dlam, lam) if need[2] else None,
            _out(da, a) if need[3] else None,
            _out(db, b) if (need[4] and (with_var or ctx.kind != "whitened")) else None,
            g_noise,
            None,
            None,
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
    out = layer_response(
        "observations",
        mu,
        v,
        inducing_points,
        lengthscales,
        targets,
        target_variances,
        noise_var,
        jitter,
        with_var,
    )
    return out[:2] if with_var else out


def cpu_variational_layer_response(
    mu: Tensor,
    v: Tensor | None,
    inducing_points: Tensor,
    lengthscales: Tensor,
    targets_loc: Tensor,
    targets_scale_tril: Tensor,
    noise_var: Tensor | None = None,
    jitter: float = 1e-6,
    with_var: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """Output moments of a variational GPN layer with a whitened ``q``, in one autograd node.

    The response of :class:`~pyro_gpn.layers.variational.VariationalTargets` with
    ``whiten=True``: ``beta = L^-T m`` and ``Khat = L^-T (I - T T^T) L^-1`` with
    ``L = chol(K(V, V) + jitter I)`` (``eq:gpn_vi_sampling_muhat_fl``,
    ``eq:gpn_vi_sampling_sigmahat_fl``), then ``eq:gpn_vi_mu`` and
    ``eq:gpn_vi_marginal_sigma2_fl`` row by row, as :func:`cpu_layer_response`.

    Args:
        mu: ``[S, N]`` activation means; v: ``[S, N]`` activation variances or ``None``.
        inducing_points: ``[N | 1, R]`` fixed, equidistant, ascending ``V`` (not differentiated).
        lengthscales: ``[N | 1]``.
        targets_loc: ``[N | 1, R]`` the mean ``m`` of ``q(z)``.
        targets_scale_tril: ``[N | 1, R, R]`` its scale ``T`` (``q(z) = N(m, T T^T)``; lower
            triangular as a Cholesky factor, or diagonal, though any square matrix is valid;
            not read with ``with_var=False``, where any ``[1, 1, 1]`` tensor will do).
        noise_var: ``[N | 1]`` output noise variance ``sigma^2`` or ``None``.
        jitter: added to the diagonal of ``K(V, V)`` (the prior covariance of ``U``).
        with_var: return ``(mean, var)`` or the means only.

    Returns:
        ``mean [S, N]`` (and ``var [S, N]``) in ``mu``'s dtype, differentiable w.r.t. ``mu``,
        ``v``, ``lengthscales``, ``targets_loc``, ``targets_scale_tril`` and ``noise_var``.

    Raises:
        NotPositiveDefinite: if a ``K(V, V) + jitter I`` fails the Cholesky factorisation or,
            with ``with_var``, is singular to half the working precision
            (:func:`~pyro_gpn.moments._numba_params.well_posed`: only far below the default
            jitter); the layer then takes the reference path.
    """
    out = layer_response(
        "whitened",
        mu,
        v,
        inducing_points,
        lengthscales,
        targets_loc,
        targets_scale_tril,
        noise_var,
        jitter,
        with_var,
    )
    return out[:2] if with_var else out


def layer_response(
    kind: str,
    mu: Tensor,
    v: Tensor | None,
    inducing_points: Tensor,
    lengthscales: Tensor,
    first: Tensor,
    second: Tensor,
    noise_var: Tensor | None,
    jitter: float,
    with_var: bool,
    refine: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor | None]:
    """:func:`cpu_layer_response` (``kind="observations"``, ``first, second = U, S``) or
    :func:`cpu_variational_layer_response` (``kind="whitened"``, ``first, second = m, T``), with
    ``with_var`` returning also ``rows``: with ``refine``, the bool ``[S, N]`` rows that the
    explicit ``C`` cannot give to 1e-6
    (:func:`~pyro_gpn.moments.quadrature.explicit_c_rows`, with ``||L^-1||_F^2`` of ``C``'s
    factor: ``tr((K + S)^-1)``, ``tr((K + jitter I)^-1)`` for ``Khat``), which
    :func:`~pyro_gpn.layers.respond.respond` recomputes from the factors, or ``None`` when
    there are none. Decided in NumPy inside the node: no tensor is read back."""
    return _LayerResponse.apply(
        mu,
        v,
        lengthscales,
        first,
        second,
        noise_var,
        inducing_points,
        jitter,
        with_var,
        kind,
        refine and with_var,
    )
