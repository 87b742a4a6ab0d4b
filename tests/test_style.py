"""The code base is ruff-clean (lint and format), so CI's pytest run enforces it."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(args):
    result = subprocess.run(["ruff", *args, "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_control_characters_in_sources():
    """A backslash escape in a non-raw string written into a docstring leaves control bytes
    (``\\a`` BEL, ``\\b`` BS) that render as garbage and that ruff does not flag."""
    bad = []
    for path in ROOT.rglob("*"):
        if path.suffix not in (".py", ".md") or ".git" in path.parts:
            continue
        if any(part in {".venv", "build", "node_modules"} for part in path.parts):
            continue
        text = path.read_bytes()
        if any(b < 32 and b not in (9, 10, 13) for b in text):
            bad.append(str(path.relative_to(ROOT)))
    assert not bad, f"control characters in {bad}"
