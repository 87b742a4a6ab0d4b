"""Library-wide switches, in the spirit of :func:`pyro.enable_validation`.

**Validation.** Every public entry point checks the *form* of its arguments (types, shapes,
dimensions) whenever it is called. Checks of *values* -- finiteness, signs, positive
definiteness, label ranges -- read the tensors back to the host, which on a GPU is a device
synchronisation per check. They are on by default, so that a user's call with a NaN or a
negative variance raises a ``ValueError`` naming the argument, and the training loops
(:class:`~pyro_gpn.inference.Trainer`, :func:`~pyro_gpn.inference.fit_svi`) turn them off
(and Pyro's own distribution checks with them) after validating the data once on entry:
inside the loop every tensor the checks would see is one the library made from checked data.

    >>> import pyro_gpn
    >>> with pyro_gpn.settings.validation(False):
    ...     pass  # value checks skipped here
    >>> pyro_gpn.settings.is_validation_enabled()
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyro

__all__ = ["enable_validation", "is_validation_enabled", "validation"]

_VALIDATION = True


def is_validation_enabled() -> bool:
    """Whether value checks run (see the module docstring)."""
    return _VALIDATION


def enable_validation(flag: bool = True) -> None:
    """Turn value checks on or off globally (as :func:`pyro.enable_validation`)."""
    global _VALIDATION
    _VALIDATION = bool(flag)


@contextlib.contextmanager
def validation(flag: bool) -> Iterator[None]:
    """Within the block, value checks are ``flag``; so are Pyro's distribution checks.

    Restores both previous states on exit, also after an exception.
    """
    global _VALIDATION
    previous = _VALIDATION
    _VALIDATION = bool(flag)
    try:
        with pyro.validation_enabled(flag):
            yield
    finally:
        _VALIDATION = previous
