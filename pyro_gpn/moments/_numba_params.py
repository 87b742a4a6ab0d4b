"""Numba kernels of the parameter-only part of a GPN layer, forward and backward (imported on
first use by :mod:`pyro_gpn.moments.cpu_layer`: imports numba).

One call per layer and direction does every unit's ``R x R`` algebra and the midpoint weights of
the closed-form variance, so that a training step pays one kernel launch for it instead of five
to twenty: :func:`params_fwd` / :func:`params_bwd` for virtual observations
(``eq:gpn_normal_alpha_kappa``), :func:`whitened_params_fwd` / :func:`whitened_params_bwd`
for the whitened variational posterior ``q(z) = N(m, T T^T)``, ``U = L z``
(``eq:gpn_vi_sampling_muhat_fl``, ``eq:gpn_vi_sampling_sigmahat_fl``). All arrays float64,
C-contiguous, parameters ``[G, ...]`` with ``G`` the number of activation functions; per-unit
gradient inputs ``[N, ...]`` are summed into their function (``g = n`` if ``G > 1`` else 0).

For equidistant points ``V_r = V_0 + r h`` both ``K(V, V)_rt = exp(-(r - t)^2 h^2 / 2 lambda^2)``
and the midpoint decay ``exp(-(r - t)^2 h^2 / 4 lambda^2)`` depend on ``|r - t|`` only: ``R``
exponentials each per unit instead of ``R^2``.
"""

# ruff: noqa: E501
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._numba_kernels import (
    cholesky_factor,
    cholesky_solve,
    cholesky_substitute,
    forward_solve,
    grid_origin_spacing,
    symmetric_inverse,
    transposed_solve,
)

_OPTS = {"cache": True, "nogil": True, "error_model": "numpy"}


@njit(inline="always", **_OPTS)
def gram_decay(V, lam, g, R, kd):
    """Spacing ``h``, lengthscale ``lm`` and ``1 / lm^2`` of function ``g``, and the Gram
    matrix's ``R`` distinct entries ``kd[j] = exp(-(j h)^2 / 2 lm^2)`` (``K(V, V)_rt =
    kd[|r - t|]`` on the equidistant grid)."""
    _, h = grid_origin_spacing(V, g, R)
    lm = lam[g]
    il2 = 1.0 / (lm * lm)
    for j in range(R):
        d = j * h
        kd[j] = math.exp(-0.5 * d * d * il2)
    return h, lm, il2


@njit(inline="always", **_OPTS)
def midpoint_rows(c, b, h, il2, dm, P, PC, PA, R):
    """One function's midpoint weights ``[2R - 1]`` of the closed-form variance:
    ``P`` of ``C - beta beta^T``, ``PC`` of ``C`` and ``PA`` of ``|C| + |beta| |beta|^T``, with
    the decay ``dm[j] = exp(-j^2 h^2 / (4 lambda^2))`` (filled here)."""
    a = h * h * 0.25 * il2
    for j in range(R):
        dm[j] = math.exp(-a * j * j)
    for k in range(2 * R - 1):
        P[k] = 0.0
        PC[k] = 0.0
        PA[k] = 0.0
    for r in range(R):
        for t in range(R):
            d = dm[abs(r - t)]
            crt = c[r, t]
            bb = b[r] * b[t]
            P[r + t] += (crt - bb) * d
            PC[r + t] += crt * d
            PA[r + t] += (abs(crt) + abs(bb)) * d


@njit(inline="always", **_OPTS)
def midpoint_grads(c, b, h, lm, il2, gP, gPC, dm, gC, gb, R):
    """Backward of :func:`midpoint_rows` (``P``, ``PC``): ``gC`` (symmetric, written), ``beta``'s
    share added to ``gb``; returns the lengthscale's share (``dm`` is filled here)."""
    a = h * h * 0.25 * il2
    for j in range(R):
        dm[j] = math.exp(-a * j * j)
    gl = 0.0
    for r in range(R):
        acc = 0.0
        for t in range(R):
            j = abs(r - t)
            d = dm[j]
            gp = gP[r + t] * d
            gpc = gPC[r + t] * d
            gC[r, t] = gp + gpc
            acc -= 2.0 * gp * b[t]
            gl += (gp * (c[r, t] - b[r] * b[t]) + gpc * c[r, t]) * 2.0 * a * j * j / lm
        gb[r] += acc
    return gl


@njit(inline="always", **_OPTS)
def function_gradients(g, G, with_var, dlam_rows, dbeta, dP, dPC, gb, gP, gPC):
    """The per-unit gradients of the row kernel summed into function ``g`` (``g = n`` if
    ``G > 1`` else 0): ``gb`` of ``beta``, ``gP``, ``gPC`` of the midpoint weights (with
    ``with_var``; written here); returns the lengthscale's share ``sum dlam_rows``."""
    N, R = dbeta.shape
    for k in range(gP.shape[0]):
        gP[k] = 0.0
        gPC[k] = 0.0
    for r in range(R):
        gb[r] = 0.0
    gl = 0.0
    for n in range(N):
        if (n if G > 1 else 0) != g:
            continue
        gl += dlam_rows[n]
        for r in range(R):
            gb[r] += dbeta[n, r]
        if with_var:
            for k in range(gP.shape[0]):
                gP[k] += dP[n, k]
                gPC[k] += dPC[n, k]
    return gl


@njit(**_OPTS)
def params_fwd(V, U, Svar, lam, jitter, with_var, beta, kappa, chol, P, PC, PA):
    """``beta = (K + diag(S + jitter))^-1 U`` (Cholesky solve) and its Cholesky factor ``chol``;
    with ``with_var`` also ``kappa`` (LU inverse, symmetrised, as ``torch.linalg.inv``) and the
    midpoint weights ``P`` of ``kappa - beta beta^T``, ``PC`` of ``kappa`` and ``PA`` of
    ``|kappa| + |beta| |beta|^T`` (``[G, 2R - 1]``). Returns False if a Cholesky fails."""
    G, R = U.shape
    A = np.empty((R, R))
    Li = np.empty((R, R))
    kd = np.empty(R)
    dm = np.empty(R)
    for g in range(G):
        h, lm, il2 = gram_decay(V, lam, g, R, kd)
        for r in range(R):
            for t in range(R):
                A[r, t] = kd[abs(r - t)]
            A[r, r] += Svar[g, r] + jitter
        L = chol[g]
        b = beta[g]
        if not cholesky_solve(A, L, U[g], b, R):
            return False
        if not with_var:
            continue
        # kappa by Gauss-Jordan elimination with partial pivoting (A is overwritten)
        c = kappa[g]
        symmetric_inverse(A, Li, c, R)
        midpoint_rows(c, b, h, il2, dm, P[g], PC[g], PA[g], R)
    return True


@njit(**_OPTS)
def params_bwd(V, U, lam, with_var, beta, kappa, chol, dP, dPC, dbeta, dlam_rows, dU, dS, dlam):
    """Gradients ``dU, dS [G, R]`` and ``dlam [G]`` (``dlam`` includes the per-unit
    ``dlam_rows [N]`` of the row kernel) from the per-unit gradients of the midpoint weights
    ``dP, dPC [N, 2R - 1]`` and of ``beta`` (``dbeta [N, R]``). ``d kappa = -kappa dA kappa``;
    without ``with_var`` (means only) ``kappa`` is not formed: ``dU = A^-1 dbeta`` by the
    Cholesky factor and ``dA = -sym(dU beta^T)``."""
    G, R = U.shape
    K = 2 * R - 1
    gP = np.empty(K)
    gPC = np.empty(K)
    gb = np.empty(R)
    gC = np.empty((R, R))
    T = np.empty((R, R))
    dA = np.empty((R, R))
    kd = np.empty(R)
    dm = np.empty(R)
    for g in range(G):
        gl = function_gradients(g, G, with_var, dlam_rows, dbeta, dP, dPC, gb, gP, gPC)
        h, lm, il2 = gram_decay(V, lam, g, R, kd)
        b = beta[g]
        du = dU[g]
        if with_var:
            c = kappa[g]
            gl += midpoint_grads(c, b, h, lm, il2, gP, gPC, dm, gC, gb, R)
            # dU = kappa gb; dA = -(kappa gC kappa + sym(dU beta^T))
            for r in range(R):
                s = 0.0
                for t in range(R):
                    s += c[r, t] * gb[t]
                du[r] = s
            for r in range(R):
                for t in range(R):
                    T[r, t] = 0.0
                for k in range(R):
                    ck = c[r, k]
                    for t in range(R):
                        T[r, t] += ck * gC[k, t]
            for r in range(R):
                for t in range(R):
                    dA[r, t] = -0.5 * (du[r] * b[t] + b[r] * du[t])
                for k in range(R):
                    tk = T[r, k]
                    for t in range(R):
                        dA[r, t] -= tk * c[k, t]
        else:
            L = chol[g]
            cholesky_substitute(L, gb, du, R)
            for r in range(R):
                for t in range(R):
                    dA[r, t] = -0.5 * (du[r] * b[t] + b[r] * du[t])
        for r in range(R):
            dS[g, r] = dA[r, r]
            for t in range(R):
                if t != r:
                    j = abs(r - t)
                    d = j * h
                    gl += dA[r, t] * kd[j] * d * d * il2 / lm
        dlam[g] = gl
    return True


@njit(inline="always", **_OPTS)
def lower_inverse(L, Li, R):
    """``Li = L^-1`` of a lower-triangular ``L`` ([R, R]) by forward substitution (lower too)."""
    for c in range(R):
        for r in range(c):
            Li[r, c] = 0.0
        Li[c, c] = 1.0 / L[c, c]
        for r in range(c + 1, R):
            s = 0.0
            for k in range(c, r):
                s += L[r, k] * Li[k, c]
            Li[r, c] = -s / L[r, r]


#: :func:`well_posed`'s bound on ``tr(K^-1) / R`` (``K = K(V, V) + jitter I``): ``1 / sqrt(eps)``
#: in float64. ``Khat`` forms ``K^-1`` explicitly; past the bound its smallest eigenvalue is below
#: ``sqrt(eps)`` and ``K^-1`` keeps fewer than half the digits of the reference path's.
MAX_MEAN_INVERSE_EIGENVALUE = 67108864.0


@njit(inline="always", **_OPTS)
def well_posed(Li, R):
    """Whether ``K = L L^T`` (``Li = L^-1`` [R, R]) passes ``tr(K^-1) = ||Li||_F^2 <= R`` times
    :data:`MAX_MEAN_INVERSE_EIGENVALUE`. As ``tr(K^-1)`` lies between ``1 / lambda_min`` and
    ``R / lambda_min``, every ``K`` with ``lambda_min >= sqrt(eps)`` passes (the default jitter
    1e-6 keeps ``lambda_min >= 1e-6`` at any lengthscale) and every one with
    ``lambda_min < sqrt(eps) / R`` fails (without jitter: lengthscale 1 and longer on 14 points
    in ``[-2, 2]``)."""
    total = 0.0
    for r in range(R):
        for c in range(r + 1):
            total += Li[r, c] * Li[r, c]
    return total <= R * MAX_MEAN_INVERSE_EIGENVALUE


@njit(**_OPTS)
def whitened_params_fwd(V, m, T, lam, jitter, with_var, beta, khat, chol, linv, P, PC, PA):
    """The whitened variational response's weights (``eq:gpn_vi_sampling_muhat_fl``,
    ``eq:gpn_vi_sampling_sigmahat_fl``): with ``L = chol(K(V, V) + jitter I)``,
    ``beta = L^-T m`` and, with ``with_var``, ``Khat = L^-T (I - T T^T) L^-1 =
    L^-T L^-1 - (L^-T T)(L^-T T)^T`` (symmetric) and its midpoint weights
    (:func:`midpoint_rows`), each by the factorisations of the reference path
    (:meth:`~pyro_gpn.layers.variational.VariationalTargets.weights`).

    Args: ``V [G, R]`` equidistant points, ``m [G, R]`` and ``T [G, R, R]`` the mean and scale
    of ``q(z)`` (``T`` any square matrix), ``lam [G]``, ``jitter``, ``with_var``. Writes
    ``beta [G, R]``, ``khat [G, R, R]``, ``chol [G, R, R]`` (``L``), ``linv [G, R, R]``
    (``L^-1``, kept for the backward) and ``P``, ``PC``, ``PA [G, 2R - 1]`` (``khat`` and the
    midpoint weights only with ``with_var``; ``T`` is not read without). Returns False if a
    Cholesky fails, or with ``with_var`` if :func:`well_posed` refuses ``K``."""
    G, R = m.shape
    A = np.empty((R, R))
    root = np.empty((R, R))
    col = np.empty(R)
    x = np.empty(R)
    kd = np.empty(R)
    decay = np.empty(R)
    for g in range(G):
        h, lm, il2 = gram_decay(V, lam, g, R, kd)
        for r in range(R):
            for t in range(R):
                A[r, t] = kd[abs(r - t)]
            A[r, r] += jitter
        L = chol[g]
        if not cholesky_factor(A, L, R):
            return False
        Li = linv[g]
        lower_inverse(L, Li, R)
        b = beta[g]
        transposed_solve(L, m[g], b, R)
        if not with_var:
            continue
        if not well_posed(Li, R):
            return False
        Tg = T[g]
        for j in range(R):  # root = L^-T T, column by column
            for r in range(R):
                col[r] = Tg[r, j]
            transposed_solve(L, col, x, R)
            for r in range(R):
                root[r, j] = x[r]
        c = khat[g]
        for r in range(R):
            for q in range(r, R):
                acc = 0.0
                for t in range(q, R):
                    acc += Li[t, r] * Li[t, q]
                for j in range(R):
                    acc -= root[r, j] * root[q, j]
                c[r, q] = acc
                c[q, r] = acc
        midpoint_rows(c, b, h, il2, decay, P[g], PC[g], PA[g], R)
    return True


@njit(**_OPTS)
def whitened_params_bwd(
    V, m, T, lam, with_var, beta, khat, chol, linv, dP, dPC, dbeta, dlam_rows, dloc, dT, dlam
):
    """Gradients ``dloc [G, R]`` (of ``m``), ``dT [G, R, R]`` and ``dlam [G]`` of
    :func:`whitened_params_fwd` from the per-unit gradients of the midpoint weights
    ``dP, dPC [N, 2R - 1]``, of ``beta`` (``dbeta [N, R]``) and the row kernel's
    ``dlam_rows [N]`` (summed into function ``g = n`` if ``G > 1`` else 0). ``dT`` is written
    only with ``with_var`` (``T`` does not reach ``beta``).

    With ``gC`` the gradient of ``Khat`` (symmetric) and ``gb`` of ``beta``: ``dm = L^-1 gb``,
    ``dM = Li gC Li^T`` for ``M = I - T T^T`` (``Li = L^-1``) so ``dT = -2 dM T``;
    ``dLi = m gb^T + 2 M Li gC``, ``dL = -Li^T dLi Li^T`` (lower part), and the Cholesky
    factor's backward (as ``torch.linalg.cholesky``'s) ``dA = Li^T sym(Phi(L^T dL)) Li``,
    which reaches the lengthscale through ``K(V, V)_rt = exp(-(r - t)^2 h^2 / 2 lambda^2)``."""
    G, R = m.shape
    K = 2 * R - 1
    gP = np.empty(K)
    gPC = np.empty(K)
    gb = np.empty(R)
    gC = np.zeros((R, R))
    X = np.empty((R, R))
    Y = np.empty((R, R))
    dLi = np.empty((R, R))
    W = np.empty((R, R))
    kd = np.empty(R)
    decay = np.empty(R)
    for g in range(G):
        gl = function_gradients(g, G, with_var, dlam_rows, dbeta, dP, dPC, gb, gP, gPC)
        h, lm, il2 = gram_decay(V, lam, g, R, kd)
        L = chol[g]
        Li = linv[g]
        Tg = T[g]
        if with_var:
            gl += midpoint_grads(khat[g], beta[g], h, lm, il2, gP, gPC, decay, gC, gb, R)
        forward_solve(L, gb, dloc[g], R)  # dm = L^-1 gb
        for r in range(R):  # dLi = m gb^T (lower part: Li's upper triangle is no variable)
            for t in range(R):
                dLi[r, t] = m[g, r] * gb[t] if t <= r else 0.0
        if with_var:
            for r in range(R):  # X = Li gC
                for t in range(R):
                    acc = 0.0
                    for k in range(r + 1):
                        acc += Li[r, k] * gC[k, t]
                    X[r, t] = acc
            for r in range(R):  # W = dM = X Li^T (symmetric)
                for q in range(R):
                    acc = 0.0
                    for t in range(q + 1):
                        acc += X[r, t] * Li[q, t]
                    W[r, q] = acc
            for r in range(R):  # dT = -2 dM T
                for j in range(R):
                    acc = 0.0
                    for q in range(R):
                        acc += W[r, q] * Tg[q, j]
                    dT[g, r, j] = -2.0 * acc
            for j in range(R):  # Y = T^T X
                for t in range(R):
                    acc = 0.0
                    for q in range(R):
                        acc += Tg[q, j] * X[q, t]
                    Y[j, t] = acc
            for r in range(R):  # dLi += 2 M X = 2 (X - T Y), lower part
                for t in range(r + 1):
                    acc = X[r, t]
                    for j in range(R):
                        acc -= Tg[r, j] * Y[j, t]
                    dLi[r, t] += 2.0 * acc
        # dL = -Li^T dLi Li^T (lower part): X = dLi Li^T, then W = -Li^T X
        for r in range(R):
            for q in range(R):
                acc = 0.0
                for t in range(min(r, q) + 1):
                    acc += dLi[r, t] * Li[q, t]
                X[r, q] = acc
        for r in range(R):
            for q in range(r + 1):
                acc = 0.0
                for t in range(r, R):
                    acc += Li[t, r] * X[t, q]
                W[r, q] = -acc
        # Phi = tril(L^T dL), diagonal halved; Y = sym(Phi) = (Phi + Phi^T) / 2
        for r in range(R):
            for q in range(r + 1):
                acc = 0.0
                for t in range(r, R):
                    acc += L[t, r] * W[t, q]
                if q == r:
                    Y[r, r] = 0.5 * acc
                else:
                    Y[r, q] = 0.5 * acc
                    Y[q, r] = 0.5 * acc
        # dA = Li^T Y Li (symmetric): X = Y Li, then dA = Li^T X
        for r in range(R):
            for q in range(R):
                acc = 0.0
                for t in range(q, R):
                    acc += Y[r, t] * Li[t, q]
                X[r, q] = acc
        for r in range(R):
            for q in range(R):
                if q == r:
                    continue
                acc = 0.0
                for t in range(r, R):
                    acc += Li[t, r] * X[t, q]
                j = abs(r - q)
                d = j * h
                gl += acc * kd[j] * d * d * il2 / lm
        dlam[g] = gl
    return True
