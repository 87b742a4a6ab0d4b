"""The GPN network: layers and a head, the one network every route uses.

Paper, sections "Central Limit Activations" to "Evaluating the Loss".

A feed-forward stack of GPN layers (:mod:`pyro_gpn.layers`) under a head
(:mod:`pyro_gpn.heads`). It propagates the mean and the variance (or full covariance) of every
sample's activations from layer to layer in closed form, treating each layer's activations as
Gaussian (the central-limit approximation), and hands the result to the head:

* ``head="gaussian"`` (:class:`~pyro_gpn.heads.GaussianHead`, regression): the last GPN layer is
  the output; its response ``F^L`` is noise-free and the head's ``sigma`` is the observation
  noise; the objective is the expected Gaussian negative log-likelihood
  ``eq:gpn_reg_loss_marginal_final``;
* ``head="softmax"`` (:class:`~pyro_gpn.heads.SoftmaxHead`, classification): a final linear map
  ``A^{L+1} = X^L W^{L+1}`` to class logits and the expected softmax cross-entropy by the
  unscented transform (``eq:gpn_normal_unscented``). The paper's "16x30x15x26" is
  ``GPNNet([16, 30, 15, 26])``: GPN layers of 30 and 15 units, then 26 logits.

The same network serves every route: the central-limit objective (:meth:`GPNNet.loss`), the
variational one (layers with a ``q(U)`` response and :meth:`GPNNet.kl_divergence`, the sum of
the layers' KL terms; :class:`~pyro_gpn.models.VariationalGPN`) and the sampled parametric one
(:class:`~pyro_gpn.models.ParametricGPN` takes a network).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ._validation import (
    EMPTY_BATCH_HINT,
    as_input,
    check_device,
    check_inputs,
    check_ndim,
    check_nonnegative,
    check_not_empty,
    check_parameters_finite,
    check_shape,
    check_tensor,
)
from .heads import HEADS, Head, Prediction, check_sizes, make_head
from .layers import GPNLayer, GPNLayerBase
from .losses import target_variance_penalty
from .moments.gaussian import Moments
from .moments.propagate import MODES, Mode
from .pyro_module import GPNModule
from .recommended import GPN

__all__ = ["GPNNet", "HEADS", "check_sizes", "input_moments"]


def input_moments(x: Tensor, x_var: Tensor | None = None, like: Tensor | None = None) -> Moments:
    """Validate network inputs ``x [S, M]`` with optional uncertainty and wrap them.

    ``x_var`` is ``[S, M]`` (independent input variances) or ``[S, M, M]`` (covariances). With
    ``like`` (a parameter of the network) both follow the dtype and device rule of
    :mod:`pyro_gpn._validation`: floating tensors or NumPy arrays are cast to ``like.dtype``
    and must be on ``like.device``. Inputs beyond ``|x| > 100`` draw an
    :class:`~pyro_gpn._validation.UnscaledInputWarning`.
    """
    where = "the network's parameters are"
    if like is not None:
        x = as_input("x", x, like, where)
    check_tensor("x", x)
    check_ndim("x", x, 2)
    check_inputs("x", x)
    if x_var is None:
        return Moments(x, validate=False)
    x_var = as_input("x_var", x_var, x, "x is")
    if x_var.dim() == 3:
        return Moments(x, cov=x_var)
    check_shape("x_var", x_var, tuple(x.shape))
    check_nonnegative("x_var", x_var)
    return Moments(x, var=x_var, validate=False)


class GPNNet(GPNModule):
    """A stack of GPN layers under a head, with the deterministic closed-form objective.

    Args:
        sizes: layer widths ``[M, N_1, ..., N_L]`` for a Gaussian head (the last GPN layer is
            the output) or ``[M, N_1, ..., N_L, C]`` for a softmax head (``C`` classes).
        mode: ``"mean"``, ``"meanvar"`` or ``"cov"``: what is propagated between layers.
        head: ``"gaussian"``, ``"softmax"`` or a :class:`~pyro_gpn.heads.Head` that fits
            ``sizes``.
        unscented_kappa: the unscented transform's ``kappa`` of a softmax head built from its
            name (``None``: the default of :func:`pyro_gpn.losses.unscented_cross_entropy`).
        layer: the layer class (:class:`~pyro_gpn.layers.GPNLayer`, or
            :class:`~pyro_gpn.layers.VariationalGPNLayer` for the variational route).
        **layer_kwargs: passed to every layer (``num_inducing``, ``share``, ``targets_init``,
            ``learn_inducing``, ``lengthscale_init``, ...); ``noise_std_init`` and ``share``
            also set a Gaussian head's noise. ``targets_init`` of
            :class:`~pyro_gpn.layers.GPNLayer` defaults to the recommendation
            :data:`pyro_gpn.recommended.GPN` (``"identity"``).

    Inputs ``x`` (and ``x_var``, floating targets ``y``) may be tensors or NumPy arrays in any
    floating dtype: they are cast to the parameters' dtype (``dtype=``, float32 by default) and
    must be on the parameters' device (the rule in :mod:`pyro_gpn._validation`).

    Example:
        >>> net = GPNNet([4, 10, 3], mode="meanvar", head="softmax")
        >>> logits = net(torch.rand(5, 4))
        >>> logits.mean.shape, logits.cov.shape
        (torch.Size([5, 3]), torch.Size([5, 3, 3]))
        >>> net.predict(torch.rand(5, 4)).probs.shape
        torch.Size([5, 3])
    """

    #: the propagation modes this network accepts
    modes: tuple[str, ...] = MODES
    #: the container of the layers: a plain ``nn.ModuleList`` keeps the layers' parameters out
    #: of Pyro's global param store unless a Pyro model registers them (``pyro.module``);
    #: ``PyroModule[nn.ModuleList]`` gives them ``PyroModule`` names (the variational GPN)
    layer_container: type[nn.Module] = nn.ModuleList

    def __init__(
        self,
        sizes: Sequence[int],
        mode: Mode = "meanvar",
        head: str | Head = "softmax",
        unscented_kappa: float | None = None,
        layer: type[GPNLayerBase] = GPNLayer,
        **layer_kwargs,
    ) -> None:
        super().__init__()
        if isinstance(head, str) and head not in HEADS:
            raise ValueError(f"head must be one of {tuple(HEADS)} or a Head, got {head!r}")
        if mode not in self.modes:
            raise ValueError(f"mode must be one of {self.modes}, got {mode!r}")
        if not isinstance(head, (str, Head)):
            raise TypeError(f"head must be a name or a Head, got {type(head).__name__}")
        self.sizes = sizes = check_sizes(sizes, head)
        self.mode = mode
        if layer is GPNLayer:
            layer_kwargs.setdefault("targets_init", GPN.targets_init)
        kind = HEADS[head] if isinstance(head, str) else head
        widths = kind.feature_sizes(sizes)
        pairs = list(zip(widths[:-1], widths[1:], strict=True))
        self.layers = self.layer_container(
            layer(
                m,
                n,
                output_noise=(i < len(pairs) - 1 or kind.noisy_features),
                **self._layer_options(i, len(pairs), layer_kwargs),
            )
            for i, (m, n) in enumerate(pairs)
        )
        weight = self.layers[0].weight
        self.head = make_head(
            head,
            sizes,
            noise_std_init=layer_kwargs.get("noise_std_init", 0.1),
            shared_noise=layer_kwargs.get("share", "none") == "layer",
            unscented_kappa=unscented_kappa,
            dtype=weight.dtype,
            device=weight.device,
        )
        self._register_load_state_dict_pre_hook(self._upgrade_state_dict)

    @staticmethod
    def _layer_options(index: int, num_layers: int, layer_kwargs: dict) -> dict:
        """The keywords of layer ``index`` (0-based, of ``num_layers``) from the network's
        ``layer_kwargs``: the same for every layer here; a subclass may resolve per-layer
        options (:class:`~pyro_gpn.models.VariationalGPN`'s ``weights``)."""
        return layer_kwargs

    def _upgrade_state_dict(self, state_dict: dict, prefix: str, *args) -> None:
        """Load v0.1 state dicts: the readout was a ``torch.nn.Linear`` (``weight [C, N]``) and
        the observation noise the last layer's."""
        moves = {
            "readout.weight": ("weight", lambda w: w.mT.contiguous()),
            "readout.bias": ("bias", None),
            f"layers.{self.num_layers - 1}.noise_std_unconstrained": (
                "noise_std_unconstrained",
                None,
            ),
        }
        head = self.head.state_dict()
        for old, (new, convert) in moves.items():
            if (
                prefix + old in state_dict
                and new in head
                and prefix + "head." + new not in state_dict
            ):
                value = state_dict.pop(prefix + old)
                state_dict[f"{prefix}head.{new}"] = value if convert is None else convert(value)

    # ------------------------------------------------------------------ properties
    @property
    def num_layers(self) -> int:
        """``L``, the number of GPN layers."""
        return len(self.layers)

    @property
    def num_classes(self) -> int | None:
        """``C`` of a classification head, else ``None``."""
        return getattr(self.head, "num_classes", None)

    @property
    def noise_std(self) -> Tensor:
        """Observation noise std of the head (``[N_L | 1]``; Gaussian head)."""
        if not hasattr(self.head, "noise_std"):
            raise AttributeError("noise_std is the observation noise of a gaussian head")
        return self.head.noise_std

    @property
    def readout(self) -> _LegacyReadout:
        """Deprecated: the readout lives in the head (``net.head.weight [N_L, C]``); this is a
        ``torch.nn.Linear``-like view of it (``weight [C, N_L]``)."""
        warnings.warn(
            "GPNNet.readout is deprecated: use net.head (weight [N_L, C], bias, readout())",
            DeprecationWarning,
            stacklevel=2,
        )
        return _LegacyReadout(self.head)

    # ------------------------------------------------------------------ evaluation
    def hidden(self, x: Tensor, x_var: Tensor | None = None) -> Moments:
        """What the head consumes: moments of the last GPN layer's outputs (with output noise
        if the head takes noisy features, else of the noise-free responses ``F^L``).

        Args:
            x: ``[S, M]`` inputs.
            x_var: optional input variances ``[S, M]`` or covariances ``[S, M, M]``; ignored in
                ``"mean"`` mode, which treats every variance as zero.

        Shape:
            ``x [S, M]`` -> :class:`Moments` ``[S, N_L]``.
        """
        moments = input_moments(x, x_var, like=self.layers[0].weight)
        if moments.num_features != self.sizes[0]:
            raise ValueError(f"x must have {self.sizes[0]} features, got {moments.num_features}")
        check_parameters_finite(self, "the network")
        for layer in self.layers:
            moments = layer._propagate(moments, self.mode)
        return moments

    def forward(self, x: Tensor, x_var: Tensor | None = None) -> Moments:
        """The posterior predictive :class:`Moments`: outputs ``X^L`` (Gaussian head) or logits
        (softmax head; a full covariance unless ``mode="mean"``).

        Shape:
            ``x [S, M]`` -> :class:`Moments` ``[S, D]`` (``D = N_L`` or ``C``).
        """
        return self.head.predictive(self.hidden(x, x_var))

    def expected_nll(self, x: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
        """The head's expected negative log-likelihood of ``y`` under the propagated features.

        Shape:
            ``x [S, M]``, ``y [S, N_L]`` (Gaussian) or ``[S]`` labels (softmax) -> a scalar, or
            ``[S]`` with ``reduction="none"``.
        """
        y = self._target(y)
        check_not_empty("x", x, reduction, hint=EMPTY_BATCH_HINT)
        return self.head.expected_nll(self.hidden(x), y, reduction=reduction)

    def log_predictive(self, x: Tensor, y: Tensor, calibrated: bool = True) -> Tensor:
        """Per-sample log density of ``y`` under the closed-form predictive (the head's
        :meth:`~pyro_gpn.heads.Head.log_predictive`: the moment-matched Gaussian of a Gaussian
        head, the Gauss-Hermite mixture of a heteroscedastic one, the averaged softmax),
        differentiable: the test log-likelihood, and (``calibrated=False``: without the head's
        predictive scale) the data term of :func:`~pyro_gpn.inference.predictive_log_likelihood`.

        Shape:
            ``x [S, M]``, ``y [S, N_L]`` (Gaussian) or ``[S]`` labels (softmax) -> ``[S]``.
        """
        y = self._target(y)
        self.head.check_target(y, _num_rows(x))
        return self.head.log_predictive(self.hidden(x), y, calibrated=calibrated)

    def _target(self, y: Tensor) -> Tensor:
        """Targets at the boundary (:func:`as_target`)."""
        return as_target(y, self.layers[0].weight)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The paper's deterministic training objective, averaged over the samples.

        Gaussian head: expected negative log-likelihood (``eq:gpn_reg_loss_marginal_final``)
        of targets ``y [S, N_L]``. Softmax head: unscented expected cross-entropy
        (``eq:gpn_normal_unscented``) of labels ``y [S]``. Add :meth:`penalty` for maximum
        likelihood training (``eq:gpn_ls``).
        """
        return self.expected_nll(x, y)

    def kl_divergence(self) -> Tensor:
        """The sum of the layers' ``KL(q(U) || p(U))`` (zero for point-estimated targets), as a
        deep GP's KL is the sum of its layers'."""
        return sum(layer.kl_divergence() for layer in self.layers)

    def penalty(self, alpha: float = 0.1, beta: float = 1e-3) -> Tensor:
        """The target-variance penalty ``eq:gpn_ls`` summed over the layers that have
        penalised variances (zero if none)."""
        variances = [layer.response.penalised_variances() for layer in self.layers]
        variances = [v for v in variances if v is not None]
        if not variances:
            return self.layers[0].weight.new_zeros(())
        return target_variance_penalty(variances, alpha=alpha, beta=beta)

    @torch.no_grad()
    def predict(self, x: Tensor, x_var: Tensor | None = None) -> Prediction:
        """Predictions without gradients: mean and std (regression) or class probabilities and
        their std under the features' Gaussian (classification), a
        :class:`~pyro_gpn.heads.Prediction`.

        Shape:
            ``x [S, M]`` -> ``mean``, ``std`` ``[S, D]`` (``D = N_L`` or ``C``).
        """
        return self.head.predict(self.hidden(x, x_var))

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}, mode={self.mode!r}"


def as_target(y: object, like: Tensor) -> object:
    """Targets at a network's boundary: NumPy arrays become tensors, floating targets take
    ``like``'s dtype (integer labels stay integers); a tensor on another device than ``like``
    raises ``ValueError`` naming ``y``. Anything else is returned for the head to refuse."""
    if isinstance(y, np.ndarray):
        y = torch.from_numpy(np.ascontiguousarray(y))
    if isinstance(y, Tensor):
        check_device("y", y, like.device, "the network's parameters are")
        if y.is_floating_point() and y.dtype != like.dtype:
            y = y.to(like.dtype)
    return y


def _num_rows(x: object) -> int | None:
    shape = getattr(x, "shape", None)
    return None if not shape else int(shape[0])


class _LegacyReadout:
    """What ``GPNNet.readout`` was, a ``torch.nn.Linear`` (``weight [C, N]``), as a view."""

    def __init__(self, head: Head) -> None:
        self.weight, self.bias, self._head = head.weight.mT, head.bias, head

    def __call__(self, features: Tensor) -> Tensor:
        return self._head.readout(features)
