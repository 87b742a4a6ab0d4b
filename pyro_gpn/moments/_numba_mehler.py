"""Numba kernels of :mod:`pyro_gpn.moments.cpu_mehler` (imported on first use: imports numba).

All arrays float64 (the mask uint8) and C-contiguous: the activation covariances ``cov``, the
mask ``ok`` and the outputs ``[S, N, N]``, ``scale = (lambda^2 + v)^-1/2`` and the per-unit
logarithms ``[S, N]``, the coefficients ``coef`` ``[S, N, K]`` (term ``k + 1`` at index ``k``).
Each unordered pair ``n < m`` is visited once, with the scaled covariance
``r = (cov_nm + cov_mn) / 2 * scale_n * scale_m`` (the symmetric part).
"""

from __future__ import annotations

import math

from numba import njit

_OPTS = {"cache": True, "nogil": True, "error_model": "numpy", "fastmath": {"contract"}}


@njit(**_OPTS)
def mehler_terms(cov, scale, per_unit, log_rtol, max_terms, ok):
    """The least ``K`` of every pair (see :func:`pyro_gpn.moments.cross._mehler_terms`), its
    mask ``ok`` (1: served, the diagonal included) and ``(largest K served, pairs not
    served)``. ``per_unit = log(sqrt(out_var) / B)``, ``+inf`` where ``B = 0``."""
    S, N = scale.shape
    largest = 0.0
    missed = 0
    for s in range(S):
        for n in range(N):
            ok[s, n, n] = 1
            for m in range(n + 1, N):
                q = abs(0.5 * (cov[s, n, m] + cov[s, m, n])) * scale[s, n] * scale[s, m]
                un = per_unit[s, n]
                um = per_unit[s, m]
                served = 1
                if q == 0.0 or un == math.inf or um == math.inf:
                    pass  # every term is zero
                elif q >= 1.0:
                    served = 0
                else:
                    limit = un + um + log_rtol + math.log1p(-q)
                    needed = limit / math.log(q) - 1.0
                    if needed <= max_terms:  # False for NaN (out_var = 0)
                        if needed > largest:
                            largest = needed
                    else:
                        served = 0
                ok[s, n, m] = served
                ok[s, m, n] = served
                missed += 2 * (1 - served)
    return largest, missed


@njit(**_OPTS)
def mehler_pairs_fwd(cov, scale, coef, ok, out):
    """``out[s, n, m] = out[s, m, n] = sum_k r^k coef[s, n, k] coef[s, m, k]`` (Horner in
    ``r``) for the served pairs, zero elsewhere and on the diagonal."""
    S, N, K = coef.shape
    for s in range(S):
        for n in range(N):
            out[s, n, n] = 0.0
            for m in range(n + 1, N):
                acc = 0.0
                if ok[s, n, m]:
                    r = 0.5 * (cov[s, n, m] + cov[s, m, n]) * scale[s, n] * scale[s, m]
                    acc = coef[s, n, K - 1] * coef[s, m, K - 1]
                    for k in range(K - 2, -1, -1):
                        acc = acc * r + coef[s, n, k] * coef[s, m, k]
                    acc *= r
                out[s, n, m] = acc
                out[s, m, n] = acc


@njit(**_OPTS)
def mehler_pairs_bwd(cov, scale, coef, ok, gout, dcov, dscale, dcoef):
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
                if not ok[s, n, m]:
                    dcov[s, n, m] = 0.0
                    dcov[s, m, n] = 0.0
                    continue
                sym = 0.5 * (cov[s, n, m] + cov[s, m, n])
                r = sym * scale[s, n] * scale[s, m]
                g = gout[s, n, m] + gout[s, m, n]
                power = 1.0  # r^(k - 1) at term k
                slope = 0.0  # d out / d r
                for k in range(K):
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
