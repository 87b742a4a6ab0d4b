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
is ``y ~ N(F^L, (sigma^L)^2)`` (``head="gaussian"``: the last layer's noise is the observation
noise, so ``X^L = y``) or ``y ~ Categorical(logits = X^L W + b)`` (``head="softmax"``).

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
``layer{l}.targets``       latent      ``U^l`` (``z^l = L^-1 U^l`` with ``whiten=True``),
                                       ``[N_l | 1, R]``; units are an *event* dimension
``data``                   plate       the samples (dim ``-1``), scaled by ``num_data / B``
``layer{l}.response``      latent      ``F^l``, event ``[N_l]``
``layer{l}.output``        latent      ``X^l = F^l + noise``, event ``[N_l]`` (all but the last
                                       layer of a gaussian head)
``obs``                    observed    ``y``: ``[B, N_L]`` (gaussian) or ``[B]`` labels (softmax)
=========================  ==========  ========================================================

The unit dimension is an event dimension (not a plate) so that ``share="layer"`` (one function,
``[1, R]``) and per-unit functions have the same site structure; ``max_plate_nesting`` is 1.
Vectorised particles (``Trace_ELBO(vectorize_particles=True, max_plate_nesting=1)``) broadcast
through (a particle batch of targets is ``[P, 1, N, R]``).

**Parameters.** ``W``, ``lambda``, ``sigma`` (and a softmax readout ``W^{L+1}``, ``b``) are
point estimates, as in the paper; ``mu_hat``, ``Sigma_hat`` are the variational parameters. All
are ``PyroModule`` parameters registered with Pyro's param store when ``model``, ``guide`` or the
closed-form methods run, so :class:`~pyro.infer.SVI` finds them. As for every ``PyroModule``,
they live in Pyro's *global* param store under their attribute names (``layers.0.weight``, ...):
call ``pyro.clear_param_store()`` before building a second network in the same process, or work
under ``pyro.settings.context(module_local_params=True)`` (then optimise ``vgpn.parameters()``
with a torch optimiser).

Cost per particle: ``O(B sum_l (M_l N_l + N_l R^2) + sum_l N_l R^3)`` for ``model`` and the same
for ``guide``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import Predictive
from pyro.nn import PyroModule, pyro_method
from torch import Tensor, nn

from .._validation import check_finite, check_ndim, check_shape, check_tensor
from ..layers.variational import VariationalGPNLayer
from ..losses import gaussian_expected_nll, unscented_cross_entropy
from ..moments.gaussian import Moments
from ..moments.propagate import Mode
from ..network import check_sizes

__all__ = ["HEADS", "MODES", "VariationalGPN"]

HEADS = ("gaussian", "softmax")
#: propagation modes of the closed-form objective ("mean" drops the variances: not a bound)
MODES = ("meanvar", "cov")


class VariationalGPN(PyroModule):
    """A feed-forward network of variational GPN layers with Pyro ``model`` and ``guide``.

    Args:
        sizes: widths ``[M, N_1, ..., N_L]`` (``head="gaussian"``; the last GPN layer is the
            output) or ``[M, N_1, ..., N_L, C]`` (``head="softmax"``, ``C`` classes).
        head: ``"gaussian"`` (regression, observation noise ``sigma^L``) or ``"softmax"``.
        q_cov: ``"full"`` or ``"diag"`` covariance of ``q(U_n)``.
        whiten: parametrise ``q`` in whitened coordinates ``z = L^-1 U``.
        mode: what the closed-form objective and :meth:`predictive_moments` propagate between
            layers: ``"meanvar"`` (``eq:gpn_vi_marginal_sigma_fl``) or ``"cov"`` (with
            ``eq:gpn_vi_marginal_sigma2_fl``).
        num_data: total number of training samples ``S`` when ``x`` is a mini-batch of ``B``;
            the likelihood is scaled by ``S / B``. ``None``: ``x`` is the whole data set.
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

    def __init__(
        self,
        sizes: Sequence[int],
        head: str = "gaussian",
        q_cov: str = "full",
        whiten: bool = False,
        mode: Mode = "meanvar",
        num_data: int | None = None,
        unscented_kappa: float | None = None,
        **layer_kwargs,
    ) -> None:
        super().__init__()
        sizes = list(sizes)
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        check_sizes(sizes, head)
        if num_data is not None and (not isinstance(num_data, int) or num_data < 1):
            raise ValueError(f"num_data must be a positive integer or None, got {num_data!r}")
        self.sizes = sizes
        self.head = head
        self.mode = mode
        self.num_data = num_data
        self.unscented_kappa = unscented_kappa
        gpn_sizes = sizes[:-1] if head == "softmax" else sizes
        self.layers = PyroModule[nn.ModuleList](
            VariationalGPNLayer(m, n, q_cov=q_cov, whiten=whiten, **layer_kwargs)
            for m, n in zip(gpn_sizes[:-1], gpn_sizes[1:], strict=True)
        )
        if head == "softmax":
            weight = self.layers[0].weight
            self.readout = PyroModule[nn.Linear](
                sizes[-2], sizes[-1], dtype=weight.dtype, device=weight.device
            )
            nn.init.xavier_uniform_(self.readout.weight)
            nn.init.zeros_(self.readout.bias)
        else:
            self.readout = None

    # ------------------------------------------------------------------ helpers
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def _check_inputs(self, x: Tensor, y: Tensor | None) -> None:
        check_tensor("x", x)
        check_ndim("x", x, 2)
        check_shape("x", x, (None, self.sizes[0]))
        check_finite("x", x)
        if y is None:  # prediction: num_data only scales the likelihood of observed targets
            return
        if self.num_data is not None and x.shape[0] > self.num_data:
            raise ValueError(f"x has {x.shape[0]} samples, more than num_data={self.num_data}")
        if self.head == "gaussian":
            check_tensor("y", y)
            check_shape("y", y, (x.shape[0], self.sizes[-1]))
            check_finite("y", y)
        else:
            if not isinstance(y, Tensor) or y.is_floating_point() or y.is_complex():
                raise ValueError("y must be an integer tensor of class labels")
            check_shape("y", y, (x.shape[0],))

    def _data_plate(self, batch: int, device: torch.device) -> pyro.plate:
        size = batch if self.num_data is None else self.num_data
        return pyro.plate("data", size, subsample=torch.arange(batch, device=device), dim=-1)

    def _local(self, x: Tensor, targets: list[Tensor]) -> Tensor:
        """Sample the local variables given the targets, inside the data plate.

        Returns ``F^L`` (gaussian head) or the logits ``X^L W + b`` (softmax head), ``[..., B, *]``.
        """
        out = x
        last = self.num_layers - 1
        for l, (layer, u) in enumerate(zip(self.layers, targets, strict=True)):
            mean, var = layer.target_conditional(out @ layer.weight, u)
            floor = torch.finfo(var.dtype).eps  # keeps the Normal's scale positive
            response = pyro.sample(
                f"layer{l}.response", dist.Normal(mean, (var + floor).sqrt()).to_event(1)
            )
            if l == last and self.head == "gaussian":
                return response
            out = pyro.sample(
                f"layer{l}.output", dist.Normal(response, layer.noise_std).to_event(1)
            )
        return self.readout(out)

    # ------------------------------------------------------------------ model and guide
    @pyro_method
    def model(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """The generative model ``eq:gpn_vi_joint`` (sites in the module docstring).

        Args:
            x: ``[B, M]`` inputs (a mini-batch of ``num_data`` when given).
            y: ``[B, N_L]`` targets (gaussian head), ``[B]`` class labels (softmax head), or
                ``None`` to sample them.

        Returns:
            The sampled or observed ``y``.
        """
        self._check_inputs(x, y)
        targets = [
            pyro.sample(f"layer{l}.targets", layer.target_prior().to_event(1))
            for l, layer in enumerate(self.layers)
        ]
        with self._data_plate(x.shape[0], x.device):
            out = self._local(x, targets)
            if self.head == "gaussian":
                likelihood = dist.Normal(out, self.layers[-1].noise_std).to_event(1)
            else:
                likelihood = dist.Categorical(logits=out)
            return pyro.sample("obs", likelihood, obs=y)

    @pyro_method
    def guide(self, x: Tensor, y: Tensor | None = None) -> list[Tensor]:
        """The paper's ``Q`` (``eq:gpn_vi_stochastic_q``): ``q(U)`` times the model's own
        conditionals of the local variables. Returns the sampled targets."""
        self._check_inputs(x, y)
        targets = [
            pyro.sample(f"layer{l}.targets", layer.target_posterior().to_event(1))
            for l, layer in enumerate(self.layers)
        ]
        with self._data_plate(x.shape[0], x.device):
            self._local(x, targets)
        return targets

    # ------------------------------------------------------------------ closed form
    @pyro_method
    def kl_divergence(self) -> Tensor:
        """``L_reg``: the sum over layers and units of ``KL(q(U) || p(U))``
        (``eq:gpn_vi_sampling_la``), a scalar."""
        return sum(layer.kl_divergence() for layer in self.layers)

    @pyro_method
    def hidden_moments(self, x: Tensor) -> Moments:
        """Moments under ``Q`` of what the likelihood consumes, by propagation
        (``eq:gpn_vi_a``, ``eq:gpn_vi_mu``, ``eq:gpn_vi_marginal_sigma_fl``,
        ``eq:gpn_vi_marginal_sigma2_fl``): ``F^L`` (gaussian head, noise-free) or ``X^L``
        (softmax head). Exact for one layer with observed inputs; with more layers the
        activations are treated as Gaussian (``eq:gpn_vi_qal``)."""
        self._check_inputs(x, None)
        moments: Moments | Tensor = x
        last = self.num_layers - 1
        for l, layer in enumerate(self.layers):
            noise = not (l == last and self.head == "gaussian")
            moments = layer.propagate(moments, self.mode, noise=noise)
        return moments

    @pyro_method
    def expected_log_likelihood(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-sample ``E_Q[log p(y_s | X^L_s)]`` in closed form, ``[B]`` (unscaled).

        Gaussian head: ``-gaussian_expected_nll`` of the moments of ``F^L``
        (``eq:gpn_lpred_marginal_final``, with the ``log 2 pi`` constant); softmax head: the
        unscented transform of the expected log-softmax (``eq:gpn_normal_unscented``).
        """
        self._check_inputs(x, y)
        features = self.hidden_moments(x)
        if self.head == "gaussian":
            nll = gaussian_expected_nll(features, y, self.layers[-1].noise_std, reduction="none")
        else:
            nll = unscented_cross_entropy(
                features,
                y,
                self.readout.weight.mT,
                self.readout.bias,
                kappa=self.unscented_kappa,
                reduction="none",
            )
        return -nll

    @pyro_method
    def predictive_moments(self, x: Tensor) -> Moments:
        """Deterministic predictive moments by propagation: of ``X^L = F^L + noise``
        (gaussian head) or of the logits (softmax head, a full covariance)."""
        features = self.hidden_moments(x)
        if self.head == "softmax":
            return features.linear_full(self.readout.weight.mT, self.readout.bias)
        noise_var = self.layers[-1].noise_std.square().expand(features.num_features)
        if features.cov is not None:
            return Moments(features.mean, cov=features.cov + torch.diag(noise_var), validate=False)
        return Moments(features.mean, var=features.variance + noise_var, validate=False)

    def predict(
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
        return (
            f"sizes={self.sizes}, head={self.head!r}, mode={self.mode!r}, num_data={self.num_data}"
        )
