r"""The non-parametric Gaussian Process Neuron network, for exact inference by MCMC.

Paper sections "Gaussian Process Neurons" and "Non-Parametric Training and Inference" (route 1
of ``fig:gpn_overview``). Unit ``n`` of layer ``l`` has a GP prior over its activation function;
marginalising the response gives the output of *all* samples (train and test rows stacked,
train first) jointly Gaussian given the previous layer (``eq:gpn_output_marginal``)

.. math::

    X^l_{\star n} \mid X^{l-1} \sim \mathcal{N}\bigl(0,\;
        \tilde K_{W^l_{\star n}}(X^{l-1}, X^{l-1}) + (\sigma^l_n)^2 I\bigr),
    \qquad
    k_{w}(x, x') = \exp\Bigl(-\frac{[\sum_m w_m (x_m - x'_m)]^2}{2\lambda^2}\Bigr)

(``eq:gpn_cov_fn``), and the network is the product of these over layers and units
(``eq:gpn_stack``). The hidden outputs ``X^1 .. X^{L-1}`` are latent; the last layer's outputs are
observed on the training rows and latent (the posterior predictive) on the test rows.

**One Cholesky for train and test.** With ``C = L L^T`` the layer covariance over the stacked
rows and ``L`` lower triangular, the leading block ``L_11`` is the Cholesky factor of the training
block, so the joint factorises as

.. math::

    X_{\text{train}} = L_{11} z_{\text{train}}, \qquad
    X_{\text{test}} \mid X_{\text{train}} \sim
        \mathcal{N}\bigl(L_{21} L_{11}^{-1} X_{\text{train}},\; L_{22} L_{22}^T\bigr),

which is the GP predictive of ``eq:gp_f_reg_mean_var`` written with the factor of the joint.
Every layer therefore has a ``*_train`` site and, when test inputs are given, a ``*_test`` site.
The training likelihood never depends on the test rows (the marginal of an MVN block is the
block), so the test rows can either be sampled by MCMC together with everything else (the paper's
literal formulation) or drawn afterwards, exactly, by ancestral sampling from these conditionals
(:func:`pyro_gpn.inference.mcmc.run_nuts` offers both).

**Parametrisation.** ``whiten=True`` (the default) samples the hidden outputs non-centred,
``Z ~ N(0, I)`` and ``X = L Z``, which decorrelates them from the weights and noise scales that
set ``L`` and removes the funnel NUTS otherwise struggles with. ``whiten=False`` samples
``X ~ N(0, L L^T)`` directly (centred). The observed and test outputs of the last layer are
always centred: the observed one cannot be whitened and the test one is a Gaussian leaf.

**The last layer is integrated out; the last hidden layer is collapsed.** With Gaussian noise
the last layer's GP is conjugate: ``y_train`` is observed under its exact marginal
``N(0, K + sigma^2 I)`` (the latent function values never appear). The last layer sees the last
hidden layer's outputs only through its activations ``A^L = X^{L-1} (W^L)^T`` (the kernel
``eq:gpn_cov_fn`` depends on ``w^T (x - x')``), and ``A^L`` is a linear map of independent
Gaussians, so ``collapse=True`` (the default) samples ``A^L`` -- ``N_L`` values per row, whitened
by the Cholesky factor of ``Cov(A_{sk}, A_{tj}) = sum_n W^L_{kn} W^L_{jn} (C_n)_{st}`` --
instead of the ``N_{L-1}`` hidden outputs per row. This integrates out exactly the directions
the likelihood cannot see, and with them the hidden layer's unit-permutation and sign-flip
symmetries and most of the latent dimensions (``[1, 4, 1]``: ``S`` instead of ``4 S``).
``collapse=False`` samples the hidden outputs as below.

**Classification** (``likelihood="bernoulli"`` with one output, ``"categorical"`` with one
output per class): the last layer has no noise (its jitter is ``classification_jitter``), its
latent function values over all rows are sampled whitened like a hidden layer's
(``Z{L}_train`` / ``Z{L}_test``), and ``y_train ~ Bernoulli(logits=F)`` or
``Categorical(logits=F)`` row by row; ``p_test`` records the test rows' class probabilities.

**Priors** (all overridable): weights ``W^l_{mn} ~ N(0, weight_scale^2 / M_l)`` (fan-in
scaling, so activations have unit prior variance for unit-variance inputs); noise standard
deviations ``sigma^l_n ~ LogNormal(log 0.1, 1)``, which keeps them away from zero where the
posterior of the hidden outputs degenerates; lengthscales fixed to ``lambda = 1`` because they
are redundant with ``|w|`` (paper, below ``eq:gpn_cov_fn``), or sampled from
``lengthscale_prior``. Weights, noise and lengthscales of a layer live inside its unit plate, so
the weight site ``W{l}`` holds ``(W^l)^T`` with shape ``[N_l, M_l]`` (one row per unit).

**Cost and size limit.** Every unit needs the Cholesky factor of an ``S x S`` matrix (``S`` =
train + test rows): ``O(S^3)`` time per unit per gradient evaluation, and NUTS takes up to
``2^max_tree_depth`` gradient steps per draw. The hidden outputs add ``S * sum(N_1 .. N_{L-1})``
latent dimensions, which the sampler must explore. Exact inference is thus limited to small data;
by default ``S <= 500`` (``max_samples``), beyond which the model raises ``ValueError``.

Site names (``l = 1 .. L``, with ``L = len(sizes) - 1``):

========================  ===================  ==============================================
site                      shape                meaning
========================  ===================  ==============================================
``W{l}``                  ``[N_l, M_l]``       weights, transposed (rows are units)
``sigma{l}``              ``[N_l]``            noise standard deviations
``lengthscale{l}``        ``[N_l]``            only with ``lengthscale_prior``
``Z{l}_train``/``_test``  ``[N_l, S_*]``       whitened hidden outputs (``whiten=True``)
``X{l}_train``/``_test``  ``[N_l, S_*]``       hidden outputs (``whiten=False``)
``Za{L}_train``/``_test``  ``[S_* N_L]``        whitened last-layer activations, rows major
                                               (``collapse=True`` and ``L >= 2``; replace
                                               layer ``L-1``'s hidden outputs)
``A{L}_train``/``_test``  ``[S_* N_L]``        the same, centred (``activations="centred"``)
``Ea{L}_train``/``_test``  ``[S_* N_L]``        the same, likelihood-informed
                                               (``activations="likelihood-informed"``, with
                                               the factor ``Ea{L}_jacobian``, the
                                               deterministic ``A{L}`` ``[S, N_L]`` and, with
                                               an anchor, ``Za{L}_train_whitened``)
``y_train``               ``[N_L, S_train]``   observed outputs (transposed targets);
                          ``[S_train]``        labels (classification)
``y_test``                ``[N_L, S_test]``    predicted outputs, noise included;
                          ``[S_test]``         labels (classification)
``p_test``                ``[S_test, C]``      class probabilities (classification)
========================  ===================  ==============================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.nn.module import pyro_method
from torch import Tensor

from ..pyro_module import GPNModule
from .gp_rows import activation_cholesky, cat_rows, conditional_rows, layer_cholesky
from .nuts_inputs import (
    LIKELIHOODS,
    check_positive,
    check_prior,
    check_sizes,
    check_xy,
    class_probs,
    default_noise_prior,
    per_layer,
)

__all__ = [
    "ACTIVATIONS",
    "DEFAULT_MAX_SAMPLES",
    "LIKELIHOODS",
    "NonParametricGPN",
    "conditional_rows",
    "layer_cholesky",
]

ACTIVATIONS = ("whitened", "centred", "likelihood-informed")
"""Parametrisations of the collapsed last-layer activations (``activations=``)."""

DEFAULT_MAX_SAMPLES = 500
"""Default limit on train + test rows for exact inference (see the module docstring)."""


class NonParametricGPN(GPNModule):
    r"""A feed-forward network of non-parametric GPNs for regression (``eq:gpn_stack``).

    Args:
        sizes: layer widths ``[M, N_1, ..., N_L]``: ``M`` inputs, ``N_L`` outputs.
        weight_scale: prior ``W^l_{mn} ~ N(0, weight_scale^2 / M_l)``.
        noise_prior: prior of each noise standard deviation ``sigma^l_n``, a scalar
            distribution with positive support, or one per layer. Default
            ``LogNormal(log 0.1, 1)``.
        lengthscale: the fixed lengthscale used where ``lengthscale_prior`` is ``None``.
        lengthscale_prior: scalar positive distribution (or one per layer, ``None`` entries
            fixed) to sample the lengthscales instead of fixing them.
        whiten: sample hidden outputs non-centred (``X = L Z``); see the module docstring.
        jitter: diagonal jitter added to each covariance.
        max_samples: the most train + test rows accepted (``O(S^3)`` per unit and step).
        dtype: the dtype of all computations (float64 recommended for NUTS).
        likelihood: ``"gaussian"`` (regression), ``"bernoulli"`` or ``"categorical"``.
        classification_jitter: the last layer's diagonal variance for classification, in place
            of the noise.
        collapse: sample the last layer's activations instead of the last hidden layer's
            outputs (exact; see the module docstring).
        activations: how the collapsed activations are sampled: ``"whitened"`` (``Za{L}``,
            ``A = L z``), ``"centred"`` (``A{L}``, ``A ~ N(0, L L^T)``) or
            ``"likelihood-informed"`` (``Ea{L}``, non-centred against a Gaussian approximation
            of the activations' conditional posterior, see :meth:`set_activation_anchor`; the
            same as whitened until an anchor is set; regression only); ``None`` follows
            ``whiten``. All give the same posterior of every model quantity (a change of
            variables given the parameters, with its Jacobian); they differ in the geometry
            NUTS sees.

    Call :meth:`model` with ``x_train [S_train, M]``, ``y_train [S_train]`` (when ``N_L = 1``)
    or ``[S_train, N_L]`` (classification: ``[S_train]`` integer labels; ``None`` samples from
    the prior), and optional ``x_test [S_test, M]``.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        *,
        weight_scale: float = 1.0,
        noise_prior: dist.Distribution | Sequence[dist.Distribution] | None = None,
        lengthscale: float = 1.0,
        lengthscale_prior: dist.Distribution | Sequence[dist.Distribution | None] | None = None,
        whiten: bool = True,
        jitter: float = 1e-6,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        dtype: torch.dtype = torch.float64,
        likelihood: str = "gaussian",
        classification_jitter: float = 1e-4,
        collapse: bool = True,
        activations: str | None = None,
    ) -> None:
        super().__init__()
        sizes = check_sizes(sizes, likelihood)
        weight_scale = check_positive("weight_scale", weight_scale)
        lengthscale = check_positive("lengthscale", lengthscale)
        jitter = check_positive("jitter", jitter, allow_zero=True)
        classification_jitter = check_positive("classification_jitter", classification_jitter)
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2, got {max_samples}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        if activations is None:
            activations = "whitened" if whiten else "centred"
        if activations not in ACTIVATIONS:
            raise ValueError(
                f"activations must be one of {ACTIVATIONS} or None, got {activations!r}"
            )
        if activations == "likelihood-informed" and likelihood != "gaussian":
            raise ValueError(
                "activations='likelihood-informed' needs likelihood='gaussian' (its conditional "
                f"width follows the output noise), got likelihood={likelihood!r}"
            )
        self.activations = activations
        self.activation_anchor: tuple[Tensor, Tensor] | None = None
        self.likelihood = likelihood
        self.collapse = bool(collapse)
        self.classification_jitter = float(classification_jitter)
        self.sizes = sizes
        self.num_layers = len(sizes) - 1
        self.weight_scale = float(weight_scale)
        self.lengthscale = float(lengthscale)
        self.whiten = bool(whiten)
        self.jitter = float(jitter)
        self.max_samples = int(max_samples)
        self.dtype = dtype
        if noise_prior is None:
            noise_prior = default_noise_prior(dtype)
        self.noise_priors = per_layer("noise_prior", noise_prior, self.num_layers)
        self.lengthscale_priors = per_layer("lengthscale_prior", lengthscale_prior, self.num_layers)
        for l, (noise, scale) in enumerate(
            zip(self.noise_priors, self.lengthscale_priors, strict=True), 1
        ):
            if noise is None:
                raise ValueError(f"noise_prior of layer {l} must not be None")
            check_prior(f"noise_prior (layer {l})", noise)
            check_prior(f"lengthscale_prior (layer {l})", scale)

    @property
    def num_outputs(self) -> int:
        return self.sizes[-1]

    def parameter_sites(self) -> list[str]:
        """Names of the per-unit latent sites (weights, noise scales, sampled lengthscales),
        whose dimension does not grow with the rows; the rest are per-row hidden outputs."""
        names = []
        for l in range(1, self.num_layers + 1):
            names += [f"W{l}"]
            if l < self.num_layers or self.likelihood == "gaussian":
                names.append(f"sigma{l}")
            if self.lengthscale_priors[l - 1] is not None:
                names.append(f"lengthscale{l}")
        return names

    def activation_sites(self, with_test: bool = False) -> list[str]:
        """Names of the collapsed last-layer activation sites (``collapse=True`` and at least two
        layers; else none): ``A{L}_train`` / ``Za{L}_train``, and the ``_test`` site when the
        test rows are sampled in the chain."""
        if not (self.collapse and self.num_layers >= 2):
            return []
        prefix = {"whitened": "Za", "centred": "A", "likelihood-informed": "Ea"}[self.activations]
        names = [f"{prefix}{self.num_layers}_train"]
        return names + [f"{prefix}{self.num_layers}_test"] if with_test else names

    def set_activation_anchor(self, a_hat: Tensor | None, kappa: Tensor | float = 1.0) -> None:
        r"""Set (or with ``None`` clear) the Gaussian approximation that
        ``activations="likelihood-informed"`` non-centres the training rows' activations against.

        The likelihood sees the last layer's activations through ``y_s ~ f(A_s) + noise``; its
        Gauss-Newton curvature in ``A_s`` is ``f'(A_s)^2 / sigma_L^2``. With ``D = diag(kappa) /
        sigma_L^2`` (``sigma_L`` the current output noise, ``kappa`` fixed) and pseudo-observations
        ``a_hat ~ N(A, D^{-1})``, the activations' conditional given the parameters is
        approximated by ``N(m, P^{-1})``, ``P = C^{-1} + D`` (``C = L L^T`` their prior
        covariance), and sampled as ``A = L z``,

        .. math::

            z = M^{-T}(e + M^{-1} L^T D \hat a), \qquad M M^T = I + L^T D L, \qquad
            e \sim \mathcal{N}(0, I) \text{ (site ``Ea{L}_train``)},

        so that ``A`` given the parameters has covariance ``L (I + L^T D L)^{-1} L^T = P^{-1}``
        and the approximation's mean when ``e ~ N(0, I)`` (where the approximation holds,
        ``e`` is a standard normal whatever the noise levels). The map is exact for any
        ``a_hat`` and ``kappa`` (they are constants): the model adds ``log N(z; 0, I) -
        log N(e; 0, I) - log det M`` (the Jacobian ``dz/de = M^{-T}``) as a factor, so the
        posterior of every model quantity is unchanged. It helps only while the chain stays
        near the anchor: on the ``[1, 4, 1]`` synthetic problem the chains moved far from it
        (``docs/results/nuts.md``, session of 2026-11-24 17:15 UTC), so it is not the
        default. Test rows stay whitened (``D = 0`` there). Costs one more Cholesky
        of the ``[S_train N_L]`` square matrix ``I + L^T D L`` per gradient.

        Args:
            a_hat: ``[S_train, N_L]`` (or ``[S_train]`` for one output) pseudo-observations,
                e.g. the activations of a fit; ``None`` clears the anchor (then ``e = z``).
            kappa: ``[S_train, N_L]`` (or broadcastable) non-negative curvature weights, e.g.
                ``f'(a_hat)^2`` of the fitted output function.
        """
        if a_hat is None:
            self.activation_anchor = None
            return
        if self.activations != "likelihood-informed":
            raise ValueError(
                "set_activation_anchor needs activations='likelihood-informed', got "
                f"{self.activations!r}"
            )
        a_hat = torch.as_tensor(a_hat, dtype=self.dtype)
        if a_hat.dim() == 1:
            a_hat = a_hat.unsqueeze(-1)
        if a_hat.dim() != 2 or a_hat.shape[-1] != self.num_outputs:
            raise ValueError(
                f"a_hat must have shape [S_train, {self.num_outputs}], got {tuple(a_hat.shape)}"
            )
        kappa = torch.as_tensor(kappa, dtype=self.dtype)
        if kappa.dim() == 1 and self.num_outputs == 1 and kappa.numel() == a_hat.shape[0]:
            kappa = kappa.unsqueeze(-1)
        try:
            kappa = kappa.expand_as(a_hat)
        except RuntimeError as err:
            raise ValueError(
                f"kappa must broadcast to a_hat's shape {tuple(a_hat.shape)}, got "
                f"{tuple(kappa.shape)}"
            ) from err
        if not (torch.isfinite(a_hat).all() and torch.isfinite(kappa).all() and (kappa >= 0).all()):
            raise ValueError("a_hat must be finite and kappa finite and non-negative")
        self.activation_anchor = (a_hat.reshape(-1).clone(), kappa.reshape(-1).clone())

    def informed_factor(self, l11: Tensor, noise_std: Tensor) -> tuple[Tensor, Tensor]:
        """``M`` (lower Cholesky factor of ``I + L^T D L``) and ``c = M^{-1} L^T D a_hat`` of
        :meth:`set_activation_anchor`, for the training rows' activation factor
        ``l11 [..., n, n]`` (``n = S_train N_L``) and the output noise ``noise_std [..., N_L]``;
        ``z = M^{-T} (e + c)``. NaN where the factorisation fails."""
        a_hat, kappa = self.activation_anchor
        n = a_hat.shape[0]
        if l11.shape[-1] != n:
            raise ValueError(
                f"the activation anchor has {n} entries, but the training rows have "
                f"{l11.shape[-1]} activations: set it for these x_train"
            )
        var = noise_std.square().unsqueeze(-2)  # [..., 1, N_L]
        var = var.expand(*var.shape[:-2], n // self.num_outputs, self.num_outputs)
        d = kappa / var.reshape(*var.shape[:-2], n)  # [..., n]
        lt_d = l11.mT * d.unsqueeze(-2)
        eye = torch.eye(n, dtype=l11.dtype)
        m, info = torch.linalg.cholesky_ex(eye + lt_d @ l11)
        m = torch.where((info > 0)[..., None, None], torch.nan, m)
        c = torch.linalg.solve_triangular(m, (lt_d @ a_hat).unsqueeze(-1), upper=False)
        return m, c.squeeze(-1)

    def check_data(
        self, x_train: Tensor, y_train: Tensor | None, x_test: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Validate the data and return it as ``x [S, M]``, ``y [N_L, S_train] | None``, ``x_test``.

        Raises ``ValueError`` naming the argument for wrong shapes, non-finite values, or more
        than ``max_samples`` rows in total.
        """
        x_train, y_train, x_test = check_xy(
            self.sizes, self.likelihood, self.dtype, x_train, y_train, x_test
        )
        total = x_train.shape[0] + (0 if x_test is None else x_test.shape[0])
        if total > self.max_samples:
            raise ValueError(
                f"x_train and x_test have {total} rows together, more than max_samples="
                f"{self.max_samples} supported by exact inference: every unit needs an O(S^3) "
                "Cholesky factorisation of its S x S covariance at every gradient step and the "
                "hidden outputs add S latent dimensions per hidden unit. Raise max_samples if "
                "you accept the cost, or use a parametric or variational GPN."
            )
        if y_train is not None and self.likelihood == "gaussian":
            y_train = y_train.mT
        return x_train, y_train, x_test

    def _sample_weight(self, l: int) -> Tensor:
        """Layer ``l``'s weights ``[..., N_l, M_l]`` (inside its unit plate)."""
        fan_in, width = self.sizes[l - 1], self.sizes[l]
        zero = torch.zeros((), dtype=self.dtype)
        std = torch.tensor(self.weight_scale / math.sqrt(fan_in), dtype=self.dtype)
        return pyro.sample(f"W{l}", dist.Normal(zero, std).expand([width, fan_in]).to_event(1)).to(
            self.dtype
        )

    def _noise_and_lengthscale(self, l: int, noise: bool) -> tuple[Tensor, Tensor | float]:
        width, dtype = self.sizes[l], self.dtype
        if noise:
            noise_std = pyro.sample(f"sigma{l}", self.noise_priors[l - 1].expand([width])).to(dtype)
        else:
            noise_std = torch.full((width,), math.sqrt(self.classification_jitter), dtype=dtype)
        prior = self.lengthscale_priors[l - 1]
        if prior is None:
            return noise_std, self.lengthscale
        return noise_std, pyro.sample(f"lengthscale{l}", prior.expand([width])).to(dtype)

    def _layer_factor(
        self,
        l: int,
        inputs: Tensor,
        noise: bool = True,
        weight: Tensor | None = None,
        sampled: tuple[Tensor, Tensor | float] | None = None,
    ) -> Tensor:
        """Sample layer ``l``'s parameters inside its unit plate and return its Cholesky factor.

        ``noise=False``: no noise site, the jitter ``classification_jitter`` only. ``weight``:
        use these projections instead of sampling ``W{l}`` (the identity when ``inputs`` are
        already the layer's activations, see :meth:`_collapsed_activations`). ``sampled``: the
        layer's noise and lengthscale, already sampled.
        """
        if weight is None:
            weight = self._sample_weight(l)
        if sampled is None:
            sampled = self._noise_and_lengthscale(l, noise)
        noise_std, lengthscale = sampled
        return layer_cholesky(inputs, weight, noise_std, lengthscale, self.jitter)

    def _collapsed_activations(
        self, inputs: Tensor, num_train: int, top_units: pyro.plate
    ) -> tuple[Tensor, tuple[Tensor, Tensor | float] | None]:
        r"""Sample the last layer's activations ``A^L = X^{L-1} (W^L)^T`` instead of the last
        hidden layer's outputs (``collapse=True``); returns ``[..., S, N_L]``.

        The last layer sees ``X^{L-1}`` only through ``A^L`` (``eq:gpn_cov_fn`` depends on
        ``w^T (x - x')``), and ``A^L`` is a linear map of the independent Gaussians
        ``X^{L-1}_{\star n} ~ N(0, C_n)``, ``C_n = K_n + sigma_n^2 I``, so it is jointly
        Gaussian with ``Cov(A_{sk}, A_{tj}) = sum_n W_{kn} W_{jn} (C_n)_{st}``. Sampling it
        (whitened by the Cholesky factor of that covariance, rows major) integrates out the
        ``N_{L-1} - N_L`` directions per row that the likelihood cannot see, exactly: the
        posterior of everything else is unchanged.

        Also returns the last layer's noise and lengthscale where they were sampled here
        (``activations="likelihood-informed"``, whose map depends on the output noise), else
        ``None``.
        """
        l, top = self.num_layers - 1, self.num_layers
        informed = self.activations == "likelihood-informed"
        top_sampled = None
        width, dtype, rows = self.sizes[top], self.dtype, inputs.shape[-2]
        with pyro.plate(f"units{l}", self.sizes[l], dim=-1):
            weight = self._sample_weight(l)
            noise_std, lengthscale = self._noise_and_lengthscale(l, True)
        with top_units:
            w_top = self._sample_weight(top)  # [..., K, N]
            if informed:
                top_sampled = self._noise_and_lengthscale(top, True)
        chol = activation_cholesky(inputs, weight, noise_std, lengthscale, w_top, self.jitter)
        n_train, n_all = num_train * width, rows * width
        batch = chol.shape[:-2]
        if self.activations in ("whitened", "likelihood-informed"):
            prefix = "Ea" if informed else "Za"
            normal = dist.Normal(torch.zeros((), dtype=dtype), 1.0)
            z = pyro.sample(f"{prefix}{top}_train", normal.expand([n_train]).to_event(1))
            z = z.reshape(*batch, n_train) if z.dim() > 1 else z
            if informed and self.activation_anchor is not None:
                e = z
                m, c = self.informed_factor(chol[..., :n_train, :n_train], top_sampled[0])
                z = torch.linalg.solve_triangular(m.mT, (e + c).unsqueeze(-1), upper=True)
                z = z.squeeze(-1)
                log_det = m.diagonal(dim1=-2, dim2=-1).log().sum(-1)
                # N(z; 0, I) |dz/de| / N(e; 0, I): the density of e under the change of variables
                pyro.factor(
                    f"Ea{top}_jacobian", 0.5 * (e.square().sum(-1) - z.square().sum(-1)) - log_det
                )
                pyro.deterministic(f"Za{top}_train_whitened", z)
            if n_all > n_train:
                z_test = pyro.sample(
                    f"{prefix}{top}_test", normal.expand([n_all - n_train]).to_event(1)
                )
                z_test = z_test.reshape(*batch, n_all - n_train) if z_test.dim() > 1 else z_test
                z = cat_rows(z, z_test)
            a = (chol @ z.unsqueeze(-1)).squeeze(-1)
            if informed:
                pyro.deterministic(f"A{top}", a.reshape(*a.shape[:-1], rows, width))
        else:
            # draw dimensions (vectorised Predictive) belong one dimension left of the unit
            # plates, which these sites sum over: give the normals batch shape [..., 1]
            lift = chol.dim() > 2
            train_tril = chol[..., :n_train, :n_train]
            a = pyro.sample(
                f"A{top}_train",
                dist.MultivariateNormal(
                    _zeros(n_train, dtype),
                    scale_tril=train_tril.unsqueeze(-3) if lift else train_tril,
                ),
            )
            a = a.reshape(*batch, n_train) if a.dim() > 1 else a
            if n_all > n_train:
                loc, scale_tril = conditional_rows(chol, n_train, a)
                if lift:
                    loc, scale_tril = loc.unsqueeze(-2), scale_tril.unsqueeze(-3)
                a_test = pyro.sample(
                    f"A{top}_test", dist.MultivariateNormal(loc, scale_tril=scale_tril)
                )
                a_test = a_test.reshape(*batch, n_all - n_train) if a_test.dim() > 1 else a_test
                a = cat_rows(a, a_test)
        return a.reshape(*a.shape[:-1], rows, width), top_sampled

    def _hidden_outputs(self, l: int, chol: Tensor, num_train: int) -> Tensor:
        """Sample layer ``l``'s outputs of all rows; returns ``[..., N_l, S]``."""
        width, num_rows = self.sizes[l], chol.shape[-1]
        num_test = num_rows - num_train
        if self.whiten:
            normal = dist.Normal(torch.zeros((), dtype=self.dtype), 1.0)
            z = pyro.sample(f"Z{l}_train", normal.expand([width, num_train]).to_event(1))
            if num_test:
                z_test = pyro.sample(f"Z{l}_test", normal.expand([width, num_test]).to_event(1))
                z = cat_rows(z, z_test)
            return (chol @ z.unsqueeze(-1)).squeeze(-1)
        train_chol = chol[..., :num_train, :num_train]
        x = pyro.sample(
            f"X{l}_train",
            dist.MultivariateNormal(_zeros(num_train, self.dtype), scale_tril=train_chol),
        )
        if not num_test:
            return x
        loc, scale_tril = conditional_rows(chol, num_train, x)
        x_test = pyro.sample(f"X{l}_test", dist.MultivariateNormal(loc, scale_tril=scale_tril))
        return cat_rows(x, x_test)

    @pyro_method
    def model(
        self, x_train: Tensor, y_train: Tensor | None = None, x_test: Tensor | None = None
    ) -> Tensor | None:
        """The joint ``eq:gpn_stack`` of all layers over the train (then test) rows.

        Args:
            x_train: ``[S_train, M]`` training inputs ``X^0`` (observed).
            y_train: ``[S_train]`` or ``[S_train, N_L]`` observed outputs, or ``None`` to sample
                them from the prior.
            x_test: optional ``[S_test, M]`` test inputs, whose outputs are latent.

        Returns:
            ``y_test`` ``[..., N_L, S_test]`` (outputs with noise), or ``None`` without
            ``x_test``.
        """
        x_train, y_train, x_test = self.check_data(x_train, y_train, x_test)
        num_train = x_train.shape[0]
        inputs = x_train if x_test is None else torch.cat([x_train, x_test], dim=0)
        last = self.num_layers
        collapse = self.collapse and last >= 2
        for l in range(1, last - 1 if collapse else last):
            with pyro.plate(f"units{l}", self.sizes[l], dim=-1):
                chol = self._layer_factor(l, inputs)
                inputs = self._hidden_outputs(l, chol, num_train).mT
        last_weight = top_sampled = None
        top_units = pyro.plate(f"units{last}", self.num_outputs, dim=-1)
        if collapse:
            inputs, top_sampled = self._collapsed_activations(inputs, num_train, top_units)
            last_weight = torch.eye(self.sizes[last], dtype=self.dtype)
        if self.likelihood != "gaussian":
            return self._classify(
                inputs, num_train, y_train, x_test is not None, last_weight, top_units
            )
        with top_units:
            chol = self._layer_factor(last, inputs, weight=last_weight, sampled=top_sampled)
            train_chol = chol[..., :num_train, :num_train]
            y = pyro.sample(
                "y_train",
                dist.MultivariateNormal(_zeros(num_train, self.dtype), scale_tril=train_chol),
                obs=y_train,
            )
            if x_test is None:
                return None
            loc, scale_tril = conditional_rows(chol, num_train, y)
            return pyro.sample("y_test", dist.MultivariateNormal(loc, scale_tril=scale_tril))

    def _classify(
        self,
        inputs: Tensor,
        num_train: int,
        labels: Tensor | None,
        with_test: bool,
        weight: Tensor | None,
        top_units: pyro.plate,
    ) -> Tensor | None:
        """The last layer as a latent function (whitened like a hidden layer, no noise) and a
        Bernoulli / categorical likelihood per row on it."""
        last = self.num_layers
        with top_units:
            chol = self._layer_factor(last, inputs, noise=False, weight=weight)
            f = self._hidden_outputs(last, chol, num_train)  # [..., N_L, S]
        logits = f.mT  # [..., S, N_L]
        with pyro.plate("rows", num_train, dim=-1):
            self._label_site("y_train", logits[..., :num_train, :], labels)
        if not with_test:
            return None
        test_logits = logits[..., num_train:, :]
        pyro.deterministic("p_test", class_probs(test_logits, self.likelihood))
        with pyro.plate("test_rows", logits.shape[-2] - num_train, dim=-1):
            return self._label_site("y_test", test_logits, None)

    def _label_site(self, name: str, logits: Tensor, labels: Tensor | None) -> Tensor:
        if self.likelihood == "bernoulli":
            return pyro.sample(name, dist.Bernoulli(logits=logits[..., 0]), obs=labels)
        return pyro.sample(name, dist.Categorical(logits=logits), obs=labels)

    def pointwise_log_likelihood(
        self, samples: dict[str, Tensor], x_train: Tensor, y_train: Tensor
    ) -> Tensor:
        r"""Per-row log-likelihood of every posterior draw, for PSIS-LOO and WAIC.

        Classification: ``log p(y_s | f_s)``, the factors of the likelihood. Regression: the
        Gaussian likelihood of the outputs is one multivariate normal over the rows (the last
        layer's GP is integrated out), which has no per-row factors; the terms are then the
        exact leave-one-out conditionals ``log p(y_s | y_{-s}, theta)`` of that normal (per
        output), ``-1/2 log(2 pi) + 1/2 log c_ss - g_s^2 / (2 c_ss)`` with ``c = C^{-1}``
        and ``g = C^{-1} y`` -- the pointwise terms of PSIS-LOO for non-factorised normal
        models (Buerkner, Gabry & Vehtari 2021, Comput. Stat. 36).

        Args:
            samples: posterior draws ``{site: [D, *shape]}`` (e.g. ``NUTSResult.samples``).
            x_train, y_train: the training data the chain was run on.

        Returns:
            ``[D, S_train]`` (summed over outputs for several outputs).
        """
        from pyro.infer import Predictive

        x_train, y_obs, _ = self.check_data(x_train, y_train, None)
        num_draws = next(iter(samples.values())).shape[0]
        with torch.no_grad():
            trace = Predictive(
                self.model, posterior_samples=samples, parallel=True, return_sites=[]
            ).get_vectorized_trace(x_train, y_train)
            site = trace.nodes["y_train"]
            if self.likelihood != "gaussian":
                return site["fn"].log_prob(site["value"]).reshape(num_draws, -1)
            scale_tril = site["fn"].scale_tril.expand(num_draws, self.num_outputs, -1, -1)
            precision = torch.cholesky_inverse(scale_tril)  # [D, N_L, S, S]
            g = (precision @ y_obs.unsqueeze(-1)).squeeze(-1)  # [D, N_L, S]
            c = torch.diagonal(precision, dim1=-2, dim2=-1)
            terms = -0.5 * math.log(2 * math.pi) + 0.5 * c.log() - 0.5 * g.square() / c
            return terms.sum(-2)

    def forward(
        self, x_train: Tensor, y_train: Tensor | None = None, x_test: Tensor | None = None
    ) -> Tensor | None:
        """Alias of :meth:`model`."""
        return self.model(x_train, y_train, x_test)


def _zeros(size: int, dtype: torch.dtype) -> Tensor:
    return torch.zeros(size, dtype=dtype)
