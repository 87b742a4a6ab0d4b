"""Accuracy of the closed-form GPN moments against an independent quadrature reference.

For one GPN unit with ``R = 14`` equally spaced inducing points on ``[-2, 2]`` (spacing
``h = 4/13``), targets ``U`` (smooth: ``tanh(V)``; rough: standard normal draws), target
variances ``S`` and lengthscale ``lambda``, and a Gaussian activation ``a ~ N(mu, v)``, the
output ``f`` of the unit has

    E[f] = E[m(a)],   Var[f] = E[1 - alpha(a)^T kappa alpha(a)] + Var[m(a)],
    m(a) = alpha(a)^T beta,   beta = kappa U,   kappa = (K(V, V) + diag(S))^-1.

**Reference** (independent of the library): ``kappa`` and ``beta`` solved in mpmath at 50
digits, the integrands ``m(a)`` and ``1 - alpha^T kappa alpha`` evaluated in numpy
``longdouble`` (64-bit mantissa) and integrated by ``scipy.integrate.quad`` over
``z = (a - mu) / sqrt(v)`` with break points at the inducing points (``v = 0``: the integrands
at ``mu``). The variance is integrated centred, ``E[(m - E m)^2]``. For a pair of units with
covariance, ``Cov[f_n, f_m] = E[(m_n(a_n) - E m_n) (E[m_m(a_m) | a_n] - E m_m)]``, with the
inner conditional expectation in closed form (a linear form in ``beta``, longdouble) and the
outer by quad. The reference is cross-checked against the closed form evaluated in mpmath.

**Subjects**: the library's :func:`pyro_gpn.moments.virtual_observation_weights` and
:func:`pyro_gpn.moments.response_moments` (``"meanvar"`` and ``"cov"``), from parameters rounded
to the compute dtype, against the *old* algebra (the closed form before issue 13, reproduced
below: ``kappa`` by an explicit inverse, ``1 - tr[(kappa - beta beta^T) Omega] - mu^2``, the
three factors of ``Lambda`` exponentiated separately).

**Error measures**: mean: ``|err| / (|E f| + sd f)`` (the output's own scale: the mean of a unit
far outside the inducing range is ~0); variance: relative, ``|err| / Var f``; covariance:
``|err| / (sd f_n sd f_m)`` (an error in correlation units). NaN or inf counts as error 1.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/accuracy_grid.py grid --out /tmp/accuracy.json
    OMP_NUM_THREADS=1 python benchmarks/accuracy_grid.py table --results /tmp/accuracy.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass

import mpmath
import numpy as np
import scipy.integrate
import scipy.special
import torch

from pyro_gpn.moments import Moments, response_moments, virtual_observation_weights

NUM_INDUCING = 14
SPACING = 4.0 / (NUM_INDUCING - 1)
LD = np.longdouble

LENGTHSCALES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.2, 2.0, 5.0)
TARGET_VARIANCES = (1e-1, 1e-2, 1e-3, 1e-4, 1e-6)
INPUT_VARIANCES = (0.0, 1e-8, 0.05, 1.0, 10.0)
MEANS = (-20.0, -6.0, -1.1, 0.3, 2.5, 6.0)
CORRELATIONS = (-0.999, -0.9, 0.0, 0.5, 0.99, 0.999)
TARGET_KINDS = ("smooth", "rough")
#: old: before issue 13; new: with the Cholesky factor (parametric GPN); newC: with an
#: explicit ``C`` only (what the variational GPN passes)
ALGEBRAS = ("old", "new", "newC")


# ----------------------------------------------------------------------------- the reference
def inducing_points() -> np.ndarray:
    return np.linspace(-2.0, 2.0, NUM_INDUCING)


def make_targets(kind: str, points: np.ndarray, seed: int = 0) -> np.ndarray:
    if kind == "smooth":
        return np.tanh(points)
    if kind == "rough":
        return np.random.default_rng(seed).standard_normal(points.shape)
    raise ValueError(f"kind must be one of {TARGET_KINDS}, got {kind!r}")


@dataclass(frozen=True)
class Unit:
    """One GPN unit's parameters, exactly as the evaluated dtype holds them (float64 values)."""

    points: tuple[float, ...]
    targets: tuple[float, ...]
    variances: tuple[float, ...]
    lengthscale: float

    @staticmethod
    def make(lengthscale: float, variance: float, kind: str, dtype: torch.dtype) -> Unit:
        points = inducing_points()
        targets = make_targets(kind, points)
        variances = np.full_like(points, variance)

        def rounded(x):
            return tuple(torch.as_tensor(x).to(dtype).double().reshape(-1).tolist())

        return Unit(rounded(points), rounded(targets), rounded(variances), rounded(lengthscale)[0])


@functools.lru_cache(maxsize=256)
def reference_weights_mp(unit: Unit) -> tuple[mpmath.matrix, mpmath.matrix]:
    """``beta`` and ``kappa`` solved in mpmath at 50 digits."""
    with mpmath.workdps(50):
        pts = [mpmath.mpf(p) for p in unit.points]
        ls2 = mpmath.mpf(unit.lengthscale) ** 2
        gram = mpmath.matrix(len(pts), len(pts))
        for r, t in itertools.product(range(len(pts)), repeat=2):
            gram[r, t] = mpmath.exp(-((pts[r] - pts[t]) ** 2) / (2 * ls2))
            if r == t:
                gram[r, t] += mpmath.mpf(unit.variances[r])
        kappa = gram**-1
        beta = kappa * mpmath.matrix([mpmath.mpf(u) for u in unit.targets])
    return beta, kappa


@functools.lru_cache(maxsize=256)
def reference_beta(unit: Unit) -> np.ndarray:
    """``beta`` of :func:`reference_weights_mp` as a longdouble array."""
    beta, _ = reference_weights_mp(unit)
    return np.array([LD(mpmath.nstr(b, 30)) for b in beta], dtype=LD)


def _alpha(a: np.ndarray, unit: Unit) -> np.ndarray:
    pts = np.array(unit.points, dtype=LD)
    ls = LD(unit.lengthscale)
    return np.exp(-((np.asarray(a, dtype=LD)[..., None] - pts) ** 2) / (2 * ls * ls))


def _mean_fn(a, unit: Unit) -> np.ndarray:
    """``m(a) = alpha(a)^T beta`` in longdouble (error ~1e-19 |beta|, a linear form)."""
    return _alpha(a, unit) @ reference_beta(unit)


@functools.lru_cache(maxsize=8)
def _legendre(order: int) -> tuple[np.ndarray, np.ndarray]:
    nodes, weights = scipy.special.roots_legendre(order)
    return nodes.astype(LD), weights.astype(LD)


def _gauss_nodes(mu: float, v: float, lengthscale: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``a`` and weights (summing to ~1) of composite 20-point Gauss-Legendre on
    ``z = (a - mu) / sqrt(v)`` in ``[-13, 13]``, panels no wider than ``lambda / (2 sqrt v)``
    (a kernel bump is resolved by >= 2 panels)."""
    sd = math.sqrt(v)
    half = 13.0
    panels = int(min(40000, max(52, math.ceil(2 * half / (0.5 * lengthscale / sd)))))
    edges = np.linspace(-half, half, panels + 1).astype(LD)
    nodes, weights = _legendre(20)
    mid, rad = (edges[1:] + edges[:-1]) / 2, (edges[1:] - edges[:-1]) / 2
    z = (mid[:, None] + rad[:, None] * nodes).reshape(-1)
    w = (rad[:, None] * weights).reshape(-1) * np.exp(-z * z / 2) / np.sqrt(2 * LD(math.pi))
    return LD(mu) + LD(sd) * z, w


def expected_cond_var_mp(unit: Unit, mu: float, v: float) -> float:
    """``E[1 - alpha(a)^T kappa alpha(a)] = 1 - sum_rt kappa_rt E[alpha_r alpha_t]`` at 50
    digits (the elementary Gaussian integral ``E[alpha_r alpha_t]``, ``eq:gpn_normal_omega``)."""
    _, kappa = reference_weights_mp(unit)
    with mpmath.workdps(50):
        ls2 = mpmath.mpf(unit.lengthscale) ** 2
        pts = [mpmath.mpf(p) for p in unit.points]
        mu, v = mpmath.mpf(mu), mpmath.mpf(v)
        c2 = ls2 + 2 * v
        amp = mpmath.sqrt(ls2 / c2)
        total = mpmath.mpf(0)
        for r, t in itertools.product(range(len(pts)), repeat=2):
            total += (
                kappa[r, t]
                * amp
                * mpmath.exp(
                    -((mu - (pts[r] + pts[t]) / 2) ** 2) / c2 - (pts[r] - pts[t]) ** 2 / (4 * ls2)
                )
            )
        return float(1 - total)


def reference_meanvar(unit: Unit, mu: float, v: float) -> tuple[float, float]:
    """Reference ``E[f]`` and ``Var[f]`` (noise-free) for ``a ~ N(mu, v)``.

    ``E[m]`` and ``Var[m] = E[(m - E m)^2]`` by composite Gauss-Legendre quadrature of the
    longdouble mean function; ``E[1 - alpha^T kappa alpha]`` at 50 digits.
    """
    cond = expected_cond_var_mp(unit, mu, v)
    if v == 0:
        beta, _ = reference_weights_mp(unit)
        with mpmath.workdps(50):
            ls2 = mpmath.mpf(unit.lengthscale) ** 2
            mean = mpmath.fsum(
                b * mpmath.exp(-((mpmath.mpf(mu) - p) ** 2) / (2 * ls2))
                for b, p in zip(beta, unit.points)
            )
        return float(mean), cond
    a, w = _gauss_nodes(mu, v, unit.lengthscale)
    m = _mean_fn(a, unit)
    mean = w @ m
    return float(mean), float(w @ (m - mean) ** 2) + cond


def reference_cov(unit_n: Unit, unit_m: Unit, mu: tuple[float, float], cov: np.ndarray) -> float:
    """Reference ``Cov[f_n, f_m]`` for ``(a_n, a_m) ~ N(mu, cov)`` (distinct units, so the
    conditional variances are independent): ``E[(m_n(a_n) - E m_n)(E[m_m | a_n] - E m_m)]``
    by composite Gauss-Legendre over ``a_n``, the inner expectation in closed form."""
    beta_m = reference_beta(unit_m)
    pts_m = np.array(unit_m.points, dtype=LD)
    ls2 = LD(unit_m.lengthscale) ** 2
    slope = LD(cov[0, 1]) / LD(cov[0, 0])
    cond_var = max(LD(cov[1, 1]) - LD(cov[0, 1]) * slope, LD(0))
    a, w = _gauss_nodes(mu[0], cov[0, 0], min(unit_n.lengthscale, unit_m.lengthscale))
    centre = LD(mu[1]) + slope * (a - LD(mu[0]))
    width = ls2 + cond_var
    inner = (np.sqrt(ls2 / width) * np.exp(-((centre[:, None] - pts_m) ** 2) / (2 * width))
             ) @ beta_m  # fmt: skip
    m_n = _mean_fn(a, unit_n)
    return float(w @ ((m_n - w @ m_n) * (inner - w @ inner)))


def quad_meanvar(unit: Unit, mu: float, v: float) -> tuple[float, float]:
    """``E[m]`` and ``Var[m]`` by adaptive ``scipy.integrate.quad``: a check of the composite
    rule (slower)."""
    sd = math.sqrt(v)
    breaks = [(p - mu) / sd for p in unit.points if abs(p - mu) / sd < 12]

    def expect(fn):
        def integrand(z):
            val = fn(np.array([mu + sd * z]))[0]
            return float(val) * math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)

        return scipy.integrate.quad(integrand, -12, 12, points=breaks or None, epsabs=0,
                                    epsrel=1e-11, limit=400 + int(50 * sd / unit.lengthscale)
                                    )[0]  # fmt: skip

    mean = expect(lambda a: _mean_fn(a, unit))
    return mean, expect(lambda a: (_mean_fn(a, unit) - LD(mean)) ** 2)


def mpmath_closed_form(unit: Unit, mu: float, v: float) -> tuple[float, float]:
    """The closed form (``eq:gpn_normal_mu``, ``eq:gpn_normal_Sigmatilde``) at 50 digits: a
    cross-check of the quadrature reference."""
    beta, kappa = reference_weights_mp(unit)
    with mpmath.workdps(50):
        ls2 = mpmath.mpf(unit.lengthscale) ** 2
        pts = [mpmath.mpf(p) for p in unit.points]
        mu, v = mpmath.mpf(mu), mpmath.mpf(v)
        c = ls2 + v
        psi = [mpmath.sqrt(ls2 / c) * mpmath.exp(-((mu - p) ** 2) / (2 * c)) for p in pts]
        mean = mpmath.fsum(beta[r] * psi[r] for r in range(len(pts)))
        c2 = ls2 + 2 * v
        trace = 0
        for r, t in itertools.product(range(len(pts)), repeat=2):
            omega = mpmath.sqrt(ls2 / c2) * mpmath.exp(
                -((mu - (pts[r] + pts[t]) / 2) ** 2) / c2 - (pts[r] - pts[t]) ** 2 / (4 * ls2)
            )
            trace += (kappa[r, t] - beta[r] * beta[t]) * omega
        return float(mean), float(1 - trace - mean**2)


# ----------------------------------------------------------------------------- the subjects
def _tensors(unit: Unit, dtype: torch.dtype):
    def t(x):
        return torch.tensor(x, dtype=dtype).reshape(1, -1)

    return t(unit.points), t(unit.targets), t(unit.variances), t([unit.lengthscale]).reshape(1)


def old_weights(points, targets, variances, ls):
    """``virtual_observation_weights`` before issue 13: an explicit inverse."""
    diff = points.unsqueeze(-1) - points.unsqueeze(-2)
    gram = (-0.5 * (diff / ls[..., None, None]).square()).exp() + torch.diag_embed(variances)
    kappa = torch.linalg.inv(gram)
    kappa = 0.5 * (kappa + kappa.mT)
    return kappa, (kappa @ targets.unsqueeze(-1)).squeeze(-1)


def old_meanvar(mean, var, points, ls, beta, kappa):
    """The closed form before issue 13 (materialised ``psi`` and ``Omega``)."""
    ls2 = ls.square()
    c = (ls2 + var).unsqueeze(-1)
    psi = (ls2.unsqueeze(-1) / c).sqrt() * (-0.5 * (mean.unsqueeze(-1) - points).square() / c).exp()
    out_mean = (psi * beta).sum(-1)
    c2 = (ls2 + 2 * var)[..., None, None]
    mid = 0.5 * (points.unsqueeze(-1) + points.unsqueeze(-2))
    sep = (points.unsqueeze(-1) - points.unsqueeze(-2)).square() / (4 * ls2[:, None, None])
    omega = (ls2[:, None, None] / c2).sqrt() * (
        -(mean[..., None, None] - mid).square() / c2 - sep
    ).exp()
    matrix = kappa - beta.unsqueeze(-1) * beta.unsqueeze(-2)
    out_var = (1 - (matrix * omega).sum((-1, -2)) - out_mean.square()).clamp_min(0)
    return out_mean, out_var


def old_cross(mean, cov, points, ls, beta):
    """The off-diagonal ``E[m_n m_m]`` before issue 13 (three factors exponentiated apart)."""
    c = ls.square() + torch.diagonal(cov, dim1=-2, dim2=-1)
    c_n, c_m, cross = c[:, 0], c[:, 1], cov[:, 0, 1]
    det = c_n * c_m - cross.square()
    dist = points - mean.unsqueeze(-1)
    d_n, d_m = dist[:, 0], dist[:, 1]
    half_inv = 0.5 / det
    left = beta[0] * (-d_n.square() * (c_m * half_inv).unsqueeze(-1)).exp()
    right = beta[1] * (-d_m.square() * (c_n * half_inv).unsqueeze(-1)).exp()
    rho = (cross / det).unsqueeze(-1)
    coupling = ((rho * d_n).unsqueeze(-1) * d_m.unsqueeze(-2)).exp()
    quad = (left * (coupling @ right.unsqueeze(-1)).squeeze(-1)).sum(-1)
    return ls[0] * ls[1] / det.sqrt() * quad


def subject_meanvar(algebra: str, unit: Unit, mu: float, v: float, dtype: torch.dtype):
    points, targets, variances, ls = _tensors(unit, dtype)
    mean = torch.tensor([[mu]], dtype=dtype)
    var = torch.tensor([[v]], dtype=dtype)
    if algebra == "old":
        kappa, beta = old_weights(points, targets, variances, ls)
        out_mean, out_var = old_meanvar(mean, var, points, ls, beta, kappa)
    else:
        kappa, beta, chol = virtual_observation_weights(
            points, targets, variances, ls, with_cholesky=True
        )
        out = response_moments(
            Moments(mean, var=var), points, ls, beta, kappa, None, "meanvar",
            variance_cholesky=chol if algebra == "new" else None,
        )  # fmt: skip
        out_mean, out_var = out.mean, out.var
    return float(out_mean.reshape(-1)[0]), float(out_var.reshape(-1)[0])


def subject_cov(algebra, units, mu, cov, dtype):
    tens = [_tensors(u, dtype) for u in units]
    points, targets, variances = (torch.cat([t[i] for t in tens]) for i in range(3))
    ls = torch.cat([t[3] for t in tens])
    mean = torch.tensor([list(mu)], dtype=dtype)
    cov_t = torch.tensor(cov, dtype=dtype).unsqueeze(0)
    if algebra == "old":
        kappa, beta = old_weights(points, targets, variances, ls)
        means, _ = old_meanvar(mean, torch.diagonal(cov_t, dim1=-2, dim2=-1), points, ls, beta,
                               kappa)  # fmt: skip
        value = old_cross(mean, cov_t, points, ls, beta) - means[:, 0] * means[:, 1]
    else:
        kappa, beta, chol = virtual_observation_weights(
            points, targets, variances, ls, with_cholesky=True
        )
        out = response_moments(
            Moments(mean, cov=cov_t), points, ls, beta, kappa, None, "cov",
            variance_cholesky=chol if algebra == "new" else None,
        )  # fmt: skip
        value = out.cov[:, 0, 1]
    return float(value.reshape(-1)[0])


def mehler_serves(units, mu, cov, dtype) -> bool:
    """Whether the library's Mehler series (not ``Lambda``) evaluates this pair's covariance:
    its truncation bound holds within :data:`~pyro_gpn.moments.cross.MEHLER_MAX_TERMS`."""
    from pyro_gpn.moments import cross

    tens = [_tensors(u, dtype) for u in units]
    points, targets, variances = (torch.cat([t[i] for t in tens]) for i in range(3))
    ls = torch.cat([t[3] for t in tens])
    mean = torch.tensor([list(mu)], dtype=dtype)
    cov_t = torch.tensor(cov, dtype=dtype).unsqueeze(0)
    kappa, beta, chol = virtual_observation_weights(points, targets, variances, ls,
                                                    with_cholesky=True)  # fmt: skip
    var = torch.diagonal(cov_t, dim1=-2, dim2=-1)
    out = response_moments(Moments(mean, var=var), points, ls, beta, kappa, None, "meanvar",
                           variance_cholesky=chol)  # fmt: skip
    _, unbounded = cross._mehler_cross_covariance(mean, cov_t, points, ls, beta, out.var)
    return unbounded is None


# ----------------------------------------------------------------------------- the grid
def _err(value: float, ref: float, scale: float) -> float:
    if not math.isfinite(value):
        return 1.0
    return abs(value - ref) / scale


def meanvar_cases(quick: bool = False):
    ls_grid = (0.05, 0.4, 2.0, 5.0) if quick else LENGTHSCALES
    s_grid = (1e-1, 1e-3, 1e-6) if quick else TARGET_VARIANCES
    v_grid = (0.0, 1e-8, 0.05, 1.0) if quick else INPUT_VARIANCES
    mu_grid = (-6.0, 0.3, 2.5) if quick else MEANS
    yield from itertools.product(ls_grid, s_grid, TARGET_KINDS, v_grid, mu_grid)


def run_meanvar(dtypes, quick: bool = False) -> list[dict]:
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for ls, s, kind, v, mu in meanvar_cases(quick):
            unit = Unit.make(ls, s, kind, dtype)
            mu_r = float(torch.tensor(mu, dtype=dtype))
            v_r = float(torch.tensor(v, dtype=dtype))
            ref_mean, ref_var = reference_meanvar(unit, mu_r, v_r)
            row = dict(mode="meanvar", dtype=dtype_name, lengthscale=ls, S=s, targets=kind,
                       v=v, mu=mu, ref_mean=ref_mean, ref_var=ref_var)  # fmt: skip
            for algebra in ALGEBRAS:
                m, var = subject_meanvar(algebra, unit, mu_r, v_r, dtype)
                row[f"{algebra}_mean_err"] = _err(m, ref_mean, abs(ref_mean) + math.sqrt(ref_var))
                row[f"{algebra}_var_err"] = _err(var, ref_var, ref_var)
                row[f"{algebra}_finite"] = math.isfinite(m) and math.isfinite(var)
            rows.append(row)
    return rows


def cov_cases(quick: bool = False):
    # the NaN cases first, then a grid over lengthscale, target variance, correlation
    yield (0.05, 0.2), 0.1, (-6.0, 6.0), (1.0, 1.0), -0.99
    yield (0.4, 0.4), 0.1, (-6.0, -6.0), (1.0, 1.0), 0.99
    ls_grid = (0.05, 0.4, 2.0) if quick else (0.05, 0.2, 0.4, 1.2, 2.0, 5.0)
    s_grid = (1e-1, 1e-6) if quick else (1e-1, 1e-3, 1e-6)
    mus = ((-6.0, 6.0), (0.3, -0.5)) if quick else ((-6.0, 6.0), (-6.0, -6.0), (0.3, -0.5),
                                                    (2.5, 20.0))  # fmt: skip
    vs = ((0.05, 0.05), (1.0, 1.0)) if quick else ((1e-6, 1e-6), (0.05, 0.05), (1.0, 1.0),
                                                   (0.05, 2.0))  # fmt: skip
    corrs = (-0.999, 0.5, 0.999) if quick else CORRELATIONS
    for ls, s, mu, v, rho in itertools.product(ls_grid, s_grid, mus, vs, corrs):
        yield (ls, 1.5 * ls), s, mu, v, rho


def run_cov(dtypes, quick: bool = False) -> list[dict]:
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for (ls_n, ls_m), s, mu, v, rho in cov_cases(quick):
            units = (Unit.make(ls_n, s, "smooth", dtype), Unit.make(ls_m, s, "rough", dtype))
            cov = np.array([[v[0], rho * math.sqrt(v[0] * v[1])],
                            [rho * math.sqrt(v[0] * v[1]), v[1]]])  # fmt: skip
            cov = torch.tensor(cov, dtype=dtype).double().numpy()
            mu_r = tuple(float(torch.tensor(x, dtype=dtype)) for x in mu)
            ref = reference_cov(units[0], units[1], mu_r, cov)
            _, var_n = reference_meanvar(units[0], mu_r[0], cov[0, 0])
            _, var_m = reference_meanvar(units[1], mu_r[1], cov[1, 1])
            row = dict(mode="cov", dtype=dtype_name, lengthscale=ls_n, S=s, mu=list(mu),
                       v=list(v), rho=rho, ref_cov=ref)  # fmt: skip
            for algebra in ALGEBRAS:
                value = subject_cov(algebra, units, mu_r, cov, dtype)
                row[f"{algebra}_cov_err"] = _err(value, ref, math.sqrt(var_n * var_m))
                row[f"{algebra}_finite"] = math.isfinite(value)
            row["mehler"] = mehler_serves(units, mu_r, cov, dtype)
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- the table
def _regime(row) -> tuple:
    ratio = row["lengthscale"] / SPACING
    band = (
        "<=1.3"
        if ratio <= 1.31
        else ("<=2.6" if ratio <= 2.61 else ("<=6.5" if ratio <= 6.6 else ">6.5"))
    )
    return band


def table(rows: list[dict]) -> str:
    """Markdown tables: the worst error per dtype, lengthscale band and target variance."""
    lines = []
    mv = [r for r in rows if r["mode"] == "meanvar"]
    keyf = lambda r: (r["dtype"], _regime(r), r["S"])  # noqa: E731
    order = lambda k: (k[0], k[1], -k[2])  # noqa: E731
    if mv:
        lines.append("| dtype | lambda/h | S | mean old | mean new | var old | var new "
                     "| var new, explicit C |")  # fmt: skip
        lines.append("|---|---|---|---|---|---|---|---|")
        for key in sorted({keyf(r) for r in mv}, key=order):
            sel = [r for r in mv if keyf(r) == key]
            cols = [max(r[k] for r in sel) for k in
                    ("old_mean_err", "new_mean_err", "old_var_err", "new_var_err",
                     "newC_var_err")]  # fmt: skip
            lines.append(f"| {key[0]} | {key[1]} | {key[2]:g} | "
                         + " | ".join(f"{c:.1e}" for c in cols) + " |")  # fmt: skip
    cv = [r for r in rows if r["mode"] == "cov"]
    if cv:
        lines.append("")
        lines.append("| dtype | lambda_n/h | S | cov old | cov new | cov new, explicit C "
                     "| by Mehler's series | new, worst of those |")  # fmt: skip
        lines.append("|---|---|---|---|---|---|---|---|")
        for key in sorted({keyf(r) for r in cv}, key=order):
            sel = [r for r in cv if keyf(r) == key]
            cols = [max(r[f"{a}_cov_err"] for r in sel) for a in ALGEBRAS]
            served = [r for r in sel if r.get("mehler")]
            worst = max((r["new_cov_err"] for r in served), default=float("nan"))
            lines.append(f"| {key[0]} | {key[1]} | {key[2]:g} | "
                         + " | ".join(f"{c:.1e}" for c in cols)
                         + f" | {len(served)} of {len(sel)} | {worst:.1e} |")  # fmt: skip
    return "\n".join(lines)


# ----------------------------------------------------------------------------- node tiers
TIER_UNITS = ((0.4, 1e-3, "rough"), (1.2, 1e-4, "smooth"), (2.0, 1e-6, "rough"),
              (0.8, 1e-1, "rough"), (5.0, 1e-4, "rough"), (0.8, 1e-2, "rough"),
              (1.2, 1e-2, "rough"), (0.05, 1e-6, "rough"))  # fmt: skip
TIER_RATIOS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.75, 0.9, 1.0, 1.1, 1.25, 1.3, 1.5, 3.0)


def run_tiers(dtypes) -> str:
    """Worst relative variance error per ``sqrt(v) / lambda`` over hard units and four means
    (float32: only ``S >= 0.01``), with the library's regime rule and node tiers."""
    lines = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        worst = dict.fromkeys(TIER_RATIOS, 0.0)
        for ls, s, kind in TIER_UNITS:
            if dtype == torch.float32 and s < 1e-2:
                continue
            unit = Unit.make(ls, s, kind, dtype)
            for ratio, mu in itertools.product(TIER_RATIOS, (-2.3, -0.5, 0.3, 1.9)):
                v = float(torch.tensor((ratio * unit.lengthscale) ** 2, dtype=dtype))
                mu = float(torch.tensor(mu, dtype=dtype))
                _, ref_var = reference_meanvar(unit, mu, v)
                _, var = subject_meanvar("new", unit, mu, v, dtype)
                worst[ratio] = max(worst[ratio], _err(var, ref_var, ref_var))
        lines.append(f"{dtype_name}: " + "  ".join(f"{r:g}: {e:.0e}" for r, e in worst.items()))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- trained networks
def _layer_weights(layer, dtype: torch.dtype, algebra: str):
    """``(points, ls, beta, C, L)`` of a GPN layer computed in ``dtype`` by ``algebra``."""
    saved = layer.compute_dtype
    layer.compute_dtype = dtype
    try:
        points = layer.compute_inducing_points()
        ls = layer.to_compute(layer.lengthscales)
        if hasattr(layer, "target_variances"):  # parametric GPN
            targets = layer.to_compute(layer.targets)
            variances = layer.to_compute(layer.target_variances) + layer.jitter
            if algebra == "old":
                kappa, beta = old_weights(points, targets, variances, ls)
                return points, ls, beta, kappa, None
            kappa, beta, chol = virtual_observation_weights(
                points, targets, variances, ls, with_cholesky=True
            )
            return points, ls, beta, kappa, chol
        beta, khat = layer.response_weights()  # variational GPN
        if algebra != "new":
            return points, ls, beta, khat, None
        chol = layer._compute_prior_scale_tril()  # C = L^-T (I - B B^T) L^-1
        root = layer.to_compute(layer.variational_scale_tril())
        if not layer.whiten:
            root = torch.linalg.solve_triangular(chol, root, upper=False)
        eye = torch.eye(root.shape[-1], dtype=root.dtype, device=root.device)
        return points, ls, beta, khat, (chol, eye - root @ root.mT)
    finally:
        layer.compute_dtype = saved


def layer_report(layer, moments: Moments) -> dict:
    """Parameter ranges of one GPN layer, its activations' regime, and the error of float32 (old
    and new algebra) against the new algebra in float64 on those activations."""
    act = moments.diagonal().linear(layer.weight)
    mean, var = act.mean.detach().double(), act.variance.detach().double()
    with torch.no_grad():
        points, ls, beta, _, _ = _layer_weights(layer, torch.float64, "new")
        spacing = float((points[..., 1] - points[..., 0]).mean())
        ls_units = ls.expand(mean.shape[-1])
        out = {
            "lengthscale": [float(ls.min()), float(ls.median()), float(ls.max())],
            "lengthscale_over_spacing": [float(ls.min() / spacing), float(ls.max() / spacing)],
            "noise_var": [float(layer.noise_std.min() ** 2), float(layer.noise_std.max() ** 2)],
            "abs_activation_mean_q50_q99_max": [
                float(q)
                for q in torch.quantile(
                    mean.abs().reshape(-1), torch.tensor([0.5, 0.99], dtype=torch.float64)
                )
            ]
            + [float(mean.abs().max())],  # fmt: skip
            "activation_sd_over_lengthscale_q50_q99": [
                float(q)
                for q in torch.quantile(
                    (var.sqrt() / ls_units).reshape(-1),
                    torch.tensor([0.5, 0.99], dtype=torch.float64),
                )
            ],  # fmt: skip
            "beta_abs_max": float(beta.abs().max()),
        }
        if hasattr(layer, "target_variances"):
            tv = layer.target_variances.detach()
            out["target_variance"] = [float(tv.min()), float(tv.median()), float(tv.max())]
        else:
            scale = layer.variational_scale_tril().detach()
            diag = torch.diagonal(scale, dim1=-2, dim2=-1) if scale.dim() == 3 else scale
            out["q_scale_diag"] = [float(diag.min()), float(diag.median()), float(diag.max())]
        results = {}
        for dtype, algebra in ((torch.float64, "new"), (torch.float32, "new"),
                               (torch.float32, "old")):  # fmt: skip
            pts, lsd, beta_d, c_d, chol = _layer_weights(layer, dtype, algebra)
            chol, inner = chol if isinstance(chol, tuple) else (chol, None)
            m_d, v_d = mean.to(dtype), var.to(dtype)
            if algebra == "old":
                om, ov = old_meanvar(m_d, v_d, pts.expand(m_d.shape[-1], -1),
                                     lsd.expand(m_d.shape[-1]), beta_d.expand(m_d.shape[-1], -1),
                                     c_d.expand(m_d.shape[-1], -1, -1))  # fmt: skip
            else:
                o = response_moments(Moments(m_d, var=v_d), pts, lsd, beta_d, c_d, None,
                                     "meanvar", variance_cholesky=chol,
                                     variance_inner=inner)  # fmt: skip
                om, ov = o.mean, o.var
            results[(str(dtype), algebra)] = (om.double(), ov.double())
        ref_m, ref_v = results[("torch.float64", "new")]
        for (dt, algebra), (om, ov) in results.items():
            if dt == "torch.float64":
                continue
            key = f"{dt.split('.')[-1]}_{algebra}"
            err_v = ((ov - ref_v).abs() / ref_v).nan_to_num(1.0)
            err_m = ((om - ref_m).abs() / (ref_m.abs() + ref_v.sqrt())).nan_to_num(1.0)
            out[f"{key}_var_err_max"] = float(err_v.max())
            out[f"{key}_mean_err_max"] = float(err_m.max())
            noisy = ref_v + layer.noise_std.detach().double().square()
            out[f"{key}_noisy_var_err_max"] = float(((ov - ref_v).abs() / noisy).max())
    return out


def trained_report(model, x: torch.Tensor) -> list[dict]:
    """:func:`layer_report` for every GPN layer of a ``GPNNet`` or ``VariationalGPN``."""
    moments = Moments(x, validate=False)
    reports = []
    with torch.no_grad():
        for layer in model.layers:
            reports.append(layer_report(layer, moments))
            moments = layer.propagate(moments, "meanvar")
    return reports


def run_trained_cli(run_dir: str, data_dir: str, rows: int) -> dict:
    """Report of a ``pyro-gpn train`` output folder (``result.json`` and ``model.pt``)."""
    from pyro_gpn.data import load_dataset
    from pyro_gpn.experiments import build_model

    with open(f"{run_dir}/result.json") as f:
        result = json.load(f)
    st = result["settings"]
    data = load_dataset(st["dataset"], data_dir, seed=0, split=st.get("split", 0))
    num_classes = getattr(data, "num_classes", None)
    head = "softmax" if num_classes else "gaussian"
    outputs = num_classes or data.y_train.shape[-1]
    sizes = [data.num_features, *st["sizes"], outputs]
    model = build_model("gpn", sizes, head, mode=st["mode"], init=st["init"], share=st["share"])
    model.load_state_dict(torch.load(f"{run_dir}/model.pt", map_location="cpu"))
    return {"run": run_dir, "epochs": result.get("epochs"), "metrics": result["metrics"],
            "layers": trained_report(model, data.x_train[:rows])}  # fmt: skip


def run_trained_vgpn(dataset: str, data_dir: str, steps: int, seed: int, rows: int) -> dict:
    """Fit the closed-form variational GPN ``[M, 4, 1]`` (whitened, the ``benchmarks/
    vgpn_starts.py`` "random" start) by SVI and report its layers."""
    import pyro

    from pyro_gpn.data import load_dataset
    from pyro_gpn.inference import seed_everything
    from pyro_gpn.inference.closed_form import ClosedFormELBO
    from pyro_gpn.inference.svi import fit_svi
    from pyro_gpn.models.variational import VariationalGPN

    data = load_dataset(dataset, data_dir, seed=0, split=0)
    pyro.clear_param_store()
    seed_everything(seed)
    vgpn = VariationalGPN([data.num_features, 4, 1], head="gaussian", whiten=True,
                          targets_init="random")  # fmt: skip
    fit_svi(vgpn.model, vgpn.guide, data.x_train, data.y_train, loss=ClosedFormELBO(),
            num_steps=steps, lr=0.05, lr_decay=0.1, seed=seed, progress=False)  # fmt: skip
    with torch.no_grad():
        pred = vgpn.predictive_moments(data.x_test)
        rmse = float((pred.mean - data.y_test).square().mean().sqrt())
    return {"run": f"vgpn {dataset} seed {seed} {steps} steps", "test_rmse_std_units": rmse,
            "layers": trained_report(vgpn, data.x_train[:rows])}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    grid = sub.add_parser("grid", help="evaluate the grid and write JSON rows")
    grid.add_argument("--out", required=True)
    grid.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    grid.add_argument("--modes", nargs="+", default=["meanvar", "cov"])
    grid.add_argument("--quick", action="store_true", help="a representative subset")
    tr = sub.add_parser("trained", help="parameter ranges and float32 error of trained nets")
    tr.add_argument("--runs", nargs="*", default=[], help="pyro-gpn train output folders")
    tr.add_argument("--vgpn", nargs="*", default=[], help="data sets for a variational fit")
    tr.add_argument("--vgpn-steps", type=int, default=2000)
    tr.add_argument("--data-dir", default=None)
    tr.add_argument("--rows", type=int, default=2000)
    tr.add_argument("--out", required=True)
    tiers = sub.add_parser("tiers", help="error against sqrt(v) / lambda (node tiers)")
    tiers.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    tab = sub.add_parser("table", help="print the markdown table of a grid's JSON rows")
    tab.add_argument("--results", required=True)
    args = parser.parse_args(argv)
    if args.command == "grid":
        start = time.perf_counter()
        rows = []
        if "meanvar" in args.modes:
            rows += run_meanvar(args.dtypes, args.quick)
        if "cov" in args.modes:
            rows += run_cov(args.dtypes, args.quick)
        with open(args.out, "w") as f:
            json.dump(rows, f)
        print(table(rows))
        print(f"{len(rows)} cases in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    elif args.command == "tiers":
        print(run_tiers(args.dtypes))
    elif args.command == "trained":
        reports = [run_trained_cli(r, args.data_dir, args.rows) for r in args.runs]
        reports += [run_trained_vgpn(d, args.data_dir, args.vgpn_steps, 0, args.rows)
                    for d in args.vgpn]  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(reports, f, indent=1)
        print(json.dumps(reports, indent=1))
    else:
        with open(args.results) as f:
            print(table(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Unit", "asdict", "mpmath_closed_form", "reference_cov", "reference_meanvar"]
