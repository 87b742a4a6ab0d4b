"""Dataset loaders: download, checksum, cache, preprocess and split (paper, "Datasets").

>>> from pyro_gpn.data import load_dataset
>>> data = load_dataset("yacht")  # shipped with the package, no network needed
>>> data.x_train.shape[1], data.y_train.shape[1]
(6, 1)

Raw files are looked up in ``data_dir`` (or ``$PYRO_GPN_DATA_DIR``, default
``~/.cache/pyro_gpn``), verified against the checksums in ``bundled/CHECKSUMS`` and downloaded
atomically when missing; see :mod:`pyro_gpn.data.download`.
"""

from pyro_gpn.data.dataset import ClassificationData, Dataset, RegressionData
from pyro_gpn.data.download import ChecksumError, DataUnavailableError, default_data_dir
from pyro_gpn.data.mnist import load_mnist, load_mnist_test_only, read_idx
from pyro_gpn.data.registry import available_datasets, load_dataset
from pyro_gpn.data.synthetic import synthetic_1d
from pyro_gpn.data.uci import load_adult, load_connect4, load_letter
from pyro_gpn.data.uci_regression import REGRESSION_DATASETS, load_uci_regression

__all__ = [
    "REGRESSION_DATASETS",
    "ChecksumError",
    "ClassificationData",
    "DataUnavailableError",
    "Dataset",
    "RegressionData",
    "available_datasets",
    "default_data_dir",
    "load_adult",
    "load_connect4",
    "load_dataset",
    "load_letter",
    "load_mnist",
    "load_mnist_test_only",
    "load_uci_regression",
    "read_idx",
    "synthetic_1d",
]
