"""Tests of the options generated from settings dataclasses, and of every command's --help."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field

import pytest

from pyro_gpn.experiments.cli import build_parser
from pyro_gpn.experiments.options import (
    HelpFormatter,
    add_options,
    from_args,
    option,
    positive_int,
    probability,
)


@dataclass
class _Settings:
    steps: int = field(default=10, metadata=option("optimiser steps", type=positive_int))
    rate: float = field(default=0.5, metadata=option("a rate", type=probability))
    widths: tuple[int, ...] = field(default=(3,), metadata=option("widths", nargs="+", type=int))
    fast: bool = field(default=True, metadata=option("go slow", flag="--slow"))
    verbose: bool = field(default=False, metadata=option("talk"))
    name: str | None = field(default=None, metadata=option("a name"))
    internal: int = 7  # no option


def _parser(**kwargs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    add_options(parser, _Settings, **kwargs)
    return parser


def test_defaults_round_trip_and_values_parse():
    assert from_args(_Settings, _parser().parse_args([])) == _Settings()
    argv = ["--steps", "3", "--rate", "0", "--widths", "1", "2", "--slow", "--verbose"]
    settings = from_args(_Settings, _parser().parse_args([*argv, "--name", "x"]), internal=1)
    assert asdict(settings) == {
        "steps": 3, "rate": 0.0, "widths": (1, 2), "fast": False, "verbose": True,
        "name": "x", "internal": 1,
    }  # fmt: skip


def test_subsets_overrides_and_renamed_flags():
    parser = _parser(names=["steps", "widths"], defaults={"steps": 99}, flags={"steps": "--n"})
    args = parser.parse_args([])
    assert args.steps == 99 and args.widths == [3] and not hasattr(args, "rate")
    assert parser.parse_args(["--n", "4"]).steps == 4
    with pytest.raises(ValueError, match="internal"):
        _parser(names=["internal"])


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--rate", "1.5"], ["--steps", "two"]])
def test_invalid_values_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(argv)
    assert exit_info.value.code == 2 and argv[0] in capsys.readouterr().err


def test_a_true_switch_needs_a_negative_flag():
    @dataclass
    class Bad:
        on: bool = field(default=True, metadata=option("on"))

    with pytest.raises(ValueError, match="turns it off"):
        add_options(argparse.ArgumentParser(), Bad)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("command", ["train", "evaluate", "reproduce", "demo", "compare"])
def test_every_option_has_a_help_text_with_its_default(command):
    sub = _subparsers(build_parser())[command]
    text = sub.format_help()
    assert "%%" not in text and "%(" not in text
    for action in sub._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        assert action.help, (command, action.option_strings)
        if action.nargs != 0:  # switches are off unless given
            assert "(default: " in sub._get_formatter()._get_help_string(action), action.dest
