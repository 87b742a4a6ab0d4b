"""Training losses on propagated moments (paper, section "Evaluating the Loss").

A GPN network in the central-limit approximation outputs the mean and (co)variance of its last
layer for every sample. The losses here turn those :class:`~pyro_gpn.moments.gaussian.Moments`
into deterministic training objectives:

* :func:`gaussian_expected_nll` -- regression: the expected negative log-likelihood of the targets
  under Gaussian observation noise, averaged over the distribution of the noise-free responses
  (``eq:gpn_reg_loss_marginal_final``); it is exact given the moments.
* :func:`heteroscedastic_expected_nll` -- regression with input-dependent noise: the same
  expectation when the network also outputs the log noise variance (DVI's heteroscedastic
  likelihood, Wu et al. 2019); exact given the moments.
* :func:`gaussian_predictive_log_likelihood` -- the log density of the targets under the Gaussian
  predictive distribution, the test log-likelihood usually reported for regression.
* :func:`unscented_cross_entropy` -- classification: the expected softmax cross-entropy of the
  class logits, approximated by the unscented transform (``eq:gpn_normal_unscented``).
* :func:`target_variance_penalty` -- the ad-hoc penalty ``eq:gpn_ls`` that keeps the virtual
  observation variances of maximum-likelihood GPNs away from zero.

All functions are pure (no Pyro, no parameters), differentiable and vectorised over samples.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from . import settings
from ._validation import (
    check_class_labels,
    check_finite,
    check_ndim,
    check_nonnegative,
    check_not_empty,
    check_positive,
    check_shape,
    check_tensor,
)
from .moments.backend import cpu_kernels_evaluate
from .moments.gaussian import Moments
from .moments.quadrature import gauss_hermite

__all__ = [
    "check_labels",
    "gaussian_expected_nll",
    "gaussian_mixture_log_density",
    "gaussian_predictive_log_likelihood",
    "heteroscedastic_expected_nll",
    "heteroscedastic_log_noise_moments",
    "log_mean_softmax",
    "STUDENT_T_DF_RANGE",
    "check_student_t_df",
    "student_t_expected_nll",
    "student_t_scale_mixture",
    "target_variance_penalty",
    "unscented_cross_entropy",
    "unscented_log_predictive",
    "unscented_logits",
    "unscented_points",
]

_LOG_2PI = math.log(2.0 * math.pi)
_REDUCTIONS = ("mean", "sum", "none")


# ---------------------------------------------------------------------------------- helpers
def _reduce(per_sample: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return per_sample.mean()
    if reduction == "sum":
        return per_sample.sum()
    return per_sample


def _check_noise(name: str, value: Tensor | float, response: Moments, target: Tensor) -> Tensor:
    """A noise level as a positive tensor of shape ``[N]``, ``[1]`` or ``[]`` (a float becomes
    one in the response's dtype), or ``ValueError`` naming it."""
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value, dtype=response.mean.dtype, device=target.device)
    check_tensor(name, value)
    check_ndim(name, value, (0, 1))
    if value.dim() == 1 and value.shape[0] not in (1, response.num_features):
        raise ValueError(
            f"{name} must have shape [{response.num_features}], [1] or [], got {tuple(value.shape)}"
        )
    check_positive(name, value)
    return value


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _check_moments(name: str, moments: Moments) -> None:
    """Check moments that may have been built with ``validate=False`` (finite, ``var >= 0``)."""
    if not isinstance(moments, Moments):
        raise TypeError(f"{name} must be a Moments, got {type(moments).__name__}")
    check_finite(f"{name}.mean", moments.mean)
    if moments.var is not None:
        check_nonnegative(f"{name}.var", moments.var)
    if moments.cov is not None:
        check_finite(f"{name}.cov", moments.cov)


def _check_target(target: Tensor, like: Tensor) -> None:
    check_tensor("target", target)
    check_shape("target", target, tuple(like.shape))
    check_finite("target", target)


def check_labels(
    target: Tensor, num_samples: int, num_classes: int, name: str = "target"
) -> Tensor:
    """``target`` holds ``[S]`` integer labels in ``[0, C)``; returned as ``long``.

    The dtype and shape are checked always; the range (a value check, one device
    synchronisation) while :func:`pyro_gpn.settings.is_validation_enabled` -- the losses call
    this every step (:func:`pyro_gpn._validation.check_class_labels`).
    """
    if not isinstance(target, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(target).__name__}")
    check_class_labels(name, target, num_classes, check_range=False)
    check_shape(name, target, (num_samples,))
    return check_class_labels(
        name, target, num_classes, check_range=settings.is_validation_enabled()
    )


def _check_kappa(kappa: float | None, num_features: int) -> float:
    kappa = 0.0 if kappa is None else float(kappa)
    if not math.isfinite(kappa) or num_features + kappa <= 0:
        raise ValueError(f"kappa must satisfy N + kappa > 0 (N = {num_features}), got {kappa}")
    return kappa


def _psd_cholesky(cov: Tensor, max_tries: int = 4) -> Tensor:
    """Lower Cholesky factors of a batch of PSD matrices ``[..., N, N]``, with jitter on failure.

    Matrices that are numerically singular (e.g. a rank-deficient propagated covariance) get
    ``jitter * I`` added, starting at ``1e-6`` (float32) / ``1e-8`` (float64) times the mean
    diagonal (or absolutely, for an all-zero matrix) and growing tenfold per try, as in
    GPyTorch's ``psd_safe_cholesky``. Only the failing matrices are perturbed.
    """
    chol, info = torch.linalg.cholesky_ex(cov)
    if not bool((info > 0).any()):
        return chol
    eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
    scale = torch.diagonal(cov, dim1=-2, dim2=-1).mean(-1).detach().clamp_min(1.0)
    jitter = (1e-6 if cov.dtype == torch.float32 else 1e-8) * scale
    for _ in range(max_tries):
        # refactorise the whole batch (the passing matrices get zero jitter and the same factor)
        # so that no failed, NaN-laden factor stays in the autograd graph
        cov = cov + ((info > 0).to(cov.dtype) * jitter)[..., None, None] * eye
        chol, info = torch.linalg.cholesky_ex(cov)
        if not bool((info > 0).any()):
            return chol
        jitter = jitter * 10.0
    raise ValueError("features.cov is not positive semi-definite (Cholesky failed with jitter)")


# ---------------------------------------------------------------------------------- regression
def gaussian_expected_nll(
    response: Moments,
    target: Tensor,
    noise_std: Tensor | float,
    reduction: str = "mean",
) -> Tensor:
    r"""Expected Gaussian negative log-likelihood under the response distribution.

    For responses ``F`` with moments ``response`` and observations ``X = F + eps``,
    ``eps ~ N(0, diag(noise_std^2))``, returns per sample ``s``

    .. math::

        \mathbb{E}_F\big[-\log \mathcal{N}(t_s \mid F_s, \sigma^2)\big]
        = \sum_n \Big[\log\sigma_n + \tfrac12\log 2\pi
          + \frac{t_{sn}^2 - 2 t_{sn}\,\mathbb{E}[F_{sn}] + \mathbb{E}[F_{sn}^2]}{2\sigma_n^2}\Big],

    which is ``eq:gpn_reg_loss_marginal_final`` with the constant kept (so that the value is a
    true expected negative log-likelihood). It is evaluated as
    ``((t - mean)^2 + var) / (2 sigma^2)``, the same quantity without the cancellation of
    ``t^2 - 2 t E[F] + E[F^2]``. Only the per-dimension variances enter (the expectation of a
    sum of squares does not see correlations), so a full ``cov`` is used through its diagonal.
    By Jensen's inequality the value upper-bounds ``-log E_F[N(t | F, sigma^2)]``
    (``eq:gpn_parametric_regression_log_loss``).

    Args:
        response: moments of the noise-free responses ``F``, mean ``[S, N]``.
        target: ``[S, N]`` observed targets.
        noise_std: observation noise standard deviation ``sigma``, positive; a tensor of shape
            ``[N]``, ``[1]`` or ``[]``, or a float.
        reduction: ``"mean"`` (over samples, default), ``"sum"`` or ``"none"`` (``[S]``).

    Returns:
        The expected negative log-likelihood, summed over the ``N`` output dimensions and reduced
        over samples as requested.

    Raises:
        ValueError: naming the argument, for shape mismatches, non-finite values, a
            non-positive ``noise_std`` or an unknown ``reduction``.
    """
    _check_reduction(reduction)
    _check_moments("response", response)
    _check_target(target, response.mean)
    noise_std = _check_noise("noise_std", noise_std, response, target)

    noise_var = noise_std.square()
    sq_err = (target - response.mean).square() + response.variance
    per_dim = 0.5 * (_LOG_2PI + noise_var.log() + sq_err / noise_var)
    return _reduce(per_dim.sum(-1), reduction)


def heteroscedastic_log_noise_moments(
    response: Moments, noise_offset: Tensor, noise_slope: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The moments a heteroscedastic Gaussian likelihood needs, from responses ``[S, 2N]``
    whose first ``N`` columns are the outputs ``F`` and last ``N`` the noise features ``H``,
    with the log noise variance ``G = noise_offset + noise_slope * H``.

    Returns:
        ``E[F]``, ``Var[F]``, ``E[G]``, ``Var[G]`` and ``Cov[F, G]`` (zero unless ``response``
        has a full ``cov``), each ``[S, N]``.
    """
    num = response.num_features // 2
    mean, var = response.mean, response.variance
    g_mean = noise_offset + noise_slope * mean[:, num:]
    g_var = noise_slope.square() * var[:, num:]
    if response.cov is not None:
        idx = torch.arange(num, device=mean.device)
        cross = noise_slope * response.cov[:, idx, idx + num]
    else:
        cross = torch.zeros_like(g_mean)
    return mean[:, :num], var[:, :num], g_mean, g_var, cross


def heteroscedastic_expected_nll(
    response: Moments,
    target: Tensor,
    noise_offset: Tensor,
    noise_slope: Tensor,
    reduction: str = "mean",
) -> Tensor:
    r"""Expected negative log-likelihood with an input-dependent Gaussian noise.

    The responses ``[S, 2N]`` hold the outputs ``F`` (first ``N`` columns) and the noise
    features ``H`` (last ``N``); the observation is ``t ~ N(F, exp(G))`` with the log noise
    variance ``G = a + b H`` (``a = noise_offset``, ``b = noise_slope``). For jointly Gaussian
    ``(F, G)``, per sample and output,

    .. math::

        \mathbb{E}\big[-\log \mathcal{N}(t \mid F, e^{G})\big]
        = \tfrac12 \log 2\pi + \tfrac12 \mathbb{E}[G]
          + \tfrac12 e^{-\mathbb{E}[G] + \mathrm{Var}[G]/2}
            \big[(t - \mathbb{E}[F] + \mathrm{Cov}[F, G])^2 + \mathrm{Var}[F]\big],

    exact (tilting ``G`` by ``e^{-G}`` shifts the mean of ``F`` by ``-Cov[F, G]``); the
    heteroscedastic likelihood of deterministic variational inference (Wu et al. 2019, section
    3.3), here with the moments of a GPN layer. ``Cov[F, G]`` is taken from a full ``cov`` and
    is zero with ``var`` (``meanvar``, the outputs independent).

    Args:
        response: moments of the noise-free responses, mean ``[S, 2N]``.
        target: ``[S, N]`` observed targets.
        noise_offset, noise_slope: ``a`` and ``b``, ``[N]``, ``[1]`` or ``[]``.
        reduction: ``"mean"`` (over samples), ``"sum"`` or ``"none"`` (``[S]``).

    Returns:
        The expected negative log-likelihood, summed over the ``N`` outputs and reduced over
        samples.
    """
    _check_reduction(reduction)
    _check_moments("response", response)
    if response.num_features % 2:
        raise ValueError(
            f"response must have 2 N features (outputs and noise features), got "
            f"{response.num_features}"
        )
    half = response.mean[:, : response.num_features // 2]
    _check_target(target, half)
    mean, var, g_mean, g_var, cross = heteroscedastic_log_noise_moments(
        response, noise_offset, noise_slope
    )
    sq_err = (target - mean + cross).square() + var
    per_dim = 0.5 * (_LOG_2PI + g_mean + (g_var / 2 - g_mean).exp() * sq_err)
    return _reduce(per_dim.sum(-1), reduction)


def gaussian_mixture_log_density(
    weights: Tensor, mean: Tensor, var: Tensor, y: Tensor, log_weights: bool = False
) -> Tensor:
    """Log density of the targets under a Gaussian mixture per output,
    ``sum_d log sum_k w_k N(y_sd | mean_ksd, var_ksd)``, ``[S]`` (the outputs independent).

    Args:
        weights: ``[K]`` mixture weights summing to 1 (their logarithms with
            ``log_weights=True``: weights too small for the dtype keep their share).
        mean, var: ``[K, S, D]`` component means and variances.
        y: ``[S, D]`` (or ``[S]`` for ``D = 1``) targets.
        log_weights: ``weights`` holds log weights.
    """
    y = y.reshape(mean.shape[1:]).to(mean.dtype)
    var = var.clamp_min(torch.finfo(var.dtype).tiny)
    comp = -0.5 * (_LOG_2PI + var.log() + (y - mean).square() / var)
    log_w = weights if log_weights else weights.log()
    return torch.logsumexp(comp + log_w.view(-1, 1, 1), dim=0).sum(-1)


#: The degrees of freedom a Student-t likelihood takes: from 2.5 (the noise has a variance,
#: so the predictive has a standard deviation, and the scale mixture captures it with a grid of
#: at most ~160 nodes; towards 2 the variance comes from ever smaller ``lambda``) to 100
#: (the scale mixture's grid step shrinks like ``sqrt(2 / nu)``: 231 nodes at 100; a larger
#: ``nu`` is close to the Gaussian head).
STUDENT_T_DF_RANGE = (2.5, 100.0)


def check_student_t_df(df: float) -> float:
    """``df`` as a float, or ``ValueError`` naming it unless ``2.5 <= df <= 100``
    (:data:`STUDENT_T_DF_RANGE`)."""
    low, high = STUDENT_T_DF_RANGE
    if isinstance(df, Tensor) and df.numel() == 1:
        df = df.item()
    if isinstance(df, bool) or not isinstance(df, numbers.Real) or not low <= df <= high:
        raise ValueError(f"df must be a real number with {low:g} <= df <= {high:g}, got {df!r}")
    return float(df)


def student_t_scale_mixture(
    df: float, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor]:
    r"""The Student-t as a finite Gaussian scale mixture: log weights ``log w`` and variance
    factors ``c`` (each ``[K]``) with

    .. math::

        t_\nu(r \mid 0, \sigma) = \int \mathcal{N}(r \mid 0, \sigma^2 / \lambda)\,
        \mathrm{Gamma}(\lambda \mid \tfrac{\nu}{2}, \tfrac{\nu}{2})\, d\lambda
        \approx \sum_k w_k\, \mathcal{N}(r \mid 0, c_k \sigma^2).

    The integral is taken over ``u = log lambda`` by the trapezoid rule on a uniform grid
    (``c_k = e^{-u_k}``, ``w_k`` proportional to the Gamma density in ``u``,
    ``exp(a u - a e^u)`` with ``a = nu / 2``, normalised to sum to 1). The integrand is analytic
    and decays like ``e^{a u}`` below and ``exp(-a e^u)`` above, so the rule converges
    geometrically in the grid step: the step is half the standard deviation of ``log lambda``
    (at most 0.5), the grid runs from ``min(-30, E - 12 sd, log(1e-8) / (a - 1))`` (where the
    variance's integrand ``e^{(a - 1) u}`` has died out) to ``E + 10 sd``. Measured against
    ``scipy.stats.t.logpdf`` for ``|r| / sigma`` from 0 to 1e4: absolute error in the log
    density below 4e-7 for ``2.5 <= nu <= 100``, below 3e-8 from ``nu = 4``; the mixture's
    variance is ``nu / (nu - 2)`` to 5e-8 relative (``tests/test_student_t_head.py``). ``K``
    is 161 at ``nu = 2.5``, 90 at ``nu = 4``, 231 at ``nu = 100`` (after the dropped nodes).

    With Gaussian responses ``F ~ N(mean, var)`` the predictive of ``y = F + eps``,
    ``eps ~ t_nu(0, sigma)``, is then the Gaussian mixture ``sum_k w_k N(y | mean, var + c_k
    sigma^2)`` (:class:`~pyro_gpn.heads.StudentTHead`), as exact as the rule.

    Args:
        df: ``nu``, with ``2.5 <= nu <= 100`` (:func:`check_student_t_df`).
        dtype, device: of the returned tensors (computed in float64).

    Nodes whose weight is below ``e^-700`` (zero in float64 arithmetic) are dropped. The
    weights are returned as logarithms, which float32 holds where the weights themselves
    underflow (below 1e-45: at ``nu = 30`` those carry the density from 300 scales out).

    Returns:
        ``(log_w, c)``, each ``[K]``; ``sum_k w_k c_k`` is the variance factor
        ``nu / (nu - 2)``.
    """
    a = check_student_t_df(df) / 2
    a64 = torch.tensor(a, dtype=torch.float64)
    centre = float(torch.digamma(a64)) - math.log(a)  # E[log lambda]
    spread = math.sqrt(float(torch.polygamma(1, a64)))  # sd[log lambda]
    step = 0.5 * min(1.0, spread)
    # below: the variance's integrand decays like e^{(a - 1) u}; stop where it is 1e-8
    low = min(-30.0, centre - 12 * spread, math.log(1e-8) / (a - 1))
    high = centre + 10 * spread
    u = torch.arange(math.floor(low / step), math.ceil(high / step) + 1, dtype=torch.float64)
    u = u * step
    log_weights = torch.log_softmax(a * u - a * u.exp(), dim=0)
    kept = log_weights > -700.0
    log_weights, u = log_weights[kept], u[kept]
    return log_weights.to(dtype=dtype, device=device), (-u).exp().to(dtype=dtype, device=device)


def student_t_expected_nll(
    response: Moments,
    target: Tensor,
    noise_scale: Tensor | float,
    df: float,
    num_nodes: int = 32,
    reduction: str = "mean",
) -> Tensor:
    r"""Expected Student-t negative log-likelihood under the response distribution.

    For responses ``F`` with moments ``response`` (per-dimension variances; a full ``cov`` is
    used through its diagonal) and observations ``X = F + eps``, ``eps ~ t_nu(0, sigma)``,
    returns per sample ``s``

    .. math::

        \sum_n \mathbb{E}_{F_{sn}}\big[-\log t_\nu(t_{sn} - F_{sn} \mid 0, \sigma_n)\big],

    the data term of the closed-form ELBO with a Student-t likelihood (the Gaussian case is
    :func:`gaussian_expected_nll`, ``eq:gpn_reg_loss_marginal_final``). There is no closed
    form: the expectation is taken by Gauss-Hermite quadrature over each ``F_sn``
    (``num_nodes`` nodes). The integrand ``(nu + 1) / 2 log(1 + r^2 / (nu sigma^2))`` is
    smooth on the scale ``sigma``, so the rule is accurate where ``sd(F)`` is not much wider:
    against ``scipy.integrate.quad`` (``nu`` 2.5, 4 and 30, targets 0 to 16 scales from the
    mean), 32 nodes reach 1.4e-7 relative where ``sd(F) <= sigma``, 1.3e-4 at ``2 sigma``,
    4e-3 at ``4 sigma`` and 2e-2 at ``8 sigma`` (``tests/test_student_t_head.py``). Trained
    regression networks have ``sd(F)`` below the noise; the predictive
    (:func:`student_t_scale_mixture`) has no such limit.

    Args:
        response: moments of the noise-free responses ``F``, mean ``[S, N]``.
        target: ``[S, N]`` observed targets.
        noise_scale: ``sigma``, the t's scale (its standard deviation is ``sigma sqrt(nu / (nu
            - 2))``), positive; ``[N]``, ``[1]``, ``[]`` or a float.
        df: ``nu``, with ``2.5 <= nu <= 100``.
        num_nodes: Gauss-Hermite nodes per response.
        reduction: ``"mean"`` (over samples, default), ``"sum"`` or ``"none"`` (``[S]``).

    Raises:
        ValueError: naming the argument, as :func:`gaussian_expected_nll`, and for ``df`` out
            of range or a ``num_nodes`` that is not a positive integer.
    """
    _check_reduction(reduction)
    _check_moments("response", response)
    _check_target(target, response.mean)
    df = check_student_t_df(df)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive integer, got {num_nodes!r}")
    noise_scale = _check_noise("noise_scale", noise_scale, response, target)

    nll = _student_t_gauss_hermite_nll(
        response.mean, response.variance, target, noise_scale, df, num_nodes
    )
    return _reduce(nll.sum(-1), reduction)


def _student_t_gauss_hermite_nll(
    mean: Tensor, variance: Tensor, target: Tensor, scale: Tensor, df: float, num_nodes: int
) -> Tensor:
    """``E[-log t_nu(target - F | 0, scale)]`` for ``F ~ N(mean, variance)`` elementwise
    (all arguments broadcast), by ``num_nodes``-point Gauss-Hermite quadrature; unchecked."""
    z, w = gauss_hermite(num_nodes, mean.dtype, mean.device)
    positive = variance > 0  # sqrt with a zero (not infinite) derivative at a point mass
    std = torch.where(positive, torch.where(positive, variance, 1).sqrt(), 0)
    shape = (-1,) + (1,) * max(mean.dim(), variance.dim(), target.dim())
    residual = target - mean - std * z.view(shape)  # [Q, ...]
    nll = -torch.distributions.StudentT(df, 0.0, scale, validate_args=False).log_prob(residual)
    return torch.tensordot(w, nll, dims=1)


def gaussian_predictive_log_likelihood(
    predictive: Moments, target: Tensor, reduction: str = "mean"
) -> Tensor:
    r"""Log density of the targets under the Gaussian predictive distribution.

    Per sample ``s``, ``log N(t_s | mean_s, Sigma_s)``: with ``var`` (or a point mass is
    rejected) the sum over dimensions of univariate log densities, with ``cov`` the multivariate
    density. This is the test log-likelihood reported for regression; ``predictive`` must include
    the observation noise (e.g. the output of a network with a Gaussian head).

    Args:
        predictive: moments of the predictive distribution, mean ``[S, N]``, with positive
            variances (``var``) or a positive-definite ``cov``.
        target: ``[S, N]`` observed targets.
        reduction: ``"mean"`` (over samples, default), ``"sum"`` or ``"none"`` (``[S]``).

    Raises:
        ValueError: naming the argument, for shape mismatches, non-finite values, a
            deterministic or degenerate predictive, an unknown ``reduction``, or no rows with
            ``reduction="mean"``.
    """
    _check_reduction(reduction)
    _check_moments("predictive", predictive)
    _check_target(target, predictive.mean)
    check_not_empty("target", target, reduction)
    if predictive.is_deterministic:
        raise ValueError("predictive must carry a variance or covariance, got a point mass")
    diff = target - predictive.mean
    if predictive.cov is not None:
        chol, info = torch.linalg.cholesky_ex(predictive.cov)
        if bool((info > 0).any()):
            raise ValueError("predictive.cov must be positive definite")
        white = torch.linalg.solve_triangular(chol, diff.unsqueeze(-1), upper=False).squeeze(-1)
        half_logdet = torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)
        log_lik = -0.5 * (white.square().sum(-1) + predictive.num_features * _LOG_2PI)
        log_lik = log_lik - half_logdet
    else:
        check_positive("predictive.var", predictive.var)
        var = predictive.var
        log_lik = -0.5 * (_LOG_2PI + var.log() + diff.square() / var).sum(-1)
    return _reduce(log_lik, reduction)


# ---------------------------------------------------------------------------------- classification
def unscented_cross_entropy(
    features: Moments,
    target: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    kappa: float | None = None,
    reduction: str = "mean",
) -> Tensor:
    r"""Expected softmax cross-entropy of Gaussian logits by the unscented transform.

    The logits ``A = X W + b`` are linear in the Gaussian features ``X ~ N(mu, Sigma)``
    (``eq:gpn_parametrized_loss_classification``: ``X = X^L``, ``W = W^{L+1}``). The
    expectation :math:`\mathbb{E}_X[-\log \mathrm{softmax}(X W + b)_{t}]` is approximated by the
    unscented transform (``eq:gpn_normal_unscented``) with ``2N + 1`` sigma points placed in the
    ``N``-dimensional space of the features, where the Gaussian lives:

    .. math::

        x_0 = \mu, \quad x_{\pm i} = \mu \pm \sqrt{N + \kappa}\, L_{\star i}, \quad
        \mathscr{W}_0 = \frac{\kappa}{N + \kappa}, \quad
        \mathscr{W}_{\pm i} = \frac{1}{2 (N + \kappa)},

    with ``L L^T = Sigma`` (``eq:unscented_sigma``, ``eq:unscented_s``). Each point is mapped to
    logits ``x W + b`` and the cross-entropies are averaged with the weights. Because the logits
    are linear in ``X``, this is the paper's transform with the sigma points expressed through
    ``W``, but it never factorises the ``C x C`` logit covariance ``W^T Sigma W``, which is
    singular whenever ``C > N`` (the paper's ``16x30x15x26`` network has ``N = 15``, ``C = 26``).
    The sigma points match the mean and covariance of ``X`` and all its odd central moments, so
    the approximation is exact for cross-entropies that are polynomials of degree three or less
    in ``X``; the error is of fourth order in the standard deviations.

    ``kappa``: the paper uses ``kappa = 3 - N`` (which matches the fourth moment of a
    one-dimensional Gaussian), but for ``N > 3`` that makes the centre weight negative and the
    estimate can fall below the true expectation or even become negative. The default
    (``None``) is ``kappa = 0``: the centre weight vanishes and the remaining ``2N`` points, at
    ``+-sqrt(N)`` standard deviations along the columns of ``L``, get weight ``1 / (2N)`` each, so
    the loss is an average of cross-entropies (hence non-negative). Pass ``kappa=3 - N`` to
    reproduce the paper. ``N + kappa`` must be positive.

    ``Sigma`` is factorised as ``sqrt(var)`` for diagonal moments and by a Cholesky
    decomposition (differentiable; jitter added to numerically singular matrices) for full
    ``cov``. Deterministic features give the ordinary cross-entropy of ``mu W + b``.

    Args:
        features: moments of ``X``, mean ``[S, N]``.
        target: ``[S]`` integer class labels in ``[0, C)``.
        weight: ``[N, C]`` map to the logits; ``None`` takes the features as the logits
            (``C = N``).
        bias: ``[C]`` logit offsets, or ``None``.
        kappa: unscented-transform spread parameter (see above); ``None`` means ``0``.
        reduction: ``"mean"`` (over samples, default), ``"sum"`` or ``"none"`` (``[S]``).

    Returns:
        The approximate expected cross-entropy (in nats), reduced over samples.

    Raises:
        ValueError: naming the argument, for shape mismatches, non-finite values, labels out of
            range, ``N + kappa <= 0`` or an unknown ``reduction``.
    """
    _check_reduction(reduction)
    num_classes = _check_readout(features, weight, bias)
    num_features = features.num_features
    target = check_labels(target, features.num_samples, num_classes)
    kappa = _check_kappa(kappa, num_features)

    if features.is_deterministic:
        return F.cross_entropy(_mean_logits(features, weight, bias), target, reduction=reduction)
    if _fused_cpu_head(features, weight, bias):
        per_sample = _fused_unscented(features, target, weight, bias, kappa, predictive=False)
        return _reduce(per_sample, reduction)
    logits, weights = _unscented_logits(features, weight, bias, kappa)  # [S, 2N+1, C], [2]
    index = target.view(-1, 1, 1).expand(-1, logits.shape[1], 1)
    point_ce = torch.logsumexp(logits, dim=-1) - logits.gather(-1, index).squeeze(-1)
    per_sample = weights[0] * point_ce[:, 0] + weights[1] * point_ce[:, 1:].sum(-1)
    return _reduce(per_sample, reduction)


def unscented_log_predictive(
    features: Moments,
    target: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    kappa: float | None = None,
    temperature: float | Tensor = 1.0,
    reduction: str = "none",
) -> Tensor:
    r"""Log of the predictive probability of the labels: the softmax averaged over the sigma
    points of :func:`unscented_cross_entropy`,

    .. math::

        \log p(t \mid X) \approx \log \sum_i \mathscr{W}_i \,
            \mathrm{softmax}\big((x_i W + b) / T\big)_t ,

    the classification head's predictive (and, negated, the data term of the predictive
    objective, :func:`pyro_gpn.inference.predictive_log_likelihood`). For non-negative weights
    (``kappa >= 0``) it is at least minus the expected cross-entropy (Jensen's inequality).
    ``T`` is the temperature of the calibrated predictive (1 in training). The average is
    taken by :func:`log_mean_softmax`; diagonal moments with a readout and ``kappa >= 0`` run
    on the fused CPU kernel of :func:`unscented_cross_entropy` where it runs.

    Args:
        features, target, weight, bias, kappa: as :func:`unscented_cross_entropy`.
        temperature: ``T``, positive and finite: a number or a one-element tensor (a
            differentiable one is allowed).
        reduction: ``"none"`` (default, ``[S]``), ``"mean"`` or ``"sum"``.

    Returns:
        The log probabilities (nats), reduced over samples.

    Raises:
        ValueError: naming the argument, as :func:`unscented_cross_entropy`, and for a
            temperature that is not one positive finite number.
    """
    _check_reduction(reduction)
    num_classes = _check_readout(features, weight, bias)
    num_features = features.num_features
    target = check_labels(target, features.num_samples, num_classes)
    kappa = _check_kappa(kappa, num_features)
    temperature = _check_temperature(temperature, features.mean)
    if features.is_deterministic:
        logits = _mean_logits(features, weight, bias) / temperature
        return _reduce(-F.cross_entropy(logits, target, reduction="none"), reduction)
    if kappa >= 0 and _fused_cpu_head(features, weight, bias):
        bias = None if bias is None else bias / temperature
        per_sample = _fused_unscented(
            features, target, weight / temperature, bias, kappa, predictive=True
        )
        return _reduce(-per_sample, reduction)
    logits, weights = _unscented_logits(features, weight, bias, kappa)  # [S, 2N+1, C], [2]
    point_weights = torch.cat([weights[:1], weights[1:].expand(logits.shape[1] - 1)])
    per_sample = log_mean_softmax(logits / temperature, point_weights, target, kappa >= 0)
    return _reduce(per_sample, reduction)


def log_mean_softmax(
    logits: Tensor, point_weights: Tensor, labels: Tensor, nonnegative: bool | None = None
) -> Tensor:
    r"""``log sum_i w_i softmax(logits[s, i])[labels[s]]`` per row: the log probability of
    the labels under softmaxes averaged with weights ``w`` (the unscented points of
    :func:`unscented_log_predictive`, the members and points of an ensemble).

    With non-negative weights it is a log-sum-exp of the points' log-softmax, exact where a
    probability underflows (a label ruled out by hundreds of nats still has its log
    probability, and a gradient); with a negative weight (the paper's ``kappa = 3 - N``) the
    weighted probabilities are summed and the sum clamped at the dtype's smallest normal
    number.

    Shape:
        ``logits [S, P, C]``, ``point_weights [P]``, ``labels [S]`` -> ``[S]``.

    Args:
        nonnegative: whether every weight is ``>= 0``; ``None`` reads the weights (a device
            synchronisation on a GPU: callers that know pass it).
    """
    index = labels.long().reshape(-1, 1, 1).expand(-1, logits.shape[1], 1)
    log_probs = logits.log_softmax(-1).gather(-1, index).squeeze(-1)  # [S, P]
    if nonnegative is None:
        nonnegative = bool((point_weights >= 0).all())
    if nonnegative:
        return torch.logsumexp(log_probs + point_weights.log(), dim=-1)
    probs = log_probs.exp() @ point_weights
    return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()


def _mean_logits(features: Moments, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """The logits of the features' mean, ``mu W + b`` ``[S, C]``."""
    logits = features.mean if weight is None else features.mean @ weight
    return logits if bias is None else logits + bias


def _fused_unscented(
    features: Moments,
    target: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    kappa: float,
    predictive: bool,
) -> Tensor:
    """The expected cross-entropy ``[S]`` (or, with ``predictive``, minus the log predictive
    probability) of diagonal features on the fused CPU kernel."""
    from .moments.cpu_unscented import cpu_unscented_cross_entropy

    num_features = features.num_features
    scale = math.sqrt(num_features + kappa)
    w0, w1 = kappa / (num_features + kappa), 0.5 / (num_features + kappa)
    centre = _mean_logits(features, weight, bias)
    sd = features.var.sqrt()
    return cpu_unscented_cross_entropy(
        centre, sd, weight, target, scale, w0, w1, predictive=predictive
    )


def _check_temperature(temperature: float | Tensor, like: Tensor) -> Tensor | float:
    """A positive finite temperature: a number, or a one-element tensor in ``like``'s dtype
    (its value checked while validation is on)."""
    if isinstance(temperature, Tensor):
        if temperature.numel() != 1:
            raise ValueError(
                f"temperature must be one number, got shape {tuple(temperature.shape)}"
            )
        temperature = temperature.to(like.dtype).reshape(())
        return check_positive("temperature", temperature)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a number or a tensor, got {temperature!r}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be positive and finite, got {temperature}")
    return float(temperature)


def unscented_points(features: Moments, kappa: float | None = None) -> tuple[Tensor, Tensor]:
    r"""Sigma points and weights of the unscented transform (``eq:unscented_sigma``).

    ``x_0 = mu``, ``x_{+-i} = mu +- sqrt(N + kappa) L_{*i}`` with ``L L^T = Sigma``
    (``sqrt(var)`` for diagonal moments, a jittered Cholesky factor for ``cov``), weights
    ``kappa / (N + kappa)`` (centre) and ``1 / (2 (N + kappa))`` (every other point); see
    :func:`unscented_cross_entropy` for the choice of ``kappa`` (``None``: 0).

    Args:
        features: Gaussian moments, mean ``[S, N]`` (a point mass gives ``2N`` copies of it).
        kappa: spread parameter, ``N + kappa > 0``.

    Returns:
        ``points [S, 2N + 1, N]`` (centre, ``+`` points, ``-`` points) and the two weights
        ``[w_centre, w_side]``.
    """
    num_features = features.num_features
    kappa = _check_kappa(kappa, num_features)
    mean = features.mean
    if features.cov is not None:
        root_t = _psd_cholesky(features.cov).mT
    elif features.var is not None:
        root_t = torch.diag_embed(features.var.sqrt())
    else:
        root_t = mean.new_zeros(mean.shape[0], num_features, num_features)
    offsets = math.sqrt(num_features + kappa) * root_t  # rows: columns of L, [S, N, N]
    centre = mean.unsqueeze(1)
    points = torch.cat([centre, centre + offsets, centre - offsets], dim=1)
    weights = mean.new_tensor([kappa / (num_features + kappa), 0.5 / (num_features + kappa)])
    return points, weights


def _fused_cpu_head(features: Moments, weight: Tensor | None, bias: Tensor | None) -> bool:
    """Whether :func:`unscented_cross_entropy` runs on the fused CPU kernel
    (:mod:`pyro_gpn.moments.cpu_unscented`): diagonal moments, a readout ``weight``, and the
    backend in force (``"auto"``, ``"cpu"`` or ``"fused"``) picking the CPU kernels for these
    tensors (float32/float64 CPU tensors, Numba installed). ``"reference"`` and ``"triton"``
    keep the PyTorch path; a forced ``"cpu"``/``"fused"`` that cannot run raises, as for the
    layers."""
    if features.cov is not None or features.var is None or weight is None:
        return False
    return cpu_kernels_evaluate(features.mean, features.var, weight, bias)


def unscented_logits(
    features: Moments,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    kappa: float | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The logits ``x W + b`` at the sigma points of :func:`unscented_points`, without forming
    the points.

    The logits are linear in ``X``, so at ``x_{+-i} = mu +- sqrt(N + kappa) L_{*i}`` they are
    ``mu W + b +- sqrt(N + kappa) (L^T W)_{i*}``: ``O(S N C)`` for diagonal moments
    (``L^T W = diag(sqrt(var)) W``) instead of the ``O(S N^2 C)`` of mapping ``S (2N + 1)``
    points of ``N`` features, and no ``[S, N, N]`` matrix -- what makes a wide last layer
    affordable (a convolutional network's flattened features, ``N`` in the thousands). The
    values are those of mapping :func:`unscented_points` (tested).

    Args:
        features: Gaussian moments, mean ``[S, N]``.
        weight: ``[N, C]`` map to the logits; ``None`` takes the features as the logits.
        bias: ``[C]`` logit offsets, or ``None``.
        kappa: spread parameter, ``N + kappa > 0`` (``None``: 0).

    Returns:
        ``logits [S, 2N + 1, C]`` (centre, ``+`` points, ``-`` points) and the two weights
        ``[w_centre, w_side]``.

    Raises:
        ValueError: naming the argument, for shape mismatches, non-finite values or
            ``N + kappa <= 0``.
    """
    _check_readout(features, weight, bias)
    return _unscented_logits(features, weight, bias, _check_kappa(kappa, features.num_features))


def _check_readout(features: Moments, weight: Tensor | None, bias: Tensor | None) -> int:
    """Check the features and the readout ``weight [N, C]``, ``bias [C]``; return ``C``."""
    _check_moments("features", features)
    num_classes = features.num_features
    if weight is not None:
        check_tensor("weight", weight)
        check_shape("weight", weight, (features.num_features, None))
        check_finite("weight", weight)
        num_classes = weight.shape[1]
    if bias is not None:
        check_tensor("bias", bias)
        check_shape("bias", bias, (num_classes,))
        check_finite("bias", bias)
    return num_classes


def _unscented_logits(
    features: Moments, weight: Tensor | None, bias: Tensor | None, kappa: float
) -> tuple[Tensor, Tensor]:
    """:func:`unscented_logits` without the argument checks (``kappa`` already checked)."""
    num_features = features.num_features
    mean = features.mean
    centre = mean if weight is None else mean @ weight
    if bias is not None:
        centre = centre + bias
    scale = math.sqrt(num_features + kappa)
    if features.cov is not None:
        root_t = _psd_cholesky(features.cov).mT  # rows: columns of L
        offsets = root_t if weight is None else root_t @ weight
    elif features.var is not None:
        sd = features.var.sqrt()
        offsets = torch.diag_embed(sd) if weight is None else sd.unsqueeze(-1) * weight
    else:
        offsets = centre.new_zeros(centre.shape[0], num_features, centre.shape[-1])
    offsets = scale * offsets  # [S, N, C]
    centre = centre.unsqueeze(1)
    logits = torch.cat([centre, centre + offsets, centre - offsets], dim=1)
    weights = mean.new_tensor([kappa / (num_features + kappa), 0.5 / (num_features + kappa)])
    return logits, weights


# ---------------------------------------------------------------------------------- penalty
def target_variance_penalty(
    target_variances: Iterable[Tensor], alpha: float = 0.1, beta: float = 1e-3
) -> Tensor:
    r"""Penalty on small virtual observation variances (``eq:gpn_ls``).

    .. math::

        \mathscr{L}_S = \sum_{l} \frac{1}{N_l R} \sum_{n, r}
        \alpha\, \mathrm{sigmoid}\!\Big(\frac{\beta}{|S^l_{rn}|}\Big)

    The logistic function of ``beta / |S|`` rises from ``1/2`` (large ``S``) to ``1`` (``S -> 0``),
    so the penalty discourages the maximum-likelihood collapse of the variances. Each layer's
    term is the mean over all entries of its tensor, so a layer that shares one set of virtual
    observations (``[1, R]``) contributes the same as ``N`` identical units would.

    Args:
        target_variances: one tensor ``S^l`` per layer (any shape, typically ``[N, R]`` or
            ``[1, R]``).
        alpha: penalty scale ``alpha_S`` (paper: 0.1), non-negative.
        beta: variance scale ``beta_S`` (paper: 1e-3), positive.

    Returns:
        A scalar tensor (zero for no layers).

    Raises:
        ValueError: naming the argument, for a negative ``alpha``, a non-positive ``beta``, or
            an empty or non-finite variance tensor.
    """
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a non-negative number, got {alpha}")
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta must be a positive number, got {beta}")
    total: Tensor | None = None
    for index, variances in enumerate(target_variances):
        name = f"target_variances[{index}]"
        check_tensor(name, variances)
        check_finite(name, variances)
        if variances.numel() == 0:
            raise ValueError(f"{name} is empty")
        term = alpha * torch.sigmoid(beta / variances.abs()).mean()
        total = term if total is None else total + term
    return torch.zeros(()) if total is None else total
