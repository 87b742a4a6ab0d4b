r"""The parametric GPN trained by sampling (paper, "Parametric Gaussian Process Neurons", route 2).

Given the outputs of the layer below, the outputs of a parametric GPN layer are Gaussian
(``eq:gpn_parametrized_y_given_x``)

.. math::

    X^l_{\star n} \mid X^{l-1} \sim \mathcal{N}\big(\mu^{X^l}_{\star n},
        \Sigma^{X^l}_{\star\star n}\big),

with ``mu`` and ``Sigma`` the GP posterior given the virtual observations ``(V, U, S)``
(``eq:gpn_parametrized_mu_sigma_y_sn``, :meth:`pyro_gpn.layers.GPNLayer.conditional`).

**Why sample by sample suffices.** ``mu_sn`` and ``Sigma_ssn`` depend on ``X^{l-1}`` only through
row ``s``, so the marginal of sample ``s`` is ``p(X^l_s | X^{l-1}) = p(X^l_s | X^{l-1}_s)``, and
the expected loss over the predictive distribution, a sum over samples, only needs these
marginals (``eq:gpn_parametrized_loss``):

.. math::

    \mathscr{L}(\theta) = \frac{1}{S} \sum_{s=1}^S
        \mathbb{E}_{p_\theta(X^L_s \mid X^0_s)}\big[L(X^L_s, T_s)\big].

The off-diagonal ``Sigma_{s s' n}`` never enters. Each sample is pushed through the network by
drawing ``X^l_s = mu + sqrt(Sigma_ss) eps``, ``eps ~ N(0, I)``, layer after layer: an unbiased,
reparameterised estimate of ``eq:gpn_parametrized_loss`` whose gradients are unbiased too.

**The Pyro formulation.** ``model`` performs one such stochastic forward pass; the only
``pyro.sample`` site is the observation ``y``. The hidden outputs are reparameterised draws
(``dist.Normal(mu, sqrt(Sigma)).rsample()``), not latent sample sites, and the guide is empty. Then
Pyro's :class:`~pyro.infer.Trace_ELBO` is ``-E[log p(y | hidden draws)]``, exactly the paper's
objective, with the pathwise gradients of the reparameterisation trick. Declaring the hidden
outputs as latent sites would be wrong with an empty guide (the model would add their prior log
densities to the objective, and Pyro warns about sites missing from the guide); a guide that
re-samples them from the model's own conditionals would make those densities cancel, but it
doubles the work and only reproduces the same estimator. The draws are recorded as
``pyro.deterministic`` sites, so :class:`~pyro.infer.Predictive` returns them too.

**What is sampled and what is observed.** For ``L`` GPN layers:

============================  =========  =====================================================
site                          kind       value
============================  =========  =====================================================
``data``                      plate      the samples, scaled by ``num_data / B``
``X1`` .. ``X{L-1}``          determin.  drawn hidden outputs ``X^l_s ~ N(mu, Sigma + sigma^2)``
``F{L}`` (gaussian head)      determin.  drawn response ``F^L_s ~ N(mu_F, Sigma_F)`` (noise-free)
``y`` (gaussian head)         observed   ``N(F^L_s, (sigma^L)^2)``, event ``[N_L]``
``X{L}`` (softmax head)       determin.  drawn outputs of the last GPN layer (with noise)
``logits`` (softmax head)     determin.  ``X^L_s W^{L+1} + b`` (recorded by the head)
``y`` (softmax head)          observed   ``Categorical(logits)``
``target_variance_penalty``   factor     ``-S * L_S`` (``eq:gpn_ls``), when ``y`` is given
============================  =========  =====================================================

The gaussian head's default ``likelihood="expected"`` is the paper's regression objective
``eq:gpn_parametric_regression_log_loss``, ``-E_{F^L}[log N(T | F^L, (sigma^L)^2)]``, which is also
what :meth:`pyro_gpn.GPNNet.loss` evaluates in closed form. ``likelihood="marginal"`` integrates
the last layer's response analytically given the sampled ``X^{L-1}``: ``y ~ N(mu_F, Sigma_F +
(sigma^L)^2)``, i.e. ``-E_{X^{L-1}}[log p(T | X^{L-1})]``, a tighter objective (by Jensen's
inequality it is never larger) with lower-variance gradients; for a single layer it is the exact
negative log-likelihood. The softmax head observes the class through the sampled logits
(``eq:gpn_parametrized_loss_classification``).

**Scaling.** Pyro's ELBO sums over samples (scaled by ``S / B`` for a mini-batch of ``B`` of
``num_data = S``, :mod:`pyro_gpn.models._contract`), so the SVI loss is ``S`` times the paper's
per-sample mean. The penalty factor is therefore ``-S * L_S``, and ``loss / S`` is the paper's
``L(theta) + L_S(theta)``.

**Sharing with the closed form.** :class:`ParametricGPN` takes a :class:`~pyro_gpn.GPNNet` (or
builds one from ``sizes``) and owns no parameters of its own, so a network trained with the
deterministic central-limit objective can be evaluated by sampling and vice versa;
``gpn(x)`` is the network's closed-form predictive.

Cost: one forward pass per particle, ``O(B sum_l (M_l N_l + N_l R^2))`` per step. The draws are
not aware of a particle plate, so use ``Trace_ELBO(num_particles=k)`` without
``vectorize_particles`` (:func:`~pyro_gpn.inference.svi.fit_svi` does);
:meth:`~ParametricGPN.sample_predictive` vectorises by stacking copies of the inputs instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import Predictive
from pyro.nn import PyroModule, pyro_method
from torch import Tensor

from ..heads import Head, Prediction
from ..moments.gaussian import Moments
from ..moments.propagate import Mode
from ..network import GPNNet
from ..pyro_module import GPNModule
from ._contract import check_batch, check_num_data, data_plate

__all__ = ["LIKELIHOODS", "ParametricGPN"]

LIKELIHOODS = ("expected", "marginal")

#: floor on the variances before the square root: keeps the reparameterised draws' gradients
#: finite where the response variance ``1 - alpha^T kappa alpha`` is clamped at zero
_MIN_VAR = 1e-12


def _normal_draw(mean: Tensor, var: Tensor) -> Tensor:
    """A reparameterised draw from ``N(mean, var)`` (elementwise)."""
    return dist.Normal(mean, var.clamp_min(_MIN_VAR).sqrt()).rsample()


class ParametricGPN(GPNModule):
    r"""A parametric GPN network as a Pyro model with sampled, reparameterised hidden outputs.

    The module holds a :class:`~pyro_gpn.GPNNet` (``self.network``) and adds the stochastic route:
    :meth:`model` (one sampled forward pass, the observation ``y``), an empty :meth:`guide`,
    :meth:`predict` and :meth:`sample_predictive` (:class:`~pyro.infer.Predictive` draws). Train
    it with :func:`pyro_gpn.inference.svi.fit_svi` (or ``SVI(gpn.model, gpn.guide, optim,
    Trace_ELBO())``); the SVI loss is ``S (L(theta) + L_S(theta))``
    (``eq:gpn_parametrized_loss`` + ``eq:gpn_ls``), see the module docstring.

    Args:
        network: the :class:`~pyro_gpn.GPNNet` to sample (shared, not copied), or its widths
            ``sizes`` to build one: ``[M, N_1, ..., N_L]`` (``head="gaussian"``) or
            ``[M, N_1, ..., N_L, C]`` (``head="softmax"``).
        head, mode, **layer_kwargs: for a network built from ``sizes`` (see
            :class:`~pyro_gpn.GPNNet`).
        likelihood: ``"expected"`` (the paper's objective) or ``"marginal"``, for a head that
            has a marginal observation (the Gaussian one; see the module docstring); the
            softmax head ignores it, another regression head refuses it.
        penalty: add the target-variance penalty ``eq:gpn_ls`` (paper: yes, for maximum
            likelihood) as a ``pyro.factor`` whenever ``y`` is observed (a training term; it is
            left out when the model generates ``y``).
        penalty_alpha, penalty_beta: ``alpha_S`` and ``beta_S`` of ``eq:gpn_ls``.
        num_data: default size ``S`` of the data set the model's batches come from.

    Example:
        >>> gpn = ParametricGPN([1, 4, 1], head="gaussian")
        >>> x, y = torch.rand(16, 1), torch.rand(16, 1)
        >>> svi = pyro.infer.SVI(gpn.model, gpn.guide, pyro.optim.Adam({"lr": 1e-2}),
        ...                      pyro.infer.Trace_ELBO())
        >>> loss = svi.step(x, y)
        >>> gpn.predict(x, num_samples=10).mean.shape
        torch.Size([16, 1])
    """

    def __init__(
        self,
        network: GPNNet | Sequence[int],
        head: str | Head = "softmax",
        mode: Mode = "meanvar",
        *,
        likelihood: str = "expected",
        penalty: bool = True,
        penalty_alpha: float = 0.1,
        penalty_beta: float = 1e-3,
        num_data: int | None = None,
        **layer_kwargs,
    ) -> None:
        super().__init__()
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
        if not penalty_alpha >= 0:
            raise ValueError(f"penalty_alpha must be non-negative, got {penalty_alpha}")
        if not penalty_beta > 0:
            raise ValueError(f"penalty_beta must be positive, got {penalty_beta}")
        if isinstance(network, GPNNet):
            if layer_kwargs:
                raise TypeError(f"options {sorted(layer_kwargs)} apply to a network from sizes")
        elif isinstance(network, PyroModule) or not isinstance(network, Sequence):
            raise TypeError(f"network must be a GPNNet or sizes, got {type(network).__name__}")
        else:
            network = GPNNet(network, mode=mode, head=head, **layer_kwargs)
        task = network.head.task
        if likelihood == "marginal" and task == "regression":
            if not hasattr(network.head, "marginal_observation"):
                raise ValueError(
                    f"likelihood='marginal' needs a head with a Gaussian marginal observation "
                    f"(GaussianHead), got {type(network.head).__name__}: use "
                    "likelihood='expected'"
                )
        self.network = network
        self.likelihood = likelihood
        self.penalty = bool(penalty)
        self.penalty_alpha = float(penalty_alpha)
        self.penalty_beta = float(penalty_beta)
        self.num_data = check_num_data(num_data)

    @classmethod
    def from_network(cls, network: GPNNet, **options) -> ParametricGPN:
        """Wrap an existing :class:`~pyro_gpn.GPNNet`, sharing (not copying) its parameters;
        the same as ``ParametricGPN(network, **options)``."""
        if not isinstance(network, GPNNet):
            raise TypeError(f"network must be a GPNNet, got {type(network).__name__}")
        return cls(network, **options)

    # ------------------------------------------------------------------ properties
    @property
    def head(self) -> Head:
        return self.network.head

    @property
    def sizes(self) -> list[int]:
        return self.network.sizes

    @property
    def num_layers(self) -> int:
        """``L``, the number of GPN layers."""
        return self.network.num_layers

    # ------------------------------------------------------------------ the model
    def sample_features(self, x: Tensor) -> tuple[list[Tensor], Tensor, Tensor]:
        """One reparameterised pass through the first ``L - 1`` layers and the last conditional.

        Args:
            x: ``[B, M]`` inputs.

        Returns:
            ``hidden``: the drawn outputs ``[X^1, ..., X^{L-1}]`` (``[B, N_l]`` each);
            ``mean``, ``var``: ``[B, N_L]`` moments of the head's features given ``X^{L-1}``:
            of the noise-free response ``F^L`` under a head that owns the observation noise,
            else of the output ``X^L`` (noise included).
        """
        layers = self.network.layers
        hidden: list[Tensor] = []
        outputs = x
        for layer in layers[:-1]:
            outputs = _normal_draw(*layer._conditional(outputs @ layer.weight))
            hidden.append(outputs)
        last = layers[-1]
        mean, var = last._conditional(outputs @ last.weight)
        return hidden, mean, var

    @pyro_method
    def model(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """One stochastic forward pass; observes ``y`` (see the module docstring for the sites).

        Args:
            x: ``[B, M]`` inputs (a batch of ``num_data`` samples).
            y: ``[B, N_L]`` targets (gaussian head), ``[B]`` integer labels (softmax head), or
                ``None`` to sample them.
            num_data: ``S`` (default: the attribute, else ``B``); the likelihood is scaled by
                ``S / B`` and the penalty by ``S``.

        Returns:
            The observed or sampled ``y``.
        """
        num_data = self.num_data if num_data is None else num_data
        x, y = check_batch(self.head, self.sizes[0], x, y, num_data, module=self)
        head = self.head
        marginal = self.likelihood == "marginal" and hasattr(head, "marginal_observation")
        with data_plate(x.shape[0], num_data, x.device):
            hidden, mean, var = self.sample_features(x)
            for l, outputs in enumerate(hidden, start=1):
                pyro.deterministic(f"X{l}", outputs, event_dim=1)
            if marginal:
                result = pyro.sample("y", head.marginal_observation(mean, var), obs=y)
            else:
                features = _normal_draw(mean, var)
                name = f"{'X' if head.noisy_features else 'F'}{self.num_layers}"
                pyro.deterministic(name, features, event_dim=1)
                result = head.observe("y", features, y)
        if self.penalty and y is not None:
            scale = x.shape[0] if num_data is None else num_data
            pyro.factor("target_variance_penalty", -scale * self.target_variance_penalty())
        return result

    @pyro_method
    def guide(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> None:
        """The empty guide: the model has no latent sample sites (all parameters are point
        estimates and the hidden outputs are reparameterised draws inside the model)."""
        return None

    def forward(self, x: Tensor, x_var: Tensor | None = None) -> Moments:
        """The predictive :class:`Moments` of the network in closed form (the central-limit
        approximation of what :meth:`model` samples).

        Shape:
            ``x [S, M]`` -> :class:`Moments` ``[S, D]``.
        """
        return self.network(x, x_var)

    def target_variance_penalty(self) -> Tensor:
        """``L_S`` of ``eq:gpn_ls`` over the network's layers."""
        return self.network.penalty(self.penalty_alpha, self.penalty_beta)

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict(self, x: Tensor, num_samples: int = 100, max_rows: int = 2**16) -> Prediction:
        """Monte Carlo predictions from :meth:`sample_predictive`: mean and std of the outputs,
        or the class probabilities averaged over the draws and their std."""
        return self.head.predict_draws(self.sample_predictive(x, num_samples, True, max_rows), "y")

    @torch.no_grad()
    def sample_predictive(
        self,
        x: Tensor,
        num_samples: int = 100,
        parallel: bool = True,
        max_rows: int = 2**16,
    ) -> dict[str, Tensor]:
        """Draws from the predictive distribution by :class:`~pyro.infer.Predictive`.

        Args:
            x: ``[S, M]`` inputs.
            num_samples: ``K`` forward passes.
            parallel: vectorise the ``K`` passes: run the model on stacked copies of ``x``,
                ``max(1, max_rows // S)`` copies at a time (exact, since samples are independent
                given the parameters, ``eq:gpn_parametrized_loss``). ``False`` runs the model
                ``K`` times.
            max_rows: bound on the rows of one vectorised pass (memory).

        Returns:
            A dict of ``[K, S, ...]`` tensors: ``"y"`` (outputs ``X^L = F^L + noise``
            ``[K, S, N_L]``, or sampled labels ``[K, S]``), the recorded draws ``"X1"``, ...,
            ``"F{L}"`` (gaussian head, ``likelihood="expected"``), ``"logits"`` and ``"probs"``
            (softmax head: ``softmax(logits)`` per draw, ``[K, S, C]``; average over ``K`` for
            the predictive class probabilities).
        """
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        if not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows must be a positive integer, got {max_rows!r}")
        x, _ = check_batch(self.head, self.sizes[0], x, None, None, module=self)
        if not parallel:
            samples = Predictive(self.model, num_samples=num_samples)(x)
        else:
            num_data = x.shape[0]
            per_pass = max(1, max_rows // max(num_data, 1))
            chunks: dict[str, list[Tensor]] = {}
            for start in range(0, num_samples, per_pass):
                copies = min(per_pass, num_samples - start)
                stacked = Predictive(self.model, num_samples=1)(x.repeat(copies, 1))
                for name, value in stacked.items():
                    value = value.reshape(copies, num_data, *value.shape[2:])
                    chunks.setdefault(name, []).append(value)
            samples = {name: torch.cat(values) for name, values in chunks.items()}
        if "logits" in samples:
            samples["probs"] = samples["logits"].softmax(-1)
        return samples

    def extra_repr(self) -> str:
        return f"likelihood={self.likelihood!r}, penalty={self.penalty}"
