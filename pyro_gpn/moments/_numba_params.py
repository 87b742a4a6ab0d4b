"""Numba kernels of the parameter-only part of a parametric GPN layer, forward and backward
(imported on first use by :mod:`pyro_gpn.moments.cpu_layer`: imports numba).

One call per layer and direction does every unit's ``R x R`` algebra (``eq:gpn_normal_alpha_kappa``)
and the midpoint weights of the closed-form variance, so that a training step pays one kernel
launch for it instead of five. All arrays float64, C-contiguous, parameters ``[G, ...]`` with
``G`` the number of activation functions; per-unit gradient inputs ``[N, ...]`` are summed into
their function (``g = n`` if ``G > 1`` else 0).

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
    cholesky_solve,
    cholesky_substitute,
    grid_origin_spacing,
    symmetric_inverse,
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
        # midpoint weights, decay exp(-(r - t)^2 h^2 / (4 lambda^2))
        a = h * h * 0.25 * il2
        for j in range(R):
            dm[j] = math.exp(-a * j * j)
        for k in range(2 * R - 1):
            P[g, k] = 0.0
            PC[g, k] = 0.0
            PA[g, k] = 0.0
        for r in range(R):
            for t in range(R):
                d = dm[abs(r - t)]
                crt = c[r, t]
                bb = b[r] * b[t]
                P[g, r + t] += (crt - bb) * d
                PC[g, r + t] += crt * d
                PA[g, r + t] += (abs(crt) + abs(bb)) * d
    return True


@njit(**_OPTS)
def params_bwd(V, U, lam, with_var, beta, kappa, chol, dP, dPC, dbeta, dlam_rows, dU, dS, dlam):
    """Gradients ``dU, dS [G, R]`` and ``dlam [G]`` (``dlam`` includes the per-unit
    ``dlam_rows [N]`` of the row kernel) from the per-unit gradients of the midpoint weights
    ``dP, dPC [N, 2R - 1]`` and of ``beta`` (``dbeta [N, R]``). ``d kappa = -kappa dA kappa``;
    without ``with_var`` (means only) ``kappa`` is not formed: ``dU = A^-1 dbeta`` by the
    Cholesky factor and ``dA = -sym(dU beta^T)``."""
    G, R = U.shape
    N = dbeta.shape[0]
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
        for k in range(K):
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
                for k in range(K):
                    gP[k] += dP[n, k]
                    gPC[k] += dPC[n, k]
        h, lm, il2 = gram_decay(V, lam, g, R, kd)
        b = beta[g]
        du = dU[g]
        if with_var:
            c = kappa[g]
            a = h * h * 0.25 * il2
            for j in range(R):
                dm[j] = math.exp(-a * j * j)
            # midpoint weights' backward: dC, and beta's share of P = sum (C - b b^T) d
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
