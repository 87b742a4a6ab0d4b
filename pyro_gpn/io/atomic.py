"""Atomic writes: a process-unique temporary file, ``fsync``, ``os.replace``, a checksum beside.

On any error (disk full, read-only folder, ``KeyboardInterrupt``, an exception in the writer) the
temporary file is removed and the previous version of the target stays intact; the order of the
steps that keeps the data file and its checksum verifiable at every instant is described in
:mod:`pyro_gpn.io`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .checksums import _read_digests, checksum_path, file_digest
from .errors import CorruptFileError, PathLike

__all__ = ["atomic_write"]

_TMP_SUFFIX = ".tmp"


def _checksum_line(digest: str, path: Path) -> str:
    return f"{digest}  {path.name}\n"


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
            if not checksum:
                os.replace(tmp, path)
                _fsync_directory(path.parent)
                return None
            # steps 1-3 under an exclusive lock on the folder: concurrent writers of one file
            # must not interleave them, or the last data and the last checksum could come from
            # different writers
            with _folder_lock(path.parent):
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
                if old:
                    _write_text_atomic(side, _checksum_line(digest, path))  # step 3
            _fsync_directory(path.parent)
            return digest
        except OSError as error:
            raise _explain(error, path) from error
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _folder_lock(directory: Path):
    """An exclusive ``flock`` on ``directory`` itself (no lock file left beside the data), for
    the few steps that must not interleave between processes; a no-op without ``fcntl``."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_text_atomic(path: Path, text: str) -> None:
    atomic_write(path, lambda handle: handle.write(text.encode("ascii")), checksum=False)
