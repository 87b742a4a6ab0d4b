"""Tests of the shared argument and data checks of the NUTS models (both models call them, so a
wrong message or a missed bad value shows in both)."""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch

from pyro_gpn.models import NonParametricGPN, SampledTargetsGPN
from pyro_gpn.models.nuts_inputs import (
    check_positive,
    check_prior,
    check_sizes,
    check_xy,
    class_probs,
    default_noise_prior,
    per_layer,
)

F64 = torch.float64


@pytest.mark.parametrize(
    ("sizes", "likelihood", "match"),
    [
        ([3], "gaussian", "sizes"),
        ([2, 0, 1], "gaussian", "sizes"),
        ([2, 1], "poisson", "likelihood"),
        ([2, 2], "bernoulli", "bernoulli"),
        ([2, 1], "categorical", "categorical"),
    ],
)
def test_bad_sizes_raise(sizes, likelihood, match):
    with pytest.raises(ValueError, match=match):
        check_sizes(sizes, likelihood)


def test_sizes_become_ints():
    assert check_sizes((2.0, 3, 1), "gaussian") == [2, 3, 1]


@pytest.mark.parametrize("sizes", [[2, True], [2, 2.5], "21", [2, None]])
def test_sizes_that_are_not_integers_raise(sizes):
    """``int(True)`` and ``int(2.5)`` would silently build another network."""
    with pytest.raises(ValueError, match="sizes must be integers"):
        check_sizes(sizes, "gaussian")


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_check_positive(value):
    with pytest.raises(ValueError, match="weight_scale must be positive"):
        check_positive("weight_scale", value)
    if value == 0.0:
        assert check_positive("jitter", value, allow_zero=True) == 0.0
    else:
        with pytest.raises(ValueError, match="jitter must be non-negative"):
            check_positive("jitter", value, allow_zero=True)


def test_priors_and_per_layer():
    check_prior("noise_prior", None)
    check_prior("noise_prior", dist.HalfNormal(1.0))
    with pytest.raises(ValueError, match="noise_prior must be a pyro Distribution"):
        check_prior("noise_prior", 0.1)
    with pytest.raises(ValueError, match="over scalars"):
        check_prior("noise_prior", dist.MultivariateNormal(torch.zeros(2), torch.eye(2)))
    assert per_layer("p", None, 3) == [None, None, None]
    with pytest.raises(ValueError, match="one entry per layer"):
        per_layer("noise_prior", [None], 2)
    prior = default_noise_prior(F64)
    assert prior.mean.dtype == F64
    torch.testing.assert_close(
        prior.icdf(torch.tensor(0.5, dtype=F64)), torch.tensor(0.1, dtype=F64)
    )


@pytest.mark.parametrize(
    ("likelihood", "y", "match"),
    [
        ("gaussian", torch.zeros(5), "y_train must have shape"),
        ("gaussian", torch.tensor([0.0, float("nan"), 0.0, 0.0]), "y_train contains NaN"),
        ("bernoulli", torch.tensor([0, 1, 2, 0]), r"labels in \[0, 2\)"),
        ("bernoulli", torch.tensor([0, 1, 0.5, 0]), "integer class labels"),
        ("bernoulli", torch.zeros(3), "one class label per row"),
        ("categorical", torch.tensor([0, 1, 3, 0]), r"labels in \[0, 3\)"),
    ],
)
def test_bad_targets_raise(likelihood, y, match):
    sizes = [2, 3] if likelihood == "categorical" else [2, 1]
    with pytest.raises(ValueError, match=match):
        check_xy(sizes, likelihood, F64, torch.zeros(4, 2), y)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="x_test must have 2 columns"):
        check_xy([2, 1], "gaussian", F64, torch.zeros(4, 2), None, torch.zeros(3, 1))
    with pytest.raises(ValueError, match="x_test contains"):
        check_xy([2, 1], "gaussian", F64, torch.zeros(4, 2), None, torch.full((3, 2), torch.inf))
    with pytest.raises(ValueError, match="at least one row"):
        check_xy([2, 1], "gaussian", F64, torch.zeros(0, 2), None)
    with pytest.raises(TypeError, match="y_train must be a torch.Tensor"):
        check_xy([2, 1], "bernoulli", F64, torch.zeros(4, 2), [0, 1, 0, 1])


def test_converted_shapes_and_dtypes():
    x, y, xt = check_xy([2, 1], "gaussian", F64, torch.zeros(4, 2), torch.ones(4), torch.ones(1, 2))
    assert x.dtype == y.dtype == xt.dtype == F64 and y.shape == (4, 1)
    _, y, _ = check_xy(
        [2, 1], "bernoulli", F64, torch.zeros(4, 2), torch.tensor([[0], [1], [1], [0]])
    )
    assert y.shape == (4,) and y.dtype == F64
    _, y, _ = check_xy([2, 3], "categorical", F64, torch.zeros(4, 2), torch.tensor([0.0, 2, 1, 0]))
    assert y.dtype == torch.long and y.tolist() == [0, 2, 1, 0]


def test_class_probs():
    logits = torch.tensor([[0.0], [2.0]], dtype=F64)
    p = class_probs(logits, "bernoulli")
    torch.testing.assert_close(p[:, 1], torch.sigmoid(logits[:, 0]))
    torch.testing.assert_close(p.sum(-1), torch.ones(2, dtype=F64))
    logits = torch.tensor([[0.0, 1.0, -1.0]], dtype=F64)
    want = logits.exp() / logits.exp().sum()
    torch.testing.assert_close(class_probs(logits, "categorical"), want)
    with pytest.raises(ValueError, match="likelihood"):
        class_probs(logits, "gaussian")


@pytest.mark.parametrize("model", [NonParametricGPN, SampledTargetsGPN])
def test_both_models_share_the_checks(model):
    """The same bad label is rejected by both models with the same message."""
    gpn = model([2, 1], likelihood="bernoulli")
    with pytest.raises(ValueError, match=r"integer class labels in \[0, 2\)"):
        gpn.model(torch.zeros(3, 2, dtype=F64), torch.tensor([0, 2, 1]))
    with pytest.raises(ValueError, match="jitter must be non-negative"):
        model([2, 1], jitter=-1.0)
