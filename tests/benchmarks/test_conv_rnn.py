"""The image experiment's metrics: calibration error and the signed confidence gap."""

import pytest
import torch

from benchmarks.conv_rnn import CNN, image_metrics


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
