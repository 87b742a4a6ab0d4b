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

from ..moments.weights import _virtual_observation_weights
from .base import GPNLayerBase, Response

__all__ = ["GPNLayer", "TARGET_INITS", "VirtualObservations"]

#: initial targets of :class:`VirtualObservations`
TARGET_INITS = ("random", "identity")


class VirtualObservations(Response):
    """Targets ``U`` and variances ``S`` as parameters (maximum likelihood).

    Args:
        points: ``[G, R]`` the layer's initial inducing points ``V``.
        lengthscales: ``[G]`` its initial lengthscales (unused: the targets need no prior).
        targets_init: ``"random"`` (targets ``U ~ N(0, 1)``) or ``"identity"`` (``U = V``, an
            activation function close to the identity on the inducing range).
        target_variance_init: initial virtual-observation variance ``S`` (paper:
            ``sqrt(0.1)``). ``S`` is a *variance* here, as in the paper's equations.
        learn_target_variances: fit ``S`` (paper: yes) or keep it fixed.
        jitter: added to the diagonal of ``K(V, V) + diag(S)`` before the Cholesky.

    Attributes:
        targets: ``[G, R]`` virtual-observation targets ``U``.
        target_variances: ``[G, R]`` positive variances ``S`` (``PyroParam``).
    """

    def __init__(
        self,
        points: Tensor,
        lengthscales: Tensor,
        targets_init: str = "random",
        target_variance_init: float = math.sqrt(0.1),
        learn_target_variances: bool = True,
        jitter: float = 1e-6,
    ) -> None:
        super().__init__()
        if targets_init not in TARGET_INITS:
            raise ValueError(f"targets_init must be one of {TARGET_INITS}, got {targets_init!r}")
        if not (math.isfinite(target_variance_init) and target_variance_init > 0):
            raise ValueError(
                f"target_variance_init must be positive and finite, got {target_variance_init}"
            )
        self.targets_init = targets_init
        self.jitter = jitter
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

    def _weights(self, points: Tensor, lengthscales: Tensor, with_kappa: bool):
        return _virtual_observation_weights(
            points,
            self.targets.to(points.dtype),
            self.target_variances.to(points.dtype),
            lengthscales,
            jitter=self.jitter,
            with_kappa=with_kappa,
        )

    def weights(self, points: Tensor, lengthscales: Tensor) -> tuple[Tensor, Tensor]:
        """``beta = kappa U`` and ``C = kappa`` (``eq:gpn_normal_alpha_kappa``)."""
        kappa, beta = self._weights(points, lengthscales, with_kappa=True)
        return beta, kappa

    def factored_weights(self, points: Tensor, lengthscales: Tensor, with_reduction: bool = True):
        """``beta``, ``C = kappa`` and ``L = chol(K(V, V) + diag(S))`` (``kappa = (L L^T)^-1``,
        ``None`` with ``with_reduction=False``; ``M`` the identity)."""
        kappa, beta, chol = _virtual_observation_weights(
            points,
            self.targets.to(points.dtype),
            self.target_variances.to(points.dtype),
            lengthscales,
            jitter=self.jitter,
            with_kappa=with_reduction,
            with_cholesky=True,
        )
        return beta, kappa, chol, None

    def variance_factor(self, points: Tensor, lengthscales: Tensor) -> Tensor:
        """``L = chol(K(V, V) + diag(S))``, the factor of :meth:`factored_weights`."""
        return self.factored_weights(points, lengthscales, with_reduction=False)[2]

    def mean_weights(self, points: Tensor, lengthscales: Tensor) -> Tensor:
        """``beta = (K(V, V) + diag(S))^-1 U`` by one solve, without forming ``kappa``."""
        return self._weights(points, lengthscales, with_kappa=False)[1]

    def penalised_variances(self) -> Tensor:
        """``S``, which the penalty ``eq:gpn_ls`` keeps from collapsing."""
        return self.target_variances

    def extra_repr(self) -> str:
        return f"targets_init={self.targets_init!r}"


class GPNLayer(GPNLayerBase):
    """A layer of parametric Gaussian Process Neurons: the layer with
    :class:`VirtualObservations` as its response.

    Args:
        in_features, out_features, num_inducing, share, and the keywords of
            :class:`~pyro_gpn.layers.base.GPNLayerBase` (``learn_inducing``, ``inducing_range``,
            ``lengthscale_init``, ``noise_std_init``, ``compute_dtype``, ``dtype``, ...).
        **response_options: of :class:`VirtualObservations` (``targets_init``,
            ``target_variance_init``, ``learn_target_variances``, ``jitter``).

    Attributes:
        targets, target_variances: the response's ``U [N | 1, R]`` and ``S [N | 1, R]``.

    Example:
        >>> layer = GPNLayer(3, 5, targets_init="identity")
        >>> out = layer.propagate(torch.randn(8, 3), mode="meanvar")
        >>> out.mean.shape, out.var.shape
        (torch.Size([8, 5]), torch.Size([8, 5]))
    """

    default_response = VirtualObservations
