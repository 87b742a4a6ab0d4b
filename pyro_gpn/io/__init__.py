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

from .atomic import atomic_write
from .checksums import CHECKSUM_SUFFIX, checksum_path, file_digest, read_verified, verify
from .errors import (
    FINISHED_MARKER,
    LOCK_NAME,
    CorruptFileError,
    MissingFileError,
    RunExistsError,
    RunInUseError,
)
from .formats import load_json, load_torch, save_json, save_torch
from .locks import RunLock, clean_stale_temporaries, ensure_can_write

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
