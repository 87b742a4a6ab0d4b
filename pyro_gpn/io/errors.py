"""The errors of :mod:`pyro_gpn.io`: damaged files, folders in use, finished runs.

Each message names the file or folder, says what is wrong and what to do about it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["CorruptFileError", "MissingFileError", "RunExistsError", "RunInUseError"]

FINISHED_MARKER = "result.json"
LOCK_NAME = ".lock"

PathLike = str | os.PathLike


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
