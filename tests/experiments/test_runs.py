"""Tests of one training run's parts: the models, settings and the split metrics."""

from __future__ import annotations

import math

import pytest
import torch

from pyro_gpn.data import load_dataset
from pyro_gpn.experiments.runs import ModelSettings, Schedule, build_model, split_metrics

from .test_paper import tiny_classification


def test_build_model_kinds():
    assert build_model("gpn", [3, 4, 2], "softmax", mode="mean").mode == "mean"
    fast = build_model("tanh-fastdropout", [3, 4, 2], "softmax", dropout=0.3)
    assert fast.fast_dropout and fast.dropout == 0.3
    assert fast.input_dropout == 0.3
    hidden_only = build_model("tanh-fastdropout", [3, 4, 2], "softmax", input_dropout=0.0)
    assert hidden_only.dropout == 0.2 and hidden_only.input_dropout == 0.0
    assert not build_model("tanh-dropout", [3, 4, 2], "softmax").fast_dropout
    with pytest.raises(ValueError, match="model"):
        build_model("relu", [3, 4, 2], "softmax")


def test_model_settings_build_from_data_and_record():
    data = tiny_classification("letter")
    net = ModelSettings(sizes=(4,), mode="mean").build(data)
    assert net.mode == "mean" and net(data.x_test).mean.shape == (12, 3)
    settings = ModelSettings.from_record({"model": "tanh", "sizes": [5], "dataset": "letter"})
    assert settings.model == "tanh" and settings.sizes == [5] and settings.input_dropout is None
    config = Schedule(lr=0.5).config(seed=3, task="classification")
    assert config.lr == 0.5 and config.batch_size == 128 and config.seed == 3


def test_split_metrics_regression_in_original_units():
    data = load_dataset("yacht")
    torch.manual_seed(0)
    net = ModelSettings(sizes=(3,)).build(data)
    metrics = split_metrics(net, data, "test")
    with torch.no_grad():
        pred = net.eval()(data.x_test)
    scale, shift = float(data.y_std[0]), float(data.y_mean[0])
    mean = pred.mean.double() * scale + shift
    var = pred.variance.double() * scale**2
    target = data.y_test.double() * scale + shift
    # independent: the univariate normal density written out, in original units
    log_density = -0.5 * ((target - mean) ** 2 / var + torch.log(2 * math.pi * var))
    assert metrics["log_likelihood"] == pytest.approx(float(log_density.mean()), rel=1e-5)
    assert metrics["rmse"] == pytest.approx(float((mean - target).square().mean().sqrt()), 1e-5)
    assert set(split_metrics(net, data, "val")) == {"rmse", "log_likelihood"}


def test_split_metrics_scores_a_heteroscedastic_head_by_its_mixture_not_a_gaussian():
    """The heteroscedastic head's predictive is a mixture over the log noise variance: the
    split's log-likelihood must be its density (``head.log_predictive``, checked against
    scipy's ``dblquad`` in ``tests/test_heteroscedastic_head.py``), in original units, not the
    moment-matched Gaussian's."""
    import pyro

    from pyro_gpn.heads import HeteroscedasticGaussianHead
    from pyro_gpn.models import VariationalGPN

    pyro.clear_param_store()  # earlier tests' VariationalGPNs share the parameter names
    data = load_dataset("yacht")
    torch.manual_seed(0)
    head = HeteroscedasticGaussianHead(1, noise_std_init=0.3, noise_slope_init=3.0)
    net = VariationalGPN([data.num_features, 4, 1], head=head)
    metrics = split_metrics(net, data, "test")
    with torch.no_grad():
        features = net.eval().hidden(data.x_test)
        gaussian = net.head.predictive(features)
        mixture = head.log_predictive(features, data.y_test)
    shift = math.log(float(data.y_std[0]))
    assert metrics["log_likelihood"] == pytest.approx(float(mixture.mean()) - shift, rel=1e-6)
    y = data.y_test.reshape(-1, 1).to(gaussian.mean.dtype)
    var = gaussian.variance
    moment_matched = -0.5 * (math.log(2 * math.pi) + var.log() + (y - gaussian.mean) ** 2 / var)
    assert abs(metrics["log_likelihood"] - (float(moment_matched.mean()) - shift)) > 0.05
    assert metrics["rmse"] == pytest.approx(
        float((gaussian.mean - y).square().mean().sqrt()) * float(data.y_std[0]), rel=1e-6
    )
