r"""Off-diagonal output covariances of a GPN layer (``eq:gpn_normal_Sigmatilde_cov``,
``"cov"`` mode of :func:`~pyro_gpn.moments.propagate.response_moments`), chunked over samples
and checkpointed so that the per-pair ``[R, R]`` tensors are never all held at once."""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import Tensor

from .quadrature import _NodeValues, gauss_hermite

__all__ = [
    "COV_CHUNK_ELEMENTS",
]


#: Upper bound on the elements of one ``Lambda`` chunk in the covariance path.
COV_CHUNK_ELEMENTS = 2**22


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
