"""Find, download and verify the raw data files behind the dataset loaders.

Every file a loader reads has a path relative to a *data directory*, for example
``uci/adult.data`` or ``uci-regression/yacht/data.txt`` (the layout of the project's shared
dataset folder), and a checksum in the manifest ``bundled/CHECKSUMS`` shipped with the package
(BSD-tagged ``SHA256 (path) = hex`` lines; ``MD5`` for the one file whose SHA-256 could not be
computed here, MNIST's training images). From the data directory the whole set can be checked
with GNU coreutils: ``cksum --check /path/to/pyro_gpn/data/bundled/CHECKSUMS``.

:func:`fetch` resolves one file:

1. The data directory is ``data_dir`` if given, else ``$PYRO_GPN_DATA_DIR``, else
   ``~/.cache/pyro_gpn``.
2. A file already there is verified and used in place (nothing is copied). A checksum mismatch
   raises :class:`ChecksumError` and leaves the file alone.
3. A missing file is downloaded with :mod:`urllib` into a temporary file in the same folder,
   verified while it streams, and moved into place with :func:`os.replace`. An interrupted or
   corrupted download removes the temporary file, so the target path only ever holds a complete,
   verified file. (A process killed with ``SIGKILL`` mid-download can leave a
   ``.<name>.*.part`` file behind, never a file under the target name.) A file the server only
   offers compressed (:attr:`RemoteFile.decompress`) is decompressed before it is verified.
4. When the download fails (offline, no write permission, HTTP error), or ``download=False``,
   :class:`DataUnavailableError` says which file to put where.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = [
    "BUNDLED_DIR",
    "ChecksumError",
    "DataDir",
    "DataUnavailableError",
    "RemoteFile",
    "default_data_dir",
    "expected_checksum",
    "fetch",
    "verify",
]

#: Folder of the files shipped inside the package (the yacht data set and the checksum manifest).
BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"

#: What ``data_dir`` arguments accept; ``None`` means :func:`default_data_dir`.
DataDir = str | os.PathLike[str] | None

_MANIFEST = BUNDLED_DIR / "CHECKSUMS"
_MANIFEST_LINE = re.compile(r"^(SHA256|MD5) \((?P<path>.+)\) = (?P<digest>[0-9a-f]+)$")
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0


class ChecksumError(OSError, RuntimeError):
    """A data file's content does not match the checksum recorded for it.

    An ``OSError`` (a damaged file, like :class:`pyro_gpn.io.CorruptFileError`) and, for code
    written against earlier releases, still a ``RuntimeError``.
    """


class DataUnavailableError(FileNotFoundError):
    """A data file is neither in the data directory nor downloadable right now."""


@dataclass(frozen=True)
class RemoteFile:
    """One raw data file: where it lives in a data directory and where to download it.

    Attributes:
        path: POSIX path relative to the data directory, e.g. ``"uci/adult.data"``; the key of
            its checksum in the manifest.
        url: canonical download location.
        decompress: applied to the downloaded bytes when the server only offers a compressed
            file (e.g. :func:`~pyro_gpn.data.lzw.decompress_lzw`); the checksum, and the file
            stored under ``path``, are those of the decompressed content.
    """

    path: str
    url: str
    decompress: Callable[[bytes], bytes] | None = None


def default_data_dir() -> Path:
    """The data directory used by default: ``$PYRO_GPN_DATA_DIR``, else ``~/.cache/pyro_gpn``."""
    env = os.environ.get("PYRO_GPN_DATA_DIR")
    return Path(env).expanduser() if env else Path("~/.cache/pyro_gpn").expanduser()


@cache
def _manifest() -> dict[str, tuple[str, str]]:
    entries: dict[str, tuple[str, str]] = {}
    for number, line in enumerate(_MANIFEST.read_text().splitlines(), start=1):
        match = _MANIFEST_LINE.match(line.strip())
        if match is None:
            raise RuntimeError(f"{_MANIFEST}:{number}: malformed checksum line {line!r}")
        entries[match["path"]] = (match.group(1).lower(), match["digest"])
    return entries


def expected_checksum(path: str) -> tuple[str, str]:
    """``(algorithm, hex digest)`` recorded for the relative ``path``; ``algorithm`` is
    ``"sha256"`` or ``"md5"``. Raises ``KeyError`` for a path the manifest does not list."""
    try:
        return _manifest()[path]
    except KeyError:
        raise KeyError(f"no checksum recorded for data file {path!r}") from None


def _hex_digest(algorithm: str, location: Path) -> str:
    digest = hashlib.new(algorithm)
    with open(location, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(location: str | os.PathLike[str], path: str) -> Path:
    """Check the file at ``location`` against the checksum recorded for ``path``.

    Returns ``location`` as a :class:`~pathlib.Path`; raises :class:`ChecksumError` on a mismatch.
    """
    location = Path(location)
    algorithm, want = expected_checksum(path)
    got = _hex_digest(algorithm, location)
    if got != want:
        raise ChecksumError(
            f"{location} is corrupted or not the expected file: its {algorithm} is {got}, "
            f"expected {want}. Delete it so that it can be downloaded again, or replace it "
            f"with an intact copy."
        )
    return location


def _download(file: RemoteFile, target: Path) -> None:
    """Stream ``file.url`` into ``target`` atomically, verifying the checksum on the way."""
    algorithm, want = expected_checksum(file.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".part"
    )
    try:
        digest = hashlib.new(algorithm)
        with (
            os.fdopen(handle, "wb") as sink,
            urllib.request.urlopen(file.url, timeout=_TIMEOUT_S) as source,
        ):
            if file.decompress is None:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    sink.write(chunk)
            else:
                content = file.decompress(source.read())
                digest.update(content)
                sink.write(content)
        if digest.hexdigest() != want:
            raise ChecksumError(
                f"the file downloaded from {file.url} has {algorithm} {digest.hexdigest()}, "
                f"expected {want}; nothing was written to {target}"
            )
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _unavailable(file: RemoteFile, target: Path, reason: str, hint: str) -> DataUnavailableError:
    algorithm, digest = expected_checksum(file.path)
    message = (
        f"{reason}. Download {file.url} and put it at {target} ({algorithm} {digest}), "
        f"or point data_dir / $PYRO_GPN_DATA_DIR at a folder that holds {file.path}."
    )
    return DataUnavailableError(f"{message} {hint}".rstrip())


def fetch(
    file: RemoteFile,
    data_dir: DataDir = None,
    *,
    download: bool = True,
    hint: str = "",
) -> Path:
    """Return the local path of ``file``, verified, downloading it first if it is missing.

    Args:
        file: the file to resolve.
        data_dir: data directory; default :func:`default_data_dir`.
        download: whether a missing file may be downloaded.
        hint: extra advice appended to the error message when the file is unavailable.

    Raises:
        ChecksumError: the local or downloaded file does not match its recorded checksum.
        DataUnavailableError: the file is missing and could not be downloaded.
    """
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    target = root / file.path
    if target.is_file():
        return verify(target, file.path)
    if not download:
        raise _unavailable(file, target, f"{file.path} is not in {root}", hint)
    try:
        _download(file, target)
    except ChecksumError:  # an OSError, but not a network failure
        raise
    except (OSError, http.client.HTTPException, ValueError) as error:  # URLError: an OSError
        reason = getattr(error, "reason", None) or error
        raise _unavailable(
            file, target, f"could not download {file.url} ({reason})", hint
        ) from error
    return target
