"""Tests of the comparison's result records."""

from __future__ import annotations

import math

from pyro_gpn.experiments.routes import (
    ComparisonResult,
    RouteBudget,
    RouteResult,
    aggregate_markdown,
)


def test_time_to_target_first_reached_and_held():
    curve = [(1, 0.1, -3.0), (2, 0.2, -1.0), (3, 0.3, -2.0), (4, 0.4, -0.5)]
    result = RouteResult("vgpn-closed", curve=curve)
    assert result.time_to_target(-1.5) == 0.4
    assert result.time_to_target(-1.5, held=False) == 0.2
    assert result.time_to_target(0.0) is None and result.time_to_target(0.0, held=False) is None


def test_markdown_tables_of_finished_and_skipped_routes():
    import numpy as np

    done = RouteResult("clt", rmse=0.5, log_lik=-1.25, coverage90=0.9, wall_s=2.0, num_train=10)
    skipped = RouteResult("nuts", skipped="too many rows")
    empty = np.zeros((0, 1))
    result = ComparisonResult(
        "toy", "toy data", [skipped, done], (4,), 0, RouteBudget(), 10, 5,
        empty, empty[:, 0], empty, empty[:, 0],
    )  # fmt: skip
    table = result.to_markdown().splitlines()
    assert table[2] == "| nuts | skipped: too many rows |" + " |" * 7
    assert table[3] == "| clt | 10 | 0.500 | -1.250 | 0.90 | 2.0 | – | – | – |"
    assert result["clt"] is done and math.isnan(result["nuts"].rmse)
    assert "| clt | 2 | 0.500 ± 0.000 |" in aggregate_markdown([result, result])
