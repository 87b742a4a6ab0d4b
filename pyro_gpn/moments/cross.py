r"""Off-diagonal output covariances of a GPN layer (``eq:gpn_normal_Sigmatilde_cov``,
``"cov"`` mode of :func:`~pyro_gpn.moments.propagate.response_moments`).

Two evaluations of the same quantity, ``Cov[m_n(a_n), m_m(a_m)]`` for the mean functions
``m_n(a) = alpha_n(a)^T beta_n`` of two units under their activations' bivariate Gaussian:

* :func:`_mehler_cross_covariance` (first choice): Mehler's expansion of the bivariate Gaussian
  in Hermite polynomials turns the covariance into ``sum_k Sigma_nm^k b_kn b_km`` with
  coefficients ``b_kn`` of one unit each: ``O(N R K)`` per sample for the coefficients and
  ``O(N^2 K)`` for the pairs, instead of ``O(N^2 R^2)``. A proven bound on its truncation error
  picks the number of terms and sends the pairs it cannot bound to the second evaluation.
* :func:`_lambda_entries`: ``Lambda`` contracted with ``beta`` per pair (``[R, R]``), or
  quadrature nodes of the conditional where both units are narrow, for the pairs the
  series leaves; chunked and checkpointed so that the per-pair tensors are never all held at
  once.
"""

from __future__ import annotations

import math

import torch
import torch.utils.checkpoint
from torch import Tensor

from .backend import cpu_kernels_evaluate
from .quadrature import _NodeValues

__all__ = [
    "COV_CHUNK_ELEMENTS",
    "MEHLER_MAX_TERMS",
    "MEHLER_RTOL",
]


#: Upper bound on the elements of one ``Lambda`` chunk in the covariance path.
COV_CHUNK_ELEMENTS = 2**22

#: Most terms of the Mehler series (:func:`_mehler_cross_covariance`); a pair whose truncation
#: bound needs more is evaluated through ``Lambda`` instead (``R^2`` Gaussians a pair, and its
#: backward: a pair's series is cheaper even at this many terms). A fresh layer needs about 7;
#: broad activations correlated near +-1 a hundred or more.
MEHLER_MAX_TERMS = 200

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
    sums = []
    previous, current = weighted, t * weighted  # u_0, u_1
    for k in range(1, num_terms + 1):
        sums.append(current.sum(-1))
        if k < num_terms:  # u_{k+1} = (t u_k - sqrt(k) u_{k-1}) / sqrt(k + 1)
            scaled = previous * -math.sqrt(k / (k + 1))
            previous, current = current, scaled.addcmul_(t, current, value=(k + 1) ** -0.5)
    signs = torch.ones(num_terms, dtype=t.dtype, device=t.device)
    signs[::2] = -1  # (-1)^k, k = 1 .. K
    return torch.stack(sums, -1) * signs, bound


def _mehler_terms(ratio: Tensor, per_unit: Tensor) -> tuple[int, Tensor]:
    """The largest number of terms of the series, and every pair's (``[S, N, N]``, int32: 0
    where every term is zero and on the diagonal, -1 where the pair is not served).

    With ``q = |rho_nm| < 1`` (the scaled covariance of :func:`_mehler_cross_covariance`, zero
    on the diagonal) the ``k``-th term of the series is at most ``q^k B_n B_m``, so after
    ``K`` terms the remainder is at most ``B_n B_m q^{K+1} / (1 - q)``. A pair needs the least
    ``K`` with ``(K + 1) log q <= log MEHLER_RTOL + u_n + u_m + log(1 - q)``,
    ``u = per_unit = log(sqrt(out_var) / B)`` (``+inf`` where ``B = 0``); it is served if that
    is at most :data:`MEHLER_MAX_TERMS` (a pair with ``q = 0`` or ``B = 0`` needs none: its
    terms are zero; otherwise ``q = 1`` is not served, nor is ``out_var = 0`` or NaN). The
    bound is on the values; a gradient's remainder may be larger, by up to about
    ``(K + 1) / (q (1 - q))``. Per-unit logarithms and in-place passes: the ``[S, N, N]`` work is
    a handful of elementwise passes (one compiled pass on the CPU kernels,
    :func:`~pyro_gpn.moments.cpu_mehler.cpu_mehler_terms`).
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
    count = needed.nan_to_num(nan=math.inf, neginf=1.0).ceil_().clamp_min_(1)  # K >= 1
    fits = (count <= MEHLER_MAX_TERMS) & (log_gap > -math.inf)
    terms = count.clamp_max_(max(MEHLER_MAX_TERMS, 1)).to(torch.int32)
    terms = terms.masked_fill_(~fits, -1).masked_fill_(zero, 0)
    if not terms.numel():  # no sample
        return 1, terms
    return max(1, int(terms.amax())), terms


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
    and, for fixed inducing points, the coefficients too) or on whole ``[S, N, N]`` matrices.
    A pair's covariance is taken as the symmetric part ``(Sigma_nm + Sigma_mn) / 2``. The
    series converges geometrically:
    ``|rho| <= |corr(a_n, a_m)| sqrt(v_n v_m / c_n c_m) < 1``. It is truncated after the fewest
    terms that bound the remainder by :data:`MEHLER_RTOL` ``sqrt(out_var_n out_var_m)``
    (:func:`_mehler_terms`), at most :data:`MEHLER_MAX_TERMS`, each pair after its own number
    of terms (on both paths: they agree to rounding); the pairs it does not serve are zero here
    (finite values and gradients).

    Shape:
        - mean ``[S, N]``, cov ``[S, N, N]`` (activations), out_var ``[S, N]`` (noise-free output
          variances: the scale of the tolerance)
        - returns the covariances ``[S, N, N]`` (zero diagonal) and ``None``, or a boolean
          ``[S, N, N]`` mask of the pairs it could not bound, whose entries are then wrong and
          must be replaced (:func:`_lambda_entries`).
    """
    num_units = mean.shape[-1]
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    eye = torch.eye(num_units, dtype=torch.bool, device=mean.device)
    scale = (lengthscales.square() + var).rsqrt()  # c^-1/2, [S, N]
    kernels = cpu_kernels_evaluate(cov, scale)
    coefficients_of = _hermite_coefficients
    if kernels and not inducing_points.requires_grad:
        from .cpu_mehler import cpu_hermite_coefficients as coefficients_of
    with torch.no_grad():
        _, bound = coefficients_of(
            mean.detach(), var.detach(), inducing_points, lengthscales.detach(), beta.detach(), 1
        )
        per_unit = (0.5 * out_var.detach().log() - bound.log()).where(bound > 0, math.inf)
    if kernels:
        from .cpu_mehler import cpu_mehler_pairs, cpu_mehler_terms

        args = (cov.detach(), scale.detach(), per_unit, MEHLER_RTOL, MEHLER_MAX_TERMS)
        num_terms, terms, every = cpu_mehler_terms(*args)
        coefficients, _ = coefficients_of(mean, var, inducing_points, lengthscales, beta, num_terms)
        return cpu_mehler_pairs(cov, scale, coefficients, terms), None if every else terms < 0
    ratio = cov * scale.unsqueeze(-1) * scale.unsqueeze(-2)
    ratio = (0.5 * (ratio + ratio.mT)).masked_fill(eye, 0)
    with torch.no_grad():
        num_terms, terms = _mehler_terms(ratio.detach(), per_unit)
        unbounded = terms < 0
        unbounded = unbounded if bool(unbounded.any()) else None
    ratio = ratio.masked_fill(terms <= 0, 0)  # pairs without terms or not served: exactly 0
    coefficients, _ = _hermite_coefficients(
        mean, var, inducing_points, lengthscales, beta, num_terms
    )
    # checkpointed: the K intermediate [S, N, N] tensors are not kept for the backward pass
    return _checkpointed(_horner, ratio, coefficients, terms), unbounded


def _checkpointed(function, *args):
    """``function(*args)``; under autograd checkpointed, so that the backward pass recomputes
    its intermediates instead of keeping them."""
    if torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in args):
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
    return function(*args)


def _horner(ratio: Tensor, coefficients: Tensor, terms: Tensor) -> Tensor:
    """``sum_{k <= terms_nm} ratio_nm^k b_kn b_km`` by Horner's scheme on whole ``[S, N, N]``
    tensors, each pair to its own number of terms (term ``k + 1`` where ``terms > k``)."""
    total = 0
    for k in range(coefficients.shape[-1] - 1, -1, -1):
        term = coefficients[..., k]
        outer = (term.unsqueeze(-1) * term.unsqueeze(-2)).masked_fill_(terms <= k, 0)
        total = total * ratio + outer
    return total * ratio


def _lambda_entries_chunk(
    entries: Tensor,
    mean: Tensor,
    cov: Tensor,
    out_mean: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    centred: Tensor | None,
    std: Tensor | None,
    nodes: Tensor | None,
    weights: Tensor | None,
    narrow: Tensor | None,
) -> Tensor:
    r"""``Cov[f_n, f_m]`` of the entries ``(s, n, m)`` (``entries`` ``[3, E]``, ``n != m``),
    ``[E]``.

    *Broad* pairs: ``sum_rt beta_rn beta_tm Lambda_rtnm - mu_n mu_m`` with ``Lambda``
    (``eq:gpn_normal_lambda``, corrected) written with its exponent completed to a square,

    .. math::

        \Lambda_{rt} = \frac{\lambda_n \lambda_m}{\sqrt{D}}
            \exp\Big(-\frac{d_{rn}^2}{2 c_n}\Big)
            \exp\Big(-\frac{c_n (d_{tm} - \Sigma_{nm} d_{rn} / c_n)^2}{2 D}\Big),

    both factors ``<= 1`` (no overflow times underflow), and
    ``D = lambda_n^2 lambda_m^2 + lambda_n^2 Sigma_mm + lambda_m^2 Sigma_nn
    + (Sigma_nn Sigma_mm - Sigma_nm^2)`` (no cancellation as the correlation nears +-1).

    *Narrow* pairs (both units narrow, see :func:`response_moments`): with the quadrature nodes
    ``a_ni = mu_n + sd_n z_i`` (``nodes`` ``z [G]``, ``weights`` ``w [G]``) of ``a_n`` and the mean
    function's centred values there (``centred``), ``Cov = sum_i w_i (m_n(a_ni) - E m_n) (g_m(a_ni)
    - E g_m)`` where ``g_m(x) = E[m_m(a_m) | a_n = x]`` is ``psi^T beta_m`` under the conditional
    Gaussian ``N(mu_m + Sigma_nm / Sigma_nn (x - mu_n), Sigma_mm - Sigma_nm^2 / Sigma_nn)``: linear
    forms in ``beta`` only, consistent with the diagonal's quadrature variance.
    """
    num_units = mean.shape[-1]
    sample, n, m = entries
    ls = lengthscales.expand(num_units)
    ls2 = ls.square()
    beta = beta.expand(num_units, -1)
    points = inducing_points.expand(num_units, -1)
    var_n, var_m = cov[sample, n, n], cov[sample, m, m]  # [E]
    cross = 0.5 * (cov[sample, n, m] + cov[sample, m, n])  # the symmetric part, as the series
    c_n = ls2[n] + var_n
    det = ls2[n] * ls2[m] + ls2[n] * var_m + ls2[m] * var_n
    det = det + (var_n * var_m - cross.square()).clamp_min(0)
    d_n = points[n] - mean[sample, n].unsqueeze(-1)  # d_rn = V_rn - mu_n, [E, R]
    d_m = points[m] - mean[sample, m].unsqueeze(-1)
    left = beta[n] * (-d_n.square() / (2 * c_n).unsqueeze(-1)).exp()
    shift = (cross / c_n).unsqueeze(-1) * d_n  # [E, R]
    coupling = (d_m.unsqueeze(-2) - shift.unsqueeze(-1)).square_()
    coupling = coupling.mul_((-c_n / (2 * det))[..., None, None]).exp_()  # [E, R, R]
    quad = (left * (coupling @ beta[m].unsqueeze(-1)).squeeze(-1)).sum(-1)
    broad = ls[n] * ls[m] / det.sqrt() * quad - out_mean[sample, n] * out_mean[sample, m]
    if centred is None:
        return broad

    std_n = std[sample, n]
    slope = torch.where(std_n > 0, cross / torch.where(std_n > 0, std_n, 1), 0)  # Sigma_nm / sd_n
    cond_var = (var_m - slope.square()).clamp_min(0)
    width = ls2[m] + cond_var  # [E]
    centre = mean[sample, m].unsqueeze(-1) + slope.unsqueeze(-1) * nodes  # [E, G]
    expo = (centre.unsqueeze(-1) - points[m].unsqueeze(-2)).square()  # [E, G, R]
    expo = expo.mul_((-0.5 / width)[..., None, None]).exp_()
    cond_mean = (ls2[m] / width).sqrt().unsqueeze(-1) * torch.einsum("egr,er->eg", expo, beta[m])
    cond_mean = cond_mean - (cond_mean @ weights).unsqueeze(-1)
    at_nodes = (centred[sample, n] * cond_mean) @ weights
    return torch.where(narrow[sample, n] & narrow[sample, m], at_nodes, broad)


def _lambda_entries(
    entries: Tensor,
    mean: Tensor,
    cov: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    out_mean: Tensor,
    nodes: _NodeValues | None,
    narrow: Tensor,
) -> Tensor:
    """Off-diagonal covariances ``[E]`` of the entries ``(s, n, m)`` (``[3, E]``) through
    ``Lambda`` or the narrow regime's nodes, see :func:`_lambda_entries_chunk`.

    Evaluated in chunks of entries with at most :data:`COV_CHUNK_ELEMENTS` elements of the
    per-pair ``[R, R]`` (``Lambda``) and ``[G, R]`` (node) tensors each; under autograd each
    chunk is checkpointed, so the backward pass recomputes it instead of storing it. The cost
    is that of the entries asked for, not of every pair of their samples.
    """
    num_points = inducing_points.shape[-1]
    per_entry = num_points * max(num_points, nodes.centred.shape[-1] if nodes is not None else 0)
    chunk = max(1, COV_CHUNK_ELEMENTS // per_entry)
    extra = (
        (None,) * 5
        if nodes is None
        else (nodes.centred, nodes.std, nodes.nodes, nodes.weights, narrow)
    )
    args = (mean, cov, out_mean, inducing_points, lengthscales, beta, *extra)
    num_entries = entries.shape[-1]
    if chunk >= num_entries:
        return _lambda_entries_chunk(entries, *args)
    parts = [
        _checkpointed(_lambda_entries_chunk, entries[:, start : start + chunk], *args)
        for start in range(0, num_entries, chunk)
    ]
    return torch.cat(parts)
