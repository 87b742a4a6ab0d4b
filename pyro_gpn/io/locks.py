"""Run directories: an exclusive lock per folder, stale temporaries, the overwrite guard."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from pathlib import Path

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from .atomic import _TMP_SUFFIX, _explain, _temporary_name
from .errors import FINISHED_MARKER, LOCK_NAME, PathLike, RunExistsError, RunInUseError

__all__ = ["RunLock", "clean_stale_temporaries", "ensure_can_write"]


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:  # pragma: no cover
        return False
    return True


def clean_stale_temporaries(directory: PathLike) -> list[Path]:
    """Remove temporary files of :func:`atomic_write` left by processes that no longer run.

    A process killed with ``SIGKILL`` cannot clean up; its ``.<name>.<pid>.<hex>.tmp`` files
    stay until this is called (e.g. when a run directory is locked). Returns the removed paths.
    """
    removed = []
    for tmp in Path(directory).glob(f".*{_TMP_SUFFIX}"):
        parts = tmp.name[: -len(_TMP_SUFFIX)].rsplit(".", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        if not _pid_alive(int(parts[1])):
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed.append(tmp)
    return removed


def _read_holder(lock_path: Path) -> tuple[int | None, str | None]:
    try:
        info = json.loads(lock_path.read_text())
        return int(info["pid"]), info.get("host")
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


class RunLock:
    """Exclusive use of a run directory by one live process.

    ``fcntl.flock`` on ``<run_dir>/.lock`` (which holds the PID, host and start time of the
    holder): the kernel drops the lock when the holder dies, however it dies, so a lock left by a
    killed run is stale by construction and is taken over. Where ``fcntl`` is missing, the lock
    file is created with ``O_EXCL`` and a leftover file whose PID no longer runs is replaced.
    Locks on network file systems are only as good as the file system's ``flock``.

    Args:
        run_dir: the folder; created if missing.

    Raises:
        RunInUseError: (from :meth:`acquire` / ``with``) another live process holds the folder.
        PermissionError: the folder cannot be created or written (message names it).

    Example::

        with RunLock("runs/yacht"):
            ...  # only this process writes runs/yacht
    """

    _held: set[str] = set()  # folders locked by this process (realpaths)

    def __init__(self, run_dir: PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        return self._fd is not None

    @classmethod
    def is_held(cls, run_dir: PathLike) -> bool:
        """Whether this process already holds the lock of ``run_dir``.

        For nested users: the command line locks a run folder for the whole command and
        :class:`~pyro_gpn.inference.Trainer` then skips taking it again (a second ``flock`` on
        the same file from the same process would be refused).
        """
        return os.path.realpath(run_dir) in cls._held

    def acquire(self) -> RunLock:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = self._acquire_flock() if fcntl is not None else self._acquire_excl()
        except OSError as error:
            raise _explain(error, self.path) from error
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(info) + "\n").encode())
        self._fd = fd
        RunLock._held.add(os.path.realpath(self.run_dir))
        clean_stale_temporaries(self.run_dir)
        return self

    def _acquire_flock(self) -> int:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                # the holder writes its PID just after locking: give it a moment
                deadline = time.monotonic() + 2.0
                pid, host = _read_holder(self.path)
                while pid is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                    pid, host = _read_holder(self.path)
                raise RunInUseError(self.run_dir, pid, host) from None
            except BaseException:
                os.close(fd)
                raise
            # the holder may have released and unlinked the file between our open and flock:
            # then we locked an orphan inode and must retry on the current file
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def _acquire_excl(self) -> int:  # pragma: no cover - exercised only without fcntl
        for _ in range(2):
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                pid, host = _read_holder(self.path)
                if pid is not None and (
                    host not in (None, socket.gethostname()) or _pid_alive(pid)
                ):
                    raise RunInUseError(self.run_dir, pid, host) from None
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()  # stale: its holder is dead
        raise RunInUseError(self.run_dir, None)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        RunLock._held.discard(os.path.realpath(self.run_dir))
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # unlink while still locked: the next holder gets a new inode
        os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __del__(self) -> None:  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            if self._fd is not None:
                os.close(self._fd)


def ensure_can_write(
    run_dir: PathLike, overwrite: bool = False, marker: str = FINISHED_MARKER
) -> Path:
    """Check that ``run_dir`` may receive a new run; create it if missing.

    Args:
        run_dir: the output folder.
        overwrite: allow replacing a finished run (one whose ``marker`` file exists).
        marker: the file that marks a finished run (``result.json``).

    Returns:
        ``run_dir`` as a ``Path``.

    Raises:
        RunExistsError: ``run_dir/marker`` exists and ``overwrite`` is false.
        NotADirectoryError: ``run_dir`` is a file.
        PermissionError: the folder cannot be created or is not writable (message names it).
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(
            errno.ENOTDIR, f"output folder {run_dir} is a file; choose another folder", str(run_dir)
        )
    if (run_dir / marker).exists() and not overwrite:
        raise RunExistsError(run_dir, marker)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = _temporary_name(run_dir / ".write-test")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        os.unlink(probe)
    except OSError as error:
        raise _explain(error, run_dir / marker) from error
    return run_dir
