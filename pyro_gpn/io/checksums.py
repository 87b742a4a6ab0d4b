"""SHA-256 checksums recorded beside saved files (``<file>.sha256``, ``sha256sum`` format) and
verified reads."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .errors import CorruptFileError, MissingFileError, PathLike

__all__ = ["CHECKSUM_SUFFIX", "checksum_path", "file_digest", "read_verified", "verify"]

CHECKSUM_SUFFIX = ".sha256"
_CHUNK = 1 << 20


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
