"""Tests of ``pyro-gpn compare``: options generated from ``RouteBudget``, the written table."""

from __future__ import annotations

import argparse
from dataclasses import asdict

import matplotlib
import pytest

from pyro_gpn.experiments.options import from_args
from pyro_gpn.experiments.routes import RouteBudget, add_compare_parser, run_compare_cli

matplotlib.use("Agg")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_compare_parser(parser.add_subparsers(dest="subcommand"))
    return parser


def test_every_budget_field_is_an_option_with_its_default():
    args = _parser().parse_args(["compare"])
    budget = from_args(RouteBudget, args)
    # the command line's only departure: the NUTS routes sample a single GPN layer unless told
    # otherwise
    assert asdict(budget) == {**asdict(RouteBudget()), "nuts_sizes": (), "sampled_u_sizes": ()}
    args = _parser().parse_args(
        ["compare", "--vgpn-no-whiten", "--nuts-sizes", "2", "3", "--sampled-u-sizes", "4"]
    )
    budget = from_args(RouteBudget, args)
    assert budget.vgpn_whiten is False and budget.nuts_sizes == (2, 3)
    assert budget.sampled_u_sizes == (4,)


@pytest.mark.parametrize(
    "argv",
    [["--svi-steps", "0"], ["--clt-lr", "-1"], ["--sizes", "x"], ["--sampled-u-inducing", "1"]],
)
def test_bad_budget_options_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(["compare", *argv])
    assert exit_info.value.code == 2 and argv[0] in capsys.readouterr().err


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
    # the az.compare ranking of the two routes follows the table
    assert "| route | rank | test elpd | elpd_diff | dse | weight |" in text
    ranking = text.split("| route | rank |")[1]
    assert ranking.count("| clt | ") == 1 and ranking.count("| vgpn-closed | ") == 1
    assert (tmp_path / "compare.png").stat().st_size > 0
