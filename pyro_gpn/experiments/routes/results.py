"""What the route comparison returns: one :class:`RouteResult` per route, collected in a
:class:`ComparisonResult`, with their markdown tables (:meth:`ComparisonResult.to_markdown`,
:func:`aggregate_markdown` over seeds) and the time each route took to reach a test
log-likelihood (:meth:`ComparisonResult.time_to_target`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .settings import ROUTE_LABELS, RouteBudget

__all__ = ["METRICS", "ComparisonResult", "RouteResult", "aggregate_markdown", "one_line"]

#: the per-route test metrics and training time, in table order
METRICS = ("rmse", "log_lik", "coverage90", "wall_s")


@dataclass
class RouteResult:
    """The outcome of one route (metrics in original target units; see the module docstring).

    Attributes:
        route: one of :data:`ROUTES`.
        rmse, log_lik, coverage90, wall_s: test metrics and training seconds (``nan`` if skipped).
        predictive: how the predictive distribution was summarised.
        skipped: the reason the route did not run, else ``None``.
        max_rhat, min_ess, num_divergences: NUTS diagnostics (``None`` for other routes).
        num_train: training rows the route saw.
        curve: ``(step, training seconds, test log-likelihood)`` triples (``vgpn`` routes).
        pointwise_log_lik: ``[S_test]`` each test row's predictive log density (original
            units; its mean is ``log_lik``), for :meth:`ComparisonResult.elpd_comparison`.
        grid_mean, grid_lower, grid_upper: predictive mean and 90 % interval on the plot grid
            (1-D data), original units.
        details: route-specific facts (steps, epochs, final loss, ...).
    """

    route: str
    rmse: float = math.nan
    log_lik: float = math.nan
    coverage90: float = math.nan
    wall_s: float = math.nan
    predictive: str = ""
    skipped: str | None = None
    max_rhat: float | None = None
    min_ess: float | None = None
    num_divergences: int | None = None
    num_train: int = 0
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    pointwise_log_lik: np.ndarray | None = field(default=None, repr=False)
    grid_mean: np.ndarray | None = field(default=None, repr=False)
    grid_lower: np.ndarray | None = field(default=None, repr=False)
    grid_upper: np.ndarray | None = field(default=None, repr=False)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return ROUTE_LABELS.get(self.route, self.route)

    def time_to_target(self, target: float, held: bool = True) -> float | None:
        """Training seconds until the recorded test log-likelihood reached ``target``.

        Args:
            target: the test log-likelihood (original units).
            held: ``True``: the time from which the curve stays ``>= target`` to the end (a
                curve that touches the target and falls back, or a noisy one crossing it by
                chance, does not count as there; ``None`` if the last value is below);
                ``False``: the first time the curve touched it (``None`` if never).
        """
        seconds = None
        for _, elapsed, log_lik in self.curve:
            if log_lik < target:
                seconds = None if held else seconds
            elif seconds is None:
                seconds = elapsed
                if not held:
                    break
        return seconds


@dataclass
class ComparisonResult:
    """All routes on one data set (:func:`compare_routes`).

    Attributes:
        dataset: the data set's name; ``description`` its provenance.
        routes: one :class:`RouteResult` per requested route, in order.
        sizes: the common hidden widths; ``seed``, ``budget``: the settings.
        num_train, num_test: rows of the training and test splits.
        x_train, y_train, x_test, y_test: the data in original units (numpy) for plots.
        x_grid: the plot grid (1-D inputs) in original units, else ``None``.
    """

    dataset: str
    description: str
    routes: list[RouteResult]
    sizes: tuple[int, ...]
    seed: int
    budget: RouteBudget
    num_train: int
    num_test: int
    x_train: np.ndarray = field(repr=False)
    y_train: np.ndarray = field(repr=False)
    x_test: np.ndarray = field(repr=False)
    y_test: np.ndarray = field(repr=False)
    x_grid: np.ndarray | None = field(default=None, repr=False)

    def __getitem__(self, route: str) -> RouteResult:
        for result in self.routes:
            if result.route == route:
                return result
        raise KeyError(route)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per route: the table's columns."""
        return [
            {
                "route": r.route,
                "rmse": r.rmse,
                "log_lik": r.log_lik,
                "coverage90": r.coverage90,
                "wall_s": r.wall_s,
                "max_rhat": r.max_rhat,
                "min_ess": r.min_ess,
                "divergences": r.num_divergences,
                "num_train": r.num_train,
                "predictive": r.predictive,
                "skipped": r.skipped,
            }
            for r in self.routes
        ]

    def elpd_comparison(self):
        """ArviZ's ``az.compare`` of the routes that ran, by their test log predictive densities
        (:func:`~pyro_gpn.diagnostics.compare_heldout_lpd`): rank, test elpd, its difference to
        the best route with the standard error of the pointwise differences (``dse``), and
        stacking weights. Raises ``ValueError`` if fewer than two routes ran."""
        from ...diagnostics import compare_heldout_lpd

        ran = {r.route: r.pointwise_log_lik for r in self.routes if r.pointwise_log_lik is not None}
        return compare_heldout_lpd(ran)

    def to_frame(self):
        """The table as a ``pandas.DataFrame`` indexed by route."""
        import pandas as pd

        return pd.DataFrame(self.rows()).set_index("route")

    def to_markdown(self) -> str:
        """The table as GitHub markdown (skipped routes list their reason)."""
        header = (
            "| route | train rows | test RMSE | test log-lik | 90 % coverage | wall s | "
            "max r-hat | min bulk ESS | divergences |"
        )
        lines = [header, "|" + " --- |" * 9]
        for r in self.routes:
            if r.skipped is not None:
                lines.append(f"| {r.route} | skipped: {r.skipped} |" + " |" * 7)
                continue
            nuts = [_fmt(r.max_rhat, 3), _fmt(r.min_ess, 0), _fmt(r.num_divergences, 0)]
            cells = [
                r.route,
                str(r.num_train),
                _fmt(r.rmse, 3),
                _fmt(r.log_lik, 3),
                _fmt(r.coverage90, 2),
                _fmt(r.wall_s, 1),
                *nuts,
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def time_to_target(
        self, target: float | None = None, held: bool = True
    ) -> tuple[float, dict[str, float | None]]:
        """Training seconds each route with a learning curve needed to reach a test log-lik.

        Args:
            target: the test log-likelihood (original units); ``None`` takes the lower of the
                routes' final values minus 0.05, a level every curve ends above.
            held: see :meth:`RouteResult.time_to_target`.

        Returns:
            ``(target, {route: seconds or None})`` over the routes that recorded a curve.
        """
        curved = [r for r in self.routes if r.curve]
        if target is None:
            if not curved:
                raise ValueError("no route recorded a learning curve (budget.eval_every)")
            target = min(r.curve[-1][2] for r in curved) - 0.05
        return target, {r.route: r.time_to_target(target, held) for r in curved}


def _fmt(value: float | int | None, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}"


def aggregate_markdown(results: Sequence[ComparisonResult]) -> str:
    """A markdown table of mean +- standard deviation over several runs (e.g. seeds).

    Routes are matched by name; skipped runs are left out of the statistics and counted.
    """
    if not results:
        raise ValueError("results must hold at least one ComparisonResult")
    lines = [
        "| route | runs | test RMSE | test log-lik | 90 % coverage | wall s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for route in [r.route for r in results[0].routes]:
        runs = [res[route] for res in results if route in {r.route for r in res.routes}]
        done = [r for r in runs if r.skipped is None]
        if not done:
            lines.append(f"| {route} | 0 of {len(runs)} (skipped: {runs[0].skipped}) |" + " |" * 4)
            continue
        cells = [_mean_sd([getattr(r, m) for r in done], d) for m, d in zip(METRICS, (3, 3, 2, 1))]
        lines.append(f"| {route} | {len(done)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean_sd(values: Sequence[float], digits: int) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def one_line(r: RouteResult) -> str:
    """One line of text for a finished (or skipped) route."""
    if r.skipped is not None:
        return f"{r.route:>15}: skipped ({r.skipped})"
    text = (
        f"{r.route:>15}: RMSE {r.rmse:.3f}, log-lik {r.log_lik:.3f}, "
        f"coverage {r.coverage90:.2f}, {r.wall_s:.1f} s"
    )
    if r.max_rhat is not None:
        text += f", max r-hat {r.max_rhat:.3f}, min ESS {r.min_ess:.0f}, "
        text += f"{r.num_divergences} divergences"
    return text
