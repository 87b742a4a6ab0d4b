"""MNIST handwritten digits from the original IDX files.

Pixels are divided by 255, so inputs lie in [0, 1] (the paper's rescaling; a fixed range rather
than per-pixel training min/max, which would be undefined for the always-blank border pixels).
Images are flattened row by row to 784 features; labels are the digits 0..9.

Two experiments:

* ``load_mnist``: the paper's setting, 60,000 training images (of which a seeded, stratified
  10 % is held out for validation) and the official 10,000 test images.
* ``load_mnist_test_only``: a reduced experiment that needs only the two ``t10k`` files: the
  10,000 official test images are split, stratified and seeded by ``split``, into 8,000 for
  training (7,200 train + 800 validation) and 2,000 for testing. Numbers from it are not
  comparable with the paper's and must be reported as such (``description`` says so).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from pyro_gpn.data.dataset import ClassificationData
from pyro_gpn.data.download import DataDir, RemoteFile, fetch
from pyro_gpn.data.splits import holdout_split

__all__ = ["load_mnist", "load_mnist_test_only", "read_idx"]

_MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist"
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"
_TEST_ONLY_HOLDOUT = 0.2
_CLASSES = tuple(str(digit) for digit in range(10))
_FEATURES = tuple(f"pixel[{row},{col}]" for row in range(28) for col in range(28))


def _remote(name: str) -> RemoteFile:
    return RemoteFile(f"mnist/{name}", f"{_MIRROR}/{name}")


TRAIN_IMAGES = _remote("train-images-idx3-ubyte.gz")
TRAIN_LABELS = _remote("train-labels-idx1-ubyte.gz")
TEST_IMAGES = _remote("t10k-images-idx3-ubyte.gz")
TEST_LABELS = _remote("t10k-labels-idx1-ubyte.gz")


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (gzip-compressed or not) into an array of its stored type and shape.

    Format: two zero bytes, a type code (``0x08`` uint8, ``0x09`` int8, ``0x0B`` int16,
    ``0x0C`` int32, ``0x0D`` float32, ``0x0E`` float64), the number of dimensions ``k``, ``k``
    big-endian uint32 sizes, then the data in C order.
    """
    raw = Path(path).read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file (header {raw[:4].hex()})")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int(n) for n in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    offset = 4 + 4 * ndim
    if len(raw) - offset != dtype.itemsize * int(np.prod(shape)):
        raise ValueError(f"{path}: header promises shape {shape}, data size does not match")
    return (
        np.frombuffer(raw, dtype=dtype, offset=offset)
        .reshape(shape)
        .astype(dtype.newbyteorder("="))
    )


def _digits(
    images: RemoteFile, labels: RemoteFile, data_dir: DataDir, download: bool, hint: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    x = read_idx(fetch(images, data_dir, download=download, hint=hint))
    y = read_idx(fetch(labels, data_dir, download=download))
    if x.ndim != 3 or x.shape[0] != y.shape[0]:
        raise ValueError(f"{images.path} {x.shape} and {labels.path} {y.shape} do not match")
    return x.reshape(len(x), -1).astype(np.float32) / 255.0, y.astype(np.int64)


def load_mnist(
    data_dir: DataDir = None, *, seed: int = 0, val_fraction: float = 0.1, download: bool = True
) -> ClassificationData:
    """MNIST, official split: 60,000 training images (validation held out) / 10,000 test."""
    hint = (
        "The full MNIST experiment needs the 60,000 training images; without them, "
        "load_dataset('mnist-test-only') runs the reduced experiment on the 10,000 test images."
    )
    x_train, y_train = _digits(TRAIN_IMAGES, TRAIN_LABELS, data_dir, download, hint)
    x_test, y_test = _digits(TEST_IMAGES, TEST_LABELS, data_dir, download)
    return ClassificationData.from_arrays(
        "mnist",
        x_train,
        y_train,
        x_test,
        y_test,
        feature_names=_FEATURES,
        class_names=_CLASSES,
        description="MNIST, official 60,000 / 10,000 split; pixels / 255",
        seed=seed,
        val_fraction=val_fraction,
    )


def load_mnist_test_only(
    data_dir: DataDir = None,
    *,
    split: int = 0,
    seed: int = 0,
    val_fraction: float = 0.1,
    download: bool = True,
) -> ClassificationData:
    """Reduced MNIST on the 10,000 official test images: stratified 8,000 / 2,000 by ``split``."""
    x, y = _digits(TEST_IMAGES, TEST_LABELS, data_dir, download)
    train, test = holdout_split(len(y), _TEST_ONLY_HOLDOUT, seed=split, strata=y)
    return ClassificationData.from_arrays(
        "mnist-test-only",
        x[train],
        y[train],
        x[test],
        y[test],
        feature_names=_FEATURES,
        class_names=_CLASSES,
        description=f"REDUCED MNIST: only the 10,000 official test images, split stratified "
        f"8,000 train / 2,000 test with seed {split}; not comparable with the full benchmark; "
        f"pixels / 255",
        seed=seed,
        val_fraction=val_fraction,
    )
