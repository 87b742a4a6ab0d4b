"""The former module paths keep working for one release, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest


@pytest.mark.parametrize(
    "module, names",
    [
        (
            "pyro_gpn.compare",
            ["compare_routes", "RouteBudget", "synthetic_1d", "plot_comparison", "Z90"],
        ),
        ("pyro_gpn.cli", ["main", "build_parser", "split_metrics"]),
    ],
)
def test_old_modules_warn_and_re_export(module, names):
    sys.modules.pop(module, None)
    with pytest.warns(DeprecationWarning, match=module.replace(".", r"\.")):
        old = importlib.import_module(module)
    for name in names:
        assert getattr(old, name) is not None


def test_old_experiments_names_and_the_new_package_import_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from pyro_gpn.experiments import (  # noqa: F401
            PAPER_HIDDEN,
            PAPER_RESULTS,
            RunSettings,
            build_model,
            machine_description,
            write_table,
        )
        from pyro_gpn.experiments.cli import main  # noqa: F401


def test_the_core_imports_nothing_from_the_orchestration():
    code = (
        "import sys, pyro_gpn, pyro_gpn.data, pyro_gpn.inference, pyro_gpn.models, "
        "pyro_gpn.losses, pyro_gpn.metrics, pyro_gpn.plotting; "
        "print(sorted(m for m in sys.modules if m.startswith('pyro_gpn.experiments')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_python_dash_m_pyro_gpn_cli_still_runs():
    out = subprocess.run(
        [sys.executable, "-m", "pyro_gpn.cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("pyro-gpn ")
