"""Safe files (:mod:`pyro_gpn.io`): damaged files are caught, faults leave no partial files.

Every fault is produced for real where that is possible (flipped and truncated bytes, killed and
interrupted processes, processes racing for a folder) and simulated where it is not (a full
disk, a read-only file system as root): the simulations raise the ``OSError`` the kernel would.
"""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from pyro_gpn import io as pio
from pyro_gpn.io import (
    CorruptFileError,
    MissingFileError,
    RunExistsError,
    RunInUseError,
    RunLock,
    atomic_write,
    checksum_path,
    clean_stale_temporaries,
    ensure_can_write,
    load_json,
    load_torch,
    save_json,
    save_torch,
    verify,
)

IO_SOURCE = Path(pio.__file__)
TIMEOUT = 60.0  # seconds any child process may take before the test fails
_CTX = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _temporaries(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(".tmp"))


def _state() -> dict:
    torch.manual_seed(0)
    return {"weight": torch.randn(50, 20), "bias": torch.randn(20), "step": 7}


def _save(kind: str, path: Path, version: int = 0) -> object:
    if kind == "torch":
        obj = {**_state(), "version": version}
        save_torch(obj, path)
    else:
        obj = {"metrics": {"rmse": 0.5 + version, "values": list(range(200))}, "v": version}
        save_json(obj, path)
    return obj


def _load(kind: str, path: Path, **kwargs) -> object:
    return load_torch(path, **kwargs) if kind == "torch" else load_json(path, **kwargs)


def _same(kind: str, a: object, b: object) -> bool:
    if kind == "json":
        return a == b
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def _standalone_io_child(body: str) -> str:
    """Python source that loads the io package without importing torch (fast child processes)."""
    prologue = f"""
        import importlib.util, os, sys, time
        spec = importlib.util.spec_from_file_location(
            "pio", {str(IO_SOURCE)!r}, submodule_search_locations=[{str(IO_SOURCE.parent)!r}]
        )
        pio = importlib.util.module_from_spec(spec)
        sys.modules["pio"] = pio
        spec.loader.exec_module(pio)
    """
    return textwrap.dedent(prologue) + textwrap.dedent(body)


# ---------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("kind", ["torch", "json"])
def test_round_trip_records_a_sha256sum_compatible_checksum(tmp_path, kind):
    path = tmp_path / ("model.pt" if kind == "torch" else "result.json")
    obj = _save(kind, path)
    assert _same(kind, _load(kind, path), obj)
    # the checksum beside the file agrees with an independent SHA-256 of its bytes
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert checksum_path(path).read_text() == f"{digest}  {path.name}\n"
    if shutil.which("sha256sum"):
        check = subprocess.run(
            ["sha256sum", "-c", checksum_path(path).name], cwd=tmp_path, capture_output=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
    assert _temporaries(tmp_path) == []


def test_overwriting_keeps_one_digest_and_the_new_content(tmp_path):
    path = tmp_path / "result.json"
    _save("json", path, version=0)
    new = _save("json", path, version=1)
    assert load_json(path) == new
    assert len(checksum_path(path).read_text().splitlines()) == 1


# ---------------------------------------------------------------------------------- damage
@pytest.mark.parametrize("kind", ["torch", "json"])
@pytest.mark.parametrize("where", [0, 0.5, -1])
def test_a_flipped_byte_anywhere_is_caught(tmp_path, kind, where):
    path = tmp_path / "file"
    _save(kind, path)
    data = bytearray(path.read_bytes())
    index = int(where * len(data)) if isinstance(where, float) else where
    data[index] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="checksum mismatch") as info:
        _load(kind, path)
    assert str(path) in str(info.value) and info.value.path == path
    assert isinstance(info.value, OSError)


def test_a_hundred_flipped_bytes_of_a_state_dict_are_caught_not_loaded(tmp_path):
    """The issue's case: 100 flipped bytes loaded silently and gave a wrong test error."""
    path = tmp_path / "model.pt"
    _save("torch", path)
    data = bytearray(path.read_bytes())
    generator = torch.Generator().manual_seed(1)
    for index in torch.randint(len(data) // 2, len(data), (100,), generator=generator).tolist():
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))
    # the checksum's own error, not the parse error torch would raise on these bytes
    with pytest.raises(
        CorruptFileError, match=r"model\.pt: checksum mismatch .* model\.pt\.sha256"
    ):
        load_torch(path)
    # flipped bytes inside a tensor's data: torch loads them silently, the checksum catches them
    saved = _save("torch", path)
    data = bytearray(path.read_bytes())
    start = bytes(data).find(saved["weight"].numpy().tobytes())
    assert start > 0
    for index in torch.randint(start, start + 4000, (100,), generator=generator).tolist():
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=r"model\.pt: checksum mismatch"):
        load_torch(path)
    silent = torch.load(path, weights_only=True)
    assert torch.equal(silent["bias"], saved["bias"])
    assert not torch.equal(silent["weight"], saved["weight"])


@pytest.mark.parametrize("kind", ["torch", "json"])
@pytest.mark.parametrize("keep", [0, 0.5, 0.95])
def test_truncation_is_caught_with_and_without_a_checksum(tmp_path, kind, keep):
    path = tmp_path / "file"
    _save(kind, path)
    data = path.read_bytes()
    path.write_bytes(data[: int(keep * len(data))])
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        _load(kind, path)
    # a legacy file without a checksum: the parser's failure becomes the same error type
    checksum_path(path).unlink()
    with pytest.raises(CorruptFileError, match="not (a readable torch file|valid JSON)") as info:
        _load(kind, path, require_checksum=False)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("kind", ["torch", "json"])
def test_a_missing_checksum_is_refused_unless_allowed(tmp_path, kind):
    path = tmp_path / "file"
    obj = _save(kind, path)
    checksum_path(path).unlink()
    with pytest.raises(MissingFileError, match="no checksum file file.sha256") as info:
        _load(kind, path)
    assert isinstance(info.value, CorruptFileError) and isinstance(info.value, FileNotFoundError)
    assert _same(kind, _load(kind, path, require_checksum=False), obj)


@pytest.mark.parametrize("content", ["", "not a digest\n", "z" * 64 + "  file\n"])
def test_a_garbled_checksum_file_is_a_corrupt_file(tmp_path, content):
    path = tmp_path / "file"
    _save("json", path)
    checksum_path(path).write_text(content)
    with pytest.raises(CorruptFileError, match="holds no SHA-256 digest"):
        verify(path)


def test_a_missing_file_is_a_missing_file_error_naming_it(tmp_path):
    path = tmp_path / "absent.pt"
    with pytest.raises(MissingFileError, match="absent.pt: file not found"):
        load_torch(path)
    with pytest.raises(FileNotFoundError):
        load_json(path, require_checksum=False)
    with pytest.raises(CorruptFileError, match="is a directory"):
        load_json(tmp_path)


def test_errors_survive_pickling_for_multiprocessing(tmp_path):
    import pickle

    for error in (
        CorruptFileError(tmp_path / "a", "bad"),
        MissingFileError(tmp_path / "a", "gone"),
        RunInUseError(tmp_path, 12),
        RunExistsError(tmp_path),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)


# ---------------------------------------------------------------------- faults while writing
class _Failing:
    """A file handle that writes ``budget`` bytes and then raises ``error``."""

    def __init__(self, handle, budget: int, error: BaseException) -> None:
        self._handle, self._budget, self._error = handle, budget, error

    def write(self, data) -> int:
        if self._budget <= 0:
            raise self._error
        chunk = bytes(data)[: self._budget]
        self._budget -= len(chunk)
        self._handle.write(chunk)
        if len(chunk) < len(data):
            raise self._error
        return len(chunk)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)


def _fail_writes_after(monkeypatch, budget: int, error: BaseException) -> None:
    real = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: _Failing(real(*a, **k), budget, error))


@pytest.mark.parametrize("kind", ["torch", "json"])
def test_disk_full_mid_write_leaves_no_temporary_and_the_old_file_intact(
    tmp_path, monkeypatch, kind
):
    path = tmp_path / "file"
    old = _save(kind, path, version=0)
    _fail_writes_after(monkeypatch, 300, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(OSError) as info:
        _save(kind, path, version=1)
    assert info.value.errno == errno.ENOSPC
    assert str(path) in str(info.value) and "disk is full" in str(info.value)
    monkeypatch.undo()
    assert _temporaries(tmp_path) == []
    assert _same(kind, _load(kind, path), old)


def test_disk_full_at_fsync_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="disk is full"):
        save_torch(_state(), path)
    assert _temporaries(tmp_path) == [] and not path.exists()


@pytest.mark.parametrize("kind", ["torch", "json"])
def test_keyboard_interrupt_mid_write_leaves_no_temporary(tmp_path, monkeypatch, kind):
    path = tmp_path / "file"
    old = _save(kind, path)
    _fail_writes_after(monkeypatch, 100, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _save(kind, path, version=1)
    monkeypatch.undo()
    assert _temporaries(tmp_path) == []
    assert _same(kind, _load(kind, path), old)


def test_an_exception_inside_the_writer_leaves_no_temporary(tmp_path):
    def broken(handle):
        handle.write(b"partial")
        raise ValueError("cannot serialise")

    with pytest.raises(ValueError, match="cannot serialise"):
        atomic_write(tmp_path / "x", broken)
    assert list(tmp_path.iterdir()) == []


def test_sigint_to_a_writing_process_leaves_no_temporary(tmp_path):
    """A real Ctrl-C (SIGINT) delivered while a child process is inside a write."""
    path = tmp_path / "big.bin"
    (tmp_path / "big.bin").write_bytes(b"old")
    child = _standalone_io_child(
        f"""
        import signal
        # a shell's background job inherits SIGINT ignored: restore Python's Ctrl-C handler
        signal.signal(signal.SIGINT, signal.default_int_handler)
        def slow(handle):
            for _ in range(600):
                handle.write(b"x" * 4096)
                time.sleep(0.05)
        try:
            pio.atomic_write({str(path)!r}, slow, checksum=False)
        except KeyboardInterrupt:
            sys.exit(130)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child])
    try:
        deadline = time.monotonic() + TIMEOUT
        while not _temporaries(tmp_path):
            assert proc.poll() is None, "the child ended before it started writing"
            assert time.monotonic() < deadline, "the child never started writing"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=TIMEOUT) == 130
    finally:
        proc.kill()
    assert _temporaries(tmp_path) == []
    assert path.read_bytes() == b"old"


def test_sigkill_mid_write_keeps_the_old_file_and_the_leftover_is_cleaned(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"old")
    child = _standalone_io_child(
        f"""
        def slow(handle):
            while True:
                handle.write(b"x" * 4096)
                time.sleep(0.05)
        pio.atomic_write({str(path)!r}, slow, checksum=False)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child])
    try:
        deadline = time.monotonic() + TIMEOUT
        while not _temporaries(tmp_path):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.kill()
        proc.wait(timeout=TIMEOUT)
    finally:
        proc.kill()
    leftovers = _temporaries(tmp_path)
    assert len(leftovers) == 1 and f".{proc.pid}." in leftovers[0].name
    assert path.read_bytes() == b"old"
    assert clean_stale_temporaries(tmp_path) == leftovers
    assert _temporaries(tmp_path) == []


@pytest.mark.parametrize("failing_replace", [1, 2, 3])
def test_a_crash_between_the_steps_leaves_a_verifiable_pair(tmp_path, monkeypatch, failing_replace):
    """Checksum file and data file are renamed separately; a crash between must not look
    like corruption. Replaces: 1 = checksum with both digests, 2 = data, 3 = new digest only."""
    path = tmp_path / "checkpoint.pt"
    old = _save("torch", path, version=0)
    new = {**_state(), "version": 1}
    calls = {"n": 0}
    real = os.replace

    def crashing(src, dst):
        calls["n"] += 1
        if calls["n"] == failing_replace:
            raise KeyboardInterrupt  # the process dies here
        return real(src, dst)

    monkeypatch.setattr(os, "replace", crashing)
    with pytest.raises(KeyboardInterrupt):
        save_torch(new, path)
    monkeypatch.undo()
    loaded = load_torch(path)  # verifies
    assert _same("torch", loaded, old if failing_replace <= 2 else new)
    # the next write returns to a single digest
    save_torch(new, path)
    assert len(checksum_path(path).read_text().splitlines()) == 1


# ---------------------------------------------------------------------------------- permissions
def test_a_read_only_file_system_gives_a_clear_error(tmp_path, monkeypatch):
    real = os.open

    def read_only(file, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(file))
        return real(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(OSError) as info:
        save_json({"a": 1}, tmp_path / "result.json")
    message = str(info.value)
    assert info.value.errno == errno.EROFS
    assert "result.json" in message and "not writable" in message and str(tmp_path) in message
    with pytest.raises(OSError, match="not writable"):
        ensure_can_write(tmp_path / "run")
    with pytest.raises(OSError, match="not writable"):
        RunLock(tmp_path).acquire()
    monkeypatch.undo()
    assert _temporaries(tmp_path) == [] and not (tmp_path / "result.json").exists()


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0, reason="root ignores folder permissions"
)
def test_a_read_only_folder_gives_a_permission_error_naming_it(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(PermissionError, match="not writable"):
            save_json({"a": 1}, folder / "result.json")
        with pytest.raises(PermissionError, match="ro"):
            ensure_can_write(folder)
    finally:
        folder.chmod(0o755)


# ---------------------------------------------------------------------------------- run dirs
def test_ensure_can_write_refuses_a_finished_run_without_overwrite(tmp_path):
    run = tmp_path / "run"
    assert ensure_can_write(run) == run and run.is_dir()
    save_json({"done": True}, run / "result.json")
    with pytest.raises(RunExistsError, match="overwrite") as info:
        ensure_can_write(run)
    assert isinstance(info.value, FileExistsError) and str(run) in str(info.value)
    assert ensure_can_write(run, overwrite=True) == run
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        ensure_can_write(tmp_path / "file")
    assert [p.name for p in run.iterdir()] == ["result.json", "result.json.sha256"]


def test_a_lock_is_exclusive_and_released(tmp_path):
    with RunLock(tmp_path) as lock:
        assert lock.locked
        holder = json.loads((tmp_path / ".lock").read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(RunInUseError, match=f"in use by process {os.getpid()}") as info:
            RunLock(tmp_path).acquire()
        assert info.value.pid == os.getpid() and str(tmp_path) in str(info.value)
    assert not (tmp_path / ".lock").exists()
    with RunLock(tmp_path):
        assert RunLock.is_held(tmp_path) and RunLock.is_held(str(tmp_path) + "/.")
    assert not RunLock.is_held(tmp_path)


@pytest.mark.skipif(pio.locks.fcntl is None, reason="flock only")
def test_a_loser_waits_for_the_winner_to_write_its_pid(tmp_path):
    """The race the concurrent test once lost: the lock is held, the PID not yet written."""
    import threading

    fd = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        pio.locks.fcntl.flock(fd, pio.locks.fcntl.LOCK_EX | pio.locks.fcntl.LOCK_NB)
        late = threading.Timer(0.3, lambda: os.write(fd, b'{"pid": 4242, "host": null}\n'))
        late.start()
        with pytest.raises(RunInUseError, match="process 4242") as info:
            RunLock(tmp_path).acquire()
        late.join()
        assert info.value.pid == 4242
    finally:
        os.close(fd)


def _hold_lock(run_dir: str, barrier, results, done) -> None:
    barrier.wait(timeout=TIMEOUT)
    try:
        with RunLock(run_dir):
            results.put(("ok", os.getpid()))
            done.wait(timeout=TIMEOUT)  # hold until every other process has tried
    except RunInUseError as error:
        results.put(("busy", error.pid, str(error)))


def test_concurrent_processes_one_wins_the_others_are_told_who(tmp_path):
    n = 4
    barrier, results, done = _CTX.Barrier(n), _CTX.Queue(), _CTX.Event()
    procs = [
        _CTX.Process(target=_hold_lock, args=(str(tmp_path), barrier, results, done))
        for _ in range(n)
    ]
    for proc in procs:
        proc.start()
    try:
        outcomes = [results.get(timeout=TIMEOUT) for _ in range(n)]
    finally:
        done.set()
    for proc in procs:
        proc.join(timeout=TIMEOUT)
        assert proc.exitcode == 0
    winners = [o for o in outcomes if o[0] == "ok"]
    losers = [o for o in outcomes if o[0] == "busy"]
    assert len(winners) == 1 and len(losers) == n - 1
    for _, pid, message in losers:
        assert pid == winners[0][1] and f"process {pid}" in message and str(tmp_path) in message


def test_a_lock_of_a_killed_process_is_taken_over(tmp_path):
    child = _standalone_io_child(
        f"""
        lock = pio.RunLock({str(tmp_path)!r}).acquire()
        print("locked", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunInUseError, match=str(proc.pid)):
            RunLock(tmp_path).acquire()
        proc.kill()
        proc.wait(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.stdout.close()
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == proc.pid  # stale file remains
    with RunLock(tmp_path):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()


def _write_many(path: str, barrier, errors, worker: int) -> None:
    barrier.wait(timeout=TIMEOUT)
    try:
        for i in range(30):
            save_json({"worker": worker, "i": i, "pad": "x" * 5000}, path)
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        errors.put(repr(error))


def test_concurrent_writers_of_one_file_never_share_a_temporary(tmp_path):
    """The issue's crash: three runs died on a shared ``.checkpoint.pt.tmp``."""
    n = 3
    path = tmp_path / "metrics.json"
    barrier, errors = _CTX.Barrier(n), _CTX.Queue()
    procs = [
        _CTX.Process(target=_write_many, args=(str(path), barrier, errors, w)) for w in range(n)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=TIMEOUT)
        assert proc.exitcode == 0
    assert errors.empty(), errors.get()
    assert _temporaries(tmp_path) == []
    final = load_json(path, require_checksum=False)  # a complete document from one writer
    assert final["i"] == 29 and final["pad"] == "x" * 5000


def test_overwriting_a_damaged_file_never_vouches_for_it(tmp_path, monkeypatch):
    """The old digest is kept beside the new one only while the old data still match it: a
    file damaged on disk and then overwritten by a write that dies before the data replace
    still fails verification (its damaged bytes never get a digest of their own)."""
    path = tmp_path / "metrics.json"
    _save("json", path, version=0)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError):
        verify(path)
    calls = {"n": 0}
    real = os.replace

    def crashing(src, dst):
        calls["n"] += 1
        if Path(dst) == path:
            raise KeyboardInterrupt  # the process dies before the data replace
        return real(src, dst)

    monkeypatch.setattr(os, "replace", crashing)
    with pytest.raises(KeyboardInterrupt):
        _save("json", path, version=1)
    monkeypatch.undo()
    assert calls["n"] == 2
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        verify(path)
    assert hashlib.sha256(bytes(data)).hexdigest() not in checksum_path(path).read_text()


@pytest.mark.parametrize("checksum", [True, False])
def test_the_data_and_then_the_folder_entry_reach_the_disk(tmp_path, monkeypatch, checksum):
    """``fsync`` of the written bytes before the rename, and of the folder after the rename of
    the data file, so that a power cut after the call returns keeps the new file (spied on
    ``os.fsync`` / ``os.replace``: which inode each call touched, in order)."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        info = os.fstat(fd)
        events.append(("fsync", stat.S_ISDIR(info.st_mode), info.st_ino))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", Path(dst).name, os.stat(src).st_ino))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "data.bin"
    for content in (b"first", b"second"):
        events.clear()
        atomic_write(path, lambda handle, content=content: handle.write(content), checksum=checksum)
        assert path.read_bytes() == content
        (data,) = [i for i, e in enumerate(events) if e[:2] == ("replace", "data.bin")]
        assert ("fsync", False, events[data][2]) in events[:data]  # the bytes, before the rename
        folder = os.stat(tmp_path).st_ino
        assert ("fsync", True, folder) in events[data + 1 :]  # the folder, after it
        assert events[-1] == ("fsync", True, folder)
