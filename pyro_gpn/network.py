"""The central-limit GPN network.

Paper, sections "Central Limit Activations" to "Evaluating the Loss".

A feed-forward stack of :class:`~pyro_gpn.layers.GPNLayer` that propagates the mean and the
variance (or full covariance) of every sample's activations from layer to layer in closed form,
treating each layer's activations as Gaussian (the central-limit approximation). The result is a
deterministic, differentiable training objective:

* ``head="gaussian"`` (regression): the last GPN layer is the output; its noise ``sigma^L`` is
  the observation noise and the objective is the expected Gaussian negative log-likelihood
  ``eq:gpn_reg_loss_marginal_final``;
* ``head="softmax"`` (classification): a final linear map ``A^{L+1} = X^L W^{L+1}`` to class
  logits and the expected softmax cross-entropy by the unscented transform
  (``eq:gpn_normal_unscented``). The paper's "16x30x15x26" is ``GPNNet([16, 30, 15, 26])``:
  GPN layers of 30 and 15 units, then 26 logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pyro.nn import PyroModule
from torch import Tensor, nn

from ._validation import check_finite, check_ndim, check_nonnegative, check_shape, check_tensor
from .layers import GPNLayer
from .moments.gaussian import Moments
from .moments.propagate import MODES, Mode

__all__ = ["GPNNet", "HEADS", "check_sizes", "input_moments"]

HEADS = ("gaussian", "softmax")


def input_moments(x: Tensor, x_var: Tensor | None = None) -> Moments:
    """Validate network inputs ``x [S, M]`` with optional uncertainty and wrap them.

    ``x_var`` is ``[S, M]`` (independent input variances) or ``[S, M, M]`` (covariances).
    """
    check_tensor("x", x)
    check_ndim("x", x, 2)
    check_finite("x", x)
    if x_var is None:
        return Moments(x, validate=False)
    check_tensor("x_var", x_var)
    if x_var.dim() == 3:
        return Moments(x, cov=x_var)
    check_shape("x_var", x_var, tuple(x.shape))
    check_nonnegative("x_var", x_var)
    return Moments(x, var=x_var, validate=False)


def check_sizes(sizes: Sequence[int], head: str) -> list[int]:
    """Validate network widths: at least 2 (gaussian head) or 3 (softmax head) positive ints."""
    sizes = list(sizes)
    min_len = 3 if head == "softmax" else 2
    if len(sizes) < min_len or any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(
            f"sizes must be at least {min_len} positive integers for head={head!r}, got {sizes}"
        )
    return sizes


class GPNNet(PyroModule):
    """A stack of parametric GPN layers trained with the deterministic closed-form objective.

    Args:
        sizes: layer widths ``[M, N_1, ..., N_L]`` for ``head="gaussian"`` (the last GPN layer
            is the output) or ``[M, N_1, ..., N_L, C]`` for ``head="softmax"`` (``C`` classes).
        mode: ``"mean"``, ``"meanvar"`` or ``"cov"``: what is propagated between layers.
        head: ``"gaussian"`` or ``"softmax"``.
        unscented_kappa: the unscented transform's ``kappa`` for the softmax loss (``None``:
            the default of :func:`pyro_gpn.losses.unscented_cross_entropy`).
        **layer_kwargs: passed to every :class:`~pyro_gpn.layers.GPNLayer` (``num_inducing``,
            ``share``, ``targets_init``, ``learn_inducing``, ``lengthscale_init``, ...).

    Example:
        >>> net = GPNNet([4, 10, 3], mode="meanvar", head="softmax")
        >>> logits = net(torch.rand(5, 4))
        >>> logits.mean.shape, logits.cov.shape
        (torch.Size([5, 3]), torch.Size([5, 3, 3]))
    """

    def __init__(
        self,
        sizes: Sequence[int],
        mode: Mode = "meanvar",
        head: str = "softmax",
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
        self.sizes = sizes
        self.mode = mode
        self.head = head
        self.unscented_kappa = unscented_kappa
        gpn_sizes = sizes[:-1] if head == "softmax" else sizes
        self.layers = nn.ModuleList(
            GPNLayer(m, n, **layer_kwargs) for m, n in zip(gpn_sizes[:-1], gpn_sizes[1:])
        )
        if head == "softmax":
            factory = {"dtype": self.layers[0].weight.dtype, "device": self.layers[0].weight.device}
            self.readout = nn.Linear(sizes[-2], sizes[-1], **factory)
            nn.init.xavier_uniform_(self.readout.weight)
            nn.init.zeros_(self.readout.bias)
        else:
            self.readout = None

    @property
    def num_classes(self) -> int | None:
        return self.sizes[-1] if self.head == "softmax" else None

    @property
    def noise_std(self) -> Tensor:
        """Observation noise std ``sigma^L`` of the gaussian head (``[N_L | 1]``)."""
        if self.head != "gaussian":
            raise AttributeError("noise_std is the observation noise of a gaussian head")
        return self.layers[-1].noise_std

    def hidden(self, x: Tensor, x_var: Tensor | None = None) -> Moments:
        """What the head consumes: moments of the noise-free responses ``F^L`` (gaussian head)
        or of the last GPN layer's outputs ``X^L`` (softmax head).

        Args:
            x: ``[S, M]`` inputs.
            x_var: optional input variances ``[S, M]`` or covariances ``[S, M, M]``; ignored in
                ``"mean"`` mode, which treats every variance as zero.
        """
        moments = input_moments(x, x_var)
        if moments.num_features != self.sizes[0]:
            raise ValueError(f"x must have {self.sizes[0]} features, got {moments.num_features}")
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            noise = not (i == last and self.head == "gaussian")
            moments = layer.propagate(moments, self.mode, noise=noise)
        return moments

    def forward(self, x: Tensor, x_var: Tensor | None = None) -> Moments:
        """Predictive moments: outputs ``X^L`` (gaussian head) or logits (softmax head).

        The logits of a softmax head carry a full covariance (unless ``mode="mean"``): even with
        independent ``X^L`` the readout correlates them.
        """
        features = self.hidden(x, x_var)
        if self.head == "softmax":
            if features.is_deterministic:
                return features.linear(self.readout.weight.mT, self.readout.bias)
            return features.linear_full(self.readout.weight.mT, self.readout.bias)
        noise_var = self.noise_std.square().expand(features.num_features)
        if features.cov is not None:
            return Moments(features.mean, cov=features.cov + torch.diag(noise_var), validate=False)
        var = features.variance + noise_var
        return Moments(features.mean, var=var, validate=False)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The paper's deterministic training objective, averaged over the samples.

        Gaussian head: expected negative log-likelihood (``eq:gpn_reg_loss_marginal_final``)
        of targets ``y [S, N_L]``. Softmax head: unscented expected cross-entropy
        (``eq:gpn_normal_unscented``) of labels ``y [S]``. Add :meth:`penalty` for maximum
        likelihood training (``eq:gpn_ls``).
        """
        from . import losses

        features = self.hidden(x)
        if self.head == "gaussian":
            return losses.gaussian_expected_nll(features, y, self.noise_std, reduction="mean")
        return losses.unscented_cross_entropy(
            features,
            y,
            self.readout.weight.mT,
            self.readout.bias,
            kappa=self.unscented_kappa,
            reduction="mean",
        )

    def penalty(self) -> Tensor:
        """The target-variance penalty ``eq:gpn_ls`` summed over the layers."""
        from .losses import target_variance_penalty

        return target_variance_penalty([layer.target_variances for layer in self.layers])

    @torch.no_grad()
    def predict(self, x: Tensor, x_var: Tensor | None = None) -> Moments | Tensor:
        """Predictions without gradients: predictive :class:`Moments` (gaussian head) or class
        probabilities ``[S, C]`` (softmax head, the softmax of the mean logits)."""
        out = self(x, x_var)
        if self.head == "softmax":
            return out.mean.softmax(-1)
        return out

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}, mode={self.mode!r}, head={self.head!r}"
