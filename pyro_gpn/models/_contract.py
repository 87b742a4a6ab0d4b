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
from torch import Tensor

from .._validation import check_finite, check_ndim, check_shape, check_tensor
from ..heads import Head

__all__ = ["check_batch", "check_num_data", "data_plate"]


def check_num_data(num_data: int | None) -> int | None:
    """``num_data`` is a positive integer or ``None``."""
    if num_data is not None and (not isinstance(num_data, int) or num_data < 1):
        raise ValueError(f"num_data must be a positive integer or None, got {num_data!r}")
    return num_data


def check_batch(
    head: Head, num_inputs: int, x: Tensor, y: Tensor | None, num_data: int | None
) -> None:
    """Check a batch at the model's boundary: ``x [B, M]`` finite, ``y`` fits the head, and
    ``B <= num_data``."""
    check_tensor("x", x)
    check_ndim("x", x, 2)
    check_shape("x", x, (None, num_inputs))
    check_finite("x", x)
    if y is None:  # prediction: num_data only scales the likelihood of observed targets
        return
    check_num_data(num_data)
    if num_data is not None and x.shape[0] > num_data:
        raise ValueError(f"x has {x.shape[0]} samples, more than num_data={num_data}")
    head.check_target(y, x.shape[0])


def data_plate(batch: int, num_data: int | None, device: torch.device) -> pyro.plate:
    """The plate ``"data"`` of ``num_data`` samples (``None``: ``batch``), subsampled to the
    ``batch`` given, so that its sites are scaled by ``num_data / batch``."""
    size = batch if num_data is None else num_data
    return pyro.plate("data", size, subsample=torch.arange(batch, device=device), dim=-1)
