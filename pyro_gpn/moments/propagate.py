r"""One GPN layer in the central-limit approximation: activation moments -> output moments.

Given the moments of the activations ``A = X W`` (``eq:gpn_normal_a``), a unit whose response
given its activation ``a`` is Gaussian with

.. math::

    E[f \mid a] = \alpha(a)^T \beta, \qquad
    Var[f \mid a] = 1 - \alpha(a)^T C \alpha(a), \qquad
    \alpha_r(a) = \exp\Big(-\frac{(a - V_r)^2}{2\lambda^2}\Big),

and output ``x = f + N(0, sigma^2)`` has, by the laws of total expectation and variance,

.. math::

    \tilde\mu = \psi^T \beta                                       (eq:gpn_normal_mu)

    \tilde\Sigma_{nn} = 1 - tr[(C - \beta\beta^T)\Omega] - \tilde\mu^2 + \sigma^2
                                                         (eq:gpn_normal_Sigmatilde)

    \tilde\Sigma_{nm} = \sum_{rt} \beta_{rn}\beta_{tm}\Lambda_{rtnm} - \tilde\mu_n\tilde\mu_m
                                                         (eq:gpn_normal_Sigmatilde_cov)

with ``psi``, ``Omega``, ``Lambda`` from :mod:`pyro_gpn.moments.expectations`. The matrix ``C``
(``variance_reduction``) is ``kappa = (K(V, V) + diag(S))^-1`` for the parametric GPN
(``eq:gpn_normal_alpha_kappa``) and ``Khat = K^-1 - K^-1 Sigma_U K^-1`` for the variational GPN
(``eq:gpn_vi_marginal_sigma_fl``); one implementation serves both.

Cost structure (paper, section "Computational and Model Complexity"):

* ``kappa`` and ``beta`` depend on the parameters only: :func:`virtual_observation_weights`
  computes them once per step, not per sample.
* ``tr[M Omega]`` with ``M = C - beta beta^T`` is a weighted sum of Gaussians in the activation
  mean, centred at the midpoints ``(V_r + V_t) / 2``. Weights over equal midpoints are summed
  ahead (:func:`midpoint_expansion`); for equidistant inducing points only ``2R - 1`` distinct
  midpoints exist, so the per-sample work is ``2R - 1`` exponentials instead of ``R^2``.
  Learnable (or irregular) inducing points fall back to the ``R (R + 1) / 2`` unordered pairs.
* the full covariance contracts ``Lambda`` with ``beta`` chunk by chunk over samples, so the
  ``[S, N, N, R, R]`` tensor is never held in memory at once (forward or backward).
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
import torch.utils.checkpoint
from torch import Tensor

from ..kernels import squared_exponential
from .backend import cpu_parameter_kernels, select_backend
from .gaussian import Moments

__all__ = [
    "MODES",
    "Mode",
    "gaussian_sum",
    "midpoint_expansion",
    "response_moments",
    "virtual_observation_weights",
]

Mode = Literal["mean", "meanvar", "cov"]
MODES: tuple[str, ...] = ("mean", "meanvar", "cov")

#: Upper bound on the elements of one ``Lambda`` chunk in the covariance path.
COV_CHUNK_ELEMENTS = 2**22


def virtual_observation_weights(
    inducing_points: Tensor,
    targets: Tensor,
    target_variances: Tensor,
    lengthscales: Tensor,
    jitter: float = 0.0,
    with_kappa: bool = True,
) -> tuple[Tensor | None, Tensor]:
    """GP-regression weights of the virtual observations (``eq:gpn_normal_alpha_kappa``).

    Args:
        inducing_points: ``[N | 1, R]`` inducing points ``V``.
        targets: ``[N | 1, R]`` targets ``U``.
        target_variances: ``[N | 1, R]`` variances ``S`` (positive).
        lengthscales: ``[N | 1]``.
        jitter: added to the diagonal of ``K(V, V) + diag(S)``.
        with_kappa: also return ``kappa`` (needed for variances, not for means).

    Returns:
        ``kappa = (K(V, V) + diag(S))^-1`` of shape ``[N | 1, R, R]`` (or ``None``) and
        ``beta = kappa U`` of shape ``[N | 1, R]``. ``K(V, V) + diag(S)`` is symmetric positive
        definite for positive ``S``; the batched ``R x R`` inverse is the cheapest stable way to
        get both at once for the small ``R`` a GPN uses.
    """
    if cpu_parameter_kernels(inducing_points, targets, target_variances, lengthscales):
        from .cpu_kernels import cpu_virtual_observation_weights

        kappa, beta = cpu_virtual_observation_weights(
            inducing_points, targets, target_variances, lengthscales, jitter
        )
        return (kappa if with_kappa else None), beta
    gram = squared_exponential(inducing_points, inducing_points, lengthscales)
    gram = gram + torch.diag_embed(target_variances + jitter)
    if not with_kappa:
        return None, torch.linalg.solve(gram, targets)
    kappa = torch.linalg.inv(gram)
    kappa = 0.5 * (kappa + kappa.mT)
    return kappa, (kappa @ targets.unsqueeze(-1)).squeeze(-1)


def is_equidistant(inducing_points: Tensor, rtol: float = 1e-6) -> bool:
    """True if every row of ``inducing_points`` ``[N, R]`` is equally spaced and ascending."""
    if inducing_points.shape[-1] < 3:
        return True
    steps = inducing_points.diff(dim=-1)
    scale = steps.abs().amax().clamp_min(torch.finfo(steps.dtype).tiny)
    return bool(((steps - steps[..., :1]).abs() <= rtol * scale).all() and (steps > 0).all())


@functools.lru_cache(maxsize=32)
def _antidiagonal_sum_matrix(size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[R*R, 2R-1]`` 0/1 matrix mapping entry ``(r, t)`` to anti-diagonal ``r + t``."""
    idx = torch.arange(size, device=device)
    k = (idx[:, None] + idx[None, :]).reshape(-1)
    out = torch.zeros(size * size, 2 * size - 1, dtype=dtype, device=device)
    out[torch.arange(size * size, device=device), k] = 1
    return out


def midpoint_expansion(
    inducing_points: Tensor,
    matrix: Tensor,
    lengthscales: Tensor,
    equidistant: bool | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Write ``tr[M Omega]`` as a sum of Gaussians centred at the midpoints of ``V``.

    From ``eq:gpn_normal_omega``, for a symmetric ``M``,

    .. math::

        \sum_{rt} M_{rt}\Omega_{rt} = \sqrt{\frac{\lambda^2}{\lambda^2 + 2v}}
            \sum_k P_k \exp\Big(-\frac{(\mu - c_k)^2}{\lambda^2 + 2v}\Big),
        \qquad P_k = \sum_{(r,t):\,(V_r+V_t)/2 = c_k} M_{rt}\,
                     e^{-(V_r - V_t)^2 / (4\lambda^2)}.

    Args:
        inducing_points: ``[N | 1, R]``.
        matrix: ``[N | 1, R, R]`` symmetric ``M``.
        lengthscales: ``[N | 1]``.
        equidistant: whether each row of ``V`` is equally spaced (``2R - 1`` midpoints);
            ``None`` detects it (only for inducing points that need no gradient).

    Returns:
        ``centers`` and ``weights``, each ``[N | 1, K]`` with ``K = 2R - 1`` (equidistant) or
        ``R (R + 1) / 2``.
    """
    num_points = inducing_points.shape[-1]
    if equidistant is None:
        equidistant = not inducing_points.requires_grad and is_equidistant(inducing_points)
    sep = inducing_points.unsqueeze(-1) - inducing_points.unsqueeze(-2)
    damped = matrix * (-sep.square() / (4 * lengthscales.square()[..., None, None])).exp()
    if equidistant:
        num_units = max(damped.shape[0], inducing_points.shape[0])
        summed = damped.expand(num_units, -1, -1).reshape(num_units, num_points * num_points)
        weights = summed @ _antidiagonal_sum_matrix(num_points, damped.dtype, damped.device)
        first, last = inducing_points[..., :1], inducing_points[..., -1:]
        steps = torch.arange(2 * num_points - 1, dtype=damped.dtype, device=damped.device)
        centers = first + (last - first) * steps / (2 * num_points - 2)
        return centers.expand(num_units, -1), weights
    rows, cols = torch.triu_indices(num_points, num_points, device=damped.device)
    multiplicity = torch.where(rows == cols, 1.0, 2.0).to(damped.dtype)
    weights = damped[..., rows, cols] * multiplicity
    centers = 0.5 * (inducing_points[..., rows] + inducing_points[..., cols])
    num_units = max(weights.shape[0], centers.shape[0])
    return centers.expand(num_units, -1), weights.expand(num_units, -1)


class _GaussianSum(torch.autograd.Function):
    """Autograd for :func:`gaussian_sum` with a hand-derived backward pass.

    With ``e_k = exp(-(mu - c_k)^2 / w)`` and ``out = sum_k p_k e_k``:
    ``d out / d mu = -2 / w * sum_k p_k e_k (mu - c_k)``,
    ``d out / d w = 1 / w^2 * sum_k p_k e_k (mu - c_k)^2``,
    ``d out / d p_k = e_k`` and ``d out / d c_k = 2 / w * p_k e_k (mu - c_k)``.
    Compared with recording each elementwise step it makes about half as many passes over the
    ``[S, N, K]`` tensors and keeps two of them (differences and exponentials) for the backward.
    """

    @staticmethod
    def forward(ctx, mean: Tensor, width: Tensor, centers: Tensor, weights: Tensor) -> Tensor:
        diff = mean.unsqueeze(-1) - centers
        expo = diff.square().mul_((-1 / width).unsqueeze(-1)).exp_()
        ctx.save_for_backward(width, weights, diff, expo)
        return (expo * weights).sum(-1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        width, weights, diff, expo = ctx.saved_tensors
        need_mean, need_width, need_centers, need_weights = ctx.needs_input_grad
        grad_mean = grad_width = grad_centers = grad_weights = None
        if need_mean or need_width or need_centers:
            scaled = grad / width
            weighted = (expo * weights).mul_(diff)  # p_k e_k (mu - c_k)
            if need_mean:
                grad_mean = -2 * scaled * weighted.sum(-1)
            if need_width:
                grad_width = scaled / width * (weighted * diff).sum(-1)
            if need_centers:
                grad_centers = 2 * torch.einsum("sn,snk->nk", scaled, weighted)
        if need_weights:
            grad_weights = torch.einsum("sn,snk->nk", grad, expo)
        return grad_mean, grad_width, grad_centers, grad_weights


def gaussian_sum(mean: Tensor, width: Tensor, centers: Tensor, weights: Tensor) -> Tensor:
    """``sum_k weights[n, k] * exp(-(mean[s, n] - centers[n, k])^2 / width[s, n])``.

    The one per-sample primitive of the mean and variance paths: ``psi^T beta`` is such a sum
    with ``width = 2 (lambda^2 + v)`` over the inducing points, ``tr[M Omega]`` one with
    ``width = lambda^2 + 2 v`` over the midpoints (:func:`midpoint_expansion`).

    Args:
        mean: ``[S, N]``; width: ``[S, N]`` (positive); centers, weights: ``[N, K]``.

    Returns:
        ``[S, N]``.
    """
    return _GaussianSum.apply(mean, width.expand_as(mean), centers, weights)


def _expand_units(tensor: Tensor, num_units: int) -> Tensor:
    return tensor.expand(num_units, *tensor.shape[1:])


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def response_moments(
    activations: Moments,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    variance_reduction: Tensor | None,
    noise_var: Tensor | None = None,
    mode: Mode = "meanvar",
    equidistant: bool | None = None,
) -> Moments:
    """Moments of a GPN layer's outputs given the moments of its activations.

    Args:
        activations: :class:`Moments` of the activations ``A``, ``[S, N]``: deterministic,
            with ``var`` or with ``cov``. A ``cov`` is only read in ``"cov"`` mode; the other
            modes use its diagonal.
        inducing_points: ``[N | 1, R]``.
        lengthscales: ``[N | 1]``.
        beta: ``[N | 1, R]`` weights of the conditional mean ``alpha(a)^T beta``.
        variance_reduction: ``[N | 1, R, R]`` symmetric ``C`` of the conditional variance
            ``1 - alpha(a)^T C alpha(a)``; may be ``None`` in ``"mean"`` mode.
        noise_var: ``[N | 1]`` output noise variance ``sigma^2``, or ``None`` for the noise-free
            response ``F``.
        mode: ``"mean"`` (means only: the paper's "GPN mean"), ``"meanvar"`` (means and
            variances, ``eq:gpn_normal_Sigmatilde``) or ``"cov"`` (full covariance,
            ``eq:gpn_normal_Sigmatilde_cov``).
        equidistant: passed to :func:`midpoint_expansion` (``None`` detects).

    Returns:
        :class:`Moments` of the outputs: ``mean`` only, ``mean`` and ``var``, or ``mean`` and
        ``cov`` (diagonal when the activations carry no covariance, since the units' activation
        functions are independent GPs).
    """
    _check_mode(mode)
    if mode != "mean" and variance_reduction is None:
        raise ValueError(f"variance_reduction is required in mode {mode!r}")
    mean, var = activations.mean, activations.variance
    num_units = mean.shape[-1]
    ls2 = lengthscales.square()

    # eq:gpn_normal_mu with psi from eq:gpn_normal_E_alpha
    kind = select_backend(
        mean,
        var,
        lengthscales,
        beta,
        variance_reduction,
        noise_var,
        inducing_points=inducing_points,
        equidistant=equidistant,
    )
    if kind != "reference":
        return _fused_response_moments(
            activations,
            inducing_points,
            lengthscales,
            beta,
            variance_reduction,
            noise_var,
            mode,
            kind,
        )
    width_psi = 2 * (ls2 + var)
    amplitude_psi = (ls2 / (ls2 + var)).sqrt()
    centers = _expand_units(inducing_points, num_units)
    out_mean = amplitude_psi * gaussian_sum(
        mean, width_psi, centers, _expand_units(beta, num_units)
    )
    if mode == "mean":
        return Moments(out_mean, validate=False)

    # eq:gpn_normal_Sigmatilde through the midpoint expansion of tr[(C - beta beta^T) Omega]
    matrix = variance_reduction - beta.unsqueeze(-1) * beta.unsqueeze(-2)
    mid_centers, mid_weights = midpoint_expansion(
        inducing_points, matrix, lengthscales, equidistant
    )
    width_omega = ls2 + 2 * var
    trace = (ls2 / width_omega).sqrt() * gaussian_sum(
        mean,
        width_omega,
        _expand_units(mid_centers, num_units),
        _expand_units(mid_weights, num_units),
    )
    out_var = (1 - trace - out_mean.square()).clamp_min(0)
    if noise_var is not None:
        out_var = out_var + noise_var
    if mode == "meanvar" or activations.cov is None:
        if mode == "cov":
            return Moments(out_mean, cov=torch.diag_embed(out_var), validate=False)
        return Moments(out_mean, var=out_var, validate=False)

    # eq:gpn_normal_Sigmatilde_cov: off-diagonal from Lambda contracted with beta, in chunks
    cross = _cross_second_moment(mean, activations.cov, inducing_points, lengthscales, beta)
    out_cov = cross - out_mean.unsqueeze(-1) * out_mean.unsqueeze(-2)
    eye = torch.eye(num_units, dtype=torch.bool, device=mean.device)
    out_cov = torch.where(eye, torch.diag_embed(out_var), out_cov)
    return Moments(out_mean, cov=0.5 * (out_cov + out_cov.mT), validate=False)


def _fused_response_moments(
    activations: Moments,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    variance_reduction: Tensor | None,
    noise_var: Tensor | None,
    mode: Mode,
    kind: str = "triton",
) -> Moments:
    """:func:`response_moments` through the fused kernels: ``kind`` ``"triton"``
    (:mod:`pyro_gpn.moments.fused`) or ``"cpu"`` (:mod:`pyro_gpn.moments.cpu_kernels`).

    In ``"cov"`` mode the CPU kernels give the diagonal (the variances) and the off-diagonal
    cross term comes from :func:`_cross_second_moment`, as on the reference path.
    """
    mean = activations.mean
    var = None if activations.is_deterministic else activations.variance
    if kind == "cpu":
        from .cpu_kernels import cpu_response_mean, cpu_response_meanvar

        if mode == "mean":
            return Moments(
                cpu_response_mean(mean, var, inducing_points, lengthscales, beta), validate=False
            )
        var = activations.variance if var is None else var
        out_mean, out_var = cpu_response_meanvar(
            mean, var, inducing_points, lengthscales, beta, variance_reduction, noise_var
        )
        if mode == "meanvar":
            return Moments(out_mean, var=out_var, validate=False)
        if activations.cov is None:
            return Moments(out_mean, cov=torch.diag_embed(out_var), validate=False)
        cross = _cross_second_moment(mean, activations.cov, inducing_points, lengthscales, beta)
        out_cov = cross - out_mean.unsqueeze(-1) * out_mean.unsqueeze(-2)
        eye = torch.eye(mean.shape[-1], dtype=torch.bool, device=mean.device)
        out_cov = torch.where(eye, torch.diag_embed(out_var), out_cov)
        return Moments(out_mean, cov=0.5 * (out_cov + out_cov.mT), validate=False)

    from .fused import fused_response_cov, fused_response_mean, fused_response_meanvar

    if mode == "mean":
        out = fused_response_mean(mean, var, inducing_points, lengthscales, beta)
        return Moments(out, validate=False)
    if mode == "cov" and activations.cov is not None:
        out_mean, out_cov = fused_response_cov(
            mean,
            activations.cov,
            inducing_points,
            lengthscales,
            beta,
            variance_reduction,
            noise_var,
        )
        return Moments(out_mean, cov=out_cov, validate=False)
    out_mean, out_var = fused_response_meanvar(
        mean,
        activations.variance,
        inducing_points,
        lengthscales,
        beta,
        variance_reduction,
        noise_var,
    )
    if mode == "cov":
        return Moments(out_mean, cov=torch.diag_embed(out_var), validate=False)
    return Moments(out_mean, var=out_var, validate=False)


def _cross_second_moment_chunk(
    mean: Tensor, cov: Tensor, inducing_points: Tensor, lengthscales: Tensor, beta: Tensor
) -> Tensor:
    """``sum_rt beta_rn beta_tm Lambda_rtnm`` for the unit pairs ``n < m``, ``[S, N (N - 1) / 2]``.

    ``Lambda`` (``eq:gpn_normal_lambda``, corrected) factorises into per-unit Gaussians and one
    coupling term, ``Lambda_rt = s * g_r * h_t * exp(rho d_r d_t)`` with ``rho = Sigma_nm / D``,
    so only the coupling is ``R x R`` per pair; it is contracted with the per-unit factors by a
    batched matrix product.
    """
    num_units = mean.shape[-1]
    rows, cols = torch.triu_indices(num_units, num_units, offset=1, device=mean.device)
    ls = lengthscales.expand(num_units)
    beta = beta.expand(num_units, -1)
    width = ls.square() + torch.diagonal(cov, dim1=-2, dim2=-1)  # c_n = lambda_n^2 + Sigma_nn
    c_n, c_m, cross = width[:, rows], width[:, cols], cov[:, rows, cols]  # [S, P]
    det = c_n * c_m - cross.square()
    dist = inducing_points.expand(num_units, -1) - mean.unsqueeze(-1)  # d_rn = V_rn - mu_n
    d_n, d_m = dist[:, rows], dist[:, cols]  # [S, P, R]
    half_inv = 0.5 / det
    left = beta[rows] * (-d_n.square() * (c_m * half_inv).unsqueeze(-1)).exp()
    right = beta[cols] * (-d_m.square() * (c_n * half_inv).unsqueeze(-1)).exp()
    rho = (cross / det).unsqueeze(-1)
    coupling = ((rho * d_n).unsqueeze(-1) * d_m.unsqueeze(-2)).exp_()  # [S, P, R, R]
    quad = (left * (coupling @ right.unsqueeze(-1)).squeeze(-1)).sum(-1)
    return ls[rows] * ls[cols] / det.sqrt() * quad


def _cross_second_moment(
    mean: Tensor, cov: Tensor, inducing_points: Tensor, lengthscales: Tensor, beta: Tensor
) -> Tensor:
    """``E[mu_n(a) mu_m(a)] = sum_rt beta_rn beta_tm Lambda_rtnm`` off the diagonal, ``[S, N, N]``.

    Evaluated in chunks of samples with at most :data:`COV_CHUNK_ELEMENTS` entries of
    ``Lambda`` each; under autograd each chunk is checkpointed, so the backward pass recomputes
    it instead of storing it.
    """
    num_samples, num_units = mean.shape
    per_sample = max(1, num_units * (num_units - 1) // 2) * inducing_points.shape[-1] ** 2
    chunk = max(1, COV_CHUNK_ELEMENTS // per_sample)
    if chunk >= num_samples:
        pairs = _cross_second_moment_chunk(mean, cov, inducing_points, lengthscales, beta)
        return _pairs_to_matrix(pairs, num_units)
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (mean, cov, inducing_points, lengthscales, beta)
    )
    parts = []
    for start in range(0, num_samples, chunk):
        args = (mean[start : start + chunk], cov[start : start + chunk])
        if needs_grad:
            parts.append(
                torch.utils.checkpoint.checkpoint(
                    _cross_second_moment_chunk,
                    *args,
                    inducing_points,
                    lengthscales,
                    beta,
                    use_reentrant=False,
                )
            )
        else:
            parts.append(_cross_second_moment_chunk(*args, inducing_points, lengthscales, beta))
    return _pairs_to_matrix(torch.cat(parts), num_units)


def _pairs_to_matrix(pairs: Tensor, num_units: int) -> Tensor:
    """Scatter ``[S, N (N - 1) / 2]`` values of the pairs ``n < m`` into symmetric ``[S, N, N]``
    matrices with a zero diagonal."""
    rows, cols = torch.triu_indices(num_units, num_units, offset=1, device=pairs.device)
    out = pairs.new_zeros(pairs.shape[0], num_units, num_units)
    out[:, rows, cols] = pairs
    return out + out.mT
