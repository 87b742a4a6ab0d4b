"""The Moments container: validation at the boundary and linear maps."""

import math

import pytest
import torch

from pyro_gpn.moments import Moments
from tests.mc import assert_mc_covariance, assert_mc_mean, random_covariance

DT = torch.float64


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mean": torch.zeros(3)}, "mean must have 2 dimensions"),
        ({"mean": torch.tensor([[0.0, math.nan]])}, "mean contains NaN"),
        ({"mean": torch.tensor([[0.0, math.inf]])}, "mean contains infinite"),
        ({"mean": torch.zeros(2, 3), "var": torch.zeros(2, 4)}, "var must have shape"),
        ({"mean": torch.zeros(2, 3), "var": -torch.ones(2, 3)}, "var must be non-negative"),
        ({"mean": torch.zeros(2, 3), "var": torch.full((2, 3), math.nan)}, "var contains NaN"),
        (
            {"mean": torch.zeros(1, 2), "cov": torch.tensor([[[1.0, 2.0], [2.0, 1.0]]])},
            "cov must be positive semi-definite",
        ),
        (
            {"mean": torch.zeros(1, 2), "cov": torch.tensor([[[1.0, 0.5], [0.0, 1.0]]])},
            "cov must be symmetric",
        ),
        ({"mean": torch.zeros(1, 2), "cov": torch.eye(3)[None]}, "cov must have shape"),
        (
            {"mean": torch.zeros(1, 2), "var": torch.ones(1, 2), "cov": torch.eye(2)[None]},
            "at most one",
        ),
    ],
)
def test_bad_input_raises_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Moments(**kwargs)


def test_integer_mean_is_rejected():
    with pytest.raises(ValueError, match="floating-point"):
        Moments(torch.zeros(2, 2, dtype=torch.long))


def test_views():
    m = Moments(torch.ones(2, 3), var=torch.full((2, 3), 2.0))
    assert m.num_samples == 2 and m.num_features == 3
    torch.testing.assert_close(m.covariance, torch.diag_embed(m.var))
    torch.testing.assert_close(m.second_moment, torch.full((2, 3), 3.0))
    point = Moments(torch.ones(2, 3))
    assert point.is_deterministic and bool((point.variance == 0).all())
    assert m[:1].num_samples == 1


def test_linear_maps_match_monte_carlo():
    g = torch.Generator().manual_seed(0)
    mean, cov = torch.randn(2, 3, dtype=DT, generator=g), random_covariance(2, 3, generator=g)
    weight, bias = torch.randn(3, 4, dtype=DT, generator=g), torch.randn(4, dtype=DT, generator=g)
    x = mean + (
        torch.linalg.cholesky(cov) @ torch.randn(50000, 2, 3, 1, dtype=DT, generator=g)
    ).squeeze(-1)
    y = x @ weight + bias
    full = Moments(mean, cov=cov).linear(weight, bias)
    assert_mc_mean(y, full.mean)
    assert_mc_covariance(y, full.cov)
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    diag_full = Moments(mean, var=var).linear_full(weight, bias)
    xd = mean + var.sqrt() * torch.randn(50000, 2, 3, dtype=DT, generator=g)
    assert_mc_covariance(xd @ weight + bias, diag_full.cov)
    diag = Moments(mean, var=var).linear(weight, bias)
    torch.testing.assert_close(diag.var, torch.diagonal(diag_full.cov, dim1=-2, dim2=-1))
