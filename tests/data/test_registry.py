from pathlib import Path

import pytest

from pyro_gpn.data import ClassificationData, RegressionData, available_datasets, load_dataset


def test_available_datasets() -> None:
    names = available_datasets()
    assert names[:5] == ("letter", "adult", "connect4", "mnist", "mnist-test-only")
    assert len(names) == 14 and "yacht" in names and "protein" in names


def test_dispatch_and_options(shared_data: Path) -> None:
    assert isinstance(load_dataset("yacht", split=2, seed=1), RegressionData)
    data = load_dataset("connect-4", shared_data, split=0, val_fraction=0.2)
    assert isinstance(data, ClassificationData) and data.name == "connect4"
    assert len(data.x_val) == pytest.approx(0.2 * (len(data.x_train) + len(data.x_val)), abs=1)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="name must be one of"):
        load_dataset("cifar10")
    with pytest.raises(ValueError, match="split must be 0"):
        load_dataset("letter", split=1)
    with pytest.raises(ValueError, match="bundled"):
        load_dataset("adult", bundled=True)
    with pytest.raises(ValueError, match="split must be a non-negative integer"):
        load_dataset("connect4", split=-1)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        load_dataset("yacht", seed=1.5)
    with pytest.raises(ValueError, match="val_fraction=0.999 holds out all"):
        load_dataset("yacht", val_fraction=0.999)  # the bundled copy; x_train had 0 rows
