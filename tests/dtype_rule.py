"""One assertion shared by the blocks' tests: the dtype rule of :mod:`pyro_gpn._validation`."""

import pytest
import torch


def assert_follows_dtype_rule(layer, x: torch.Tensor) -> None:
    """``layer`` (float32 parameters) casts float64 and float16 tensors and NumPy arrays of
    ``x`` to float32, giving ``layer(x)``'s moments, and refuses integer inputs naming them."""
    want = layer(x)
    for given in (x.double(), x.numpy()):
        got = layer(given)
        assert got.mean.dtype == torch.float32
        torch.testing.assert_close(got.mean, want.mean)
        torch.testing.assert_close(got.var, want.var)
    half = x.half()
    torch.testing.assert_close(layer(half).mean, layer(half.float()).mean)
    with pytest.raises(ValueError, match="inputs must be a floating-point tensor"):
        layer(torch.ones(x.shape, dtype=torch.long))
