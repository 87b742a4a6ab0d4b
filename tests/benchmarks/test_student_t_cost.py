"""benchmarks/student_t_cost.py and benchmarks/uci_test_rows.py: the probes of uci.md section
24 run and report what they say."""

import pytest

from benchmarks import student_t_cost


def test_accuracy_table_orders_the_node_counts():
    """The reference-free rows of the table: more nodes over ``G`` are never worse (at 48 nodes
    over ``F | G``), and the module-level node counts are restored."""
    import pyro_gpn.heads as heads

    before = (heads._T_NODES_OVER_G, heads._T_NODES_GIVEN_G)
    table = student_t_cost.accuracy(rows=200)
    assert (heads._T_NODES_OVER_G, heads._T_NODES_GIVEN_G) == before
    rows = [line.split("|")[1:4] for line in table.splitlines()[2:]]
    errors = {(int(g), int(f)): float(e) for g, f, e in rows}
    assert len(errors) == 7
    assert errors[(64, 48)] <= errors[(16, 48)] <= errors[(8, 48)]
    assert errors[(64, 48)] < 1e-3


def test_uci_test_rows_reports_the_worst_rows(monkeypatch):
    import benchmarks.uci_test_rows as uci_test_rows
    from benchmarks.uci import DATA_DIR, bgpn_config
    from benchmarks.uci_test_rows import worst_test_rows

    # the report's code path, not the fit's quality: 100 steps instead of the column's budget
    monkeypatch.setattr(
        uci_test_rows,
        "bgpn_config",
        lambda model, name: {**bgpn_config(model, name), "num_steps": 100},
    )
    try:
        text = worst_test_rows("yacht", 0, "bgpn", num_rows=3)
    except (FileNotFoundError, OSError, RuntimeError) as err:
        pytest.skip(f"UCI data not found under {DATA_DIR}: {err}")
    lines = text.splitlines()
    assert lines[0].startswith("bgpn yacht split 0: test log-likelihood mean")
    assert len(lines) == 4 and all(" z " in line for line in lines[1:])
