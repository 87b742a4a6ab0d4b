"""Deprecated: the route comparison moved to :mod:`pyro_gpn.experiments.routes`.

Its synthetic data is :func:`pyro_gpn.data.synthetic_1d` and its plots are in
:mod:`pyro_gpn.plotting`. This module re-exports the old names for one release.
"""

import warnings

from .data.synthetic import synthetic_1d
from .experiments.routes import (
    ROUTE_LABELS,
    ROUTES,
    Z90,
    ComparisonResult,
    RouteBudget,
    RouteResult,
    add_compare_parser,
    add_route_start_arguments,
    aggregate_markdown,
    compare_routes,
    route_start_settings,
    run_compare_cli,
)
from .plotting import plot_comparison, plot_learning_curves

warnings.warn(
    "pyro_gpn.compare is deprecated: use pyro_gpn.experiments.routes (compare_routes, "
    "RouteBudget, ...), pyro_gpn.data.synthetic_1d and pyro_gpn.plotting.plot_comparison",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "ROUTES",
    "ROUTE_LABELS",
    "Z90",
    "ComparisonResult",
    "RouteBudget",
    "RouteResult",
    "add_compare_parser",
    "add_route_start_arguments",
    "aggregate_markdown",
    "compare_routes",
    "plot_comparison",
    "plot_learning_curves",
    "route_start_settings",
    "run_compare_cli",
    "synthetic_1d",
]
