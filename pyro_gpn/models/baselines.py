"""Fixed-activation baselines: the paper's "fixed tanh" and "fixed tanh (dropout)" networks.

The paper compares GPN networks with conventional networks of the same architecture whose units
have a fixed hyperbolic-tangent activation, trained plainly or regularised by (fast) dropout
(section "Maximum Likelihood Training of Parametric GPNs", table ``tab:gpn_exp_errors``).
:class:`FixedActivationNet` is that network with the interface of :class:`pyro_gpn.GPNNet`:
``net(x)`` and ``net.hidden(x)`` return :class:`~pyro_gpn.moments.gaussian.Moments`,
``net.loss(x, y)`` is the training objective and ``net.penalty()`` the (here zero) regulariser,
so the same trainer, losses and evaluation code serve both.

Dropout comes in two kinds, both "inverted" (kept units are scaled by ``1 / p`` during training,
``p = 1 - dropout`` the keep probability, so that evaluation uses the network as it is):

* standard dropout (Srivastava et al., 2014): random Bernoulli masks in ``train()`` mode;
* fast dropout (Wang & Manning, 2013, "Fast dropout training"): instead of sampling masks, the
  dropout-perturbed pre-activations are approximated by Gaussians whose mean and variance are
  propagated through the network, and the loss is the expectation under that approximation.
  For independent inputs ``x_j`` (mean ``m_j``, variance ``v_j``) and masks ``z_j ~ Bern(p)``,
  the unit ``x~_j = z_j x_j / p`` has mean ``m_j`` and variance ``(v_j + (1 - p) m_j^2) / p``,
  and the pre-activation ``a = x~ W + b`` has mean ``m W + b`` and variance ``Var(x~) W^2``
  (exact, given the inputs' independence). ``a`` is then treated as Gaussian (the
  central-limit argument the paper also uses for GPN activations) and the mean and variance of
  ``tanh(a)`` are computed by Gauss--Hermite quadrature with ``quadrature_points`` nodes
  (default 32) instead of Wang & Manning's probit-style closed forms (their accuracy:
  ``docs/results/docstring_notes.md``). The cost is ``quadrature_points`` activation
  evaluations per unit and sample. The head's logits are linear in the last hidden layer, so
  the softmax loss is the unscented expected cross-entropy of
  :func:`pyro_gpn.losses.unscented_cross_entropy` on the (dropped-out) last hidden layer. In
  ``eval()`` mode no dropout is applied and predictions are deterministic.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .._validation import as_input, check_finite, check_not_empty, check_shape, integer_sizes
from ..heads import HEADS, GaussianHead, Head, Prediction, SoftmaxHead
from ..moments.gaussian import Moments
from ..network import as_target

__all__ = ["FixedActivationNet"]

_ACTIVATIONS = {"tanh": torch.tanh, "sigmoid": torch.sigmoid}


def _dropout_moments(moments: Moments, keep: float) -> Moments:
    """Moments of ``z * x / keep`` for ``z ~ Bernoulli(keep)`` independent of ``x`` (diagonal)."""
    variance = (moments.variance + (1.0 - keep) * moments.mean.square()) / keep
    return Moments(moments.mean, var=variance, validate=False)


class FixedActivationNet(nn.Module):
    r"""Feed-forward network with a fixed activation function and optional (fast) dropout.

    ``sizes = [M, H_1, ..., H_k, D]`` gives ``k`` hidden layers
    ``h_l = act(h_{l-1} W_l + b_l)`` followed by a linear head ``h_k W + b``; e.g. the paper's
    ``[16, 30, 15, 26]`` has tanh layers of 30 and 15 units and 26 class logits. Dropout, when
    enabled, acts on the input of every linear map: at rate ``input_dropout`` on the data and at
    rate ``dropout`` on each hidden layer (Srivastava et al. use 0.2 and 0.5; with few inputs,
    as Letter's 16, dropping inputs costs much more than dropping hidden units).

    Weights are ``[in, out]`` (``a = x @ W``, as in the GPN layers) and Glorot-uniform
    initialised, ``U(-r, r)`` with ``r = sqrt(6 / (fan_in + fan_out))`` (the paper's
    "Initialization"); biases start at zero.

    Heads:

    * ``"softmax"``: ``D`` classes. ``hidden(x)`` returns the moments of the head's input (the
      last hidden layer after dropout), ``forward(x)`` the moments of the logits (full ``cov``
      under fast dropout, else a point mass), and ``loss(x, y)`` the mean expected
      cross-entropy of the labels ``y`` ``[S]`` (unscented transform, ``eq:gpn_normal_unscented``;
      exact plain cross-entropy without fast dropout).
    * ``"gaussian"``: ``D`` real outputs with a learned noise standard deviation ``noise_std``
      ``[D]``. ``hidden(x)`` returns the moments of the noise-free outputs ``F``, ``forward(x)``
      the predictive moments (variance ``Var F + noise_std^2``), and ``loss(x, y)`` the mean
      expected negative log-likelihood of ``y`` ``[S, D]`` (``eq:gpn_reg_loss_marginal_final``).

    Args:
        sizes: layer widths ``[M, H_1, ..., H_k, D]``, at least two entries, all positive.
        activation: ``"tanh"`` (default) or ``"sigmoid"``.
        head: ``"softmax"`` (default) or ``"gaussian"``.
        dropout: drop probability in ``[0, 1)`` of the hidden units (the input of every linear
            map after the first).
        input_dropout: drop probability in ``[0, 1)`` of the network's inputs (``None``: the
            same as ``dropout``; ``0``: dropout on the hidden layers only).
        fast_dropout: use the Gaussian (fast-dropout) approximation instead of sampled masks.
        quadrature_points: Gauss--Hermite points for the activation moments (fast dropout).
        unscented_kappa: unscented-transform parameter for the softmax loss under fast dropout
            (``None``: ``0``, see :func:`~pyro_gpn.losses.unscented_cross_entropy`).
        noise_std_init: initial ``noise_std`` of the Gaussian head.
        kappa: deprecated spelling of ``unscented_kappa``.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        activation: str = "tanh",
        head: str = "softmax",
        dropout: float = 0.0,
        input_dropout: float | None = None,
        fast_dropout: bool = False,
        quadrature_points: int = 32,
        unscented_kappa: float | None = None,
        noise_std_init: float = 1.0,
        kappa: float | None = None,
    ) -> None:
        super().__init__()
        if kappa is not None:
            warnings.warn(
                "kappa is deprecated, use unscented_kappa", DeprecationWarning, stacklevel=2
            )
            unscented_kappa = kappa
        sizes = integer_sizes(sizes)
        if len(sizes) < 2 or any(s <= 0 for s in sizes):
            raise ValueError(f"sizes must hold at least two positive widths, got {sizes}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(_ACTIVATIONS)}, got {activation!r}")
        if head not in HEADS:
            raise ValueError(f"head must be one of {tuple(HEADS)}, got {head!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        input_dropout = dropout if input_dropout is None else input_dropout
        if not 0.0 <= input_dropout < 1.0:
            raise ValueError(f"input_dropout must lie in [0, 1), got {input_dropout}")
        if quadrature_points < 2:
            raise ValueError(f"quadrature_points must be at least 2, got {quadrature_points}")
        if not noise_std_init > 0:
            raise ValueError(f"noise_std_init must be positive, got {noise_std_init}")
        self.sizes = sizes
        self.activation = activation
        self.dropout = float(dropout)
        self.input_dropout = float(input_dropout)
        self.fast_dropout = bool(fast_dropout)
        with torch.random.fork_rng(devices=[]):  # reset_parameters draws the readout
            self.head: Head = (
                SoftmaxHead(sizes[-2], sizes[-1], unscented_kappa)
                if HEADS[head].has_readout
                else GaussianHead(sizes[-1], noise_std_init)
            )
        # the linear maps below the head: activated hidden maps, then (without a readout in
        # the head) the linear output map
        widths = self.head.feature_sizes(sizes)
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.empty(m, n)) for m, n in zip(widths[:-1], widths[1:], strict=True)]
        )
        self.biases = nn.ParameterList([nn.Parameter(torch.empty(n)) for n in widths[1:]])
        self.num_hidden = len(sizes) - 2
        self._register_load_state_dict_pre_hook(self._upgrade_state_dict)
        # probabilists' Gauss-Hermite rule for E[f(a)], a ~ N(mu, var): nodes t, weights w
        nodes, weights = np.polynomial.hermite_e.hermegauss(quadrature_points)
        default = torch.get_default_dtype()
        self.register_buffer("_gh_nodes", torch.as_tensor(nodes, dtype=default), persistent=False)
        self.register_buffer(
            "_gh_weights",
            torch.as_tensor(weights / weights.sum(), dtype=default),
            persistent=False,
        )
        self.reset_parameters()

    # ------------------------------------------------------------------ parameters
    def reset_parameters(self) -> None:
        """Glorot-uniform weights (the head's readout last), zero biases."""
        for weight, bias in self.maps:
            nn.init.xavier_uniform_(weight)
            nn.init.zeros_(bias)

    def _upgrade_state_dict(self, state_dict: dict, prefix: str, *args) -> None:
        """Load v0.1 state dicts: the readout was the last of ``weights``, the noise
        ``log_noise_std``."""
        last = len(self.weights)
        moves = {
            f"weights.{last}": "head.weight",
            f"biases.{last}": "head.bias",
            "log_noise_std": "head.noise_std_unconstrained",
        }
        for old, new in moves.items():
            if prefix + old in state_dict and prefix + new not in state_dict:
                state_dict[prefix + new] = state_dict.pop(prefix + old)

    @property
    def maps(self) -> list[tuple[Tensor, Tensor]]:
        """Every linear map ``(weight [in, out], bias [out])`` from the input to the head's
        output, the softmax head's readout included."""
        readout = [(self.head.weight, self.head.bias)] if self.head.has_readout else []
        return [*zip(self.weights, self.biases, strict=True), *readout]

    @property
    def noise_std(self) -> Tensor:
        """``[D]`` observation noise standard deviation of the Gaussian head."""
        if not hasattr(self.head, "noise_std"):
            raise AttributeError("noise_std exists only for head='gaussian'")
        return self.head.noise_std

    def penalty(self) -> Tensor:
        """No regulariser: a zero scalar (the interface of :class:`pyro_gpn.GPNNet`)."""
        return self.maps[0][0].new_zeros(())

    # ------------------------------------------------------------------ propagation
    def _drop(self, moments: Moments, rate: float) -> Moments:
        """Dropout at ``rate`` on the input of a linear map (a no-op in eval mode or at 0)."""
        if not self.training or rate == 0:
            return moments
        if self.fast_dropout:
            return _dropout_moments(moments, 1.0 - rate)
        dropped = nn.functional.dropout(moments.mean, rate, training=True)
        return Moments(dropped, validate=False)

    def _activate(self, pre: Moments) -> Moments:
        """Moments of ``act(a)`` for ``a ~ N(pre.mean, pre.variance)``, elementwise."""
        act = _ACTIVATIONS[self.activation]
        if pre.is_deterministic:
            return Moments(act(pre.mean), validate=False)
        points = pre.mean.unsqueeze(-1) + pre.variance.sqrt().unsqueeze(-1) * self._gh_nodes
        values = act(points)  # [S, N, Q]
        mean = values @ self._gh_weights
        second = values.square() @ self._gh_weights
        return Moments(mean, var=(second - mean.square()).clamp_min(0.0), validate=False)

    def _check_input(self, x: Tensor) -> Tensor:
        """``x`` at the boundary: the dtype and device rule of :mod:`pyro_gpn._validation`
        (floating tensors or NumPy arrays cast to the parameters' dtype, on their device),
        ``[S, M]``, finite."""
        x = as_input("x", x, self.maps[0][0], "the network's parameters are")
        check_shape("x", x, (None, self.sizes[0]))
        check_finite("x", x)
        return x

    def hidden(self, x: Tensor) -> Moments:
        """What the head consumes: the dropped-out last hidden layer (softmax head) or the
        noise-free outputs ``F`` (Gaussian head).

        ``x`` may be a tensor or NumPy array in any floating dtype: it is cast to the
        parameters' dtype and must be on their device (as for :class:`pyro_gpn.GPNNet`).

        Shape:
            ``x [S, M]`` -> :class:`Moments` ``[S, H_k]`` (softmax) or ``[S, D]`` (Gaussian).

        Raises:
            TypeError: ``x`` is neither a tensor nor a NumPy array.
            ValueError: integer or non-finite ``x``, the wrong number of features, or another
                device than the parameters.
        """
        x = self._check_input(x)
        moments = Moments(x, validate=False)
        rate = self.input_dropout
        hidden = zip(self.weights[: self.num_hidden], self.biases[: self.num_hidden], strict=True)
        for weight, bias in hidden:
            moments = self._activate(self._drop(moments, rate).linear(weight, bias))
            rate = self.dropout
        moments = self._drop(moments, rate)
        output = zip(self.weights[self.num_hidden :], self.biases[self.num_hidden :], strict=True)
        for weight, bias in output:  # the linear output map below a head without readout
            moments = moments.linear(weight, bias)
        return moments

    def forward(self, x: Tensor) -> Moments:
        """The predictive moments: of the logits (softmax head) or of the outputs.

        Shape:
            ``x [S, M]`` -> :class:`Moments` ``[S, C]`` or ``[S, D]``.
        """
        return self.head.predictive(self.hidden(x))

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """Mean training objective over the ``S`` samples (see the class docstring).

        Raises:
            ValueError: ``x`` has no rows (the mean over no samples is undefined, as in
                :meth:`pyro_gpn.GPNNet.loss`), or bad ``x`` / ``y``.
        """
        check_not_empty("x", x, hint="skip empty batches")
        y = as_target(y, self.maps[0][0])
        return self.head.expected_nll(self.hidden(x), y)

    @torch.no_grad()
    def predict(self, x: Tensor) -> Prediction:
        """:class:`~pyro_gpn.heads.Prediction` of the head from the propagated moments."""
        return self.head.predict(self.hidden(x))

    def extra_repr(self) -> str:
        kind = "fast" if self.fast_dropout else "standard"
        drop = (
            f", dropout={self.dropout}, input_dropout={self.input_dropout} ({kind})"
            if self.dropout > 0 or self.input_dropout > 0
            else ""
        )
        return f"sizes={self.sizes}, activation={self.activation}{drop}"
