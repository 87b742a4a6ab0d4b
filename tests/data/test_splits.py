import numpy as np
import pytest

from pyro_gpn.data.splits import holdout_split


def test_partition_is_disjoint_complete_and_sized() -> None:
    kept, held = holdout_split(101, 0.1, seed=3)
    assert len(held) == 10
    assert np.array_equal(np.sort(np.concatenate([kept, held])), np.arange(101))
    assert np.all(np.diff(kept) > 0) and np.all(np.diff(held) > 0)


def test_seed_determines_the_partition() -> None:
    a = holdout_split(1000, 0.25, seed=0)[1]
    assert np.array_equal(a, holdout_split(1000, 0.25, seed=0)[1])
    assert not np.array_equal(a, holdout_split(1000, 0.25, seed=1)[1])


def test_stratified_split_keeps_proportions_and_total() -> None:
    strata = np.repeat([0, 1, 2], [7, 150, 843])
    _, held = holdout_split(len(strata), 0.1, seed=0, strata=strata)
    assert len(held) == 100
    counts = np.bincount(strata[held], minlength=3)
    assert np.all(np.abs(counts - 0.1 * np.array([7, 150, 843])) < 1)


def test_zero_fraction_holds_out_nothing() -> None:
    kept, held = holdout_split(5, 0.0, seed=0)
    assert len(held) == 0 and len(kept) == 5


@pytest.mark.parametrize("fraction", [-0.1, 1.0])
def test_bad_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        holdout_split(10, fraction, seed=0)


def test_negative_seed() -> None:
    with pytest.raises(ValueError, match="seed"):
        holdout_split(10, 0.1, seed=-1)


def test_strata_length_checked() -> None:
    with pytest.raises(ValueError, match="strata"):
        holdout_split(10, 0.1, seed=0, strata=np.zeros(9))
