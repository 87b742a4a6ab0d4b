"""The return types of the dataset loaders: train / validation / test tensors plus metadata.

Features are float32 ``[S, D]``; class labels int64 ``[S]``; regression targets float32
``[S, 1]``. The validation split is a seeded share (default 10 %, as in the paper's section
"Preprocessing") of the original training split. Preprocessing statistics (ranges, categories,
means, standard deviations) are fitted on the original training split (training + validation
rows), never on the test rows. Dataclass equality is disabled: tensors have no single truth value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pyro_gpn.data.preprocessing import Standardizer
from pyro_gpn.data.splits import holdout_split

__all__ = ["ClassificationData", "Dataset", "RegressionData"]


def _floats(x: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


def _check_finite_array(name: str, values: np.ndarray, columns: tuple[str, ...] = ()) -> None:
    """``ValueError`` naming ``name``, the first bad row and its column unless all finite."""
    values = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(values)
    if not bad.any():
        return
    rows, *cols = np.nonzero(bad.reshape(len(values), -1))
    row, col = int(rows[0]), int(cols[0][0]) if cols else 0
    column = columns[col] if col < len(columns) else f"column {col}"
    kind = "NaN" if np.isnan(values.reshape(len(values), -1)[row, col]) else "infinite"
    raise ValueError(
        f"{name} holds {int(bad.sum())} non-finite values, the first {kind} in row {row}, "
        f"{column!r}: impute or drop them before building the data set"
    )


def _check_val_fraction(val_fraction: float) -> None:
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in [0, 1), got {val_fraction}")


def _holdout(
    num_rows: int, val_fraction: float, seed: int, strata: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~pyro_gpn.data.splits.holdout_split` of the training rows, refusing a
    ``val_fraction`` that leaves no training row, or no validation row when it is positive."""
    keep, val = holdout_split(num_rows, val_fraction, seed, strata=strata)
    if len(keep) == 0:
        raise ValueError(
            f"val_fraction={val_fraction} holds out all {num_rows} training rows and leaves "
            "none to train on: use a smaller val_fraction"
        )
    if val_fraction > 0 and len(val) == 0:
        raise ValueError(
            f"val_fraction={val_fraction} of {num_rows} training rows holds out none: use a "
            "larger val_fraction, or 0 for no validation rows"
        )
    return keep, val


@dataclass(frozen=True, repr=False, eq=False)
class Dataset:
    """Train / validation / test splits of one data set.

    Attributes:
        name: registry name, e.g. ``"adult"``.
        x_train, x_val, x_test: float32 features ``[S, D]``.
        y_train, y_val, y_test: targets (see the subclasses).
        feature_names: one name per feature column (``D`` of them).
        description: provenance and preprocessing in one line; report it with any number
            computed on the data (for example that a split is not the official one).
    """

    name: str
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    feature_names: tuple[str, ...]
    description: str

    @property
    def num_features(self) -> int:
        """Input width ``D``."""
        return self.x_train.shape[1]

    def _summary(self) -> str:
        sizes = (len(self.x_train), len(self.x_val), len(self.x_test))
        return f"name={self.name!r}, train/val/test={sizes}, num_features={self.num_features}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._summary()})"


@dataclass(frozen=True, repr=False, eq=False)
class ClassificationData(Dataset):
    """A classification data set; ``y_*`` are int64 labels ``[S]`` indexing ``class_names``."""

    class_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        """Number of classes ``C``."""
        return len(self.class_names)

    def _summary(self) -> str:
        return f"{super()._summary()}, num_classes={self.num_classes}"

    @classmethod
    def from_arrays(
        cls,
        name: str,
        x_train: np.ndarray,
        y_train: np.ndarray,
        x_test: np.ndarray,
        y_test: np.ndarray,
        *,
        feature_names: tuple[str, ...],
        class_names: tuple[str, ...],
        description: str,
        seed: int = 0,
        val_fraction: float = 0.1,
    ) -> ClassificationData:
        """Hold out a stratified, seeded ``val_fraction`` of the (already encoded) training rows.

        Args:
            x_train, y_train: the original training split, features [S, D] and labels [S].
            x_test, y_test: the test split.
            seed: seed of the validation hold-out (:func:`~pyro_gpn.data.splits.holdout_split`).
            val_fraction: share of the training rows held out for validation.

        Raises:
            ValueError: a ``val_fraction`` outside ``[0, 1)``, or one that leaves no training
                row (or, when positive, no validation row); non-finite features.
        """
        _check_val_fraction(val_fraction)
        _check_finite_array("x_train", x_train, feature_names)
        _check_finite_array("x_test", x_test, feature_names)
        keep, val = _holdout(len(y_train), val_fraction, seed, strata=y_train)
        labels = [torch.from_numpy(np.asarray(y, dtype=np.int64)) for y in (y_train, y_test)]
        return cls(
            name=name,
            x_train=_floats(x_train[keep]),
            y_train=labels[0][keep],
            x_val=_floats(x_train[val]),
            y_val=labels[0][val],
            x_test=_floats(x_test),
            y_test=labels[1],
            feature_names=feature_names,
            description=description,
            class_names=class_names,
        )


@dataclass(frozen=True, repr=False, eq=False)
class RegressionData(Dataset):
    """A regression data set with standardised inputs and targets.

    ``x`` and ``y`` are standardised with the mean and standard deviation of the original
    training split (training + validation rows), as in the UCI regression literature. ``y_*`` are
    float32 ``[S, 1]``. Report RMSE and log-likelihood in original units with
    :meth:`unstandardize`: for a Gaussian predictive, the log density in original units is the
    standardised one minus ``log(y_std)``.

    Attributes:
        x_mean, x_std: float32 ``[D]`` input statistics.
        y_mean, y_std: float32 ``[1]`` target statistics.
    """

    x_mean: Tensor
    x_std: Tensor
    y_mean: Tensor
    y_std: Tensor

    def unstandardize(
        self, mean: Tensor, var: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Map a predictive mean (and variance) of standardised targets to original units."""
        mean = mean * self.y_std + self.y_mean
        return mean, None if var is None else var * self.y_std**2

    @classmethod
    def from_arrays(
        cls,
        name: str,
        x: np.ndarray,
        y: np.ndarray,
        train_index: np.ndarray,
        test_index: np.ndarray,
        *,
        feature_names: tuple[str, ...],
        description: str,
        seed: int = 0,
        val_fraction: float = 0.1,
    ) -> RegressionData:
        """Standardise with training statistics and hold out a seeded validation share.

        Args:
            x, y: all rows, inputs [S, D] and targets [S].
            train_index, test_index: rows of the fixed training and test split.
            seed: seed of the validation hold-out.
            val_fraction: share of the training rows held out for validation.

        Raises:
            ValueError: a ``val_fraction`` outside ``[0, 1)``, or one that leaves no training
                row (or, when positive, no validation row); non-finite inputs or targets.
        """
        _check_val_fraction(val_fraction)
        _check_finite_array("x", x, feature_names)
        _check_finite_array("y", y)
        y = np.asarray(y, dtype=np.float64).reshape(-1, 1)
        x_scaler = Standardizer().fit(x[train_index])
        y_scaler = Standardizer().fit(y[train_index])
        keep, val = _holdout(len(train_index), val_fraction, seed)
        parts = {"train": train_index[keep], "val": train_index[val], "test": test_index}
        xs = {k: _floats(x_scaler.transform(x[rows])) for k, rows in parts.items()}
        ys = {k: _floats(y_scaler.transform(y[rows])) for k, rows in parts.items()}
        return cls(
            name=name,
            x_train=xs["train"],
            y_train=ys["train"],
            x_val=xs["val"],
            y_val=ys["val"],
            x_test=xs["test"],
            y_test=ys["test"],
            feature_names=feature_names,
            description=description,
            x_mean=_floats(x_scaler.mean),
            x_std=_floats(x_scaler.std),
            y_mean=_floats(y_scaler.mean),
            y_std=_floats(y_scaler.std),
        )
