"""A GPN network from a sequence of moment-carrying blocks under a head.

:class:`~pyro_gpn.GPNNet` stacks dense GPN layers; :class:`GPNSequential` stacks any blocks that
carry :class:`~pyro_gpn.moments.Moments` -- convolutional and recurrent GPN layers
(:mod:`pyro_gpn.layers.conv`, :mod:`pyro_gpn.layers.recurrent`), the dense
:class:`~pyro_gpn.layers.GPNLayer`, pooling, flattening and linear maps
(:mod:`pyro_gpn.layers.linear`) -- and hands the last block's moments to a head
(:mod:`pyro_gpn.heads`), with the network interface every route uses: ``forward`` (predictive
moments), ``predict``, ``loss`` (for :class:`~pyro_gpn.inference.Trainer`), ``penalty``
(``eq:gpn_ls``), ``kl_divergence`` and ``expected_log_likelihood`` (for
:func:`~pyro_gpn.inference.closed_form.closed_form_elbo`, which reads only these and
``num_data``).

A block is a module with ``propagate(inputs, mode, noise=True) -> Moments`` on flat moments
``[S, F]`` and ``output_shape(in_shape) -> tuple`` (which validates ``in_shape``); a dense
:class:`~pyro_gpn.layers.GPNLayerBase` takes ``(in_features,)``. Inputs are flat ``[S, F]``
(images ``[S, C H W]``, sequences ``[S, T D]``), so the data loaders and the
:class:`~pyro_gpn.inference.Trainer`'s two-dimensional batches work unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ._validation import EMPTY_BATCH_HINT, check_int, check_not_empty
from .heads import HEADS, Head, Prediction, make_head
from .layers.base import GPNLayerBase
from .layers.linear import MomentFlatten
from .layers.variational import VariationalTargets
from .losses import target_variance_penalty
from .moments.gaussian import Moments
from .moments.propagate import MODES, Mode
from .network import _num_rows, as_target, input_moments
from .pyro_module import GPNModule
from .recommended import VGPN

__all__ = ["OBJECTIVES", "GPNSequential", "block_output_shape"]

#: the data terms :meth:`GPNSequential.loss` can train on (names as ``fit_vgpn``'s ``elbo``)
OBJECTIVES = ("closed_form", "predictive")


def block_output_shape(block: nn.Module, in_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The output shape of ``block`` for inputs ``in_shape`` (``ValueError`` if it does not fit)."""
    if hasattr(block, "output_shape"):
        return tuple(block.output_shape(tuple(in_shape)))
    if isinstance(block, GPNLayerBase):
        if math.prod(in_shape) != block.in_features or len(in_shape) != 1:
            raise ValueError(
                f"{type(block).__name__} takes ({block.in_features},) features, got {in_shape}"
                " (insert a MomentFlatten)"
            )
        return (block.out_features,)
    raise TypeError(f"block {type(block).__name__} has no output_shape and is no GPN layer")


class GPNSequential(GPNModule):
    """Blocks that carry moments, then a head.

    Args:
        blocks: the blocks, in order (see the module docstring).
        input_shape: shape of one input: ``(C, H, W)`` images, ``(T, D)`` sequences, ``(M,)``.
        head: ``"softmax"`` (a readout ``W [F, C]``, ``b`` to ``num_outputs`` classes),
            ``"gaussian"`` (the last block's outputs are the regression outputs; it must have no
            output noise: the head owns the observation noise) or a
            :class:`~pyro_gpn.heads.Head`.
        num_outputs: classes (softmax) or outputs (gaussian, default the features' width).
        mode: ``"mean"``, ``"meanvar"`` (convolutional blocks take only these) or ``"cov"``.
        num_data: size of the training set for the KL term's weight in :meth:`loss` and the
            closed-form ELBO (``None``: the batch size).
        unscented_kappa, noise_std_init: of a head built from its name.
        objective: the data term of :meth:`loss` (see there): ``"closed_form"``, the paper's
            expected negative log-likelihood (with variational blocks: the negative ELBO per
            sample), or ``"predictive"``, the negative log density of the targets under the
            closed-form predictive (with variational blocks: the predictive log-likelihood
            objective of :func:`~pyro_gpn.inference.predictive_log_likelihood`, PPGPR).
            ``None`` (default): the recommendation for the Bayesian GPN
            (:attr:`pyro_gpn.recommended.VGPN.elbo <pyro_gpn.recommended.VGPNRecommendation>`,
            ``"predictive"``) when a block is variational (a
            :class:`~pyro_gpn.layers.VariationalTargets` response in any block), else
            ``"closed_form"``, the paper's
            objective of the maximum-likelihood GPN. On the variational CNNs and RNN of
            ``docs/results/conv_rnn.md`` the predictive objective scored a higher validation
            log-likelihood per image or sequence, paired by seed: digits +0.0037 +- 0.0015
            nats (9 of 10 seeds), noisy sine +0.046 +- 0.033 (2 of 3), reduced MNIST
            +0.0002 +- 0.0026 (2 of 3: a tie).

    Example:
        >>> from pyro_gpn.layers import GPNConv2d, MomentAvgPool2d, MomentFlatten
        >>> net = GPNSequential(
        ...     [GPNConv2d(1, 4, 3, (8, 8), padding=1), MomentAvgPool2d(2), MomentFlatten()],
        ...     input_shape=(1, 8, 8), num_outputs=10)
        >>> net(torch.rand(5, 64)).mean.shape
        torch.Size([5, 10])
    """

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        input_shape: Sequence[int],
        head: str | Head = "softmax",
        num_outputs: int | None = None,
        mode: Mode = "meanvar",
        num_data: int | None = None,
        unscented_kappa: float | None = None,
        noise_std_init: float = 0.1,
        objective: str | None = None,
    ) -> None:
        super().__init__()
        if objective is not None and objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES} or None, got {objective!r}")
        blocks = list(blocks)
        if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
            raise ValueError("blocks must be a non-empty sequence of modules")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        for block in blocks:
            modes = getattr(block, "modes", MODES)
            if mode not in modes:
                raise ValueError(
                    f"mode must be one of {modes} for {type(block).__name__}, got {mode!r}"
                )
        input_shape = tuple(input_shape)
        if not input_shape or any(not isinstance(s, int) or s < 1 for s in input_shape):
            raise ValueError(f"input_shape must be positive integers, got {input_shape}")
        num_data = check_int("num_data", num_data, 1, none_ok=True)
        shape = input_shape
        for block in blocks:
            shape = block_output_shape(block, shape)
        self.input_shape, self.feature_shape = input_shape, shape
        features = math.prod(shape)
        self.blocks = nn.ModuleList(blocks)
        self.mode, self.num_data = mode, num_data
        reference = next(iter(self.blocks.parameters()), torch.zeros(()))
        factory = {"dtype": reference.dtype, "device": reference.device}
        if isinstance(head, str):
            if head not in HEADS:
                raise ValueError(f"head must be one of {tuple(HEADS)} or a Head, got {head!r}")
            if HEADS[head].has_readout:
                if not isinstance(num_outputs, int) or num_outputs < 1:
                    raise ValueError(f"num_outputs must be a positive integer, got {num_outputs!r}")
                sizes = [input_shape[0], features, num_outputs]
            else:
                if num_outputs not in (None, features):
                    raise ValueError(
                        f"num_outputs must equal the last block's width {features} for a "
                        f"gaussian head, got {num_outputs}"
                    )
                sizes = [input_shape[0], features]
            head = make_head(
                head,
                sizes,
                noise_std_init=noise_std_init,
                unscented_kappa=unscented_kappa,
                **factory,
            )
        elif not isinstance(head, Head):
            raise TypeError(f"head must be a name or a Head, got {type(head).__name__}")
        width = getattr(head, "in_features", getattr(head, "num_outputs", None))
        if width != features:
            raise ValueError(f"head takes {width} features, the blocks give {features}")
        top = [b for b in blocks if not isinstance(b, MomentFlatten)][-1:]
        if not head.noisy_features and any(getattr(b, "noise_std", None) is not None for b in top):
            raise ValueError(
                "a GPN block at the top must have output_noise=False under a gaussian head "
                "(the head owns the observation noise)"
            )
        self.head = head
        if objective is None:
            variational = any(isinstance(m, VariationalTargets) for m in self.blocks.modules())
            objective = VGPN.elbo if variational and VGPN.elbo in OBJECTIVES else "closed_form"
        self.objective = objective

    @property
    def objective(self) -> str:
        """The data term of :meth:`loss`: ``"closed_form"`` or ``"predictive"``."""
        return self._objective

    @objective.setter
    def objective(self, value: str) -> None:
        if value not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {value!r}")
        self._objective = value

    # ------------------------------------------------------------------ evaluation
    @property
    def input_features(self) -> int:
        return math.prod(self.input_shape)

    def _reference(self) -> Tensor | None:
        """The parameter whose dtype and device inputs take: the first block's with parameters,
        else the head's (``None`` without parameters)."""
        return next(self.blocks.parameters(), next(self.head.parameters(), None))

    def hidden(self, x: Tensor, x_var: Tensor | None = None) -> Moments:
        """Moments of the last block's outputs (the head's features).

        ``x`` (and ``x_var``) may be tensors or NumPy arrays in any floating dtype: they are
        cast to the parameters' dtype and must be on the parameters' device (the rule in
        :mod:`pyro_gpn._validation`, as for :class:`~pyro_gpn.GPNNet`); ``S = 0`` rows give
        empty moments.

        Shape:
            ``x [S, F_in]`` (flat) -> :class:`Moments` ``[S, F]``.
        """
        moments = input_moments(x, x_var, like=self._reference())
        if moments.num_features != self.input_features:
            raise ValueError(
                f"x must have {self.input_features} features (input_shape {self.input_shape}), "
                f"got {moments.num_features}"
            )
        if self.mode != "cov":
            moments = moments.diagonal()
        for block in self.blocks:
            moments = block.propagate(moments, self.mode)
        return moments

    def forward(self, x: Tensor, x_var: Tensor | None = None) -> Moments:
        """Predictive moments (logits or outputs with the observation noise)."""
        return self.head.predictive(self.hidden(x, x_var))

    def expected_nll(self, x: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
        """The head's expected negative log-likelihood of ``y`` under the blocks' features.

        Raises:
            ValueError: ``x`` has no rows with ``reduction="mean"`` (as
                :meth:`pyro_gpn.GPNNet.expected_nll`), or bad ``x`` / ``y``.
        """
        check_not_empty("x", x, reduction, hint=EMPTY_BATCH_HINT)
        y = as_target(y, self._reference())
        return self.head.expected_nll(self.hidden(x), y, reduction=reduction)

    def expected_log_likelihood(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-sample ``E[log p(y_s | features)]`` ``[B]`` (the closed-form ELBO's ``L_pred``)."""
        y = as_target(y, self._reference())
        self.head.check_target(y, _num_rows(x))
        return -self.expected_nll(x, y, reduction="none")

    def log_predictive(self, x: Tensor, y: Tensor, calibrated: bool = True) -> Tensor:
        """Per-sample log density of ``y`` under the closed-form predictive (the head's
        :meth:`~pyro_gpn.heads.Head.log_predictive`), differentiable: the test log-likelihood,
        and (``calibrated=False``: without the head's predictive scale) the data term of the
        ``"predictive"`` objective.

        Shape:
            ``x [S, F_in]``, ``y [S, N]`` (regression) or ``[S]`` labels -> ``[S]``.
        """
        y = as_target(y, self._reference())
        self.head.check_target(y, _num_rows(x))
        return self.head.log_predictive(self.hidden(x), y, calibrated=calibrated)

    def kl_divergence(self) -> Tensor:
        """Sum of the GPN blocks' ``KL(q(U) || p(U))`` (zero without variational blocks)."""
        terms = [b.kl_divergence() for b in self.blocks if isinstance(b, GPNLayerBase)]
        if terms:
            return sum(terms)
        return next(self.parameters()).new_zeros(())

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        r"""The training objective per sample: a data term averaged over the batch, plus
        ``KL / num_data``.

        ``objective="closed_form"``: the expected negative log-likelihood
        ``-E[log p(y_s | F_s)]`` (``eq:gpn_reg_loss_marginal_final``; the unscented expected
        cross-entropy ``eq:gpn_normal_unscented``), so the negative ELBO per sample for
        variational blocks and the paper's objective for parametric ones (add :meth:`penalty`).
        ``objective="predictive"``: ``-log E[p(y_s | F_s)]`` (:meth:`log_predictive` at the
        head's uncalibrated predictive: training never sees the predictive scale), the
        expectation inside the logarithm; at least the expected data term (Jensen's
        inequality, for the softmax head's non-negative point weights, ``kappa >= 0``), and
        what the test log-likelihood scores (PPGPR: Jankowiak, Pleiss & Gardner, ICML 2020).
        The functions :func:`~pyro_gpn.inference.closed_form_elbo` and
        :func:`~pyro_gpn.inference.predictive_log_likelihood` name their objective
        themselves and do not read :attr:`objective`.

        Raises:
            ValueError: ``x`` has no rows (the mean over no samples is undefined, as in
                :meth:`pyro_gpn.GPNNet.loss`), or bad ``x`` / ``y``.
        """
        check_not_empty("x", x, hint="skip empty batches")
        num_data = _num_rows(x) if self.num_data is None else self.num_data
        if self.objective == "predictive":
            data = -self.log_predictive(x, y, calibrated=False).mean()
        else:
            data = self.expected_nll(x, y)
        return data + self.kl_divergence() / num_data

    def penalty(self, alpha: float = 0.1, beta: float = 1e-3) -> Tensor:
        """``eq:gpn_ls`` over the blocks with penalised target variances (zero if none)."""
        variances = [
            b.response.penalised_variances() for b in self.blocks if isinstance(b, GPNLayerBase)
        ]
        variances = [v for v in variances if v is not None]
        if not variances:
            return self.kl_divergence() * 0
        return target_variance_penalty(variances, alpha=alpha, beta=beta)

    @torch.no_grad()
    def predict(self, x: Tensor, x_var: Tensor | None = None) -> Prediction:
        """:class:`~pyro_gpn.heads.Prediction` from the head (no gradients)."""
        return self.head.predict(self.hidden(x, x_var))

    def extra_repr(self) -> str:
        return (
            f"input_shape={self.input_shape}, mode={self.mode!r}, num_data={self.num_data}, "
            f"objective={self.objective!r}"
        )
