from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_gpn.data import ClassificationData, load_adult, load_connect4, load_letter
from pyro_gpn.data.lzw import decompress_lzw
from pyro_gpn.data.uci import CONNECT4, read_table


@pytest.fixture(scope="module")
def letter(shared_data: Path) -> ClassificationData:
    return load_letter(shared_data, download=False)


@pytest.fixture(scope="module")
def adult(shared_data: Path) -> ClassificationData:
    return load_adult(shared_data, download=False)


@pytest.fixture(scope="module")
def connect4(shared_data: Path) -> ClassificationData:
    return load_connect4(shared_data)


def _check_common(data: ClassificationData, width: int, classes: int, sizes: tuple) -> None:
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    assert data.num_features == width == len(data.feature_names)
    assert data.num_classes == classes
    assert (len(data.x_train), len(data.x_val), len(data.x_test)) == sizes
    train_and_val = torch.cat([data.x_train, data.x_val])
    assert train_and_val.min() == 0.0 and train_and_val.max() == 1.0
    for y in (data.y_train, data.y_val, data.y_test):
        assert 0 <= y.min() and y.max() < classes


def test_letter(letter: ClassificationData, shared_data: Path) -> None:
    _check_common(letter, 16, 26, (14_400, 1_600, 4_000))
    assert letter.class_names[0] == "A" and letter.class_names[-1] == "Z"
    # the test split is the last 4,000 rows, in file order
    raw = read_table(shared_data / "uci" / "letter-recognition.data")
    test_letters = [letter.class_names[int(i)] for i in letter.y_test]
    assert test_letters == raw[16_000:, 0].tolist()
    # the test split is scaled with training statistics: it reaches outside [0, 1]
    assert letter.x_test.min() < 0.0


def test_adult(adult: ClassificationData) -> None:
    _check_common(adult, 108, 2, (29_305, 3_256, 16_281))
    assert adult.class_names == ("<=50K", ">50K")
    assert torch.bincount(adult.y_test).tolist() == [12_435, 3_846]  # trailing '.' handled
    names = adult.feature_names
    assert names[0] == "age" and "workclass=unknown" in names and "native-country=unknown" in names
    assert sum(name.startswith("native-country=") for name in names) == 42
    # test values above the training maximum are kept, not clipped
    assert adult.x_test.max() > 1.0
    # every training row has exactly one active category per categorical column (8 of them)
    categorical = torch.tensor(["=" in name for name in names])
    assert torch.all(adult.x_train[:, categorical].sum(1) == 8)


def test_connect4_counts_and_stratified_split(connect4: ClassificationData) -> None:
    _check_common(connect4, 126, 3, (40_534, 4_504, 22_519))
    assert connect4.class_names == ("draw", "loss", "win")
    labels = torch.cat([connect4.y_train, connect4.y_val, connect4.y_test])
    assert torch.bincount(labels).tolist() == [6_449, 16_635, 44_473]
    share = torch.bincount(connect4.y_test) / torch.bincount(labels)
    assert torch.allclose(share, torch.full((3,), 1 / 3), atol=1e-3)
    x = torch.cat([connect4.x_train, connect4.x_val, connect4.x_test])
    assert torch.all(x.view(-1, 42, 3).sum(-1) == 1)  # one of b/o/x per cell
    assert connect4.feature_names[:3] == ("a1=b", "a1=o", "a1=x")


def test_connect4_split_argument_reseeds_the_test_set(
    connect4: ClassificationData, shared_data: Path
) -> None:
    other = load_connect4(shared_data, split=1)
    assert len(other.y_test) == len(connect4.y_test)
    assert not torch.equal(other.x_test, connect4.x_test)


def test_connect4_is_downloaded_compressed_and_stored_decompressed(tmp_path: Path) -> None:
    from pyro_gpn.data import DataUnavailableError

    assert CONNECT4.decompress is decompress_lzw and CONNECT4.url.endswith("connect-4.data.Z")
    with pytest.raises(DataUnavailableError, match="uncompress") as error:
        load_connect4(tmp_path)  # offline
    assert str(tmp_path / "uci" / "connect-4.data") in str(error.value)


def test_read_table_rejects_ragged_rows(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b\nc\n\n")
    with pytest.raises(ValueError, match="2 fields"):
        read_table(path)
    path.write_text("a,b\n\nc,d\n")
    np.testing.assert_array_equal(read_table(path), [["a", "b"], ["c", "d"]])
