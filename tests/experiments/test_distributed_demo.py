"""The README's data-parallel command runs as written: its ``torchrun`` line, launched through
``python -m torch.distributed.run`` (what the ``torchrun`` script calls) with the README's options
(``--standalone``: a rendezvous on a free port the launcher picks itself) on 2 CPU processes for
one epoch, exits 0 and reports a world of 2 processes and the global batches' step count."""

from __future__ import annotations

import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # seconds for the launcher and its workers together


def _readme_command() -> list[str]:
    """The ``torchrun`` line of the README's data-parallel section, split into arguments."""
    lines = re.findall(r"^torchrun .*$", (ROOT / "README.md").read_text(), flags=re.M)
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def _run_group(
    command: list[str], env: dict[str, str], timeout: float = TIMEOUT
) -> subprocess.CompletedProcess:
    """``command`` in a session of its own; on timeout the whole process group is killed (the
    launcher and the workers it started), not the launcher alone."""
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"no result in {timeout:g} s: {stdout[-2000:]}{stderr[-4000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_readme_torchrun_command_runs_on_two_processes():
    pytest.importorskip("sklearn")  # the demo's digits (the benchmarks extra)
    command = _readme_command()
    assert command[:4] == ["torchrun", "--standalone", "--nproc_per_node=2", "-m"], command
    launcher, module, args = command[1:3], command[4], command[5:]
    epochs = args.index("--epochs")
    args[epochs + 1] = "1"  # one short epoch: the command, not the training, is under test
    batch_size = int(args[args.index("--batch-size") + 1])
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}  # this checkout's package
    python = [sys.executable, "-m", "torch.distributed.run"]
    done = _run_group([*python, *launcher, "-m", module, *args], env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (report,) = [line for line in done.stdout.splitlines() if line.startswith("world_size=")]
    assert "world_size=2 " in report
    steps = math.ceil(1797 / batch_size)  # scikit-learn's 1,797 digits, one epoch
    assert f" steps={steps} " in report, report


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left to an init that does not reap it does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_timeout_kills_the_launcher_and_its_workers():
    """A launcher that hangs: its process group goes, the child it started included, at once
    (a child left alive would also hold the output pipes open, and the test would wait)."""
    script = "sleep 30 & echo worker=$!; wait"
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="no result in 1 s") as failure:
        _run_group(["bash", "-c", script], dict(os.environ), timeout=1)
    assert time.monotonic() - start < 10
    worker = int(re.search(r"worker=(\d+)", str(failure.value)).group(1))
    deadline = time.monotonic() + 5  # its pipes close a moment before it is gone
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(worker)
