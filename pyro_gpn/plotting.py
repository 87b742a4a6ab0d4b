"""Plots: learned GPN activation functions (the paper's ``fig:gpn_act_connect4``) and the
comparison of inference routes (:mod:`pyro_gpn.experiments.routes`).

Each GPN unit's activation function is a GP conditioned on its virtual observations: targets
``U_r`` at the inducing points ``V_r`` with variances ``S_r``. :func:`plot_activation_functions`
draws, for chosen units of one layer, the conditional mean of the unit's output over a grid of
activations with a band of two standard deviations (from :meth:`GPNLayerBase.conditional`), and
the virtual observations as red dots ``(V_r, U_r)`` with error bars ``sqrt(S_r)``.
:func:`plot_network_activations` does that for every layer of a :class:`~pyro_gpn.GPNNet`, one
row of panels per layer.

:func:`plot_comparison` draws a :class:`~pyro_gpn.experiments.routes.ComparisonResult` (bands
over a 1-D input, or bars of the test metrics over seeds) and :func:`plot_learning_curves` the
test log-likelihood of the variational routes against training time.

Calibration of any route's :class:`~pyro_gpn.heads.Prediction`:
:func:`plot_reliability_diagram` (classification: accuracy against confidence per bin, with the
expected calibration error) and :func:`plot_interval_coverage` (regression: the coverage of the
central predictive intervals against their level), from :mod:`pyro_gpn.metrics`.

matplotlib is an optional dependency (the ``plots`` extra); it is imported when a function is
called, so ``import pyro_gpn.plotting`` works without it.

Example::

    import matplotlib
    matplotlib.use("Agg")
    from pyro_gpn.plotting import plot_network_activations

    fig = plot_network_activations(net, units_per_layer=3)
    fig.savefig("activations.png", dpi=120)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from .experiments.routes import ComparisonResult
    from .heads import Prediction
    from .layers.base import GPNLayerBase
    from .network import GPNNet

__all__ = [
    "activation_curves",
    "plot_activation_functions",
    "plot_comparison",
    "plot_interval_coverage",
    "plot_learning_curves",
    "plot_network_activations",
    "plot_reliability_diagram",
]

_MEAN_COLORS = ("tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:cyan")
#: the route metrics drawn as bars, with their panel titles
_COMPARISON_METRICS = ("rmse", "log_lik", "coverage90")


def _pyplot():
    """Import ``matplotlib.pyplot`` with a helpful error when matplotlib is missing."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "plotting needs matplotlib; install it with `pip install pyro-gpn[plots]`"
        ) from error
    return plt


def _check_units(units: Sequence[int], num_units: int) -> list[int]:
    units = list(units)
    if not units:
        raise ValueError("units must name at least one unit")
    for unit in units:
        if isinstance(unit, bool) or not isinstance(unit, int) or not 0 <= unit < num_units:
            raise ValueError(f"units must be integers in [0, {num_units}), got {units}")
    return units


@torch.no_grad()
def activation_curves(
    layer: GPNLayerBase,
    units: Sequence[int],
    grid: tuple[float, float] = (-3.0, 3.0),
    num_points: int = 200,
    noise: bool = False,
) -> dict[str, Any]:
    """The numbers behind :func:`plot_activation_functions`, as CPU tensors.

    Args:
        layer: a GPN layer with ``conditional``, ``inducing_points``, ``targets`` and
            ``target_variances`` (:class:`~pyro_gpn.layers.GPNLayer`).
        units: indices of the units (``0 <= unit < layer.out_features``).
        grid: the interval of activations to evaluate.
        num_points: grid resolution.
        noise: include the output noise ``sigma^2`` in the variance (the output ``X``) or not
            (the activation function ``F`` itself).

    Returns:
        ``{"a": [P], "mean": [P, K], "std": [P, K], "points": [K, R], "targets": [K, R],
        "target_std": [K, R]}`` for the ``K`` chosen units.
    """
    units = _check_units(units, layer.out_features)
    low, high = grid
    if not low < high:
        raise ValueError(f"grid must be an increasing pair, got {grid}")
    if not isinstance(num_points, int) or num_points < 2:
        raise ValueError(f"num_points must be an integer >= 2, got {num_points!r}")
    for name in ("targets", "target_variances"):
        if not hasattr(layer, name):
            raise TypeError(f"layer has no {name!r}: only parametric GPN layers can be plotted")
    weight = layer.weight
    a = torch.linspace(low, high, num_points, dtype=weight.dtype, device=weight.device)
    mean, var = layer.conditional(a.unsqueeze(-1).expand(-1, layer.out_features), noise=noise)
    n = layer.out_features
    points = layer.inducing_points.expand(n, -1)
    targets = layer.targets.expand(n, -1)
    target_std = layer.target_variances.expand(n, -1).sqrt()
    return {
        "a": a.cpu(),
        "mean": mean[:, units].cpu(),
        "std": var[:, units].sqrt().cpu(),
        "points": points[units].cpu(),
        "targets": targets[units].cpu(),
        "target_std": target_std[units].cpu(),
    }


def plot_activation_functions(
    layer: GPNLayerBase,
    units: Sequence[int] = (0, 1, 2),
    ax: Axes | Sequence[Axes] | None = None,
    grid: tuple[float, float] = (-3.0, 3.0),
    noise: bool = False,
    num_points: int = 200,
    title: str | None = None,
    legend: bool = True,
) -> list[Axes]:
    """Plot the learned activation functions of some units of a GPN layer.

    For every unit: the conditional mean ``E[f(a)]`` (line) with a band of ``+-2`` standard
    deviations, and the virtual observations ``(V_r, U_r)`` as red dots with error bars of one
    standard deviation ``sqrt(S_r)`` (the paper's ``fig:gpn_act_connect4``).

    Args:
        layer: a parametric GPN layer (e.g. ``net.layers[0]``).
        units: the units to draw, one panel each.
        ax: one axes per unit, or ``None`` to create a row of panels in a new figure.
        grid: the interval of activations ``a`` on the horizontal axis.
        noise: band from the variance including the output noise ``sigma^2`` (the unit's output
            ``X``) instead of the activation function ``F`` alone; the legend says which.
        num_points: grid resolution.
        title: prefix for the panel titles (default ``"unit"``).
        legend: put a legend on the first panel.

    Returns:
        The list of axes drawn on.
    """
    plt = _pyplot()
    curves = activation_curves(layer, units, grid, num_points, noise)
    units = list(units)
    if ax is None:
        _, axes = plt.subplots(1, len(units), figsize=(3.2 * len(units), 2.8), squeeze=False)
        axes = list(axes[0])
    else:
        axes = [ax] if not isinstance(ax, Sequence) else list(ax)
    if len(axes) != len(units):
        raise ValueError(f"ax must hold one axes per unit ({len(units)}), got {len(axes)}")
    band_label = "mean ± 2 std (with output noise)" if noise else "mean ± 2 std (noise-free f)"
    a = curves["a"].numpy()
    for k, (unit, axis) in enumerate(zip(units, axes, strict=True)):
        color = _MEAN_COLORS[k % len(_MEAN_COLORS)]
        mean = curves["mean"][:, k].numpy()
        std = curves["std"][:, k].numpy()
        axis.fill_between(a, mean - 2 * std, mean + 2 * std, color=color, alpha=0.2)
        axis.plot(a, mean, color=color, label=band_label)
        axis.errorbar(
            curves["points"][k].numpy(),
            curves["targets"][k].numpy(),
            yerr=curves["target_std"][k].numpy(),
            fmt="o",
            color="red",
            markersize=3,
            elinewidth=1,
            capsize=2,
            label="virtual observations (V, U ± sqrt(S))",
        )
        axis.set_title(f"{title or 'unit'} {unit}")
        axis.set_xlabel("activation a")
        axis.set_xlim(*grid)
    axes[0].set_ylabel("f(a)")
    if legend:
        axes[0].legend(fontsize="x-small", loc="best")
    return axes


def plot_network_activations(
    net: GPNNet,
    units_per_layer: int = 3,
    grid: tuple[float, float] = (-3.0, 3.0),
    noise: bool = False,
    num_points: int = 200,
) -> Figure:
    """A grid of activation-function panels: one row per GPN layer, ``units_per_layer`` columns.

    Layers with fewer units (or one shared activation function, ``share="layer"``) show as many
    panels as they have distinct functions; the remaining cells are hidden.

    Args:
        net: a :class:`~pyro_gpn.GPNNet` (anything with a ``layers`` list of GPN layers).
        units_per_layer: panels per row, the first units of each layer.
        grid, noise, num_points: see :func:`plot_activation_functions`.

    Returns:
        The matplotlib figure.
    """
    plt = _pyplot()
    if isinstance(units_per_layer, bool) or not isinstance(units_per_layer, int):
        raise ValueError(f"units_per_layer must be a positive integer, got {units_per_layer!r}")
    if units_per_layer < 1:
        raise ValueError(f"units_per_layer must be a positive integer, got {units_per_layer}")
    layers = list(getattr(net, "layers", []))
    if not layers:
        raise ValueError("net has no GPN layers to plot")
    fig, axes = plt.subplots(
        len(layers),
        units_per_layer,
        figsize=(3.2 * units_per_layer, 2.6 * len(layers)),
        squeeze=False,
    )
    for row, layer in enumerate(layers):
        distinct = getattr(layer, "num_functions", layer.out_features)
        count = min(units_per_layer, distinct)
        plot_activation_functions(
            layer,
            units=range(count),
            ax=list(axes[row, :count]),
            grid=grid,
            noise=noise,
            num_points=num_points,
            title=f"layer {row + 1}, unit",
            legend=row == 0,
        )
        for axis in axes[row, count:]:
            axis.set_visible(False)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------- routes
def plot_comparison(results: ComparisonResult | Sequence[ComparisonResult]) -> Figure:
    """Plot a comparison.

    1-D inputs: one panel per route with the training (black) and test (grey) points and the
    predictive mean with its 90 % interval over the grid (of the first result when several are
    given). Multi-D inputs: bars of test RMSE, log-likelihood and 90 % coverage per route (mean
    and standard deviation over the results, e.g. seeds), with the nominal 0.9 marked.
    """
    plt = _pyplot()
    runs = [results] if hasattr(results, "routes") else list(results)
    if not runs:
        raise ValueError("results must hold at least one ComparisonResult")
    first = runs[0]
    if first.x_grid is not None:
        return _plot_bands(first, plt)
    names = [r.route for r in first.routes if r.skipped is None]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), constrained_layout=True)
    for ax, metric, title in zip(
        axes, _COMPARISON_METRICS, ("test RMSE", "test log-likelihood", "90 % interval coverage")
    ):
        values = [
            [res[name].__dict__[metric] for res in runs if res[name].skipped is None]
            for name in names
        ]
        means = [statistics.fmean(v) for v in values]
        sds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
        ax.bar(range(len(names)), means, yerr=sds, capsize=3, color="tab:blue", alpha=0.8)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_title(title)
        if metric == "coverage90":
            ax.axhline(0.9, color="k", linestyle="--", linewidth=1)
            ax.set_ylim(0, 1.05)
    fig.suptitle(f"{first.dataset}: {len(runs)} run(s), hidden widths {list(first.sizes)}")
    return fig


def plot_learning_curves(
    results: Sequence[ComparisonResult], target: float | Sequence[float | None] | None = None
) -> Figure:
    """Test log-likelihood against training seconds of the routes with a learning curve.

    One panel per result (e.g. per data set); ``target`` (one per result, or one for all) is
    drawn as a dashed line.
    """
    plt = _pyplot()
    results = list(results)
    targets = target if isinstance(target, Sequence) else [target] * len(results)
    fig, axes = plt.subplots(
        1, len(results), figsize=(4.5 * len(results), 3.4), constrained_layout=True
    )
    for ax, result, level in zip(np.atleast_1d(axes), results, targets, strict=True):
        for r in result.routes:
            if r.curve:
                _, seconds, log_lik = zip(*r.curve)
                ax.plot(seconds, log_lik, marker=".", label=r.label)
        curves = [[ll for *_, ll in r.curve] for r in result.routes if r.curve]
        if curves:  # start at the lowest final value: the early, poor steps would squash it
            top = max(max(c) for c in curves)
            ax.set_ylim(min(c[-1] for c in curves) - 1.0, top + 0.1 * (abs(top) + 1.0))
        if level is not None:
            ax.axhline(level, color="k", linestyle="--", linewidth=1, label="target")
        ax.set_xlabel("training wall time [s]")
        ax.set_ylabel("test log-likelihood")
        ax.set_title(f"{result.dataset}, seed {result.seed}")
        ax.legend(fontsize=7)
    return fig


def _plot_bands(result: ComparisonResult, plt) -> Figure:
    panels = result.routes
    fig, axes = plt.subplots(
        1, len(panels), figsize=(3.2 * len(panels), 3.2), sharey=True, constrained_layout=True
    )
    axes = np.atleast_1d(axes)
    lows = [r.grid_lower.min() for r in panels if r.grid_lower is not None]
    highs = [r.grid_upper.max() for r in panels if r.grid_upper is not None]
    span = np.concatenate([result.y_train, result.y_test])
    ylim = (min(span.min(), *lows) - 0.2, max(span.max(), *highs) + 0.2)
    for ax, r in zip(axes, panels, strict=True):
        ax.scatter(result.x_test[:, 0], result.y_test, s=6, color="0.6", label="test")
        ax.scatter(result.x_train[:, 0], result.y_train, s=8, color="k", label="train")
        if r.skipped is None:
            ax.fill_between(
                result.x_grid, r.grid_lower, r.grid_upper, alpha=0.3, label="90 % interval"
            )
            ax.plot(result.x_grid, r.grid_mean, color="tab:blue", label="mean")
            ax.set_title(f"{r.route}\nlog-lik {r.log_lik:.2f}, cov. {r.coverage90:.2f}")
        else:
            ax.set_title(f"{r.route}\nskipped")
        ax.set_ylim(*ylim)
        ax.set_xlabel("x")
    axes[0].legend(loc="lower left", fontsize=7)
    return fig


# ---------------------------------------------------------------------------------- calibration
def plot_reliability_diagram(
    prediction: Prediction | torch.Tensor,
    labels: torch.Tensor,
    num_bins: int = 15,
    ax: Axes | None = None,
    label: str | None = None,
) -> Figure:
    """Accuracy against mean confidence per bin of top-class probability, with the diagonal
    of perfect calibration and the expected calibration error in the legend.

    Args:
        prediction: a classification :class:`~pyro_gpn.heads.Prediction` or ``[S, C]`` class
            probabilities.
        labels: ``[S]`` integer labels.
        num_bins: bins on ``[0, 1]`` (:func:`pyro_gpn.metrics.reliability_diagram`).
        ax: draw into this axes (e.g. to overlay routes); a new figure otherwise.
        label: legend label of this prediction.
    """
    from .metrics import reliability_diagram

    plt = _pyplot()
    diagram = reliability_diagram(prediction, labels, num_bins)
    if ax is None:
        fig, ax = plt.subplots(figsize=(4.0, 4.0), constrained_layout=True)
    else:
        fig = ax.figure
    filled = diagram.counts > 0
    conf = diagram.confidence[filled].cpu().numpy()
    acc = diagram.accuracy[filled].cpu().numpy()
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="calibrated")
    name = f"{label}: " if label else ""
    ax.plot(conf, acc, marker="o", label=f"{name}ECE {diagram.ece:.3f}")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence (mean top-class probability)")
    ax.set_ylabel("accuracy")
    ax.set_title("reliability diagram")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def plot_interval_coverage(
    prediction: Prediction,
    target: torch.Tensor,
    levels: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99),
    ax: Axes | None = None,
    label: str | None = None,
) -> Figure:
    """Coverage of the central predictive intervals against their level (regression); the
    diagonal is perfect calibration, below it over-confident.

    Args:
        prediction: a regression :class:`~pyro_gpn.heads.Prediction`.
        target: ``[S, D]`` (or ``[S]``) targets in the prediction's units.
        levels: the interval levels (:func:`pyro_gpn.metrics.central_interval_coverage`).
        ax: draw into this axes; a new figure otherwise.
        label: legend label of this prediction.
    """
    from .metrics import central_interval_coverage

    plt = _pyplot()
    levels = list(levels)
    coverage = central_interval_coverage(prediction, target, levels).cpu().numpy()
    if ax is None:
        fig, ax = plt.subplots(figsize=(4.0, 4.0), constrained_layout=True)
    else:
        fig = ax.figure
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="calibrated")
    ax.plot(levels, coverage, marker="o", label=label or "prediction")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("central interval level")
    ax.set_ylabel("observed coverage")
    ax.set_title("interval coverage")
    ax.legend(fontsize=8, loc="upper left")
    return fig
