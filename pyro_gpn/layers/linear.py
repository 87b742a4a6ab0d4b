r"""Linear blocks between GPN layers that carry :class:`~pyro_gpn.moments.Moments`.

A linear map ``Y = X T`` of independent inputs (mean ``mu``, variance ``v``) has ``E[Y] = mu T``
and ``Var[Y] = v (T o T)`` (``eq:gpn_normal_a``, diagonal: the ``"meanvar"`` mode drops the
correlations the map creates, as the dense layers do). The blocks:

* :class:`MomentAvgPool2d`: average pooling, ``E = avgpool(mu)``,
  ``Var = avgpool(v) / (k_h k_w)`` (the pooling weights ``1 / (k_h k_w)`` squared, summed over
  each window; overlapping windows included);
* :class:`MomentFlatten`: images ``(C, H, W)`` to features ``(C H W,)`` (moments are already flat:
  it only changes the shape the next block checks);
* :class:`MomentLinear`: a dense affine readout ``X W + b`` with ``W [in, out]`` (the library's
  layout); in ``"cov"`` mode it keeps the output covariance ``W^T diag(v) W``.

Every block has ``output_shape(in_shape)`` (which validates) and
``propagate(inputs, mode, noise=True)``, the protocol of :class:`pyro_gpn.sequential.GPNSequential`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from .._validation import check_device_available, check_parameter_dtype
from ..moments.gaussian import Moments
from ..moments.propagate import MODES, Mode
from .conv import CONV_MODES, as_moments, check_mode, conv_output_size, pair

__all__ = ["MomentAvgPool2d", "MomentFlatten", "MomentLinear"]


def _image_shape(in_shape: tuple[int, ...], block: str) -> tuple[int, int, int]:
    if len(in_shape) != 3 or any(not isinstance(s, int) or s < 1 for s in in_shape):
        raise ValueError(f"{block} takes images (C, H, W), got in_shape {tuple(in_shape)}")
    return tuple(in_shape)


class MomentAvgPool2d(nn.Module):
    """Average pooling of image moments (no padding).

    Args:
        kernel_size: ``k`` or ``(k_h, k_w)``.
        stride: default ``kernel_size`` (non-overlapping windows).
        input_shape: ``(C, H, W)``; ``None`` takes it from the inputs' feature count only when
            set by :meth:`output_shape` (the container does).

    Shape:
        ``[S, C H W]`` -> ``[S, C H' W']``.
    """

    modes = CONV_MODES

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        input_shape: tuple[int, int, int] | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size = pair("kernel_size", kernel_size, 1)
        self.stride = self.kernel_size if stride is None else pair("stride", stride, 1)
        self.in_shape = None
        self.out_shape = None
        if input_shape is not None:
            self.output_shape(input_shape)

    def output_shape(self, in_shape: tuple[int, ...]) -> tuple[int, int, int]:
        """``(C, H', W')``; fixes the block's input shape (a second, different one raises)."""
        shape = _image_shape(in_shape, "MomentAvgPool2d")
        if self.in_shape is not None and shape != self.in_shape:
            raise ValueError(f"inputs must have shape {self.in_shape}, got {shape}")
        size = conv_output_size(shape[1:], self.kernel_size, self.stride, (0, 0))
        self.in_shape, self.out_shape = shape, (shape[0], *size)
        return self.out_shape

    def propagate(
        self, inputs: Moments | Tensor, mode: Mode = "meanvar", noise: bool = True
    ) -> Moments:
        """Pooled moments: means averaged, variances averaged with weights ``1 / (k_h k_w)^2``."""
        check_mode(mode, self.modes, "MomentAvgPool2d")
        if self.in_shape is None:
            raise ValueError("MomentAvgPool2d needs input_shape (or a container that sets it)")
        inputs = as_moments(inputs, math.prod(self.in_shape))
        images = (inputs.num_samples, *self.in_shape)
        area = self.kernel_size[0] * self.kernel_size[1]
        pool = lambda t: F.avg_pool2d(t.reshape(images), self.kernel_size, self.stride).flatten(1)
        mean = pool(inputs.mean)
        if mode == "mean" or inputs.is_deterministic:
            return Moments(mean, validate=False)
        return Moments(mean, var=pool(inputs.variance) / area, validate=False)

    def forward(self, inputs: Moments | Tensor, mode: Mode = "meanvar") -> Moments:
        return self.propagate(inputs, mode)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}"


class MomentFlatten(nn.Module):
    """Images ``(C, H, W)`` to features: the identity on flat moments, a change of shape.

    Shape:
        ``[S, C H W]`` -> ``[S, C H W]``.
    """

    modes = MODES

    def output_shape(self, in_shape: tuple[int, ...]) -> tuple[int]:
        return (math.prod(in_shape),)

    def propagate(
        self, inputs: Moments | Tensor, mode: Mode = "meanvar", noise: bool = True
    ) -> Moments:
        check_mode(mode, self.modes, "MomentFlatten")
        if isinstance(inputs, Tensor):
            return Moments(inputs)
        return inputs

    def forward(self, inputs: Moments | Tensor, mode: Mode = "meanvar") -> Moments:
        return self.propagate(inputs, mode)


class MomentLinear(nn.Module):
    """A dense affine map ``X W + b`` of moments (a readout or a projection between layers).

    Args:
        in_features, out_features: ``M`` and ``N``.
        bias: learn ``b [N]`` (zero-initialised).
        dtype, device: of the parameters (float32 or float64; ``None``: torch's default).

    Attributes:
        weight: ``[M, N]``, Glorot-uniform; bias: ``[N]`` or ``None``.

    Shape:
        ``[S, M]`` -> ``[S, N]`` (``var`` in ``"meanvar"`` mode, ``cov`` in ``"cov"`` mode).
    """

    modes = MODES

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        factory = {
            "dtype": check_parameter_dtype("dtype", dtype),
            "device": check_device_available("device", device),
        }
        self.in_features, self.out_features = in_features, out_features
        bound = math.sqrt(6.0 / (in_features + out_features))
        self.weight = nn.Parameter(
            torch.empty(in_features, out_features, **factory).uniform_(-bound, bound)
        )
        self.bias = nn.Parameter(torch.zeros(out_features, **factory)) if bias else None

    def output_shape(self, in_shape: tuple[int, ...]) -> tuple[int]:
        if tuple(in_shape) != (self.in_features,):
            raise ValueError(
                f"MomentLinear takes ({self.in_features},) features, got in_shape {in_shape}"
            )
        return (self.out_features,)

    def propagate(
        self, inputs: Moments | Tensor, mode: Mode = "meanvar", noise: bool = True
    ) -> Moments:
        """Moments of ``X W + b``.

        Args:
            inputs: :class:`Moments` ``[S, M]``, or a tensor (or NumPy array) of observed
                inputs; floating inputs are cast to the parameters' dtype and must be on their
                device (the rule in :mod:`pyro_gpn._validation`).
            mode: ``"mean"``, ``"meanvar"`` or ``"cov"``.
            noise: unused (the block has no noise; the protocol's argument).

        Raises:
            TypeError: ``inputs`` is neither :class:`Moments`, a tensor nor a NumPy array.
            ValueError: an unknown ``mode``; integer, non-finite or misshapen inputs, or
                inputs on another device than the parameters.
        """
        check_mode(mode, self.modes, "MomentLinear")
        inputs = as_moments(inputs, self.in_features, like=self.weight, check_scale=False)
        if mode == "mean":
            return Moments(inputs.mean @ self.weight + _zero(self.bias), validate=False)
        if mode == "cov":
            return inputs.linear_full(self.weight, self.bias)
        return inputs.diagonal().linear(self.weight, self.bias)

    def forward(self, inputs: Moments | Tensor, mode: Mode = "meanvar") -> Moments:
        return self.propagate(inputs, mode)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def _zero(bias: Tensor | None) -> Tensor | float:
    return 0.0 if bias is None else bias
