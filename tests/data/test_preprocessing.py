import numpy as np
import pytest

from pyro_gpn.data.preprocessing import MinMaxScaler, OneHotEncoder, Standardizer, TabularEncoder


def test_minmax_uses_fitted_rows_and_does_not_clip() -> None:
    scaler = MinMaxScaler().fit(np.array([[2.0, 5.0], [4.0, 5.0]]))
    out = scaler.transform(np.array([[3.0, 5.0], [6.0, 7.0], [0.0, 4.0]]))
    # column 0: range [2, 4]; column 1 constant -> range 1, maps to value - 5
    np.testing.assert_allclose(out, [[0.5, 0.0], [2.0, 2.0], [-1.0, -1.0]])


def test_standardizer_treats_nearly_constant_float_column_as_constant() -> None:
    x = np.stack([np.full(9667, 0.998), np.arange(9667.0)], axis=1)
    assert x[:, 0].std() > 0  # round-off: a constant column with nonzero float std
    scaler = Standardizer().fit(x)
    out = scaler.transform(x)
    assert scaler.std[0] == 1.0
    np.testing.assert_allclose(out.mean(0), 0.0, atol=1e-9)
    np.testing.assert_allclose(out[:, 1].std(), 1.0)


def test_one_hot_unseen_category_is_all_zeros() -> None:
    encoder = OneHotEncoder().fit(np.array(["b", "a", "b"]))
    out = encoder.transform(np.array(["a", "b", "z", "0"]))
    np.testing.assert_array_equal(out, [[1, 0], [0, 1], [0, 0], [0, 0]])
    assert out.dtype == np.float32


def test_tabular_encoder_columns_names_and_missing_values() -> None:
    train = np.array([["1", "x", "?"], ["3", "?", "p"], ["?", "y", "q"]])
    encoder = TabularEncoder(["num", "cat", "cat2"], continuous=["num"]).fit(train)
    assert encoder.feature_names == (
        "num", "cat=unknown", "cat=x", "cat=y", "cat2=unknown", "cat2=p", "cat2=q",
    )  # fmt: skip
    out = encoder.transform(np.array([["2", "y", "r"], ["?", "?", "?"], ["5", "x", "p"]]))
    np.testing.assert_allclose(
        out,
        [
            [0.5, 0, 0, 1, 0, 0, 0],  # unseen 'r' -> zeros
            [0.0, 1, 0, 0, 1, 0, 0],  # missing continuous -> 0, missing categorical -> unknown
            [2.0, 0, 1, 0, 0, 1, 0],  # above the training maximum -> above 1, not clipped
        ],
    )


def test_tabular_encoder_checks_shapes_and_names() -> None:
    with pytest.raises(ValueError, match="continuous"):
        TabularEncoder(["a"], continuous=["b"])
    encoder = TabularEncoder(["a", "b"])
    with pytest.raises(ValueError, match="table"):
        encoder.fit(np.array([["1"]]))
    with pytest.raises(RuntimeError, match="before fit"):
        encoder.transform(np.array([["1", "2"]]))
