r"""The variational GPN (paper, section "Approximate Bayesian Inference", route 4).

**Model** (``eq:gpn_vi_joint``, ``fig:gpn_vi_distrs`` a). For layers ``l = 0 .. L-1`` (the
paper's ``1 .. L``) with :class:`~pyro_gpn.layers.variational.VariationalGPNLayer` ``layers[l]``:

.. math::

    U^l_{\star n} \sim \mathcal{N}(0, K^l_n), \qquad
    A^l = X^{l-1} W^l, \qquad
    F^l_{sn} \mid A^l, U^l \sim \mathcal{N}\big(\alpha^T K^{-1} U_{\star n},\;
        1 - \alpha^T K^{-1} \alpha\big), \qquad
    X^l_{sn} \mid F^l_{sn} \sim \mathcal{N}\big(F^l_{sn}, \sigma_n^2\big),

with ``alpha_r = k(A^l_{sn}, V_{rn})``. The response is sampled sample by sample (diagonal over
samples): the ELBO is a sum over samples of expectations of ``log p(y_s | X^L_s)``, and each
sample's ``X^L_s`` depends on the others only through the shared ``U`` (the same argument as
``eq:gpn_parametrized_loss``), so the joint over samples given ``U`` factorises. The observation
is the head's (:mod:`pyro_gpn.heads`): ``y ~ N(F^L, sigma^2)`` (``head="gaussian"``: the head's
noise is the observation noise, so ``X^L = y``) or ``y ~ Categorical(logits = X^L W + b)``
(``head="softmax"``).

**Guide** (``eq:gpn_vi_stochastic_q``, ``fig:gpn_vi_distrs`` b): ``q(U^l_n) = N(mu_hat, Sigma_hat)``
per unit, and *every other variable keeps the model's own conditional*
``p(A | X) p(F | A, U) p(X | F)``. Pyro needs every latent site of the model in the guide, so
the guide draws ``F^l`` and ``X^l`` from those same conditionals (:meth:`VariationalGPN._local`
runs in both): in :class:`~pyro.infer.Trace_ELBO` their log densities in model and guide are
the same function of the same values and cancel exactly, and a particle's estimate is

.. math::

    \log p(U) - \log q(U) + \tfrac{S_{\rm data}}{B} \sum_{s \in \text{batch}}
        \log p(y_s \mid X^L_s),

an unbiased estimate of the paper's ``L = -L_reg + L_pred`` (``eq:gpn_vi_sampling_l``,
``eq:gpn_vi_l``). The cost of this literal construction is a second forward pass (in the guide);
:class:`pyro_gpn.inference.closed_form.ClosedFormELBO` evaluates the same objective in closed
form by moment propagation instead.

**Sites.** For layer ``l`` (0-based, ``layers[l]``):

=========================  ==========  ========================================================
site                       kind        value
=========================  ==========  ========================================================
``layer{l}.weight``        latent      ``W^l [M_l, N_l]`` (event), prior ``N(0, s_l^2)``, guide
                                       ``q(W^l)`` mean-field (``weights="variational"``, the
                                       default; absent where the layer's ``weights`` is
                                       ``"point"``)
``layer{l}.targets``       latent      ``U^l`` (``z^l = L^-1 U^l`` with ``whiten=True``),
                                       ``[N_l | 1, R]``; units are an *event* dimension
``data``                   plate       the samples (dim ``-1``), scaled by ``num_data / B``
                                       (:mod:`pyro_gpn.models._contract`)
``layer{l}.response``      latent      ``F^l``, event ``[N_l]``
``layer{l}.output``        latent      ``X^l = F^l + noise``, event ``[N_l]`` (all but the last
                                       layer of a gaussian head)
``logits``                 determin.   ``X^L W + b`` (softmax head)
``obs``                    observed    ``y``: ``[B, N_L]`` (gaussian) or ``[B]`` labels (softmax)
=========================  ==========  ========================================================

The unit dimension is an event dimension (not a plate) so that ``share="layer"`` (one function,
``[1, R]``) and per-unit functions have the same site structure; ``max_plate_nesting`` is 1.
Vectorised particles (``Trace_ELBO(vectorize_particles=True, max_plate_nesting=1)``) broadcast
through (a particle batch of targets is ``[P, 1, N, R]``).

**The network.** :class:`VariationalGPN` *is* a :class:`~pyro_gpn.GPNNet` whose layers have the
response :class:`~pyro_gpn.layers.variational.VariationalTargets`: its ``forward`` is the
predictive moments under ``Q``, :meth:`~pyro_gpn.GPNNet.kl_divergence` the sum of the layers' KL
terms (as in a deep GP) and the closed-form ELBO
(:class:`~pyro_gpn.inference.closed_form.ClosedFormELBO`) the network's expected
log-likelihood minus that KL. This module adds the Pyro ``model`` and ``guide``.

**Parameters.** ``lambda``, ``sigma`` (and a softmax readout ``W^{L+1}``, ``b``) are point
estimates, as in the paper; ``mu_hat``, ``Sigma_hat`` are the variational parameters of ``U``.
The projections ``W`` are latent with a mean-field ``q(W)`` (``weight``, ``weight_scale``) by
default (``weights="variational"``, :class:`~pyro_gpn.layers.VariationalGPNLayer`: the point
estimate of the paper overfits, ``docs/results/uci.md``); ``weights="point"`` keeps them point
estimates. All
are ``PyroModule`` parameters registered with Pyro's param store when ``model``, ``guide`` or the
closed-form methods run, so :class:`~pyro.infer.SVI` finds them. As for every ``PyroModule``,
they live in Pyro's *global* param store under their attribute names (``layers.0.weight``, ...;
the head's as ``head$$$noise_std_unconstrained``, a ``pyro.module``); unlike a plain
``PyroModule``, the network always computes with its own tensors, even when another network
with the same names registered its own since (:class:`~pyro_gpn.pyro_module.GPNModule`). Load
parameters with ``load_state_dict``, not through the param store. Under
``pyro.settings.context(module_local_params=True)`` nothing enters the global store (then
optimise ``vgpn.parameters()`` with a torch optimiser).

Cost per particle: ``O(B sum_l (M_l N_l + N_l R^2) + sum_l N_l R^3)`` for ``model`` and the same
for ``guide``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import Predictive
from pyro.nn import PyroModule, pyro_method
from torch import Tensor, nn

from ..heads import HEADS, Head, Prediction
from ..layers.variational import WEIGHT_TREATMENTS, VariationalGPNLayer, check_whiten
from ..moments.gaussian import Moments
from ..moments.propagate import Mode
from ..network import GPNNet
from ..recommended import VGPN
from ._contract import check_batch, check_num_data, data_plate

__all__ = ["ELBO_MODES", "HEADS", "VariationalGPN"]

#: propagation modes of the closed-form objective ("mean" drops the variances: not a bound)
ELBO_MODES = ("meanvar", "cov")


def __getattr__(name: str):
    if name == "MODES":
        warnings.warn("MODES is deprecated, use ELBO_MODES", DeprecationWarning, stacklevel=2)
        return ELBO_MODES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class VariationalGPN(GPNNet):
    """A :class:`~pyro_gpn.GPNNet` of variational GPN layers with Pyro ``model`` and ``guide``.

    Args:
        sizes: widths ``[M, N_1, ..., N_L]`` (``head="gaussian"``; the last GPN layer is the
            output) or ``[M, N_1, ..., N_L, C]`` (``head="softmax"``, ``C`` classes).
        head: ``"gaussian"`` (regression, observation noise ``sigma``), ``"softmax"`` or a
            :class:`~pyro_gpn.heads.Head`.
        q_cov: ``"full"`` or ``"diag"`` covariance of ``q(U_n)``.
        whiten: parametrise ``q`` in whitened coordinates ``z = L^-1 U`` (default: the
            recommendation, :data:`pyro_gpn.recommended.VGPN`).
        weights: ``"variational"`` (``q(W)`` with a prior; default) or ``"point"``
            (:class:`~pyro_gpn.layers.VariationalGPNLayer`) for every layer, or a sequence
            with one of them per GPN layer, ``[L]`` (bottom first; a heteroscedastic head's
            layers are ``M -> N_1 -> 2 D``): e.g. ``("variational", "point")`` keeps ``q(W)``
            in the first layer only, where inputs far from the training rows become
            activations, and point-estimates the weights above it (``docs/results/uci.md``
            section 13). Only layers with ``q(W)`` have a ``layer{l}.weight`` site.
        mode: what the closed-form objective and ``forward`` propagate between layers:
            ``"meanvar"`` (``eq:gpn_vi_marginal_sigma_fl``) or ``"cov"`` (with
            ``eq:gpn_vi_marginal_sigma2_fl``).
        num_data: total number of training samples ``S`` when ``x`` is a mini-batch of ``B``;
            the likelihood is scaled by ``S / B``. ``None``: ``x`` is the whole data set. A
            ``num_data`` passed to :meth:`model` / :meth:`guide` takes precedence.
        unscented_kappa: ``kappa`` of the unscented transform (softmax head, closed form);
            ``None`` is the default of :func:`pyro_gpn.losses.unscented_cross_entropy`.
        **layer_kwargs: passed to every
            :class:`~pyro_gpn.layers.variational.VariationalGPNLayer` (``num_inducing``,
            ``share``, ``targets_init``, ``targets_scale_init``, ``jitter``, ``dtype``, ...).

    Example:
        >>> vgpn = VariationalGPN([1, 1], head="gaussian")
        >>> svi = pyro.infer.SVI(vgpn.model, vgpn.guide, pyro.optim.Adam({"lr": 0.01}),
        ...                      pyro.infer.Trace_ELBO())
    """

    modes = ELBO_MODES
    layer_container = PyroModule[nn.ModuleList]

    def __init__(
        self,
        sizes: Sequence[int],
        head: str | Head = "gaussian",
        q_cov: str = "full",
        whiten: bool | None = None,
        mode: Mode = "meanvar",
        num_data: int | None = None,
        unscented_kappa: float | None = None,
        **layer_kwargs,
    ) -> None:
        num_data = check_num_data(num_data)
        check_whiten(whiten)
        whiten = VGPN.whiten if whiten is None else whiten
        layer_kwargs.setdefault("targets_init", VGPN.targets_init)
        layer_kwargs.setdefault("weights", VGPN.weights)
        super().__init__(
            sizes,
            mode=mode,
            head=head,
            unscented_kappa=unscented_kappa,
            layer=VariationalGPNLayer,
            q_cov=q_cov,
            whiten=whiten,
            **layer_kwargs,
        )
        self.num_data = num_data

    @staticmethod
    def _layer_options(index: int, num_layers: int, layer_kwargs: dict) -> dict:
        """Resolve a per-layer ``weights`` sequence to layer ``index``'s entry.

        Raises:
            ValueError: ``weights`` is a sequence whose length is not the number of GPN layers,
                or with an entry other than ``"variational"`` / ``"point"``.
        """
        weights = layer_kwargs.get("weights")
        if isinstance(weights, str) or weights is None:
            return layer_kwargs
        if not isinstance(weights, Sequence) or len(weights) != num_layers:
            raise ValueError(
                f"weights must be one of {WEIGHT_TREATMENTS} or a sequence of them with one "
                f"entry per GPN layer ({num_layers}), got {weights!r}"
            )
        bad = [w for w in weights if w not in WEIGHT_TREATMENTS]
        if bad:
            raise ValueError(f"weights entries must be one of {WEIGHT_TREATMENTS}, got {bad!r}")
        return {**layer_kwargs, "weights": weights[index]}

    # ------------------------------------------------------------------ the network's methods,
    # as pyro_methods, so that every parameter goes through Pyro's param store
    hidden = pyro_method(GPNNet.hidden)
    kl_divergence = pyro_method(GPNNet.kl_divergence)

    def _weights(self, guide: bool) -> list[Tensor]:
        """Each layer's ``W``: a draw of the site ``layer{l}.weight`` from the prior (model) or
        ``q(W)`` (guide) for variational weights, the point estimate otherwise."""
        out = []
        for l, layer in enumerate(self.layers):
            if layer.variational_weights:
                d = layer.weight_posterior() if guide else layer.weight_prior()
                out.append(pyro.sample(f"layer{l}.weight", d.to_event(2)))
            else:
                out.append(layer.weight)
        return out

    def _local(self, x: Tensor, targets: list[Tensor], weights: list[Tensor]) -> Tensor:
        """Sample the local variables given the targets and weights, inside the data plate.

        Returns a draw of the head's features, ``F^L`` (a head that owns the noise) or ``X^L``,
        ``[..., B, N_L]``.
        """
        out = x
        for l, (layer, u, w) in enumerate(zip(self.layers, targets, weights, strict=True)):
            if w.dim() > 2:  # a particle batch [P, 1, M, N] (the data plate's dimension)
                w = w.squeeze(-3)
            mean, var = layer.target_conditional(out @ w, u)
            floor = torch.finfo(var.dtype).eps  # keeps the Normal's scale positive
            out = pyro.sample(
                f"layer{l}.response", dist.Normal(mean, (var + floor).sqrt()).to_event(1)
            )
            if layer.noise_std is not None:
                out = pyro.sample(f"layer{l}.output", dist.Normal(out, layer.noise_std).to_event(1))
        return out

    # ------------------------------------------------------------------ model and guide
    @pyro_method
    def model(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """The generative model ``eq:gpn_vi_joint`` (sites in the module docstring).

        Args:
            x: ``[B, M]`` inputs (a mini-batch of ``num_data`` when given).
            y: ``[B, N_L]`` targets (gaussian head), ``[B]`` class labels (softmax head), or
                ``None`` to sample them.
            num_data: ``S``, the size of the data set ``x`` is a batch of (default: the
                attribute ``num_data``); the data plate is scaled by ``S / B``.

        Returns:
            The sampled or observed ``y``.
        """
        num_data = self.num_data if num_data is None else num_data
        x, y = check_batch(self.head, self.sizes[0], x, y, num_data)
        weights = self._weights(guide=False)
        targets = [
            pyro.sample(f"layer{l}.targets", layer.target_prior().to_event(1))
            for l, layer in enumerate(self.layers)
        ]
        with data_plate(x.shape[0], num_data, x.device):
            return self.head.observe("obs", self._local(x, targets, weights), y)

    @pyro_method
    def guide(
        self, x: Tensor, y: Tensor | None = None, num_data: int | None = None
    ) -> list[Tensor]:
        """The paper's ``Q`` (``eq:gpn_vi_stochastic_q``): ``q(U)`` times the model's own
        conditionals of the local variables (and ``q(W)`` for variational weights). Returns the
        sampled targets."""
        num_data = self.num_data if num_data is None else num_data
        x, y = check_batch(self.head, self.sizes[0], x, y, num_data)
        weights = self._weights(guide=True)
        targets = [
            pyro.sample(f"layer{l}.targets", layer.target_posterior().to_event(1))
            for l, layer in enumerate(self.layers)
        ]
        with data_plate(x.shape[0], num_data, x.device):
            self._local(x, targets, weights)
        return targets

    # ------------------------------------------------------------------ closed form
    @pyro_method
    def expected_log_likelihood(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-sample ``E_Q[log p(y_s | X^L_s)]`` in closed form, ``[B]`` (unscaled).

        The head's expected log-likelihood of the propagated features
        (``eq:gpn_lpred_marginal_final``, with the ``log 2 pi`` constant; softmax: the
        unscented transform of the expected log-softmax, ``eq:gpn_normal_unscented``).

        Shape:
            ``x [B, M]``, ``y [B, N_L] | [B]`` -> ``[B]``.
        """
        x, y = check_batch(self.head, self.sizes[0], x, y, None)
        return -self.head.expected_nll(self.hidden(x), y, reduction="none")

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The negative ELBO per sample: ``mean_s E_Q[-log p(y_s | .)] + KL / num_data`` (the
        attribute, else the batch size), so that :class:`~pyro_gpn.inference.Trainer` trains
        the variational network too; ``-closed_form_elbo / num_data`` on the same batch."""
        num_data = x.shape[0] if self.num_data is None else self.num_data
        return self.expected_nll(x, y) + self.kl_divergence() / num_data

    def hidden_moments(self, x: Tensor) -> Moments:
        """Deprecated alias of :meth:`hidden`."""
        warnings.warn("hidden_moments is deprecated, use hidden", DeprecationWarning, stacklevel=2)
        return self.hidden(x)

    def predictive_moments(self, x: Tensor) -> Moments:
        """Deprecated alias of ``forward`` (``vgpn(x)``), the predictive moments under ``Q``."""
        warnings.warn(
            "predictive_moments is deprecated, use vgpn(x)", DeprecationWarning, stacklevel=2
        )
        return self(x)

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict(self, x: Tensor, x_var: Tensor | None = None) -> Prediction:
        """Closed-form predictions under ``Q``: mean and std, or class probabilities and
        their std (:class:`~pyro_gpn.heads.Prediction`)."""
        return self.head.predict(self.hidden(x, x_var))

    def sample_predictive(
        self, x: Tensor, num_samples: int = 100, parallel: bool = True
    ) -> dict[str, Tensor]:
        """Monte Carlo posterior predictive by :class:`pyro.infer.Predictive` (no gradients).

        ``parallel`` draws all ``num_samples`` in one vectorised pass (the model broadcasts over
        a particle dimension); ``False`` loops. Returns every site (``layer{l}.targets``,
        ``layer{l}.response``, ``layer{l}.output``, ``obs``), each with a leading
        ``num_samples`` dimension; the targets keep the data plate's singleton dimension,
        ``[num_samples, 1, N | 1, R]``.
        """
        sites = ["obs"]
        for l in range(self.num_layers):
            sites += [f"layer{l}.targets", f"layer{l}.response", f"layer{l}.output"]
            if self.layers[l].variational_weights:
                sites.append(f"layer{l}.weight")
        predictive = Predictive(
            self.model,
            guide=self.guide,
            num_samples=num_samples,
            return_sites=sites,
            parallel=parallel,
        )
        with torch.no_grad():
            return predictive(x)

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}, mode={self.mode!r}, num_data={self.num_data}"
