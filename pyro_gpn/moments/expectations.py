r"""Expectations of squared-exponential kernels under Gaussian activations.

With unit-amplitude SE kernels ``alpha_r(a) = exp(-(a - V_r)^2 / (2 lambda^2))`` between an
activation ``a`` and the inducing points ``V``, the closed-form GPN moments need

* ``psi_r     = E[alpha_r(a)]``,                 ``a ~ N(mu, v)``      (``eq:gpn_normal_E_alpha``)
* ``Omega_rt  = E[alpha_r(a) alpha_t(a)]``,      ``a ~ N(mu, v)``      (``eq:gpn_normal_omega``)
* ``Lambda_rt = E[alpha_r(a_n) alpha_t(a_m)]``,  ``(a_n, a_m)`` jointly Gaussian
  (``eq:gpn_normal_lambda``, corrected; see below).

All three are products of Gaussian densities integrated in closed form:

.. math::

    \psi_r = \sqrt{\frac{\lambda^2}{\lambda^2 + v}}
             \exp\Big(-\frac{(\mu - V_r)^2}{2(\lambda^2 + v)}\Big), \qquad
    \Omega_{rt} = \sqrt{\frac{\lambda^2}{\lambda^2 + 2v}}
             \exp\Big(-\frac{(\mu - \tfrac{V_r + V_t}{2})^2}{\lambda^2 + 2v}
                      -\frac{(V_r - V_t)^2}{4\lambda^2}\Big).

For ``Lambda`` the paper's printed indices are mixed up. Derived from the bivariate Gaussian
integral, with ``d_n = V_rn - mu_n``, ``d_m = V_tm - mu_m``, ``c_n = lambda_n^2 + Sigma_nn``,
``c_m = lambda_m^2 + Sigma_mm`` and ``D = c_n c_m - Sigma_nm^2``:

.. math::

    \Lambda_{rt} = \frac{\lambda_n \lambda_m}{\sqrt{D}}
        \exp\Big(-\frac{d_n^2 c_m + d_m^2 c_n - 2 d_n d_m \Sigma_{nm}}{2D}\Big).

These functions materialise the full tensors and serve as the readable reference (and the
Monte Carlo tests' subject). :mod:`pyro_gpn.moments.propagate` contracts them without
materialising ``Omega`` or ``Lambda`` at scale.

Shapes: ``S`` samples, ``N`` units, ``R`` inducing points per unit. Per-unit parameters have a
leading dimension ``N`` or ``1`` (one activation function shared by the layer), broadcast over
units.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import (
    check_ndim,
    check_per_unit,
    check_psd,
    check_same_dtype_device,
    check_shape,
    check_tensor,
    check_values,
)

__all__ = ["expected_cross_kernel_product", "expected_kernel", "expected_kernel_product"]


def _zero_if_none(var: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if var is None else var


def _check_arguments(
    mean: Tensor,
    second: tuple[str, Tensor | None],
    inducing_points: Tensor,
    lengthscales: Tensor,
) -> None:
    """Shapes ``mean [S, N]``, ``var [S, N]`` or ``cov [S, N, N]`` (``second``),
    ``inducing_points [N | 1, R]`` (or ``[R]``) and ``lengthscales [N | 1]``, one dtype and
    device; while validation is on, finite ``mean`` and ``inducing_points``, a non-negative
    ``var`` or a symmetric positive semi-definite ``cov``, positive ``lengthscales``."""
    check_tensor("mean", mean)
    check_ndim("mean", mean, 2)
    num_samples, num_units = mean.shape
    name, value = second
    if value is not None or name == "cov":
        check_tensor(name, value)
        wanted = (num_samples, num_units) + ((num_units,) if name == "cov" else ())
        check_shape(name, value, wanted)
    check_tensor("inducing_points", inducing_points)
    if inducing_points.dim() != 1:  # [R]: shared by every unit, as [1, R]
        check_per_unit("inducing_points", inducing_points, num_units, (None,), owner="mean")
    check_tensor("lengthscales", lengthscales)
    check_per_unit("lengthscales", lengthscales, num_units, owner="mean")
    check_same_dtype_device(
        "mean",
        mean,
        {name: value, "inducing_points": inducing_points, "lengthscales": lengthscales},
    )
    check_values(
        finite={"mean": mean, "inducing_points": inducing_points},
        nonnegative={"var": value} if name == "var" else None,
        positive={"lengthscales": lengthscales},
    )
    if name == "cov":
        check_psd("cov", value)


def expected_kernel(
    mean: Tensor, var: Tensor | None, inducing_points: Tensor, lengthscales: Tensor
) -> Tensor:
    """``psi = E[k(a, V_r)]`` for ``a ~ N(mean, var)`` (``eq:gpn_normal_E_alpha``).

    Args:
        mean: ``[S, N]`` activation means.
        var: ``[S, N]`` activation variances, or ``None`` for deterministic activations.
        inducing_points: ``[N | 1, R]``.
        lengthscales: ``[N | 1]``.

    Returns:
        ``[S, N, R]``.

    Raises:
        TypeError: if an argument is not a tensor.
        ValueError: naming the argument, for shapes that do not fit together or mixed dtypes
            or devices; while :func:`pyro_gpn.settings.is_validation_enabled`, for non-finite
            ``mean`` or ``inducing_points``, a negative ``var`` or non-positive
            ``lengthscales``.
    """
    _check_arguments(mean, ("var", var), inducing_points, lengthscales)
    var = _zero_if_none(var, mean)
    ls2 = lengthscales.square()
    c = (ls2 + var).unsqueeze(-1)  # [S, N, 1]
    diff = mean.unsqueeze(-1) - inducing_points  # [S, N, R]
    return (ls2.unsqueeze(-1) / c).sqrt() * (-0.5 * diff.square() / c).exp()


def expected_kernel_product(
    mean: Tensor, var: Tensor | None, inducing_points: Tensor, lengthscales: Tensor
) -> Tensor:
    """``Omega``: ``E[k(a, V_r) k(a, V_t)]`` for ``a ~ N(mean, var)`` (``eq:gpn_normal_omega``).

    Args:
        mean: ``[S, N]``; var: ``[S, N]`` or ``None``; inducing_points: ``[N | 1, R]``;
        lengthscales: ``[N | 1]``.

    Returns:
        ``[S, N, R, R]``.

    Raises:
        TypeError: if an argument is not a tensor.
        ValueError: naming the argument, for shapes that do not fit together or mixed dtypes
            or devices; while :func:`pyro_gpn.settings.is_validation_enabled`, for non-finite
            ``mean`` or ``inducing_points``, a negative ``var`` or non-positive
            ``lengthscales``.
    """
    _check_arguments(mean, ("var", var), inducing_points, lengthscales)
    var = _zero_if_none(var, mean)
    ls2 = lengthscales.square()
    c = (ls2 + 2 * var)[..., None, None]  # [S, N, 1, 1]
    mid = 0.5 * (inducing_points.unsqueeze(-1) + inducing_points.unsqueeze(-2))  # [N, R, R]
    sep = (inducing_points.unsqueeze(-1) - inducing_points.unsqueeze(-2)).square()
    sep = sep / (4 * ls2[:, None, None])
    diff = mean[..., None, None] - mid
    return (ls2[:, None, None] / c).sqrt() * (-diff.square() / c - sep).exp()


def expected_cross_kernel_product(
    mean: Tensor, cov: Tensor, inducing_points: Tensor, lengthscales: Tensor
) -> Tensor:
    """``Lambda = E[k(a_n, V_rn) k(a_m, V_tm)]``, ``a ~ N(mean, cov)`` (``eq:gpn_normal_lambda``).

    Uses the corrected formula of the module docstring. On the diagonal ``n == m`` this is the
    joint expectation of two kernels of the *same* activation, i.e. ``Omega``.

    Args:
        mean: ``[S, N]``; cov: ``[S, N, N]``; inducing_points: ``[N | 1, R]``;
        lengthscales: ``[N | 1]``.

    Returns:
        ``[S, N, N, R, R]`` indexed ``[s, n, m, r, t]``. Memory grows as ``S N^2 R^2``: use it
        for small problems and tests; :func:`pyro_gpn.moments.propagate.response_moments`
        contracts it in chunks.

    Raises:
        TypeError: if an argument is not a tensor.
        ValueError: naming the argument, for shapes that do not fit together or mixed dtypes
            or devices; while :func:`pyro_gpn.settings.is_validation_enabled`, for non-finite
            ``mean`` or ``inducing_points``, a ``cov`` that is not symmetric positive
            semi-definite or non-positive ``lengthscales``.
    """
    _check_arguments(mean, ("cov", cov), inducing_points, lengthscales)
    num_units = mean.shape[-1]
    ls = lengthscales.expand(num_units)
    V = inducing_points.expand(num_units, -1)
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    ls2 = ls.square()
    c = ls2 + var  # [S, N]
    c_n, c_m = c[:, :, None], c[:, None, :]  # [S, N, 1], [S, 1, N]
    # D = c_n c_m - Sigma_nm^2 summed from non-negative parts: no cancellation near |rho| = 1
    var_n, var_m = var[:, :, None], var[:, None, :]
    ls2_n, ls2_m = ls2[:, None], ls2[None, :]
    det = (
        ls2_n * ls2_m + ls2_n * var_m + ls2_m * var_n + (var_n * var_m - cov.square()).clamp_min(0)
    )
    d = V - mean.unsqueeze(-1)  # [S, N, R]
    d_n = d[:, :, None, :, None]  # [S, N, 1, R, 1]
    d_m = d[:, None, :, None, :]  # [S, 1, N, 1, R]
    c_n5, c_m5 = c_n[..., None, None], c_m[..., None, None]
    cov5, det5 = cov[..., None, None], det[..., None, None]
    expo = -(d_n.square() * c_m5 + d_m.square() * c_n5 - 2 * d_n * d_m * cov5) / (2 * det5)
    scale = ls[:, None] * ls[None, :] / det.sqrt()  # [S, N, N]
    return scale[..., None, None] * expo.exp()
