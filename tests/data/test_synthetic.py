"""Tests of the synthetic 1-D regression problem."""

from __future__ import annotations

import numpy as np
import pytest

from pyro_gpn.data import RegressionData, synthetic_1d


def test_synthetic_1d_has_a_gap():
    data = synthetic_1d(n_train=200, n_test=50, seed=3)
    x = data.x_train[:, 0] * data.x_std + data.x_mean
    assert isinstance(data, RegressionData) and data.num_features == 1
    assert len(data.x_train) + len(data.x_val) == 200 and len(data.x_test) == 50
    assert not ((x > -0.5) & (x < 0.5)).any()
    assert float(data.y_std) > 0


def test_synthetic_1d_targets_follow_the_sine_and_are_seeded():
    data = synthetic_1d(n_train=400, n_test=400, seed=1, noise_std=0.1)
    x = (data.x_test[:, 0] * data.x_std + data.x_mean).double().numpy()
    y = (data.y_test[:, 0] * data.y_std + data.y_mean).double().numpy()
    residual = y - np.sin(3.0 * x)
    assert abs(residual.mean()) < 0.03 and residual.std() == pytest.approx(0.1, rel=0.15)
    again = synthetic_1d(n_train=400, n_test=400, seed=1, noise_std=0.1)
    assert bool((again.x_test == data.x_test).all())


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"gap": (1.0, 0.0)}, "gap"),
        ({"n_train": 5}, "n_train"),
        ({"n_test": 0}, "n_test"),
        # NumPy's seeding error, and targets with the noise's sign flipped or NaN
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"seed": "a"}, "seed must be a non-negative integer"),
        ({"noise_std": -1.0}, "noise_std must be a non-negative finite number"),
        ({"noise_std": float("nan")}, "noise_std must be a non-negative finite number"),
    ],
)
def test_synthetic_1d_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        synthetic_1d(**kwargs)
