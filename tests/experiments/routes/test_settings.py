"""Tests of :class:`RouteBudget`'s checks."""

from __future__ import annotations

import pytest

from pyro_gpn.experiments.routes import ROUTE_LABELS, ROUTES, RouteBudget


def test_every_route_has_a_label_and_the_budget_keeps_tuples():
    assert set(ROUTE_LABELS) == set(ROUTES)
    assert RouteBudget(nuts_sizes=[2, 3]).nuts_sizes == (2, 3)
    assert RouteBudget(sampled_u_sizes=[4]).sampled_u_sizes == (4,)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"svi_steps": 0}, "svi_steps"),
        ({"eval_every": -1}, "eval_every"),
        ({"clt_lr": float("inf")}, "clt_lr"),
        ({"vgpn_lr_decay": 0.0}, "vgpn_lr_decay"),
        ({"vgpn_targets_init": "tanh"}, "vgpn_targets_init"),
        ({"targets_init": "zero"}, "targets_init"),  # the parametric GPN has no zero init
        ({"svi_batch_size": 0}, "svi_batch_size"),
        ({"nuts_sizes": (2, 0)}, "nuts_sizes"),
        ({"sampled_u_sizes": (0,)}, "sampled_u_sizes"),
        ({"sampled_u_inducing": 1}, "sampled_u_inducing"),  # SampledTargetsGPN needs >= 2
    ],
)
def test_bad_budgets_name_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RouteBudget(**kwargs)
