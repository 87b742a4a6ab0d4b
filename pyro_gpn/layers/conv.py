r"""Convolutional GPN layers: one activation function per output channel, shared over positions.

A convolution is linear, so the central-limit argument of the dense layer (paper, section
"Central Limit Activations") carries over unchanged. For an input image ``X [C_in, H, W]`` with
independent pixels (mean ``mu``, variance ``v``) the activation of output channel ``n`` at
position ``p`` is ``A_{np} = sum_{c,i,j} W_{n c i j} X_{c, p + (i, j)}`` with

.. math::

    E[A] = \mathrm{conv}(\mu, W), \qquad \mathrm{Var}[A] = \mathrm{conv}(v, W \circ W)

(``eq:gpn_normal_a`` with the dense ``W`` replaced by the convolution's Toeplitz matrix; the
``"meanvar"`` mode's diagonal: activations at different positions share inputs and are
correlated, which the next layer ignores exactly as the dense ``"meanvar"`` mode ignores the
correlations ``X W`` creates). Every activation then goes through its channel's GPN activation
function -- the natural reading of "unit" for a convolution -- by the dense layer's own response
(:func:`~pyro_gpn.layers.respond.respond`: ``eq:gpn_normal_mu``, ``eq:gpn_normal_Sigmatilde``):
positions are treated as further samples, ``[S, C_out, H', W'] -> [S H' W', C_out]``.

Layout: :class:`~pyro_gpn.moments.Moments` stay two-dimensional; an image batch is
``[S, C H W]``, channel-major (``x.reshape(S, C, H, W)``), what ``torch.flatten`` of an
``NCHW`` tensor gives. The weight keeps the library's ``[in, out]`` layout,
``weight [C_in k_h k_w, C_out]`` (an unfolded patch times ``weight`` is the activation, so
:meth:`~pyro_gpn.layers.base.GPNLayerBase.conditional` takes per-position activations
``[S', C_out]``); :attr:`GPNConv2d.kernel` is the ``[C_out, C_in, k_h, k_w]`` view
:func:`torch.nn.functional.conv2d` takes.

``share="none"`` gives one activation function per output channel, ``share="layer"`` one for the
whole layer (:class:`~pyro_gpn.layers.base.GPNLayerBase`). Modes: ``"mean"`` and ``"meanvar"``
(a full covariance over all positions and channels, ``[S, C H W, C H W]``, is not carried).

Cost per layer: two convolutions (means and variances) and the dense response on
``S H' W'`` rows of ``C_out`` units, ``O(S H' W' C_out (C_in k^2 + R))``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from .._validation import (
    as_input,
    check_device,
    check_finite,
    check_inputs,
    check_ndim,
    check_tensor,
)
from ..moments.gaussian import Moments
from ..moments.propagate import Mode
from .base import GPNLayerBase
from .parametric import VirtualObservations
from .respond import respond
from .variational import VariationalTargets

__all__ = ["CONV_MODES", "GPNConv2d", "VariationalGPNConv2d", "as_moments", "pair"]

#: the propagation modes of convolutional (and pooling) blocks
CONV_MODES = ("mean", "meanvar")


def pair(name: str, value: int | tuple[int, int], minimum: int) -> tuple[int, int]:
    """``value`` as an ``(int, int)`` pair, each at least ``minimum``.

    Raises:
        ValueError: ``value`` is neither an integer nor a pair of integers (bools and floats
            included), or an entry is below ``minimum``.
    """
    message = f"{name} must be an integer >= {minimum} or a pair of them, got {value!r}"
    if isinstance(value, int):
        values = (value, value)
    else:
        try:
            values = tuple(value)
        except TypeError:  # a float, None, ...: not iterable
            raise ValueError(message) from None
    if len(values) != 2 or any(
        not isinstance(v, int) or isinstance(v, bool) or v < minimum for v in values
    ):
        raise ValueError(message)
    return values


def as_moments(
    inputs: Moments | Tensor | np.ndarray,
    num_features: int | None,
    name: str = "inputs",
    like: Tensor | None = None,
    check_scale: bool = True,
) -> Moments:
    """Validate block inputs ``[S, num_features]`` (a tensor becomes a point mass).

    Args:
        inputs: :class:`Moments`, a floating tensor or a NumPy array ``[S, F]``.
        num_features: the ``F`` required (``None``: any).
        name: the argument's name, for messages.
        like: a parameter of the block: the dtype and device rule of
            :mod:`pyro_gpn._validation` applies, as at
            :meth:`~pyro_gpn.layers.base.GPNLayerBase.validate_inputs` (floating inputs and
            :class:`Moments` are cast to ``like.dtype`` and must be on ``like.device``).
            ``None`` (a block without parameters): inputs keep their dtype.
        check_scale: with ``like``, tensor inputs beyond ``|x| > 100`` draw an
            :class:`~pyro_gpn._validation.UnscaledInputWarning` (GPN blocks; as a dense
            layer does).

    Raises:
        TypeError: ``inputs`` is neither :class:`Moments`, a tensor nor a NumPy array.
        ValueError: an integer or boolean tensor, not two dimensions, non-finite values, the
            wrong number of features, or another device than ``like``'s.
    """
    if isinstance(inputs, np.ndarray) and like is None:
        if inputs.dtype.kind not in "fiub":
            raise TypeError(f"{name} must be numeric, got a NumPy array of dtype {inputs.dtype}")
        inputs = torch.from_numpy(np.ascontiguousarray(inputs))
    if isinstance(inputs, (Tensor, np.ndarray)):
        if like is None:
            check_tensor(name, inputs)
        else:
            inputs = as_input(name, inputs, like, "the block's parameters are")
        check_ndim(name, inputs, 2)
        if like is not None and check_scale:
            check_inputs(name, inputs)
        else:
            check_finite(name, inputs)
        inputs = Moments(inputs, validate=False)
    elif not isinstance(inputs, Moments):
        raise TypeError(
            f"{name} must be Moments, a tensor or a NumPy array, got {type(inputs).__name__}"
        )
    elif like is not None:
        check_device(name, inputs.mean, like.device, "the block's parameters are")
        if inputs.mean.dtype != like.dtype:
            inputs = inputs.to(like.dtype)
    if num_features is not None and inputs.num_features != num_features:
        raise ValueError(f"{name} must have {num_features} features, got {inputs.num_features}")
    return inputs


def check_mode(mode: str, modes: tuple[str, ...], block: str) -> None:
    if mode not in modes:
        raise ValueError(f"mode must be one of {modes} for {block}, got {mode!r}")


def conv_output_size(
    size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int], padding
) -> tuple[int, int]:
    """Spatial output size of a convolution or pooling (``ValueError`` if empty)."""
    out = tuple(
        (s + 2 * p - k) // st + 1 for s, k, st, p in zip(size, kernel, stride, padding, strict=True)
    )
    if min(out) < 1:
        raise ValueError(
            f"kernel_size {kernel} with padding {padding} does not fit input_size {size}"
        )
    return out


class GPNConv2d(GPNLayerBase):
    """A 2-d convolution followed by GPN activation functions, one per output channel.

    Args:
        in_channels: ``C_in``.
        out_channels: ``C_out``, the number of GPN units (activation functions).
        kernel_size: ``k`` or ``(k_h, k_w)``.
        input_size: ``(H, W)`` of the input images (``Moments`` are flat, ``[S, C_in H W]``).
        stride: ``s`` or ``(s_h, s_w)``.
        padding: zero padding ``p`` or ``(p_h, p_w)`` (padded pixels are deterministic zeros).
        num_inducing, share, and the keywords of :class:`~pyro_gpn.layers.base.GPNLayerBase`
            (``output_noise``, ``lengthscale_init``, ``compute_dtype``, ``dtype``, ...);
        **response_options: of the response
            (:class:`~pyro_gpn.layers.parametric.VirtualObservations` here,
            :class:`~pyro_gpn.layers.variational.VariationalTargets` for
            :class:`VariationalGPNConv2d`).

    Attributes:
        weight: ``[C_in k_h k_w, C_out]``, Glorot-uniform over ``(C_in k_h k_w, C_out)``.
        kernel: ``[C_out, C_in, k_h, k_w]`` view of ``weight``.
        in_shape, out_shape: ``(C_in, H, W)`` and ``(C_out, H', W')``.

    Shape:
        inputs ``[S, C_in H W]`` -> :class:`Moments` ``[S, C_out H' W']``.

    Example:
        >>> conv = GPNConv2d(1, 4, 3, input_size=(8, 8), padding=1)
        >>> conv(torch.rand(2, 64)).mean.shape
        torch.Size([2, 256])
    """

    default_response = VirtualObservations
    modes = CONV_MODES

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        input_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        num_inducing: int = 14,
        share: str = "none",
        **kwargs,
    ) -> None:
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        kernel = pair("kernel_size", kernel_size, 1)
        size = pair("input_size", input_size, 1)
        stride = pair("stride", stride, 1)
        padding = pair("padding", padding, 0)
        out_size = conv_output_size(size, kernel, stride, padding)
        super().__init__(
            in_channels * kernel[0] * kernel[1], out_channels, num_inducing, share, **kwargs
        )
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel, stride, padding
        self.in_shape = (in_channels, *size)
        self.out_shape = (out_channels, *out_size)

    @property
    def kernel(self) -> Tensor:
        """``[C_out, C_in, k_h, k_w]``, the convolution kernel (a view of ``weight``)."""
        return self.weight.mT.reshape(self.out_channels, self.in_channels, *self.kernel_size)

    @property
    def input_features(self) -> int:
        """``C_in H W``, the width of the flat inputs."""
        return self.in_shape[0] * self.in_shape[1] * self.in_shape[2]

    def output_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        """``(C_out, H', W')`` for inputs of shape ``in_shape`` (must be :attr:`in_shape`)."""
        if tuple(in_shape) != self.in_shape:
            raise ValueError(f"inputs must have shape {self.in_shape}, got {tuple(in_shape)}")
        return self.out_shape

    def activations(self, inputs: Moments | Tensor, mode: Mode = "meanvar") -> Moments:
        """Moments of the activations, ``[S H' W', C_out]`` (rows ordered sample, row, column).

        Means convolve with ``W``; in ``"meanvar"`` mode the variances with ``W o W``.
        """
        check_mode(mode, self.modes, type(self).__name__)
        inputs = as_moments(inputs, self.input_features, like=self.weight)
        images = (inputs.num_samples, *self.in_shape)
        kernel = self.kernel
        conv = lambda t, k: F.conv2d(t.reshape(images), k, None, self.stride, self.padding)
        rows = lambda t: t.permute(0, 2, 3, 1).reshape(-1, self.out_channels)
        mean = rows(conv(inputs.mean, kernel))
        if mode == "mean" or inputs.is_deterministic:
            return Moments(mean, validate=False)
        return Moments(mean, var=rows(conv(inputs.variance, kernel.square())), validate=False)

    def propagate(
        self, inputs: Moments | Tensor, mode: Mode = "meanvar", noise: bool = True
    ) -> Moments:
        """Moments of the layer's outputs given the moments of its (flat) input images.

        Args:
            inputs: :class:`Moments` ``[S, C_in H W]`` (independent pixels), or a tensor (or
                NumPy array) of observed images. Floating inputs are cast to the parameters'
                dtype and must be on their device (the rule in :mod:`pyro_gpn._validation`);
                inputs beyond ``|x| > 100`` draw an
                :class:`~pyro_gpn._validation.UnscaledInputWarning`. ``S = 0`` gives empty
                outputs.
            mode: ``"mean"`` or ``"meanvar"``.
            noise: include the output noise ``sigma^2``.

        Returns:
            :class:`Moments` ``[S, C_out H' W']`` (``var`` in ``"meanvar"`` mode).

        Raises:
            TypeError: ``inputs`` is neither :class:`Moments`, a tensor nor a NumPy array.
            ValueError: an unknown ``mode``; integer, non-finite or misshapen inputs, or
                inputs on another device than the parameters.
        """
        check_mode(mode, self.modes, type(self).__name__)
        inputs = as_moments(inputs, self.input_features, like=self.weight)
        samples = inputs.num_samples
        activations = self.activations(inputs, mode)
        outputs = respond(self, activations, mode, noise)
        images = lambda t: t.reshape(samples, *self.out_shape[1:], self.out_channels).permute(
            0, 3, 1, 2
        )
        width = math.prod(self.out_shape)
        flat = lambda t: None if t is None else images(t).reshape(samples, width)
        return Moments(flat(outputs.mean), var=flat(outputs.var), validate=False)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"input_size={self.in_shape[1:]}, stride={self.stride}, padding={self.padding}, "
            f"num_inducing={self.num_inducing}, share={self.share!r}"
        )


class VariationalGPNConv2d(GPNConv2d):
    """:class:`GPNConv2d` with :class:`~pyro_gpn.layers.variational.VariationalTargets`: a GP
    prior and a Gaussian ``q(U)`` per output channel; ``kl_divergence()`` is their KL term
    (``eq:gpn_vi_sampling_la``), which the network adds to the closed-form ELBO."""

    default_response = VariationalTargets
