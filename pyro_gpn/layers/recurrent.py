r"""A recurrent GPN layer: ``a_t = x_t W + h_{t-1} U``, ``h_t = f(a_t) + noise``.

Each of the ``N`` hidden units has its own GPN activation function (``share="none"``; or one for
the layer, ``share="layer"``), the same at every time step. The moments of the hidden state are
propagated through time by the central-limit argument of the dense layer (paper, section
"Central Limit Activations"): ``a_t`` is a sum of many weighted terms and is treated as Gaussian
with

.. math::

    E[a_t] = E[x_t] W + E[h_{t-1}] U, \qquad
    \mathrm{Var}[a_t] = \mathrm{Var}[x_t] (W \circ W) + \mathrm{Var}[h_{t-1}] (U \circ U)

in ``"meanvar"`` mode (``eq:gpn_normal_a`` for each of the two products) and
``Cov[a_t] = W^T Cov[x_t] W + U^T Cov[h_{t-1}] U`` in ``"cov"`` mode, then ``h_t``'s moments are
the dense layer's response (:func:`~pyro_gpn.layers.respond.respond`: ``eq:gpn_normal_mu``,
``eq:gpn_normal_Sigmatilde`` / ``_cov``). ``h_0 = 0``.

**Cross-covariance of ``x_t`` and ``h_{t-1}``: taken as zero (independence).** For observed
inputs (deterministic ``x``, the first layer) this is exact: ``x_t`` has no variance. When
``x_t`` is itself the output of a stochastic layer, ``x_t`` and ``h_{t-1}`` both depend on
``x_1 .. x_{t-1}`` and are correlated; the choice drops that term, the same approximation the
``"meanvar"`` mode makes for the correlations between units. Consequences (tested against Monte
Carlo through :meth:`~pyro_gpn.layers.base.GPNLayerBase.conditional`): with observed inputs
the per-unit moments are exact for sequences of length 1 and 2 (``h_1`` given ``x`` is Gaussian
with independent units, so ``a_2`` is exactly Gaussian), and approximate from ``t = 3`` on,
where ``h_{t-1}`` is no longer Gaussian.

Layout: sequences are flat, ``[S, T D]`` (``x.reshape(S, T, D)``, time-major within a sample);
the output is the last state ``[S, N]`` or, with ``return_sequence=True``, every state
``[S, T N]`` (per-step variances; the covariance between time steps is not carried).

Cost: ``T`` dense responses of ``S`` rows and ``N`` units, the response weights (Choleskys)
computed once per call.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..moments.gaussian import Moments
from ..moments.propagate import MODES, Mode
from .base import GPNLayerBase
from .conv import as_moments, check_mode
from .parametric import VirtualObservations
from .respond import respond, response_parts
from .variational import VariationalTargets

__all__ = ["GPNRecurrent", "VariationalGPNRecurrent", "add_independent"]


def add_independent(first: Moments, second: Moments) -> Moments:
    """Moments of the sum of two independent random vectors ``[S, N]``."""
    mean = first.mean + second.mean
    if first.cov is not None or second.cov is not None:
        return Moments(mean, cov=first.covariance + second.covariance, validate=False)
    if first.is_deterministic and second.is_deterministic:
        return Moments(mean, validate=False)
    return Moments(mean, var=first.variance + second.variance, validate=False)


def _project(moments: Moments, weight: Tensor, mode: Mode) -> Moments:
    """``moments @ weight`` in ``mode`` (as :meth:`GPNLayerBase.propagate` projects)."""
    if mode == "mean":
        return Moments(moments.mean @ weight, validate=False)
    if mode == "cov":
        return moments.linear_full(weight)
    return moments.diagonal().linear(weight)


class GPNRecurrent(GPNLayerBase):
    """A recurrent layer of GPN units (an Elman RNN whose activation functions are GPNs).

    Args:
        in_features: ``D``, the width of each time step's input.
        hidden_size: ``N``, the number of GPN units (the state's width).
        num_inducing, share, and the keywords of :class:`~pyro_gpn.layers.base.GPNLayerBase`
            (``output_noise``, ``lengthscale_init``, ``compute_dtype``, ``dtype``, ...).
        return_sequence: return every state ``[S, T N]`` instead of the last ``[S, N]``.
        **response_options: of the response (targets, ``q(U)``).

    Attributes:
        weight: ``[D, N]`` input weights ``W`` (Glorot-uniform).
        recurrent_weight: ``[N, N]`` ``U`` (orthogonal initialisation).

    Shape:
        inputs ``[S, T D]`` -> :class:`Moments` ``[S, N]`` (or ``[S, T N]``).

    Example:
        >>> rnn = GPNRecurrent(1, 8)
        >>> rnn(torch.randn(4, 10)).mean.shape
        torch.Size([4, 8])
    """

    default_response = VirtualObservations
    modes = MODES

    def __init__(
        self,
        in_features: int,
        hidden_size: int,
        num_inducing: int = 14,
        share: str = "none",
        *,
        return_sequence: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(in_features, hidden_size, num_inducing, share, **kwargs)
        if not isinstance(return_sequence, bool):
            raise ValueError(f"return_sequence must be a bool, got {return_sequence!r}")
        self.hidden_size = hidden_size
        self.return_sequence = return_sequence
        recurrent = torch.empty(hidden_size, hidden_size, dtype=self.weight.dtype)
        nn.init.orthogonal_(recurrent)
        self.recurrent_weight = nn.Parameter(recurrent.to(self.weight.device))

    def output_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """``(N,)`` or ``(T, N)`` for inputs ``(T, D)`` (or flat ``(T D,)``)."""
        features = math.prod(in_shape)
        if len(in_shape) == 2 and in_shape[1] != self.in_features:
            raise ValueError(f"inputs must be (T, {self.in_features}), got {tuple(in_shape)}")
        if features % self.in_features:
            raise ValueError(
                f"inputs must have T * {self.in_features} features, got in_shape {in_shape}"
            )
        steps = features // self.in_features
        return (steps, self.hidden_size) if self.return_sequence else (self.hidden_size,)

    def propagate(
        self, inputs: Moments | Tensor, mode: Mode = "meanvar", noise: bool = True
    ) -> Moments:
        """Moments of the states given the moments of the input sequence.

        Args:
            inputs: :class:`Moments` ``[S, T D]`` (``var``; a ``cov`` is read as its diagonal)
                or a tensor (or NumPy array) of observed sequences. Floating inputs are cast to
                the parameters' dtype and must be on their device (the rule in
                :mod:`pyro_gpn._validation`); inputs beyond ``|x| > 100`` draw an
                :class:`~pyro_gpn._validation.UnscaledInputWarning`.
            mode: ``"mean"``, ``"meanvar"`` or ``"cov"`` (the state's covariance over units is
                carried through time; inputs enter by their variances).
            noise: include the output noise in the returned states (the state fed back is
                always the noisy output ``h_t``, the model's).

        Returns:
            :class:`Moments` of ``h_T`` ``[S, N]`` (``cov`` in ``"cov"`` mode) or of every
            state ``[S, T N]`` (``var``).

        Raises:
            TypeError: ``inputs`` is neither :class:`Moments`, a tensor nor a NumPy array.
            ValueError: an unknown ``mode``; integer or non-finite inputs, inputs that are not
                ``[S, T D]`` with ``T >= 1``, or inputs on another device than the parameters.
        """
        check_mode(mode, self.modes, type(self).__name__)
        inputs = as_moments(inputs, None, like=self.weight)
        features = inputs.num_features
        if features % self.in_features or features == 0:
            raise ValueError(f"inputs must have T * {self.in_features} features, got {features}")
        steps, samples = features // self.in_features, inputs.num_samples
        mean = inputs.mean.reshape(samples, steps, self.in_features)
        var = None if inputs.is_deterministic else inputs.variance.reshape(mean.shape)
        parts = response_parts(self, mode, noise=True)
        state, states = None, []
        for t in range(steps):
            x_t = Moments(mean[:, t], var=None if var is None else var[:, t], validate=False)
            activations = _project(x_t, self.weight, mode)
            if state is not None:
                activations = add_independent(
                    activations, _project(state, self.recurrent_weight, mode)
                )
            state = respond(self, activations, mode, parts=parts)
            states.append(state)
        outputs = [self._drop_noise(s) if not noise else s for s in states]
        if not self.return_sequence:
            return outputs[-1]
        width = steps * self.hidden_size
        mean = torch.stack([s.mean for s in outputs], 1).reshape(samples, width)
        if mode == "mean":
            return Moments(mean, validate=False)
        var = torch.stack([s.variance for s in outputs], 1).reshape(samples, width)
        return Moments(mean, var=var, validate=False)

    def _drop_noise(self, state: Moments) -> Moments:
        """The noise-free response ``F_t`` from the noisy state ``h_t`` (``- sigma^2``)."""
        if self.noise_std is None or state.is_deterministic:
            return state
        noise_var = self.noise_std.square().to(state.mean.dtype).expand(self.hidden_size)
        if state.cov is not None:
            return Moments(state.mean, cov=state.cov - torch.diag(noise_var), validate=False)
        return Moments(state.mean, var=(state.var - noise_var).clamp_min(0), validate=False)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, hidden_size={self.hidden_size}, "
            f"num_inducing={self.num_inducing}, share={self.share!r}, "
            f"return_sequence={self.return_sequence}"
        )


class VariationalGPNRecurrent(GPNRecurrent):
    """:class:`GPNRecurrent` with :class:`~pyro_gpn.layers.variational.VariationalTargets`
    (a ``q(U)`` per unit and its KL term, ``eq:gpn_vi_sampling_la``)."""

    default_response = VariationalTargets
