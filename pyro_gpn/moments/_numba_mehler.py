"""Numba kernels of :mod:`pyro_gpn.moments.cpu_mehler` (imported on first use: imports numba).

All arrays float64 (the terms int32) and C-contiguous: the activation covariances ``cov``,
the number of terms of every pair ``terms`` (-1: not served) and the outputs ``[S, N, N]``,
``scale = (lambda^2 + v)^-1/2`` and the per-unit logarithms ``[S, N]``, the coefficients
``coef`` ``[S, N, K]`` (term ``k + 1`` at index ``k``). Each unordered pair ``n < m`` is
visited once, with the scaled covariance ``r = (cov_nm + cov_mn) / 2 * scale_n * scale_m``
(the symmetric part).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_OPTS = {"cache": True, "nogil": True, "error_model": "numpy", "fastmath": {"contract"}}


@njit(**_OPTS)
def mehler_terms(cov, scale, per_unit, log_rtol, max_terms, terms):
    """The least ``K`` of every pair (see :func:`pyro_gpn.moments.cross._mehler_terms`) in
    ``terms`` (0: every term is zero, -1: not served; the diagonal 0), and ``(largest K
    served, pairs not served)``. ``per_unit = log(sqrt(out_var) / B)``, ``+inf`` where
    ``B = 0``."""
    S, N = scale.shape
    largest = 0
    missed = 0
    for s in range(S):
        for n in range(N):
            terms[s, n, n] = 0
            for m in range(n + 1, N):
                q = abs(0.5 * (cov[s, n, m] + cov[s, m, n])) * scale[s, n] * scale[s, m]
                un = per_unit[s, n]
                um = per_unit[s, m]
                k = 0
                if q == 0.0 or un == math.inf or um == math.inf:
                    pass  # every term is zero
                elif q >= 1.0:
                    k = -1
                else:
                    limit = un + um + log_rtol + math.log1p(-q)
                    needed = limit / math.log(q) - 1.0
                    if needed <= max_terms:  # False for NaN (out_var = 0 or NaN)
                        k = 1 if needed < 1.0 else int(math.ceil(needed))  # K >= 1
                        if k <= max_terms:
                            largest = max(largest, k)
                        else:
                            k = -1  # (max_terms < 1)
                    else:
                        k = -1
                terms[s, n, m] = k
                terms[s, m, n] = k
                if k < 0:
                    missed += 2
    return largest, missed


@njit(**_OPTS)
def mehler_pairs_fwd(cov, scale, coef, terms, out):
    """``out[s, n, m] = out[s, m, n] = sum_{k <= K_nm} r^k coef[s, n, k] coef[s, m, k]``
    (Horner in ``r``) with each pair's own number of terms ``K_nm`` (``terms``); zero for the
    pairs not served, those without terms and on the diagonal."""
    S, N, _ = coef.shape
    for s in range(S):
        for n in range(N):
            out[s, n, n] = 0.0
            for m in range(n + 1, N):
                num = terms[s, n, m]
                acc = 0.0
                if num > 0:
                    r = 0.5 * (cov[s, n, m] + cov[s, m, n]) * scale[s, n] * scale[s, m]
                    acc = coef[s, n, num - 1] * coef[s, m, num - 1]
                    for k in range(num - 2, -1, -1):
                        acc = acc * r + coef[s, n, k] * coef[s, m, k]
                    acc *= r
                out[s, n, m] = acc
                out[s, m, n] = acc


@njit(**_OPTS)
def mehler_pairs_bwd(cov, scale, coef, terms, gout, dcov, dscale, dcoef):
    """Gradients of :func:`mehler_pairs_fwd`: ``dcov`` (``[S, N, N]``, half of the pair's
    gradient on each of its two entries), ``dscale`` (``[S, N]``) and ``dcoef``
    (``[S, N, K]``), all written here."""
    S, N, K = coef.shape
    for s in range(S):
        for n in range(N):
            dcov[s, n, n] = 0.0
            dscale[s, n] = 0.0
            for k in range(K):
                dcoef[s, n, k] = 0.0
        for n in range(N):
            for m in range(n + 1, N):
                num = terms[s, n, m]
                if num <= 0:
                    dcov[s, n, m] = 0.0
                    dcov[s, m, n] = 0.0
                    continue
                sym = 0.5 * (cov[s, n, m] + cov[s, m, n])
                r = sym * scale[s, n] * scale[s, m]
                g = gout[s, n, m] + gout[s, m, n]
                power = 1.0  # r^(k - 1) at term k
                slope = 0.0  # d out / d r
                for k in range(num):
                    cn = coef[s, n, k]
                    cm = coef[s, m, k]
                    slope += (k + 1) * power * cn * cm
                    power *= r
                    weight = g * power
                    dcoef[s, n, k] += weight * cm
                    dcoef[s, m, k] += weight * cn
                dr = g * slope
                half = 0.5 * dr * scale[s, n] * scale[s, m]
                dcov[s, n, m] = half
                dcov[s, m, n] = half
                dscale[s, n] += dr * sym * scale[s, m]
                dscale[s, m] += dr * sym * scale[s, n]


@njit(inline="always", **_OPTS)
def _rows(n, points, beta, lengthscales):
    """Unit ``n``'s rows of the inducing points, ``beta`` and the lengthscales (a leading size
    of 1 is shared by every unit)."""
    return (
        n * min(points.shape[0] - 1, 1),
        n * min(beta.shape[0] - 1, 1),
        n * min(lengthscales.shape[0] - 1, 1),
    )


@njit(**_OPTS)
def hermite_fwd(mean, var, points, lengthscales, beta, roots, coef, bound):
    """``coef[s, n, k - 1] = (-1)^k sum_r beta_r psi_r h_k(t_r)`` for ``k = 1 .. K`` and
    ``bound[s, n] = CRAMER sum_r |beta_r| lambda / sqrt(c) exp(-t_r^2 / 4)`` (see
    :func:`pyro_gpn.moments.cross._hermite_coefficients`; ``h_k = He_k / sqrt(k!)``, by the
    three-term recurrence of the Hermite functions, the ``R`` recurrences of a unit side by
    side). ``points``, ``beta`` ``[N | 1, R]``, ``lengthscales`` ``[N | 1]`` (a leading size of
    1 is shared by every unit); ``roots[k] = sqrt(k)``, ``k = 0 .. K + 1``."""
    S, N, K = coef.shape
    R = points.shape[1]
    t = np.empty(R)
    previous = np.empty(R)
    current = np.empty(R)
    for s in range(S):
        for n in range(N):
            p, b, q = _rows(n, points, beta, lengthscales)
            lam = lengthscales[q]
            scale = 1.0 / math.sqrt(lam * lam + var[s, n])
            amplitude = lam * scale
            total = 0.0
            for r in range(R):
                t[r] = (mean[s, n] - points[p, r]) * scale
                total += abs(beta[b, r]) * amplitude * math.exp(-0.25 * t[r] * t[r])
                previous[r] = beta[b, r] * amplitude * math.exp(-0.5 * t[r] * t[r])  # u_0
                current[r] = t[r] * previous[r]  # u_1
            bound[s, n] = 1.086435 * total
            sign = -1.0
            for k in range(1, K + 1):
                acc = 0.0
                for r in range(R):
                    acc += current[r]
                coef[s, n, k - 1] = sign * acc
                sign = -sign
                if k < K:
                    down = roots[k]
                    inverse = 1.0 / roots[k + 1]
                    for r in range(R):
                        following = (t[r] * current[r] - down * previous[r]) * inverse
                        previous[r] = current[r]
                        current[r] = following


@njit(**_OPTS)
def hermite_bwd(mean, var, points, lengthscales, beta, roots, gcoef, dmean, dvar, dlam, dbeta):
    """Gradients of :func:`hermite_fwd`'s coefficients: ``dmean``, ``dvar`` ``[S, N]`` written,
    ``dlam`` ``[N | 1]`` and ``dbeta`` ``[N | 1, R]`` accumulated (zero them first). With the
    Hermite functions ``u_k = exp(-t^2 / 2) h_k(t)``: ``du_k / dt = -sqrt(k + 1) u_{k+1}``,
    ``t = (mu - V) / sqrt(c)``, ``c = lambda^2 + v``, the amplitude ``lambda / sqrt(c)``."""
    S, N, K = gcoef.shape
    R = points.shape[1]
    t = np.empty(R)
    previous = np.empty(R)
    current = np.empty(R)
    dsum = np.empty(R)  # sum_k g_k (-1)^k u_k
    dtsum = np.empty(R)  # sum_k g_k (-1)^k (-sqrt(k + 1)) u_{k+1}: d dsum / dt
    for s in range(S):
        for n in range(N):
            p, b, q = _rows(n, points, beta, lengthscales)
            lam = lengthscales[q]
            width = lam * lam + var[s, n]
            scale = 1.0 / math.sqrt(width)
            amplitude = lam * scale
            for r in range(R):
                t[r] = (mean[s, n] - points[p, r]) * scale
                previous[r] = math.exp(-0.5 * t[r] * t[r])  # u_0 (bounded: no overflow)
                current[r] = t[r] * previous[r]  # u_1
                dsum[r] = 0.0
                dtsum[r] = 0.0
            sign = -1.0
            for k in range(1, K + 1):
                g = gcoef[s, n, k - 1] * sign
                sign = -sign
                down = roots[k]
                up = roots[k + 1]
                inverse = 1.0 / up
                for r in range(R):
                    following = (t[r] * current[r] - down * previous[r]) * inverse
                    dsum[r] += g * current[r]
                    dtsum[r] -= g * up * following
                    previous[r] = current[r]
                    current[r] = following
            gt_sum = 0.0  # sum_r dL/dt_r
            gtt_sum = 0.0  # sum_r dL/dt_r t_r
            gamp = 0.0  # dL/d amplitude
            for r in range(R):
                dbeta[b, r] += amplitude * dsum[r]
                gamp += beta[b, r] * dsum[r]
                gt = beta[b, r] * amplitude * dtsum[r]
                gt_sum += gt
                gtt_sum += gt * t[r]
            # t = (mu - V) c^-1/2: dt/dmu = c^-1/2, dt/dc = -t / (2c); amplitude = lam c^-1/2
            gwidth = -0.5 * gtt_sum / width - 0.5 * gamp * amplitude / width
            dmean[s, n] = gt_sum * scale
            dvar[s, n] = gwidth
            dlam[q] += gamp * scale + 2.0 * lam * gwidth
