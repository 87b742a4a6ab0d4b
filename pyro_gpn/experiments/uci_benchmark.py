"""``pyro-gpn uci``: the UCI regression benchmark on its fixed splits (issue 15).

The benchmark itself is ``benchmarks/uci.py`` of the source checkout (the models side by
side -- the Bayesian GPN's columns, MC dropout, a deep ensemble, the central-limit GPN and
GPyTorch's deep GP --, the standard protocol, resumable cells, the summary tables;
``docs/results/uci.md``). This command runs it with the arguments given after ``uci``, e.g.::

    pyro-gpn uci --sets kin8nm boston --splits 0 1 2 --models chosen mcdrop dgp --out runs/uci
    pyro-gpn uci --summary --out runs/uci
    pyro-gpn uci --help

It needs the checkout (``pip install -e ".[benchmarks]"`` from a clone: the Quickstart's
install); an installation without ``benchmarks/`` says so and exits with status 1. Without
``--out`` the cells go where the project keeps its own, the checkout's
``docs/results/uci_runs``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["add_uci_parser", "benchmark_script"]


def benchmark_script() -> Path:
    """``benchmarks/uci.py`` of the checkout this package runs from.

    Raises:
        FileNotFoundError: the package is not installed from a source checkout.
    """
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "uci.py"
    if not script.is_file():
        raise FileNotFoundError(
            f"pyro-gpn uci runs the source checkout's benchmarks/uci.py, which this "
            f"installation does not have ({script}): clone the repository and install it with "
            "pip install -e '.[benchmarks]'"
        )
    return script


def _benchmark_module(script: Path) -> ModuleType:
    """The module ``benchmarks.uci`` loaded from ``script`` (by its path: another package named
    ``benchmarks`` on ``sys.path`` cannot stand in for it); the one already imported if it is
    that file."""
    name = "benchmarks.uci"
    module = sys.modules.get(name)
    if module is not None and Path(module.__file__).resolve() == script:
        return module
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _run_uci(args: argparse.Namespace) -> int:
    uci = _benchmark_module(benchmark_script())
    return uci.main(list(args.benchmark_args), prog="pyro-gpn uci")


def add_uci_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``pyro-gpn uci``: every argument after ``uci`` (``--help`` included) goes to the
    benchmark's own parser (``args.benchmark_args``, filled by the command's ``main``)."""
    parser = subparsers.add_parser(
        "uci",
        add_help=False,
        allow_abbrev=False,  # an abbreviation is the benchmark's (--d: its --diag, not --debug)
        help="the UCI regression benchmark on its fixed splits (pyro-gpn uci --help)",
        description=__doc__.split("\n")[0],
    )
    parser.set_defaults(func=_run_uci, benchmark_args=[], pass_through=True)
