"""Command-line options declared once, on the settings dataclasses they fill.

A settings field carries its option in its metadata::

    @dataclass
    class Settings:
        steps: int = field(default=100, metadata=option("optimiser steps", type=positive_int))

:func:`add_options` turns the fields into ``--steps``-style options (the default is the
field's, or an override) and :func:`from_args` builds the dataclass back from the parsed
namespace, so a setting's name, default, type and help are written in one place. Every parser
of the ``pyro-gpn`` command uses :class:`HelpFormatter`, which appends each option's default to
its help text.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch

__all__ = [
    "HelpFormatter",
    "add_device",
    "add_options",
    "add_threads",
    "from_args",
    "nonnegative_int",
    "option",
    "positive_float",
    "positive_int",
    "probability",
]

T = TypeVar("T")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show every option's default (``(default: ...)``) in ``--help``; switches (options
    without a value, off unless given) are left as they are."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.nargs == 0:
            return action.help or ""
        return super()._get_help_string(action)


# ---------------------------------------------------------------------------------- types
def _number(text: str, kind: Callable[[str], Any], what: str, ok: Callable[[Any], bool]):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer ``>= 1``."""
    return _number(text, int, "a positive integer", lambda v: v >= 1)


def int_at_least_two(text: str) -> int:
    """argparse type: an integer ``>= 2``."""
    return _number(text, int, "an integer of at least 2", lambda v: v >= 2)


def nonnegative_int(text: str) -> int:
    """argparse type: an integer ``>= 0``."""
    return _number(text, int, "a non-negative integer", lambda v: v >= 0)


def positive_float(text: str) -> float:
    """argparse type: a finite number ``> 0``."""
    return _number(text, float, "a positive number", lambda v: math.isfinite(v) and v > 0)


def probability(text: str) -> float:
    """argparse type: a number in ``[0, 1)`` (a drop rate)."""
    return _number(text, float, "a number in [0, 1)", lambda v: 0.0 <= v < 1.0)


# ---------------------------------------------------------------------------------- dataclasses
def option(help: str, *, flag: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """Field metadata declaring a command-line option.

    Args:
        help: the help text (the default is appended by :class:`HelpFormatter`).
        flag: the option string (default ``--field-name``). A ``bool`` field that defaults to
            ``True`` needs one: it becomes a ``store_false`` switch (e.g. ``--no-whiten``).
        **kwargs: further ``add_argument`` keywords (``type``, ``choices``, ``nargs``,
            ``metavar``); ``type`` defaults to the type of the field's default.
    """
    return {"option": {"help": help, "flag": flag, **kwargs}}


def _option_fields(cls: type, names: Iterable[str] | None) -> list[dataclasses.Field]:
    declared = {f.name: f for f in dataclasses.fields(cls) if "option" in f.metadata}
    if names is None:
        return list(declared.values())
    unknown = [name for name in names if name not in declared]
    if unknown:
        raise ValueError(f"{cls.__name__} declares no option for {unknown}")
    return [declared[name] for name in names]


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"field {f.name!r} has no default, so it cannot be an option")


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    names: Iterable[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
) -> None:
    """Add one option per field of the dataclass ``cls`` that declares one (:func:`option`).

    Args:
        parser: the parser to extend.
        cls: the settings dataclass.
        names: the fields to add, in this order (default: every declared one).
        defaults: per-field defaults that replace the dataclass's for this parser.
        flags: per-field option strings that replace the declared ones.
    """
    defaults, flags = dict(defaults or {}), dict(flags or {})
    for f in _option_fields(cls, names):
        spec = dict(f.metadata["option"])
        declared = spec.pop("flag")
        flag = flags.get(f.name) or declared or "--" + f.name.replace("_", "-")
        default = defaults.get(f.name, _default(f))
        if isinstance(default, bool):
            if default and declared is None and f.name not in flags:
                raise ValueError(
                    f"{cls.__name__}.{f.name} defaults to True: declare a flag that turns it off"
                )
            spec["action"] = "store_false" if default else "store_true"
        elif "type" not in spec and default is not None:
            spec["type"] = type(default)
        if isinstance(default, tuple):
            default = list(default)
        parser.add_argument(flag, dest=f.name, default=default, **spec)


def from_args(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """Build ``cls`` from the parsed options of :func:`add_options` (fields that ``args``
    lacks keep their defaults; lists become tuples where the default is a tuple or ``None``)."""
    values = {}
    for f in _option_fields(cls, None):
        if f.name in overrides or not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values, **overrides)


# ---------------------------------------------------------------------------------- shared
def add_threads(parser: argparse.ArgumentParser, default: int | None = None) -> None:
    """``--threads``: torch CPU threads (applied by ``pyro-gpn``'s ``main``)."""
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=default,
        help="torch CPU threads (None: torch's default); small networks often run fastest on one",
    )


def add_device(parser: argparse.ArgumentParser) -> None:
    """``--device cpu|cuda``."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="torch device")


def check_device(device: str) -> None:
    """Exit with a usage error when ``cuda`` is asked for and not available."""
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pyro-gpn: error: --device cuda requested but CUDA is not available")
