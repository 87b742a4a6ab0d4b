"""The paper's UCI classification benchmarks: Letter Recognition, Adult and Connect-4.

Paper, section "Datasets" and "Preprocessing": continuous inputs rescaled to [0, 1], categorical
inputs one-hot, 10 % of the training split held out for validation. All encoding statistics
come from the original training split (see :mod:`pyro_gpn.data.preprocessing` for what happens
to test values outside the training range and to unseen categories).

============  ==========================================================  =====  =======
data set      train / test split                                          width  classes
============  ==========================================================  =====  =======
``letter``    first 16,000 rows / last 4,000 rows (common convention)     16     26
``adult``     official ``adult.data`` (32,561) / ``adult.test`` (16,281)  108    2
``connect4``  stratified, seeded 2/3 / 1/3 (seed = ``split``)             126    3
============  ==========================================================  =====  =======

Adult's missing values ``?`` (they occur only in categorical columns) become an extra
``unknown`` category; a missing continuous value would become 0 after rescaling, as the paper
says. The first line of ``adult.test`` (``|1x3 Cross validator``) is skipped and its labels'
trailing period (``<=50K.``) removed.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import numpy as np

from pyro_gpn.data.dataset import ClassificationData
from pyro_gpn.data.download import DataDir, RemoteFile, fetch
from pyro_gpn.data.lzw import decompress_lzw
from pyro_gpn.data.preprocessing import TabularEncoder
from pyro_gpn.data.splits import holdout_split

__all__ = ["load_adult", "load_connect4", "load_letter", "read_table"]

_UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases"
LETTER = RemoteFile(
    "uci/letter-recognition.data", f"{_UCI}/letter-recognition/letter-recognition.data"
)
ADULT_TRAIN = RemoteFile("uci/adult.data", f"{_UCI}/adult/adult.data")
ADULT_TEST = RemoteFile("uci/adult.test", f"{_UCI}/adult/adult.test")
# UCI serves this file compressed with Unix ``compress``; it is stored decompressed.
CONNECT4 = RemoteFile(
    "uci/connect-4.data", f"{_UCI}/connect-4/connect-4.data.Z", decompress=decompress_lzw
)

_LETTER_COLUMNS = (
    "x-box", "y-box", "width", "high", "onpix", "x-bar", "y-bar", "x2bar",
    "y2bar", "xybar", "x2ybr", "xy2br", "x-ege", "xegvy", "y-ege", "yegvx",
)  # fmt: skip
_ADULT_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country",
)  # fmt: skip
_ADULT_CONTINUOUS = (
    "age",
    "fnlwgt",
    "education-num",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
)
# Board cells in the order of the UCI attribute list: column a (rows 1-6), then b, ..., g.
_CONNECT4_COLUMNS = tuple(f"{col}{row}" for col in "abcdefg" for row in range(1, 7))
_LETTER_TRAIN_ROWS = 16_000
_CONNECT4_TEST_FRACTION = 1.0 / 3.0


def read_table(path: str | os.PathLike[str], sep: str = ",", skip_rows: int = 0) -> np.ndarray:
    """Read a delimited text file into a string array [rows, columns].

    Blank lines are dropped; every other line must have the same number of fields as the first.
    Splitting is done once over the whole text, which keeps 67,557 x 43 Connect-4 cells fast.
    """
    lines = [line for line in Path(path).read_text().splitlines()[skip_rows:] if line.strip()]
    if not lines:
        raise ValueError(f"{path} holds no data rows")
    width = lines[0].count(sep) + 1
    cells = sep.join(lines).split(sep)
    if len(cells) != width * len(lines):
        raise ValueError(f"{path}: rows do not all have {width} fields separated by {sep!r}")
    return np.array(cells).reshape(len(lines), width)


def _labels(values: np.ndarray, class_names: tuple[str, ...], path: str) -> np.ndarray:
    names = np.array(class_names)
    order = np.argsort(names)
    position = np.minimum(np.searchsorted(names[order], values), len(names) - 1)
    index = order[position]
    bad = names[index] != values
    if bad.any():
        raise ValueError(f"{path}: unexpected class label {values[bad][0]!r}")
    return index


def load_letter(
    data_dir: DataDir = None, *, seed: int = 0, val_fraction: float = 0.1, download: bool = True
) -> ClassificationData:
    """UCI Letter Recognition: 16 integer features, 26 letters (labels 0..25 = A..Z).

    Training split: the first 16,000 rows; test split: the last 4,000.
    """
    table = read_table(fetch(LETTER, data_dir, download=download))
    classes = tuple(string.ascii_uppercase)
    y = _labels(table[:, 0], classes, LETTER.path)
    encoder = TabularEncoder(_LETTER_COLUMNS, continuous=_LETTER_COLUMNS)
    train, test = slice(None, _LETTER_TRAIN_ROWS), slice(_LETTER_TRAIN_ROWS, None)
    encoder.fit(table[train, 1:])
    return ClassificationData.from_arrays(
        "letter",
        encoder.transform(table[train, 1:]),
        y[train],
        encoder.transform(table[test, 1:]),
        y[test],
        feature_names=encoder.feature_names,
        class_names=classes,
        description="UCI Letter Recognition; train = first 16,000 rows, test = last 4,000; "
        "features rescaled to [0, 1] with training min/max",
        seed=seed,
        val_fraction=val_fraction,
    )


def load_adult(
    data_dir: DataDir = None, *, seed: int = 0, val_fraction: float = 0.1, download: bool = True
) -> ClassificationData:
    """UCI Adult: 6 continuous + 8 categorical features, income ``<=50K`` (0) / ``>50K`` (1).

    Official split: ``adult.data`` (32,561 rows) / ``adult.test`` (16,281 rows).
    """
    train = read_table(fetch(ADULT_TRAIN, data_dir, download=download), sep=", ")
    test = read_table(fetch(ADULT_TEST, data_dir, download=download), sep=", ", skip_rows=1)
    classes = ("<=50K", ">50K")
    y_train = _labels(train[:, -1], classes, ADULT_TRAIN.path)
    y_test = _labels(np.char.rstrip(test[:, -1], "."), classes, ADULT_TEST.path)
    encoder = TabularEncoder(_ADULT_COLUMNS, continuous=_ADULT_CONTINUOUS).fit(train[:, :-1])
    return ClassificationData.from_arrays(
        "adult",
        encoder.transform(train[:, :-1]),
        y_train,
        encoder.transform(test[:, :-1]),
        y_test,
        feature_names=encoder.feature_names,
        class_names=classes,
        description="UCI Adult; official adult.data / adult.test split; continuous features "
        "rescaled to [0, 1] with training min/max, categorical one-hot with '?' as 'unknown'",
        seed=seed,
        val_fraction=val_fraction,
    )


def load_connect4(
    data_dir: DataDir = None,
    *,
    split: int = 0,
    seed: int = 0,
    val_fraction: float = 0.1,
    download: bool = True,
) -> ClassificationData:
    """UCI Connect-4: 42 board cells one-hot over ``b``/``o``/``x`` (126 inputs), 3 classes.

    Labels 0, 1, 2 = ``draw``, ``loss``, ``win`` (6,449 / 16,635 / 44,473 rows). UCI gives no
    split; this one holds out a stratified third for testing, seeded by ``split``. UCI serves
    the file compressed (``connect-4.data.Z``); it is decompressed on download
    (:mod:`pyro_gpn.data.lzw`) and stored as ``uci/connect-4.data``. Its recorded SHA-256 was
    computed from a reference copy rebuilt in the UCI text format, not from a fresh download;
    should UCI's bytes differ, the download stops with a
    :class:`~pyro_gpn.data.download.ChecksumError`.
    """
    hint = "UCI serves it compressed: decompress it with `uncompress` or `gzip -d` first."
    table = read_table(fetch(CONNECT4, data_dir, download=download, hint=hint))
    classes = ("draw", "loss", "win")
    y = _labels(table[:, -1], classes, CONNECT4.path)
    train, test = holdout_split(len(y), _CONNECT4_TEST_FRACTION, seed=split, strata=y)
    encoder = TabularEncoder(_CONNECT4_COLUMNS).fit(table[train, :-1])
    return ClassificationData.from_arrays(
        "connect4",
        encoder.transform(table[train, :-1]),
        y[train],
        encoder.transform(table[test, :-1]),
        y[test],
        feature_names=encoder.feature_names,
        class_names=classes,
        description=f"UCI Connect-4; no official split: stratified 2/3 train, 1/3 test with "
        f"seed {split}; cells one-hot over b/o/x",
        seed=seed,
        val_fraction=val_fraction,
    )
