"""Numba kernels of :mod:`pyro_gpn.moments.cpu_kernels` (imported on first use: imports numba).

All arrays are float64 and C-contiguous. A parameter array with leading dimension 1 is shared
by all units (index ``n * min(shape[0] - 1, 1)``). Formulas and derivations: see
:mod:`pyro_gpn.moments.cpu_kernels`.

The row kernels exist twice: ``meanvar_fwd`` / ``meanvar_bwd`` (``parallel=True``, ``prange``
over units) and ``meanvar_fwd_serial`` / ``meanvar_bwd_serial``, the same code compiled without
the parallel runtime, which :func:`pyro_gpn.moments.cpu_kernels._k` uses when torch runs on one
thread. Launching Numba's thread pool at all is not free: with its default OpenMP layer and two
threads, a loaded 2-core machine measured a 50 -> 50 meanvar layer step at 144 ms against 5-7 ms
with one Numba thread, and torch's own matrix products in the same process slowed from 0.02 to
24 ms (``docs/results/layer_speed.md``).
"""

# ruff: noqa: E501
from __future__ import annotations

import math
import types

import numpy as np
from numba import njit, prange

_OPTS = {"cache": True, "nogil": True, "error_model": "numpy", "fastmath": {"contract"}}


@njit(inline="always", **_OPTS)
def gauss_jordan_inverse(A, Li, R):
    """``Li = A^-1`` by Gauss-Jordan elimination with partial pivoting (an LU inverse, as
    ``torch.linalg.inv``); ``A`` ([R, R]) is overwritten."""
    for r in range(R):
        for t in range(R):
            Li[r, t] = 1.0 if r == t else 0.0
    for col in range(R):
        piv = col
        big = abs(A[col, col])
        for r in range(col + 1, R):
            if abs(A[r, col]) > big:
                big = abs(A[r, col])
                piv = r
        if piv != col:
            for t in range(R):
                tmp = A[col, t]
                A[col, t] = A[piv, t]
                A[piv, t] = tmp
                tmp = Li[col, t]
                Li[col, t] = Li[piv, t]
                Li[piv, t] = tmp
        inv = 1.0 / A[col, col]
        for t in range(R):
            A[col, t] *= inv
            Li[col, t] *= inv
        for r in range(R):
            if r != col:
                f = A[r, col]
                if f != 0.0:
                    for t in range(R):
                        A[r, t] -= f * A[col, t]
                        Li[r, t] -= f * Li[col, t]


@njit(inline="always", **_OPTS)
def cholesky_factor(A, L, R):
    """Lower Cholesky factor ``L`` of ``A`` ([R, R], upper triangle zeroed; ``A`` unchanged).
    Returns False if ``A`` is not numerically positive definite."""
    for j in range(R):
        s = A[j, j]
        for k in range(j):
            s -= L[j, k] * L[j, k]
        if not s > 0.0:
            return False
        ljj = math.sqrt(s)
        L[j, j] = ljj
        for i in range(j + 1, R):
            s = A[i, j]
            for k in range(j):
                s -= L[i, k] * L[j, k]
            L[i, j] = s / ljj
        for i in range(j):
            L[i, j] = 0.0
    return True


@njit(inline="always", **_OPTS)
def forward_solve(L, u, x, R):
    """``x = L^-1 u`` for a lower-triangular ``L`` ([R, R]) by forward substitution (``x`` may
    be ``u``)."""
    for r in range(R):
        acc = u[r]
        for k in range(r):
            acc -= L[r, k] * x[k]
        x[r] = acc / L[r, r]


@njit(inline="always", **_OPTS)
def transposed_solve(L, u, x, R):
    """``x = L^-T u`` for a lower-triangular ``L`` ([R, R]) by back substitution (as
    ``torch.linalg.solve_triangular(L.mT, u, upper=True)``; ``x`` may be ``u``)."""
    for r in range(R - 1, -1, -1):
        acc = u[r]
        for k in range(r + 1, R):
            acc -= L[k, r] * x[k]
        x[r] = acc / L[r, r]


@njit(inline="always", **_OPTS)
def cholesky_substitute(L, u, b, R):
    """``b = (L L^T)^-1 u`` by the two triangular solves with the factor ``L``."""
    forward_solve(L, u, b, R)
    transposed_solve(L, b, b, R)


@njit(inline="always", **_OPTS)
def cholesky_solve(A, L, u, b, R):
    """:func:`cholesky_factor` of ``A`` into ``L``, then ``b = A^-1 u`` by
    :func:`cholesky_substitute` (as ``torch.cholesky_solve``). Returns False if ``A`` is not
    numerically positive definite."""
    if not cholesky_factor(A, L, R):
        return False
    cholesky_substitute(L, u, b, R)
    return True


@njit(inline="always", **_OPTS)
def symmetric_inverse(A, Li, out, R):
    """``out = (A^-1 + A^-T) / 2`` through :func:`gauss_jordan_inverse` (``A`` and ``Li``
    are overwritten)."""
    gauss_jordan_inverse(A, Li, R)
    for r in range(R):
        for t in range(r, R):
            sym = 0.5 * (Li[r, t] + Li[t, r])
            out[r, t] = sym
            out[t, r] = sym


@njit(inline="always", **_OPTS)
def progression_ratios(delta, h, K, j0, w):
    """First ratios ``(q_up, q_dn)`` and their common ratio ``rho`` of the geometric
    progressions ``E_{k+1} / E_k`` (up) and ``E_{k-1} / E_k`` (down) of
    ``E_k = exp(-(x - k h)^2 / w)``, anchored at the nearest centre ``j0`` (``delta = x - j0 h``),
    so that every factor is <= 1; a ratio that has no neighbour on its side is 0."""
    hh = h * h
    up = j0 < K - 1
    down = j0 > 0
    q_up = math.exp((2.0 * delta * h - hh) / w) if up else 0.0
    q_dn = math.exp((-2.0 * delta * h - hh) / w) if down else 0.0
    rho = q_up * q_dn if up and down else math.exp(-2.0 * hh / w)
    return q_up, q_dn, rho


@njit(inline="always", **_OPTS)
def gsum(x, h, K, w, wts, acc, coef, grad):
    """``sum_k wts[k] E_k`` with ``E_k = exp(-(x - k h)^2 / w)`` and its first two
    moments ``sum wts E e``, ``sum wts E e^2`` (``e = x - k h``); if ``grad``,
    ``acc[k] += coef * E_k`` (``coef = 1`` on a zeroed ``acc``: a record of the exponentials)."""
    f = np.floor(x / h + 0.5)  # nearest centre, clamped in floating point (NaN -> 0)
    if not f > 0.0:
        f = 0.0
    if f > K - 1.0:
        f = K - 1.0
    j0 = int(f)
    delta = x - j0 * h
    E0 = math.exp(-delta * delta / w)
    g0 = wts[j0] * E0
    g1 = g0 * delta
    g2 = g1 * delta
    if grad:
        acc[j0] += coef * E0
    if K > 1:
        q_up, q_dn, rho = progression_ratios(delta, h, K, j0, w)
        E = E0
        q = q_up
        for k in range(j0 + 1, K):
            E *= q
            q *= rho
            e = x - k * h
            t = wts[k] * E
            g0 += t
            t *= e
            g1 += t
            g2 += t * e
            if grad:
                acc[k] += coef * E
        E = E0
        q = q_dn
        for k in range(j0 - 1, -1, -1):
            E *= q
            q *= rho
            e = x - k * h
            t = wts[k] * E
            g0 += t
            t *= e
            g1 += t
            g2 += t * e
            if grad:
                acc[k] += coef * E
    return g0, g1, g2


@njit(inline="always", **_OPTS)
def gsum_abs(x, h, K, w, wts, awts):
    """``(sum_k wts[k] E_k, sum_k awts[k] E_k)`` over one set of exponentials (as
    :func:`gsum`, without moments or gradients)."""
    f = np.floor(x / h + 0.5)
    if not f > 0.0:
        f = 0.0
    if f > K - 1.0:
        f = K - 1.0
    j0 = int(f)
    delta = x - j0 * h
    E0 = math.exp(-delta * delta / w)
    s0 = wts[j0] * E0
    a0 = awts[j0] * E0
    if K > 1:
        q_up, q_dn, rho = progression_ratios(delta, h, K, j0, w)
        E = E0
        q = q_up
        for k in range(j0 + 1, K):
            E *= q
            q *= rho
            s0 += wts[k] * E
            a0 += awts[k] * E
        E = E0
        q = q_dn
        for k in range(j0 - 1, -1, -1):
            E *= q
            q *= rho
            s0 += wts[k] * E
            a0 += awts[k] * E
    return s0, a0


# ---------------------------------------------------------------------------------------------
# exponentials of a block of rows, vectorised (AVX2 on x86-64: 4 lanes)
# ---------------------------------------------------------------------------------------------
#: rows per block of the row kernels (their exponentials are evaluated together by vexp)
BLOCK = 16
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 to 32 bits: k * _LN2_HI is exact for |k| < 2^21
_LN2_LO = 1.90821492927058770002e-10
_ROUND = 6755399441055744.0  # 1.5 * 2^52: x + _ROUND rounds x to an integer in the low bits
_ROUND_BITS = 4843621399236968448  # the bits of _ROUND as an int64
_UNDERFLOW = -708.0  # exp(x) below ~3e-308 is returned as 0 (the terms are negligible)


@njit(inline="always", **_OPTS)
def vexp(a, out, n, tbuf, ebuf):
    """``out[i] = exp(a[i])`` for ``a[i] <= 0`` (``-inf`` included, NaN stays NaN), ``i < n``, within about one
    ulp of ``math.exp`` (0 below ``exp(-708)``). Plain arithmetic in three simple loops, which
    LLVM vectorises where ``math.exp`` is a scalar library call: ``exp(x) = 2^k exp(r)``,
    ``k = round(x / ln 2)``, ``|r| <= ln(2) / 2``, ``exp(r)`` by its Taylor polynomial of degree
    13 (truncation below 1e-17 relative), ``2^k`` assembled from its exponent bits."""
    for i in range(n):
        x = a[i]
        xc = _UNDERFLOW if x < _UNDERFLOW else x  # NaN stays NaN
        t = xc * _LOG2E + _ROUND
        k = t - _ROUND
        r = (xc - k * _LN2_HI) - k * _LN2_LO
        q = 1.0 / 6227020800.0
        q = q * r + 1.0 / 479001600.0
        q = q * r + 1.0 / 39916800.0
        q = q * r + 1.0 / 3628800.0
        q = q * r + 1.0 / 362880.0
        q = q * r + 1.0 / 40320.0
        q = q * r + 1.0 / 5040.0
        q = q * r + 1.0 / 720.0
        q = q * r + 1.0 / 120.0
        q = q * r + 1.0 / 24.0
        q = q * r + 1.0 / 6.0
        q = q * r + 0.5
        q = q * r + 1.0
        q = q * r + 1.0
        out[i] = 0.0 if x < _UNDERFLOW else q
        tbuf[i] = t
    tbits = tbuf.view(np.int64)
    for i in range(n):
        ebuf[i] = (tbits[i] - _ROUND_BITS + 1023) << 52
    scale = ebuf.view(np.float64)
    for i in range(n):
        out[i] *= scale[i]


@njit(inline="always", **_OPTS)
def anchor(x, h, K):
    """Nearest centre ``j0`` of ``x`` on ``0, h, .., (K - 1) h`` (clamped; NaN -> 0) and the
    offset ``delta = x - j0 h``."""
    f = np.floor(x / h + 0.5)
    if not f > 0.0:
        f = 0.0
    if f > K - 1.0:
        f = K - 1.0
    j0 = int(f)
    return j0, x - j0 * h


@njit(inline="always", **_OPTS)
def progression_args(delta, h, K, j0, w, args, b, nb):
    """The exponents of :func:`gsum`'s anchor ``E_{j0}``, its ratios ``q_up``, ``q_dn``
    (``-inf``, i.e. 0, without a neighbour on that side) and the common ratio for one-sided
    walks, into ``args[b + i nb]``, ``i = 0..3`` (as :func:`progression_ratios`)."""
    hh = h * h
    args[b] = -delta * delta / w
    args[b + nb] = (2.0 * delta * h - hh) / w if j0 < K - 1 else -np.inf
    args[b + 2 * nb] = (-2.0 * delta * h - hh) / w if j0 > 0 else -np.inf
    args[b + 3 * nb] = -2.0 * hh / w


@njit(inline="always", **_OPTS)
def gsum_pre(x, h, K, j0, delta, ex, b, nb, wts, awts, acc, coef, grad, absolute):
    """:func:`gsum` (``absolute=False``: ``(sum, first, second moment)``) or :func:`gsum_abs`
    (``absolute=True``: ``(sum, sum of awts terms, 0)``) with the anchor ``j0, delta`` and the
    exponentials ``ex[b + i nb]`` of :func:`progression_args` evaluated beforehand."""
    E0 = ex[b]
    q_up = ex[b + nb]
    q_dn = ex[b + 2 * nb]
    rho = q_up * q_dn if (j0 < K - 1 and j0 > 0) else ex[b + 3 * nb]
    g0 = wts[j0] * E0
    if absolute:
        g1 = awts[j0] * E0
        g2 = 0.0
    else:
        g1 = g0 * delta
        g2 = g1 * delta
    if grad:
        acc[j0] += coef * E0
    # walk away from the anchor, up (step +1) then down (step -1)
    for step in (1, -1):
        E = E0
        q = q_up if step == 1 else q_dn
        k = j0 + step
        while 0 <= k < K:
            E *= q
            q *= rho
            t = wts[k] * E
            g0 += t
            if absolute:
                g1 += awts[k] * E
            else:
                e = x - k * h
                t *= e
                g1 += t
                g2 += t * e
            if grad:
                acc[k] += coef * E
            k += step
    return g0, g1, g2


@njit(inline="always", **_OPTS)
def row_rule(vv, l2, ratio2, tier_r2):
    """Node tier of one (sample, unit) in the narrow regime: the first ``t`` with
    ``v / lambda^2 <= tier_r2[t]`` (``-1``: broad, ``v > ratio2 lambda^2``)."""
    if not vv <= ratio2 * l2:
        return -1
    r2 = vv / l2 if vv > 0.0 else 0.0
    T = tier_r2.shape[0]
    for t in range(T):
        if r2 <= tier_r2[t]:
            return t
    return T - 1


@njit(inline="always", **_OPTS)
def unit_row(a, n):
    """Unit ``n``'s entry of a parameter array whose leading dimension is ``N`` or 1 (shared by
    all units)."""
    return a[n * min(a.shape[0] - 1, 1)]


@njit(inline="always", **_OPTS)
def grid_origin_spacing(V, n, R):
    """First inducing point ``x0`` and spacing ``h`` of unit ``n``'s equidistant grid
    (``V [G, R]``, ``G`` 1 or ``N``)."""
    v = unit_row(V, n)
    x0 = v[0]
    h = (v[R - 1] - x0) / (R - 1) if R > 1 else 1.0
    return x0, h


@njit(inline="always", **_OPTS)
def largest_tier(offs):
    """The most nodes of one node tier (tier ``t`` at ``offs[t]:offs[t + 1]``): the size of the
    per-unit node buffers, indexed by a node's place in its tier."""
    q = 1
    for t in range(offs.shape[0] - 1):
        q = max(q, offs[t + 1] - offs[t])
    return q


@njit(inline="always", **_OPTS)
def row_buffers(Q):
    """One unit's work arrays of :func:`meanvar_fwd` / :func:`meanvar_bwd`: the mean values at
    a tier's ``Q`` quadrature nodes, the block's exponent arguments, exponentials and :func:`vexp`
    scratch (``8 BLOCK``), and the anchors of both sums (``BLOCK``)."""
    return (
        np.empty(Q),
        np.empty(8 * BLOCK),
        np.empty(8 * BLOCK),
        np.empty(8 * BLOCK),
        np.empty(8 * BLOCK, dtype=np.int64),
        np.empty(BLOCK, dtype=np.int64),
        np.empty(BLOCK),
        np.empty(BLOCK, dtype=np.int64),
        np.empty(BLOCK),
    )


@njit(inline="always", **_OPTS)
def block_exponentials(
    mu, v, n, s_lo, nb, x0, h, R, K, l2, with_var, j1, d1, j2, d2, args, ex, tbuf, ebuf
):
    """Anchors (``j1, d1``; ``j2, d2`` for the variance's half-spaced sum) and the progression
    exponentials ``ex`` of the ``nb`` rows from ``s_lo`` of unit ``n``, in one vectorised pass
    (shared by :func:`meanvar_fwd` and :func:`meanvar_bwd`)."""
    for r in range(nb):
        x = mu[s_lo + r, n] - x0
        vv = v[s_lo + r, n]
        j, d = anchor(x, h, R)
        j1[r] = j
        d1[r] = d
        progression_args(d, h, R, j, 2.0 * (l2 + vv), args, r, nb)
        if with_var:
            j, d = anchor(x, 0.5 * h, K)
            j2[r] = j
            d2[r] = d
            progression_args(d, 0.5 * h, K, j, l2 + 2.0 * vv, args, 4 * nb + r, nb)
    vexp(args, ex, (8 if with_var else 4) * nb, tbuf, ebuf)


#: Largest ``h^2 / (4 lambda^2)`` for which deterministic rows take :func:`deterministic_row`:
#: its odd midpoint Gaussians are ``c E_r E_{r+1}`` with ``c = exp(h^2 / (4 lambda^2))``, kept
#: below ``e^300`` (a lengthscale under 1/34.6 of the spacing falls back to the general rows).
DETERMINISTIC_MAX_SHIFT = 300.0


@njit(inline="always", **_OPTS)
def deterministic_setup(pc, h, l2, K, with_var):
    """One unit's set-up of :func:`deterministic_row`: whether its deterministic rows take it
    (``with_var`` and ``h^2 / (4 lambda^2) <= DETERMINISTIC_MAX_SHIFT``), the factor
    ``c_odd = exp(h^2 / (4 lambda^2))`` of the odd midpoints, and the weights ``pcw [K]``: the
    midpoint weights ``pc`` of ``C``, the odd ones times ``c_odd``."""
    shift = h * h / (4.0 * l2)
    det_unit = with_var and shift <= DETERMINISTIC_MAX_SHIFT
    c_odd = math.exp(shift) if det_unit else 0.0
    pcw = np.empty(K)
    if det_unit:
        for k in range(K):
            pcw[k] = pc[k] * c_odd if k % 2 else pc[k]
    return det_unit, c_odd, pcw


@njit(inline="always", **_OPTS)
def deterministic_row(x, h, R, j0, ex, off, nb, b, pcw, e, moments):
    """One deterministic activation (``v = 0``) at ``x`` (from the grid's origin): the mean
    function's Gaussians ``E_r = exp(-(x - r h)^2 / (2 lambda^2))`` into ``e`` by one
    progression (the exponentials ``ex[off + i nb]`` of :func:`progression_args`), the mean
    ``m = sum_r b_r E_r`` and the conditional variance's sum ``q = sum_k pc_k G_k`` over the
    ``2R - 1`` midpoints, whose Gaussians ``G_k = exp(-(x - k h / 2)^2 / lambda^2)`` are products
    of the mean's: ``G_{2r} = E_r^2``, ``G_{2r+1} = c_odd E_r E_{r+1}``
    (``c_odd = exp(h^2 / (4 lambda^2))``, folded into the weights ``pcw`` of
    :func:`deterministic_setup`). So the row needs the exponentials of one progression instead
    of two, and no quadrature node.

    Returns ``(m, m1, m2, q, q1, q2)``; with ``moments``, ``m_j = sum_r b_r E_r d_r^j``
    (``d_r = x - r h``) and ``q_j = sum_k pc_k G_k d_k^j`` (``d_k = x - k h / 2``), else zeros.
    The terms of ``q`` are added in the order of ``k`` (one chain: partial sums of the even and
    odd midpoints alone would each grow to the size of ``C``'s entries and cancel)."""
    E0 = ex[off]
    q_up = ex[off + nb]
    q_dn = ex[off + 2 * nb]
    rho = q_up * q_dn if (j0 < R - 1 and j0 > 0) else ex[off + 3 * nb]
    e[j0] = E0
    E = E0
    q = q_up
    for k in range(j0 + 1, R):
        E *= q
        q *= rho
        e[k] = E
    E = E0
    q = q_dn
    for k in range(j0 - 1, -1, -1):
        E *= q
        q *= rho
        e[k] = E
    m0 = 0.0
    m1 = 0.0
    m2 = 0.0
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    for r in range(R):
        E = e[r]
        t = b[r] * E
        m0 += t
        u = pcw[2 * r] * (E * E)
        s0 += u
        if moments:
            d = x - r * h
            t *= d
            m1 += t
            m2 += t * d
            u *= d
            s1 += u
            s2 += u * d
        if r < R - 1:
            u = pcw[2 * r + 1] * (E * e[r + 1])
            s0 += u
            if moments:
                d = x - (r + 0.5) * h
                u *= d
                s1 += u
                s2 += u * d
    return m0, m1, m2, s0, s1, s2


@njit(inline="always", **_OPTS)
def deterministic_accumulate(R, e, acc_b, coef_b, acc_q, coef_q):
    """The parameter gradients of :func:`deterministic_row`'s sums with the Gaussians ``e`` of
    one activation: ``acc_b[r] += coef_b E_r``, ``acc_q[k] += coef_q G_k / (c_odd if k odd)``
    (the caller multiplies the odd entries by ``c_odd``). Linear in the coefficients: a run of
    equal activations is accumulated once with their sums."""
    for r in range(R):
        E = e[r]
        acc_b[r] += coef_b * E
        acc_q[2 * r] += coef_q * (E * E)
        if r < R - 1:
            acc_q[2 * r + 1] += coef_q * (E * e[r + 1])


@njit(inline="always", **_OPTS)
def block_deterministic(v, n, s_lo, nb):
    """Whether every activation of the block's rows of unit ``n`` is deterministic (``v = 0``)."""
    for r in range(nb):
        if v[s_lo + r, n] != 0.0:
            return False
    return True


@njit(inline="always", **_OPTS)
def node_buffers(Q, R):
    """One unit's work arrays of the quadrature rows (up to ``Q`` nodes): the nodes' mean
    values and moments, the anchors of both sums, the exponent arguments, exponentials and
    :func:`vexp` scratch (``8 Q``), and the mean sums' exponentials ``[Q, R]``."""
    return (
        np.empty(Q),
        np.empty(Q),
        np.empty(Q),
        np.empty(Q, dtype=np.int64),
        np.empty(Q),
        np.empty(Q, dtype=np.int64),
        np.empty(Q),
        np.empty(8 * Q),
        np.empty(8 * Q),
        np.empty(8 * Q),
        np.empty(8 * Q, dtype=np.int64),
        np.empty((Q, R)),
    )


@njit(inline="always", **_OPTS)
def node_exponentials(x, sd, zs, lo, hi, h, R, K, l2, ja, da, jb, db, args, ex, tbuf, ebuf):
    """Anchors and progression exponentials of both Gaussian sums at the quadrature nodes
    ``x + sd zs[i]``, ``i = lo..hi - 1`` (node ``c = i - lo``): the mean's (spacing ``h``, ``R``
    centres, width ``2 lambda^2``) at ``ex[c + j nq]``, the conditional variance's (spacing
    ``h / 2``, ``K`` centres, width ``lambda^2``) at ``ex[4 nq + c + j nq]``, ``nq = hi - lo``,
    in one vectorised pass (as :func:`block_exponentials` for the rows)."""
    nq = hi - lo
    for c in range(nq):
        xi = x + sd * zs[lo + c]
        j, d = anchor(xi, h, R)
        ja[c] = j
        da[c] = d
        progression_args(d, h, R, j, 2.0 * l2, args, c, nq)
        j, d = anchor(xi, 0.5 * h, K)
        jb[c] = j
        db[c] = d
        progression_args(d, 0.5 * h, K, j, l2, args, 4 * nq + c, nq)
    vexp(args, ex, 8 * nq, tbuf, ebuf)


@njit(parallel=True, **_OPTS)
def meanvar_fwd(
    mu, v, V, lam, beta, P, PA, PC, zs, ws, offs, tier_r2, ratio2, err_scale, rtol, noise,
    with_var, mean, var, pre, how,
):  # fmt: skip
    """Means and variances. ``P`` midpoint weights of ``C - beta beta^T``, ``PA`` those of
    ``|C| + |beta| |beta|^T`` (the magnitudes of the closed form's terms), ``PC`` those of ``C``;
    ``zs``, ``ws`` the concatenated quadrature rules of the node tiers (tier ``t`` at
    ``offs[t]:offs[t + 1]``, for ``v / lambda^2 <= tier_r2[t]``).

    Per (sample, unit): the closed form ``1 - tr[(C - beta beta^T) Omega] - mean^2`` where the
    activation is broad (``v > ratio2 lambda^2``) or where its rounding-error bound
    ``err_scale (1 + tr[PA-terms] + mean^2)`` is at most ``rtol`` times its value (``how = 0``);
    otherwise quadrature with that row's node tier (``how = t + 1``), the exponentials of all
    its nodes' Gaussian sums evaluated together (:func:`node_exponentials`). Deterministic
    activations (``v = 0``) take the one-node rule by :func:`deterministic_row` (``how = 1``, as
    the first tier's one node) in units with ``h^2 / (4 lambda^2) <= DETERMINISTIC_MAX_SHIFT``.
    A row whose activation ``(mu, v)`` equals the previous row's of its unit copies its outputs."""
    S, N = mu.shape
    R = V.shape[1]
    K = P.shape[1]
    Q = largest_tier(offs)
    dummy = np.zeros(1)
    for n in prange(N):
        x0, h = grid_origin_spacing(V, n, R)
        l2 = unit_row(lam, n) ** 2
        b = unit_row(beta, n)
        p = unit_row(P, n)
        pa = unit_row(PA, n)
        pc = unit_row(PC, n)
        nz = unit_row(noise, n)
        mvals, args, ex, tbuf, ebuf, j1, d1, j2, d2 = row_buffers(Q)
        _, _, _, aj, ad, bj, bd, nargs, nex, ntbuf, nebuf, _ = node_buffers(Q, R)
        det_unit, _, pcw = deterministic_setup(pc, h, l2, K, with_var)
        dete = np.empty(R)
        for s_lo in range(0, S, BLOCK):
            nb = min(BLOCK, S - s_lo)
            # the block's exponentials (anchors and progression ratios of both sums) at once;
            # deterministic rows need the mean's only
            det_block = det_unit and block_deterministic(v, n, s_lo, nb)
            block_exponentials(
                mu, v, n, s_lo, nb, x0, h, R, K, l2, with_var and not det_block, j1, d1, j2, d2,
                args, ex, tbuf, ebuf,
            )  # fmt: skip
            for r in range(nb):
                s = s_lo + r
                m = mu[s, n]
                vv = v[s, n]
                if s > 0 and m == mu[s - 1, n] and vv == v[s - 1, n]:
                    # the previous row's activation (runs of them: a CNN's background)
                    mean[s, n] = mean[s - 1, n]
                    if with_var:
                        var[s, n] = var[s - 1, n]
                        pre[s, n] = pre[s - 1, n]
                        how[s, n] = how[s - 1, n]
                    continue
                x = m - x0
                if det_unit and vv == 0.0:
                    # deterministic: the one-node rule, 1 - alpha^T C alpha at the activation
                    # (no |beta|^2-sized terms to cancel), from the mean's exponentials
                    mn, _, _, qd, _, _ = deterministic_row(
                        x, h, R, j1[r], ex, r, nb, b, pcw, dete, False
                    )
                    mean[s, n] = mn
                    pr = 1.0 - qd
                    how[s, n] = 1
                    pre[s, n] = pr
                    var[s, n] = max(pr, 0.0) + nz
                    continue
                c1 = l2 + vv
                g0, _, _ = gsum_pre(
                    x, h, R, j1[r], d1[r], ex, r, nb, b, b, dummy, 0.0, False, False
                )
                mn = math.sqrt(l2 / c1) * g0
                mean[s, n] = mn
                if not with_var:
                    continue
                tier = row_rule(vv, l2, ratio2, tier_r2)
                c2 = l2 + 2.0 * vv
                a2 = math.sqrt(l2 / c2)
                t0, ta, _ = gsum_pre(
                    x, 0.5 * h, K, j2[r], d2[r], ex, 4 * nb + r, nb, p, pa, dummy, 0.0, False, True
                )
                pr = 1.0 - a2 * t0 - mn * mn
                if tier >= 0 and not err_scale * (1.0 + a2 * ta + mn * mn) <= rtol * pr:
                    # narrow and the closed form not provably accurate: quadrature over
                    # a = m + sqrt(v) z with this row's node tier
                    sd = math.sqrt(vv) if vv > 0.0 else 0.0
                    lo = offs[tier]
                    hi = offs[tier + 1]
                    mbar = 0.0
                    eq = 0.0
                    nq = hi - lo
                    node_exponentials(
                        x, sd, zs, lo, hi, h, R, K, l2, aj, ad, bj, bd, nargs, nex, ntbuf, nebuf
                    )
                    for i in range(lo, hi):
                        xi = x + sd * zs[i]
                        c = i - lo
                        mi, _, _ = gsum_pre(
                            xi, h, R, aj[c], ad[c], nex, c, nq, b, b, dummy, 0.0, False, False
                        )
                        qi, _, _ = gsum_pre(
                            xi, 0.5 * h, K, bj[c], bd[c], nex, 4 * nq + c, nq, pc, pc, dummy, 0.0,
                            False, False,
                        )  # fmt: skip
                        mvals[c] = mi
                        mbar += ws[i] * mi
                        eq += ws[i] * (1.0 - qi)
                    spread = 0.0
                    for i in range(lo, hi):
                        d = mvals[i - lo] - mbar
                        spread += ws[i] * d * d
                    pr = eq + spread
                    how[s, n] = tier + 1
                else:
                    how[s, n] = 0
                pre[s, n] = pr
                var[s, n] = max(pr, 0.0) + nz


@njit(parallel=True, **_OPTS)
def meanvar_bwd(
    mu, v, V, lam, beta, P, PC, zs, ws, offs, mean, pre, how, gmean, gvar, with_var,
    dmu, dv, dlam, dbeta, dP, dPC,
):  # fmt: skip
    """Gradients of :func:`meanvar_fwd`'s means and variances (``gmean``, ``gvar``) w.r.t. the
    activations (``dmu``, ``dv``), the lengthscales, ``beta`` and the midpoint weights ``P``,
    ``PC`` (accumulated per unit), each row by the path its forward took (``how``; deterministic
    rows by :func:`deterministic_row`, with ``d var / dv = m'(mu)^2 + s''(mu) / 2`` at ``v = 0``).
    A run of equal deterministic rows is evaluated once and its parameter gradient accumulated
    once with the run's summed coefficients (:func:`deterministic_accumulate`)."""
    S, N = mu.shape
    R = V.shape[1]
    K = P.shape[1]
    Q = largest_tier(offs)
    for n in prange(N):
        x0, h = grid_origin_spacing(V, n, R)
        lm = unit_row(lam, n)
        l2 = lm * lm
        b = unit_row(beta, n)
        p = unit_row(P, n)
        pc = unit_row(PC, n)
        acc_b = dbeta[n]
        acc_p = dP[n]
        acc_pc = dPC[n]
        acc_l2 = 0.0
        mvals, args, ex, tbuf, ebuf, j1, d1, j2, d2 = row_buffers(Q)
        m1vals, m2vals, _, aj, ad, bj, bd, nargs, nex, ntbuf, nebuf, evals = node_buffers(Q, R)
        det_unit, c_odd, pcw = deterministic_setup(pc, h, l2, K, with_var)
        il2 = 1.0 / l2
        acc_q = np.zeros(K)  # the deterministic rows' gradient of PC, odd entries over c_odd
        dete = np.empty(R)  # the last deterministic row's Gaussians
        have = False  # dete holds a row's Gaussians, pending with the coefficients below
        pend_b = 0.0
        pend_q = 0.0
        dm0 = dm1 = dm2 = dq0 = dq1 = dq2 = 0.0  # that row's sums and moments
        for s_lo in range(0, S, BLOCK):
            nb = min(BLOCK, S - s_lo)
            # the block's exponentials (anchors and progression ratios of both sums) at once;
            # deterministic rows need the mean's only
            det_block = det_unit and block_deterministic(v, n, s_lo, nb)
            block_exponentials(
                mu, v, n, s_lo, nb, x0, h, R, K, l2, with_var and not det_block, j1, d1, j2, d2,
                args, ex, tbuf, ebuf,
            )  # fmt: skip
            for r in range(nb):
                s = s_lo + r
                m = mu[s, n]
                vv = v[s, n]
                x = m - x0
                gm = gmean[s, n]
                if det_unit and vv == 0.0:
                    # deterministic_row's mean m(x) and conditional variance s(x) = 1 - q(x);
                    # d var / dv at v = 0 is m'(x)^2 + s''(x) / 2 (Var[m(a)] and E[s(a)] to
                    # first order in v)
                    G = gvar[s, n] if pre[s, n] >= 0.0 else 0.0
                    if not (s > 0 and m == mu[s - 1, n] and v[s - 1, n] == 0.0):
                        # a new activation (not the previous row's: runs of equal activations,
                        # as a CNN's background, share one evaluation and one accumulation)
                        if have:
                            deterministic_accumulate(R, dete, acc_b, pend_b, acc_q, pend_q)
                        dm0, dm1, dm2, dq0, dq1, dq2 = deterministic_row(
                            x, h, R, j1[r], ex, r, nb, b, pcw, dete, True
                        )
                        have = True
                        pend_b = 0.0
                        pend_q = 0.0
                    pend_b += gm
                    pend_q -= G
                    dmu[s, n] = il2 * (2.0 * G * dq1 - gm * dm1)
                    dv[s, n] = gm * il2 * (0.5 * dm2 * il2 - 0.5 * dm0) + G * il2 * (
                        dm1 * dm1 * il2 + dq0 - 2.0 * dq2 * il2
                    )
                    acc_l2 += (0.5 * gm * dm2 - G * dq2) * il2 * il2
                    continue
                G = 0.0
                tier = -1
                if with_var:
                    if pre[s, n] >= 0.0:
                        G = gvar[s, n]
                    tier = how[s, n] - 1
                    if tier < 0:
                        gm -= 2.0 * G * mean[s, n]
                c1 = l2 + vv
                a1 = math.sqrt(l2 / c1)
                g0, g1, g2 = gsum_pre(
                    x, h, R, j1[r], d1[r], ex, r, nb, b, b, acc_b, gm * a1, True, False
                )
                # d mean / d (mu, v, lambda^2)
                ic1 = 1.0 / c1
                half = 0.5 * a1 * g2 * ic1 * ic1
                gmu = gm * (-a1 * g1 * ic1)
                gv = gm * (-0.5 * a1 * g0 * ic1 + half)
                gl2 = gm * (0.5 * a1 * g0 * (1.0 / l2 - ic1) + half)
                if with_var and G != 0.0:
                    if tier >= 0:
                        sd = math.sqrt(vv) if vv > 0.0 else 0.0
                        lo = offs[tier]
                        hi = offs[tier + 1]
                        mbar = 0.0
                        da_sum = 0.0
                        dz_sum = 0.0
                        q0 = 0.0
                        q2 = 0.0
                        nq = hi - lo
                        node_exponentials(
                            x, sd, zs, lo, hi, h, R, K, l2, aj, ad, bj, bd, nargs, nex, ntbuf,
                            nebuf,
                        )  # fmt: skip
                        for i in range(lo, hi):
                            xi = x + sd * zs[i]
                            c = i - lo
                            # the node's mean sum, its moments and exponentials (for the spread)
                            e_i = evals[c]
                            for k in range(R):
                                e_i[k] = 0.0
                            mi, m1, m2 = gsum_pre(
                                xi, h, R, aj[c], ad[c], nex, c, nq, b, b, e_i, 1.0, True, False
                            )
                            q0, q1, q2 = gsum_pre(
                                xi, 0.5 * h, K, bj[c], bd[c], nex, 4 * nq + c, nq, pc, pc, acc_pc,
                                -G * ws[i], True, False,
                            )  # fmt: skip
                            mvals[c] = mi
                            m1vals[c] = m1
                            m2vals[c] = m2
                            mbar += ws[i] * mi
                            # -w_i dq_i/da = 2 w_i q1 / l2 ; -w_i dq_i/dl2 = -w_i q2 / l2^2
                            da = 2.0 * ws[i] * q1 / l2
                            da_sum += da
                            dz_sum += da * zs[i]
                            gl2 -= G * ws[i] * q2 / (l2 * l2)
                        if hi - lo > 1:  # one node: no spread
                            for i in range(lo, hi):
                                c = i - lo
                                coef = 2.0 * ws[i] * (mvals[c] - mbar)
                                # the mean sum's gradient: its exponentials, recorded above
                                gc = G * coef
                                e_i = evals[c]
                                for k in range(R):
                                    acc_b[k] += gc * e_i[k]
                                m1 = m1vals[c]
                                m2 = m2vals[c]
                                da = -coef * m1 / l2
                                da_sum += da
                                dz_sum += da * zs[i]
                                gl2 += G * coef * m2 / (2.0 * l2 * l2)
                        gmu += G * da_sum
                        if sd > 0.0:
                            gv += G * dz_sum / (2.0 * sd)
                        elif hi - lo == 1:
                            # v = 0 (a unit without deterministic_row): the slope
                            # m'(x)^2 + s''(x) / 2 that the node's sqrt(v) does not carry
                            mp = m1vals[0] / l2
                            gv += G * (mp * mp + (q0 - 2.0 * q2 / l2) / l2)
                    else:
                        c2 = l2 + 2.0 * vv
                        a2 = math.sqrt(l2 / c2)
                        gt = -G
                        t0, t1, t2 = gsum_pre(
                            x, 0.5 * h, K, j2[r], d2[r], ex, 4 * nb + r, nb, p, p, acc_p,
                            gt * a2, True, False,
                        )  # fmt: skip
                        ic2 = 1.0 / c2
                        dt_c2 = -0.5 * a2 * t0 * ic2 + a2 * t2 * ic2 * ic2
                        gmu += gt * (-2.0 * a2 * t1 * ic2)
                        gv += gt * (2.0 * dt_c2)
                        gl2 += gt * (0.5 * a2 * t0 / l2 + dt_c2)
                dmu[s, n] = gmu
                dv[s, n] = gv
                acc_l2 += gl2
        if have:
            deterministic_accumulate(R, dete, acc_b, pend_b, acc_q, pend_q)
        if det_unit:
            for k in range(K):
                acc_pc[k] += acc_q[k] * c_odd if k % 2 else acc_q[k]
        dlam[n] = 2.0 * lm * acc_l2


@njit(**_OPTS)
def midpoint_weights(C, beta, lam, V, P, magnitudes):
    """Midpoint weights ``P [G, 2R - 1]`` of ``C - beta beta^T`` (or, with ``magnitudes``, of
    ``|C| + |beta| |beta|^T``: the magnitudes of the closed-form variance's terms, for its
    rounding-error bound; not differentiated)."""
    G, K = P.shape
    R = V.shape[1]
    for n in range(G):
        c = unit_row(C, n)
        b = unit_row(beta, n)
        lm = unit_row(lam, n)
        _, h = grid_origin_spacing(V, n, R)
        a = h * h / (4.0 * lm * lm)
        for k in range(K):
            P[n, k] = 0.0
        for r in range(R):
            for t in range(R):
                j = r - t
                if magnitudes:
                    term = abs(c[r, t]) + abs(b[r] * b[t])
                else:
                    term = c[r, t] - b[r] * b[t]
                P[n, r + t] += term * math.exp(-a * j * j)


@njit(**_OPTS)
def midpoint_fwd(C, beta, lam, V, P):
    midpoint_weights(C, beta, lam, V, P, False)


@njit(**_OPTS)
def midpoint_abs(C, beta, lam, V, PA):
    """:func:`midpoint_weights` of the terms' magnitudes."""
    midpoint_weights(C, beta, lam, V, PA, True)


@njit(**_OPTS)
def midpoint_bwd(C, beta, lam, V, gP, dC, dbeta, dlam):
    G, K = gP.shape
    R = V.shape[1]
    for n in range(G):
        c = unit_row(C, n)
        b = unit_row(beta, n)
        lm = unit_row(lam, n)
        _, h = grid_origin_spacing(V, n, R)
        a = h * h / (4.0 * lm * lm)
        gl = 0.0
        for r in range(R):
            db = 0.0
            for t in range(R):
                j = r - t
                d = math.exp(-a * j * j)
                g = gP[n, r + t] * d
                dC[n, r, t] = g
                db -= 2.0 * g * b[t]
                gl += g * (c[r, t] - b[r] * b[t]) * 2.0 * a * j * j / lm
            dbeta[n, r] = db
        dlam[n] = gl


@njit(**_OPTS)
def vow_fwd(V, U, Svar, lam, jitter, kappa, beta):
    G, R = U.shape
    A = np.empty((R, R))
    L = np.empty((R, R))
    Li = np.empty((R, R))
    for n in range(G):
        lm = lam[n]
        for r in range(R):
            for t in range(R):
                d = V[n, r] - V[n, t]
                A[r, t] = math.exp(-0.5 * d * d / (lm * lm))
            A[r, r] += Svar[n, r] + jitter
        # beta = A^-1 U through the Cholesky factor; kappa = A^-1 (LU inverse, symmetrised)
        if not cholesky_solve(A, L, U[n], beta[n], R):
            return False
        symmetric_inverse(A, Li, kappa[n], R)
    return True


@njit(**_OPTS)
def vow_bwd(V, U, lam, kappa, beta, gK, gb, dU, dS, dlam):
    G, R = U.shape
    M = np.empty((R, R))
    T = np.empty((R, R))
    for n in range(G):
        lm = lam[n]
        # M = sym(gK + gb U^T)
        for r in range(R):
            for t in range(R):
                M[r, t] = 0.5 * (
                    gK[n, r, t] + gK[n, t, r] + gb[n, r] * U[n, t] + gb[n, t] * U[n, r]
                )
        for r in range(R):
            s = 0.0
            for t in range(R):
                s += kappa[n, r, t] * gb[n, t]
            dU[n, r] = s
        # dA = -kappa M kappa
        for r in range(R):
            for t in range(R):
                s = 0.0
                for k in range(R):
                    s += kappa[n, r, k] * M[k, t]
                T[r, t] = s
        gl = 0.0
        for r in range(R):
            for t in range(R):
                s = 0.0
                for k in range(R):
                    s += T[r, k] * kappa[n, k, t]
                if r == t:
                    dS[n, r] = -s
                else:
                    d = V[n, r] - V[n, t]
                    d2 = d * d / (lm * lm)
                    gl -= s * math.exp(-0.5 * d2) * d2 / lm
        dlam[n] = gl


def _serial(dispatcher):
    """The kernel of ``dispatcher`` compiled without ``parallel`` (``prange`` runs as ``range``),
    under its own name so that its on-disk cache entry does not collide with the parallel one."""
    f = dispatcher.py_func
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__ + "_serial", f.__defaults__)
    g.__qualname__ = f.__qualname__ + "_serial"
    g.__doc__ = f.__doc__
    return njit(**_OPTS)(g)


meanvar_fwd_serial = _serial(meanvar_fwd)
meanvar_bwd_serial = _serial(meanvar_bwd)
