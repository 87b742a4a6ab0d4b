"""Argument checks for the public boundary.

Every public entry point checks its tensors here so that bad input raises a ``ValueError`` that
names the argument, instead of a NaN or a wrong shape travelling silently through the network.
Form checks (:func:`check_tensor`, :func:`check_ndim`, :func:`check_shape`,
:func:`check_per_unit`) and checks of Python numbers (:func:`check_number`) always run; value
checks (:func:`check_finite`, :func:`check_nonnegative`, :func:`check_positive`,
:func:`check_psd`, and :func:`check_values` for several tensors in one synchronisation) read the
tensor back to the host -- a device synchronisation -- and run only while
:func:`pyro_gpn.settings.is_validation_enabled` (on by default, off inside the training loops).

**The dtype and device rule** (:func:`as_input`, applied at every public module boundary:
layers, :class:`~pyro_gpn.GPNNet` and its heads' losses and predictions, the Pyro models,
:class:`~pyro_gpn.inference.Trainer`, :func:`~pyro_gpn.inference.evaluate`):

* floating inputs (torch tensors or NumPy arrays) are cast to the dtype of the module's
  parameters, so float64 data from NumPy, float16 inputs or a float64 network fed float32
  data all compute in the parameters' dtype (the cast is differentiable);
* integer and boolean inputs are refused (``ValueError`` naming the argument and its dtype):
  a label tensor passed as ``x`` is a mistake, not data;
* an input on another device than the parameters is refused (``ValueError`` naming the
  argument and both devices); nothing is moved between devices implicitly;
* parameters are float32 or float64: other dtypes (float16, bfloat16, integers) are refused
  when the module is built (:func:`check_parameter_dtype`);
* pure functions on tensors (:class:`~pyro_gpn.moments.gaussian.Moments` and
  :mod:`pyro_gpn.moments`) cast nothing: mixed dtypes or devices among their arguments raise a
  ``ValueError`` naming the arguments and both dtypes (devices).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from . import settings

__all__ = [
    "EMPTY_BATCH_HINT",
    "PARAMETER_DTYPES",
    "SCALE_WARNING_LIMIT",
    "UnscaledInputWarning",
    "as_input",
    "check_device",
    "check_device_available",
    "check_class_labels",
    "check_finite",
    "check_inputs",
    "check_int",
    "check_parameter_dtype",
    "check_parameters_finite",
    "check_per_unit",
    "check_same_dtype_device",
    "check_ndim",
    "check_nonnegative",
    "check_not_empty",
    "check_number",
    "check_positive",
    "check_psd",
    "check_shape",
    "check_tensor",
    "check_values",
    "integer_sizes",
]


def check_tensor(name: str, value: object) -> Tensor:
    """Return ``value`` if it is a floating tensor, else raise ``TypeError``/``ValueError``."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def check_ndim(name: str, value: Tensor, ndim: int | Sequence[int]) -> Tensor:
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if value.dim() not in allowed:
        want = " or ".join(str(d) for d in allowed)
        raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(value.shape)}")
    return value


def check_shape(name: str, value: Tensor, shape: Sequence[int | None]) -> Tensor:
    """Check ``value.shape`` against ``shape``; ``None`` entries match any size."""
    if value.dim() != len(shape) or any(
        want is not None and got != want for got, want in zip(value.shape, shape)
    ):
        pretty = tuple("*" if s is None else s for s in shape)
        raise ValueError(f"{name} must have shape {pretty}, got {tuple(value.shape)}")
    return value


def check_per_unit(
    name: str,
    value: Tensor,
    num_units: int,
    trailing: Sequence[int | None] = (),
    note: str = "",
    owner: str = "",
) -> Tensor:
    """Check a per-unit parameter ``[N | 1, *trailing]``: a leading dimension of ``num_units``
    (one entry per unit) or 1 (one shared by every unit), then ``trailing`` (``None`` entries
    match any size). Shapes only: no device synchronisation.

    Args:
        name: the argument's name, for messages.
        value: the tensor.
        num_units: ``N``.
        trailing: the shape after the leading dimension.
        note: appended to the message (where a trailing size comes from).
        owner: the argument ``N`` comes from, for the message.

    Raises:
        ValueError: naming ``name``, the shape wanted and the shape given (and ``note``).
    """
    if (
        value.dim() != 1 + len(trailing)
        or value.shape[0] not in (num_units, 1)
        or any(want is not None and got != want for got, want in zip(value.shape[1:], trailing))
    ):
        dims = ", ".join(["*" if s is None else str(s) for s in trailing])
        pretty = f"({num_units} | 1{', ' + dims if dims else ''})"
        units = f"the {num_units} units of {owner}" if owner else f"{num_units} units"
        extra = f"; {note}" if note else ""
        raise ValueError(
            f"{name} must have shape {pretty} (a row for each of {units} or 1 shared"
            f"{extra}), got {tuple(value.shape)}"
        )
    return value


def check_number(name: str, value: object, positive: bool = False) -> float:
    """``value`` as a float if it is a finite real number (Python's or NumPy's, not a bool),
    non-negative (``positive``: greater than 0); a ``TypeError`` for other types, a
    ``ValueError`` naming ``name`` otherwise. Numbers only (no device synchronisation): always
    checked."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        want = "positive" if positive else "non-negative"
        raise ValueError(f"{name} must be {want} and finite, got {value!r}")
    return number


def check_int(name: str, value: object, minimum: int = 0, *, none_ok: bool = False) -> int | None:
    """``value`` as a Python ``int`` if it is an integer (Python's or NumPy's) ``>= minimum``
    (``None`` passes through with ``none_ok``).

    Bools (``True`` is 1 to ``isinstance``), floats (``2.0`` included) and other types are
    refused: a ``ValueError`` naming ``name``, the integers wanted and the value given.
    """
    if value is None and none_ok:
        return None
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, np.integer))
        or value < minimum
    ):
        if minimum == 1:
            want = "a positive integer"
        elif minimum == 0:
            want = "a non-negative integer"
        else:
            want = f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {want}{' or None' if none_ok else ''}, got {value!r}")
    return int(value)


def integer_sizes(sizes: Sequence[int], name: str = "sizes") -> list[int]:
    """``sizes`` (network widths) as a list of Python ints. Integers (NumPy's too) and integral
    floats (``2.0``) are converted; bools, fractional numbers and strings raise ``ValueError``
    naming ``name`` (``int(2.5)`` or ``int(True)`` would silently build another network)."""
    if isinstance(sizes, (str, bytes)):
        raise ValueError(f"{name} must be integers, got the string {sizes!r}")
    try:
        values = list(sizes)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of integers, got {sizes!r}") from None
    out = []
    for value in values:
        try:
            number = int(value)
            integral = not isinstance(value, (bool, np.bool_, str, bytes)) and bool(number == value)
        except (TypeError, ValueError, OverflowError, RuntimeError):
            integral = False
        if not integral:
            raise ValueError(f"{name} must be integers, got {value!r} in {sizes!r}")
        out.append(number)
    return out


def check_class_labels(
    name: str,
    labels: object,
    num_classes: int | None,
    *,
    check_range: bool = True,
    hint: str = "",
) -> Tensor:
    """``labels`` as a ``long`` tensor, if it holds integer class labels in
    ``[0, num_classes)`` (``None``: only ``>= 0``).

    The dtype is checked always. The range is read back to the host in one device
    synchronisation (``torch.aminmax``) unless ``check_range`` is false: a label out of range
    indexes past the class dimension (an out-of-bounds gather) or scores a silently wrong
    value, so the training and scoring entry points check it once, whether or not validation
    is on. The result is ``long`` (``gather`` and ``index_select`` refuse ``uint8`` or
    ``int16`` indices).

    Args:
        name: the argument's name, for messages.
        labels: the labels.
        num_classes: ``C``, or ``None`` for no upper bound.
        check_range: read the range back (the per-step losses pass
            :func:`pyro_gpn.settings.is_validation_enabled`).
        hint: appended to the message of a wrong dtype (not to the range's).

    Raises:
        TypeError: ``labels`` is not a tensor.
        ValueError: naming ``name``: floating, complex or boolean labels, or labels out of
            range.
    """
    extra = f" ({hint})" if hint else ""
    if not isinstance(labels, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of class labels, got {type(labels).__name__}"
        )
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer class labels, got dtype {labels.dtype}{extra}")
    # long first: aminmax has no kernel for uint16-uint64 (a uint64 label >= 2^63 wraps to a
    # negative one, refused below)
    labels = labels.long()
    if check_range and labels.numel() > 0 and labels.device.type != "meta":
        low, high = torch.stack(torch.aminmax(labels.detach())).tolist()
        if low < 0 or (num_classes is not None and high >= num_classes):
            bound = "" if num_classes is None else f", {num_classes}"
            raise ValueError(
                f"{name} must hold class labels in [0{bound}), got range [{low}, {high}]"
            )
    return labels


#: the advice of :func:`check_not_empty` for a loss with a ``reduction`` argument
EMPTY_BATCH_HINT = "skip empty batches or use reduction='sum'"


def check_not_empty(
    name: str, value: object, reduction: str = "mean", *, rows: bool = True, hint: str = ""
) -> None:
    """``ValueError`` naming ``name`` when a mean would be taken over no samples (a NaN):
    ``value`` has no rows (``rows``) or no entries at all (``rows=False``), and
    ``reduction == "mean"``. Shapes only (no device synchronisation)."""
    shape = getattr(value, "shape", None)
    if reduction != "mean" or not shape:
        return
    if (shape[0] if rows else math.prod(shape)) == 0:
        size = tuple(shape)
        what = (
            f"has 0 samples (an empty batch, shape {size})" if rows else f"is empty (shape {size})"
        )
        raise ValueError(
            f"{name} {what}: the mean over no samples is undefined (NaN)"
            f"{'; ' + hint if hint else ''}"
        )


def check_values(
    finite: dict[str, Tensor | None] | None = None,
    nonnegative: dict[str, Tensor | None] | None = None,
    positive: dict[str, Tensor | None] | None = None,
) -> None:
    """:func:`check_finite`, :func:`check_nonnegative` and :func:`check_positive` on several
    tensors in one device synchronisation (a stacked all-good flag; the individual checks run
    only to name the offender). ``None`` entries are skipped. Like them, runs only while
    :func:`pyro_gpn.settings.is_validation_enabled`, and not while a JIT trace is recorded
    (where a check would be baked into the trace as a constant).
    """
    if not settings.is_validation_enabled() or torch.jit.is_tracing():
        return
    groups = (
        (finite or {}, check_finite, lambda t: torch.isfinite(t).all()),
        (nonnegative or {}, check_nonnegative, lambda t: (torch.isfinite(t) & (t >= 0)).all()),
        (positive or {}, check_positive, lambda t: (torch.isfinite(t) & (t > 0)).all()),
    )
    items = [
        (name, value.detach(), check, good)
        for values, check, good in groups
        for name, value in values.items()
        if value is not None and value.numel() > 0 and value.device.type != "meta"
    ]
    if not items:
        return
    if len({value.device for _, value, _, _ in items}) == 1:
        flags = torch.stack([good(value) for _, value, _, good in items])
        if bool(flags.all()):
            return
    for name, value, check, _ in items:
        check(name, value)


def check_finite(name: str, value: Tensor) -> Tensor:
    if not settings.is_validation_enabled():
        return value
    if not bool(torch.isfinite(value).all()):
        bad = "NaN" if bool(torch.isnan(value).any()) else "infinite"
        raise ValueError(f"{name} contains {bad} values")
    return value


def check_nonnegative(name: str, value: Tensor) -> Tensor:
    if not settings.is_validation_enabled():
        return value
    check_finite(name, value)
    if bool((value < 0).any()):
        raise ValueError(f"{name} must be non-negative, got minimum {value.min().item():.3g}")
    return value


def check_positive(name: str, value: Tensor) -> Tensor:
    if not settings.is_validation_enabled():
        return value
    check_finite(name, value)
    if bool((value <= 0).any()):
        raise ValueError(f"{name} must be positive, got minimum {value.min().item():.3g}")
    return value


def check_psd(name: str, value: Tensor, rtol: float = 1e-5) -> Tensor:
    """Check that a batch of square matrices ``[..., N, N]`` is symmetric positive semi-definite.

    Symmetry is checked to ``rtol`` of the largest entry; semi-definiteness by the smallest
    eigenvalue, allowing ``-rtol * max|eigenvalue|`` of round-off. The values are read only
    while validation is on, and not while a JIT trace is recorded or for an empty batch.
    """
    if value.dim() < 2 or value.shape[-1] != value.shape[-2]:
        raise ValueError(f"{name} must be a batch of square matrices, got {tuple(value.shape)}")
    if not settings.is_validation_enabled() or torch.jit.is_tracing() or value.numel() == 0:
        return value
    check_finite(name, value)
    scale = value.abs().amax().clamp_min(torch.finfo(value.dtype).tiny)
    if bool(((value - value.mT).abs() > rtol * scale).any()):
        raise ValueError(f"{name} must be symmetric")
    eig = torch.linalg.eigvalsh(value)
    tol = rtol * eig.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(value.dtype).tiny)
    if bool((eig < -tol).any()):
        raise ValueError(
            f"{name} must be positive semi-definite, got eigenvalue {eig.min().item():.3g}"
        )
    return value


# ---------------------------------------------------------------------------------- dtype/device
#: the parameter dtypes the library computes in
PARAMETER_DTYPES = (torch.float32, torch.float64)
#: inputs beyond this magnitude draw an :class:`UnscaledInputWarning`
SCALE_WARNING_LIMIT = 100.0


class UnscaledInputWarning(UserWarning):
    """Inputs far outside the range GPN activation functions respond in (unscaled data)."""


def check_parameter_dtype(name: str, dtype: torch.dtype | None) -> torch.dtype:
    """``dtype`` (``None``: torch's default) if it is float32 or float64, else ``ValueError``."""
    resolved = torch.get_default_dtype() if dtype is None else dtype
    if resolved not in PARAMETER_DTYPES:
        given = f"{name}={dtype}" if dtype is not None else f"torch's default dtype {resolved}"
        raise ValueError(
            f"{given} is not supported for the parameters: use torch.float32 or torch.float64 "
            "(float16/bfloat16 lose the GP algebra; integers cannot be trained)"
        )
    return resolved


def check_device_available(name: str, device: torch.device | str | None) -> torch.device | None:
    """``device`` as a ``torch.device``; ``ValueError`` naming it if it is malformed or CUDA is
    requested on a machine without it."""
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{name}={device!r} is not a torch device ({error})") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        built = "built with" if torch.backends.cuda.is_built() else "built without"
        raise ValueError(
            f"{name}={device!r} requested but CUDA is not available (this torch "
            f"{torch.__version__} is {built} CUDA support and sees no GPU); use {name}='cpu'"
        )
    return resolved


def check_device(name: str, value: Tensor, device: torch.device, where: str) -> Tensor:
    """``ValueError`` naming ``name`` and both devices unless ``value`` is on ``device``."""
    if value.device != device:
        raise ValueError(
            f"{name} is on device {value.device} but {where} on {device}; move it with "
            f".to({str(device)!r})"
        )
    return value


def check_same_dtype_device(
    reference: str, value: Tensor, others: dict[str, Tensor | None]
) -> None:
    """Pure functions: every tensor in ``others`` has ``value``'s dtype and device (a
    ``ValueError`` naming the arguments and both dtypes or devices otherwise)."""
    for name, other in others.items():
        if other is None or not isinstance(other, Tensor):
            continue
        if other.device != value.device:
            raise ValueError(
                f"{name} is on device {other.device} but {reference} on {value.device}; "
                "put all arguments on one device"
            )
        if other.dtype != value.dtype:
            raise ValueError(
                f"{name} has dtype {other.dtype} but {reference} has {value.dtype}; give all "
                f"arguments in one dtype (e.g. {name}.to({value.dtype}))"
            )


def as_input(name: str, value: object, like: Tensor, where: str = "the parameters are") -> Tensor:
    """Apply the module docstring's dtype and device rule to an input.

    Args:
        name: the argument's name, for messages.
        value: a floating ``torch.Tensor`` or NumPy array.
        like: a parameter of the module: the dtype cast to and the device required.
        where: what ``like`` is, for the device message.

    Returns:
        ``value`` as a tensor in ``like.dtype`` (the same object when nothing changes).
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "fiub":
            raise TypeError(f"{name} must be numeric, got a NumPy array of dtype {value.dtype}")
        value = torch.from_numpy(np.ascontiguousarray(value))
        if value.is_floating_point():
            value = value.to(device=like.device)
    check_tensor(name, value)
    check_device(name, value, like.device, where)
    if value.dtype != like.dtype:
        value = value.to(like.dtype)
    return value


def check_inputs(name: str, value: Tensor) -> Tensor:
    """:func:`check_finite` and a warning for unscaled inputs, in one device synchronisation.

    GPN activation functions respond only near their inducing points (``[-2, 2]`` by default):
    inputs of order ``1e3`` or ``1e6`` put every activation where the GP prior's kernel has
    underflowed, every gradient is exactly zero and training silently does nothing. Inputs
    beyond :data:`SCALE_WARNING_LIMIT` in magnitude draw an :class:`UnscaledInputWarning`.
    """
    if not settings.is_validation_enabled() or value.numel() == 0:
        return value
    peak = float(value.detach().abs().amax())
    if not math.isfinite(peak):
        check_finite(name, value)
        raise ValueError(f"{name} contains NaN or infinite values")  # pragma: no cover
    if peak > SCALE_WARNING_LIMIT:
        warnings.warn(
            f"{name} reaches |{name}| = {peak:.3g}: the inputs look unscaled. GPN activation "
            "functions respond only near their inducing points (default range [-2, 2]); "
            "far outside it the output is the GP prior and every gradient is zero. Standardise "
            "the inputs (zero mean, unit variance per column, e.g. "
            "pyro_gpn.data.preprocessing.Standardizer) before training.",
            UnscaledInputWarning,
            stacklevel=3,
        )
    return value


def check_parameters_finite(module: nn.Module, owner: str) -> None:
    """``ValueError`` naming the parameters of ``module`` that hold NaN or infinite values.

    One device synchronisation (a stacked all-finite flag), and only while validation is on:
    parameters turn non-finite when an optimisation diverges outside the library's training
    loops (which detect it themselves), and a network with NaN parameters otherwise predicts
    NaN without a word.
    """
    if not settings.is_validation_enabled():
        return
    named = [(n, p) for n, p in module.named_parameters() if p.is_floating_point()]
    if not named or named[0][1].device.type == "meta":
        return
    tensors = [p.detach() for _, p in named]
    if len({(t.device, t.dtype) for t in tensors}) == 1:
        # one kernel over all of them (a layer has five small parameters: five isfinite and
        # five all() launches cost more than the copy)
        flat = torch.cat([t.reshape(-1) for t in tensors])
        if bool(torch.isfinite(flat).all()):
            return
    flags = torch.stack([torch.isfinite(t).all() for t in tensors])
    if bool(flags.all()):
        return
    bad = [n for (n, _), ok in zip(named, flags.tolist(), strict=True) if not ok]
    raise ValueError(
        f"parameters {bad} of {owner} contain NaN or infinite values (the training that "
        "produced them diverged?): reload a checkpoint or re-initialise, then train with a "
        "smaller learning rate"
    )
