"""The model--inference contract every Pyro model of the package follows.

* ``model(x, y=None, num_data=None)`` and ``guide(x, y=None, num_data=None)`` take a (mini-)batch
  ``x [B, M]`` and open the plate ``"data"`` of size ``num_data`` (the call's, else the model's
  attribute, else ``B``) subsampled to the batch, so every site inside it is scaled by
  ``num_data / B`` (the convention of ``pyro.contrib.gp``'s ``VariationalSparseGP``);
* ``forward(x)`` returns the posterior predictive :class:`~pyro_gpn.moments.gaussian.Moments`;
* ``predict(x)`` returns a :class:`~pyro_gpn.heads.Prediction` (mean and std, or class
  probabilities and their std).

:func:`~pyro_gpn.inference.fit_svi` slices the batches and passes ``num_data``; it never inspects
the model.
"""

from __future__ import annotations

import pyro
import torch
from torch import Tensor, nn

from .._validation import (
    as_input,
    check_device,
    check_inputs,
    check_int,
    check_ndim,
    check_parameters_finite,
    check_shape,
    check_tensor,
)
from ..heads import Head

__all__ = ["check_batch", "check_num_data", "data_plate"]


def check_num_data(num_data: int | None) -> int | None:
    """``num_data`` is a positive integer (Python's or NumPy's, returned as ``int``; not a
    bool, which ``isinstance`` counts as 1) or ``None``."""
    return check_int("num_data", num_data, 1, none_ok=True)


def check_batch(
    head: Head,
    num_inputs: int,
    x: Tensor,
    y: Tensor | None,
    num_data: int | None,
    module: nn.Module | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Check a batch at the model's boundary and return it in the parameters' dtype.

    ``x [B, M]`` floating (a tensor or NumPy array; cast to the parameters' dtype and on their
    device, the rule of :mod:`pyro_gpn._validation`), finite, with ``B >= 1`` when ``y`` is
    observed and ``B <= num_data``; ``y`` fits the head (floating targets cast likewise). With
    ``module``, its parameters are checked to be finite (while validation is on).

    Returns:
        ``(x, y)``, cast.
    """
    like = next(iter(module.parameters()), None) if module is not None else None
    if like is None:
        like = next(iter(head.parameters()), None)
    where = "the model's parameters are"
    if like is not None:
        x = as_input("x", x, like, where)
    check_tensor("x", x)
    check_ndim("x", x, 2)
    check_shape("x", x, (None, num_inputs))
    check_inputs("x", x)
    if module is not None:
        check_parameters_finite(module, f"the {type(module).__name__}")
    if y is None:  # prediction: num_data only scales the likelihood of observed targets
        return x, y
    if x.shape[0] == 0:
        raise ValueError(
            "x has 0 samples (rows): an empty batch has no likelihood to scale by num_data; "
            "give at least one row"
        )
    num_data = check_num_data(num_data)
    if num_data is not None and x.shape[0] > num_data:
        raise ValueError(f"x has {x.shape[0]} samples, more than num_data={num_data}")
    if isinstance(y, Tensor) and like is not None:
        check_device("y", y, like.device, where)
        if y.is_floating_point() and y.dtype != like.dtype:
            y = y.to(like.dtype)
    head.check_target(y, x.shape[0])
    return x, y


def data_plate(batch: int, num_data: int | None, device: torch.device) -> pyro.plate:
    """The plate ``"data"`` of ``num_data`` samples (``None``: ``batch``), subsampled to the
    ``batch`` given, so that its sites are scaled by ``num_data / batch``."""
    size = batch if num_data is None else num_data
    return pyro.plate("data", size, subsample=torch.arange(batch, device=device), dim=-1)
