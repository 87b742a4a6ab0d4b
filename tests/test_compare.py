"""Smoke tests of the route comparison (:mod:`pyro_gpn.compare`) with tiny budgets."""

from __future__ import annotations

import argparse
import math

import matplotlib
import pytest

from pyro_gpn.compare import (
    ROUTES,
    ComparisonResult,
    RouteBudget,
    RouteResult,
    add_compare_parser,
    aggregate_markdown,
    compare_routes,
    plot_comparison,
    run_compare_cli,
    synthetic_1d,
)

matplotlib.use("Agg")

TINY = RouteBudget(
    svi_steps=4,
    eval_every=2,
    predictive_samples=8,
    clt_epochs=2,
    nuts_samples=6,
    nuts_warmup=6,
    nuts_chains=2,
    nuts_max_tree_depth=3,
)


@pytest.fixture(scope="module")
def tiny_data():
    return synthetic_1d(n_train=12, n_test=6, seed=0)


@pytest.fixture(scope="module")
def tiny_result(tiny_data) -> ComparisonResult:
    return compare_routes(tiny_data, sizes=(), seed=0, budget=TINY, grid_size=10)


def test_synthetic_1d_has_a_gap():
    data = synthetic_1d(n_train=200, n_test=50, seed=3)
    x = data.x_train[:, 0] * data.x_std + data.x_mean
    assert data.num_features == 1
    assert len(data.x_train) + len(data.x_val) == 200 and len(data.x_test) == 50
    assert not ((x > -0.5) & (x < 0.5)).any()
    assert float(data.y_std) > 0


def test_every_route_runs_and_reports_finite_metrics(tiny_result):
    assert [r.route for r in tiny_result.routes] == list(ROUTES)
    for r in tiny_result.routes:
        assert r.skipped is None, r.route
        for value in (r.rmse, r.log_lik, r.wall_s):
            assert math.isfinite(value), (r.route, value)
        assert 0.0 <= r.coverage90 <= 1.0
        assert r.grid_mean.shape == r.grid_lower.shape == (10,)
        assert (r.grid_lower <= r.grid_upper).all()
    nuts = tiny_result["nuts"]
    assert math.isfinite(nuts.max_rhat) and math.isfinite(nuts.min_ess)
    assert nuts.num_divergences >= 0
    assert tiny_result["clt"].max_rhat is None
    for route in ("vgpn-trace", "vgpn-closed"):
        steps = [step for step, _, _ in tiny_result[route].curve]
        assert steps[0] == 1 and steps[-1] == TINY.svi_steps
    target, times = tiny_result.time_to_target()
    assert set(times) == {"vgpn-trace", "vgpn-closed"}
    assert all(t is not None and t >= 0 for t in times.values())
    table = tiny_result.to_markdown()
    assert table.count("\n") == 1 + len(ROUTES) and "| nuts | 11 |" in table
    assert list(tiny_result.to_frame().index) == list(ROUTES)
    assert "± " in aggregate_markdown([tiny_result, tiny_result])


def test_plots_bands_and_bars(tiny_result, tiny_data):
    fig = plot_comparison(tiny_result)
    assert len(fig.axes) == len(ROUTES)
    multi = compare_routes(tiny_data, routes=("clt",), sizes=(2,), budget=TINY, grid_size=10)
    multi.x_grid = None  # as for multi-D inputs
    assert len(plot_comparison([multi, multi]).axes) == 3


def test_nuts_is_skipped_with_the_reason_when_data_is_too_large(tiny_data):
    budget = RouteBudget(**{**TINY.__dict__, "nuts_max_rows": 15})
    result = compare_routes(tiny_data, routes=("nuts", "clt"), budget=budget, grid_size=10)
    nuts = result["nuts"]
    assert nuts.skipped is not None and "nuts_max_rows=15" in nuts.skipped
    assert math.isnan(nuts.rmse) and result["clt"].skipped is None
    assert "skipped: " in result.to_markdown()


def test_time_to_target_first_reached_and_held():
    curve = [(1, 0.1, -3.0), (2, 0.2, -1.0), (3, 0.3, -2.0), (4, 0.4, -0.5)]
    result = RouteResult("vgpn-closed", curve=curve)
    assert result.time_to_target(-1.5) == 0.4
    assert result.time_to_target(-1.5, held=False) == 0.2
    assert result.time_to_target(0.0) is None and result.time_to_target(0.0, held=False) is None


def test_bad_arguments(tiny_data):
    with pytest.raises(ValueError, match="routes"):
        compare_routes(tiny_data, routes=("mcmc",))
    with pytest.raises(ValueError, match="svi_steps"):
        RouteBudget(svi_steps=0)
    with pytest.raises(ValueError, match="vgpn_lr_decay"):
        RouteBudget(vgpn_lr_decay=0.0)
    with pytest.raises(ValueError, match="vgpn_targets_init"):
        RouteBudget(vgpn_targets_init="tanh")
    with pytest.raises(ValueError, match="targets_init"):
        RouteBudget(targets_init="zero")  # the parametric GPN has no zero init
    with pytest.raises(ValueError, match="gap"):
        synthetic_1d(gap=(1.0, 0.0))


def test_cli_writes_a_markdown_table(tmp_path):
    parser = argparse.ArgumentParser()
    add_compare_parser(parser.add_subparsers(dest="subcommand"))
    args = parser.parse_args(
        [
            "compare",
            "--n-train", "12", "--n-test", "6", "--sizes",
            "--routes", "clt", "vgpn-closed",
            "--svi-steps", "3", "--clt-epochs", "2", "--grid-size", "10",
            "--vgpn-lr-decay", "0.5",
            "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert args.func is run_compare_cli
    assert args.func(args) == 0
    text = (tmp_path / "compare.md").read_text()
    assert "| clt |" in text and "| vgpn-closed |" in text
    assert (tmp_path / "compare.png").stat().st_size > 0
