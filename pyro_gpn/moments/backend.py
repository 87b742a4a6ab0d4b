"""Choice between the plain-PyTorch reference path and the fused kernels.

The closed-form GPN moments (:mod:`pyro_gpn.moments.propagate`) have three implementations:

* ``"reference"`` -- readable PyTorch on any device and dtype (the ground truth of the tests);
* ``"cpu"`` -- :mod:`pyro_gpn.moments.cpu_kernels`: compiled Numba loops, one pass per
  (sample, unit) forward and backward, float32 and float64 CPU tensors, fixed equidistant
  inducing points (``"mean"`` and ``"meanvar"``; in ``"cov"`` mode the diagonal, and the
  off-diagonal's Mehler series in one pass over the unit pairs, :mod:`pyro_gpn.moments.cpu_mehler`);
  needs the optional ``numba`` (``pyro-gpn[fast]``); first-order gradients only (use
  ``"reference"`` for ``create_graph=True``). A
  parametric or whitened variational layer's whole response (parameter-only algebra and rows) is
  one autograd node there, :mod:`pyro_gpn.moments.cpu_layer`, and so is the softmax head's
  unscented cross-entropy of diagonal features, :mod:`pyro_gpn.moments.cpu_unscented`;
* ``"triton"`` -- :mod:`pyro_gpn.moments.fused`: one Triton kernel per layer and direction that
  evaluates ``psi`` and ``Omega`` and their contractions in registers, never materialising
  ``[S, N, R, R]`` tensors (paper, section "Implementation"); float32 or float64 CUDA tensors
  (or CPU tensors under ``TRITON_INTERPRET=1``). A full covariance's off-diagonal is Mehler's
  series on whole tensors (:mod:`pyro_gpn.moments.cross`), as on the reference path.

The backend is chosen per thread with the :func:`backend` context manager:

* ``"auto"`` (default) -- ``"triton"`` for CUDA tensors when Triton is installed: float32 or
  float64 (the layers' default compute dtype), in every mode: the kernels evaluate the
  closed-form mean and variance, and
  :func:`~pyro_gpn.moments.propagate.response_moments` replaces the narrow-regime rows whose
  closed form is not provably accurate by their quadrature variance and adds a full
  covariance's off-diagonal by Mehler's series, exactly as on the reference path;
  ``"cpu"`` for float32/float64 CPU tensors with fixed equidistant inducing points when Numba is
  installed, else ``"reference"``. Never raises.
* ``"reference"`` -- always the reference path;
* ``"fused"`` -- the fused kernel for the tensors' device (``"cpu"`` on the CPU, ``"triton"``
  on CUDA); raises :class:`RuntimeError` naming the reason when it cannot run (package missing,
  dtype, device, learnable or irregular inducing points). Nothing falls back silently.
* ``"cpu"`` / ``"triton"`` -- that kernel family, raising likewise when it cannot run.

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
    "TRITON_MEANVAR_DTYPES",
    "backend",
    "get_backend",
    "cpu_kernels_evaluate",
    "cpu_parameter_kernels",
    "numba_available",
    "select_backend",
    "triton_available",
    "triton_interpret",
    "use_fused",
]

#: The accepted backend names.
BACKENDS: tuple[str, ...] = ("auto", "reference", "fused", "cpu", "triton")

#: dtypes of the Triton mean and mean/variance kernels
TRITON_MEANVAR_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64)

_state = threading.local()


def _stack() -> list[str]:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = ["auto"]
    return stack


def get_backend() -> str:
    """The backend in force in this thread (one of :data:`BACKENDS`)."""
    return _stack()[-1]


@contextlib.contextmanager
def backend(name: str) -> Iterator[str]:
    """Use backend ``name`` inside the ``with`` block (this thread only; nestable).

    Args:
        name: one of :data:`BACKENDS`.

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


@functools.cache
def numba_available() -> bool:
    """True if ``numba`` is installed (looked up without importing it)."""
    try:
        return importlib.util.find_spec("numba") is not None
    except (ImportError, ValueError):
        return False


_FLOATS = (torch.float32, torch.float64)


def _triton_problem(
    present: list[Tensor], dtypes: tuple[torch.dtype, ...] = (torch.float32,)
) -> str | None:
    """Why the Triton kernels (computing in one of ``dtypes``) cannot evaluate ``present``
    (``None`` if they can)."""
    if not triton_available():
        return "Triton is not installed (pip install 'pyro-gpn[gpu]')"
    names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
    bad = [t.dtype for t in present if t.dtype not in dtypes]
    if bad:
        return f"the Triton kernels compute in {names}, got {bad[0]}"
    if len({t.dtype for t in present}) > 1:
        return f"the Triton kernels need one dtype, got {sorted({str(t.dtype) for t in present})}"
    dev = [t.device for t in present if not _runnable_device(t)]
    if dev:
        return (
            f"the Triton kernels cannot run on device {dev[0]}: they need CUDA tensors, or CPU "
            "tensors with TRITON_INTERPRET=1 set before the first launch"
        )
    return None


def _cpu_problem(present: list[Tensor], inducing_points: Tensor | None, equidistant) -> str | None:
    """Why the Numba CPU kernels cannot evaluate ``present`` (``None`` if they can)."""
    if not numba_available():
        return "numba is not installed (pip install 'pyro-gpn[fast]')"
    dev = [t.device for t in present if t.device.type != "cpu"]
    if dev:
        return f"the fused CPU kernels need CPU tensors, got device {dev[0]}"
    bad = [t.dtype for t in present if t.dtype not in _FLOATS]
    if bad:
        return f"the fused CPU kernels need float32 or float64 tensors, got {bad[0]}"
    if inducing_points is not None:
        if inducing_points.requires_grad:
            return "the fused CPU kernels need fixed inducing points (learn_inducing=False)"
        if equidistant is None:
            from .propagate import is_equidistant

            equidistant = is_equidistant(inducing_points)
        if not equidistant:
            return "the fused CPU kernels need equidistant, ascending inducing points"
    return None


def select_backend(
    *tensors: Tensor | None,
    inducing_points: Tensor | None = None,
    equidistant: bool | None = None,
    cpu_unsupported: str | None = None,
    triton_dtypes: tuple[torch.dtype, ...] = (torch.float32,),
) -> str:
    """The implementation that evaluates an expression of ``tensors``: ``"reference"``,
    ``"cpu"`` or ``"triton"``, by the backend in force (module docstring).

    Args:
        tensors: every tensor entering the expression (``None`` entries are ignored).
        inducing_points: the layer's ``V`` (the CPU kernels need them fixed and equidistant).
        equidistant: whether ``V`` is known to be equidistant (``None``: checked here).
        cpu_unsupported: the reason the CPU kernels cannot evaluate this expression (a mode or
            an argument they do not cover), or ``None``.
        triton_dtypes: the dtypes the Triton kernels of this expression compute in.

    Raises:
        RuntimeError: a forcing backend (``"fused"``, ``"cpu"``, ``"triton"``) that cannot run,
            with the reason.
    """
    name = get_backend()
    if name == "reference":
        return "reference"
    present = [t for t in (*tensors, inducing_points) if t is not None]
    if not present:
        return "reference"
    on_cuda = any(t.is_cuda for t in present)
    if name == "auto":
        if on_cuda:
            ok = _triton_problem(present, triton_dtypes) is None
            return "triton" if ok else "reference"
        if cpu_unsupported is None and _cpu_problem(present, inducing_points, equidistant) is None:
            return "cpu"
        return "reference"
    if name == "fused":
        name = "triton" if on_cuda else "cpu"
    if name == "triton":
        problem = _triton_problem(present, triton_dtypes)
    else:
        problem = cpu_unsupported or _cpu_problem(present, inducing_points, equidistant)
    if problem is not None:
        raise RuntimeError(f"backend({get_backend()!r}) cannot run here: {problem}")
    return name


def cpu_kernels_evaluate(
    *tensors: Tensor | None,
    inducing_points: Tensor | None = None,
    equidistant: bool | None = None,
) -> bool:
    """Whether an expression that only the Numba CPU kernels fuse (no Triton kernel of its own:
    Mehler's series, the fused layer, the softmax head's cross-entropy) runs on them: the
    backend in force is ``"auto"``, ``"cpu"`` or ``"fused"`` and picks the CPU kernels for
    ``tensors`` (:func:`select_backend`). Under ``"reference"`` and ``"triton"``, and under
    ``"fused"`` on CUDA, the expression's PyTorch path runs (``False``).

    Raises:
        RuntimeError: a forced ``"cpu"`` (or ``"fused"`` on the CPU) that cannot run, as
            :func:`select_backend`.
    """
    name = get_backend()
    if name in ("reference", "triton"):
        return False
    present = [t for t in (*tensors, inducing_points) if t is not None]
    if name == "fused" and any(t.is_cuda for t in present):
        return False
    kind = select_backend(*tensors, inducing_points=inducing_points, equidistant=equidistant)
    return kind == "cpu"


def _runnable_device(tensor: Tensor) -> bool:
    return tensor.is_cuda or (tensor.device.type == "cpu" and triton_interpret())


def cpu_parameter_kernels(inducing_points: Tensor, *tensors: Tensor) -> bool:
    """Whether the parameter-only algebra (``kappa``, ``beta``: per-unit ``R x R`` systems) runs
    in the Numba kernels: backend ``"auto"``, ``"fused"`` or ``"cpu"``, Numba installed, fixed
    inducing points, float32/float64 CPU tensors. Never raises (the reference path is exact)."""
    if get_backend() not in ("auto", "fused", "cpu") or inducing_points.requires_grad:
        return False
    present = (inducing_points, *tensors)
    return numba_available() and all(t.device.type == "cpu" and t.dtype in _FLOATS for t in present)


def use_fused(*tensors: Tensor | None) -> bool:
    """Whether the Triton kernels evaluate an expression of ``tensors`` (compatibility wrapper
    of :func:`select_backend` for code that knows only the Triton kernels).

    Raises:
        RuntimeError: as :func:`select_backend`.
    """
    name = get_backend()
    if name in ("fused", "triton"):
        present = [t for t in tensors if t is not None]
        problem = _triton_problem(present)
        if problem is not None:
            raise RuntimeError(f"backend({name!r}) cannot run here: {problem}")
        return bool(present)
    return select_backend(*tensors) == "triton"
