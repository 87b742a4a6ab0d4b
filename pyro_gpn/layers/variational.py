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

This is exactly the form :class:`~pyro_gpn.layers.base.GPNLayerBase` propagates: the layer is
the base with the response :class:`VariationalTargets`, so
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

**KL term.** :meth:`VariationalTargets.kl_divergence` (the layer's ``kl_divergence()``) is
``sum_n KL(q(U_n) || p(U_n))``
(``eq:gpn_vi_sampling_la``, with the constant ``-R/2`` per function that the paper drops, so the
value is the exact KL divergence):

.. math::

    \mathrm{KL} = \tfrac12\big[\mathrm{tr}(K^{-1}\hat\Sigma) + \hat\mu^T K^{-1}\hat\mu - R
                  + \log|K| - \log|\hat\Sigma|\big].

The same expression in whitened coordinates is ``KL(N(m, S S^T) || N(0, I))`` (KL is invariant
under the invertible map ``z -> L z``).

**Weights.** With ``weights="variational"`` (the default) the projection ``W`` is a latent
variable too, as the parameters of a deep GP or of DVI (Wu et al. 2019) are: a prior
``W_ij ~ N(0, s^2)``, ``s = weight_prior_scale / sqrt(M)`` (fan-in scaling keeps the
activations of standardised inputs of order one, inside the inducing range), and a mean-field
posterior ``q(W_ij) = N(m_ij, v_ij)`` (``weight`` is ``m``, ``weight_scale`` is ``sqrt(v)``).
The closed-form objective uses the moments of the activations ``A = X W`` under ``q(W)`` and
the input moments (the local reparameterisation: ``X`` and ``W`` independent, the columns of
``W`` independent),

.. math::

    \mathbb{E}[A_{sn}] = \sum_m \mathbb{E}[X_{sm}] m_{mn}, \qquad
    \mathrm{Cov}[A_{sn}, A_{sn'}] = \sum_{m m'} \mathrm{Cov}[X_{sm}, X_{sm'}] m_{mn} m_{m'n'}
        + \delta_{nn'} \sum_m \mathbb{E}[X_{sm}^2] v_{mn},

which enter the central-limit moments of the layer (``eq:gpn_vi_a``, ``eq:gpn_vi_mu``,
``eq:gpn_vi_marginal_sigma_fl``) as the activations' moments do with point weights. The
layer's :meth:`~VariationalGPNLayer.kl_divergence` adds ``KL(q(W) || p(W))``. Why: with point
weights the closed-form variational GPN overfits like a maximum-likelihood MLP and its
predictive is overconfident (boston validation log-likelihood -5.72 and 60 % coverage of the
90 % interval, against -2.58 and 88 % with ``q(W)``; ``docs/results/uci.md``).
``weights="point"`` keeps the paper's point estimate.

**Empirical-Bayes prior** (``weight_prior_scale="empirical"``). The prior variance is set to
the value that maximises the ELBO for the current ``q(W)``,
``s^2 = (1 / (M N)) sum_ij (m_ij^2 + v_ij)``, evaluated inside the KL term at every step (type-II
maximum likelihood of one hyperparameter per layer, as DVI's empirical Bayes; Wu et al. 2019,
section 4). There the KL becomes ``(1/2) sum_ij log(s^2 / v_ij)``: it no longer pulls the means
toward zero, only the variances toward the layer's common scale.

**Cost.** One Cholesky of ``K`` per function and a few triangular solves:
``O(G R^3)`` per evaluation of :meth:`VariationalTargets.weights` or ``kl_divergence``
(``G = N`` functions, or 1 with ``share="layer"``), independent of the number of samples.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from pyro.distributions import MultivariateNormal, Normal
from pyro.nn import PyroParam
from torch import Tensor, nn
from torch.distributions import constraints

from ..kernels import _squared_exponential
from ..moments.gaussian import Moments
from ..moments.propagate import Mode
from ..recommended import VGPN
from .base import GPNLayerBase, Response

__all__ = [
    "EMPIRICAL",
    "Q_COVS",
    "VARIATIONAL_TARGET_INITS",
    "WEIGHT_TREATMENTS",
    "VariationalGPNLayer",
    "VariationalTargets",
    "activation_moments",
]

Q_COVS = ("full", "diag")
#: ``weight_prior_scale`` of an empirical-Bayes prior on ``W`` (its variance at the ELBO's
#: maximiser for the current ``q(W)``)
EMPIRICAL = "empirical"
#: how a variational layer treats its projection ``W``: a mean-field Gaussian ``q(W)`` with a
#: prior (``"variational"``, the default) or a point estimate (``"point"``, the paper's)
WEIGHT_TREATMENTS = ("variational", "point")
#: initial means of :class:`VariationalTargets` (the parametric layer's ``TARGET_INITS`` and
#: ``"zero"``)
VARIATIONAL_TARGET_INITS = ("random", "identity", "zero")


def __getattr__(name: str):
    if name == "TARGETS_INITS":
        warnings.warn(
            "TARGETS_INITS is deprecated, use VARIATIONAL_TARGET_INITS",
            DeprecationWarning,
            stacklevel=2,
        )
        return VARIATIONAL_TARGET_INITS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_whiten(whiten: object) -> None:
    """``ValueError`` naming ``whiten`` unless it is a bool or ``None`` (a string such as
    ``"yes"`` or ``"false"`` would be read by its truth value)."""
    if whiten is not None and not isinstance(whiten, (bool, np.bool_)):
        raise ValueError(f"whiten must be True, False or None, got {whiten!r}")


def _inverse_gram_times(whiten: bool, chol: Tensor, values: Tensor) -> Tensor:
    """``K^-1 U [..., G, R]`` for ``values [..., G, R]`` of the targets' site (``z`` with
    ``U = L z`` when ``whiten``: ``L^-T z``; ``U`` itself otherwise), ``chol`` ``L``."""
    if whiten:
        return torch.linalg.solve_triangular(chol.mT, values.unsqueeze(-1), upper=True)[..., 0]
    return torch.cholesky_solve(values.unsqueeze(-1), chol)[..., 0]


def prior_scale_tril(points: Tensor, lengthscales: Tensor, jitter: float) -> Tensor:
    """``[G, R, R]`` lower Cholesky factor ``L`` of ``K(V, V) + jitter I`` (``eq:gpn_vi_puv``)."""
    gram = _squared_exponential(points, points, lengthscales)
    eye = torch.eye(points.shape[-1], dtype=points.dtype, device=points.device)
    return torch.linalg.cholesky(gram + jitter * eye)


def activation_moments(
    inputs: Moments, weight_loc: Tensor, weight_var: Tensor | None, mode: Mode = "meanvar"
) -> Moments:
    """Moments of the activations ``A = X W`` for random inputs and mean-field Gaussian weights.

    ``X [S, M]`` with the moments ``inputs``, ``W [M, N]`` with independent entries of mean
    ``weight_loc`` and variance ``weight_var`` (``None``: point weights), ``X`` and ``W``
    independent. The mean is ``E[X] m``; the covariance of a sample's activations is
    ``m^T Cov[X] m + diag(E[X^2] v)`` (module docstring), its diagonal
    ``Var[X] m^2 + E[X^2] v``. Exact (no approximation) for these independence assumptions.

    Args:
        inputs: :class:`Moments` ``[S, M]`` (deterministic, ``var`` or ``cov``).
        weight_loc: ``[M, N]`` ``m``.
        weight_var: ``[M, N]`` ``v`` (non-negative) or ``None``.
        mode: ``"mean"`` (means only, the variances taken as zero), ``"meanvar"`` (``var``) or
            ``"cov"`` (``cov [S, N, N]``).

    Returns:
        :class:`Moments` ``[S, N]``.
    """
    if mode == "mean":
        return Moments(inputs.mean @ weight_loc, validate=False)
    acts = inputs.linear_full(weight_loc) if mode == "cov" else inputs.diagonal().linear(weight_loc)
    if weight_var is None:
        return acts
    extra = inputs.second_moment @ weight_var  # [S, N]
    if mode == "cov":
        return Moments(acts.mean, cov=acts.covariance + torch.diag_embed(extra), validate=False)
    return Moments(acts.mean, var=acts.variance + extra, validate=False)


class VariationalTargets(Response):
    """A GP prior on the targets and a Gaussian variational posterior ``q(U)`` per function.

    Args:
        points: ``[G, R]`` the layer's initial inducing points ``V``.
        lengthscales: ``[G]`` its initial lengthscales (for the initial ``q``).
        q_cov: ``"full"`` (a full covariance per function, ``targets_scale_tril``) or
            ``"diag"`` (independent targets, ``targets_scale``).
        whiten: parametrise ``q`` on the whitened targets ``z = L^-1 U`` (see module docs);
            ``None``: the recommendation :data:`pyro_gpn.recommended.VGPN` (whitened).
        targets_init: initial mean of ``q(U)`` (``None``: the recommendation, ``"identity"``):
            ``"identity"`` (``mu_hat = V``, an
            activation function close to the identity on the inducing range), ``"random"`` (a
            draw from the prior ``N(0, K)``) or ``"zero"``. How the starts compare on data:
            ``docs/results/routes.md``.
        targets_scale_init: initial ``q`` scale as a fraction ``c`` of the prior:
            ``Sigma_hat = c^2 K`` (``"full"``, or ``S = c I`` whitened) and
            ``Sigma_hat = c^2 diag(K)`` for ``"diag"`` without whitening. ``c = 1`` with
            ``targets_init="zero"`` is ``q = p``.
        jitter: ``epsilon`` added to the diagonal of ``K(V, V)`` (the prior covariance).

    Attributes:
        targets_loc: ``[G, R]`` mean ``mu_hat`` of ``q(U)`` (``m`` of ``q(z)`` whitened).
        targets_scale_tril: ``[G, R, R]`` lower Cholesky factor of the ``q`` covariance
            (``q_cov="full"``; ``PyroParam`` with ``constraints.lower_cholesky``).
        targets_scale: ``[G, R]`` standard deviations (``q_cov="diag"``; positive).
    """

    def __init__(
        self,
        points: Tensor,
        lengthscales: Tensor,
        q_cov: str = "full",
        whiten: bool | None = None,
        targets_init: str | None = None,
        targets_scale_init: float = 0.1,
        jitter: float = 1e-6,
    ) -> None:
        super().__init__()
        check_whiten(whiten)
        whiten = VGPN.whiten if whiten is None else whiten
        targets_init = VGPN.targets_init if targets_init is None else targets_init
        if q_cov not in Q_COVS:
            raise ValueError(f"q_cov must be one of {Q_COVS}, got {q_cov!r}")
        if targets_init not in VARIATIONAL_TARGET_INITS:
            raise ValueError(
                f"targets_init must be one of {VARIATIONAL_TARGET_INITS}, got {targets_init!r}"
            )
        if not targets_scale_init > 0:
            raise ValueError(f"targets_scale_init must be positive, got {targets_scale_init}")
        if not jitter >= 0:
            raise ValueError(f"jitter must be non-negative, got {jitter}")
        self.q_cov = q_cov
        self.whiten = bool(whiten)
        self.targets_init = targets_init
        self.jitter = float(jitter)
        self.num_inducing = points.shape[-1]

        with torch.no_grad():
            chol = prior_scale_tril(points, lengthscales, self.jitter)
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
    def variational_scale_tril(self) -> Tensor:
        """``[G, R, R]`` lower Cholesky factor of the ``q`` covariance in the coordinates
        of the targets' sample site (``U``, or ``z`` when whitened)."""
        if self.q_cov == "full":
            return self.targets_scale_tril
        return torch.diag_embed(self.targets_scale)

    def target_prior(self, points: Tensor, lengthscales: Tensor) -> MultivariateNormal:
        """The prior of the targets' sample site: ``N(0, K)`` (``eq:gpn_vi_puv``), or
        ``N(0, I)`` for the whitened ``z``; batch shape ``[G]``, event shape ``[R]``."""
        loc = torch.zeros_like(points)
        if self.whiten:
            eye = torch.eye(self.num_inducing, dtype=loc.dtype, device=loc.device)
            return MultivariateNormal(loc, scale_tril=eye.expand(loc.shape[0], -1, -1))
        return MultivariateNormal(
            loc, scale_tril=prior_scale_tril(points, lengthscales, self.jitter)
        )

    def target_posterior(self) -> MultivariateNormal:
        """The variational posterior ``q`` of the targets' sample site (``U``, or ``z``);
        batch shape ``[G]``, event shape ``[R]``."""
        return MultivariateNormal(self.targets_loc, scale_tril=self.variational_scale_tril())

    def kl_divergence(self, points: Tensor, lengthscales: Tensor) -> Tensor:
        """``sum_n KL(q(U_n) || p(U_n))`` (``eq:gpn_vi_sampling_la`` with its constant), a scalar.

        Evaluated in whitened coordinates, ``KL(N(m, S S^T) || N(0, I))`` with ``m = L^-1 mu_hat``,
        ``S = L^-1 chol(Sigma_hat)`` unless the response is already whitened.
        """
        loc = self.targets_loc.to(points.dtype)
        tril = self.variational_scale_tril().to(points.dtype)
        if not self.whiten:
            chol = prior_scale_tril(points, lengthscales, self.jitter)
            loc = torch.linalg.solve_triangular(chol, loc.unsqueeze(-1), upper=False).squeeze(-1)
            tril = torch.linalg.solve_triangular(chol, tril, upper=False)
        logdet = torch.diagonal(tril, dim1=-2, dim2=-1).abs().log().sum(-1)
        per_function = 0.5 * (tril.square().sum((-2, -1)) + loc.square().sum(-1))
        per_function = per_function - 0.5 * self.num_inducing - logdet
        return per_function.sum()

    # ------------------------------------------------------------------ responses
    def weights(self, points: Tensor, lengthscales: Tensor) -> tuple[Tensor, Tensor]:
        """``beta = K^-1 mu_hat`` and ``C = Khat = K^-1 - K^-1 Sigma_hat K^-1``
        (``eq:gpn_vi_sampling_muhat_fl``, ``eq:gpn_vi_sampling_sigmahat_fl``).

        Returns:
            ``beta [G, R]`` and ``Khat [G, R, R]`` (symmetric).
        """
        chol = prior_scale_tril(points, lengthscales, self.jitter)
        kinv = torch.cholesky_inverse(chol)
        tril = self.variational_scale_tril().to(points.dtype)
        loc = self.targets_loc.to(points.dtype)
        beta = _inverse_gram_times(self.whiten, chol, loc)
        if self.whiten:  # beta = L^-T m, Khat = L^-T (I - S S^T) L^-1
            root = torch.linalg.solve_triangular(chol.mT, tril, upper=True)
        else:
            root = torch.cholesky_solve(tril, chol)  # K^-1 chol(Sigma_hat)
        khat = kinv - root @ root.mT
        return beta, 0.5 * (khat + khat.mT)

    def factored_weights(self, points: Tensor, lengthscales: Tensor, with_reduction: bool = True):
        """``beta``, ``Khat`` and its factors: ``L = chol(K + jitter)``, ``M = I - B B^T`` with
        ``B`` the whitened posterior scale (``B = L^-1 chol(Sigma_hat)`` when not whitened), so
        ``Khat = L^-T M L^-1`` (``None`` with ``with_reduction=False``)."""
        chol = prior_scale_tril(points, lengthscales, self.jitter)
        if with_reduction:
            beta, khat = self.weights(points, lengthscales)
        else:
            loc = self.targets_loc.to(points.dtype)
            beta, khat = _inverse_gram_times(self.whiten, chol, loc), None
        tril = self.variational_scale_tril().to(points.dtype)
        if not self.whiten:
            tril = torch.linalg.solve_triangular(chol, tril, upper=False)
        eye = torch.eye(tril.shape[-1], dtype=tril.dtype, device=tril.device)
        inner = eye - tril @ tril.mT
        return beta, khat, chol, 0.5 * (inner + inner.mT)

    def variance_factor(self, points: Tensor, lengthscales: Tensor) -> Tensor:
        """``L = chol(K + jitter I)``, the factor of :meth:`factored_weights`."""
        return prior_scale_tril(points, lengthscales, self.jitter)

    def target_weights(self, points: Tensor, lengthscales: Tensor, targets: Tensor):
        """``K^-1 U [..., G, R]`` for values of the targets' site and ``K^-1 [G, R, R]``."""
        chol = prior_scale_tril(points, lengthscales, self.jitter)
        return _inverse_gram_times(self.whiten, chol, targets), torch.cholesky_inverse(chol)

    def extra_repr(self) -> str:
        return f"q_cov={self.q_cov!r}, whiten={self.whiten}, targets_init={self.targets_init!r}"


class VariationalGPNLayer(GPNLayerBase):
    """A layer of GPN units with a GP prior on the targets and a Gaussian variational posterior:
    the layer with :class:`VariationalTargets` as its response.

    Args:
        in_features, out_features, num_inducing, share, and the keywords of
            :class:`~pyro_gpn.layers.base.GPNLayerBase`.
        weights: ``"variational"`` (a mean-field Gaussian ``q(W)`` with the prior
            ``N(0, weight_prior_scale^2 / in_features)``, module docstring) or ``"point"``;
            ``None``: the recommendation :data:`pyro_gpn.recommended.VGPN` (variational).
        weight_prior_scale: the prior standard deviation of ``W`` times ``sqrt(in_features)``,
            or ``"empirical"``: the prior variance set to its empirical-Bayes value, the one
            that maximises the ELBO for the current ``q(W)``, ``s^2 = mean(m^2 + v)`` over
            the layer's entries (module docstring); ``None``: the recommendation.
        weight_scale_init: the initial standard deviation of ``q(W)`` times
            ``sqrt(in_features)`` (small: the fit starts near the point-estimated network).
        **response_options: of :class:`VariationalTargets` (``q_cov``, ``whiten``,
            ``targets_init``, ``targets_scale_init``, ``jitter``).

    Attributes:
        weight: ``[M, N]`` the point estimate of ``W``, or the mean of ``q(W)``.
        weight_scale: ``[M, N]`` the standard deviations of ``q(W)`` (positive ``PyroParam``;
            ``weights="variational"`` only).
        weight_treatment: ``"variational"`` or ``"point"`` (the ``weights`` argument).
        targets_loc, targets_scale_tril | targets_scale: the response's ``q`` parameters.

    Example:
        >>> layer = VariationalGPNLayer(3, 5)
        >>> out = layer.propagate(torch.randn(8, 3), mode="meanvar")
        >>> float(layer.kl_divergence()) >= 0
        True
    """

    default_response = VariationalTargets

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_inducing: int = 14,
        share: str = "none",
        *,
        weights: str | None = None,
        weight_prior_scale: float | str | None = None,
        weight_scale_init: float = 1e-2,
        **kwargs,
    ) -> None:
        weights = VGPN.weights if weights is None else weights
        if weight_prior_scale is None:
            weight_prior_scale = VGPN.weight_prior_scale
        if weights not in WEIGHT_TREATMENTS:
            raise ValueError(f"weights must be one of {WEIGHT_TREATMENTS}, got {weights!r}")
        checked = [("weight_scale_init", weight_scale_init)]
        if weight_prior_scale != EMPIRICAL:
            checked.append(("weight_prior_scale", weight_prior_scale))
        for name, value in checked:
            if not (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value > 0
            ):
                extra = f' or "{EMPIRICAL}"' if name == "weight_prior_scale" else ""
                raise ValueError(f"{name} must be a positive number{extra}, got {value!r}")
        super().__init__(in_features, out_features, num_inducing, share, **kwargs)
        self.weight_treatment = weights
        self.weight_prior_scale: float | str = (
            EMPIRICAL if weight_prior_scale == EMPIRICAL else float(weight_prior_scale)
        )
        if weights == "variational":
            std = weight_scale_init / math.sqrt(in_features)
            self.weight_scale = PyroParam(
                torch.full_like(self.weight.detach(), std), constraints.positive
            )

    # ------------------------------------------------------------------ the weights
    @property
    def variational_weights(self) -> bool:
        """Whether ``W`` is a latent variable with ``q(W)`` (``weights="variational"``)."""
        return self.weight_treatment == "variational"

    def weight_prior_std(self) -> float | Tensor:
        """The prior standard deviation ``s`` of every ``W_ij``: ``weight_prior_scale / sqrt(M)``,
        or, with ``weight_prior_scale="empirical"``, the empirical-Bayes value
        ``s = sqrt(mean_ij(m_ij^2 + v_ij))`` (a scalar tensor, differentiable in ``q(W)``)."""
        if self.weight_prior_scale == EMPIRICAL:
            second = self.weight.square()
            if self.variational_weights:
                second = second + self.weight_scale.square()
            tiny = torch.finfo(second.dtype).tiny
            return second.mean().clamp_min(tiny).sqrt()
        return self.weight_prior_scale / math.sqrt(self.in_features)

    def weight_prior(self) -> Normal:
        """``p(W)``: independent ``N(0, s^2)``, batch shape ``[M, N]``."""
        loc = torch.zeros_like(self.weight)
        std = torch.as_tensor(self.weight_prior_std(), dtype=loc.dtype, device=loc.device)
        return Normal(loc, std.expand_as(loc))

    def weight_posterior(self) -> Normal:
        """``q(W)``: independent ``N(weight, weight_scale^2)``, batch shape ``[M, N]``."""
        if not self.variational_weights:
            raise ValueError('weight_posterior needs weights="variational"')
        return Normal(self.weight, self.weight_scale)

    def weight_var(self) -> Tensor | None:
        """``[M, N]`` variances of ``q(W)``, or ``None`` for point weights."""
        return self.weight_scale.square() if self.variational_weights else None

    def weight_kl_divergence(self) -> Tensor:
        """``KL(q(W) || p(W))`` summed over the entries (zero for point weights), a scalar:
        ``sum_ij [log(s / sqrt(v_ij)) + (v_ij + m_ij^2) / (2 s^2) - 1/2]``."""
        if not self.variational_weights:
            return self.weight.new_zeros(())
        var = self.weight_scale.square()
        s2 = self.weight_prior_std() ** 2
        kl = 0.5 * ((var + self.weight.square()) / s2 - 1.0 - (var / s2).log())
        return kl.sum()

    def kl_divergence(self) -> Tensor:
        """``KL(q(U) || p(U)) + KL(q(W) || p(W))``, a scalar in the parameters' dtype."""
        return super().kl_divergence() + self.weight_kl_divergence()

    def activation_moments(self, inputs: Moments, mode: Mode = "meanvar") -> Moments:
        """Moments of the activations ``A = X W`` under ``q(W)`` given checked input
        :class:`Moments` (:func:`activation_moments`, the variance of ``q(W)`` included);
        ``mode="mean"`` and point weights are the base's.

        Shape:
            inputs ``[S, M]`` -> activations ``[S, N]`` (``var [S, N]`` or ``cov [S, N, N]``).
        """
        if not self.variational_weights or mode == "mean":
            return super().activation_moments(inputs, mode)
        return activation_moments(inputs, self.weight, self.weight_var(), mode)

    def prior_scale_tril(self) -> Tensor:
        """``[N | 1, R, R]`` lower Cholesky factor ``L`` of ``K(V, V) + jitter I``."""
        return prior_scale_tril(self.inducing_points, self.lengthscales, self.response.jitter)

    def target_prior(self) -> MultivariateNormal:
        """:meth:`VariationalTargets.target_prior` on the layer's grid (parameters' dtype)."""
        return self.response.target_prior(self.inducing_points, self.lengthscales)

    def target_posterior(self) -> MultivariateNormal:
        """:meth:`VariationalTargets.target_posterior`."""
        return self.response.target_posterior()

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
        points, lengthscales = self.compute_grid()
        weights, kinv = self.response.target_weights(points, lengthscales, targets)
        alpha = _squared_exponential(activations.unsqueeze(-1), points, lengthscales).squeeze(
            -2
        )  # [..., S, N, R]
        mean = (alpha * weights).sum(-1).to(out_dtype)
        quad = torch.einsum(
            "...nr,nrt,...nt->...n", alpha, kinv.expand(alpha.shape[-2], -1, -1), alpha
        )
        var = (1 - quad).clamp_min(0).to(out_dtype)
        if noise and self.noise_std is not None:
            var = var + self.noise_std.square()
        return mean, var.expand_as(mean)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, weights={self.weight_treatment!r}"
