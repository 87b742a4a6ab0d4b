"""The head benchmark compares like with like: its three variants compute the same loss."""

import pytest
import torch

from benchmarks.head_speed import SHAPES, make, points_path
from pyro_gpn.losses import unscented_cross_entropy
from pyro_gpn.moments import Moments
from pyro_gpn.moments.backend import backend


@pytest.mark.parametrize("name", ["letter", "digits-cnn"])
def test_variants_agree(name):
    (mean, var, weight, bias), target = make(SHAPES[name])
    old = points_path(mean, var, weight, bias, target)
    for kind in ("reference", "auto"):
        with backend(kind):
            new = unscented_cross_entropy(Moments(mean, var=var), target, weight, bias)
        torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-6)
