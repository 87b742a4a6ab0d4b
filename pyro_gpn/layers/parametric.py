"""The parametric GPN layer (paper, section "Parametric Gaussian Process Neurons").

Each unit's activation function is the posterior mean (and variance) of a GP with unit-amplitude
SE kernel conditioned on ``R`` virtual observations ``f(V_r) = U_r + N(0, S_r)``
(``eq:gpn_parametrized_mu_sigma_y_sn``):

    mu(a)    = K(a, V) [K(V, V) + diag(S)]^-1 U         = alpha(a)^T beta,  beta = kappa U
    Sigma(a) = 1 - K(a, V) [K(V, V) + diag(S)]^-1 K(V, a) + sigma^2
             = 1 - alpha(a)^T kappa alpha(a) + sigma^2,  kappa = [K(V, V) + diag(S)]^-1.

The targets ``U`` and variances ``S`` are parameters fitted by maximum likelihood, with the
penalty ``eq:gpn_ls`` that keeps ``S`` from collapsing (see :mod:`pyro_gpn.losses`).
"""

from __future__ import annotations

import math

import torch
from pyro.nn import PyroParam
from torch import Tensor, nn
from torch.distributions import constraints

from ..moments.propagate import virtual_observation_weights
from .base import GPNLayerBase

__all__ = ["GPNLayer", "TARGET_INITS"]

TARGET_INITS = ("random", "identity")


class GPNLayer(GPNLayerBase):
    """A layer of parametric Gaussian Process Neurons.

    Args:
        in_features, out_features, num_inducing, share, learn_inducing, inducing_range,
        lengthscale_init, noise_std_init, compute_dtype, dtype, device: see
            :class:`~pyro_gpn.layers.base.GPNLayerBase`.
        targets_init: ``"random"`` (targets ``U ~ N(0, 1)``) or ``"identity"`` (``U = V``, an
            activation function close to the identity on the inducing range).
        target_variance_init: initial virtual-observation variance ``S`` (paper:
            ``sqrt(0.1)``). ``S`` is a *variance* here, as in the paper's equations.
        learn_target_variances: fit ``S`` (paper: yes) or keep it fixed.
        jitter: added to the diagonal of ``K(V, V) + diag(S)`` before the Cholesky.

    Attributes:
        targets: ``[N | 1, R]`` virtual-observation targets ``U``.
        target_variances: ``[N | 1, R]`` positive variances ``S`` (``PyroParam``).

    Example:
        >>> layer = GPNLayer(3, 5)
        >>> out = layer.propagate(torch.randn(8, 3), mode="meanvar")
        >>> out.mean.shape, out.var.shape
        (torch.Size([8, 5]), torch.Size([8, 5]))
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_inducing: int = 14,
        share: str = "none",
        targets_init: str = "random",
        learn_inducing: bool = False,
        inducing_range: tuple[float, float] = (-2.0, 2.0),
        lengthscale_init: float = 0.4,
        noise_std_init: float = 0.1,
        target_variance_init: float = math.sqrt(0.1),
        learn_target_variances: bool = True,
        jitter: float = 1e-6,
        compute_dtype: torch.dtype | None = torch.float64,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(
            in_features,
            out_features,
            num_inducing=num_inducing,
            share=share,
            learn_inducing=learn_inducing,
            inducing_range=inducing_range,
            lengthscale_init=lengthscale_init,
            noise_std_init=noise_std_init,
            compute_dtype=compute_dtype,
            dtype=dtype,
            device=device,
        )
        if targets_init not in TARGET_INITS:
            raise ValueError(f"targets_init must be one of {TARGET_INITS}, got {targets_init!r}")
        if not target_variance_init > 0:
            raise ValueError(f"target_variance_init must be positive, got {target_variance_init}")
        self.targets_init = targets_init
        self.jitter = jitter
        points = self.inducing_points.detach()
        if targets_init == "identity":
            targets = points.clone()
        else:
            targets = torch.randn(points.shape, dtype=points.dtype, device=points.device)
        self.targets = nn.Parameter(targets)
        variances = torch.full_like(points, target_variance_init)
        if learn_target_variances:
            self.target_variances = PyroParam(variances, constraints.positive)
        else:
            self.register_buffer("target_variances", variances)

    def _weights(self, with_kappa: bool) -> tuple[Tensor | None, Tensor]:
        return virtual_observation_weights(
            self.compute_inducing_points(),
            self.to_compute(self.targets),
            self.to_compute(self.target_variances),
            self.to_compute(self.lengthscales),
            jitter=self.jitter,
            with_kappa=with_kappa,
        )

    def response_weights(self) -> tuple[Tensor, Tensor]:
        """``beta = kappa U`` and ``C = kappa`` (``eq:gpn_normal_alpha_kappa``)."""
        kappa, beta = self._weights(with_kappa=True)
        return beta, kappa

    def response_mean_weights(self) -> Tensor:
        """``beta = (K(V, V) + diag(S))^-1 U`` by one solve, without forming ``kappa``."""
        return self._weights(with_kappa=False)[1]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", targets_init={self.targets_init!r}"
