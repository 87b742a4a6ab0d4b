"""Attempt (2026-11-25, measured, not adopted; docs/results/layer_speed.md): every Gaussian of a
row's two sums by one vectorised exponential (``vexp``) instead of the row kernels' geometric
walk from the nearest centre. The closed-form mean and variance sums only (no rounding-error
rule, no Gauss-Hermite rows), 256 rows x 50 units, R = 14, one thread, side by side in one
process::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python docs/results/attempts/direct_exponentials.py
"""

import math
import time

import numpy as np
from numba import njit

from pyro_gpn.moments import _numba_kernels as K

OPTS = {"cache": False, "nogil": True, "error_model": "numpy", "fastmath": {"contract"}}


@njit(**OPTS)
def walk(mu, v, x0, h, R, l2, b, p, pa, mean, var):
    """The package's way: the block's anchors and ratios by ``vexp``, then the walks."""
    S, N = mu.shape
    Kk = 2 * R - 1
    dummy = np.zeros(1)
    _, args, ex, tbuf, ebuf, j1, d1, j2, d2 = K.row_buffers(4)
    for n in range(N):
        for s_lo in range(0, S, K.BLOCK):
            nb = min(K.BLOCK, S - s_lo)
            K.block_exponentials(
                mu, v, n, s_lo, nb, x0, h, R, Kk, l2, True, j1, d1, j2, d2, args, ex, tbuf, ebuf
            )
            for r in range(nb):
                s = s_lo + r
                x = mu[s, n] - x0
                vv = v[s, n]
                g0, _, _ = K.gsum_pre(
                    x, h, R, j1[r], d1[r], ex, r, nb, b, b, dummy, 0.0, False, False
                )
                mn = math.sqrt(l2 / (l2 + vv)) * g0
                mean[s, n] = mn
                t0, ta, _ = K.gsum_pre(
                    x, 0.5 * h, Kk, j2[r], d2[r], ex, 4 * nb + r, nb, p, pa, dummy, 0.0, False, True
                )
                var[s, n] = 1.0 - math.sqrt(l2 / (l2 + 2.0 * vv)) * t0 - mn * mn + 1e-30 * ta


@njit(**OPTS)
def direct(mu, v, x0, h, R, l2, b, p, pa, mean, var):
    """Every Gaussian of the block's rows by ``vexp``, summed by loops over the rows."""
    S, N = mu.shape
    Kk = 2 * R - 1
    B = K.BLOCK
    M = (R + Kk) * B
    args, ex, tbuf = np.empty(M), np.empty(M), np.empty(M)
    ebuf = np.empty(M, dtype=np.int64)
    g0, t0, ta = np.empty(B), np.empty(B), np.empty(B)
    x, i1, i2 = np.empty(B), np.empty(B), np.empty(B)
    for n in range(N):
        for s_lo in range(0, S, B):
            nb = min(B, S - s_lo)
            for r in range(nb):
                x[r] = mu[s_lo + r, n] - x0
                vv = v[s_lo + r, n]
                i1[r] = -1.0 / (2.0 * (l2 + vv))
                i2[r] = -1.0 / (l2 + 2.0 * vv)
            for k in range(R):
                for r in range(nb):
                    e = x[r] - k * h
                    args[k * nb + r] = e * e * i1[r]
            off = R * nb
            for k in range(Kk):
                for r in range(nb):
                    e = x[r] - 0.5 * k * h
                    args[off + k * nb + r] = e * e * i2[r]
            K.vexp(args, ex, (R + Kk) * nb, tbuf, ebuf)
            for r in range(nb):
                g0[r] = 0.0
                t0[r] = 0.0
                ta[r] = 0.0
            for k in range(R):
                for r in range(nb):
                    g0[r] += b[k] * ex[k * nb + r]
            for k in range(Kk):
                for r in range(nb):
                    e = ex[off + k * nb + r]
                    t0[r] += p[k] * e
                    ta[r] += pa[k] * e
            for r in range(nb):
                s = s_lo + r
                vv = v[s, n]
                mn = math.sqrt(l2 / (l2 + vv)) * g0[r]
                mean[s, n] = mn
                var[s, n] = 1.0 - math.sqrt(l2 / (l2 + 2.0 * vv)) * t0[r] - mn * mn + 1e-30 * ta[r]


def main() -> None:
    rng = np.random.default_rng(0)
    S, N, R = 256, 50, 14
    mu = rng.normal(size=(S, N)) * 1.5 + 2.0
    v = rng.uniform(0.05, 0.5, size=(S, N))
    x0, h, l2 = 0.0, 4.0 / 13, 0.16
    b = rng.normal(size=R)
    p = rng.normal(size=2 * R - 1) * 0.1
    pa = np.abs(p)
    m1, v1, m2, v2 = (np.empty((S, N)) for _ in range(4))
    walk(mu, v, x0, h, R, l2, b, p, pa, m1, v1)
    direct(mu, v, x0, h, R, l2, b, p, pa, m2, v2)
    print("max diff mean", np.abs(m1 - m2).max(), "var", np.abs(v1 - v2).max())
    for _ in range(3):
        for name, f in (("walk", walk), ("direct", direct)):
            t = time.perf_counter()
            for _ in range(200):
                f(mu, v, x0, h, R, l2, b, p, pa, m1, v1)
            dt = (time.perf_counter() - t) / 200
            print(name, f"{dt * 1e9 / (S * N):.1f} ns/elem")


if __name__ == "__main__":
    main()
