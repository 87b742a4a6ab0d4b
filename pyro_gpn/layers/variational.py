r"""The variational GPN layer (paper, section "Approximate Bayesian Inference").

The virtual-observation targets become random variables with the GP prior
(``eq:gpn_vi_puv``) and no target variance (``S = 0``):

.. math::

    p(U_{\star n}) = \mathcal{N}\big(U_{\star n} \mid 0, K_n\big), \qquad
    K_n = K(V_{\star n}, V_{\star n}) + \epsilon I,

with ``epsilon`` the ``jitter``. Given the targets, a unit's response to activation ``a`` is the
GP conditional ``p(f | a, U) = N(alpha^T K^-1 U, 1 - alpha^T K^-1 alpha)`` with
``alpha_r = k(a, V_r)`` (:meth:`VariationalGPNLayer.target_conditional`). The variational
posterior is a Gaussian per unit (or one for the layer with ``share="layer"``),
``q(U_n) = N(mu_hat_n, Sigma_hat_n)``, and marginalising ``U`` under ``q`` gives
(``eq:gpn_vi_sampling_muhat_sigmahat_fl``)

.. math::

    q(f \mid a) = \mathcal{N}\big(\alpha^T \beta,\; 1 - \alpha^T \hat K \alpha\big), \qquad
    \beta = K^{-1}\hat\mu, \qquad \hat K = K^{-1} - K^{-1}\hat\Sigma K^{-1}.

This is exactly the form :class:`~pyro_gpn.layers.base.GPNLayerBase` propagates, so
:meth:`~pyro_gpn.layers.base.GPNLayerBase.propagate` evaluates ``eq:gpn_vi_mu``,
``eq:gpn_vi_marginal_sigma_fl`` and ``eq:gpn_vi_marginal_sigma2_fl`` through the core
(:func:`pyro_gpn.moments.response_moments`), and
:meth:`~pyro_gpn.layers.base.GPNLayerBase.conditional` gives ``q(f | a)``.

**Parametrisations.**

* ``whiten=False``: ``targets_loc`` and ``targets_scale_tril`` (or ``targets_scale``) are
  ``mu_hat`` and the Cholesky factor of ``Sigma_hat`` directly.
* ``whiten=True``: ``U = L z`` with ``L L^T = K``; the prior on ``z`` is ``N(0, I)`` and the
  variational parameters describe ``q(z) = N(m, S S^T)``, i.e. ``mu_hat = L m`` and
  ``Sigma_hat = L S S^T L^T``. Then ``beta = L^-T m`` and ``Khat = L^-T (I - S S^T) L^-1``.
  Whitening decouples the variational parameters from the lengthscale (as in Pyro's
  ``VariationalSparseGP``) and usually conditions the optimisation better.
* ``q_cov="full"``: ``S`` lower triangular with positive diagonal (``constraints.lower_cholesky``);
  ``q_cov="diag"``: ``S = diag(targets_scale)`` (``constraints.positive``).

**KL term.** :meth:`VariationalGPNLayer.kl_divergence` is ``sum_n KL(q(U_n) || p(U_n))``
(``eq:gpn_vi_sampling_la``, with the constant ``-R/2`` per function that the paper drops, so the
value is the exact KL divergence):

.. math::

    \mathrm{KL} = \tfrac12\big[\mathrm{tr}(K^{-1}\hat\Sigma) + \hat\mu^T K^{-1}\hat\mu - R
                  + \log|K| - \log|\hat\Sigma|\big].

The same expression in whitened coordinates is ``KL(N(m, S S^T) || N(0, I))`` (KL is invariant
under the invertible map ``z -> L z``).

**Cost.** One Cholesky of ``K`` per function and a few triangular solves:
``O(G R^3)`` per evaluation of :meth:`response_weights` or :meth:`kl_divergence`
(``G = N`` functions, or 1 with ``share="layer"``), independent of the number of samples.
"""

from __future__ import annotations

import torch
from pyro.distributions import MultivariateNormal
from pyro.nn import PyroParam
from torch import Tensor, nn
from torch.distributions import constraints

from ..kernels import squared_exponential
from .base import GPNLayerBase

__all__ = ["Q_COVS", "TARGETS_INITS", "VariationalGPNLayer"]

Q_COVS = ("full", "diag")
TARGETS_INITS = ("random", "identity", "zero")


class VariationalGPNLayer(GPNLayerBase):
    """A layer of GPN units with a GP prior on the targets and a Gaussian variational posterior.

    Args:
        in_features, out_features, num_inducing, share, learn_inducing, inducing_range,
        lengthscale_init, noise_std_init, compute_dtype, dtype, device: see
            :class:`~pyro_gpn.layers.base.GPNLayerBase`.
        q_cov: ``"full"`` (a full covariance per function, ``targets_scale_tril``) or
            ``"diag"`` (independent targets, ``targets_scale``).
        whiten: parametrise ``q`` on the whitened targets ``z = L^-1 U`` (see module docs).
        targets_init: initial mean of ``q(U)``: ``"identity"`` (default; ``mu_hat = V``, an
            activation function close to the identity on the inducing range), ``"random"`` (a
            draw from the prior ``N(0, K)``) or ``"zero"``. Random prior draws -- wiggly
            activation functions -- often leave the optimiser in the optimum where the output
            noise explains the data (UCI yacht: 2 of 3 seeds, test RMSE about 11 against 0.3
            from the identity; ``docs/results/routes.md``).
        targets_scale_init: initial ``q`` scale as a fraction ``c`` of the prior:
            ``Sigma_hat = c^2 K`` (``"full"``, or ``S = c I`` whitened) and
            ``Sigma_hat = c^2 diag(K)`` for ``"diag"`` without whitening. ``c = 1`` with
            ``targets_init="zero"`` is ``q = p``.
        jitter: ``epsilon`` added to the diagonal of ``K(V, V)`` (the prior covariance).

    Attributes:
        targets_loc: ``[N | 1, R]`` mean ``mu_hat`` of ``q(U)`` (``m`` of ``q(z)`` whitened).
        targets_scale_tril: ``[N | 1, R, R]`` lower Cholesky factor of the ``q`` covariance
            (``q_cov="full"``; ``PyroParam`` with ``constraints.lower_cholesky``).
        targets_scale: ``[N | 1, R]`` standard deviations (``q_cov="diag"``; positive).

    Example:
        >>> layer = VariationalGPNLayer(3, 5)
        >>> out = layer.propagate(torch.randn(8, 3), mode="meanvar")
        >>> float(layer.kl_divergence()) >= 0
        True
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_inducing: int = 14,
        share: str = "none",
        q_cov: str = "full",
        whiten: bool = False,
        targets_init: str = "identity",
        targets_scale_init: float = 0.1,
        learn_inducing: bool = False,
        inducing_range: tuple[float, float] = (-2.0, 2.0),
        lengthscale_init: float = 0.4,
        noise_std_init: float = 0.1,
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
        if q_cov not in Q_COVS:
            raise ValueError(f"q_cov must be one of {Q_COVS}, got {q_cov!r}")
        if targets_init not in TARGETS_INITS:
            raise ValueError(f"targets_init must be one of {TARGETS_INITS}, got {targets_init!r}")
        if not targets_scale_init > 0:
            raise ValueError(f"targets_scale_init must be positive, got {targets_scale_init}")
        if not jitter >= 0:
            raise ValueError(f"jitter must be non-negative, got {jitter}")
        self.q_cov = q_cov
        self.whiten = bool(whiten)
        self.targets_init = targets_init
        self.jitter = float(jitter)

        with torch.no_grad():
            points = self.inducing_points.detach()
            chol = self.prior_scale_tril().detach()
            eye = torch.eye(self.num_inducing, dtype=points.dtype, device=points.device)
            if targets_init == "random":
                white = torch.randn(points.shape, dtype=points.dtype, device=points.device)
            elif targets_init == "identity":
                white = torch.linalg.solve_triangular(
                    chol, points.unsqueeze(-1), upper=False
                ).squeeze(-1)
            else:
                white = torch.zeros_like(points)
            loc = white if self.whiten else (chol @ white.unsqueeze(-1)).squeeze(-1)
            self.targets_loc = nn.Parameter(loc.clone())
            if q_cov == "full":
                tril = eye.expand_as(chol) if self.whiten else chol
                self.targets_scale_tril = PyroParam(
                    (targets_scale_init * tril).clone(), constraints.lower_cholesky
                )
            else:
                prior_std = (
                    torch.ones_like(points) if self.whiten else (chol.square().sum(-1)).sqrt()
                )
                self.targets_scale = PyroParam(
                    (targets_scale_init * prior_std).clone(), constraints.positive
                )

    # ------------------------------------------------------------------ prior and posterior
    def prior_scale_tril(self) -> Tensor:
        """``[N | 1, R, R]`` lower Cholesky factor ``L`` of ``K(V, V) + jitter I``."""
        return self._prior_scale_tril(self.inducing_points, self.lengthscales)

    def _prior_scale_tril(self, points: Tensor, lengthscales: Tensor) -> Tensor:
        gram = squared_exponential(points, points, lengthscales)
        eye = torch.eye(points.shape[-1], dtype=points.dtype, device=points.device)
        return torch.linalg.cholesky(gram + self.jitter * eye)

    def _compute_prior_scale_tril(self) -> Tensor:
        """:meth:`prior_scale_tril` evaluated in :attr:`compute_dtype`."""
        return self._prior_scale_tril(
            self.compute_inducing_points(), self.to_compute(self.lengthscales)
        )

    def variational_scale_tril(self) -> Tensor:
        """``[N | 1, R, R]`` lower Cholesky factor of the ``q`` covariance in the coordinates
        of the targets' sample site (``U``, or ``z`` when whitened)."""
        if self.q_cov == "full":
            return self.targets_scale_tril
        return torch.diag_embed(self.targets_scale)

    def target_prior(self) -> MultivariateNormal:
        """The prior of the targets' sample site: ``N(0, K)`` (``eq:gpn_vi_puv``), or
        ``N(0, I)`` for the whitened ``z``; batch shape ``[N | 1]``, event shape ``[R]``."""
        loc = torch.zeros_like(self.inducing_points)
        if self.whiten:
            eye = torch.eye(self.num_inducing, dtype=loc.dtype, device=loc.device)
            return MultivariateNormal(loc, scale_tril=eye.expand(loc.shape[0], -1, -1))
        return MultivariateNormal(loc, scale_tril=self.prior_scale_tril())

    def target_posterior(self) -> MultivariateNormal:
        """The variational posterior ``q`` of the targets' sample site (``U``, or ``z``);
        batch shape ``[N | 1]``, event shape ``[R]``."""
        return MultivariateNormal(self.targets_loc, scale_tril=self.variational_scale_tril())

    def kl_divergence(self) -> Tensor:
        """``sum_n KL(q(U_n) || p(U_n))`` (``eq:gpn_vi_sampling_la`` with its constant), a scalar.

        Evaluated in whitened coordinates, ``KL(N(m, S S^T) || N(0, I))`` with ``m = L^-1 mu_hat``,
        ``S = L^-1 chol(Sigma_hat)`` unless the layer is already whitened.
        """
        loc = self.to_compute(self.targets_loc)
        tril = self.to_compute(self.variational_scale_tril())
        if not self.whiten:
            chol = self._compute_prior_scale_tril()
            loc = torch.linalg.solve_triangular(chol, loc.unsqueeze(-1), upper=False).squeeze(-1)
            tril = torch.linalg.solve_triangular(chol, tril, upper=False)
        logdet = torch.diagonal(tril, dim1=-2, dim2=-1).abs().log().sum(-1)
        per_function = 0.5 * (tril.square().sum((-2, -1)) + loc.square().sum(-1))
        per_function = per_function - 0.5 * self.num_inducing - logdet
        return per_function.sum().to(self.targets_loc.dtype)

    # ------------------------------------------------------------------ responses
    def response_weights(self) -> tuple[Tensor, Tensor]:
        """``beta = K^-1 mu_hat`` and ``C = Khat = K^-1 - K^-1 Sigma_hat K^-1``
        (``eq:gpn_vi_sampling_muhat_fl``, ``eq:gpn_vi_sampling_sigmahat_fl``).

        Returns:
            ``beta [N | 1, R]`` and ``Khat [N | 1, R, R]`` (symmetric).
        """
        chol = self._compute_prior_scale_tril()
        kinv = torch.cholesky_inverse(chol)
        tril = self.to_compute(self.variational_scale_tril())
        loc = self.to_compute(self.targets_loc)
        if self.whiten:  # beta = L^-T m, Khat = L^-T (I - S S^T) L^-1
            beta = torch.linalg.solve_triangular(chol.mT, loc.unsqueeze(-1), upper=True)
            beta = beta.squeeze(-1)
            root = torch.linalg.solve_triangular(chol.mT, tril, upper=True)
        else:
            beta = torch.cholesky_solve(loc.unsqueeze(-1), chol).squeeze(-1)
            root = torch.cholesky_solve(tril, chol)  # K^-1 chol(Sigma_hat)
        khat = kinv - root @ root.mT
        return beta, 0.5 * (khat + khat.mT)

    def target_conditional(
        self, activations: Tensor, targets: Tensor, noise: bool = False
    ) -> tuple[Tensor, Tensor]:
        """The GP conditional ``p(F | A, U)`` per sample, for given targets (S = 0).

        ``eq:gpn_parametrized_mu_sigma_y_sn`` with ``S = 0``, diagonal over samples:
        mean ``alpha^T K^-1 U`` and variance ``1 - alpha^T K^-1 alpha`` (plus ``sigma^2`` with
        ``noise``). Leading batch dimensions broadcast (e.g. vectorised particles).

        Args:
            activations: ``[..., S, N]`` activations ``A = X W``.
            targets: ``[..., N | 1, R]`` values of the targets' sample site (``U``, or ``z``
                when whitened, then ``U = L z``). Its leading dimensions ``...`` broadcast with
                the activations' ``[..., S]`` (plate alignment: a batch of particles is
                ``[P, 1, N, R]`` against activations ``[P, S, N]``).
            noise: add the output noise variance ``sigma^2``.

        Returns:
            ``mean`` and ``var``, each ``[..., S, N]``.
        """
        out_dtype = activations.dtype
        activations, targets = self.to_compute(activations), self.to_compute(targets)
        chol = self._compute_prior_scale_tril()
        if self.whiten:  # K^-1 L z = L^-T z
            weights = torch.linalg.solve_triangular(chol.mT, targets.unsqueeze(-1), upper=True)
        else:
            weights = torch.cholesky_solve(targets.unsqueeze(-1), chol)
        weights = weights.squeeze(-1)  # [..., N | 1, R], K^-1 U
        kinv = torch.cholesky_inverse(chol)  # [N | 1, R, R]
        alpha = squared_exponential(
            activations.unsqueeze(-1),
            self.compute_inducing_points(),
            self.to_compute(self.lengthscales),
        ).squeeze(-2)  # [..., S, N, R]
        mean = (alpha * weights).sum(-1).to(out_dtype)
        quad = torch.einsum(
            "...nr,nrt,...nt->...n", alpha, kinv.expand(alpha.shape[-2], -1, -1), alpha
        )
        var = (1 - quad).clamp_min(0).to(out_dtype)
        if noise:
            var = var + self.noise_std.square()
        return mean, var.expand_as(mean)

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", q_cov={self.q_cov!r}, whiten={self.whiten}, targets_init={self.targets_init!r}"
        )
