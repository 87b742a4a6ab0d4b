r"""A GPN whose virtual-observation targets are sampled, with the activations integrated out in
closed form: the posterior a sampler can explore on thousands of rows.

Model (the variational GPN's, ``eq:gpn_vi_joint``, with the weights and noise scales given
priors as well). For layers ``l = 1 .. L`` with ``R`` fixed inducing points ``V`` per unit:

.. math::

    W^l_{mn} \sim \mathcal{N}(0, s_w^2 / M_l), \qquad
    U^l_{\star n} = L_K\, z^l_{\star n}, \quad z^l_{\star n} \sim \mathcal{N}(0, I),
    \quad L_K L_K^T = K(V, V) + \epsilon I, \qquad
    \sigma^l_n \sim \text{LogNormal}(\log 0.1, 1),

i.e. ``U`` has the GP prior ``eq:gpn_vi_puv``, whitened w.r.t. the kernel that defines it (the
same ``L_K`` for every unit). Given the targets a unit's response is the GP conditional
``f | a, U ~ N(alpha^T K^-1 U, 1 - alpha^T K^-1 alpha)`` and its output ``f + N(0, sigma^2)``.
The hidden activations are *not* sampled: every row's outputs are propagated through the
layers in the central-limit approximation (``eq:gpn_normal_a``, ``eq:gpn_normal_mu``,
``eq:gpn_normal_Sigmatilde`` with ``C = K^-1``, ``beta = K^-1 U``: the variational layer's
moments with ``q(U)`` a point mass), and the likelihood is

.. math::

    p(y \mid z, W, \sigma) = \prod_s \mathcal{N}\big(y_s \mid \tilde\mu^L_s,\;
        \tilde\Sigma^L_{s}\big)

(the last layer's variance includes its noise, the observation noise). For classification the
last layer's output ``x^L_s`` is the latent function: ``y_s ~ Bernoulli(sigmoid(x^L_s))`` or
``Categorical(softmax(x^L_s))`` with ``x^L_s ~ N(mu^L_s, Sigma^L_s)`` -- the Gaussian is
integrated by Gauss-Hermite quadrature per output (``num_quadrature`` nodes; independent
outputs for the categorical case, one dimension at a time is exact only for one output, so the
categorical likelihood uses the mean logits plus a probit-style variance correction
``mu / sqrt(1 + pi var / 8)``).

The posterior lives in ``sum_l N_l (R + M_l + 1)`` dimensions, independent of the number of
rows, and one evaluation of the log density costs ``O(S sum_l N_l (M_l + R^2))`` -- linear in
the rows. This is the route to NUTS on data sets of thousands of rows, where the
non-parametric GPN's hidden outputs (``S`` latent dimensions per hidden unit and ``O(S^3)`` per
unit and step) are out of reach. The price is the central-limit approximation of the hidden
activations, which is what the variational GPN makes as well.

Sites (``l = 1 .. L``):

=====================  ===================  ==============================================
site                   shape                meaning
=====================  ===================  ==============================================
``W{l}``               ``[N_l, M_l]``       weights, transposed (rows are units)
``sigma{l}``           ``[N_l]``            noise standard deviations (regression: all;
                                            classification: hidden layers only)
``z{l}``               ``[N_l, R]``         whitened targets, ``U^l = L_K z^l``
``y``                  ``[S]`` / ``[S, N_L]`` observed outputs, one factor per row
=====================  ===================  ==============================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.nn.module import pyro_method
from torch import Tensor

from .._validation import check_parameter_dtype
from ..moments.midpoint import is_equidistant, midpoint_expansion
from ..pyro_module import GPNModule
from .nuts_inputs import (
    LIKELIHOODS,
    check_positive,
    check_sizes,
    check_xy,
    default_noise_prior,
)

__all__ = ["LIKELIHOODS", "SampledTargetsGPN", "clt_layer_moments"]


def clt_layer_moments(
    mean: Tensor,
    var: Tensor,
    weight: Tensor,
    inducing: Tensor,
    targets: Tensor,
    lengthscale: float,
    jitter: float,
    noise_std: Tensor | None,
    equidistant: bool | None = None,
) -> tuple[Tensor, Tensor]:
    r"""One layer's output moments given its targets, in the central-limit approximation.

    With ``a = x W^T``, ``a_n ~ N(m_n, v_n)`` (``eq:gpn_normal_a``, inputs independent),
    ``psi_r = E[alpha_r(a)]``, ``Omega_rt = E[alpha_r(a) alpha_t(a)]`` (closed-form Gaussian
    integrals), ``beta = K^-1 U`` and ``C = K^-1``:
    ``mean = psi^T beta`` (``eq:gpn_normal_mu``) and
    ``var = 1 - tr[(C - beta beta^T) Omega] - mean^2 + sigma^2`` (``eq:gpn_normal_Sigmatilde``).

    Args:
        mean, var: ``[..., S, M]`` moments of the layer's inputs.
        weight: ``[..., N, M]`` weights (rows are units).
        inducing: ``[R]`` inducing points ``V`` (shared by the units).
        targets: ``[..., N, R]`` virtual-observation targets ``U``.
        lengthscale: the kernel's lengthscale ``lambda``.
        jitter: added to ``K(V, V)``'s diagonal.
        noise_std: ``[..., N]`` or ``None`` (no output noise).
        equidistant: whether ``inducing`` is an ascending uniform grid, passed to
            :func:`~pyro_gpn.moments.midpoint.midpoint_expansion` (``None`` detects it from
            the values: decide it once outside a ``torch.jit.trace``).

    Returns:
        ``mean [..., S, N]`` and ``var [..., S, N]``.
    """
    lam2 = lengthscale**2
    a_mean = mean @ weight.mT  # [..., S, N]
    a_var = var @ weight.square().mT
    diff = inducing[:, None] - inducing[None, :]
    kern = torch.exp(-0.5 * diff.square() / lam2) + jitter * torch.eye(
        inducing.shape[0], dtype=inducing.dtype
    )
    chol = torch.linalg.cholesky(kern)
    beta = torch.cholesky_solve(targets.unsqueeze(-1), chol).squeeze(-1)  # [..., N, R]
    cinv = torch.cholesky_inverse(chol)  # [R, R]
    m = a_mean.unsqueeze(-1)  # [..., S, N, 1]
    v = a_var.unsqueeze(-1)
    psi = torch.sqrt(lam2 / (lam2 + v)) * torch.exp(
        -0.5 * (m - inducing).square() / (lam2 + v)
    )  # [..., S, N, R]
    out_mean = (psi * beta.unsqueeze(-3)).sum(-1)
    # Omega_rt = sqrt(lam2 / w2) exp(-diff_rt^2 / (4 lam2)) exp(-(m - mid_rt)^2 / w2) depends on
    # the row only through mid_rt = (V_r + V_t) / 2 (2R - 1 values on a uniform grid): the
    # midpoint expansion sums the row-free factors first, O(S N K) instead of O(S N R^2).
    coef = cinv - beta.unsqueeze(-1) * beta.unsqueeze(-2)  # [..., N, R, R]
    mids, weights = midpoint_expansion(
        inducing, coef, torch.tensor(lengthscale, dtype=coef.dtype), equidistant
    )  # [..., N, K]
    w2 = lam2 + 2 * v  # [..., S, N, 1]
    trace = torch.sqrt(lam2 / w2.squeeze(-1)) * (
        torch.exp(-(m - mids.unsqueeze(-3)).square() / w2) * weights.unsqueeze(-3)
    ).sum(-1)  # [..., S, N]
    out_var = (1.0 - trace - out_mean.square()).clamp_min(1e-10)
    if noise_std is not None:
        out_var = out_var + noise_std.unsqueeze(-2).square()
    return out_mean, out_var


class SampledTargetsGPN(GPNModule):
    r"""GPN with sampled virtual-observation targets and closed-form activations (see module).

    Args:
        sizes: widths ``[M, N_1, ..., N_L]``; ``N_L`` outputs (regression), ``1`` for
            ``likelihood="bernoulli"``, the number of classes for ``"categorical"``.
        likelihood: ``"gaussian"``, ``"bernoulli"`` or ``"categorical"``.
        num_inducing: ``R`` targets per unit, on a linear grid over ``inducing_range``.
        inducing_range: the interval of the inducing points.
        lengthscale: the kernel's ``lambda`` (fixed; the weights set the activations' scale).
        weight_scale: prior ``W^l_{mn} ~ N(0, weight_scale^2 / M_l)``.
        noise_prior: prior of every noise standard deviation (default ``LogNormal(log 0.1, 1)``).
        jitter: added to ``K(V, V)``.
        dtype: of all computations: torch.float32 or torch.float64 (others raise
            ``ValueError`` naming ``dtype``).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        *,
        likelihood: str = "gaussian",
        num_inducing: int = 10,
        inducing_range: tuple[float, float] = (-2.0, 2.0),
        lengthscale: float = 0.5,
        weight_scale: float = 1.0,
        noise_prior: dist.Distribution | None = None,
        jitter: float = 1e-6,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        sizes = check_sizes(sizes, likelihood)
        if not isinstance(num_inducing, int) or num_inducing < 2:
            raise ValueError(f"num_inducing must be an integer >= 2, got {num_inducing!r}")
        low, high = inducing_range
        if not low < high:
            raise ValueError(f"inducing_range must be increasing, got {inducing_range}")
        lengthscale = check_positive("lengthscale", lengthscale)
        weight_scale = check_positive("weight_scale", weight_scale)
        jitter = check_positive("jitter", jitter, allow_zero=True)
        self.sizes = sizes
        self.num_layers = len(sizes) - 1
        self.likelihood = likelihood
        self.num_inducing = num_inducing
        self.lengthscale = float(lengthscale)
        self.weight_scale = float(weight_scale)
        self.jitter = float(jitter)
        self.dtype = dtype = check_parameter_dtype("dtype", dtype)
        self.inducing_points = torch.linspace(low, high, num_inducing, dtype=dtype)
        self.equidistant = is_equidistant(self.inducing_points)  # decided once, not in a trace
        self.noise_prior = default_noise_prior(dtype) if noise_prior is None else noise_prior

    @property
    def num_outputs(self) -> int:
        return self.sizes[-1]

    def _has_noise(self, l: int) -> bool:
        return l < self.num_layers or self.likelihood == "gaussian"

    def parameter_sites(self) -> list[str]:
        """Latent sites whose dimension does not grow with anything but the widths: all of them."""
        names = []
        for l in range(1, self.num_layers + 1):
            names += [f"W{l}", f"z{l}"] + ([f"sigma{l}"] if self._has_noise(l) else [])
        return names

    def check_data(
        self, x: Tensor, y: Tensor | None, x_test: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Validate ``x [S, M]`` and ``y`` (``[S]``/``[S, N_L]`` targets or ``[S]`` labels)."""
        return check_xy(self.sizes, self.likelihood, self.dtype, x, y, x_test)

    def _sample_layers(self) -> list[tuple[Tensor, Tensor, Tensor | None]]:
        """Sample every layer's weights, targets and noise; ``[(W, U, sigma)]``."""
        dtype, out = self.dtype, []
        diff = self.inducing_points[:, None] - self.inducing_points[None, :]
        kern = torch.exp(-0.5 * diff.square() / self.lengthscale**2)
        kern = kern + self.jitter * torch.eye(self.num_inducing, dtype=dtype)
        chol = torch.linalg.cholesky(kern)
        zero = torch.zeros((), dtype=dtype)
        for l in range(1, self.num_layers + 1):
            fan_in, width = self.sizes[l - 1], self.sizes[l]
            std = torch.tensor(self.weight_scale / math.sqrt(fan_in), dtype=dtype)
            w = pyro.sample(f"W{l}", dist.Normal(zero, std).expand([width, fan_in]).to_event(2))
            z = pyro.sample(
                f"z{l}", dist.Normal(zero, 1.0).expand([width, self.num_inducing]).to_event(2)
            )
            u = (chol @ z.unsqueeze(-1)).squeeze(-1)
            sigma = None
            if self._has_noise(l):
                sigma = pyro.sample(f"sigma{l}", self.noise_prior.expand([width]).to_event(1))
            out.append((w, u, sigma))
        return out

    def output_moments(self, x: Tensor, params) -> tuple[Tensor, Tensor]:
        """The last layer's output mean and variance ``[..., S, N_L]`` given sampled parameters."""
        mean, var = x, torch.zeros_like(x)
        for w, u, sigma in params:
            mean, var = clt_layer_moments(
                mean,
                var,
                w,
                self.inducing_points,
                u,
                self.lengthscale,
                self.jitter,
                sigma,
                self.equidistant,
            )
        return mean, var

    def observation(self, mean: Tensor, var: Tensor) -> dist.Distribution:
        """The per-row predictive distribution of ``y`` given the last layer's moments.

        Gaussian: ``N(mean, var)`` over the outputs (event ``[N_L]``). Bernoulli: the logistic
        likelihood integrated against ``N(mean, var)`` by 64-node Gauss-Hermite quadrature.
        Categorical: logits ``mean / sqrt(1 + pi var / 8)`` (the probit approximation).
        """
        if self.likelihood == "gaussian":
            return dist.Normal(mean, var.sqrt()).to_event(1)
        if self.likelihood == "bernoulli":
            nodes, weights = _hermite(64, self.dtype)
            f = mean + var.sqrt() * nodes  # [..., S, 1] * [Q] -> [..., S, Q]
            prob = (torch.sigmoid(f) * weights).sum(-1).clamp(1e-12, 1 - 1e-12)
            return dist.Bernoulli(probs=prob)
        return dist.Categorical(logits=mean / torch.sqrt(1 + math.pi * var / 8))

    @pyro_method
    def model(
        self, x_train: Tensor, y_train: Tensor | None = None, x_test: Tensor | None = None
    ) -> Tensor | None:
        """Priors, then one likelihood factor per training row (plate ``rows``, site ``y``);
        with ``x_test`` also ``y_test`` (the predictive of the test rows, a Gaussian per row
        for regression, labels for classification)."""
        x_train, y_train, x_test = self.check_data(x_train, y_train, x_test)
        params = self._sample_layers()
        mean, var = self.output_moments(x_train, params)
        with pyro.plate("rows", x_train.shape[0], dim=-1):
            pyro.sample("y", self.observation(mean, var), obs=y_train)
        if x_test is None:
            return None
        mean, var = self.output_moments(x_test, params)
        fn = self.observation(mean, var)
        if self.likelihood == "bernoulli":
            pyro.deterministic("p_test", torch.stack([1 - fn.probs, fn.probs], dim=-1))
        elif self.likelihood == "categorical":
            pyro.deterministic("p_test", fn.probs)
        with pyro.plate("test_rows", x_test.shape[0], dim=-1):
            return pyro.sample("y_test", fn)

    def pointwise_log_likelihood(
        self, samples: dict[str, Tensor], x_train: Tensor, y_train: Tensor
    ) -> Tensor:
        """``log p(y_s | theta_d)`` per posterior draw and training row, ``[D, S_train]`` (the
        likelihood's own per-row factors)."""
        from pyro.infer import Predictive

        num_draws = next(iter(samples.values())).shape[0]
        with torch.no_grad():
            trace = Predictive(
                self.model, posterior_samples=samples, parallel=True, return_sites=[]
            ).get_vectorized_trace(x_train, y_train)
        site = trace.nodes["y"]
        return site["fn"].log_prob(site["value"]).reshape(num_draws, -1)

    def forward(self, x_train: Tensor, y_train: Tensor | None = None, x_test: Tensor | None = None):
        """Alias of :meth:`model`."""
        return self.model(x_train, y_train, x_test)


def _hermite(num: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Nodes and weights for ``E[g(f)]``, ``f ~ N(0, 1)`` (probabilists' Gauss-Hermite)."""
    import numpy as np

    nodes, weights = np.polynomial.hermite_e.hermegauss(num)
    return (
        torch.as_tensor(nodes, dtype=dtype),
        torch.as_tensor(weights / math.sqrt(2 * math.pi), dtype=dtype),
    )
