"""The boundary rules of :mod:`pyro_gpn._validation` (issue 14): dtypes, devices, non-finite
parameters, empty batches and unscaled inputs, applied at every public module boundary.

Each test failed on the code before the rules existed (torch's ``expected m1 and m2 to have the
same dtype`` deep inside, NaN results without a word, a ``ZeroDivisionError`` in a plate).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from pyro_gpn import GPNLayer, GPNNet, Moments, UnscaledInputWarning, settings


def _x(n=6, m=3, seed=1):
    return torch.randn(n, m, generator=torch.Generator().manual_seed(seed))


def _net(head="softmax", **kw):
    torch.manual_seed(0)
    return GPNNet([3, 4, 2] if head == "softmax" else [3, 4, 1], head=head, **kw)


# ---------------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("convert", ["float64", "float16", "numpy64", "numpy32"])
def test_floating_inputs_are_cast_to_the_parameters_dtype(convert):
    x = _x()
    given = {
        "float64": x.double(),
        "float16": x.half(),
        "numpy64": x.double().numpy(),
        "numpy32": x.numpy(),
    }[convert]
    expected_x = x.half().float() if convert == "float16" else x
    net = _net()
    got, want = net(given), net(expected_x)
    assert got.mean.dtype == torch.float32
    # float64 -> float32 rounds to the same float32 values: the results are identical
    torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=0)
    torch.testing.assert_close(got.cov, want.cov, rtol=0, atol=0)
    loss = net.loss(given, torch.tensor([0, 1, 0, 1, 0, 1]))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    layer = GPNLayer(3, 4)
    assert layer(given).mean.dtype == torch.float32


def test_a_float64_network_computes_float32_inputs_in_float64():
    net = _net("gaussian", dtype=torch.float64)
    x = _x()
    got = net(x)
    assert got.mean.dtype == torch.float64
    torch.testing.assert_close(got.mean, net(x.double()).mean, rtol=0, atol=0)
    prediction = net.predict(x, x.abs())
    assert prediction.mean.dtype == torch.float64


def test_float_targets_and_moments_inputs_follow_the_rule():
    net = _net("gaussian")
    x, y = _x(), torch.randn(6, 1, dtype=torch.float64)
    torch.testing.assert_close(net.loss(x, y), net.loss(x, y.float()), rtol=0, atol=0)
    layer = GPNLayer(3, 4)
    got = layer(Moments(x.double(), var=x.double().abs()))
    torch.testing.assert_close(got.mean, layer(Moments(x, var=x.abs())).mean, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64])
def test_parameters_in_other_dtypes_are_refused_naming_both(dtype):
    with pytest.raises(ValueError, match=rf"dtype={dtype}.*torch.float32 or torch.float64"):
        GPNLayer(3, 4, dtype=dtype)
    with pytest.raises(ValueError, match=rf"dtype={dtype}"):
        GPNNet([3, 4, 2], dtype=dtype)


def test_integer_inputs_are_refused_naming_the_argument():
    with pytest.raises(
        ValueError, match="x must be a floating-point tensor, got dtype torch.int64"
    ):
        _net()(_x().long())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"var": "float32"}, "var has dtype torch.float32 but mean has torch.float64"),
        ({"cov": "float32"}, "cov has dtype torch.float32 but mean has torch.float64"),
    ],
)
def test_moments_refuse_mixed_dtypes_naming_both(kwargs, message):
    mean = _x().double()
    var = mean.abs().float()
    cov = torch.eye(3).expand(6, 3, 3)
    given = {"var": var} if "var" in kwargs else {"cov": cov}
    with pytest.raises(ValueError, match=message):
        Moments(mean, **given)


def test_moments_linear_checks_the_weight():
    moments = Moments(_x(), var=_x().abs())
    with pytest.raises(ValueError, match="weight has dtype torch.float64 but the moments' mean"):
        moments.linear(torch.ones(3, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weight must have shape \(3, '\*'\), got \(4, 2\)"):
        moments.linear_full(torch.ones(4, 2))


# ---------------------------------------------------------------------------------- devices
def test_inputs_on_another_device_are_refused_naming_both():
    with pytest.raises(ValueError, match="x is on device meta but the network's parameters are"):
        _net()(_x().to("meta"))
    with pytest.raises(ValueError, match="inputs is on device meta but the layer's"):
        GPNLayer(3, 4)(_x().to("meta"))
    with pytest.raises(ValueError, match="var is on device meta but mean on cpu"):
        Moments(_x(), var=_x().abs().to("meta"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="device='cuda' requested but CUDA is not available"):
        GPNLayer(3, 4, device="cuda")
    with pytest.raises(ValueError, match="device='cuda' requested"):
        GPNNet([3, 4, 2], device="cuda")
    with pytest.raises(ValueError, match="device='tpu0' is not a torch device"):
        GPNLayer(3, 4, device="tpu0")


# ---------------------------------------------------------------------------------- non-finite
def test_nan_parameters_are_named_at_the_boundary():
    net = _net()
    with torch.no_grad():
        net.layers[0].weight[0, 0] = math.nan
    for call in (
        lambda: net(_x()),
        lambda: net.predict(_x()),
        lambda: net.loss(_x(), torch.zeros(6, dtype=torch.long)),
    ):
        with pytest.raises(ValueError, match=r"parameters \['layers.0.weight'\] of the network"):
            call()
    with pytest.raises(ValueError, match=r"\['weight'\] of the GPNLayer"):
        net.layers[0](_x())
    # behind the validation switch: the training loops skip the check (no device sync)
    with settings.validation(False):
        assert torch.isnan(net(_x()).mean).any()


@pytest.mark.parametrize(
    ("name", "value"),
    [("noise_std_init", math.inf), ("lengthscale_init", math.inf), ("num_inducing", 1)],
)
def test_constructor_values_are_finite_and_usable(name, value):
    with pytest.raises(ValueError, match=name):
        GPNLayer(3, 4, **{name: value})


# ---------------------------------------------------------------------------------- empty batches
@pytest.mark.parametrize("head", ["softmax", "gaussian"])
def test_the_loss_of_an_empty_batch_is_an_error_not_nan(head):
    net = _net(head)
    y = torch.zeros(0, dtype=torch.long) if head == "softmax" else torch.zeros(0, 1)
    with pytest.raises(ValueError, match="x has 0 samples"):
        net.loss(_x()[:0], y)
    assert net.expected_nll(_x()[:0], y, reduction="sum").item() == 0.0
    assert net(_x()[:0]).mean.shape == (0, net.sizes[-1])


def test_pyro_models_and_fit_svi_refuse_zero_rows_and_cast_float64():
    from pyro.infer import Trace_ELBO

    from pyro_gpn.inference import fit_svi
    from pyro_gpn.models import ParametricGPN, VariationalGPN

    torch.manual_seed(0)
    vgpn, pgpn = VariationalGPN([3, 2, 1]), ParametricGPN([3, 2, 1], head="gaussian")
    x, y = _x(), torch.randn(6, 1)
    for model in (vgpn, pgpn):
        with pytest.raises(ValueError, match="x has 0 samples"):
            fit_svi(model.model, model.guide, x[:0], y[:0], num_steps=1, progress=False)
        loss = Trace_ELBO().differentiable_loss(model.model, model.guide, x.double(), y.double())
        assert loss.dtype == torch.float32 and torch.isfinite(loss)


# ---------------------------------------------------------------------------------- scale
def test_unscaled_inputs_draw_a_warning_and_standardised_ones_do_not():
    net = _net()
    with pytest.warns(UnscaledInputWarning, match="Standardise the inputs"):
        net(1e6 * _x())
    with pytest.warns(UnscaledInputWarning, match="inputs reaches"):
        GPNLayer(3, 4)(1e6 * _x())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net(3 * _x())
        with settings.validation(False):  # no check, no sync inside the training loops
            net(1e6 * _x())


def test_numpy_labels_are_accepted_by_the_loss():
    net = _net()
    labels = np.array([0, 1, 0, 1, 0, 1])
    torch.testing.assert_close(net.loss(_x(), labels), net.loss(_x(), torch.from_numpy(labels)))


# ---------------------------------------------------------------------------------- helpers
def test_check_per_unit_takes_n_or_one_rows_and_names_the_argument():
    from pyro_gpn._validation import check_per_unit

    check_per_unit("beta", torch.zeros(3, 5), 3, (5,))
    check_per_unit("beta", torch.zeros(1, 5), 3, (5,))
    check_per_unit("lengthscales", torch.zeros(1), 3)
    for bad in (torch.zeros(2, 5), torch.zeros(3, 4), torch.zeros(5), torch.zeros(3, 5, 1)):
        with pytest.raises(ValueError, match=r"beta must have shape \(3 \| 1, 5\).*of activations"):
            check_per_unit("beta", bad, 3, (5,), owner="activations")


def test_check_number_takes_finite_numbers_only():
    from pyro_gpn._validation import check_number

    assert check_number("jitter", 0) == 0.0
    assert check_number("lengthscale", 0.5, positive=True) == 0.5
    for bad, positive in ((-1e-9, False), (math.inf, False), (math.nan, False), (0.0, True)):
        with pytest.raises(ValueError, match="must be"):
            check_number("jitter", bad, positive=positive)
    with pytest.raises(TypeError, match="jitter must be a real number, got str"):
        check_number("jitter", "0.1")


def test_check_values_synchronises_once_and_names_the_offender():
    from pyro_gpn._validation import check_values
    from tests.syncs import count_syncs

    good = {"finite": {"a": torch.zeros(3)}, "positive": {"b": torch.ones(2), "c": None}}
    with count_syncs() as counter:
        check_values(**good, nonnegative={"d": torch.zeros(4)})
    assert counter["n"] == 1
    with pytest.raises(ValueError, match="d must be non-negative"):
        check_values(**good, nonnegative={"d": -torch.ones(4)})
    with pytest.raises(ValueError, match="b must be positive"):
        check_values(positive={"b": torch.zeros(2)})
    with pytest.raises(ValueError, match="a contains NaN"):
        check_values(finite={"a": torch.tensor([math.nan])})
    with settings.validation(False), count_syncs() as counter:
        check_values(nonnegative={"d": -torch.ones(4)})
    assert counter["n"] == 0


def test_check_number_takes_numpy_scalars_but_not_bools():
    from pyro_gpn._validation import check_number

    assert check_number("jitter", np.float32(0.5)) == 0.5
    assert check_number("jitter", np.int64(2), positive=True) == 2.0
    for value in (np.bool_(True), True):
        with pytest.raises(TypeError, match="jitter must be a real number"):
            check_number("jitter", value)
    with pytest.raises(ValueError, match="lengthscale must be positive"):
        check_number("lengthscale", np.float64(0.0), positive=True)


def test_check_int_takes_python_and_numpy_integers_only():
    from pyro_gpn._validation import check_int

    assert check_int("seed", np.int64(3)) == 3 and type(check_int("seed", np.int64(3))) is int
    assert check_int("num_data", None, 1, none_ok=True) is None
    for value in (True, np.bool_(False), 2.0, "2", None):
        with pytest.raises(ValueError, match="seed must be a non-negative integer"):
            check_int("seed", value)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        check_int("batch_size", 0, 1)
    with pytest.raises(ValueError, match="n_train must be an integer >= 10"):
        check_int("n_train", 9, 10)


def test_integer_sizes_is_the_one_rule_for_network_widths():
    from pyro_gpn._validation import integer_sizes
    from pyro_gpn.models.baselines import FixedActivationNet

    assert integer_sizes([np.int64(2), 3.0, torch.tensor(1)]) == [2, 3, 1]
    for sizes in ([2, True, 1], [2, 2.5, 1], "231", [2, "3", 1]):
        with pytest.raises(ValueError, match="sizes must"):
            integer_sizes(sizes)
    # GPNNet took NumPy integers differently from FixedActivationNet and the NUTS models
    assert GPNNet([np.int64(2), 3, 1]).sizes == [2, 3, 1]
    assert GPNNet([np.int64(2), np.int32(3)], head="gaussian").sizes == [2, 3]
    FixedActivationNet([np.int64(2), 3, 1])


def test_check_class_labels_reads_the_range_once_and_returns_long():
    from pyro_gpn._validation import check_class_labels
    from tests.syncs import count_syncs

    for dtype in (torch.uint8, torch.int16, torch.int32, torch.int64):
        labels = torch.tensor([0, 2, 1], dtype=dtype)
        with count_syncs() as counter:
            out = check_class_labels("y", labels, 3)
        assert counter["n"] == 1 and out.dtype == torch.int64 and out.tolist() == [0, 2, 1]
    with pytest.raises(ValueError, match=r"y must hold class labels in \[0, 3\), got range"):
        check_class_labels("y", torch.tensor([0, 3]), 3)
    with pytest.raises(ValueError, match=r"y must hold class labels in \[0\), got range"):
        check_class_labels("y", torch.tensor([-1, 0]), None)
    with pytest.raises(ValueError, match="y must hold integer class labels"):
        check_class_labels("y", torch.tensor([0.0]), 3)
    with pytest.raises(TypeError, match="y must be a torch.Tensor"):
        check_class_labels("y", [0, 1], 3)
    with count_syncs() as counter:
        check_class_labels("y", torch.tensor([5]), 3, check_range=False)
    assert counter["n"] == 0


def test_check_not_empty_names_the_argument():
    from pyro_gpn._validation import check_not_empty

    with pytest.raises(ValueError, match=r"x has 0 samples .*undefined \(NaN\); skip"):
        check_not_empty("x", torch.zeros(0, 3), hint="skip empty batches")
    with pytest.raises(ValueError, match=r"mean is empty \(shape \(3, 0\)\)"):
        check_not_empty("mean", torch.zeros(3, 0), rows=False)
    check_not_empty("x", torch.zeros(0, 3), reduction="sum")
    check_not_empty("x", torch.zeros(3, 0))
    check_not_empty("x", [1, 2])


@pytest.mark.filterwarnings("ignore")
def test_check_psd_skips_empty_batches_and_traces():
    from pyro_gpn._validation import check_psd

    check_psd("cov", torch.zeros(0, 3, 3))  # amax of no entries raised a RuntimeError
    bad = torch.tensor([[[1.0, 0.0], [0.0, -1.0]]])
    with pytest.raises(ValueError, match="cov must be positive semi-definite"):
        check_psd("cov", bad)
    traced = torch.jit.trace(lambda c: check_psd("cov", c) * 2, (bad,), check_trace=False)
    assert torch.equal(traced(bad), bad * 2)


def test_check_class_labels_takes_every_integer_dtype_and_hints_only_the_dtype():
    from pyro_gpn._validation import check_class_labels

    for dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.int16):
        got = check_class_labels("y", torch.tensor([0, 2, 1]).to(dtype), 3)
        assert got.dtype == torch.long and got.tolist() == [0, 2, 1]
    in_range = r"y must hold class labels in \[0, 3\), got range \[0, 5\]$"  # no hint
    with pytest.raises(ValueError, match=in_range):
        check_class_labels("y", torch.tensor([0, 5]).to(torch.uint16), 3, hint="a hint")
    with pytest.raises(ValueError, match="integer class labels, got dtype torch.float32 .a hint."):
        check_class_labels("y", torch.tensor([0.0, 1.0]), 3, hint="a hint")


def test_integer_arguments_follow_one_rule():
    """Bools (``True`` is 1 to ``isinstance``) are refused and NumPy integers accepted, by every
    integer argument that had a check of its own."""
    from pyro_gpn import GPNSequential
    from pyro_gpn.experiments.routes.settings import RouteBudget, check_sizes
    from pyro_gpn.metrics import expected_calibration_error

    def net(num_data):
        layer = GPNLayer(2, 3, output_noise=False)
        return GPNSequential([layer], input_shape=(2,), head="gaussian", num_data=num_data)

    with pytest.raises(ValueError, match="num_data must be a positive integer or None, got True"):
        net(True)
    assert net(np.int64(5)).num_data == 5
    with pytest.raises(ValueError, match="nuts_sizes must be integers, got True"):
        check_sizes("nuts_sizes", (True, 2))
    assert check_sizes("nuts_sizes", (np.int64(2),)) == (2,)
    with pytest.raises(ValueError, match="nuts_subsample must be a positive integer or None"):
        RouteBudget(nuts_subsample=True)
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    with pytest.raises(ValueError, match="num_bins must be a positive integer, got True"):
        expected_calibration_error(probs, torch.tensor([0, 1]), num_bins=True)
    assert expected_calibration_error(probs, torch.tensor([0, 1]), num_bins=np.int64(2)) >= 0
