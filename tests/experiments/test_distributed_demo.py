"""The README's data-parallel command runs as written: its ``torchrun`` line, launched through
``python -m torch.distributed.run`` (what the ``torchrun`` script calls) on 2 CPU processes for
one epoch, exits 0 and reports a world of 2 processes and the global batches' step count."""

from __future__ import annotations

import math
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _readme_command() -> list[str]:
    """The ``torchrun`` line of the README's data-parallel section, split into arguments."""
    lines = re.findall(r"^torchrun .*$", (ROOT / "README.md").read_text(), flags=re.M)
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_readme_torchrun_command_runs_on_two_processes():
    pytest.importorskip("sklearn")  # the demo's digits (the benchmarks extra)
    command = _readme_command()
    assert command[:3] == ["torchrun", "--nproc_per_node=2", "-m"], command
    module, args = command[3], command[4:]
    epochs = args.index("--epochs")
    args[epochs + 1] = "1"  # one short epoch: the command, not the training, is under test
    batch_size = int(args[args.index("--batch-size") + 1])
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    launcher += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}  # this checkout's package
    done = subprocess.run(
        [*launcher, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (report,) = [line for line in done.stdout.splitlines() if line.startswith("world_size=")]
    assert "world_size=2 " in report
    steps = math.ceil(1797 / batch_size)  # scikit-learn's 1,797 digits, one epoch
    assert f" steps={steps} " in report, report
