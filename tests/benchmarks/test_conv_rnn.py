"""The image experiment's metrics: calibration error, the signed confidence gap and the
temperature-scaled metrics of ``--calibrate``."""

import pytest
import torch

from benchmarks.conv_rnn import (
    CNN,
    RNN,
    LogitsAsFeatures,
    calibrated_metrics,
    calibrated_sequence_metrics,
    image_metrics,
)


def _fixed_probs_cnn(probs: torch.Tensor) -> CNN:
    model = CNN((1, 2, 2), (1, 1), probs.shape[-1], "relu")
    model.probs = lambda x: probs
    return model


def test_confidence_gap_is_mean_top_probability_minus_accuracy():
    # top probability 0.9 everywhere, 3 of 4 right: over-confident by 0.15; one bin: ECE 0.15
    probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.1, 0.9], [0.1, 0.9]])
    y = torch.tensor([0, 0, 1, 0])
    out = image_metrics(_fixed_probs_cnn(probs), torch.zeros(4, 4), y)
    assert out["test_error"] == pytest.approx(0.25)
    assert out["test_confidence_gap"] == pytest.approx(0.15)
    assert out["test_ece"] == pytest.approx(0.15)
    # under-confident: top probability 0.6, all right
    probs = torch.tensor([[0.6, 0.4], [0.4, 0.6]])
    out = image_metrics(_fixed_probs_cnn(probs), torch.zeros(2, 4), torch.tensor([0, 1]))
    assert out["test_confidence_gap"] == pytest.approx(-0.4)


def test_full_mnist_task_names_the_missing_training_images(tmp_path):
    """``mnist-full`` needs the 60,000 training images: without them (and without
    ``--download``) it stops with the data error that says what to fetch, before training."""
    from benchmarks.conv_rnn import main
    from pyro_gpn.data.download import DataUnavailableError

    with pytest.raises(DataUnavailableError, match="train-images"):
        main(["mnist-full", "--data-dir", str(tmp_path), "--models", "relu", "--epochs", "1"])


def test_a_fixed_activation_cnn_is_temperature_scaled_through_the_softmax_head():
    """The ReLU CNN seen as point-mass features of an identity readout predicts its own softmax
    at temperature 1; ``calibrated_metrics`` fits the temperature that minimises the validation
    NLL of its logits (no other temperature on a grid does better) and reports the test
    metrics at it."""
    torch.manual_seed(0)
    cnn = CNN((1, 4, 4), (2, 3), 3, "relu")
    x = torch.randn(200, 16)
    with torch.no_grad():
        logits = cnn.logits(x)
        y = torch.multinomial((logits / 0.2).softmax(-1), 1).squeeze(-1)  # sharper: T < 1
    wrapped = LogitsAsFeatures(cnn)
    with torch.no_grad():
        torch.testing.assert_close(wrapped.predict(x).probs, cnn.probs(x), rtol=0, atol=0)
    row = calibrated_metrics(cnn, (x[:100], y[:100]), (x[100:], y[100:]))

    def val_nll(t):
        return float(torch.nn.functional.cross_entropy(logits[:100].double() / t, y[:100]))

    t = row["temperature"]
    assert t < 0.5
    assert all(val_nll(t) <= val_nll(t * f) for f in (0.7, 0.95, 1.05, 1.4))
    test_nll = float(torch.nn.functional.cross_entropy(logits[100:].double() / t, y[100:]))
    assert row["cal_test_nll"] == pytest.approx(test_nll, rel=1e-5)
    assert row["cal_val_nll"] == pytest.approx(val_nll(t), rel=1e-5)


def test_a_fixed_activation_rnn_is_sigma_scaled_through_the_gaussian_head():
    """The tanh RNN's predictive ``N(mean, noise^2)``: the fitted scale is the closed form
    ``sqrt(mean(z^2))`` of the validation rows, and the test metrics are at it."""
    torch.manual_seed(0)
    rnn = RNN(3, "tanh-rnn")
    x = torch.randn(300, 5)
    with torch.no_grad():
        mean = rnn.mean(x)
        y = mean + 0.5 * torch.randn_like(mean)  # the noise is 0.1: 5x too narrow
    noise = float(rnn.log_noise.exp())
    row = calibrated_sequence_metrics(rnn, (x[:200], y[:200]), (x[200:], y[200:]))
    z = (y[:200] - mean[:200]).double() / noise
    assert row["scale"] == pytest.approx(float(z.square().mean().sqrt()), rel=1e-6)
    sd = row["scale"] * noise
    assert row["cal_mean_pred_std"] == pytest.approx(sd, rel=1e-6)
    expected = torch.distributions.Normal(mean[200:].double(), sd).log_prob(y[200:].double())
    assert row["cal_test_nll"] == pytest.approx(float(-expected.mean()), rel=1e-6)
