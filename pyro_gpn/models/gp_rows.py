"""Exact GP algebra over the rows of a non-parametric GPN layer: the Cholesky factor of a layer's
output covariance over all rows and the Gaussian of some rows given the others (used by
:class:`~pyro_gpn.models.nonparametric.NonParametricGPN`)."""

from __future__ import annotations

import torch
from torch import Tensor

from pyro_gpn.kernels import _gpn_kernel

__all__ = ["activation_cholesky", "cat_rows", "conditional_rows", "layer_cholesky"]


def layer_cholesky(
    inputs: Tensor,
    weight: Tensor,
    noise_std: Tensor,
    lengthscale: Tensor | float,
    jitter: float,
) -> Tensor:
    r"""Cholesky factor of one layer's output covariance over all rows (``eq:gpn_output_marginal``).

    Args:
        inputs: ``[..., S, M]`` the previous layer's outputs ``X^{l-1}``.
        weight: ``[..., N, M]`` one row ``W^l_{\star n}`` per unit.
        noise_std: ``[..., N]`` the noise standard deviations ``sigma^l``.
        lengthscale: scalar or ``[..., N]``.
        jitter: added to the diagonal on top of ``sigma^2`` for round-off.

    Returns:
        ``[..., N, S, S]`` lower-triangular ``L`` with
        ``L L^T = K_w(X^{l-1}, X^{l-1}) + (sigma^2 + jitter) I`` for every unit. Where the
        factorisation fails numerically the factor is NaN, so that a sampler rejects the state
        instead of crashing.
    """
    cov = _gpn_kernel(inputs, None, weight.mT, lengthscale)
    diag = noise_std.square() + jitter
    cov = cov + diag[..., None, None] * torch.eye(cov.shape[-1], dtype=cov.dtype)
    chol, info = torch.linalg.cholesky_ex(cov)
    # no data-dependent branch here, so that a JIT trace keeps the failure path
    return torch.where((info > 0)[..., None, None], torch.nan, chol)


def activation_cholesky(
    inputs: Tensor,
    weight: Tensor,
    noise_std: Tensor,
    lengthscale: Tensor | float,
    top_weight: Tensor,
    jitter: float,
) -> Tensor:
    r"""Cholesky factor of the next layer's activations ``A = X W_top^T`` over all rows, with
    the hidden outputs ``X`` of this layer integrated out (``collapse=True`` of
    :class:`~pyro_gpn.models.nonparametric.NonParametricGPN`).

    The hidden outputs are independent Gaussians per unit, ``X_{\star n} ~ N(0, C_n)`` with
    ``C_n = K_{w_n}(X^{l-1}, X^{l-1}) + sigma_n^2 I`` (``eq:gpn_output_marginal``), so ``A`` is
    jointly Gaussian with ``Cov(A_{sk}, A_{tj}) = sum_n V_{kn} V_{jn} (C_n)_{st}``
    (``V`` = ``top_weight``), flattened rows major (index ``s K + k``).

    Args:
        inputs: ``[..., S, M]`` the previous layer's outputs.
        weight: ``[..., N, M]`` this layer's weights, one row per unit.
        noise_std: ``[..., N]``; lengthscale: scalar or ``[..., N]``.
        top_weight: ``[..., K, N]`` the next layer's weights.
        jitter: added to the diagonal of the ``[S K, S K]`` covariance.

    Returns:
        ``[..., S K, S K]`` lower-triangular factor, NaN where the factorisation fails.
    """
    cov = _gpn_kernel(inputs, None, weight.mT, lengthscale)  # [..., N, S, S]
    eye = torch.eye(cov.shape[-1], dtype=cov.dtype)
    cov = cov + noise_std.square()[..., None, None] * eye
    rows, width = cov.shape[-1], top_weight.shape[-2]
    joint = torch.einsum("...kn,...jn,...nst->...sktj", top_weight, top_weight, cov)
    joint = joint.reshape(*joint.shape[:-4], rows * width, rows * width)
    joint = joint + jitter * torch.eye(rows * width, dtype=cov.dtype)
    chol, info = torch.linalg.cholesky_ex(joint)
    return torch.where((info > 0)[..., None, None], torch.nan, chol)


def conditional_rows(chol: Tensor, num_train: int, train_rows: Tensor) -> tuple[Tensor, Tensor]:
    r"""Gaussian of the trailing rows given the leading ones, from the joint's Cholesky factor.

    With ``C = L L^T`` partitioned after ``num_train`` rows,
    ``x_2 | x_1 ~ N(L_21 L_11^{-1} x_1, L_22 L_22^T)`` (``eq:gp_f_reg_mean_var``).

    Args:
        chol: ``[..., N, S, S]`` joint factor ``L``.
        num_train: number of leading (conditioned-on) rows ``S_1``.
        train_rows: ``[..., N, S_1]`` values of the leading rows.

    Returns:
        ``loc [..., N, S - S_1]`` and ``scale_tril [..., N, S - S_1, S - S_1]``.
    """
    l11 = chol[..., :num_train, :num_train]
    l21 = chol[..., num_train:, :num_train]
    white = torch.linalg.solve_triangular(l11, train_rows.unsqueeze(-1), upper=False)
    return (l21 @ white).squeeze(-1), chol[..., num_train:, num_train:]


def cat_rows(train: Tensor, test: Tensor) -> Tensor:
    """Concatenate ``[..., N, S_1]`` and ``[..., N, S_2]`` along rows, broadcasting batch dims."""
    batch = torch.broadcast_shapes(train.shape[:-1], test.shape[:-1])
    return torch.cat([train.expand(*batch, -1), test.expand(*batch, -1)], dim=-1)
