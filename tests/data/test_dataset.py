import numpy as np
import pytest
import torch

from pyro_gpn.data.dataset import ClassificationData, RegressionData


def _classification(val_fraction: float = 0.1, seed: int = 0) -> ClassificationData:
    rng = np.random.default_rng(0)
    return ClassificationData.from_arrays(
        "toy",
        rng.random((100, 3)),
        np.repeat([0, 1], [80, 20]),
        rng.random((30, 3)),
        rng.integers(0, 2, 30),
        feature_names=("a", "b", "c"),
        class_names=("no", "yes"),
        description="toy",
        seed=seed,
        val_fraction=val_fraction,
    )


def test_classification_types_shapes_and_stratified_validation() -> None:
    data = _classification()
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    assert (len(data.x_train), len(data.x_val), len(data.x_test)) == (90, 10, 30)
    assert data.y_val.tolist().count(1) == 2  # 10 % of each class
    assert data.num_features == 3 and data.num_classes == 2
    assert repr(data) == (
        "ClassificationData(name='toy', train/val/test=(90, 10, 30), num_features=3, num_classes=2)"
    )
    assert not torch.equal(data.y_val, _classification(seed=1).y_val) or not torch.equal(
        data.x_val, _classification(seed=1).x_val
    )


def test_empty_validation_split_is_allowed() -> None:
    data = _classification(val_fraction=0.0)
    assert data.x_val.shape == (0, 3) and len(data.x_train) == 100


def test_val_fraction_is_checked() -> None:
    with pytest.raises(ValueError, match="val_fraction"):
        _classification(val_fraction=1.0)


@pytest.mark.parametrize("val_fraction", [0.999, 0.996])
def test_a_val_fraction_that_leaves_no_training_row_is_refused(val_fraction) -> None:
    # round(0.996 * 100) = 100 rows held out: the training split was empty, without a word
    with pytest.raises(ValueError, match=rf"val_fraction={val_fraction} holds out all 100"):
        _classification(val_fraction=val_fraction)
    with pytest.raises(ValueError, match=rf"val_fraction={val_fraction} holds out all 80"):
        RegressionData.from_arrays(
            "toy",
            np.zeros((100, 2)),
            np.arange(100.0),
            np.arange(80),
            np.arange(80, 100),
            feature_names=("a", "b"),
            description="toy",
            val_fraction=val_fraction,
        )


def test_a_positive_val_fraction_that_holds_out_no_row_is_refused() -> None:
    # round(0.004 * 100) = 0: a validation split was asked for and none came
    with pytest.raises(ValueError, match="val_fraction=0.004 of 100 training rows holds out none"):
        _classification(val_fraction=0.004)
    assert len(_classification(val_fraction=0.006).x_val) == 1


def _regression(x: np.ndarray, y: np.ndarray) -> RegressionData:
    return RegressionData.from_arrays(
        "toy",
        x,
        y,
        np.arange(80),
        np.arange(80, 100),
        feature_names=("a", "b"),
        description="toy",
        val_fraction=0.25,
    )


def test_regression_standardises_with_training_rows_only() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(3.0, 2.0, (100, 2))
    y = rng.normal(-1.0, 5.0, 100)
    data = _regression(x, y)
    assert data.y_train.shape == (60, 1) and data.y_test.shape == (20, 1)
    np.testing.assert_allclose(data.x_mean.numpy(), x[:80].mean(0), rtol=1e-6)
    np.testing.assert_allclose(data.y_std.numpy(), [y[:80].std()], rtol=1e-6)
    train_and_val = torch.cat([data.y_train, data.y_val])
    assert abs(train_and_val.mean().item()) < 1e-5
    assert abs(train_and_val.std(unbiased=False).item() - 1.0) < 1e-5

    # no leakage: changing the test rows changes nothing but the test tensors
    x2, y2 = x.copy(), y.copy()
    x2[80:] += 100.0
    y2[80:] *= 7.0
    other = _regression(x2, y2)
    assert torch.equal(other.x_train, data.x_train) and torch.equal(other.y_val, data.y_val)
    assert torch.equal(other.y_std, data.y_std)
    assert not torch.equal(other.x_test, data.x_test)


def test_unstandardize_recovers_original_units() -> None:
    rng = np.random.default_rng(2)
    y = rng.normal(10.0, 3.0, 100)
    data = _regression(rng.normal(size=(100, 2)), y)
    mean, var = data.unstandardize(data.y_test, torch.ones_like(data.y_test))
    np.testing.assert_allclose(mean.squeeze(1).numpy(), y[80:], rtol=1e-5)
    np.testing.assert_allclose(var.numpy(), data.y_std.numpy() ** 2 * np.ones((20, 1)), rtol=1e-6)
    assert data.unstandardize(data.y_test)[1] is None


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_from_arrays_names_the_first_non_finite_row_and_column(bad):
    x = np.arange(30, dtype=np.float64).reshape(10, 3)
    x[7, 2] = bad
    kind = "NaN" if np.isnan(bad) else "infinite"
    with pytest.raises(
        ValueError, match=rf"x holds 1 non-finite values, the first {kind} in row 7, 'c'"
    ):
        RegressionData.from_arrays(
            "toy", x, np.arange(10.0), np.arange(8), np.arange(8, 10),
            feature_names=("a", "b", "c"), description="toy",
        )  # fmt: skip
    y = np.zeros(10)
    y[3] = bad
    with pytest.raises(ValueError, match=r"y holds 1 non-finite values, the first .* in row 3"):
        RegressionData.from_arrays(
            "toy", np.ones((10, 3)), y, np.arange(8), np.arange(8, 10),
            feature_names=("a", "b", "c"), description="toy",
        )  # fmt: skip
    with pytest.raises(ValueError, match="x_train holds 1 non-finite values"):
        ClassificationData.from_arrays(
            "toy", x, np.arange(10) % 2, np.ones((4, 3)), np.arange(4) % 2,
            feature_names=("a", "b", "c"), class_names=("n", "p"), description="toy",
        )  # fmt: skip
