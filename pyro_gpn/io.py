"""Safe files: atomic, checksummed writes, verified reads and a lock on a run directory.

What a training run writes (``model.pt``, ``checkpoint.pt``, ``result.json``, metrics) must
survive a kill, a full disk and a second process writing to the same folder, and what it reads
back must be what it wrote. This module is the one place that guarantees that:

* :func:`atomic_write` writes through a temporary file unique to the process and the call
  (``.<name>.<pid>.<random>.tmp`` in the same directory), ``fsync``s it, renames it over the
  target with :func:`os.replace` and ``fsync``s the directory. On *any* error -- ``OSError``
  (disk full, read-only folder), ``KeyboardInterrupt``, an exception inside the writer -- the
  temporary file is removed and the previous version of the target is left intact.
* Every file written this way gets a SHA-256 checksum beside it (``model.pt.sha256``, in the
  format of ``sha256sum``). :func:`verify` checks it; :func:`load_torch` and :func:`load_json`
  verify before they parse. A flipped byte, a truncated file, a missing file or a missing
  checksum all raise :class:`CorruptFileError` (an ``OSError``) whose message names the file,
  says what is wrong and what to do.
* The checksum file and the data file cannot be renamed together, so the write goes in three
  steps that keep every intermediate state verifiable: the checksum file first lists the old and
  the new digest, then the data file is replaced, then the checksum file is rewritten with the
  new digest only. A kill at any point leaves a pair that verifies (either version).
* :class:`RunLock` makes a run directory exclusive to one live process (``fcntl.flock`` on
  ``<run_dir>/.lock``, which the kernel releases when the process dies, so a stale lock left by a
  killed run is taken over silently; without ``fcntl`` an ``O_EXCL`` lock file with a PID check).
  A second process gets :class:`RunInUseError` naming the folder and the holder's PID.
* :func:`ensure_can_write` refuses to overwrite a finished run (one with ``result.json``)
  unless ``overwrite=True`` and turns an unwritable folder into a clear ``PermissionError``.

Example::

    with RunLock(out_dir):
        ensure_can_write(out_dir, overwrite=args.overwrite)
        save_torch(model.state_dict(), out_dir / "model.pt")
        save_json(record, out_dir / "result.json")
    state = load_torch(out_dir / "model.pt")  # CorruptFileError if it was damaged
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CHECKSUM_SUFFIX",
    "FINISHED_MARKER",
    "LOCK_NAME",
    "CorruptFileError",
    "MissingFileError",
    "RunExistsError",
    "RunInUseError",
    "RunLock",
    "atomic_write",
    "checksum_path",
    "clean_stale_temporaries",
    "ensure_can_write",
    "file_digest",
    "load_json",
    "load_torch",
    "read_verified",
    "save_json",
    "save_torch",
    "verify",
]

CHECKSUM_SUFFIX = ".sha256"
LOCK_NAME = ".lock"
FINISHED_MARKER = "result.json"
_TMP_SUFFIX = ".tmp"
_CHUNK = 1 << 20

PathLike = str | os.PathLike


# ---------------------------------------------------------------------------------- errors
class CorruptFileError(OSError):
    """A saved file is damaged, truncated, missing or has no (or a wrong) checksum.

    Attributes:
        path: the file.
        reason: what is wrong, in words.
        hint: what to do about it.
    """

    def __init__(self, path: PathLike, reason: str, hint: str | None = None) -> None:
        self.path = Path(path)
        self.reason = reason
        self.hint = hint or (
            "the file was damaged or only partly written; restore it from a copy or re-create "
            "it (re-run the command that wrote it)"
        )
        self.message = f"{self.path}: {reason}; {self.hint}"
        super().__init__(self.message)
        self.filename = str(self.path)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):  # picklable across processes despite the custom signature
        return (type(self), (self.path, self.reason, self.hint))


class MissingFileError(CorruptFileError, FileNotFoundError):
    """The file (or its checksum) does not exist; also a ``FileNotFoundError``."""


class RunInUseError(RuntimeError):
    """The run directory is locked by another live process."""

    def __init__(self, run_dir: PathLike, pid: int | None, host: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.pid = pid
        self.host = host
        holder = "another process" if pid is None else f"process {pid}"
        if host and host != socket.gethostname():
            holder += f" on host {host}"
        super().__init__(
            f"{self.run_dir} is in use by {holder} (lock file {self.run_dir / LOCK_NAME}); "
            "wait for it to finish, stop it, or choose another output folder"
        )

    def __reduce__(self):
        return (type(self), (self.run_dir, self.pid, self.host))


class RunExistsError(FileExistsError):
    """The run directory already holds a finished run and ``overwrite`` was not given."""

    def __init__(self, run_dir: PathLike, marker: str = FINISHED_MARKER) -> None:
        self.run_dir = Path(run_dir)
        self.marker = marker
        self.message = (
            f"{self.run_dir} already holds a finished run ({marker} exists); pass "
            "overwrite=True (--overwrite on the command line) to replace it, --resume to "
            "continue it, or choose another output folder"
        )
        super().__init__(self.message)
        self.filename = str(self.run_dir / marker)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return (type(self), (self.run_dir, self.marker))


# ---------------------------------------------------------------------------------- checksums
def checksum_path(path: PathLike) -> Path:
    """The checksum file recorded beside ``path`` (``<path>.sha256``)."""
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def file_digest(path: PathLike) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_digests(path: Path) -> list[str]:
    """The digests listed in ``path``'s checksum file (``sha256sum`` lines)."""
    side = checksum_path(path)
    try:
        text = side.read_text(encoding="ascii")
    except FileNotFoundError:
        raise MissingFileError(
            path,
            f"no checksum file {side.name} beside it, so its integrity cannot be verified",
            "files written by pyro_gpn carry one; re-create the file, or load it with "
            "require_checksum=False if you trust it",
        ) from None
    except (UnicodeDecodeError, OSError) as error:
        raise CorruptFileError(
            path, f"its checksum file {side.name} is unreadable ({error})"
        ) from error
    digests = []
    for line in text.splitlines():
        token = line.split(maxsplit=1)[0] if line.strip() else ""
        if len(token) == 64 and all(c in "0123456789abcdef" for c in token):
            digests.append(token)
    if not digests:
        raise CorruptFileError(path, f"its checksum file {side.name} holds no SHA-256 digest")
    return digests


def _write_text_atomic(path: Path, text: str) -> None:
    atomic_write(path, lambda handle: handle.write(text.encode("ascii")), checksum=False)


def _checksum_line(digest: str, path: Path) -> str:
    return f"{digest}  {path.name}\n"


def read_verified(path: PathLike, require_checksum: bool = True) -> bytes:
    """The bytes of ``path`` after checking them against its checksum file.

    Args:
        path: the file.
        require_checksum: a missing checksum file is an error (default); ``False`` accepts
            files written before checksums existed (an existing checksum is still verified).

    Raises:
        MissingFileError: the file, or (with ``require_checksum``) its checksum, is missing.
        CorruptFileError: the bytes do not match the recorded checksum.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MissingFileError(
            path, "file not found", "check the path, or re-run the command that writes it"
        ) from None
    except IsADirectoryError:
        raise CorruptFileError(path, "is a directory, not a file", "check the path") from None
    try:
        digests = _read_digests(path)
    except MissingFileError:
        if require_checksum:
            raise
        return data
    actual = hashlib.sha256(data).hexdigest()
    if actual not in digests:
        raise CorruptFileError(
            path,
            f"checksum mismatch ({len(data)} bytes with SHA-256 {actual[:12]}..., recorded "
            f"{digests[-1][:12]}... in {checksum_path(path).name})",
        )
    return data


def verify(path: PathLike, require_checksum: bool = True) -> None:
    """Check ``path`` against its checksum file; raise :class:`CorruptFileError` if it fails."""
    read_verified(path, require_checksum)


# ---------------------------------------------------------------------------------- writing
def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}")


def _fsync_directory(directory: Path) -> None:
    if os.name != "posix":  # pragma: no cover
        return
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _explain(error: OSError, path: Path) -> OSError:
    """The same kind of ``OSError`` with a message that names ``path`` and the way out."""
    if isinstance(error, CorruptFileError) or getattr(error, "_explained", False):
        return error
    code = error.errno
    if code == errno.ENOSPC or code == getattr(errno, "EDQUOT", -1):
        advice = "the disk is full: free space (or choose another folder) and run again"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        advice = (
            f"the folder {path.parent} is not writable (read-only disk or missing permission): "
            "choose another output folder"
        )
    elif code == errno.ENOENT:
        advice = f"the folder {path.parent} does not exist or was removed while writing"
    else:
        advice = "check the disk and the folder's permissions"
    reason = error.strerror or str(error)
    message = f"cannot write {path}: {reason}; {advice}; the previous version (if any) is intact"
    new = type(error)(code, message) if code is not None else OSError(message)
    new.filename = str(path)
    new._explained = True
    return new


def atomic_write(
    path: PathLike, write: Callable[[IO[bytes]], Any], checksum: bool = True
) -> str | None:
    """Write ``path`` atomically: either the whole new content or the previous file remains.

    Args:
        path: the target file; its directory must exist.
        write: called with a binary file handle open on the temporary file.
        checksum: also record the SHA-256 in ``<path>.sha256`` (see the module docstring for the
            order of the steps that keeps the pair verifiable at every instant).

    Returns:
        The hex SHA-256 of the written bytes (``None`` with ``checksum=False``).

    Raises:
        OSError: the same subclass as the underlying error (``PermissionError``, ...) with a
            message naming ``path`` and what to do; the temporary file is removed.
        BaseException: whatever ``write`` raises (``KeyboardInterrupt`` included), after the
            temporary file has been removed.
    """
    path = Path(path)
    tmp = _temporary_name(path)
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as handle:
                write(handle)
                handle.flush()
                os.fsync(handle.fileno())
            digest = file_digest(tmp) if checksum else None
            if checksum:
                side = checksum_path(path)
                old: list[str] = []
                if side.exists() and path.exists():
                    with contextlib.suppress(OSError):  # CorruptFileError included
                        current = file_digest(path)
                        if current != digest and current in _read_digests(path):
                            old = [current]
                if old:  # step 1: both digests, so that old and new data verify
                    _write_text_atomic(
                        side, "".join(_checksum_line(d, path) for d in (*old, digest))
                    )
                else:  # no valid old pair to protect: record the new digest directly
                    _write_text_atomic(side, _checksum_line(digest, path))
            os.replace(tmp, path)  # step 2
            if checksum and old:
                _write_text_atomic(checksum_path(path), _checksum_line(digest, path))  # step 3
            _fsync_directory(path.parent)
            return digest
        except OSError as error:
            raise _explain(error, path) from error
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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


# ---------------------------------------------------------------------------------- formats
def save_torch(obj: Any, path: PathLike) -> str:
    """``torch.save(obj)`` atomically with a checksum; returns the SHA-256.

    The object is serialised in memory first, so that a failing disk raises the plain
    ``OSError`` of :func:`atomic_write` rather than torch's ``RuntimeError`` from inside its zip
    writer (which hides the ``ENOSPC``).
    """
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getbuffer()
    return atomic_write(path, lambda handle: handle.write(data))


def load_torch(
    path: PathLike,
    map_location: Any = "cpu",
    weights_only: bool = True,
    require_checksum: bool = True,
) -> Any:
    """``torch.load`` a file written by :func:`save_torch`, after verifying its checksum.

    Raises:
        CorruptFileError: missing, damaged or truncated file, or a checksum problem (see
            :func:`read_verified`); also when the bytes do not unpickle.
    """
    import torch

    data = read_verified(path, require_checksum)
    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=weights_only)
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise CorruptFileError(
            path, f"not a readable torch file ({type(error).__name__}: {error})"
        ) from error


def save_json(obj: Any, path: PathLike, indent: int | None = 1) -> str:
    """``json.dump(obj)`` (UTF-8, trailing newline) atomically with a checksum."""
    text = json.dumps(obj, indent=indent, allow_nan=True) + "\n"
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def load_json(path: PathLike, require_checksum: bool = True) -> Any:
    """Read a file written by :func:`save_json` after verifying its checksum.

    Raises:
        CorruptFileError: missing, damaged or truncated file, a checksum problem, or text that
            is not JSON (the message gives the line and column).
    """
    data = read_verified(path, require_checksum)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptFileError(path, f"not valid JSON ({error})") from error


# ---------------------------------------------------------------------------------- run dirs
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
