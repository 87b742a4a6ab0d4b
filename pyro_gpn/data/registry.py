"""``load_dataset``: one entry point for every data set, dispatching by name."""

from __future__ import annotations

from collections.abc import Callable

from pyro_gpn.data.dataset import Dataset
from pyro_gpn.data.download import DataDir
from pyro_gpn.data.mnist import load_mnist, load_mnist_test_only
from pyro_gpn.data.uci import load_adult, load_connect4, load_letter
from pyro_gpn.data.uci_regression import REGRESSION_DATASETS, load_uci_regression

__all__ = ["available_datasets", "load_dataset"]

# name -> (loader, whether it has several train / test splits selected by ``split``)
_CLASSIFICATION: dict[str, tuple[Callable[..., Dataset], bool]] = {
    "letter": (load_letter, False),
    "adult": (load_adult, False),
    "connect4": (load_connect4, True),
    "mnist": (load_mnist, False),
    "mnist-test-only": (load_mnist_test_only, True),
}
_ALIASES = {"connect-4": "connect4"}


def available_datasets() -> tuple[str, ...]:
    """Names accepted by :func:`load_dataset`: classification sets, then regression sets."""
    return (*_CLASSIFICATION, *REGRESSION_DATASETS)


def load_dataset(
    name: str,
    data_dir: DataDir = None,
    *,
    seed: int = 0,
    split: int = 0,
    val_fraction: float = 0.1,
    download: bool = True,
    bundled: bool | None = None,
) -> Dataset:
    """Load a data set as training / validation / test tensors.

    Args:
        name: see :func:`available_datasets`; ``"connect-4"`` is accepted for ``"connect4"``.
        data_dir: folder holding (or receiving) the raw files in the layout ``uci/``,
            ``mnist/``, ``uci-regression/<set>/``; default ``$PYRO_GPN_DATA_DIR`` or
            ``~/.cache/pyro_gpn``. Files found there are verified and used in place.
        seed: seed of the validation hold-out (``val_fraction`` of the training split).
        split: which train / test split: the fixed split files of the regression sets, or the
            seed of the random split of ``connect4`` and ``mnist-test-only``; must be 0 for
            ``letter``, ``adult`` and ``mnist``, which have one split.
        val_fraction: share of the training split held out for validation (paper: 10 %).
        download: whether missing files may be downloaded.
        bundled: regression sets only; see
            :func:`~pyro_gpn.data.uci_regression.load_uci_regression`.

    Returns:
        :class:`~pyro_gpn.data.dataset.ClassificationData` or
        :class:`~pyro_gpn.data.dataset.RegressionData`.
    """
    for argument, value in (("seed", seed), ("split", split)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{argument} must be a non-negative integer, got {value!r}")
    key = _ALIASES.get(name, name)
    if key in REGRESSION_DATASETS:
        return load_uci_regression(
            key, data_dir, split=split, seed=seed, val_fraction=val_fraction,
            download=download, bundled=bundled,
        )  # fmt: skip
    if key not in _CLASSIFICATION:
        raise ValueError(f"name must be one of {list(available_datasets())}, got {name!r}")
    if bundled:
        raise ValueError(f"bundled=True: {key!r} does not ship with the package")
    loader, has_splits = _CLASSIFICATION[key]
    options: dict[str, int | float] = {"seed": seed, "val_fraction": val_fraction}
    if has_splits:
        options["split"] = split
    elif split != 0:
        raise ValueError(f"split must be 0 for {key!r}, which has one official split, got {split}")
    return loader(data_dir, download=download, **options)
