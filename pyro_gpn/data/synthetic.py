"""Synthetic data sets for tests, notebooks and the route comparison.

:func:`synthetic_1d` is a 1-D regression problem ``y = sin(3 x) + noise`` with a gap in the
training inputs, so that predictive bands show epistemic uncertainty where there are no data.
"""

from __future__ import annotations

import math

import numpy as np

from pyro_gpn._validation import check_int
from pyro_gpn.data.dataset import RegressionData

__all__ = ["synthetic_1d"]


def synthetic_1d(
    n_train: int = 60,
    n_test: int = 100,
    seed: int = 0,
    noise_std: float = 0.1,
    gap: tuple[float, float] = (-0.5, 0.5),
    x_range: tuple[float, float] = (-2.0, 2.0),
) -> RegressionData:
    """A 1-D regression problem ``y = sin(3 x) + N(0, noise_std^2)`` with a gap.

    Training inputs are uniform on ``x_range`` minus ``gap`` (no training data in the gap), test
    inputs uniform on the whole ``x_range``, so test points in the gap probe the epistemic
    uncertainty. Returned as :class:`~pyro_gpn.data.RegressionData` standardised with training
    statistics; 10 % of the ``n_train`` training rows are held out for validation.

    Raises:
        ValueError: naming the argument: ``n_train < 10``, ``n_test < 1``, a ``seed`` that is
            not a non-negative integer, a ``noise_std`` that is negative or not finite, or a
            ``gap`` that is not an interval inside ``x_range``.
    """
    n_train = check_int("n_train", n_train, 10)
    n_test = check_int("n_test", n_test, 1)
    seed = check_int("seed", seed, 0)
    if (
        isinstance(noise_std, bool)
        or not isinstance(noise_std, (int, float, np.number))
        or not math.isfinite(noise_std)
        or noise_std < 0
    ):
        raise ValueError(f"noise_std must be a non-negative finite number, got {noise_std!r}")
    lo, hi = x_range
    if not (lo <= gap[0] < gap[1] <= hi):
        raise ValueError(f"gap {gap} must be an interval inside x_range {x_range}")
    rng = np.random.default_rng(seed)
    width = (hi - lo) - (gap[1] - gap[0])
    u = rng.uniform(0.0, width, n_train)
    x_train = np.where(u < gap[0] - lo, lo + u, gap[1] + u - (gap[0] - lo))
    x = np.concatenate([x_train, rng.uniform(lo, hi, n_test)])[:, None]
    y = np.sin(3.0 * x[:, 0]) + noise_std * rng.standard_normal(len(x))
    index = np.arange(n_train + n_test)
    return RegressionData.from_arrays(
        "synthetic-1d",
        x,
        y,
        index[:n_train],
        index[n_train:],
        feature_names=("x",),
        description=(
            f"synthetic y = sin(3x) + N(0, {noise_std}^2); train x ~ U({x_range}) without the "
            f"gap {gap} ({n_train} rows, 10 % held out for validation), test x ~ U({x_range}) "
            f"({n_test} rows); data seed {seed}"
        ),
        seed=seed,
    )
