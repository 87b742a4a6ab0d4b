"""Numba kernels of :mod:`pyro_gpn.moments.cpu_unscented` (imported on first use: imports numba).

All arrays float64 and C-contiguous. Point ``i`` of sample ``s`` has the logits
``centre[s] + sign_i * scale * sd[s, j_i] * W[j_i]``: ``i = 0`` the centre (sign 0),
``i = 1..N`` the ``+`` points (``j_i = i - 1``), ``i = N+1..2N`` the ``-`` points
(``j_i = i - N - 1``).
"""

# ruff: noqa: E501
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._numba_kernels import vexp

_OPTS = {"cache": True, "nogil": True, "error_model": "numpy", "fastmath": {"contract"}}


@njit(inline="always", **_OPTS)
def _point(i, N):
    """Feature index and sign of sigma point ``i``."""
    if i == 0:
        return 0, 0.0
    if i <= N:
        return i - 1, 1.0
    return i - N - 1, -1.0


@njit(**_OPTS)
def unscented_ce_fwd(centre, sd, W, target, scale, w0, w1, predictive, loss, probs, resp):
    """Per sample, from the cross-entropies ``CE_i`` of the points' logits against ``target[s]``:
    ``loss[s] = w0 CE_0 + w1 sum_{i >= 1} CE_i`` (the expected cross-entropy), or with
    ``predictive`` ``loss[s] = -log sum_i w_i exp(-CE_i)`` (the negative log of the averaged
    softmax; weights not negative). Also the points' softmax ``probs [S, 2N+1, C]`` and
    ``resp [S, 2N+1]``, ``d loss[s] / d CE_i``: the weights, or the points' shares
    ``w_i exp(-CE_i) / sum_j w_j exp(-CE_j)`` of the averaged probability."""
    S, C = centre.shape
    N = sd.shape[1]
    P = 2 * N + 1
    n = P * C
    logits = np.empty(n)
    args = np.empty(n)
    ex = np.empty(n)
    tbuf = np.empty(n)
    ebuf = np.empty(n, dtype=np.int64)
    top = np.empty(P)
    ce = np.empty(P)
    for s in range(S):
        for i in range(P):
            j, sign = _point(i, N)
            a = sign * scale * sd[s, j]
            m = -np.inf
            for c in range(C):
                z = centre[s, c] + a * W[j, c]
                logits[i * C + c] = z
                if z > m:
                    m = z
            top[i] = m
            for c in range(C):
                args[i * C + c] = logits[i * C + c] - m
        vexp(args, ex, n, tbuf, ebuf)
        t = target[s]
        for i in range(P):
            z = 0.0
            for c in range(C):
                z += ex[i * C + c]
            inv = 1.0 / z
            for c in range(C):
                probs[s, i, c] = ex[i * C + c] * inv
            ce[i] = top[i] + math.log(z) - logits[i * C + t]
        if not predictive:
            total = 0.0
            for i in range(P):
                wi = w0 if i == 0 else w1
                total += wi * ce[i]
                resp[s, i] = wi
            loss[s] = total
            continue
        # -log sum_i w_i exp(-CE_i) by a log-sum-exp over the points with w_i > 0
        m = -np.inf
        for i in range(P):
            wi = w0 if i == 0 else w1
            if wi > 0.0 and -ce[i] > m:
                m = -ce[i]
        z = 0.0
        for i in range(P):
            wi = w0 if i == 0 else w1
            e = wi * math.exp(-ce[i] - m) if wi > 0.0 else 0.0
            resp[s, i] = e
            z += e
        for i in range(P):
            resp[s, i] /= z
        loss[s] = -(m + math.log(z))


@njit(**_OPTS)
def unscented_ce_bwd(sd, W, target, scale, resp, probs, gout, dcentre, dsd, dW):
    """Gradients of ``sum_s gout[s] loss[s]`` (either loss of :func:`unscented_ce_fwd`, through
    its ``resp``): ``dcentre [S, C]``, ``dsd [S, N]`` and the direct part ``dW [N, C]``
    (through the points' offsets; ``dW`` accumulated, zero it first)."""
    S, C = dcentre.shape
    N = sd.shape[1]
    P = 2 * N + 1
    for s in range(S):
        t = target[s]
        for c in range(C):
            dcentre[s, c] = 0.0
        for j in range(N):
            dsd[s, j] = 0.0
        for i in range(P):
            j, sign = _point(i, N)
            wi = gout[s] * resp[s, i]
            if wi == 0.0:
                continue
            a = sign * scale * sd[s, j]
            acc = 0.0
            for c in range(C):
                g = wi * (probs[s, i, c] - (1.0 if c == t else 0.0))
                dcentre[s, c] += g
                acc += g * W[j, c]
                dW[j, c] += a * g
            dsd[s, j] += sign * scale * acc
