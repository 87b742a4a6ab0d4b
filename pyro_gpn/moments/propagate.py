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

Numerics (issue 13, ``docs/results/accuracy.md``): ``beta`` has huge alternating entries when
``K + S`` is ill-conditioned, and the closed-form variance cancels terms of size ``|beta|^2``.
Where the activation is narrow against the kernel the variance is therefore evaluated by
Gauss-Hermite quadrature of the (well-conditioned) mean function and conditional variance
(:func:`response_moments`); ``Lambda``'s exponent is completed to a square so that no factor
overflows.
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
    "CLOSED_FORM_RTOL",
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

#: The narrow regime: activation standard deviation at most this multiple of the lengthscale
#: (beyond it the closed form is accurate: float64 relative error <= 1e-6 from the ratio 1.2 in
#: the hardest regimes of ``docs/results/accuracy.md``, 2e-6 at 1.0).
GH_MAX_STD_RATIO = 1.25

#: Gauss-Hermite node counts of the narrow regime: ``(ratio, nodes)``, the first row whose
#: ratio is at least the largest ``sqrt(v) / lambda`` of the narrow samples in the call gives the
#: node count (measured in float64: <= 3e-7 relative at each row's ratio, 1e-9 well inside).
#: Deterministic activations (``v = 0``) need one node.
GH_TIERS: tuple[tuple[float, int], ...] = (
    (0.0, 1),
    (0.1, 8),
    (0.2, 12),
    (0.4, 20),
    (0.75, 32),
    (1.0, 48),
    (1.25, 64),
)


#: The closed-form variance is used in the narrow regime too wherever its rounding-error bound
#: (:func:`closed_form_error_scale` times the magnitude of its terms) is at most this fraction
#: of its value: well-conditioned units (``K + S`` far from singular) pay no quadrature.
CLOSED_FORM_RTOL = 1e-8


def closed_form_error_scale(num_points: int, dtype: torch.dtype) -> float:
    """Rounding-error factor of the closed-form variance ``1 - tr[(C - beta beta^T) Omega] -
    mu^2``: each of its ``2R - 1`` midpoint terms (and the ``R`` products summed into each) is
    exact to ``~(2R + 8) eps`` relative, so the sum is wrong by at most this factor times the sum
    of the terms' magnitudes ``1 + tr[(|C| + |beta| |beta|^T) Omega] + mu^2`` (a factor 4 of
    margin)."""
    return 4.0 * (2 * num_points + 8) * torch.finfo(dtype).eps


def gauss_hermite_nodes(std_ratio: float) -> int:
    """Node count of :data:`GH_TIERS` for the largest ``sqrt(v) / lambda`` of a call."""
    for ratio, nodes in GH_TIERS:
        if std_ratio <= ratio:
            return nodes
    return GH_TIERS[-1][1]


@functools.lru_cache(maxsize=16)
def gauss_hermite(
    num_nodes: int, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Probabilists' Gauss-Hermite rule: nodes ``z`` and weights ``w`` (summing to 1) with
    ``E[g(Z)] ~ sum_i w_i g(z_i)`` for ``Z ~ N(0, 1)``, exact for polynomials of degree
    ``< 2 num_nodes``. Each ``[num_nodes]``."""
    import numpy as np

    nodes, weights = np.polynomial.hermite_e.hermegauss(num_nodes)
    weights = weights / weights.sum()
    return (
        torch.tensor(nodes, dtype=dtype, device=device),
        torch.tensor(weights, dtype=dtype, device=device),
    )


def _safe_sqrt(x: Tensor) -> Tensor:
    """``sqrt(max(x, 0))`` with a zero (not infinite) derivative at ``x <= 0``."""
    positive = x > 0
    return torch.where(positive, torch.where(positive, x, 1).sqrt(), 0)


def virtual_observation_weights(
    inducing_points: Tensor,
    targets: Tensor,
    target_variances: Tensor,
    lengthscales: Tensor,
    jitter: float = 0.0,
    with_kappa: bool = True,
    with_cholesky: bool = False,
) -> tuple[Tensor | None, Tensor] | tuple[Tensor | None, Tensor, Tensor]:
    """GP-regression weights of the virtual observations (``eq:gpn_normal_alpha_kappa``).

    Args:
        inducing_points: ``[N | 1, R]`` inducing points ``V``.
        targets: ``[N | 1, R]`` targets ``U``.
        target_variances: ``[N | 1, R]`` variances ``S`` (positive).
        lengthscales: ``[N | 1]``.
        jitter: added to the diagonal of ``K(V, V) + diag(S)``.
        with_kappa: also return ``kappa`` (needed for variances, not for means).
        with_cholesky: also return the lower Cholesky factor ``L`` of ``K(V, V) + diag(S)``,
            the ``variance_cholesky`` of :func:`response_moments` (the accurate conditional
            variance ``1 - |L^-1 alpha(a)|^2``).

    Returns:
        ``kappa = (K(V, V) + diag(S))^-1`` of shape ``[N | 1, R, R]`` (or ``None``),
        ``beta = kappa U`` of shape ``[N | 1, R]``, and with ``with_cholesky`` ``L``
        ``[N | 1, R, R]``. ``beta`` comes from two triangular solves with ``L``. ``kappa`` is
        the LU-based inverse, symmetrised: measured against 50-digit arithmetic
        (``docs/results/accuracy.md``) it gives ``alpha^T kappa alpha`` more accurately than
        ``cholesky_inverse`` when ``K + S`` is ill-conditioned; where that matters the variance
        path uses ``L`` instead.
    """
    if not with_cholesky and cpu_parameter_kernels(
        inducing_points, targets, target_variances, lengthscales
    ):
        from .cpu_kernels import NotPositiveDefinite, cpu_virtual_observation_weights

        try:
            kappa, beta = cpu_virtual_observation_weights(
                inducing_points, targets, target_variances, lengthscales, jitter
            )
            return (kappa if with_kappa else None), beta
        except NotPositiveDefinite:
            pass  # the reference path below retries with more jitter
    gram = squared_exponential(inducing_points, inducing_points, lengthscales)
    gram = gram + torch.diag_embed(target_variances + jitter)
    chol = safe_cholesky(gram)
    beta = torch.cholesky_solve(targets.unsqueeze(-1), chol).squeeze(-1)
    kappa = None
    if with_kappa:
        kappa = torch.linalg.inv(gram)
        kappa = 0.5 * (kappa + kappa.mT)
    if with_cholesky:
        return kappa, beta, chol
    return kappa, beta


def safe_cholesky(matrix: Tensor, max_tries: int = 4) -> Tensor:
    """Lower Cholesky factor of the symmetric positive definite ``[..., R, R]`` ``matrix``.

    When rounding makes a numerically singular ``matrix`` (a long lengthscale and a target
    variance near the dtype's resolution) indefinite, retries with ``10^k * eps * max diag``
    added to the diagonal, ``k = 0 .. max_tries - 1``, and raises a clear error after that.
    """
    chol, info = torch.linalg.cholesky_ex(matrix)
    if not bool((info > 0).any()):
        return chol
    eps = torch.finfo(matrix.dtype).eps
    scale = torch.diagonal(matrix, dim1=-2, dim2=-1).amax(-1, keepdim=True).detach()
    for k in range(max_tries):
        extra = torch.diag_embed((10.0**k * eps * scale).expand(matrix.shape[:-1]))
        chol, info = torch.linalg.cholesky_ex(matrix + extra)
        if not bool((info > 0).any()):
            return chol
    raise ValueError(
        "K(V, V) + diag(S) is not positive definite in "
        f"{matrix.dtype} (increase the target variances or the jitter, or compute in float64)"
    )


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
    variance_cholesky: Tensor | None = None,
    variance_inner: Tensor | None = None,
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
        variance_cholesky: optional ``[N | 1, R, R]`` lower ``L`` with
            ``C = (L L^T)^-1`` exactly (the parametric GPN: the Cholesky factor of
            ``K(V, V) + diag(S)``, :func:`virtual_observation_weights` with
            ``with_cholesky=True``). In the narrow regime the conditional variance is then
            ``1 - |L^-1 alpha(a)|^2``, accurate where ``alpha^T C alpha`` with an explicit ``C``
            loses ``eps * cond(K + S)`` (float32 and small ``S``). Must not be given when ``C``
            has another form, unless ``variance_inner`` is given.
        variance_inner: optional symmetric ``[N | 1, R, R]`` ``M`` with
            ``C = L^-T M L^-1`` (with ``L = variance_cholesky``; default ``M = I``). For the
            variational GPN, ``L = chol(K + jitter)`` and ``M = I - B B^T`` with ``B`` the
            whitened posterior scale (``B = L^-1 chol(Sigma_U)`` when not whitened) give
            ``Khat`` (``eq:gpn_vi_sampling_sigmahat_fl``); the conditional variance is then
            ``1 - x^T M x`` with ``x = L^-1 alpha(a)``.

    Numerics (``docs/results/accuracy.md``): the variance is computed per sample and unit in
    one of two regimes. *Broad* (``v > (GH_MAX_STD_RATIO * lambda)^2``): the closed form
    ``1 - tr[(C - beta beta^T) Omega] - mu^2``, exact in exact arithmetic and accurate when the
    Gaussian is wide against the kernel. *Narrow*: Gauss-Hermite quadrature with
    :data:`GH_TIERS` nodes of the centred spread of ``m(a)`` and of the conditional variance
    (:func:`_node_values`), which does not cancel the ``|beta|^2``-sized terms that make the
    closed form lose up to all digits when ``K + S`` is ill-conditioned. The mean is always the
    closed form ``psi^T beta`` (a linear form in ``beta``). ``"cov"`` mode uses the same
    variances on its diagonal and the same regimes for the off-diagonal (see
    :func:`_cross_covariance`).

    Returns:
        :class:`Moments` of the outputs: ``mean`` only, ``mean`` and ``var``, or ``mean`` and
        ``cov`` (diagonal when the activations carry no covariance, since the units' activation
        functions are independent GPs).
    """
    _check_mode(mode)
    if mode != "mean" and variance_reduction is None:
        raise ValueError(f"variance_reduction is required in mode {mode!r}")
    if variance_inner is not None and variance_cholesky is None:
        raise ValueError("variance_inner requires variance_cholesky (C = L^-T M L^-1)")
    num_points = inducing_points.shape[-1]
    for name, factor in (
        ("variance_cholesky", variance_cholesky),
        ("variance_inner", variance_inner),
    ):
        if factor is not None and tuple(factor.shape[-2:]) != (num_points, num_points):
            raise ValueError(
                f"{name} must be [N | 1, {num_points}, {num_points}], got {tuple(factor.shape)}"
            )
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
        variance_cholesky,
        inducing_points=inducing_points,
        equidistant=equidistant,
        cpu_unsupported=_cpu_unsupported(mode, activations, variance_cholesky),
        triton_auto=mode == "mean",
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

    # eq:gpn_normal_Sigmatilde, broad regime: midpoint expansion of tr[(C - beta beta^T) Omega]
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
    out_var = 1 - trace - out_mean.square()

    # narrow regime: Gauss-Hermite nodes of a ~ N(mean, var), centred spread of m(a), with each
    # row's node tier, where the closed form is not provably accurate
    ratio2 = var / ls2
    narrow = ratio2 <= GH_MAX_STD_RATIO**2
    quadrature = narrow
    if variance_cholesky is None and bool(narrow.any()):
        with torch.no_grad():
            abs_beta = beta.abs()
            _, abs_weights = midpoint_expansion(
                inducing_points,
                variance_reduction.abs() + abs_beta.unsqueeze(-1) * abs_beta.unsqueeze(-2),
                lengthscales,
                equidistant,
            )
            magnitude = 1 + (ls2 / width_omega).sqrt() * gaussian_sum(
                mean,
                width_omega,
                _expand_units(mid_centers, num_units),
                _expand_units(abs_weights, num_units),
            )
            bound = closed_form_error_scale(num_points, mean.dtype) * (
                magnitude + out_mean.square()
            )
            quadrature = narrow & ~(bound <= CLOSED_FORM_RTOL * out_var)
    if bool(quadrature.any()):
        out_var = _node_variance_rows(
            out_var,
            quadrature,
            mean,
            var,
            inducing_points,
            lengthscales,
            beta,
            variance_reduction,
            variance_cholesky,
            variance_inner,
        )
    nodes = None
    if mode == "cov" and activations.cov is not None and bool(narrow.any()):
        num_nodes = gauss_hermite_nodes(float(ratio2.detach().where(narrow, 0).amax()) ** 0.5)
        nodes = _node_values(
            mean,
            var,
            inducing_points,
            lengthscales,
            beta,
            variance_reduction,
            variance_cholesky,
            variance_inner,
            num_nodes,
        )
    out_var = out_var.clamp_min(0)
    if noise_var is not None:
        out_var = out_var + noise_var
    if mode == "meanvar" or activations.cov is None:
        if mode == "cov":
            return Moments(out_mean, cov=torch.diag_embed(out_var), validate=False)
        return Moments(out_mean, var=out_var, validate=False)

    # eq:gpn_normal_Sigmatilde_cov: off-diagonal covariances, in chunks of samples
    out_cov = _cross_covariance(
        mean, activations.cov, inducing_points, lengthscales, beta, out_mean, nodes, narrow
    )
    eye = torch.eye(num_units, dtype=torch.bool, device=mean.device)
    out_cov = torch.where(eye, torch.diag_embed(out_var), out_cov)
    return Moments(out_mean, cov=0.5 * (out_cov + out_cov.mT), validate=False)


class _NodeValues:
    """The mean function at the Gauss-Hermite nodes of each activation (narrow regime)."""

    def __init__(self, centred: Tensor, variance: Tensor, std: Tensor, weights: Tensor):
        self.centred = centred  # [S, N, G]: m(a_i) - sum_i w_i m(a_i)
        self.variance = variance  # [S, N]: E[1 - alpha^T C alpha] + Var[m(a)], noise-free
        self.std = std  # [S, N]
        self.weights = weights  # [G]


def _node_variance_rows(
    out_var: Tensor,
    rows: Tensor,
    mean: Tensor,
    var: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    variance_reduction: Tensor,
    variance_cholesky: Tensor | None,
    variance_inner: Tensor | None,
) -> Tensor:
    r"""``out_var`` ``[S, N]`` with the entries ``rows`` (bool ``[S, N]``) replaced by their
    Gauss-Hermite variance (:func:`_node_values`), each with the node count of its own
    ``sqrt(v) / lambda`` (:data:`GH_TIERS`): the rows of one tier are gathered, evaluated with
    their units' parameters and scattered back."""
    num_units = mean.shape[-1]
    ls2 = lengthscales.expand(num_units).square()
    std_ratio = (var.detach() / ls2.detach()).clamp_min(0).sqrt()
    bounds = torch.tensor([r for r, _ in GH_TIERS], dtype=std_ratio.dtype, device=mean.device)
    tier = torch.searchsorted(bounds, std_ratio.contiguous()).clamp_max(len(GH_TIERS) - 1)
    points = inducing_points.expand(num_units, -1)
    beta = beta.expand(num_units, -1)
    flat = out_var.reshape(-1)
    for t in tier[rows].unique().tolist():
        sel = (rows & (tier == t)).reshape(-1).nonzero().squeeze(-1)
        unit = sel % num_units
        z, w = gauss_hermite(GH_TIERS[t][1], mean.dtype, mean.device)
        m_sel = mean.reshape(-1)[sel]
        std = _safe_sqrt(var.reshape(-1)[sel])
        nodes = m_sel.unsqueeze(-1) + std.unsqueeze(-1) * z  # [P, G]
        diff = nodes.unsqueeze(-1) - points[unit].unsqueeze(-2)  # [P, G, R]
        alpha = (diff.square() * (-0.5 / ls2[unit])[:, None, None]).exp()
        values = (alpha @ beta[unit].unsqueeze(-1)).squeeze(-1)
        centred = values - (values @ w).unsqueeze(-1)
        if variance_cholesky is not None:
            chol = variance_cholesky.expand(num_units, -1, -1)[unit]
            solved = torch.linalg.solve_triangular(chol, alpha.mT, upper=False)  # [P, R, G]
            if variance_inner is None:
                quad = solved.square().sum(-2)
            else:
                inner = variance_inner.expand(num_units, -1, -1)[unit]
                quad = (solved * (inner @ solved)).sum(-2)
        else:
            reduction = variance_reduction.expand(num_units, -1, -1)[unit]
            quad = ((alpha @ reduction) * alpha).sum(-1)
        flat = flat.index_put((sel,), ((1 - quad) + centred.square()) @ w)
    return flat.reshape(out_var.shape)


def _node_values(
    mean: Tensor,
    var: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    variance_reduction: Tensor,
    variance_cholesky: Tensor | None,
    variance_inner: Tensor | None = None,
    num_nodes: int = GH_TIERS[-1][1],
) -> _NodeValues:
    r"""``Var[f] = E[1 - alpha(a)^T C alpha(a)] + E[(m(a) - E m)^2]`` by Gauss-Hermite.

    With ``a_i = mu + sqrt(v) z_i``: ``m_i = alpha(a_i)^T beta`` (a linear form: accurate
    however large and alternating ``beta`` is), ``q_i = alpha(a_i)^T C alpha(a_i)`` or, given
    ``L`` with ``C = (L L^T)^-1``, ``q_i = |L^-1 alpha(a_i)|^2`` by a triangular solve
    (``x^T M x`` with ``x = L^-1 alpha(a_i)`` given ``M = variance_inner``) (accurate
    to ~eps where an explicit ``C`` loses ``eps * cond(K + S)``), and
    ``Var = sum_i w_i [(1 - q_i) + (m_i - sum_j w_j m_j)^2]``: no cancellation of terms of size
    ``|beta|^2``.
    """
    num_units = mean.shape[-1]
    z, w = gauss_hermite(num_nodes, mean.dtype, mean.device)
    std = _safe_sqrt(var)
    nodes = mean.unsqueeze(-1) + std.unsqueeze(-1) * z  # [S, N, G]
    points = inducing_points.expand(num_units, -1)
    ls2 = lengthscales.expand(num_units).square()
    diff = nodes.unsqueeze(-1) - points.unsqueeze(-2)  # [S, N, G, R]
    alpha = (diff.square() * (-0.5 / ls2)[:, None, None]).exp()
    values = torch.einsum("sngr,nr->sng", alpha, beta.expand(num_units, -1))
    centred = values - (values @ w).unsqueeze(-1)
    if variance_cholesky is not None:
        chol = variance_cholesky.expand(num_units, -1, -1)
        rhs = alpha.permute(1, 3, 0, 2).reshape(num_units, alpha.shape[-1], -1)  # [N, R, S*G]
        solved = torch.linalg.solve_triangular(chol, rhs, upper=False)
        if variance_inner is None:
            quad = solved.square().sum(-2)
        else:
            inner = variance_inner.expand(num_units, -1, -1)
            quad = (solved * (inner @ solved)).sum(-2)
        quad = quad.reshape(num_units, mean.shape[0], -1).permute(1, 0, 2)
    else:
        reduction = variance_reduction.expand(num_units, -1, -1)
        quad = torch.einsum("sngr,nrt,sngt->sng", alpha, reduction, alpha)
    variance = ((1 - quad) + centred.square()) @ w
    return _NodeValues(centred, variance, std, w)


def _cpu_unsupported(
    mode: str, activations: Moments, variance_cholesky: Tensor | None
) -> str | None:
    """Why the CPU kernels cannot evaluate this :func:`response_moments` call (or ``None``)."""
    if mode == "cov" and activations.cov is not None:
        return "the fused CPU kernels have no full-covariance (cross-term) path yet"
    if mode != "mean" and variance_cholesky is not None:
        return "the fused CPU kernels take an explicit C, not variance_cholesky"
    return None


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

    The CPU kernels cover ``"mean"`` and ``"meanvar"`` (and ``"cov"`` without an activation
    covariance), with an explicit ``C`` (see :func:`_cpu_unsupported`).
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
        return Moments(out_mean, cov=torch.diag_embed(out_var), validate=False)

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
