"""Count host-device synchronisations: conversions of tensors to Python values."""

from __future__ import annotations

import contextlib
import os
import sys

import torch

_METHODS = ("__bool__", "__float__", "__int__", "item", "tolist")
_OPTIM = os.path.join("torch", "optim", "")


@contextlib.contextmanager
def count_syncs(within: str | None = None):
    """Count syncs (all but torch.optim's), or only those from files whose path has ``within``."""
    counter = {"n": 0}
    originals = {name: getattr(torch.Tensor, name) for name in _METHODS}

    def wrap(original):
        def method(self, *args, **kwargs):
            # torch.optim reads its CPU step counters (no device sync on a GPU): not counted
            caller = sys._getframe(1).f_code.co_filename
            if _OPTIM not in caller and (within is None or within in caller):
                counter["n"] += 1
            return original(self, *args, **kwargs)

        return method

    for name, original in originals.items():
        setattr(torch.Tensor, name, wrap(original))
    try:
        yield counter
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
