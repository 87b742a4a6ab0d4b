"""Feature encoding fitted on training data only: [0, 1] rescaling, one-hot codes, standardising.

The paper (section "Preprocessing") rescales continuous inputs to [0, 1] and one-hot encodes
categorical ones. Every statistic here (minimum, maximum, the category list, mean, standard
deviation) comes from the rows passed to ``fit``; the loaders pass the official training split,
so nothing is learned from test data. Consequences, by design and never hidden by clipping:

* a test value outside the training range maps outside [0, 1] (below 0 or above 1);
* a category that does not occur in the training rows is encoded as all zeros;
* a feature that is constant on the training rows (maximum == minimum, tested exactly, since a
  floating-point standard deviation of equal values can come out as 1e-16 instead of 0) has its
  range or standard deviation set to 1, so it maps to ``value - min`` or ``value - mean``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["MinMaxScaler", "OneHotEncoder", "Standardizer", "TabularEncoder"]


def _safe_scale(scale: np.ndarray, constant: np.ndarray) -> np.ndarray:
    return np.where(constant | ~np.isfinite(scale), 1.0, scale)


@dataclass
class MinMaxScaler:
    """Map each column affinely so that the fitted rows span [0, 1]; NaNs are ignored by ``fit``."""

    minimum: np.ndarray | None = None
    scale: np.ndarray | None = None

    def fit(self, x: np.ndarray) -> MinMaxScaler:
        """Record column minima and ranges of ``x`` [S, D]."""
        self.minimum = np.nanmin(x, axis=0)
        span = np.nanmax(x, axis=0) - self.minimum
        self.scale = _safe_scale(span, span == 0)
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        """``(x - minimum) / scale`` for ``x`` [S, D]; NaNs stay NaN."""
        if self.minimum is None or self.scale is None:
            raise RuntimeError("MinMaxScaler.transform called before fit")
        return (x - self.minimum) / self.scale


@dataclass
class Standardizer:
    """Map each column to zero mean and unit standard deviation over the fitted rows."""

    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    def fit(self, x: np.ndarray) -> Standardizer:
        """Record column means and (population) standard deviations of ``x`` [S, D]."""
        self.mean = x.mean(axis=0)
        self.std = _safe_scale(x.std(axis=0), np.ptp(x, axis=0) == 0)
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        """``(x - mean) / std`` for ``x`` [S, D]."""
        if self.mean is None or self.std is None:
            raise RuntimeError("Standardizer.transform called before fit")
        return (x - self.mean) / self.std


@dataclass
class OneHotEncoder:
    """One-hot code of one column of strings; categories are the sorted training values."""

    categories: np.ndarray | None = None

    def fit(self, values: np.ndarray) -> OneHotEncoder:
        """Record the distinct values of ``values`` [S] (sorted)."""
        self.categories = np.unique(values)
        return self

    def transform(self, values: np.ndarray) -> np.ndarray:
        """Indicator matrix [S, K] (float32); a value not seen by ``fit`` gives a zero row."""
        if self.categories is None:
            raise RuntimeError("OneHotEncoder.transform called before fit")
        position = np.searchsorted(self.categories, values)
        position = np.minimum(position, len(self.categories) - 1)
        known = self.categories[position] == values
        codes = np.zeros((len(values), len(self.categories)), dtype=np.float32)
        codes[np.flatnonzero(known), position[known]] = 1.0
        return codes


@dataclass
class TabularEncoder:
    """Encode a table of strings [S, D] column by column into a float32 matrix.

    Columns listed in ``continuous`` are parsed as numbers and rescaled to [0, 1]
    (:class:`MinMaxScaler`); a missing value (the string ``missing``, ``"?"`` in UCI files)
    becomes 0 after rescaling, as the paper does for Adult. All other columns are one-hot
    encoded (:class:`OneHotEncoder`); a missing value is then a category of its own, named
    ``"unknown"`` in :attr:`feature_names`. Output columns follow the input column order.

    Args:
        column_names: one name per input column.
        continuous: names of the continuous columns.
        missing: the token marking a missing value.
    """

    column_names: Sequence[str]
    continuous: Sequence[str] = ()
    missing: str = "?"
    _scalers: dict[int, MinMaxScaler] = field(default_factory=dict, init=False, repr=False)
    _encoders: dict[int, OneHotEncoder] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        unknown = set(self.continuous) - set(self.column_names)
        if unknown:
            raise ValueError(f"continuous names columns that do not exist: {sorted(unknown)}")

    def _numbers(self, column: np.ndarray) -> np.ndarray:
        numbers = np.full(column.shape, np.nan)
        present = column != self.missing
        numbers[present] = column[present].astype(np.float64)
        return numbers[:, None]

    def fit(self, table: np.ndarray) -> TabularEncoder:
        """Fit every column's scaler or one-hot code on ``table`` [S, D] (strings)."""
        self._check(table)
        self._scalers.clear()
        self._encoders.clear()
        for j, name in enumerate(self.column_names):
            if name in self.continuous:
                self._scalers[j] = MinMaxScaler().fit(self._numbers(table[:, j]))
            else:
                self._encoders[j] = OneHotEncoder().fit(table[:, j])
        return self

    def transform(self, table: np.ndarray) -> np.ndarray:
        """Encode ``table`` [S, D] (strings) into features [S, F] (float32)."""
        self._check(table)
        if not self._scalers and not self._encoders:
            raise RuntimeError("TabularEncoder.transform called before fit")
        blocks = []
        for j in range(len(self.column_names)):
            if j in self._scalers:
                scaled = self._scalers[j].transform(self._numbers(table[:, j]))
                blocks.append(np.nan_to_num(scaled, nan=0.0).astype(np.float32))
            else:
                blocks.append(self._encoders[j].transform(table[:, j]))
        return np.concatenate(blocks, axis=1)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Names of the output columns: ``"age"`` or ``"workclass=Private"``."""
        names: list[str] = []
        for j, column in enumerate(self.column_names):
            if j in self._scalers:
                names.append(column)
            else:
                for category in self._encoders[j].categories:
                    label = "unknown" if category == self.missing else str(category)
                    names.append(f"{column}={label}")
        return tuple(names)

    def _check(self, table: np.ndarray) -> None:
        if table.ndim != 2 or table.shape[1] != len(self.column_names):
            raise ValueError(
                f"table must have shape (*, {len(self.column_names)}), got {table.shape}"
            )
