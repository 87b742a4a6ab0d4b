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

__all__ = ["expected_cross_kernel_product", "expected_kernel", "expected_kernel_product"]


def _zero_if_none(var: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if var is None else var


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
    """
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
    """
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
    """
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
