"""Fault cases over every public entry point, as data: bad inputs, bad files, kills, races.

Each :class:`Case` is one call a user could make with one fault (a wrong shape, a dtype, a
device, NaN or inf, an empty or one-row batch, out-of-range labels, unscaled inputs, a damaged
file, a kill, a concurrent run, a full or read-only disk) and :func:`classify` runs it and puts
the outcome in one of five classes:

* ``clear``: an exception raised by pyro_gpn whose message names the argument or the file
  (one of ``Case.names``); for the command line, a non-zero exit whose message names it;
* ``handled``: a correct result (``Case.check`` agrees, nothing non-finite);
* ``unclear``: an exception from deep inside torch / pyro / Python, or one whose message names
  neither argument nor file; a command-line error that does not name them;
* ``silent``: a wrong or non-finite result, or success on garbage (exit 0 on a damaged file);
* ``crash``: a raw traceback from the command line, or a hang (past ``Case.timeout``).

The list is consumed by ``benchmarks/probe_faults.py`` (the report in
``docs/results/fault_probe.md``) and is meant to become a parametrised test once the library is
fixed::

    @pytest.mark.parametrize("case", cases(), ids=lambda c: c.id)
    def test_fault(case, tmp_path):
        outcome = classify(case, tmp_path)
        assert outcome.kind in ("clear", "handled"), outcome.message

It is not collected by pytest itself (no ``test_`` prefix): today many cases fail by design.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("clear", "handled", "unclear", "silent", "crash")
FAULTS = ("shape", "dtype", "device", "nan", "empty", "one-row", "labels", "scale", "value",
          "file", "kill", "concurrency", "disk")  # fmt: skip

__all__ = ["FAULTS", "KINDS", "Case", "CliResult", "Outcome", "cases", "classify"]


# ---------------------------------------------------------------------------------- the schema
@dataclass(frozen=True)
class Case:
    """One fault at one entry point.

    Attributes:
        id: unique, ``entry/fault``.
        entry: the public entry point (``GPNNet.loss``, ``cli train``, ...).
        fault: the fault category (``shape``, ``dtype``, ``device``, ``nan``, ``empty``,
            ``one-row``, ``labels``, ``scale``, ``file``, ``kill``, ``concurrency``, ``disk``,
            ``value``).
        run: ``run(tmp_dir) -> result``; raises for an error; command-line cases return a
            :class:`CliResult`.
        names: a clear message contains one of these (argument or file names, matched as whole
            words, case-insensitively).
        expect: ``"error"`` (garbage in: only a clear error is right), ``"result"`` (a valid edge
            case: ``check`` decides; an error naming the argument still counts as clear) or
            ``"either"`` (a documented refusal or a correct result, e.g. the dtype policy).
        check: ``check(result, warnings) -> problem | None`` for a returned result.
        post: ``post(tmp_dir) -> problem | None`` after the call whatever its outcome (leftover
            temporary files, a damaged folder); a problem makes a clear outcome unclear.
        timeout: seconds before the case counts as a hang.
        note: where the case comes from (issue 14's bullets).
        requires: what the case needs of the machine: ``"no-cuda"`` (it provokes the error of a
            machine without CUDA), ``"data"`` (it copies a file of the shared datasets,
            :func:`shared_data`).
    """

    id: str
    entry: str
    fault: str
    run: Callable[[Path], Any]
    names: tuple[str, ...] = ()
    expect: str = "error"
    check: Callable[[Any, list], str | None] | None = None
    post: Callable[[Path], str | None] | None = None
    timeout: float = 120.0
    note: str = ""
    requires: tuple[str, ...] = ()


def shared_data() -> Path | None:
    """The shared dataset folder: ``$PYRO_GPN_TEST_DATA``, else ``../shared/datasets`` beside
    the repository root; ``None`` when it holds no ``uci`` folder."""
    env = os.environ.get("PYRO_GPN_TEST_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"
    return path if (path / "uci").is_dir() else None


@dataclass
class CliResult:
    """What a ``python -m pyro_gpn.cli`` run (or several) left behind."""

    returncode: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


@dataclass
class Outcome:
    kind: str
    message: str
    seconds: float = 0.0


# ---------------------------------------------------------------------------------- classify
class _Hang(BaseException):
    """Raised by the alarm when an in-process case runs past its timeout."""


def _names_in(text: str, names: tuple[str, ...]) -> bool:
    low = text.lower()
    for name in names:
        pattern = r"(?<![A-Za-z0-9_])" + re.escape(name.lower()) + r"(?![A-Za-z0-9_])"
        if re.search(pattern, low):
            return True
    return False


def _origin(error: BaseException) -> tuple[str, bool]:
    """``file:line`` of the innermost Python frame of ``error`` and whether that line is a
    ``raise`` statement (a deliberate check) rather than a call into torch / pyro."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "?", False
    frame = frames[-1]
    deliberate = (frame.line or "").lstrip().startswith("raise")
    return f"{frame.filename}:{frame.lineno}", deliberate


def _in_library(origin: str) -> bool:
    return f"{os.sep}pyro_gpn{os.sep}" in origin and "site-packages" not in origin


def _short(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _nonfinite(value: Any, depth: int = 0) -> bool:
    if depth > 4:
        return False
    if isinstance(value, torch.Tensor):
        return (
            value.is_floating_point()
            and value.numel() > 0
            and not bool(torch.isfinite(value).all())
        )
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_nonfinite(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_nonfinite(v, depth + 1) for v in value)
    for attr in ("mean", "var", "cov"):  # Moments
        if isinstance(getattr(value, attr, None), torch.Tensor) and _nonfinite(
            getattr(value, attr), depth + 1
        ):
            return True
    return False


def _classify_cli(case: Case, result: CliResult) -> Outcome:
    text = result.text
    if result.timed_out:
        return Outcome("crash", f"hang: no exit within {case.timeout:.0f} s")
    if "Traceback (most recent call last)" in text:
        last = [line for line in text.strip().splitlines() if line.strip()][-1:]
        return Outcome("crash", f"traceback, exit {result.returncode}: {_short(last[0])}")
    if result.returncode == 0:
        problem = case.check(result, []) if case.check else None
        if case.expect == "error" and case.check is None:
            shown = " ".join(result.stdout.strip().splitlines()[-1:])
            problem = f"accepted, printed {shown!r}" if shown else "accepted"
        if problem:
            return Outcome("silent", f"exit 0: {problem}")
        last = result.stdout.strip().splitlines()[-1:]
        return Outcome("handled", _short(" ".join([*result.extra.get("notes", []), *last])))
    message = _short(result.stderr.strip() or result.stdout.strip())
    if case.check and case.expect != "error":
        problem = case.check(result, [])
        if problem is None:
            return Outcome("handled", message)
    if _names_in(text, case.names):
        return Outcome("clear", f"exit {result.returncode}: {message}")
    return Outcome("unclear", f"exit {result.returncode}: {message}")


def _run_with_alarm(case: Case, tmp: Path) -> tuple[Any, BaseException | None, list]:
    def on_alarm(signum, frame):
        raise _Hang

    use_alarm = hasattr(signal, "setitimer") and _main_thread()
    if use_alarm:
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, case.timeout)
    result, error = None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.manual_seed(0)
            result = case.run(tmp)
        except (Exception, _Hang, KeyboardInterrupt) as exc:  # noqa: BLE001 - that is the probe
            error = exc
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
    return result, error, list(caught)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def classify(case: Case, tmp: Path) -> Outcome:
    """Run ``case`` in ``tmp`` (an empty folder) and classify what happened (module docstring)."""
    start = time.perf_counter()
    result, error, caught = _run_with_alarm(case, tmp)
    outcome = _classify(case, result, error, caught)
    if case.post is not None:
        problem = case.post(tmp)
        if problem:
            if outcome.kind in ("clear", "handled"):
                outcome = Outcome("unclear", f"{outcome.message}; but {problem}")
            else:
                outcome = Outcome(outcome.kind, f"{outcome.message}; and {problem}")
    outcome.seconds = time.perf_counter() - start
    return outcome


def _classify(case: Case, result: Any, error: BaseException | None, caught: list) -> Outcome:
    if isinstance(error, _Hang):
        return Outcome("crash", f"hang: still running after {case.timeout:.0f} s")
    if error is not None:
        origin, deliberate = _origin(error)
        where = origin.replace(str(ROOT) + os.sep, "")
        if "site-packages" in where:
            where = where.split("site-packages" + os.sep, 1)[1]
        text = str(error).split("Trace Shapes:")[0]  # Pyro appends its trace's site names
        message = f"{type(error).__name__}: {_short(text)} [{where}]"
        if deliberate and _in_library(origin) and _names_in(text, case.names):
            return Outcome("clear", message)
        return Outcome("unclear", message)
    if isinstance(result, CliResult):
        return _classify_cli(case, result)
    warned = [str(w.message) for w in caught]
    problem = case.check(result, caught) if case.check is not None else None
    if problem is None and _nonfinite(result):
        problem = "non-finite values in the result"
    if problem is None and case.expect == "error" and case.check is None:
        problem = "returned without an error"
    if problem:
        if warned and _names_in(" ".join(warned), case.names):
            return Outcome("handled", f"warned: {_short(warned[0])}")
        return Outcome("silent", problem)
    return Outcome(
        "handled", _short(f"{type(result).__name__}" + (f"; warned {warned[0]}" if warned else ""))
    )


# ---------------------------------------------------------------------------------- helpers
def _data(n: int = 6, m: int = 3, seed: int = 1, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return scale * torch.randn(n, m, generator=generator)


def _labels(n: int = 6, classes: int = 2, seed: int = 2) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, classes, (n,), generator=generator)


def _targets(n: int = 6, seed: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, generator=generator)


def _layer(**kw):
    from pyro_gpn import GPNLayer

    torch.manual_seed(0)
    return GPNLayer(3, 4, **kw)


def _net(head: str = "softmax", **kw):
    from pyro_gpn import GPNNet

    torch.manual_seed(0)
    return GPNNet([3, 4, 2] if head == "softmax" else [3, 4, 1], head=head, **kw)


def _nan_params(module):
    with torch.no_grad():
        next(iter(module.parameters())).view(-1)[0] = float("nan")
    return module


def _vgpn(head: str = "gaussian", **kw):
    from pyro_gpn.models import VariationalGPN

    torch.manual_seed(0)
    return VariationalGPN([3, 2, 1] if head == "gaussian" else [3, 2, 2], head=head, **kw)


def _pgpn(head: str = "gaussian", **kw):
    from pyro_gpn.models import ParametricGPN

    torch.manual_seed(0)
    return ParametricGPN([3, 2, 1] if head == "gaussian" else [3, 2, 2], head=head, **kw)


def _npgpn(**kw):
    from pyro_gpn.models import NonParametricGPN

    return NonParametricGPN([1, 1], **kw)


def _elbo_step(model, guide, *args, loss: str = "trace"):
    """One SVI step's loss with ``Trace_ELBO`` or the closed form (no optimiser)."""
    import pyro
    from pyro.infer import Trace_ELBO

    from pyro_gpn.inference import ClosedFormELBO

    pyro.clear_param_store()
    elbo = Trace_ELBO() if loss == "trace" else ClosedFormELBO()
    return elbo.differentiable_loss(model, guide, *args)


def _values(result: Any) -> torch.Tensor:
    """The tensor to compare: a tensor itself or the mean of ``Moments``."""
    return result if isinstance(result, torch.Tensor) else result.mean


def _same_as_float32(run_f32: Callable[[], Any], rtol: float = 1e-4):
    """Check for a result computed from float64 inputs: equal to the float32 computation."""

    def check(result, caught):
        reference = run_f32()
        got, want = _values(result), _values(reference)
        if not torch.allclose(got.double(), want.double(), rtol=rtol, atol=1e-6):
            gap = (got.double() - want.double()).abs().max()
            return f"differs from the float32 result by {gap:.3g}"
        return None

    return check


def _row_matches_batch(batch_fn: Callable[[], Any], row: int = 0):
    def check(result, caught):
        full = batch_fn()
        got, want = _values(result), _values(full)[row : row + 1]
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            return "one-row result differs from the same row in a batch"
        return None

    return check


def _shape_is(shape: tuple[int, ...]):
    def check(result, caught):
        got = tuple(_values(result).shape)
        return None if got == shape else f"shape {got}, expected {shape}"

    return check


def _gradients_flow(build_loss: Callable[[], tuple[Any, torch.Tensor]]):
    """For unscaled inputs: the loss must have non-zero gradients (or a warning is needed)."""

    def run(tmp):
        module, loss = build_loss()
        loss.backward()
        gpn_layer = getattr(module, "layers", [module])[0]  # the first GPN layer's weights
        grad = gpn_layer.weight.grad
        return {"loss": loss.detach(), "max_grad": 0.0 if grad is None else float(grad.abs().max())}

    return run


def _grads_nonzero(result, caught):
    if result["max_grad"] == 0.0:
        return "all gradients are exactly zero (inputs far outside the inducing range), no hint"
    return None


def _no_temporaries(tmp: Path) -> str | None:
    left = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*.tmp"))
    return f"partial temporary files left behind: {left}" if left else None


# ---------------------------------------------------------------------------------- files
_SHARED_RUNS: dict[str, Path] = {}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _cli(*argv: str, timeout: float = 120.0, prelude: str | None = None) -> CliResult:
    """Run ``python -m pyro_gpn.cli argv`` (after ``prelude``, Python source) in ``ROOT``."""
    if prelude is None:
        command = [sys.executable, "-m", "pyro_gpn.cli", *argv]
    else:
        code = prelude + f"\nimport runpy, sys\nsys.argv = ['pyro-gpn', *{list(argv)!r}]\n"
        code += "runpy.run_module('pyro_gpn.cli', run_name='__main__')\n"
        command = [sys.executable, "-c", code]
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as expired:
        return CliResult(-9, _text(expired.stdout), _text(expired.stderr), timed_out=True)
    return CliResult(done.returncode, done.stdout, done.stderr)


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


TRAIN = ("train", "yacht", "--sizes", "4", "--quiet", "--threads", "1")


def _trained_run(tmp: Path, epochs: int = 2) -> Path:
    """A finished ``pyro-gpn train`` folder (trained once per process, copied per case)."""
    key = f"yacht-{epochs}"
    if key not in _SHARED_RUNS:
        base = Path(tempfile.mkdtemp(prefix="probe-run-")) / "run"
        done = _cli(*TRAIN, "--max-epochs", str(epochs), "--out", str(base))
        if done.returncode != 0:
            raise RuntimeError(f"probe setup: training failed: {done.stderr[-2000:]}")
        _SHARED_RUNS[key] = base
    target = tmp / "run"
    shutil.copytree(_SHARED_RUNS[key], target)
    return target


def _flip(path: Path, count: int = 100, seed: int = 0) -> None:
    data = bytearray(path.read_bytes())
    generator = torch.Generator().manual_seed(seed)
    start = len(data) // 2  # past the zip headers: the tensors' bytes
    for index in torch.randint(start, len(data), (count,), generator=generator).tolist():
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


def _flip_tensor_bytes(path: Path, count: int = 100, seed: int = 0) -> None:
    """Flip bytes inside the largest tensor record of a torch zip file (headers intact)."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = max(
            (i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size
        )
    data = bytearray(path.read_bytes())
    name_len = int.from_bytes(data[info.header_offset + 26 : info.header_offset + 28], "little")
    extra_len = int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.randint(0, info.file_size, (count,), generator=generator).tolist()
    for offset in offsets:
        data[start + offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path, fraction: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


def _evaluate_after(damage: Callable[[Path], None]) -> Callable[[Path], CliResult]:
    def run(tmp: Path) -> CliResult:
        run_dir = _trained_run(tmp)
        damage(run_dir)
        return _cli("evaluate", str(run_dir), "--json")

    return run


def _edit_result(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        record = json.loads((run_dir / "result.json").read_text())
        edit(record)
        (run_dir / "result.json").write_text(json.dumps(record))

    return damage


def _trainer_resume_after(damage: Callable[[Path], None]) -> Callable[[Path], Any]:
    """Train 2 epochs in-process, damage ``checkpoint.pt``, resume for 3."""

    def run(tmp: Path):
        from pyro_gpn.inference import TrainConfig, Trainer

        x, y = _data(20), _targets(20)
        config = TrainConfig(max_epochs=2, batch_size=8, out_dir=str(tmp / "out"), progress=False)
        Trainer(_net("gaussian"), config).fit((x, y), (x, y))
        damage(tmp / "out" / "checkpoint.pt")
        config = TrainConfig(max_epochs=3, batch_size=8, out_dir=str(tmp / "out"), progress=False)
        return Trainer(_net("gaussian"), config).fit((x, y), (x, y), resume=True)

    return run


# ------------------------------------------------------------------ simulated disk faults
_FAULTY_OPEN = """
import builtins, errno, os
_OUT = os.path.realpath({out!r})
_real_open = builtins.open
class _Full:
    def __init__(self, handle): self._h, self._left = handle, 200
    def write(self, data):
        if len(data) > self._left:  # what fits, then the error
            self._h.write(data[: self._left]); self._left = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self._left -= len(data); return self._h.write(data)
    def __getattr__(self, name): return getattr(self._h, name)
    def __enter__(self): return self
    def __exit__(self, *exc): return self._h.__exit__(*exc)
def _open(file, mode="r", *args, **kwargs):
    inside = isinstance(file, (str, os.PathLike)) and os.path.realpath(file).startswith(_OUT)
    if inside and any(c in mode for c in "wax+"):
        if {kind!r} == "readonly":
            raise OSError(errno.EROFS, "Read-only file system", str(file))
        return _Full(_real_open(file, mode, *args, **kwargs))
    return _real_open(file, mode, *args, **kwargs)
builtins.open = _open
_real_os_open, _real_fdopen = os.open, os.fdopen
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
def _os_open(path, flags, *args, **kwargs):
    inside = os.path.realpath(path).startswith(_OUT)
    if inside and flags & _WRITE and {kind!r} == "readonly":
        raise OSError(errno.EROFS, "Read-only file system", str(path))
    return _real_os_open(path, flags, *args, **kwargs)
def _fdopen(fd, mode="r", *args, **kwargs):
    handle = _real_fdopen(fd, mode, *args, **kwargs)
    try:
        target = os.readlink(f"/proc/self/fd/{{fd}}")
    except OSError:
        return handle
    if target.startswith(_OUT) and any(c in mode for c in "wax+") and {kind!r} == "full":
        return _Full(handle)
    return handle
os.open, os.fdopen = _os_open, _fdopen
"""


def _train_on_faulty_disk(kind: str) -> Callable[[Path], CliResult]:
    def run(tmp: Path) -> CliResult:
        out = tmp / "out"
        out.mkdir()
        prelude = _FAULTY_OPEN.format(out=str(out), kind=kind)
        return _cli(*TRAIN, "--max-epochs", "2", "--out", str(out), prelude=prelude)

    return run


def _faulty_trainer(kind: str) -> Callable[[Path], Any]:
    """In-process ``Trainer.fit`` with ``open`` / ``os.open`` / ``os.fdopen`` failing inside
    ``out_dir``."""

    def run(tmp: Path):
        import builtins

        from pyro_gpn.inference import TrainConfig, Trainer

        out = tmp / "out"
        out.mkdir()
        namespace: dict = {}
        exec(_FAULTY_OPEN.format(out=str(out), kind=kind), namespace)  # patches builtins.open
        real = namespace["_real_open"]
        try:
            x, y = _data(20), _targets(20)
            config = TrainConfig(max_epochs=2, batch_size=8, out_dir=str(out), progress=False)
            return Trainer(_net("gaussian"), config).fit((x, y), (x, y))
        finally:
            builtins.open = real
            os.open, os.fdopen = namespace["_real_os_open"], namespace["_real_fdopen"]

    return run


def _trainer_in_locked_folder(tmp: Path) -> Any:
    """``Trainer.fit`` into a folder that another live process holds (``RunLock``)."""
    from pyro_gpn.inference import TrainConfig, Trainer

    out = tmp / "out"
    code = (
        "import time; from pyro_gpn.io import RunLock; "
        f"lock = RunLock({str(out)!r}).acquire(); print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        holder.stdout.readline()
        config = TrainConfig(max_epochs=1, batch_size=8, out_dir=str(out), progress=False)
        x, y = _data(20), _targets(20)
        return Trainer(_net("gaussian"), config).fit((x, y), (x, y))
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------ processes
def _popen_train(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pyro_gpn.cli", *TRAIN, *argv],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def _interrupt_training(tmp: Path) -> CliResult:
    out = tmp / "out"
    proc = _popen_train("--max-epochs", "500", "--patience", "1000", "--out", str(out))
    try:
        started = _wait_for(out / "checkpoint.pt", proc, 90)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        return CliResult(-9, stdout, stderr, timed_out=True)
    result = CliResult(proc.returncode, stdout, stderr, extra={"started": started})
    return result


def _resume_hint(result: CliResult, caught) -> str | None:
    if "--resume" not in result.text:
        return "no hint to continue with --resume"
    return None


def _kill_and_resume(tmp: Path) -> CliResult:
    """kill -9 after the first checkpoint, ``--resume``: must equal an uninterrupted run."""
    common = ("--max-epochs", "8", "--patience", "1000", "--batch-size", "64")
    straight = _cli(*TRAIN, *common, "--out", str(tmp / "straight"))
    if straight.returncode != 0:
        return straight
    proc = _popen_train(*common, "--out", str(tmp / "killed"))
    _wait_for(tmp / "killed" / "checkpoint.pt", proc, 90)
    proc.kill()
    proc.communicate()
    killed_at = None
    with contextlib.suppress(Exception):
        checkpoint = torch.load(tmp / "killed" / "checkpoint.pt", weights_only=True)
        killed_at = checkpoint["result"]["epochs"]
    resumed = _cli(*TRAIN, *common, "--out", str(tmp / "killed"), "--resume")
    resumed.extra["notes"] = [f"killed (SIGKILL, exit {proc.returncode}) after epoch {killed_at};"]
    resumed.extra["dirs"] = (tmp / "straight", tmp / "killed")
    return resumed


def _identical_to_straight(result: CliResult, caught) -> str | None:
    straight, killed = result.extra["dirs"]
    a = torch.load(straight / "model.pt", weights_only=True)
    b = torch.load(killed / "model.pt", weights_only=True)
    if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
        return "resumed parameters differ from an uninterrupted run"
    return None


def _concurrent_trains(count: int) -> Callable[[Path], CliResult]:
    def run(tmp: Path) -> CliResult:
        out = tmp / "out"
        procs = [_popen_train("--max-epochs", "6", "--out", str(out)) for _ in range(count)]
        outputs = []
        for proc in procs:
            try:
                stdout, stderr = proc.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                return CliResult(-9, "", "", timed_out=True)
            outputs.append((proc.returncode, stdout, stderr))
        codes = [code for code, _, _ in outputs]
        text_err = "\n".join(err for _, _, err in outputs if err)
        text_out = "\n".join(out_ for _, out_, _ in outputs if out_)
        # one success and clear refusals is the goal; report the worst process
        worst = max(codes, key=lambda c: c != 0)
        return CliResult(worst, text_out, text_err, extra={"codes": codes})

    return run


def _one_winner(result: CliResult, caught) -> str | None:
    codes = result.extra["codes"]
    if codes.count(0) != 1:
        return f"exit codes {codes}: {codes.count(0)} runs claim the same folder"
    return None


# ---------------------------------------------------------------------------------- the cases
def _cases() -> list[Case]:  # noqa: C901 - a table
    import numpy as np

    from pyro_gpn import GPNLayer, GPNNet, Moments
    from pyro_gpn.data import RegressionData
    from pyro_gpn.inference import ClosedFormELBO
    from pyro_gpn.models import NonParametricGPN, ParametricGPN

    cases: list[Case] = []

    def add(id, entry, fault, run, names=(), **kw):
        cases.append(Case(id, entry, fault, run, tuple(names), **kw))

    x, x64, x16 = _data(), _data().double(), _data().half()
    nan_x = _data().index_put_((torch.tensor([0]), torch.tensor([1])), torch.tensor(math.nan))
    inf_x = _data().index_put_((torch.tensor([1]), torch.tensor([0])), torch.tensor(math.inf))
    big_x = _data(scale=1e6)

    # ------------------------------------------------------------ GPNLayer
    E = "GPNLayer"
    add("layer/shape-1d", E, "shape", lambda t: _layer()(torch.randn(5)), ["inputs"])
    add("layer/shape-features", E, "shape", lambda t: _layer()(torch.randn(5, 2)), ["inputs"])
    add("layer/shape-3d", E, "shape", lambda t: _layer()(torch.randn(2, 5, 3)), ["inputs"])
    add(
        "layer/dtype-float64",
        E,
        "dtype",
        lambda t: _layer()(x64),
        ["inputs"],
        expect="either",
        check=_same_as_float32(lambda: _layer()(x)),
    )
    add(
        "layer/dtype-float16",
        E,
        "dtype",
        lambda t: _layer()(x16),
        ["inputs"],
        expect="either",
        check=_same_as_float32(lambda: _layer()(x16.float()), rtol=1e-2),
    )
    add("layer/dtype-int", E, "dtype", lambda t: _layer()(x.long()), ["inputs"])
    add("layer/nan-input", E, "nan", lambda t: _layer()(nan_x), ["inputs"])
    add("layer/inf-input", E, "nan", lambda t: _layer()(inf_x), ["inputs"])
    add(
        "layer/nan-parameter",
        E,
        "nan",
        lambda t: _nan_params(_layer())(x),
        ["weight", "parameter", "parameters"],
        note="issue 14: NaN parameters flow through",
    )
    add(
        "layer/empty-batch",
        E,
        "empty",
        lambda t: _layer()(x[:0]),
        ["inputs"],
        expect="result",
        check=_shape_is((0, 4)),
    )
    add(
        "layer/one-row",
        E,
        "one-row",
        lambda t: _layer()(x[:1]),
        ["inputs"],
        expect="result",
        check=_row_matches_batch(lambda: _layer()(x)),
    )
    add(
        "layer/device-cuda-unavailable",
        E,
        "device",
        lambda t: GPNLayer(3, 4, device="cuda"),
        ["device", "cuda"],
        note="issue 14",
        requires=("no-cuda",),
    )
    add(
        "layer/device-mismatch", E, "device", lambda t: _layer()(x.to("meta")), ["inputs", "device"]
    )
    add(
        "layer/moments-input-float64",
        E,
        "dtype",
        lambda t: _layer()(Moments(x64, var=x64.abs())),
        ["inputs"],
        expect="either",
        check=_same_as_float32(lambda: _layer()(Moments(x, var=x.abs()))),
    )
    add("layer/bad-mode", E, "value", lambda t: _layer()(x, mode="full"), ["mode"])
    add(
        "layer/unscaled-1e6",
        E,
        "scale",
        _gradients_flow(lambda: (lambda l: (l, l(big_x).mean.sum()))(_layer())),
        ["scale", "standardise", "standardize", "inducing"],
        expect="result",
        check=_grads_nonzero,
        note="issue 14: 1e6 inputs give zero gradients",
    )
    add("layer/in-features-0", E, "value", lambda t: GPNLayer(0, 4), ["in_features"])
    add(
        "layer/dtype-int-params", E, "dtype", lambda t: GPNLayer(3, 4, dtype=torch.int64), ["dtype"]
    )
    add(
        "layer/lengthscale-nan",
        E,
        "nan",
        lambda t: GPNLayer(3, 4, lengthscale_init=math.nan),
        ["lengthscale_init"],
    )
    add(
        "layer/noise-inf",
        E,
        "nan",
        lambda t: GPNLayer(3, 4, noise_std_init=math.inf),
        ["noise_std_init"],
        note="inf passes a `> 0` check",
    )
    add(
        "layer/inducing-range-nan",
        E,
        "nan",
        lambda t: GPNLayer(3, 4, inducing_range=(math.nan, 1.0)),
        ["inducing_range"],
    )
    add(
        "layer/num-inducing-1",
        E,
        "value",
        lambda t: _layer(num_inducing=1)(x),
        ["num_inducing"],
        expect="either",
    )
    add(
        "layer/numpy-input",
        E,
        "dtype",
        lambda t: _layer()(x.numpy()),
        ["inputs"],
        expect="either",
        check=_same_as_float32(lambda: _layer()(x), rtol=1e-6),
        note="the dtype rule: NumPy arrays are accepted and cast like tensors",
    )

    # ------------------------------------------------------------ GPNNet.forward / predict
    E = "GPNNet.forward"
    add("net/shape-1d", E, "shape", lambda t: _net()(torch.randn(3)), ["x"])
    add("net/shape-features", E, "shape", lambda t: _net()(torch.randn(5, 4)), ["x"])
    add(
        "net/dtype-float64",
        E,
        "dtype",
        lambda t: _net()(x64),
        ["x"],
        expect="either",
        check=_same_as_float32(lambda: _net()(x)),
        note="issue 14: numpy data is float64",
    )
    add(
        "net/dtype-float16",
        E,
        "dtype",
        lambda t: _net()(x16),
        ["x"],
        expect="either",
        check=_same_as_float32(lambda: _net()(x16.float()), rtol=1e-2),
        note="issue 14",
    )
    add(
        "net/float64-network-float32-x",
        E,
        "dtype",
        lambda t: _net(dtype=torch.float64)(x),
        ["x"],
        expect="either",
        # the same float64 network fed the same values in float64 (a float32 network would
        # draw different initial weights)
        check=_same_as_float32(lambda: _net(dtype=torch.float64)(x64), rtol=1e-9),
    )
    add("net/nan-input", E, "nan", lambda t: _net()(nan_x), ["x"])
    add("net/inf-input", E, "nan", lambda t: _net()(inf_x), ["x"])
    add(
        "net/nan-parameter",
        E,
        "nan",
        lambda t: _nan_params(_net())(x),
        ["weight", "parameter", "parameters"],
        note="issue 14",
    )
    add(
        "net/empty-batch",
        E,
        "empty",
        lambda t: _net()(x[:0]),
        ["x"],
        expect="result",
        check=_shape_is((0, 2)),
    )
    add(
        "net/one-row",
        E,
        "one-row",
        lambda t: _net()(x[:1]),
        ["x"],
        expect="result",
        check=_row_matches_batch(lambda: _net()(x)),
    )
    add(
        "net/device-cuda-unavailable",
        "GPNNet",
        "device",
        lambda t: GPNNet([3, 4, 2], device="cuda"),
        ["device", "cuda"],
        requires=("no-cuda",),
    )
    add("net/device-mismatch", E, "device", lambda t: _net()(x.to("meta")), ["x", "device"])
    add("net/x-var-negative", E, "value", lambda t: _net()(x, -x.abs()), ["x_var"])
    add("net/x-var-shape", E, "shape", lambda t: _net()(x, x[:, :2].abs()), ["x_var"])
    add(
        "net/x-var-float64",
        E,
        "dtype",
        lambda t: _net()(x, x64.abs()),
        ["x_var"],
        expect="either",
        check=_same_as_float32(lambda: _net()(x, x.abs())),
    )
    add(
        "net/numpy-input",
        E,
        "dtype",
        lambda t: _net()(x64.numpy()),
        ["x"],
        expect="either",
        check=_same_as_float32(lambda: _net()(x)),
        note="the dtype rule: float64 NumPy data are accepted and cast",
    )
    add(
        "net/unscaled-1e6",
        E,
        "scale",
        _gradients_flow(lambda: (lambda n: (n, n.loss(big_x, _labels())))(_net())),
        ["scale", "standardise", "standardize", "inducing"],
        expect="result",
        check=_grads_nonzero,
        note="issue 14",
    )
    add("net/sizes-too-short", "GPNNet", "value", lambda t: GPNNet([3, 2]), ["sizes"])
    add("net/mode-unknown", "GPNNet", "value", lambda t: GPNNet([3, 4, 2], mode="full"), ["mode"])
    add(
        "net/sizes-float",
        "GPNNet",
        "value",
        lambda t: GPNNet([3.0, 4, 2]),
        ["sizes"],
        expect="either",  # integral floats are widths, as for every network (integer_sizes)
        check=lambda net, w: None if net.sizes == [3, 4, 2] else f"sizes {net.sizes}",
    )
    add("net/sizes-fraction", "GPNNet", "value", lambda t: GPNNet([3.5, 4, 2]), ["sizes"])

    E = "GPNNet.loss"
    add(
        "loss/empty-batch-softmax",
        E,
        "empty",
        lambda t: _net().loss(x[:0], _labels(0)),
        ["x", "batch", "empty"],
        note="issue 14: NaN",
    )
    add(
        "loss/empty-batch-gaussian",
        E,
        "empty",
        lambda t: _net("gaussian").loss(x[:0], _targets(0)),
        ["x", "batch", "empty"],
        note="issue 14: NaN",
    )
    add(
        "loss/one-row-softmax",
        E,
        "one-row",
        lambda t: _net().loss(x[:1], _labels()[:1]),
        ["x"],
        expect="result",
        check=lambda r, w: None if r.shape == () else f"shape {tuple(r.shape)}",
    )
    add(
        "loss/label-too-large",
        E,
        "labels",
        lambda t: _net().loss(x, torch.full((6,), 2)),
        ["y", "target"],
    )
    add(
        "loss/label-negative",
        E,
        "labels",
        lambda t: _net().loss(x, torch.full((6,), -1)),
        ["y", "target"],
    )
    add(
        "loss/float-labels",
        E,
        "labels",
        lambda t: _net().loss(x, _labels().float()),
        ["y", "target"],
    )
    add(
        "loss/labels-wrong-length",
        E,
        "shape",
        lambda t: _net().loss(x, _labels(5)),
        ["y", "target"],
    )
    add("loss/labels-2d", E, "shape", lambda t: _net().loss(x, _labels()[:, None]), ["y", "target"])
    add(
        "loss/labels-int32",
        E,
        "dtype",
        lambda t: _net().loss(x, _labels().int()),
        ["y"],
        expect="either",
        check=lambda r, w: None if torch.isclose(r, _net().loss(x, _labels())) else "differs",
    )
    add(
        "loss/gaussian-y-1d",
        E,
        "shape",
        lambda t: _net("gaussian").loss(x, _targets()[:, 0]),
        ["y", "target"],
        expect="either",
        check=lambda r, w: (
            None
            if torch.isclose(r, _net("gaussian").loss(x, _targets()))
            else "a [S] target broadcast against [S, 1] gives a different loss"
        ),
    )
    add(
        "loss/gaussian-y-float64",
        E,
        "dtype",
        lambda t: _net("gaussian").loss(x, _targets().double()),
        ["y", "target"],
        expect="either",
        check=_same_as_float32(lambda: _net("gaussian").loss(x, _targets())),
    )
    add(
        "loss/gaussian-y-nan",
        E,
        "nan",
        lambda t: _net("gaussian").loss(x, _targets().index_fill_(0, torch.tensor([0]), math.nan)),
        ["y", "target"],
    )
    add(
        "loss/gaussian-y-wrong-rows",
        E,
        "shape",
        lambda t: _net("gaussian").loss(x, _targets(5)),
        ["y", "target"],
    )
    add(
        "loss/x-float64",
        E,
        "dtype",
        lambda t: _net().loss(x64, _labels()),
        ["x"],
        expect="either",
        check=_same_as_float32(lambda: _net().loss(x, _labels())),
    )
    add(
        "loss/nan-parameter",
        E,
        "nan",
        lambda t: _nan_params(_net()).loss(x, _labels()),
        ["weight", "parameter", "parameters"],
    )
    add(
        "loss/labels-list",
        E,
        "dtype",
        lambda t: _net().loss(x, [0, 1, 0, 1, 0, 1]),
        ["y", "target"],
    )
    add(
        "loss/mode-cov-float64-x",
        E,
        "dtype",
        lambda t: _net(mode="cov").loss(x64, _labels()),
        ["x"],
        expect="either",
        check=_same_as_float32(lambda: _net(mode="cov").loss(x, _labels())),
    )

    E = "GPNNet.predict"
    add(
        "predict/nan-parameter",
        E,
        "nan",
        lambda t: _nan_params(_net()).predict(x),
        ["weight", "parameter", "parameters"],
        note="issue 14",
    )
    add(
        "predict/float64",
        E,
        "dtype",
        lambda t: _net().predict(x64),
        ["x"],
        expect="either",
        check=_same_as_float32(lambda: _net().predict(x)),
    )
    add(
        "predict/empty-batch",
        E,
        "empty",
        lambda t: _net().predict(x[:0]),
        ["x"],
        expect="result",
        check=_shape_is((0, 2)),
    )
    add(
        "predict/one-row-gaussian",
        E,
        "one-row",
        lambda t: _net("gaussian").predict(x[:1]),
        ["x"],
        expect="result",
        check=_row_matches_batch(lambda: _net("gaussian").predict(x)),
    )

    # ------------------------------------------------------------ Moments
    E = "Moments"
    add(
        "moments/mixed-dtype",
        E,
        "dtype",
        lambda t: Moments(x64, var=x.abs()),
        ["var"],
        note="issue 14",
    )
    add(
        "moments/mixed-dtype-cov",
        E,
        "dtype",
        lambda t: Moments(x, cov=torch.eye(3, dtype=torch.float64).expand(6, 3, 3)),
        ["cov"],
    )
    add(
        "moments/mixed-device",
        E,
        "device",
        lambda t: Moments(x, var=x.abs().to("meta")),
        ["var", "device"],
        note="issue 14",
    )
    add("moments/mean-1d", E, "shape", lambda t: Moments(torch.randn(3)), ["mean"])
    add("moments/var-negative", E, "value", lambda t: Moments(x, var=-x.abs()), ["var"])
    add("moments/var-nan", E, "nan", lambda t: Moments(x, var=nan_x.abs()), ["var"])
    add("moments/mean-inf", E, "nan", lambda t: Moments(inf_x), ["mean"])
    add(
        "moments/cov-not-psd",
        E,
        "value",
        lambda t: Moments(x, cov=-torch.eye(3).expand(6, 3, 3)),
        ["cov"],
    )
    add(
        "moments/var-and-cov",
        E,
        "value",
        lambda t: Moments(x, var=x.abs(), cov=torch.eye(3).expand(6, 3, 3)),
        ["var", "cov"],
    )
    add("moments/mean-int", E, "dtype", lambda t: Moments(x.long()), ["mean"])
    add("moments/var-shape", E, "shape", lambda t: Moments(x, var=x[:, :2].abs()), ["var"])
    add(
        "moments/empty",
        E,
        "empty",
        lambda t: Moments(x[:0], var=x[:0]),
        ["mean"],
        expect="result",
        check=_shape_is((0, 3)),
    )
    add(
        "moments/float16",
        E,
        "dtype",
        lambda t: Moments(x16, var=x16.abs()),
        ["mean"],
        expect="result",
        check=_shape_is((6, 3)),
    )
    add(
        "moments/linear-float64-weight",
        "Moments.linear",
        "dtype",
        lambda t: Moments(x, var=x.abs()).linear(torch.randn(3, 2, dtype=torch.float64)),
        ["weight"],
        expect="either",
        check=lambda r, w: None if r.mean.dtype in (torch.float32, torch.float64) else "dtype",
    )
    add(
        "moments/linear-wrong-weight",
        "Moments.linear",
        "shape",
        lambda t: Moments(x, var=x.abs()).linear(torch.randn(4, 2)),
        ["weight"],
    )

    # ------------------------------------------------------------ VariationalGPN
    E = "VariationalGPN"
    y_lab3 = torch.tensor([0, 1, 2, 0, 1, 0])
    add(
        "vgpn/model-float64-trace",
        E,
        "dtype",
        lambda t: _elbo_step((v := _vgpn()).model, v.guide, x64, _targets().double()),
        ["x"],
        expect="either",
        note="issue 14: VariationalGPN.model(x.double())",
    )
    add(
        "vgpn/model-float64-closed",
        E,
        "dtype",
        lambda t: _elbo_step(
            (v := _vgpn()).model, v.guide, x64, _targets().double(), loss="closed"
        ),
        ["x"],
        expect="either",
    )
    add(
        "vgpn/labels-out-of-range-trace",
        E,
        "labels",
        lambda t: _elbo_step((v := _vgpn("softmax")).model, v.guide, x, y_lab3),
        ["y", "target"],
        note="issue 14: softmax VGPN, out-of-range labels under Trace_ELBO",
    )
    add(
        "vgpn/labels-out-of-range-closed",
        E,
        "labels",
        lambda t: _elbo_step((v := _vgpn("softmax")).model, v.guide, x, y_lab3, loss="closed"),
        ["y", "target"],
    )
    add(
        "vgpn/labels-float-trace",
        E,
        "labels",
        lambda t: _elbo_step((v := _vgpn("softmax")).model, v.guide, x, _labels().float()),
        ["y", "target"],
    )
    add(
        "vgpn/closed-no-y",
        E,
        "value",
        lambda t: _elbo_step((v := _vgpn()).model, v.guide, x, None, loss="closed"),
        ["y"],
    )
    add(
        "vgpn/shape-features",
        E,
        "shape",
        lambda t: _elbo_step((v := _vgpn()).model, v.guide, torch.randn(6, 2), _targets()),
        ["x"],
    )
    add(
        "vgpn/y-wrong-shape",
        E,
        "shape",
        lambda t: _elbo_step((v := _vgpn()).model, v.guide, x, _targets()[:, 0]),
        ["y"],
    )
    add(
        "vgpn/nan-x-trace",
        E,
        "nan",
        lambda t: _elbo_step((v := _vgpn()).model, v.guide, nan_x, _targets()),
        ["x"],
    )
    add(
        "vgpn/empty-batch-trace",
        E,
        "empty",
        lambda t: _elbo_step((v := _vgpn()).model, v.guide, x[:0], _targets(0)),
        ["x", "batch", "empty"],
        expect="either",
    )
    add(
        "vgpn/empty-batch-closed-num-data",
        E,
        "empty",
        lambda t: _elbo_step(
            (v := _vgpn(num_data=10)).model, v.guide, x[:0], _targets(0), loss="closed"
        ),
        ["x", "batch", "empty"],
    )
    add(
        "vgpn/one-row-closed",
        E,
        "one-row",
        lambda t: _elbo_step((v := _vgpn()).model, v.guide, x[:1], _targets()[:1], loss="closed"),
        ["x"],
        expect="result",
    )
    add(
        "vgpn/nan-parameter-predictive",
        "VariationalGPN.predictive_moments",
        "nan",
        lambda t: _nan_params(_vgpn()).predictive_moments(x),
        ["weight", "parameter", "parameters"],
    )
    add(
        "vgpn/predict-float64",
        "VariationalGPN.predictive_moments",
        "dtype",
        lambda t: _vgpn().predictive_moments(x64),
        ["x"],
        expect="either",
        check=_same_as_float32(lambda: _vgpn().predictive_moments(x)),
    )
    add(
        "vgpn/batch-above-num-data",
        E,
        "value",
        lambda t: _elbo_step((v := _vgpn(num_data=3)).model, v.guide, x, _targets()),
        ["num_data"],
    )
    add(
        "vgpn/device-cuda-unavailable",
        E,
        "device",
        lambda t: _vgpn(device="cuda"),
        ["device", "cuda"],
        requires=("no-cuda",),
    )
    add("vgpn/q-cov-unknown", E, "value", lambda t: _vgpn(q_cov="dense"), ["q_cov"])

    # ------------------------------------------------------------ ParametricGPN
    E = "ParametricGPN"
    add(
        "pgpn/model-float64",
        E,
        "dtype",
        lambda t: _elbo_step((p := _pgpn()).model, p.guide, x64, _targets().double()),
        ["x"],
        expect="either",
    )
    add(
        "pgpn/labels-out-of-range",
        E,
        "labels",
        lambda t: _elbo_step((p := _pgpn("softmax")).model, p.guide, x, y_lab3),
        ["y", "target"],
    )
    add(
        "pgpn/empty-batch",
        E,
        "empty",
        lambda t: _elbo_step((p := _pgpn()).model, p.guide, x[:0], _targets(0)),
        ["x", "batch", "empty"],
    )
    add(
        "pgpn/y-wrong-shape",
        E,
        "shape",
        lambda t: _elbo_step((p := _pgpn()).model, p.guide, x, _targets(5)),
        ["y"],
    )
    add(
        "pgpn/predict-nan-parameter",
        "ParametricGPN.predict",
        "nan",
        lambda t: _nan_params(_pgpn()).predict(x, num_samples=4),
        ["weight", "parameter", "parameters"],
    )
    add(
        "pgpn/predict-num-samples-0",
        "ParametricGPN.predict",
        "value",
        lambda t: _pgpn().predict(x, num_samples=0),
        ["num_samples"],
    )
    add(
        "pgpn/predict-one-row",
        "ParametricGPN.predict",
        "one-row",
        lambda t: _pgpn().sample_predictive(x[:1], num_samples=4),
        ["x"],
        expect="result",
        check=lambda r, w: None if r["y"].shape == (4, 1, 1) else f"shape {tuple(r['y'].shape)}",
    )
    add(
        "pgpn/from-network-wrong-type",
        "ParametricGPN.from_network",
        "value",
        lambda t: ParametricGPN.from_network(torch.nn.Linear(3, 1)),
        ["network"],
    )
    add(
        "pgpn/device-mismatch",
        E,
        "device",
        lambda t: _elbo_step((p := _pgpn()).model, p.guide, x.to("meta"), _targets().to("meta")),
        ["x", "device"],
    )

    # ------------------------------------------------------------ NonParametricGPN / run_nuts
    def nuts(xt, yt, xs=None, model=None, **kw):
        from pyro_gpn.inference import run_nuts

        options = dict(num_samples=4, warmup_steps=4, num_chains=1, jit_compile=False)
        options.update(kw)
        return run_nuts(model or _npgpn(), xt, yt, xs, **options)

    xn, yn = _data(8, 1), _targets(8)
    E = "run_nuts"
    add(
        "nuts/tiny-float32",
        E,
        "dtype",
        lambda t: nuts(xn, yn[:, 0]).samples,
        ["x_train"],
        expect="result",
    )
    add("nuts/nan-x", E, "nan", lambda t: nuts(nan_x[:, 1:2], yn[:6, 0]), ["x_train"])
    add("nuts/y-wrong-length", E, "shape", lambda t: nuts(xn, yn[:5, 0]), ["y_train"])
    add("nuts/empty", E, "empty", lambda t: nuts(xn[:0], yn[:0, 0]), ["x_train"])
    add(
        "nuts/one-row",
        E,
        "one-row",
        lambda t: nuts(xn[:1], yn[:1, 0], xn[1:3]).samples,
        ["x_train"],
        expect="result",
    )
    add(
        "nuts/x-test-features",
        E,
        "shape",
        lambda t: nuts(xn, yn[:, 0], torch.randn(3, 2)),
        ["x_test"],
    )
    add("nuts/y-inf", E, "nan", lambda t: nuts(xn, yn[:, 0].clone().fill_(math.inf)), ["y_train"])
    add(
        "nuts/wrong-model",
        E,
        "value",
        lambda t: nuts(xn, yn[:, 0], model=_net("gaussian")),
        ["model"],
    )
    add(
        "nuts/float16-dtype",
        "NonParametricGPN",
        "dtype",
        lambda t: _npgpn(dtype=torch.float16),
        ["dtype"],
    )
    add(
        "nuts/sizes-zero",
        "NonParametricGPN",
        "value",
        lambda t: NonParametricGPN([1, 0]),
        ["sizes"],
    )
    add(
        "nuts/num-samples-0",
        E,
        "value",
        lambda t: nuts(xn, yn[:, 0], num_samples=0),
        ["num_samples"],
    )

    # ------------------------------------------------------------ fit_svi
    def svi(xs, ys, model=None, **kw):
        from pyro_gpn.inference import fit_svi

        m = model or _pgpn()
        options = dict(num_steps=3, progress=False, seed=0)
        options.update(kw)
        return fit_svi(m.model, m.guide, xs, ys, **options)

    E = "fit_svi"
    add(
        "svi/zero-rows",
        E,
        "empty",
        lambda t: svi(x[:0], _targets(0)),
        ["x", "samples", "rows"],
        note="issue 14: ZeroDivisionError inside a plate",
    )
    add(
        "svi/zero-rows-vgpn",
        E,
        "empty",
        lambda t: svi(x[:0], _targets(0), model=_vgpn()),
        ["x", "samples", "rows"],
    )
    add("svi/numpy-x", E, "dtype", lambda t: svi(x.numpy(), _targets()), ["x"])
    add("svi/y-length", E, "shape", lambda t: svi(x, _targets(5)), ["y"])
    add(
        "svi/num-steps-negative",
        E,
        "value",
        lambda t: svi(x, _targets(), num_steps=-1),
        ["num_steps"],
    )
    add("svi/batch-size-0", E, "value", lambda t: svi(x, _targets(), batch_size=0), ["batch_size"])
    add("svi/loss-unknown", E, "value", lambda t: svi(x, _targets(), loss="elbo"), ["loss"])
    add("svi/lr-nan", E, "nan", lambda t: svi(x, _targets(), lr=math.nan).losses, ["lr"])
    add(
        "svi/lr-huge",
        E,
        "nan",
        lambda t: svi(x, _targets(), lr=1e6, num_steps=30).losses,
        ["step", "lr"],
        expect="either",
    )
    add(
        "svi/float64-vgpn",
        E,
        "dtype",
        lambda t: svi(x64, _targets().double(), model=_vgpn()).losses,
        ["x"],
        expect="either",
    )
    add(
        "svi/closed-form-on-parametric",
        E,
        "value",
        lambda t: svi(x, _targets(), loss=ClosedFormELBO()),
        ["model", "ClosedFormELBO"],
    )
    add(
        "svi/one-row",
        E,
        "one-row",
        lambda t: svi(x[:1], _targets()[:1]).losses,
        ["x"],
        expect="result",
    )
    add(
        "svi/minibatch-vgpn-without-num-data",
        E,
        "value",
        lambda t: svi(x, _targets(), model=_vgpn(), batch_size=2).losses,
        ["num_data", "batch_size"],
        expect="result",
        note="fit_svi passes num_data to every model (the model-inference contract)",
    )

    # ------------------------------------------------------------ Trainer / TrainConfig
    from pyro_gpn.inference import TrainConfig, Trainer, evaluate

    def fit(net, train, val=None, **kw):
        options = dict(max_epochs=2, batch_size=4, progress=False)
        options.update(kw)
        return Trainer(net, TrainConfig(**options)).fit(train, val or train)

    xt, yt, lt = _data(12), _targets(12), _labels(12)
    E = "Trainer.fit"
    add(
        "trainer/classification-float-targets",
        E,
        "labels",
        lambda t: fit(_net(), (xt, yt[:, 0]), task="classification").history[-1],
        ["y", "task", "target", "targets"],
    )
    add(
        "trainer/classification-task-regression-net",
        E,
        "labels",
        lambda t: fit(_net("gaussian"), (xt, yt), task="classification").history[-1],
        ["y", "task", "target", "targets"],
        note="issue 14: trains and reports val_error 20.0",
    )
    add(
        "trainer/float64-data",
        E,
        "dtype",
        lambda t: fit(_net("gaussian"), (xt.double(), yt.double())).history[-1],
        ["x"],
        expect="either",
        note="issue 14",
    )
    add(
        "trainer/float64-y-only",
        E,
        "dtype",
        lambda t: fit(_net("gaussian"), (xt, yt.double())).history[-1],
        ["y"],
        expect="either",
    )
    add("trainer/empty-train", E, "empty", lambda t: fit(_net(), (xt[:0], lt[:0])), ["train"])
    add(
        "trainer/one-row-train",
        E,
        "one-row",
        lambda t: fit(_net(), (xt[:1], lt[:1]), (xt, lt)).history[-1],
        ["train"],
        expect="result",
    )
    add("trainer/nan-x", E, "nan", lambda t: fit(_net(), (nan_x, _labels())), ["train x"])
    add(
        "trainer/labels-out-of-range",
        E,
        "labels",
        lambda t: fit(_net(), (xt, torch.full((12,), 5))),
        ["y", "target", "labels"],
    )
    add(
        "trainer/lr-huge",
        E,
        "nan",
        lambda t: fit(_net("gaussian"), (xt * 3, yt * 100), lr=1e6, max_epochs=20).history[-1],
        ["epoch"],
        note="issue 14: --lr 1e6",
    )
    add(
        "trainer/nan-parameter",
        E,
        "nan",
        lambda t: fit(_nan_params(_net()), (xt, lt)),
        ["epoch", "weight", "parameter", "parameters"],
    )
    add(
        "trainer/resume-without-out-dir",
        E,
        "value",
        lambda t: Trainer(_net(), TrainConfig(progress=False)).fit((xt, lt), (xt, lt), resume=True),
        ["out_dir"],
    )
    add(
        "trainer/resume-truncated-checkpoint",
        E,
        "file",
        _trainer_resume_after(_truncate),
        ["checkpoint.pt"],
        note="issue 14: OSError Errno 22, no file named",
    )
    add(
        "trainer/resume-flipped-checkpoint",
        E,
        "file",
        _trainer_resume_after(_flip_tensor_bytes),
        ["checkpoint.pt"],
    )
    add(
        "trainer/resume-empty-checkpoint",
        E,
        "file",
        _trainer_resume_after(lambda p: p.write_bytes(b"")),
        ["checkpoint.pt"],
    )
    add(
        "trainer/out-dir-is-file",
        E,
        "disk",
        lambda t: (t / "f").write_text("x") and fit(_net(), (xt, lt), out_dir=str(t / "f")),
        ["out_dir", "f"],
    )
    add(
        "trainer/disk-full",
        E,
        "disk",
        _faulty_trainer("full"),
        ["checkpoint.pt", "metrics.csv", "disk", "out"],
        post=_no_temporaries,
        note="issue 14: partial .tmp left",
    )
    add(
        "trainer/read-only-out-dir",
        E,
        "disk",
        _faulty_trainer("readonly"),
        ["out", "read-only", "folder"],
        post=_no_temporaries,
    )
    add(
        "trainer/model-without-loss",
        "Trainer",
        "value",
        lambda t: Trainer(torch.nn.Linear(3, 2)),
        ["loss"],
    )
    add("trainer/train-not-a-pair", E, "value", lambda t: fit(_net(), xt), ["train"])
    add(
        "trainer/device-cuda-unavailable",
        "Trainer",
        "device",
        lambda t: Trainer(_net(), TrainConfig(device="cuda")),
        ["device", "cuda"],
        requires=("no-cuda",),
    )
    add(
        "trainer/x-on-meta",
        E,
        "device",
        lambda t: fit(_net(), (xt.to("meta"), lt.to("meta"))),
        ["train x", "device"],
    )
    for name, value in (
        ("lr", math.nan),
        ("batch_size", 0),
        ("patience", -1),
        ("task", "rank"),
        ("device", "tpu"),
        ("lr_factor", 1.5),
        ("min_lr", 1.0),
    ):
        add(
            f"trainconfig/{name}",
            "TrainConfig",
            "value",
            lambda t, n=name, v=value: TrainConfig(**{n: v}),
            [name],
        )
    add(
        "evaluate/task-unknown",
        "evaluate",
        "value",
        lambda t: evaluate(_net(), xt, lt, "rank"),
        ["task"],
    )
    add(
        "evaluate/regression-task-on-labels",
        "evaluate",
        "labels",
        lambda t: evaluate(_net(), xt, lt, "regression"),
        ["task", "y"],
    )

    # ------------------------------------------------------------ data loaders
    from pyro_gpn.data import load_dataset

    def letter_dir(tmp: Path, damage: Callable[[Path], None] | None) -> Path:
        source = shared_data()
        if source is None:
            raise FileNotFoundError("the shared datasets are not here (case requires 'data')")
        (tmp / "uci").mkdir(parents=True)
        target = tmp / "uci" / "letter-recognition.data"
        shutil.copy(source / "uci" / "letter-recognition.data", target)
        if damage:
            damage(target)
        return tmp

    E = "load_dataset"
    add("data/unknown-name", E, "value", lambda t: load_dataset("iris"), ["name"])
    add("data/split-negative", E, "value", lambda t: load_dataset("yacht", split=-1), ["split"])
    add("data/seed-bool", E, "value", lambda t: load_dataset("yacht", seed=True), ["seed"])
    add(
        "data/val-fraction-1.5",
        E,
        "value",
        lambda t: load_dataset("yacht", val_fraction=1.5),
        ["val_fraction"],
    )
    add(
        "data/letter-flipped-bytes",
        E,
        "file",
        lambda t: load_dataset("letter", letter_dir(t, lambda p: _flip(p, 10)), download=False),
        ["letter-recognition.data"],
        requires=("data",),
    )
    add(
        "data/letter-truncated",
        E,
        "file",
        lambda t: load_dataset("letter", letter_dir(t, _truncate), download=False),
        ["letter-recognition.data"],
        requires=("data",),
    )
    add(
        "data/letter-missing",
        E,
        "file",
        lambda t: load_dataset("letter", t / "nothing", download=False),
        ["letter-recognition.data"],
    )
    add(
        "data/data-dir-is-file",
        E,
        "file",
        lambda t: (t / "f").write_text("x") and load_dataset("letter", t / "f", download=False),
        ["letter-recognition.data", "data_dir"],
    )
    add(
        "data/from-arrays-nan",
        "RegressionData.from_arrays",
        "nan",
        lambda t: RegressionData.from_arrays(
            "toy",
            nan_x.numpy(),
            _targets().numpy(),
            np.arange(4),
            np.arange(4, 6),
            feature_names=("a", "b", "c"),
            description="toy",
        ),
        ["x"],
    )

    # ------------------------------------------------------------ more of what users hit
    from pyro_gpn.heads import Prediction
    from pyro_gpn.metrics import central_interval_coverage, expected_calibration_error

    add(
        "layer/dtype-bfloat16-params",
        "GPNLayer",
        "dtype",
        lambda t: GPNLayer(3, 4, dtype=torch.bfloat16),
        ["dtype"],
    )
    add(
        "net/x-var-other-device",
        "GPNNet.forward",
        "device",
        lambda t: _net()(x, x.abs().to("meta")),
        ["x_var", "device"],
    )
    add(
        "loss/labels-other-device",
        "GPNNet.loss",
        "device",
        lambda t: _net().loss(x, _labels().to("meta")),
        ["y", "device"],
    )
    add(
        "loss/numpy-labels",
        "GPNNet.loss",
        "dtype",
        lambda t: _net().loss(x.numpy(), _labels().numpy()),
        ["x", "y"],
        expect="either",
        check=lambda r, w: None if torch.isclose(r, _net().loss(x, _labels())) else "differs",
    )
    add(
        "moments/linear-bias-float64",
        "Moments.linear",
        "dtype",
        lambda t: Moments(x).linear(torch.ones(3, 2), torch.zeros(2, dtype=torch.float64)),
        ["bias"],
    )
    add(
        "trainer/empty-val",
        "Trainer.fit",
        "empty",
        lambda t: fit(_net(), (xt, lt), (xt[:0], lt[:0])),
        ["val"],
    )
    add(
        "trainer/one-row-val",
        "Trainer.fit",
        "one-row",
        lambda t: fit(_net(), (xt, lt), (xt[:1], lt[:1])).history[-1],
        ["val"],
        expect="result",
    )
    add(
        "trainer/numpy-data",
        "Trainer.fit",
        "dtype",
        lambda t: fit(_net("gaussian"), (xt.double().numpy(), yt.double().numpy())).history[-1],
        ["train x"],
        expect="either",
    )
    add(
        "trainer/out-dir-in-use",
        "Trainer.fit",
        "concurrency",
        _trainer_in_locked_folder,
        ["in use", "out"],
        timeout=120,
    )
    add(
        "trainer/unscaled-1e6",
        "Trainer.fit",
        "scale",
        lambda t: fit(_net(), (xt * 1e6, lt)).history[-1],
        ["scale", "standardise", "standardize", "inducing"],
        expect="either",
        check=lambda r, w: None if w else "no hint that the inputs are unscaled",
    )
    add(
        "metrics/ece-of-regression",
        "expected_calibration_error",
        "value",
        lambda t: expected_calibration_error(_net("gaussian").predict(x), _labels()),
        ["probs", "regression"],
    )
    add(
        "metrics/coverage-wrong-rows",
        "central_interval_coverage",
        "shape",
        lambda t: central_interval_coverage(_net("gaussian").predict(x), _targets(5)),
        ["target"],
    )
    add(
        "metrics/coverage-of-classification",
        "central_interval_coverage",
        "value",
        lambda t: central_interval_coverage(
            Prediction(torch.full((6, 2), 0.5), torch.zeros(6, 2), "classification"), _targets()
        ),
        ["prediction"],
    )

    # ------------------------------------------------------------ command line
    E = "cli evaluate"
    add(
        "cli/evaluate-flipped-model-tensors",
        E,
        "file",
        _evaluate_after(lambda d: _flip_tensor_bytes(d / "model.pt")),
        ["model.pt"],
        note="issue 14: wrong test error, exit 0",
    )
    add(
        "cli/evaluate-flipped-model-tail",
        E,
        "file",
        _evaluate_after(lambda d: _flip(d / "model.pt")),
        ["model.pt"],
    )
    add(
        "cli/evaluate-truncated-model",
        E,
        "file",
        _evaluate_after(lambda d: _truncate(d / "model.pt")),
        ["model.pt"],
        note="issue 14",
    )
    add(
        "cli/evaluate-empty-model",
        E,
        "file",
        _evaluate_after(lambda d: (d / "model.pt").write_bytes(b"")),
        ["model.pt"],
    )
    add(
        "cli/evaluate-truncated-result",
        E,
        "file",
        _evaluate_after(lambda d: _truncate(d / "result.json")),
        ["result.json"],
        note="issue 14: bare JSONDecodeError",
    )
    add(
        "cli/evaluate-missing-model",
        E,
        "file",
        _evaluate_after(lambda d: (d / "model.pt").unlink()),
        ["model.pt"],
    )
    add(
        "cli/evaluate-missing-folder",
        E,
        "file",
        lambda t: _cli("evaluate", str(t / "nowhere")),
        ["nowhere", "result.json"],
    )
    add(
        "cli/evaluate-result-without-settings",
        E,
        "file",
        _evaluate_after(_edit_result(lambda r: r.pop("settings"))),
        ["result.json", "settings"],
    )
    add(
        "cli/evaluate-sizes-edited",
        E,
        "file",
        _evaluate_after(_edit_result(lambda r: r["settings"].update(sizes=[5]))),
        ["model.pt", "result.json"],
    )
    add(
        "cli/evaluate-run-dir-is-file",
        E,
        "file",
        lambda t: (t / "f").write_text("x") and _cli("evaluate", str(t / "f")),
        ["result.json", "not a directory", "is a file"],
    )
    add(
        "cli/evaluate-cuda-unavailable",
        E,
        "device",
        lambda t: _cli("evaluate", str(_trained_run(t)), "--device", "cuda"),
        ["cuda"],
        requires=("no-cuda",),
    )

    E = "cli train"
    add(
        "cli/train-cuda-unavailable",
        E,
        "device",
        lambda t: _cli(*TRAIN, "--device", "cuda", "--out", str(t / "o")),
        ["cuda"],
        requires=("no-cuda",),
    )
    add(
        "cli/train-lr-1e6",
        E,
        "nan",
        lambda t: _cli(*TRAIN, "--lr", "1e6", "--max-epochs", "5", "--out", str(t / "o")),
        ["epoch"],
        note="issue 14: ValueError traceback, not FloatingPointError",
    )
    add(
        "cli/train-out-under-a-file",
        E,
        "disk",
        lambda t: (
            (t / "f").write_text("x")
            and _cli(*TRAIN, "--max-epochs", "1", "--out", str(t / "f" / "run"))
        ),
        ["f", "out"],
    )
    add(
        "cli/train-disk-full",
        E,
        "disk",
        _train_on_faulty_disk("full"),
        ["out", "disk", "space"],
        post=_no_temporaries,
        note="issue 14",
    )
    add(
        "cli/train-read-only-folder",
        E,
        "disk",
        _train_on_faulty_disk("readonly"),
        ["out", "read-only"],
        post=_no_temporaries,
        note="issue 14",
    )
    add(
        "cli/train-over-finished-run",
        E,
        "concurrency",
        lambda t: _cli(*TRAIN, "--max-epochs", "1", "--out", str(_trained_run(t))),
        ["overwrite", "run"],
        note="issue 14: overwritten without --overwrite",
    )
    add(
        "cli/train-resume-truncated-checkpoint",
        E,
        "file",
        lambda t: (
            _truncate(_trained_run(t) / "checkpoint.pt"),
            _cli(*TRAIN, "--max-epochs", "3", "--out", str(t / "run"), "--resume"),
        )[1],
        ["checkpoint.pt"],
        note="issue 14",
    )
    add(
        "cli/train-resume-flipped-checkpoint",
        E,
        "file",
        lambda t: (
            _flip(_trained_run(t) / "checkpoint.pt"),
            _cli(*TRAIN, "--max-epochs", "3", "--out", str(t / "run"), "--resume"),
        )[1],
        ["checkpoint.pt"],
    )
    add(
        "cli/train-ctrl-c",
        E,
        "kill",
        _interrupt_training,
        ["--resume", "resume"],
        expect="either",
        check=_resume_hint,
        timeout=240,
        note="issue 14: Ctrl-C prints a traceback, no --resume hint",
    )
    add(
        "cli/train-kill-9-resume",
        E,
        "kill",
        _kill_and_resume,
        ["resume"],
        expect="result",
        check=_identical_to_straight,
        timeout=300,
        note="issue 14: keep bitwise resume",
    )
    add(
        "cli/train-2-concurrent",
        E,
        "concurrency",
        _concurrent_trains(2),
        ["in use", "out"],
        expect="either",
        check=_one_winner,
        timeout=300,
        note="issue 14: both exit 0",
    )
    add(
        "cli/train-3-concurrent",
        E,
        "concurrency",
        _concurrent_trains(3),
        ["in use", "out"],
        expect="either",
        check=_one_winner,
        timeout=300,
        note="issue 14: FileNotFoundError on the shared .tmp",
    )
    add(
        "cli/train-letter-flipped-data",
        E,
        "file",
        lambda t: _cli(
            "train",
            "letter",
            "--data-dir",
            str(letter_dir(t, lambda p: _flip(p, 10))),
            "--max-epochs",
            "1",
            "--quiet",
            "--out",
            str(t / "o"),
            timeout=120,
        ),
        ["letter-recognition.data"],
        requires=("data",),
    )
    add("cli/train-sizes-zero", E, "value", lambda t: _cli(*TRAIN, "--sizes", "0"), ["--sizes"])

    # ------------------------------------------------------------ pure moment functions, kernels
    from pyro_gpn.kernels import gpn_kernel, squared_exponential
    from pyro_gpn.moments import (
        expected_cross_kernel_product,
        expected_kernel,
        response_moments,
        virtual_observation_weights,
    )

    f64 = torch.float64
    grid = torch.linspace(-2, 2, 5, dtype=f64).expand(3, 5).clone()
    scales, variances = torch.full((3,), 0.5, dtype=f64), torch.full((3, 5), 0.1, dtype=f64)
    targets = torch.randn(3, 5, dtype=f64, generator=torch.Generator().manual_seed(4))
    acts = Moments(_data(4, 3).double(), var=_data(4, 3, seed=5).double().abs())

    def _vow(**bad):
        args = {"inducing_points": grid, "targets": targets, "target_variances": variances}
        return virtual_observation_weights(**{**args, "lengthscales": scales, **bad})

    def _respond(moments=acts, **bad):
        kappa, beta = _vow()
        args = {"inducing_points": grid, "lengthscales": scales, "beta": beta}
        return response_moments(moments, **{**args, "variance_reduction": kappa, **bad})

    E = "response_moments"
    add(
        "response_moments/beta-wide",
        E,
        "shape",
        lambda t: _respond(beta=torch.randn(3, 7, dtype=f64)),
        ["beta"],
        note="fused CPU backend read past beta's end: garbage (3.3e87) different on every call",
    )
    add(
        "response_moments/activations-4-units",
        E,
        "shape",
        lambda t: _respond(Moments(_data(4, 4).double(), var=_data(4, 4).double().abs())),
        ["activations"],
        note="fused CPU backend: NaN or 0 for the unit without parameters",
    )
    add(
        "response_moments/activations-2-units",
        E,
        "shape",
        lambda t: _respond(Moments(_data(4, 2).double(), var=_data(4, 2).double().abs())),
        ["activations"],
    )
    add(
        "response_moments/kappa-shape",
        E,
        "shape",
        lambda t: _respond(variance_reduction=torch.eye(4, dtype=f64).expand(3, 4, 4)),
        ["variance_reduction"],
    )
    add(
        "response_moments/lengthscales-shape",
        E,
        "shape",
        lambda t: _respond(lengthscales=torch.ones(5, dtype=f64)),
        ["lengthscales"],
    )
    add(
        "response_moments/noise-negative",
        E,
        "value",
        lambda t: _respond(noise_var=-torch.ones(3, dtype=f64)),
        ["noise_var"],
    )
    add(
        "response_moments/mixed-dtype",
        E,
        "dtype",
        lambda t: _respond(Moments(_data(4, 3), var=_data(4, 3, seed=5).abs())),
        ["inducing_points", "activations.mean"],
    )
    E = "virtual_observation_weights"
    add(
        "virtual_observation_weights/inducing-points-1d",
        E,
        "shape",
        lambda t: _vow(inducing_points=grid[0]),
        ["inducing_points"],
    )
    add(
        "virtual_observation_weights/targets-shape",
        E,
        "shape",
        lambda t: _vow(targets=targets[:, :4]),
        ["targets"],
    )
    add(
        "virtual_observation_weights/variances-negative",
        E,
        "value",
        lambda t: _vow(target_variances=-variances),
        ["target_variances"],
    )
    add(
        "virtual_observation_weights/jitter-negative",
        E,
        "value",
        lambda t: _vow(jitter=-1.0),
        ["jitter"],
    )
    add(
        "virtual_observation_weights/mixed-dtype",
        E,
        "dtype",
        lambda t: _vow(targets=targets.float()),
        ["targets"],
    )
    E = "expected_kernel"
    add(
        "expected_kernel/var-negative",
        E,
        "value",
        lambda t: expected_kernel(acts.mean, -acts.var, grid, scales),
        ["var"],
    )
    add(
        "expected_kernel/mixed-dtype",
        E,
        "dtype",
        lambda t: expected_kernel(acts.mean.float(), acts.var, grid, scales),
        ["var", "inducing_points", "mean"],
    )
    add(
        "expected_cross_kernel_product/cov-not-psd",
        "expected_cross_kernel_product",
        "value",
        lambda t: expected_cross_kernel_product(
            acts.mean, -torch.diag_embed(acts.var), grid, scales
        ),
        ["cov"],
    )
    E = "kernels"
    add(
        "squared_exponential/lengthscale-zero",
        E,
        "value",
        lambda t: squared_exponential(torch.zeros(2, 1), torch.ones(2, 1), 0.0),
        ["lengthscale"],
    )
    add(
        "squared_exponential/nan",
        E,
        "nan",
        lambda t: squared_exponential(torch.tensor([[math.nan]]), torch.zeros(1, 1), 1.0),
        ["a"],
    )
    add(
        "gpn_kernel/weight-shape",
        E,
        "shape",
        lambda t: gpn_kernel(torch.randn(3, 2), None, torch.randn(3, 4)),
        ["weight"],
    )
    add(
        "gpn_kernel/lengthscale-negative",
        E,
        "value",
        lambda t: gpn_kernel(torch.randn(3, 2), None, torch.randn(2, 4), -torch.ones(4)),
        ["lengthscale"],
    )
    add(
        "gpn_kernel/nan-x",
        E,
        "nan",
        lambda t: gpn_kernel(torch.full((3, 2), math.nan), None, torch.randn(2, 4)),
        ["x"],
    )

    # ------------------------------------------------------------ blocks, GPNSequential, models
    # (the dtype rule, empty batches, unscaled inputs and constructor arguments beyond GPNNet)
    from pyro_gpn import GPNSequential
    from pyro_gpn._validation import UnscaledInputWarning
    from pyro_gpn.layers import GPNConv2d, GPNRecurrent, MomentFlatten, MomentLinear
    from pyro_gpn.models import FixedActivationNet, SampledTargetsGPN, VariationalGPN

    def conv():
        torch.manual_seed(0)
        return GPNConv2d(1, 2, 3, input_size=5)

    def rnn():
        torch.manual_seed(0)
        return GPNRecurrent(2, 3)

    def seq():
        torch.manual_seed(0)
        blocks = [GPNConv2d(1, 2, 3, input_size=5), MomentFlatten()]
        return GPNSequential(blocks, input_shape=(1, 5, 5), num_outputs=3)

    def fan():
        torch.manual_seed(0)
        return FixedActivationNet([3, 4, 2])

    def warned(result, caught):
        if any(issubclass(w.category, UnscaledInputWarning) for w in caught):
            return None
        return "no UnscaledInputWarning for inputs of order 1e3"

    images, sequences = _data(6, 25), _data(6, 10)
    E = "GPNConv2d"
    add(
        "conv/dtype-float64",
        E,
        "dtype",
        lambda t: conv()(images.double()),
        ["inputs"],
        expect="either",
        check=_same_as_float32(lambda: conv()(images)),
    )
    add(
        "conv/numpy-input",
        E,
        "dtype",
        lambda t: conv()(images.numpy()),
        ["inputs"],
        expect="either",
        check=_same_as_float32(lambda: conv()(images)),
    )
    add(
        "conv/empty-batch",
        E,
        "empty",
        lambda t: conv()(images[:0]),
        ["inputs"],
        expect="result",
        check=_shape_is((0, 18)),
    )
    add(
        "conv/unscaled-1e3",
        E,
        "scale",
        lambda t: conv()(images * 1e3),
        expect="result",
        check=warned,
    )
    add("conv/kernel-size-float", E, "value", lambda t: GPNConv2d(1, 2, 2.5, 5), ["kernel_size"])
    E = "GPNRecurrent"
    add(
        "rnn/dtype-float64",
        E,
        "dtype",
        lambda t: rnn()(sequences.double()),
        ["inputs"],
        expect="either",
        check=_same_as_float32(lambda: rnn()(sequences)),
    )
    add(
        "rnn/numpy-input",
        E,
        "dtype",
        lambda t: rnn()(sequences.numpy()),
        ["inputs"],
        expect="either",
        check=_same_as_float32(lambda: rnn()(sequences)),
    )
    add(
        "rnn/unscaled-1e3",
        E,
        "scale",
        lambda t: rnn()(sequences * 1e3),
        expect="result",
        check=warned,
    )
    add(
        "moment-linear/dtype-float64",
        "MomentLinear",
        "dtype",
        lambda t: (torch.manual_seed(0), MomentLinear(3, 2))[1](x64),
        ["inputs"],
        expect="either",
        check=_same_as_float32(lambda: (torch.manual_seed(0), MomentLinear(3, 2))[1](x)),
    )
    E = "GPNSequential"
    add(
        "seq/predict-float64",
        E,
        "dtype",
        lambda t: seq().predict(images.double()).probs,
        ["x"],
        expect="either",
        check=_same_as_float32(lambda: seq().predict(images).probs),
    )
    add(
        "seq/loss-float16",
        E,
        "dtype",
        lambda t: seq().loss(images.half(), _labels(6, 3)),
        ["x"],
        expect="either",
        check=_same_as_float32(lambda: seq().loss(images.half().float(), _labels(6, 3))),
    )
    add(
        "seq/predict-empty-batch",
        E,
        "empty",
        lambda t: seq().predict(images[:0]).probs,
        ["x"],
        expect="result",
        check=_shape_is((0, 3)),
    )
    add(
        "seq/loss-empty-batch",
        E,
        "empty",
        lambda t: seq().loss(images[:0], _labels(0, 3)),
        ["x", "batch", "empty"],
    )
    E = "FixedActivationNet"
    add(
        "fan/predict-float64",
        E,
        "dtype",
        lambda t: fan().predict(x64).probs,
        ["x"],
        expect="either",
        check=_same_as_float32(lambda: fan().predict(x).probs),
    )
    add(
        "fan/loss-empty-batch",
        E,
        "empty",
        lambda t: fan().loss(x[:0], _labels(0)),
        ["x", "batch", "empty"],
    )
    add("fan/sizes-bool", E, "value", lambda t: FixedActivationNet([3, True, 2]), ["sizes"])
    E = "constructors"
    add(
        "layer/compute-dtype-float16",
        E,
        "value",
        lambda t: GPNLayer(3, 2, compute_dtype=torch.float16),
        ["compute_dtype"],
    )
    add(
        "layer/compute-dtype-bfloat16",
        E,
        "value",
        lambda t: GPNLayer(3, 2, compute_dtype=torch.bfloat16),
        ["compute_dtype"],
    )
    add("layer/in-features-bool", E, "value", lambda t: GPNLayer(True, 3), ["in_features"])
    add("net/sizes-bool", E, "value", lambda t: GPNNet([2, True, 1]), ["sizes"])
    add(
        "stgpn/dtype-int",
        E,
        "value",
        lambda t: SampledTargetsGPN([2, 1], dtype=torch.int64),
        ["dtype"],
    )
    add(
        "vgpn/whiten-str", E, "value", lambda t: VariationalGPN([2, 3, 1], whiten="yes"), ["whiten"]
    )

    # ------------------------------------------------------------ label ranges, empty and
    # out-of-range arguments at the training and scoring entry points (the API prober's list)
    from pyro_gpn import metrics
    from pyro_gpn.data import synthetic_1d
    from pyro_gpn.inference import closed_form_elbo, fit_vgpn

    xl, ll = _data(12, 3), _labels(12, 2)
    probs = torch.softmax(_data(6, 2), -1)

    def vgpn_fit(xs, ys, model=None, **kw):
        return fit_vgpn(model or _vgpn("softmax"), xs, ys, num_steps=2, **kw)

    E = "fit_vgpn"
    add("fit-vgpn/labels-above", E, "labels", lambda t: vgpn_fit(xl, ll + 100), ["y"])
    add("fit-vgpn/labels-negative", E, "labels", lambda t: vgpn_fit(xl, ll - 5), ["y"])
    add(
        "fit-vgpn/labels-no-validation",
        E,
        "labels",
        lambda t: vgpn_fit(xl, ll + 100, val_fraction=0.0).losses,
        ["y"],
    )
    add(
        "fit-vgpn/y-val-labels",
        E,
        "labels",
        lambda t: vgpn_fit(xl, ll, x_val=xl[:4], y_val=ll[:4] + 10),
        ["y_val"],
    )
    add(
        "fit-vgpn/y-more-rows",
        E,
        "shape",
        lambda t: vgpn_fit(xl, _targets(15), model=_vgpn()),
        ["y"],
    )
    add(
        "fit-vgpn/y-fewer-rows",
        E,
        "shape",
        lambda t: vgpn_fit(xl, _targets(9), model=_vgpn()),
        ["y"],
    )
    add(
        "fit-vgpn/x-val-empty",
        E,
        "empty",
        lambda t: vgpn_fit(xl, _targets(12), model=_vgpn(), x_val=xl[:0], y_val=_targets(0)),
        ["x_val"],
    )
    add(
        "vgpn/elbo-num-data-0",
        "closed_form_elbo",
        "value",
        lambda t: closed_form_elbo(_vgpn(), xl, _targets(12), num_data=0),
        ["num_data"],
    )

    E = "fit_svi"
    add(
        "svi/labels-above-parametric",
        E,
        "labels",
        lambda t: svi(xl, ll + 7, model=_pgpn("softmax")),
        ["y"],
    )
    add(
        "svi/labels-above-closed-form",
        E,
        "labels",
        lambda t: (lambda m: svi(xl, ll + 7, model=m, loss=ClosedFormELBO(m)))(_vgpn("softmax")),
        ["y"],
    )
    add("svi/num-steps-0", E, "value", lambda t: svi(x, _targets(), num_steps=0), ["num_steps"])
    add("svi/seed-negative", E, "value", lambda t: svi(x, _targets(), seed=-1), ["seed"])

    E = "evaluate"
    add("evaluate/labels-above", E, "labels", lambda t: evaluate(_net(), xl, ll + 5), ["y"])
    add(
        "evaluate/batch-size-0",
        E,
        "value",
        lambda t: evaluate(_net(), xl, ll, batch_size=0),
        ["batch_size"],
    )
    add(
        "trainconfig/seed-negative",
        "TrainConfig",
        "value",
        lambda t: TrainConfig(seed=-1),
        ["seed"],
    )

    E = "metrics"
    add(
        "metrics/classification-error-labels-above",
        E,
        "labels",
        lambda t: metrics.classification_error(probs, _labels(6, 2) + 5),
        ["labels"],
    )
    add(
        "metrics/categorical-nll-labels-above",
        E,
        "labels",
        lambda t: metrics.categorical_nll(probs, _labels(6, 2) + 5),
        ["labels"],
    )
    add(
        "metrics/ece-labels-negative",
        E,
        "labels",
        lambda t: metrics.expected_calibration_error(probs, _labels(6, 2) - 5),
        ["labels"],
    )
    add(
        "metrics/rmse-empty",
        E,
        "empty",
        lambda t: metrics.rmse(_targets(0), _targets(0)),
        ["mean"],
    )
    add(
        "metrics/classification-error-empty",
        E,
        "empty",
        lambda t: metrics.classification_error(probs[:0], _labels(0)),
        ["labels"],
    )
    add(
        "metrics/ece-empty",
        E,
        "empty",
        lambda t: metrics.expected_calibration_error(probs[:0], _labels(0)),
        ["labels"],
    )
    add(
        "metrics/rmse-nan",
        E,
        "nan",
        lambda t: metrics.rmse(_targets() * math.nan, _targets()),
        ["mean"],
    )
    add(
        "metrics/rmse-int",
        E,
        "dtype",
        lambda t: metrics.rmse(_targets().long(), _targets().long()),
        ["mean"],
    )

    E = "run_nuts"
    add("nuts/x-test-empty", E, "empty", lambda t: nuts(xn, yn[:, 0], xn[:0]), ["x_test"])
    add("nuts/seed-negative", E, "value", lambda t: nuts(xn, yn[:, 0], seed=-1), ["seed"])
    add(
        "nuts/progress-every-negative",
        E,
        "value",
        lambda t: nuts(xn, yn[:, 0], progress_every=-1),
        ["progress_every"],
    )

    E = "data"
    add(
        "data/val-fraction-leaves-no-training-row",
        "load_dataset",
        "value",
        lambda t: load_dataset("yacht", val_fraction=0.999),
        ["val_fraction"],
    )
    add(
        "data/synthetic-noise-negative",
        "synthetic_1d",
        "value",
        lambda t: synthetic_1d(noise_std=-1.0),
        ["noise_std"],
    )
    add(
        "data/synthetic-seed-negative",
        "synthetic_1d",
        "value",
        lambda t: synthetic_1d(seed=-1),
        ["seed"],
    )
    return cases


_CACHE: list[Case] | None = None


def cases() -> list[Case]:
    """Every case (built once; building imports the library)."""
    global _CACHE
    if _CACHE is None:
        _CACHE = _cases()
        ids = [case.id for case in _CACHE]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise RuntimeError(f"duplicate case ids: {duplicates}")
    return _CACHE


# ---------------------------------------------------------------------------------- fixes
# The boundary check each non-clear case needs (file:function -> check), for the report.
_CAST = (
    "dtype policy: cast floating inputs to the parameters' dtype at the boundary "
    "(`{where}`), documented; integer/bool stay a ValueError"
)
_MOMENTS_DTYPE = (
    "moments/gaussian.py:Moments.__init__ -> ValueError naming the argument and both dtypes "
    "(and devices) when var/cov differ from mean"
)
_DEVICE = (
    "_validation.py:check_device (new), called from layers/base.py:GPNLayerBase.__init__ -> "
    "ValueError 'device=cuda requested but CUDA is not available'"
)
_SAME_DEVICE = (
    "_validation.py:check_tensor(name, value, like=param) -> ValueError naming the argument "
    "and both devices (before any value check: a meta/cuda tensor cannot be .item()-ed)"
)
_NAN_PARAMS = (
    "layers/base.py:GPNLayerBase.propagate -> if the output is non-finite, name the non-finite "
    "parameter (`layers.0.weight contains NaN: training diverged?`); Trainer.fit checks "
    "parameters once at the start"
)
_EMPTY = "ValueError '{arg} has 0 samples' at {where} (a mean over no samples is NaN)"
_UNSCALED = (
    "network.py:input_moments / Trainer._check_data / fit_svi -> warn once when |x| is far "
    "outside the inducing range (e.g. max|x| > 1e3): 'standardise the inputs'"
)
_DIVERGED = (
    "inference/trainer.py:Trainer._train_epoch -> after optimizer.step check parameters finite, "
    "and turn the loss's own NaN ValueError into FloatingPointError naming epoch, step, lr and "
    "the parameter; the checkpoint of the last epoch stays intact"
)
_IO_LOAD = (
    "io.load_torch/io.load_json (checksum verified) in {where}; CorruptFileError names the file"
)
_CLI_MAIN = (
    "cli.py:main -> catch CorruptFileError/OSError/RunInUseError/RunExistsError/ChecksumError/"
    "FloatingPointError: 'pyro-gpn: error: ...' exit 1; KeyboardInterrupt -> resume hint, 130"
)

FIXES: dict[str, str] = {
    **{
        cid: _CAST.format(where=where)
        for cid, where in {
            "layer/dtype-float64": "layers/base.py:GPNLayerBase.propagate",
            "layer/dtype-float16": "layers/base.py:GPNLayerBase.propagate",
            "layer/moments-input-float64": "layers/base.py:GPNLayerBase.propagate",
            "net/dtype-float64": "network.py:input_moments(x, dtype=weight.dtype)",
            "net/dtype-float16": "network.py:input_moments(x, dtype=weight.dtype)",
            "net/float64-network-float32-x": "network.py:input_moments(x, dtype=weight.dtype)",
            "net/x-var-float64": "network.py:input_moments(x, x_var, dtype=weight.dtype)",
            "loss/x-float64": "network.py:GPNNet.loss via input_moments; y likewise",
            "loss/mode-cov-float64-x": "network.py:GPNNet.loss via input_moments",
            "predict/float64": "network.py:GPNNet.predict via input_moments",
            "vgpn/model-float64-trace": "models/variational.py:VariationalGPN._check_inputs",
            "vgpn/model-float64-closed": "models/variational.py:VariationalGPN._check_inputs",
            "vgpn/predict-float64": "models/variational.py:VariationalGPN._check_inputs",
            "pgpn/model-float64": "models/parametric.py:ParametricGPN._check_inputs",
            "svi/float64-vgpn": "the model's _check_inputs (fit_svi passes data through)",
            "trainer/float64-data": "inference/trainer.py:_check_data, once per fit",
        }.items()
    },
    "moments/mixed-dtype": _MOMENTS_DTYPE,
    "moments/mixed-dtype-cov": _MOMENTS_DTYPE,
    "moments/mixed-device": _MOMENTS_DTYPE,
    "moments/linear-float64-weight": "moments/gaussian.py:Moments.linear/linear_full -> "
    "ValueError naming weight and both dtypes",
    "moments/linear-wrong-weight": "moments/gaussian.py:Moments.linear/linear_full -> "
    "check_shape('weight', (num_features, None))",
    "layer/device-cuda-unavailable": _DEVICE,
    "net/device-cuda-unavailable": _DEVICE + " (GPNNet passes device to its layers)",
    "vgpn/device-cuda-unavailable": _DEVICE + " (VariationalGPNLayer inherits it)",
    "layer/device-mismatch": _SAME_DEVICE,
    "net/device-mismatch": _SAME_DEVICE + " in network.py:input_moments",
    "pgpn/device-mismatch": _SAME_DEVICE + " in ParametricGPN._check_inputs",
    "trainer/x-on-meta": _SAME_DEVICE + " in trainer.py:_check_data",
    "layer/dtype-int-params": "layers/base.py:GPNLayerBase.__init__ -> dtype must be a "
    "floating torch.dtype (ValueError naming dtype)",
    "layer/noise-inf": "layers/base.py:GPNLayerBase.__init__ -> math.isfinite for "
    "lengthscale_init / noise_std_init (and GPNLayer target_variance_init, jitter)",
    "layer/num-inducing-1": "layers/base.py:GPNLayerBase.__init__ -> num_inducing >= 2 "
    "(the equidistant-grid path needs a spacing)",
    "layer/numpy-input": "layers/base.py:GPNLayerBase.propagate -> TypeError 'inputs must be "
    "a torch.Tensor or Moments, got ndarray'",
    "layer/unscaled-1e6": _UNSCALED,
    "net/unscaled-1e6": _UNSCALED,
    "layer/nan-parameter": _NAN_PARAMS,
    "net/nan-parameter": _NAN_PARAMS,
    "loss/nan-parameter": _NAN_PARAMS,
    "predict/nan-parameter": _NAN_PARAMS,
    "vgpn/nan-parameter-predictive": _NAN_PARAMS,
    "pgpn/predict-nan-parameter": _NAN_PARAMS,
    "trainer/nan-parameter": _NAN_PARAMS,
    "loss/empty-batch-softmax": _EMPTY.format(arg="x", where="network.py:GPNNet.loss"),
    "loss/empty-batch-gaussian": _EMPTY.format(arg="x", where="network.py:GPNNet.loss"),
    "vgpn/empty-batch-trace": _EMPTY.format(arg="x", where="VariationalGPN._check_inputs"),
    "vgpn/empty-batch-closed-num-data": _EMPTY.format(
        arg="x", where="inference/closed_form.py:closed_form_elbo"
    ),
    "pgpn/empty-batch": _EMPTY.format(arg="x", where="ParametricGPN._check_inputs"),
    "svi/zero-rows": _EMPTY.format(arg="x", where="inference/svi.py:fit_svi"),
    "svi/zero-rows-vgpn": _EMPTY.format(arg="x", where="inference/svi.py:fit_svi"),
    "vgpn/labels-out-of-range-trace": "models/variational.py:VariationalGPN._check_inputs -> "
    "labels in [0, C) naming y (as losses._check_labels does for the closed form)",
    "pgpn/labels-out-of-range": "models/parametric.py:ParametricGPN._check_inputs -> labels "
    "in [0, C) naming y",
    "svi/lr-huge": "inference/svi.py:_checked_step -> check parameters after the optimiser "
    "step; FloatingPointError naming the step and the parameters (today Pyro's "
    "distribution validation fails one step later)",
    "trainer/lr-huge": _DIVERGED,
    "trainer/classification-task-regression-net": "inference/trainer.py:Trainer.fit -> "
    "task='classification' needs integer y and a model with num_classes (ValueError naming "
    "task and y)",
    "trainer/resume-truncated-checkpoint": _IO_LOAD.format(where="Trainer._load_checkpoint"),
    "trainer/resume-flipped-checkpoint": _IO_LOAD.format(where="Trainer._load_checkpoint"),
    "trainer/resume-empty-checkpoint": _IO_LOAD.format(where="Trainer._load_checkpoint"),
    "trainer/out-dir-is-file": "io.ensure_can_write(out_dir) in Trainer.fit -> "
    "NotADirectoryError naming out_dir",
    "trainer/disk-full": "io.atomic_write in Trainer._save/_write_metrics/_finish (explained "
    "OSError, temporary removed)",
    "trainer/read-only-out-dir": "io.ensure_can_write(out_dir) at the start of Trainer.fit "
    "(before the first epoch), io.atomic_write for every file",
    "trainconfig/device": "inference/trainer.py:TrainConfig.__post_init__ -> wrap "
    "torch.device(...) RuntimeError in ValueError naming device",
    "evaluate/regression-task-on-labels": "inference/trainer.py:evaluate -> regression needs "
    "floating y shaped like the prediction (ValueError naming y and task)",
    "data/from-arrays-nan": "data/dataset.py:*.from_arrays -> check_finite on x and y naming them",
    **{
        cid: _IO_LOAD.format(where="cli.py:_run_evaluate") + "; " + _CLI_MAIN
        for cid in (
            "cli/evaluate-flipped-model-tensors",
            "cli/evaluate-flipped-model-tail",
            "cli/evaluate-truncated-model",
            "cli/evaluate-empty-model",
            "cli/evaluate-truncated-result",
        )
    },
    "cli/evaluate-result-without-settings": "cli.py:_run_evaluate -> CorruptFileError("
    "result.json, 'no settings entry: not a pyro-gpn train result')",
    "cli/evaluate-sizes-edited": "cli.py:_run_evaluate -> load_state_dict RuntimeError -> "
    "CorruptFileError naming model.pt and result.json ('do not describe the same network')",
    "cli/train-lr-1e6": _DIVERGED + "; " + _CLI_MAIN,
    "cli/train-out-under-a-file": "io.ensure_can_write(out) in cli.py:_run_train; " + _CLI_MAIN,
    "cli/train-disk-full": "io.atomic_write everywhere; " + _CLI_MAIN,
    "cli/train-read-only-folder": "io.ensure_can_write(out) before loading data; " + _CLI_MAIN,
    "cli/train-over-finished-run": "cli.py:_run_train -> io.ensure_can_write(out, "
    "overwrite=args.overwrite or args.resume), new --overwrite flag",
    "cli/train-resume-truncated-checkpoint": _IO_LOAD.format(where="Trainer._load_checkpoint")
    + "; "
    + _CLI_MAIN,
    "cli/train-resume-flipped-checkpoint": _IO_LOAD.format(where="Trainer._load_checkpoint")
    + "; "
    + _CLI_MAIN,
    "cli/train-ctrl-c": "cli.py:main -> except KeyboardInterrupt: 'interrupted; continue "
    "with the same command and --resume' (the last epoch's checkpoint is intact), exit 130",
    "cli/train-2-concurrent": "cli.py:_run_train -> with io.RunLock(out) around training and "
    "writing; RunInUseError names the PID; " + _CLI_MAIN,
    "cli/train-3-concurrent": "io.RunLock(out) (and unique temporaries from io.atomic_write); "
    + _CLI_MAIN,
    "cli/train-letter-flipped-data": "cli.py:_load_data -> also catch "
    "data.download.ChecksumError (a RuntimeError today; better an OSError subclass)",
}


def fix_for(case_id: str) -> str:
    """The recorded fix of a case ("" when none is recorded)."""
    return FIXES.get(case_id, "")
