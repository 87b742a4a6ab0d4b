"""Choice between the plain-PyTorch reference path and the fused Triton kernels.

The closed-form GPN moments (:mod:`pyro_gpn.moments.propagate`) have two implementations:

* ``"reference"`` -- readable PyTorch on any device and dtype (the ground truth of the tests);
* ``"fused"`` -- :mod:`pyro_gpn.moments.fused`: one Triton kernel per layer and direction that
  evaluates ``psi``, ``Omega`` and ``Lambda`` and their contractions in registers, never
  materialising ``[S, N, R, R]`` or ``[S, N, N, R, R]`` tensors (paper, section
  "Implementation").

The backend is chosen per thread with the :func:`backend` context manager:

* ``"auto"`` (default) -- fused for float32 CUDA tensors when Triton is installed, else reference;
* ``"reference"`` -- always the reference path;
* ``"fused"`` -- the fused kernels for every float32 input; raises :class:`RuntimeError` if Triton
  is not installed or the tensors live on a device the kernels cannot run on. CPU tensors work
  under Triton's interpreter (environment variable ``TRITON_INTERPRET=1``, set before the first
  kernel launch), which is how the kernels are tested without a GPU.

The kernels compute in float32. Inputs of any other dtype (float64 gradient checks, half
precision) always take the reference path, whatever the backend.

Example::

    with backend("reference"):
        out = layer.propagate(moments, "meanvar")
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = [
    "BACKENDS",
    "backend",
    "get_backend",
    "triton_available",
    "triton_interpret",
    "use_fused",
]

#: The accepted backend names.
BACKENDS: tuple[str, ...] = ("auto", "reference", "fused")

_state = threading.local()


def _stack() -> list[str]:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = ["auto"]
    return stack


def get_backend() -> str:
    """The backend in force in this thread: ``"auto"``, ``"reference"`` or ``"fused"``."""
    return _stack()[-1]


@contextlib.contextmanager
def backend(name: str) -> Iterator[str]:
    """Use backend ``name`` inside the ``with`` block (this thread only; nestable).

    Args:
        name: ``"auto"``, ``"reference"`` or ``"fused"``.

    Raises:
        ValueError: for any other name.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    stack = _stack()
    stack.append(name)
    try:
        yield name
    finally:
        stack.pop()


@functools.cache
def triton_available() -> bool:
    """True if ``triton`` is installed.

    Only looks the package up, without importing it: Triton fixes its interpreter mode
    (``TRITON_INTERPRET``) when first imported, which :mod:`pyro_gpn.moments.fused` therefore
    defers to the first kernel launch.
    """
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["triton"] = None
        return False


def triton_interpret() -> bool:
    """True if Triton's CPU interpreter is switched on (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def _runnable_device(tensor: Tensor) -> bool:
    return tensor.is_cuda or (tensor.device.type == "cpu" and triton_interpret())


def use_fused(*tensors: Tensor | None) -> bool:
    """Whether the fused kernels should evaluate an expression of ``tensors``.

    ``None`` entries are ignored.

    * ``"reference"``: ``False``.
    * ``"auto"``: ``True`` iff Triton is available and every tensor is a float32 CUDA tensor.
    * ``"fused"``: ``True`` iff every tensor is float32 (other dtypes take the reference path).

    Raises:
        RuntimeError: backend ``"fused"`` with Triton not installed, or with float32 tensors on a
            device Triton cannot run on (CPU without ``TRITON_INTERPRET=1``).
    """
    name = get_backend()
    if name == "reference":
        return False
    present = [t for t in tensors if t is not None]
    if name == "auto":
        return (
            bool(present)
            and all(t.is_cuda and t.dtype == torch.float32 for t in present)
            and triton_available()
        )
    # name == "fused"
    if not triton_available():
        raise RuntimeError(
            "backend('fused') needs Triton, which is not installed "
            "(pip install 'pyro-gpn[gpu]'); use backend('auto') or backend('reference')"
        )
    if not all(t.dtype == torch.float32 for t in present):
        return False
    bad = [t.device for t in present if not _runnable_device(t)]
    if bad:
        raise RuntimeError(
            f"backend('fused') cannot run on device {bad[0]}: the Triton kernels need CUDA "
            "tensors, or CPU tensors with TRITON_INTERPRET=1 set before the first launch"
        )
    return True
