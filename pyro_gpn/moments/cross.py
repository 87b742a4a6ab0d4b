r"""Off-diagonal output covariances of a GPN layer (``eq:gpn_normal_Sigmatilde_cov``,
``"cov"`` mode of :func:`~pyro_gpn.moments.propagate.response_moments`).

Two evaluations of the same quantity, ``Cov[m_n(a_n), m_m(a_m)]`` for the mean functions
``m_n(a) = alpha_n(a)^T beta_n`` of two units under their activations' bivariate Gaussian:

* :func:`_mehler_cross_covariance` (first choice): Mehler's expansion of the bivariate Gaussian
  in Hermite polynomials turns the covariance into ``sum_k Sigma_nm^k b_kn b_km`` with
  coefficients ``b_kn`` of one unit each: ``O(N R K)`` per sample for the coefficients and
  ``O(N^2 K)`` for the pairs, instead of ``O(N^2 R^2)``. A proven bound on its truncation error
  picks the number of terms and sends the pairs it cannot bound to the second evaluation.
* :func:`_cross_covariance`: ``Lambda`` contracted with ``beta`` per pair (``[R, R]``), or
  Gauss-Hermite nodes of the conditional where both units are narrow; chunked over samples
  and checkpointed so that the per-pair tensors are never all held at once.
"""

from __future__ import annotations

import math

import torch
import torch.utils.checkpoint
from torch import Tensor

from .backend import select_backend
from .quadrature import _NodeValues, gauss_hermite

__all__ = [
    "COV_CHUNK_ELEMENTS",
    "MEHLER_MAX_TERMS",
    "MEHLER_RTOL",
]


#: Upper bound on the elements of one ``Lambda`` chunk in the covariance path.
COV_CHUNK_ELEMENTS = 2**22

#: Most terms of the Mehler series (:func:`_mehler_cross_covariance`); a pair whose truncation
#: bound needs more is evaluated through ``Lambda`` instead.
MEHLER_MAX_TERMS = 40

#: The Mehler series is truncated where its proven remainder is at most this fraction of
#: ``sqrt(Var f_n Var f_m)`` (the scale of the covariance it approximates).
MEHLER_RTOL = 1e-8

#: Cramer's inequality for the probabilists' Hermite polynomials:
#: ``|He_k(x)| <= CRAMER sqrt(k!) exp(x^2 / 4)`` for every ``k`` and real ``x``.
_CRAMER = 1.086435


def _hermite_coefficients(
    mean: Tensor,
    var: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    num_terms: int,
) -> tuple[Tensor, Tensor]:
    r"""Hermite coefficients of every unit's mean function under its activation's marginal.

    With ``c = lambda^2 + v`` and ``t_r = (mu - V_r) / sqrt(c)``, Stein's identity applied ``k``
    times gives ``E[m(a) He_k(z)] = v^{k/2} d^k/dmu^k E[m(a)]`` (``a = mu + sqrt(v) z``), and the
    ``k``-th derivative of ``psi_r = lambda / sqrt(c) exp(-t_r^2 / 2)`` is
    ``(-1)^k c^{-k/2} He_k(t_r) psi_r``. The coefficient that :func:`_mehler_cross_covariance`
    needs, ``E[m(a) He_k(z)] (c / v)^{k/2} / sqrt(k!)`` (free of ``sqrt(v)``), is therefore

    .. math::

        b_k = (-1)^k \sum_r \beta_r \psi_r \frac{He_k(t_r)}{\sqrt{k!}},

    evaluated by the three-term recurrence of the normalised Hermite *functions*
    ``u_k = beta psi He_k(t) / sqrt(k!)`` (``u_{k+1} = (t u_k - sqrt(k) u_{k-1}) / sqrt(k+1)``),
    which stay below ``CRAMER |beta| lambda / sqrt(c) exp(-t^2 / 4)``: no overflow for
    activations far outside the inducing points. A linear form in ``beta``, so as accurate as
    the mean itself however ill-conditioned ``K + S`` is.

    Shape:
        - mean, var: ``[S, N]``; inducing_points, beta: ``[N | 1, R]``; lengthscales ``[N | 1]``
        - returns ``b`` ``[S, N, K]`` (``k = 1 .. K``) and the bound ``B`` ``[S, N]`` with
          ``|b_k| <= B`` for every ``k`` (Cramer's inequality).
    """
    width = lengthscales.square() + var  # c, [S, N]
    scale = width.rsqrt()
    t = (mean.unsqueeze(-1) - inducing_points) * scale.unsqueeze(-1)  # [S, N, R]
    amplitude = (lengthscales * scale).unsqueeze(-1)
    weighted = beta * amplitude * (-0.5 * t.square()).exp()  # beta_r psi_r = u_0, [S, N, R]
    bound = _CRAMER * (beta.abs() * amplitude * (-0.25 * t.square()).exp()).sum(-1)
    coefficients = []
    previous, current = weighted, t * weighted  # u_0, u_1
    for k in range(1, num_terms + 1):
        coefficients.append(current.sum(-1) if k % 2 == 0 else -current.sum(-1))
        if k < num_terms:
            previous, current = current, (t * current - math.sqrt(k) * previous) / math.sqrt(k + 1)
    return torch.stack(coefficients, -1), bound


def _mehler_terms(ratio: Tensor, per_unit: Tensor) -> tuple[int, Tensor]:
    """The number of terms of the series and which pairs it serves (``[S, N, N]``, bool).

    With ``q = |rho_nm| < 1`` (the scaled covariance of :func:`_mehler_cross_covariance`, zero
    on the diagonal) the ``k``-th term of the series is at most ``q^k B_n B_m``, so after
    ``K`` terms the remainder is at most ``B_n B_m q^{K+1} / (1 - q)``. A pair needs the least
    ``K`` with ``(K + 1) log q <= log MEHLER_RTOL + u_n + u_m + log(1 - q)``,
    ``u = per_unit = log(sqrt(out_var) / B)`` (``+inf`` where ``B = 0``); it is served if that
    is at most :data:`MEHLER_MAX_TERMS` (a pair with ``q = 0`` or ``B = 0`` needs none: its
    terms are zero; otherwise ``q = 1`` is not served, nor is ``out_var = 0`` or NaN). The
    bound is on the values; a gradient's remainder may be larger, by up to about
    ``(K + 1) / (q (1 - q))``. Per-unit
    logarithms and in-place passes: the ``[S, N, N]`` work is a handful of elementwise passes
    (one compiled pass on the CPU kernels, :func:`~pyro_gpn.moments.cpu_mehler.cpu_mehler_terms`).
    """
    zero_coefficients = per_unit == math.inf  # B = 0
    zero = (ratio == 0) | zero_coefficients.unsqueeze(-1) | zero_coefficients.unsqueeze(-2)
    q = ratio.abs()
    limit = (per_unit.unsqueeze(-1) + per_unit.unsqueeze(-2)).add_(math.log(MEHLER_RTOL))
    log_q = q.log()
    log_gap = q.neg_().log1p_()  # log(1 - q), in place of q
    needed = limit.add_(log_gap).div_(log_q).sub_(1)
    # served: every term zero, or the bound met within the limit (False for NaN: out_var = 0
    # or NaN) with q < 1 (log(1 - q) > -inf); the same order as the compiled rule
    fits = (needed <= MEHLER_MAX_TERMS) & (log_gap > -math.inf)
    ok = zero | fits
    if not ok.numel():  # no sample
        return 1, ok
    num_terms = max(1, math.ceil(float(needed.where(fits & ~zero, 0).amax())))
    return num_terms, ok


def _mehler_cross_covariance(
    mean: Tensor,
    cov: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    out_var: Tensor,
) -> tuple[Tensor, Tensor | None]:
    r"""Off-diagonal ``Cov[m_n(a_n), m_m(a_m)]`` by Mehler's formula, ``[S, N, N]``.

    Mehler's formula writes the standard bivariate normal density of correlation ``rho`` as
    ``phi(x) phi(y) sum_k rho^k / k! He_k(x) He_k(y)``, so for
    ``(a_n, a_m) ~ N(mu, Sigma)``

    .. math::

        Cov[m_n(a_n), m_m(a_m)] = \sum_{k \ge 1} \rho_{nm}^k\, b_{kn}\, b_{km}, \qquad
        \rho_{nm} = \frac{\Sigma_{nm}}{\sqrt{(\lambda_n^2 + v_n)(\lambda_m^2 + v_m)}},

    with the coefficients of one unit each (:func:`_hermite_coefficients`), all of them
    bounded (no power of a large number is formed); the pair sum is evaluated by Horner's
    scheme in ``rho``, in one compiled pass over the pairs on the fused CPU kernels
    (:mod:`~pyro_gpn.moments.cpu_mehler`, backend ``"auto"``/``"cpu"``, the truncation rule
    too) or on whole ``[S, N, N]`` matrices. A pair's covariance is taken as the symmetric part
    ``(Sigma_nm + Sigma_mn) / 2``. The series converges geometrically:
    ``|rho| <= |corr(a_n, a_m)| sqrt(v_n v_m / c_n c_m) < 1``. It is truncated after the fewest
    terms that bound the remainder of every pair it serves by :data:`MEHLER_RTOL`
    ``sqrt(out_var_n out_var_m)`` (:func:`_mehler_terms`), at most :data:`MEHLER_MAX_TERMS`;
    the other pairs' ``rho`` is set to zero here (finite values and gradients).

    Shape:
        - mean ``[S, N]``, cov ``[S, N, N]`` (activations), out_var ``[S, N]`` (noise-free output
          variances: the scale of the tolerance)
        - returns the covariances ``[S, N, N]`` (zero diagonal) and ``None``, or a boolean
          ``[S, N, N]`` mask of the pairs it could not bound, whose entries are then wrong and
          must be replaced (:func:`_cross_covariance`).
    """
    num_units = mean.shape[-1]
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    eye = torch.eye(num_units, dtype=torch.bool, device=mean.device)
    scale = (lengthscales.square() + var).rsqrt()  # c^-1/2, [S, N]
    with torch.no_grad():
        _, bound = _hermite_coefficients(
            mean.detach(), var.detach(), inducing_points, lengthscales.detach(), beta.detach(), 1
        )
        per_unit = (0.5 * out_var.detach().log() - bound.log()).where(bound > 0, math.inf)
    if select_backend(cov, scale, triton_auto=False) == "cpu":
        from .cpu_mehler import cpu_mehler_pairs, cpu_mehler_terms

        args = (cov.detach(), scale.detach(), per_unit, MEHLER_RTOL, MEHLER_MAX_TERMS)
        num_terms, ok, every = cpu_mehler_terms(*args)
        coefficients, _ = _hermite_coefficients(
            mean, var, inducing_points, lengthscales, beta, num_terms
        )
        return cpu_mehler_pairs(cov, scale, coefficients, ok), None if every else ~ok
    ratio = cov * scale.unsqueeze(-1) * scale.unsqueeze(-2)
    ratio = (0.5 * (ratio + ratio.mT)).masked_fill(eye, 0)
    with torch.no_grad():
        num_terms, ok = _mehler_terms(ratio.detach(), per_unit)
        unbounded = None if bool(ok.all()) else ~ok
    if unbounded is not None:
        ratio = ratio.masked_fill(unbounded, 0)
    coefficients, _ = _hermite_coefficients(
        mean, var, inducing_points, lengthscales, beta, num_terms
    )
    total = coefficients[..., -1].unsqueeze(-1) * coefficients[..., -1].unsqueeze(-2)
    for k in range(num_terms - 2, -1, -1):
        term = coefficients[..., k]
        total = torch.addcmul(total * ratio, term.unsqueeze(-1), term.unsqueeze(-2))
    return total * ratio, unbounded


def _cross_covariance_chunk(
    mean: Tensor,
    cov: Tensor,
    out_mean: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    centred: Tensor | None,
    std: Tensor | None,
    narrow: Tensor | None,
) -> Tensor:
    r"""``Cov[f_n, f_m]`` for the unit pairs ``n < m``, ``[S, N (N - 1) / 2]``.

    *Broad* pairs: ``sum_rt beta_rn beta_tm Lambda_rtnm - mu_n mu_m`` with ``Lambda``
    (``eq:gpn_normal_lambda``, corrected) written with its exponent completed to a square,

    .. math::

        \Lambda_{rt} = \frac{\lambda_n \lambda_m}{\sqrt{D}}
            \exp\Big(-\frac{d_{rn}^2}{2 c_n}\Big)
            \exp\Big(-\frac{c_n (d_{tm} - \Sigma_{nm} d_{rn} / c_n)^2}{2 D}\Big),

    both factors ``<= 1`` (no overflow times underflow), and
    ``D = lambda_n^2 lambda_m^2 + lambda_n^2 Sigma_mm + lambda_m^2 Sigma_nn
    + (Sigma_nn Sigma_mm - Sigma_nm^2)`` (no cancellation as the correlation nears +-1).

    *Narrow* pairs (both units narrow, see :func:`response_moments`): with the Gauss-Hermite
    nodes ``a_ni`` of ``a_n`` and the mean function's centred values there (``centred``),
    ``Cov = sum_i w_i (m_n(a_ni) - E m_n) (g_m(a_ni) - E g_m)`` where
    ``g_m(x) = E[m_m(a_m) | a_n = x]`` is ``psi^T beta_m`` under the conditional Gaussian
    ``N(mu_m + Sigma_nm / Sigma_nn (x - mu_n), Sigma_mm - Sigma_nm^2 / Sigma_nn)``: linear
    forms in ``beta`` only, consistent with the diagonal's Gauss-Hermite variance.
    """
    num_units = mean.shape[-1]
    rows, cols = torch.triu_indices(num_units, num_units, offset=1, device=mean.device)
    ls = lengthscales.expand(num_units)
    ls2 = ls.square()
    beta = beta.expand(num_units, -1)
    points = inducing_points.expand(num_units, -1)
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    var_n, var_m, cross = var[:, rows], var[:, cols], cov[:, rows, cols]  # [S, P]
    c_n = ls2[rows] + var_n
    det = (
        ls2[rows] * ls2[cols]
        + ls2[rows] * var_m
        + ls2[cols] * var_n
        + (var_n * var_m - cross.square()).clamp_min(0)
    )
    dist = points - mean.unsqueeze(-1)  # d_rn = V_rn - mu_n, [S, N, R]
    d_n, d_m = dist[:, rows], dist[:, cols]  # [S, P, R]
    left = beta[rows] * (-d_n.square() / (2 * c_n).unsqueeze(-1)).exp()
    shift = (cross / c_n).unsqueeze(-1) * d_n  # [S, P, R]
    coupling = (d_m.unsqueeze(-2) - shift.unsqueeze(-1)).square_()
    coupling = coupling.mul_((-c_n / (2 * det))[..., None, None]).exp_()  # [S, P, R, R]
    quad = (left * (coupling @ beta[cols].unsqueeze(-1)).squeeze(-1)).sum(-1)
    broad = ls[rows] * ls[cols] / det.sqrt() * quad - out_mean[:, rows] * out_mean[:, cols]
    if centred is None:
        return broad

    z, w = gauss_hermite(centred.shape[-1], mean.dtype, mean.device)
    std_n = std[:, rows]
    slope = torch.where(std_n > 0, cross / torch.where(std_n > 0, std_n, 1), 0)  # Sigma_nm / sd_n
    cond_var = (var_m - slope.square()).clamp_min(0)
    width = ls2[cols] + cond_var  # [S, P]
    centre = mean[:, cols].unsqueeze(-1) + slope.unsqueeze(-1) * z  # [S, P, G]
    expo = (centre.unsqueeze(-1) - points[cols].unsqueeze(-2)).square()  # [S, P, G, R]
    expo = expo.mul_((-0.5 / width)[..., None, None]).exp_()
    cond_mean = (ls2[cols] / width).sqrt().unsqueeze(-1) * torch.einsum(
        "spgr,pr->spg", expo, beta[cols]
    )
    cond_mean = cond_mean - (cond_mean @ w).unsqueeze(-1)
    gh = (centred[:, rows] * cond_mean) @ w
    return torch.where(narrow[:, rows] & narrow[:, cols], gh, broad)


def _cross_covariance(
    mean: Tensor,
    cov: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    out_mean: Tensor,
    nodes: _NodeValues | None,
    narrow: Tensor,
) -> Tensor:
    """Off-diagonal output covariances ``[S, N, N]`` (zero diagonal), see
    :func:`_cross_covariance_chunk`.

    Evaluated in chunks of samples with at most :data:`COV_CHUNK_ELEMENTS` entries of the
    per-pair ``[R, R]`` (``Lambda``) and ``[G, R]`` (node) tensors each; under autograd each
    chunk is checkpointed, so the backward pass recomputes it instead of storing it.
    """
    num_samples, num_units = mean.shape
    num_points = inducing_points.shape[-1]
    per_pair = num_points * max(num_points, nodes.centred.shape[-1] if nodes is not None else 0)
    per_sample = max(1, num_units * (num_units - 1) // 2) * per_pair
    chunk = max(1, COV_CHUNK_ELEMENTS // per_sample)
    extra = (None, None, None) if nodes is None else (nodes.centred, nodes.std, narrow)

    def rows(tensor: Tensor | None, start: int) -> Tensor | None:
        return None if tensor is None else tensor[start : start + chunk]

    if chunk >= num_samples:
        pairs = _cross_covariance_chunk(
            mean, cov, out_mean, inducing_points, lengthscales, beta, *extra
        )
        return _pairs_to_matrix(pairs, num_units)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad
        for t in (mean, cov, out_mean, inducing_points, lengthscales, beta, *extra)
    )
    parts = []
    for start in range(0, num_samples, chunk):
        args = (rows(mean, start), rows(cov, start), rows(out_mean, start))
        args = (*args, inducing_points, lengthscales, beta, *(rows(t, start) for t in extra))
        if needs_grad:
            parts.append(
                torch.utils.checkpoint.checkpoint(
                    _cross_covariance_chunk, *args, use_reentrant=False
                )
            )
        else:
            parts.append(_cross_covariance_chunk(*args))
    return _pairs_to_matrix(torch.cat(parts), num_units)


def _pairs_to_matrix(pairs: Tensor, num_units: int) -> Tensor:
    """Scatter ``[S, N (N - 1) / 2]`` values of the pairs ``n < m`` into symmetric ``[S, N, N]``
    matrices with a zero diagonal."""
    rows, cols = torch.triu_indices(num_units, num_units, offset=1, device=pairs.device)
    out = pairs.new_zeros(pairs.shape[0], num_units, num_units)
    out[:, rows, cols] = pairs
    return out + out.mT
