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
``y_train``               ``[N_L, S_train]``   observed outputs (transposed targets)
``y_test``                ``[N_L, S_test]``    predicted outputs, noise included
========================  ===================  ==============================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.nn.module import PyroModule, pyro_method
from torch import Tensor

from pyro_gpn._validation import check_finite, check_ndim, check_tensor
from pyro_gpn.kernels import gpn_kernel

__all__ = ["DEFAULT_MAX_SAMPLES", "NonParametricGPN", "conditional_rows", "layer_cholesky"]

DEFAULT_MAX_SAMPLES = 500
"""Default limit on train + test rows for exact inference (see the module docstring)."""


def _per_layer(name: str, value: object, num_layers: int) -> list:
    """Broadcast a single prior (or ``None``) to every layer, or check a per-layer sequence."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != num_layers:
            raise ValueError(
                f"{name} must have one entry per layer ({num_layers}), got {len(value)}"
            )
        return list(value)
    return [value] * num_layers


def _check_prior(name: str, prior: object) -> None:
    if prior is not None and not isinstance(prior, dist.Distribution):
        raise ValueError(f"{name} must be a pyro Distribution, got {type(prior).__name__}")
    if prior is not None and prior.event_shape != ():
        raise ValueError(
            f"{name} must be a distribution over scalars, got event_shape "
            f"{tuple(prior.event_shape)}"
        )


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
    cov = gpn_kernel(inputs, None, weight.mT, lengthscale)
    diag = noise_std.square() + jitter
    cov = cov + diag[..., None, None] * torch.eye(cov.shape[-1], dtype=cov.dtype)
    chol, info = torch.linalg.cholesky_ex(cov)
    # no data-dependent branch here, so that a JIT trace keeps the failure path
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


class NonParametricGPN(PyroModule):
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

    Call :meth:`model` with ``x_train [S_train, M]``, ``y_train [S_train]`` (when ``N_L = 1``)
    or ``[S_train, N_L]`` (``None`` samples from the prior), and optional ``x_test
    [S_test, M]``.
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
    ) -> None:
        super().__init__()
        sizes = [int(s) for s in sizes]
        if len(sizes) < 2 or any(s < 1 for s in sizes):
            raise ValueError(
                f"sizes must list >= 2 positive widths [M, N_1, ..., N_L], got {sizes}"
            )
        for name, value in (("weight_scale", weight_scale), ("lengthscale", lengthscale)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive and finite, got {value}")
        if not (math.isfinite(jitter) and jitter >= 0):
            raise ValueError(f"jitter must be non-negative and finite, got {jitter}")
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2, got {max_samples}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.sizes = sizes
        self.num_layers = len(sizes) - 1
        self.weight_scale = float(weight_scale)
        self.lengthscale = float(lengthscale)
        self.whiten = bool(whiten)
        self.jitter = float(jitter)
        self.max_samples = int(max_samples)
        self.dtype = dtype
        if noise_prior is None:
            noise_prior = dist.LogNormal(
                torch.tensor(math.log(0.1), dtype=dtype), torch.tensor(1.0, dtype=dtype)
            )
        self.noise_priors = _per_layer("noise_prior", noise_prior, self.num_layers)
        self.lengthscale_priors = _per_layer(
            "lengthscale_prior", lengthscale_prior, self.num_layers
        )
        for l, (noise, scale) in enumerate(
            zip(self.noise_priors, self.lengthscale_priors, strict=True), 1
        ):
            if noise is None:
                raise ValueError(f"noise_prior of layer {l} must not be None")
            _check_prior(f"noise_prior (layer {l})", noise)
            _check_prior(f"lengthscale_prior (layer {l})", scale)

    @property
    def num_outputs(self) -> int:
        return self.sizes[-1]

    def check_data(
        self, x_train: Tensor, y_train: Tensor | None, x_test: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Validate the data and return it as ``x [S, M]``, ``y [N_L, S_train] | None``, ``x_test``.

        Raises ``ValueError`` naming the argument for wrong shapes, non-finite values, or more
        than ``max_samples`` rows in total.
        """
        m, n_out = self.sizes[0], self.num_outputs
        check_ndim("x_train", check_tensor("x_train", x_train), 2)
        if x_train.shape[-1] != m:
            raise ValueError(f"x_train must have {m} columns, got shape {tuple(x_train.shape)}")
        if x_train.shape[0] < 1:
            raise ValueError("x_train must have at least one row")
        num_test = 0
        if x_test is not None:
            check_ndim("x_test", check_tensor("x_test", x_test), 2)
            if x_test.shape[-1] != m:
                raise ValueError(f"x_test must have {m} columns, got shape {tuple(x_test.shape)}")
            num_test = x_test.shape[0]
        total = x_train.shape[0] + num_test
        if total > self.max_samples:
            raise ValueError(
                f"x_train and x_test have {total} rows together, more than max_samples="
                f"{self.max_samples} supported by exact inference: every unit needs an O(S^3) "
                "Cholesky factorisation of its S x S covariance at every gradient step and the "
                "hidden outputs add S latent dimensions per hidden unit. Raise max_samples if "
                "you accept the cost, or use a parametric or variational GPN."
            )
        if y_train is not None:
            check_tensor("y_train", y_train)
            if y_train.dim() == 1 and n_out == 1:
                y_train = y_train.unsqueeze(-1)
            if y_train.shape != (x_train.shape[0], n_out):
                raise ValueError(
                    f"y_train must have shape ({x_train.shape[0]}, {n_out})"
                    + (f" or ({x_train.shape[0]},)" if n_out == 1 else "")
                    + f", got {tuple(y_train.shape)}"
                )
            y_train = y_train.to(self.dtype).mT
        if not torch._C._get_tracing_state():  # value checks would break a JIT trace
            check_finite("x_train", x_train)
            if x_test is not None:
                check_finite("x_test", x_test)
            if y_train is not None:
                check_finite("y_train", y_train)
        x_test = None if x_test is None else x_test.to(self.dtype)
        return x_train.to(self.dtype), y_train, x_test

    def _layer_factor(self, l: int, inputs: Tensor) -> Tensor:
        """Sample layer ``l``'s parameters inside its unit plate and return its Cholesky factor."""
        fan_in, width = self.sizes[l - 1], self.sizes[l]
        dtype = self.dtype
        zero = torch.zeros((), dtype=dtype)
        weight_std = torch.tensor(self.weight_scale / math.sqrt(fan_in), dtype=dtype)
        weight = pyro.sample(
            f"W{l}", dist.Normal(zero, weight_std).expand([width, fan_in]).to_event(1)
        ).to(dtype)
        noise_std = pyro.sample(f"sigma{l}", self.noise_priors[l - 1].expand([width])).to(dtype)
        prior = self.lengthscale_priors[l - 1]
        if prior is None:
            lengthscale: Tensor | float = self.lengthscale
        else:
            lengthscale = pyro.sample(f"lengthscale{l}", prior.expand([width])).to(dtype)
        return layer_cholesky(inputs, weight, noise_std, lengthscale, self.jitter)

    def _hidden_outputs(self, l: int, chol: Tensor, num_train: int) -> Tensor:
        """Sample layer ``l``'s outputs of all rows; returns ``[..., N_l, S]``."""
        width, num_rows = self.sizes[l], chol.shape[-1]
        num_test = num_rows - num_train
        if self.whiten:
            normal = dist.Normal(torch.zeros((), dtype=self.dtype), 1.0)
            z = pyro.sample(f"Z{l}_train", normal.expand([width, num_train]).to_event(1))
            if num_test:
                z_test = pyro.sample(f"Z{l}_test", normal.expand([width, num_test]).to_event(1))
                z = _cat_rows(z, z_test)
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
        return _cat_rows(x, x_test)

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
        for l in range(1, self.num_layers):
            with pyro.plate(f"units{l}", self.sizes[l], dim=-1):
                chol = self._layer_factor(l, inputs)
                inputs = self._hidden_outputs(l, chol, num_train).mT
        last = self.num_layers
        with pyro.plate(f"units{last}", self.num_outputs, dim=-1):
            chol = self._layer_factor(last, inputs)
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

    def forward(
        self, x_train: Tensor, y_train: Tensor | None = None, x_test: Tensor | None = None
    ) -> Tensor | None:
        """Alias of :meth:`model`."""
        return self.model(x_train, y_train, x_test)


def _zeros(size: int, dtype: torch.dtype) -> Tensor:
    return torch.zeros(size, dtype=dtype)


def _cat_rows(train: Tensor, test: Tensor) -> Tensor:
    """Concatenate ``[..., N, S_1]`` and ``[..., N, S_2]`` along rows, broadcasting batch dims."""
    batch = torch.broadcast_shapes(train.shape[:-1], test.shape[:-1])
    return torch.cat([train.expand(*batch, -1), test.expand(*batch, -1)], dim=-1)
