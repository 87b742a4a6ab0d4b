"""Tests of the activation-function and route-comparison plots (Agg backend, no display)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402

from pyro_gpn import GPNLayer, GPNNet  # noqa: E402
from pyro_gpn.experiments.routes import (  # noqa: E402
    ComparisonResult,
    RouteBudget,
    RouteResult,
)
from pyro_gpn.plotting import (  # noqa: E402
    activation_curves,
    plot_activation_functions,
    plot_comparison,
    plot_learning_curves,
    plot_network_activations,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _gp_posterior(points, targets, variances, lengthscale, a, jitter=1e-6):
    """Written out: the posterior mean and variance at ``a`` of a unit-amplitude SE-kernel GP
    given virtual observations ``f(V) = U + N(0, diag(S))`` (``jitter``: the layer's default,
    added to the diagonal), ``k(a, V) (K + S)^-1 U`` and ``1 - k(a, V) (K + S)^-1 k(V, a)``."""

    def kernel(p, q):
        return torch.exp(-0.5 * ((p[:, None] - q[None, :]) / lengthscale) ** 2)

    gram = kernel(points, points) + torch.diag(variances + jitter)
    cross = kernel(a, points)
    mean = cross @ torch.linalg.solve(gram, targets)
    var = 1 - (cross * torch.linalg.solve(gram, cross.T).T).sum(-1)
    return mean, var


def test_activation_curves_match_layer_parameters():
    torch.manual_seed(0)
    layer = GPNLayer(3, 4, num_inducing=6)
    with torch.no_grad():  # a lengthscale and a noise of each unit's own
        layer.lengthscales = torch.tensor([0.4, 0.5, 0.7, 0.9])
        layer.noise_std = torch.tensor([0.1, 0.2, 0.3, 0.4])
    curves = activation_curves(layer, units=(1, 3), grid=(-2.5, 2.5), num_points=11)
    assert curves["a"].shape == (11,)
    assert curves["mean"].shape == curves["std"].shape == (11, 2)
    a = -2.5 + 0.5 * torch.arange(11, dtype=torch.float64)
    torch.testing.assert_close(curves["a"].double(), a)
    noisy = activation_curves(layer, units=(1, 3), grid=(-2.5, 2.5), num_points=11, noise=True)
    for k, unit in enumerate((1, 3)):
        mean, var = _gp_posterior(
            *(t[unit].detach().double() for t in (layer.inducing_points, layer.targets)),
            layer.target_variances[unit].detach().double(),
            float(layer.lengthscales[unit].detach()),
            a,
        )
        close = {"rtol": 1e-5, "atol": 1e-5}  # float32 curves
        torch.testing.assert_close(curves["mean"][:, k].double(), mean, **close)
        torch.testing.assert_close(curves["std"][:, k].double().square(), var, **close)
        sigma2 = float(layer.noise_std[unit].detach()) ** 2
        torch.testing.assert_close(noisy["std"][:, k].double().square(), var + sigma2, **close)
    torch.testing.assert_close(curves["points"], layer.inducing_points[[1, 3]].detach())
    torch.testing.assert_close(curves["targets"], layer.targets[[1, 3]].detach())
    torch.testing.assert_close(curves["target_std"], layer.target_variances[[1, 3]].sqrt().detach())
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


def _comparison(grid: bool, seed: int = 0) -> ComparisonResult:
    rng = np.random.default_rng(seed)
    x = np.linspace(-2, 2, 8)[:, None]
    routes = [
        RouteResult("nuts", skipped="too many rows"),
        RouteResult("clt", rmse=0.2 + 0.1 * seed, log_lik=-0.5, coverage90=0.875, wall_s=1.0),
        RouteResult(
            "vgpn-closed", rmse=0.3, log_lik=-0.4, coverage90=1.0, wall_s=2.0,
            curve=[(1, 0.1, -3.0), (2, 0.2, -0.6), (3, 0.3, -0.4)],
        ),
    ]  # fmt: skip
    x_grid = np.linspace(-2.5, 2.5, 5) if grid else None
    for r in routes[1:]:
        if grid:
            r.grid_mean = np.sin(x_grid)
            r.grid_lower, r.grid_upper = r.grid_mean - 0.3, r.grid_mean + 0.3
    y = np.sin(3 * x[:, 0]) + 0.1 * rng.standard_normal(8)
    return ComparisonResult(
        "toy", "toy", routes, (4,), seed, RouteBudget(), 8, 8, x, y, x, y, x_grid
    )


def test_plot_comparison_bands_over_a_1d_input():
    fig = plot_comparison(_comparison(grid=True))
    assert len(fig.axes) == 3
    assert "skipped" in fig.axes[0].get_title() and "cov. 0.88" in fig.axes[1].get_title()
    assert len([c for c in fig.axes[1].collections if isinstance(c, PolyCollection)]) == 1


def test_plot_comparison_bars_over_seeds_skip_the_skipped_route():
    fig = plot_comparison([_comparison(grid=False, seed=s) for s in (0, 1)])
    rmse = fig.axes[0]
    assert [t.get_text() for t in rmse.get_xticklabels()] == ["clt", "vgpn-closed"]
    heights = [bar.get_height() for bar in rmse.patches]
    assert heights == pytest.approx([0.25, 0.3])  # the mean over the two seeds
    with pytest.raises(ValueError, match="results"):
        plot_comparison([])


def test_plot_learning_curves_draws_each_curve_and_the_target():
    fig = plot_learning_curves([_comparison(grid=False)], target=-0.45)
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == ["VI, closed-form ELBO", "target"]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [-3.0, -0.6, -0.4])


def test_plot_reliability_diagram_draws_the_filled_bins_and_the_ece():
    from pyro_gpn.heads import Prediction
    from pyro_gpn.plotting import plot_reliability_diagram

    # float64: in float32, 0.8 and 0.6 round above the bin edges 4/5 and 3/5
    probs = torch.tensor(
        [[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.45, 0.55]], dtype=torch.float64
    )
    labels = torch.tensor([0, 1, 1, 0, 0])
    fig = plot_reliability_diagram(Prediction(probs, torch.zeros_like(probs), "classification"),
                                   labels, num_bins=5, label="net")  # fmt: skip
    ax = fig.axes[0]
    diagonal, curve = ax.lines
    # filled bins (0.4, 0.6], (0.6, 0.8], (0.8, 1]: confidences 0.575, 0.75, 0.9
    np.testing.assert_allclose(curve.get_xdata(), [0.575, 0.75, 0.9], rtol=1e-6)
    np.testing.assert_allclose(curve.get_ydata(), [0.5, 0.5, 1.0])
    assert "ECE 0.150" in curve.get_label()
    plt.close(fig)


def test_plot_interval_coverage_draws_coverage_against_level():
    from pyro_gpn.heads import Prediction
    from pyro_gpn.plotting import plot_interval_coverage

    mean = torch.zeros(4, 1, dtype=torch.float64)
    target = torch.tensor([0.5, -1.0, 1.5, 2.5], dtype=torch.float64)
    fig = plot_interval_coverage(
        Prediction(mean, torch.ones_like(mean), "regression"), target, levels=(0.5, 0.9, 0.99)
    )
    curve = fig.axes[0].lines[1]
    np.testing.assert_allclose(curve.get_xdata(), [0.5, 0.9, 0.99])
    np.testing.assert_allclose(curve.get_ydata(), [0.25, 0.75, 1.0])
    plt.close(fig)
