"""Torch and JSON files written atomically with a checksum and verified before they are parsed."""

from __future__ import annotations

import io
import json
from typing import Any

from .atomic import atomic_write
from .checksums import read_verified
from .errors import CorruptFileError, PathLike

__all__ = ["load_json", "load_torch", "save_json", "save_torch"]


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
