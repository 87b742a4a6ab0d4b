import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_gpn.data import DataUnavailableError, download, load_mnist, load_mnist_test_only
from pyro_gpn.data.mnist import read_idx

_CODES = {"u1": 0x08, "i1": 0x09, "i2": 0x0B, "i4": 0x0C, "f4": 0x0D, "f8": 0x0E}


def _idx_bytes(array: np.ndarray) -> bytes:
    kind = array.dtype.str[1:]
    header = bytes([0, 0, _CODES[kind], array.ndim]) + np.array(array.shape, ">u4").tobytes()
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


@pytest.mark.parametrize("dtype", ["u1", "i1", "i2", "i4", "f4", "f8"])
@pytest.mark.parametrize("compressed", [False, True])
def test_read_idx_round_trip(tmp_path: Path, dtype: str, compressed: bool) -> None:
    array = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    raw = _idx_bytes(array)
    path = tmp_path / "a.idx"
    path.write_bytes(gzip.compress(raw) if compressed else raw)
    out = read_idx(path)
    assert out.shape == (2, 3, 4) and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, array)


def test_read_idx_rejects_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(path)
    path.write_bytes(_idx_bytes(np.zeros((3, 2), np.uint8))[:-1])
    with pytest.raises(ValueError, match="does not match"):
        read_idx(path)


def test_full_mnist_runs_end_to_end_on_synthetic_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (100, 28, 28)).astype(np.uint8),
        "train-labels-idx1-ubyte.gz": np.repeat(np.arange(10, dtype=np.uint8), 10),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (20, 28, 28)).astype(np.uint8),
        "t10k-labels-idx1-ubyte.gz": np.repeat(np.arange(10, dtype=np.uint8), 2),
    }
    (tmp_path / "mnist").mkdir()
    manifest = {}
    for name, array in arrays.items():
        payload = gzip.compress(_idx_bytes(array))
        (tmp_path / "mnist" / name).write_bytes(payload)
        manifest[f"mnist/{name}"] = ("sha256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(download, "_manifest", lambda: manifest)

    data = load_mnist(tmp_path)
    assert (len(data.x_train), len(data.x_val), len(data.x_test)) == (90, 10, 20)
    assert data.num_features == 784 and data.num_classes == 10
    assert torch.bincount(data.y_val).tolist() == [1] * 10
    images = arrays["t10k-images-idx3-ubyte.gz"].reshape(20, 784) / 255.0
    np.testing.assert_allclose(data.x_test.numpy(), images, rtol=1e-6)
    assert data.y_test.tolist() == arrays["t10k-labels-idx1-ubyte.gz"].tolist()


def test_missing_train_images_points_to_the_reduced_experiment(shared_data: Path) -> None:
    with pytest.raises(DataUnavailableError) as error:
        load_mnist(shared_data)
    message = str(error.value)
    assert "train-images-idx3-ubyte.gz" in message
    assert "f68b3c2dcbeaaa9fbdd348bbdeb94873" in message
    assert "mnist-test-only" in message


def test_mnist_test_only(shared_data: Path) -> None:
    data = load_mnist_test_only(shared_data)
    assert (len(data.x_train), len(data.x_val), len(data.x_test)) == (7_200, 800, 2_000)
    assert data.x_train.dtype == torch.float32 and data.num_features == 784
    assert data.x_train.min() == 0.0 and data.x_train.max() == 1.0
    all_labels = torch.cat([data.y_train, data.y_val, data.y_test])
    counts = torch.bincount(all_labels, minlength=10)
    assert counts.sum() == 10_000 and counts[1] == 1_135  # t10k holds 1,135 ones
    share = torch.bincount(data.y_test, minlength=10) / counts
    assert torch.allclose(share, torch.full((10,), 0.2), atol=2e-3)
    assert "REDUCED" in data.description
    other = load_mnist_test_only(shared_data, split=1)
    assert not torch.equal(other.y_test, data.y_test)
