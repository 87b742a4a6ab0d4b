"""Tests of the activation-function plots (Agg backend, no display)."""

from __future__ import annotations

import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402

from pyro_gpn import GPNLayer, GPNNet  # noqa: E402
from pyro_gpn.plotting import (  # noqa: E402
    activation_curves,
    plot_activation_functions,
    plot_network_activations,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_activation_curves_match_layer_parameters():
    torch.manual_seed(0)
    layer = GPNLayer(3, 4, num_inducing=6)
    curves = activation_curves(layer, units=(1, 3), grid=(-2.5, 2.5), num_points=11)
    assert curves["a"].shape == (11,)
    assert curves["mean"].shape == curves["std"].shape == (11, 2)
    torch.testing.assert_close(curves["points"], layer.inducing_points[[1, 3]].detach())
    torch.testing.assert_close(curves["targets"], layer.targets[[1, 3]].detach())
    torch.testing.assert_close(curves["target_std"], layer.target_variances[[1, 3]].sqrt().detach())
    noisy = activation_curves(layer, units=(1, 3), grid=(-2.5, 2.5), num_points=11, noise=True)
    assert (noisy["std"] > curves["std"]).all()
    torch.testing.assert_close(noisy["mean"], curves["mean"])


def test_plot_activation_functions_draws_band_mean_and_virtual_observations():
    torch.manual_seed(0)
    layer = GPNLayer(2, 5, num_inducing=7)
    axes = plot_activation_functions(layer, units=(0, 2, 4))
    assert len(axes) == 3
    for axis in axes:
        bands = [c for c in axis.collections if isinstance(c, PolyCollection)]
        assert len(bands) == 1
        errorbars = [c for c in axis.containers if isinstance(c, ErrorbarContainer)]
        assert len(errorbars) == 1
        marker_line = errorbars[0].lines[0]
        assert len(marker_line.get_xdata()) == 7
        assert marker_line.get_color() == "red"
    labels = [text.get_text() for text in axes[0].get_legend().get_texts()]
    assert any("noise-free" in label for label in labels)
    assert any("virtual observations" in label for label in labels)


def test_plot_activation_functions_checks_arguments():
    layer = GPNLayer(2, 3)
    with pytest.raises(ValueError, match="units"):
        plot_activation_functions(layer, units=(3,))
    with pytest.raises(ValueError, match="grid"):
        plot_activation_functions(layer, units=(0,), grid=(1.0, -1.0))
    _, axis = plt.subplots()
    with pytest.raises(ValueError, match="one axes per unit"):
        plot_activation_functions(layer, units=(0, 1), ax=[axis])


def test_plot_network_activations_grid_one_row_per_layer():
    torch.manual_seed(0)
    net = GPNNet([3, 4, 2, 5], mode="meanvar", head="softmax")
    figure = plot_network_activations(net, units_per_layer=3)
    axes = figure.get_axes()
    assert len(axes) == 2 * 3
    visible = [axis.get_visible() for axis in axes]
    assert visible == [True, True, True, True, True, False]  # layer 2 has only two units
    assert axes[3].get_title() == "layer 2, unit 0"


def test_plot_network_activations_shared_layer_has_one_panel():
    net = GPNNet([3, 4, 1], mode="meanvar", head="gaussian", share="layer")
    figure = plot_network_activations(net, units_per_layer=2)
    assert [axis.get_visible() for axis in figure.get_axes()] == [True, False, True, False]
    with pytest.raises(ValueError, match="units_per_layer"):
        plot_network_activations(net, units_per_layer=0)
