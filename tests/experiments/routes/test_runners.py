"""Smoke tests of the route runners (:func:`compare_routes`) with tiny budgets."""

from __future__ import annotations

import math

import pytest
import torch

from pyro_gpn.data import synthetic_1d
from pyro_gpn.experiments.routes import (
    ROUTES,
    ComparisonResult,
    RouteBudget,
    aggregate_markdown,
    compare_routes,
)

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


def test_every_route_runs_and_reports_finite_metrics(tiny_result):
    assert [r.route for r in tiny_result.routes] == list(ROUTES)
    for r in tiny_result.routes:
        assert r.skipped is None, r.route
        for value in (r.rmse, r.log_lik, r.wall_s):
            assert math.isfinite(value), (r.route, value)
        assert 0.0 <= r.coverage90 <= 1.0
        assert r.grid_mean.shape == r.grid_lower.shape == (10,)
        assert (r.grid_lower <= r.grid_upper).all()
    for route in ("nuts", "sampled-u"):
        nuts = tiny_result[route]
        assert math.isfinite(nuts.max_rhat) and math.isfinite(nuts.min_ess), route
        assert nuts.num_divergences >= 0
        assert nuts.details["sizes"] == [1, 1]  # sizes=(): a single GPN layer
        assert (nuts.details["chains"], nuts.details["samples"]) == (2, 6)
    assert tiny_result["sampled-u"].details["num_inducing"] == TINY.sampled_u_inducing
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


def test_elpd_comparison_ranks_routes_by_their_pointwise_test_densities(tiny_result):
    # the pointwise densities are the log_lik column's terms, and az.compare ranks by their sum
    import numpy as np

    sums = {}
    for r in tiny_result.routes:
        assert r.pointwise_log_lik.shape == (6,)
        assert r.pointwise_log_lik.mean() == pytest.approx(r.log_lik, rel=1e-12)
        sums[r.route] = float(r.pointwise_log_lik.sum())
    table = tiny_result.elpd_comparison()
    assert list(table.index) == sorted(sums, key=sums.get, reverse=True)
    assert np.allclose(table["elpd_loo"], [sums[name] for name in table.index])
    assert table["elpd_diff"].iloc[0] == 0 and (table["dse"].iloc[1:] > 0).all()
    assert table["weight"].sum() == pytest.approx(1.0)


def test_nuts_is_skipped_with_the_reason_when_data_is_too_large(tiny_data):
    """The non-parametric GPN's row limit does not apply to the sampled-U route, whose cost is
    linear in the rows: it runs on the same data, all training rows included."""
    budget = RouteBudget(**{**TINY.__dict__, "nuts_max_rows": 15})
    result = compare_routes(
        tiny_data, routes=("nuts", "sampled-u", "clt"), budget=budget, grid_size=10
    )
    nuts = result["nuts"]
    assert nuts.skipped is not None and "nuts_max_rows=15" in nuts.skipped
    assert math.isnan(nuts.rmse) and result["clt"].skipped is None
    sampled = result["sampled-u"]
    assert sampled.skipped is None and math.isfinite(sampled.rmse)
    assert sampled.num_train == tiny_data.x_train.shape[0]
    assert "skipped: " in result.to_markdown()


def test_both_nuts_routes_see_the_same_subsample(tiny_data, monkeypatch):
    """``nuts_subsample`` bounds both NUTS routes' rows (the ``compare`` budget), the same
    seeded rows for each."""
    from pyro_gpn.experiments.routes import runners

    seen = {}  # the rows each route sampled with
    pick = runners._nuts_rows

    def spy(ctx, out):
        x, y = pick(ctx, out)
        seen[out.route] = (x.clone(), y.clone())
        return x, y

    monkeypatch.setattr(runners, "_nuts_rows", spy)
    budget = RouteBudget(**{**TINY.__dict__, "nuts_subsample": 7})
    result = compare_routes(tiny_data, routes=("nuts", "sampled-u"), budget=budget, grid_size=10)
    assert result["nuts"].num_train == result["sampled-u"].num_train == 7
    (x_a, y_a), (x_b, y_b) = seen["nuts"], seen["sampled-u"]
    assert x_a.shape[0] == 7 and torch.equal(x_a, x_b) and torch.equal(y_a, y_b)


def test_sampled_u_route_samples_the_budgets_network(tiny_data):
    """``sampled_u_sizes`` and ``sampled_u_inducing`` set the SampledTargetsGPN that NUTS samples
    (not the common ``sizes``), and its draws make the predictive and the pointwise test log
    densities that ``az.compare`` ranks."""
    budget = RouteBudget(**{**TINY.__dict__, "sampled_u_sizes": (2,), "sampled_u_inducing": 4})
    result = compare_routes(
        tiny_data, routes=("sampled-u", "clt"), sizes=(3,), budget=budget, grid_size=10
    )
    sampled = result["sampled-u"]
    assert sampled.details["sizes"] == [1, 2, 1] and sampled.details["num_inducing"] == 4
    assert sampled.predictive.startswith("draws") and sampled.pointwise_log_lik.shape == (6,)
    assert set(result.elpd_comparison().index) == {"sampled-u", "clt"}


def test_bad_arguments(tiny_data):
    with pytest.raises(ValueError, match="routes"):
        compare_routes(tiny_data, routes=("mcmc",))
    with pytest.raises(ValueError, match="sizes"):
        compare_routes(tiny_data, routes=("clt",), sizes=(0,))
    with pytest.raises(TypeError, match="RegressionData"):
        compare_routes(tiny_data.x_train, routes=("clt",))
