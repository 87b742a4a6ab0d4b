"""Fixtures for the data-loader tests.

The real data sets are read from the project's shared dataset folder: ``$PYRO_GPN_TEST_DATA``,
else ``../shared/datasets`` beside the repository root. Tests needing it skip when it is absent.
Every test runs offline (``urlopen`` raises) with ``$PYRO_GPN_DATA_DIR`` pointing at an empty
temporary folder, so nothing is downloaded and no user cache is touched.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _shared_data() -> Path | None:
    env = os.environ.get("PYRO_GPN_TEST_DATA")
    path = Path(env) if env else REPO_ROOT.parent / "shared" / "datasets"
    return path if (path / "uci").is_dir() else None


SHARED_DATA = _shared_data()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared dataset folder, or skip."""
    if SHARED_DATA is None:
        pytest.skip("shared datasets not found: set PYRO_GPN_TEST_DATA or add ../shared/datasets")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setenv("PYRO_GPN_DATA_DIR", str(tmp_path_factory.mktemp("cache")))
