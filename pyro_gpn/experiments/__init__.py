"""Orchestration on top of the library: the paper's grid, the route comparison, the CLI.

Nothing in the core (``moments``, ``layers``, ``network``, ``models``, ``inference``,
``losses``, ``data``) imports this package; it only uses the core's public API.

=====================  ========================================================================
module                 what it holds
=====================  ========================================================================
:mod:`~.runs`          one training run: :class:`ModelSettings`, :func:`build_model`,
                       :class:`Schedule`, :func:`split_metrics`, :func:`machine_description`
:mod:`~.saved`         a ``pyro-gpn train`` folder read back, verified: :func:`load_run`
:mod:`~.paper`         the paper's Table ``tab:gpn_exp_errors`` as data (:data:`PAPER_RESULTS`),
                       its grid (:func:`grid_cells`) and runner (:func:`run_cell`,
                       :func:`run_grid`)
:mod:`~.paper_table`   the table from the run files (:func:`aggregate_runs`, :func:`write_table`)
:mod:`~.routes`        every inference route on one regression set (:func:`compare_routes`)
:mod:`~.demo`          ``pyro-gpn demo``
:mod:`~.options`       command-line options generated from the settings dataclasses
:mod:`~.cli`           the ``pyro-gpn`` command (:func:`~.cli.main`)
=====================  ========================================================================

Metrics are :mod:`pyro_gpn.metrics`, synthetic data :func:`pyro_gpn.data.synthetic_1d`, plots
:mod:`pyro_gpn.plotting`. The names of the former module ``pyro_gpn.experiments`` are
re-exported here unchanged.
"""

from .paper import (
    GRID_DATASETS,
    GRID_MODELS,
    PAPER_GRID,
    PAPER_HIDDEN,
    PAPER_LAYER_SIZES,
    PAPER_RESULTS,
    PAPER_SEEDS,
    GridCell,
    RunSettings,
    grid_cells,
    run_cell,
    run_grid,
)
from .paper_table import aggregate_runs, load_runs, write_table
from .routes import (
    ROUTES,
    ComparisonResult,
    RouteBudget,
    RouteResult,
    aggregate_markdown,
    compare_routes,
)
from .runs import (
    CLI_MODELS,
    ModelSettings,
    Schedule,
    build_model,
    machine_description,
    split_metrics,
)
from .saved import TrainedRun, load_run

__all__ = [
    "CLI_MODELS",
    "GRID_DATASETS",
    "GRID_MODELS",
    "PAPER_GRID",
    "PAPER_HIDDEN",
    "PAPER_LAYER_SIZES",
    "PAPER_RESULTS",
    "PAPER_SEEDS",
    "ROUTES",
    "ComparisonResult",
    "GridCell",
    "ModelSettings",
    "RouteBudget",
    "RouteResult",
    "RunSettings",
    "TrainedRun",
    "Schedule",
    "aggregate_markdown",
    "aggregate_runs",
    "build_model",
    "compare_routes",
    "grid_cells",
    "load_run",
    "load_runs",
    "machine_description",
    "run_cell",
    "run_grid",
    "split_metrics",
    "write_table",
]
