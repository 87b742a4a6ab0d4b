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
* the full covariance's off-diagonal is Mehler's series ``sum_k rho_nm^k b_kn b_km``
  (:func:`~pyro_gpn.moments.cross._mehler_cross_covariance`): ``O(N R K)`` per sample for
  the coefficients and ``O(N^2 K)`` for the pairs, with the number of terms ``K`` chosen by a
  proven truncation bound (7 for a fresh 50-unit layer); the pairs it cannot bound contract
  ``Lambda`` with ``beta`` entry by entry (``O(R^2)`` per pair that needs it), in checkpointed
  chunks, so no ``[S, N, N, R, R]`` tensor is held in memory (forward or backward).

Numerics (issue 13, ``docs/results/accuracy.md``): ``beta`` has huge alternating entries when
``K + S`` is ill-conditioned, and the closed-form variance cancels terms of size ``|beta|^2``.
Where the activation is narrow against the kernel the variance is therefore evaluated by
quadrature (Gauss-Hermite or trapezoidal) of the (well-conditioned) mean function and
conditional variance
(:func:`response_moments`); ``Lambda``'s exponent is completed to a square so that no factor
overflows.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .._validation import (
    check_ndim,
    check_per_unit,
    check_same_dtype_device,
    check_tensor,
    check_values,
)
from . import cross
from .backend import TRITON_MEANVAR_DTYPES, select_backend
from .cross import COV_CHUNK_ELEMENTS
from .gaussian import Moments
from .midpoint import gaussian_sum, is_equidistant, midpoint_expansion
from .quadrature import (
    CLOSED_FORM_RTOL,
    NODE_MAX_STD_RATIO,
    NODE_TIERS,
    _node_values,
    closed_form_error_scale,
    gauss_hermite,
    node_tier,
    node_variance_rows,
)
from .weights import safe_cholesky, virtual_observation_weights

__all__ = [
    "CLOSED_FORM_RTOL",
    "COV_CHUNK_ELEMENTS",
    "MODES",
    "NODE_MAX_STD_RATIO",
    "NODE_TIERS",
    "Mode",
    "closed_form_error_scale",
    "gauss_hermite",
    "gaussian_sum",
    "is_equidistant",
    "midpoint_expansion",
    "node_tier",
    "response_moments",
    "safe_cholesky",
    "virtual_observation_weights",
]

Mode = Literal["mean", "meanvar", "cov"]
MODES: tuple[str, ...] = ("mean", "meanvar", "cov")


def _expand_units(tensor: Tensor, num_units: int) -> Tensor:
    return tensor.expand(num_units, *tensor.shape[1:])


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _check_response_options(
    mode: str,
    variance_reduction: Tensor | None,
    variance_cholesky: Tensor | None,
    variance_inner: Tensor | None,
) -> None:
    """The O(1) checks of :func:`response_moments`' mode and of the optional arguments it
    needs (also run by the layers' unchecked path)."""
    _check_mode(mode)
    if mode != "mean" and variance_reduction is None:
        raise ValueError(f"variance_reduction is required in mode {mode!r}")
    if variance_inner is not None and variance_cholesky is None:
        raise ValueError("variance_inner requires variance_cholesky (C = L^-T M L^-1)")


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
    one of two regimes. *Broad* (``v > (NODE_MAX_STD_RATIO * lambda)^2``): the closed form
    ``1 - tr[(C - beta beta^T) Omega] - mu^2``, exact in exact arithmetic and accurate when the
    Gaussian is wide against the kernel. *Narrow*: quadrature with the rule and nodes of
    :data:`NODE_TIERS` of the centred spread of ``m(a)`` and of the conditional variance
    (:func:`_node_values`), which does not cancel the ``|beta|^2``-sized terms that make the
    closed form lose up to all digits when ``K + S`` is ill-conditioned. The mean is always the
    closed form ``psi^T beta`` (a linear form in ``beta``). ``"cov"`` mode uses the same
    variances on its diagonal and Mehler's series for the off-diagonal (linear forms in
    ``beta`` too, :func:`~pyro_gpn.moments.cross._mehler_cross_covariance`), the pairs its
    truncation bound cannot serve through ``Lambda`` or, both units narrow, the same nodes
    (:func:`~pyro_gpn.moments.cross._lambda_entries`).

    Returns:
        :class:`Moments` of the outputs: ``mean`` only, ``mean`` and ``var``, or ``mean`` and
        ``cov`` (diagonal when the activations carry no covariance, since the units' activation
        functions are independent GPs).

    Raises:
        TypeError: if ``activations`` is not :class:`Moments` or an argument is not a tensor.
        ValueError: naming the argument, for an unknown ``mode``; a missing
            ``variance_reduction``; shapes that do not fit together (every per-unit argument
            has ``N`` rows, ``N`` the activations' units, or 1, and ``R`` inducing points as
            ``inducing_points``): checked always, as nothing else stops the fused kernels from
            reading past an argument's end; mixed dtypes or devices; and, while
            :func:`pyro_gpn.settings.is_validation_enabled`, non-positive ``lengthscales`` or a
            negative ``noise_var``.
    """
    _check_response_options(mode, variance_reduction, variance_cholesky, variance_inner)
    _check_response_arguments(
        activations,
        inducing_points,
        lengthscales,
        beta,
        variance_reduction,
        noise_var,
        variance_cholesky,
        variance_inner,
    )
    return _response_moments(
        activations,
        inducing_points,
        lengthscales,
        beta,
        variance_reduction,
        noise_var,
        mode,
        equidistant,
        variance_cholesky,
        variance_inner,
    )


def _response_moments(
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
    """:func:`response_moments` without the argument checks: the layers call it every step
    with their own parameters (checked when the layer was built) and activations they
    computed, so neither the shape checks nor the values' device synchronisation run there
    (only the O(1) checks of ``mode`` and of the optional arguments it needs)."""
    _check_response_options(mode, variance_reduction, variance_cholesky, variance_inner)
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
        cpu_unsupported=_cpu_unsupported(mode, variance_cholesky),
        triton_dtypes=TRITON_MEANVAR_DTYPES,
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
            equidistant,
            variance_cholesky,
            variance_inner,
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
    response = (inducing_points, lengthscales, beta, variance_reduction)
    factors = (variance_cholesky, variance_inner, equidistant)
    return _from_closed_form(activations, out_mean, out_var, noise_var, mode, response, factors)


def _check_response_arguments(
    activations: Moments,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    variance_reduction: Tensor | None,
    noise_var: Tensor | None,
    variance_cholesky: Tensor | None,
    variance_inner: Tensor | None,
) -> None:
    """The argument checks of :func:`response_moments`: types, shapes, dtypes and devices
    (Python comparisons of shapes, no device synchronisation: the layers call it every step),
    and the values of ``lengthscales`` and ``noise_var`` in one synchronisation while
    validation is on (off inside the training loops)."""
    if not isinstance(activations, Moments):
        raise TypeError(f"activations must be Moments, got {type(activations).__name__}")
    mean = activations.mean
    check_tensor("activations.mean", mean)
    check_ndim("activations.mean", mean, 2)
    num_units = mean.shape[-1]
    owner = "activations"
    check_tensor("inducing_points", inducing_points)
    check_per_unit("inducing_points", inducing_points, num_units, (None,), owner=owner)
    num_points = inducing_points.shape[-1]
    points = f"R = {num_points} inducing points as in inducing_points"
    check_tensor("lengthscales", lengthscales)
    check_per_unit("lengthscales", lengthscales, num_units, owner=owner)
    check_tensor("beta", beta)
    check_per_unit("beta", beta, num_units, (num_points,), points, owner)
    optional = {
        "variance_reduction": variance_reduction,
        "variance_cholesky": variance_cholesky,
        "variance_inner": variance_inner,
    }
    for name, matrix in optional.items():
        if matrix is None:
            continue
        check_tensor(name, matrix)
        if tuple(matrix.shape[-2:]) != (num_points, num_points):
            raise ValueError(
                f"{name} must be [N | 1, {num_points}, {num_points}], got {tuple(matrix.shape)}"
            )
        check_per_unit(name, matrix, num_units, (num_points, num_points), points, owner)
    if noise_var is not None:
        check_tensor("noise_var", noise_var)
        check_per_unit("noise_var", noise_var, num_units, owner=owner)
    check_same_dtype_device(
        "activations.mean",
        mean,
        {
            "activations.var": activations.var,
            "activations.cov": activations.cov,
            "inducing_points": inducing_points,
            "lengthscales": lengthscales,
            "beta": beta,
            **optional,
            "noise_var": noise_var,
        },
    )
    check_values(positive={"lengthscales": lengthscales}, nonnegative={"noise_var": noise_var})


def _from_closed_form(
    activations: Moments,
    out_mean: Tensor,
    out_var: Tensor,
    noise_var: Tensor | None,
    mode: Mode,
    response: tuple[Tensor, Tensor, Tensor, Tensor],
    factors: tuple[Tensor | None, Tensor | None, bool | None],
) -> Moments:
    """The output :class:`Moments` from the closed-form means and noise-free variances
    ``[S, N]`` (the reference path's or the Triton kernels'): the narrow regime's rows whose
    closed form is not provably accurate replaced by quadrature (:func:`_narrow_regime`),
    clamped at 0; then the noise, and in ``"cov"`` mode the diagonal or, for a full activation
    covariance, the off-diagonal (:func:`_with_cross_covariance`). ``response`` is
    ``(inducing_points, lengthscales, beta, variance_reduction)``, ``factors``
    ``(variance_cholesky, variance_inner, equidistant)`` as for :func:`response_moments`."""
    mean, var = activations.mean, activations.variance
    # narrow regime: quadrature nodes of a ~ N(mean, var), centred spread of m(a), with each
    # row's node tier, where the closed form is not provably accurate
    _, narrow = _narrow_rows(var, response[1])
    out_var = _narrow_regime(out_var, narrow, out_mean, mean, var, *response, *factors)
    out_var = out_var.clamp_min(0)
    if mode == "cov" and activations.cov is not None:
        return _with_cross_covariance(
            activations, out_mean, out_var, noise_var, response, factors[:2]
        )
    if noise_var is not None:
        out_var = out_var + noise_var
    if mode == "cov":
        return Moments(out_mean, cov=torch.diag_embed(out_var), validate=False)
    return Moments(out_mean, var=out_var, validate=False)


def _with_cross_covariance(
    activations: Moments,
    out_mean: Tensor,
    out_var: Tensor,
    noise_var: Tensor | None,
    response: tuple[Tensor, Tensor, Tensor, Tensor],
    factors: tuple[Tensor | None, Tensor | None] = (None, None),
) -> Moments:
    """The output :class:`Moments` with full covariance (``eq:gpn_normal_Sigmatilde_cov``):
    the diagonal ``out_var`` (noise-free, ``[S, N]``, from the reference path, the CPU kernels
    or the Triton kernels) plus ``noise_var``, the off-diagonal by Mehler's series, and through
    ``Lambda`` (or the narrow regime's nodes) for the pairs whose series it cannot bound.
    ``response`` is ``(inducing_points, lengthscales, beta, variance_reduction)``, ``factors``
    ``(variance_cholesky, variance_inner)`` as for :func:`response_moments`."""
    inducing_points, lengthscales, beta, _ = response
    out_cov, unbounded = cross._mehler_cross_covariance(
        activations.mean, activations.cov, inducing_points, lengthscales, beta, out_var
    )
    if unbounded is not None:
        out_cov = _lambda_cross_covariance(
            out_cov, unbounded, activations, out_mean, response, factors
        )
    if noise_var is not None:
        out_var = out_var + noise_var
    # both evaluations give fresh symmetric matrices with a zero diagonal (no autograd node
    # keeps them): the diagonal is written in place
    torch.diagonal(out_cov, dim1=-2, dim2=-1).copy_(out_var)
    return Moments(out_mean, cov=out_cov, validate=False)


def _lambda_cross_covariance(
    out_cov: Tensor,
    unbounded: Tensor,
    activations: Moments,
    out_mean: Tensor,
    response: tuple[Tensor, Tensor, Tensor, Tensor],
    factors: tuple[Tensor | None, Tensor | None],
) -> Tensor:
    """``out_cov`` ``[S, N, N]`` with the pairs ``unbounded`` (a symmetric boolean mask)
    replaced by their covariances through ``Lambda``, or the narrow regime's quadrature
    nodes where both units are narrow (:func:`~pyro_gpn.moments.cross._lambda_entries`): the
    cost is that of those pairs. ``response`` is ``(inducing_points, lengthscales, beta,
    variance_reduction)``, ``factors`` ``(variance_cholesky, variance_inner)`` as for
    :func:`response_moments`."""
    sample, n, m = unbounded.triu(1).nonzero().unbind(-1)
    rows, local = torch.unique(sample, return_inverse=True)  # the samples involved
    mean, cov, var = activations.mean[rows], activations.cov[rows], activations.variance[rows]
    inducing_points, lengthscales, beta, _ = response
    ratio2, narrow = _narrow_rows(var, lengthscales)
    nodes = None
    if bool(narrow.any()):
        tier = node_tier(float(ratio2.detach().where(narrow, 0).amax()) ** 0.5)
        nodes = _node_values(mean, var, *response, *factors, tier)
    entries = torch.stack([local, n, m])
    values = cross._lambda_entries(
        entries, mean, cov, inducing_points, lengthscales, beta, out_mean[rows], nodes, narrow
    )
    out_cov = out_cov.index_put((sample, n, m), values)
    return out_cov.index_put((sample, m, n), values)


def _narrow_rows(var: Tensor, lengthscales: Tensor) -> tuple[Tensor, Tensor]:
    """``(v / lambda^2, mask)`` of the narrow regime's rows ``[S, N]``: ``sqrt(v) <=
    NODE_MAX_STD_RATIO lambda`` (the rows whose variance may need quadrature nodes)."""
    ratio2 = var / lengthscales.square()
    return ratio2, ratio2 <= NODE_MAX_STD_RATIO**2


def _narrow_regime(
    out_var: Tensor,
    narrow: Tensor,
    out_mean: Tensor,
    mean: Tensor,
    var: Tensor,
    inducing_points: Tensor,
    lengthscales: Tensor,
    beta: Tensor,
    variance_reduction: Tensor,
    variance_cholesky: Tensor | None,
    variance_inner: Tensor | None,
    equidistant: bool | None,
) -> Tensor:
    """``out_var`` ``[S, N]`` (the closed-form variance, noise-free) with the ``narrow`` rows
    whose closed form is not provably accurate replaced by their quadrature variance
    (:func:`node_variance_rows`): every narrow row when ``variance_cholesky`` is given, else
    those whose rounding-error bound (:func:`closed_form_error_scale` times the magnitude of the
    closed form's terms, ``1 + tr[(|C| + |beta| |beta|^T) Omega] + mean^2``) exceeds
    :data:`CLOSED_FORM_RTOL` of the value. The one rule of every backend that evaluates the
    closed form (the reference path and the Triton kernels)."""
    if not bool(narrow.any()):
        return out_var
    quadrature = narrow
    if variance_cholesky is None:
        with torch.no_grad():
            num_units = mean.shape[-1]
            ls2 = lengthscales.square()
            width_omega = ls2 + 2 * var
            abs_beta = beta.abs()
            mid_centers, abs_weights = midpoint_expansion(
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
            bound = closed_form_error_scale(inducing_points.shape[-1], mean.dtype) * (
                magnitude + out_mean.square()
            )
            quadrature = narrow & ~(bound <= CLOSED_FORM_RTOL * out_var)
    if not bool(quadrature.any()):
        return out_var
    return node_variance_rows(
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


def _cpu_unsupported(mode: str, variance_cholesky: Tensor | None) -> str | None:
    """Why the CPU kernels cannot evaluate this :func:`response_moments` call (or ``None``)."""
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
    equidistant: bool | None = None,
    variance_cholesky: Tensor | None = None,
    variance_inner: Tensor | None = None,
) -> Moments:
    """:func:`response_moments` through the fused kernels: ``kind`` ``"triton"``
    (:mod:`pyro_gpn.moments.fused`) or ``"cpu"`` (:mod:`pyro_gpn.moments.cpu_kernels`).

    The CPU kernels cover ``"mean"`` and ``"meanvar"`` with an explicit ``C`` (see
    :func:`_cpu_unsupported`), and apply the narrow regime's rule themselves; in ``"cov"`` mode
    they give the mean and the diagonal, and Mehler's series the off-diagonal
    (:func:`_with_cross_covariance`). The Triton kernels evaluate the closed-form mean and
    variance; the rest is the reference path's (:func:`_from_closed_form`): the narrow-regime
    rows replaced, and in ``"cov"`` mode Mehler's series for the off-diagonal.
    """
    mean = activations.mean
    var = None if activations.is_deterministic else activations.variance
    if kind == "cpu":
        from .cpu_kernels import _cpu_response_mean as cpu_response_mean
        from .cpu_kernels import _cpu_response_meanvar as cpu_response_meanvar

        if mode == "mean":
            return Moments(
                cpu_response_mean(mean, var, inducing_points, lengthscales, beta), validate=False
            )
        var = activations.variance if var is None else var
        if mode == "cov" and activations.cov is not None:
            out_mean, out_var = cpu_response_meanvar(
                mean, var, inducing_points, lengthscales, beta, variance_reduction, None
            )
            response = (inducing_points, lengthscales, beta, variance_reduction)
            return _with_cross_covariance(activations, out_mean, out_var, noise_var, response)
        out_mean, out_var = cpu_response_meanvar(
            mean, var, inducing_points, lengthscales, beta, variance_reduction, noise_var
        )
        if mode == "meanvar":
            return Moments(out_mean, var=out_var, validate=False)
        return Moments(out_mean, cov=torch.diag_embed(out_var), validate=False)

    from .fused import fused_response_mean, fused_response_meanvar

    if mode == "mean":
        out = fused_response_mean(mean, var, inducing_points, lengthscales, beta)
        return Moments(out, validate=False)
    out_mean, out_var = fused_response_meanvar(
        mean, activations.variance, inducing_points, lengthscales, beta, variance_reduction, None
    )
    response = (inducing_points, lengthscales, beta, variance_reduction)
    factors = (variance_cholesky, variance_inner, equidistant)
    return _from_closed_form(activations, out_mean, out_var, noise_var, mode, response, factors)
