"""The notebooks in ``notebooks/``: committed executed, and runnable top to bottom in smoke mode.

CI executes every notebook with ``PYRO_GPN_SMOKE=1`` (fewer samples and steps); the saved
outputs come from a full run (``python notebooks/execute.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat (extra [test])")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbclient (extra [test])")

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9]*.ipynb"))
SMOKE_TIMEOUT_S = 240


def _shared_data() -> Path | None:
    env = os.environ.get("PYRO_GPN_TEST_DATA")
    path = Path(env) if env else REPO_ROOT.parent / "shared" / "datasets"
    return path if path.is_dir() else None


def test_the_six_notebooks_exist():
    assert len(NOTEBOOKS) == 6, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_executed_without_errors(path):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    assert notebook.cells[0].cell_type == "markdown", f"{path.name} must open with a title cell"
    for cell in code:
        assert cell.get("execution_count") is not None, f"{path.name}: a cell was never run"
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error", f"{path.name}: saved error output"
    figures = sum("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", []))
    assert figures >= 1, f"{path.name}: no figure in the saved outputs"
    assert "PYRO_GPN_SMOKE" in "".join(cell.source for cell in code), f"{path.name}: no smoke mode"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(path, monkeypatch):
    notebook = nbformat.read(path, as_version=4)
    needs = notebook.metadata.get("pyro_gpn", {}).get("needs_data", [])
    data = _shared_data()
    if needs and data is None:
        pytest.skip(f"{path.name} needs {needs}: set PYRO_GPN_TEST_DATA or add ../shared/datasets")
    if data is not None:
        monkeypatch.setenv("PYRO_GPN_DATA_DIR", str(data))
    monkeypatch.setenv("PYRO_GPN_SMOKE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(
        notebook,
        timeout=SMOKE_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, on failure
